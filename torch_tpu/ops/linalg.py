"""Linear algebra lowerings: matrix products and the torch.linalg kernels.

Matrix products use `precision=HIGHEST` for float32 (and complex64): on a TPU
the default precision multiplies float32 in bfloat16 passes, which is far from
what PyTorch's CPU (or CUDA without TF32) computes. HIGHEST keeps results
close to CPU; a later precision setting (torch.backends-style, from the debug
helper) can relax it. Half types (bfloat16/float16) multiply with float32
accumulation and round once at the end, as PyTorch's CPU kernels do.

Factorizations follow LAPACK's conventions, which is what PyTorch returns:
1-based int32 pivots, `info` the first zero pivot (LU) or the order of the
first leading minor that is not positive-definite (Cholesky).

The kernels in front of these lowerings (CPU's error text for the matrix
products, the Python kernels of lstsq and geqrf, eig on the CPU platform
only) are in linalg_kernels.py; the LDL^T factorization in ldl.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import core
from .._compat import jax_api
from .opmath import is_half, opmath_dtype, upcast
from .registry import arg_meta, lower, out_dtype, out_meta
from ..runtime.precision import lax_precision
from ..runtime import executor, platform, xla_flags

aten = torch.ops.aten




def _matmul(a, b, acc=None, stored=None):
    """a @ b accumulated in `acc` (default: the opmath type for half operands,
    the operands' own type otherwise); `stored`: b's meta tensor, how b is
    stored (registry.arg_meta), if known."""
    if acc is None and is_half(a.dtype):
        acc = opmath_dtype(a.dtype)
    if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_:
        return jnp.matmul(a, b, preferred_element_type=acc or a.dtype)

    via_f32 = _half_via_f32(a, b)

    def product(x, y):
        if via_f32:
            x, y = x.astype(jnp.float32), y.astype(jnp.float32)
        return jnp.matmul(x, y, precision=lax_precision(), preferred_element_type=acc)

    if stored is not None and is_half(a.dtype) and _stored_transposed(a, b, stored):
        return _against_stored(a, b, acc, product)
    return product(a, b)


def _half_via_f32(a, b):
    """Is a @ b a half-precision product that XLA:CPU computes fastest on
    float32 copies of its operands (xla_flags.cpu_half_dots_f32: a host
    without a native dot unit for the type)? Each output element is a
    float32-accumulated dot rounded once either way."""
    return (is_half(a.dtype) and b.dtype == a.dtype and platform.platform() == "cpu"
            and xla_flags.cpu_half_dots_f32(jnp.dtype(a.dtype).name))


def _stored_transposed(a, b, stored):
    """Is b = W.T with W's rows contiguous (a Linear's weight), by its strides?"""
    if a.ndim < 2 or b.ndim < 2 or stored.dim() != b.ndim:
        return False
    strides = stored.stride()
    k, n = b.shape[-2:]
    return (n >= 2 and all(isinstance(x, int) for x in strides[-2:]) and strides[-2] == 1
            and strides[-1] >= k)


def _against_stored(a, b, acc, product):
    """product(a, b), a half-precision product with b = W.T stored as W, in
    the form XLA:CPU computes fastest on this host (platform "cpu" only).

    - Hosts with AMX-BF16 or AVX512-BF16 (xla_flags.cpu_native_bf16_dots): XLA:CPU hands a
      bfloat16 dot to its XNNPACK fusion, which multiplies bfloat16 natively,
      only when the dot reads W as stored; `x @ W.T` as JAX writes it (a
      transpose, then the dot) is computed on float32 copies instead. So the
      dot contracts W's last axis directly: 10-16x faster for more than one
      row, no scratch. One row is computed as two (a zero row added) where W
      is wider than tall; otherwise XLA's fused loop over W is as fast.
    - Other hosts (or TORCH_TPU_CPU_HALF_DOTS_F32 on): XLA:CPU makes a float32, transposed copy of all of W when
      a has more than one row: 1 GB of scratch for a Llama LM head on every
      call, and 2-3x the time of cache-sized pieces. Large products are split
      along W's rows, in pieces of xla_flags.cpu_dot_piece_bytes() of
      float32, concatenated; pieces along the other axis, or of a b stored
      row-major (read without a copy), are slower than the whole product.

    Each output element's dot product is computed whole in float32 either way
    (docs/benchmarks.md, "Which bfloat16 dots get a float32 copy")."""
    if platform.platform() != "cpu":
        return product(a, b)
    k, n = b.shape[-2:]
    rows = a.shape[-2]
    if (a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16 and a.ndim == b.ndim
            and a.shape[:-2] == b.shape[:-2] and (rows >= 2 or k >= n)
            and xla_flags.cpu_native_bf16_dots() and not _half_via_f32(a, b)):
        w = jnp.swapaxes(b, -1, -2)  # W as stored (cancels the view's transpose)
        x = a if rows >= 2 else jnp.concatenate([a, jnp.zeros_like(a)], axis=-2)
        batch = tuple(range(a.ndim - 2))
        out = lax.dot_general(x, w, (((a.ndim - 1,), (a.ndim - 1,)), (batch, batch)),
                              precision=lax_precision(), preferred_element_type=acc)
        return out if rows >= 2 else lax.slice_in_dim(out, 0, 1, axis=a.ndim - 2)
    piece = xla_flags.cpu_dot_piece_bytes()
    if rows < 2 or not piece or b.size * 4 <= piece:
        return product(a, b)
    step = max(1, -(-n // _MAX_PIECES), n * piece // (b.size * 4))
    w = jnp.swapaxes(b, -1, -2)
    outs = [product(a, jnp.swapaxes(lax.slice_in_dim(w, i, min(i + step, n), axis=w.ndim - 2),
                                    -1, -2))
            for i in range(0, n, step)]
    return jnp.concatenate(outs, axis=-1)


_MAX_PIECES = 128  # bounds the program's size: pieces grow past the set bytes


def _stored():
    """The second matrix's meta tensor (mm, bmm, addmm's `mat2`; baddbmm's `batch2`)."""
    meta = arg_meta("mat2")
    return arg_meta("batch2") if meta is None else meta


