"""Sorting and selection: sort, topk, searchsorted/bucketize, histc, histogram(dd), and the
data-dependent ops (nonzero, masked_select, unique*, bincount).

Sort order follows PyTorch CPU: sorts are stable; ascending puts NaN last,
descending puts NaN first; -0.0 and 0.0 compare equal (lax.sort standardizes
both, so a stable sort keeps them in input order). A descending stable sort
is the reverse of the ascending stable sort of the reversed input, which
keeps equal elements in input order without negating keys (negation would
overflow integer minima and misplace NaN).

Data-dependent output shapes (nonzero, masked_select, unique*, bincount) run
eagerly on concrete arrays (`eager=True`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .._compat import torch_api
from ..runtime import executor, overlap, platform
from ..runtime import storage as st
from . import core
from .opmath import opmath_dtype
from .reductions import reject, type_name, wrap_dim
from .registry import LOWERINGS, lower, out_dtype
from .factories import linspace_exponents
from ..device import module
from .indexing import C10_TYPE_NAMES as names

aten = torch.ops.aten


def _orderable(x):
    return x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x


# -- sort, topk ----------------------------------------------------------------


def sort_last(x, descending=False):
    """Stable sort along the last axis: (values, int32 source indices)."""
    n = x.shape[-1]
    last = x.ndim - 1
    xs = _orderable(x)
    if descending:
        xs = jnp.flip(xs, last)
    iota = lax.broadcasted_iota(jnp.int32, xs.shape, last)
    v, i = lax.sort((xs, iota), dimension=last, is_stable=True, num_keys=1)
    if descending:
        v = jnp.flip(v, last)
        i = (n - 1) - jnp.flip(i, last)
    return v.astype(x.dtype), i


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return sort_stable(x, stable=True, dim=dim, descending=descending)


@lower(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    # The unstable sort is allowed to be stable (PyTorch's CPU sort is).
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise RuntimeError("Sort does not support complex dtypes")
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    if x.shape[d] == 0 or x.size == 0:
        return x, jnp.zeros(x.shape, jnp.int64)
    v, i = sort_last(jnp.moveaxis(x, d, -1), descending)
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d).astype(jnp.int64)


def _order_key(x):
    """An integer key whose order is PyTorch's order of `x`: NaN largest, -0 == 0."""
    x = _orderable(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    bits = np.dtype(x.dtype).itemsize * 8
    itype = {16: jnp.int16, 32: jnp.int32, 64: jnp.int64}[bits]
    i = lax.bitcast_convert_type(x, itype)
    imax = np.iinfo(itype).max
    # Sign-magnitude to two's-complement order; -0.0 maps onto 0.0.
    key = jnp.where(i < 0, -(i & jnp.asarray(imax, itype)), i)
    return jnp.where(jnp.isnan(x), jnp.asarray(imax, itype), key)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise RuntimeError("topk does not support complex dtypes")
    if x.dtype == jnp.bool_:
        raise RuntimeError("topk does not support bool dtypes")
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    xm = jnp.moveaxis(x, d, -1)
    if k == 0 or xm.size == 0:
        shape = xm.shape[:-1] + (k,)
        return (jnp.moveaxis(jnp.zeros(shape, x.dtype), -1, d),
                jnp.moveaxis(jnp.zeros(shape, jnp.int64), -1, d))
    key = _order_key(xm)
    if not largest:
        key = ~key  # order-reversing, no overflow (also for unsigned types)
    _, i = lax.top_k(key, k)
    v = jnp.take_along_axis(xm, i, axis=-1)
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d).astype(jnp.int64)


# -- searchsorted, bucketize, histc ----------------------------------------------


