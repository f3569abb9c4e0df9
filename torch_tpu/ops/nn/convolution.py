"""Convolution, forward and backward (`convolution`, `_convolution`,
`convolution_backward`): one `lax.conv_general_dilated` each; the backward
is the vjp of the forward inside the program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..opmath import opmath, upcast
from ..registry import lower, out_meta
from ._common import expand_param, matmul_precision

aten = torch.ops.aten


# --------------------------------------------------------------------------
# convolution


_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _conv_forward(x, w, stride, padding, dilation, transposed, output_padding, groups, prec):
    """Batched N-d convolution (no bias) in PyTorch's layout and semantics."""
    nsp = x.ndim - 2
    sp = _SPATIAL[nsp]
    dn = ("NC" + sp, "OI" + sp, "NC" + sp)
    stride = expand_param(stride, nsp)
    padding = expand_param(padding, nsp)
    dilation = expand_param(dilation, nsp)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
            precision=prec)
    output_padding = expand_param(output_padding, nsp)
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


def _check_conv_params(weight_shape, stride, padding, dilation, transposed, output_padding,
                       groups):
    """PyTorch CPU's convolution parameter checks (ConvUtils.h check_shape_forward)
    that its meta kernel does not make: RuntimeError, as on CPU. Host values only."""
    op = "aten.convolution"
    stride, padding, dilation, output_padding = (
        expand_param(v, 1) for v in (stride, padding, dilation, output_padding))
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
    w = list(weight_shape)
    if w[0] < groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be at least {groups} at "
                           f"dimension 0, but got weight of size {w} instead")
    if w[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} "
                           f"at dimension 0, but got weight of size [{w}] instead")


def _empty_input(input, unbatched):
    """No batch or no input channels: CPU's ConvBackend::Empty, whose results and
    gradients are all empty or zero (a convolution over nothing)."""
    return input.shape[0] == 0 or input.shape[0 if unbatched else 1] == 0


@lower(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    _check_conv_params(weight.shape, stride, padding, dilation, transposed, output_padding,
                       groups)
    unbatched = input.ndim == weight.ndim - 1
    if _empty_input(input, unbatched):
        # An empty result of the meta kernel's shape (which has no output channels
        # when the input has none).
        return jnp.zeros(tuple(out_meta().shape), upcast(input).dtype)
    prec = matmul_precision(input, weight)
    x = upcast(input)[None] if unbatched else upcast(input)
    y = _conv_forward(x, upcast(weight), stride, padding, dilation, transposed, output_padding,
                      groups, prec)
    if bias is not None:
        y = y + upcast(bias).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y[0] if unbatched else y


@lower(aten._convolution.default)
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups, benchmark, deterministic, cudnn_enabled, allow_tf32):
    return convolution(input, weight, bias, stride, padding, dilation, transposed,
                       output_padding, groups)


@lower(aten.convolution_backward.default)
@opmath("grad_output")
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    unbatched = input.ndim == weight.ndim - 1
    if _empty_input(input, unbatched):
        f = upcast(input).dtype
        zeros = (jnp.zeros(input.shape, f), jnp.zeros(weight.shape, f),
                 jnp.zeros(tuple(bias_sizes or ()), f))
        return tuple(z if m else None for z, m in zip(zeros, output_mask))
    prec = matmul_precision(input, weight)
    x = upcast(input)[None] if unbatched else upcast(input)
    g = grad_output[None] if unbatched else grad_output
    g = g.astype(x.dtype)

    def f(x_, w_):
        return _conv_forward(x_, w_, stride, padding, dilation, transposed, output_padding,
                             groups, prec)

    _, vjp = jax.vjp(f, x, upcast(weight).astype(x.dtype))
    gx, gw = vjp(g)
    if unbatched:
        gx = gx[0]
    gb = jnp.sum(g, axis=(0,) + tuple(range(2, g.ndim))) if output_mask[2] else None
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)
