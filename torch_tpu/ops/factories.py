"""Factory lowerings: fill/zero, full/zeros/ones, arange, linspace, logspace,
eye, scalar_tensor, tril/triu_indices.

`empty_like`, `zeros_like`, `ones_like`, `full_like`, `rand_like` and friends
are CompositeExplicitAutograd: PyTorch runs them as `empty_like` (which keeps
the input's strides) followed by `zero_`/`fill_`/`uniform_`, all of which are
lowered, so they are not lowered again here.

`arange` is special: its length depends on the values of its `Scalar`
arguments, which the executor passes to executables as runtime values (so a
new start does not recompile). Its eager kernel therefore asks PyTorch's meta
kernel for the length and keys its own small executable cache on it. The
table lowering (for graphs) reads the length from the output metadata.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import core
from .registry import lower, out_dtype, out_meta
from ..runtime import keys, overlap, platform, programs, verdict
from ..runtime import storage as st

aten = torch.ops.aten


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return jnp.full(x.shape, value, out_dtype())


@lower(aten.zero.default)
def zero(x):
    return jnp.zeros(x.shape, x.dtype)


def _full(shape, value, dtype):
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.complexfloating) and not jnp.issubdtype(
            dtype, jnp.complexfloating):
        value = jnp.real(value)
    if dtype == jnp.bool_:
        value = value != 0
    return jnp.full(shape, value.astype(dtype), dtype)


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(tuple(size), fill_value, out_dtype())


# The fill value is a host Scalar: CPU converts it with an overflow check
# (`torch.full((2,), nan, dtype=torch.int64)` raises), so the eager kernels
# check it before running (full.out decomposes to fill_). Graphs keep the bare
# lowerings.
def _full_dtype(fill_value, dtype):
    if dtype is not None:
        return dtype
    if isinstance(fill_value, bool):
        return torch.bool
    if isinstance(fill_value, int):
        return torch.int64
    if isinstance(fill_value, complex):
        return torch.complex128 if torch.get_default_dtype() == torch.float64 \
            else torch.complex64
    return torch.get_default_dtype()


def _check_full(size, fill_value, *, dtype=None, **_):
    core.check_scalar_fits(aten.full.default, fill_value, _full_dtype(fill_value, dtype))


def _check_fill(op):
    def check(self, value):
        core.check_scalar_fits(op, value, self.dtype)
    return check


core.KERNELS[aten.full.default] = core.checked_kernel(aten.full.default, _check_full)
for _op in (aten.fill.Scalar, aten.fill_.Scalar):
    core.KERNELS[_op] = core.checked_kernel(_op, _check_fill(_op))


# `_efficientzerotensor` (autograd's zero gradients, e.g. sgn's at 0) is a
# zero-filled tensor with the ZeroTensor key on CPU/CUDA, whose ops skip the
# work; here it is plain zeros: the same values, computed like any tensor.
@lower(aten.zeros.default, aten._efficientzerotensor.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), out_dtype())


@lower(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), out_dtype())


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full((), s, out_dtype())


@lower(aten.eye.default)
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=out_dtype())


@lower(aten.eye.m)
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=out_dtype())


# -- arange ----------------------------------------------------------------------------------


def _wide_float():
    return jnp.float64 if platform.supports_float64() else jnp.float32


def _arange_values(n, start, step, dtype):
    """start + step * i, i < n, computed like PyTorch's CPU kernel.

    Accumulation: int64 for integer outputs (start and step truncated to
    integers first), double for float32/float64 (float32 where the platform
    has no float64), float for the half types.
    """
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        s = jnp.trunc(jnp.asarray(start)).astype(jnp.int64)
        d = jnp.trunc(jnp.asarray(step)).astype(jnp.int64)
        return (s + d * jnp.arange(n, dtype=jnp.int64)).astype(dtype)
    acc = jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else _wide_float()
    if jnp.issubdtype(dtype, jnp.complexfloating):
        acc = dtype
    i = jnp.arange(n, dtype=acc)
    return (jnp.asarray(start).astype(acc) + jnp.asarray(step).astype(acc) * i).astype(dtype)


@lower(aten.arange.default)
def arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_values(out_meta().shape[0], 0, 1, out_dtype())


@lower(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_values(out_meta().shape[0], start, 1, out_dtype())


@lower(aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_values(out_meta().shape[0], start, step, out_dtype())


def _arange_array(n, start, step, torch_dtype, index):
    jd = st.TORCH_TO_JAX[torch_dtype]
    key = keys.helper_key(programs.ProgramKind.ARANGE, n, torch_dtype, type(start), type(step),
                          index)
    sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(index))
    if not platform.supports_float64():  # no f64 program inputs where f64 does not exist
        start, step = (np.float32(v) if isinstance(v, float) else v for v in (start, step))
    fn = programs.get_or_compile(
        key, jax.jit(lambda s, d: _arange_values(n, s, d, jd), out_shardings=sharding),
        (start, step))
    return fn(start, step)


def _arange_kernel(start, end, step, dtype, device):
    meta = aten.arange.start_step(start, end, step, dtype=dtype, device="meta")
    index = core.device_index(device)
    arr = _arange_array(meta.shape[0], start, step, meta.dtype, index)
    return st.wrap(arr, index, meta.dtype)


def _k_arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_kernel(0, end, 1, dtype, device)


def _k_arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_kernel(start, end, 1, dtype, device)


def _k_arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None,
                         pin_memory=None):
    return _arange_kernel(start, end, step, dtype, device)


def _check_out_not_expanded(op, out):
    """CPU's nullary TensorIterator check of a factory's out= tensor."""
    if overlap.internal_overlap(out):
        raise RuntimeError(f"{verdict.INTERNAL_OVERLAP_TEXT} ({op})")


def _k_arange_out(start, end, step=1, *, out):
    meta = aten.arange.start_step(start, end, step, dtype=out.dtype, device="meta")
    n = meta.shape[0]
    if out.numel() != n:
        out.resize_((n,))
    _check_out_not_expanded(aten.arange.start_out, out)
    arr = _arange_array(n, start, step, out.dtype, out.device.index)
    core.assign(out, arr.reshape(tuple(out.shape)))
    return out


core.KERNELS[aten.arange.default] = _k_arange_end
core.KERNELS[aten.arange.start] = _k_arange_start
core.KERNELS[aten.arange.start_step] = _k_arange_start_step
core.KERNELS[aten.arange.start_out] = _k_arange_out


# -- linspace / logspace ------------------------------------------------------------------------


def linspace_exponents(start, end, steps, dtype):
    """PyTorch's CPU linspace: from start for the first half, from end for the rest
    (ops.sorting's histogram bin edges use it too)."""
    integral = jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_
    if integral:
        # Scalar::to<scalar_t>: truncated, then wrapped into the dtype (a
        # uint8 linspace from -9 starts at 247).
        start = jnp.trunc(jnp.asarray(start)).astype(jnp.int64).astype(dtype)
        end = jnp.trunc(jnp.asarray(end)).astype(jnp.int64).astype(dtype)
        comp = _wide_float()
    else:
        comp = dtype
    s = jnp.asarray(start).astype(comp)
    e = jnp.asarray(end).astype(comp)
    if steps == 1:
        return jnp.reshape(s, (1,)), comp
    step = (e - s) / jnp.asarray(steps - 1, comp)
    i = jnp.arange(steps)
    lo = s + step * i.astype(comp)
    hi = e - step * (steps - 1 - i).astype(comp)
    return jnp.where(i < steps // 2, lo, hi), comp


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
       aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = out_dtype()
    if steps == 0:
        return jnp.zeros((0,), dt)
    vals, _ = linspace_exponents(start, end, steps, dt)
    return st.float_to_int(vals, dt) if jnp.issubdtype(dt, jnp.integer) else vals.astype(dt)


@lower(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
       aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None,
             pin_memory=None):
    dt = out_dtype()
    if steps == 0:
        return jnp.zeros((0,), dt)
    exps, comp = linspace_exponents(start, end, steps, dt)
    if jnp.issubdtype(dt, jnp.integer):
        return st.float_to_int(jnp.power(jnp.asarray(base, comp), exps), dt)
    return jnp.power(jnp.asarray(base).astype(dt), exps.astype(dt)).astype(dt)


def _space_out_kernel(out_op):
    """CPU's linspace/logspace out= (at::native linspace_out): `out` keeps its
    shape when it has `steps` elements (else it becomes 1-D of `steps`), and
    takes the values in its own row-major order, through the view it may be
    (the executor's derived out= would resize it to PyTorch's meta shape, and
    a non-contiguous view resized so writes past its elements)."""
    overload = out_op._overloadname.removesuffix("out").removesuffix("_") or "default"
    functional = getattr(getattr(aten, out_op._schema.name.split("::")[1]), overload)

    def kernel(*args, out, **kwargs):
        values = functional(*args, **kwargs, dtype=out.dtype, device=out.device)
        if out.numel() != values.numel():
            out.resize_(tuple(values.shape))
        _check_out_not_expanded(out_op, out)
        aten.copy_.default(out, values.reshape(tuple(out.shape)))
        return out

    kernel.__name__ = str(out_op)
    return kernel


for _op in (aten.linspace.out, aten.linspace.Tensor_Tensor_out, aten.linspace.Tensor_Scalar_out,
            aten.linspace.Scalar_Tensor_out, aten.logspace.out, aten.logspace.Tensor_Tensor_out,
            aten.logspace.Tensor_Scalar_out, aten.logspace.Scalar_Tensor_out):
    core.KERNELS[_op] = _space_out_kernel(_op)


# -- tril / triu indices ---------------------------------------------------------------------------


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    r, c = np.tril_indices(row, offset, col) if row and col else (np.zeros(0), np.zeros(0))
    return jnp.asarray(np.stack([r, c]).astype(np.int64)).astype(out_dtype())


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    r, c = np.triu_indices(row, offset, col) if row and col else (np.zeros(0), np.zeros(0))
    return jnp.asarray(np.stack([r, c]).astype(np.int64)).astype(out_dtype())
