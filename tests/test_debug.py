"""torch_tpu.debug (metrics, capture, HLO, compile log, dump dir, parity) and the profiler."""

import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import torch_tpu.debug as dbg
from torch_tpu.ops import registry

aten = torch.ops.aten
_shape_counter = iter(range(3, 10_000))


def fresh_shape():
    """A shape no other test uses: its ops compile (a cache miss) on first use.

    The second size is a prime no other test or OpInfo sample picks: with a
    common one such as 5, a test file that ran earlier on the same worker
    could already have compiled `x * x` at (3, 5), and the compile-log tests
    saw no compile.
    """
    return (next(_shape_counter), 1021)


# --------------------------------------------------------------------------
# metrics


def test_metrics_module_keeps_producer_api():
    from torch_tpu.debug import metrics

    assert callable(metrics)
    assert hasattr(metrics, "count") and hasattr(metrics, "COUNTERS")
    assert hasattr(metrics, "TRANSFER_BYTES") and hasattr(metrics, "FALLBACKS")
    assert isinstance(metrics(), dict)


def test_op_counter_increments_exactly():
    a = torch.randn(4, 4, device="tpu")
    b = torch.randn(4, 4, device="tpu")
    a + b  # warm: compiled outside the capture
    with dbg.capture() as cap:
        for _ in range(3):
            a + b
        a * b
    m = cap.metrics
    assert m["ops"]["aten.add.Tensor"] == 3
    assert m["ops"]["aten.mul.Tensor"] == 1
    assert m["ops_total"] == 4
    assert m["cache"]["hits"] >= 3
    assert m["fallbacks"] == {}


def test_reset_metrics_and_metrics_dict():
    a = torch.ones(3, device="tpu")
    dbg.reset_metrics()
    assert dbg.metrics()["ops_total"] == 0
    a + a
    a + a
    m = dbg.metrics()
    assert m["ops"]["aten.add.Tensor"] == 2
    for key in ("compiles", "cache", "fallbacks", "transfers", "synchronizations", "execute"):
        assert key in m
    assert set(m["cache"]["tiers"]) == {"memory", "disk"}


def test_transfers_and_syncs_counted():
    x = torch.arange(100, dtype=torch.float32)
    with dbg.capture() as cap:
        y = x.to("tpu")
        torch.tpu.synchronize()
        back = y.cpu()
    m = cap.metrics
    assert m["transfers"]["host_to_device"] == {"count": 1, "bytes": 400}
    assert m["transfers"]["device_to_host"]["count"] >= 1
    assert m["transfers"]["device_to_host"]["bytes"] >= 400
    assert m["synchronizations"] == 1
    torch.testing.assert_close(back, x)


_lib = torch.library.Library("torch_tpu_debug_test", "DEF")
_lib.define("cpu_only(Tensor x) -> Tensor")
_lib.impl("cpu_only", lambda x: x * 3, "CPU")


def test_fallback_shows_in_counters_report_and_log(caplog):
    x = torch.arange(4.0, device="tpu")
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="torch_tpu.fallback"):
        warnings.simplefilter("ignore")
        with dbg.capture() as cap:
            y = torch.ops.torch_tpu_debug_test.cpu_only(x)
            y = torch.ops.torch_tpu_debug_test.cpu_only(x)
    name = "torch_tpu_debug_test.cpu_only.default"
    logged = [r.getMessage() for r in caplog.records if r.name == "torch_tpu.fallback"]
    assert len(logged) == 2 and all(name in m for m in logged)
    assert cap.metrics["fallbacks"] == {name: 2}
    assert cap.metrics["fallbacks_total"] == 2
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) * 3)
    rep = dbg.fallback_report()
    assert rep[name] >= 2
    assert name in str(rep)
    assert name in dbg.metrics_report()


