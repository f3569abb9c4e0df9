"""The op table, as the op families use it: `from .registry import aten, lower`.

The table itself is `torch_tpu.runtime.registry` (a leaf of the runtime
layer, so the executor can read it without importing the op layer): one
`OpEntry` per op with its lowering, storage kernel, graph-mode rule and
padding rule, and where each was registered. This module re-exports it; the
objects are the same (`OPS`, `LOWERINGS`, `CONTEXT`). Importing it through
`torch_tpu.ops` loads every op family, which fills the lowerings and
kernels; `entry(op)` is an op's record (`torch_tpu.debug.describe_op` loads
the graph and padding rules too).
"""

from __future__ import annotations

from ..runtime.registry import (  # noqa: F401  (re-exported)
    CONTEXT,
    FIELDS,
    GRAPH_OPS,
    KERNELS,
    LOWERINGS,
    OPS,
    PADDING_RULES,
    FieldView,
    Lowering,
    OpEntry,
    aten,
    arg_meta,
    entry,
    graph_op,
    kernel,
    lower,
    padding_rule,
    register,
    unregister,
    out_dtype,
    out_meta,
    out_torch_dtype,
)

__all__ = ["arg_meta", "CONTEXT", "FIELDS", "GRAPH_OPS", "KERNELS", "LOWERINGS", "OPS", "PADDING_RULES",
           "FieldView", "Lowering", "OpEntry", "aten", "entry", "graph_op", "kernel", "lower",
           "out_dtype", "out_meta", "out_torch_dtype", "padding_rule", "register", "unregister"]
