"""Why a program compiled again: compile events' reasons and explain_recompiles.

Each test starts from an empty compile log and program cache, so the first
compile of an op in it is a first compile (no reason) and every later one is
compared with it. Inputs are made on the CPU and moved, so that the only
compiles are the ops under test.
"""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401
import torch_tpu.debug as dbg
from torch_tpu.runtime import key_decode, programs


@pytest.fixture(autouse=True)
def fresh_log():
    programs.clear()
    dbg.clear_compile_log()
    yield
    dbg.clear_compile_log()


def tpu(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype).to("tpu")


def events_of(name):
    return dbg.compile_log(name=name)


def only_change(ev):
    assert ev.reason is not None, ev
    assert len(ev.reason.changes) == 1, str(ev.reason)
    return ev.reason.changes[0]


def test_first_compile_has_no_reason_and_hits_record_nothing():
    x = tpu(3, 17)
    (x + 1).cpu()
    (x + 1).cpu()  # a hit: no event
    evs = events_of("aten.add.Tensor")
    assert len(evs) == 1
    assert evs[0].reason is None
    report = dbg.explain_recompiles()
    assert report.recompiles == 0
    assert str(report).startswith("no recompiles")


def test_shape_change():
    (tpu(4, 8) + 1).cpu()
    (tpu(4, 9) + 1).cpu()
    first, second = events_of("aten.add.Tensor")
    change = only_change(second)
    assert str(change) == "arg 0 shape (4, 8) -> (4, 9)"
    assert change.cause == "shape"
    assert second.reason.previous == first.seq
    report = dbg.explain_recompiles("aten.add.Tensor")
    text = str(report)
    assert text.splitlines()[0].startswith("1 recompile(s) of 1 op(s)")
    assert "aten.add.Tensor: 1 recompile(s)" in text
    assert "arg 0 shape (4, 8) -> (4, 9)" in text
    assert "bucket" in report.hints("aten.add.Tensor")["shape"]
    assert second.as_dict()["reason"] == "arg 0 shape (4, 8) -> (4, 9)"


def test_dtype_change():
    (tpu(5, 3) * tpu(5, 3)).cpu()
    (tpu(5, 3, dtype=torch.bfloat16) * tpu(5, 3, dtype=torch.bfloat16)).cpu()
    ev = events_of("aten.mul.Tensor")[-1]
    fields = {c.field: c for c in ev.reason.changes}
    assert str(fields["arg 0 dtype"]) == "arg 0 dtype float32 -> bfloat16"
    assert str(fields["arg 1 dtype"]) == "arg 1 dtype float32 -> bfloat16"
    assert ev.reason.causes == ["dtype"]
    assert "cast once" in dbg.explain_recompiles().hints("aten.mul.Tensor")["dtype"]


def test_static_scalar_value_change():
    # dropout's p is a float argument: baked into the program (the key holds it).
    x = tpu(6, 4)
    torch.nn.functional.dropout(x, p=0.25).cpu()
    torch.nn.functional.dropout(x, p=0.5).cpu()
    ev = events_of("aten.native_dropout.default")[-1]
    change = only_change(ev)
    assert str(change) == "arg 1 (p) value 0.25 -> 0.5"
    assert change.cause == "static value"
    hint = dbg.explain_recompiles().hints("aten.native_dropout.default")["static value"]
    assert "as a tensor" in hint


def test_python_scalar_value_is_no_recompile_but_its_type_is():
    x = tpu(2, 7)
    (x * 2.5).cpu()
    (x * 3.5).cpu()  # the value is a runtime input: a hit
    (x * 3).cpu()    # an int instead of a float
    evs = events_of("aten.mul.Tensor")
    assert len(evs) == 2
    change = only_change(evs[1])
    assert str(change) == "arg 1 (other) value runtime float -> runtime int"
    assert change.cause == "scalar type"


def test_precision_change():
    a = tpu(6, 6)
    before = torch.tpu.get_matmul_precision()
    try:
        torch.tpu.set_matmul_precision("highest")
        (a @ a).cpu()
        torch.tpu.set_matmul_precision("high")
        (a @ a).cpu()
    finally:
        torch.tpu.set_matmul_precision(before)
    ev = events_of("aten.mm.default")[-1]
    change = only_change(ev)
    assert change.field == "precision" and change.cause == "precision"
    assert change.old != change.new
    assert "set_matmul_precision" in dbg.explain_recompiles().hints("aten.mm.default")["precision"]


