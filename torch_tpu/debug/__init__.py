"""Debugging tools: metrics, HLO, compile log, fallback report, numerical parity.

Metrics
    metrics()            dict of everything counted since reset_metrics()
    metrics_report()     the same as a readable table
    reset_metrics()      start counting from zero (executor statistics are
                         not cleared; metrics are measured from a baseline)
    capture()            context manager: the metrics of one block

The metrics dict::

    {"ops": {"aten.add.Tensor": 3, ...},   # executions through the executor
     "ops_total": 3,
     "compiles": {"count", "wall_seconds", "seconds", "per_op", "by_tier"},
                                           # wall_seconds: wall time with a compile in
                                           # flight; seconds: each compile's own time,
                                           # summed (more than the wall time when
                                           # compiles overlap on the compile threads)
     "cache": {"requests", "hits", "misses", "evictions", "entries",
               "tiers": {"memory": {"hits", "misses"}, "disk": {"hits", "misses"}},
               "graphs": {"requests", "hits", "misses", "eager_fallbacks",
                          "runs"}},                # runs: graph programs executed
                                           # memory-tier hits include compiled-graph
                                           # hits; every miss compiled or loaded a
                                           # program; the disk tier served `disk.hits`
     "fallbacks": {"aten.foo.default": 1}, "fallbacks_total": 1,   # CPU fallbacks
     "decompositions": {...},              # ops run through torch._decomp
     "transfers": {"host_to_device": {"count", "bytes"}, "device_to_host": ...},
     "synchronizations": n, "item_calls": n,
     "execute": {"mode", "seconds", "per_op": {op: {"calls", "seconds"}}},
     "other": {...}}

Execute times are measured only inside `capture(timing=True)` (host
dispatch time: the device runs asynchronously) or `capture(sync=True)` (each
op waits for its outputs, so the time includes device execution).

HLO: `hlo(fn, *args, stage=...)`, `lower(...)` (a Program with all stages,
`.cost`, `.memory`), `last_graphs()`. Compile log: `compile_log()`;
`TORCH_TPU_LOG=compile|fallback|all` prints events through logging;
`TORCH_TPU_DUMP_DIR=dir` writes every compiled program there.
Recompiles: `explain_recompiles(name=None)` (a RecompileReport: why each
program compiled again, by op or graph, with a hint per kind of cause; each
CompileEvent's `reason`).
Fusions: `fusions(fn_or_program, *args)` (a FusionGraph: each XLA kernel
with the ATen ops it came from and the bytes between kernels; `to_mermaid()`).

Op table: `describe_op("aten.cat.default")` (the op's record: its lowering,
storage kernel, graph-mode rule and padding rule, each with the module:line
that registered it; `print()` it through `op_table.format_entry`, or run
`python -m torch_tpu.debug op aten.cat.default`).

Memory: `memory_timeline(snapshot=None, ax=None, top=5)` (a MemoryTimeline:
bytes over time from `torch.tpu.memory._snapshot()`'s history, the peak and
the ops and lines holding memory at it; `.plot()`, `print()`).

Sharding: `sharding(dtensor_module_or_program)` (a ShardingView: which
device holds which block of each DTensor parameter, and a program's
collectives with their bytes and ICI roofline time on a published TPU; `.plot()`).

Roofline: `roofline(fn_or_program, *args, device="v6e")` (a RooflineReport:
per program FLOPs, bytes, measured time, FLOP/s, intensity and the bounding
roof here and on a published device; its first line is the summary).
"""

from __future__ import annotations

import contextlib

from . import metrics  # noqa: F401  (first: producers import it by this name)
from . import _events
from . import report
from .hlo import (STAGES, Program, cost_analysis, hlo, lower, memory_analysis)  # noqa: F401
from .fusion import FusionGraph, fusions  # noqa: F401
from .parity import LayerDiff, ParityReport, parity  # noqa: F401
from . import recompiles
from .recompiles import RecompileReport  # noqa: F401
from .roofline import RooflineReport, roofline  # noqa: F401
from .memory_timeline import MemoryTimeline, memory_timeline  # noqa: F401
from .sharding import ShardingView, sharding  # noqa: F401
from .op_table import describe_op  # noqa: F401
from ._events import CompileEvent, set_log  # noqa: F401
from ..device import module
from .timing import OpTimer
from ..runtime import programs
from ..runtime.switches import switch_raw

