"""Elementwise lowerings: arithmetic, comparisons, unary math (activations: activations.py).

Type promotion follows PyTorch, not JAX: `_promote` asks PyTorch's own
`elementwise_dtypes` (with meta stand-ins for the arrays and Python numbers
for weakly-typed `Scalar` arguments) for the computation dtype, and the
inputs are cast to it. Like PyTorch's CPU kernels, float16/bfloat16 compute
in float32 ("opmath") and the executor rounds the result to the output dtype.

Integer semantics are PyTorch's: floor division and remainder round toward
-inf, `fmod` and `div(rounding_mode="trunc")` toward zero, shifts by
>= bit width give 0 (left) or the sign fill (right), `int ** negative int`
is 0 except for bases 1 and -1.

Known difference: PyTorch CPU raises `RuntimeError: ZeroDivisionError` for an
integer division (`//`, `%`, `fmod`, `div(rounding_mode=...)`) by zero.
Raising would need a device-to-host read on every integer division, so the
tpu device does not check; XLA's results are returned instead (documented
in `_int_div_by_zero` below): quotient -1, remainder and fmod the dividend.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch
from jax import lax

from .._compat.torch_api import ELEMENTWISE_TYPE_PROMOTION_KIND as K
from .._compat.torch_api import elementwise_dtypes
from . import core
from .._compat import jax_api
from .registry import lower
from ..runtime.storage import from_bool, torch_dtype
from ..runtime.storage import TORCH_TO_JAX
from .reductions import reject
from .reductions import type_name
from ..runtime import platform

aten = torch.ops.aten

__all__ = ["promote", "prep"]

# -- type promotion --------------------------------------------------------------

_SCALAR_OF_KIND = {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}


def _jax_dtype(dtype):
    return TORCH_TO_JAX[dtype]


def standin(x):
    """What PyTorch's promotion sees for `x`: a Python number or a meta tensor
    (ops.foreach runs the meta kernels on these to check in-place results)."""
    if isinstance(x, (bool, int, float, complex)):
        return x
    aval = jax.typeof(x)
    dtype = np.dtype(aval.dtype)
    if aval.shape == () and getattr(aval, "weak_type", False):
        # A traced `Scalar` argument (a Python number on the host).
        return _SCALAR_OF_KIND[dtype.kind]
    # Promotion depends on rank and dtype only: a symbolic size (torch_tpu.export)
    # stands in as 2.
    shape = tuple(d if isinstance(d, int) else 2 for d in aval.shape)
    return torch.empty(shape, dtype=torch_dtype(dtype), device="meta")


def promote(*xs, kind=K.DEFAULT):
    """(computation dtype, result dtype) PyTorch uses for `xs`, as jax dtypes."""
    args = [standin(x) for x in xs if x is not None]
    comp, res = elementwise_dtypes(*args, type_promotion_kind=kind)
    return _jax_dtype(comp), _jax_dtype(res)


def _as(x, dtype):
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_ and not jnp.issubdtype(dtype, jnp.bool_):
        return from_bool(x, dtype)  # not convert(pred): see from_bool
    if jnp.issubdtype(dtype, jnp.bool_) and x.dtype != jnp.bool_:
        return x != 0
    return x.astype(dtype) if x.dtype != dtype else x


def prep(*xs, kind=K.DEFAULT):
    """`xs` cast to PyTorch's computation dtype for them (None passes through)."""
    comp, _ = promote(*xs, kind=kind)
    out = [_as(x, comp) for x in xs]
    return out if len(out) != 1 else out[0]


def _bc(fn):
    """A binary lax function with numpy broadcasting."""
    def f(x, y):
        x, y = jnp.broadcast_arrays(x, y)
        return fn(x, y)
    return f


_div = _bc(lax.div)
_rem = _bc(lax.rem)
_lpow = _bc(lax.pow)


def _is_int(x):
    return jnp.issubdtype(x.dtype, jnp.integer)


def is_bool(x):
    """Whether jax array `x` is boolean (the lowerings here and in ops.activations)."""
    return x.dtype == jnp.bool_


def is_complex(x):
    """Whether jax array `x` is complex (the lowerings here and in ops.activations)."""
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _is_float(x):
    return jnp.issubdtype(x.dtype, jnp.floating)


def zero(x):
    """A 0-dim 0 of `x`'s dtype (the lowerings here and in ops.activations)."""
    return jnp.zeros((), x.dtype)


def one(x):
    """A 0-dim 1 of `x`'s dtype (the lowerings here and in ops.activations)."""
    return jnp.ones((), x.dtype)


def const(v, x):
    """Python constant `v` as a 0-dim array of `x`'s dtype (also for ops.activations)."""
    return jnp.asarray(v, x.dtype)


def _scaled(y, alpha):
    """`alpha * y` unless alpha is the Python literal 1."""
    if _is_one(alpha):
        return y
    return y * _as(alpha, y.dtype)


def _is_one(alpha):
    return alpha is None or (isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
                             and alpha == 1)


