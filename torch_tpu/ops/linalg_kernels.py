"""Linear algebra's Python kernels: what runs in front of the lowerings.

- PyTorch CPU's error text for the matrix products, where the Python meta
  kernels word it differently (the runner is called; on an error only, CPU is
  asked);
- lstsq and geqrf, which have no meta kernel (and lstsq's results depend on
  the computed ranks): PyTorch's argument checks by hand with CPU's messages,
  then one cached executable for the math (executor.run_program);
- eig, which XLA implements on the CPU platform only.

The lowerings themselves are in linalg.py (and ldl.py).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from . import core, fallback, linalg
from .._compat import torch_api
from ..runtime import executor, platform, programs
from ..runtime import storage as st

aten = torch.ops.aten


# -- PyTorch's CPU error messages for the matrix products ---------------------------------------
#
# The executor checks arguments with PyTorch's Python meta kernels, whose
# messages differ from the CPU's for the matmul family ("a and b must have same
# reduction dim" instead of "mat1 and mat2 shapes cannot be multiplied"). On
# an error (only then), run the CPU kernel on empty tensors of the same shapes
# and raise its message.


# RuntimeErrors that are not about the arguments: CPU is not asked (it would try
# to allocate the result that did not fit the device).
_NOT_ARGUMENT_ERRORS = (torch.OutOfMemoryError, NotImplementedError)


def _cpu_error_kernel(op):
    pytree = torch_api.pytree

    def kernel(*args, **kwargs):

        try:
            return executor.runner_for(op)(*args, **kwargs)
        except _NOT_ARGUMENT_ERRORS:
            raise  # a result too big for the device, no lowering: not a bad call
        except RuntimeError as err:
            def cpu(t):
                if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                    return torch.empty(tuple(t.shape), dtype=t.dtype)
                return t

            cargs, ckwargs = pytree.tree_map(cpu, (args, kwargs))
            try:
                op(*cargs, **ckwargs)
            except RuntimeError as cpu_err:
                raise RuntimeError(f"{op}: {cpu_err}") from None
            raise err

    kernel.__name__ = str(op)
    # A cache hit is the runner's call (the rewording above is for its misses):
    # the native kernel may run hits itself (executor.install_kernel).
    kernel.hits_as_runner = True
    return kernel


for _op in (aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default,
            aten.vdot.default, aten.addmm.default, aten.addmv.default, aten.baddbmm.default,
            aten.addbmm.default, aten.addr.default):
    core.KERNELS[_op] = _cpu_error_kernel(_op)


# -- kernels with data-dependent or meta-less outputs ------------------------------------------
#
# PyTorch has no Meta kernel for linalg_lstsq or geqrf, and lstsq's residuals
# exist or not depending on the computed ranks (gelsd/gelss). These run as
# Python kernels: PyTorch's argument checks by hand, then one cached XLA
# executable for the math (`_run`), then tensors around its results.

def _run(name, fn, tensors, static=()):
    """Run jax function fn(*arrays, *static) on the tpu tensors' values, as
    one cached executable (executor.run_program)."""
    return executor.run_program(programs.ProgramKind.LINALG, name, fn,
                                [core.device_value(t) for t in tensors],
                                tensors[0].device.index, static)


def _wrap_out(arr, like, dtype=None):

    return st.wrap(arr, like.device.index, dtype)


def _torch_dtype_name(dt):
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble", torch.int32: "Int", torch.int64: "Long",
            torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool"}.get(dt, str(dt))


def _broadcast_batch(a, b):
    """Broadcast two batch shapes with PyTorch's error message."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a2, b2 = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(a2, b2)):
        if x != y and x != 1 and y != 1:
            raise RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) "
                               f"at non-singleton dimension {i}")
        out.append(y if x == 1 else x)
    return tuple(out)


