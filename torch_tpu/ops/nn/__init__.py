"""Neural-network lowerings: convolution, pooling, normalization, losses,
embedding, dropout, attention, upsampling and padding.

Each forward op and the backward op PyTorch's autograd formula calls for it
is one lowering, so a layer's forward and its backward each run as one
compiled executable. Backward lowerings either write the gradient out
(normalizations, losses) or take `jax.vjp` of the forward lowering inside the
program (convolution, padding, average pooling, attention), which keeps the
two consistent by construction.

Half-precision inputs (bfloat16, float16) compute in float32 and are rounded
once at the end, like PyTorch's CPU kernels (accumulation types). Matmul-like
ops (convolution, attention, adaptive pooling) run float32 inputs at
`Precision.HIGHEST`, so results match PyTorch's float32 on a TPU too; inputs
that came from a half type are exact in bfloat16 and use the default (one-pass)
precision.

Two PyTorch routes need kernels outside the table (`_install_routes`):
`scaled_dot_product_attention` is CompositeImplicitAutograd and on PrivateUse1
always takes the many-op math path, so it is routed to the fused
`_scaled_dot_product_fused_attention_overrideable` (one executable forward,
one backward); `native_batch_norm` takes optional running statistics that it
updates in place, which is routed to the `_native_batch_norm_legit` overloads
(mutated, non-optional running stats, or none).
"""

from __future__ import annotations

import functools
import itertools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..registry import lower, out_meta

aten = torch.ops.aten

_HALF = (jnp.bfloat16, jnp.float16)


# --------------------------------------------------------------------------
# helpers


def _is_half(x):
    return x.dtype in _HALF


def _acc(x):
    """`x` in its accumulation dtype (float32 for half types)."""
    if x is None:
        return None
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _precision(*xs):
    """HIGHEST for genuine float32 operands, DEFAULT when they came from halves."""
    if any(x is not None and x.dtype == jnp.float32 for x in xs):
        return lax.Precision.HIGHEST
    return lax.Precision.DEFAULT


def _is_float(x):
    return jnp.issubdtype(x.dtype, jnp.floating)


def _meta_list():
    m = out_meta()
    return list(m) if isinstance(m, (list, tuple)) else [m]


def _reduce(loss, reduction):
    """PyTorch's loss reduction enum: 0 none, 1 mean, 2 sum."""
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp.mean(loss)
    return jnp.sum(loss)


def _expand_param(v, n):
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * n if len(v) == 1 else v


def _sum_to(x, shape):
    """Sum a broadcast result back to `shape` (the transpose of broadcasting)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    return jnp.sum(x, axis=axes, keepdims=False).reshape(shape) if axes else x.reshape(shape)


# --------------------------------------------------------------------------
# convolution


_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _conv_forward(x, w, stride, padding, dilation, transposed, output_padding, groups, prec):
    """Batched N-d convolution (no bias) in PyTorch's layout and semantics."""
    nsp = x.ndim - 2
    sp = _SPATIAL[nsp]
    dn = ("NC" + sp, "OI" + sp, "NC" + sp)
    stride = _expand_param(stride, nsp)
    padding = _expand_param(padding, nsp)
    dilation = _expand_param(dilation, nsp)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
            precision=prec)
    output_padding = _expand_param(output_padding, nsp)
    # Transposed: the gradient of a convolution w.r.t. its input. The weight
    # (Cin, Cout/g, k...) becomes (Cout, Cin/g, k...), spatially flipped.
    cin, coutg = w.shape[0], w.shape[1]
    k = w.shape[2:]
    w = w.reshape((groups, cin // groups, coutg) + k)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * coutg, cin // groups) + k)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nsp)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x, w, window_strides=(1,) * nsp, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
        precision=prec)


def _check_conv_params(stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch CPU's convolution parameter checks (ConvUtils.h check_shape_forward)
    that its meta kernel does not make: RuntimeError, as on CPU. Host values only."""
    op = "aten.convolution"
    stride, padding, dilation, output_padding = (
        _expand_param(v, 1) for v in (stride, padding, dilation, output_padding))
    if any(s <= 0 for s in stride):
        raise RuntimeError(f"{op}: non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError(f"{op}: negative padding is not supported")
    if transposed and any(p < 0 for p in output_padding):
        raise RuntimeError(f"{op}: negative output_padding is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"{op}: dilation should be greater than zero")
    if groups <= 0:
        raise RuntimeError(f"{op}: non-positive groups is not supported")


@lower(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    _check_conv_params(stride, padding, dilation, transposed, output_padding, groups)
    prec = _precision(input, weight)
    unbatched = input.ndim == weight.ndim - 1
    x = _acc(input)[None] if unbatched else _acc(input)
    y = _conv_forward(x, _acc(weight), stride, padding, dilation, transposed, output_padding,
                      groups, prec)
    if bias is not None:
        y = y + _acc(bias).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y[0] if unbatched else y


@lower(aten._convolution.default)
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups, benchmark, deterministic, cudnn_enabled, allow_tf32):
    return convolution(input, weight, bias, stride, padding, dilation, transposed,
                       output_padding, groups)


@lower(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    prec = _precision(input, weight)
    unbatched = input.ndim == weight.ndim - 1
    x = _acc(input)[None] if unbatched else _acc(input)
    g = _acc(grad_output)[None] if unbatched else _acc(grad_output)
    g = g.astype(x.dtype)

    def f(x_, w_):
        return _conv_forward(x_, w_, stride, padding, dilation, transposed, output_padding,
                             groups, prec)

    _, vjp = jax.vjp(f, x, _acc(weight).astype(x.dtype))
    gx, gw = vjp(g)
    if unbatched:
        gx = gx[0]
    gb = jnp.sum(g, axis=(0,) + tuple(range(2, g.ndim))) if output_mask[2] else None
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


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


def _max_pool(x, nsp, kernel_size, stride, padding, dilation):
    kernel = _expand_param(kernel_size, nsp)
    stride = _expand_param(stride, nsp) if stride else kernel
    padding = _expand_param(padding, nsp)
    dilation = _expand_param(dilation, nsp)
    out_sp = tuple(_meta_list()[0].shape[-nsp:])
    out_shape = x.shape[:-nsp] + out_sp
    fill = _neg_inf(x.dtype)
    best = jnp.full(out_shape, fill, x.dtype)
    bidx = jnp.full(out_shape, -1, jnp.int64)
    if 0 in out_shape:
        return best, bidx
    is_float = _is_float(x)
    for v, valid, idx in _tap_slices(x, nsp, out_sp, kernel, stride, padding, dilation, fill):
        # PyTorch's rule: take the first in-bounds tap, then any tap that is
        # greater or NaN (so NaN propagates, the last NaN's index wins).
        upd = (v > best) | (bidx < 0)
        if is_float:
            upd = upd | jnp.isnan(v)
        if valid is not None:
            upd = upd & valid
        best = jnp.where(upd, v, best)
        bidx = jnp.where(upd, jnp.asarray(idx), bidx)
    return best, bidx


def _max_pool_backward(grad_output, x, nsp, kernel_size, stride, padding, dilation, indices):
    kernel = _expand_param(kernel_size, nsp)
    stride = _expand_param(stride, nsp) if stride else kernel
    padding = _expand_param(padding, nsp)
    dilation = _expand_param(dilation, nsp)
    g = _acc(grad_output)
    out_sp = g.shape[-nsp:]
    in_sp = x.shape[-nsp:]
    lead = g.ndim - nsp
    gi = jnp.zeros(g.shape[:lead] + tuple(in_sp), g.dtype)
    if 0 in g.shape or 0 in gi.shape:
        return gi
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
    kernel = _expand_param(kernel_size, nsp)
    stride = _expand_param(stride, nsp) if stride else kernel
    padding = _expand_param(padding, nsp)
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
    out_sp = tuple(_meta_list()[0].shape[-nsp:])
    x = _acc(self)
    return _avg_pool(x, nsp, out_sp, kernel_size, stride, padding, count_include_pad,
                     divisor_override)


def _avg_pool_bwd(grad_output, self, nsp, kernel_size, stride, padding, count_include_pad,
                  divisor_override):
    g = _acc(grad_output)
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


def _separable(x, mats, transpose=False, prec=None):
    """Apply a (O, L) matrix to each of the last len(mats) dims of `x`."""
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
    y = _separable(_acc(x), mats, prec=_precision(x))
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
    ga = _acc(g)
    ga = ga / jnp.asarray(div, ga.dtype)
    return _separable(ga, mats, transpose=True, prec=lax.Precision.HIGHEST)


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
    is_float = _is_float(x)
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
        if is_float:
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
    gf = g.reshape(b, -1)
    idx = indices.reshape(b, -1)
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
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_flat(_acc(grad_output), indices, self.shape[-2:])


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_flat(_acc(grad_output), indices, self.shape[-3:])


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
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_flat(_acc(grad_output), indices, self.shape[-2:])


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


def _install_fractional_kernel():
    from .. import core

    core.KERNELS.setdefault(aten.fractional_max_pool3d_backward.default,
                            _fractional_max_pool3d_backward)


_install_fractional_kernel()


# --------------------------------------------------------------------------
# normalization


def _moments(x, axes):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return mean, var


def _norm_input_grad(g, xhat, rstd, axes):
    """d/dx of (x - mean(x)) * rstd over `axes`, given g = dL/dxhat."""
    mg = jnp.mean(g, axis=axes, keepdims=True)
    mgx = jnp.mean(g * xhat, axis=axes, keepdims=True)
    return rstd * (g - mg - xhat * mgx)


@lower(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = _acc(input)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    if x.size == 0:
        stat_shape = x.shape[:x.ndim - k] + (1,) * k
        return x, jnp.zeros(stat_shape, x.dtype), jnp.zeros(stat_shape, x.dtype)
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _acc(weight)
    if bias is not None:
        y = y + _acc(bias)
    return y, mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    x = _acc(input)
    dy = _acc(grad_out)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    batch_axes = tuple(range(x.ndim - k))
    mean = _acc(mean)
    rstd = _acc(rstd)
    xhat = (x - mean) * rstd
    g = dy * _acc(weight) if weight is not None else dy
    gi = _norm_input_grad(g, xhat, rstd, axes) if output_mask[0] else None
    gw = jnp.sum(dy * xhat, axis=batch_axes) if output_mask[1] and weight is not None else None
    gb = jnp.sum(dy, axis=batch_axes) if output_mask[2] and bias is not None else None
    return gi, gw, gb


def _layer_norm_kernel(input, normalized_shape, weight, bias, eps):
    """PrivateUse1 kernel of native_layer_norm: the lowering's runner, then CPU's
    dtype for mean/rstd. CPU keeps them in the input's dtype (float32 only for a
    half input with float32 weight or bias); PyTorch's meta function, which
    sizes the lowering's outputs, says float32 for half inputs always."""
    from ...runtime import executor

    out, mean, rstd = executor.runner_for(aten.native_layer_norm.default)(
        input, normalized_shape, weight, bias, eps)
    dt = _bn_stat_dtype(input, weight, bias)
    if mean.dtype != dt:
        mean, rstd = mean.to(dt), rstd.to(dt)
    return out, mean, rstd


def _install_layer_norm_kernel():
    # Takes the op's PrivateUse1 slot in place of the runner (the lowering stays
    # in the table for graphs).
    from .. import core

    core.KERNELS.setdefault(aten.native_layer_norm.default, _layer_norm_kernel)


_install_layer_norm_kernel()


def _bn_shape(x, v):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _bn_train(input, weight, bias, running_mean, running_var, momentum, eps):
    x = _acc(input)
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _bn_shape(x, _acc(weight))
    if bias is not None:
        y = y + _bn_shape(x, _acc(bias))
    mean, var, rstd = mean.reshape(-1), var.reshape(-1), rstd.reshape(-1)
    new_rm = new_rv = None
    if running_mean is not None:
        new_rm = (1 - momentum) * _acc(running_mean) + momentum * mean
    if running_var is not None:
        n = x.size // x.shape[1]
        unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.inf
        new_rv = (1 - momentum) * _acc(running_var) + momentum * unbiased
    return y, mean, rstd, new_rm, new_rv


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = _acc(input)
    mean = _acc(running_mean)
    rstd = lax.rsqrt(_acc(running_var) + eps)
    scale = rstd if weight is None else rstd * _acc(weight)
    y = (x - _bn_shape(x, mean)) * _bn_shape(x, scale)
    if bias is not None:
        y = y + _bn_shape(x, _acc(bias))
    return y, mean, rstd


@lower(aten._native_batch_norm_legit.default, mutates=("running_mean", "running_var"))
def _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum,
                             eps):
    if training:
        y, mean, rstd, rm, rv = _bn_train(input, weight, bias, running_mean, running_var,
                                          momentum, eps)
        return (y, mean, rstd), {"running_mean": rm, "running_var": rv}
    y, mean, rstd = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return (y, mean, rstd), {"running_mean": running_mean, "running_var": running_var}


