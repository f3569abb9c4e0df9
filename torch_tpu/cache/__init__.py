"""The compile cache: one cache for eager op executables and compiled graphs.

Tiers, looked up in order:

1. **memory** - the program cache (torch_tpu.runtime.programs): one LRU of
   loaded executables in this process (eager ops, keyed by op, shapes,
   dtypes, layouts and static arguments; helper and fused programs; compiled
   graphs, keyed by the graph's fingerprint and its input shapes). Capacity:
   ``TORCH_TPU_CACHE_SIZE`` entries (default 8192), of which at most
   ``TORCH_TPU_GRAPH_CACHE_SIZE`` compiled graphs (default 512), and
   ``TORCH_TPU_CACHE_BYTES`` bytes.
2. **disk** - a persistent cache that survives the process, so that a second
   run skips XLA compilation. Default directory: the user's cache directory
   (``~/.cache/torch_tpu`` on Linux); ``TORCH_TPU_CACHE_DIR=/path`` moves it,
   ``TORCH_TPU_CACHE_DIR=""`` turns it off, as do `disable()` and
   `set_dir(None)`. Size cap: ``TORCH_TPU_CACHE_MAX_BYTES`` (default 4 GiB,
   least recently used entries evicted first) or `set_max_bytes()`. A
   directory that is read-only still serves what it holds (nothing is
   written). **shared** - ``TORCH_TPU_SHARED_CACHE_DIR=/path`` (or
   `set_shared_dir()`) adds a read-only directory under the local one: a
   cache prebuilt by CI, or mounted on every host of a pod. Lookups that the
   local directory misses are served from it; new programs are written to
   the local directory only, and nothing in the shared one is ever written,
   touched or deleted. It must be owned by the user or root and not
   writable by group or others, as must the path to it (as the local one:
   `torch_tpu.cache.trust`); ``stats()["disk"]`` counts its hits as
   ``shared_hits``.

3. **graphs** - for compiled graphs (torch.compile), an index on disk from
   the graph's fingerprint (ATen code, input metadata, specialization key,
   torch_tpu's source hash) to its executable in the disk tier, so that a
   warm process loads a graph's executable without tracing or lowering it
   (`torch_tpu.cache.graphs`; ``TORCH_TPU_GRAPH_CACHE=0`` turns it off).
   ``stats()["graph_disk"]`` counts its hits.
4. **eager index** - the same for eager ops: from the executor's key (op,
   argument signatures, device, dtype and precision settings, torch_tpu's
   source hash) to the op's executable, so that a warm process runs an op
   without tracing or lowering it (`torch_tpu.cache.eager`;
   ``TORCH_TPU_EAGER_INDEX=0`` turns it off). ``stats()["eager_index"]``
   counts its hits; its ``prefetch`` part, the programs a warm process
   loaded ahead of its ops in the previous run's order (`torch_tpu.cache.prefetch`).

The disk tier is JAX's persistent compilation cache machinery (its key covers
the lowered program, compile options and shardings, devices, backend, jaxlib
version and XLA flags; its executable serialization uses no pickle) with our
own store underneath: checksummed entries, atomic writes, size cap, and
graceful degradation. See `torch_tpu.cache.store` for the format and
`torch_tpu.cache.trust` for the trust model (which directories and entries
are used, checked from ``/`` and held open against races).

    >>> import torch_tpu
    >>> torch_tpu.cache.stats()["disk"]["hits"]
    >>> torch_tpu.cache.clear()

From a shell: ``python -m torch_tpu.cache info`` / ``python -m torch_tpu.cache clear``.
"""

from __future__ import annotations

import collections
import os
import threading

from .._compat import jax_api
from ..runtime import programs as _programs
from .store import CacheWarning, DiskStore, configured_dir, default_dir, warn_once  # noqa: F401
from .store import configured_shared_dir

__all__ = ["stats", "clear", "reset_stats", "enable", "disable", "set_dir", "cache_dir",
           "set_shared_dir", "shared_dir", "set_max_bytes", "is_enabled", "CacheWarning",
           "default_dir", "info"]

_lock = threading.Lock()
_store: DiskStore | None = None
_installed = False
# Per-compile records: (name, seconds, source, trace_seconds); source is "compiled"
# (XLA compiled it), "disk" (loaded from the persistent tier) or "uncached"
# (the program cannot be stored, e.g. it calls back into Python).
_RECORDS: collections.deque = collections.deque(maxlen=4096)
_TOTALS = {"compiled": [0, 0.0], "disk": [0, 0.0], "uncached": [0, 0.0]}


def disk_store() -> DiskStore:
    """The disk tier (created and installed into JAX on first use)."""
    global _store
    if _store is None:
        with _lock:
            if _store is None:
                s = DiskStore(configured_dir())
                _install(s)
                _store = s
    return _store