def _lstsq_math(a_own, a, b, rcond, driver, work):
    """(solution, residuals, rank, singular values) of batched A X = B (all computed).

    rank and singular values are those of `a_own` (A without the batch
    broadcast against B, as PyTorch returns them).
    """
    dt = a.dtype
    real = jnp.finfo(dt).dtype
    hi = lax.Precision.HIGHEST
    a = a.astype(work)
    b = b.astype(work)
    m, n = a.shape[-2], a.shape[-1]
    s = lax.linalg.svd(a_own.astype(work), full_matrices=False, compute_uv=False)
    rank = jnp.sum(s > rcond * s[..., :1], axis=-1).astype(jnp.int64)

    def svd_solve():
        u, s2, vh = lax.linalg.svd(a, full_matrices=False, compute_uv=True)
        keep = s2 > rcond * s2[..., :1]
        sinv = jnp.where(keep, 1 / jnp.where(keep, s2, 1), 0).astype(work)
        utb = jnp.matmul(jnp.conj(jnp.matrix_transpose(u)), b, precision=hi)
        return jnp.matmul(jnp.conj(jnp.matrix_transpose(vh)) * sinv[..., None, :], utb, precision=hi), keep

    resid = jnp.zeros(b.shape[:-2] + (b.shape[-1],), real)
    if driver in ("gels", "gelsy"):
        # Householder QR (m >= n) or LQ (m < n), as LAPACK's gels: the least
        # squares / minimum-norm solution of a full-rank A.
        if m >= n:
            q, r = lax.linalg.qr(a, full_matrices=True)
            qtb = jnp.matmul(jnp.conj(jnp.matrix_transpose(q)), b, precision=hi)
            x = lax.linalg.triangular_solve(r[..., :n, :], qtb[..., :n, :], left_side=True,
                                            lower=False)
            # LAPACK's residuals: the squared norms of rows n: of Q^H B.
            resid = jnp.sum(jnp.abs(qtb[..., n:, :]) ** 2, axis=-2)
        else:
            q, r = lax.linalg.qr(jnp.conj(jnp.matrix_transpose(a)), full_matrices=False)  # A = R^H Q^H
            y = lax.linalg.triangular_solve(r, b, left_side=True, lower=False,
                                            transpose_a=True, conjugate_a=True)
            x = jnp.matmul(q, y, precision=hi)
        if driver == "gelsy":
            # A rank-deficient A: the minimum-norm solution of the SVD-truncated
            # problem. gelsy truncates a column-pivoted QR instead: the same
            # solution when the dropped part is at rounding level (a numerically
            # rank-deficient A), not when rcond cuts a sizeable singular value.
            x_svd, keep = svd_solve()
            x = jnp.where(jnp.all(keep, axis=-1)[..., None, None], x, x_svd)
    else:
        x, _ = svd_solve()
        if m > n:
            resid = jnp.sum(jnp.abs(jnp.matmul(a, x, precision=hi) - b) ** 2, axis=-2)
    return x.astype(dt), resid.astype(real), rank, s.astype(real)


