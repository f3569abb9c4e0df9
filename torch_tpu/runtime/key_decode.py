"""Reading an eager key back: which argument each part of it is.

For the debug tools only (`torch_tpu.debug.explain_recompiles`: why a
program recompiled), on compile events, never on the hot path. The format
is runtime/keys.py's; this module parses it against the op's schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import executor, keys, programs


def key_fields(key: tuple) -> dict[str, str]:
    """An eager key (as `classify` and `Runner.__call__` build it, or the
    native kernel, which builds the same) as named, printable fields: per
    argument its shape, dtype, layout and storage, or its value (static
    arguments; Python scalars show only their type, their value being a
    runtime input), then the context parts (programs.EAGER_CONTEXT).

    Read back against the op's schema and the argument kinds of
    runtime/keys.py, which writes the format. For the debug tools (`torch_tpu.debug.explain_recompiles`), on
    compile events only; parts it cannot attribute fall back to `part i`.
    """
    k = programs.eager_key(key)
    fields: dict[str, str] = {}
    parsed = None
    if isinstance(k.op, torch._ops.OpOverload):
        # (ops with their own runner, such as the random ops, have none here)
        runner = executor.runner_for(k.op)
        parsed = _parse_args(runner.plan.kinds if runner is not None else keys.Plan(k.op).kinds,
                             list(k.args))
    if parsed is None:
        for i, part in enumerate(k.args):
            fields[f"part {i}"] = _show(part)
    else:
        owners: dict[int, str] = {}
        names = [a.name for a in k.op._schema.arguments]
        for i, arg in enumerate(parsed):
            _arg_fields(f"arg {i}", names[i], arg, fields, owners)
    if k.rng:
        fields["random"] = "a fresh PRNG key per call"
    fields["device"] = f"tpu:{k.device}"
    fields["default dtype"] = _show(k.default_dtype)
    fields["precision"] = str(k.precision)
    fields["opt level"] = _show(k.opt_level)
    return fields


def _show(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    if isinstance(v, type):
        return v.__name__
    return repr(v) if isinstance(v, str) else str(v)


def _is_storage_sig(x: Any) -> bool:
    return (type(x) is tuple and len(x) == 2 and type(x[0]) is tuple
            and isinstance(x[1], torch.dtype))


def _tensor_alts(parts: list, p: int, slots: tuple) -> list:
    """How a tensor argument's parts at `p` read: [] or [(arg, next p, slots)]."""
    if p >= len(parts):
        return []
    x = parts[p]
    if x in (int, float, bool, complex):  # a Python number where a Tensor goes
        return [(("scalar", x), p + 1, slots)]
    if type(x) is tuple and len(x) == 2 and x[0] is programs.KeyTag.CPU_SCALAR:
        return [(("cpu", x[1]), p + 1, slots)]
    new = _is_storage_sig(x)
    if new:
        slots += (x,)
        p += 1
        if p >= len(parts):
            return []
        x = parts[p]
    if type(x) is int:
        slot, layout, bits = x, None, None
    elif type(x) is tuple and len(x) in (2, 3) and type(x[0]) is int:
        slot, layout, bits = x[0], x[1], (x[2] if len(x) == 3 else None)
    else:
        return []
    if slot >= len(slots) or (new and slot != len(slots) - 1):
        return []
    return [(("tensor", slots[slot], slot, new, layout, bits), p + 1, slots)]


def _scalar_alts(parts: list, p: int, slots: tuple) -> list:
    if p < len(parts) and parts[p] in (int, float, bool, complex):
        return [(("scalar", parts[p]), p + 1, slots)]
    return _tensor_alts(parts, p, slots)  # a Scalar given as a tensor


def _list_alts(parts: list, p: int, slots: tuple, elem: Callable, exact: bool) -> Any:
    """A list argument: its elements' parts, then its length."""
    def more(p, slots, items):
        x = parts[p] if p < len(parts) else None
        if type(x) is int and (x == len(items) if exact else x >= len(items)):
            yield ("list", x, tuple(items)), p + 1, slots
        for item, q, s in elem(parts, p, slots):
            yield from more(q, s, items + [item])
    return more(p, slots, [])


def _arg_alts(kind: int, parts: list, p: int, slots: tuple) -> Any:
    if p >= len(parts):
        return []
    x = parts[p]
    if kind == keys.STATIC:
        return [(("static", x), p + 1, slots)]
    if kind == keys.TENSOR:
        return _tensor_alts(parts, p, slots)
    if kind == keys.SCALAR:
        return _scalar_alts(parts, p, slots)
    if kind == keys.ALPHA and x is programs.KeyTag.ONE:
        return [(("static", 1), p + 1, slots)]
    if kind == keys.ALPHA:
        return _scalar_alts(parts, p, slots)
    alts: list = [(("static", None), p + 1, slots)] if x is None else []
    if kind == keys.OPT_TENSOR:
        return alts + _tensor_alts(parts, p, slots)
    if kind == keys.OPT_SCALAR:
        return alts + _scalar_alts(parts, p, slots)
    if kind in (keys.TENSOR_LIST, keys.OPT_TENSOR_LIST):
        return list(alts) + list(_list_alts(parts, p, slots, _tensor_alts, kind == keys.TENSOR_LIST))
    if kind == keys.SCALAR_LIST:
        return list(alts) + list(_list_alts(parts, p, slots, _scalar_alts, True))
    return alts  # a generator: always None


def _parse_args(kinds: tuple, parts: list, i: int = 0, p: int = 0,
                slots: tuple = ()) -> list | None:
    """One reading of `parts` as the arguments `kinds`, or None (backtracking:
    a list's length and a storage slot are both ints)."""
    if i == len(kinds):
        return [] if p == len(parts) else None
    for arg, q, s in _arg_alts(kinds[i], parts, p, slots):
        rest = _parse_args(kinds, parts, i + 1, q, s)
        if rest is not None:
            return [arg] + rest
    return None


def _arg_fields(name: str, arg_name: str, arg: tuple, fields: dict, owners: dict) -> None:
    """Fields of one parsed argument: tensors `arg i shape` (dtype, layout,
    storage); values `arg i (schema name) value`."""
    tag = arg[0]
    if tag == "static":
        fields[f"{name} ({arg_name}) value"] = _show(arg[1])
    elif tag == "scalar":
        fields[f"{name} ({arg_name}) value"] = f"runtime {arg[1].__name__}"
    elif tag == "cpu":
        fields[f"{name} ({arg_name}) value"] = f"runtime 0-dim cpu {_show(arg[1])} tensor"
    elif tag == "list":
        fields[f"{name} length"] = str(arg[1])
        for j, item in enumerate(arg[2]):
            _arg_fields(f"{name}[{j}]", arg_name, item, fields, owners)
    else:
        (shape, dtype), slot, new, layout, bits = arg[1:]
        if layout is None:
            fields[f"{name} shape"] = str(shape)
            fields[f"{name} dtype"] = _show(dtype)
            fields[f"{name} layout"] = "contiguous"
        else:
            fields[f"{name} shape"] = str(layout[1])
            fields[f"{name} dtype"] = _show(layout[0])
            flags = "".join(f" {n}" for n, on in zip(("conj", "neg"), bits or ()) if on)
            fields[f"{name} layout"] = f"view, strides {layout[2]}{flags}"
            if new:
                fields[f"{name} storage"] = f"{shape} {_show(dtype)}"
        if not new:
            fields[f"{name} storage"] = f"shared with {owners.get(slot, 'an earlier argument')}"
        owners.setdefault(slot, name)
