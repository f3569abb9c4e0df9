"""The lowering table: one place mapping ATen overloads to JAX functions.

A lowering is a small pure function written against the op's ATen schema:
tensor arguments arrive as jax arrays (already in the tensor's logical shape,
views resolved), `Scalar` arguments as traced weak-typed scalars, everything
else (dims, sizes, flags, dtypes) as plain Python values. It returns arrays
in the structure the op returns. The executor casts each output to the dtype
PyTorch's meta kernel says the op produces, so a lowering only has to get the
values right.

In-place (`add_`) and out= (`add.out`) overloads need no lowering of their
own: the executor runs the functional overload and writes the result back.

    @lower(aten.add.Tensor)
    def add(x, y, *, alpha=1):
        return x + alpha * y

It lives in the runtime, the bottom layer, as a leaf (torch and storage's dtype table): the
executor and the graph lowering read it without importing the op families
that fill it. The families use it as `torch_tpu.ops.registry` (a re-export);
importing that name loads every family, so the table is full.

The lowering is one field of the op's record. `OPS` maps each op to an
`OpEntry` holding everything torch_tpu knows about it, each field filled by
its own decorator, all of them defined here and writing through `register`:

    lowering  `@lower(op)`             (ops/<family>.py)   eager and graph mode
    kernel    `@kernel(op)`            (ops/core.py, re-exported there): a
              PrivateUse1 kernel of its own, which takes the op's dispatcher
              slot in place of the lowering's runner (views, copies, argument
              checks, host-side work)
    graph     `@graph_op(op)`          (compile/graph_ops.py): the value
              semantics of an op with no lowering inside a compiled graph
    padding   `@padding_rule(op)`      (compile/padding.py): how the op runs
              on bucketed (padded) dimensions

with the module:line each was registered at (`OpEntry.sources`). A field is
registered once per op: a second registration raises, and a kernel that
wraps the one before it says so (`KERNELS.replace(op, fn)`). `LOWERINGS`,
`ops.core.KERNELS`, `compile.graph_ops.GRAPH_OPS` and `compile.padding.RULES`
are views of one field each (`FieldView`), in registration order. Fields
registered by an upper layer (graph, padding) are there once that layer's
module is loaded; `torch_tpu.debug.describe_op` loads them all first.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from .storage import TORCH_TO_JAX

aten = torch.ops.aten


@dataclass(frozen=True)
class Lowering:
    op: torch._ops.OpOverload
    fn: Callable
    # Names of mutable (non-out) arguments the lowering returns new values for,
    # after its outputs: fn returns (outputs, {name: new_value}).
    mutates: tuple = ()
    # Ops whose lowering needs a fresh PRNG key: passed as keyword `rng_key`.
    random: bool = False
    # Data-dependent output shapes (nonzero, masked_select, unique): run on
    # concrete arrays, outside jit, instead of as one cached executable.
    eager: bool = False
    # Scalar arguments baked into the program (their values are part of the
    # key) instead of runtime inputs: for values that select the program's
    # structure and hardly ever change (a norm's order), where a runtime value
    # would compile every alternative into one program.
    static: tuple = ()
    # The opposite: int arguments made runtime inputs (traced scalars, like a
    # Scalar) instead of part of the program, for values that change from call
    # to call without changing the program's structure (embedding's
    # padding_idx): each distinct value would otherwise compile a program.
    traced: tuple = ()


# The fields of a record, and what one of each is called in messages.
FIELDS = {"lowering": "lowering", "kernel": "kernel", "graph": "graph op",
          "padding": "padding rule"}


@dataclass
class OpEntry:
    """Everything torch_tpu registered for one op (see the module docstring)."""

    op: Any
    lowering: Lowering | None = None
    kernel: Callable | None = None
    graph: Callable | None = None
    padding: Callable | None = None
    # field name -> "module:line" of the registration that set it.
    sources: dict[str, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The fields this op has, by name, in FIELDS order."""
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}


OPS: dict[Any, OpEntry] = {}
# Per field, op -> value in registration order: what the FieldViews read
# (kept by register/unregister, the only writers, together with OPS).
_INDEX: dict[str, dict[Any, Any]] = {f: {} for f in FIELDS}
# Frames of these modules are registration machinery, not the registration site.
_MACHINERY = {__name__, "_collections_abc", "collections.abc"}


def _site() -> str:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _MACHINERY:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}"


def register(op: Any, name: str, value: Any, *, replace: bool = False,
             source: str | None = None) -> None:
    """Set field `name` of `op`'s record to `value`, noting where it was called from.

    Raises RuntimeError if the field is already set, unless `replace` (a
    kernel that wraps the op's previous kernel)."""
    index = _INDEX[name]
    entry = OPS.get(op)
    if op in index and not replace:
        assert entry is not None
        raise RuntimeError(f"two {FIELDS[name]}s registered for {op} "
                           f"(the first at {entry.sources.get(name, '?')})")
    if entry is None:
        entry = OPS[op] = OpEntry(op)
    setattr(entry, name, value)
    entry.sources[name] = source or _site()
    index[op] = value


