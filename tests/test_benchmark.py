"""torch_tpu.benchmark: timing, results, plots, model registry and the CLI."""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_tpu import benchmark as bm


@pytest.fixture
def no_programs(cache_dir):
    """No program of any op in memory or on disk (a private, empty disk tier):
    whatever ran before in this worker or in an earlier run on a shared cache,
    the programs a test needs are compiled in it."""
    from torch_tpu.runtime import executor

    executor.clear_cache()
    yield
    executor.clear_cache()  # nothing here refers to the private directory later


def _statistics_run():
    a = torch.randn(6, 11, device="tpu")
    b = torch.randn(6, 11, device="tpu")
    calls = []

    def f(a, b):
        calls.append(1)
        return a * b + 1

    res = bm.benchmark(f, a, b, warmup=2, iters=7)
    return res, calls


def test_benchmark_result_statistics_and_flops(no_programs):
    res, calls = _statistics_run()
    # warm-up, timed calls, and one trace with fake tensors for the FLOP count
    assert len(calls) == 2 + 7 + 1
    assert res.iters == 7 and len(res.times) == 7
    assert res.min <= res.median <= res.p90 <= res.max
    assert all(t > 0 for t in res.times)
    assert res.compiles == 2  # mul and add: no program exists before (no_programs)
    assert res.recompiles == 0
    assert res.flops == 2 * 6 * 11  # XLA's cost analysis: one mul + one add per element
    assert res.flops_per_second == pytest.approx(res.flops / res.median)
    d = res.as_dict()
    assert d["median"] == res.median and d["iters"] == 7
    assert "median" in str(res) and "GFLOP/s" in str(res)


@pytest.mark.slow  # compares measured seconds: flaky on a loaded machine
def test_benchmark_first_call_includes_its_compiles(no_programs):
    res, _ = _statistics_run()
    assert res.compile_seconds > 0
    # The first call includes its compiles (the second compiles nothing);
    # they may run in parallel on the background pool (runtime.async_compile),
    # and compile_seconds is their wall-clock union, so it fits in the call.
    assert res.first_call_seconds >= res.compile_seconds


def _printed_seconds(text):
    return float(text[:-3]) * 1e-3 if text.endswith(" ms") else (
        float(text[:-3]) * 1e-6 if text.endswith(" us") else float(text[:-2]))


def test_benchmark_compile_is_wall_time_within_what_it_is_printed_with(no_programs):
    """The second warm-up call compiles (a new shape): the warm-up's compile time then
    exceeds the first call's, so each is printed with the wall time that holds it."""
    import re

    shapes = iter([(5, 7), (9, 13)])

    def f():
        x = torch.ones(*next(shapes, (9, 13)), device="tpu")
        return torch.tanh(x @ x.T + 1).sum(0)

    res = bm.benchmark(f, warmup=2, iters=2, flops=None)
    assert 0 < res.first_call_compile_seconds <= res.first_call_seconds
    assert res.first_call_compile_seconds < res.compile_seconds <= res.warmup_seconds
    assert res.first_call_seconds < res.warmup_seconds
    text = str(res)
    m = re.search(r"first call ([\d.]+ \w?s) \(compiling ([\d.]+ \w?s) of it\); "
                  r"warm-up 2 calls ([\d.]+ \w?s) \(compiling ([\d.]+ \w?s) of it", text)
    assert m, text
    first, first_compile, warm, warm_compile = map(_printed_seconds, m.groups())
    assert first_compile <= first and warm_compile <= warm, text
    table = bm.format_table([res]).splitlines()
    assert "of it compiling" in table[0]


def test_benchmark_explicit_flops_sync_modes_and_progress():
    x = torch.randn(16, device="tpu")
    seen = []
    res = bm.benchmark(lambda x: x.sum(), x, warmup=1, iters=3, flops=1e6, sync="device",
                       progress=lambda *a: seen.append(a))
    assert res.flops == 1e6
    assert [s[0] for s in seen] == ["warmup", "timed", "timed", "timed"]
    assert [s[1] for s in seen] == [1, 1, 2, 3]
    res = bm.benchmark(lambda x: x + 1, x, warmup=1, iters=2, flops=None, sync="none")
    assert res.flops is None and res.flops_per_second is None


def test_benchmark_counts_recompiles(no_programs):
    shapes = iter([(k, 3) for k in range(21, 40)])

    def f():
        return torch.ones(next(shapes), device="tpu") * 3

    with pytest.warns(UserWarning, match="compiled during the timed calls"):
        res = bm.benchmark(f, warmup=1, iters=2, flops=None)
    assert res.recompiles == 4  # ones and mul, for each timed call's new shape


def test_benchmark_bad_arguments():
    with pytest.raises(ValueError):
        bm.benchmark(42)
    with pytest.raises(ValueError, match="sync"):
        bm.benchmark(lambda: None, sync="sometimes")
    with pytest.raises(ValueError):
        bm.benchmark(lambda: None, warmup=0)


