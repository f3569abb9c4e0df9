"""Self-tests of the OpInfo harness: the judge must catch what it claims to."""

from __future__ import annotations

import pytest
import torch

from . import expectations, harness


def test_cases_cover_op_db():
    names = {n for n, _ in harness.tested_ops()}
    assert not any(n.startswith("jiterator_") for n in names)
    assert {"add", "nn.functional.conv2d", "linalg.svd", "fft.fft"} <= names
    cases = list(harness.cases())
    assert any(c[2] == "bfloat16" and c[3] == "forward" for c in cases)
    assert all(c[2] == "float32" for c in cases if c[3] == "grad")


def test_expectation_keys_are_real():
    """Every XFAILS / TOLERANCES entry names a case the harness runs."""
    from .test_bad_input import BAD_CALLS, _error_ops

    cases = {(n, d, k) for n, _, d, k in harness.cases()}
    cases |= {(p.values[0], "any", "error") for p in _error_ops()}
    cases |= {(c[0], "any", "bad_call") for c in BAD_CALLS}
    stale = [k for k in expectations.XFAILS if k not in cases]
    assert not stale, f"XFAILS entries for cases that do not exist: {stale}"
    for k, v in expectations.XFAILS.items():
        assert isinstance(v, str) and v.strip(), f"XFAILS{k} needs a reason"
    pairs = {(n, d) for n, d, _ in cases}
    for k, v in expectations.TOLERANCES.items():
        assert k[:2] in pairs, f"TOLERANCES entry for an unknown case: {k}"
        assert len(v) == 3 and isinstance(v[2], str) and v[2].strip(), (
            f"TOLERANCES{k} must be (atol, rtol, reason)")
    for v in expectations.UNCHECKED_INDEX.values():
        assert isinstance(v, str) and v.strip()


def test_pick_is_evenly_spaced():
    assert harness.pick(5, 12) == [0, 1, 2, 3, 4]
    assert harness.pick(100, 3) == [0, 50, 99]
    idx = harness.pick(1440, 12)
    assert len(idx) == 12 and idx[0] == 0 and idx[-1] == 1439
    assert harness.pick(10, None) == list(range(10))


