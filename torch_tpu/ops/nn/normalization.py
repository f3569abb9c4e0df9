"""Layer, batch, group and RMS normalization, forward and backward; the
batch-norm kernels that give CPU's saved-statistics conventions and
`native_batch_norm`'s route to the `_native_batch_norm_legit` overloads.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..opmath import opmath, upcast
from ..registry import lower
from ._common import meta_list
from ...runtime import executor
from .. import core

aten = torch.ops.aten


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
@opmath("input")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = input
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    if x.size == 0:
        stat_shape = x.shape[:x.ndim - k] + (1,) * k
        return x, jnp.zeros(stat_shape, x.dtype), jnp.zeros(stat_shape, x.dtype)
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * upcast(weight)
    if bias is not None:
        y = y + upcast(bias)
    return y, mean, rstd


@lower(aten.native_layer_norm_backward.default)
@opmath("grad_out", "input")
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    x = input
    dy = grad_out
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    batch_axes = tuple(range(x.ndim - k))
    mean = upcast(mean)
    rstd = upcast(rstd)
    xhat = (x - mean) * rstd
    g = dy * upcast(weight) if weight is not None else dy
    gi = _norm_input_grad(g, xhat, rstd, axes) if output_mask[0] else None
    gw = jnp.sum(dy * xhat, axis=batch_axes) if output_mask[1] and weight is not None else None
    gb = jnp.sum(dy, axis=batch_axes) if output_mask[2] and bias is not None else None
    return gi, gw, gb


def _layer_norm_kernel(input, normalized_shape, weight, bias, eps):
    """PrivateUse1 kernel of native_layer_norm: the lowering's runner, then CPU's
    dtype for mean/rstd. CPU keeps them in the input's dtype (float32 only for a
    half input with float32 weight or bias); PyTorch's meta function, which
    sizes the lowering's outputs, says float32 for half inputs always."""
    out, mean, rstd = executor.runner_for(aten.native_layer_norm.default)(
        input, normalized_shape, weight, bias, eps)
    dt = _bn_stat_dtype(input, weight, bias)
    if mean.dtype != dt:
        mean, rstd = mean.to(dt), rstd.to(dt)
    return out, mean, rstd


def _install_layer_norm_kernel():
    # Takes the op's PrivateUse1 slot in place of the runner (the lowering stays
    # in the table for graphs).

    core.KERNELS.setdefault(aten.native_layer_norm.default, _layer_norm_kernel)


_install_layer_norm_kernel()


def _bn_shape(x, v):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _bn_train(input, weight, bias, running_mean, running_var, momentum, eps):
    x = upcast(input)
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _bn_shape(x, upcast(weight))
    if bias is not None:
        y = y + _bn_shape(x, upcast(bias))
    mean, var, rstd = mean.reshape(-1), var.reshape(-1), rstd.reshape(-1)
    new_rm = new_rv = None
    if running_mean is not None:
        new_rm = (1 - momentum) * upcast(running_mean) + momentum * mean
    if running_var is not None:
        n = x.size // x.shape[1]
        unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.inf
        new_rv = (1 - momentum) * upcast(running_var) + momentum * unbiased
    return y, mean, rstd, new_rm, new_rv


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = upcast(input)
    mean = upcast(running_mean)
    rstd = lax.rsqrt(upcast(running_var) + eps)
    scale = rstd if weight is None else rstd * upcast(weight)
    y = (x - _bn_shape(x, mean)) * _bn_shape(x, scale)
    if bias is not None:
        y = y + _bn_shape(x, upcast(bias))
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
    y, mean, rstd = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    metas = meta_list()
    if len(metas) == 3 and tuple(metas[1].shape) == (0,):
        # CPU's (fake) kernel returns empty save_mean / save_rstd (nothing is
        # saved for a backward); the meta kernel the eager path sees does not.
        return y, jnp.zeros((0,), mean.dtype), jnp.zeros((0,), rstd.dtype)
    return y, mean, rstd


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
    x = upcast(input)
    dy = upcast(grad_out)
    axes = (0,) + tuple(range(2, x.ndim))
    if train:
        mean, rstd = upcast(save_mean), upcast(save_invstd)
    else:
        mean = upcast(running_mean)
        rstd = lax.rsqrt(upcast(running_var) + eps)
    mean_b, rstd_b = _bn_shape(x, mean), _bn_shape(x, rstd)
    xhat = (x - mean_b) * rstd_b
    w = _bn_shape(x, upcast(weight)) if weight is not None else None
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
@opmath("input")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = input
    if x.size == 0:
        z = jnp.zeros((N, group), x.dtype)
        return x, z, z
    xg = x.reshape(N, group, -1)
    mean, var = _moments(xg, (2,))
    rstd = lax.rsqrt(var + eps)
    y = ((xg - mean) * rstd).reshape(x.shape)
    if weight is not None:
        y = y * _bn_shape(x, upcast(weight))
    if bias is not None:
        y = y + _bn_shape(x, upcast(bias))
    return y, mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
@opmath("grad_out")
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                               output_mask):
    x = upcast(input).reshape(N, C, HxW)
    dy = grad_out.reshape(N, C, HxW)
    mean = upcast(mean).reshape(N, group, 1, 1)
    rstd = upcast(rstd).reshape(N, group, 1, 1)
    xg = x.reshape(N, group, C // group, HxW)
    xhat = (xg - mean) * rstd
    gi = None
    if output_mask[0]:
        g = dy * upcast(weight).reshape(1, C, 1) if weight is not None else dy
        g = g.reshape(N, group, C // group, HxW)
        gi = _norm_input_grad(g, xhat, rstd, (2, 3)).reshape(input.shape)
    xhat = xhat.reshape(N, C, HxW)
    gw = jnp.sum(dy * xhat, axis=(0, 2)) if output_mask[1] else None
    gb = jnp.sum(dy, axis=(0, 2)) if output_mask[2] else None
    return gi, gw, gb


@lower(aten._fused_rms_norm.default)
@opmath("input")
def _fused_rms_norm(input, normalized_shape, weight, eps):
    x = input
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    if eps is None:
        eps = float(jnp.finfo(x.dtype).eps)  # of the computation dtype, like PyTorch
    if x.size == 0:
        return x, jnp.zeros(x.shape[:x.ndim - k] + (1,) * k, x.dtype)
    rstd = lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * upcast(weight)
    return y, rstd


@lower(aten._fused_rms_norm_backward.default)
@opmath("grad_out", "input")
def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    x = input
    dy = grad_out
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    rstd = upcast(rstd)
    xhat = x * rstd
    g = dy * upcast(weight) if weight is not None else dy
    gi = None
    if output_mask[0]:
        gi = rstd * (g - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
    gw = None
    if output_mask[1] and weight is not None:
        gw = jnp.sum(dy * xhat, axis=tuple(range(x.ndim - k)))
    return gi, gw


def native_batch_norm_route(input, weight, bias, running_mean, running_var, training, momentum,
                            eps):
    """native_batch_norm by the `_native_batch_norm_legit` overloads (installed by
    ops.nn.routes as the op's PrivateUse1 kernel)."""
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

    for op, fn in _bn_kernels().items():
        core.KERNELS.setdefault(op, fn)


_install_bn_kernels()
