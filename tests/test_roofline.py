"""torch_tpu.debug.roofline: counts from cost analysis, rates from the measured
time, bounds against published peaks, the per-host peaks cache, and MFU in
torch_tpu.benchmark. No wall-clock thresholds: only identities between the
numbers a report shows."""

import importlib
import json
import math
import os

import pytest
import torch

import torch_tpu.debug as dbg
from torch_tpu import benchmark as bm

rl = importlib.import_module("torch_tpu.debug.roofline")

# Fixed peaks for this device, so that most tests measure nothing: a ridge of 10 FLOP/B.
HOST = rl.Peaks("test host", 1e11, 1e10, dtype="float32", source="test")


def _matmul(a, b):
    return a @ b


def _add(a, b):
    return a + b


def test_rows_are_cost_analysis_over_measured_time():
    a = torch.randn(96, 80, device="tpu")
    b = torch.randn(80, 64, device="tpu")
    prog = dbg.lower(_matmul, a, b)
    cost = prog.cost
    rep = dbg.roofline(prog, host=HOST, repeats=3)
    assert isinstance(rep, dbg.RooflineReport) and len(rep.rows) == 1
    row = rep.rows[0]
    assert row.flops == cost["flops"] == 2 * 96 * 80 * 64
    assert row.bytes_accessed == cost["bytes_accessed"] > 0
    assert row.seconds > 0
    assert row.flops_per_second == row.flops / row.seconds
    assert row.bytes_per_second == row.bytes_accessed / row.seconds
    assert row.intensity == row.flops / row.bytes_accessed
    assert row.bound == HOST.bound(row.intensity)
    ref = rl.PUBLISHED["v6e"]
    assert rep.reference == ref and row.reference_bound == ref.bound(row.intensity)
    assert row.reference_seconds == max(row.flops / ref.flops_per_second,
                                        row.bytes_accessed / ref.bytes_per_second)
    # totals and the MFU-like fraction
    assert rep.flops == row.flops and rep.seconds == row.seconds
    assert rep.mfu == rep.flops / rep.seconds / HOST.flops_per_second
    d = rep.as_dict()
    assert d["rows"][0]["flops"] == row.flops and d["mfu"] == rep.mfu


def test_summary_is_the_first_line():
    a = torch.randn(32, 32, device="tpu")
    rep = dbg.roofline(dbg.lower(_add, a, a), host=HOST, device="h100", repeats=2)
    lines = str(rep).splitlines()
    assert lines[0] == rep.summary()
    assert lines[0].startswith("roofline: 1 program,")
    assert "NVIDIA H100" in lines[0] and "memory-bound" in lines[0]
    assert "%" in lines[0]  # the fraction of this host's peak
    assert any(line.startswith("program") for line in lines)  # the table follows


def test_bound_compute_for_large_matmul_memory_for_add():
    # float32 n x n matmul: intensity 2n^3 / (3 * 4 n^2) = n / 6, above every ridge
    # in the table for n = 4096 (683 > 560, v6e's); not timed (repeats=0): only counts decide the bound.
    n = 4096
    a = torch.empty(n, n, device="tpu")
    mm = dbg.lower(_matmul, a, a)
    add = dbg.lower(_add, a, a)
    for name, peaks in rl.PUBLISHED.items():
        rep = dbg.roofline([mm, add], host=HOST, device=name, repeats=0)
        big, elementwise = rep.rows
        assert big.reference_bound == "compute", (name, big.intensity, peaks.ridge)
        assert elementwise.reference_bound == "memory", (name, elementwise.intensity)
        assert math.isnan(big.seconds) and math.isnan(rep.mfu)
        assert "not timed" in rep.summary()
    assert big.intensity == big.flops / big.bytes_accessed > rl.PUBLISHED["v7"].ridge
    assert elementwise.intensity < 1


def test_against_recomputes_the_reference_only():
    a = torch.randn(64, 64, device="tpu")
    rep = dbg.roofline(dbg.lower(_matmul, a, a), host=HOST, repeats=2)
    other = rep.against("Ironwood")
    assert other.reference is rl.PUBLISHED["v7"] and rep.reference is rl.PUBLISHED["v6e"]
    assert other.rows[0].seconds == rep.rows[0].seconds
    assert other.rows[0].reference_seconds == rl.PUBLISHED["v7"].seconds(
        rep.rows[0].flops, rep.rows[0].bytes_accessed)
    with pytest.raises(ValueError, match="no published peaks"):
        rep.against("v99")


