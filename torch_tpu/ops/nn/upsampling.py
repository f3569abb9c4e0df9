"""Nearest, (bi/tri)linear, bicubic and anti-aliased upsampling, forward
and backward, as one interpolation matrix per spatial axis.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..opmath import is_half, opmath, upcast
from ..registry import lower
from ._common import is_float
from .pooling import separable

aten = torch.ops.aten


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
    return separable(upcast(g), mats, transpose=True, prec=lax.Precision.HIGHEST)


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
    xa = upcast(x)
    # CPU's generic (1-d and 3-d) kernel stores a half input's weights in its
    # dtype: lambda1 rounded, lambda0 = 1 - that, rounded (its 2-d kernel not).
    round_w = is_half(x.dtype) and nsp != 2
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
    return separable(upcast(g), mats, transpose=True, prec=lax.Precision.HIGHEST)


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
    return separable(upcast(self), mats, prec=lax.Precision.HIGHEST)


@lower(aten.upsample_bicubic2d_backward.default)
@opmath("grad_output")
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners,
                                scales_h=None, scales_w=None):
    mats = [_cubic_mat(L, O, align_corners, sc)
            for L, O, sc in zip(tuple(input_size[-2:]), tuple(output_size), (scales_h, scales_w))]
    return separable(grad_output, mats, transpose=True, prec=lax.Precision.HIGHEST)


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
    if is_half(self.dtype):
        name = "BFloat16" if self.dtype == jnp.bfloat16 else "Half"
        raise NotImplementedError(
            f'"compute_index_ranges_weights" not implemented for \'{name}\'')
    mats = _aa_mats(self.shape[-2:], tuple(output_size), align_corners, (scales_h, scales_w))
    x = self if is_float(self) else self.astype(jnp.float32)
    # CPU resamples the last dim first, then the one before (skipping equal sizes).
    for j in (1, 0):
        if mats[j].shape[0] != mats[j].shape[1] or not np.array_equal(
                mats[j], np.eye(mats[j].shape[0], dtype=np.float32)):
            ax = x.ndim - 2 + j
            x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(mats[j]), axes=([ax], [1]),
                                           precision=lax.Precision.HIGHEST), -1, ax)
    if not is_float(self):  # uint8: rounded and saturated
        x = jnp.clip(jnp.round(x), 0, 255)
    return x


@lower(aten._upsample_bilinear2d_aa_backward.default)
@opmath("grad_output")
def _upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners,
                                     scales_h=None, scales_w=None):
    mats = _aa_mats(tuple(input_size[-2:]), tuple(output_size), align_corners,
                    (scales_h, scales_w))
    return separable(grad_output, mats, transpose=True, prec=lax.Precision.HIGHEST)