def test_quick_selection_is_a_subset_of_the_thorough_one(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_OPINFO_MAX_SAMPLES", raising=False)
    assert harness.quick()
    for dtype, grad, limit, step in ((torch.float32, False, harness.QUICK_SAMPLES, 2),
                                     (torch.float32, True, harness.QUICK_SAMPLES_OTHER, 4),
                                     (torch.bfloat16, False, harness.QUICK_SAMPLES_OTHER, 4),
                                     (torch.int64, False, harness.QUICK_SAMPLES_OTHER, 4)):
        for n in (1, 4, 5, 7, 8, 12, 13, 100, 1440):
            quick = harness.selection(n, dtype, grad=grad)
            full = harness.pick(n, harness.DEFAULT_MAX_SAMPLES)
            assert set(quick) <= set(full) and quick == sorted(quick)
            assert len(quick) == (len(full) if n <= limit else len(set(full[::step]) | {full[-1]}))
            assert len(quick) <= limit
            assert quick[0] == 0 and quick[-1] == n - 1  # first and last kept
    assert harness.selection(1440, torch.bfloat16) == [0, 523, 1047, 1439]
    monkeypatch.setenv("TORCH_TPU_OPINFO_MAX_SAMPLES", "12")
    assert not harness.quick() and harness.selection(1440) == harness.pick(1440, 12)


def test_to_tpu_keeps_layout():
    base = torch.arange(60.0).reshape(3, 4, 5)
    for t in (base, base.transpose(0, 2), base[:, ::2, 1:], base[1], base.expand(2, 3, 4, 5)):
        d = harness.to_tpu(t)
        assert d.device.type == "tpu"
        assert d.shape == t.shape and d.stride() == t.stride()
        assert d.storage_offset() == t.storage_offset()
        torch.testing.assert_close(d.cpu(), t)
    g = torch.randn(3, requires_grad=True)
    d = harness.to_tpu(g)
    assert d.requires_grad and d.is_leaf


def test_compare_catches_wrong_values_and_dtypes():
    x = torch.randn(4)
    harness.compare(x.clone(), x, {}, "ok")
    with pytest.raises(harness.Outcome, match="mismatch"):
        harness.compare(x + 1e-3, x, {}, "values")
    with pytest.raises(harness.Outcome, match="mismatch"):
        harness.compare(x.double(), x, {}, "dtype")
    with pytest.raises(harness.Outcome, match="mismatch"):
        harness.compare(x[:3], x, {}, "shape")
    harness.compare(NotImplemented, NotImplemented, {}, "non-tensor")


def test_distribution_check():
    g = torch.Generator().manual_seed(0)
    draws = lambda f: [f(torch.rand(500, generator=g)) for _ in range(8)]  # noqa: E731
    harness._compare_distribution(draws(lambda u: u), draws(lambda u: u), "same")
    with pytest.raises(harness.Outcome, match="distribution"):
        harness._compare_distribution(draws(lambda u: u + 0.1), draws(lambda u: u), "shifted")
    with pytest.raises(harness.Outcome, match="distribution"):
        harness._compare_distribution(draws(lambda u: u * 1.2), draws(lambda u: u), "scaled")
    # Correlated draws (a whole draw zeroed, like dropout2d): the design
    # effect keeps a correct distribution from failing.
    def chan(u):
        keep = torch.rand(1, generator=g) > 0.5
        return u * keep

    harness._compare_distribution([chan(torch.rand(500, generator=g)) for _ in range(30)],
                                  [chan(torch.rand(500, generator=g)) for _ in range(30)],
                                  "correlated")


def test_classify_no_lowering():
    e = NotImplementedError("The operator 'aten.foo.default' is not implemented for the tpu "
                            "device, and the CPU fallback is disabled (TORCH_TPU_CPU_FALLBACK=0).")
    assert harness.classify_exception(e) == "no lowering: aten.foo.default"


def test_fallback_switch_is_read_at_call_time():
    from torch_tpu.ops import fallback

    with harness.cpu_fallback(False):
        assert not fallback.cpu_fallback_enabled()
        with harness.cpu_fallback(True):
            assert fallback.cpu_fallback_enabled()
        assert not fallback.cpu_fallback_enabled()


def _judge(actual, expected, exact, dtype=torch.bfloat16, op="add"):
    return harness.no_less_accurate_than_cpu(op, actual, expected, exact, dtype, {})


def test_half_rule_passes_only_results_as_accurate_as_cpu():
    """bfloat16/float16 results outside the tolerance pass only when they are
    no further from the float64 result than CPU's, element by element."""
    exact = torch.tensor([100.3, 0.5, -7.0], dtype=torch.float64)
    cpu = torch.tensor([98.0, 0.5, -7.0], dtype=torch.bfloat16)  # CPU 2.3 off (half sums)
    closer = torch.tensor([100.0, 0.5, -7.0], dtype=torch.bfloat16)
    assert _judge(closer, cpu, exact)
    # as far off as CPU on the other side: passes; further: fails
    assert _judge(torch.tensor([102.5, 0.5, -7.0], dtype=torch.bfloat16), cpu, exact)
    # bound: 2.3 + rtol 0.016 * 100.3 = 3.9
    assert not _judge(torch.tensor([106.0, 0.5, -7.0], dtype=torch.bfloat16), cpu, exact)
    # where CPU is exact, a one-tolerance error is the most the tpu may add
    assert not _judge(torch.tensor([100.0, 0.53, -7.0], dtype=torch.bfloat16), cpu, exact)
    # wrong dtype or shape: never
    assert not _judge(closer.float(), cpu, exact)
    assert not _judge(closer[:2], cpu, exact)


def test_half_rule_needs_exact_agreement_where_cpu_is_not_finite():
    exact = torch.tensor([1e40, 1.0], dtype=torch.float64)  # beyond float16's range
    cpu = torch.tensor([float("inf"), 1.0], dtype=torch.float16)
    assert _judge(cpu.clone(), cpu, exact, torch.float16)
    assert not _judge(torch.tensor([0.0, 1.0], dtype=torch.float16), cpu, exact, torch.float16)
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float16)
    assert _judge(nan.clone(), nan, exact, torch.float16)
    assert not _judge(torch.tensor([5.0, 1.0], dtype=torch.float16), nan, exact, torch.float16)