def unregister(op: Any, name: str) -> Any:
    """Clear field `name` of `op`'s record and return its value (KeyError if unset)."""
    value = _INDEX[name].pop(op)
    entry = OPS[op]
    setattr(entry, name, None)
    entry.sources.pop(name, None)
    if not entry.sources:
        del OPS[op]
    return value


def entry(op: Any) -> OpEntry | None:
    """`op`'s record: every field registered for it so far (None if none)."""
    return OPS.get(op)


class FieldView(MutableMapping):
    """One field of the table as a mapping op -> value, in registration order.

    Reading is reading the table. `view[op] = value` registers (raising if
    the op has one), `view.replace(op, value)` puts a value over the one
    before it, `del view[op]` unregisters."""

    def __init__(self, name: str):
        self.name = name
        self._index = _INDEX[name]

    def __getitem__(self, op: Any) -> Any:
        return self._index[op]

    def __contains__(self, op: object) -> bool:
        return op in self._index

    def get(self, op: Any, default: Any = None) -> Any:
        return self._index.get(op, default)

    def __iter__(self) -> Iterator:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def keys(self):
        return self._index.keys()

    def values(self):
        return self._index.values()

    def items(self):
        return self._index.items()

    def __setitem__(self, op: Any, value: Any) -> None:
        register(op, self.name, value)

    def replace(self, op: Any, value: Any) -> None:
        """Set the field whether or not it was set (a kernel wrapping the previous one)."""
        register(op, self.name, value, replace=True)

    def __delitem__(self, op: Any) -> None:
        unregister(op, self.name)

    def __repr__(self) -> str:
        return f"<FieldView {self.name!r}: {len(self)} ops>"


LOWERINGS: FieldView = FieldView("lowering")  # op -> Lowering
KERNELS: FieldView = FieldView("kernel")  # op -> PrivateUse1 kernel (ops.core.KERNELS)
GRAPH_OPS: FieldView = FieldView("graph")  # op -> graph-mode rule (compile.graph_ops.GRAPH_OPS)
PADDING_RULES: FieldView = FieldView("padding")  # op -> padding rule (compile.padding.RULES)


def lower(*ops, mutates=(), random=False, eager=False, static=(), traced=()):
    """Register `fn` as the lowering of each ATen overload in `ops`."""

    def deco(fn):
        for op in ops:
            register(op, "lowering", Lowering(op, fn, tuple(mutates), random, eager,
                                              tuple(static), tuple(traced)))
        return fn

    return deco


def kernel(*ops):
    """Register `fn` as the PrivateUse1 kernel of each op (in place of its lowering's runner)."""

    def deco(fn):
        for op in ops:
            register(op, "kernel", fn)
        return fn

    return deco


def graph_op(*ops):
    """Register `fn(g, a)` as each op's value semantics inside a compiled graph
    (compile/graph_ops.py says what `g` and `a` are)."""

    def deco(fn):
        for op in ops:
            register(op, "graph", fn)
        return fn

    return deco


def padding_rule(*ops):
    """Register `fn(hook, n, op, args, kwargs, call)` as each op's rule on
    padded dimensions (compile/padding.py says what it returns)."""

    def deco(fn):
        for op in ops:
            register(op, "padding", fn)
        return fn

    return deco


class _Context(threading.local):
    meta_out: Any = None  # pytree of meta tensors: what the op returns
    # argument name -> meta tensor with the argument's strides, where the
    # caller knows them (eager programs, compiled graphs; not fused traces)
    meta_in: Any = None


CONTEXT = _Context()


def out_meta():
    """The meta tensor(s) PyTorch says the op being lowered returns."""
    return CONTEXT.meta_out


def arg_meta(name: str) -> Any:
    """The meta tensor of tensor argument `name` of the op being lowered, with
    its sizes and strides (how it is stored), or None where the caller does
    not say. For lowerings whose best XLA form depends on the layout, which
    the arrays they get (views resolved) do not show; never for values."""
    meta = CONTEXT.meta_in
    return None if meta is None else meta.get(name)


def out_dtype():
    """The jax dtype of the (first) output of the op being lowered."""
    meta = CONTEXT.meta_out
    while isinstance(meta, (tuple, list)):
        meta = meta[0]
    return TORCH_TO_JAX[meta.dtype]


def out_torch_dtype():
    meta = CONTEXT.meta_out
    while isinstance(meta, (tuple, list)):
        meta = meta[0]
    return meta.dtype
