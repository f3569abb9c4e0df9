"""Loss lowerings (NLL, MSE, smooth L1, Huber, binary cross-entropy, the
margin-loss backwards) and the Meta kernels PyTorch lacks for the
margin-loss backwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..opmath import opmath, upcast
from ..registry import lower
from ._common import reduce_loss

aten = torch.ops.aten


# --------------------------------------------------------------------------
# losses


def _nll(self, target, weight, ignore_index):
    """Per-element weight w_i (0 where ignored) and the picked log-probs."""
    cdim = 1 if self.ndim >= 2 else 0
    nclass = self.shape[cdim]
    t = target.astype(jnp.int32)
    ignored = t == ignore_index
    safe = jnp.where(ignored, 0, t)
    w = jnp.ones(t.shape, jnp.float32) if weight is None else upcast(weight)[safe]
    w = jnp.where(ignored, jnp.zeros((), w.dtype), w)
    return cdim, nclass, safe, w


def _nll_forward(self, target, weight, reduction, ignore_index):
    x = upcast(self)
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
    g = upcast(grad_output)
    cdim, nclass, safe, w = _nll(self, target, weight, ignore_index)
    w = w.astype(g.dtype)
    if reduction == 1:
        g = g / upcast(total_weight).astype(g.dtype)
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
    g = upcast(grad_output)
    return g / n if reduction == 1 else g


@lower(aten.mse_loss.default)
@opmath("self", "target")
def mse_loss(self, target, reduction=1):
    d = self - target
    return reduce_loss(d * d, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    d = upcast(self) - upcast(target)
    n = max(1, int(np.prod(jnp.broadcast_shapes(self.shape, target.shape))))
    return 2 * d * _grad_scale(grad_output, reduction, n)


@lower(aten.smooth_l1_loss.default)
@opmath("self", "target")
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    z = jnp.abs(self - target)
    if beta == 0:
        return reduce_loss(z, reduction)
    return reduce_loss(jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), reduction)


@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    x = upcast(self) - upcast(target)
    n = max(1, int(np.prod(jnp.broadcast_shapes(self.shape, target.shape))))
    g = _grad_scale(grad_output, reduction, n)
    inner = x / beta if beta != 0 else jnp.zeros_like(x)
    d = jnp.where(x <= -beta, -1.0, jnp.where(x >= beta, 1.0, inner))
    return d * g


@lower(aten.huber_loss.default)
@opmath("self", "target")
def huber_loss(self, target, reduction=1, delta=1.0):
    z = jnp.abs(self - target)
    return reduce_loss(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@lower(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    x = upcast(self) - upcast(target)
    n = max(1, int(np.prod(jnp.broadcast_shapes(self.shape, target.shape))))
    g = _grad_scale(grad_output, reduction, n)
    d = jnp.where(x <= -delta, -delta, jnp.where(x >= delta, delta, x))
    return d * g


@lower(aten.binary_cross_entropy.default)
@opmath("self", "target")
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x, t = self, target
    log_x = jnp.maximum(jnp.log(x), -100.0)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100.0)
    loss = (t - 1) * log_1mx - t * log_x
    if weight is not None:
        loss = loss * upcast(weight)
    return reduce_loss(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
@opmath("self", "target")
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    x, t = self, target
    g = _grad_scale(grad_output, reduction, max(1, x.size))
    gi = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        gi = gi * upcast(weight)
    return gi


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    # PyTorch's composite, op by op, each result in its tensor's dtype (the
    # in-place steps keep the left operand's; what a bfloat16 input sees):
    # log_sigmoid(x) [* ((pw - 1) * t + 1)], (1 - t) * x - that [* weight].
    def rnd(v, like):
        return v.astype(like.dtype)

    xf = upcast(self)
    lsi = rnd(jnp.minimum(xf, 0) - jnp.log1p(jnp.exp(-jnp.abs(xf))), self)
    if pos_weight is not None:
        log_weight = (pos_weight - 1) * target + 1
        lsi = rnd(lsi * log_weight, lsi)
    one_m_t = rnd(1 - target, target)
    loss = rnd(rnd(one_m_t * self, one_m_t) - lsi, one_m_t)
    if weight is not None:
        loss = rnd(loss * weight, loss)
    return reduce_loss(upcast(loss), reduction)


def _margin_rows(x, grad_output, reduction):
    """(N, C) view of a margin loss input (a 0-dim or 1-D input is one row),
    the per-element scale 1/C (1/(N*C) for the mean) and grad_output as a
    column (reduction 'none' with rows) or a scalar."""
    x2 = x.reshape(1, -1) if x.ndim <= 1 else x
    n, c = x2.shape
    scale = 1.0 / (n * c) if reduction == 1 else 1.0 / c
    g = upcast(grad_output)
    g = g.reshape(-1, 1) if g.ndim > 0 else g
    return x2, n, c, scale, g


@lower(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    """CPU's formula: for each class d != y with z = margin - x[y] + x[d] > 0,
    grad[d] = g (p=1) or 2*g*z (p=2), times weight[y]; grad[y] = -sum."""
    x2, n, c, scale, g = _margin_rows(upcast(self), grad_output, reduction)
    t = target.reshape(-1).astype(jnp.int32)
    xt = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = margin - xt + x2
    is_y = jnp.arange(c, dtype=jnp.int32)[None, :] == t[:, None]
    h = jnp.where(p == 1, jnp.full_like(z, scale), (2 * scale) * z)
    if weight is not None:
        h = h * upcast(weight)[t][:, None]
    h = jnp.where((z > 0) & ~is_y, h, jnp.zeros((), h.dtype))
    gi = jnp.where(is_y, -jnp.sum(h, axis=1, keepdims=True), h)
    return (gi * g).reshape(self.shape)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    """CPU's formula: each listed target y (up to the first -1, repeats count)
    and each non-target d with z = 1 - x[y] + x[d] > 0 add g to grad[d] and
    -g to grad[y]."""
    x2, n, c, scale, g = _margin_rows(upcast(self), grad_output, reduction)
    t = target.reshape(n, c).astype(jnp.int32)
    listed = jnp.cumsum(t < 0, axis=1) == 0
    count = jnp.sum(jax.nn.one_hot(jnp.where(listed, t, -1), c, dtype=x2.dtype), axis=1)
    other = is_target.reshape(n, c) == 0
    z = 1 - x2[:, :, None] + x2[:, None, :]  # [n, y, d]
    w = jnp.where((z > 0) & other[:, None, :], count[:, :, None], jnp.zeros((), x2.dtype))
    gi = scale * (jnp.sum(w, axis=1) - jnp.sum(w, axis=2))
    return (gi * g).reshape(self.shape)


# PyTorch has no Meta kernel for the margin-loss backwards (the executor
# runs every op on meta tensors first): the gradient has the input's shape.
_META_LIB = torch.library.Library("aten", "IMPL")



def _margin_loss_backward_meta(grad_output, self, *args, **kwargs):
    return torch.empty(self.shape, dtype=self.dtype, device=self.device)


for _op in (aten.multi_margin_loss_backward.default,
            aten.multilabel_margin_loss_backward.default):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(_op.name(), "Meta"):
        _META_LIB.impl(_op, _margin_loss_backward_meta, "Meta")
