"""Matrix products and torch.linalg on tpu against PyTorch CPU."""

import pytest
import torch
from torch.utils import _pytree as pytree

import torch_tpu  # noqa: F401


@pytest.fixture(autouse=True)
def _no_cpu_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")


def tpu(x):
    # clone(): on XLA:CPU, .to("tpu") may share the host buffer.
    return pytree.tree_map(
        lambda t: t.clone().to("tpu") if isinstance(t, torch.Tensor) else t, x)


F32 = dict(rtol=1e-5, atol=1e-5)
LOOSE = dict(rtol=1e-4, atol=1e-4)


def compare(got, want, **tol):
    gl, wl = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl):
        if isinstance(w, torch.Tensor):
            assert g.device.type == "tpu"
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            torch.testing.assert_close(g.cpu(), w, equal_nan=True, **(tol or F32))


def check(fn, *args, **tol):
    targs = tpu(args)
    want = fn(*args)
    got = fn(*targs)
    compare(got, want, **tol)
    return got, want


def check_grad(fn, *args, **tol):
    def run(xs):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = fn(*xs)
        outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        g = torch.Generator().manual_seed(0)
        grads = [torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device) for o in outs]
        torch.autograd.backward(outs, grads)
        return out, [x.grad for x in xs]

    targs = tpu(args)
    want = run(list(args))
    got = run(list(targs))
    compare(got, want, **(tol or LOOSE))


def make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 5, shape, generator=g).to(dtype)


def spd(n, batch=(), seed=0, dtype=torch.float32):
    a = make(batch + (n, n), dtype, seed)
    return a @ a.mH + n * torch.eye(n, dtype=dtype)


def wellcond(n, batch=(), seed=0, dtype=torch.float32):
    return make(batch + (n, n), dtype, seed) + n * torch.eye(n, dtype=dtype)


# -- products ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64])
def test_products(dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else F32
    a, b = make((3, 4), dtype), make((4, 5), dtype, 1)
    c = make((3, 5), dtype, 2)
    v, w = make((4,), dtype, 3), make((3,), dtype, 4)
    ba, bb = make((2, 3, 4), dtype, 5), make((2, 4, 5), dtype, 6)
    check(torch.mm, a, b, **tol)
    check(torch.mm, b.t(), a.t(), **tol)  # non-contiguous
    check(torch.bmm, ba, bb, **tol)
    check(torch.matmul, ba, b, **tol)
    check(torch.matmul, v, b, **tol)
    check(torch.mv, a, v, **tol)
    check(torch.dot, v, v, **tol)
    check(torch.vdot, v, v, **tol)
    check(torch.outer, v, w, **tol)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=2, alpha=3), c, a, b, **tol)
    check(torch.addmm, c[0], a, b, **tol)  # broadcast self
    check(lambda c, a, v: torch.addmv(c, a, v, beta=0), c[:, 0], a, v, **tol)
    check(lambda c, x, y: torch.baddbmm(c, x, y, alpha=2), c, ba, bb, **tol)
    check(lambda c, x, y: torch.addbmm(c, x, y, beta=0.5 if dtype.is_floating_point else 2),
          c, ba, bb, **tol)
    check(lambda c, x, y: torch.addr(c, x, y, alpha=2), c, w, make((5,), dtype, 7), **tol)


def test_beta_zero_ignores_nan_and_float32_is_exact_enough():
    c = torch.full((3, 5), float("nan"))
    a, b = make((3, 4)), make((4, 5), seed=1)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0), c, a, b)
    check(lambda c, x, y: torch.baddbmm(c, x, y, beta=0), c[None], a[None], b[None])
    # float32 products use HIGHEST precision: CPU-level accuracy on large sums.
    x, y = make((64, 512)), make((512, 64), seed=2)
    check(torch.mm, x, y, rtol=1e-5, atol=1e-4)


def test_bool_addr_and_int_mm():
    c = torch.tensor([[True, False], [False, False]])
    check(torch.addr, c, torch.tensor([True, False]), torch.tensor([False, True]))
    check(torch.mm, make((3, 4), torch.int32), make((4, 2), torch.int32, 1))