def _beta_alpha(self, prod, beta, alpha):
    """beta * self + alpha * prod, with beta == 0 ignoring self (NaN included)."""
    dt = prod.dtype
    self = jnp.asarray(self).astype(dt)
    if dt == jnp.bool_:
        return jnp.logical_or(jnp.logical_and(self, beta != 0),
                              jnp.logical_and(prod, alpha != 0))
    if jnp.issubdtype(dt, jnp.integer):
        # PyTorch converts beta and alpha to the integer type (truncation).
        beta = jnp.trunc(jnp.asarray(beta)).astype(dt)
        alpha = jnp.trunc(jnp.asarray(alpha)).astype(dt)
    scaled = prod if (isinstance(alpha, (int, float)) and alpha == 1) else prod * alpha
    if isinstance(beta, (int, float)) and not isinstance(beta, bool):
        if beta == 0:
            return scaled
        if beta == 1:
            return self + scaled
    return jnp.where(beta == 0, jnp.zeros((), dt), self * beta) + scaled


def _same_dtype(name, *arrays):
    """The matrix products' CPU kernels refuse mixed dtypes (the meta kernels do
    not check): RuntimeError while tracing; _cpu_error_kernel below then raises
    the CPU kernel's own message."""
    dts = [jnp.asarray(x).dtype for x in arrays]
    if any(d != dts[0] for d in dts):
        raise RuntimeError(f"{name}: expected all operands to have the same dtype, "
                           f"but got {', '.join(str(d) for d in dts)}")


def _no_bool(kernel, *arrays, empty_too=False):
    """The matrix products' CPU kernels have no bool version (addr and outer
    do): CPU's NotImplementedError, named after its kernel (a `_cpu` kernel
    name as `_tpu`, as runtime.verdict words CPU's errors), on every path.
    Checked after the operands' dtypes agree (CPU's mixed-dtype error comes
    first), and, as CPU, only where there is something to multiply (an empty
    operand returns before the kernel is chosen), except for dot."""
    arrays = [jnp.asarray(x) for x in arrays]
    if arrays[0].dtype == jnp.bool_ and (empty_too or all(x.size for x in arrays)):
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


def _product_kernel(a, b, self=None):
    """The name of the CPU kernel that computes a @ b (mm, mv, bmm, addmm...)."""
    if a.ndim == 3:
        return "bmm" if self is None else "baddbmm"
    return "addmv_impl_tpu" if b.ndim == 1 else "addmm_impl_cpu_"


@lower(aten.mm.default, aten.bmm.default, aten.mv.default)
def mm(a, b):
    _same_dtype("mm", a, b)
    _no_bool(_product_kernel(a, b), a, b)
    return _matmul(a, b, stored=_stored())