def _axpy(x, y, alpha, sign):
    """x + sign * alpha * y; half types in float32 with one rounding, as
    PyTorch's CPU and CUDA kernels compute them (opmath)."""
    if not _is_one(alpha) and x.dtype in (jnp.float16, jnp.bfloat16):
        f = jnp.float32
        return (x.astype(f) + sign * y.astype(f) * _as(alpha, f)).astype(x.dtype)
    return x + _scaled(y, alpha) if sign > 0 else x - _scaled(y, alpha)


# -- binary arithmetic -------------------------------------------------------------


def _alpha_check(x, alpha):
    """CPU's alpha_check against the result dtype (x is in it). The alpha's
    Python type is part of the executable's key, so this is a trace-time check."""
    if alpha is None:
        return
    if isinstance(alpha, (bool, int, float, complex)):
        kind = {bool: "b", int: "i", float: "f", complex: "c"}[type(alpha)]
    else:
        kind = np.dtype(jnp.asarray(alpha).dtype).kind
    if kind == "b" and not is_bool(x):
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if kind in "fc" and not (_is_float(x) or is_complex(x)):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating "
                           "point number.")
    if kind == "c" and not is_complex(x):
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a "
                           "complex number.")


@lower(aten.add.Tensor, aten.add.Scalar)
def add(self, other, alpha=1):
    x, y = prep(self, other)
    _alpha_check(x, alpha)
    if is_bool(x):
        return x | (y & _as(alpha, jnp.bool_))
    return _axpy(x, y, alpha, 1)


def _sub_check(self, other):
    """CPU's sub_check: the kernel (not the meta function) rejects a bool operand."""
    if any(isinstance(v, bool) or (hasattr(v, "dtype") and v.dtype == jnp.bool_)
           for v in (self, other)):
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
            "trying to invert a mask, use the `~` or `logical_not()` operator instead.")


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    _sub_check(self, other)
    x, y = prep(self, other)
    _alpha_check(x, alpha)
    return _axpy(x, y, alpha, -1)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    _sub_check(self, other)
    x, y = prep(self, other)
    _alpha_check(x, alpha)
    return y - _scaled(x, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    x, y = prep(self, other)
    if is_bool(x):
        return x & y
    return x * y


@lower(aten.div.Tensor, aten.div.Scalar)
def div(self, other):
    x, y = prep(self, other, kind=K.INT_TO_FLOAT)
    return x / y


def _int_div_by_zero(q, y):
    """Integer quotients by zero: PyTorch CPU raises; here they are -1.

    XLA leaves x / 0 implementation-defined; selecting -1 makes every backend
    agree. (Remainders by zero are the dividend, which XLA defines.)
    """
    return jnp.where(y == 0, -one(q), q)


def _int_floor_div(x, y):
    q = _div(x, y)
    r = _rem(x, y)
    fix = (r != 0) & ((r < 0) != (y < 0))
    return _int_div_by_zero(jnp.where(fix, q - 1, q), y)


def _float_floor_div(x, y, rnd=lambda v: v):
    """PyTorch's div_floor_floating, step by step; `rnd` rounds each step to
    the tensor dtype (CPU's bfloat16/half kernel computes in scalar_t)."""
    mod = rnd(_rem(x, y))
    d = rnd(_true_div(rnd(x - mod), y))
    d = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), rnd(d - 1), d)
    fl = jnp.floor(d)
    fl = jnp.where(rnd(d - fl) > 0.5, rnd(fl + 1), fl)
    q = rnd(_true_div(x, y))
    fl = jnp.where(d == 0, jnp.copysign(zero(q), q), fl)
    return jnp.where(y == 0, q, fl)


def _floor_div(x, y):
    if is_bool(x):
        x, y = x.astype(jnp.int8), y.astype(jnp.int8)
    if _is_int(x):
        return _int_floor_div(x, y)
    return _float_floor_div(x, y)


def _true_div(x, y):
    """x / y, correctly rounded also when y is broadcast.

    XLA's algebraic simplifier rewrites A / broadcast(B) into
    A * broadcast(1 / B), which is off by an ulp for some quotients (e.g.
    -9.9375 / 0.62109375 = -15.999999 instead of -16): harmless for true
    division, wrong after trunc. An opaque full-shape divisor keeps the divide.
    """
    shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y))
    if jnp.shape(y) != shape:
        y = lax.optimization_barrier(jnp.broadcast_to(y, shape))
    return x / y