def test_product_grads():
    check_grad(torch.mm, make((3, 4)), make((4, 5), seed=1))
    check_grad(torch.bmm, make((2, 3, 4)), make((2, 4, 5), seed=1))
    check_grad(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), make((3, 5)),
               make((3, 4)), make((4, 5), seed=1))
    check_grad(torch.matmul, make((2, 3, 4)), make((4,), seed=1))
    check_grad(lambda x, w, b: torch.nn.functional.linear(x, w, b), make((6, 4)),
               make((3, 4), seed=1), make((3,), seed=2))


def test_product_errors():
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        torch.ones(2, 3, device="tpu") @ torch.ones(4, 5, device="tpu")
    with pytest.raises(RuntimeError):
        torch.bmm(torch.ones(2, 3, 4, device="tpu"), torch.ones(3, 4, 5, device="tpu"))


# -- solves and factorizations -------------------------------------------------------------------


def test_inv_solve_det():
    a = wellcond(4, (2,))
    b = make((2, 4, 3), seed=1)
    check(torch.linalg.inv, a, **LOOSE)
    check(torch.linalg.inv_ex, a[0], **LOOSE)
    check(torch.linalg.solve, a, b, **LOOSE)
    check(torch.linalg.solve, a[0], b[0, :, 0], **LOOSE)  # vector rhs
    check(torch.linalg.solve, a, b[:, :, 0], **LOOSE)  # batched vector rhs
    check(lambda a, b: torch.linalg.solve(a, b, left=False), a, b.mT, **LOOSE)
    check(torch.linalg.solve, a[0].t(), b[0], **LOOSE)  # non-contiguous A
    check(torch.linalg.det, a, **LOOSE)
    check(torch.linalg.det, a.mT, **LOOSE)
    check(torch.linalg.slogdet, a, **LOOSE)
    check(torch.linalg.slogdet, -a[0], **LOOSE)
    check(torch.logdet, a, **LOOSE)
    check(torch.linalg.det, torch.ones(3, 3), **LOOSE)  # singular
    check(torch.linalg.slogdet, torch.zeros(2, 2), **LOOSE)
    check(torch.linalg.det, torch.empty(0, 0), **LOOSE)
    check(torch.linalg.inv, wellcond(3, dtype=torch.complex64), **LOOSE)
    check(torch.linalg.det, wellcond(3, dtype=torch.complex64), **LOOSE)


def test_singular_errors_and_info():
    s = torch.ones(3, 3)
    _, info = torch.linalg.inv_ex(s.to("tpu"))
    assert info.item() == torch.linalg.inv_ex(s)[1].item()
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(s.to("tpu"))
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.solve(s.to("tpu"), torch.ones(3, 1, device="tpu"))
    m = torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # minor 2 fails
    _, info = torch.linalg.cholesky_ex(m.to("tpu"))
    assert info.item() == torch.linalg.cholesky_ex(m)[1].item() == 2
    with pytest.raises(torch.linalg.LinAlgError, match="order 2"):
        torch.linalg.cholesky(m.to("tpu"))


def test_factorization_grads():
    a = wellcond(3, (2,))
    check_grad(torch.linalg.inv, a)
    check_grad(torch.linalg.det, a)
    check_grad(torch.linalg.det, a[0].t())
    check_grad(lambda x: torch.linalg.slogdet(x)[1], a)
    check_grad(torch.linalg.solve, a, make((2, 3, 2), seed=1))
    check_grad(torch.linalg.solve, a[0].t(), make((3,), seed=1))
    check_grad(torch.linalg.cholesky, spd(3))
    check_grad(lambda x: torch.linalg.eigh(x)[0], spd(3))


