"""Indexing lowerings: advanced indexing, index_put, gather/scatter, masks.

Index tensors and out-of-range indices
--------------------------------------
PyTorch's CPU kernels check every index and raise `IndexError`/`RuntimeError`
for one out of range. Checking a device index tensor would mean reading it on
the host before every op (a sync that serializes the program), so here:

* indices that live on the host (CPU index tensors in `x[idx]`, which PyTorch
  allows for device tensors) are checked before they are copied to the device,
  and raise what the CPU raises;
* device index tensors are not checked. The result is deterministic:
  out-of-range *reads* (index, index_select, gather, take) produce the fill
  value of JAX's "fill" mode: NaN for floating and complex dtypes, the minimum
  of a signed integer dtype, the maximum of an unsigned one, True for bool;
  out-of-range *writes* (index_put, index_add/copy/fill, scatter*, put) are
  dropped. Where PyTorch wraps negative indices (advanced indexing, take, put,
  index_fill) we wrap them too; where it rejects them (gather, scatter*,
  index_select, index_add, index_copy) a negative index counts as out of
  range.

Boolean masks
-------------
`x[mask]` has a data-dependent shape: the kernel for `index.Tensor` turns each
bool/uint8 mask into `nonzero()` indices first (one device-to-host read, as
CUDA does) and then runs the integer-index executable, so integer indexing is
one cached executable and never syncs. `x[mask] = v` does not need the count
when `v` is the same for every selected element (a scalar, or a value that
broadcasts over the selected dimension): it becomes a `where` with no sync.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from . import bounds, core
from .registry import lower, out_dtype, out_meta
from .fallback import cpu_fallback
from ..runtime import executor, overlap, verdict
from ..runtime import storage as st
from .reductions import type_name

aten = torch.ops.aten


def _is_mask_dtype(dtype) -> bool:
    return dtype in (jnp.bool_, jnp.uint8)


def _norm_dim(dim, ndim):
    n = max(ndim, 1)
    return dim + n if dim < 0 else dim


# -- advanced indexing ---------------------------------------------------------


def _index_tuple(x, indices):
    tup = []
    for idx in indices:
        if idx is None:
            tup.append(slice(None))
        else:
            idx = jnp.asarray(idx)
            if _is_mask_dtype(idx.dtype):
                raise RuntimeError(
                    "index: boolean mask indices have a data-dependent shape and must be "
                    "converted to integer indices before the executable is built")
            tup.append(idx)
    return tuple(tup)


def _index_result_shape(x_shape, indices):
    """Shape of x[indices] (numpy/PyTorch advanced indexing rules)."""
    adv = [i for i, idx in enumerate(indices) if idx is not None]
    bshape = jnp.broadcast_shapes(*[tuple(indices[i].shape) for i in adv]) if adv else ()
    rest = list(x_shape[len(indices):])
    if not adv:
        return tuple(x_shape)
    adjacent = adv == list(range(adv[0], adv[-1] + 1))
    kept_before = [x_shape[i] for i in range(len(indices)) if indices[i] is None and i < adv[0]]
    kept_after = [x_shape[i] for i in range(len(indices)) if indices[i] is None and i > adv[0]]
    if adjacent:
        return tuple(kept_before) + tuple(bshape) + tuple(kept_after) + tuple(rest)
    return tuple(bshape) + tuple(kept_before) + tuple(kept_after) + tuple(rest)


@lower(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(x, indices):
    return x.at[_index_tuple(x, indices)].get(mode="fill")


def _mask_where_plan(x_shape, indices, values_shape):
    """For `x[mask] = v` without a sync: (position, mask ndim) or None.

    Applies when the only index is one bool/uint8 mask (after leading Nones)
    and the value does not depend on how many elements the mask selects.
    """
    tensors = [(i, idx) for i, idx in enumerate(indices) if idx is not None]
    if len(tensors) != 1:
        return None
    p, mask = tensors[0]
    if not _is_mask_dtype(_dtype_of(mask)):
        return None
    mshape = tuple(mask.shape)
    k = len(mshape)
    if k == 0 or tuple(x_shape[p:p + k]) != mshape:
        return None
    post = len(x_shape) - p - k
    vs = tuple(values_shape)
    # values broadcast against pre + (K,) + post: the K position must be 1 or
    # absent (else the count decides, and the nonzero path checks it).
    if len(vs) > post and vs[len(vs) - post - 1] != 1:
        return None
    if not _expandable(_strip_ones(vs, p + 1 + post),
                       tuple(x_shape[:p]) + (1,) + tuple(x_shape[p + k:])):
        return None
    return p, k


def _strip_ones(shape, ndim):
    shape = tuple(shape)
    while len(shape) > ndim and shape[0] == 1:
        shape = shape[1:]
    return shape


def _dtype_of(t):
    if isinstance(t, torch.Tensor):
        return {torch.bool: jnp.bool_, torch.uint8: jnp.uint8}.get(t.dtype, None)
    return jnp.asarray(t).dtype


def _strip_leading_ones(v, ndim):
    while v.ndim > ndim and v.shape[0] == 1:
        v = v.reshape(v.shape[1:])
    return v


def _index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    values = jnp.asarray(values).astype(x.dtype)
    plan = _mask_where_plan(x.shape, indices, values.shape)
    if plan is not None:
        p, k = plan
        mask = jnp.asarray(indices[p]).astype(bool)
        pre, post = x.shape[:p], x.shape[p + k:]
        v = _strip_leading_ones(values, len(pre) + 1 + len(post))
        v = jnp.broadcast_to(v, pre + (1,) + post).reshape(pre + (1,) * k + post)
        m = mask.reshape((1,) * p + mask.shape + (1,) * len(post))
        if accumulate:
            if x.dtype == jnp.bool_:
                return x | (m & v)
            return x + jnp.where(m, v, jnp.zeros((), x.dtype))
        return jnp.where(m, v, x)
    tup = _index_tuple(x, indices)
    rshape = _index_result_shape(x.shape, [None if i is None else jnp.asarray(i)
                                           for i in indices])
    values = _strip_leading_ones(values, len(rshape))
    values = jnp.broadcast_to(values, rshape)
    if accumulate:
        if x.dtype == jnp.bool_:  # bool accumulation is a logical or
            return x.at[tup].max(values, mode="drop")
        return x.at[tup].add(values, mode="drop")
    return x.at[tup].set(values, mode="drop")


@lower(aten._index_put_impl.default)
def _index_put_impl_lowering(x, indices, values, accumulate=False, unsafe=False):
    return _index_put_impl(x, indices, values, accumulate)


@lower(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(x, indices, values, accumulate=False):
    return _index_put_impl(x, indices, values, accumulate)


# -- kernels: turn masks and host indices into device integer indices ----------


def _host_check(idx: torch.Tensor, size: int, dim: int):
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    bad = lo if lo < -size else (hi if hi >= size else None)
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def _warn_user(message: str) -> None:
    """A UserWarning attributed to the first caller outside torch and
    torch_tpu, as PyTorch's TORCH_WARN attributes it to the Python line that
    indexed (so each indexing line warns once under the default filter)."""
    import os
    import sys
    import warnings

    roots = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))
    level, frame = 2, sys._getframe(1)  # stacklevel 2: _warn_user's caller
    while frame is not None and frame.f_code.co_filename.startswith(roots):
        frame = frame.f_back
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _mask_indices(mask: torch.Tensor, x_shape, dim: int):
    """The integer index tensors (on tpu) selecting the True elements of `mask`."""
    k = mask.dim()
    for j in range(k):
        if dim + j >= len(x_shape) or mask.shape[j] != x_shape[dim + j]:
            raise IndexError(
                f"The shape of the mask {list(mask.shape)} at index {j} does not match the "
                f"shape of the indexed tensor {list(x_shape)} at index {dim + j}")
    if mask.dtype == torch.uint8:
        mask = mask != 0
    nz = torch.ops.aten.nonzero.default(mask)  # one device-to-host read
    return list(nz.unbind(1))


def _shape_str(shape) -> str:
    return str(list(shape))


def _broadcast_indices(new, x_shape):
    """PyTorch's index canonicalization after masks became integer indices:
    every index tensor broadcast to one shape (expanded views), PyTorch's
    IndexError when they cannot be, and when a non-empty index addresses a
    dimension of size 0. JAX then sees only index arrays of one shape."""
    tensors = [(d, t) for d, t in new if t is not None]
    if not tensors:
        return [t for _, t in new], False
    shapes = [tuple(t.shape) for _, t in tensors]
    try:
        common = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                         "with shapes " + ", ".join(_shape_str(s) for s in shapes)) from None
    if math.prod(common) > 0:
        for d, _ in tensors:
            if d < len(x_shape) and x_shape[d] == 0:
                raise IndexError("index is out of bounds for dimension with size 0")
    changed = False
    out = []
    for _, t in new:
        if t is not None and tuple(t.shape) != common:
            t = t.expand(common)
            changed = True
        out.append(t)
    return out, changed


def _prepare_indices(x: torch.Tensor, indices, values=None):
    """Indices the lowering can take, or None for 'no change'.

    Returns (new_indices, fallback): fallback True means the case is not
    handled (0-dim masks) and the caller should use the CPU.
    """
    changed = False
    new = []  # (dimension of x it indexes, index tensor or None)
    dim = 0
    device = x.device
    for idx in indices:
        if idx is not None and idx.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    keep_mask = values is not None and _mask_where_plan(
        tuple(x.shape), indices, tuple(values.shape)) is not None \
        and all(i is None or i.device.type == "tpu" for i in indices)
    for idx in indices:
        if idx is None:
            new.append((dim, None))
            dim += 1
            continue
        is_mask = idx.dtype in (torch.bool, torch.uint8)
        if is_mask:
            if idx.dim() == 0:
                return None, True
            if idx.dtype == torch.uint8:
                _warn_user("indexing with dtype torch.uint8 is now deprecated, please use a "
                           "dtype torch.bool instead.")
            if keep_mask:
                return None, False  # one mask, written with a where: no canonical form
            if idx.device.type != "tpu":
                idx = idx.to(device)
            new.extend((dim + j, t) for j, t in enumerate(_mask_indices(idx, tuple(x.shape), dim)))
            dim += idx.dim()
            changed = True
            continue
        if idx.device.type != "tpu":
            if dim < x.dim():
                _host_check(idx, x.shape[dim], dim)
            idx = idx.to(device)
            changed = True
        new.append((dim, idx))
        dim += 1
    out, expanded = _broadcast_indices(new, tuple(x.shape))
    return (out if changed or expanded else None), False


# The executable cache keys a `Tensor?[]` argument by its length and its
# tensors, not by where its Nones are, so [i, None, j] and [None, i, j] would
# share an executable. Until the executor keys the None positions, the kernels
# below drop trailing Nones (which change nothing) and, for the rare lists
# that are still ambiguous (a None before the last of several tensors), index
# a permuted view whose indexed dims come first (no Nones at all).


def _strip(indices):
    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    return indices


def _ambiguous(indices):
    n_t = sum(i is not None for i in indices)
    return n_t >= 2 and any(i is None for i in indices)


def _front_plan(x, indices):
    """(perm, tensors, p, nb, adjacent) to index x.permute(perm) with tensors only."""
    T = [d for d, i in enumerate(indices) if i is not None]
    N = [d for d, i in enumerate(indices) if i is None]
    rest = list(range(len(indices), x.dim()))
    tensors = [indices[d] for d in T]
    nb = len(torch.broadcast_shapes(*[tuple(t.shape) for t in tensors]))
    adjacent = T == list(range(T[0], T[-1] + 1))
    return T + N + rest, tensors, T[0], nb, adjacent


def _to_front(res, p, nb):
    """Result of the permuted indexing -> PyTorch's layout (adjacent case)."""
    return res.movedim(tuple(range(nb)), tuple(range(p, p + nb)))


