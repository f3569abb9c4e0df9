"""Reductions, scans and softmax: sum/mean/prod, max/min and their indices,
all/any, var/std, norms, logsumexp, cumulative ops, median/mode/kthvalue.

Conventions (PyTorch CPU semantics):
- `dim=None` or `dim=[]` reduces every dimension (except `all/any.dims`, where
  an empty list reduces nothing); dims may be negative; a 0-dim tensor accepts
  dim 0/-1 and reduces nothing.
- Half types (float16/bfloat16) accumulate in float32, like PyTorch's CPU
  kernels; the executor casts results to the dtype PyTorch's meta kernel
  gives (e.g. int64 for sums of integers and bools).
- max/min/amax/amin propagate NaN; argmax/argmin and max/min.dim return the
  first occurrence (of the extreme value, or of the first NaN).
- Indices are computed in int32 (cheap on TPUs) and widened to int64.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime import storage as st
from .opmath import opmath_dtype
from .registry import lower, out_dtype, out_meta
from . import core

aten = torch.ops.aten

# -- helpers -----------------------------------------------------------------


def _is_float(x):
    return jnp.issubdtype(x.dtype, jnp.floating)


def _is_complex(x):
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def wrap_dim(dim, ndim):
    """`dim` in [0, ndim) (0 for a 0-dim tensor), or PyTorch's IndexError."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return dim % n


def _axes(x, dim, empty_means_all=True):
    """Normalized, sorted reduction axes of `x` for an ATen `dim` argument."""
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = (dim,)
    dim = tuple(dim)
    if not dim:
        return tuple(range(x.ndim)) if empty_means_all else ()
    axes = {wrap_dim(d, x.ndim) for d in dim}
    if x.ndim == 0:
        return ()
    return tuple(sorted(axes))


def _axis(x, dim):
    """One normalized axis (None for a 0-dim tensor)."""
    d = wrap_dim(dim, x.ndim)
    return None if x.ndim == 0 else d


def _count(x, axes):
    return math.prod(x.shape[a] for a in axes)


def _orderable(x):
    """Bool compares as uint8 in lax's sort/argmax/scan."""
    return x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x


def _idx(i):
    return i.astype(jnp.int64)


_TYPE_NAMES = {
    "bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
    "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float",
    "float64": "Double", "complex64": "ComplexFloat", "complex128": "ComplexDouble",
    "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
}


def type_name(dtype):
    """PyTorch's C++ name of a dtype ('Float', 'Long', ...), as in its error messages."""
    name = np.dtype(dtype).name
    return _TYPE_NAMES.get(name, name)


def reject(x, kernel, *, complex_=False, bool_=False, integer=False):
    """Raise PyTorch CPU's NotImplementedError for dtypes its kernel does not have.

    PyTorch's meta kernels accept these dtypes; its CPU kernels do not, and the
    tpu device follows the CPU. `integer` covers bool too.
    """
    dt = x.dtype
    bad = ((complex_ and jnp.issubdtype(dt, jnp.complexfloating))
           or ((bool_ or integer) and dt == jnp.bool_)
           or (integer and jnp.issubdtype(dt, jnp.integer)))
    if bad:
        raise NotImplementedError(f'"{kernel}" not implemented for \'{type_name(dt)}\'')


def _no_complex(x, op):
    if _is_complex(x):
        raise RuntimeError(f"{op}(): does not support complex input")


def _meta_dtype(i):
    """The jax dtype of output `i` of the op being lowered."""
    return st.TORCH_TO_JAX[jax.tree_util.tree_leaves(out_meta())[i].dtype]


# -- sum, mean, prod ---------------------------------------------------------