def test_opt_level_change():
    from torch_tpu.runtime import opt_level

    x = tpu(3, 11)
    level = opt_level.level()
    try:
        opt_level.set_level(3)
        (x - 1).cpu()
        opt_level.set_level(1)
        (x - 1).cpu()
    finally:
        opt_level.set_level(level)
    change = only_change(events_of("aten.sub.Tensor")[-1])
    assert str(change) == "opt level 3 -> 1"


def test_same_key_after_the_cache_dropped_it():
    x = tpu(2, 13)
    (x + 1).cpu()
    programs.clear()
    (x + 1).cpu()
    ev = events_of("aten.add.Tensor")[-1]
    assert ev.reason is not None and ev.reason.changes == []
    assert ev.reason.causes == ["evicted"]
    assert "TORCH_TPU_CACHE_SIZE" in dbg.explain_recompiles().hints("aten.add.Tensor")["evicted"]


def test_nearest_earlier_key_is_compared():
    (tpu(4, 8) + 1).cpu()
    (tpu(4, 8, dtype=torch.bfloat16) + 1).cpu()
    (tpu(4, 9) + 1).cpu()  # one field from the first, two from the second
    ev = events_of("aten.add.Tensor")[-1]
    assert [str(c) for c in ev.reason.changes] == ["arg 0 shape (4, 8) -> (4, 9)"]
    assert ev.reason.previous == events_of("aten.add.Tensor")[0].seq


def test_key_fields_name_every_argument():
    x = tpu(4, 6)
    torch.cat([x, x[1:3]], 0).cpu()
    key = next(k for k in programs.CACHE if type(k) is tuple and k[0] is torch.ops.aten.cat.default)
    fields = key_decode.key_fields(key)
    assert fields["arg 0 length"] == "2"
    assert fields["arg 0[0] shape"] == "(4, 6)"
    assert fields["arg 0[1] shape"] == "(2, 6)"
    assert fields["arg 0[1] layout"].startswith("view, strides (6, 1)")
    assert fields["arg 0[1] storage"] == "shared with arg 0[0]"
    assert fields["arg 1 (dim) value"] == "0"
    assert [f for f in fields][-4:] == ["device", "default dtype", "precision", "opt level"]


def test_compiled_graph_shape_change_has_dynamo_guard_and_bucket(monkeypatch):
    # Traced in this process (a warm one would load both graphs from the
    # function's package and recompile nothing).
    monkeypatch.setenv("TORCH_TPU_PRECOMPILE", "0")

    def scaled_sum(x):
        return (x * 3).sum(1)

    fn = torch.compile(scaled_sum, backend="tpu")
    for n in (8, 9, 10, 20):
        fn(tpu(4, n)).cpu()
    graphs = [ev for ev in dbg.compile_log(kind="graph")]
    assert graphs[0].reason is None
    guarded = [ev for ev in graphs if ev.reason is not None and ev.reason.guard]
    assert len(guarded) == 1
    reason = guarded[0].reason
    assert "size mismatch at index 1. expected 8, actual 9" in reason.guard
    assert "input 0 shape (4, 8) -> (4, 9)" in [str(c) for c in reason.changes]
    assert "scaled_sum" in reason.group
    # The symbolic graph then compiles once per bucket: 16 for 9 and 10, 32 for 20.
    bucketed = [ev for ev in graphs if ev.name.endswith("_bucketed")]
    assert len(bucketed) == 2
    assert any(c.cause == "bucket" and c.new == "32" for c in bucketed[-1].reason.changes)
    report = dbg.explain_recompiles("graph_inference")
    text = str(report)
    assert "dynamo: " in text and "size mismatch" in text
    hints = report.hints(reason.group)
    assert "mark_dynamic" in hints["guard"]
    assert "TORCH_TPU_BUCKETS" in hints["bucket"]


def test_capture_lists_a_blocks_compiles_when_the_log_is_full(monkeypatch):
    """The log keeps its newest events only: a block's compiles come from
    capture().compiles (event numbers), not from the log's length, which stops
    growing once it is full (CI's long-lived workers hit this)."""
    import collections

    from torch_tpu.debug import _events

    monkeypatch.setattr(_events, "_events", collections.deque(maxlen=3))
    for n in range(4, 8):  # fills the log
        tpu(n, 3) * 2
    assert len(dbg.compile_log()) == 3
    with dbg.capture() as cap:
        tpu(9, 3) * 2
        tpu(9, 3) * 2  # a hit: compiles nothing
    names = [ev.name for ev in cap.compiles]
    assert names.count("aten.mul.Tensor") == 1, names
    assert dbg.compile_log(since=cap.compiles[-1].seq) == []
    assert len(dbg.compile_log()) == 3