def _trunc_div(x, y):
    if is_bool(x):
        x, y = x.astype(jnp.int8), y.astype(jnp.int8)
    if _is_int(x):
        return _int_div_by_zero(_div(x, y), y)
    return jnp.trunc(_true_div(x, y))


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return div(self, other)
    x, y = prep(self, other)
    if rounding_mode == "trunc":
        _, res = promote(self, other)
        if (res in (jnp.bfloat16, jnp.float16) and jnp.size(y) != 1
                and math.prod(jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y))) != 1):
            # CPU's bfloat16/half kernel rounds the quotient to the tensor
            # dtype before truncating (trunc(a / b) in scalar_t); only a
            # single-element divisor takes its float (opmath) path.
            return jnp.trunc(_true_div(x, y).astype(res).astype(x.dtype))
        return _trunc_div(x, y)
    return floor_divide(self, other)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self, other):
    x, y = prep(self, other)
    _, res = promote(self, other)
    if (res in (jnp.bfloat16, jnp.float16) and jnp.size(y) != 1
            and math.prod(jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y))) != 1):
        # as for trunc: CPU's half-type kernel computes every step of
        # div_floor_floating in scalar_t (a single-element divisor: in float)
        bits = (8, 7) if res == jnp.bfloat16 else (5, 10)
        return _float_floor_div(x, y, lambda v: lax.reduce_precision(v, *bits))
    return _floor_div(x, y)


def _fmod(x, y):
    if is_bool(x):
        x, y = x.astype(jnp.int8), y.astype(jnp.int8)
    r = _rem(x, y)
    if _is_int(x):  # by zero: the dividend (PyTorch CPU raises)
        r = jnp.where(y == 0, x, r)
    return r


def _remainder(x, y):
    if is_bool(x):
        x, y = x.astype(jnp.int8), y.astype(jnp.int8)
    r = _fmod(x, y)
    fix = (r != 0) & ((r < 0) != (y < 0))
    return jnp.where(fix, r + y, r)


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(self, other):
    x, y = prep(self, other)
    _reject(x, "remainder_cpu", bool_=True)
    return _remainder(x, y)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(self, other):
    x, y = prep(self, other)
    _reject(x, "fmod_cpu", bool_=True)
    return _fmod(x, y)


def _int_pow(x, n):
    """x ** n for integers, wrapping like C; negative n: PyTorch's rule."""
    n = jnp.broadcast_to(n, jnp.broadcast_shapes(x.shape, n.shape))
    x = jnp.broadcast_to(x, n.shape)
    bits = jnp.iinfo(n.dtype).bits

    def body(_, carry):
        acc, base, e = carry
        acc = jnp.where((e & 1) == 1, acc * base, acc)
        return acc, base * base, e >> 1

    acc, _, _ = lax.fori_loop(0, bits, body, (jnp.ones_like(x), x, jnp.maximum(n, 0)))
    neg = jnp.where(x == 1, one(x),
                    jnp.where(x == -1, jnp.where((n % 2) != 0, -one(x), one(x)), zero(x)))
    return jnp.where(n < 0, neg, acc)


def _pow(x, y):
    if is_bool(x):
        return _int_pow(x.astype(jnp.int8), y.astype(jnp.int8)).astype(jnp.bool_)
    if _is_int(x):
        return _int_pow(x, y)
    return _lpow(x, y)


@lower(aten.pow.Tensor_Tensor)
def pow_tensor_tensor(self, exponent):
    x, y = prep(self, exponent, kind=K.BOOL_TO_LONG)
    return _pow(x, y)


@lower(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(self, exponent):
    x, y = prep(self, exponent, kind=K.BOOL_TO_LONG)
    return _pow(x, y)


@lower(aten.pow.Scalar)
def pow_scalar(self, exponent):
    x, y = prep(self, exponent, kind=K.BOOL_TO_LONG)
    return _pow(x, y)


def _check_int_pow(op):
    """CPU's pow(Tensor, Scalar) check (its structured meta; PyTorch's Python meta
    kernel skips it): an integer or bool base with a negative integer Scalar
    exponent raises (NumPy's rule). A Tensor exponent is not checked, as on CPU."""
    def check(self, exponent, **_):
        if (not (self.dtype.is_floating_point or self.dtype.is_complex)
                and isinstance(exponent, int) and exponent < 0):
            raise RuntimeError(f"{op}: Integers to negative integer powers are not allowed.")
    return check


# (pow_.Scalar already raises: PyTorch's in-place structured meta checks it.)
for _op in (aten.pow.Tensor_Scalar, aten.pow.Tensor_Scalar_out):
    core.KERNELS[_op] = core.checked_kernel(_op, _check_int_pow(_op))


@lower(aten.atan2.default)
def atan2(self, other):
    x, y = prep(self, other, kind=K.INT_TO_FLOAT)
    return jnp.arctan2(x, y)


@lower(aten.hypot.default)
def hypot(self, other):
    x, y = prep(self, other)
    return jnp.hypot(x, y)


def max_of(x, y):
    """Elementwise maximum, logical or for booleans (clamp here and in ops.activations)."""
    if is_bool(x):
        return x | y
    return jnp.maximum(x, y)


def min_of(x, y):
    """Elementwise minimum, logical and for booleans (clamp here and in ops.activations)."""
    if is_bool(x):
        return x & y
    return jnp.minimum(x, y)


@lower(aten.maximum.default)
def maximum(self, other):
    if is_complex(self) or is_complex(other):
        raise RuntimeError("maximum not implemented for complex tensors.")
    return max_of(*prep(self, other))


@lower(aten.minimum.default)
def minimum(self, other):
    if is_complex(self) or is_complex(other):
        raise RuntimeError("minimum not implemented for complex tensors.")
    return min_of(*prep(self, other))


@lower(aten.fmax.default)
def fmax(self, other):
    x, y = prep(self, other)
    if not _is_float(x):
        return max_of(x, y)
    return jnp.where(jnp.isnan(y) | (x > y), x, jnp.where(jnp.isnan(x), y, jnp.maximum(x, y)))


@lower(aten.fmin.default)
def fmin(self, other):
    x, y = prep(self, other)
    if not _is_float(x):
        return min_of(x, y)
    return jnp.where(jnp.isnan(y) | (x < y), x, jnp.where(jnp.isnan(x), y, jnp.minimum(x, y)))


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(self, other):
    x, y = prep(self, other, kind=K.INT_TO_FLOAT)
    return jnp.copysign(x, y)


@lower(aten.nextafter.default)
def nextafter(self, other):
    # In the tensors' own dtype (no opmath): the next representable value.
    x, y = prep(self, other, kind=K.NO_OPMATH)
    return jnp.nextafter(x, y)


def _xlogy(x, y, log):
    out = x * log(y)
    out = jnp.where(x == 0, zero(out), out)
    return jnp.where(jnp.isnan(y), y, out)


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
def xlogy(self, other):
    x, y = prep(self, other, kind=K.INT_TO_FLOAT)
    return _xlogy(x, y, jnp.log)


@lower(aten.special_xlog1py.default, aten.special_xlog1py.other_scalar,
       aten.special_xlog1py.self_scalar)
def special_xlog1py(self, other):
    x, y = prep(self, other, kind=K.INT_TO_FLOAT)
    return _xlogy(x, y, jnp.log1p)


@lower(aten.special_zeta.default, aten.special_zeta.other_scalar,
       aten.special_zeta.self_scalar)
def special_zeta(self, other):
    x, q = prep(self, other, kind=K.INT_TO_FLOAT)
    return _zeta(x, q)


_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)


