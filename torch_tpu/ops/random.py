"""Random lowerings: uniform, normal, bernoulli, random_, the distributions,
multinomial, randperm, rand/randn/randint, poisson, gamma.

Every lowering is registered with `random=True`: the executor passes a fresh
raw key (the device's seed and a per-op offset) as a runtime input, so the
numbers follow torch.manual_seed / torch.tpu.manual_seed, get_rng_state /
set_rng_state replay them, and no random op recompiles when the state
changes. `Generator` arguments are accepted and ignored (the tpu device keeps
one generator per device, like the default CUDA generators).

The streams are JAX's (threefry), not PyTorch's CPU stream: a seeded tpu
program is reproducible on tpu, but draws different numbers than the same
program on CPU. Half types draw in float32 and round.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import core
from .opmath import opmath, opmath_dtype, upcast
from .registry import LOWERINGS, lower, out_dtype, out_meta, out_torch_dtype
from ..runtime import rng as tpu_random
from ..runtime.rng import jax_key
from ..runtime import executor, keys, programs
from ..runtime import storage as st
from ..runtime.storage import torch_dtype

aten = torch.ops.aten


def _shape():
    return tuple(out_meta().shape)


def _float(dtype):
    """The dtype to draw floats in for an output of `dtype`."""
    if dtype in (jnp.bfloat16, jnp.float16) or not jnp.issubdtype(dtype, jnp.inexact):
        return jnp.float32
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.float32 if dtype == jnp.complex64 else jnp.float64
    return dtype


def _uniform(key, shape, dtype, lo=0.0, hi=1.0):
    if jnp.issubdtype(dtype, jnp.complexfloating):
        # PyTorch draws the real and imaginary parts each in [lo, hi).
        parts = jax.random.uniform(key, tuple(shape) + (2,), _float(dtype), lo, hi)
        return lax.complex(parts[..., 0], parts[..., 1])
    return jax.random.uniform(key, shape, _float(dtype), lo, hi)


def _normal(key, shape, dtype):
    if jnp.issubdtype(dtype, jnp.complexfloating):
        # PyTorch's complex normal: real and imaginary parts each with variance 1/2.
        f = _float(dtype)
        k1, k2 = jax.random.split(key)
        return lax.complex(jax.random.normal(k1, shape, f), jax.random.normal(k2, shape, f)) \
            * np.sqrt(0.5).astype(f)
    return jax.random.normal(key, shape, _float(dtype))


# -- uniform / normal ------------------------------------------------------------------------


def _dtype_name(dtype):
    return executor.dtype_name(dtype)


def _check_uniform(dtype, lo, hi):
    """PyTorch CPU's uniform_ argument checks (host values: from/to are floats)."""
    tdt = out_meta().dtype
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise NotImplementedError(f'aten.uniform: "check_uniform_bounds" not implemented '
                                  f"for '{_dtype_name(tdt)}'")
    fi = jnp.finfo(_float(dtype) if jnp.issubdtype(dtype, jnp.complexfloating) else dtype)
    lowest, biggest = float(fi.min), float(fi.max)
    for what, v in (("from", lo), ("to", hi)):
        if not lowest <= v <= biggest:  # NaN included
            raise RuntimeError(f"aten.uniform: {what} is out of bounds for "
                               f"{_dtype_name(tdt)}")
    if lo > hi:
        raise RuntimeError(f"aten.uniform: uniform_ expects to return a [from, to) range, "
                           f"but found from={lo:g} > to={hi:g}")
    if hi - lo > biggest:
        raise RuntimeError(f"aten.uniform: uniform_ expects to-from <= the largest "
                           f"{_dtype_name(tdt)}, but found to={hi:g} and from={lo:g}")


@lower(aten.uniform.default, random=True)
def uniform(x, from_=0.0, to=1.0, *, generator=None, rng_key):
    _check_uniform(x.dtype, float(from_), float(to))
    return _uniform(jax_key(rng_key), x.shape, x.dtype, from_, to)


