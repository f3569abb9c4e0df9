"""Random ops on tpu: shapes, dtypes, ranges, moments, reproducibility."""

import math

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import executor

N = 20000


@pytest.fixture(autouse=True)
def _no_cpu_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")


def host(t):
    assert t.device.type == "tpu"
    return t.cpu()


def moments(t):
    t = host(t).double()
    return t.mean().item(), t.std().item()


def test_factories_shapes_dtypes():
    assert torch.rand(2, 3, device="tpu").dtype == torch.float32
    assert torch.rand(2, 3, device="tpu", dtype=torch.bfloat16).shape == (2, 3)
    assert torch.randn(4, device="tpu", dtype=torch.float64).dtype == torch.float64
    assert torch.randn((), device="tpu").shape == ()
    assert torch.rand(0, 5, device="tpu").shape == (0, 5)
    r = host(torch.randint(3, 7, (1000,), device="tpu"))
    assert r.dtype == torch.int64 and r.min() >= 3 and r.max() <= 6 and len(r.unique()) == 4
    r = host(torch.randint(5, (100,), device="tpu", dtype=torch.int32))
    assert r.dtype == torch.int32 and r.min() >= 0 and r.max() < 5
    p = host(torch.randperm(50, device="tpu"))
    assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(50))
    assert host(torch.randperm(10, device="tpu", dtype=torch.int32)).dtype == torch.int32
    x = torch.zeros(3, 4, device="tpu", dtype=torch.bfloat16)
    for fn in (torch.rand_like, torch.randn_like, lambda t: torch.randint_like(t, 10)):
        y = fn(x)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "tpu"
    u = host(torch.rand(N, device="tpu"))
    assert u.min() >= 0 and u.max() < 1


def test_moments():
    m, s = moments(torch.rand(N, device="tpu"))
    assert abs(m - 0.5) < 0.01 and abs(s - math.sqrt(1 / 12)) < 0.01
    m, s = moments(torch.randn(N, device="tpu"))
    assert abs(m) < 0.03 and abs(s - 1) < 0.03
    x = torch.empty(N, device="tpu")
    m, s = moments(x.uniform_(-2, 4))
    assert abs(m - 1) < 0.06 and abs(s - math.sqrt(3)) < 0.05
    m, s = moments(x.normal_(3, 0.5))
    assert abs(m - 3) < 0.02 and abs(s - 0.5) < 0.02
    m, s = moments(x.exponential_(2.0))
    assert abs(m - 0.5) < 0.02 and abs(s - 0.5) < 0.03 and host(x).min() >= 0
    g = host(x.geometric_(0.25))
    assert g.min() >= 1 and abs(g.mean().item() - 4) < 0.15 and torch.equal(g, g.round())
    m, _ = moments(x.log_normal_(0.0, 0.5))
    assert abs(m - math.exp(0.125)) < 0.03
    c = host(x.cauchy_(1.0, 2.0))
    assert abs(c.median().item() - 1.0) < 0.1
    m, s = moments(torch.normal(2.0, 3.0, (N,), device="tpu"))
    assert abs(m - 2) < 0.1 and abs(s - 3) < 0.1
    mean = torch.full((N,), 5.0, device="tpu")
    m, s = moments(torch.normal(mean, 2.0))
    assert abs(m - 5) < 0.06 and abs(s - 2) < 0.06
    m, s = moments(torch.normal(1.0, torch.full((N,), 0.1, device="tpu")))
    assert abs(m - 1) < 0.01 and abs(s - 0.1) < 0.01
    m, s = moments(torch.normal(mean, torch.full((N,), 0.1, device="tpu")))
    assert abs(m - 5) < 0.01 and abs(s - 0.1) < 0.01
    z = host(torch.randn(N, device="tpu", dtype=torch.complex64))
    assert abs(z.real.var().item() - 0.5) < 0.03 and abs(z.imag.var().item() - 0.5) < 0.03


def test_bernoulli():
    p = torch.full((N,), 0.3, device="tpu")
    b = host(torch.bernoulli(p))
    assert b.dtype == torch.float32 and set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 0.02
    x = torch.empty(N, device="tpu")
    assert abs(host(x.bernoulli_(0.8)).mean().item() - 0.8) < 0.02
    assert abs(host(x.bernoulli_(p)).mean().item() - 0.3) < 0.02
    assert abs(host(torch.bernoulli(x, 0.6)).mean().item() - 0.6) < 0.02
    probs = torch.tensor([0.0, 1.0], device="tpu").repeat(100)
    torch.testing.assert_close(host(torch.bernoulli(probs)), probs.cpu())
    assert host(torch.bernoulli(torch.full((10,), 0.5, device="tpu", dtype=torch.bfloat16))
                ).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8,
                                   torch.int8, torch.bool])
def test_random_(dtype):
    x = torch.empty(4000, device="tpu", dtype=dtype)
    r = host(x.random_(2, 6 if dtype != torch.bool else 2) if dtype != torch.bool
             else x.random_(0, 2))
    if dtype != torch.bool:
        assert r.min() >= 2 and r.max() <= 5 and len(r.unique()) == 4
    else:
        assert set(r.tolist()) == {False, True}
    r = host(x.random_(3 if dtype != torch.bool else 2))
    assert r.min() >= 0 and r.max() < 3 and len(r.unique()) == (3 if dtype != torch.bool else 2)
    r = host(x.random_())
    if dtype in (torch.float32, torch.bfloat16):
        bound = 2 ** 24 if dtype == torch.float32 else 2 ** 8
        assert r.min() >= 0 and r.max() <= bound and torch.equal(r, r.round())
        assert r.max() > bound / 2
    elif dtype != torch.bool:
        assert r.min() >= 0 and r.double().max() > torch.iinfo(dtype).max / 2
    if dtype == torch.int64:
        r = host(x.random_(-(2 ** 63), None))  # the whole int64 range
        assert r.min() < 0 < r.max()