@lower(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    y, mean, rstd, _, _ = _bn_train(input, weight, bias, None, None, momentum, eps)
    return y, mean, rstd


@lower(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                         momentum, eps):
    return _bn_eval(input, weight, bias, running_mean, running_var, eps)


@lower(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training,
                                        momentum, eps):
    if training:
        return _bn_train(input, weight, bias, running_mean, running_var, momentum, eps)
    y, mean, rstd = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return y, mean, rstd, running_mean, running_var


def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lower(aten._batch_norm_with_update.default, mutates=("running_mean", "running_var"))
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    y, mean, rstd, rm, rv = _bn_train(input, weight, bias, running_mean, running_var,
                                      momentum, eps)
    return (y, mean, rstd, _reserve()), {"running_mean": rm, "running_var": rv}


@lower(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(input, weight, bias, running_mean, running_var, momentum,
                                       eps):
    y, mean, rstd, rm, rv = _bn_train(input, weight, bias, running_mean, running_var,
                                      momentum, eps)
    return y, mean, rstd, _reserve(), rm, rv


@lower(aten._batch_norm_no_update.default)
def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None or running_var is None:
        y, mean, rstd, _, _ = _bn_train(input, weight, bias, None, None, momentum, eps)
        return y, mean, rstd, _reserve()
    y, mean, rstd = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return y, mean, rstd, _reserve()


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                 train, eps, output_mask):
    x = _acc(input)
    dy = _acc(grad_out)
    axes = (0,) + tuple(range(2, x.ndim))
    if train:
        mean, rstd = _acc(save_mean), _acc(save_invstd)
    else:
        mean = _acc(running_mean)
        rstd = lax.rsqrt(_acc(running_var) + eps)
    mean_b, rstd_b = _bn_shape(x, mean), _bn_shape(x, rstd)
    xhat = (x - mean_b) * rstd_b
    w = _bn_shape(x, _acc(weight)) if weight is not None else None
    gi = None
    if output_mask[0]:
        g = dy * w if w is not None else dy
        gi = _norm_input_grad(g, xhat, rstd_b, axes) if train else g * rstd_b
    gw = jnp.sum(dy * xhat, axis=axes) if output_mask[1] else None
    gb = jnp.sum(dy, axis=axes) if output_mask[2] else None
    return gi, gw, gb


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                        save_invstd, train, eps, output_mask)


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                        update, eps, output_mask, reserve):
    train = update or running_mean is None
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                        train, eps, output_mask)


