"""Activations (relu, threshold, gelu, silu, elu, softplus, hardtanh, ...) and
their backward ops: elementwise lowerings, with elementwise.py's type
promotion and helpers (`prep`, the dtype predicates, the constants).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .._compat.torch_api import ELEMENTWISE_TYPE_PROMOTION_KIND as K
from .elementwise import (const, is_bool, is_complex, max_of, min_of, no_complex_clamp, one,
                          zero, prep)
from .registry import lower, out_meta

aten = torch.ops.aten


def _float(*xs):
    return prep(*xs, kind=K.DEFAULT)


@lower(aten.relu.default)
def relu(self):
    no_complex_clamp(self)  # CPU's relu is clamp_min(0)
    if is_bool(self):
        raise RuntimeError("Boolean inputs not supported for relu")
    x = _float(self)
    return jnp.maximum(x, zero(x))


@lower(aten.threshold.default)
def threshold(self, threshold, value):
    x, t, v = _float(self, threshold, value)
    return jnp.where(x <= t, v, x)


@lower(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    g, x, t = _float(grad_output, self, threshold)
    return jnp.where(x <= t, zero(g), g)


_GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
_GELU_KAPPA = 0.044715


@lower(aten.gelu.default)
def gelu(self, *, approximate="none"):
    x = _float(self)
    if approximate == "tanh":
        inner = const(_GELU_BETA, x) * (x + const(_GELU_KAPPA, x) * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return x * 0.5 * (1 + lax.erf(x * const(math.sqrt(0.5), x)))


@lower(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    g, x = _float(grad_output, self)
    if approximate == "tanh":
        x_sq = x * x
        inner = const(_GELU_BETA, x) * (x + const(_GELU_KAPPA, x) * x_sq * x)
        t = jnp.tanh(inner)
        left = 0.5 * x
        right = 1 + t
        left_d = 0.5 * right
        inner_d = const(_GELU_BETA, x) * (1 + 3 * const(_GELU_KAPPA, x) * x_sq)
        right_d = left * (1 - t * t) * inner_d
        return g * (left_d + right_d)
    cdf = 0.5 * (1 + lax.erf(x * const(math.sqrt(0.5), x)))
    pdf = const((2.0 / math.sqrt(math.pi)) * math.sqrt(0.5) * 0.5, x) * jnp.exp(x * x * -0.5)
    return g * (cdf + x * pdf)


@lower(aten.silu.default)
def silu(self):
    x = _float(self)
    return x / (1 + jnp.exp(-x))


@lower(aten.silu_backward.default)
def silu_backward(grad_output, self):
    g, x = _float(grad_output, self)
    s = 1 / (1 + jnp.exp(-x))
    return g * s * (1 + x * (1 - s))


@lower(aten.mish.default)
def mish(self):
    x = _float(self)
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    g, y = _float(grad_output, output)
    d = (1 - y) * y
    return g * (jnp.conj(d) if is_complex(d) else d)


@lower(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    g, y = _float(grad_output, output)
    d = 1 - y * y
    return g * (jnp.conj(d) if is_complex(d) else d)


@lower(aten.logit_backward.default)
def logit_backward(grad_output, self, eps=None):
    g, x = _float(grad_output, self)
    d = g / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), const(jnp.nan, d), d)
    return jnp.where((x < eps) | (x > 1 - eps), zero(d), d)


@lower(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    x, lo, hi = _float(self, min_val, max_val)
    return min_of(max_of(x, lo), hi)


@lower(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, self, min_val, max_val):
    g, x, lo, hi = _float(grad_output, self, min_val, max_val)
    return jnp.where((x <= lo) | (x >= hi), zero(g), g)


@lower(aten.hardswish.default)
def hardswish(self):
    x = _float(self)
    return x * jnp.minimum(jnp.maximum(x + 3, zero(x)), const(6, x)) / 6


@lower(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    g, x = _float(grad_output, self)
    return jnp.where(x < -3, zero(g), jnp.where(x <= 3, g * (x / 3 + 0.5), g))


@lower(aten.hardsigmoid.default)
def hardsigmoid(self):
    x = _float(self)
    return jnp.minimum(jnp.maximum(x + 3, zero(x)), const(6, x)) / 6


@lower(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    g, x = _float(grad_output, self)
    return jnp.where((x > -3) & (x < 3), g / 6, zero(g))


def _elu(x, alpha, scale, input_scale):
    neg = jnp.expm1(x * input_scale) * (alpha * scale)
    return jnp.where(x <= 0, neg, x * scale)


@lower(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    x, a, s, i = _float(self, alpha, scale, input_scale)
    return _elu(x, a, s, i)


@lower(aten.celu.default)
def celu(self, alpha=1.0):
    x, a = _float(self, alpha)
    return _elu(x, a, one(x), 1 / a)


@lower(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, y, a, s, i = _float(grad_output, self_or_result, alpha, scale, input_scale)
    negcoef = a * s
    if is_result:
        neg = g * i * (y + negcoef)
    else:
        neg = g * i * negcoef * jnp.exp(y * i)
    return jnp.where(y <= 0, neg, g * s)


@lower(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    x, s = _float(self, negative_slope)
    return jnp.where(x > 0, x, x * s)


@lower(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    g, x, s = _float(grad_output, self, negative_slope)
    return jnp.where(x > 0, g, g * s)


@lower(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    x, b, t = _float(self, beta, threshold)
    xb = x * b
    return jnp.where(xb > t, x, jnp.log1p(jnp.exp(xb)) / b)


@lower(aten.softplus_backward.default)
def softplus_backward(grad_output, self, beta, threshold):
    g, x, b, t = _float(grad_output, self, beta, threshold)
    xb = x * b
    z = jnp.exp(xb)
    return jnp.where(xb > t, g, g * z / (z + 1))


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    x = _float(self)
    z = jnp.exp(-jnp.abs(x))
    out = jnp.minimum(x, zero(x)) - jnp.log1p(z)
    buf_meta = out_meta()[1]
    if buf_meta.numel() != math.prod(x.shape) or tuple(buf_meta.shape) != x.shape:
        return out, jnp.zeros(tuple(buf_meta.shape), x.dtype)
    return out, z


@lower(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    g, x, buf = _float(grad_output, self, buffer)
    neg = x < 0
    max_deriv = jnp.where(neg, one(x), zero(x))
    sgn_ = jnp.where(neg, one(x), -one(x))
    # PyTorch's CPU kernel reads exp(-|x|) from the forward's buffer; CUDA
    # passes an empty one and recomputes it.
    z = buf if buf.size == x.size and buf.size else jnp.exp(-jnp.abs(x))
    return (max_deriv - sgn_ * (z / (1 + z))) * g


@lower(aten.glu.default)
def glu(self, dim=-1):
    x = _float(self)
    a, b = jnp.split(x, 2, axis=dim)
    return a * (1 / (1 + jnp.exp(-b)))


@lower(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    g, x = _float(grad_output, self)
    a, b = jnp.split(x, 2, axis=dim)
    s = 1 / (1 + jnp.exp(-b))
    return jnp.concatenate([s * g, (1 - s) * s * a * g], axis=dim)


@lower(aten._prelu_kernel.default)
def _prelu_kernel(self, weight):
    x, w = _float(self, weight)
    return jnp.where(x > 0, x, w * x)


@lower(aten._prelu_kernel_backward.default)
def _prelu_kernel_backward(grad_output, self, weight):
    g, x, w = _float(grad_output, self, weight)
    shape = jnp.broadcast_shapes(g.shape, x.shape, w.shape)
    gi = jnp.where(x > 0, g, w * g)
    gw = jnp.where(x > 0, zero(g), x * g)
    return jnp.broadcast_to(gi, shape), jnp.broadcast_to(gw, shape)


@lower(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    x, l_ = _float(self, lambd)
    return jnp.where((x >= -l_) & (x <= l_), zero(x), x)


@lower(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    g, x, l_ = _float(grad_out, self, lambd)
    return jnp.where((x >= -l_) & (x <= l_), zero(g), g)


@lower(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    x, l_ = _float(self, lambd)
    return jnp.where(x > l_, x - l_, jnp.where(x < -l_, x + l_, x * 0))


@lower(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    g, x, l_ = _float(grad_output, self, lambd)
    return jnp.where((x >= -l_) & (x <= l_), zero(g), g)
