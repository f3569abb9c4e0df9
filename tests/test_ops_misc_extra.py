"""frexp, div(trunc), histogram/histogramdd, segment_reduce and out= overlap
checks on tpu against PyTorch CPU (special values the OpInfo samples miss)."""

import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

TPU = torch.device("tpu", 0)


def tpu(x):
    return x.to(TPU) if isinstance(x, torch.Tensor) else x


def same(a, b, **kw):
    a, b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(y.cpu(), x, equal_nan=True, **kw)


SPECIAL = [0.0, -0.0, 1.0, -1.5, float("inf"), -float("inf"), float("nan"), 1e-40, -3e-45,
           1.17e-38, 5.9e-39, 3.4e38, 0.5, 7.0, 1e-45, 1e-5, -6e-8, 65504.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_frexp_special_values(dtype):
    x = torch.tensor(SPECIAL).to(dtype)
    m, e = torch.frexp(x)
    mt, et = torch.frexp(tpu(x))
    assert et.dtype == torch.int32
    same((m, e), (mt, et), rtol=0, atol=0)


def test_frexp_out_and_grad():
    x = torch.randn(8, requires_grad=True)
    xt = x.detach().to(TPU).requires_grad_()
    torch.frexp(x)[0].sum().backward()
    torch.frexp(xt)[0].sum().backward()
    same(x.grad, xt.grad)
    m = torch.empty(8, device=TPU)
    e = torch.empty(8, dtype=torch.int32, device=TPU)
    torch.frexp(tpu(x.detach()), out=(m, e))
    same(torch.frexp(x.detach()), (m, e))
    with pytest.raises(RuntimeError):
        torch.frexp(torch.arange(3, device=TPU))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_div_rounding_modes_match_cpu_bitwise(dtype):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(4000, generator=g) * 50).to(dtype)
    b = torch.randn(4000, generator=g).to(dtype)
    s = torch.randn(1, generator=g).to(dtype)
    # exact quotients: XLA's A / broadcast(B) -> A * (1 / B) must not apply
    a[:8] = (s * torch.arange(1, 9).to(dtype)).to(dtype)
    a[8:12] = 0
    b[12:14] = 0
    a[14], b[15] = float("inf"), float("inf")
    for other in (b, s, s.reshape(()), s.reshape(1, 1), 0.37, s.item()):
        for mode in ("trunc", "floor"):
            want = torch.div(a, other, rounding_mode=mode)
            got = torch.div(tpu(a), tpu(other), rounding_mode=mode)
            same(want, got, rtol=0, atol=0)
        same(torch.floor_divide(a, other), torch.floor_divide(tpu(a), tpu(other)), rtol=0, atol=0)
    # a broadcast (not single-element) divisor
    same(torch.div(a.reshape(2, -1), b[:2000], rounding_mode="floor"),
         torch.div(tpu(a.reshape(2, -1)), tpu(b[:2000]), rounding_mode="floor"), rtol=0, atol=0)


def test_histogram_matches_cpu():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3, generator=g) * 3
    w = torch.rand(40, generator=g)
    for bins in (1, 3, 7):
        for rng in (None, (-1.0, 2.0), (0.5, 0.5)):
            for dens in (False, True):
                same(torch.histogram(x, bins, range=rng, density=dens),
                     torch.histogram(tpu(x), bins, range=rng, density=dens))
                r3 = None if rng is None else rng * 3
                same(torch.histogramdd(x, [bins, 2, bins], range=r3, weight=w, density=dens),
                     torch.histogramdd(tpu(x), [bins, 2, bins], range=r3, weight=tpu(w),
                                       density=dens))
                edges = torch.randn(bins + 1, generator=g).sort()[0]
                same(torch.histogram(x, edges, weight=w.repeat(3), density=dens),
                     torch.histogram(tpu(x), tpu(edges), weight=tpu(w.repeat(3)), density=dens))
                # unsorted edges: CPU's std::upper_bound, step for step
                bs = [torch.randn(bins + 1, generator=g) for _ in range(3)]
                same(torch.histogramdd(x, bs, density=dens),
                     torch.histogramdd(tpu(x), [tpu(b) for b in bs], density=dens))