@lower(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    od = out_dtype()
    return jnp.sum(x.astype(opmath_dtype(od)), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    if _is_complex(x):
        raise RuntimeError("nansum does not support complex inputs")
    od = out_dtype()
    x = x.astype(opmath_dtype(od))
    if _is_float(x) or _is_complex(x):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    od = out_dtype()
    axes = _axes(x, dim)
    s = jnp.sum(x.astype(opmath_dtype(od)), axis=axes, keepdims=keepdim)
    return s / _count(x, axes)


@lower(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    od = out_dtype()
    return jnp.prod(x.astype(opmath_dtype(od)), axis=_axes(x, dim), keepdims=keepdim)


def _f32_bits_as_f64(x):
    """The bit pattern (uint64) of float32 `x` converted to float64, built with
    integer ops (TPUs have no float64): exact for zeros, subnormals, infinities
    and NaNs (quieted, payload kept, as the host's conversion does)."""
    b = lax.bitcast_convert_type(x, jnp.uint32).astype(jnp.uint64)
    sign = (b >> 31) << 63
    exp = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    normal = (((exp + (1023 - 127)) << 52) | (mant << 29))
    special = (jnp.uint64(0x7FF) << 52) | (
        jnp.where(mant != 0, mant | 0x400000, mant) << 29)
    # Subnormal: value mant * 2**-149, highest set bit h of mant.
    h = 63 - lax.clz(jnp.maximum(mant, 1)).astype(jnp.uint64)
    sub = ((h + (1023 - 149)) << 52) | ((mant << (52 - h)) & ((1 << 52) - 1))
    bits = jnp.where(exp == 0xFF, special, jnp.where(exp != 0, normal, jnp.where(
        mant != 0, sub, jnp.uint64(0))))
    return sign | bits


@lower(aten.hash_tensor.default)
def hash_tensor(x, dim=(), keepdim=False, *, mode=0):
    """xor of the elements widened to 64 bits (float64 or int64) and bitcast to
    uint64, like PyTorch's CPU kernel (mode 0, the only mode it has)."""
    if mode != 0:
        raise RuntimeError(f"Unknown hash_tensor mode: {mode}")
    if x.dtype == jnp.float64:
        bits = lax.bitcast_convert_type(x, jnp.uint64)
    elif _is_float(x):
        bits = _f32_bits_as_f64(x.astype(jnp.float32))
    elif x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        bits = x.astype(jnp.uint64)
    else:
        bits = lax.bitcast_convert_type(x.astype(jnp.int64), jnp.uint64)
    axes = _axes(x, dim)
    out = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, axes)
    if keepdim:
        out = jnp.expand_dims(out, axes)
    return out


# -- max/min -------------------------------------------------------------------


def _full_reduction(x, name):
    reject(x, f"{name}_all", complex_=True)
    if x.size == 0:
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument.")


@lower(aten.max.default)
def max_(x):
    _full_reduction(x, "max")
    return jnp.max(x)


@lower(aten.min.default)
def min_(x):
    _full_reduction(x, "min")
    return jnp.min(x)


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    reject(x, "max_values", complex_=True)
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    reject(x, "min_values", complex_=True)
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    reject(x, "aminmax", complex_=True)
    axes = _axes(x, dim)
    return (jnp.min(x, axis=axes, keepdims=keepdim),
            jnp.max(x, axis=axes, keepdims=keepdim))


def _reduction_check(op, label, dim_at, default_dim=None, any_dim_error=None):
    """CPU's argument checks that PyTorch's meta kernels make differently.
    Host metadata only.

    - A reduced dim of size 0 is an IndexError on CPU ("Expected reduction dim
      d to have non-zero size"); the meta kernels raise RuntimeError, or (max
      and min over a dim) nothing.
    - `any_dim_error`: the exception type CPU raises for an empty input reduced
      over all dims (argmax/argmin: IndexError).
    - aminmax's out= tensors must have the input's dtype (meta: any castable).
    """
    def check(self, *args, **kwargs):
        dim = args[dim_at] if len(args) > dim_at else kwargs.get("dim", default_dim)
        if any_dim_error is not None and (self.dtype == torch.bool or self.is_complex()):
            # argmax/argmin: CPU rejects the dtype before looking at sizes.
            kind = "bool" if self.dtype == torch.bool else "complex"
            raise RuntimeError(f"{label}: does not support {kind} input")
        if self.numel() == 0:
            if dim is None:
                if any_dim_error is not None:
                    raise any_dim_error(f"{label}: Expected reduction dim to be specified "
                                        "for input.numel() == 0.")
            else:
                for d in ([dim] if isinstance(dim, int) else list(dim)):
                    d = d + max(self.dim(), 1) if d < 0 else d
                    if self.dim() == 0 or (0 <= d < self.dim() and self.shape[d] == 0):
                        raise IndexError(f"{label}: Expected reduction dim {d} to have "
                                         "non-zero size.")
        for name in ("min", "max"):
            out = kwargs.get(name)
            if isinstance(out, torch.Tensor) and out.dtype != self.dtype:
                raise RuntimeError(f"{op}: Expected out tensor to have dtype {self.dtype}, "
                                   f"but got {out.dtype} instead")

    return check


def _install_checked_kernels():
    table = [
        # (ops, label, index of dim in the positional args after self, default dim)
        ((aten.amax.default, aten.amax.out), "amax()", 0, None, None),
        ((aten.amin.default, aten.amin.out), "amin()", 0, None, None),
        ((aten.aminmax.default, aten.aminmax.out), "aminmax", 99, None, None),
        ((aten.argmax.default, aten.argmax.out), "argmax()", 0, None, IndexError),
        ((aten.argmin.default, aten.argmin.out), "argmin()", 0, None, IndexError),
        ((aten.max.dim, aten.max.dim_max), "max()", 0, None, None),
        ((aten.min.dim, aten.min.dim_min), "min()", 0, None, None),
        ((aten.kthvalue.default, aten.kthvalue.values), "kthvalue()", 1, -1, None),
    ]
    for ops, label, dim_at, default, any_dim in table:
        for op in ops:
            core.KERNELS.setdefault(op, core.checked_kernel(
                op, _reduction_check(op, label, dim_at, default, any_dim)))


_install_checked_kernels()


def _arg_extreme(x, axis, largest):
    """First index of the max (min) along `axis`; a NaN counts as the extreme."""
    f = lax.argmax if largest else lax.argmin
    return _idx(f(_orderable(x), axis, jnp.int32))


def _extreme_with_index(x, axis, largest):
    """(max, first index of it) along `axis` in one variadic reduction.

    NaN counts as the extreme; among equal values the lower index wins. The
    choice is a max over a total order of (value, index), so XLA may combine
    in any order.
    """
    xs = _orderable(x)
    idx = lax.broadcasted_iota(jnp.int32, xs.shape, axis)
    floating = _is_float(xs)
    if floating:
        init = -jnp.inf if largest else jnp.inf
    else:
        info = jnp.iinfo(xs.dtype)
        init = info.min if largest else info.max
    init_v = jnp.asarray(init, xs.dtype)
    init_i = jnp.asarray(np.iinfo(np.int32).max, jnp.int32)

    def combine(a, b):
        av, ai = a
        bv, bi = b
        strict = av > bv if largest else av < bv
        tie = (av == bv) & (ai < bi)
        if floating:
            an, bn = jnp.isnan(av), jnp.isnan(bv)
            tie = tie | (an & bn & (ai < bi))
            strict = (strict & ~bn) | (an & ~bn)
        take_a = strict | tie
        return jnp.where(take_a, av, bv), jnp.where(take_a, ai, bi)

    v, i = lax.reduce((xs, idx), (init_v, init_i), combine, (axis,))
    return v.astype(x.dtype), _idx(i)


def _value_and_index(x, dim, keepdim, largest):
    _no_complex(x, "max" if largest else "min")
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    v, i = _extreme_with_index(x, d, largest)
    if keepdim:
        return jnp.expand_dims(v, d), jnp.expand_dims(i, d)
    return v, i


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _value_and_index(x, dim, keepdim, True)


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _value_and_index(x, dim, keepdim, False)


def _argminmax(x, dim, keepdim, largest):
    name = "argmax" if largest else "argmin"
    _no_complex(x, name)
    if x.dtype == jnp.bool_:
        raise RuntimeError(f"{name}(): does not support bool input")
    if dim is not None:
        wrap_dim(dim, x.ndim)
    if dim is None or x.ndim == 0:
        # Flattened index; with keepdim the executor broadcasts to all-ones shape.
        return _arg_extreme(x.reshape(-1), 0, largest)
    d = wrap_dim(dim, x.ndim)
    i = _arg_extreme(x, d, largest)
    return jnp.expand_dims(i, d) if keepdim else i


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _argminmax(x, dim, keepdim, True)


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _argminmax(x, dim, keepdim, False)


# -- all/any, count_nonzero ------------------------------------------------------


def _truth(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lower(aten.all.default, aten.all.dim)
def all_(x, dim=None, keepdim=False):
    return jnp.all(_truth(x), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.all.dims)
def all_dims(x, dim=None, keepdim=False):
    return jnp.all(_truth(x), axis=_axes(x, dim, empty_means_all=False), keepdims=keepdim)


@lower(aten.any.default, aten.any.dim)
def any_(x, dim=None, keepdim=False):
    return jnp.any(_truth(x), axis=_axes(x, dim), keepdims=keepdim)


@lower(aten.any.dims)
def any_dims(x, dim=None, keepdim=False):
    return jnp.any(_truth(x), axis=_axes(x, dim, empty_means_all=False), keepdims=keepdim)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(_truth(x), axis=_axes(x, dim), dtype=jnp.int64)


# -- var/std ---------------------------------------------------------------------


def _var_mean(x, dim, correction, keepdim):
    if not (_is_float(x) or _is_complex(x)):
        raise RuntimeError("std and var only support floating point and complex dtypes")
    axes = _axes(x, dim)
    n = _count(x, axes)
    xa = x.astype(opmath_dtype(x.dtype))
    m = jnp.sum(xa, axis=axes, keepdims=True) / n
    d = xa - m
    sq = d.real * d.real + d.imag * d.imag if _is_complex(d) else d * d
    c = 1 if correction is None else correction
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - c, 0)
    if not keepdim:
        m = jnp.squeeze(m, axes)
    return var, m


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, correction, keepdim)[0])


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


