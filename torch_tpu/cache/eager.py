"""The eager index: a warm process runs an eager op's program without lowering it.

The executable tier (JAX's persistent cache over `DiskStore`) is keyed on the
lowered program, so a process that finds an eager op's executable on disk has
still traced the op's lowering to a jaxpr, lowered it to StableHLO and
serialized and hashed that to compute the key: 15-30 ms an op on XLA:CPU,
against about 1 ms to load the executable. A warm tiny-Llama training process
makes ~115 such programs. This tier removes that work, as the graph tier
(`torch_tpu.cache.graphs`) does for compiled graphs: when an eager op's
program is compiled, a small index entry maps

    the executor's key (the op overload, each argument's storage signature,
    view layout, Scalar type or static value, the device, default dtype,
    matmul precision and XLA optimization level) + the torch_tpu source
    fingerprint + torch/jax versions and the JAX settings that change a trace
    (`graphs.key_for`)

to the JAX cache key of the executable and to what JAX's `Compiled` object
needs besides it: every argument's shape, dtype and weak type, which
arguments XLA kept, the results' shapes and dtypes, the result-handling
flags. A later process with the same key reads the entry, loads the
executable from the executable tier (no pickle: JAX's own deserializer,
after our checksum) and rebuilds the `jax.stages.Compiled` the lowering
would have given, so the native fast path and every debug API that works
on a `Compiled` (cost and memory analysis, HLO text) work on it unchanged.

Anything unusual makes a miss, never a wrong program: an entry whose
executable was evicted, arguments whose shapes or dtypes differ from the
entry's, an executable whose parameter count differs, a key part without a
stable text (an object's address). Only plain single-device programs are
indexed: no effects, host callbacks, constants or extended dtypes (PRNG key
types). Edits to torch_tpu's sources change the source fingerprint.

The rebuilding uses JAX internals (`pxla.UnloadedMeshExecutable`,
`stages.Compiled`), read through `torch_tpu._compat.jax_api`, which checks
them against the JAX they were written for: a JAX whose internals differ
turns the tier off with one warning (every op is lowered, as without it),
and a rebuild that still fails is a miss with one warning.
A warm process loads the entries it will ask for ahead of its ops, in the
order the previous run asked for them (`torch_tpu.cache.prefetch`).
``TORCH_TPU_EAGER_INDEX=0`` turns the tier off; so does
``TORCH_TPU_DUMP_DIR`` (dumping needs the lowered program), and the index is
not consulted while a debug tool listens for lowered programs.
"""

from __future__ import annotations

import enum
import time
from typing import Any

from . import graphs, index, prefetch
from .index import Index, executable
from .store import warn_once
from .._compat import jax_api
from .. import cache as _cache  # this package

PREFIX = "torch_tpu-eager-v1:"
STATS = Index()


def enabled() -> bool:
    return index.enabled("TORCH_TPU_EAGER_INDEX")


# -- keys ---------------------------------------------------------------------------


class _Unstable(Exception):
    pass


def _text(part: Any, out: list) -> None:
    """Append a stable text of one key part (raise _Unstable if it has none)."""
    if part is None or isinstance(part, (bool, int, str)):
        out.append(f"{type(part).__name__}:{part!r}")
    elif isinstance(part, float):
        out.append(f"float:{part.hex()}")
    elif isinstance(part, tuple):
        out.append("(")
        for p in part:
            _text(p, out)
        out.append(")")
    elif isinstance(part, enum.Enum):
        out.append(f"{type(part).__qualname__}.{part.name}")
    elif isinstance(part, type):
        out.append(f"type:{part.__module__}.{part.__qualname__}")
    else:
        import torch

        if isinstance(part, (torch.dtype, torch.device, torch.layout, torch.memory_format,
                             torch._ops.OpOverload)):
            out.append(f"{type(part).__name__}:{part}")
        else:
            raise _Unstable(type(part).__name__)


def key_for(key: tuple, device: Any = None) -> str | None:
    """The index key of executor key `key` for JAX device `device`, or None (a
    part without a stable text).

    The executor's key names the process's device index (each torchrun rank's
    own device is its `tpu:0`); its executable is compiled for one global
    device, so the JAX device id and the process's place go in as well.
    """
    out: list = []
    try:
        _text(key, out)
    except _Unstable:
        return None
    if device is not None:
        import jax

        out.append(f"device:{device.platform}:{device.id}:"
                   f"process {jax.process_index()}/{jax.process_count()}")
    text = "\n".join(out)
    if " at 0x" in text:  # an object's address: not stable across processes
        return None
    return graphs.key_for(text, PREFIX)


# -- what a Compiled needs besides its executable -------------------------------------


def _aval_text(aval: Any) -> list | None:
    import jax

    dtype = aval.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return None  # a PRNG key type: no plain dtype name to rebuild it from
    return [list(aval.shape), str(dtype), bool(getattr(aval, "weak_type", False))]


