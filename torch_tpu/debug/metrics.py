"""Counters behind torch_tpu.debug.metrics(): transfers, syncs, fallbacks.

Counting is a dict increment, cheap enough to stay on in every path. The
producers elsewhere in torch_tpu call `count`, `transfer` and `fallback`
(torch_tpu.runtime.counters, where the counters live);
the executor keeps its own per-op and cache statistics (`executor.STATS`),
which `snapshot()` reads without touching.

This module is also callable: `torch_tpu.debug.metrics()` returns the
metrics dict (see `torch_tpu.debug` for its layout), while
`from torch_tpu.debug import metrics; metrics.count(...)` keeps working.
"""

from __future__ import annotations

import sys
import types

# The counters live in the runtime layer (every layer counts); these are
# the same objects, read and reset here.
from . import _events
from ..runtime.counters import (COUNTERS, DISK_CACHE, FALLBACKS, OP_SECONDS,  # noqa: E402,F401
                                OP_TIMED, TRANSFER_BYTES, count, fallback, reset, transfer)
from ..runtime import programs


# --------------------------------------------------------------------------
# snapshots: flat {name: number} dicts that subtract cleanly


def snapshot() -> dict:
    """Every counter as one flat dict of monotonically growing numbers."""
    programs.settle()  # compiles still running in the background count first
    flat: dict = {}
    for k, v in COUNTERS.items():
        flat["c:" + k] = v
    for k, v in TRANSFER_BYTES.items():
        flat["tb:" + k] = v
    for k, v in FALLBACKS.items():
        flat["fb:" + k] = v
    for k, v in OP_SECONDS.items():
        flat["ts:" + k] = v
    for k, v in OP_TIMED.items():
        flat["tn:" + k] = v
    for k, v in DISK_CACHE.items():
        flat["disk:" + k] = v
    stats = _executor_stats()
    if stats is not None:
        flat["cache:requests"] = stats.requests
        flat["cache:hits"] = stats.hits
        flat["cache:misses"] = stats.misses
        flat["cache:evictions"] = stats.evictions
        flat["cache:compile_seconds"] = stats.compile_seconds
        flat["cache:compile_wall_seconds"] = stats.compile_wall_seconds
        for k, v in stats.per_op.items():
            flat["op:" + k] = v
        for k, v in stats.compiles_per_op.items():
            flat["co:" + k] = v
        if hasattr(stats, "disk_loads"):
            flat["cache:disk_loads"] = stats.disk_loads
    graph = programs.STATS.rows[programs.ProgramKind.GRAPH]  # compiled graphs' row
    for k in ("requests", "hits", "misses", "eager_fallbacks", "runs"):
        flat["graph:" + k] = getattr(graph, k, 0)
    flat["events:compiles"] = _events.TOTALS["compiles"]
    for k, v in _events.TOTALS_BY_TIER.items():
        flat["tier:" + k] = v
    return flat


def diff(after: dict, before: dict) -> dict:
    """after - before, per counter. A counter that went down was reset in
    between (e.g. torch_tpu.cache.reset_stats()): its whole value counts."""
    out = {}
    for k, v in after.items():
        b = before.get(k, 0)
        d = v - b if v >= b else v
        if d:
            out[k] = d
    return out


def _executor_stats():
    mod = sys.modules.get("torch_tpu.runtime.executor")
    return getattr(mod, "STATS", None) if mod is not None else None


def _cache_entries():
    """The program cache's entries but compiled graphs' (counted apart)."""
    mod = sys.modules.get("torch_tpu.runtime.programs")
    return mod.entries() if mod is not None else 0


def structure(flat: dict, timing_mode: str | None = None) -> dict:
    """The public metrics dict built from a flat (difference) snapshot."""

    def section(prefix):
        n = len(prefix)
        return {k[n:]: v for k, v in sorted(flat.items()) if k.startswith(prefix)}

    ops = section("op:")
    counters = section("c:")
    transfers = {}
    for kind, nbytes in section("tb:").items():
        transfers[kind] = {"count": counters.get(f"transfer.{kind}", 0), "bytes": nbytes}
    for name, n in counters.items():
        if name.startswith("transfer."):
            transfers.setdefault(name[len("transfer."):], {"count": n, "bytes": 0})
    decomposed = {k[len("decomposed."):]: v for k, v in counters.items()
                  if k.startswith("decomposed.")}
    other = {k: v for k, v in counters.items()
             if not k.startswith(("transfer.", "decomposed.")) and k not in ("synchronize", "item")}
    seconds = section("ts:")
    timed = section("tn:")
    graphs = section("graph:")
    hits = flat.get("cache:hits", 0) + graphs.get("hits", 0)
    misses = flat.get("cache:misses", 0)
    stats = _executor_stats()
    if stats is not None and hasattr(stats, "disk_loads"):
        # The executor says which misses the disk tier served.
        disk_hits = flat.get("cache:disk_loads", 0)
        disk_misses = misses - disk_hits
    else:  # JAX's persistent-cache events
        disk = section("disk:")
        disk_hits = disk.get("hits", 0)
        disk_misses = max(disk.get("requests", 0) - disk_hits, 0)
    return {
        "ops": ops,
        "ops_total": sum(ops.values()),
        "compiles": {
            "count": misses,
            # wall seconds with a compile in flight (overlapping compiles once)
            "wall_seconds": flat.get("cache:compile_wall_seconds", 0.0),
            # each compile's own seconds, summed (overlapping compiles each count)
            "seconds": flat.get("cache:compile_seconds", 0.0),
            "per_op": section("co:"),
            "by_tier": section("tier:"),
        },
        "cache": {
            "requests": flat.get("cache:requests", 0) + graphs.get("requests", 0),
            "hits": hits,
            "misses": misses,
            "evictions": flat.get("cache:evictions", 0),
            "entries": _cache_entries(),
            "tiers": {
                "memory": {"hits": hits, "misses": misses},
                "disk": {"hits": disk_hits, "misses": disk_misses},
            },
            "graphs": {"requests": graphs.get("requests", 0), "hits": graphs.get("hits", 0),
                       "misses": graphs.get("misses", 0),
                       "eager_fallbacks": graphs.get("eager_fallbacks", 0),
                       "runs": graphs.get("runs", 0)},
        },
        "fallbacks": section("fb:"),
        "fallbacks_total": sum(section("fb:").values()),
        "decompositions": decomposed,
        "transfers": transfers,
        "synchronizations": counters.get("synchronize", 0),
        "item_calls": counters.get("item", 0),
        "execute": {
            "mode": timing_mode,
            "seconds": float(sum(seconds.values())),
            "per_op": {k: {"calls": timed.get(k, 0), "seconds": v} for k, v in seconds.items()},
        },
        "other": other,
    }


# --------------------------------------------------------------------------
# `metrics()` : a callable module


_BASELINE: dict = {}


def current() -> dict:
    """The metrics since the last reset_metrics() (or process start)."""
    return structure(diff(snapshot(), _BASELINE))


def set_baseline() -> None:
    global _BASELINE
    _BASELINE = snapshot()


class _CallableModule(types.ModuleType):
    def __call__(self):
        """The metrics dict since the last `reset_metrics()`."""
        return current()


sys.modules[__name__].__class__ = _CallableModule