# -- norms -------------------------------------------------------------------------


def _norm_branches(axes, keepdim):
    def red(f):
        return lambda a, p: f(a, p)

    def pnorm(a, p):
        return jnp.sum(a ** p, axis=axes, keepdims=keepdim) ** (1 / p)

    return [
        red(lambda a, p: jnp.max(a, axis=axes, keepdims=keepdim, initial=0)),        # inf
        red(lambda a, p: jnp.min(a, axis=axes, keepdims=keepdim, initial=jnp.inf)),  # -inf
        red(lambda a, p: jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)),  # 0
        red(lambda a, p: jnp.sum(a, axis=axes, keepdims=keepdim)),                   # 1
        red(lambda a, p: jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))),     # 2
        pnorm,
    ]


def _branch_of(p):
    if p == math.inf:
        return 0
    if p == -math.inf:
        return 1
    return {0: 2, 1: 3, 2: 4}.get(p, 5)


@lower(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    od = out_dtype()
    if dtype is not None:
        x = x.astype(st.TORCH_TO_JAX[dtype])
    axes = _axes(x, dim)
    a = jnp.abs(x).astype(opmath_dtype(od))
    branches = _norm_branches(axes, keepdim)
    # max/min of |x| over an empty set: PyTorch's meta kernel already rejects
    # inf/-inf norms of empty inputs; `initial` only makes tracing total.
    if isinstance(ord, (int, float)):
        return branches[_branch_of(ord)](a, ord)
    # `ord` is a runtime scalar: pick the formula inside the program.
    p = jnp.asarray(ord, jnp.float64 if a.dtype == jnp.float64 else jnp.float32)
    which = jnp.select([p == jnp.inf, p == -jnp.inf, p == 0, p == 1, p == 2],
                       [0, 1, 2, 3, 4], 5).astype(jnp.int32)
    return lax.switch(which, branches, a, p.astype(a.dtype))


@lower(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype,
       aten.norm.ScalarOpt_dtype)
def norm(x, p=2, dim=None, keepdim=False, *, dtype=None):
    return linalg_vector_norm(x, 2 if p is None else p, dim, keepdim, dtype=dtype)


# -- logsumexp, softmax -------------------------------------------------------------


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    od = out_dtype()
    xa = x.astype(opmath_dtype(od))
    axes = _axes(xa, dim)
    # Complex: shift by the largest real part (the result's imaginary part is
    # then the principal argument of the sum, as on CPU).
    m = jnp.max(xa.real, axis=axes, keepdims=True, initial=-jnp.inf)
    m = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m)
    r = jnp.log(jnp.sum(jnp.exp(xa - m), axis=axes, keepdims=True)) + m
    return r if keepdim else jnp.squeeze(r, axes)