def describe(compiled: Any) -> dict | None:
    """The index entry's description of `compiled`, or None (not indexable)."""
    meta = jax_api.describe_compiled(compiled, _aval_text)
    if meta is None:
        return None
    out_info = compiled.out_info  # the executor's programs return ([results], [new storages])
    if not (type(out_info) is tuple and len(out_info) == 2
            and all(type(part) is list for part in out_info)):
        return None
    n_res = len(out_info[0])
    if compiled.out_tree != _out_tree(n_res, len(meta["outs"]) - n_res):
        return None
    return {**meta, "n_results": n_res}


def _out_tree(n_results: int, n_bases: int) -> Any:
    import jax

    if n_results < 0 or n_bases < 0:
        return None
    return jax.tree_util.tree_structure(([0] * n_results, [0] * n_bases))


def _rebuild(exe: Any, meta: dict, args: Any, device: Any) -> Any:
    """The `jax.stages.Compiled` for loaded executable `exe` and `args`, or None."""
    import jax
    import jax.numpy as jnp

    in_tree = jax.tree_util.tree_structure((args, {}))
    if str(in_tree) != meta["in_tree"]:
        return None
    leaves = jax.tree_util.tree_leaves(args)
    stored = meta["args"]
    if len(leaves) != len(stored):
        return None
    avals = []
    for leaf, (shape, dtype, weak) in zip(leaves, stored):
        aval = jax.core.ShapedArray(tuple(shape), jnp.dtype(dtype), weak_type=bool(weak))
        if _aval_text(jax.typeof(leaf)) != _aval_text(aval):
            return None  # called with other shapes or dtypes than the entry's
        avals.append(aval)
    out_avals = [jax.core.ShapedArray(tuple(s), jnp.dtype(d), weak_type=w)
                 for s, d, w in meta["outs"]]
    out_tree = _out_tree(int(meta["n_results"]), len(out_avals) - int(meta["n_results"]))
    if out_tree is None:
        return None
    return jax_api.rebuild_compiled(exe, device, avals, [int(i) for i in meta["kept"]],
                                    out_avals, in_tree, out_tree, meta)


# -- store / load -------------------------------------------------------------------


def store(index_key: str, jax_key: str, compiled: Any) -> bool:
    """Write the index entry `index_key` -> (the executable under `jax_key`, its description)."""
    try:
        meta = describe(compiled)
    except Exception:  # noqa: BLE001 - an executable this JAX describes otherwise
        meta = None
    if meta is None:
        STATS.skip()
        return False
    return STATS.write(index_key, jax_key, meta, compiled.runtime_executable())


def fetch(index_key: str, device: Any) -> tuple[str, dict, Any] | None:
    """(JAX key, meta, loaded executable) of index entry `index_key` on
    `device`, or None: the disk reads of `load` (prefetch runs them ahead)."""
    entry = STATS.read(index_key)
    if entry is None:
        return None
    exe = executable(entry[0], device)
    return (entry[0], entry[1], exe) if exe is not None else None


def load(index_key: str, args: Any, device: Any) -> Any:
    """The `Compiled` program of index entry `index_key` for `args` on `device`, or None."""
    t0 = time.perf_counter()
    prefetch.note(index_key, device)
    got = prefetch.take(index_key)
    if got is not None:  # read on a prefetch thread: still this load's disk hit
        _cache.disk_store().note_hit(got[0])
    else:
        got = fetch(index_key, device)
    compiled = _rebuild_or_none(got[2], got[1], args, device) if got is not None else None
    STATS.count(compiled is not None, time.perf_counter() - t0)
    if compiled is not None:
        index.report_hit()
    return compiled


def _rebuild_or_none(exe: Any, meta: dict, args: Any, device: Any) -> Any:
    try:
        return _rebuild(exe, meta, args, device)
    except (ValueError, KeyError, TypeError, IndexError):
        return None  # a malformed entry
    except Exception as e:  # noqa: BLE001 - JAX internals this version lacks
        warn_once("eager-index", f"the eager index cannot rebuild JAX programs here ({e!r}); "
                  "eager ops are lowered again in each process")
        return None


class Tier:
    """This module as runtime.programs' index tier (programs.set_index_tier)."""

    def key(self, key: tuple, device: Any) -> str | None:
        return key_for(key, device) if enabled() else None

    def load(self, index_key: str, args: Any, device: Any) -> Any:
        return load(index_key, args, device)

    def store(self, index_key: str, compiled: Any) -> None:
        """Index `compiled`, just compiled or loaded on this thread (its JAX key
        is the disk tier's last one here)."""
        keys = _cache.last_compile_keys()
        if len(keys) == 1:
            store(index_key, keys[0], compiled)


def stats() -> dict:
    out = STATS.stats(enabled())
    out["prefetch"] = prefetch.stats()
    return out


def reset_stats() -> None:
    STATS.reset()


prefetch.FETCH[:] = [fetch]  # the prefetch thread loads entries through this module