@pytest.mark.parametrize("call", [
    lambda d, f: torch.histogram(f, 0),
    lambda d, f: torch.histogram(f, 3, range=(1.0, 0.0)),
    lambda d, f: torch.histogram(f, 3, range=(0.0, float("inf"))),
    lambda d, f: torch.histogram(f, 3, weight=f.double()),
    lambda d, f: torch.histogram(f, torch.zeros(2, 2, device=d)),
    lambda d, f: torch.histogram(torch.arange(5, device=d), 3),
    lambda d, f: torch.histogramdd(f, [3, 3, 3]),
    lambda d, f: torch.histogramdd(f, [3, 3], range=[0.0, 1.0]),
    lambda d, f: torch.histogramdd(f, [torch.zeros(3, device=d)]),
])
def test_histogram_errors(call):
    f = torch.randn(5, 2)
    with pytest.raises(Exception) as cpu:
        call("cpu", f)
    with pytest.raises(type(cpu.value)):
        call(TPU, tpu(f))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
def test_segment_reduce(dtype, reduce):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 7, 3, generator=g).to(dtype)
    x[2, 3, 1] = float("nan")
    x[4, 1, 0] = 0.0
    x[4, 2, 0] = x[4, 3, 0]
    lengths = torch.tensor([[2, 0, 3, 2]] * 6)
    lengths[1] = torch.tensor([0, 0, 7, 0])
    offsets = torch.cat([torch.zeros(6, 1, dtype=torch.long), lengths.cumsum(1)], 1)
    exact = dtype == torch.bfloat16 or reduce in ("max", "min")  # bf16: per-step rounding
    tol = dict(rtol=0, atol=0) if exact else {}
    for initial in (None, 2.0):
        for kw in (dict(lengths=lengths), dict(offsets=offsets)):
            xr = x.clone().requires_grad_(dtype == torch.float32)
            xt = tpu(x).requires_grad_(dtype == torch.float32)
            r = torch.segment_reduce(xr, reduce, axis=1, initial=initial, **kw)
            rt = torch.segment_reduce(xt, reduce, axis=1, initial=initial,
                                      **{k: tpu(v) for k, v in kw.items()})
            same(r, rt, **tol)
            if dtype == torch.float32:
                gr = torch.randn(r.shape, generator=g)
                same(torch.autograd.grad(r, xr, gr), torch.autograd.grad(rt, xt, tpu(gr)))


def _overlap_calls(d):
    x = torch.arange(6.0, device=d)
    i = torch.tensor([0, 1, 2], device=d)
    return [
        lambda: torch.gather(x, 0, i, out=x[:3]),
        lambda: torch.take(x, i, out=x[:3]),
        lambda: torch.index_select(x, 0, i, out=x[:3]),
        lambda: torch.cat([x[:3], x[3:]], out=x),
        lambda: torch.masked_select(x, x > 0, out=x),
        lambda: torch.topk(x, 2, out=(x[:2], torch.empty(2, dtype=torch.long, device=d))),
        lambda: torch.bernoulli(torch.rand(3, device=d), out=torch.empty(1, device=d).expand(3)),
        lambda: torch.index_select(x, 0, i, out=torch.empty(1, device=d).expand(3)),
        # accepted by CPU
        lambda: torch.add(x, 1, out=x),
        lambda: torch.sum(x.view(3, 2), 1, out=torch.empty(1, device=d).expand(3)),
        lambda: torch.cat([x[:3], x[3:]], out=torch.empty(6, device=d)),
    ]


_OVERLAP_ERRORS = 8  # the first 8 calls raise on CPU, the others are accepted


@pytest.mark.parametrize("k", range(_OVERLAP_ERRORS))
def test_out_overlap_errors(k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="unsupported operation") as cpu:
            _overlap_calls("cpu")[k]()
        with pytest.raises(type(cpu.value), match="unsupported operation"):
            _overlap_calls(TPU)[k]()


@pytest.mark.parametrize("k", range(_OVERLAP_ERRORS, len(_overlap_calls("cpu"))))
def test_out_overlap_accepted(k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _overlap_calls("cpu")[k]()
        got = _overlap_calls(TPU)[k]()
    assert got.device.type == "tpu" and got.shape == want.shape and got.dtype == want.dtype
    if got.stride() == (0,):
        # sum's three results all written to one element: which one stays is
        # the kernel's order (unspecified); it is one of them.
        assert got.cpu()[0].item() in (1.0, 5.0, 9.0)
    else:
        same(want, got)
