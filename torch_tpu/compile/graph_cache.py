"""The executables of compiled graphs: one specialization's `Entry`, its
place in the program cache, and the graph tier on disk.

`entry_for` is the one way a `CompiledGraph` (compile/graph.py) gets an
executable (it passes its `GraphSpec`, compile/graph_spec.py): a hit in the program cache (runtime/programs.py, where graphs are
`ProgramKind.GRAPH` entries keyed by `graph_key.program_key`, at most
``TORCH_TPU_GRAPH_CACHE_SIZE`` of them), else a load from the graph tier
(torch_tpu.cache.graphs: the executable of a graph an earlier process
compiled, found without tracing or lowering), else a compile through
`programs.hooked_compile` (the program cache's compile step, so the
executable tier and the compile listeners apply), indexed in the graph tier
for the next process when it is portable.

`GRAPH_STATS` is the graphs' row of the program cache's stats table, with
the counters only graphs have; `cache_stats()` / `reset_cache_stats()` /
`clear_cache()` are what `torch_tpu.compile` reports and clears.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..runtime import platform, programs
from ..runtime.switches import switch_on
from ..runtime import storage as st
from . import graph_key
from .graph_spec import GraphSpec
from .lowering import LoweringError

try:
    from .. import cache as _tiers
    from ..cache import graphs as _graph_tier
except Exception:  # pragma: no cover - the cache package failed to import
    # Typed as the modules: used only where graph_key.persistent_key gave a
    # key, which it does not without them.
    _tiers = _graph_tier = None  # type: ignore[assignment]

# --------------------------------------------------------------------------
# graphs in the program cache: program key -> Entry


# The graphs' row of the program cache's statistics (declared there):
# requests, hits, misses, evictions and entries, counted by programs, and
# what only graphs count, counted here.
GRAPH_STATS = programs.STATS.rows[programs.ProgramKind.GRAPH]
_lock = threading.Lock()


def cache_stats() -> dict:
    """The graphs' row: its counters and its entries in the program cache."""
    return GRAPH_STATS.as_dict()


def reset_cache_stats() -> None:
    GRAPH_STATS.reset()


def clear_cache() -> None:
    """Drop every graph entry from the program cache (other programs stay)."""
    programs.clear(programs.ProgramKind.GRAPH)


def cached_keys() -> list:
    """The program keys of the graph entries in the program cache."""
    return programs.keys(programs.ProgramKind.GRAPH)


def record(**amounts: float) -> None:
    """Add `amounts` to the counters of GRAPH_STATS (``record(graphs=1)``)."""
    with _lock:
        for name, amount in amounts.items():
            setattr(GRAPH_STATS, name, getattr(GRAPH_STATS, name) + amount)


# --------------------------------------------------------------------------
# one specialization's executables


class Entry:
    """The executable(s) of one graph specialization.

    `donating` takes the buffers of the inputs the graph overwrites; it is
    used when nothing else can see those buffers (checked per call), else
    `plain` (compiled on first need).
    """

    __slots__ = ("fn", "lower_args", "name", "key", "values", "donate_idx", "keep_idx",
                 "plain", "donating", "layouts", "opt_level")

    @property
    def compiled(self):
        """The executable the program cache charges this entry's bytes for."""
        return self.donating if self.donating is not None else self.plain

    def __init__(self, fn, lower_args, name, key, values, donate_idx, keep_idx):
        self.fn = fn
        self.lower_args = lower_args
        self.name = name
        self.key = key
        self.values = values
        self.donate_idx = donate_idx
        self.keep_idx = keep_idx
        self.plain = None
        self.donating = None
        self.layouts = None
        self.opt_level = None

    def release_trace(self):
        # Keep only abstract values for a later compile of the other variant.
        self.lower_args = _abstract(self.lower_args)

    def run(self, spec: GraphSpec, args: Sequence[Any], arrays: Sequence[Any],
            consts: Sequence[Any], rng: Any) -> Any:
        donated = [arrays[i] for i in self.donate_idx]
        kept = [arrays[i] for i in self.keep_idx]
        if self.donating is not None and _can_donate(spec, self.donate_idx, args, donated):
            GRAPH_STATS.donating_calls += 1
            return self.donating(donated, kept, consts, rng)
        if self.plain is None:
            self.plain = programs.hooked_compile()(self.name, self.key, self.fn,
                                                   self.lower_args, opt_level=self.opt_level)
        return self.plain(donated, kept, consts, rng)


