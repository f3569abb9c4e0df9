"""The lowering table, as the op families use it: `from .registry import aten, lower`.

The table itself is `torch_tpu.runtime.registry` (a leaf of the runtime
layer, so the executor can read it without importing the op layer). This
module re-exports it; the objects are the same (`LOWERINGS`, `CONTEXT`).
Importing it through `torch_tpu.ops` loads every op family, which fills the
table.
"""

from __future__ import annotations

from ..runtime.registry import (  # noqa: F401  (re-exported)
    CONTEXT,
    LOWERINGS,
    Lowering,
    aten,
    lower,
    out_dtype,
    out_meta,
    out_torch_dtype,
)

__all__ = ["CONTEXT", "LOWERINGS", "Lowering", "aten", "lower", "out_dtype", "out_meta",
           "out_torch_dtype"]
