"""Everything torch_tpu knows about one op: its record in the op table.

    >>> print(op_table.format_entry(torch_tpu.debug.describe_op("aten.cat.default")))
    aten.cat.default
      lowering  torch_tpu.ops.shape.cat                          torch_tpu.ops.shape:39
      kernel    torch_tpu.ops.core.checked_kernel.<locals>.kernel torch_tpu.ops.shape:61
      graph     -
      padding   torch_tpu.compile.padding._cat_rule              torch_tpu.compile.padding:769

or from a shell: `python -m torch_tpu.debug op aten.cat.default [more ops]`.

The table is `torch_tpu.runtime.registry.OPS` (see its docstring): one
`OpEntry` per op, its fields filled by `@lower`, `@kernel`, `@graph_op` and
`@padding_rule`, each with the module:line it was registered at. The graph
and padding fields belong to compile/, loaded with torch.compile; this
module loads every layer that registers (the op families, compile's graph
rules and padding rules) before it answers. SPMD's graph rules for
collectives join the table when `torch_tpu.distributed.spmd.install()` runs.
"""

from __future__ import annotations

import sys

import torch

from ..runtime import loading, registry


def op_named(name) -> torch._ops.OpOverload:
    """The overload `name` names: an OpOverload, an OpOverloadPacket (its
    `.default`), or a string "aten.cat.default" / "aten::cat.default" /
    "aten.cat" (the default overload)."""
    if isinstance(name, torch._ops.OpOverloadPacket):
        return name.default
    if isinstance(name, torch._ops.OpOverload):
        return name
    text = str(name).replace("::", ".")
    parts = text.split(".")
    if len(parts) == 2:
        parts.append("default")
    if len(parts) != 3:
        raise ValueError(f"not an op name: {name!r} (expected e.g. 'aten.cat.default')")
    ns, op, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError) as e:
        raise ValueError(f"no op {name!r}: {e}") from None


def describe_op(op) -> registry.OpEntry:
    """The op table's record of `op` (anything `op_named` takes), with every
    layer that registers loaded; an empty record if nothing is registered."""
    loading.load()
    # lazy: compile's graph and padding rules load with torch.compile, not with the backend
    from ..compile import graph_ops, padding  # noqa: F401  (they fill those fields)
    op = op_named(op)
    found = registry.entry(op)
    return found if found is not None else registry.OpEntry(op)


def _name(value) -> str:
    fn = value.fn if isinstance(value, registry.Lowering) else value
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    text = f"{module}.{qualname}"
    if isinstance(value, registry.Lowering):
        flags = [f"{k}={v!r}" for k, v in (("mutates", value.mutates), ("random", value.random),
                                           ("eager", value.eager), ("static", value.static),
                                           ("traced", value.traced))
                 if v]
        if flags:
            text += f" ({', '.join(flags)})"
    return text


def format_entry(entry: registry.OpEntry) -> str:
    """`entry` as text: the op, then one line per field (its function and where
    it was registered; `-` for a field it does not have)."""
    lines = [str(entry.op)]
    for field in registry.FIELDS:
        value = getattr(entry, field)
        if value is None:
            lines.append(f"  {field:<9} -")
        else:
            lines.append(f"  {field:<9} {_name(value):<48} {entry.sources.get(field, '?')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m torch_tpu.debug op OP...`: print each op's record."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m torch_tpu.debug op OP [OP ...]   (e.g. aten.cat.default)")
        return 0 if argv else 2
    status = 0
    for name in argv:
        try:
            print(format_entry(describe_op(name)))
        except ValueError as e:
            print(e, file=sys.stderr)
            status = 1
    return status