@lower(aten.mm.dtype, aten.bmm.dtype)
def mm_dtype(a, b, out_dtype):
    return _matmul(a, b, acc=jnp.float32 if jnp.issubdtype(a.dtype, jnp.floating) else None,
                   stored=_stored())


@lower(aten._int_mm.default)
def _int_mm(a, b):
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


@lower(aten.dot.default)
def dot(a, b):
    _same_dtype("dot", a, b)
    _no_bool("dot", a, b, empty_too=True)
    return _matmul(a, b)


@lower(aten.vdot.default)
def vdot(a, b):
    _same_dtype("vdot", a, b)
    _no_bool("dot", a, b, empty_too=True)
    return _matmul(jnp.conj(a), b)


@lower(aten.addmm.default, aten.addmv.default, aten.baddbmm.default)
def addmm(self, a, b, *, beta=1, alpha=1):
    _same_dtype("addmm", self, a, b)
    _no_bool(_product_kernel(a, b, self), a, b)
    return _beta_alpha(self, _matmul(a, b, stored=_stored()), beta, alpha)


@lower(aten.addmm.dtype, aten.baddbmm.dtype)
def addmm_dtype(self, a, b, out_dtype, *, beta=1, alpha=1):
    return _beta_alpha(self, _matmul(a, b, acc=jnp.float32, stored=_stored()), beta, alpha)


@lower(aten.addbmm.default)
def addbmm(self, b1, b2, *, beta=1, alpha=1):
    _same_dtype("addbmm", self, b1, b2)
    _no_bool("addmm_impl_cpu_", b1, b2)
    acc = opmath_dtype(b1.dtype) if is_half(b1.dtype) else None
    if acc is not None and b1.shape[0] > 0:
        # PyTorch's CPU kernel runs one addmm_ per batch, rounding the
        # half-precision result after each: do the same.
        dt = b1.dtype
        out = _beta_alpha(jnp.broadcast_to(self, (b1.shape[1], b2.shape[2])),
                          _matmul(b1[0], b2[0]), beta, alpha).astype(dt)

        def step(i, out):
            return _beta_alpha(out, _matmul(b1[i], b2[i]), 1, alpha).astype(dt)

        return lax.fori_loop(1, b1.shape[0], step, out)
    if jnp.issubdtype(b1.dtype, jnp.integer):
        prod = jnp.einsum("bij,bjk->ik", b1, b2, preferred_element_type=b1.dtype)
    else:
        prod = jnp.einsum("bij,bjk->ik", b1, b2, precision=lax_precision(),
                          preferred_element_type=acc)
    return _beta_alpha(self, prod, beta, alpha)


@lower(aten.addr.default)
def addr(self, v1, v2, *, beta=1, alpha=1):
    dt = out_dtype()
    if dt == jnp.bool_:
        prod = jnp.logical_and(v1[:, None], v2[None, :])
    elif dt in (jnp.bfloat16, jnp.float16):
        # In float32, rounded once (by the executor), as CUDA's kernel does.
        # CPU's rounds each operation to the half type in its scalar loop and
        # not always in its vector one (AVX512-FP16 hosts differ from AVX2
        # ones), so the once-rounded result is the one no host beats.
        # The inputs in the result's type first, as PyTorch converts them.
        self = upcast(jnp.asarray(self).astype(dt))
        prod = upcast(v1.astype(dt))[:, None] * upcast(v2.astype(dt))[None, :]
    else:
        prod = v1.astype(dt)[:, None] * v2.astype(dt)[None, :]
    return _beta_alpha(self, prod, beta, alpha)


# -- LU and solves ------------------------------------------------------------------


def _lu(a):
    """(lu, pivots (0-based int32), perm) with a[perm] = L @ U."""
    return lax.linalg.lu(a)


def _lu_info(lu):
    n = min(lu.shape[-2], lu.shape[-1])
    if n == 0:
        return jnp.zeros(lu.shape[:-2], jnp.int32)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)


def _tri(a, b, *, lower, trans=False, conj=False, unit=False, left=True):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if b.size == 0 or a.size == 0:
        return jnp.zeros(b.shape, jnp.result_type(a, b))
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=trans,
                                       conjugate_a=conj, unit_diagonal=unit)


