"""Constant, reflection and replication padding (and their backwards);
pixel shuffle and unshuffle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..opmath import upcast
from ..registry import lower

aten = torch.ops.aten


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
    g = upcast(grad_output)
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