def _zeta_sum(x, q):
    """Cephes' Hurwitz zeta (as in PyTorch): direct sum while q + i <= 9, then
    Euler-Maclaurin. The direct sum also covers negative non-integer q."""
    x, q = jnp.broadcast_arrays(x, q)
    eps = const(jnp.finfo(x.dtype).eps / 2, x)
    s = q ** -x
    zero = jnp.zeros_like(s)

    def cond(state):
        i, a, _, _, done = state
        return jnp.any(~done & ((i < 9) | (a <= 9)))

    def body(state):
        i, a, s, b, done = state
        active = ~done & ((i < 9) | (a <= 9))
        a = jnp.where(active, a + 1, a)
        bn = a ** -x
        s = jnp.where(active, s + bn, s)
        b = jnp.where(active, bn, b)
        done = done | (active & (jnp.abs(bn / s) < eps))
        return i + 1, a, s, b, done

    _, a, s, b, done = lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), q, s, zero, jnp.zeros(s.shape, bool)))
    w = a
    t_s = s + b * w / (x - 1) - 0.5 * b
    aa, k, tdone = jnp.ones_like(s), zero, done
    for coef in _ZETA_A:
        aa = aa * (x + k)
        b = b / w
        t = aa * b / coef
        t_s = jnp.where(tdone, t_s, t_s + t)
        tdone = tdone | (jnp.abs(t / t_s) < eps)
        k = k + 1
        aa = aa * (x + k)
        b = b / w
        k = k + 1
    out = jnp.where(done, s, t_s)
    big = (1 / (x - 1) + 1 / (2 * q)) * q ** (1 - x)
    return jnp.where(q > 1e8, big, out)


def _zeta(x, q):
    """Hurwitz zeta with PyTorch's (Cephes') special cases."""
    out = _zeta_sum(x, q)
    inf, nan = const(jnp.inf, out), const(jnp.nan, out)
    nonpos = q <= 0
    out = jnp.where(nonpos & (x != jnp.floor(x)), nan, out)
    out = jnp.where(nonpos & (q == jnp.floor(q)), inf, out)
    out = jnp.where(x < 1, nan, out)
    return jnp.where(x == 1, inf, out)


@lower(aten.igamma.default)
def igamma(self, other):
    a, x = prep(self, other, kind=K.INT_TO_FLOAT)
    return _bc(lax.igamma)(a, x)


@lower(aten.igammac.default)
def igammac(self, other):
    a, x = prep(self, other, kind=K.INT_TO_FLOAT)
    return _bc(lax.igammac)(a, x)


@lower(aten.logaddexp.default)
def logaddexp(self, other):
    a, b = prep(self, other, kind=K.INT_TO_FLOAT)
    if jnp.iscomplexobj(a):
        # As CPU: the operand with the larger real part (ties: the second) is
        # the max; max + log1p(exp(min - max)).
        a_max = jnp.real(b) < jnp.real(a)
        hi, lo = jnp.where(a_max, a, b), jnp.where(a_max, b, a)
        return hi + jnp.log1p(jnp.exp(lo - hi))
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp(-jnp.abs(a - b)))
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


