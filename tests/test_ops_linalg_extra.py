"""Pairwise distances, least squares, Householder products and friends on tpu
against PyTorch CPU (the ops lowered in torch_tpu/ops/linalg.py for issue #4)."""

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