def _take_rows(b, perm):
    """b[..., perm, :] with perm batched like b's leading dims."""
    batch = jnp.broadcast_shapes(b.shape[:-2], perm.shape[:-1])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    perm = jnp.broadcast_to(perm, batch + perm.shape[-1:])
    return jnp.take_along_axis(b, perm[..., None], axis=-2)


def _inverse_perm(perm):
    return jnp.argsort(perm, axis=-1)


def _lu_solve_left(lu, perm, b, mode="N"):
    """Solve op(A) X = B for A with A[perm] = L U; op is N, T or H."""
    if mode == "N":
        y = _take_rows(b, perm)
        y = _tri(lu, y, lower=True, unit=True)
        return _tri(lu, y, lower=False)
    conj = mode == "H"
    z = _tri(lu, b, lower=False, trans=True, conj=conj)
    w = _tri(lu, z, lower=True, trans=True, conj=conj, unit=True)
    return _take_rows(w, _inverse_perm(perm))


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _lu_solve(lu, perm, b, left=True, adjoint=False):
    if left:
        return _lu_solve_left(lu, perm, b, "H" if adjoint else "N")
    if adjoint:  # X A^H = B  <=>  A X^H = B^H
        return jnp.conj(_mT(_lu_solve_left(lu, perm, jnp.conj(_mT(b)), "N")))
    return _mT(_lu_solve_left(lu, perm, _mT(b), "T"))  # X A = B <=> A^T X^T = B^T