def _index_kernel(op):
    def kernel(self, indices):
        new, cpu = _prepare_indices(self, indices)
        if cpu:
            return cpu_fallback(op, self, indices)

        runner = executor.runner_for(op)
        indices = _strip(indices if new is None else new)
        bounds.check_indices(op._schema.name, self, indices)
        if not _ambiguous(indices):
            return runner(self, indices)
        perm, tensors, p, nb, adjacent = _front_plan(self, indices)
        res = runner(self.permute(perm), tensors)
        return _to_front(res, p, nb) if adjacent and p else res

    kernel.__name__ = str(op)
    return kernel


_INPLACE_PUT = (aten.index_put_.default, aten._index_put_impl_.default)


C10_TYPE_NAMES = {
    torch.float64: "Double", torch.float32: "Float", torch.float16: "Half",
    torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
    torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble", torch.complex32: "ComplexHalf",
}


def _masked_fill_path(self, indices, values) -> bool:
    """CPU's index_put_ writes a one-element host value through one bool/uint8
    mask with masked_fill_ (no dtype or shape check): canDispatchToMaskedFill."""
    if values.numel() != 1 or values.device.type != "cpu":
        return False
    masks = [i for i in indices if i is not None]
    return (len(masks) == 1 and masks[0].dtype in (torch.bool, torch.uint8)
            and masks[0].device == self.device)