def _softmax_axes(x, dim):
    d = wrap_dim(dim, x.ndim)
    return () if x.ndim == 0 else (d,)


def _reject_softmax(x, dim, name):
    """CPU's dtype check of (log_)softmax, which its kernels make only when there is
    something to compute (an empty integer or complex input is returned as it is),
    named after the kernel CPU picks for the dimension."""
    if x.size:
        last = x.ndim == 0 or wrap_dim(dim, x.ndim) == x.ndim - 1
        reject(x, f"{name}{'_lastdim' if last else ''}_kernel_impl", complex_=True,
               integer=True)


@lower(aten._softmax.default)
def _softmax(x, dim, half_to_float):
    _reject_softmax(x, dim, "softmax")
    xa = x.astype(opmath_dtype(x.dtype))
    axes = _softmax_axes(xa, dim)
    if xa.size == 0:
        return xa
    e = jnp.exp(xa - jnp.max(xa, axis=axes, keepdims=True))
    return e / jnp.sum(e, axis=axes, keepdims=True)


@lower(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float):
    _reject_softmax(x, dim, "log_softmax")
    xa = x.astype(opmath_dtype(x.dtype))
    axes = _softmax_axes(xa, dim)
    if xa.size == 0:
        return xa
    s = xa - jnp.max(xa, axis=axes, keepdims=True)
    return s - jnp.log(jnp.sum(jnp.exp(s), axis=axes, keepdims=True))


