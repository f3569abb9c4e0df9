"""Pairwise distances, least squares, Householder products and friends on tpu
against PyTorch CPU (the ops lowered in torch_tpu/ops/linalg.py for issue #4)."""

import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

import torch_tpu  # noqa: F401


@pytest.fixture(autouse=True)
def _no_cpu_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")


F32 = dict(rtol=1e-5, atol=1e-5)
LOOSE = dict(rtol=1e-4, atol=1e-4)


def tpu(x):
    return pytree.tree_map(
        lambda t: t.clone().to("tpu") if isinstance(t, torch.Tensor) else t, x)


def compare(got, want, **tol):
    gl, wl = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl):
        if isinstance(w, torch.Tensor):
            assert g.device.type == "tpu"
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            torch.testing.assert_close(g.cpu(), w, equal_nan=True, **(tol or F32))
        else:
            assert g == w


def check(fn, *args, **tol):
    want = fn(*args)
    got = fn(*tpu(args))
    compare(got, want, **tol)
    return got, want


def check_grad(fn, *args, **tol):
    def run(xs):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = fn(*xs)
        outs = [o for o in pytree.tree_leaves(out)
                if isinstance(o, torch.Tensor) and o.requires_grad]
        g = torch.Generator().manual_seed(0)
        grads = [torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device) for o in outs]
        torch.autograd.backward(outs, grads)
        return out, [x.grad for x in xs]

    want = run(list(args))
    got = run(list(tpu(args)))
    compare(got, want, **(tol or LOOSE))


def make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


# -- cdist / pdist ----------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_values_and_grads(p):
    x1, x2 = make((2, 4, 3)), make((1, 5, 3), seed=1)
    x2[0, 0] = x1[0, 0]  # a zero distance (and zero differences)
    x2[0, 1, 0] = x1[1, 2, 0]
    for mode in ("use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"):
        check(lambda a, b: torch.cdist(a, b, p, compute_mode=mode), x1, x2)
        check_grad(lambda a, b: torch.cdist(a, b, p, compute_mode=mode), x1, x2)


def test_cdist_matmul_path_and_empty():
    # p = 2 with more than 25 rows: CPU (and tpu) take the matmul form.
    x1, x2 = make((30, 8)), make((7, 8), seed=1)
    check(torch.cdist, x1, x2, **LOOSE)
    check_grad(torch.cdist, x1, x2, **LOOSE)
    check(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), x1[:3], x2, **LOOSE)
    check(lambda a, b: torch.ops.aten._cdist_forward(a, b, 2.0, 1), x1[:3], x2, **LOOSE)
    check(torch.cdist, make((0, 4)), make((3, 4)))
    check(torch.cdist, make((2, 0)), make((3, 0)))
    check_grad(torch.cdist, make((2, 0)), make((3, 0)))


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist(p):
    x = make((6, 4))
    x[3] = x[1]
    x[4, 0] = x[2, 0]
    check(lambda a: torch.pdist(a, p), x)
    check_grad(lambda a: torch.pdist(a, p), x)
    check(lambda a: torch.pdist(a, p), make((1, 4)))
    check(lambda a: torch.pdist(a, p), make((3, 0)))


# -- lstsq ------------------------------------------------------------------------------------


