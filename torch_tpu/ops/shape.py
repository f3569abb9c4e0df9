"""Shape lowerings: cat/stack, clone, the *_copy forms of the view ops, flips,
rolls, repeats, triangles, diagonals, the *_scatter ops, im2col/col2im.

The view ops themselves (view, transpose, select, slice, expand, ...) are not
here: ops/core.py runs PyTorch's metadata kernels for them, so they alias
their base. Their `*_copy` forms (functionalization and decompositions emit
them) return fresh tensors and are lowered here.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import bounds, core
from .registry import lower, out_dtype, out_meta, out_torch_dtype
from ..runtime import storage as st
from ..runtime import asserts, executor

aten = torch.ops.aten


def _norm(dim, ndim):
    n = max(ndim, 1)
    return dim + n if dim < 0 else dim


def _shape():
    return tuple(out_meta().shape)


# -- cat / stack --------------------------------------------------------------


@lower(aten.cat.default)
def cat(tensors, dim=0):
    dtype = out_dtype()
    # PyTorch skips 1-d empty tensors (legacy), whatever the others' rank.
    kept = [jnp.asarray(t).astype(dtype) for t in tensors
            if not (jnp.ndim(t) == 1 and jnp.shape(t)[0] == 0)]
    if not kept:
        return jnp.zeros(_shape(), dtype)
    d = _norm(dim, kept[0].ndim)
    return jnp.concatenate(kept, axis=d)


def _check_cat(tensors, dim=0, **kwargs):
    # CPU's first check; PyTorch's meta kernel fails on 0-d tensors with an
    # IndexError instead of this RuntimeError.
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            raise RuntimeError(f"aten.cat: zero-dimensional tensor (at position {i}) "
                               "cannot be concatenated")


for _op in (aten.cat.default, aten.cat.out):
    core.KERNELS[_op] = core.checked_kernel(_op, _check_cat)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    dtype = out_dtype()
    arrays = [jnp.asarray(t).astype(dtype) for t in tensors]
    d = dim + arrays[0].ndim + 1 if dim < 0 else dim
    return jnp.stack(arrays, axis=d)


# -- clone -----------------------------------------------------------------------


@lower(aten.clone.default)
def clone(x, *, memory_format=None):
    return x


def _clone_kernel(self, *, memory_format=None):
    meta = torch.empty_strided(tuple(self.shape), tuple(self.stride()), dtype=self.dtype,
                               device="meta").clone(memory_format=memory_format
                                                    or torch.preserve_format)
    if tuple(meta.stride()) == st.contiguous_strides(tuple(meta.shape)) or meta.numel() <= 1:
        # One executable; the result is a fresh, plain (contiguous) tensor (the
        # memory format passed on: the executor lays results out as meta does).
        return executor.runner_for(aten.clone.default)(self, memory_format=memory_format)
    # preserve_format of a dense permuted tensor, channels_last, ...: PyTorch
    # keeps the strides; so do we (the storage is then a flat array).
    out = core.new_tensor(tuple(meta.shape), self.dtype, self.device.index, tuple(meta.stride()))
    core.copy_(out, self)
    return out


core.KERNELS[aten.clone.default] = _clone_kernel


@lower(aten.lift_fresh_copy.default, aten.alias_copy.default, aten.detach_copy.default)
def alias_copy(x):
    return x


# -- *_copy forms of the view ops ----------------------------------------------------


@lower(aten.view_copy.default, aten._reshape_copy.default, aten.squeeze_copy.default,
       aten.squeeze_copy.dim, aten.squeeze_copy.dims, aten.unsqueeze_copy.default,
       aten._reshape_alias_copy.default)
def reshape_copy(x, *args, **kwargs):
    return x.reshape(_shape())


@lower(aten.view_copy.dtype)
def view_copy_dtype(x, dtype):
    return st.reinterpret(x.reshape(-1), out_torch_dtype()).reshape(_shape())


@lower(aten.expand_copy.default)
def expand_copy(x, size, *, implicit=False):
    return jnp.broadcast_to(x, _shape())


@lower(aten.permute_copy.default)
def permute_copy(x, dims):
    return jnp.transpose(x, [_norm(d, x.ndim) for d in dims])


@lower(aten.transpose_copy.int)
def transpose_copy(x, dim0, dim1):
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, _norm(dim0, x.ndim), _norm(dim1, x.ndim))


@lower(aten.t_copy.default)
def t_copy(x):
    return x.T if x.ndim == 2 else x


def _slice_obj(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return slice(start, end, step)


@lower(aten.slice_copy.Tensor)
def slice_copy(x, dim=0, start=None, end=None, step=1):
    d = _norm(dim, x.ndim)
    return x[(slice(None),) * d + (_slice_obj(x.shape[d], start, end, step),)]


@lower(aten.select_copy.int)
def select_copy(x, dim, index):
    d = _norm(dim, x.ndim)
    i = index + x.shape[d] if index < 0 else index
    return lax.index_in_dim(x, i, axis=d, keepdims=False)


@lower(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    d = _norm(dim, x.ndim)
    s = start + x.shape[d] if start < 0 else start
    return lax.slice_in_dim(x, s, s + length, axis=d)


def _narrow_copy_kernel(self, dim, start, length):
    # CPU's narrow_copy wraps a negative dim (IndexError when out of range, as
    # the meta kernel does) but checks a non-negative one with TORCH_CHECK
    # (RuntimeError, where the meta kernel raises IndexError).
    if self.dim() > 0 and dim >= self.dim():
        raise RuntimeError(f"aten.narrow_copy.default: Expected dim < {self.dim()} "
                           f"(the tensor's number of dimensions), but got dim={dim}")

    return executor.runner_for(aten.narrow_copy.default)(self, dim, start, length)


core.KERNELS[aten.narrow_copy.default] = _narrow_copy_kernel


@lower(aten.diagonal_copy.default)
def diagonal_copy(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _norm(dim1, x.ndim), _norm(dim2, x.ndim))


def _windows(x, d, size, step):
    """x.unfold(d, size, step) as an array (window elements on a new last axis)."""
    n = (x.shape[d] - size) // step + 1 if x.ndim else 1
    if x.ndim == 0:
        return x.reshape(1)
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :])
    out = jnp.take(x, jnp.asarray(idx), axis=d)
    return jnp.moveaxis(out, d + 1, -1)


@lower(aten.unfold_copy.default)
def unfold_copy(x, dimension, size, step):
    return _windows(x, _norm(dimension, x.ndim), size, step)


@lower(aten.as_strided_copy.default)
def as_strided_copy(x, size, stride, storage_offset=None):
    # Relative to x as a contiguous storage (functionalization's use).
    layout = (out_torch_dtype(), tuple(size), tuple(stride), storage_offset or 0)
    return st.strided_read(x, layout)


@lower(aten.split_with_sizes_copy.default)
def split_with_sizes_copy(x, split_sizes, dim=0):
    d = _norm(dim, x.ndim)
    bounds = np.cumsum([0] + list(split_sizes))
    return [lax.slice_in_dim(x, int(a), int(b), axis=d) for a, b in zip(bounds[:-1], bounds[1:])]


@lower(aten.split_copy.Tensor)
def split_copy(x, split_size, dim=0):
    d = _norm(dim, x.ndim)
    n = x.shape[d]
    if split_size == 0:
        return [x]
    starts = list(range(0, n, split_size)) or [0]
    return [lax.slice_in_dim(x, s, min(s + split_size, n), axis=d) for s in starts]


@lower(aten.unbind_copy.int)
def unbind_copy(x, dim=0):
    d = _norm(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis=d, keepdims=False) for i in range(x.shape[d])]


@lower(aten.view_as_real_copy.default)
def view_as_real_copy(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lower(aten.view_as_complex_copy.default)
def view_as_complex_copy(x):
    return lax.complex(x[..., 0], x[..., 1])


# -- flips, rolls, repeats -------------------------------------------------------------


@lower(aten.flip.default)
def flip(x, dims):
    if x.ndim == 0 or not dims:
        return x
    return jnp.flip(x, tuple(_norm(d, x.ndim) for d in dims))


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(_norm(d, x.ndim) for d in dims))


@lower(aten.repeat.default)
def repeat(x, repeats):
    return jnp.tile(x, tuple(repeats)).reshape(_shape())


@lower(aten.rot90.default)
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=tuple(_norm(d, x.ndim) for d in dims))


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


def _repeat_interleave(repeats, output_size):
    r = jnp.asarray(repeats).reshape(-1)
    return jnp.repeat(jnp.arange(r.shape[0], dtype=r.dtype), r,
                      total_repeat_length=output_size)


@lower(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size=None):
    if output_size is None:
        raise RuntimeError("repeat_interleave: output_size is needed inside an executable")
    return _repeat_interleave(repeats, output_size)


def _repeats_total(repeats):
    """The output length of repeat_interleave(repeats), with CPU's checks in its order
    (repeat_interleave_common). The length is data: one device-to-host read, as on CUDA,
    which also brings the smallest repeat for CPU's negative check (at the op)."""
    torch._check(repeats.dim() == 1, lambda: "repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise NotImplementedError('"repeat_interleave_tpu" not implemented for '
                                  f"'{executor.dtype_name(repeats.dtype)}'")
    if not repeats.numel():
        return 0
    total, low = torch.stack((repeats.sum(), repeats.min().long())).tolist()
    if low < 0:
        raise RuntimeError("repeats can not be negative")
    return total


