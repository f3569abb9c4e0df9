"""FFT lowerings: the three ATen FFT primitives every torch.fft function uses.

`normalization` is PyTorch's fft_norm_mode, already resolved by the caller
for the direction: 0 = none, 1 = 1/sqrt(n), 2 = 1/n, with n the product of
the signal sizes along the transformed dims. The jnp transforms are called
unnormalized in both directions (norm="backward" forward, norm="forward"
inverse) and scaled here once.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from .opmath import opmath
from .registry import lower

aten = torch.ops.aten


def _scale(x, normalization, n):
    if normalization == 1:
        return x / jnp.asarray(math.sqrt(n), x.real.dtype)
    if normalization == 2:
        return x / jnp.asarray(n, x.real.dtype)
    return x


def _complex(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return x
    return x.astype(jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64)


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    dim = tuple(dim)
    if not dim:
        return x
    n = math.prod(x.shape[d] for d in dim)
    x = _complex(x)
    y = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim, norm="forward")
    return _scale(y, normalization, n)


@lower(aten._fft_r2c.default)
@opmath("x")
def fft_r2c(x, dim, normalization, onesided):
    dim = tuple(dim)
    n = math.prod(x.shape[d] for d in dim)
    y = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(_complex(x), axes=dim)
    return _scale(y, normalization, n)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    dim = tuple(dim)
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(_complex(x), s=sizes, axes=dim, norm="forward")
    return _scale(y, normalization, math.prod(sizes))