# `from` is a Python keyword: the executor passes it positionally (its
# schema position), so the parameter name does not matter above.


@lower(aten.rand.default, aten.rand.generator, random=True)
def rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
         rng_key):
    return _uniform(jax_key(rng_key), tuple(size), out_dtype())


@lower(aten.randn.default, aten.randn.generator, random=True)
def randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
          rng_key):
    return _normal(jax_key(rng_key), tuple(size), out_dtype())


@lower(aten.normal_functional.default, random=True)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, rng_key):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        # PyTorch's complex normal_: both parts N(mean, std^2 / 2).
        f = _float(x.dtype)
        mean = jnp.asarray(mean, f)
        return lax.complex(mean, mean) + std * _normal(jax_key(rng_key), x.shape, x.dtype)
    return mean + std * _normal(jax_key(rng_key), x.shape, x.dtype)


@lower(aten.normal.Tensor_float, random=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, rng_key):
    return mean + std * _normal(jax_key(rng_key), _shape(), out_dtype())


@lower(aten.normal.float_Tensor, random=True)
def normal_float_tensor(mean, std, *, generator=None, rng_key):
    return mean + std * _normal(jax_key(rng_key), _shape(), out_dtype())


@lower(aten.normal.Tensor_Tensor, random=True)
def normal_tensor_tensor(mean, std, *, generator=None, rng_key):
    return mean + std * _normal(jax_key(rng_key), _shape(), out_dtype())


@lower(aten.normal.float_float, random=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None,
                       device=None, pin_memory=None, rng_key):
    return mean + std * _normal(jax_key(rng_key), tuple(size), out_dtype())


# -- bernoulli ---------------------------------------------------------------------------------


def _bernoulli(key, p, shape):
    p = jnp.asarray(p)
    if not jnp.issubdtype(p.dtype, jnp.floating) or p.dtype in (jnp.bfloat16, jnp.float16):
        p = p.astype(jnp.float32)
    return jax.random.uniform(key, shape, p.dtype) < p


@lower(aten.bernoulli.default, random=True)
def bernoulli(x, *, generator=None, rng_key):
    return _bernoulli(jax_key(rng_key), x, x.shape)


@lower(aten.bernoulli.p, random=True)
def bernoulli_p(x, p, *, generator=None, rng_key):
    return _bernoulli(jax_key(rng_key), p, x.shape)


@lower(aten.bernoulli.Tensor, random=True)
def bernoulli_tensor(x, p, *, generator=None, rng_key):
    return _bernoulli(jax_key(rng_key), p, x.shape)


# -- random_ (discrete uniform) -----------------------------------------------------------------


def _randint(key, shape, lo, span, dtype):
    """lo + (64 random bits mod span), like PyTorch's random_from_to; span in [1, 2**64]
    (`_random_range` checked it)."""
    bits = jax.random.bits(key, shape, jnp.uint64)
    if span < (1 << 64):
        bits = bits % np.uint64(span)
    vals = (bits + np.uint64(lo & 0xFFFFFFFFFFFFFFFF)).astype(jnp.int64)  # two's complement wrap
    return vals.astype(dtype) if dtype != jnp.bool_ else vals != 0


def _digits_bound(dtype):
    """Largest value random_() draws for `dtype` (inclusive)."""
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 1 << jnp.finfo(dtype).nmant + 1
    return int(jnp.iinfo(dtype).max)


# -- random_'s argument checks: CPU's (ATen's DistributionTemplates.h), in its order and words.

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

# caffe2::TypeMeta's names of the dtypes, which random_'s bound messages print.
_TYPEMETA_NAMES = {
    torch.bool: "bool", torch.uint8: "unsigned char", torch.int8: "signed char",
    torch.int16: "short int", torch.int32: "int", torch.int64: "long int",
    torch.uint16: "short unsigned int", torch.uint32: "unsigned int",
    torch.uint64: "long unsigned int", torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16", torch.float32: "float", torch.float64: "double",
}