def test_capture_timing_and_sync_modes():
    a = torch.randn(8, 8, device="tpu")
    a + a
    with dbg.capture(timing=True) as cap:
        a + a
        a + a
    ex = cap.metrics["execute"]
    assert ex["mode"] == "dispatch"
    assert ex["per_op"]["aten.add.Tensor"]["calls"] == 2
    assert ex["per_op"]["aten.add.Tensor"]["seconds"] > 0
    with dbg.capture(sync=True) as cap:
        a * a
    assert cap.metrics["execute"]["mode"] == "sync"
    assert cap.metrics["execute"]["per_op"]["aten.mul.Tensor"]["calls"] == 1
    # Without timing, no execute times are recorded.
    with dbg.capture() as cap:
        a + a
    assert cap.metrics["execute"]["per_op"] == {}
    assert "aten.add.Tensor" in cap.report()


# --------------------------------------------------------------------------
# compile log and dump directory


def test_compile_log_events_match_cache_misses():
    shape = fresh_shape()
    x = torch.ones(shape, device="tpu")
    y = torch.ones(shape, device="tpu")
    last = max((e.seq for e in dbg.compile_log()), default=-1)  # the log is bounded
    with dbg.capture() as cap:
        x * y
        x * y  # hit
        x - y
    events = [e for e in dbg.compile_log() if e.seq > last]
    assert len(events) == cap.metrics["compiles"]["count"] == cap.metrics["cache"]["misses"]
    names = [e.name for e in events]
    assert names.count("aten.mul.Tensor") == 1
    assert names.count("aten.sub.Tensor") == 1
    for e in events:
        assert e.kind == "op"
        assert e.tier in ("compile", "disk")
        assert e.seconds > 0
        assert e.program_bytes > 0
        assert re.fullmatch(r"[0-9a-f]{10}", e.key_hash)
    ev = [e for e in events if e.name == "aten.mul.Tensor"][0]
    assert "multiply" in ev.program.optimized
    assert ev.program.cost["flops"] > 0
    assert sum(cap.metrics["compiles"]["by_tier"].values()) == len(events)


def test_dump_dir_receives_named_files(tmp_path):
    shape = fresh_shape()
    x = torch.ones(shape, device="tpu")
    with dbg.dump_to(tmp_path):
        x * x
    files = sorted(os.listdir(tmp_path))
    pat = re.compile(r"(\d{5})-aten\.mul\.Tensor-([0-9a-f]{10})\.optimized\.hlo\.txt")
    matches = [f for f in files if pat.fullmatch(f)]
    assert len(matches) == 1, files
    ev = [e for e in dbg.compile_log() if e.name == "aten.mul.Tensor"][-1]
    seq, key = pat.fullmatch(matches[0]).groups()
    # numbered from 1 in a new directory, whatever compiled before
    assert int(seq) == min(int(f[:5]) for f in files) == 1 and key == ev.key_hash
    assert str(tmp_path / matches[0]) in ev.dumped
    text = (tmp_path / matches[0]).read_text()
    assert "HloModule" in text and "multiply" in text
    # Outside the block nothing more is written.
    x + x * 2
    assert sorted(os.listdir(tmp_path)) == files
    # A directory used again continues its numbers.
    with dbg.dump_to(tmp_path):
        x.sin()
    new = [f for f in sorted(os.listdir(tmp_path)) if f not in files]
    assert new and min(int(f[:5]) for f in new) == max(int(f[:5]) for f in files) + 1, new


def test_compile_log_through_logging(caplog):
    shape = fresh_shape()
    x = torch.ones(shape, device="tpu")
    with caplog.at_level(logging.INFO, logger="torch_tpu.compile"):
        x * x
        # A background compile logs when it ends; reading the log waits for it.
        dbg.compile_log()
    msgs = [r.getMessage() for r in caplog.records if r.name == "torch_tpu.compile"]
    assert any("aten.mul.Tensor" in m and "key=" in m for m in msgs), msgs


def test_set_log_validates():
    with pytest.raises(ValueError, match="compile"):
        dbg.set_log("bogus")
    dbg.set_log("all")
    assert logging.getLogger("torch_tpu.compile").level == logging.INFO
    assert logging.getLogger("torch_tpu.fallback").level == logging.INFO
    dbg.set_log(None)
    assert logging.getLogger("torch_tpu.compile").level == logging.NOTSET