@lower(aten.logaddexp2.default)
def logaddexp2(self, other):
    a, b = prep(self, other, kind=K.INT_TO_FLOAT)
    m = jnp.maximum(a, b)
    out = m + jnp.log1p(jnp.exp2(-jnp.abs(a - b))) * const(1 / math.log(2.0), a)
    return jnp.where(jnp.isinf(a) & (a == b), a, out)


def _lerp(x, end, w):
    small = jnp.abs(w) < const(0.5, w)  # not a Python float: a weak f32 `w` would widen
    return jnp.where(small, x + w * (end - x), end - (end - x) * (1 - w))


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    x, e, w = prep(self, end, weight)
    return _lerp(x, e, w)


@lower(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    x, a, b = prep(self, tensor1, tensor2)
    if is_bool(x):
        return x | (a & b & _as(value, jnp.bool_))
    return x + _as(value, x.dtype) * a * b


@lower(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    x, a, b = prep(self, tensor1, tensor2)
    return x + _as(value, x.dtype) * (a / b)


@lower(aten.ldexp.Tensor)
def ldexp(self, other):
    x, e = prep(self, other, kind=K.INT_TO_FLOAT)
    return x * jnp.exp2(e)


# (uint type of the same width, mantissa bits, exponent bias) per float format.
_FLOAT_BITS = {
    np.dtype(jnp.float32): (jnp.uint32, 23, 127),
    np.dtype(jnp.bfloat16): (jnp.uint16, 7, 127),
    np.dtype(jnp.float16): (jnp.uint16, 10, 15),
}


@lower(aten.frexp.Tensor)
def frexp(self):
    """std::frexp on the bits: mantissa in [0.5, 1) with the input's sign.

    XLA:CPU flushes subnormal operands of float arithmetic to zero, so the
    exponent and mantissa fields are taken apart with integer ops only; a
    subnormal input is normalized by counting leading zeros of its fraction.
    Zero, inf and nan give (self, 0), as glibc's frexp.
    """
    x = self
    uint, mb, bias = _FLOAT_BITS[np.dtype(x.dtype)]
    nbits = np.dtype(uint).itemsize * 8
    u = lax.bitcast_convert_type(x, uint).astype(jnp.uint32)
    sign = u & jnp.uint32(1 << (nbits - 1))
    frac_mask = jnp.uint32((1 << mb) - 1)
    e = ((u >> mb) & jnp.uint32((1 << (nbits - 1 - mb)) - 1)).astype(jnp.int32)
    f = u & frac_mask
    emax = (1 << (nbits - 1 - mb)) - 1
    # Subnormal: value = f * 2**(1 - bias - mb); highest set bit of f at p.
    p = 31 - lax.clz(f).astype(jnp.int32)
    sub_exp = p + 2 - bias - mb
    sub_frac = (f << (mb - jnp.clip(p, 0, mb)).astype(jnp.uint32)) & frac_mask
    normal = (e > 0) & (e < emax)
    subnormal = (e == 0) & (f != 0)
    exp = jnp.where(normal, e - (bias - 1), jnp.where(subnormal, sub_exp, 0))
    frac = jnp.where(subnormal, sub_frac, f)
    m_bits = (sign | jnp.uint32((bias - 1) << mb) | frac).astype(uint)
    mant = lax.bitcast_convert_type(m_bits, x.dtype)
    mant = jnp.where(normal | subnormal, mant, x)
    return mant, exp.astype(jnp.int32)


@lower(aten.heaviside.default)
def heaviside(self, values):
    x, v = prep(self, values)
    return jnp.where(x == 0, v, (x > 0).astype(x.dtype))


@lower(aten.gcd.default)
def gcd(self, other):
    x, y = prep(self, other)
    return jnp.gcd(x, y)


@lower(aten.lcm.default)
def lcm(self, other):
    x, y = prep(self, other)
    g = jnp.gcd(x, y)
    safe = jnp.where(g == 0, one(g), g)
    return jnp.where(g == 0, zero(g), jnp.abs(_div(x, safe) * y))


# -- bitwise and logical ------------------------------------------------------------


def _reject(x, kernel, **kinds):
    reject(x, kernel, **kinds)


def _integral_only(x, kernel):
    """PyTorch CPU's bitwise kernels exist for integer and bool types only."""
    if not (_is_int(x) or is_bool(x)):
        raise NotImplementedError(f'"{kernel}" not implemented for \'{type_name(x.dtype)}\'')


def _bitwise(fn, kernel):
    def lowering(self, other):
        x, y = prep(self, other)
        _integral_only(x, kernel)
        return fn(x, y)
    return lowering


lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)(
    _bitwise(jnp.bitwise_and, "bitwise_and_cpu"))
lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)(
    _bitwise(jnp.bitwise_or, "bitwise_or_cpu"))
lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)(
    _bitwise(jnp.bitwise_xor, "bitwise_xor_cpu"))