def test_published_table_cites_its_sources():
    assert set(rl.PUBLISHED) == {"v4", "v5e", "v5p", "v6e", "v7", "h100", "h200"}
    for p in rl.PUBLISHED.values():
        assert p.source.startswith("https://") and p.ridge > 0
    assert rl.reference_peaks("TPU v6e").flops_per_second == 918e12
    assert rl.reference_peaks("trillium").bytes_per_second == 1638e9


@pytest.fixture
def fresh_programs(cache_dir):
    from torch_tpu.runtime import executor

    executor.clear_cache()
    yield
    executor.clear_cache()


def test_callable_programs_it_compiled_then_whole_call(fresh_programs):
    x = torch.randn(13, 29, device="tpu")
    w = torch.randn(29, 7, device="tpu")

    def step():
        return torch.relu(x @ w).sum()

    rep = dbg.roofline(step, host=HOST, repeats=2)
    assert rep.rows and "compiled by the call" in rep.source
    assert rep.call_seconds is not None and rep.call_seconds > 0
    progs = {p.name: p for p in dbg.last_programs(len(rep.rows))}
    for row in rep.rows:
        assert row.flops == progs[row.name].cost["flops"]
        assert row.flops_per_second == row.flops / row.seconds
    assert rep.flops == sum(r.flops for r in rep.rows)
    # Everything is cached now: the call is shown as one program, as lower() gives it.
    again = dbg.roofline(step, host=HOST, repeats=2)
    assert len(again.rows) == 1 and "debug.lower" in again.source
    assert again.rows[0].flops == dbg.lower(step).cost["flops"]
    assert any("compiled nothing new" in n for n in again.notes)


def _peaks_file(cache_dir):
    return os.path.join(str(cache_dir), "roofline", "peaks.json")


def test_host_peaks_measured_once_and_cached(cache_dir, monkeypatch):
    monkeypatch.setattr(rl, "_host_memo", {})
    calls = []
    measure = rl._measure

    def counting():
        calls.append(1)
        return measure(repeats=2)

    monkeypatch.setattr(rl, "_measure", counting)
    first = rl.host_peaks()
    assert len(calls) == 1 and first.flops_per_second > 0 and first.bytes_per_second > 0
    assert rl.is_measured(first) and "float32" in first.source and "bfloat16" in first.source
    path = _peaks_file(cache_dir)
    assert os.stat(path).st_mode & 0o077 == 0  # through cache.trust: this user's only
    data = json.loads(open(path).read())
    assert len(data) == 1
    [entry] = data.values()
    assert entry["flops_per_second"] == first.flops_per_second
    mtime = os.stat(path).st_mtime_ns
    # a new process (no memo) reads the file instead of measuring
    monkeypatch.setattr(rl, "_host_memo", {})
    assert rl.host_peaks() == first and len(calls) == 1
    assert rl.host_peaks() == first and len(calls) == 1
    assert os.stat(path).st_mtime_ns == mtime
    again = rl.host_peaks(remeasure=True)
    assert len(calls) == 2 and again.flops_per_second > 0
    assert json.loads(open(path).read())[next(iter(data))]["flops_per_second"] == \
        again.flops_per_second


def test_host_key_names_the_cpu_model_flags_and_count(cache_dir, monkeypatch):
    """Another host's entry (same hostname, another CPU) is never this host's peak."""
    model, flags = rl._cpu_identity()
    key = rl._host_key()
    assert model in key and f"{rl._cpus()} cpus" in key
    monkeypatch.setattr(rl, "_cpu_identity", lambda: (model, flags + " amx_tile"))
    assert rl._host_key() != key
    monkeypatch.setattr(rl, "_cpu_identity", lambda: (model, flags))
    monkeypatch.setattr(rl, "_cpus", lambda: 1024)
    other = rl._host_key()
    assert other != key
    os.makedirs(os.path.dirname(_peaks_file(cache_dir)), mode=0o700)
    with open(_peaks_file(cache_dir), "w") as f:
        json.dump({other: dict(name="elsewhere", flops_per_second=1.0, bytes_per_second=1.0)}, f)
    monkeypatch.undo()
    monkeypatch.setattr(rl, "_host_memo", {})
    monkeypatch.setattr(rl, "_measure", lambda: HOST_MEASURED)
    assert rl.host_peaks() == HOST_MEASURED