def _lstsq_kernel(A, B, rcond=None, *, driver=None):
    name = "torch.linalg.lstsq"
    if A.dim() < 2:
        raise RuntimeError(f"{name}: input must have at least 2 dimensions.")
    if B.dim() < 1:
        raise RuntimeError(f"{name}: other must have at least 1 dimension.")
    if A.dtype != B.dtype:
        raise RuntimeError(f"{name}: Expected input and other to have the same dtype, but got "
                           f"input's dtype {_torch_dtype_name(A.dtype)} and other's dtype "
                           f"{_torch_dtype_name(B.dtype)}")
    if A.dim() - B.dim() not in (0, 1):
        raise RuntimeError(f"{name}: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    if B.device != A.device:
        raise RuntimeError(f"{name}: Expected other and input tensors to be on the same device, "
                           f"but got other on {B.device} and input on {A.device}")
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    m, n = A.shape[-2], A.shape[-1]
    if vector:
        if B.shape[-1] != m:
            raise RuntimeError(f"{name}: input.size(-2) should match other.size(-1)")
    elif B.shape[-2] != m:
        raise RuntimeError(f"{name}: input.size(-2) should match other.size(-2)")
    drv = "gelsy" if driver is None else driver
    if drv not in ("gels", "gelsy", "gelsd", "gelss"):
        raise RuntimeError(f"{name}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if A.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise RuntimeError("This function doesn't handle types other than float and double")
    real_t = A.real.dtype if A.is_complex() else A.dtype
    # The batch: A's against B's leading dims (all but the last one when B has
    # one dimension less than A, vector or not, as PyTorch does).
    b_batch = B.shape[:-1] if B.dim() == A.dim() - 1 else B.shape[:-2]
    batch = _broadcast_batch(A.shape[:-2], b_batch)
    k = 1 if vector else B.shape[-1]
    a_batch = tuple(A.shape[:-2])
    dev = A.device

    def zeros(shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=dev)

    rank_shape = a_batch if drv != "gels" else (0,)
    sv_shape = a_batch + (min(m, n),) if drv in ("gelsd", "gelss") else (0,)
    Bm = (B.unsqueeze(-1) if vector else B).expand(batch + (m, k))
    if m == 0 or n == 0 or k == 0 or 0 in batch or 0 in a_batch:
        # LAPACK returns at once: X = 0; the residuals PyTorch reads are zeros,
        # except gelsd/gelss with n == 0, which leave rows n: of B (all of B).
        sol = zeros(batch + (n, k), A.dtype)
        if m > n and drv != "gelsy":
            resid = ((Bm.abs() ** 2).sum(dim=-2).to(real_t) if n == 0 and drv != "gels"
                     else zeros(batch + (k,), real_t))
        else:
            resid = zeros((0,), real_t)
        return ((sol.squeeze(-1) if vector else sol), resid, zeros(rank_shape, torch.int64),
                zeros(sv_shape, real_t))
    eps = torch.finfo(real_t).eps
    rc = eps * max(m, n) if rcond is None else float(rcond)
    if rc < 0:
        rc = eps

    # Where the platform has float64, solve in it (closer to LAPACK's float32
    # results than a float32 solve by a different algorithm); TPUs: float32.
    wide = {torch.float32: jnp.float64, torch.complex64: jnp.complex128}
    work = wide.get(A.dtype) if platform.supports_float64() else None
    work = jnp.dtype(work or core.st.jax_dtype(A.dtype))
    x, resid, rank_b, s = _run("aten::linalg_lstsq", _lstsq_math,
                               [A, A.expand(batch + (m, n)), Bm], static=(rc, drv, work))
    sol = _wrap_out(x, A, A.dtype)
    if vector:
        sol = sol.squeeze(-1)
    rank_t = _wrap_out(rank_b, A, torch.int64)
    compute_resid = m > n and drv != "gelsy"
    if compute_resid and drv in ("gelsd", "gelss"):
        # PyTorch reads them only when every matrix has full column rank.
        compute_resid = bool(torch.all(rank_t == n).item())
    resid_t = _wrap_out(resid, A, real_t) if compute_resid else zeros((0,), real_t)
    if drv == "gels":
        rank_t = zeros((0,), torch.int64)
    s_t = _wrap_out(s, A, real_t) if drv in ("gelsd", "gelss") else zeros((0,), real_t)
    return sol, resid_t, rank_t, s_t


core.KERNELS[aten.linalg_lstsq.default] = _lstsq_kernel


# -- geqrf: PyTorch's checks, then linalg.geqrf_values -----------------------------------------


def _geqrf_kernel(A):
    if A.dim() < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    if A.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise RuntimeError(f'"geqrf_cpu" not implemented for \'{_torch_dtype_name(A.dtype)}\'')
    m, n = A.shape[-2], A.shape[-1]
    tau_shape = tuple(A.shape[:-2]) + (min(m, n),)
    if A.numel() == 0:
        return (torch.zeros(tuple(A.shape), dtype=A.dtype, device=A.device),
                torch.zeros(tau_shape, dtype=A.dtype, device=A.device))
    qr, tau = _run("aten::geqrf", linalg.geqrf_values, [A])
    return _wrap_out(qr, A, A.dtype), _wrap_out(tau, A, A.dtype)


core.KERNELS[aten.geqrf.default] = _geqrf_kernel


# -- eig: XLA implements the nonsymmetric eigensolver (LAPACK geev) on CPU only ------------------


def _cpu_platform_only_kernel(op):
    """Run `op`'s lowering on the CPU platform; elsewhere (XLA has no eig
    there) the CPU fallback runs it, or it raises NotImplementedError naming
    the op when the fallback is off."""
    def kernel(*args, **kwargs):
        if platform.platform() != "cpu":
            return fallback.cpu_fallback(op, *args, **kwargs)
        return executor.runner_for(op)(*args, **kwargs)

    kernel.__name__ = str(op)
    return kernel


for _op in (aten.linalg_eig.default, aten._linalg_eigvals.default):
    core.KERNELS[_op] = _cpu_platform_only_kernel(_op)