@lower(aten.bitwise_not.default)
def bitwise_not(self):
    _integral_only(self, "bitwise_not_cpu")
    return jnp.logical_not(self) if is_bool(self) else jnp.bitwise_not(self)


def _shift_left(x, y):
    # Shifts by a negative amount or >= the bit width give 0 (as on CPU).
    bits = jnp.iinfo(x.dtype).bits
    out = _bc(lax.shift_left)(x, jnp.clip(y, 0, bits - 1).astype(x.dtype))
    return jnp.where((y < 0) | (y >= bits), zero(x), out)


def _shift_right(x, y):
    bits = jnp.iinfo(x.dtype).bits
    big = (y < 0) | (y >= bits)
    amount = jnp.where(big, bits - 1, y).astype(x.dtype)
    if jnp.issubdtype(x.dtype, jnp.signedinteger):
        return _bc(lax.shift_right_arithmetic)(x, amount)
    return jnp.where(big, zero(x), _bc(lax.shift_right_logical)(x, amount))


@lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
       aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def bitwise_left_shift(self, other):
    x, y = prep(self, other)
    _integral_only(x, "lshift_cpu")
    return _shift_left(x, y)


@lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
       aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def bitwise_right_shift(self, other):
    x, y = prep(self, other)
    _integral_only(x, "rshift_cpu")
    return _shift_right(x, y)


def _truth(x):
    x = jnp.asarray(x)
    return x if is_bool(x) else x != 0


@lower(aten.logical_and.default)
def logical_and(self, other):
    return _truth(self) & _truth(other)


@lower(aten.logical_or.default)
def logical_or(self, other):
    return _truth(self) | _truth(other)


@lower(aten.logical_xor.default)
def logical_xor(self, other):
    return _truth(self) ^ _truth(other)


@lower(aten.logical_not.default)
def logical_not(self):
    return ~_truth(self)


# -- comparisons ---------------------------------------------------------------


def _compare(fn, ordered=None):
    def lowering(self, other):
        x, y = prep(self, other, kind=K.ALWAYS_BOOL)
        if ordered and is_complex(x):
            # complex numbers have no order: CPU's kernels have no complex case
            raise NotImplementedError(
                f'"{ordered}_tpu" not implemented for '
                f"'{'ComplexDouble' if x.dtype == jnp.complex128 else 'ComplexFloat'}'")
        return fn(x, y)
    return lowering


lower(aten.eq.Tensor, aten.eq.Scalar)(_compare(lambda x, y: x == y))
lower(aten.ne.Tensor, aten.ne.Scalar)(_compare(lambda x, y: x != y))
lower(aten.lt.Tensor, aten.lt.Scalar)(_compare(lambda x, y: x < y, "lt"))
lower(aten.le.Tensor, aten.le.Scalar)(_compare(lambda x, y: x <= y, "le"))
lower(aten.gt.Tensor, aten.gt.Scalar)(_compare(lambda x, y: x > y, "gt"))
lower(aten.ge.Tensor, aten.ge.Scalar)(_compare(lambda x, y: x >= y, "ge"))


@lower(aten.isnan.default)
def isnan(self):
    return self != self


@lower(aten.isinf.default)
def isinf(self):
    if _is_int(self) or is_bool(self):
        return jnp.zeros(self.shape, jnp.bool_)
    return jnp.isinf(self)


@lower(aten.isposinf.default)
def isposinf(self):
    if _is_int(self) or is_bool(self):
        return jnp.zeros(self.shape, jnp.bool_)
    return self == jnp.inf


@lower(aten.isneginf.default)
def isneginf(self):
    if _is_int(self) or is_bool(self):
        return jnp.zeros(self.shape, jnp.bool_)
    return self == -jnp.inf


@lower(aten.signbit.default)
def signbit(self):
    if is_bool(self) or jnp.issubdtype(self.dtype, jnp.unsignedinteger):
        return jnp.zeros(self.shape, jnp.bool_)
    if _is_int(self):
        return self < 0
    return jnp.signbit(self)


# -- unary math ----------------------------------------------------------------


def _unary(ops, fn, kind=K.INT_TO_FLOAT):
    def lowering(self):
        return fn(prep(self, kind=kind))
    lowering.__name__ = fn.__name__ if hasattr(fn, "__name__") else "unary"
    lower(*ops)(lowering)
    return lowering


def _complex_or(real_fn, complex_fn):
    def fn(x):
        return complex_fn(x) if is_complex(x) else real_fn(x)
    return fn


def _digamma(x):
    out = lax.digamma(x)
    return jnp.where(x == 0, jnp.copysign(jnp.full((), jnp.inf, x.dtype), -x), out)


def _sigmoid(x):
    if is_complex(x):
        return 1 / (1 + jnp.exp(-x))
    return lax.logistic(x)


def _sinc(x):
    px = x * const(math.pi, x)
    safe = jnp.where(x == 0, one(px), px)
    return jnp.where(x == 0, one(x), jnp.sin(safe) / safe)