def _searchsorted(seq, values, right):
    reject(seq, "searchsorted", complex_=True, bool_=True)
    reject(values, "searchsorted", complex_=True, bool_=True)
    side = "right" if right else "left"
    if seq.size == 0 or values.size == 0:
        return jnp.zeros(values.shape, jnp.int64)  # nothing to search, or in
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side)
    batch = seq.shape[:-1]
    s = seq.reshape((-1, seq.shape[-1]))
    v = values.reshape((s.shape[0], -1))
    r = jax.vmap(lambda a, b: jnp.searchsorted(a, b, side=side))(s, v)
    return r.reshape(batch + values.shape[-1:])


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int32), axis=-1)
    t = jnp.result_type(seq, x)
    return _searchsorted(seq.astype(t), jnp.asarray(x).astype(t), right or side == "right")


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:
        raise RuntimeError(
            f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    t = jnp.result_type(boundaries, x)
    return _searchsorted(boundaries.astype(t), jnp.asarray(x).astype(t), right)


_HALF_BITS = {np.dtype(jnp.bfloat16): (8, 7), np.dtype(jnp.float16): (5, 10)}


@lower(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    """PyTorch CPU's histc: bin edges in the input dtype, position by linear
    interpolation computed in the input dtype (half types round every step)."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        reject(x, "aminmax", complex_=True)
    if x.dtype == jnp.bool_:
        reject(x, "linspace", bool_=True)
    reject(x, "histogram", integer=True)
    od = out_dtype()
    half = _HALF_BITS.get(np.dtype(x.dtype))
    acc = jnp.float32 if half else x.dtype

    def rnd(v):  # round to the input dtype after each step, like c10::BFloat16/Half math
        return lax.reduce_precision(v, *half) if half else v

    xf = x.reshape(-1).astype(acc)
    lo = jnp.asarray(min, jnp.float64 if acc == jnp.float64 else jnp.float32)
    hi = jnp.asarray(max, lo.dtype)
    if xf.size:
        auto = lo == hi
        lo = jnp.where(auto, jnp.min(xf).astype(lo.dtype), lo)
        hi = jnp.where(auto, jnp.max(xf).astype(hi.dtype), hi)
    same = lo == hi
    lo = rnd(jnp.where(same, lo - 1, lo).astype(acc))
    hi = rnd(jnp.where(same, hi + 1, hi).astype(acc))
    pos = rnd(rnd(rnd(xf - lo) * rnd(jnp.asarray(bins, acc))) / rnd(hi - lo))
    pos = jnp.trunc(pos).astype(jnp.int32)
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (xf >= lo) & (xf <= hi)  # also drops NaN
    counts = jnp.zeros((bins,), jnp.float32 if half else acc).at[
        jnp.where(inside, pos, bins)].add(1, mode="drop")
    return counts.astype(od)


# -- histogram, histogramdd ---------------------------------------------------------
#
# PyTorch CPU (Histogram.cpp): the input is read as M points in N dimensions;
# bin edges are either given (tensors) or linspace(min, max, bins + 1) per
# dimension in the input dtype (min/max from `range` or from the data, an
# empty range widened by 0.5 each side). A point is counted when every
# coordinate lies in [edges[0], edges[-1]]; its bin is std::upper_bound over
# the edges minus one, the last bin closed on the right. Known difference:
# with range=None, CPU raises when the data's min or max is not finite; here
# that would cost a device-to-host read, so the edges are nan/inf instead.


def _upper_bound(edges, vals):
    """libstdc++'s std::upper_bound step for step (the same answer on unsorted
    edges, which PyTorch's OpInfo samples pass to histogramdd)."""
    n = edges.shape[0]
    first = jnp.zeros(vals.shape, jnp.int32)
    length = jnp.full(vals.shape, n, jnp.int32)
    for _ in range(n.bit_length()):
        half = length >> 1
        middle = first + half
        go_left = vals < edges[jnp.clip(middle, 0, n - 1)]
        active = length > 0
        first = jnp.where(active & ~go_left, middle + 1, first)
        length = jnp.where(active, jnp.where(go_left, half, length - half - 1), length)
    return first


def _hist_fill(x2, edges, weight, density):
    """The histogram of the (M, N) points `x2` over per-dimension `edges`."""
    m, n = x2.shape
    shape = tuple(e.shape[0] - 1 for e in edges)
    acc = opmath_dtype(x2.dtype)
    if n == 0:
        return jnp.zeros((), x2.dtype)
    total = int(np.prod(shape))
    flat = jnp.zeros((m,), jnp.int32)
    keep = jnp.ones((m,), bool)
    stride = total
    for d, e in enumerate(edges):
        stride //= shape[d]
        elt = x2[:, d]
        keep = keep & (elt >= e[0]) & (elt <= e[-1])  # also drops NaN
        pos = _upper_bound(e, elt) - 1
        pos = jnp.where(pos == e.shape[0] - 1, pos - 1, pos)
        flat = flat + pos * stride
    flat = jnp.where(keep & (flat >= 0) & (flat < total), flat, total)
    w = jnp.ones((m,), acc) if weight is None else weight.reshape(m).astype(acc)
    hist = jnp.zeros((total,), acc).at[flat].add(w, mode="drop").reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            widths = (e[1:] - e[:-1]).astype(acc)
            hist = hist / widths.reshape(tuple(-1 if i == d else 1 for i in range(n)))
    return hist.astype(x2.dtype)


def _linspace_edges(x2, bins, range_):
    """The linspace bin edges of every dimension (select_outer_bin_edges)."""
    m, n = x2.shape
    if range_ is not None:
        lo = [jnp.asarray(range_[2 * d], x2.dtype) for d in range(n)]
        hi = [jnp.asarray(range_[2 * d + 1], x2.dtype) for d in range(n)]
        same = [range_[2 * d] == range_[2 * d + 1] for d in range(n)]
    elif m == 0:
        lo = [jnp.asarray(0.0, x2.dtype)] * n
        hi = [jnp.asarray(1.0, x2.dtype)] * n
        same = [False] * n
    else:
        mins, maxs = jnp.min(x2, axis=0), jnp.max(x2, axis=0)
        lo, hi = [mins[d] for d in range(n)], [maxs[d] for d in range(n)]
        same = [lo[d] == hi[d] for d in range(n)]
    edges = []
    for d in range(n):
        lo_d = jnp.where(same[d], lo[d] - 0.5, lo[d]).astype(x2.dtype)
        hi_d = jnp.where(same[d], hi[d] + 0.5, hi[d]).astype(x2.dtype)
        vals, _ = linspace_exponents(lo_d, hi_d, bins[d] + 1, x2.dtype)
        edges.append(vals.astype(x2.dtype))
    return edges


def _points(x):
    """x as (M, N) points (a reshape with -1 fails for N == 0)."""
    return x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])