def test_env_log_and_dump_dir_in_new_process(tmp_path):
    code = ("import torch, torch_tpu\n"
            "x = torch.ones(3, 7, device='tpu')\n"
            "y = (x * 2).cpu()\n")
    env = {**os.environ, "TORCH_TPU_LOG": "all", "TORCH_TPU_DUMP_DIR": str(tmp_path),
           "TORCH_TPU_CACHE_DIR": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"\[torch_tpu\.compile\] compile aten\.mul\.Tensor", out.stderr), out.stderr
    assert any(re.fullmatch(r"\d{5}-aten\.mul\.Tensor-[0-9a-f]{10}\.optimized\.hlo\.txt", f)
               for f in os.listdir(tmp_path))


# --------------------------------------------------------------------------
# HLO


def test_hlo_of_eager_function_all_stages():
    a = torch.randn(4, 4, device="tpu")
    b = torch.randn(4, 4, device="tpu")

    def f(a, b):
        return a * b + 1

    shlo = dbg.hlo(f, a, b)
    assert "stablehlo.multiply" in shlo and "stablehlo.add" in shlo
    pre = dbg.hlo(f, a, b, stage="hlo")
    assert pre.startswith("HloModule") and "multiply(" in pre and "add(" in pre
    opt = dbg.hlo(f, a, b, stage="optimized")
    assert "HloModule" in opt and "fusion" in opt
    prog = dbg.lower(f, a, b)
    assert prog.cost["flops"] == 32.0  # 16 multiplies + 16 adds
    assert prog.cost["bytes_accessed"] > 0
    assert prog.memory["argument_size_in_bytes"] == 128
    assert prog.memory["output_size_in_bytes"] == 64


def test_hlo_of_matmul_plus_one_has_dot_and_add():
    assert aten.mm.default in registry.LOWERINGS
    a = torch.randn(4, 4, device="tpu")
    b = torch.randn(4, 4, device="tpu")
    text = dbg.hlo(lambda a, b: a @ b + 1, a, b, stage="hlo")
    assert re.search(r"\bdot\(", text) and re.search(r"\badd\(", text), text
    assert dbg.cost_analysis(lambda a, b: a @ b, a, b)["flops"] == 2 * 4 * 4 * 4


def test_hlo_of_single_op_and_module_and_graph():
    a = torch.randn(3, 4, device="tpu")
    b = torch.randn(3, 4, device="tpu")
    assert "stablehlo.add" in dbg.hlo(aten.add.Tensor, a, b)
    assert "stablehlo.subtract" in dbg.hlo(aten.sub, a, b)
    m = torch.nn.ReLU()
    assert "stablehlo.maximum" in dbg.hlo(m, a)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x) * 2

    gm = torch.fx.symbolic_trace(M())
    text = dbg.hlo(gm, a, stage="hlo")
    assert "exponential(" in text and "multiply(" in text
    # a torch.compile'd callable: the program of the function it wraps
    compiled = torch.compile(M(), backend="tpu")
    assert "stablehlo.exponential" in dbg.hlo(compiled, a)


def test_hlo_module_parameters_are_program_inputs():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).to("tpu")
    x = torch.randn(2, 4, device="tpu")
    prog = dbg.lower(lin, x)
    # x, weight, bias are parameters, not constants baked into the program
    assert prog.memory["argument_size_in_bytes"] == 4 * (3 * 4 + 3 + 2 * 4)


def test_hlo_bad_input():
    a = torch.ones(2, device="tpu")
    with pytest.raises(ValueError, match="function.*nn.Module.*ATen op.*GraphModule"):
        dbg.hlo(42, a)
    with pytest.raises(ValueError, match="function"):
        dbg.hlo("aten.add", a)
    with pytest.raises(ValueError, match="'stablehlo', 'hlo', 'optimized'"):
        dbg.hlo(lambda x: x + 1, a, stage="llvm")


