"""`torch.tpu.memory`: torch.cuda.memory's names for the `tpu` device.

The statistics are `torch.tpu`'s own; what this module adds is the memory
history: `_record_memory_history()`, `_snapshot()` and `_dump_snapshot()`
with torch.cuda.memory's signatures and PyTorch's snapshot schema, so
PyTorch's viewer renders it (`python -m torch.cuda._memory_viz trace_plot
snapshot.pickle -o out.html`) and `torch_tpu.debug.memory_timeline` plots
it. How the events are found: runtime/memory_history.py. Like `torch.tpu`,
importing it loads no JAX.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from .module import (LazyModule, empty_cache, max_memory_allocated,  # noqa: F401
                     max_memory_reserved, mem_get_info, memory_allocated, memory_reserved,
                     memory_snapshot, memory_stats, memory_summary, reset_peak_memory_stats)

_history = LazyModule("torch_tpu.runtime.memory_history")
_memory = LazyModule("torch_tpu.device.memory")

_ENABLED = (None, "state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")
_ACTIONS = frozenset(("alloc", "free_requested", "free_completed", "segment_alloc",
                      "segment_free", "oom", "snapshot"))


def _record_memory_history(enabled: Any = "all", context: str | None = "all",
                           stacks: str = "all", max_entries: int = sys.maxsize,
                           device: Any = None, clear_history: bool = False,
                           skip_actions: list[str] | None = None) -> None:
    """Record every `tpu` allocation and free, with the Python stack and the
    ATen op that made it, as torch.cuda.memory._record_memory_history.

    enabled: "all" (a history of events and the live blocks' stacks),
    "state" (the live blocks' stacks only) or None (stop; what was recorded
    stays readable by `_snapshot()`); True/False as the legacy API.
    context: which stacks are kept (None, "state", "alloc", "all": frees
    too). stacks: "python" or "all" (the same here: there is no C++ stack to
    add). max_entries: the newest events kept per device. Recording covers
    every device (`device` is accepted for torch.cuda's signature). Enabling
    starts a new history unless one is recording and `clear_history` is
    False, which changes the settings and keeps its events.
    """
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    _check("enabled", enabled, _ENABLED)
    _check("context", context, _CONTEXT)
    _check("stacks", stacks, _STACKS)
    skip = frozenset(skip_actions or ())
    if skip - _ACTIONS:
        raise ValueError(f"skip_actions: unknown actions {sorted(skip - _ACTIONS)}; "
                         f"expected some of {sorted(_ACTIONS)}")
    if enabled is None:
        rec = _history.active()
        if rec is not None:
            _memory.keep_peaks(rec.peak)
        _history.stop()
        return
    rec = _history.active()
    if rec is None or clear_history:
        rec = _history.start(enabled, context, max_entries)
    else:
        rec.configure(enabled, context, max_entries)
    rec.skip = skip


def _check(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"_record_memory_history: {name}={value!r} is not one of {allowed}")


def _snapshot(device: Any = None) -> dict:
    """The memory state now, as torch.cuda.memory._snapshot: `segments` (one
    per live array, one block each, with the stack that allocated it when a
    history followed it) and `device_traces` (one list of events per device:
    alloc, free_requested, free_completed, each with size, address, time_us
    and frames). `device` is accepted for torch.cuda's signature: every device
    is included, as there."""
    return _history.snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """`_snapshot()` pickled to `filename`, for `python -m
    torch.cuda._memory_viz trace_plot <filename> -o out.html` (or
    pytorch.org/memory_viz)."""
    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)