def _through_dtype(v, dtype):
    """static_cast<int64_t>(static_cast<dtype>(v)): v rounded to the float dtype; a result
    past int64 reads as INT64_MIN, what x86's conversion gives."""
    v = (v - _I64_MIN) % (1 << 64) + _I64_MIN  # int64 arithmetic wraps
    r = float(np.asarray(v, np.int64).astype(dtype))
    return int(r) if -2.0 ** 63 <= r < 2.0 ** 63 else _I64_MIN


def _update_from(from_, dtype, digits):
    """ATen's update_from: the smallest from that survives the cast to a float dtype."""
    from_plus_1 = _through_dtype(from_ + 1, dtype)
    if from_plus_1 < from_:
        n = max(abs(from_ + 1).bit_length() - 1, 0)
        from_ = from_plus_1 + (1 << (n - digits + 1))
    return from_


def _update_to(to, dtype, digits):
    """ATen's update_to: the largest to that survives the cast to a float dtype."""
    to_minus_1 = _through_dtype(to - 1, dtype)
    if to_minus_1 >= to:
        n = max(abs(to - 1).bit_length() - 1, 0)
        to = to_minus_1 - (1 << (n - digits + 1))
    return to


def _digits(tdt):
    """std::numeric_limits<dtype>::digits of a float dtype (the significand's bits)."""
    return jnp.finfo(st.jax_dtype(tdt)).nmant + 1


def _check_in_range(from_, to_inc, tdt, warn):
    """ATen's check_from_to_in_range: both ends representable in the dtype (an error), and
    for floats within the exactly representable integers (a warning, if `warn`)."""
    name = _TYPEMETA_NAMES.get(tdt, str(tdt))
    if tdt.is_floating_point:
        lo, hi = float(torch.finfo(tdt).min), float(torch.finfo(tdt).max)
    elif tdt == torch.bool:
        lo, hi = 0, 1
    elif tdt == torch.uint64:
        lo, hi = 0, _I64_MAX
    elif not tdt.is_complex:
        lo, hi = torch.iinfo(tdt).min, torch.iinfo(tdt).max
    else:
        raise RuntimeError("check_random_bounds handles only integral, floating-point and "
                           "boolean types")
    for what, v in (("from", from_), ("to - 1", to_inc)):
        if not lo <= v <= hi:
            raise RuntimeError(f"{what} is out of bounds for {name}")
    if warn and tdt.is_floating_point:
        digits = _digits(tdt)
        for what, v in (("from", from_), ("to - 1", to_inc)):
            if not -(1 << digits) <= v <= 1 << digits:
                warnings.warn(
                    f"{what} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision "
                    f"limitations {name} can support discrete uniform distribution only within "
                    "this range. This warning will become an error in version 1.7 release, "
                    "please fix the code in advance", UserWarning, stacklevel=2)


def _check_full_range(tdt):
    """The dtypes CPU's random_(-2**63, None) (every int64) takes, and its errors for others."""
    kernel = "random_full_64_bits_range_kernel"
    if tdt in (torch.int8, torch.uint8, torch.int16, torch.int32):
        raise RuntimeError(f"{kernel}_cpu handles only int64, double, float and bfloat16")
    if tdt not in (torch.int64, torch.float32, torch.float64, torch.bfloat16):
        # (the kernel named after the device, as runtime.verdict names CPU's)
        raise NotImplementedError(f'"{kernel}_tpu" not implemented for '
                                  f"'{executor.dtype_name(tdt)}'")


