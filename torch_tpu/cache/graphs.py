"""The graph tier: a warm process runs a compiled graph without lowering it.

The executable tier (JAX's persistent cache over `DiskStore`) is keyed on the
lowered program, so a process that finds a graph's executable on disk has
still traced the graph to a jaxpr and lowered it to StableHLO to compute that
key. This tier removes that work: when a graph (forward, backward or
inference) is compiled, a small index entry maps

    the graph's fingerprint (its ATen code, input and output metadata, the
    specialization key: shapes, dtypes, layouts, precision, device, donated
    inputs) + the torch_tpu source fingerprint (every .py file of the
    package) + torch/jax versions and the JAX settings that change a trace

to the JAX cache key of its executable and to what the runtime needs besides
the executable (Python values recorded while tracing, the output
de-duplication map, argument/result counts). A later process with the same
key reads that entry, loads the executable straight from the executable
tier (`jax._src.compilation_cache.get_executable_and_time`, no pickle), and
runs it with the PJRT executable's own `execute_sharded`.

Anything unusual makes a miss, never a wrong program: an index entry whose
executable was evicted, counts that do not match, a key that cannot be
computed. Edits to torch_tpu's sources change the source fingerprint, so a
development checkout never runs programs lowered by older code.
``TORCH_TPU_GRAPH_CACHE=0`` turns the tier off; so does
``TORCH_TPU_DUMP_DIR`` (dumping needs the lowered program).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Any

PREFIX = "torch_tpu-graph-v1:"


class _Stats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.hits = 0         # graphs loaded without lowering
        self.misses = 0       # lookups that found nothing usable
        self.writes = 0       # index entries written
        self.skipped = 0      # graphs not stored (not portable)
        self.load_seconds = 0.0


STATS = _Stats()
_lock = threading.Lock()
_source_fp = None


def enabled() -> bool:
    from . import disk_store

    if os.environ.get("TORCH_TPU_GRAPH_CACHE", "1").strip() in ("0", "false", "False", "off"):
        return False
    if os.environ.get("TORCH_TPU_DUMP_DIR"):
        return False
    return disk_store().enabled


def source_fingerprint() -> str:
    """SHA-256 over torch_tpu's Python sources (computed once per process)."""
    global _source_fp
    if _source_fp is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                try:
                    with open(path, "rb") as f:
                        h.update(f.read())
                except OSError:
                    h.update(b"<unreadable>")
                h.update(b"\0")
        _source_fp = h.hexdigest()
    return _source_fp


def _settings() -> str:
    """torch/jax versions and the JAX options that change what a trace produces."""
    import jax
    import torch

    values = [torch.__version__, jax.__version__]
    for name in ("jax_enable_x64", "jax_default_matmul_precision", "jax_threefry_partitionable",
                 "jax_default_prng_impl", "jax_numpy_rank_promotion",
                 "jax_numpy_dtype_promotion"):
        try:
            values.append(f"{name}={getattr(jax.config, name)}")
        except Exception:  # an option this JAX does not have
            values.append(f"{name}=?")
    values.append("fallback=" + os.environ.get("TORCH_TPU_CPU_FALLBACK", ""))
    return "\n".join(values)


def key_for(description: str) -> str:
    """The index key of a graph specialization described by `description`."""
    h = hashlib.sha256()
    for part in (source_fingerprint(), _settings(), description):
        h.update(part.encode("utf-8", "replace"))
        h.update(b"\0")
    return PREFIX + h.hexdigest()


# -- portable values (what tracing recorded besides the executable) -------------


class NotPortable(TypeError):
    pass


def encode_value(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {"tuple": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return {"list": [encode_value(x) for x in v]}
    raise NotPortable(type(v).__name__)


def decode_value(v):
    if isinstance(v, dict):
        if "tuple" in v:
            return tuple(decode_value(x) for x in v["tuple"])
        if "list" in v:
            return [decode_value(x) for x in v["list"]]
        raise ValueError("bad value")
    return v


# -- store / load -------------------------------------------------------------------


def store(key: str, jax_key: str, meta: dict) -> bool:
    """Write the index entry `key` -> (the executable under `jax_key`, meta)."""
    from . import disk_store

    try:
        blob = json.dumps({"jax_key": jax_key, "meta": meta}, sort_keys=True,
                          allow_nan=True).encode()
    except (TypeError, ValueError):
        with _lock:
            STATS.skipped += 1
        return False
    disk_store().put(key, blob, count=False)
    with _lock:
        STATS.writes += 1
    return True


def skipped() -> None:
    with _lock:
        STATS.skipped += 1


def load(key: str, jax_device: Any) -> tuple[Any, dict[str, Any]] | None:
    """(loaded PJRT executable, meta) for index entry `key`, or None."""
    from . import disk_store

    t0 = time.perf_counter()
    s = disk_store()
    blob = s.get(key, count=False)
    if blob is None:
        with _lock:
            STATS.misses += 1
        return None
    try:
        entry = json.loads(blob.decode())
        jax_key = entry["jax_key"]
        meta = entry["meta"]
        if not isinstance(jax_key, str) or not isinstance(meta, dict):
            raise ValueError("bad entry")
    except (ValueError, KeyError, UnicodeDecodeError, TypeError):
        with _lock:
            STATS.misses += 1
        return None
    from jax._src import compilation_cache as cc
    from jax._src.lib import xla_client as xc

    try:
        exe, _ = cc.get_executable_and_time(jax_key, None, jax_device.client,
                                            xc.DeviceList((jax_device,)))
    except Exception:  # an entry this jaxlib cannot load: compile instead
        exe = None
    if exe is None:
        with _lock:
            STATS.misses += 1
        return None
    with _lock:
        STATS.hits += 1
        STATS.load_seconds += time.perf_counter() - t0
    return exe, meta


def stats() -> dict:
    with _lock:
        return {"hits": STATS.hits, "misses": STATS.misses, "writes": STATS.writes,
                "skipped": STATS.skipped, "load_seconds": STATS.load_seconds,
                "enabled": enabled()}


def reset_stats() -> None:
    with _lock:
        STATS.reset()