__all__ = [
    "metrics", "metrics_report", "reset_metrics", "capture", "Capture",
    "hlo", "lower", "Program", "cost_analysis", "memory_analysis", "last_graphs",
    "last_programs", "STAGES", "compile_log", "clear_compile_log", "CompileEvent",
    "set_log", "dump_to", "fallback_report", "FallbackReport", "parity", "ParityReport",
    "explain_recompiles", "RecompileReport", "memory_timeline", "MemoryTimeline",
    "fusions", "FusionGraph",
    "roofline", "RooflineReport",
    "sharding", "ShardingView",
    "describe_op",
]


def last_graphs(n: int | None = None) -> list:
    """Programs of the most recently compiled torch.compile graphs (newest last).

    A forward/backward pair from one training step is the last two entries.
    They come from the compile log (events of kind 'graph'); only the last
    `_events.KEEP_PROGRAMS` compiled programs keep their executables.
    """
    progs = [e.program for e in _events.events(kind="graph") if e.program is not None]
    return progs if n is None else progs[-n:]


def last_programs(n: int = 1, name: str | None = None) -> list:
    """Programs of the most recent compile events of any kind (newest last)."""
    progs = [e.program for e in _events.events(name=name) if e.program is not None]
    return progs[-n:]


def explain_recompiles(name: str | None = None, events: list | None = None) -> RecompileReport:
    """Why programs compiled again: the recompiles in the compile log (or in
    `events`, e.g. a slice of it), of op or graph `name` only if given,
    grouped by op or graph, with a hint per kind of cause. `print()` it."""
    return recompiles.explain(_events.events() if events is None else events, name)


def reset_metrics() -> None:
    """Measure metrics() from now on (executor statistics are left intact)."""
    metrics.set_baseline()


# --------------------------------------------------------------------------
# capture


class Capture:
    """The metrics of one block; `.metrics` is filled when the block exits.

    While the block runs, `.current()` gives the metrics so far; `.compiles`
    lists the compile events (CompileEvent) recorded in the block.
    """

    def __init__(self, sync: bool = False, timing: bool | None = None):
        self.sync = sync
        self.timing = bool(sync if timing is None else timing or sync)
        self.metrics = None
        self._start = None
        self._mode = None
        self._seq = 0
        self._compiles: list | None = None

    def _mode_name(self):
        return "sync" if self.sync else ("dispatch" if self.timing else None)

    def current(self) -> dict:
        return metrics.structure(metrics.diff(metrics.snapshot(), self._start),
                                 self._mode_name())

    def __enter__(self):
        if self.sync:
            module.synchronize()
        self._seq = _events.last_seq()
        self._start = metrics.snapshot()
        if self.timing:
            self._mode = OpTimer(sync=self.sync)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        self.metrics = self.current()
        self._compiles = _events.events(since=self._seq)
        return False

    @property
    def compiles(self) -> list:
        """The CompileEvents of the block (so far, while it runs), oldest first."""
        return self._compiles if self._compiles is not None else _events.events(since=self._seq)

    def report(self) -> str:
        return metrics_report(self.metrics if self.metrics is not None else self.current())

    def __getitem__(self, key):
        return (self.metrics if self.metrics is not None else self.current())[key]


def capture(sync: bool = False, timing: bool | None = None) -> Capture:
    """Context manager capturing the metrics of its block.

        with torch_tpu.debug.capture() as cap:
            y = x + 1
        cap.metrics["ops"]["aten.add.Tensor"]   # 1

    timing=True times each op's host dispatch; sync=True (implies timing)
    makes each op wait for its outputs, so times include device execution.
    """
    return Capture(sync=sync, timing=timing)


# --------------------------------------------------------------------------
# reports


_table = report.table
_bytes = report.fmt_bytes


def _compile_ms(c: dict) -> str:
    """The compiles' wall time, and their summed time when overlapping
    compiles (the background compile threads) made it noticeably larger."""
    wall = c.get("wall_seconds", c["seconds"])
    out = f"{wall * 1e3:.1f} ms wall"
    if c["seconds"] > wall * 1.05 + 1e-3:
        out += f"; {c['seconds'] * 1e3:.1f} ms summed over parallel compiles"
    return out


