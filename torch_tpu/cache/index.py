"""Index entries: what lets a warm process skip lowering a program.

JAX keys an executable on its lowered program, so finding one on disk needs
the lowering. An index entry is a small JSON file in the disk tier, under a
key that needs no lowering (a compiled graph's fingerprint, an eager op's
executor key; see `graphs` and `eager`), holding the JAX cache key of the
executable and what the runtime needs besides it (`meta`). A process that
reads the entry loads the executable straight from the executable tier (JAX's
own deserializer, after our checksum; no pickle).

`Index` keeps one tier's counters and reads and writes its entries; anything
wrong with an entry (malformed, its executable evicted, unloadable) is a
miss, and the program is lowered as before. Each entry also records the
custom-call targets its executable calls, and nothing is loaded before the
process is ready for them (`torch_tpu.cache.needs`).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from . import needs
from .._compat import jax_api
from ..runtime.switches import switch_on, switch_raw
from .. import cache as _cache  # this package (its disk_store() is read at each call)


def enabled(switch: str) -> bool:
    """Whether an index tier may be used: its switch (`switch`, e.g.
    TORCH_TPU_GRAPH_CACHE) is not off, nothing is being dumped (dumping needs
    the lowered program), and the disk tier is on."""
    if not switch_on(switch) or switch_raw("TORCH_TPU_DUMP_DIR"):
        return False
    return _cache.disk_store().enabled


def report_hit() -> None:
    """Tell JAX's monitoring that a program came from its cache, as JAX does for
    the programs it finds there (the debug tools count tiers by these events)."""
    try:
        from jax import monitoring

        monitoring.record_event("/jax/compilation_cache/compile_requests_use_cache")
        monitoring.record_event("/jax/compilation_cache/cache_hits")
    except Exception:  # noqa: BLE001 - pragma: no cover (an older JAX)
        pass


class Index:
    """One index tier's entries and counters (hits: programs loaded without lowering)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.hits = 0         # programs loaded without lowering
        self.misses = 0       # lookups that found nothing usable
        self.writes = 0       # index entries written
        self.skipped = 0      # programs not indexed (not portable)
        self.load_seconds = 0.0

    def stats(self, enabled: bool) -> dict:
        with self.lock:
            return {"hits": self.hits, "misses": self.misses, "writes": self.writes,
                    "skipped": self.skipped, "load_seconds": self.load_seconds,
                    "enabled": enabled}

    def count(self, hit: bool, seconds: float = 0.0) -> None:
        with self.lock:
            if hit:
                self.hits += 1
                self.load_seconds += seconds
            else:
                self.misses += 1

    def skip(self) -> None:
        with self.lock:
            self.skipped += 1

    def write(self, key: str, jax_key: str, meta: dict, exe: Any) -> bool:
        """Write entry `key` -> (the executable under `jax_key`, meta, the
        custom-call targets of `exe`, the loaded executable itself); False
        (counted as skipped) when `meta` is not plain JSON data or the
        executable's targets cannot be read."""
        targets = needs.of(exe)
        if targets is None:
            self.skip()
            return False
        try:
            blob = json.dumps({"jax_key": jax_key, "meta": meta, "needs": targets},
                              sort_keys=True, allow_nan=True).encode()
        except (TypeError, ValueError):
            self.skip()
            return False
        _cache.disk_store().put(key, blob, count=False)
        with self.lock:
            self.writes += 1
        return True

    def read(self, key: str) -> tuple[str, dict] | None:
        """(JAX key, meta) of entry `key`, or None (absent, malformed, or calling
        a kernel this process cannot be made ready for; not counted)."""
        blob = _cache.disk_store().get(key, count=False)
        if blob is None:
            return None
        try:
            entry = json.loads(blob.decode())
            jax_key, meta, targets = entry["jax_key"], entry["meta"], entry["needs"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None
        if not isinstance(jax_key, str) or not isinstance(meta, dict):
            return None
        if not needs.prepare(targets):
            return None  # lowered again: the lowering sets up what it calls
        return jax_key, meta


def executable(jax_key: str, device: Any) -> Any:
    """The loaded executable stored under `jax_key` for JAX device `device`, or None."""
    return jax_api.load_executable(jax_key, device)
