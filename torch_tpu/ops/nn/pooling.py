"""Max, average, adaptive (average and max) and fractional max pooling,
forward and backward.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..._compat.torch_api import suggest_memory_format
from ...runtime import storage as st
from .. import core
from ..opmath import opmath, upcast
from ..reductions import type_name
from ..registry import lower
from ._common import expand_param, is_float, meta_list, matmul_precision

aten = torch.ops.aten


# --------------------------------------------------------------------------
# pooling


def _neg_inf(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(False)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _tap_slices(x, nsp, out_sp, kernel, stride, padding, dilation, fill):
    """Yield (value, valid mask or None, flat input index) for each kernel tap.

    The value is the input at every output position's tap (padding filled
    with `fill`), as a strided slice of the padded input: no gather.
    """
    in_sp = x.shape[-nsp:]
    lead = x.ndim - nsp
    hi = [max(0, (k - 1) * d + (o - 1) * s + 1 - (L + p))
          for L, k, s, p, d, o in zip(in_sp, kernel, stride, padding, dilation, out_sp)]
    cfg = [(0, 0, 0)] * lead + [(p, h, 0) for p, h in zip(padding, hi)]
    xp = lax.pad(x, fill.astype(x.dtype), cfg)
    flat_stride = [int(np.prod(in_sp[j + 1:])) for j in range(nsp)]
    for tap in itertools.product(*[range(k) for k in kernel]):
        starts = [t * d for t, d in zip(tap, dilation)]
        v = lax.slice(
            xp, (0,) * lead + tuple(starts),
            tuple(xp.shape[:lead]) + tuple(st + (o - 1) * s + 1 for st, o, s in
                                           zip(starts, out_sp, stride)),
            (1,) * lead + tuple(stride))
        pos = [np.arange(o) * s - p + st for o, s, p, st in zip(out_sp, stride, padding, starts)]
        grids = np.meshgrid(*pos, indexing="ij")
        valid = np.ones(tuple(out_sp), bool)
        idx = np.zeros(tuple(out_sp), np.int64)
        for j, gpos in enumerate(grids):
            valid &= (gpos >= 0) & (gpos < in_sp[j])
            idx += gpos * flat_stride[j]
        yield v, (None if valid.all() else valid), idx


# Windows of more taps than this are pooled by one gather of every window
# (`_max_pool_windows`) instead of one strided slice per tap: a 7x7x7 window
# unrolled into 343 slices took a minute to compile (bfloat16, XLA:CPU), as
# did the backward's 343 pads.
MAX_UNROLLED_TAPS = 32


def _window_table(in_sp, out_sp, kernel, stride, padding, dilation):
    """(flat input index, in bounds) of each (output position, tap), taps in
    row-major order: numpy arrays of shape (prod(out_sp), prod(kernel))."""
    idx = np.zeros((int(np.prod(out_sp)), int(np.prod(kernel))), np.int64)
    valid = np.ones(idx.shape, bool)
    for j, (L, O, k, s, p, d) in enumerate(zip(in_sp, out_sp, kernel, stride, padding,
                                               dilation)):
        pos = (np.arange(O) * s - p)[:, None] + (np.arange(k) * d)[None, :]  # (O, k)
        shape_o = [1] * len(in_sp)
        shape_o[j] = O
        shape_k = [1] * len(in_sp)
        shape_k[j] = k
        pos = pos.reshape(shape_o + shape_k)
        full = np.broadcast_to(pos, tuple(out_sp) + tuple(kernel)).reshape(idx.shape)
        valid &= (full >= 0) & (full < L)
        idx = idx * L + np.clip(full, 0, L - 1)
    return idx, valid


def _max_pool_windows(x, nsp, out_sp, kernel, stride, padding, dilation):
    """Max pooling by gathering every window: (values, flat indices)."""
    in_sp = x.shape[-nsp:]
    lead = x.shape[:-nsp]
    idx, valid = _window_table(in_sp, out_sp, kernel, stride, padding, dilation)
    flat = x.reshape(lead + (int(np.prod(in_sp)),))
    vals = jnp.take(flat, jnp.asarray(idx), axis=-1)  # lead + (positions, taps)
    ok = jnp.asarray(valid)
    fill = _neg_inf(x.dtype)
    v = jnp.where(ok, vals, fill)
    taps = idx.shape[1]
    if is_float(x):
        # PyTorch's rule: the first maximum; a NaN wins, the last NaN.
        nan = ok & jnp.isnan(vals)
        last_nan = taps - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        v = jnp.where(nan, fill, v)
    best = jnp.max(v, axis=-1, keepdims=True)
    tap = jnp.argmax(ok & (v == best), axis=-1)
    if is_float(x):
        tap = jnp.where(nan.any(axis=-1), last_nan, tap)
    out = jnp.take_along_axis(vals, tap[..., None], axis=-1)[..., 0]
    ind = jnp.asarray(idx)[jnp.arange(idx.shape[0]), tap]
    shape = lead + tuple(out_sp)
    return out.reshape(shape), ind.reshape(shape)


def _max_pool(x, nsp, kernel_size, stride, padding, dilation):
    kernel = expand_param(kernel_size, nsp)
    stride = expand_param(stride, nsp) if stride else kernel
    padding = expand_param(padding, nsp)
    dilation = expand_param(dilation, nsp)
    out_sp = tuple(meta_list()[0].shape[-nsp:])
    out_shape = x.shape[:-nsp] + out_sp
    # Half types compare as float32 (exact: the maximum is one of the inputs,
    # rounded back by the executor); XLA:CPU compiles half-precision
    # elementwise chains several times slower.
    x = upcast(x)
    fill = _neg_inf(x.dtype)
    best = jnp.full(out_shape, fill, x.dtype)
    bidx = jnp.full(out_shape, -1, jnp.int64)
    if 0 in out_shape:
        return best, bidx
    if int(np.prod(kernel)) > MAX_UNROLLED_TAPS:
        return _max_pool_windows(x, nsp, out_sp, kernel, stride, padding, dilation)
    floating = is_float(x)
    for v, valid, idx in _tap_slices(x, nsp, out_sp, kernel, stride, padding, dilation, fill):
        # PyTorch's rule: take the first in-bounds tap, then any tap that is
        # greater or NaN (so NaN propagates, the last NaN's index wins).
        upd = (v > best) | (bidx < 0)
        if floating:
            upd = upd | jnp.isnan(v)
        if valid is not None:
            upd = upd & valid
        best = jnp.where(upd, v, best)
        bidx = jnp.where(upd, jnp.asarray(idx), bidx)
    return best, bidx


def _max_pool_backward(grad_output, x, nsp, kernel_size, stride, padding, dilation, indices):
    kernel = expand_param(kernel_size, nsp)
    stride = expand_param(stride, nsp) if stride else kernel
    padding = expand_param(padding, nsp)
    dilation = expand_param(dilation, nsp)
    g = upcast(grad_output)
    out_sp = g.shape[-nsp:]
    in_sp = x.shape[-nsp:]
    lead = g.ndim - nsp
    gi = jnp.zeros(g.shape[:lead] + tuple(in_sp), g.dtype)
    if 0 in g.shape or 0 in gi.shape:
        return gi
    if int(np.prod(kernel)) > MAX_UNROLLED_TAPS:  # one scatter, not a pad per tap
        return _scatter_flat(g, indices, in_sp)
    flat_stride = [int(np.prod(in_sp[j + 1:])) for j in range(nsp)]
    zero = jnp.zeros((), g.dtype)
    for tap in itertools.product(*[range(k) for k in kernel]):
        # Output position o reads input o*s - p + t*d: place the gradient of
        # the outputs whose argmax is this tap there (interior padding = stride).
        lo = [t * d - p for t, d, p in zip(tap, dilation, padding)]
        pos = [np.arange(o) * s + lo_ for o, s, lo_ in zip(out_sp, stride, lo)]
        grids = np.meshgrid(*pos, indexing="ij")
        idx = sum(gp * fs for gp, fs in zip(grids, flat_stride))
        contrib = jnp.where(indices == jnp.asarray(idx), g, zero)
        cfg = [(0, 0, 0)] * lead + [
            (lo_, L - (lo_ + (o - 1) * s + 1), s - 1)
            for lo_, L, o, s in zip(lo, in_sp, out_sp, stride)]
        gi = gi + lax.pad(contrib, zero, cfg)
    return gi


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, 2, kernel_size, stride, padding, dilation,
                              indices)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, 3, kernel_size, stride, padding, dilation,
                              indices)


def _avg_pool(x, nsp, out_sp, kernel_size, stride, padding, count_include_pad,
              divisor_override):
    kernel = expand_param(kernel_size, nsp)
    stride = expand_param(stride, nsp) if stride else kernel
    padding = expand_param(padding, nsp)
    in_sp = x.shape[-nsp:]
    lead = x.ndim - nsp
    out_shape = x.shape[:lead] + tuple(out_sp)
    if 0 in out_shape or 0 in x.shape:
        return jnp.zeros(out_shape, x.dtype)
    hi = [max(0, (o - 1) * s + k - L - p)
          for o, s, k, L, p in zip(out_sp, stride, kernel, in_sp, padding)]
    summed = lax.reduce_window(
        x, np.zeros((), x.dtype), lax.add, (1,) * lead + tuple(kernel),
        (1,) * lead + tuple(stride), [(0, 0)] * lead + list(zip(padding, hi)))
    summed = summed[(Ellipsis,) + tuple(slice(0, o) for o in out_sp)]
    if divisor_override:
        div = np.full(tuple(out_sp), float(divisor_override))
    else:
        div = np.ones(tuple(out_sp))
        for j, (o, s, k, L, p) in enumerate(zip(out_sp, stride, kernel, in_sp, padding)):
            start = np.arange(o) * s - p
            end = np.minimum(start + k, L + p)
            size = end - start
            if not count_include_pad:
                size = np.minimum(end, L) - np.maximum(start, 0)
            shape = [1] * nsp
            shape[j] = o
            div = div * size.reshape(shape)
        div = np.where(div == 0, 1, div)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(summed, jnp.broadcast_to(jnp.asarray(div, x.dtype), summed.shape))
    return summed / jnp.asarray(div, x.dtype)


def _avg_pool_fwd(self, nsp, kernel_size, stride, padding, count_include_pad,
                  divisor_override):
    out_sp = tuple(meta_list()[0].shape[-nsp:])
    x = upcast(self)
    return _avg_pool(x, nsp, out_sp, kernel_size, stride, padding, count_include_pad,
                     divisor_override)


def _avg_pool_bwd(grad_output, self, nsp, kernel_size, stride, padding, count_include_pad,
                  divisor_override):
    g = upcast(grad_output)
    out_sp = g.shape[-nsp:]
    x = jnp.zeros(self.shape, g.dtype)
    _, vjp = jax.vjp(lambda x_: _avg_pool(x_, nsp, out_sp, kernel_size, stride, padding,
                                          count_include_pad, divisor_override), x)
    return vjp(g)[0]


@lower(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool_fwd(self, 2, kernel_size, stride, padding, count_include_pad,
                         divisor_override)


@lower(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool_fwd(self, 3, kernel_size, stride, padding, count_include_pad,
                         divisor_override)


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    return _avg_pool_bwd(grad_output, self, 2, kernel_size, stride, padding, count_include_pad,
                         divisor_override)


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    return _avg_pool_bwd(grad_output, self, 3, kernel_size, stride, padding, count_include_pad,
                         divisor_override)


def _adaptive_windows(L, O):
    o = np.arange(O)
    start = (o * L) // O
    end = -((-(o + 1) * L) // O)
    return start, end


def _indicator(L, O):
    """(O, L) 0/1 matrix of adaptive-pooling windows and each window's size."""
    start, end = _adaptive_windows(L, O)
    pos = np.arange(L)
    m = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
    return m.astype(np.float32), (end - start).astype(np.float32)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def separable(x, mats, transpose=False, prec=None):
    """Apply a (O, L) matrix to each of the last len(mats) dims of `x` (adaptive
    pooling here, interpolation in ops.nn.upsampling)."""
    nsp = len(mats)
    lead = x.ndim - nsp
    xs = _LETTERS[:lead] + _LETTERS[lead:lead + nsp]
    outs = _LETTERS[:lead] + _LETTERS[lead + nsp:lead + 2 * nsp]
    terms = [xs]
    for j in range(nsp):
        a, b = outs[lead + j], xs[lead + j]
        terms.append(b + a if transpose else a + b)
    expr = ",".join(terms) + "->" + outs
    return jnp.einsum(expr, x, *[jnp.asarray(m, x.dtype) for m in mats], precision=prec)