def _hist_dtype_check(x, range_):
    if range_ is None and x.size:
        # select_outer_bin_edges reads min/max for float and double only
        if x.dtype not in (jnp.float32, jnp.float64):
            raise NotImplementedError(
                f'"histogramdd" not implemented for \'{type_name(x.dtype)}\'')
    elif not jnp.issubdtype(x.dtype, jnp.floating):
        raise NotImplementedError(f'"histogram_cpu" not implemented for \'{type_name(x.dtype)}\'')


@lower(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    _hist_dtype_check(x, range)
    x2 = x.reshape(-1, 1)
    edges = _linspace_edges(x2, [bins], range)
    return _hist_fill(x2, edges, weight, density), edges[0]


@lower(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    _hist_dtype_check(x, ())
    x2 = x.reshape(-1, 1)
    return _hist_fill(x2, [bins], weight, density), bins


@lower(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    x2 = _points(x)
    if range is None and x2.size and x2.dtype not in (jnp.float32, jnp.float64):
        raise NotImplementedError(f'"histogramdd" not implemented for \'{type_name(x.dtype)}\'')
    return _linspace_edges(x2, bins, range)


@lower(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    _hist_dtype_check(x, range)
    x2 = _points(x)
    return _hist_fill(x2, _linspace_edges(x2, bins, range), weight, density)


@lower(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    _hist_dtype_check(x, ())
    x2 = _points(x)
    return _hist_fill(x2, list(bins), weight, density)


# PyTorch has no Meta kernels for the histogram ops; the executor needs one for
# the output shapes and PyTorch CPU's argument checks (Histogram.cpp).

def _hist_check_inputs(x, bins, weight):
    """histogramdd_check_inputs: x (M, N), bins a list of (meta) tensors."""
    torch._check(x.dim() >= 2, lambda: "torch.histogramdd: input tensor should have at least "
                 f"2 dimensions, but got {x.dim()}")
    n = x.shape[-1]
    torch._check(len(bins) == n, lambda: f"torch.histogramdd: expected {n} sequences of bin "
                 f"edges for a {n}-dimensional histogram but got {len(bins)}")
    for d, b in enumerate(bins):
        torch._check(b.dtype == x.dtype, lambda: "torch.histogramdd: input tensor and bins "
                     f"tensors should have the same dtype, but got input with dtype {_cpp(x.dtype)} "
                     f"and bins for dimension {d} with dtype {_cpp(b.dtype)}")
        torch._check(b.dim() == 1, lambda: "torch.histogramdd: bins tensor should have one "
                     f"dimension, but got {b.dim()} dimensions in the bins tensor for "
                     f"dimension {d}")
        torch._check(b.numel() > 0, lambda: "torch.histogramdd: bins tensor should have at "
                     f"least 1 element, but got {b.numel()} elements in the bins tensor for "
                     f"dimension {d}")
    if weight is not None:
        torch._check(weight.dtype == x.dtype, lambda: "torch.histogramdd: if weight tensor is "
                     "provided, input tensor and weight tensor should have the same dtype, but "
                     f"got input({_cpp(x.dtype)}), and weight({_cpp(weight.dtype)})")
        wsizes = list(weight.shape) or [1]
        torch._check(list(x.shape[:-1]) == wsizes, lambda: "torch.histogramdd: if weight tensor "
                     "is provided it should have the same shape as the input tensor excluding its "
                     f"innermost dimension, but got input with shape {list(x.shape)} and weight "
                     f"with shape {list(weight.shape)}")


def _hist_check_bin_cts(bin_ct):
    for d, c in enumerate(bin_ct):
        torch._check(c > 0, lambda: f"torch.histogram(): bins must be > 0, but got {c} for "
                     f"dimension {d}")


def _hist_check_range(n, range_):
    if range_ is None:
        return
    torch._check(len(range_) == 2 * n, lambda: f"torch.histogramdd: for a {n}-dimensional "
                 f"histogram range should have {2 * n} elements, but got {len(range_)}")
    for d in range(n):
        lo, hi = range_[2 * d], range_[2 * d + 1]
        torch._check(math.isfinite(lo) and math.isfinite(hi), lambda: "torch.histogramdd: "
                     f"dimension {d}'s range [{lo:g}, {hi:g}] is not finite")
        torch._check(lo <= hi, lambda: "torch.histogramdd: min should not exceed max, but got "
                     f"min {lo:g} max {hi:g} for dimension {d}")



_CPP_DTYPE = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
              torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int"}


def _cpp(dtype):
    """A dtype as PyTorch's C++ messages print it."""
    return _CPP_DTYPE.get(dtype, str(dtype))


def _empty_like_meta(x, shape, dtype=None):
    return torch.empty(tuple(shape), dtype=dtype or x.dtype, device=x.device)


def _flat_weight(weight):
    return None if weight is None else weight.reshape(-1)


def _meta_histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    x2 = x.reshape(-1, 1)
    _hist_check_bin_cts([bins])
    _hist_check_range(1, range)
    _hist_check_inputs(x2, [_empty_like_meta(x, (bins + 1,))], _flat_weight(weight))
    return _empty_like_meta(x, (bins,)), _empty_like_meta(x, (bins + 1,))


def _meta_histogram_bins_tensor(x, bins, *, weight=None, density=False):
    _hist_check_inputs(x.reshape(-1, 1), [bins], _flat_weight(weight))
    _hist_check_bin_cts([bins.numel() - 1])
    return _empty_like_meta(x, (bins.numel() - 1,)), _empty_like_meta(bins, bins.shape)


def _meta_dd_edges(x, bins, range=None):
    torch._check(x.dim() >= 2,
                 lambda: "torch.histogramdd: input tensor should have at least 2 dimensions")
    n = x.shape[-1]
    _hist_check_range(n, range)
    torch._check(len(bins) == n, lambda: "histogramdd: The size of bins must be equal to the "
                 "innermost dimension of the input.")
    return [_empty_like_meta(x, (c + 1,)) for c in bins]


def _meta_histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _meta_dd_edges(x, bins, range)


def _meta_histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    edges = _meta_dd_edges(x, bins, range)
    _hist_check_inputs(x, edges, weight)
    _hist_check_bin_cts(bins)
    return _empty_like_meta(x, tuple(bins))


def _meta_histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    _hist_check_inputs(x, bins, weight)
    _hist_check_bin_cts([b.numel() - 1 for b in bins])
    return _empty_like_meta(x, tuple(b.numel() - 1 for b in bins))


def _out_meta(functional, n_out):
    """A Meta kernel for the out= overload: the functional meta, outs resized."""
    def kernel(*args, **kwargs):
        if n_out == "list":
            outs = kwargs.pop("out")
        elif n_out == 1:
            outs = [kwargs.pop("out")]
        else:
            outs = [kwargs.pop("hist"), kwargs.pop("bin_edges")]
        res = functional(*args, **kwargs)
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        torch._check(len(outs) == len(res), lambda: "expected out= to have one tensor per "
                     f"result, got {len(outs)} for {len(res)}")
        for o, r in zip(outs, res):
            torch_api.maybe_resize_out(o, r.shape)
        if n_out == "list":
            return None
        return outs[0] if n_out == 1 else tuple(outs)
    return kernel


_HIST_LIB = torch.library.Library("aten", "IMPL")
for _op, _fn, _n in (
        (aten.histogram.bin_ct, _meta_histogram_bin_ct, 2),
        (aten.histogram.bins_tensor, _meta_histogram_bins_tensor, 2),
        (aten._histogramdd_bin_edges.default, _meta_histogramdd_bin_edges, "list"),
        (aten._histogramdd_from_bin_cts.default, _meta_histogramdd_from_bin_cts, 1),
        (aten._histogramdd_from_bin_tensors.default, _meta_histogramdd_from_bin_tensors, 1)):
    _out = {2: ("bin_ct_out" if _op is aten.histogram.bin_ct else "bins_tensor_out")}.get(
        _n, "out")
    _out_op = getattr(_op.overloadpacket, _out)
    for _o, _k in ((_op, _fn), (_out_op, _out_meta(_fn, _n))):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(_o.name(), "Meta"):
            _HIST_LIB.impl(_o, _k, "Meta")


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    if x.size == 0:
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    idx = jnp.nonzero(_truth(x), size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=1).astype(jnp.int64)


# -- data-dependent shapes (eager) ----------------------------------------------------
#
# Each runs one cached executable on padded (input-sized) outputs plus the
# output size, reads the size on the host, and slices.


def _truth(x):
    return x if x.dtype == jnp.bool_ else x != 0


@jax.jit
def _nonzero_padded(x):
    t = _truth(x).reshape(x.shape)
    idx = jnp.nonzero(t, size=t.size, fill_value=0)
    return jnp.stack(idx, axis=1).astype(jnp.int64), jnp.sum(t, dtype=jnp.int64)


@lower(aten.nonzero.default, eager=True)
def nonzero(x):
    if x.ndim == 0:
        return jnp.zeros((int(_truth(x)), 0), jnp.int64)
    idx, count = _nonzero_padded(x)
    return idx[: int(count)]


@jax.jit
def _masked_select_padded(x, mask):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    xf = jnp.broadcast_to(x, shape).reshape(-1)
    mf = jnp.broadcast_to(mask, shape).reshape(-1)
    (idx,) = jnp.nonzero(mf, size=mf.size, fill_value=0)
    return xf[idx], jnp.sum(mf, dtype=jnp.int64)


@lower(aten.masked_select.default, eager=True)
def masked_select(x, mask):
    torch._check(mask.dtype == jnp.bool_,
                 lambda: f"masked_select: expected BoolTensor for mask, got {type_name(mask.dtype)}")
    try:
        jnp.broadcast_shapes(x.shape, mask.shape)
    except ValueError:
        raise RuntimeError(
            f"The size of tensor a ({x.shape}) must match the size of tensor b "
            f"({mask.shape}) (masked_select)") from None
    vals, count = _masked_select_padded(x, mask)
    return vals[: int(count)]


@jax.jit
def _min_max(x):
    return jnp.min(x), jnp.max(x)


@functools.partial(jax.jit, static_argnums=2)
def _bincount_fixed(x, weights, length):
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[x].add(1)
    wdtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros((length,), wdtype).at[x].add(weights.astype(wdtype))


@lower(aten.bincount.default, eager=True)
def bincount(x, weights=None, minlength=0):
    reject(x, "bincount", complex_=True)
    if jnp.issubdtype(x.dtype, jnp.floating):
        raise NotImplementedError(f'"bincount" not implemented for \'{type_name(x.dtype)}\'')
    torch._check(minlength >= 0, lambda: "minlength should be >= 0")
    lo, hi = (int(v) for v in _min_max(x)) if x.ndim == 1 and x.size else (0, -1)
    torch._check(x.ndim == 1 and jnp.issubdtype(x.dtype, jnp.integer) and lo >= 0,
                 lambda: "bincount only supports 1-d non-negative integral inputs.")
    if weights is not None:
        torch._check(weights.ndim == 1 and weights.shape[0] == x.shape[0],
                     lambda: "weights should be 1-d and have the same length as input")
    return _bincount_fixed(x, weights, max(hi + 1, minlength))


@functools.partial(jax.jit, static_argnums=1)
def _groups(rows, sort):
    """Group equal rows of a (n, k) array (n >= 1; NaNs never equal).

    Returns, padded to n groups: each group's representative row index, the
    group of every row (inverse), group sizes, and the number of groups.
    With `sort`, groups are in lexicographic row order, else runs of
    consecutive equal rows.
    """
    n = rows.shape[0]
    iota = jnp.arange(n, dtype=jnp.int32)
    if sort:
        cols = tuple(rows[:, j] for j in range(rows.shape[1]))
        perm = lax.sort(cols + (iota,), dimension=0, is_stable=True, num_keys=len(cols))[-1]
        srt = rows[perm]
    else:
        perm, srt = iota, rows
    new = jnp.concatenate([jnp.ones((1,), bool), jnp.any(srt[1:] != srt[:-1], axis=1)])
    gid = jnp.cumsum(new.astype(jnp.int32)) - 1
    inverse = jnp.zeros((n,), jnp.int64).at[perm].set(gid.astype(jnp.int64))
    counts = jnp.zeros((n,), jnp.int64).at[gid].add(1)
    rep = jnp.zeros((n,), jnp.int32).at[jnp.where(new, gid, n)].set(perm, mode="drop")
    return rep, inverse, counts, gid[-1] + 1


def _group_rows(xm, sort):
    """unique/unique_consecutive over the leading axis of `xm` (n >= 1 rows)."""
    rows = _orderable(xm.reshape((xm.shape[0], int(np.prod(xm.shape[1:])))))
    rep, inverse, counts, m = _groups(rows, sort)
    m = int(m)
    return jnp.take(xm, rep[:m], axis=0), inverse, counts[:m]


_EMPTY = (0,)


def _unique_flat(x, sort):
    reject(x, "unique", complex_=True)
    flat = x.reshape(-1)
    if flat.shape[0] == 0:
        e = jnp.zeros(_EMPTY, jnp.int64)
        return flat, e.reshape(x.shape), e
    u, inv, cnt = _group_rows(flat, sort)
    return u, inv.reshape(x.shape), cnt


@lower(aten._unique2.default, eager=True)
def _unique2(x, sorted=True, return_inverse=False, return_counts=False):
    # Like PyTorch's CPU kernel, the result is sorted even when sorted=False.
    u, inv, cnt = _unique_flat(x, True)
    empty = jnp.zeros(_EMPTY, jnp.int64)
    return u, inv if return_inverse else empty, cnt if return_counts else empty


@lower(aten._unique.default, eager=True)
def _unique(x, sorted=True, return_inverse=False):
    u, inv, _ = _unique_flat(x, True)
    return u, inv if return_inverse else jnp.zeros(_EMPTY, jnp.int64)


def _unique_along(x, dim, sort):
    d = wrap_dim(dim, x.ndim)
    if x.size == 0:
        torch._check(x.shape[d] == 0 or sum(s == 0 for s in x.shape) == 0,
                     lambda: "There are 0 sized dimensions, and they aren't selected, so "
                             "unique cannot be applied")
    if x.ndim == 0:
        return x, jnp.zeros((1,), jnp.int64), jnp.ones((1,), jnp.int64)
    if x.shape[d] == 0:
        e = jnp.zeros(_EMPTY, jnp.int64)
        return x, e, e
    u, inv, cnt = _group_rows(jnp.moveaxis(x, d, 0), sort)
    return jnp.moveaxis(u, 0, d), inv, cnt


@lower(aten.unique_dim.default, eager=True)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    # PyTorch returns the inverse and counts whether or not they were asked for.
    return _unique_along(x, dim, True)


@lower(aten.unique_consecutive.default, eager=True)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is not None:
        return _unique_along(x, dim, False)
    u, inv, cnt = _unique_flat(x, False)
    empty = jnp.zeros(_EMPTY, jnp.int64)
    return u, inv if return_inverse else empty, cnt if return_counts else empty


@lower(aten.unique_dim_consecutive.default, eager=True)
def unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    return _unique_along(x, dim, False)


# -- eager kernels ---------------------------------------------------------------------
#
# The executor runs every lowering through PyTorch's meta kernel first, which
# data-dependent ops do not have (nonzero's raises on purpose). Until the
# executor's eager path skips that step, these ops get direct kernels that run
# the lowerings above on concrete arrays; out= forms resize and copy.


def _bind(schema, args, kwargs):
    vals = list(args)
    for a in schema.arguments[len(vals):]:
        if a.name in kwargs:
            vals.append(kwargs[a.name])
        else:
            vals.append(a.default_value if a.has_default_value() else None)
    return vals


def _eager_kernel(op):
    fn = LOWERINGS[op].fn
    schema = op._schema

    def kernel(*args, **kwargs):
        vals = _bind(schema, args, kwargs)
        index = None
        for v in vals:
            if isinstance(v, torch.Tensor) and v.device.type == "tpu":
                index = v.device.index
                break
        if index is None:
            index = module.current_device()
        pos, kw = [], {}
        for a, v in zip(schema.arguments, vals):
            if isinstance(v, torch.Tensor):
                if v.device.type == "tpu":
                    torch._check(v.device.index == index, lambda: (
                        f"Expected all tensors to be on the same device (when checking "
                        f"arguments for {op})"))
                    arr = executor.value(v)
                    if v.is_conj():
                        arr = jnp.conj(arr)
                    if v.is_neg():
                        arr = -arr
                elif v.dim() == 0:
                    arr = jnp.asarray(v.item(), st.TORCH_TO_JAX[v.dtype])
                else:
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least "
                        f"two devices, tpu:{index} and {v.device}! (when checking arguments "
                        f"for {op})")
                v = arr
            (kw.__setitem__(a.name, v) if a.kwarg_only else pos.append(v))
        out = fn(*pos, **kw)
        dev = platform.jax_device(index)

        def wrap(a):
            a = jax.device_put(jnp.asarray(a), dev)
            return st.wrap(a, index)

        if isinstance(out, tuple):
            return tuple(wrap(a) for a in out)
        return wrap(out)

    kernel.__name__ = str(op)
    return kernel


def _out_dtype_message(out_op, want, got):
    if out_op is aten.nonzero.out:
        # CPU's text, verbatim (its missing space included).
        return (f"nonzero: Expected out tensor to have scalar type {names.get(want, want)} "
                f"but got scalar type{names.get(got, got)}")
    return f"{out_op}: Expected out tensor to have dtype {want}, but got {got} instead"


def _eager_out_kernel(out_op, functional):
    schema = out_op._schema
    out_names = [a.name for a in schema.arguments if a.is_out]

    def kernel(*args, **kwargs):
        overlap.check_out_overlap(out_op, args, kwargs)
        vals = _bind(schema, args, kwargs)
        named = {a.name: v for a, v in zip(schema.arguments, vals)}
        outs = [named.pop(n) for n in out_names]
        fpos, fkw = [], {}
        for a in functional._schema.arguments:
            (fkw.__setitem__(a.name, named[a.name]) if a.kwarg_only
             else fpos.append(named[a.name]))
        res = functional(*fpos, **fkw)
        res = res if isinstance(res, tuple) else (res,)
        for o, r in zip(outs, res):
            torch._check(o.dtype == r.dtype, lambda: _out_dtype_message(out_op, r.dtype, o.dtype))
            if tuple(o.shape) != tuple(r.shape):
                o.resize_(r.shape)
            o.copy_(r)
        return outs[0] if len(outs) == 1 else tuple(outs)

    kernel.__name__ = str(out_op)
    return kernel


_EAGER_OPS = (aten.nonzero.default, aten.masked_select.default, aten.bincount.default,
              aten._unique2.default, aten._unique.default, aten.unique_dim.default,
              aten.unique_consecutive.default, aten.unique_dim_consecutive.default)


def _register_eager():
    for op in _EAGER_OPS:
        core.KERNELS[op] = _eager_kernel(op)
        packet = getattr(aten, op._schema.name.split("::")[1])
        for name in packet.overloads():
            cand = getattr(packet, name)
            if cand is op or cand in core.KERNELS:
                continue
            if executor.functional_of(cand) is op:
                core.KERNELS[cand] = _eager_out_kernel(cand, op)


_register_eager()