def _check_output_size(repeats, output_size):
    """CPU's check that the repeats add up to a given output_size, on the device
    (a device-side assert, runtime.asserts: the point of output_size is no read)."""
    wrong = repeats.sum() != output_size
    asserts.defer(wrong, lambda bad: RuntimeError(
        "allocated size does not match required size (aten.repeat_interleave.Tensor)"
        + bounds.WHERE) if bad else None)


def _repeat_interleave_kernel(repeats, *, output_size=None):
    if output_size is None:
        output_size = _repeats_total(repeats)
    elif repeats.dim() == 1 and repeats.numel() == 0:
        return torch.empty_like(repeats)  # CPU's result whatever output_size says
    elif output_size >= 0 and repeats.dtype in (torch.int32, torch.int64):
        _check_output_size(repeats, output_size)
    return executor.runner_for(aten.repeat_interleave.Tensor)(repeats, output_size=output_size)


core.KERNELS[aten.repeat_interleave.Tensor] = _repeat_interleave_kernel


@lower(aten.block_diag.default)
def block_diag(tensors):
    dtype = out_dtype()
    out = jnp.zeros(_shape(), dtype)
    r = c = 0
    for t in tensors:
        t = jnp.asarray(t).astype(dtype)
        if t.ndim == 0:
            t = t.reshape(1, 1)
        elif t.ndim == 1:
            t = t.reshape(1, -1)
        out = lax.dynamic_update_slice(out, t, (r, c)) if t.size else out
        r, c = r + t.shape[0], c + t.shape[1]
    return out