def test_multinomial():
    w = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]], device="tpu")
    s = host(torch.multinomial(w, 4000, replacement=True))
    assert s.shape == (2, 4000) and s.dtype == torch.int64
    freq = torch.stack([torch.bincount(row, minlength=4) for row in s]).double() / 4000
    torch.testing.assert_close(freq, (w / w.sum(1, keepdim=True)).cpu().double(), atol=0.03,
                               rtol=0)
    s = host(torch.multinomial(w, 3))
    assert s.shape == (2, 3)
    for row, ws in zip(s, w.cpu()):
        assert len(row.unique()) == 3 and (ws[row] > 0).all()
    one = host(torch.multinomial(torch.tensor([0.0, 0.0, 5.0], device="tpu"), 1))
    assert one.tolist() == [2]
    # Without replacement, heavier categories come first more often.
    first = host(torch.multinomial(torch.tensor([1.0, 9.0], device="tpu").expand(2000, 2), 2))
    assert abs((first[:, 0] == 1).double().mean().item() - 0.9) < 0.03


def test_poisson_gamma_dirichlet_binomial():
    lam = torch.full((N,), 4.0, device="tpu")
    p = host(torch.poisson(lam))
    assert p.dtype == torch.float32 and torch.equal(p, p.round())
    assert abs(p.mean().item() - 4) < 0.1 and abs(p.var().item() - 4) < 0.25
    g = host(torch._standard_gamma(torch.full((N,), 3.0, device="tpu")))
    assert abs(g.mean().item() - 3) < 0.1 and abs(g.var().item() - 3) < 0.25
    d = host(torch._sample_dirichlet(torch.ones(N, 3, device="tpu")))
    torch.testing.assert_close(d.sum(1), torch.ones(N))
    b = host(torch.binomial(torch.full((N,), 10.0, device="tpu"),
                            torch.full((N,), 0.3, device="tpu")))
    assert abs(b.mean().item() - 3) < 0.1 and b.max() <= 10
    s = torch.distributions.Gamma(torch.tensor(2.0, device="tpu"),
                                  torch.tensor(1.0, device="tpu")).sample((10,))
    assert s.device.type == "tpu" and s.shape == (10,)


def test_reproducible_and_no_recompile():
    def draw():
        return [host(t) for t in (
            torch.rand(5, device="tpu"), torch.randn(5, device="tpu"),
            torch.randint(0, 100, (5,), device="tpu"), torch.randperm(7, device="tpu"),
            torch.empty(5, device="tpu").normal_(), torch.empty(5, device="tpu").uniform_(),
            torch.bernoulli(torch.full((5,), 0.5, device="tpu")),
            torch.multinomial(torch.ones(6, device="tpu"), 3))]

    torch.manual_seed(1234)
    a = draw()
    torch.manual_seed(1234)
    misses = executor.STATS.misses
    b = draw()
    assert executor.STATS.misses == misses  # the state is an input, not a constant
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    c = draw()
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])
    torch.tpu.manual_seed(99)
    d = draw()
    assert not torch.equal(a[0], d[0])
    state = torch.tpu.get_rng_state()
    e = draw()
    torch.tpu.set_rng_state(state)
    f = draw()
    for x, y in zip(e, f):
        assert torch.equal(x, y)


def test_errors_and_init():
    with pytest.raises(RuntimeError, match="std >= 0"):
        torch.empty(3, device="tpu").normal_(0, -1)
    with pytest.raises(RuntimeError):
        torch.empty(3, device="tpu").random_(5, 2)
    w = torch.empty(64, 32, device="tpu")
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    bound = 1 / math.sqrt(32)
    assert host(w).abs().max() <= bound + 1e-6
    torch.nn.init.xavier_normal_(w)
    torch.nn.init.normal_(w, std=0.02)
    assert abs(host(w).std().item() - 0.02) < 0.003
    torch.nn.init.uniform_(w, -0.1, 0.1)
    assert host(w).abs().max() <= 0.1


def test_complex_uniform_draws_both_parts():
    # PyTorch draws the real and imaginary parts independently in [from, to).
    for t in (torch.empty(N, dtype=torch.cfloat, device="tpu").uniform_(-2.0, 3.0),
              torch.rand(N, dtype=torch.cfloat, device="tpu") * 5 - (2 + 2j)):
        x = host(t)
        for part in (x.real, x.imag):
            assert part.min() >= -2.0 and part.max() < 3.0
            assert abs(part.mean().item() - 0.5) < 0.05
            assert abs(part.std().item() - 5 / math.sqrt(12)) < 0.05
        assert abs(torch.corrcoef(torch.stack([x.real, x.imag]))[0, 1].item()) < 0.05


def test_multinomial_checks_weight_values():
    # As on CPU: the no-replacement path's messages, then the sampler's.
    bad = {"neg": [1.0, -1.0, 1.0], "inf": [1.0, math.inf, 1.0], "nan": [1.0, math.nan, 1.0],
           "zero": [0.0, 0.0, 0.0]}
    for replacement in (False, True):
        for w in bad.values():
            for dev in ("cpu", "tpu"):
                with pytest.raises(RuntimeError) as e:
                    torch.multinomial(torch.tensor(w, device=dev), 2, replacement)
                msg = str(e.value).split(": ", 1)[-1] if dev == "tpu" else str(e.value)
                if dev == "cpu":
                    want = msg
            assert msg == want
    # A valid row after an all-zero one: the zero row still fails.
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        torch.multinomial(torch.tensor([[1.0, 2.0], [0.0, 0.0]], device="tpu"), 1)