def _perm_from_pivots(pivots, m):
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the tpu")
    if a.size == 0:
        k = min(a.shape[-2], a.shape[-1])
        return a, jnp.zeros(a.shape[:-2] + (k,), jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    lu, piv, _ = _lu(a)
    return lu, piv + 1, _lu_info(lu)


@lower(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the tpu")
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    if a.size == 0:
        P = jnp.broadcast_to(jnp.eye(m, dtype=a.dtype), a.shape[:-2] + (m, m))
        return P, jnp.zeros(a.shape[:-2] + (m, k), a.dtype), jnp.zeros(a.shape[:-2] + (k, n), a.dtype)
    lu, _, perm = _lu(a)
    return _unpack(lu, perm, a.dtype)


def _unpack(lu, perm, dtype):
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    # A = P L U with A[perm] = L U: P[perm[i], i] = 1.
    P = _mT(jax.nn.one_hot(perm, m, dtype=dtype))
    return P, L, U


@lower(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m = lu.shape[-2]
    outs = out_meta()
    perm = _perm_from_pivots(pivots, m)
    P, L, U = _unpack(lu, perm, lu.dtype)
    if not unpack_pivots:
        P = jnp.zeros(tuple(outs[0].shape), lu.dtype)
    if not unpack_data:
        L = jnp.zeros(tuple(outs[1].shape), lu.dtype)
        U = jnp.zeros(tuple(outs[2].shape), lu.dtype)
    return P, L, U


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    shape = tuple(out_meta().shape)
    if b.size == 0 or lu.size == 0:
        return jnp.zeros(shape, lu.dtype)
    perm = _perm_from_pivots(pivots, lu.shape[-1])
    batch = shape[:-2]
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    perm = jnp.broadcast_to(perm, batch + perm.shape[-1:])
    b = jnp.broadcast_to(b, shape)
    return _lu_solve(lu, perm, b, left=left, adjoint=adjoint)


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    lu, _, perm = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve_left(lu, perm, eye), _lu_info(lu)


def _solve_is_vector_rhs(a_shape, b_shape):
    return len(b_shape) == 1 or (len(a_shape) - 1 == len(b_shape)
                                 and tuple(b_shape) == tuple(a_shape[:-1]))


@lower(aten._linalg_solve_ex.default)
def _linalg_solve_ex(a, b, *, left=True, check_errors=False):
    # PyTorch (2.13) returns the LU of A itself here (unlike _linalg_det,
    # which factors A^T when A is contiguous); the backward solves with it.
    outs = out_meta()
    vector_case = _solve_is_vector_rhs(a.shape, b.shape)
    b2 = b[..., None] if vector_case else b
    if a.size == 0 or b.size == 0:
        lu = jnp.broadcast_to(a, tuple(outs[1].shape))
        return (jnp.zeros(tuple(outs[0].shape), a.dtype), lu,
                jnp.zeros(tuple(outs[2].shape), jnp.int32), jnp.zeros(tuple(outs[3].shape), jnp.int32))
    lu, piv, perm = _lu(a)
    rshape = jnp.broadcast_shapes(lu.shape[:-2], b2.shape[:-2])
    x = _lu_solve(jnp.broadcast_to(lu, rshape + lu.shape[-2:]),
                  jnp.broadcast_to(perm, rshape + perm.shape[-1:]),
                  jnp.broadcast_to(b2, rshape + b2.shape[-2:]), left=left)
    if vector_case:
        x = x[..., 0]
    return x, lu, piv + 1, _lu_info(lu)


def _det_parts(a):
    """(diag of U, parity sign, lu, 1-based pivots) of a square batch."""
    n = a.shape[-1]
    if n == 0:
        return (jnp.ones(a.shape[:-2] + (0,), a.dtype), jnp.ones(a.shape[:-2], a.dtype), a,
                jnp.zeros(a.shape[:-2] + (0,), jnp.int32))
    lu, piv, _ = _lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv != jnp.arange(n, dtype=piv.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(a.dtype)
    return diag, parity, lu, piv + 1


@lower(aten._linalg_det.default)
def _linalg_det(a):
    diag, parity, lu, piv = _det_parts(a)
    return parity * jnp.prod(diag, axis=-1), lu, piv


@lower(aten._linalg_slogdet.default)
def _linalg_slogdet(a):
    diag, parity, lu, piv = _det_parts(a)
    absd = jnp.abs(diag)
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        phase = jnp.prod(diag / absd.astype(a.dtype), axis=-1)
        sign = jnp.where(jnp.any(absd == 0, axis=-1), jnp.zeros((), a.dtype), parity * phase)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    logabs = jnp.sum(jnp.log(absd), axis=-1)
    return sign, logabs, lu, piv


def _det_kernel(op):
    def kernel(A):
        # PyTorch factors A^T when A is contiguous and real (det(A^T) == det(A));
        # the backward solves with the LU under that convention.

        use_A_T = A.is_contiguous() and not A.is_complex()
        return executor.runner_for(op)(A.mT if use_A_T else A)

    kernel.__name__ = str(op)
    return kernel


for _op in (aten._linalg_det.default, aten._linalg_slogdet.default):
    core.KERNELS[_op] = _det_kernel(_op)


# -- Cholesky -----------------------------------------------------------------------------


def _hermitian_from_lower(a):
    low = jnp.tril(a)
    return low + jnp.conj(_mT(jnp.tril(a, -1)))


def _cholesky_info(a):
    """Order of the first leading minor that is not positive-definite (0: none)."""
    n = a.shape[-1]
    m = _hermitian_from_lower(a)
    info0 = jnp.zeros(a.shape[:-2], jnp.int32)

    def body(k, state):
        m, info = state
        piv = jnp.real(m[..., k, k])
        bad = jnp.logical_not(piv > 0) & (info == 0)
        info = jnp.where(bad, k + 1, info)
        safe = jnp.where(piv > 0, piv, 1).astype(m.dtype)
        col = m[..., :, k]
        row = m[..., k, :]
        upd = col[..., :, None] * row[..., None, :] / safe[..., None, None]
        return m - upd, info

    _, info = lax.fori_loop(0, n, body, (m, info0))
    return info


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    L = lax.linalg.cholesky(a, symmetrize_input=False)
    failed = jnp.any(jnp.isnan(L))
    info = lax.cond(failed, _cholesky_info, lambda x: jnp.zeros(x.shape[:-2], jnp.int32), a)
    L = jnp.tril(L)
    return (jnp.conj(_mT(L)) if upper else L), info


def cholesky(a, upper=False):
    if a.size == 0:
        return a
    L = jnp.tril(lax.linalg.cholesky(a, symmetrize_input=False))
    return jnp.conj(_mT(L)) if upper else L


# PyTorch 2.14 removed the op (torch.cholesky raises, pointing to
# torch.linalg.cholesky, lowered above); 2.13 still has it.
if hasattr(aten, "cholesky"):
    lower(aten.cholesky.default)(cholesky)


def _chol_solve(f, b, upper):
    """Solve (L L^H) X = B, or (U^H U) X = B when upper."""
    if upper:
        y = _tri(f, b, lower=False, trans=True, conj=True)
        return _tri(f, y, lower=False)
    y = _tri(f, b, lower=True)
    return _tri(f, y, lower=True, trans=True, conj=True)


@lower(aten._cholesky_solve_helper.default)
def _cholesky_solve_helper(b, a, upper):
    return _chol_solve(a, b, upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(f, upper=False):
    if f.size == 0:
        return f
    eye = jnp.broadcast_to(jnp.eye(f.shape[-1], dtype=f.dtype), f.shape)
    return _chol_solve(f, eye, upper)


# -- triangular solves ------------------------------------------------------------------------


@lower(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    outs = out_meta()
    shape = tuple(outs[0].shape)
    if b.size == 0 or a.size == 0:
        return jnp.zeros(shape, b.dtype), jnp.broadcast_to(a, tuple(outs[1].shape))
    x = _tri(a, b, lower=not upper, trans=transpose, unit=unitriangular)
    return x, jnp.broadcast_to(a, tuple(outs[1].shape))


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    shape = tuple(out_meta().shape)
    if b.size == 0 or a.size == 0:
        return jnp.zeros(shape, out_dtype())
    return _tri(a, b, lower=not upper, unit=unitriangular, left=left)


# -- QR, SVD, eigh ----------------------------------------------------------------------------


@lower(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    outs = out_meta()
    if a.size == 0:
        return jnp.zeros(tuple(outs[0].shape), a.dtype) + (
            jnp.eye(*outs[0].shape[-2:], dtype=a.dtype) if len(outs[0].shape) >= 2 else 0), \
            jnp.zeros(tuple(outs[1].shape), a.dtype)
    q, r = lax.linalg.qr(a, full_matrices=(mode == "complete"))
    if mode == "r":
        q = jnp.zeros(tuple(outs[0].shape), a.dtype)
    return q, r


@lower(aten._linalg_svd.default)
def _linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    outs = out_meta()
    if a.size == 0:
        u = jnp.zeros(tuple(outs[0].shape), a.dtype)
        vh = jnp.zeros(tuple(outs[2].shape), a.dtype)
        if compute_uv and full_matrices:
            u = u + jnp.eye(*outs[0].shape[-2:], dtype=a.dtype)
            vh = vh + jnp.eye(*outs[2].shape[-2:], dtype=a.dtype)
        return u, jnp.zeros(tuple(outs[1].shape), core.st.TORCH_TO_JAX[outs[1].dtype]), vh
    if not compute_uv:
        s = lax.linalg.svd(a, full_matrices=False, compute_uv=False)
        return (jnp.zeros(tuple(outs[0].shape), a.dtype), s,
                jnp.zeros(tuple(outs[2].shape), a.dtype))
    u, s, vh = lax.linalg.svd(a, full_matrices=full_matrices, compute_uv=True)
    return u, s, vh


@lower(aten._linalg_eigh.default)
def _linalg_eigh(a, UPLO="L", compute_v=True):
    outs = out_meta()
    if a.size == 0:
        return (jnp.zeros(tuple(outs[0].shape), core.st.TORCH_TO_JAX[outs[0].dtype]),
                jnp.zeros(tuple(outs[1].shape), a.dtype))
    v, w = lax.linalg.eigh(a, lower=(UPLO.upper() == "L"), symmetrize_input=False)
    if not compute_v:
        v = jnp.zeros(tuple(outs[1].shape), a.dtype)
    return w, v


@lower(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    m, n = a.shape[-2], a.shape[-1]
    shape = tuple(out_meta().shape)
    if a.size == 0:
        return jnp.zeros(shape, a.dtype)
    real = jnp.finfo(a.dtype).dtype
    if hermitian:
        v, w = lax.linalg.eigh(a, lower=True, symmetrize_input=False)
        s = jnp.abs(w)
        smax = jnp.max(s, axis=-1, keepdims=True)
    else:
        u, s, vh = lax.linalg.svd(a, full_matrices=False, compute_uv=True)
        smax = s[..., :1]
    atol_v = jnp.zeros((), real) if atol is None else jnp.asarray(atol).astype(real)[..., None]
    if rtol is None:
        eps = jnp.finfo(real).eps * max(m, n)
        rtol_v = (jnp.asarray(eps, real) if atol is None
                  else jnp.where(atol_v > 0, jnp.zeros((), real), eps))
    else:
        rtol_v = jnp.asarray(rtol).astype(real)[..., None]
    thresh = jnp.maximum(atol_v, rtol_v * smax)
    s_inv = jnp.where(s > thresh, 1 / jnp.where(s > thresh, s, 1), 0).astype(real)
    if hermitian:
        w_inv = jnp.where(s > thresh, 1 / jnp.where(s > thresh, w, 1), 0).astype(a.dtype)
        return jnp.matmul(v * w_inv[..., None, :], jnp.conj(_mT(v)), precision=lax_precision())
    return jnp.matmul(jnp.conj(_mT(vh)) * s_inv.astype(a.dtype)[..., None, :],
                      jnp.conj(_mT(u)), precision=lax_precision())


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    if a.size == 0:
        return a
    # jax's expm (Pade 13) in float32 is ~1e-3 relative from PyTorch's; where the
    # platform has float64, compute in it (TPUs do not: float32 there).
    dt = a.dtype
    wide = {jnp.dtype(jnp.float32): jnp.float64, jnp.dtype(jnp.complex64): jnp.complex128}

    if dt in (jnp.bfloat16, jnp.float16):
        work = jnp.float64 if platform.supports_float64() else jnp.float32
    elif platform.supports_float64():
        work = wide.get(jnp.dtype(dt), dt)
    else:
        work = dt
    return jax.scipy.linalg.expm(a.astype(work)).astype(dt)


# -- pairwise distances (cdist, pdist) -----------------------------------------------------
#
# PyTorch's CPU kernels (DistanceOpsKernel): the distance of two rows is a
# reduction over |x1 - x2| chosen by p (0: count of nonzeros, 1: sum, 2: sqrt of
# the sum of squares, inf: max, else (sum |d|^p)^(1/p)). The gradient of one
# pair is, per element d = x1 - x2 with distance D and incoming g:
#   p == 0: 0;  p == 1: g sign(d);  p < 2: sign(d) |d|^(p-1) g / D^(p-1);
#   p == 2: g d / D;  p == inf: g sign(d) [|d| == D];  else d |d|^(p-2) g / D^(p-1);
# zero where D == 0 (and, for p < 1, where d == 0).


def _dist_reduce(diff, p):
    """Distances from the pairwise differences `diff` (last axis reduced)."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if np.isinf(p):
        return jnp.max(a, axis=-1)
    return jnp.sum(a ** p, axis=-1) ** (1.0 / p)


def _dist_grad_terms(diff, g, dist, p):
    """Per-element gradient terms of the pairs (diff: [..., r1, r2, c])."""
    g = g[..., None]
    D = dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return g * jnp.sign(diff)
    safeD = jnp.where(D == 0, jnp.ones((), diff.dtype), D)
    if np.isinf(p):
        return g * jnp.sign(diff) * (jnp.abs(diff) == D).astype(diff.dtype)
    if p == 2:
        return jnp.where(D == 0, zero, g * diff / safeD)
    a = jnp.abs(diff)
    if p < 2:
        safea = jnp.where(a == 0, jnp.ones((), diff.dtype), a)
        t = jnp.sign(diff) * safea ** (p - 1) * g / safeD ** (p - 1)
        return jnp.where((D == 0) | (a == 0), zero, t)
    t = diff * a ** (p - 2) * g / safeD ** (p - 1)
    return jnp.where(D == 0, zero, t)


def _cdist_batched(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (jnp.broadcast_to(x1, batch + x1.shape[-2:]),
            jnp.broadcast_to(x2, batch + x2.shape[-2:]))


@lower(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode=None):
    shape = tuple(out_meta().shape)
    mode = 0 if compute_mode is None else compute_mode
    if mode not in (0, 1, 2):
        raise RuntimeError(f"possible modes: 0, 1, 2, but was: {mode}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    r1, r2, c = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    if 0 in shape:
        return jnp.zeros(shape, x1.dtype)
    if c == 0:
        return jnp.zeros(shape, x1.dtype)
    x1, x2 = _cdist_batched(x1, x2)
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        # CPU's _euclidean_dist: one matmul of [-2 x1, |x1|^2, 1] and [x2, 1, |x2|^2].
        n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        a = jnp.concatenate([x1 * -2, n1, jnp.ones_like(n1)], axis=-1)
        b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
        return jnp.sqrt(jnp.maximum(_matmul(a, _mT(b)), 0)).reshape(shape)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return _dist_reduce(diff, p).reshape(shape)


@lower(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, dist):
    shape = tuple(out_meta().shape)
    if 0 in shape or 0 in grad.shape:
        return jnp.zeros(shape, x1.dtype)
    x1, x2 = _cdist_batched(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    terms = _dist_grad_terms(diff, grad.reshape(diff.shape[:-1]), dist.reshape(diff.shape[:-1]), p)
    return jnp.sum(terms, axis=-2).reshape(shape)


def _pdist_pairs(n):
    i, j = np.triu_indices(n, 1)
    return i, j


@lower(aten._pdist_forward.default)
def _pdist_forward(x, p=2):
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    n = x.shape[0]
    if n <= 1:
        return jnp.zeros((0,), x.dtype)
    if x.shape[1] == 0:
        return jnp.zeros((n * (n - 1) // 2,), x.dtype)
    i, j = _pdist_pairs(n)
    return _dist_reduce(x[i] - x[j], p)


@lower(aten._pdist_backward.default)
def _pdist_backward(grad, x, p, pdist):
    n = x.shape[0]
    if n <= 1 or x.shape[1] == 0:
        return jnp.zeros(x.shape, x.dtype)
    i, j = _pdist_pairs(n)
    # CPU adds the pair's term to row i and subtracts it from row j.
    terms = _dist_grad_terms(x[i] - x[j], grad, pdist, p)
    out = jnp.zeros(x.shape, x.dtype)
    return out.at[i].add(terms).at[j].add(-terms)


# -- Householder reflectors: geqrf, householder_product, ormqr -------------------------------------
#
# LAPACK's compact form: column i of `a` below the diagonal holds v_i (with an
# implicit 1 on the diagonal), H_i = I - tau_i v_i v_i^H, Q = H_1 H_2 ... H_k.


def _householder_q(a, tau, full):
    """Q = H_1 ... H_k from reflectors in a (*, m, n) and tau (*, k): the first
    n columns, or all m when `full` (zero taus make the padded reflectors I)."""
    m, n = a.shape[-2], a.shape[-1]
    k = tau.shape[-1]
    a = a[..., :, :k]
    cols = m if full else n
    if cols > k:
        a = jnp.concatenate([a, jnp.zeros(a.shape[:-1] + (cols - k,), a.dtype)], axis=-1)
        tau = jnp.concatenate([tau, jnp.zeros(tau.shape[:-1] + (cols - k,), tau.dtype)], axis=-1)
    if cols == 0 or m == 0:
        return jnp.zeros(a.shape[:-2] + (m, cols), a.dtype)
    return lax.linalg.householder_product(a, tau)


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    shape = tuple(out_meta().shape)
    if 0 in shape:
        return jnp.zeros(shape, a.dtype)
    batch = shape[:-2]
    a = jnp.broadcast_to(a, shape)
    tau = jnp.broadcast_to(tau, batch + tau.shape[-1:])
    return _householder_q(a, tau, full=False)


@lower(aten.ormqr.default)
def ormqr(a, tau, other, left=True, transpose=False):
    shape = tuple(out_meta().shape)
    if 0 in shape:
        return jnp.zeros(shape, out_dtype())
    batch = shape[:-2]
    q_n = shape[-2] if left else shape[-1]
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    tau = jnp.broadcast_to(tau, batch + tau.shape[-1:])
    other = jnp.broadcast_to(other, shape)
    if tau.shape[-1] == 0:
        return other
    q = _householder_q(a[..., :q_n, :], tau, full=True)
    if transpose:
        q = jnp.conj(_mT(q))
    return _matmul(q, other) if left else _matmul(other, q)


def geqrf_values(a):
    """(qr, tau) of `a` (non-empty; the eager kernel and the graph rule)."""
    geqrf = jax_api.geqrf()
    if geqrf is None:
        raise NotImplementedError(
            "aten::geqrf is not implemented for the tpu device with this JAX (its geqrf is "
            "not the code torch_tpu was written for; see `python -m torch_tpu._compat`)")
    return tuple(geqrf(a))


# -- eig: XLA implements the nonsymmetric eigensolver (LAPACK geev) on CPU only ------------------


def _eig_dtypes(a):
    cdt = jnp.complex128 if a.dtype in (jnp.float64, jnp.complex128) else jnp.complex64
    return cdt


@lower(aten.linalg_eig.default)
def linalg_eig(a):
    cdt = _eig_dtypes(a)
    if a.size == 0:
        return (jnp.zeros(a.shape[:-1], cdt), jnp.zeros(a.shape, cdt))
    w, v = lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
    return w.astype(cdt), v.astype(cdt)


@lower(aten._linalg_eigvals.default)
def _linalg_eigvals(a):
    cdt = _eig_dtypes(a)
    if a.size == 0:
        return jnp.zeros(a.shape[:-1], cdt)
    (w,) = lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=False)
    return w.astype(cdt)