def test_plot(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    res = bm.BenchmarkResult("demo", [0.001, 0.002, 0.0015], warmup=1, first_call_seconds=0.5,
                             compile_seconds=0.4, compiles=2, recompiles=0)
    ax = res.plot()
    assert ax.get_title() == "demo"
    assert len(ax.lines[0].get_xdata()) == 3
    ax2 = res.plot(kind="hist")
    assert ax2.get_xlabel() == "ms"
    ax.figure.savefig(tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0
    with pytest.raises(ValueError):
        res.plot(kind="pie")


def test_percentiles():
    res = bm.BenchmarkResult("p", [float(i) for i in range(1, 11)], 1, 0.0, 0.0, 0, 0)
    assert res.median == 5.5
    assert res.p90 == pytest.approx(9.1)
    assert res.min == 1.0 and res.max == 10.0
    empty = bm.BenchmarkResult("e", [], 1, 0.0, 0.0, 0, 0)
    assert math.isnan(empty.median)


def test_registry_and_cases(tmp_path):
    @bm.register_model("test-double", description="doubles a vector")
    def case(device="tpu", batch_size=None):
        x = torch.ones(batch_size or 4, device=device)
        return (lambda x: x * 2), (x,)

    assert bm.models()["test-double"] == "doubles a vector"
    c = bm.get_case("test-double", batch_size=3)
    assert c.name == "test-double"
    torch.testing.assert_close(c.fn(*c.args).cpu(), torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="already registered"):
        bm.register_model("test-double", case)
    with pytest.raises(ValueError, match="unknown benchmark model"):
        bm.get_case("no-such-model")
    for name in ("matmul", "mlp", "mlp-train"):
        assert name in bm.models()
    c = bm.get_case("matmul", batch_size=8)
    assert c.flops == 2 * 8 ** 3
    assert c.fn(*c.args).shape == (8, 8)


def test_script_cases(tmp_path):
    with_case = tmp_path / "with_case.py"
    with_case.write_text(textwrap.dedent("""
        import torch
        def benchmark_case(device="tpu", batch_size=None):
            x = torch.ones(batch_size or 2, device=device)
            return (lambda x: x + 1), (x,)
    """))
    c = bm.get_case(str(with_case))
    assert c.name == "with_case"
    torch.testing.assert_close(c.fn(*c.args).cpu(), torch.full((2,), 2.0))
    with_main = tmp_path / "with_main.py"
    with_main.write_text("def main():\n    return 7\n")
    assert bm.get_case(str(with_main)).fn() == 7
    plain = tmp_path / "plain.py"
    plain.write_text("result = 1 + 1\n")
    c = bm.get_case(str(plain))
    assert c.fn()["result"] == 2
    with pytest.raises(FileNotFoundError):
        bm.get_case(str(tmp_path / "missing.py"))


def test_cli_runs_model_and_script_prints_table(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(textwrap.dedent("""
        import torch
        def benchmark_case(device="tpu", batch_size=None):
            x = torch.ones(4, device=device)
            return (lambda x: x * 3), (x,)
    """))
    out_json = tmp_path / "r.json"
    # Autoload off: `python -m torch_tpu...` imports torch_tpu before torch.
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch_tpu.benchmark", "matmul", str(script), "--iters", "2",
         "--warmup", "1", "--batch-size", "16", "--json", str(out_json)],
        capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["benchmark", "median", "min", "p90"]
    assert lines[2].startswith("matmul") and lines[3].startswith("tiny")
    assert "3/3" in proc.stderr  # the progress bar reached the end
    data = json.loads(out_json.read_text())
    assert [d["name"] for d in data] == ["matmul", "tiny"]
    assert data[0]["flops"] == 2 * 16 ** 3 and len(data[0]["times"]) == 2


def test_cli_list_and_unknown(capsys):
    from torch_tpu.benchmark.__main__ import main

    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "mlp-train" in out and "matmul" in out
    assert main(["definitely-not-a-model"]) == 2
    assert "unknown benchmark model" in capsys.readouterr().err


def test_example_models_found_by_name(tmp_path, monkeypatch):
    pkg = tmp_path / "examples" / "tinybench"
    pkg.mkdir(parents=True)
    (tmp_path / "examples" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .model import double\n")
    (pkg / "model.py").write_text("def double(x):\n    return x * 2\n")
    (pkg / "benchmark.py").write_text(textwrap.dedent("""
        import torch
        from .model import double
        def benchmark_case(device="tpu", batch_size=None):
            return double, (torch.ones(batch_size or 5, device=device),)
    """))
    monkeypatch.chdir(tmp_path)
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert bm.models()["tinybench"] == "examples/tinybench"
        case = bm.get_case("tinybench", batch_size=2)
        assert case.name == "tinybench"
        torch.testing.assert_close(case.fn(*case.args).cpu(), torch.full((2,), 2.0))
    finally:
        for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
            del sys.modules[name]