def _adaptive_avg(x, out_sp):
    nsp = len(out_sp)
    in_sp = x.shape[-nsp:]
    mats, counts = zip(*[_indicator(L, O) for L, O in zip(in_sp, out_sp)])
    y = separable(upcast(x), mats, prec=matmul_precision(x))
    div = np.ones(tuple(out_sp), np.float32)
    for j, c in enumerate(counts):
        shape = [1] * nsp
        shape[j] = len(c)
        div = div * c.reshape(shape)
    return y / jnp.asarray(div, y.dtype)


def _adaptive_avg_backward(g, x, nsp):
    in_sp = x.shape[-nsp:]
    out_sp = g.shape[-nsp:]
    mats, counts = zip(*[_indicator(L, O) for L, O in zip(in_sp, out_sp)])
    div = np.ones(tuple(out_sp), np.float32)
    for j, c in enumerate(counts):
        shape = [1] * nsp
        shape[j] = len(c)
        div = div * c.reshape(shape)
    ga = upcast(g)
    ga = ga / jnp.asarray(div, ga.dtype)
    return separable(ga, mats, transpose=True, prec=lax.Precision.HIGHEST)


@lower(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lower(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lower(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 2)


@lower(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 3)


def _adaptive_max(x, out_sp):
    nsp = len(out_sp)
    in_sp = x.shape[-nsp:]
    lead = x.ndim - nsp
    out_shape = x.shape[:lead] + tuple(out_sp)
    if 0 in out_shape or 0 in x.shape:
        return jnp.zeros(out_shape, x.dtype), jnp.zeros(out_shape, jnp.int64)
    wins = [_adaptive_windows(L, O) for L, O in zip(in_sp, out_sp)]
    kmax = [int(np.max(e - s)) for s, e in wins]
    flat_stride = [int(np.prod(in_sp[j + 1:])) for j in range(nsp)]
    best = bidx = None
    floating = is_float(x)
    for tap in itertools.product(*[range(k) for k in kmax]):
        # Taps past a window's end repeat its last element: no mask needed.
        pos = [np.minimum(s + t, e - 1) for (s, e), t in zip(wins, tap)]
        v = x
        for j, p in enumerate(pos):
            v = jnp.take(v, jnp.asarray(p), axis=lead + j)
        grids = np.meshgrid(*pos, indexing="ij")
        idx = jnp.asarray(sum(gp * fs for gp, fs in zip(grids, flat_stride)).astype(np.int64))
        if best is None:
            best, bidx = v, jnp.broadcast_to(idx, out_shape)
            continue
        upd = v > best
        if floating:
            upd = upd | jnp.isnan(v)
        best = jnp.where(upd, v, best)
        bidx = jnp.where(upd, idx, bidx)
    return best, bidx


def _scatter_flat(g, indices, in_sp):
    """Add g[..., i] into a zero array at flat spatial index indices[..., i]."""
    nsp = len(in_sp)
    lead_shape = g.shape[:g.ndim - nsp]
    b = int(np.prod(lead_shape))
    n_in = int(np.prod(in_sp))
    n_out = int(np.prod(g.shape[g.ndim - nsp:]))
    if b == 0 or n_in == 0 or n_out == 0:  # an empty batch: nothing to scatter
        return jnp.zeros(lead_shape + tuple(in_sp), g.dtype)
    gf = g.reshape(b, n_out)
    idx = indices.reshape(b, n_out)
    rows = jnp.arange(b)[:, None]
    out = jnp.zeros((b, n_in), g.dtype).at[rows, idx].add(gf)
    return out.reshape(lead_shape + tuple(in_sp))


@lower(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lower(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lower(aten.adaptive_max_pool2d_backward.default)
@opmath("grad_output")
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_flat(grad_output, indices, self.shape[-2:])


@lower(aten.adaptive_max_pool3d_backward.default)
@opmath("grad_output")
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_flat(grad_output, indices, self.shape[-3:])


# --------------------------------------------------------------------------
# fractional max pooling


def _fractional_starts(sample, L, O, k):
    """CPU's generate_intervals: window starts (..., O) from samples (...)."""
    if O == 1:
        return jnp.full(sample.shape + (1,), L - k, jnp.int32)
    alpha = (jnp.asarray(L - k, sample.dtype) / jnp.asarray(O - 1, sample.dtype))
    i = jnp.arange(O - 1, dtype=sample.dtype)
    s = sample[..., None]
    seq = ((i + s) * alpha).astype(jnp.int32) - (s * alpha).astype(jnp.int32)
    last = jnp.full(sample.shape + (1,), L - k, jnp.int32)
    return jnp.concatenate([seq, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples):
    nsp = len(kernel_size)
    out_meta = meta_list()[0]
    if out_meta.numel() == 0:  # an output size or a batch of 0: nothing to pool
        shape = tuple(out_meta.shape)
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    batched = x.ndim == nsp + 2
    if not batched:
        x, samples = x[None], samples.reshape((1,) + samples.shape[-2:])
    sp = x.shape[-nsp:]
    lead = x.shape[:2]
    # samples[..., d] drives dim d (W, H for 2-D; T, H, W for 3-D).
    order = (1, 0) if nsp == 2 else (0, 1, 2)
    starts = [_fractional_starts(samples[..., order[d]], sp[d], output_size[d], kernel_size[d])
              for d in range(nsp)]
    # Flat input index of every (output position, tap), taps in row-major order.
    idx = None
    for d in range(nsp):
        taps = jnp.arange(kernel_size[d], dtype=jnp.int32)
        pos = starts[d][..., :, None] + taps  # (N, C, O_d, k_d)
        # broadcastable to (N, C, O_0.., k_0..)
        perm_shape = lead + (1,) * d + (output_size[d],) + (1,) * (nsp - d - 1) + \
            (1,) * d + (kernel_size[d],) + (1,) * (nsp - d - 1)
        pos = pos.reshape(perm_shape)
        idx = pos if idx is None else idx * sp[d] + pos
    full = lead + tuple(output_size) + tuple(kernel_size)
    kk = int(np.prod(kernel_size))
    idx = jnp.broadcast_to(idx, full).reshape(lead + tuple(output_size) + (kk,))
    n_out = int(np.prod(output_size)) * kk
    vals = jnp.take_along_axis(x.reshape(lead + (int(np.prod(sp)),)),
                               idx.reshape(lead + (n_out,)), axis=-1).reshape(idx.shape)
    # First maximum wins, like CPU's strict comparison; NaN counts as maximal.
    key = jnp.where(jnp.isnan(vals), jnp.inf, vals)
    best = jnp.argmax(key, axis=-1)
    out = jnp.take_along_axis(vals, best[..., None], axis=-1)[..., 0]
    ind = jnp.take_along_axis(idx, best[..., None], axis=-1)[..., 0].astype(jnp.int64)
    if not batched:
        out, ind = out[0], ind[0]
    return out, ind


@lower(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def fractional_max_pool(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, tuple(kernel_size), tuple(output_size), random_samples)


@lower(aten.fractional_max_pool2d_backward.default)
@opmath("grad_output")
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_flat(grad_output, indices, self.shape[-2:])


def _fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    # PyTorch has no meta kernel for this op (the executor needs one): a
    # scatter-add of the gradient into the flattened input.
    lead = tuple(self.shape[:-3])
    n_out = grad_output.shape[-3] * grad_output.shape[-2] * grad_output.shape[-1]
    g = grad_output.reshape(lead + (n_out,))
    idx = indices.reshape(lead + (n_out,))
    out = torch.zeros(lead + (self.shape[-3] * self.shape[-2] * self.shape[-1],),
                      dtype=grad_output.dtype, device=grad_output.device)
    return out.scatter_add(-1, idx, g).reshape(self.shape)


# Ops whose CPU kernels keep the input's memory format (channels_last in,
# channels_last out; the backwards follow the input): their results take the
# strides PyTorch's meta kernel gives them (ops.core.strided_kernel).
_KEEP_MEMORY_FORMAT = (
    aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
    aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default,
    aten.avg_pool2d.default, aten.avg_pool3d.default,
    aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default,
    aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default,
    aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d_backward.default,
    aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default,
    aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default,
)


def _unbatched_max_pool3d_layout(args, metas):
    """CPU's layout of an unbatched (C, D, H, W) max_pool3d and its backward,
    where the meta kernel's is contiguous: the results follow the first
    argument (the input; the backward: grad_output) as a batch of one, so a
    channels-last one gives channels-last results. None for batched calls."""
    first = args[0]
    if first.dim() != 4:
        return None
    batched = torch.empty_strided((1, *first.shape), (first.numel(), *first.stride()),
                                  device="meta")
    cl = suggest_memory_format(batched) == torch.channels_last_3d
    return tuple(None if m is None else
                 tuple(torch.empty((1, *m.shape), device="meta")
                       .contiguous(memory_format=torch.channels_last_3d).stride()[1:])
                 if cl else st.contiguous_strides(tuple(m.shape)) for m in metas)


_LAYOUTS = {aten.max_pool3d_with_indices.default: _unbatched_max_pool3d_layout,
            aten.max_pool3d_with_indices_backward.default: _unbatched_max_pool3d_layout}

# CPU's adaptive pooling kernels take floating types only; the name its error
# gives, for a contiguous and a channels_last input.
_ADAPTIVE_KERNEL_NAMES = {
    aten._adaptive_avg_pool2d.default: ("adaptive_avg_pool2d",
                                        "adaptive_avg_pool2d_channels_last"),
    aten.adaptive_max_pool2d.default: ("adaptive_max_pool2d",
                                       "adaptive_max_pool2d_channels_last"),
    aten._adaptive_avg_pool3d.default: ("adaptive_avg_pool3d_cpu", "adaptive_avg_pool3d_cpu"),
    aten.adaptive_max_pool3d.default: ("adaptive_max_pool3d_cpu", "adaptive_max_pool3d_cpu"),
}


def _adaptive_dtype_check(op):
    plain, channels_last = _ADAPTIVE_KERNEL_NAMES[op]

    def check(self, output_size):
        if self.is_floating_point():
            return
        cl = (self.dim() == 4 and not self.is_contiguous()
              and self.is_contiguous(memory_format=torch.channels_last))
        name = channels_last if cl else plain
        raise NotImplementedError(
            f'"{name}" not implemented for \'{type_name(st.TORCH_TO_JAX[self.dtype])}\'')

    return check


def _install_kernels():
    core.KERNELS.setdefault(aten.fractional_max_pool3d_backward.default,
                            _fractional_max_pool3d_backward)
    for op in _KEEP_MEMORY_FORMAT:
        check = _adaptive_dtype_check(op) if op in _ADAPTIVE_KERNEL_NAMES else None
        core.KERNELS.setdefault(op, core.strided_kernel(op, check, _LAYOUTS.get(op)))


_install_kernels()