def _install(s: DiskStore) -> None:
    """Make `s` JAX's persistent compilation cache for this process (through
    the checked slot in torch_tpu._compat.jax_api; where JAX's cache code
    changed, the tier stays out of JAX's compiles, with one warning)."""
    global _installed
    import jax

    # Every executable is worth keeping: an eager op compiles in milliseconds,
    # but thousands of them add up to the seconds a warm start saves. (The
    # runtime's compiles turn JAX's own write off for their thread and the
    # tier writes them itself: see `_write_entry`.)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _installed = jax_api.install_disk_tier(s)


# -- the disk tier's hooks (runtime.programs.DiskTier, installed below) ----------


def begin_compile() -> object:
    """Called before each compile: starts collecting tier events;
    the token it returns goes to `end_compile`."""
    return disk_store().begin()


def end_compile(token: object, name: str, seconds: float, trace_seconds: float = 0.0,
                compiled: object = None) -> str:
    """Called after compiling: records the compile and says which tier served it.

    `seconds` is the whole time to produce the executable; `trace_seconds`
    the part spent tracing and lowering to StableHLO (before any tier could
    answer), the rest is XLA compilation or loading from disk. `compiled`
    (the executable, where the caller has one) is written to the disk tier
    if it missed there (`_write_entry`).
    """
    store = disk_store()
    events = store.end(token)
    if compiled is not None and "miss" in events and "write" not in events:
        _write_entry(store, name, seconds - trace_seconds, compiled)
    if "hit" in events:
        source = "disk"
    elif "miss" in events or "write" in events or not store.enabled:
        source = "compiled"
    else:
        source = "uncached"
    with _lock:
        _RECORDS.append((name, seconds, source, trace_seconds))
        tot = _TOTALS[source]
        tot[0] += 1
        tot[1] += seconds
    return source


def _write_entry(store: DiskStore, name: str, seconds: float, compiled: object) -> None:
    """Store an executable that missed the disk tier.

    Every process writes its own misses (JAX writes from process 0 only, to
    spare shared file systems many writers of one entry; under torchrun the
    other ranks compile their own per-device programs, whose keys name their
    device, and without this compiled every op again on every run). Our
    directory is local to the host and its writes are atomic. Programs that
    call back into Python are never stored (their callbacks live in this
    process), as JAX decides.
    """
    keys = store.last_keys
    if len(keys) != 1 or not store.writable:
        return
    if jax_api.has_host_callbacks(compiled):
        return  # a host callback, or an executable type we cannot inspect: not stored
    if os.path.exists(store.file_for(keys[0])):
        return  # another process wrote it (programs that span processes share a key)
    try:
        jax_api.store_executable(keys[0], name, compiled, seconds)
    except Exception as e:  # noqa: BLE001 - the program runs; only the disk copy is lost
        warn_once("write", f"could not write {name}'s executable to the cache ({e})")


class _Tier:
    """This package as runtime.programs' disk tier (programs.set_disk_tier)."""

    def begin(self) -> object:
        return begin_compile()

    def end(self, token: object, name: str, seconds: float, trace_seconds: float,
            compiled: object = None) -> str:
        return end_compile(token, name, seconds, trace_seconds=trace_seconds,
                           compiled=compiled)

    def abort(self, token: object) -> None:
        disk_store().end(token)


_programs.set_disk_tier(_Tier())

from . import eager as _eager  # noqa: E402
from . import graphs  # noqa: E402
from . import needs as _needs  # noqa: E402

_programs.set_index_tier(_eager.Tier())


def last_compile_keys() -> list:
    """The JAX cache keys the last compile on this thread asked the disk tier for."""
    return list(disk_store().last_keys)


# -- public API -------------------------------------------------------------------