@lower(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = _acc(input)
    if x.size == 0:
        z = jnp.zeros((N, group), x.dtype)
        return x, z, z
    xg = x.reshape(N, group, -1)
    mean, var = _moments(xg, (2,))
    rstd = lax.rsqrt(var + eps)
    y = ((xg - mean) * rstd).reshape(x.shape)
    if weight is not None:
        y = y * _bn_shape(x, _acc(weight))
    if bias is not None:
        y = y + _bn_shape(x, _acc(bias))
    return y, mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                               output_mask):
    x = _acc(input).reshape(N, C, HxW)
    dy = _acc(grad_out).reshape(N, C, HxW)
    mean = _acc(mean).reshape(N, group, 1, 1)
    rstd = _acc(rstd).reshape(N, group, 1, 1)
    xg = x.reshape(N, group, C // group, HxW)
    xhat = (xg - mean) * rstd
    gi = None
    if output_mask[0]:
        g = dy * _acc(weight).reshape(1, C, 1) if weight is not None else dy
        g = g.reshape(N, group, C // group, HxW)
        gi = _norm_input_grad(g, xhat, rstd, (2, 3)).reshape(input.shape)
    xhat = xhat.reshape(N, C, HxW)
    gw = jnp.sum(dy * xhat, axis=(0, 2)) if output_mask[1] else None
    gb = jnp.sum(dy, axis=(0, 2)) if output_mask[2] else None
    return gi, gw, gb


@lower(aten._fused_rms_norm.default)
def _fused_rms_norm(input, normalized_shape, weight, eps):
    x = _acc(input)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    if eps is None:
        eps = float(jnp.finfo(x.dtype).eps)  # of the computation dtype, like PyTorch
    if x.size == 0:
        return x, jnp.zeros(x.shape[:x.ndim - k] + (1,) * k, x.dtype)
    rstd = lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * _acc(weight)
    return y, rstd


@lower(aten._fused_rms_norm_backward.default)
def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    x = _acc(input)
    dy = _acc(grad_out)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    rstd = _acc(rstd)
    xhat = x * rstd
    g = dy * _acc(weight) if weight is not None else dy
    gi = None
    if output_mask[0]:
        gi = rstd * (g - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
    gw = None
    if output_mask[1] and weight is not None:
        gw = jnp.sum(dy * xhat, axis=tuple(range(x.ndim - k)))
    return gi, gw


# --------------------------------------------------------------------------
# losses


def _nll(self, target, weight, ignore_index):
    """Per-element weight w_i (0 where ignored) and the picked log-probs."""
    cdim = 1 if self.ndim >= 2 else 0
    nclass = self.shape[cdim]
    t = target.astype(jnp.int32)
    ignored = t == ignore_index
    safe = jnp.where(ignored, 0, t)
    w = jnp.ones(t.shape, jnp.float32) if weight is None else _acc(weight)[safe]
    w = jnp.where(ignored, jnp.zeros((), w.dtype), w)
    return cdim, nclass, safe, w


def _nll_forward(self, target, weight, reduction, ignore_index):
    x = _acc(self)
    cdim, nclass, safe, w = _nll(self, target, weight, ignore_index)
    picked = jnp.squeeze(jnp.take_along_axis(x, jnp.expand_dims(safe, cdim), axis=cdim), cdim)
    w = w.astype(x.dtype)
    loss = -picked * w
    if reduction == 0:
        return loss, jnp.zeros((), x.dtype)
    total = jnp.sum(w)
    s = jnp.sum(loss)
    return (s / total if reduction == 1 else s), total


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    g = _acc(grad_output)
    cdim, nclass, safe, w = _nll(self, target, weight, ignore_index)
    w = w.astype(g.dtype)
    if reduction == 1:
        g = g / _acc(total_weight).astype(g.dtype)
    scale = -w * g
    onehot = jax.nn.one_hot(safe, nclass, dtype=g.dtype, axis=cdim)
    return onehot * jnp.expand_dims(scale, cdim)


@lower(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lower(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lower(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@lower(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index,
                        total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


def _grad_scale(grad_output, reduction, n):
    g = _acc(grad_output)
    return g / n if reduction == 1 else g


@lower(aten.mse_loss.default)
def mse_loss(self, target, reduction=1):
    d = _acc(self) - _acc(target)
    return _reduce(d * d, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    d = _acc(self) - _acc(target)
    n = max(1, int(np.prod(jnp.broadcast_shapes(self.shape, target.shape))))
    return 2 * d * _grad_scale(grad_output, reduction, n)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    z = jnp.abs(_acc(self) - _acc(target))
    if beta == 0:
        return _reduce(z, reduction)
    return _reduce(jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), reduction)


@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    x = _acc(self) - _acc(target)
    n = max(1, int(np.prod(jnp.broadcast_shapes(self.shape, target.shape))))
    g = _grad_scale(grad_output, reduction, n)
    inner = x / beta if beta != 0 else jnp.zeros_like(x)
    d = jnp.where(x <= -beta, -1.0, jnp.where(x >= beta, 1.0, inner))
    return d * g


@lower(aten.huber_loss.default)
def huber_loss(self, target, reduction=1, delta=1.0):
    z = jnp.abs(_acc(self) - _acc(target))
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@lower(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    x = _acc(self) - _acc(target)
    n = max(1, int(np.prod(jnp.broadcast_shapes(self.shape, target.shape))))
    g = _grad_scale(grad_output, reduction, n)
    d = jnp.where(x <= -delta, -delta, jnp.where(x >= delta, delta, x))
    return d * g


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x, t = _acc(self), _acc(target)
    log_x = jnp.maximum(jnp.log(x), -100.0)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100.0)
    loss = (t - 1) * log_1mx - t * log_x
    if weight is not None:
        loss = loss * _acc(weight)
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    x, t = _acc(self), _acc(target)
    g = _grad_scale(grad_output, reduction, max(1, x.size))
    gi = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        gi = gi * _acc(weight)
    return gi


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    # PyTorch's composite, op by op, each result in its tensor's dtype (the
    # in-place steps keep the left operand's; what a bfloat16 input sees):
    # log_sigmoid(x) [* ((pw - 1) * t + 1)], (1 - t) * x - that [* weight].
    def rnd(v, like):
        return v.astype(like.dtype)

    xf = _acc(self)
    lsi = rnd(jnp.minimum(xf, 0) - jnp.log1p(jnp.exp(-jnp.abs(xf))), self)
    if pos_weight is not None:
        log_weight = (pos_weight - 1) * target + 1
        lsi = rnd(lsi * log_weight, lsi)
    one_m_t = rnd(1 - target, target)
    loss = rnd(rnd(one_m_t * self, one_m_t) - lsi, one_m_t)
    if weight is not None:
        loss = rnd(loss * weight, loss)
    return _reduce(_acc(loss), reduction)


def _margin_rows(x, grad_output, reduction):
    """(N, C) view of a margin loss input (a 0-dim or 1-D input is one row),
    the per-element scale 1/C (1/(N*C) for the mean) and grad_output as a
    column (reduction 'none' with rows) or a scalar."""
    x2 = x.reshape(1, -1) if x.ndim <= 1 else x
    n, c = x2.shape
    scale = 1.0 / (n * c) if reduction == 1 else 1.0 / c
    g = _acc(grad_output)
    g = g.reshape(-1, 1) if g.ndim > 0 else g
    return x2, n, c, scale, g


@lower(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    """CPU's formula: for each class d != y with z = margin - x[y] + x[d] > 0,
    grad[d] = g (p=1) or 2*g*z (p=2), times weight[y]; grad[y] = -sum."""
    x2, n, c, scale, g = _margin_rows(_acc(self), grad_output, reduction)
    t = target.reshape(-1).astype(jnp.int32)
    xt = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = margin - xt + x2
    is_y = jnp.arange(c, dtype=jnp.int32)[None, :] == t[:, None]
    h = jnp.where(p == 1, jnp.full_like(z, scale), (2 * scale) * z)
    if weight is not None:
        h = h * _acc(weight)[t][:, None]
    h = jnp.where((z > 0) & ~is_y, h, jnp.zeros((), h.dtype))
    gi = jnp.where(is_y, -jnp.sum(h, axis=1, keepdims=True), h)
    return (gi * g).reshape(self.shape)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    """CPU's formula: each listed target y (up to the first -1, repeats count)
    and each non-target d with z = 1 - x[y] + x[d] > 0 add g to grad[d] and
    -g to grad[y]."""
    x2, n, c, scale, g = _margin_rows(_acc(self), grad_output, reduction)
    t = target.reshape(n, c).astype(jnp.int32)
    listed = jnp.cumsum(t < 0, axis=1) == 0
    count = jnp.sum(jax.nn.one_hot(jnp.where(listed, t, -1), c, dtype=x2.dtype), axis=1)
    other = is_target.reshape(n, c) == 0
    z = 1 - x2[:, :, None] + x2[:, None, :]  # [n, y, d]
    w = jnp.where((z > 0) & other[:, None, :], count[:, :, None], jnp.zeros((), x2.dtype))
    gi = scale * (jnp.sum(w, axis=1) - jnp.sum(w, axis=2))
    return (gi * g).reshape(self.shape)


# --------------------------------------------------------------------------
# embedding


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0, mode="clip")


@lower(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    """Rows of `self` named in `indices` rescaled to norm <= max_norm."""
    idx = indices.reshape(-1)
    rows = jnp.take(_acc(self), idx, axis=0, mode="clip")
    norms = jnp.linalg.norm(rows, ord=norm_type, axis=-1, keepdims=True)
    scale = jnp.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    return _acc(self).at[idx].set(rows * scale)


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    g = _acc(grad_output)
    d = g.shape[-1]
    idx = indices.reshape(-1)
    g = g.reshape(-1, d)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], jnp.zeros((), g.dtype), g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, d), g.dtype).at[idx].add(g)


def _bags(indices, offsets, include_last_offset, padding_idx, nbags):
    """Bag of each index, whether it counts (in a bag, not padding), counts per bag."""
    n = indices.shape[0]
    pos = jnp.arange(n)
    starts = offsets[:nbags]
    bag = jnp.clip(jnp.searchsorted(starts, pos, side="right") - 1, 0, max(nbags - 1, 0))
    if include_last_offset:
        end = offsets[nbags] if offsets.shape[0] > nbags else n
        inside = pos < end
    else:
        inside = jnp.ones((n,), jnp.bool_)
    valid = inside & (pos >= starts[bag]) if nbags else jnp.zeros((n,), jnp.bool_)
    if padding_idx is not None and padding_idx >= 0:
        valid = valid & (indices != padding_idx)
    counts = jax.ops.segment_sum(valid.astype(jnp.int64), bag, num_segments=nbags)
    return bag, valid, counts


def _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights,
                        include_last_offset, padding_idx):
    nbags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag, valid, counts = _bags(indices, offsets, include_last_offset, padding_idx, nbags)
    w = _acc(weight)
    rows = jnp.take(w, indices, axis=0, mode="clip")
    metas = _meta_list()
    if mode == 2:
        neg = jnp.array(-jnp.inf, rows.dtype)
        vals = jnp.where(valid[:, None], rows, neg)
        out = jax.ops.segment_max(vals, bag, num_segments=nbags)
        out = jnp.where(counts[:, None] > 0, out, 0)
        # First index (in bag order) reaching the maximum, like PyTorch's CPU.
        n = indices.shape[0]
        hit = valid[:, None] & (vals == out[bag])
        first = jax.ops.segment_min(jnp.where(hit, jnp.arange(n)[:, None], n), bag,
                                    num_segments=nbags)
        maxi = jnp.where(counts[:, None] > 0, indices[jnp.clip(first, 0, max(n - 1, 0))], 0)
    else:
        if per_sample_weights is not None:
            rows = rows * _acc(per_sample_weights)[:, None]
        out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, num_segments=nbags)
        if mode == 1:
            out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
        maxi = jnp.zeros(tuple(metas[3].shape), jnp.int64)
    bag_size = jnp.zeros(tuple(metas[2].shape), jnp.int64)
    if mode != 0:
        bag_size = bag_size.at[:nbags].set(counts)
    return out, bag, bag_size, maxi


@lower(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights,
                               include_last_offset, padding_idx)


def _embedding_bag_grad(grad, indices, bag, valid, counts, maximum_indices, num_weights,
                        scale_grad_by_freq, mode, per_sample_weights):
    g = _acc(grad)
    d = g.shape[-1]
    if mode == 2:
        nbags = g.shape[0]
        keep = (counts > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(d), (nbags, d))
        return jnp.zeros((num_weights, d), g.dtype).at[maximum_indices, cols].add(
            jnp.where(keep, g, 0))
    rows = g[bag]
    if mode == 1:
        rows = rows / jnp.maximum(counts[bag], 1)[:, None].astype(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * _acc(per_sample_weights)[:, None]
    rows = jnp.where(valid[:, None], rows, 0)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), rows.dtype).at[indices].add(valid.astype(rows.dtype))
        rows = rows / jnp.maximum(freq[indices], 1)[:, None]
    return jnp.zeros((num_weights, d), rows.dtype).at[indices].add(rows)


@lower(aten._embedding_bag_backward.default)
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                            num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
                            padding_idx=-1):
    nbags = grad.shape[0]
    include_last = offsets.shape[0] > nbags
    bag, valid, counts = _bags(indices, offsets, include_last, padding_idx, nbags)
    return _embedding_bag_grad(grad, indices, bag, valid, counts, maximum_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights)


@lower(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                  padding_idx=-1):
    nbags = grad.shape[0]
    valid = jnp.ones(indices.shape, jnp.bool_)
    if padding_idx >= 0:
        valid = indices != padding_idx
    counts = jax.ops.segment_sum(valid.astype(jnp.int64), offset2bag, num_segments=nbags)
    return _embedding_bag_grad(grad, indices, offset2bag, valid, counts, maximum_indices,
                               num_weights, scale_grad_by_freq, mode, per_sample_weights)


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                               padding_idx=-1):
    nbags = grad.shape[0]
    include_last = offsets.shape[0] > nbags
    bag, valid, _ = _bags(indices, offsets, include_last, padding_idx, nbags)
    rows = jnp.take(_acc(weight), indices, axis=0, mode="clip")
    return jnp.where(valid, jnp.sum(_acc(grad)[bag] * rows, axis=-1), 0)


# --------------------------------------------------------------------------
# dropout


def _jax_key(rng_key):
    from ...device import random as tpu_random

    return tpu_random.jax_key(rng_key)


@lower(aten.native_dropout.default, random=True)
def native_dropout(input, p, train, *, rng_key):
    if train is not None and not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(_jax_key(rng_key), 1.0 - p, input.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    x = _acc(input)
    return x * keep.astype(x.dtype) * scale, keep


@lower(aten.rrelu_with_noise.default, mutates=("noise",), random=True)
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None,
                     *, rng_key):
    x = _acc(self)
    if not training:  # leaky_relu with the mean slope; the noise is left alone
        slope = (lower + upper) / 2
        return jnp.where(x > 0, x, x * slope), {"noise": noise}
    r = jax.random.uniform(_jax_key(rng_key), x.shape, jnp.float32, 0.0, 1.0)
    r = (lower + (upper - lower) * r).astype(x.dtype)
    neg = x <= 0
    return (jnp.where(neg, x * r, x),
            {"noise": jnp.where(neg, r, jnp.ones((), x.dtype)).astype(noise.dtype)})