def entry_for(spec: GraphSpec, entry: Entry, consts: Sequence[Any]) -> Entry:
    """The cached entry of `entry.key`, else `entry` with its executable
    loaded from the graph tier or compiled (and then cached)."""
    gkey = entry.key
    with _lock:
        hit = programs.find(gkey)
        if hit is not None:
            return hit
    fn, lower_args, level = entry.fn, entry.lower_args, entry.opt_level
    # Inputs the graph overwrites (an optimizer's parameters) are donated:
    # XLA writes the new values into their buffers instead of new ones.
    donating = bool(entry.donate_idx and _donation_enabled())
    pkey = graph_key.persistent_key(spec, gkey, donating, consts)
    if pkey is None or not _load_persistent(spec, pkey, entry, donating):
        t0 = time.perf_counter()
        # keep_unused: the executable takes every flattened argument, so
        # that the graph tier can call it without JAX's argument pruning.
        extra = {"keep_unused": True} if pkey is not None else {}
        try:
            if donating:
                # hooked_compile: with the declared compile hooks (SPMD programs).
                compiled = entry.donating = programs.hooked_compile()(
                    spec.name, gkey + ("donate",), fn, lower_args, donate_argnums=(0,),
                    opt_level=level, **extra)
            else:
                compiled = entry.plain = programs.hooked_compile()(
                    spec.name, gkey, fn, lower_args, opt_level=level, **extra)
        except LoweringError:
            raise
        except Exception as e:  # a lowering that fails inside a graph: run it eagerly
            raise LoweringError(f"{type(e).__name__}: {e}") from e
        record(lowered=1, lower_compile_seconds=time.perf_counter() - t0)
        if pkey is not None:
            _store_persistent(spec, pkey, compiled, lower_args, entry.values)
    entry.release_trace()
    with _lock:
        programs.insert(gkey, entry)
    return entry


def _donation_enabled() -> bool:
    return switch_on("TORCH_TPU_DONATE")  # the spelling fused mode reads too


_OWN_REFS = 6


def _can_donate(spec: GraphSpec, donate_idx: Sequence[int], args: Sequence[Any],
                donated: Sequence[Any]) -> bool:
    """Are the donated arrays only held by their own (plain) input tensors?"""
    seen = set()
    for i, arr in zip(donate_idx, donated):
        t = args[spec.tensor_pos[i]]
        if t.device.type != "tpu":
            return False
        data = st.data_of(t)
        if data.array is not arr or id(arr) in seen:
            return False
        seen.add(id(arr))
        # Our own references: the storage's slot, the `arrays` and `donated`
        # lists, zip's tuple, `arr` and getrefcount's argument. One more is
        # someone else's (another storage sharing this array, a user's handle).
        if sys.getrefcount(arr) > _OWN_REFS:
            return False
    return True


def whole_reshape(layout: tuple, array: jax.Array | jax.ShapeDtypeStruct) -> bool:
    """Is a view with `layout` its whole storage (`array`) in another shape?"""
    if len(layout) != 4 or layout[3] != 0:
        return False
    dtype, sizes, strides = layout[0], layout[1], layout[2]
    try:
        if np.dtype(st.jax_dtype(dtype)) != np.dtype(array.dtype):
            return False
    except TypeError:
        return False
    if int(np.prod(sizes, dtype=np.int64)) != int(np.prod(array.shape, dtype=np.int64)):
        return False
    return st.is_contiguous(sizes, strides)


# --------------------------------------------------------------------------
# the graph tier (torch_tpu.cache.graphs)


def _load_persistent(spec: GraphSpec, pkey: str, entry: Entry, donating: bool) -> bool:
    """Fill `entry` from the graph tier without lowering; False on a miss."""
    lower_args = entry.lower_args
    t0 = time.perf_counter()
    device = platform.jax_device(spec.device)
    tier = programs.disk_tier()  # the disk tier's hooks, as programs.compile uses them
    token = tier.begin() if tier is not None else None
    source = "compiled"
    prog = None
    programs.STATS.compile_clock.begin()  # the wall time of `seconds` below
    try:
        got = _graph_tier.load(pkey, device)
        if got is not None:
            exe, meta = got
            n_in = len(jax.tree_util.tree_leaves(lower_args))
            if meta.get("n_in") == n_in and len(exe.get_parameter_layouts()) == n_in:
                values = {}
                for k, v in meta.get("values", []):
                    values[k if isinstance(k, str) else int(k)] = \
                        _graph_tier.decode_value(v)
                prog = _LoadedProgram(exe, device, int(meta["n_out"]),
                                     len(exe.get_output_layouts()))
                prog.relower = _relowerer(entry.fn, lower_args, donating)
                prog._torch_tpu_bytes = programs.footprint(spec.name, prog)
    except Exception:  # a bad entry is a miss
        prog = None
    finally:
        seconds = time.perf_counter() - t0
        programs.STATS.compile_clock.end()
        if tier is not None and prog is not None:
            source = tier.end(token, spec.name, seconds, 0.0)
        elif tier is not None:
            tier.abort(token)
    if prog is None:
        return False
    entry.values.update(values)
    if donating:
        entry.donating = prog
    else:
        entry.plain = prog
    record(disk_loads=1, load_seconds=seconds)
    _graph_tier.report_hit()
    programs.record_compile(spec.name, entry.key, seconds, prog, source)
    return True


