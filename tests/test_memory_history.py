"""torch.tpu.memory's history (issue 53): PyTorch's snapshot schema, rendered
by PyTorch's own `torch.cuda._memory_viz`; alloc/free events that balance;
the timeline's peak is max_memory_allocated's; nothing recorded when off;
eager, fused and compiled regions all record."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

import torch_tpu
import torch_tpu.debug as ttd
from torch_tpu.runtime import memory_history

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

MIB = 2**20


@pytest.fixture
def history():
    """Record for one test; always stopped after."""
    torch.tpu.synchronize()
    torch.tpu.memory._record_memory_history(max_entries=100_000)
    try:
        yield torch.tpu.memory
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)


def _step(x, w):
    """1 MiB tensors: a + 1 while a lives, then an in-place op (a new array
    while the old one is alive: XLA arrays are immutable)."""
    a = x * w
    b = a + 1
    del a
    b.mul_(2)
    return b


def _events(snap, action):
    return [e for e in snap["device_traces"][0] if e["action"] == action]


def _ops(snap):
    return {e["frames"][0]["name"] for e in _events(snap, "alloc") if e["frames"]}


def test_snapshot_renders_in_pytorchs_memory_viz(history, tmp_path):
    x = torch.randn(512, 512, device="tpu")
    y = _step(x, x)
    del y
    torch.tpu.synchronize()
    snap = history._snapshot()
    for html in (_memory_viz.trace_plot(snap), _memory_viz.segment_plot(snap)):
        assert "snapshot.pickle" in html and "add_local_files" in html
    text = _memory_viz.trace(snap)  # the text trace walks every event
    assert f"{len(snap['device_traces'][0])} entries" in text and "TOTAL MEM" in text
    assert _memory_viz.segsum(snap)  # the segment summary reads every segment
    path = tmp_path / "snap.pickle"
    history._dump_snapshot(str(path))
    out = tmp_path / "out.html"
    subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path),
                    "-o", str(out)], check=True, timeout=120)
    assert pickle.loads(path.read_bytes())["device_traces"][0]
    assert "add_local_files" in out.read_text()


def test_alloc_and_free_events_balance(history):
    x = torch.randn(512, 512, device="tpu")
    y = _step(x, x)
    del x, y
    torch.tpu.synchronize()
    snap = history._snapshot()
    allocs = {e["addr"]: e["size"] for e in _events(snap, "alloc")}
    freed = {e["addr"]: e["size"] for e in _events(snap, "free_completed")}
    requested = {e["addr"] for e in _events(snap, "free_requested")}
    assert set(freed) == requested
    live = {s["address"] for s in snap["segments"]}
    # Every allocation is freed exactly once or is still live (a segment).
    for addr, size in allocs.items():
        assert (addr in freed) != (addr in live), addr
        if addr in freed:
            assert freed[addr] == size
    assert {"aten.mul.Tensor", "aten.add.Tensor", "aten.mul_.Tensor"} <= _ops(snap)
    frames = [f["filename"] for e in _events(snap, "alloc") for f in e["frames"]]
    assert __file__ in frames  # the user's line is on the stack


def test_timeline_peak_is_max_memory_allocated(history):
    x = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    y = _step(x, x)
    torch.tpu.synchronize()
    peak = torch.tpu.max_memory_allocated()
    tl = ttd.memory_timeline(history._snapshot())
    assert tl.peak == peak
    # a and b live together; a dies; mul_'s new array is made while the old
    # b lives: two 1 MiB arrays at most besides x (plus cached device scalars).
    assert base + 2 * MIB <= peak < base + 2 * MIB + 4096
    assert tl.bytes[-1] == torch.tpu.memory_allocated()
    assert "aten.mul_.Tensor" in dict(tl.top_ops) or "aten.add.Tensor" in dict(tl.top_ops)
    assert "peak" in str(tl) and "by op" in str(tl)
    history._record_memory_history(enabled=None)
    assert torch.tpu.max_memory_allocated() == peak  # kept after the history stops
    del y


def test_timeline_plot_marks_the_peak(history):
    matplotlib = pytest.importorskip("matplotlib", reason="the guide extra (matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = torch.randn(512, 512, device="tpu")
    _step(x, x)
    fig, ax = plt.subplots()
    tl = ttd.memory_timeline(None, ax=ax, top=3)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(lbl.startswith("peak") for lbl in labels)
    assert len(labels) == 1 + len(tl.top_ops) and len(tl.top_ops) <= 3
    plt.close(fig)


def test_nothing_is_recorded_when_off():
    from torch_tpu.runtime import storage

    torch.tpu.memory._record_memory_history()
    x = torch.randn(256, 256, device="tpu")
    torch.tpu.synchronize()
    torch.tpu.memory._record_memory_history(enabled=None)
    rec = memory_history.RECORDER
    n = len(rec.events[0])
    assert n > 0 and storage.RECORD is None
    _step(x, x)
    with torch_tpu.fused():
        _step(x, x)
    torch.tpu.synchronize()
    torch.tpu.memory_allocated()
    assert len(memory_history.RECORDER.events[0]) == n
    assert all(b.ref is None for b in rec.blocks.values())  # no free callbacks either


def test_fused_region_records(history):
    x = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    with torch_tpu.fused():
        y = _step(x, x)
    torch.tpu.synchronize()
    snap = history._snapshot()
    assert any(op.endswith("(fused)") for op in _ops(snap))
    assert y.sum().item() == pytest.approx(((x * x + 1) * 2).sum().item(), rel=1e-5)


def test_compiled_region_records(history):
    f = torch.compile(_step, backend="tpu")
    x = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    n0 = len(_events(history._snapshot(), "alloc"))
    y = f(x, x)
    torch.tpu.synchronize()
    snap = history._snapshot()
    made = [e for e in _events(snap, "alloc")[n0:] if e["size"] == MIB]
    assert made and all(memory_history.UNTRACKED not in str(e["frames"]) for e in made)
    assert __file__ in {f["filename"] for e in made for f in e["frames"]}
    torch.testing.assert_close(y.cpu(), (x.cpu() * x.cpu() + 1) * 2)


def test_record_memory_history_rejects_bad_arguments_with_value_error():
    with pytest.raises(ValueError, match="enabled"):
        torch.tpu.memory._record_memory_history(enabled="some")
    with pytest.raises(ValueError, match="skip_actions"):
        torch.tpu.memory._record_memory_history(skip_actions=["nope"])