def _expandable(shape, desired) -> bool:
    if len(shape) > len(desired):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(desired)))


def _check_put(self, indices, values):
    """CPU's index_put_ checks (make_index_put_iterator): the value broadcasts
    to the indexing result and has the destination's dtype. `indices` are
    canonical (integer tensors of one shape, or one kept mask)."""
    if _masked_fill_path(self, indices, values):
        return
    if not any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        shape = _index_result_shape(tuple(self.shape), [
            None if i is None else torch.empty(tuple(i.shape), device="meta") for i in indices])
        if not _expandable(tuple(values.shape), shape):
            raise RuntimeError(f"shape mismatch: value tensor of shape {_shape_str(values.shape)} "
                               f"cannot be broadcast to indexing result of shape "
                               f"{_shape_str(shape)}")
    if values.dtype != self.dtype:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{C10_TYPE_NAMES.get(self.dtype, self.dtype)} for the destination and "
            f"{C10_TYPE_NAMES.get(values.dtype, values.dtype)} for the source.")


def _index_put_kernel(op):
    def kernel(self, indices, values, *args, **kwargs):
        new, cpu = _prepare_indices(self, indices, values)
        if cpu:
            return cpu_fallback(op, self, indices, values, *args, **kwargs)
        _check_put(self, indices if new is None else new, values)

        runner = executor.runner_for(op)
        indices = _strip(indices if new is None else new)
        bounds.check_indices(op._schema.name, self, indices)
        if not _ambiguous(indices):
            return runner(self, indices, values, *args, **kwargs)
        perm, tensors, p, nb, adjacent = _front_plan(self, indices)
        xp = self.permute(perm)
        shape = _index_result_shape(tuple(self.shape), [
            None if i is None else torch.empty(tuple(i.shape), device="meta") for i in indices])
        v = values
        while v.dim() > len(shape) and v.shape[0] == 1:
            v = v.squeeze(0)
        v = v.expand(shape)
        if adjacent and p:
            v = v.movedim(tuple(range(p, p + nb)), tuple(range(nb)))
        res = runner(xp, tensors, v, *args, **kwargs)
        if op in _INPLACE_PUT:
            return self
        inv = [0] * len(perm)
        for k, d in enumerate(perm):
            inv[d] = k
        return res.permute(inv)

    kernel.__name__ = str(op)
    return kernel