def _angle(x):
    if is_complex(x):
        return jnp.angle(x)
    out = jnp.where(x < 0, const(math.pi, x), zero(x))
    return jnp.where(jnp.isnan(x), x, out)


def _rsqrt(x):
    return 1 / jnp.sqrt(x) if is_complex(x) else lax.rsqrt(x)


def _i0(x):
    return jnp.exp(jnp.abs(x)) * lax.bessel_i0e(x)


def _i1(x):
    return jnp.exp(jnp.abs(x)) * lax.bessel_i1e(x)


def _spherical_j0(x):
    """sin(x) / x, by its series below 0.5 (as PyTorch), 0 at +-inf."""
    x2 = x * x
    series = 1 + x2 * (-1.0 / 6 + x2 * (1.0 / 120 + x2 * (-1.0 / 5040 + x2 * (
        1.0 / 362880 + x2 * (-1.0 / 39916800 + x2 * (1.0 / 6227020800))))))
    safe = jnp.where(jnp.abs(x) < 0.5, one(x), x)
    out = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), zero(x), out)


def _entr(x):
    out = -x * jnp.log(jnp.where(x > 0, x, one(x)))
    out = jnp.where(x == 0, zero(x), out)
    out = jnp.where(x < 0, const(-jnp.inf, x), out)
    return jnp.where(jnp.isnan(x), x, out)


def _erfinv(x):
    # XLA's float32 erf_inv is a few ulp off near +-1, where the derivative
    # (and so autograd) amplifies it; PyTorch's is correctly rounded there.
    # Where the platform has float64 (XLA:CPU, GPU), go through it.

    if x.dtype == jnp.float32 and platform.supports_float64():
        return lax.erf_inv(x.astype(jnp.float64)).astype(x.dtype)
    return lax.erf_inv(x)


def _lgamma(x):
    # PyTorch: lgamma(-inf) = +inf.
    return jnp.where(x == -jnp.inf, const(jnp.inf, x), lax.lgamma(x))


_unary([aten.exp.default], jnp.exp)
_unary([aten.exp2.default], jnp.exp2)
_unary([aten.expm1.default], jnp.expm1)
_unary([aten.log.default], jnp.log)
_unary([aten.log2.default], jnp.log2)
_unary([aten.log10.default], jnp.log10)
_unary([aten.log1p.default], jnp.log1p)
_unary([aten.sqrt.default], jnp.sqrt)
_unary([aten.rsqrt.default], _rsqrt)
_unary([aten.reciprocal.default], lambda x: 1 / x)
_unary([aten.sin.default], jnp.sin)
_unary([aten.cos.default], jnp.cos)
_unary([aten.tan.default], jnp.tan)
_unary([aten.asin.default], jnp.arcsin)
_unary([aten.acos.default], jnp.arccos)
_unary([aten.atan.default], jnp.arctan)
_unary([aten.sinh.default], jnp.sinh)
_unary([aten.cosh.default], jnp.cosh)
_unary([aten.tanh.default], jnp.tanh)
_unary([aten.asinh.default], jnp.arcsinh)
_unary([aten.acosh.default], jnp.arccosh)
_unary([aten.atanh.default], jnp.arctanh)
_unary([aten.erf.default], lax.erf)
_unary([aten.erfc.default], lax.erfc)
_unary([aten.erfinv.default], _erfinv)
_unary([aten.lgamma.default], _lgamma)
_unary([aten.digamma.default], _digamma)
_unary([aten.i0.default], _i0)
_unary([aten.special_i0e.default], lax.bessel_i0e)
_unary([aten.special_i1.default], _i1)
_unary([aten.special_i1e.default], lax.bessel_i1e)
_unary([aten.special_modified_bessel_i0.default], _i0)
_unary([aten.special_modified_bessel_i1.default], _i1)
_unary([aten.special_spherical_bessel_j0.default], _spherical_j0)
_unary([aten.special_ndtri.default], jsp.ndtri)
_unary([aten.special_log_ndtr.default], jsp.log_ndtr)
if (_erfcx := jax_api.erfcx()) is not None:  # JAX >= 0.10
    _unary([aten.special_erfcx.default], _erfcx)
_unary([aten.special_entr.default], _entr)
_unary([aten.sigmoid.default], _sigmoid)
_unary([aten.sinc.default], _sinc)
_unary([aten.deg2rad.default], lambda x: x * const(math.pi / 180.0, x))
_unary([aten.rad2deg.default], lambda x: x * const(180.0 / math.pi, x))
_unary([aten.angle.default], _angle)


def _keep_int(fn, kernel):
    def f(x):
        _reject(x, kernel, bool_=True)  # CPU's vml kernels have no bool
        return x if _is_int(x) else fn(x)
    return f