@lower(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(self, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                                generator=None, *, rng_key):
    out, new = rrelu_with_noise(self, noise, lower, upper, training, generator, rng_key=rng_key)
    return out, new["noise"]


def _rrelu_with_noise_inplace(self, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                              generator=None):
    # The functional overload writes `noise`; the result is then copied into self.
    out = aten.rrelu_with_noise.default(self, noise, lower, upper, training, generator)
    self.copy_(out)
    return self


def _install_rrelu_kernel():
    from .. import core

    core.KERNELS.setdefault(aten.rrelu_with_noise_.default, _rrelu_with_noise_inplace)


_install_rrelu_kernel()


@lower(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    g = _acc(grad_output)
    slope = (lower + upper) / 2
    leaky = jnp.where(_acc(self) > 0, g, g * slope)
    if not training:
        return leaky
    return jnp.where(upper - lower > 1e-6, g * _acc(noise), leaky)


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    g = _acc(grad_output)
    return g * mask.astype(g.dtype) * scale


# --------------------------------------------------------------------------
# attention


def _heads(x):
    return x.shape[-3] if x.ndim >= 3 else 1


def _group(x, grp):
    """(..., Hq, A, B) -> (..., Hk, G, A, B): query head h uses kv head h // G."""
    if grp == 1:
        return x
    return x.reshape(x.shape[:-3] + (x.shape[-3] // grp, grp) + x.shape[-2:])


def _ungroup(x, grp):
    if grp == 1:
        return x
    return x.reshape(x.shape[:-4] + (x.shape[-4] * x.shape[-3],) + x.shape[-2:])


def _kv(x, grp):
    """(..., Hk, S, E) -> (..., Hk, 1, S, E), to pair with grouped queries."""
    return x if grp == 1 else x[..., :, None, :, :]


def _attn_scores(q, k, bias, is_causal, scale, grp):
    """Masked, scaled scores q k^T in float32, shape (..., Hq, L, S)."""
    L, S = q.shape[-2], k.shape[-2]
    s = jnp.einsum("...le,...se->...ls", _group(_acc(q), grp), _kv(_acc(k), grp),
                   precision=_precision(q, k))
    s = _ungroup(s, grp) * scale
    masked = None
    if is_causal:
        masked = ~jnp.tril(jnp.ones((L, S), jnp.bool_))
    if bias is not None:
        if bias.dtype == jnp.bool_:
            masked = ~bias if masked is None else (masked | ~bias)
        else:
            s = s + _acc(bias)
    if masked is not None:
        s = jnp.where(masked, -jnp.inf, s)
    return s


def _attn_setup(q, k, scale):
    E = q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    hq, hk = _heads(q), _heads(k)
    return scale, (hq // hk if hq != hk else 1)


def _attn_keep(key, dropout_p, shape):
    return jax.random.bernoulli(key, 1.0 - dropout_p, shape)


def _attention(q, k, v, bias, dropout_p, is_causal, scale, key):
    """softmax(q k^T * scale + bias) v, with GQA when k has fewer heads.

    Fully masked rows give zeros (PyTorch's CPU kernels and its math path's
    _safe_softmax do the same). Returns (out, logsumexp).
    """
    scale, grp = _attn_setup(q, k, scale)
    s = _attn_scores(q, k, bias, is_causal, scale, grp)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    lse = (jnp.log(denom) + m)[..., 0]
    p = e / jnp.where(denom == 0, 1.0, denom)
    if dropout_p > 0:
        p = jnp.where(_attn_keep(key, dropout_p, p.shape), p / (1.0 - dropout_p), 0.0)
    half_v = _is_half(v)
    # P @ V runs in V's dtype (float32 accumulation) for half types.
    va = v if half_v else _acc(v)
    out = jnp.einsum("...ls,...sd->...ld", _group(p.astype(va.dtype), grp), _kv(va, grp),
                     precision=_precision(v), preferred_element_type=jnp.float32
                     if half_v else None)
    return _ungroup(out, grp), lse


def _attention_backward(g, q, k, v, bias, lse, dropout_p, is_causal, scale, key, out=None):
    """Gradients of _attention from the saved logsumexp (no second softmax).
    With the forward's `out`, the softmax-gradient row term sum(p * dp) is
    taken as rowsum(g * out), as CPU's fused attention backward does."""
    scale, grp = _attn_setup(q, k, scale)
    s = _attn_scores(q, k, bias, is_causal, scale, grp)
    lse = lse.reshape(s.shape[:-1])[..., None]
    p = jnp.where(jnp.isfinite(lse), jnp.exp(s - lse), 0.0)
    ga = _acc(g)
    prec = _precision(q, k, v)
    pd = p
    if dropout_p > 0:
        z = jnp.where(_attn_keep(key, dropout_p, p.shape), 1.0 / (1.0 - dropout_p), 0.0)
        pd = p * z
    gg = _group(ga, grp)
    # With GQA, the G query heads of a kv head sum into its gradients.
    gsum = "...gls,...gld->...sd" if grp > 1 else "...ls,...ld->...sd"
    dv = jnp.einsum(gsum, _group(pd, grp), gg, precision=prec)
    dp = _ungroup(jnp.einsum("...ld,...sd->...ls", gg, _kv(_acc(v), grp), precision=prec), grp)
    if dropout_p > 0:
        dp = dp * z
    if out is not None:
        row = jnp.sum(ga * _acc(out), axis=-1, keepdims=True)
    else:
        row = jnp.sum(p * dp, axis=-1, keepdims=True)
    ds = p * (dp - row)
    dsg = _group(ds, grp)
    dq = _ungroup(jnp.einsum("...ls,...se->...le", dsg, _kv(_acc(k), grp), precision=prec),
                  grp) * scale
    dk = jnp.einsum(gsum.replace("d", "e"), dsg, _group(_acc(q), grp), precision=prec) * scale
    return dq, dk, dv, ds


def _pack_key(rng_key):
    """The raw (seed, offset) uint32[4] key as two int64 scalars."""
    k = rng_key.astype(jnp.uint64)
    seed = lax.bitcast_convert_type((k[0] << 32) | k[1], jnp.int64)
    offset = lax.bitcast_convert_type((k[2] << 32) | k[3], jnp.int64)
    return seed, offset


def _unpack_key(seed, offset):
    s = lax.bitcast_convert_type(seed.astype(jnp.int64), jnp.uint64)
    o = lax.bitcast_convert_type(offset.astype(jnp.int64), jnp.uint64)
    raw = jnp.stack([s >> 32, s & 0xFFFFFFFF, o >> 32, o & 0xFFFFFFFF]).astype(jnp.uint32)
    return _jax_key(raw)


@lower(aten._scaled_dot_product_fused_attention_overrideable.default, random=True)
def _sdpa_fused(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, *, scale=None, rng_key):
    out, lse = _attention(query, key, value, attn_bias, dropout_p, is_causal, scale,
                          _jax_key(rng_key))
    seed, offset = _pack_key(rng_key)
    if query.ndim == 3:
        lse = lse[None]
    return out, lse, seed, offset


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _sdpa_fused_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out,
                         logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                         philox_seed, philox_offset, *, scale=None):
    rkey = _unpack_key(philox_seed, philox_offset) if dropout_p > 0 else None
    gq, gk, gv, ds = _attention_backward(grad_out, query, key, value, attn_bias, logsumexp,
                                         dropout_p, is_causal, scale, rkey, out)
    gb = None
    if attn_bias is not None:
        if attn_bias.dtype != jnp.bool_ and grad_input_mask[3]:
            gb = _sum_to(ds, attn_bias.shape)
        else:
            # PyTorch's meta gives the bias gradient the bias' shape whenever a
            # bias is passed, even when it is not wanted (or is a bool mask).
            gb = jnp.zeros(attn_bias.shape, attn_bias.dtype)
    # The meta kernel returns all three input gradients whatever the mask.
    gq, gk, gv = (g if want else jnp.zeros(g.shape, g.dtype)
                  for g, want in zip((gq, gk, gv), grad_input_mask[:3]))
    return gq, gk, gv, gb


# --------------------------------------------------------------------------
# upsampling


def _scale_value(scale, L, O):
    # compute_scales_value: 1/scale when given, else input/output (as float32)
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(L) / np.float32(O)


def _nearest_index(L, O, scale, exact):
    if O == L and not exact:
        return np.arange(O)
    if O == 2 * L and not exact and scale is None:
        return np.arange(O) >> 1
    sc = _scale_value(scale, L, O)
    o = np.arange(O, dtype=np.float32)
    if exact:
        src = np.floor((o + np.float32(0.5)) * sc)
    else:
        src = np.floor(o * sc)
    return np.minimum(src.astype(np.int64), L - 1)


def _upsample_nearest(x, out_sp, scales, exact):
    nsp = len(out_sp)
    lead = x.ndim - nsp
    for j, (O, sc) in enumerate(zip(out_sp, scales)):
        L = x.shape[lead + j]
        x = jnp.take(x, jnp.asarray(_nearest_index(L, O, sc, exact)), axis=lead + j)
    return x


def _onehot_mat(idx, L):
    m = np.zeros((len(idx), L), np.float32)
    m[np.arange(len(idx)), idx] = 1
    return m


def _upsample_nearest_backward(g, out_sp, in_sp, scales, exact):
    mats = [_onehot_mat(_nearest_index(L, O, sc, exact), L)
            for L, O, sc in zip(in_sp, out_sp, scales)]
    return _separable(_acc(g), mats, transpose=True, prec=lax.Precision.HIGHEST)


def _linear_weights(L, O, align_corners, scale):
    """Source indices (i0, i1) and weights (l0, l1) of linear interpolation."""
    o = np.arange(O, dtype=np.float32)
    if align_corners:
        sc = np.float32((L - 1) / (O - 1)) if O > 1 else np.float32(0)
        src = sc * o
    else:
        sc = _scale_value(scale, L, O)
        src = np.maximum(sc * (o + np.float32(0.5)) - np.float32(0.5), np.float32(0))
    i0 = src.astype(np.int64)
    i0 = np.minimum(i0, L - 1)
    l1 = (src - i0.astype(np.float32)).astype(np.float32)
    i1 = i0 + (i0 < L - 1)
    l0 = (np.float32(1) - l1).astype(np.float32)
    return i0, i1, l0, l1


def _upsample_linear(x, out_sp, align_corners, scales):
    nsp = len(out_sp)
    lead = x.ndim - nsp
    xa = _acc(x)
    # CPU's generic (1-d and 3-d) kernel stores a half input's weights in its
    # dtype: lambda1 rounded, lambda0 = 1 - that, rounded (its 2-d kernel not).
    round_w = _is_half(x) and nsp != 2
    for j, (O, sc) in enumerate(zip(out_sp, scales)):
        L = xa.shape[lead + j]
        i0, i1, l0, l1 = _linear_weights(L, O, align_corners, sc)
        if round_w:
            hd = jnp.dtype(x.dtype)
            l1 = l1.astype(hd).astype(np.float32)
            l0 = (np.float32(1) - l1).astype(hd).astype(np.float32)
        shape = [1] * xa.ndim
        shape[lead + j] = O
        a = jnp.take(xa, jnp.asarray(i0), axis=lead + j)
        b = jnp.take(xa, jnp.asarray(i1), axis=lead + j)
        xa = a * jnp.asarray(l0.reshape(shape)) + b * jnp.asarray(l1.reshape(shape))
    return xa


def _linear_mat(L, O, align_corners, scale):
    i0, i1, l0, l1 = _linear_weights(L, O, align_corners, scale)
    m = np.zeros((O, L), np.float32)
    np.add.at(m, (np.arange(O), i0), l0)
    np.add.at(m, (np.arange(O), i1), l1)
    return m


def _upsample_linear_backward(g, out_sp, in_sp, align_corners, scales):
    mats = [_linear_mat(L, O, align_corners, sc) for L, O, sc in zip(in_sp, out_sp, scales)]
    return _separable(_acc(g), mats, transpose=True, prec=lax.Precision.HIGHEST)


def _cubic_mat(L, O, align_corners, scale, A=-0.75):
    """(O, L) matrix of PyTorch's bicubic interpolation along one dim."""
    o = np.arange(O, dtype=np.float32)
    if align_corners:
        sc = np.float32((L - 1) / (O - 1)) if O > 1 else np.float32(0)
        src = sc * o
    else:
        sc = _scale_value(scale, L, O)
        src = (sc * (o + np.float32(0.5)) - np.float32(0.5)).astype(np.float32)
    i0 = np.floor(src).astype(np.int64)
    t = (src - i0.astype(np.float32)).astype(np.float32)
    A = np.float32(A)

    def cc1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def cc2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    coeffs = [cc2(t + 1), cc1(t), cc1(1 - t), cc2(2 - t)]
    m = np.zeros((O, L), np.float32)
    for k in range(4):
        np.add.at(m, (np.arange(O), np.clip(i0 - 1 + k, 0, L - 1)), coeffs[k])
    return m


@lower(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    in_sp = self.shape[-2:]
    mats = [_cubic_mat(L, O, align_corners, sc)
            for L, O, sc in zip(in_sp, tuple(output_size), (scales_h, scales_w))]
    return _separable(_acc(self), mats, prec=lax.Precision.HIGHEST)


@lower(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners,
                                scales_h=None, scales_w=None):
    mats = [_cubic_mat(L, O, align_corners, sc)
            for L, O, sc in zip(tuple(input_size[-2:]), tuple(output_size), (scales_h, scales_w))]
    return _separable(_acc(grad_output), mats, transpose=True, prec=lax.Precision.HIGHEST)


@lower(aten.upsample_nearest1d.default)
def upsample_nearest1d(self, output_size, scales=None):
    return _upsample_nearest(self, tuple(output_size), (scales,), False)


@lower(aten.upsample_nearest2d.default)
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w), False)


@lower(aten.upsample_nearest3d.default)
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_d, scales_h, scales_w), False)


@lower(aten._upsample_nearest_exact1d.default)
def _upsample_nearest_exact1d(self, output_size, scales=None):
    return _upsample_nearest(self, tuple(output_size), (scales,), True)


@lower(aten._upsample_nearest_exact2d.default)
def _upsample_nearest_exact2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w), True)