# -- diagonals and scatters --------------------------------------------------------------


def _diag_coords(n, offset):
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    return rows, cols


@lower(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    shape = _shape()
    nd = len(shape)
    d1, d2 = _norm(dim1, nd), _norm(dim2, nd)
    n = x.shape[-1]
    m = n + abs(offset)
    out = jnp.zeros(x.shape[:-1] + (m, m), x.dtype)
    rows, cols = _diag_coords(n, offset)
    out = out.at[..., rows, cols].set(x)
    return jnp.moveaxis(out, (-2, -1), (d1, d2)) if (d1, d2) != (nd - 2, nd - 1) else out


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _norm(dim1, x.ndim), _norm(dim2, x.ndim)
    y = jnp.moveaxis(x, (d1, d2), (-2, -1))
    n = src.shape[-1]
    rows, cols = _diag_coords(n, offset)
    y = y.at[..., rows, cols].set(jnp.asarray(src).astype(x.dtype))
    return jnp.moveaxis(y, (-2, -1), (d1, d2))


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    d = _norm(dim, x.ndim)
    i = index + x.shape[d] if index < 0 else index
    return x.at[(slice(None),) * d + (i,)].set(jnp.asarray(src).astype(x.dtype))


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    d = _norm(dim, x.ndim)
    sl = _slice_obj(x.shape[d], start, end, step)
    return x.at[(slice(None),) * d + (sl,)].set(jnp.asarray(src).astype(x.dtype))


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    # Relative to x as a contiguous storage, like as_strided_copy.
    offset = storage_offset or 0
    # CPU writes through a strided view of a clone of x (x.numel() elements):
    # a view reaching past it fails in setStorage. Host metadata only.
    numel = math.prod(size)
    need = 0 if numel == 0 else offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))
    if need > x.size or offset < 0:
        item = jnp.dtype(x.dtype).itemsize
        raise RuntimeError(
            f"aten.as_strided_scatter: setStorage: sizes {list(size)}, strides {list(stride)}, "
            f"storage offset {offset}, and itemsize {item} requiring a storage size of "
            f"{need * item} are out of bounds for storage of size {x.size * item}")
    layout = (out_torch_dtype(), tuple(size), tuple(stride), offset)
    return st.strided_write(x, layout, jnp.asarray(src).astype(x.dtype))


