"""LDL^T with Bunch-Kaufman pivoting: linalg_ldl_factor_ex and linalg_ldl_solve.

A hand-written kernel (a `lax.while_loop` over the columns) that reproduces
LAPACK's unblocked sytf2/sytrs, lower, pivot for pivot: XLA has no symmetric
indefinite factorization, and PyTorch's results (the packed factor and its
pivots) are LAPACK's. Real inputs only; complex ones run on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import core, fallback
from .registry import lower, out_meta
from ..runtime import executor

aten = torch.ops.aten


# -- LDL^T with Bunch-Kaufman pivoting (LAPACK sytf2, lower) --------------------------------------
#
# PyTorch's CPU kernel is LAPACK's sytrf with uplo='L', which for the sizes
# below its block size (64) runs the unblocked sytf2. The loop below makes
# the same pivot decisions in the same order (alpha = (1 + sqrt(17)) / 8,
# 1x1 and 2x2 pivots, 1-based pivots negated for 2x2 blocks, columns of L left
# unswapped) and the same element updates; `info` is the first zero pivot.
# The trailing block is kept as a full symmetric matrix so that row and
# column interchanges are one symmetric permutation.

_BK_ALPHA = (1.0 + np.sqrt(17.0)) / 8.0


def _sytf2_lower(a):
    n = a.shape[-1]
    dt = a.dtype
    idx = jnp.arange(n)
    alpha = jnp.asarray(_BK_ALPHA, dt)
    zero = jnp.zeros((), dt)

    def body(state):
        m, ipiv, info, k = state
        col = m[:, k]
        absakk = jnp.abs(m[k, k])
        below = idx > k
        colabs = jnp.where(below, jnp.abs(col), -1)
        imax = jnp.argmax(colabs)
        colmax = jnp.maximum(colabs[imax], 0).astype(dt)
        is_zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        # The largest off-diagonal magnitude in row/column imax of the trailing block.
        rowabs = jnp.where((idx >= k) & (idx != imax), jnp.abs(m[imax, :]), -1)
        rowmax = jnp.maximum(jnp.max(rowabs), 0).astype(dt)
        no_swap = absakk >= alpha * colmax
        no_swap2 = absakk >= alpha * colmax * (colmax / jnp.where(rowmax == 0, jnp.ones((), dt), rowmax))
        one_swap = jnp.abs(m[imax, imax]) >= alpha * rowmax
        kp = jnp.where(is_zero | no_swap | no_swap2, k, imax)
        kstep = jnp.where(is_zero | no_swap | no_swap2 | one_swap, 1, 2)
        kk = k + kstep - 1
        # Symmetric interchange kk <-> kp inside the trailing block.
        p = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trail = (idx[:, None] >= k) & (idx[None, :] >= k)
        m = jnp.where(trail, m[p][:, p], m)
        # kstep 1: rank-1 update with the 1x1 pivot.
        akk = m[k, k]
        d11 = 1 / jnp.where(akk == 0, jnp.ones((), dt), akk)
        x = jnp.where(below, m[:, k], zero)
        upd1 = m + x[:, None] * (-d11 * x)[None, :]
        l1 = x * d11
        # kstep 2: the 2x2 pivot at (k, k+1).
        k1 = jnp.minimum(k + 1, n - 1)
        d21 = m[k1, k]
        d21s = jnp.where(d21 == 0, jnp.ones((), dt), d21)
        e11 = m[k1, k1] / d21s
        e22 = m[k, k] / d21s
        t = 1 / (e11 * e22 - 1)
        d21b = t / d21s
        below2 = idx > k1
        ck = jnp.where(below2, m[:, k], zero)
        ck1 = jnp.where(below2, m[:, k1], zero)
        wk = d21b * (e11 * ck - ck1)
        wkp1 = d21b * (e22 * ck1 - ck)
        upd2 = m - (ck[:, None] * wk[None, :] + ck1[:, None] * wkp1[None, :])
        lower_i = idx[:, None] >= idx[None, :]
        t1 = (idx[:, None] > k) & (idx[None, :] > k)
        t2 = (idx[:, None] > k1) & (idx[None, :] > k1)
        # Updated lower triangles, mirrored (LAPACK reads only the lower one).
        upd1 = jnp.where(lower_i, upd1, jnp.matrix_transpose(upd1))
        upd2 = jnp.where(lower_i, upd2, jnp.matrix_transpose(upd2))
        m1 = jnp.where(t1, upd1, m)
        m1 = m1.at[:, k].set(jnp.where(below, l1, m1[:, k]))
        m2 = jnp.where(t2, upd2, m)
        m2 = m2.at[:, k].set(jnp.where(below2, wk, m2[:, k]))
        m2 = m2.at[:, k1].set(jnp.where(below2, wkp1, m2[:, k1]))
        m = jnp.where(is_zero, m, jnp.where(kstep == 1, m1, m2))
        piv1 = ipiv.at[k].set((kp + 1).astype(jnp.int32))
        piv2 = ipiv.at[k].set(-(kp + 1).astype(jnp.int32)).at[k1].set(-(kp + 1).astype(jnp.int32))
        ipiv = jnp.where(kstep == 1, piv1, piv2)
        info = jnp.where(is_zero & (info == 0), (k + 1).astype(jnp.int32), info)
        return m, ipiv, info, k + kstep

    state = (a, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    m, ipiv, info, _ = lax.while_loop(lambda s: s[3] < n, body, state)
    return jnp.tril(m), ipiv, info


def _ldl_real_only(op, name):
    """Complex inputs (hetrf/sytrf with complex pivot magnitudes) run on the CPU."""
    def kernel(*args, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.is_complex() for t in args):
            return fallback.cpu_fallback(op, *args, **kwargs)
        return executor.runner_for(op)(*args, **kwargs)

    kernel.__name__ = name
    return kernel


@lower(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    n = a.shape[-1]
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-1], jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    batch = a.shape[:-2]
    flat = a.reshape((-1, n, n))
    # Only the lower triangle is read: mirror it.
    flat = jnp.tril(flat) + jnp.matrix_transpose(jnp.tril(flat, -1))
    ld, piv, info = jax.vmap(_sytf2_lower)(flat)
    return ld.reshape(a.shape), piv.reshape(batch + (n,)), info.reshape(batch)


def _sytrs_lower(ld, ipiv, b):
    """Solve A X = B from sytf2's factors (LAPACK sytrs, lower)."""
    n = ld.shape[-1]
    idx = jnp.arange(n)
    dt = b.dtype

    def swap_rows(b, i, j):
        p = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return b[p]

    def fwd(state):
        b, k = state
        pk = ipiv[k]
        one = pk > 0
        k1 = jnp.minimum(k + 1, n - 1)
        kp = jnp.where(one, pk - 1, -pk - 1)
        # 1x1: swap k <-> kp, eliminate below, divide by D(k).
        b1 = swap_rows(b, k, kp)
        col = ld[:, k].astype(dt)
        b1 = b1 - jnp.where((idx > k)[:, None], col[:, None] * b1[k][None, :], 0)
        b1 = b1.at[k].set(b1[k] / ld[k, k])
        # 2x2: swap k+1 <-> kp, eliminate below k+1 with both columns, solve the block.
        b2 = swap_rows(b, k1, kp)
        rows2 = (idx > k1)[:, None]
        b2 = b2 - jnp.where(rows2, ld[:, k].astype(dt)[:, None] * b2[k][None, :], 0)
        b2 = b2 - jnp.where(rows2, ld[:, k1].astype(dt)[:, None] * b2[k1][None, :], 0)
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / akm1k
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = b2[k] / akm1k
        bk = b2[k1] / akm1k
        b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(one, b1, b2), k + jnp.where(one, 1, 2)

    b, _ = lax.while_loop(lambda s: s[1] < n, fwd, (b, jnp.zeros((), jnp.int32)))

    def bwd(state):
        b, k = state
        pk = ipiv[k]
        one = pk > 0
        kp = jnp.where(one, pk - 1, -pk - 1)
        rows = (idx > k)[:, None]

        def dot_below(c):  # sum over rows > k only (no 0 * inf from the others)
            return jnp.sum(jnp.where(rows, c[:, None] * b, 0), axis=0)

        col = ld[:, k].astype(dt)
        b1 = b.at[k].add(-dot_below(col))
        b1 = swap_rows(b1, k, kp)
        km1 = jnp.maximum(k - 1, 0)
        b2 = b.at[k].add(-dot_below(col))
        b2 = b2.at[km1].add(-dot_below(ld[:, km1].astype(dt)))
        b2 = swap_rows(b2, k, kp)
        return jnp.where(one, b1, b2), k - jnp.where(one, 1, 2)

    b, _ = lax.while_loop(lambda s: s[1] >= 0, bwd, (b, jnp.asarray(n - 1, jnp.int32)))
    return b


@lower(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ld, pivots, b, *, hermitian=False):
    shape = tuple(out_meta().shape)
    if 0 in shape or ld.size == 0:
        return jnp.zeros(shape, ld.dtype)
    n = ld.shape[-1]
    batch = shape[:-2]
    ld = jnp.broadcast_to(ld, batch + ld.shape[-2:]).reshape((-1, n, n))
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:]).reshape((-1, n))
    b = jnp.broadcast_to(b, shape).reshape((-1,) + shape[-2:])
    return jax.vmap(_sytrs_lower)(ld, pivots, b).reshape(shape)


for _op, _name in ((aten.linalg_ldl_factor_ex.default, "linalg_ldl_factor_ex"),
                   (aten.linalg_ldl_solve.default, "linalg_ldl_solve")):
    core.KERNELS[_op] = _ldl_real_only(_op, _name)