def _random_range(tdt, from_, to, warn=False):
    """(low, span) of random_(from_, to) on a `tdt` tensor, after CPU's checks
    (random_from_to_impl); `to` None draws up to the dtype's largest value. The
    lowerings check without the warning, which the kernels below give at each call
    (a program loaded from the cache is not lowered)."""
    jdt = st.jax_dtype(tdt)
    digits = _digits(tdt) if tdt.is_floating_point else 0
    if to is not None:
        if from_ >= to:
            raise RuntimeError("random_ expects 'from' to be less than 'to', but got "
                               f"from={from_} >= to={to}")
        if digits:
            from_, to = _update_from(from_, jdt, digits), _update_to(to, jdt, digits)
            if from_ >= to:
                raise RuntimeError("random_ expects 'from' casted to dtype to be less than "
                                   "'to' casted to dtype, but got "
                                   f"from={from_} >= to={to}")
        _check_in_range(from_, to - 1, tdt, warn)
        return from_, to - from_
    if from_ == _I64_MIN:
        _check_full_range(tdt)
        return from_, 1 << 64  # every int64, cast to the dtype, as CPU draws them
    if digits:
        to_inc = min(1 << digits, _I64_MAX)
        from_ = _update_from(from_, jdt, digits)
        if from_ >= to_inc:
            raise RuntimeError("random_ expects 'from' casted to dtype to be less than or "
                               "equal to 'to_inc' casted to dtype, but got "
                               f"from={from_} > to_inc={to_inc}")
    elif tdt.is_complex:
        raise RuntimeError("random_from_to_impl handles only integral, floating-point and "
                           "boolean types")
    else:
        to_inc = _digits_bound(jdt)
    _check_in_range(from_, to_inc, tdt, warn)
    return from_, to_inc - from_ + 1


@lower(aten.random.default, random=True)
def random_default(x, *, generator=None, rng_key):
    return _randint(jax_key(rng_key), x.shape, 0, _digits_bound(x.dtype) + 1, x.dtype)


@lower(aten.random.to, random=True)
def random_to(x, to, *, generator=None, rng_key):
    lo, span = _random_range(out_torch_dtype(), 0, to)
    return _randint(jax_key(rng_key), x.shape, lo, span, x.dtype)


def random_from(x, from_, to=None, *, generator=None, rng_key):
    lo, span = _random_range(out_torch_dtype(), from_, to)
    return _randint(jax_key(rng_key), x.shape, lo, span, x.dtype)


lower(getattr(aten.random, "from"), random=True)(random_from)


@lower(aten.randint.default, aten.randint.generator, random=True)
def randint(high, size, *, generator=None, dtype=None, layout=None, device=None,
            pin_memory=None, rng_key):
    lo, span = _random_range(out_torch_dtype(), 0, high)
    return _randint(jax_key(rng_key), tuple(size), lo, span, out_dtype())


@lower(aten.randint.low, aten.randint.low_generator, random=True)
def randint_low(low, high, size, *, generator=None, dtype=None, layout=None, device=None,
                pin_memory=None, rng_key):
    lo, span = _random_range(out_torch_dtype(), low, high)
    return _randint(jax_key(rng_key), tuple(size), lo, span, out_dtype())


@lower(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
             rng_key):
    return jax.random.permutation(jax_key(rng_key), n).astype(out_dtype())


# -- continuous distributions ---------------------------------------------------------------------


@lower(aten.exponential.default, random=True)
def exponential(x, lambd=1.0, *, generator=None, rng_key):
    u = _uniform(jax_key(rng_key), x.shape, x.dtype)
    return -jnp.log1p(-u) / lambd


@lower(aten.geometric.default, random=True)
def geometric(x, p, *, generator=None, rng_key):
    f = _float(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float64
    u = jax.random.uniform(jax_key(rng_key), x.shape, f, jnp.finfo(f).tiny, 1.0)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-jnp.asarray(p, f)))


@lower(aten.log_normal.default, random=True)
def log_normal(x, mean=1.0, std=2.0, *, generator=None, rng_key):
    return jnp.exp(mean + std * _normal(jax_key(rng_key), x.shape, x.dtype))


@lower(aten.cauchy.default, random=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, rng_key):
    u = _uniform(jax_key(rng_key), x.shape, x.dtype)
    return median + sigma * jnp.tan(jnp.pi * (u - 0.5))