# -- backward helpers of the view ops (one executable instead of zeros + scatter) ---


@lower(aten.select_backward.default)
def select_backward(grad, input_sizes, dim, index):
    x = jnp.zeros(tuple(input_sizes), grad.dtype)
    return select_scatter(x, grad, dim, index)


@lower(aten.slice_backward.default)
def slice_backward(grad, input_sizes, dim, start, end, step):
    x = jnp.zeros(tuple(input_sizes), grad.dtype)
    return slice_scatter(x, grad, dim, start, end, step)


@lower(aten.diagonal_backward.default)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    x = jnp.zeros(tuple(input_sizes), grad.dtype)
    return diagonal_scatter(x, grad, offset, dim1, dim2)


@lower(aten.unfold_backward.default)
def unfold_backward(grad, input_sizes, dim, size, step):
    sizes = tuple(input_sizes)
    d = _norm(dim, len(sizes))
    if len(sizes) == 0:
        return grad.reshape(())
    n = grad.shape[d] if grad.ndim else 1
    idx = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    g = jnp.moveaxis(grad, -1, d + 1)  # (..., n, size, ...)
    g = g.reshape(g.shape[:d] + (n * size,) + g.shape[d + 2:])
    x = jnp.zeros(sizes, grad.dtype)
    return x.at[(slice(None),) * d + (jnp.asarray(idx.reshape(-1)),)].add(g)


# -- im2col / col2im (F.unfold / F.fold) --------------------------------------------------


def _im2col(x, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    if not batched:
        x = x[None]
    n, c, h, w = x.shape
    kh, kw = kernel_size
    dh, dw = dilation
    ph, pw = padding
    sh, sw = stride
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = []
    for i in range(kh):
        for j in range(kw):
            cols.append(lax.slice(xp, (0, 0, i * dh, j * dw),
                                  (n, c, i * dh + sh * (oh - 1) + 1, j * dw + sw * (ow - 1) + 1),
                                  (1, 1, sh, sw)))
    out = jnp.stack(cols, axis=2).reshape(n, c * kh * kw, oh * ow)
    return out if batched else out[0]


@lower(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    return _im2col(x, kernel_size, dilation, padding, stride)


@lower(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    batched = x.ndim == 3
    if not batched:
        x = x[None]
    n = x.shape[0]
    h, w = output_size
    kh, kw = kernel_size
    dh, dw = dilation
    ph, pw = padding
    sh, sw = stride
    c = x.shape[1] // (kh * kw)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    blocks = x.reshape(n, c, kh, kw, oh, ow)
    out = jnp.zeros((n, c, h + 2 * ph, w + 2 * pw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            out = out.at[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                         j * dw: j * dw + sw * (ow - 1) + 1: sw].add(blocks[:, :, i, j])
    out = out[:, :, ph: ph + h, pw: pw + w]
    return out if batched else out[0]