def stats() -> dict:
    """Requests, hits and misses per tier, compile seconds, bytes on disk.

    - ``requests``: executable lookups (eager op executables and compiled
      graphs) = memory hits + memory misses.
    - ``memory``: hits, misses (each miss compiled or loaded a program:
      the executables this process needed), disk_loads (the misses the disk
      tier served, prefetched ones included; the rest were compiled),
      entries, capacity, evictions, bytes and byte_capacity (the cached
      executables' measured size, compiled graphs' included, and its bound,
      TORCH_TPU_CACHE_BYTES).
    - ``disk``: enabled, dir, hits (executables read, those prefetched
      ahead of their ops included, whether or not an op asked for them),
      misses, writes, write errors, corrupt entries discarded, evictions,
      entries and bytes on disk, max_bytes.
    - ``compile_seconds``: total seconds spent producing executables, each
      compile's own seconds summed (compiles overlapping on the background
      compile threads each count); ``compile_wall_seconds``: the wall time
      during which at least one was in flight (at most the elapsed time);
      ``compile_seconds_by_source``: split into XLA compiles ("compiled"),
      loads from disk ("disk") and programs the disk tier cannot hold.
    - ``per_entry``: the most recent compiles (up to 4096): name, seconds,
      source, and trace_seconds (tracing + lowering, part of seconds).
    - ``graphs``: the compiled graphs' row of the memory tier (their
      requests, hits, misses, evictions and entries) and counters (``lowered``:
      graphs traced and lowered in this process; ``disk_loads``: graphs
      loaded without lowering; seconds spent in each phase).
    - ``graph_disk``: the graph tier (see `torch_tpu.cache.graphs`): hits
      (graphs run without lowering), misses, index writes, skipped graphs.
    - ``eager_index``: the same for eager ops' programs (see
      `torch_tpu.cache.eager`): hits (loaded without lowering), misses,
      index writes, skipped programs, load seconds.
    - ``index_needs``: what indexed executables needed from this process
      (see `torch_tpu.cache.needs`): ``ready``, the kernel setups done
      (``lapack``); ``unknown``, entries refused (lowered again) per
      custom-call target with no known setup.
    """
    mem = _programs.memory_stats()  # every kind, compiled graphs included
    mem_hits = mem["hits"]
    mem_misses = mem["misses"]
    graph = _programs.STATS.rows[_programs.ProgramKind.GRAPH].as_dict()
    with _lock:
        per_entry = [{"name": n, "seconds": sec, "source": src, "trace_seconds": tr}
                     for n, sec, src, tr in _RECORDS]
        by_source = {k: {"count": v[0], "seconds": v[1]} for k, v in _TOTALS.items()}
    return {
        "requests": mem_hits + mem_misses,
        "memory": {
            "hits": mem_hits,
            "misses": mem_misses,
            "disk_loads": mem["disk_loads"],
            "entries": mem["entries"],
            "capacity": mem["capacity"],
            "evictions": mem["evictions"],
            # The executables' measured bytes and their bound
            # (TORCH_TPU_CACHE_BYTES).
            "bytes": mem["bytes"],
            "byte_capacity": mem["byte_capacity"],
        },
        "disk": disk_store().info(),
        "compile_seconds": mem["compile_seconds"],
        "compile_wall_seconds": mem["compile_wall_seconds"],
        "compile_seconds_by_source": by_source,
        "compiles": mem_misses,
        "per_entry": per_entry,
        "graphs": graph,
        "graph_disk": _graph_tier().stats(),
        "eager_index": _eager.stats(),
        "index_needs": _needs.stats(),
    }


def info() -> dict:
    """Where the disk tier is and what it holds (no process statistics)."""
    d = disk_store().info()
    return {k: d[k] for k in ("enabled", "writable", "dir", "status", "entries", "bytes",
                              "other_files", "max_bytes", "shared_dir", "shared_status",
                              "shared_entries", "shared_bytes")}


def _graph_tier():
    return graphs


def reset_stats() -> None:
    """Zero every counter (the cached programs stay)."""
    _programs.STATS.reset()  # with every kind's row: compiled graphs' too
    disk_store().stats.reset()
    _graph_tier().reset_stats()
    _eager.reset_stats()
    _needs.reset_stats()
    with _lock:
        _RECORDS.clear()
        for v in _TOTALS.values():
            v[0], v[1] = 0, 0.0


def clear(memory: bool = True, disk: bool = True) -> int:
    """Drop cached programs: the in-memory tier and/or the files on disk.

    Returns the number of files removed from disk. Compiled graphs already
    held by `torch.compile`d functions keep their executables; they are not
    recompiled.
    """
    removed = 0
    if memory:
        _programs.clear()  # every kind: compiled graphs too
    if disk:
        removed = disk_store().clear()
    return removed


def set_dir(path: str | None) -> None:
    """Use `path` for the disk tier from now on (None or "" turns it off)."""
    import os

    disk_store().set_dir(os.path.abspath(os.path.expanduser(path)) if path else None)


def cache_dir() -> str | None:
    """The disk tier's local directory, or None when it is off."""
    s = disk_store()
    return s.root if s.path is not None else None


def set_shared_dir(path: str | None) -> None:
    """Serve hits from `path` too, read-only, under the local directory (None: none)."""
    import os

    disk_store().set_shared_dir(os.path.abspath(os.path.expanduser(path)) if path else None)


def shared_dir() -> str | None:
    """The read-only shared directory in use, or None."""
    s = disk_store()
    return s.shared_root if s.shared_path is not None else None


def enable(path: str | None = None) -> None:
    """Turn the disk tier on (in `path`, else TORCH_TPU_CACHE_DIR or the default;
    with TORCH_TPU_SHARED_CACHE_DIR under it when that is set)."""
    set_dir(path or configured_dir() or default_dir())
    disk_store().set_shared_dir(configured_shared_dir())


def disable() -> None:
    """Turn the disk tier off for this process (memory only; the shared
    directory too)."""
    disk_store().set_dir(None)
    disk_store().set_shared_dir(None)


def is_enabled() -> bool:
    return disk_store().enabled


def set_max_bytes(max_bytes: int) -> None:
    """Cap the disk tier at `max_bytes`, evicting least recently used entries."""
    disk_store().set_max_bytes(max_bytes)