@lower(aten.poisson.default, random=True)
def poisson(x, generator=None, *, rng_key):
    lam = upcast(x)
    return jax.random.poisson(jax_key(rng_key), lam, x.shape).astype(x.dtype)


@lower(aten._standard_gamma.default, random=True)
@opmath("x")
def _standard_gamma(x, generator=None, *, rng_key):
    return jax.random.gamma(jax_key(rng_key), x, x.shape)


# -- ops without a meta kernel -------------------------------------------------------------
#
# The executor asks PyTorch's meta kernel for shapes and dtypes; _sample_dirichlet
# and binomial have none. Their kernels run a cached jitted function of the
# input values and a fresh key directly (outputs: the first input's shape/dtype).



def _direct_kernel(name, fn):
    def kernel(*tensors, generator=None):
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        first = tensors[0]
        index = first.device.index
        for t in tensors:
            if t.device != first.device:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, {first.device} and {t.device}! (when checking arguments for {name})")
        if name == "aten.binomial.default":
            torch._check(tensors[0].shape == tensors[1].shape, lambda: (
                f"{name}: count and prob must have the same shape"))
        values = [executor.value(t) for t in tensors]
        key = keys.helper_key(programs.ProgramKind.RANDOM_DIRECT, name,
                              tuple((v.shape, v.dtype) for v in values))
        raw = tpu_random.next_key(index)
        compiled = programs.get_or_compile(
            key, lambda vals, raw: fn(jax_key(raw), *vals).astype(vals[0].dtype),
            (values, raw), name=name)
        return st.wrap(compiled(values, raw), index, first.dtype)

    kernel.__name__ = name
    return kernel


def _dirichlet_fn(key, alpha):
    a = upcast(alpha)
    g = jax.random.gamma(key, a, a.shape)
    return g / jnp.sum(g, axis=-1, keepdims=True)


def _binomial_fn(key, count, prob):
    f = opmath_dtype(count.dtype)
    return jax.random.binomial(key, count.astype(f), prob.astype(f), count.shape)


core.KERNELS[aten._sample_dirichlet.default] = _direct_kernel(
    "aten._sample_dirichlet.default", _dirichlet_fn)
core.KERNELS[aten.binomial.default] = _direct_kernel("aten.binomial.default", _binomial_fn)


# -- multinomial ------------------------------------------------------------------------------------