_unary([aten.floor.default], _keep_int(jnp.floor, "floor_vml_cpu"), kind=K.DEFAULT)
_unary([aten.ceil.default], _keep_int(jnp.ceil, "ceil_vml_cpu"), kind=K.DEFAULT)
_unary([aten.trunc.default], _keep_int(jnp.trunc, "trunc_vml_cpu"), kind=K.DEFAULT)
_unary([aten.round.default], _keep_int(jnp.round, "round_vml_cpu"), kind=K.DEFAULT)
_unary([aten.frac.default], lambda x: x - jnp.trunc(x), kind=K.DEFAULT)
_unary([aten.neg.default], lambda x: -x, kind=K.DEFAULT)
_unary([aten._conj_physical.default], jnp.conj, kind=K.NO_OPMATH)


@lower(aten.abs.default)
def abs_(self):
    _reject(self, "abs_cpu", bool_=True)
    x = prep(self, kind=K.COMPLEX_TO_FLOAT)
    return jnp.abs(x)


@lower(aten.sign.default)
def sign(self):
    if is_complex(self):
        raise NotImplementedError(
            "Unlike NumPy, torch.sign is not intended to support complex numbers. Please use "
            "torch.sgn instead.")
    x = prep(self)
    if is_bool(x):
        return x
    # sign(nan) == 0 on PyTorch's CPU.
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lower(aten.sgn.default)
def sgn(self):
    x = prep(self)
    if not is_complex(x):
        return sign(x)
    a = jnp.abs(x)
    return jnp.where(a == 0, zero(x), x / jnp.where(a == 0, one(a), a).astype(x.dtype))


@lower(aten.round.decimals)
def round_decimals(self, *, decimals=0):
    x = prep(self)
    if _is_int(x) or is_bool(x):
        return x
    if decimals == 0:
        return jnp.round(x)
    if decimals > 0:
        p = const(10.0 ** decimals, x)
        return jnp.round(x * p) / p
    p = const(10.0 ** (-decimals), x)
    return jnp.round(x / p) * p


def _trigamma(x):
    """PyTorch's calc_trigamma: reflection below 0.5, six recurrence steps, series."""
    pi = const(math.pi, x)
    neg = x < 0.5
    sin_pi_x = jnp.sin(pi * x)
    result = jnp.where(neg, -(pi * pi) / (sin_pi_x * sin_pi_x), jnp.zeros_like(x))
    x = jnp.where(neg, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(neg, -result, result)


@lower(aten.polygamma.default)
def polygamma(n, self):
    x = prep(self, kind=K.INT_TO_FLOAT)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign_ = 1.0 if n % 2 else -1.0
    return const(sign_ * math.gamma(n + 1), x) * _zeta(const(n + 1, x), x)


@lower(aten.mvlgamma.default)
def mvlgamma(self, p):
    # PyTorch also checks all(self > (p - 1) / 2) on the host; not checked here.
    x = prep(self, kind=K.INT_TO_FLOAT)
    js = jnp.arange(p, dtype=x.dtype) * const(-0.5, x)
    terms = lax.lgamma(x[..., None] + js)
    return jnp.sum(terms, axis=-1) + const(p * (p - 1) / 4 * math.log(math.pi), x)


@lower(aten.logit.default)
def logit(self, eps=None):
    # In the result dtype, like PyTorch's CPU kernel (bfloat16 rounds each step).
    x = _as(self, promote(self, kind=K.INT_TO_FLOAT)[1])
    if eps is not None:
        # CPU's order (x < eps first), not a clip: with eps > 0.5 the bounds
        # cross, and values below eps become eps (PyTorch 2.14's OpInfo
        # samples include eps=0.6)
        lo, hi = const(eps, x), const(1 - eps, x)
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))
    return jnp.log(x / (1 - x))


@lower(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    x = self
    if not (_is_float(x) or is_complex(x)):
        return x

    def fix(v):
        info = jnp.finfo(v.dtype)
        v = jnp.where(jnp.isnan(v), const(0.0 if nan is None else nan, v), v)
        v = jnp.where(v == jnp.inf, const(info.max if posinf is None else posinf, v), v)
        return jnp.where(v == -jnp.inf, const(info.min if neginf is None else neginf, v), v)

    if is_complex(x):
        return lax.complex(fix(jnp.real(x)), fix(jnp.imag(x)))
    return fix(x)


def no_complex_clamp(*xs):
    """Raise PyTorch's error for a complex clamp operand (clamp and relu-like activations)."""
    if any(x is not None and is_complex(x) for x in xs):
        raise NotImplementedError("clamp is not supported for complex types")


def _clamp(x, lo, hi):
    no_complex_clamp(x, lo, hi)
    if lo is not None:
        x = max_of(x, lo)
    if hi is not None:
        x = min_of(x, hi)
    return x


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(self, min=None, max=None):  # noqa: A002 (ATen names)
    x, lo, hi = prep(self, min, max)
    return _clamp(x, lo, hi)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):  # noqa: A002
    x, lo = prep(self, min)
    no_complex_clamp(x, lo)
    return max_of(x, lo)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):  # noqa: A002
    x, hi = prep(self, max)
    no_complex_clamp(x, hi)
    return min_of(x, hi)


@lower(aten.where.self)
def where(condition, self, other):
    x, y = prep(self, other, kind=K.NO_OPMATH)
    return jnp.where(_truth(condition), x, y)