@lower(aten._upsample_nearest_exact3d.default)
def _upsample_nearest_exact3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_d, scales_h, scales_w), True)


@lower(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _upsample_nearest_backward(grad_output, tuple(output_size), tuple(input_size[-1:]),
                                      (scales,), False)


@lower(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None,
                                scales_w=None):
    return _upsample_nearest_backward(grad_output, tuple(output_size), tuple(input_size[-2:]),
                                      (scales_h, scales_w), False)


@lower(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None,
                                scales_h=None, scales_w=None):
    return _upsample_nearest_backward(grad_output, tuple(output_size), tuple(input_size[-3:]),
                                      (scales_d, scales_h, scales_w), False)


@lower(aten._upsample_nearest_exact1d_backward.default)
def _upsample_nearest_exact1d_backward(grad_output, output_size, input_size, scales=None):
    return _upsample_nearest_backward(grad_output, tuple(output_size), tuple(input_size[-1:]),
                                      (scales,), True)


@lower(aten._upsample_nearest_exact2d_backward.default)
def _upsample_nearest_exact2d_backward(grad_output, output_size, input_size, scales_h=None,
                                       scales_w=None):
    return _upsample_nearest_backward(grad_output, tuple(output_size), tuple(input_size[-2:]),
                                      (scales_h, scales_w), True)


@lower(aten._upsample_nearest_exact3d_backward.default)
def _upsample_nearest_exact3d_backward(grad_output, output_size, input_size, scales_d=None,
                                       scales_h=None, scales_w=None):
    return _upsample_nearest_backward(grad_output, tuple(output_size), tuple(input_size[-3:]),
                                      (scales_d, scales_h, scales_w), True)


@lower(aten.upsample_linear1d.default)
def upsample_linear1d(self, output_size, align_corners, scales=None):
    return _upsample_linear(self, tuple(output_size), align_corners, (scales,))


@lower(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear(self, tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None,
                         scales_w=None):
    return _upsample_linear(self, tuple(output_size), align_corners,
                            (scales_d, scales_h, scales_w))


@lower(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners,
                               scales=None):
    return _upsample_linear_backward(grad_output, tuple(output_size), tuple(input_size[-1:]),
                                     align_corners, (scales,))


@lower(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                 scales_h=None, scales_w=None):
    return _upsample_linear_backward(grad_output, tuple(output_size), tuple(input_size[-2:]),
                                     align_corners, (scales_h, scales_w))


@lower(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(grad_output, output_size, input_size, align_corners,
                                  scales_d=None, scales_h=None, scales_w=None):
    return _upsample_linear_backward(grad_output, tuple(output_size), tuple(input_size[-3:]),
                                     align_corners, (scales_d, scales_h, scales_w))


def _aa_linear_mat(L, O, align_corners, scale):
    """(O, L) matrix of PyTorch's antialiased bilinear resampling along one dim
    (CPU's _compute_indices_min_size_weights_aa with the triangle filter)."""
    f32 = np.float32
    if align_corners:
        sc = f32(L - 1) / f32(O - 1) if O > 1 else f32(0)
    else:
        sc = _scale_value(scale, L, O)
    support = f32(sc) if sc >= 1.0 else f32(1.0)  # (interp_size / 2) * scale
    invscale = f32(1.0) / sc if sc >= 1.0 else f32(1.0)
    max_size = int(math.ceil(support)) * 2 + 1
    m = np.zeros((O, L), np.float32)
    for i in range(O):
        center = f32(float(sc) * (i + 0.5))
        xmin = max(int(float(center) - float(support) + 0.5), 0)
        xsize = min(int(float(center) + float(support) + 0.5), L) - xmin
        xsize = min(max(xsize, 0), max_size)
        ws = []
        for j in range(xsize):
            t = abs(f32((j + xmin - float(center) + 0.5) * float(invscale)))
            ws.append(f32(1) - t if t < 1 else f32(0))
        total = f32(0)
        for w in ws:
            total = f32(total + w)
        for j, w in enumerate(ws):
            m[i, xmin + j] = w / total if total != 0 else w
    return m


def _aa_mats(in_sp, out_sp, align_corners, scales):
    return [_aa_linear_mat(L, O, align_corners, sc) for L, O, sc in zip(in_sp, out_sp, scales)]


@lower(aten._upsample_bilinear2d_aa.default)
def _upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    if _is_half(self):
        name = "BFloat16" if self.dtype == jnp.bfloat16 else "Half"
        raise NotImplementedError(
            f'"compute_index_ranges_weights" not implemented for \'{name}\'')
    mats = _aa_mats(self.shape[-2:], tuple(output_size), align_corners, (scales_h, scales_w))
    x = self if _is_float(self) else self.astype(jnp.float32)
    # CPU resamples the last dim first, then the one before (skipping equal sizes).
    for j in (1, 0):
        if mats[j].shape[0] != mats[j].shape[1] or not np.array_equal(
                mats[j], np.eye(mats[j].shape[0], dtype=np.float32)):
            ax = x.ndim - 2 + j
            x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(mats[j]), axes=([ax], [1]),
                                           precision=lax.Precision.HIGHEST), -1, ax)
    if not _is_float(self):  # uint8: rounded and saturated
        x = jnp.clip(jnp.round(x), 0, 255)
    return x


@lower(aten._upsample_bilinear2d_aa_backward.default)
def _upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners,
                                     scales_h=None, scales_w=None):
    mats = _aa_mats(tuple(input_size[-2:]), tuple(output_size), align_corners,
                    (scales_h, scales_w))
    return _separable(_acc(grad_output), mats, transpose=True, prec=lax.Precision.HIGHEST)


# --------------------------------------------------------------------------
# grid sampling


def _gs_unnormalize(coord, size, align_corners, vectorized=False):
    # CPU's 2-D kernel (vectorized) and its 3-D kernel round differently.
    if vectorized:
        sf = (size - 1) / 2 if align_corners else size / 2
        return (coord + 1) * sf if align_corners else (coord + 1) * sf - 0.5
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


_CUBIC_A = -0.75


def _gs_cubic_coeffs(t):
    A = _CUBIC_A

    def cc1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def cc2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return (cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(2.0 - t))


def _gs_cubic_coeffs_grad(t):
    A = _CUBIC_A
    x0, x1, x2, x3 = -1.0 - t, -t, 1.0 - t, 2.0 - t
    return ((-3 * A * x0 - 10 * A) * x0 - 8 * A,
            (-3 * (A + 2) * x1 - 2 * (A + 3)) * x1,
            (3 * (A + 2) * x2 - 2 * (A + 3)) * x2,
            (3 * A * x3 - 10 * A) * x3 + 8 * A)