for _op in (aten.index.Tensor, aten._unsafe_index.Tensor):
    core.KERNELS[_op] = _index_kernel(_op)
for _op in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl.default,
            aten._index_put_impl_.default, aten._unsafe_index_put.default):
    core.KERNELS[_op] = _index_put_kernel(_op)


# -- index_select / index_add / index_copy / index_fill -------------------------


def _neg_oob(index, size):
    """Negative indices count as out of range (PyTorch rejects them here)."""
    return jnp.where(index < 0, size, index)


def _as1d(x):
    return x.reshape(1) if x.ndim == 0 else x


@lower(aten.index_select.default)
def index_select(x, dim, index):
    if jnp.ndim(index) > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if jnp.asarray(index).dtype not in (jnp.int32, jnp.int64):
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    shape = tuple(out_meta().shape)
    x1 = _as1d(x)
    d = _norm_dim(dim, x.ndim)
    idx = _neg_oob(jnp.asarray(index).reshape(-1), x1.shape[d])
    out = jnp.take(x1, idx, axis=d, mode="fill")
    return out.reshape(shape)


def _index_dim_tuple(d, index):
    return (slice(None),) * d + (index,)


def _source_for(x1, d, n, source):
    """source reshaped to x1's shape with dim d of size n."""
    want = x1.shape[:d] + (n,) + x1.shape[d + 1:]
    return jnp.asarray(source).astype(x1.dtype).reshape(want)


@lower(aten.index_add.default)
def index_add(x, dim, index, source, *, alpha=1):
    x1 = _as1d(x)
    d = _norm_dim(dim, x.ndim)
    xs, ss = list(x.shape), list(jnp.shape(source))
    if xs and ss:
        del xs[d], ss[d:d + 1]
    if xs != ss:
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified "
            f"dimension. Got self.shape = {list(x.shape)} source.shape = {list(jnp.shape(source))}")
    idx = _neg_oob(jnp.asarray(index).reshape(-1), x1.shape[d])
    src = _source_for(x1, d, idx.shape[0], source)
    if x1.dtype == jnp.bool_:
        src = jnp.logical_and(src, alpha != 0) if not isinstance(alpha, bool) else (
            src if alpha else jnp.zeros_like(src))
        out = x1.at[_index_dim_tuple(d, idx)].max(src, mode="drop")
    else:
        if not (isinstance(alpha, (int, float)) and alpha == 1):
            src = (src * alpha).astype(x1.dtype)
        out = x1.at[_index_dim_tuple(d, idx)].add(src, mode="drop")
    return out.reshape(x.shape)


@lower(aten.index_copy.default)
def index_copy(x, dim, index, source):
    x1 = _as1d(x)
    d = _norm_dim(dim, x.ndim)
    idx = _neg_oob(jnp.asarray(index).reshape(-1), x1.shape[d])
    src = _source_for(x1, d, idx.shape[0], source)
    return x1.at[_index_dim_tuple(d, idx)].set(src, mode="drop").reshape(x.shape)


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    x1 = _as1d(x)
    d = _norm_dim(dim, x.ndim)
    idx = jnp.asarray(index).reshape(-1)
    v = _cast_scalar(value, x1.dtype)
    return x1.at[_index_dim_tuple(d, idx)].set(v, mode="drop").reshape(x.shape)


def _cast_scalar(v, dtype):
    v = jnp.asarray(v)
    if jnp.issubdtype(v.dtype, jnp.complexfloating) and not jnp.issubdtype(
            dtype, jnp.complexfloating):
        v = jnp.real(v)
    if dtype == jnp.bool_:
        return v != 0
    return v.astype(dtype)


# -- gather / scatter -----------------------------------------------------------


def _grid(index, d):
    """Full index tuple for scatter/gather along d: iotas elsewhere, index at d."""
    shape = index.shape
    tup = []
    for k in range(len(shape)):
        if k == d:
            tup.append(index)
        else:
            tup.append(lax.broadcasted_iota(index.dtype, shape, k))
    return tuple(tup)