def wellcond(shape, seed=0):
    a = make(shape, seed=seed)
    m, n = shape[-2], shape[-1]
    return a + 3 * torch.eye(m, n)


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
def test_lstsq_shapes_values_and_grads(driver):
    lstsq = lambda a, b: torch.linalg.lstsq(a, b, driver=driver)  # noqa: E731
    for ashape, bshape in [((5, 3), (5, 2)), ((3, 5), (3, 2)), ((4, 4), (4, 1)),
                           ((2, 5, 3), (2, 5, 4)), ((5, 3), (5,)), ((2, 5, 3), (2, 5)),
                           ((1, 5, 3), (2, 5, 2)), ((2, 5, 3), (1, 5, 2)), ((1, 5, 3), (5, 2))]:
        check(lstsq, wellcond(ashape), make(bshape, seed=1), **LOOSE)
    check_grad(lambda a, b: lstsq(a, b).solution, wellcond((2, 5, 3)), make((2, 5, 2), seed=1),
               rtol=2e-4, atol=2e-4)
    check_grad(lambda a, b: lstsq(a, b).solution, wellcond((3, 4)), make((3, 2), seed=1),
               rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
def test_lstsq_rank_deficient(driver):
    a = make((6, 4))
    a[:, 3] = a[:, 1] + a[:, 2]
    b = make((6, 2), seed=1)
    got, want = check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), a, b, **LOOSE)
    assert int(got.rank.cpu()) == 3
    assert got.residuals.shape == (0,)  # residuals only for full-rank A
    batch = torch.stack([a, make((6, 4), seed=2)])
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), batch, b.expand(2, 6, 2), **LOOSE)
    if driver == "gelsy":
        return  # gelsy truncates a pivoted QR, not the SVD: only rounding-level cuts agree
    # A cut-off that drops singular values.
    check(lambda a, b: torch.linalg.lstsq(a, b, rcond=0.3, driver=driver),
          make((6, 4), seed=3), b, **LOOSE)


def test_lstsq_empty_and_errors():
    for ashape, bshape in [((0, 3), (0, 2)), ((5, 0), (5, 2)), ((0, 5, 3), (0, 5, 2)), ((5, 3), (5, 0))]:
        for driver in ("gels", "gelsy", "gelsd"):
            if bshape == (5, 0) and driver == "gelsd":
                continue  # CPU: MKL rejects nrhs == 0 (internal assert)
            check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), make(ashape), make(bshape))
    bad = [((5,), (5,)), ((5, 3), ()), ((2, 5, 3), (5,)), ((5, 3), (4, 2)), ((5, 3), (3,)),
           ((2, 5, 3), (5, 1)), ((2, 5, 3), (1, 5))]
    for ashape, bshape in bad:
        with pytest.raises(RuntimeError) as cpu_err:
            torch.linalg.lstsq(make(ashape), make(bshape))
        with pytest.raises(RuntimeError) as tpu_err:
            torch.linalg.lstsq(*tpu((make(ashape), make(bshape))))
        assert str(cpu_err.value) in str(tpu_err.value)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.linalg.lstsq(*tpu((make((5, 3)), make((5, 2), torch.float64))))
    with pytest.raises(RuntimeError, match="driver"):
        torch.linalg.lstsq(*tpu((make((5, 3)), make((5, 2)))), driver="foo")


# -- geqrf / householder_product / ormqr --------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 5, 3), (0, 3), (2, 0, 4)])
def test_geqrf_householder_product_ormqr(shape):
    a = make(shape)
    check(torch.geqrf, a, **LOOSE)
    qr, tau = torch.geqrf(a)
    m, n = shape[-2], shape[-1]
    if m >= n:
        check(torch.linalg.householder_product, qr, tau, **LOOSE)
        check(torch.linalg.householder_product, qr, tau[..., : max(n - 1, 0)], **LOOSE)
    for left in (True, False):
        for transpose in (True, False):
            c = make(shape[:-2] + ((m, 2) if left else (2, m)), seed=1)
            check(lambda x, t, c: torch.ormqr(x, t, c, left=left, transpose=transpose), qr, tau, c,
                  **LOOSE)
    if m >= n and a.numel():
        check_grad(torch.linalg.householder_product, qr, tau, rtol=1e-3, atol=1e-3)
        check_grad(lambda x, t, c: torch.ormqr(x, t, c), qr, tau, make(shape[:-2] + (m, 2), seed=1),
                   rtol=1e-3, atol=1e-3)