def test_half_rule_scope():
    """Only half dtypes, only with a float64 run, never for precision-defined
    ops, and integer outputs must match exactly."""
    exact = torch.tensor([1.0], dtype=torch.float64)
    cpu, tpu = torch.tensor([1.5]), torch.tensor([1.0])
    assert not _judge(tpu, cpu, exact, torch.float32)
    assert not _judge(tpu.bfloat16(), cpu.bfloat16(), None)
    assert not _judge(tpu.bfloat16(), cpu.bfloat16(), exact, op="nextafter")
    idx_cpu, idx_tpu = torch.tensor([2]), torch.tensor([3])
    assert not _judge((tpu.bfloat16(), idx_tpu), (cpu.bfloat16(), idx_cpu), (exact, idx_cpu))
    assert _judge((tpu.bfloat16(), idx_cpu), (cpu.bfloat16(), idx_cpu), (exact, idx_cpu))


def test_complex64_rule_judges_against_complex128():
    """complex64 results outside the tolerance are judged against a complex128
    run the same way (distance: the magnitude of the difference); a sample's
    float32 inputs go to float64 with it."""
    exact = torch.tensor([47.0 + 3.0j, 1.0j], dtype=torch.complex128)
    cpu = torch.tensor([47.0001 + 3.0j, 1.0j], dtype=torch.complex64)
    closer = torch.tensor([47.0 + 3.00002j, 1.0j], dtype=torch.complex64)
    assert _judge(closer, cpu, exact, torch.complex64)
    # further than CPU by more than atol 1e-5 + rtol 1.3e-6 * |47+3j| (~7e-5): fails
    assert not _judge(torch.tensor([47.0 + 3.0003j, 1.0j], dtype=torch.complex64), cpu, exact,
                      torch.complex64)
    # a real output of a complex op (linalg.cond, abs): judged in float64
    assert _judge(torch.tensor([2.00001]), torch.tensor([2.00002]),
                  torch.tensor([2.0], dtype=torch.float64), torch.complex64)

    class Sample:
        input = torch.ones(2, dtype=torch.complex64)
        args = (torch.ones(2), torch.ones(2, dtype=torch.int64))
        kwargs: dict = {}

    inp, args, _ = harness._upcast_exact(Sample, torch.complex64)
    assert (inp.dtype, args[0].dtype, args[1].dtype) == (torch.complex128, torch.float64,
                                                          torch.int64)


def test_float32_is_judged_against_float64_on_the_compiled_path_only(monkeypatch):
    # A compiled graph's fused arithmetic (FMA contraction) may round float32
    # differently from CPU's kernels: there, a result at least as close to
    # float64 as CPU's passes; eager and fused stay held to CPU's results.
    exact = torch.tensor([1.0, 2.0], dtype=torch.float64)
    cpu = torch.tensor([1.0 + 1e-4, 2.0])
    closer = torch.tensor([1.0, 2.0 + 1e-6])
    worse = torch.tensor([1.0 - 3e-4, 2.0])
    monkeypatch.setenv("TORCH_TPU_OPINFO_PATH", "eager")
    assert harness.judged(torch.float32) is None
    assert not harness.no_less_accurate_than_cpu("add", closer, cpu, exact, torch.float32, {})
    monkeypatch.setenv("TORCH_TPU_OPINFO_PATH", "compiled")
    assert harness.judged(torch.float32) == {torch.float32: torch.float64}
    assert harness.no_less_accurate_than_cpu("add", closer, cpu, exact, torch.float32, {})
    assert not harness.no_less_accurate_than_cpu("add", worse, cpu, exact, torch.float32, {})
    assert harness.judged(torch.bfloat16) == {torch.bfloat16: torch.float64}  # every path


def test_exact_grads_are_the_float64_gradients(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_OPINFO_PATH", "compiled")
    from torch.testing._internal.opinfo.core import SampleInput

    x = torch.tensor([0.5, -0.25], requires_grad=True)
    sample = SampleInput(x)
    cot = torch.tensor([1.0, 2.0])
    grads = harness._exact_grads(lambda i, a, k: torch.atanh(i), sample, torch.float32,
                                 [cot], 0)
    want = cot.double() / (1 - x.detach().double() ** 2)
    assert grads[0].dtype == torch.float64
    torch.testing.assert_close(grads[0], want)