def _check_multinomial(ndim, dtype, k, num_samples, replacement):
    """PyTorch CPU's multinomial checks on shapes, dtypes and arguments, in its order."""
    op = "aten.multinomial"
    if ndim not in (1, 2):
        raise RuntimeError(f"{op}: prob_dist must be 1 or 2 dim")
    if not dtype.is_floating_point:
        raise RuntimeError(f"{op}: multinomial only supports floating-point dtypes for input, "
                           f"got: {_dtype_name(dtype)}")
    if num_samples <= 0:
        raise RuntimeError(f"{op}: cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > k:
        raise RuntimeError(f"{op}: cannot sample n_sample > prob_dist.size(-1) samples "
                           "without replacement")
    if k > 2 ** 24:
        raise RuntimeError(f"{op}: number of categories cannot exceed 2^24")


# Per row of the weights: 0 valid, 1 a NaN or negative entry first, 2 +inf first,
# 3 all zero. One small program per shape; its result is read on the host.
_ROW_OK, _ROW_NEG, _ROW_INF, _ROW_ZERO = range(4)


def _row_codes(p):
    p2 = p.reshape(1, -1) if p.ndim == 1 else p
    kind = jnp.where(~(p2 >= 0), _ROW_NEG, jnp.where(p2 == jnp.inf, _ROW_INF, _ROW_OK))
    first_bad = jnp.take_along_axis(kind, jnp.argmax(kind > 0, axis=-1)[:, None], -1)[:, 0]
    zero = jnp.all(p2 == 0, axis=-1)
    return jnp.where(first_bad > 0, first_bad, jnp.where(zero, _ROW_ZERO, _ROW_OK)).astype(jnp.int8)


def _check_multinomial_values(t, num_samples, replacement):
    """PyTorch's checks on the weights' values, which need a device read.

    PyTorch makes them on every device: its no-replacement (and single-sample)
    path reads `max() < inf & min() >= 0` and the row sums with `.item()`,
    and its CPU sampler checks each entry. The tpu reads one code per row.
    """
    if t.numel() == 0:
        return
    arr = executor.value(t)
    key = keys.helper_key(programs.ProgramKind.MULTINOMIAL_CHECK, arr.shape, arr.dtype,
                          t.device.index)
    fn = programs.get_or_compile(key, _row_codes, (arr,))
    codes = np.asarray(fn(arr))
    op = "aten.multinomial"
    if not replacement or num_samples == 1:
        if ((codes == _ROW_NEG) | (codes == _ROW_INF)).any():
            raise RuntimeError(f"{op}: probability tensor contains either `inf`, `nan` or "
                               "element < 0")
        if (codes == _ROW_ZERO).any():
            raise RuntimeError(f"{op}: invalid multinomial distribution (sum of probabilities "
                               "<= 0)")
        return
    bad = codes[codes != _ROW_OK]
    if bad.size:  # CPU's sampler stops at the first bad row, at its first bad entry
        raise RuntimeError(f"{op}: invalid multinomial distribution " + {
            _ROW_NEG: "(encountering probability entry < 0)",
            _ROW_INF: "(encountering probability entry = infinity or NaN)",
            _ROW_ZERO: "(sum of probabilities <= 0)"}[int(bad[0])])


@lower(aten.multinomial.default, random=True)
def multinomial(p, num_samples, replacement=False, *, generator=None, rng_key):
    """Categories drawn by weight (unnormalized, non-negative).

    With replacement: independent categorical draws. Without: the Gumbel
    top-k trick (equivalent to drawing one at a time without replacement).
    The checks on the weights' values are made by the eager kernels below
    (a device read); inside a compiled graph they are not made.
    """
    _check_multinomial(p.ndim, torch_dtype(p.dtype), p.shape[-1] if p.ndim else 1,
                       num_samples, replacement)
    key = jax_key(rng_key)
    p2 = p.reshape(1, -1) if p.ndim == 1 else p
    f = opmath_dtype(p2.dtype)
    logits = jnp.log(p2.astype(f))
    n, k = p2.shape
    if replacement:
        out = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, n)).T
    else:
        g = logits + jax.random.gumbel(key, (n, k), f)
        out = lax.top_k(g, num_samples)[1]
    out = out.astype(jnp.int64)
    return out.reshape(_shape())


def _multinomial_checks(self, num_samples, replacement=False, *, generator=None, out=None):
    # CPU checks the out= dtype after the input's dim and dtype; the functional
    # lowering that computes the values never sees the out tensor.
    if (out is not None and self.dim() in (1, 2) and self.dtype.is_floating_point
            and out.dtype != torch.int64):
        raise RuntimeError(f"aten.multinomial.out: multinomial expects Long tensor out, "
                           f"got: {_dtype_name(out.dtype)}")
    _check_multinomial(self.dim(), self.dtype, self.shape[-1] if self.dim() else 1,
                       num_samples, replacement)
    _check_multinomial_values(self, num_samples, replacement)


for _op in (aten.multinomial.default, aten.multinomial.out):
    core.KERNELS[_op] = core.checked_kernel(_op, _multinomial_checks)


def _check_random_from(self, from_, to=None, *args, **kwargs):
    _random_range(self.dtype, from_, to, warn=True)


def _check_random_to(self, to, *args, **kwargs):
    _random_range(self.dtype, 0, to, warn=True)


