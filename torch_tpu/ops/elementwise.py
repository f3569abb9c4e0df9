"""Elementwise lowerings: unary math, binary arithmetic, comparisons, where.

Inputs are first cast to the dtype PyTorch computes in (the op's result
dtype, from the meta kernel), so int/float mixes and bfloat16 follow
PyTorch's type promotion rather than JAX's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import lower, out_dtype

aten = torch.ops.aten


def _cast(*xs, dtype=None):
    dtype = dtype or out_dtype()
    return [jnp.asarray(x).astype(dtype) if not isinstance(x, (int, float, bool, complex))
            else x for x in xs]


def _compute_dtype(dtype):
    """Half types compute in float32, like PyTorch's CPU kernels."""
    if dtype in (jnp.bfloat16, jnp.float16):
        return jnp.float32
    return dtype


# -- binary arithmetic ---------------------------------------------------------


@lower(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    x, y = _cast(x, y)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = y * alpha
    return x + y


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    x, y = _cast(x, y)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = y * alpha
    return x - y


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, alpha=1):
    return sub(y, x, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    x, y = _cast(x, y)
    return x * y


@lower(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    x, y = _cast(x, y)
    return x / y


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, *, rounding_mode=None):
    x, y = _cast(x, y)
    if rounding_mode is None:
        return x / y
    if rounding_mode == "trunc":
        if jnp.issubdtype(out_dtype(), jnp.integer):
            return lax.div(x, jnp.asarray(y, x.dtype))
        return jnp.trunc(x / y)
    return jnp.floor_divide(x, y)


@lower(aten.neg.default)
def neg(x):
    return -x


@lower(aten.abs.default)
def abs_(x):
    return jnp.abs(x)


@lower(aten.exp.default)
def exp(x):
    (x,) = _cast(x)
    return jnp.exp(x)


@lower(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))