def test_geqrf_errors():
    for bad in (make((3,)), torch.ones(3, 3, dtype=torch.int64)):
        with pytest.raises(RuntimeError):
            torch.geqrf(bad)
        with pytest.raises(RuntimeError):
            torch.geqrf(tpu(bad))


# -- eig ------------------------------------------------------------------------------------------


def _eig_check(a):
    w, v = torch.linalg.eig(tpu(a))
    w_cpu, _ = torch.linalg.eig(a)
    torch.testing.assert_close(w.cpu(), w_cpu, **LOOSE)
    # Eigenvectors are unique up to phase: check A V = V diag(w) and unit norms.
    ac = a.to(w.dtype)
    v = v.cpu()
    torch.testing.assert_close(ac @ v, v * w.cpu().unsqueeze(-2), **LOOSE)
    torch.testing.assert_close(torch.linalg.vector_norm(v, dim=-2),
                               torch.ones(v.shape[:-1]), **LOOSE)
    check(torch.linalg.eigvals, a, **LOOSE)


def test_eig_and_eigvals():
    _eig_check(make((4, 4)))
    _eig_check(make((2, 3, 3), seed=1))
    _eig_check(make((3, 3), seed=2).to(torch.complex64))
    check(torch.linalg.eigvals, make((0, 0)))
    check(torch.linalg.eigvals, make((2, 0, 0)))
    # Gradients through eigenvalues (well defined).
    check_grad(lambda a: torch.linalg.eigvals(a).abs(), make((4, 4), seed=3), rtol=1e-3, atol=1e-3)


def test_eig_off_cpu_platform_uses_the_fallback(monkeypatch):
    from torch_tpu.runtime import platform

    a = make((3, 3))
    monkeypatch.setattr(platform, "platform", lambda: "tpu")
    with pytest.raises(NotImplementedError, match="linalg_eig"):
        torch.linalg.eig(tpu(a))
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's one-time warning
        w = torch.linalg.eigvals(tpu(a))
    assert w.device.type == "tpu"
    torch.testing.assert_close(w.cpu(), torch.linalg.eigvals(a))


# -- LDL^T (Bunch-Kaufman) -------------------------------------------------------------------------


def test_ldl_factor_pivots_match_lapack_and_solve():
    g = torch.Generator().manual_seed(0)
    for trial in range(28):
        n = [1, 2, 3, 4, 5, 7, 9][trial % 7]
        a = torch.randn(2, n, n, generator=g)
        a = a + a.mT  # symmetric indefinite: 1x1 and 2x2 pivots, interchanges
        if trial % 5 == 0:
            a[0, 0, 0] = 0
        want = torch.linalg.ldl_factor_ex(a)
        got = torch.linalg.ldl_factor_ex(tpu(a))
        assert torch.equal(got.pivots.cpu(), want.pivots)
        assert torch.equal(got.info.cpu(), want.info)
        torch.testing.assert_close(got.LD.cpu(), want.LD, **LOOSE)
        b = torch.randn(2, n, 3, generator=g)
        torch.testing.assert_close(torch.linalg.ldl_solve(got.LD, got.pivots, tpu(b)).cpu(),
                                   torch.linalg.ldl_solve(want.LD, want.pivots, b),
                                   rtol=1e-3, atol=1e-3, equal_nan=True)
    # Only the lower triangle is read; info for a zero matrix; empty inputs.
    a = make((4, 4)) + 4 * torch.eye(4)
    check(lambda a: torch.linalg.ldl_factor(a, hermitian=True), a, **LOOSE)
    check(torch.linalg.ldl_factor_ex, torch.zeros(3, 3))
    check(torch.linalg.ldl_factor_ex, make((0, 0)))
    check(torch.linalg.ldl_factor_ex, make((2, 0, 0)))
    ld, piv = torch.linalg.ldl_factor(a)
    check(torch.linalg.ldl_solve, ld, piv, make((2, 4, 2), seed=1), **LOOSE)  # broadcast B
