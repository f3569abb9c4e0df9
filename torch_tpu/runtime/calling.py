"""How a lowering is called: one implementation for the eager executor and the graph lowering.

A lowering is a jax function taking an ATen op's schema arguments (positional
ones positionally, keyword-only ones by keyword) and returning arrays that
must match the shapes and dtypes PyTorch's meta kernel computed. The eager
executor (runtime/executor.py) and the graph lowering (compile/lowering.py)
both bind arguments to schema names, split them back into a call, conform the
results and find the functional overload of in-place/out= ops; this module is
the single place that does it, so the two paths cannot drift apart.

A leaf: it imports only torch, jax and runtime/storage (for PyTorch's
casting rules); each caller passes its own exception factory to `conform`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import torch

from . import storage as st

_SCHEMA_ARGS: dict[Any, Any] = {}


def schema_args(op: Any) -> Any:
    """`op._schema.arguments`, cached (the schema property builds a new list per access)."""
    args = _SCHEMA_ARGS.get(op)
    if args is None:
        args = _SCHEMA_ARGS[op] = op._schema.arguments
    return args


def bind(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """{schema argument name: value} of a call of `op`, defaults filled in (None without one)."""
    named = {}
    for i, a in enumerate(schema_args(op)):
        if i < len(args) and not a.kwarg_only:
            named[a.name] = args[i]
        elif a.name in kwargs:
            named[a.name] = kwargs[a.name]
        elif a.has_default_value():
            named[a.name] = a.default_value
        else:
            named[a.name] = None
    return named


def split(args_of: Any, named: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The (positional, keyword-only) arguments of a lowering call from a name map.

    `args_of` is an op or its schema arguments; a name missing from `named`
    takes its schema default (None without one).
    """
    if not isinstance(args_of, (list, tuple)):
        args_of = schema_args(args_of)
    args, kwargs = [], {}
    for a in args_of:
        v = named[a.name] if a.name in named else (
            a.default_value if a.has_default_value() else None)
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return args, kwargs


def internal_error(name: str, got: tuple, want: tuple) -> Exception:
    """The eager executor's error for a lowering result of the wrong shape (a bug)."""
    return RuntimeError(f"internal error in the lowering of {name}: produced shape "
                        f"{got}, PyTorch expects {want}")


def conform(x: Any, shape: Sequence[Any], dtype: torch.dtype, name: str,
            error: Callable[[str, tuple, tuple], Exception] = internal_error) -> Any:
    """`x` as an array of PyTorch's `shape` and `dtype` (cast by PyTorch's rules,
    broadcast when the lowering returned a broadcastable shape).

    A shape that cannot broadcast raises `error(name, got, want)`, so each
    caller keeps its own exception type and message.
    """
    x = st.convert(jnp.asarray(x), dtype)
    shape = tuple(shape)
    if x.shape != shape:
        try:
            x = jnp.broadcast_to(x, shape)
        except ValueError:
            raise error(name, x.shape, shape) from None
    return x


def functional_of(op: Any) -> Any:
    """The functional overload computing what in-place/out= overload `op` writes."""
    schema = op._schema
    if not any(a.alias_info and a.alias_info.is_write for a in schema.arguments):
        return None
    base = schema.name.split("::")[1]
    ns = getattr(torch.ops, schema.name.split("::")[0])
    out_names = {a.name for a in schema.arguments if a.is_out}
    if out_names:
        packet = getattr(ns, base, None)
        if packet is None:
            return None
        want = [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]
        for ov in packet.overloads():
            cand = getattr(packet, ov)
            if cand is op:
                continue
            cs = cand._schema
            if any(a.alias_info and a.alias_info.is_write for a in cs.arguments):
                continue
            if [(a.name, str(a.type)) for a in cs.arguments] == want:
                return cand
        return None
    if base.endswith("_") and not base.startswith("_foreach") or base.startswith("_foreach") and base.endswith("_"):
        packet = getattr(ns, base[:-1], None)
        if packet is None:
            return None
        ov = schema.overload_name or "default"
        cand = getattr(packet, ov, None)
        if cand is None:
            return None
        if [str(a.type) for a in cand._schema.arguments] == [
                str(a.type).replace("(a!)", "") for a in schema.arguments]:
            return cand
    return None
