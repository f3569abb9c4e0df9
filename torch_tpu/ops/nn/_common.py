"""Helpers shared by the nn lowerings: matmul precision, dtype tests,
loss reductions, parameter expansion and gradient summing.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..registry import out_meta

aten = torch.ops.aten

# --------------------------------------------------------------------------
# helpers


def matmul_precision(*xs):
    """The matmul precision of the nn lowerings' contractions: HIGHEST for genuine
    float32 operands, DEFAULT when they came from halves."""
    if any(x is not None and x.dtype == jnp.float32 for x in xs):
        return lax.Precision.HIGHEST
    return lax.Precision.DEFAULT


def is_float(x):
    """Whether jax array `x` is a real floating type (pooling, upsampling)."""
    return jnp.issubdtype(x.dtype, jnp.floating)


def meta_list():
    """The current lowering's output metas as a list (one or several outputs)."""
    m = out_meta()
    return list(m) if isinstance(m, (list, tuple)) else [m]


def reduce_loss(loss, reduction):
    """A loss reduced by PyTorch's reduction enum: 0 none, 1 mean, 2 sum (the losses)."""
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp.mean(loss)
    return jnp.sum(loss)


def expand_param(v, n):
    """A per-dimension parameter (stride, padding, ...) given once or per dimension,
    as a tuple of `n` (convolution, pooling)."""
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * n if len(v) == 1 else v


def sum_to(x, shape):
    """Sum a broadcast result back to `shape` (the transpose of broadcasting;
    attention's backward)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    return jnp.sum(x, axis=axes, keepdims=False).reshape(shape) if axes else x.reshape(shape)