def test_last_graphs_forward_and_backward():
    def f(x):
        return (torch.sin(x) * 3).sum()

    x = torch.randn(5, 6, device="tpu", requires_grad=True)
    cf = torch.compile(f, backend="tpu")
    n0 = len(dbg.compile_log(kind="graph"))
    loss = cf(x)
    loss.backward()
    events = dbg.compile_log(kind="graph")[n0:]
    assert [e.name for e in events] == ["graph_forward", "graph_backward"]
    fw, bw = dbg.last_graphs(2)
    assert "sine" in fw.optimized
    assert "cosine" in bw.optimized
    torch.testing.assert_close(x.grad.cpu(), 3 * torch.cos(x.detach().cpu()))
    # Timing captures (and the profiler) leave compiled code compiled.
    with dbg.capture(timing=True) as cap:
        cf(x.detach())
    assert "aten.sin.default" not in cap.metrics["ops"]


# --------------------------------------------------------------------------
# parity


def test_parity_reports_every_layer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    rep = dbg.parity(model, x)
    assert [r.name for r in rep] == ["0", "1", "2", ""]
    assert rep["0"].shapes == [[5, 16]]
    assert rep.max_abs < 1e-4
    assert rep.first_divergence(atol=1e-4, rtol=1e-4) is None
    assert next(model.parameters()).device.type == "cpu"  # the original is untouched
    assert "Linear" in str(rep)


class _Skewed(torch.nn.Module):
    def forward(self, x):
        return x + (0.5 if x.device.type == "tpu" else 0.0)


def test_parity_finds_first_divergent_layer():
    model = torch.nn.Sequential(torch.nn.Tanh(), _Skewed(), torch.nn.Tanh())
    rep = dbg.parity(model, torch.randn(3, 4))
    bad = rep.first_divergence(atol=1e-4, rtol=1e-4)
    assert bad is not None and bad.name == "1" and bad.module == "_Skewed"
    assert abs(bad.max_abs - 0.5) < 1e-5
    with pytest.raises(ValueError):
        dbg.parity(lambda x: x, torch.ones(1))


# --------------------------------------------------------------------------
# profiler


def test_profiler_writes_trace_with_op_names(tmp_path):
    from torch_tpu import profiler

    x = torch.randn(16, 16, device="tpu")
    with profiler.trace(tmp_path) as prof:
        with profiler.step(0):
            with profiler.annotate("my_region"):
                y = (x * 2 + 1).sum()
    assert not profiler.is_tracing()
    assert prof.xplane is not None and os.path.getsize(prof.xplane) > 0
    assert all(str(tmp_path) in f for f in prof.files)
    jsons = [f for f in prof.files if f.endswith(".trace.json.gz")]
    assert jsons
    names = {e.get("name") for e in profiler.trace_events(jsons[0])}
    assert {"aten.mul.Tensor", "aten.add.Tensor", "aten.sum.default", "my_region"} <= names
    assert float(y.cpu()) == pytest.approx(float((x.cpu() * 2 + 1).sum()), rel=1e-5)
    with pytest.raises(RuntimeError):
        profiler.stop()


def test_report_tells_calls_from_programs_run():
    """A timed report counts an op's calls apart from the programs it ran: a
    view runs none, and an op that runs inside another op's call is 'nested'
    (its time is its caller's), not a row with calls 0 and a time."""
    x = torch.randn(fresh_shape(), device="tpu")
    torch.ones_like(x)  # compiled outside the capture
    x.reshape(-1).sin()
    with dbg.capture(timing=True) as cap:
        torch.ones_like(x)
        x.view(-1).sin()
    report = dbg.metrics_report(cap.metrics)
    rows = {line.split()[0]: line.split()[1:] for line in report.splitlines()
            if line.startswith("aten.")}
    assert "programs run" in report and "ops executed" not in report
    assert rows["aten.view.default"][:2] == ["1", "0"], report  # 1 call, no program
    assert rows["aten.sin.default"][:2] == ["1", "1"], report
    for _name, cols in rows.items():  # no op timed with zero calls
        assert cols[0] != "0", report
