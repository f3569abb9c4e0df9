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
tier (JAX's own deserializer through `_compat.jax_api.load_executable`, no pickle), and
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
import os
import time
from typing import Any

from . import index
from .index import Index, executable
from ..runtime.switches import switch_raw
from ..runtime.xla_flags import NATIVE_DOT_FLAGS, cpu_half_dots_f32, cpu_native_bf16_dots

PREFIX = "torch_tpu-graph-v1:"


STATS = Index()
_source_fp = None


def enabled() -> bool:
    return index.enabled("TORCH_TPU_GRAPH_CACHE")


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
    values.append("fallback=" + (switch_raw("TORCH_TPU_CPU_FALLBACK") or ""))
    # lowering choices read from the environment (runtime/xla_flags.py)
    values.append("cpu_defaults=" + (switch_raw("TORCH_TPU_CPU_XLA_DEFAULTS") or ""))
    values.append("dot_piece=" + (switch_raw("TORCH_TPU_CPU_DOT_PIECE_MB") or ""))
    values.append(f"native_bf16_dots={cpu_native_bf16_dots()}")  # resolved: auto follows the host
    values.append("half_dots_f32=" + ",".join(  # resolved per half type, as native_bf16_dots
        f"{t}:{cpu_half_dots_f32(t)}" for t in NATIVE_DOT_FLAGS))
    return "\n".join(values)


def key_for(description: str, prefix: str = PREFIX) -> str:
    """The index key of a graph specialization described by `description`
    (`prefix`: another index's name, e.g. the eager index's)."""
    h = hashlib.sha256()
    for part in (source_fingerprint(), _settings(), description):
        h.update(part.encode("utf-8", "replace"))
        h.update(b"\0")
    return prefix + h.hexdigest()


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


def store(key: str, jax_key: str, meta: dict, exe: Any) -> bool:
    """Write the index entry `key` -> (the executable under `jax_key`, meta);
    `exe` is the loaded executable (its custom calls are recorded)."""
    return STATS.write(key, jax_key, meta, exe)


def skipped() -> None:
    STATS.skip()


def load(key: str, jax_device: Any) -> tuple[Any, dict[str, Any]] | None:
    """(loaded PJRT executable, meta) for index entry `key`, or None."""
    t0 = time.perf_counter()
    entry = STATS.read(key)
    exe = executable(entry[0], jax_device) if entry is not None else None
    STATS.count(exe is not None, time.perf_counter() - t0)
    return (exe, entry[1]) if exe is not None and entry is not None else None


def stats() -> dict:
    return STATS.stats(enabled())


def reset_stats() -> None:
    STATS.reset()


def report_hit() -> None:
    """A graph loaded through this tier, reported as JAX reports its cache hits."""
    index.report_hit()