@lower(aten._safe_softmax.default)
def _safe_softmax(x, dim, dtype=None):
    """Softmax whose fully masked (all -inf) rows are 0 instead of NaN (SDPA)."""
    if dtype is not None:
        x = x.astype(st.TORCH_TO_JAX[dtype])
    y = _softmax(x, dim, False)
    if y.size == 0:
        return y
    axes = _softmax_axes(x, dim)
    masked = jnp.all(x == -jnp.inf, axis=axes, keepdims=True)
    return jnp.where(masked, jnp.zeros((), y.dtype), y)


@lower(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    acc = opmath_dtype(grad_output.dtype)
    g, y = grad_output.astype(acc), output.astype(acc)
    axes = _softmax_axes(g, dim)
    return y * (g - jnp.sum(g * y, axis=axes, keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    acc = opmath_dtype(grad_output.dtype)
    g, y = grad_output.astype(acc), output.astype(acc)
    axes = _softmax_axes(g, dim)
    return g - jnp.exp(y) * jnp.sum(g, axis=axes, keepdims=True)


# -- scans -----------------------------------------------------------------------------


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    xa = x.astype(opmath_dtype(out_dtype()))
    d = _axis(x, dim)
    return xa if d is None else jnp.cumsum(xa, axis=d)


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    xa = x.astype(opmath_dtype(out_dtype()))
    d = _axis(x, dim)
    return xa if d is None else jnp.cumprod(xa, axis=d)


@lower(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(x, dim):
    reject(x, "logcumsumexp", integer=True)
    xa = x.astype(opmath_dtype(out_dtype()))
    d = _axis(x, dim)
    if d is None or xa.shape[d] == 0:
        return xa
    if _is_complex(xa):
        return lax.associative_scan(_complex_logaddexp, xa, axis=d)
    return lax.cumlogsumexp(xa, axis=d)


def _complex_logaddexp(a, b):
    # log(exp(a) + exp(b)) for complex a, b, shifted by the larger real part.
    big = jnp.where(a.real >= b.real, a, b)
    small = jnp.where(a.real >= b.real, b, a)
    inf = jnp.isinf(big.real) & (big.real < 0)
    r = big + jnp.log1p(jnp.exp(small - big))
    return jnp.where(inf, big, r)


def _cum_extreme(x, dim, largest):
    """cummax/cummin: running extreme and the index of its latest occurrence.

    A NaN wins over everything and sticks; among equal values the later index
    wins (PyTorch's CPU kernel uses >= / <=). Under these rules the combine is
    a max over a total order of (value, index) pairs, hence associative.
    """
    reject(x, "cummax" if largest else "cummin", complex_=True)
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    xs = _orderable(x)
    idx = lax.broadcasted_iota(jnp.int32, xs.shape, d)
    if xs.shape[d] == 0:
        return x, _idx(idx)
    floating = _is_float(xs)

    def combine(a, b):
        av, ai = a
        bv, bi = b
        better = bv >= av if largest else bv <= av
        if floating:
            better = jnp.isnan(bv) | (~jnp.isnan(av) & better)
        return jnp.where(better, bv, av), jnp.where(better, bi, ai)

    v, i = lax.associative_scan(combine, (xs, idx), axis=d)
    return v.astype(x.dtype), _idx(i)


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, True)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, False)


# -- order statistics: median, nanmedian, kthvalue, mode -------------------------------


def _sorted_last(x):
    """Stable ascending sort along the last axis (NaN last) with source indices."""
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    v, i = lax.sort((_orderable(x), iota), dimension=x.ndim - 1, is_stable=True, num_keys=1)
    return v.astype(x.dtype), i


def _pick(v, i, pos, keepdim, d):
    """Values/indices at sorted position `pos` (shape: batch + (1,)), axis moved back."""
    val = jnp.take_along_axis(v, pos, axis=-1)
    ind = _idx(jnp.take_along_axis(i, pos, axis=-1))
    val, ind = jnp.moveaxis(val, -1, d), jnp.moveaxis(ind, -1, d)
    if not keepdim:
        val, ind = jnp.squeeze(val, d), jnp.squeeze(ind, d)
    return val, ind


def _median_pos(x, n, ignore_nan):
    """Sorted position of the (lower) median along the last axis."""
    if not _is_float(x):
        return jnp.full(x.shape[:-1] + (1,), (n - 1) // 2, jnp.int32)
    nans = jnp.sum(jnp.isnan(x), axis=-1, keepdims=True, dtype=jnp.int32)
    if ignore_nan:
        valid = n - nans
        # All NaN: the first NaN (PyTorch's index here depends on its
        # nth_element's internals; its value is NaN either way).
        return jnp.where(valid > 0, (valid - 1) // 2, 0)
    # Any NaN: the result is the first NaN (stable sort keeps NaNs in order, last).
    return jnp.where(nans > 0, n - nans, (n - 1) // 2)


def _check_reduced_size(x, d, name):
    if x.ndim and x.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def _empty_pair(x, d, keepdim):
    """(values, indices) of a selection along `d` when nothing is selected."""
    shape = list(x.shape)
    if keepdim:
        shape[d] = 1
    else:
        del shape[d]
    return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)


def _median_dim(x, dim, keepdim, ignore_nan):
    reject(x, "median", complex_=True, bool_=True)
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    _check_reduced_size(x, d, "nanmedian" if ignore_nan else "median")
    if x.size == 0:
        return _empty_pair(x, d, keepdim)
    xm = jnp.moveaxis(x, d, -1)
    v, i = _sorted_last(xm)
    return _pick(v, i, _median_pos(xm, xm.shape[-1], ignore_nan), keepdim, d)


def _median_all(x, ignore_nan):
    reject(x, "median", complex_=True, bool_=True)
    flat = x.reshape(-1)
    n = flat.shape[0]
    if n == 0:
        return jnp.full((), jnp.nan, x.dtype) if _is_float(x) else jnp.zeros((), x.dtype)
    v, _ = _sorted_last(flat)
    return jnp.take(v, _median_pos(flat, n, ignore_nan)[0])


@lower(aten.median.default)
def median(x):
    return _median_all(x, False)


@lower(aten.nanmedian.default)
def nanmedian(x):
    return _median_all(x, True)


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, False)


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, True)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    reject(x, "kthvalue", complex_=True, bool_=True)
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    xm = jnp.moveaxis(x, d, -1)
    _check_reduced_size(x, d, "kthvalue")
    if xm.size == 0:
        return _empty_pair(x, d, keepdim)
    v, i = _sorted_last(xm)
    pos = jnp.full(xm.shape[:-1] + (1,), k - 1, jnp.int32)
    return _pick(v, i, pos, keepdim, d)


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """Most frequent value (smallest among ties) and its last index."""
    reject(x, "mode", complex_=True)
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    xm = jnp.moveaxis(x, d, -1)
    n = xm.shape[-1]
    _check_reduced_size(x, d, "mode")
    if xm.size == 0:
        return _empty_pair(x, d, keepdim)
    v, i = _sorted_last(xm)
    last = xm.ndim - 1
    pos = lax.broadcasted_iota(jnp.int32, v.shape, last)
    vs = _orderable(v)
    same_prev = jnp.concatenate(
        [jnp.zeros(v.shape[:-1] + (1,), bool), vs[..., 1:] == vs[..., :-1]], axis=-1)
    same_next = jnp.concatenate(
        [vs[..., 1:] == vs[..., :-1], jnp.zeros(v.shape[:-1] + (1,), bool)], axis=-1)
    start = lax.cummax(jnp.where(same_prev, 0, pos), axis=last)
    end = lax.cummin(jnp.where(same_next, n - 1, pos), axis=last, reverse=True)
    count = end - start + 1
    best = lax.argmax(count, last, jnp.int32)[..., None]  # first run of max length
    return _pick(v, i, jnp.take_along_axis(end, best, axis=-1), keepdim, d)


# -- segment_reduce --------------------------------------------------------------------
#
# PyTorch CPU (SegmentReduce.cpp): along `axis`, consecutive segments given by
# `lengths` (..., S) or `offsets` (..., S + 1), the leading dimensions those of
# `data`. Each segment starts from `initial` (or the reduction's identity;
# mean of an empty segment without `initial` is NaN), max/min propagate NaN,
# mean divides the sum (initial included) by the length. Elements past the
# last segment (unsafe=True with short lengths) are ignored. Known
# difference: the unsafe=False value checks (negative lengths, lengths not
# summing to the axis size) would need a device-to-host read, and are not made.

_SEGMENT_REDUCTIONS = ("max", "mean", "min", "sum", "prod")


def _segment_layout(data, lengths, offsets, axis):
    """(O, A, I) view of data, per-position segment ids into O * S (O * S =
    outside every segment), and the (O, S) segment lengths."""
    axis = wrap_dim(axis, data.ndim)
    outer = int(np.prod(data.shape[:axis]))
    a = data.shape[axis]
    inner = int(np.prod(data.shape[axis + 1:]))
    x = data.reshape(outer, a, inner)
    if lengths is not None:
        n_seg = lengths.shape[-1]
        ln = lengths.reshape(-1, n_seg).astype(jnp.int64)
        ends = jnp.cumsum(ln, axis=1)
        starts = ends - ln
    else:
        n_seg = offsets.shape[-1] - 1
        off = offsets.reshape(-1, n_seg + 1).astype(jnp.int64)
        starts, ends = off[:, :-1], off[:, 1:]
        ln = ends - starts
    ln = jnp.broadcast_to(ln, (outer, n_seg))
    starts = jnp.broadcast_to(starts, (outer, n_seg))
    ends = jnp.broadcast_to(ends, (outer, n_seg))
    pos = jnp.arange(a, dtype=jnp.int64)
    if n_seg == 0:
        seg = jnp.zeros((outer, a), jnp.int64)
        inside = jnp.zeros((outer, a), bool)
    else:
        seg = jnp.sum(ends[:, None, :] <= pos[None, :, None], axis=-1)
        inside = (seg < n_seg) & (pos[None, :] >= starts[:, :1])
    ids = jnp.where(inside, jnp.arange(outer)[:, None] * n_seg + seg, outer * n_seg)
    return x, ids.reshape(-1), ln, (outer, n_seg, inner), axis


def _segment_out_shape(data, axis, n_seg):
    return data.shape[:axis] + (n_seg,) + data.shape[axis + 1:]


_HALF_BITS = {np.dtype(jnp.bfloat16): (8, 7), np.dtype(jnp.float16): (5, 10)}


def _segment_scan(x, ids, nseg, start, op, half):
    """Sequential per-segment accumulation of x (O, A, I), rounding to the half
    type after every step as CPU's scalar_t arithmetic; (nseg - 1, I) results,
    `start` for empty segments."""
    outer, a, inner = x.shape
    res = jnp.broadcast_to(start, (nseg - 1, inner)).astype(x.dtype)
    if a == 0 or outer == 0:
        return res
    prev = jnp.concatenate([jnp.full((outer, 1), -1, ids.dtype), ids[:, :-1]], axis=1)
    nxt = jnp.concatenate([ids[:, 1:], jnp.full((outer, 1), -1, ids.dtype)], axis=1)
    reset = ids != prev

    def step(carry, inp):
        xa, ra = inp
        carry = jnp.where(ra[:, None], jnp.broadcast_to(start, carry.shape), carry)
        carry = lax.reduce_precision(op(carry, xa), *half)
        return carry, carry

    init = jnp.broadcast_to(start, (outer, inner)).astype(x.dtype)
    _, run = lax.scan(step, init, (jnp.swapaxes(x, 0, 1), reset.T))
    run = jnp.swapaxes(run, 0, 1).reshape(outer * a, inner)
    last = ((ids != nxt) & (ids < nseg - 1)).reshape(-1)
    return res.at[jnp.where(last, ids.reshape(-1), nseg)].set(run, mode="drop")


@lower(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    torch._check(reduce in _SEGMENT_REDUCTIONS,
                 lambda: f"unsupported reduction given! {reduce}")
    torch._check(lengths is not None or offsets is not None,
                 lambda: "segment_reduce(): Either lengths or offsets must be defined.")
    reject(data, "_segment_reduce_cpu", complex_=True, integer=True)
    x, ids, ln, (outer, n_seg, inner), axis = _segment_layout(data, lengths, offsets, axis)
    acc = opmath_dtype(data.dtype)
    rows = x.reshape(outer * x.shape[1], inner).astype(acc)
    nseg = outer * n_seg + 1
    ln = ln.reshape(-1, 1)
    if initial is not None:
        init = jnp.asarray(initial).astype(data.dtype).astype(acc)
    half = _HALF_BITS.get(np.dtype(data.dtype))
    if half and reduce in ("sum", "mean", "prod"):
        # CPU accumulates in the half type: every step rounds
        start = init if initial is not None else jnp.asarray(1 if reduce == "prod" else 0, acc)
        r = _segment_scan(rows.reshape(outer, -1, inner), ids.reshape(outer, -1), nseg, start,
                          jnp.multiply if reduce == "prod" else jnp.add, half)
        if reduce == "mean":
            q = lax.reduce_precision(r / jnp.maximum(ln, 1).astype(acc), *half)
            r = jnp.where((ln > 0) & ~jnp.isnan(r), q, r)
            if initial is None:
                r = jnp.where(ln == 0, jnp.nan, r)
    elif reduce in ("sum", "mean"):
        r = jax.ops.segment_sum(rows, ids, num_segments=nseg)[:-1]
        if initial is not None:
            r = init + r
        if reduce == "mean":
            r = jnp.where((ln > 0) & ~jnp.isnan(r), r / jnp.maximum(ln, 1).astype(acc), r)
            if initial is None:
                r = jnp.where(ln == 0, jnp.nan, r)
    elif reduce == "prod":
        r = jax.ops.segment_prod(rows, ids, num_segments=nseg)[:-1]
        if initial is not None:
            r = init * r
    else:
        seg_fn = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        r = seg_fn(rows, ids, num_segments=nseg)[:-1]
        if initial is not None:
            r = (jnp.maximum if reduce == "max" else jnp.minimum)(init, r)
        has_nan = jax.ops.segment_max(jnp.isnan(rows).astype(jnp.int32), ids,
                                      num_segments=nseg)[:-1] > 0
        r = jnp.where(has_nan, jnp.nan, r)
        if initial is None:  # empty segments: -inf / inf
            r = jnp.where(ln == 0, -jnp.inf if reduce == "max" else jnp.inf, r)
    return r.reshape(_segment_out_shape(data, axis, n_seg)).astype(data.dtype)


@lower(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None,
                            axis=0, initial=None):
    torch._check(reduce in _SEGMENT_REDUCTIONS,
                 lambda: f"unsupported reduction given! {reduce}")
    torch._check(lengths is not None or offsets is not None,
                 lambda: "segment_reduce(): Either lengths or offsets must be defined")
    x, ids, ln, (outer, n_seg, inner), axis = _segment_layout(data, lengths, offsets, axis)
    acc = opmath_dtype(grad.dtype)
    n = outer * x.shape[1]
    rows = x.reshape(n, inner).astype(acc)
    nseg = outer * n_seg + 1
    inside = (ids < outer * n_seg)[:, None]
    safe = jnp.minimum(ids, max(outer * n_seg - 1, 0))

    def at_pos(v):  # a per-segment (O * S, ...) value at every position
        if outer * n_seg == 0:
            return jnp.zeros((n,) + v.shape[1:], v.dtype)
        return v[safe]

    g = at_pos(grad.reshape(outer * n_seg, inner).astype(acc))
    out = at_pos(output.reshape(outer * n_seg, inner).astype(acc))
    ln_pos = at_pos(ln.reshape(-1, 1)).astype(acc)
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        gi = g / jnp.maximum(ln_pos, 1)
    elif reduce in ("max", "min"):
        hit = jnp.isnan(rows) | (rows == out)
        gi = jnp.where(hit, g, 0)
        cnt = at_pos(jax.ops.segment_sum(hit.astype(acc), ids, num_segments=nseg)[:-1])
        # CPU divides only the positive gradients among ties by their count
        gi = jnp.where((cnt >= 2) & (gi > 0), gi / jnp.maximum(cnt, 1), gi)
    else:  # prod
        zero, nan = rows == 0, jnp.isnan(rows)
        special = zero | nan
        p_rest = jax.ops.segment_prod(jnp.where(special, 1, rows), ids, num_segments=nseg)[:-1]
        if initial is not None:
            p_rest = jnp.asarray(initial).astype(grad.dtype).astype(acc) * p_rest
        zeros = jax.ops.segment_sum(zero.astype(jnp.int32), ids, num_segments=nseg)[:-1]
        nans = jax.ops.segment_sum(nan.astype(jnp.int32), ids, num_segments=nseg)[:-1]
        excl = at_pos(p_rest)
        excl = jnp.where(at_pos(zeros) - zero.astype(jnp.int32) > 0, excl * 0, excl)
        excl = jnp.where(at_pos(nans) - nan.astype(jnp.int32) > 0, jnp.nan, excl)
        gi = jnp.where(special, g * excl, (g * out) / jnp.where(special, 1, rows))
    gi = jnp.where(inside, gi, 0)
    return gi.reshape(data.shape).astype(grad.dtype)
