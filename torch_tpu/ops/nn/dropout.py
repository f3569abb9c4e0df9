"""Dropout and RReLU with noise: lowerings that take a PRNG key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ..opmath import opmath, upcast
from ..registry import lower
from ...runtime import rng as tpu_random
from ...runtime.storage import from_bool
from .. import core

aten = torch.ops.aten


# --------------------------------------------------------------------------
# dropout


def _jax_key(rng_key):
    return tpu_random.jax_key(rng_key)


@lower(aten.native_dropout.default, random=True)
def native_dropout(input, p, train, *, rng_key):
    if train is not None and not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(_jax_key(rng_key), 1.0 - p, input.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    x = upcast(input)
    return x * from_bool(keep, x.dtype) * scale, keep


@lower(aten.rrelu_with_noise.default, mutates=("noise",), random=True)
@opmath("self")
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None,
                     *, rng_key):
    x = self
    if not training:  # leaky_relu with the mean slope; the noise is left alone
        slope = (lower + upper) / 2
        return jnp.where(x > 0, x, x * slope), {"noise": noise}
    r = jax.random.uniform(_jax_key(rng_key), x.shape, jnp.float32, 0.0, 1.0)
    r = (lower + (upper - lower) * r).astype(x.dtype)
    neg = x <= 0
    return (jnp.where(neg, x * r, x),
            {"noise": jnp.where(neg, r, jnp.ones((), x.dtype)).astype(noise.dtype)})


@lower(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(self, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                                generator=None, *, rng_key):
    out, new = rrelu_with_noise(self, noise, lower, upper, training, generator, rng_key=rng_key)
    return out, new["noise"]


def _rrelu_with_noise_inplace(self, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                              generator=None):
    # The functional overload writes `noise`; the result is then copied into self.
    out = aten.rrelu_with_noise.default(self, noise, lower, upper, training, generator)
    self.copy_(out)
    return self


def _install_rrelu_kernel():
    core.KERNELS.setdefault(aten.rrelu_with_noise_.default, _rrelu_with_noise_inplace)


_install_rrelu_kernel()


@lower(aten.rrelu_with_noise_backward.default)
@opmath("grad_output", "self", "noise")
def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    g = grad_output
    slope = (lower + upper) / 2
    leaky = jnp.where(self > 0, g, g * slope)
    if not training:
        return leaky
    return jnp.where(upper - lower > 1e-6, g * noise, leaky)


@lower(aten.native_dropout_backward.default)
@opmath("grad_output")
def native_dropout_backward(grad_output, mask, scale):
    g = grad_output
    return g * from_bool(mask, g.dtype) * scale