def metrics_report(m: dict | None = None) -> str:
    """A readable table of `metrics()` (or of the dict `m`, e.g. a capture's)."""
    if m is None:
        m = metrics()
    c = m["compiles"]
    cache = m["cache"]
    lines = ["torch_tpu metrics", ""]
    summary = [
        # programs the executor ran for ops; views, metadata ops and ops working
        # inside another op's program run none
        ("op programs run", m["ops_total"]),
        ("compiles", f"{c['count']} ({_compile_ms(c)})"),
        # every lookup: ops' programs and the helper programs they use
        ("program cache hits / misses", f"{cache['hits']} / {cache['misses']}"),
        ("disk cache hits / misses", f"{cache['tiers']['disk']['hits']} / "
                                     f"{cache['tiers']['disk']['misses']}"),
        ("CPU fallbacks", m["fallbacks_total"]),
        ("synchronizations", m["synchronizations"]),
        ("item() calls", m["item_calls"]),
    ]
    for kind, t in sorted(m["transfers"].items()):
        summary.append((f"transfers {kind.replace('_', ' ')}", f"{t['count']} ({_bytes(t['bytes'])})"))
    timed = m["execute"]["per_op"]
    if m["execute"]["mode"]:
        summary.append((f"execute seconds ({m['execute']['mode']})",
                        f"{m['execute']['seconds'] * 1e3:.2f} ms"))
    lines.append(_table(summary, ("metric", "value")))
    ops = m["ops"]
    names = sorted(set(ops) | set(c["per_op"]) | set(timed),
                   key=lambda k: (-timed.get(k, {}).get("calls", 0), -ops.get(k, 0), k))
    if names and timed:
        # calls: the op's dispatches (a view runs no program; an op called
        # inside another op is timed within its caller: "nested")
        rows = [(k, timed[k]["calls"] if k in timed else "nested", ops.get(k, 0),
                 c["per_op"].get(k, 0), f"{timed[k]['seconds'] * 1e3:.3f}" if k in timed else "nested")
                for k in names]
        lines += ["", _table(rows, ("op", "calls", "programs run", "compiles", "exec ms")),
                  "exec ms includes the ops an op runs inside it (those say 'nested')."]
    elif names:
        rows = [(k, ops.get(k, 0), c["per_op"].get(k, 0)) for k in names]
        lines += ["", _table(rows, ("op", "programs run", "compiles"))]
    if m["fallbacks"]:
        lines += ["", _table(sorted(m["fallbacks"].items(), key=lambda kv: -kv[1]),
                             ("CPU fallback op", "calls"))]
    return "\n".join(lines)


class FallbackReport(dict):
    """{op name: CPU fallback calls}; `.decomposed` holds the decomposed ops.

    Its str() is a table with what to do about each op."""

    def __init__(self, fallbacks, decomposed):
        super().__init__(fallbacks)
        self.decomposed = dict(decomposed)

    def __str__(self):
        if not self and not self.decomposed:
            return "No CPU fallbacks and no decompositions."
        parts = []
        if self:
            parts.append("Ops that ran on the CPU (inputs copied to the host and back):\n" + _table(
                sorted(self.items(), key=lambda kv: -kv[1]), ("op", "calls")))
            parts.append("Register a lowering for these in torch_tpu/ops (see "
                         "torch_tpu.ops.registry.lower); TORCH_TPU_CPU_FALLBACK=0 makes them "
                         "raise instead.")
        if self.decomposed:
            parts.append("Ops run through PyTorch decompositions (on the device):\n" + _table(
                sorted(self.decomposed.items(), key=lambda kv: -kv[1]), ("op", "calls")))
        return "\n\n".join(parts)

    def __repr__(self):
        return f"FallbackReport({dict(self)!r}, decomposed={self.decomposed!r})"


def fallback_report() -> FallbackReport:
    """The ops that fell back to the CPU (and those decomposed) since reset."""
    m = metrics()
    return FallbackReport(m["fallbacks"], m["decompositions"])


# --------------------------------------------------------------------------
# compile log


def compile_log(kind: str | None = None, name: str | None = None, since: int = 0) -> list:
    """Recorded compile events (CompileEvent), oldest first.

    The log keeps the newest 10,000: to see what one block compiled, use
    `capture()`'s `.compiles` (or `since=` an event's `seq`), not the log's
    length, which stops growing when it is full.

    Each has seq, name, key_hash, kind ('op'|'graph'|'other'), tier
    ('compile'|'disk'), seconds, program_bytes, time, and `.program` (a
    Program: optimized HLO, cost, memory) for the most recent ones.
    """
    return _events.events(kind=kind, name=name, since=since)


def clear_compile_log() -> None:
    _events.clear()


@contextlib.contextmanager
def dump_to(directory):
    """Write every program compiled inside the block to `directory`."""
    import os

    # Programs compile in the background (runtime.async_compile): the ones
    # started before the block go where they were going, the block's own
    # land here before it ends.
    programs.settle()
    old = switch_raw("TORCH_TPU_DUMP_DIR")
    os.environ["TORCH_TPU_DUMP_DIR"] = str(directory)
    try:
        yield directory
    finally:
        programs.settle()
        if old is None:
            os.environ.pop("TORCH_TPU_DUMP_DIR", None)
        else:
            os.environ["TORCH_TPU_DUMP_DIR"] = old


_events.install()
