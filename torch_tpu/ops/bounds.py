"""Index bounds, checked on the device as CUDA's device-side asserts are.

PyTorch's CPU kernels raise for an index out of range; an XLA gather clamps
or fills and a scatter drops the write, so without a check `x[idx]` with a
bad index returned NaN. Reading the index tensor on the host before each op
would serialize every program, so each indexing op dispatches one more op
next to it: ``torch_tpu::index_bounds(index, size, negative)``, a lowering in
the table like any other (one cached executable, the native fast path;
recorded into the fused program in fused mode), whose result, ``[any index
out of range, the first such index]``, stays on the device. It is handed to
`runtime.asserts.defer` and read when the host next waits (a value read,
`torch.tpu.synchronize()`), or at once with ``TORCH_TPU_LAUNCH_BLOCKING=1``.
The error (`asserts.DeviceIndexError`, an IndexError and a RuntimeError)
names the op, the index and the size.

Which argument is an index, against which size, and whether negative indices
wrap (advanced indexing, take, put, index_fill) or are out of range (gather,
scatter*, index_select, index_add/copy/reduce, embedding) is the table
`_SPECS` below, one line per op; their in-place and out= overloads share it.
Compiled graphs (`torch.compile`) are not checked: their ops never reach these
kernels (listed in docs/troubleshooting.md).

``TORCH_TPU_INDEX_CHECKS=0`` turns the checks off for the process (read at
start-up): the ops then run behind the native kernel again, and an index out
of range reads the fill value or drops the write, as before the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import asserts, calling
from ..runtime.switches import switch_on
from .registry import lower

ENABLED = switch_on("TORCH_TPU_INDEX_CHECKS")

_lib = torch.library.Library("torch_tpu", "FRAGMENT")
_lib.define("index_bounds(Tensor index, int size, bool negative) -> Tensor")
index_bounds_op = torch.ops.torch_tpu.index_bounds.default


@torch.library.register_fake("torch_tpu::index_bounds", lib=_lib)
def _index_bounds_fake(index, size, negative):
    return index.new_empty((2,))


@lower(index_bounds_op)
def index_bounds(index, size, negative):
    """[1 if any index is outside [-size or 0, size) else 0, the first such index]."""
    idx = index.reshape(-1)
    lo = -size if negative else 0
    bad = (idx < lo) | (idx >= size)
    first = idx[jnp.argmax(bad)]
    return jnp.stack([bad.any().astype(idx.dtype), first])


_TEXT = "{op}: index {value} is out of bounds for dimension {dim} with size {size}"
_TAKE_TEXT = "{op}: out of range: tried to access index {value} on a tensor of {size} elements"
# embedding_bag's CPU text (its padding_idx and max paths; the others word it
# "Index 0 of input takes value ..."), which PyTorch's tests match.
_BAG_TEXT = ("{op}: embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to "
             "be {value} (num_embeddings {size})")
# What a device-side error adds to CPU's text (other value checks use it too).
WHERE = (" (a device-side check, reported at the first host read after the op; "
          "TORCH_TPU_LAUNCH_BLOCKING=1 reports it at the op)")


def check(op: str, index: Any, size: int, dim: int | None, negative: bool,
          text: str | None = None) -> None:
    """Defer the bounds check of tpu tensor `index` against `size` (see the
    module docstring); `dim` None: an index into the flattened tensor;
    `text` the error's own format (fields op, value, dim, size)."""
    if not ENABLED or not isinstance(index, torch.Tensor) or index.device.type != "tpu" \
            or index.dtype not in (torch.int64, torch.int32) or index.numel() == 0:
        # (PyTorch's index dtypes; uint8/bool are masks, and the ops reject the
        # others with their own errors, which a check cast to int8 must not preempt)
        return
    flags = index_bounds_op(index, int(size), bool(negative))
    if text is None:
        text = _TEXT if dim is not None else _TAKE_TEXT

    def make_error(value: np.ndarray) -> BaseException | None:
        if not value[0]:
            return None
        return asserts.DeviceIndexError(
            text.format(op=op, value=int(value[1]), dim=dim, size=size) + WHERE)

    asserts.defer(flags, make_error)


def check_indices(op: str, x: torch.Tensor, indices: Any) -> None:
    """Advanced indexing: indices[i] indexes dimension i of `x` (None: a slice)."""
    for d, idx in enumerate(indices):
        if idx is not None and d < x.dim():
            check(op, idx, x.shape[d], d, True)


def _dim_size(x: torch.Tensor, dim: int) -> tuple[int, int] | None:
    """(size, dim) of `x` along `dim`; None for a bad dim (the op raises its own error)."""
    n = max(x.dim(), 1)
    d = dim + n if dim < 0 else dim
    if not 0 <= d < n:
        return None
    return (x.shape[d] if x.dim() else 1), d


def _along_dim(negative: bool, tensor: str = "self", index: str = "index") -> Callable:
    def spec(a: dict) -> list:
        if not isinstance(a[tensor], torch.Tensor) or not isinstance(a["dim"], int):
            return []
        got = _dim_size(a[tensor], a["dim"])
        return [] if got is None else [(a[index], got[0], got[1], negative)]

    return spec


def _flat(a: dict) -> list:
    return [(a["index"], a["self"].numel(), None, True)]


def _rows(a: dict) -> list:
    # A weight that is not 2-D is the op's own error (raised after this check).
    if not isinstance(a["weight"], torch.Tensor) or a["weight"].dim() != 2:
        return []
    return [(a["indices"], a["weight"].shape[0], 0, False)]


def _bag_rows(a: dict) -> list:
    return [(*spec, _BAG_TEXT) for spec in _rows(a)]


aten = torch.ops.aten

# functional overload -> the (index, size, dim, negative ok) it must check.
_SPECS: dict = {
    aten.gather.default: _along_dim(False),
    aten.scatter.src: _along_dim(False),
    aten.scatter.value: _along_dim(False),
    aten.scatter.reduce: _along_dim(False),
    aten.scatter.value_reduce: _along_dim(False),
    aten.scatter_add.default: _along_dim(False),
    aten.scatter_reduce.two: _along_dim(False),
    aten.index_select.default: _along_dim(False),
    aten.index_add.default: _along_dim(False),
    aten.index_copy.default: _along_dim(False),
    aten.index_reduce.default: _along_dim(False),
    aten.index_fill.int_Scalar: _along_dim(True),
    aten.index_fill.int_Tensor: _along_dim(True),
    aten.take.default: _flat,
    aten.put.default: _flat,
    aten.embedding.default: _rows,
    aten._embedding_bag.default: _bag_rows,
    aten._embedding_bag_forward_only.default: _bag_rows,
}


def spec_for(op: Any) -> Callable | None:
    """The bounds checks of `op` (or of its functional form), None without any."""
    if not ENABLED:
        return None
    spec = _SPECS.get(op)
    if spec is None:
        try:
            spec = _SPECS.get(calling.functional_of(op))
        except Exception:  # noqa: BLE001 - an op without a functional form
            return None
    return spec


def guard(op: Any, kernel: Callable) -> Callable:
    """`kernel` preceded by `op`'s bounds checks (`kernel` itself when none)."""
    spec = spec_for(op)
    if spec is None:
        return kernel
    name = op._schema.name

    def guarded(*args, **kwargs):
        a = calling.bind(op, args, kwargs)
        for spec_args in spec(a):
            check(name, *spec_args)
        return kernel(*args, **kwargs)

    guarded.__name__ = str(op)
    return guarded