def _store_persistent(spec: GraphSpec, pkey: str, compiled: Any, lower_args: Any,
                      value_results: dict) -> None:
    """Index this graph's executable in the graph tier (when it is portable)."""
    try:
        keys = _tiers.last_compile_keys()
        exe = compiled.runtime_executable()
        n_in = len(jax.tree_util.tree_leaves(lower_args))
        out_index = value_results.get("__out_index__")
        n_unique = len(set(out_index)) if out_index is not None else None
        n_out_total = len(exe.get_output_layouts())
        if (len(keys) != 1 or n_unique is None or n_in != len(exe.get_parameter_layouts())
                or n_out_total < n_unique
                or n_out_total - n_unique != len(spec.program.mutated_inputs)):
            _graph_tier.skipped()
            return
        values = [[k, _graph_tier.encode_value(v)] for k, v in value_results.items()]
        _graph_tier.store(pkey, keys[0], {"n_in": n_in, "n_out": n_unique,
                                          "values": values, "name": spec.name}, exe)
    except Exception:  # not portable (a value we cannot encode, ...): not stored
        _graph_tier.skipped()


class _LoadedProgram:
    """A graph executable loaded by the graph tier: called like a jax Compiled
    (donated, kept, consts, rng) -> (outputs, mutated input values), through
    the PJRT executable itself (nothing was traced in this process)."""

    __slots__ = ("exe", "device", "n_out", "n_total", "relower", "_torch_tpu_bytes")

    def __init__(self, exe, device, n_out, n_total, relower=None):
        self.exe = exe
        self.device = device
        self.n_out = n_out
        self.n_total = n_total
        # () -> jax.stages.Lowered of the same program, traced on demand
        # (torch_tpu.debug's 'stablehlo' and 'hlo' stages); None: unavailable.
        self.relower = relower
        self._torch_tpu_bytes = 0  # what the program cache charges (set at the load)

    def __call__(self, donated, kept, consts, rng):
        flat = [*donated, *kept, *consts]
        if rng is not None:
            flat.append(rng)
        for i, a in enumerate(flat):
            if not isinstance(a, jax.Array):
                flat[i] = jax.device_put(a, self.device)
        res = self.exe.execute_sharded(flat).disassemble_into_single_device_arrays()
        outs = [r[0] for r in res]
        return outs[:self.n_out], outs[self.n_out:]

    # What torch_tpu.debug asks of a jax Compiled, answered by the executable.
    def as_text(self):
        return self.exe.get_hlo_text()

    def cost_analysis(self):
        return self.exe.cost_analysis()

    def memory_analysis(self):
        return self.exe.get_compiled_memory_stats()

    def runtime_executable(self):
        return self.exe


def _abstract(tree):
    """`tree` with every array replaced by its shape, dtype and sharding.

    An uncommitted array (one JAX may move) lowers without a sharding
    annotation, so it gets none here either: a re-lowered program must be
    the text the compiled one was lowered to."""
    def one(a):
        if not hasattr(a, "shape"):
            return a
        sharding = getattr(a, "sharding", None) if getattr(a, "committed", True) else None
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

    return jax.tree_util.tree_map(one, tree)


def _relowerer(fn, lower_args, donating):
    """A thunk lowering `fn` as `programs.compile` did for the graph tier (no
    arrays held: only their abstract values)."""
    abstract = _abstract(lower_args)
    kwargs: dict[str, Any] = {"keep_unused": True}
    if donating:
        kwargs["donate_argnums"] = (0,)
    return lambda: jax.jit(fn, **kwargs).lower(*abstract)