def test_cholesky_and_triangular():
    a = spd(4, (2,))
    check(torch.linalg.cholesky, a, **LOOSE)
    check(lambda a: torch.linalg.cholesky(a, upper=True), a, **LOOSE)
    if hasattr(torch.ops.aten, "cholesky"):  # (PyTorch 2.14 removed torch.cholesky's op)
        check(torch.cholesky, a[0], **LOOSE)
    lo = torch.linalg.cholesky(a)
    b = make((2, 4, 3), seed=1)
    check(torch.cholesky_solve, b, lo, **LOOSE)
    check(lambda b, u: torch.cholesky_solve(b, u, upper=True), b, lo.mH, **LOOSE)
    check(torch.cholesky_inverse, lo[0], **LOOSE)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False), lo, b, **LOOSE)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False),
          lo.mT, b.mT, **LOOSE)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
          lo, b, **LOOSE)
    check(lambda b, a: torch.triangular_solve(b, a, upper=False), b, lo, **LOOSE)
    check(lambda b, a: torch.triangular_solve(b, a, transpose=True), b, lo.mT, **LOOSE)
    check(lambda b, a: torch.triangular_solve(b, a), b[0], lo.mT, **LOOSE)  # broadcast


def test_lu():
    a = make((2, 4, 4))
    check(torch.linalg.lu_factor, a, **LOOSE)
    check(torch.linalg.lu, a, **LOOSE)
    check(torch.linalg.lu, make((3, 5)), **LOOSE)
    check(torch.linalg.lu, make((5, 3)), **LOOSE)
    lu, piv = torch.linalg.lu_factor(a)
    b = make((2, 4, 2), seed=1)
    for left in (True, False):
        for adjoint in (False, True):
            bb = b if left else b.mT
            check(lambda lu, piv, bb: torch.linalg.lu_solve(lu, piv, bb, left=left,
                                                            adjoint=adjoint),
                  lu, piv, bb, **LOOSE)
    check(torch.lu_unpack, lu, piv, **LOOSE)


def _sign_fix(q, r):
    """QR is unique up to the signs of R's diagonal: make them positive."""
    d = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    d = torch.where(d == 0, torch.ones_like(d), d)
    return q * d[..., None, :], r * d[..., :, None]


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(mode):
    a = make((2, 5, 3))
    want = torch.linalg.qr(a, mode=mode)
    got = torch.linalg.qr(a.to("tpu"), mode=mode)
    assert got.Q.shape == want.Q.shape and got.R.shape == want.R.shape
    if mode == "r":
        torch.testing.assert_close(got.R.cpu().abs(), want.R.abs(), **LOOSE)
        return
    k = want.R.shape[-2] if mode == "reduced" else 3
    gq, gr = _sign_fix(got.Q.cpu()[..., :k], got.R.cpu()[..., :k, :])
    wq, wr = _sign_fix(want.Q[..., :k], want.R[..., :k, :])
    torch.testing.assert_close(gr, wr, **LOOSE)
    torch.testing.assert_close(gq, wq, **LOOSE)
    torch.testing.assert_close(got.Q.cpu() @ got.R.cpu(), a, **LOOSE)


def test_svd_eigh_pinv():
    a = make((2, 5, 3))
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=False)
    torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(a), **LOOSE)
    torch.testing.assert_close((u * s[..., None, :] @ vh).cpu(), a, **LOOSE)
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=True)
    assert u.shape == (2, 5, 5) and vh.shape == (2, 3, 3)
    check(torch.linalg.svdvals, a, **LOOSE)
    h = spd(4, (2,))
    w, v = torch.linalg.eigh(h.to("tpu"))
    torch.testing.assert_close(w.cpu(), torch.linalg.eigvalsh(h), **LOOSE)
    torch.testing.assert_close((v * w[..., None, :] @ v.mH).cpu(), h, rtol=1e-4, atol=1e-3)
    check(lambda h: torch.linalg.eigvalsh(h, UPLO="U"), h, **LOOSE)
    check(torch.linalg.pinv, a, **LOOSE)
    check(lambda h: torch.linalg.pinv(h, hermitian=True), h, **LOOSE)
    check(torch.linalg.matrix_exp, make((3, 3)) * 0.3, **LOOSE)
    check_grad(lambda x: torch.linalg.svdvals(x), make((4, 3)))