def _gs_reflect(x, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = jnp.abs(x - lo)
    extra = jnp.fmod(x, span)
    flips = jnp.floor(x / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)


def _gs_clip(x, size):
    return jnp.minimum(jnp.asarray(size - 1, x.dtype), jnp.maximum(x, 0))


def _gs_coordinates(x, size, padding_mode, align_corners):
    """CPU's compute_coordinates: padding mode applied to a source coordinate."""
    if padding_mode == 1:  # border
        x = _gs_clip(x, size)
    elif padding_mode == 2:  # reflection
        if align_corners:
            x = _gs_reflect(x, 0, 2 * (size - 1))
        else:
            x = _gs_reflect(x, -1, 2 * size - 1)
        x = _gs_clip(x, size)
    # safe_downgrade_to_int_range: huge or non-finite coordinates read nothing.
    bad = ~jnp.isfinite(x) | (x > 2.0 ** 31 - 2) | (x < -2.0 ** 31)
    return jnp.where(bad, jnp.asarray(-100.0, x.dtype), x)


def _gs_gather(flat, sp, idxs):
    """Values of `flat` (N, C, prod(sp)) at integer positions `idxs` (each
    (N, P), last spatial dim last), and whether each is in bounds, as
    (N, C, P) values with out-of-bounds ones zero."""
    ok = None
    lin = None
    for i, L in zip(idxs, sp):
        inb = (i >= 0) & (i < L)
        ok = inb if ok is None else ok & inb
        ic = jnp.clip(i, 0, L - 1)
        lin = ic if lin is None else lin * L + ic
    v = jnp.take_along_axis(flat, lin[:, None, :], axis=2)
    return jnp.where(ok[:, None, :], v, jnp.zeros((), v.dtype))


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    # bfloat16: CPU runs its scalar kernel in bfloat16, every operation rounded;
    # the same operations on bfloat16 arrays reproduce it. float16 (like float32)
    # takes CPU's vectorized 2-D kernel, which we follow in float32.
    keep = input.dtype == jnp.bfloat16
    x = input if keep else _acc(input)
    g = grid if keep else _acc(grid)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    nsp = len(sp)
    out_sp = g.shape[1:-1]
    p = int(np.prod(out_sp)) if out_sp else 1
    flat = x.reshape(n, c, -1)
    gf = g.reshape(n, p, nsp)
    # grid's last dim is (x, y[, z]): x indexes the last spatial dim.
    coords = [gf[:, :, nsp - 1 - d] for d in range(nsp)]
    src = [_gs_unnormalize(co, L, align_corners, nsp == 2 and not keep)
           for co, L in zip(coords, sp)]
    if interpolation_mode == 2:  # bicubic (2-D only)
        iy, ix = src
        y0, x0 = jnp.floor(iy), jnp.floor(ix)
        ty, tx = iy - y0, ix - x0
        H, W = sp
        cx, cy = _gs_cubic_coeffs(tx), _gs_cubic_coeffs(ty)
        out = None
        for i in range(4):
            yy = _gs_coordinates(y0 - 1 + i, H, padding_mode, align_corners)
            row = None
            for j in range(4):
                xx = _gs_coordinates(x0 - 1 + j, W, padding_mode, align_corners)
                v = _gs_gather(flat, sp, (yy.astype(jnp.int32), xx.astype(jnp.int32)))
                term = v * cx[j][:, None, :]
                row = term if row is None else row + term
            term = row * cy[i][:, None, :]
            out = term if out is None else out + term
    else:
        src = [_gs_coordinates(s_, L, padding_mode, align_corners) for s_, L in zip(src, sp)]
        if interpolation_mode == 1:  # nearest (round half to even, like nearbyint)
            out = _gs_gather(flat, sp, [jnp.round(s_).astype(jnp.int32) for s_ in src])
        else:  # bilinear / trilinear
            lo = [jnp.floor(s_) for s_ in src]
            w1 = [s_ - f for s_, f in zip(src, lo)]
            w0 = [f + 1 - s_ for s_, f in zip(src, lo)]
            out = None
            for corner in itertools.product((0, 1), repeat=nsp):
                idx = [(f + b).astype(jnp.int32) for f, b in zip(lo, corner)]
                w = None
                for d in reversed(range(nsp)):  # x, y, z
                    wd = w1[d] if corner[d] else w0[d]
                    w = wd if w is None else w * wd
                term = _gs_gather(flat, sp, idx) * w[:, None, :]
                out = term if out is None else out + term
    return out.reshape((n, c) + tuple(out_sp))


@lower(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


def _gs_coordinates_grad(coord, size, padding_mode, align_corners, vectorized=False):
    """Source coordinate and d(coordinate)/d(grid value), with CPU's gradient
    conventions: clipping passes no gradient at or beyond the borders, and a
    reflection flips its sign."""
    sf = (size - 1) / 2 if align_corners else size / 2
    x = _gs_unnormalize(coord, size, align_corners, vectorized)
    m = jnp.full(x.shape, sf, x.dtype)
    if padding_mode == 2:
        if align_corners:
            twice_low, twice_high = 0, 2 * (size - 1)
        else:
            twice_low, twice_high = -1, 2 * size - 1
        if twice_low == twice_high:
            x, m = jnp.zeros_like(x), jnp.zeros_like(m)
        else:
            lo = twice_low / 2
            span = (twice_high - twice_low) / 2
            d = x - lo
            sign = jnp.where(d < 0, -1.0, 1.0).astype(x.dtype)
            d = jnp.abs(d)
            extra = jnp.fmod(d, span)
            even = jnp.fmod(jnp.floor(d / span), 2) == 0
            x = jnp.where(even, extra + lo, span - extra + lo)
            m = m * jnp.where(even, sign, -sign)
    if padding_mode in (1, 2):
        inside = (x > 0) & (x < size - 1)
        m = jnp.where(inside, m, jnp.zeros((), m.dtype))
        x = _gs_clip(x, size)
    bad = ~jnp.isfinite(x) | (x > 2.0 ** 31 - 2) | (x < -2.0 ** 31)
    return jnp.where(bad, jnp.asarray(-100.0, x.dtype), x), m


@lower(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                          align_corners, output_mask):
    x, g, go = _acc(input), _acc(grid), _acc(grad_output)
    gi = None
    if output_mask[0]:  # linear in the input: the forward's transpose
        _, vjp = jax.vjp(lambda x_: _grid_sample(x_, g, interpolation_mode, padding_mode,
                                                 align_corners), x)
        gi = vjp(go)[0]
    if interpolation_mode == 1:  # nearest: no gradient for the grid
        return gi, jnp.zeros(g.shape, g.dtype)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    nsp = len(sp)
    p = int(np.prod(g.shape[1:-1])) if g.shape[1:-1] else 1
    flat = x.reshape(n, c, -1)
    gf = g.reshape(n, p, nsp)
    gof = go.reshape(n, c, p)
    if interpolation_mode == 2:  # bicubic, CPU's formula (taps carry no gradient)
        H, W = sp
        ix = _gs_unnormalize(gf[:, :, 0], W, align_corners, True)
        iy = _gs_unnormalize(gf[:, :, 1], H, align_corners, True)
        x0, y0 = jnp.floor(ix), jnp.floor(iy)
        cx, cy = _gs_cubic_coeffs(ix - x0), _gs_cubic_coeffs(iy - y0)
        gcx, gcy = _gs_cubic_coeffs_grad(ix - x0), _gs_cubic_coeffs_grad(iy - y0)
        gx = gy = None
        for i in range(4):
            xx = _gs_coordinates(x0 - 1 + i, W, padding_mode, align_corners)
            for j in range(4):
                yy = _gs_coordinates(y0 - 1 + j, H, padding_mode, align_corners)
                vg = _gs_gather(flat, sp, (yy.astype(jnp.int32), xx.astype(jnp.int32))) * gof
                tx_ = vg * gcx[i][:, None, :] * cy[j][:, None, :]
                ty_ = vg * gcy[j][:, None, :] * cx[i][:, None, :]
                gx = -tx_ if gx is None else gx - tx_
                gy = -ty_ if gy is None else gy - ty_
        gx, gy = jnp.sum(gx, axis=1), jnp.sum(gy, axis=1)
        sfx = (W - 1) / 2 if align_corners else W / 2
        sfy = (H - 1) / 2 if align_corners else H / 2
        gg = jnp.stack([gx * sfx, gy * sfy], axis=-1)
        return gi, gg.reshape(g.shape)
    src, mult = [], []
    for d in range(nsp):  # d indexes the spatial dims (z, y, x order)
        s_, m_ = _gs_coordinates_grad(gf[:, :, nsp - 1 - d], sp[d], padding_mode,
                                      align_corners, nsp == 2)
        src.append(s_)
        mult.append(m_)
    lo = [jnp.floor(s_) for s_ in src]
    w1 = [s_ - f for s_, f in zip(src, lo)]
    w0 = [f + 1 - s_ for s_, f in zip(src, lo)]
    acc = [None] * nsp
    for corner in itertools.product((0, 1), repeat=nsp):
        idx = [(f + b).astype(jnp.int32) for f, b in zip(lo, corner)]
        v = _gs_gather(flat, sp, idx) * gof
        for d in range(nsp):
            dw = None
            for e in reversed(range(nsp)):
                if e == d:
                    continue
                we = w1[e] if corner[e] else w0[e]
                dw = we if dw is None else dw * we
            term = v if dw is None else v * dw[:, None, :]
            term = term if corner[d] else -term
            acc[d] = term if acc[d] is None else acc[d] + term
    # grid's last dim holds x (the last spatial dim) first.
    gg = jnp.stack([jnp.sum(acc[d], axis=1) * mult[d] for d in reversed(range(nsp))], axis=-1)
    return gi, gg.reshape(g.shape)


# --------------------------------------------------------------------------
# padding and pixel shuffle


def _pad_widths(ndim, pad):
    """PyTorch's pad list (last dim first, (before, after) pairs) as lax widths."""
    widths = [(0, 0)] * ndim
    for j in range(len(pad) // 2):
        widths[ndim - 1 - j] = (pad[2 * j], pad[2 * j + 1])
    return widths


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    fill = jnp.asarray(value).astype(self.dtype)
    return lax.pad(self, fill, [(lo, hi, 0) for lo, hi in _pad_widths(self.ndim, pad)])


def _pad_mode(x, padding, mode):
    widths = _pad_widths(x.ndim, padding)
    if mode == "edge" and any(lo < 0 or hi < 0 for lo, hi in widths):
        # CPU's replication_pad reads output j of an axis from input
        # clip(j - before, 0, n - 1); this covers cropping past the edge too.
        for ax, (lo, hi) in enumerate(widths):
            if lo or hi:
                n = x.shape[ax]
                x = jnp.take(x, np.clip(np.arange(n + lo + hi) - lo, 0, n - 1), axis=ax)
        return x
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        # Negative padding crops (before the positive side is padded).
        x = lax.pad(x, np.zeros((), x.dtype),
                    [(min(lo, 0), min(hi, 0), 0) for lo, hi in widths])
        widths = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    return jnp.pad(x, widths, mode=mode)


def _pad_backward(grad_output, self, padding, mode):
    g = _acc(grad_output)
    _, vjp = jax.vjp(lambda x_: _pad_mode(x_, padding, mode), jnp.zeros(self.shape, g.dtype))
    return vjp(g)[0]


@lower(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
       aten.reflection_pad3d.default)
def reflection_pad(self, padding):
    return _pad_mode(self, padding, "reflect")


@lower(aten.replication_pad1d.default, aten.replication_pad2d.default,
       aten.replication_pad3d.default)
def replication_pad(self, padding):
    return _pad_mode(self, padding, "edge")


@lower(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
       aten.reflection_pad3d_backward.default)
def reflection_pad_backward(grad_output, self, padding):
    return _pad_backward(grad_output, self, padding, "reflect")


@lower(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
       aten.replication_pad3d_backward.default)
def replication_pad_backward(grad_output, self, padding):
    return _pad_backward(grad_output, self, padding, "edge")


@lower(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    n = len(lead)
    perm = tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2)
    return jnp.transpose(x, perm).reshape(tuple(lead) + (c // (r * r), h * r, w * r))


@lower(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    n = len(lead)
    perm = tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3)
    return jnp.transpose(x, perm).reshape(tuple(lead) + (c * r * r, h // r, w // r))


# --------------------------------------------------------------------------
# routes: kernels outside the lowering table


def _sdpa_fusable(q, k, v, attn_mask, enable_gqa):
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        return False
    if q.is_nested or k.is_nested or v.is_nested:
        return False
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        return False
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        return False
    if q.shape[-1] != k.shape[-1]:
        return False
    hq, hk = q.shape[-3], k.shape[-3]
    if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
        return False
    if attn_mask is not None and attn_mask.dim() > 4:
        return False
    return True


def _sdpa_check(q, k, v, attn_mask):
    """The argument checks of PyTorch's scaled_dot_product_attention."""
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{q.dtype} key.dtype: {k.dtype} and value.dtype: {v.dtype} instead.")
    if not (q.device == k.device == v.device):
        raise RuntimeError(
            "Expected query, key, and value to have the same device type, but got "
            f"query.device: {q.device} key.device: {k.device} and value.device: {v.device} "
            "instead.")
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got "
            f"query.dim: {q.dim()} key.dim: {k.dim()} and value.dim: {v.dim()} instead.")
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
            f"attn_mask.dtype: {attn_mask.dtype} and  query.dtype: {q.dtype} instead.")


def _sdpa_route(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    _sdpa_check(query, key, value, attn_mask)
    if not _sdpa_fusable(query, key, value, attn_mask, enable_gqa):
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
            enable_gqa=enable_gqa)[0]
    if is_causal and attn_mask is not None:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
            "is_causal=True")
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]


def _native_batch_norm_route(input, weight, bias, running_mean, running_var, training, momentum,
                             eps):
    if running_mean is None and running_var is None:
        if not training:
            raise RuntimeError(
                "running_mean and running_var must be defined in evaluation mode")
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum,
                                                      eps)
    if running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must both be given or both be None")
    if training:
        return aten._native_batch_norm_legit.default(input, weight, bias, running_mean,
                                                     running_var, True, momentum, eps)
    return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean,
                                                             running_var, momentum, eps)


def _bn_stat_dtype(input, *params):
    """dtype of CPU's save_mean/save_invstd: float32 when a half input comes with
    float32 parameters or running statistics (the mixed-type kernel), else the
    input's dtype (PyTorch's meta functions say float32 for halves always)."""
    if input.dtype in (torch.bfloat16, torch.float16) and any(
            p is not None and p.dtype == torch.float32 for p in params):
        return torch.float32
    return input.dtype


def _bn_cpu_stats(out, input, params, training):
    """The batch-norm results with CPU's saved statistics: in the stat dtype, and
    empty (shape [0]) in evaluation mode, where CPU saves nothing."""
    out = tuple(out)
    mean, rstd = out[1], out[2]
    dt = _bn_stat_dtype(input, *params)
    if not training:
        mean = torch.empty((0,), dtype=dt, device=input.device)
        rstd = torch.empty((0,), dtype=dt, device=input.device)
    elif mean.dtype != dt:
        mean, rstd = mean.to(dt), rstd.to(dt)
    return (out[0], mean, rstd) + out[3:]


def _bn_kernels():
    """PrivateUse1 kernels of the batch-norm overloads: the lowering's runner,
    then CPU's saved-statistics conventions (`_bn_cpu_stats`)."""
    from ...runtime import executor

    def legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
        out = executor.runner_for(aten._native_batch_norm_legit.default)(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
        return _bn_cpu_stats(out, input, (weight, bias, running_mean, running_var), training)

    def legit_no_stats(input, weight, bias, training, momentum, eps):
        out = executor.runner_for(aten._native_batch_norm_legit.no_stats)(
            input, weight, bias, training, momentum, eps)
        return _bn_cpu_stats(out, input, (weight, bias), True)

    def legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
        out = executor.runner_for(aten._native_batch_norm_legit_no_training.default)(
            input, weight, bias, running_mean, running_var, momentum, eps)
        return _bn_cpu_stats(out, input, (weight, bias, running_mean, running_var), False)

    def with_update(input, weight, bias, running_mean, running_var, momentum, eps):
        out = executor.runner_for(aten._batch_norm_with_update.default)(
            input, weight, bias, running_mean, running_var, momentum, eps)
        return _bn_cpu_stats(out, input, (weight, bias, running_mean, running_var), True)

    def no_update(input, weight, bias, running_mean, running_var, momentum, eps):
        out = executor.runner_for(aten._batch_norm_no_update.default)(
            input, weight, bias, running_mean, running_var, momentum, eps)
        training = running_mean is None or running_var is None
        return _bn_cpu_stats(out, input, (weight, bias, running_mean, running_var), training)

    return {
        aten._native_batch_norm_legit.default: legit,
        aten._native_batch_norm_legit.no_stats: legit_no_stats,
        aten._native_batch_norm_legit_no_training.default: legit_no_training,
        aten._batch_norm_with_update.default: with_update,
        aten._batch_norm_no_update.default: no_update,
    }


def _install_bn_kernels():
    # Kernels in `core.KERNELS` take the op's PrivateUse1 slot in place of the
    # lowering's runner (the lowering stays in the table for graphs).
    from .. import core

    for op, fn in _bn_kernels().items():
        core.KERNELS.setdefault(op, fn)


_install_bn_kernels()


_route_libs = []


def _install_routes():
    if _route_libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    _route_libs.append(lib)
    lib.impl("scaled_dot_product_attention", _sdpa_route, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", _sdpa_route, "PrivateUse1")
    lib.impl("native_batch_norm", _native_batch_norm_route, "PrivateUse1")


_install_routes()


# --------------------------------------------------------------------------
# connectionist temporal classification (CTC) loss
#
# `ctc_loss` is CompositeImplicitAutograd: it calls `_ctc_loss` (IntList or
# Tensor lengths) for the per-sample negative log-likelihood and `log_alpha`,
# then applies zero_infinity and the reduction with ordinary ops. The backward
# `_ctc_loss_backward` is PyTorch's formula, eq. (16) of Graves et al.:
# grad = (exp(log_probs) - exp(log(sum alpha*beta) + nll - log_probs)) * g,
# which is the true gradient only for normalized log_probs; we reproduce it
# (and its NaNs for impossible alignments without zero_infinity) as CPU does.
# Both recursions run over the extended label sequence (blank, l1, blank, l2,
# ..., blank) as one lax.scan over time in log space.


def _ctc_neg_inf(dtype):
    return jnp.array(-jnp.inf, dtype)


def _ctc_lse3(a, b, c):
    """log(e^a + e^b + e^c) the way PyTorch's CPU kernel writes it."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, jnp.zeros((), m.dtype), m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _ctc_check(log_probs, targets, blank):
    if log_probs.dtype not in (jnp.float32, jnp.float64):
        from ..reductions import type_name

        raise NotImplementedError(
            f'"ctc_loss_cpu" not implemented for \'{type_name(log_probs.dtype)}\'')
    if not 0 <= blank < log_probs.shape[2]:
        raise RuntimeError("blank must be in label range")


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank, L):
    """Extended labels (N, L), their validity/skip masks and the emissions (T, N, L)."""
    T, N, C = log_probs.shape
    S = (L - 1) // 2
    il = jnp.asarray(input_lengths, jnp.int32).reshape(N)
    tl = jnp.asarray(target_lengths, jnp.int32).reshape(N)
    tg = targets.astype(jnp.int32)
    k = jnp.arange(S, dtype=jnp.int32)
    if S == 0:
        padded = jnp.zeros((N, 0), jnp.int32)
    elif tg.ndim == 1:
        offsets = jnp.cumsum(tl) - tl
        idx = jnp.clip(offsets[:, None] + k[None, :], 0, max(tg.shape[0] - 1, 0))
        padded = tg[idx] if tg.shape[0] else jnp.zeros((N, S), jnp.int32)
    else:
        padded = tg[:, :S]
    padded = jnp.where(k[None, :] < tl[:, None], padded, blank)
    padded = jnp.clip(padded, 0, C - 1)
    ext = jnp.full((N, L), blank, jnp.int32)
    if S:
        ext = ext.at[:, 1::2].set(padded)
    s = jnp.arange(L, dtype=jnp.int32)
    valid = s[None, :] < (2 * tl + 1)[:, None]                        # (N, L)
    prev2 = jnp.concatenate([jnp.full((N, 2), -1, jnp.int32), ext[:, :-2]], axis=1)[:, :L]
    skip = (s[None, :] > 1) & (ext != prev2)                            # s-2 -> s allowed
    emit = jnp.take_along_axis(
        log_probs, jnp.broadcast_to(ext[None], (T, N, L)), axis=2)       # (T, N, L)
    return il, tl, ext, valid, skip, emit


def _ctc_shift(x, k, fill):
    """x[..., s - k] along the last axis, `fill` where s < k."""
    if k >= x.shape[-1]:
        return jnp.full_like(x, fill)
    pad = jnp.full(x.shape[:-1] + (k,), fill, x.dtype)
    return jnp.concatenate([pad, x[..., :-k]], axis=-1)


def _ctc_alpha(emit, il, tl, valid, skip):
    T, N, L = emit.shape
    dt = emit.dtype
    ninf = _ctc_neg_inf(dt)
    s = jnp.arange(L)
    a0 = jnp.where((s[None, :] == 0) | ((s[None, :] == 1) & (tl[:, None] > 0)), emit[0], ninf)
    a0 = jnp.where(valid, a0, ninf)

    def step(a, e):
        la2 = _ctc_shift(a, 1, ninf)
        la3 = jnp.where(skip, _ctc_shift(a, 2, ninf), ninf)
        new = jnp.where(valid, _ctc_lse3(a, la2, la3) + e, ninf)
        return new, new

    if T > 1:
        _, rest = lax.scan(step, a0, emit[1:])
        alpha = jnp.concatenate([a0[None], rest], axis=0)               # (T, N, L)
    else:
        alpha = a0[None]
    t = jnp.arange(T)
    live = (t[:, None] < il[None, :])[:, :, None]
    return jnp.where(live, alpha, ninf)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, L=None):
    if L is None:
        L = tuple(_meta_list()[1].shape)[2]
    T, N, _ = log_probs.shape
    lp = log_probs
    dt = lp.dtype
    ninf = _ctc_neg_inf(dt)
    if T == 0:
        il = jnp.asarray(input_lengths, jnp.int32).reshape(N)
        tl = jnp.asarray(target_lengths, jnp.int32).reshape(N)
        nll = jnp.where(tl == 0, jnp.zeros((), dt), jnp.array(jnp.inf, dt))
        return nll, jnp.full((N, 0, L), ninf, dt)
    il, tl, ext, valid, skip, emit = _ctc_setup(lp, targets, input_lengths, target_lengths,
                                                blank, L)
    alpha = _ctc_alpha(emit, il, tl, valid, skip)                       # (T, N, L)
    last = alpha[jnp.clip(il - 1, 0, T - 1), jnp.arange(N)]              # (N, L)
    l1 = jnp.take_along_axis(last, (2 * tl)[:, None], axis=1)[:, 0]
    l2 = jnp.take_along_axis(last, jnp.maximum(2 * tl - 1, 0)[:, None], axis=1)[:, 0]
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == -jnp.inf, jnp.zeros((), dt), m)
    ll = jnp.where(tl == 0, last[:, 0], jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    ll = jnp.where(il == 0, jnp.where(tl == 0, jnp.zeros((), dt), ninf), ll)
    return -ll, jnp.swapaxes(alpha, 0, 1)


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha,
                  blank, zero_infinity):
    T, N, C = log_probs.shape
    L = log_alpha.shape[2]
    lp = log_probs
    dt = lp.dtype
    if T == 0:
        return jnp.zeros_like(lp)
    ninf = _ctc_neg_inf(dt)
    il, tl, ext, valid, skip, emit = _ctc_setup(lp, targets, input_lengths, target_lengths,
                                                blank, L)
    s = jnp.arange(L)
    t_idx = jnp.arange(T)
    live = (t_idx[:, None] < il[None, :])[:, :, None]                   # (T, N, 1)
    alpha = jnp.where(live & valid[None], jnp.swapaxes(log_alpha, 0, 1).astype(dt), ninf)
    # the s -> s+2 transition into s+2 is allowed when skip[s+2]
    skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((N, min(2, L)), bool)], axis=1)[:, :L]
    end = (s[None, :] == 2 * tl[:, None]) | ((s[None, :] == 2 * tl[:, None] - 1)
                                              & (tl[:, None] > 0))

    def unshift(x, k):
        if k >= L:
            return jnp.full_like(x, ninf)
        pad = jnp.full(x.shape[:-1] + (k,), ninf, x.dtype)
        return jnp.concatenate([x[..., k:], pad], axis=-1)

    def step(b_next, xs):
        t, e = xs
        lb2 = unshift(b_next, 1)
        lb3 = jnp.where(skip_next, unshift(b_next, 2), ninf)
        rec = _ctc_lse3(b_next, lb2, lb3) + e
        init = jnp.where(end, e, ninf)
        b = jnp.where((t == il - 1)[:, None], init,
                      jnp.where((t < il - 1)[:, None], rec, ninf))
        b = jnp.where(valid, b, ninf)
        return b, b

    b_last = jnp.full((N, L), ninf, dt)
    _, beta = lax.scan(step, b_last, (t_idx, emit), reverse=True)       # (T, N, L)
    ab = alpha + beta
    # log-sum over the extended positions carrying each label, accumulated
    # pairwise in descending s as PyTorch's CPU kernel does (same rounding)
    ab_s = jnp.moveaxis(ab, 2, 0)                                       # (L, T, N)
    nn_ = jnp.arange(N)

    def acc(lcab, xs):
        cls, v = xs                                                     # (N,), (T, N)
        cur = lcab[:, nn_, cls]
        m = jnp.maximum(cur, v)
        m = jnp.where(m == -jnp.inf, jnp.zeros((), dt), m)
        new = jnp.where(cur == -jnp.inf, v, jnp.log(jnp.exp(cur - m) + jnp.exp(v - m)) + m)
        return lcab.at[:, nn_, cls].set(new), None

    lcab, _ = lax.scan(acc, jnp.full((T, N, C), ninf, dt), (ext.T, ab_s), reverse=True)
    g = grad.astype(dt).reshape(N)
    nllv = nll.astype(dt).reshape(N)
    res = (jnp.exp(lp) - jnp.exp(lcab + nllv[None, :, None] - lp)) * g[None, :, None]
    res = jnp.where(live, res, jnp.zeros((), dt))
    if zero_infinity:
        res = jnp.where((nllv == jnp.inf)[None, :, None], jnp.zeros((), dt), res)
    return res


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _ctc_check(log_probs, targets, blank)
    return _ctc_forward(log_probs, targets, list(input_lengths), list(target_lengths), blank)


@lower(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                       neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    _ctc_check(log_probs, targets, blank)
    return _ctc_backward(grad, log_probs, targets, list(input_lengths), list(target_lengths),
                         neg_log_likelihood, log_alpha, blank, zero_infinity)


def _ctc_host_lengths(input_lengths, target_lengths):
    """The Tensor overloads read the lengths to the host, as PyTorch's CPU/CUDA kernels do."""
    for name, v in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    return ([int(v) for v in input_lengths.detach().to("cpu", torch.long).reshape(-1).tolist()],
            [int(v) for v in target_lengths.detach().to("cpu", torch.long).reshape(-1).tolist()])


# In eager mode both overloads run kernels that keep the lengths as data
# inside the executable (the IntList lowering bakes them in, so every new set
# of lengths, i.e. nearly every training batch, would compile a new program;
# it stays in the table for graphs): the executable is keyed on the shapes and
# a padded number of extended states, 2 * targets.size(1) + 1 for padded
# targets, the next power of two of the longest target for concatenated ones.
# Extra states stay -inf and change no valid value; log_alpha is cut to CPU's
# 2 * max(target_lengths) + 1. PyTorch's checks run on meta tensors first.
_CTC_JAX_OPS: dict = {}


def _ctc_padded_states(targets, L):
    if targets.dim() == 2:
        return 2 * targets.shape[1] + 1
    s = (L - 1) // 2
    p = 1 << max(s - 1, 0).bit_length() if s else 0
    return 2 * max(s, min(p, targets.numel())) + 1


def _ctc_jax_op(kind, L, blank, zero_infinity):
    key = (kind, L, blank, zero_infinity)
    op = _CTC_JAX_OPS.get(key)
    if op is None:
        from ...jax_op import jax_op

        if kind == "fwd":
            def fn(log_probs, targets, il, tl):
                return _ctc_forward(log_probs, targets, il, tl, blank, L)
        else:
            def fn(grad, log_probs, targets, il, tl, nll):
                _, log_alpha = _ctc_forward(log_probs, targets, il, tl, blank, L)
                return _ctc_backward(grad, log_probs, targets, il, tl, nll, log_alpha, blank,
                                     zero_infinity)
        op = _CTC_JAX_OPS[key] = jax_op(
            fn, name=f"ctc_loss_{kind}_L{L}_b{blank}_z{int(bool(zero_infinity))}", vjp=False)
    return op


def _ctc_meta_check(log_probs, targets, il, tl, blank, zero_infinity):
    """PyTorch's own checks (and log_alpha's size) from the IntList overload on meta."""
    meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (log_probs, targets)]
    _, la = aten._ctc_loss.default(*meta, il, tl, blank, zero_infinity)
    if not 0 <= blank < log_probs.shape[2]:
        raise RuntimeError("blank must be in label range")
    return la.shape[2]


def _ctc_lengths_on(dev, il, tl, input_lengths, target_lengths):
    if isinstance(input_lengths, torch.Tensor):
        return input_lengths.to(dev), target_lengths.to(dev)
    return (torch.tensor(il, dtype=torch.long, device=dev),
            torch.tensor(tl, dtype=torch.long, device=dev))


def _ctc_prepare(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    """CPU's checks on host lengths; (label states, lengths as device tensors)."""
    if isinstance(input_lengths, torch.Tensor):
        il, tl = _ctc_host_lengths(input_lengths, target_lengths)
    else:
        il, tl = [int(v) for v in input_lengths], [int(v) for v in target_lengths]
    L = _ctc_meta_check(log_probs, targets, il, tl, blank, zero_infinity)
    ilt, tlt = _ctc_lengths_on(log_probs.device, il, tl, input_lengths, target_lengths)
    return L, ilt, tlt


def _ctc_run_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    L, ilt, tlt = _ctc_prepare(log_probs, targets, input_lengths, target_lengths, blank,
                               zero_infinity)
    op = _ctc_jax_op("fwd", _ctc_padded_states(targets, L), blank, False)
    nll, la = op(log_probs, targets, ilt, tlt)
    if la.shape[2] != L:
        la = la[:, :, :L].contiguous()
    return nll, la


def _ctc_run_backward(grad, log_probs, targets, input_lengths, target_lengths,
                      neg_log_likelihood, log_alpha, blank, zero_infinity):
    L, ilt, tlt = _ctc_prepare(log_probs, targets, input_lengths, target_lengths, blank,
                               zero_infinity)
    op = _ctc_jax_op("bwd", _ctc_padded_states(targets, L), blank, zero_infinity)
    return op(grad, log_probs, targets, ilt, tlt, neg_log_likelihood)


def _dynamo_disabled(fn):
    """`torch._dynamo.disable(fn)`, without importing dynamo (seconds) for eager use.

    Dynamo can only be tracing once it has been imported: until then `fn`
    runs as it is, afterwards through its disabled form (made once).
    """
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch._dynamo.disable(fn)
        return disabled(*args, **kwargs)

    return call


# Eager kernels: when dynamo runs them eagerly (a graph break), their host
# code (lengths to the device) must not be traced as frames.
@_dynamo_disabled
def _ctc_loss_kernel(log_probs, targets, input_lengths, target_lengths, blank=0,
                     zero_infinity=False):
    return _ctc_run_forward(log_probs, targets, input_lengths, target_lengths, blank,
                            zero_infinity)


@_dynamo_disabled
def _ctc_loss_backward_kernel(grad, log_probs, targets, input_lengths, target_lengths,
                              neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    return _ctc_run_backward(grad, log_probs, targets, input_lengths, target_lengths,
                             neg_log_likelihood, log_alpha, blank, zero_infinity)


def _install_ctc_kernels():
    from .. import core

    for op in (aten._ctc_loss.default, aten._ctc_loss.Tensor):
        core.KERNELS.setdefault(op, _ctc_loss_kernel)
    for op in (aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor):
        core.KERNELS.setdefault(op, _ctc_loss_backward_kernel)


_install_ctc_kernels()


# PyTorch has no Meta kernel for the CTC backward (the executor runs every op
# on meta tensors first): the gradient has log_probs' shape, contiguous.
_CTC_META_LIB = torch.library.Library("aten", "IMPL")


def _ctc_loss_backward_meta(grad, log_probs, *args, **kwargs):
    return torch.empty(log_probs.shape, dtype=log_probs.dtype, device=log_probs.device)


for _op in (aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(_op.name(), "Meta"):
        _CTC_META_LIB.impl(_op, _ctc_loss_backward_meta, "Meta")


# Nor for the margin-loss backwards: the gradient has the input's shape.
def _margin_loss_backward_meta(grad_output, self, *args, **kwargs):
    return torch.empty(self.shape, dtype=self.dtype, device=self.device)


for _op in (aten.multi_margin_loss_backward.default,
            aten.multilabel_margin_loss_backward.default):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(_op.name(), "Meta"):
        _CTC_META_LIB.impl(_op, _margin_loss_backward_meta, "Meta")