# This host's peaks as host_peaks would give them, set low: a calibration run
# while the machine was busy.
HOST_MEASURED = rl.Peaks("this host (test)", 1e6, 1e10, dtype="float32",
                         source="measured on this host: float32 8x8 matmul 0.001 GFLOP/s")


@pytest.fixture
def slow_calibration(cache_dir, monkeypatch):
    monkeypatch.setattr(rl, "_host_memo", {rl._host_key(): HOST_MEASURED})
    return cache_dir


def test_mfu_at_most_100_percent_benchmark(slow_calibration, monkeypatch):
    """A benchmark faster than the calibrated peak raises it: MFU <= 100 %, and the
    next report uses the raised peak (kept in the cache for the next process)."""
    a = torch.randn(64, 64, device="tpu")
    res = bm.benchmark(_matmul, a, a, warmup=1, iters=3, name="mm64")
    assert res.flops_per_second > HOST_MEASURED.flops_per_second
    assert 0 < res.mfu <= 1.0
    assert res.peak_flops_per_second == rl.host_peaks().flops_per_second >= res.flops_per_second
    assert "measured on this host: " in str(res)
    raised = rl.host_peaks()
    assert "raised to" in raised.source and "benchmark 'mm64'" in raised.source
    monkeypatch.setattr(rl, "_host_memo", {})  # a new process reads the raised peak
    assert rl.host_peaks() == raised


def test_mfu_at_most_100_percent_roofline(slow_calibration):
    a = torch.randn(64, 64, device="tpu")
    rep = dbg.roofline(dbg.lower(_matmul, a, a), repeats=2)
    assert 0 < rep.mfu <= 1.0
    assert all(r.flops_per_second <= rep.host.flops_per_second for r in rep.rows)
    assert "measured on this host: " in rep.summary() and "raised to" in rep.host.source


def test_benchmark_reports_mfu():
    a = torch.randn(48, 48, device="tpu")
    res = bm.benchmark(_matmul, a, a, warmup=1, iters=3, peaks=HOST)
    assert res.flops == 2 * 48 ** 3
    assert res.mfu == res.flops_per_second / HOST.flops_per_second
    assert "MFU" in str(res) and res.as_dict()["mfu"] == res.mfu
    table = bm.format_table([res]).splitlines()
    assert table[0].split()[-1] == "MFU" and table[2].rstrip().endswith("%")
    v6e = bm.benchmark(_matmul, a, a, warmup=1, iters=2, peaks="v6e")
    assert v6e.peak_flops_per_second == 918e12 and "TPU v6e" in str(v6e)
    none = bm.benchmark(_matmul, a, a, warmup=1, iters=2, peaks=None)
    assert none.mfu is None and "MFU" not in str(none)


def test_plot():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    a = torch.randn(64, 64, device="tpu")
    rep = dbg.roofline([dbg.lower(_matmul, a, a), dbg.lower(_add, a, a)], host=HOST, repeats=2)
    ax = rep.plot(reference="v5e")
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.get_lines()) == 4  # two roofs, two programs


_WARM_STEP = """
import json, math, torch, torch_tpu
import torch_tpu.debug as dbg
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10)).to("tpu")
fwd = torch.compile(m, backend="tpu")
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x, y = torch.randn(24, 96, device="tpu"), torch.randint(0, 10, (24,), device="tpu")

def step():
    loss = torch.nn.functional.cross_entropy(fwd(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss

r = dbg.roofline(step, repeats=2)
print("RESULT " + json.dumps({"rows": {row.name: row.seconds for row in r.rows},
                              "notes": r.notes}))
"""


def test_programs_loaded_from_the_cache_are_timed(tmp_path):
    """A warm process's programs come from the disk cache (graph tier and
    deserialized eager executables, without an input signature): roofline
    times them as it times programs compiled in the process (notebook 07
    run a second time showed them untimed)."""
    import subprocess
    import sys

    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))
    results = []
    for _ in range(2):  # cold, then warm on the filled directory
        proc = subprocess.run([sys.executable, "-c", _WARM_STEP], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT "):]))
    for res in results:
        assert {"graph_forward", "graph_backward"} <= set(res["rows"]), res
        assert res["notes"] == [] and all(math.isfinite(s) and s > 0
                                           for s in res["rows"].values()), res