@lower(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    index = jnp.asarray(index)
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    x1 = x.reshape(1) if x.ndim == 0 else x
    i1 = index.reshape(1) if index.ndim == 0 else index
    d = _norm_dim(dim, x.ndim)
    idx = _neg_oob(i1, x1.shape[d])
    out = x1.at[_grid(idx, d)].get(mode="fill", wrap_negative_indices=False)
    return out.reshape(index.shape)


def _scatter_prepare(x, dim, index, src):
    index = jnp.asarray(index)
    x1 = x.reshape(1) if x.ndim == 0 else x
    i1 = index.reshape(1) if index.ndim == 0 else index
    d = _norm_dim(dim, x.ndim)
    if not isinstance(src, (int, float, bool, complex)):
        src = jnp.asarray(src)
        if src.ndim == 0 and index.ndim == 0:
            src = src.reshape(1)
        if src.ndim > 0:
            src = src[tuple(slice(0, n) for n in i1.shape)]
        src = src.astype(x1.dtype)
    else:
        src = _cast_scalar(src, x1.dtype)
    idx = _neg_oob(i1, x1.shape[d])
    return x1, _grid(idx, d), src


def _scatter_apply(x1, grid, src, mode):
    at = x1.at[grid]
    kw = dict(mode="drop", wrap_negative_indices=False)
    if mode is None:
        return at.set(src, **kw)
    if mode in ("add", "sum"):
        if x1.dtype == jnp.bool_:
            return at.max(src, **kw)
        return at.add(src, **kw)
    if mode in ("multiply", "prod"):
        if x1.dtype == jnp.bool_:
            return at.min(src, **kw)
        return at.multiply(src, **kw)
    if mode == "amax":
        return at.max(src, **kw)
    if mode == "amin":
        return at.min(src, **kw)
    raise RuntimeError(f"scatter: unknown reduce {mode!r}")


@lower(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    if jnp.size(index) == 0:
        return x
    x1, grid, src = _scatter_prepare(x, dim, index, src)
    return _scatter_apply(x1, grid, src, None).reshape(x.shape)


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    if jnp.size(index) == 0:
        return x
    x1, grid, src = _scatter_prepare(x, dim, index, src)
    return _scatter_apply(x1, grid, src, reduce).reshape(x.shape)


@lower(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    if jnp.size(index) == 0:
        return x
    x1, grid, src = _scatter_prepare(x, dim, index, src)
    return _scatter_apply(x1, grid, src, "add").reshape(x.shape)


def _identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.array(reduce == "amin")
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.array(info.min if reduce == "amax" else info.max, dtype)


def _scatter_reduce(x1, grid, src, reduce, include_self):
    dtype = x1.dtype
    kw = dict(mode="drop", wrap_negative_indices=False)
    base = x1
    if not include_self:
        hit = jnp.zeros(x1.shape, bool).at[grid].set(True, **kw)
        base = jnp.where(hit, _identity(reduce, dtype), x1)
    if reduce == "mean":
        total = _scatter_apply(base, grid, src, "sum")
        count = jnp.zeros(x1.shape, jnp.int64).at[grid].add(1, **kw)
        if include_self:
            count = count + 1
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
            return (total / count.astype(dtype)).astype(dtype)
        return jnp.floor_divide(total, count.astype(dtype)).astype(dtype)
    if reduce in ("amax", "amin") and jnp.issubdtype(dtype, jnp.floating):
        # PyTorch propagates NaN through amax/amin.
        out = _scatter_apply(base, grid, src, reduce)
        nan_hit = jnp.zeros(x1.shape, bool).at[grid].max(jnp.isnan(src), **kw)
        return jnp.where(nan_hit | jnp.isnan(base), jnp.nan, out).astype(dtype)
    return _scatter_apply(base, grid, src, reduce)


@lower(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if jnp.size(index) == 0:
        return x
    x1, grid, src = _scatter_prepare(x, dim, index, src)
    return _scatter_reduce(x1, grid, src, reduce, include_self).reshape(x.shape)


@lower(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    x1 = _as1d(x)
    d = _norm_dim(dim, x.ndim)
    idx = _neg_oob(jnp.asarray(index).reshape(-1), x1.shape[d])
    src = _source_for(x1, d, idx.shape[0], source)
    if idx.shape[0] == 0:
        return x
    shape = [1] * src.ndim
    shape[d] = idx.shape[0]
    full = jnp.broadcast_to(idx.reshape(shape), src.shape)
    grid = _grid(full, d)
    return _scatter_reduce(x1, grid, src, reduce, include_self).reshape(x.shape)


def _torch_type_name(dtype):

    return type_name(st.TORCH_TO_JAX[dtype])


def _check_index_reduce(self, dim, index, source, reduce, *, include_self=True, out=None):
    """CPU's argument checks of index_reduce, in CPU's order and with its texts
    (its structured meta function, then its kernel's dtype dispatch).

    PyTorch's Python meta kernel, which the tpu runner consults, makes only
    some of them: without this, reduce="sum", a source of another dtype or
    with the wrong number of rows ran and returned a wrong result, and an
    out-of-range dim raised a bare "tuple index out of range".
    """
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError("index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin but got {reduce}.")
    n = max(self.dim(), 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    d = dim % n
    if index.dim() > 1:
        raise IndexError(f"index_reduce_(): Index is supposed to be a vector, but got dim: "
                         f"{index.dim()} with type: {_torch_type_name(index.dtype)} and size: "
                         f"{list(index.shape)}")
    if index.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("index_reduce_(): Expected dtype int32/int64 for index but got: "
                           f"{_torch_type_name(index.dtype)}")
    if self.dtype != source.dtype:
        raise RuntimeError(f"index_reduce_(): self ({_torch_type_name(self.dtype)}) and source "
                           f"({_torch_type_name(source.dtype)}) must have the same scalar type")
    if not (d == 0 or d < source.dim()):
        raise RuntimeError(f"index_reduce_(): Indexing dim {d} is out of bounds of the source "
                           f"tensor with dim {source.dim()}")
    rows = 1 if source.dim() == 0 else source.shape[d]
    if index.numel() != rows:
        if source.dim() == 0:  # CPU's message reads source.size(0)
            raise IndexError("Dimension specified as 0 but tensor has no dimensions")
        raise RuntimeError(f"index_reduce_(): Number of indices ({index.numel()}) should be "
                           f"equal to source.size(dim): ({rows}), for dim: {d}")
    self_rest, source_rest = list(self.shape), list(source.shape)
    if self.dim() and source.dim():
        del self_rest[d], source_rest[d]
    if self_rest != source_rest:
        raise RuntimeError("source tensor shape must match self tensor shape, excluding the "
                           f"specified dimension. Got self.shape = {list(self.shape)} "
                           f"source.shape = {list(source.shape)}")
    if self.dtype not in _INDEX_REDUCE_DTYPES:
        raise NotImplementedError(
            f"\"index_func_\" not implemented for '{_torch_type_name(self.dtype)}'")


# CPU's kernel dispatches over all types and half, bfloat16 (no bool, complex,
# float8 or the wide unsigned types).
_INDEX_REDUCE_DTYPES = frozenset({
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64})


def _check_written(written, *inputs):
    """CPU's at::assert_no_internal_overlap(written) and
    at::assert_no_overlap(written, input) for each input."""

    if any(st == 0 and sz > 1 for sz, st in zip(written.shape, written.stride())):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to "
            "a single memory location. Please clone() the tensor before performing the "
            "operation.")
    _check_written_inputs(written, inputs)


def _index_reduce_check(op):
    """The checks of `op` (an index_reduce overload), its errors carrying the
    op's name after CPU's text; the in-place and out= overloads also check the
    written tensor's memory as CPU does."""
    def run(self, dim, index, source, *args, **kwargs):
        try:
            _check_index_reduce(self, dim, index, source, *args, **kwargs)
            written = kwargs.get("out") if op is aten.index_reduce.out else (
                self if op is aten.index_reduce_.default else None)
            if written is not None:
                _check_written(written, index, source)
        except (RuntimeError, IndexError, NotImplementedError) as e:
            raise type(e)(f"{e} ({op})") from None

    return run


for _op in (aten.index_reduce.default, aten.index_reduce_.default, aten.index_reduce.out):
    core.KERNELS[_op] = core.checked_kernel(_op, _index_reduce_check(_op))


# -- masks ----------------------------------------------------------------------


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    dtype = out_dtype()
    v = _cast_scalar(value, dtype)
    return jnp.where(jnp.asarray(mask), v, x.astype(dtype))


def _cpu_value_kernel(op, scalar_op, pos):
    """op's Tensor `value` (argument `pos`) may be a CPU 0-dim tensor, as on
    CUDA; PyTorch's meta check rejects that, so use the Scalar overload."""
    def kernel(*args, **kwargs):
        value = args[pos] if len(args) > pos else kwargs.get("value")
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0:
            args = list(args)
            if len(args) > pos:
                args[pos] = value.item()
            else:
                kwargs = dict(kwargs, value=value.item())
            return executor.runner_for(scalar_op)(*args, **kwargs)
        return executor.runner_for(op)(*args, **kwargs)

    kernel.__name__ = str(op)
    return kernel


def _value_check_kernel(op, inner, pos, complex_error=None):
    """A kernel for `op` whose fill value (argument `pos`, or `value`) CPU
    converts to self's dtype on the host before the op runs (index_fill,
    masked_fill, scatter with a value): a number the dtype cannot hold raises
    c10's "value cannot be converted to type T without overflow" (op named
    after CPU's text). `complex_error`: the message of ops that refuse any
    complex value for a real tensor (index_fill). A CPU 0-dim value is read
    (it is on the host); a tpu 0-dim value is checked by dtype only, so no
    call reads the device. Then `inner` runs the op."""
    def kernel(*args, **kwargs):
        self = args[0] if args else kwargs["self"]
        value = args[pos] if len(args) > pos else kwargs.get("value")
        is_tensor = isinstance(value, torch.Tensor)
        if complex_error is not None and not self.is_complex() and (
                value.is_complex() if is_tensor else isinstance(value, complex)):
            raise RuntimeError(complex_error)
        host = value
        if is_tensor:
            host = value.item() if value.device.type == "cpu" and value.dim() == 0 else None
        try:
            core.check_scalar_fits("", host, self.dtype)
        except RuntimeError as e:  # CPU's text (no op prefix), the op named after it
            raise RuntimeError(f"{str(e).removeprefix(': ')} ({op})") from None
        return inner(*args, **kwargs)

    kernel.__name__ = str(op)
    return kernel


for _op, _sop, _pos in ((aten.masked_fill.Tensor, aten.masked_fill.Scalar, 2),
                        (aten.masked_fill_.Tensor, aten.masked_fill_.Scalar, 2),
                        (aten.index_fill.int_Tensor, aten.index_fill.int_Scalar, 3),
                        (aten.index_fill_.int_Tensor, aten.index_fill_.int_Scalar, 3)):
    core.KERNELS[_op] = _cpu_value_kernel(_op, _sop, _pos)


def _runner(op):
    def run(*args, **kwargs):
        return executor.runner_for(op)(*args, **kwargs)

    return run


_INDEX_FILL_COMPLEX = ("index_fill_(): Converting complex Scalar to non-complex type is "
                       "not supported")
for _op, _pos, _complex in (
        (aten.index_fill.int_Scalar, 3, _INDEX_FILL_COMPLEX),
        (aten.index_fill_.int_Scalar, 3, _INDEX_FILL_COMPLEX),
        (aten.masked_fill.Scalar, 2, None), (aten.masked_fill_.Scalar, 2, None),
        (aten.scatter.value, 3, None), (aten.scatter_.value, 3, None),
        (aten.scatter.value_out, 3, None), (aten.scatter.value_reduce, 3, None),
        (aten.scatter_.value_reduce, 3, None), (aten.scatter.value_reduce_out, 3, None)):
    core.KERNELS[_op] = _value_check_kernel(_op, _runner(_op), _pos, _complex)
for _op, _pos, _complex in (
        (aten.index_fill.int_Tensor, 3, _INDEX_FILL_COMPLEX),
        (aten.index_fill_.int_Tensor, 3, _INDEX_FILL_COMPLEX),
        (aten.masked_fill.Tensor, 2, None), (aten.masked_fill_.Tensor, 2, None)):
    core.KERNELS.replace(_op, _value_check_kernel(_op, core.KERNELS[_op], _pos, _complex))


@lower(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    if jnp.asarray(mask).dtype != jnp.bool_:
        raise RuntimeError("masked_scatter_ only supports boolean masks, but got mask with "
                           f"dtype {type_name(jnp.asarray(mask).dtype)}")
    shape = tuple(out_meta().shape)
    m = jnp.broadcast_to(jnp.asarray(mask), shape).reshape(-1)
    xb = jnp.broadcast_to(x, shape).reshape(-1)
    src = jnp.asarray(source).reshape(-1).astype(x.dtype)
    if src.shape[0] == 0:
        return xb.reshape(shape)
    pos = jnp.cumsum(m.astype(jnp.int64)) - 1
    vals = src.at[jnp.clip(pos, 0, src.shape[0] - 1)].get(mode="clip")
    return jnp.where(m, vals, xb).reshape(shape)


# -- flat take / put --------------------------------------------------------------


@lower(aten.take.default)
def take(x, index):
    flat = x.reshape(-1)
    index = jnp.asarray(index)
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    return flat.at[index].get(mode="fill")


@lower(aten.put.default)
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    index = jnp.asarray(index).reshape(-1)
    src = jnp.asarray(source).reshape(-1).astype(x.dtype)
    if index.size == 0:
        return x
    if accumulate:
        if x.dtype == jnp.bool_:
            return flat.at[index].max(src, mode="drop").reshape(x.shape)
        return flat.at[index].add(src, mode="drop").reshape(x.shape)
    return flat.at[index].set(src, mode="drop").reshape(x.shape)


# -- memory overlap of indexing writes --------------------------------------------
#
# CPU's kernels check the tensor they write: an in-place index_add_/index_copy_/
# scatter*_/put_/masked_scatter_ into an expanded tensor (one element stored for
# several) raises (at::assert_no_internal_overlap), index_fill_/index_put_/
# masked_fill_ only warn that it is deprecated; and the written tensor may not
# share memory with the index or the source (at::assert_no_overlap). tpu keeps
# those rules: the lowering itself would compute some answer for either case.

# op base name -> (an expanded written tensor: "error" or "warn", the arguments
# checked against the written tensor).
_WRITE_RULES = {
    "index_add": ("error", ("index", "source")),
    "index_copy": ("error", ("index", "source")),
    "index_fill": ("warn", ("index",)),
    "scatter": ("error", ("index", "src")),
    "scatter_add": ("error", ("index", "src")),
    "scatter_reduce": ("error", ("index", "src")),
    "put": ("error", ("index", "source")),
    "masked_scatter": ("error", ()),
    "index_put": ("warn", ("indices", "values")),
    "_index_put_impl": ("warn", ("indices", "values")),
    "masked_fill": ("warn", ()),
}
# CPU's in-place scatter_(..., src, reduce=) (only that overload) also warns,
# once per process:
_SCATTER_REDUCE_WARNED: list = []
_SCATTER_REDUCE_TEXT = ("The reduce argument of torch.scatter with Tensor src is deprecated and will "
                        "be removed in a future PyTorch release. Use torch.scatter_reduce instead "
                        "for more reduction options.")
_WARN_EXAMPLE = {"index_put": "tensor[indices] = tensor"}


def _write_checked_kernel(op, base, written_name, rule):
    """`op`'s kernel (or runner) behind CPU's overlap checks of the tensor it writes."""
    internal, checked = rule
    names = [a.name for a in op._schema.arguments]
    inner = core.KERNELS.get(op)
    runner = None
    label = "index_put" if base == "_index_put_impl" else base  # CPU's text names index_put_
    warn_text = (f"Use of {label}_ on expanded tensors is deprecated. Please clone() the tensor "
                 "before performing this operation. This also applies to advanced indexing e.g. "
                 f"{_WARN_EXAMPLE.get(label, 'tensor[mask] = scalar')}")

    def kernel(*args, **kwargs):
        nonlocal runner
        if op is aten.scatter_.reduce and not _SCATTER_REDUCE_WARNED:
            _SCATTER_REDUCE_WARNED.append(True)  # TORCH_WARN_ONCE: once per process
            _warn_user(_SCATTER_REDUCE_TEXT)
        bound = dict(zip(names, args))
        bound.update(kwargs)
        written = bound.get(written_name)
        if isinstance(written, torch.Tensor):
            if internal == "warn":
                if any(st == 0 and sz > 1 for sz, st in zip(written.shape, written.stride())):
                    _warn_user(warn_text)
            try:
                inputs = tuple(t for name in checked for t in _tensor_args(bound.get(name)))
                mask = _fill_mask(base, bound)
                if mask is not None:
                    _check_no_partial_overlap(written, mask)
                elif internal == "error":
                    _check_written(written, *inputs)
                else:
                    _check_written_inputs(written, inputs)
            except RuntimeError as e:
                raise RuntimeError(f"{e} ({op})") from None
        if inner is not None:
            return inner(*args, **kwargs)
        if runner is None:
            runner = executor.runner_for(op)
        return runner(*args, **kwargs)

    kernel.__name__ = str(op)
    return kernel


def _fill_mask(base, bound):
    """The mask of a masked fill: masked_fill_'s, or index_put_'s where CPU runs
    it as masked_fill_ (at::native canDispatchToMaskedFill: no accumulate, one
    value, one bool/uint8 index), as for `x[x] = False`. CPU then refuses only a
    mask partly sharing the written tensor's memory; None for other calls."""
    if base == "masked_fill":
        return bound.get("mask")
    if base not in ("index_put", "_index_put_impl") or bound.get("accumulate"):
        return None
    values = bound.get("values")
    masks = [i for i in bound.get("indices") or () if i is not None]
    if (not isinstance(values, torch.Tensor) or values.numel() != 1 or len(masks) != 1
            or masks[0].dtype not in (torch.bool, torch.uint8)):
        return None
    return masks[0]


def _check_no_partial_overlap(written, mask):
    """at::assert_no_partial_overlap(written, mask)."""
    if isinstance(mask, torch.Tensor) and overlap.partial_overlap(written, mask):
        raise RuntimeError(verdict.PARTIAL_OVERLAP_TEXT)


def _tensor_args(v):
    if isinstance(v, torch.Tensor):
        return (v,)
    if isinstance(v, (list, tuple)):
        return tuple(t for t in v if isinstance(t, torch.Tensor))
    return ()


def _check_written_inputs(written, inputs):
    for t in inputs:
        if overlap.overlaps(written, t):
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to "
                "tensor refer to a single memory location. Please clone() the tensor before "
                "performing the operation.")


def _install_write_checks():
    for base, rule in _WRITE_RULES.items():
        for name, written in ((base + "_", "self"), (base, "out")):
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for ov in packet.overloads():
                op = getattr(packet, ov)
                args = op._schema.arguments
                if not args or not any(a.name == written and a.alias_info is not None
                                       and a.alias_info.is_write for a in args):
                    continue  # the functional overload writes nothing
                core.KERNELS.replace(op, _write_checked_kernel(op, base, written, rule))


_install_write_checks()