def _check_randint(*args, dtype=None, **kwargs):
    low, high = args[:2] if len(args) > 2 and not isinstance(args[1], (list, tuple)) \
        else (0, args[0])
    _random_range(dtype or torch.int64, low, high, warn=True)


# random_'s checks at each call, with CPU's precision warning for float dtypes.
for _op, _check in ((aten.random_.to, _check_random_to), (aten.random.to, _check_random_to),
                    (getattr(aten.random_, "from"), _check_random_from),
                    (getattr(aten.random, "from"), _check_random_from),
                    (aten.randint.default, _check_randint),
                    (aten.randint.generator, _check_randint),
                    (aten.randint.low, _check_randint),
                    (aten.randint.low_generator, _check_randint)):
    core.KERNELS[_op] = core.checked_kernel(_op, _check)


# -- in-place forms whose functional overload has another name ---------------------------------------
#
# The executor derives `foo_` from `foo` when the overload names match. normal_
# (functional: normal_functional) and bernoulli_.float (functional: bernoulli.p)
# do not match, so they get runners built from their functional lowering here.


def _inplace_runner(inplace, functional):
    runner = executor.Runner(inplace, LOWERINGS[functional], functional)
    return runner.__call__


core.KERNELS[aten.normal_.default] = _inplace_runner(aten.normal_.default,
                                                     aten.normal_functional.default)
core.KERNELS[aten.bernoulli_.float] = _inplace_runner(aten.bernoulli_.float, aten.bernoulli.p)


# -- host checks of std and p (CPU's messages) -------------------------------------------------
#
# A float std or p is a host value: checked here before the op runs, with the
# CPU kernel's message. A Tensor std is checked as PyTorch's device-generic
# normal (the one CUDA runs) checks it: `std.min() >= 0` read back to the host,
# one device-to-host read per call. A Tensor p of bernoulli is not checked: CUDA
# checks it inside its kernel (a device-side assert), which has no XLA
# counterpart, and a host read per call would stall every dropout-like use;
# out-of-range probabilities act as clamped to [0, 1] (docs/troubleshooting.md).


def _arguments(op, args, kwargs):
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    for a in op._schema.arguments:
        if a.name not in bound and a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _check_std(op, std):
    if isinstance(std, torch.Tensor):
        if std.is_complex():
            raise RuntimeError(f"{op}: normal expects standard deviation to be non-complex")
        if std.numel() and not bool(std.min().ge(0).item()):
            raise RuntimeError(f"{op}: normal expects all elements of std >= 0.0")
    elif not std >= 0.0:
        raise RuntimeError(f"{op}: normal expects std >= 0.0, but found std {std:g}")


def _check_p(op, p):
    if not 0 <= p <= 1:
        raise RuntimeError(f"{op}: bernoulli_ expects p to be in [0, 1], but got p={p:g}")


def _with_check(op, run, check):
    def kernel(*args, **kwargs):
        check(op, _arguments(op, args, kwargs))
        return run(*args, **kwargs)

    kernel.__name__ = str(op)
    return kernel


def _lazy_runner(op):
    runner = None

    def run(*args, **kwargs):
        nonlocal runner
        if runner is None:
            runner = executor.runner_for(op)
        return runner(*args, **kwargs)

    return run


for _op in (aten.normal.Tensor_float, aten.normal.Tensor_float_out, aten.normal.float_Tensor,
            aten.normal.float_Tensor_out, aten.normal.Tensor_Tensor,
            aten.normal.Tensor_Tensor_out, aten.normal.float_float, aten.normal_.default):
    core.KERNELS.replace(_op, _with_check(_op, core.KERNELS.get(_op) or _lazy_runner(_op),
                                          lambda op, a: _check_std(op, a["std"])))
for _op in (aten.bernoulli.p, aten.bernoulli.float_out, aten.bernoulli_.float):
    core.KERNELS.replace(_op, _with_check(_op, core.KERNELS.get(_op) or _lazy_runner(_op),
                                          lambda op, a: _check_p(op, a["p"])))
