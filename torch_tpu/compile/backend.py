"""The dynamo backend "tpu": AOTAutograd, one XLA executable per graph.

    model = torch.compile(model, backend="tpu")

Dynamo captures a graph of torch calls; AOTAutograd functionalizes it,
applies PyTorch's core-ATen decompositions (except for ops the lowering
table handles directly) and splits training graphs into a forward and a
backward graph. Each graph becomes a `CompiledGraph`: the graph is lowered to
one jax function with the same lowering table eager mode uses (`lowering.py`)
and jit-compiled once per input signature, through the executor's compile
path, so both tiers of the compile cache apply (torch_tpu.cache). Static
graphs are also indexed in the graph tier (torch_tpu.cache.graphs): a later
process with the same graph loads its executable without lowering it.

At run time a call reads the jax values of its tpu inputs (parameters and
buffers stay on the device between calls: nothing is copied in or out),
runs the executable (asynchronously: nothing waits for the result), wraps
its outputs as tpu tensors and writes input mutations back into the input
tensors. Anything the backend cannot lower (a higher-order op, a
data-dependent shape) makes that graph run op by op on the eager device,
with one warning: a graph never fails to run because of the backend.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import os
import sys
import threading
import time
import warnings

import jax
import numpy as np
import torch
import torch.fx

from ..ops import registry
from ..runtime import async_compile, executor, gc_pause, programs
from ..runtime import opt_level as _olevel
from ..runtime import storage as st
from . import dynamic as dyn
from . import effects
from . import padding
from .lowering import GraphProgram, LoweringError, SymEnv, _const_value
from .outputs import wrap_outputs

try:
    from ..cache import graphs as _graph_tier
except Exception:  # pragma: no cover - the cache package failed to import
    _graph_tier = None
try:
    from ..cache import artifacts as _artifacts
except Exception:  # pragma: no cover - the cache package failed to import
    _artifacts = None

aten = torch.ops.aten

# --------------------------------------------------------------------------
# memory tier for graphs: fingerprint -> compiled executable


class _GraphCacheStats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.requests = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.graphs = 0          # CompiledGraph objects created
        self.eager_fallbacks = 0  # graphs that run op by op
        self.donating_calls = 0   # calls that gave their overwritten inputs' buffers to XLA
        self.runs = 0             # graph programs executed (one per compiled-graph call)
        self.lowered = 0          # graph specializations traced, lowered and compiled/loaded by XLA
        self.disk_loads = 0       # ... loaded from the graph tier instead (nothing traced)
        self.prebuilt = 0         # backward programs compiled ahead, at the forward's first call
        self.backend_seconds = 0.0        # in tpu_backend: AOTAutograd + graph setup
        self.lower_compile_seconds = 0.0  # tracing + lowering + XLA compile (or executable load)
        self.load_seconds = 0.0           # graph-tier loads


GRAPH_STATS = _GraphCacheStats()
_GRAPH_CACHE: "collections.OrderedDict" = collections.OrderedDict()
_lock = threading.Lock()


def _graph_cache_capacity() -> int:
    return int(os.environ.get("TORCH_TPU_GRAPH_CACHE_SIZE", "512"))


def cache_stats() -> dict:
    s = GRAPH_STATS
    return {"requests": s.requests, "hits": s.hits, "misses": s.misses,
            "evictions": s.evictions, "entries": len(_GRAPH_CACHE), "graphs": s.graphs,
            "eager_fallbacks": s.eager_fallbacks, "donating_calls": s.donating_calls,
            "runs": s.runs,
            "lowered": s.lowered, "disk_loads": s.disk_loads, "prebuilt": s.prebuilt,
            "backend_seconds": s.backend_seconds,
            "lower_compile_seconds": s.lower_compile_seconds, "load_seconds": s.load_seconds}


def reset_cache_stats() -> None:
    GRAPH_STATS.reset()


def clear_cache() -> None:
    with _lock:
        _GRAPH_CACHE.clear()


# --------------------------------------------------------------------------


class _Spec:
    """How one placeholder is passed: tensor, symbolic int, or other value."""

    __slots__ = ("kind", "dtype", "index", "static")

    def __init__(self, kind, dtype=None, index=None, static=None):
        self.kind = kind      # "t" tensor, "s" SymInt/int, "x" other python value
        self.dtype = dtype
        self.index = index
        self.static = static


def _device_of(example_inputs):
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return x.device.index if x.device.index is not None else 0
    from ..device import module

    return module.current_device()


class CompiledGraph:
    """One AOT graph (forward, backward or inference) as XLA executables."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, kind: str, options=None,
                 n_user_outputs=None):
        # Boxed calling convention (one list of inputs, cleared after use). An
        # instance attribute, so that wrappers made with functools.wraps keep it.
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        self.options = options or {}
        # The XLA optimization level of this graph's programs (the "opt_level"
        # option); None: the process-wide level when a program is compiled.
        self.opt_level = self.options.get("opt_level")
        self.name = f"graph_{kind}"
        # Effectful ops (linalg's error checks) leave the graph and run after it.
        self.hoisted, tokens, self.n_graph_outputs = effects.hoist(gm)
        self.program = GraphProgram(gm, self.name)
        self.device = _device_of(example_inputs)
        self.specs = []
        placeholders = self.program.placeholders
        for n, ex in zip(placeholders, example_inputs):
            val = n.meta.get("val", ex)
            if n in tokens:  # an effect token: None at run time
                self.specs.append(_Spec("x", static=None))
            elif isinstance(val, torch.Tensor):
                self.specs.append(_Spec("t", val.dtype))
            elif isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
                self.specs.append(_Spec("s"))
            else:
                self.specs.append(_Spec("x", static=val))
        self.tensor_pos = [i for i, s in enumerate(self.specs) if s.kind == "t"]
        self.int_pos = [i for i, s in enumerate(self.specs) if s.kind == "s"]
        self.symbolic = bool(self.int_pos) or any(
            isinstance(d, torch.SymInt)
            for n in placeholders
            for d in (n.meta["val"].shape if isinstance(n.meta.get("val"), torch.Tensor)
                      else ()))
        self._analyze_outputs()
        code = gm.code
        self.fingerprint = hashlib.sha256(code.encode()).hexdigest()
        self.executables = collections.OrderedDict()  # specialization key -> entry
        self.policy = dyn.Policy.from_options(self.options) if self.symbolic else None
        self.pad_ok = None       # False once padding to buckets proved unsafe
        self.pad_plan = None
        self.seen_sizes = {}     # symbol -> values seen (only changing ones are padded)
        self.warned_cap = False
        # Outputs [0, n_user_outputs) are what the user (or AOTAutograd's
        # wrapper) sees; the rest of a forward graph's outputs are saved for
        # the backward graph.
        self.n_user_outputs = len(self.out_specs)
        if kind == "forward":
            try:
                md = torch._guards.TracingContext.try_get().fw_metadata
                self.n_user_outputs = int(md.num_forward)
            except Exception:
                pass
            if n_user_outputs is not None:  # rebuilt from a compile package
                self.n_user_outputs = int(n_user_outputs)
            if not self.symbolic:
                self._saved_views_of_inputs()
        mutated = set(self.program.mutated_inputs)
        self.donate_idx = [i for i, p in enumerate(self.tensor_pos) if p in mutated]
        self.eager = False
        self.consts = None
        # A forward graph's backward graph (linked by tpu_backend), whose
        # program is compiled in the background from the forward's first call
        # on (`_prebuild_backward`); the futures wait in the backward's
        # `prebuilt`, by specialization token.
        self.backward_graph = None
        self.prebuilt = {}
        with _lock:
            GRAPH_STATS.graphs += 1

    def _analyze_outputs(self):
        """Which outputs come from the program, the inputs, or are not tensors."""
        outs = self.program.output_node.args[0]
        if not isinstance(outs, (list, tuple)):
            outs = (outs,)
        index = {n: i for i, n in enumerate(self.program.placeholders)}
        self.output_nodes = list(outs)
        self.out_specs = []
        n_prog = 0
        for o in outs:
            if o is None:
                self.out_specs.append(("none", None))
            elif isinstance(o, torch.fx.Node) and o in index and o.op == "placeholder" \
                    and isinstance(o.meta.get("val"), torch.Tensor):
                self.out_specs.append(("input", index[o]))
            elif isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor):
                self.out_specs.append(("array", n_prog, o.meta["val"].dtype))
                n_prog += 1
            elif isinstance(o, torch.fx.Node):
                self.out_specs.append(("value", None))
            else:
                self.out_specs.append(("const", o))
        self.n_prog_out = n_prog

    def _saved_views_of_inputs(self):
        """Saved-for-backward outputs that are views of inputs (`t(weight)`):
        returned as views (metadata only) instead of materialized copies."""
        index = {n: i for i, n in enumerate(self.program.placeholders)}
        for i, o in enumerate(self.output_nodes):
            if i < self.n_user_outputs or self.out_specs[i][0] != "array":
                continue
            base = o
            while (isinstance(base, torch.fx.Node) and base.op == "call_function"
                   and base.target in _VIEW_OPS and isinstance(base.args[0], torch.fx.Node)):
                base = base.args[0]
            if base is o or base not in index:
                continue
            fin, fout = base.meta.get("val"), o.meta.get("val")
            if not (isinstance(fin, torch.Tensor) and isinstance(fout, torch.Tensor)):
                continue
            try:
                view = (tuple(int(d) for d in fout.shape), tuple(int(d) for d in fout.stride()),
                        int(fout.storage_offset()) - int(fin.storage_offset()),
                        tuple(int(d) for d in fin.shape), tuple(int(d) for d in fin.stride()))
            except (TypeError, ValueError):
                continue
            self.out_specs[i] = ("input_view", index[base], view, self.out_specs[i][1])
        # The program no longer computes those: renumber its outputs.
        n = 0
        for i, spec in enumerate(self.out_specs):
            if spec[0] == "array":
                self.out_specs[i] = ("array", n, spec[2])
                n += 1
        self.n_prog_out = n

    # -- compiling ---------------------------------------------------------

    def _build(self, arrays, ints, consts, key, layouts=None):
        """Compile the program for these input values (one specialization).

        `layouts[i]` (static graphs): tensor input i arrives as its storage's
        array and is read through that view layout inside the program, so a
        view input (`t(weight)` saved for the backward) costs no separate copy.
        """
        program = self.program
        specs = self.specs
        tensor_pos = self.tensor_pos
        int_pos = self.int_pos
        uses_rng = program.uses_rng
        placeholders = program.placeholders
        value_outs = [i for i, spec in enumerate(self.out_specs) if spec[0] == "value"]

        def make_syms(inputs):
            syms = SymEnv()
            for n, v in zip(placeholders, inputs):
                val = n.meta.get("val")
                if isinstance(val, torch.Tensor) and v is not None:  # (None: a token)
                    for d, size in zip(val.shape, v.shape):
                        syms.bind(d, size)
                elif isinstance(val, torch.SymInt):
                    syms.bind(val, v)
            return syms

        static_ints = tuple(ints)
        layouts = tuple(layouts) if layouts is not None else (None,) * len(tensor_pos)
        # An input that is its whole storage in another shape (a flat storage
        # read as a matrix): a reshape in the program; its new value goes back
        # in the storage's shape, so it can be donated like a plain input.
        reshaped = {i: tuple(arrays[i].shape) for i in self.donate_idx
                    if layouts[i] is not None and _whole_reshape(layouts[i], arrays[i])}
        donate_idx = [i for i in self.donate_idx if layouts[i] is None or i in reshaped]
        keep_idx = [i for i in range(len(tensor_pos)) if i not in set(donate_idx)]
        mut_reshape = [(j, reshaped[tensor_pos.index(p)])
                       for j, p in enumerate(program.mutated_inputs)
                       if p in tensor_pos and tensor_pos.index(p) in reshaped]

        def fn(donated, kept, consts, rng):
            arrays = [None] * len(tensor_pos)
            for i, a in zip(donate_idx, donated):
                arrays[i] = a if i not in reshaped else a.reshape(layouts[i][1])
            for i, a in zip(keep_idx, kept):
                arrays[i] = a if layouts[i] is None else st.strided_read(a, layouts[i])
            inputs = [None] * len(specs)
            for p, a in zip(tensor_pos, arrays):
                inputs[p] = a
            for p, v in zip(int_pos, static_ints):
                inputs[p] = v
            for p, s in enumerate(specs):
                if s.kind == "x":
                    inputs[p] = s.static
            syms = make_syms(inputs)
            outs, muts = program.trace(inputs, consts, rng if uses_rng else None, syms)
            if mut_reshape:
                muts = list(muts)
                for j, shape in mut_reshape:
                    muts[j] = muts[j].reshape(shape)
            # Python values among the outputs (sizes saved for the backward) are
            # constants of this specialization: recorded while tracing.
            value_results.update((i, outs[i]) for i in value_outs)
            arr_outs = [v for spec, v in zip(self.out_specs, outs) if spec[0] == "array"]
            # The same value returned twice (`relu` and its `alias`, both saved
            # for the backward) is returned once: XLA would copy it.
            unique, index, seen = [], [], {}
            for v in arr_outs:
                j = seen.get(id(v))
                if j is None:
                    j = seen[id(v)] = len(unique)
                    unique.append(v)
                index.append(j)
            value_results["__out_index__"] = index
            return unique, muts

        value_results = {}

        rng = np.zeros((4,), np.uint32) if uses_rng else None
        lower_args = ([arrays[i] for i in donate_idx], [arrays[i] for i in keep_idx],
                      list(consts), rng)
        level = self.level()
        gkey = (self.fingerprint, self.kind, key, self.device, tuple(donate_idx),
                tuple(tuple(c.shape) + (str(c.dtype),) if hasattr(c, "shape") else repr(c)
                      for c in consts), ("opt_level", level))
        with _lock:
            GRAPH_STATS.requests += 1
            hit = _GRAPH_CACHE.get(gkey)
            if hit is not None:
                GRAPH_STATS.hits += 1
                _GRAPH_CACHE.move_to_end(gkey)
                return hit
            GRAPH_STATS.misses += 1
        entry = _Entry(fn, lower_args, self.name, gkey, value_results, donate_idx, keep_idx)
        entry.layouts = layouts
        entry.opt_level = level
        # Inputs the graph overwrites (an optimizer's parameters) are donated:
        # XLA writes the new values into their buffers instead of new ones.
        donating = bool(donate_idx and _donation_enabled())
        pkey = self._persistent_key(gkey, donating, consts)
        if pkey is None or not self._load_persistent(pkey, entry, donating, lower_args,
                                                     value_results):
            t0 = time.perf_counter()
            # keep_unused: the executable takes every flattened argument, so
            # that the graph tier can call it without JAX's argument pruning.
            extra = {"keep_unused": True} if pkey is not None else {}
            try:
                if donating:
                    # hooked_compile: with the declared compile hooks (SPMD programs).
                    compiled = entry.donating = programs.hooked_compile()(
                        self.name, gkey + ("donate",), fn, lower_args, donate_argnums=(0,),
                        opt_level=level, **extra)
                else:
                    compiled = entry.plain = programs.hooked_compile()(
                        self.name, gkey, fn, lower_args, opt_level=level, **extra)
            except LoweringError:
                raise
            except Exception as e:  # a lowering that fails inside a graph: run it eagerly
                raise LoweringError(f"{type(e).__name__}: {e}") from e
            with _lock:
                GRAPH_STATS.lowered += 1
                GRAPH_STATS.lower_compile_seconds += time.perf_counter() - t0
            if pkey is not None:
                self._store_persistent(pkey, compiled, lower_args, value_results)
        entry.release_trace()
        with _lock:
            _GRAPH_CACHE[gkey] = entry
            if len(_GRAPH_CACHE) > _graph_cache_capacity():
                _GRAPH_CACHE.popitem(last=False)
                GRAPH_STATS.evictions += 1
        return entry

    # -- the graph tier (torch_tpu.cache.graphs) -----------------------------

    def _persistent_key(self, gkey, donating, consts):
        """The graph tier's key of this specialization, or None (not stored)."""
        if self.symbolic or _graph_tier is None:
            return None
        try:
            if not _graph_tier.enabled():
                return None
            if any(not isinstance(c, jax.Array) for c in consts):
                return None
            parts = [self.kind, self.gm.code, repr(gkey), repr(self.out_specs),
                     str(self.n_user_outputs), repr(self.program.mutated_inputs),
                     "donate" if donating else "plain"]
            for n in self.program.placeholders:
                val = n.meta.get("val")
                if isinstance(val, torch.Tensor):
                    parts.append(repr((tuple(int(d) for d in val.shape),
                                       tuple(int(d) for d in val.stride()),
                                       str(val.dtype), int(val.storage_offset()))))
                else:
                    parts.append(type(val).__name__)
            text = "\n".join(parts)
            if " at 0x" in text:  # an object's address: not stable across processes
                return None
            return _graph_tier.key_for(text)
        except Exception:  # anything we cannot describe is simply not stored
            return None

    def _load_persistent(self, pkey, entry, donating, lower_args, value_results) -> bool:
        """Fill `entry` from the graph tier without lowering; False on a miss."""
        from ..runtime import platform

        t0 = time.perf_counter()
        device = platform.jax_device(self.device)
        tier = programs.disk_tier()  # the disk tier's hooks, as programs.compile uses them
        token = tier.begin() if tier is not None else None
        source = "compiled"
        prog = None
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
        except Exception:  # a bad entry is a miss
            prog = None
        finally:
            seconds = time.perf_counter() - t0
            if tier is not None and prog is not None:
                source = tier.end(token, self.name, seconds, 0.0)
            elif tier is not None:
                tier.abort(token)
        if prog is None:
            return False
        value_results.update(values)
        if donating:
            entry.donating = prog
        else:
            entry.plain = prog
        with _lock:
            GRAPH_STATS.disk_loads += 1
            GRAPH_STATS.load_seconds += seconds
        _graph_tier.report_hit()
        programs.record_compile(self.name, entry.key, seconds, prog, source)
        return True

    def _store_persistent(self, pkey, compiled, lower_args, value_results):
        """Index this graph's executable in the graph tier (when it is portable)."""
        from .. import cache as _tiers

        try:
            keys = _tiers.last_compile_keys()
            exe = compiled.runtime_executable()
            n_in = len(jax.tree_util.tree_leaves(lower_args))
            out_index = value_results.get("__out_index__")
            n_unique = len(set(out_index)) if out_index is not None else None
            n_out_total = len(exe.get_output_layouts())
            if (len(keys) != 1 or n_unique is None or n_in != len(exe.get_parameter_layouts())
                    or n_out_total < n_unique
                    or n_out_total - n_unique != len(self.program.mutated_inputs)):
                _graph_tier.skipped()
                return
            values = [[k, _graph_tier.encode_value(v)] for k, v in value_results.items()]
            _graph_tier.store(pkey, keys[0], {"n_in": n_in, "n_out": n_unique,
                                              "values": values, "name": self.name}, exe)
        except Exception:  # not portable (a value we cannot encode, ...): not stored
            _graph_tier.skipped()

    # -- running -----------------------------------------------------------

    def __call__(self, *args):
        # Boxed (one list, which we may clear) or unboxed (the values) calls:
        # AOTAutograd uses both; a graph input is never a list.
        if len(args) == 1 and type(args[0]) is list:
            args = args[0]
        else:
            args = list(args)
        if self.eager:
            results = self._run_eager(args)
        else:
            try:
                results = self._run(args)
            except LoweringError as e:
                self._to_eager(e)
                results = self._run_eager(args)
        if self.hoisted:
            results = effects.run_hoisted(results, self.hoisted, self.n_graph_outputs)
        return results

    def _run(self, args):
        if self.consts is None:
            self.consts = [_const_value(v, self.device) for _, v in self.program.constants]
        ints = [int(args[p]) for p in self.int_pos]
        if self.symbolic:
            # The policy reads the inputs itself (padded inputs are not re-read).
            return self.policy.run(self, args, None, ints)
        arrays, layouts = self.read_storages(args)
        return self._run_static(args, arrays, ints, layouts)

    def read_storages(self, args):
        """Storage arrays of the tensor inputs and their view layouts (None: plain)."""
        arrays, layouts = [], []
        for p in self.tensor_pos:
            t = args[p]
            data = getattr(t.untyped_storage(), "_tpu", None) if t.device.type == "tpu" else None
            if data is None:
                arrays.append(executor.value(t) if t.device.type == "tpu"
                              else st.from_host(t, self.device))
                layouts.append(None)
                continue
            arrays.append(data.array)
            layouts.append(st.layout_of(t, data))
        if padding.SPECS:
            self._unpad_inputs(args, arrays)
        return arrays, tuple(layouts)

    def read_inputs(self, args):
        """The jax values of the tensor inputs."""
        arrays = []
        for p in self.tensor_pos:
            t = args[p]
            if t.device.type == "tpu":
                arrays.append(executor.value(t))
            else:
                arrays.append(st.from_host(t, self.device))
        if padding.SPECS:
            self._unpad_inputs(args, arrays)
        return arrays

    def _run_static(self, args, arrays, ints, layouts):
        # Dynamo's guards fix the shapes of a static graph; what can still
        # change the program is the matmul precision and the inputs' layouts.
        token = (_precision_token(), self.level(), layouts, tuple(a.shape for a in arrays))
        entry = self.executables.get(token)
        if entry is None:
            if self.backward_graph is not None:
                self._prebuild_backward(arrays, layouts)
            if self.prebuilt:
                entry = _prebuilt_entry(self.prebuilt.pop(token, None))
                if entry is not None:
                    with _lock:
                        GRAPH_STATS.prebuilt += 1
            if entry is None:
                entry = self._build(arrays, ints, self.consts,
                                    self.signature(arrays, ints) + (layouts,), layouts)
            self.executables[token] = entry
        return self._execute(entry, args, arrays)

    # -- compiling the backward while the forward compiles -------------------

    def _prebuild_backward(self, arrays, layouts):
        """Compile the backward graph's program on a background thread.

        Called once, at this forward graph's first call, before its own
        program is built: the backward's inputs are this graph's saved
        outputs and the tangents, whose shapes, dtypes and layouts follow
        from this graph's inputs and the fake values AOTAutograd traced with.
        XLA compiles outside the GIL, so the backward program compiles while
        the forward's compiles and runs and the host goes on (loss.backward()
        then finds it ready). A prediction that turns out wrong (another
        layout at the backward's first call) only costs the unused compile:
        the backward then builds its program as before. Opt-in: see
        `_prebuild_enabled`.
        """
        bw, self.backward_graph = self.backward_graph, None
        if (bw is None or bw.eager or bw.symbolic or bw.int_pos or bw.executables
                or padding.SPECS or not _prebuild_enabled()):
            return
        try:
            predicted = bw._inputs_from_forward(self, arrays, layouts)
        except Exception:  # nothing we can predict: the backward builds on its first call
            predicted = None
        if predicted is None:
            return
        b_arrays, b_layouts = predicted[0], tuple(predicted[1])
        if bw.consts is None:
            bw.consts = [_const_value(v, bw.device) for _, v in bw.program.constants]
        precision = _precision_token()
        token = (precision, bw.level(), b_layouts, tuple(tuple(a.shape) for a in b_arrays))
        key = bw.signature(b_arrays, []) + (b_layouts,)
        matmul = jax.config.jax_default_matmul_precision

        def build():
            if _precision_token() != precision:  # a thread-local precision context
                with jax.default_matmul_precision(matmul):
                    return bw._build(b_arrays, [], bw.consts, key, b_layouts)
            return bw._build(b_arrays, [], bw.consts, key, b_layouts)

        # The compile pool eager ops compile on (runtime.async_compile); not
        # counted as outstanding work, which would defer eager ops.
        bw.prebuilt[token] = async_compile.compile_pool().submit(build)

    def _inputs_from_forward(self, fw, fw_arrays, fw_layouts):
        """(arrays, layouts) this backward graph will read at its first call,
        as `read_storages` will give them: arrays are the forward's own input
        arrays or abstract values; None where a case is not foreseen."""
        sharding = None
        for a in fw_arrays:
            if isinstance(a, jax.Array) and getattr(a, "committed", False):
                sharding = a.sharding
                break
        if sharding is None:
            return None
        saved = {}
        for i, n in enumerate(fw.output_nodes):
            if i >= fw.n_user_outputs and isinstance(n, torch.fx.Node):
                saved.setdefault(n.name, i)
        fw_index = {p: k for k, p in enumerate(fw.tensor_pos)}
        arrays, layouts = [], []
        for p in self.tensor_pos:
            node = self.program.placeholders[p]
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.dtype is torch.complex32:
                return None
            i = saved.get(node.name)
            if i is None:
                # A tangent: a new, plain tensor (AOTAutograd makes it so).
                if not node.name.startswith("tangents") or not _plain_fake(val):
                    return None
                arrays.append(jax.ShapeDtypeStruct(tuple(int(d) for d in val.shape),
                                                   st.jax_dtype(val.dtype), sharding=sharding))
                layouts.append(None)
                continue
            spec = fw.out_specs[i]
            if spec[0] == "array":
                out = fw.output_nodes[i].meta.get("val")
                if (not isinstance(out, torch.Tensor) or not _plain_fake(out)
                        or out.dtype is not spec[2] or not _plain_fake(val)):
                    return None
                arrays.append(jax.ShapeDtypeStruct(tuple(int(d) for d in out.shape),
                                                   st.jax_dtype(spec[2]), sharding=sharding))
                layouts.append(None)
            elif spec[0] == "input":
                k = fw_index[spec[1]]
                arrays.append(fw_arrays[k])
                layouts.append(fw_layouts[k])
            elif spec[0] == "input_view":
                k = fw_index[spec[1]]
                if fw_layouts[k] is not None or fw.specs[spec[1]].dtype is not val.dtype:
                    return None
                size, stride, offset = spec[2][0], spec[2][1], spec[2][2]
                arr = fw_arrays[k]
                if (size == tuple(arr.shape) and offset == 0
                        and _contiguous(size, stride)):
                    layouts.append(None)
                else:
                    layouts.append((val.dtype, tuple(size), tuple(stride), offset))
                arrays.append(arr)
            else:
                return None
        return arrays, layouts

    def _unpad_inputs(self, args, arrays):
        """Saved activations a padded graph produced padded, for an unpadded graph."""
        for i, p in enumerate(self.tensor_pos):
            reg = dyn._registered(args[p])
            if reg is not None:
                arrays[i] = padding.unpad(arrays[i], reg[0], reg[2])

    def signature(self, arrays, ints):
        """The specialization key of these input values."""
        return (tuple((a.shape, str(a.dtype)) for a in arrays), tuple(ints),
                tuple(repr(s.static) for s in self.specs if s.kind == "x"), _precision_token(),
                self.level())

    def level(self) -> int:
        """The XLA optimization level this graph compiles at now."""
        return _olevel.LEVEL if self.opt_level is None else self.opt_level

    def _execute(self, entry, args, arrays, out_slices=None):
        value_results = entry.values
        rng = None
        if self.program.uses_rng:
            from ..device import random as tpu_random

            rng = tpu_random.next_key(self.device)
        outs, muts = entry.run(self, args, arrays, self.consts, rng)
        GRAPH_STATS.runs += 1
        out_index = value_results.get("__out_index__")
        if out_index is not None and len(out_index) != len(outs):
            outs = [outs[j] for j in out_index]
        device = self.device

        def array(i, spec):
            arr = outs[spec[1]]
            if out_slices is not None and out_slices[i] is not None:
                arr = out_slices[i](arr)
            return st.wrap(arr, device, spec[2])

        return wrap_outputs(self, args, muts, array, value_results.__getitem__)

    # -- eager fallback ------------------------------------------------------

    def _to_eager(self, err):
        self.eager = True
        with _lock:
            GRAPH_STATS.eager_fallbacks += 1
        warnings.warn(
            f"torch_tpu: a compiled {self.kind} graph runs op by op on the tpu device "
            f"because it cannot be lowered as one program: {err}", stacklevel=3)

    def _run_eager(self, args):
        args = list(args) if not isinstance(args, list) else args
        if not getattr(self, "_views_as_reshapes", False):
            _views_as_reshapes(self.gm)
            self._views_as_reshapes = True
        with torch.no_grad():
            out = self.gm(*args)
        args.clear()
        return list(out) if isinstance(out, (list, tuple)) else [out]


def _views_as_reshapes(gm: torch.fx.GraphModule) -> None:
    """`aten.view` nodes of a graph that runs op by op become `aten.reshape`.

    The graph was traced with fake tensors whose strides come from PyTorch's
    meta kernels; an eager tpu kernel may return another layout for the same
    value (the fused attention's output is contiguous where the meta kernel
    gives it the query's transposed layout), and `view` of the transposed
    result then fails ("view size is not compatible with input tensor's size
    and stride"). The graph is functional (its only mutations are copies into
    inputs), so a reshape that copies gives the same values.
    """
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.view.default:
            n.target = aten.reshape.default
            changed = True
    if changed:
        gm.recompile()


_VIEW_OPS = {
    aten.t.default, aten.permute.default, aten.transpose.int, aten.view.default,
    aten._unsafe_view.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.alias.default,
    aten.slice.Tensor, aten.select.int, aten.detach.default,
}


def _donation_enabled() -> bool:
    return os.environ.get("TORCH_TPU_DONATE", "1") not in ("0", "false", "False")


def _prebuild_enabled() -> bool:
    """Compile backward programs ahead (see CompiledGraph._prebuild_backward)?

    Opt-in, ``TORCH_TPU_PREBUILD_BACKWARD=1``; by default the backward
    compiles at its first call, as AOTAutograd's lazy backward does. Why not
    by default: XLA:CPU compiles on its own threads, so on 2 cores the two
    compiles only share the same cores (the compile benchmark's MLP, 2 CPUs
    at load 2-3: first call 0.78-0.86 s with it, 0.75-0.95 s without); a
    backward that is never called (a forward with grad-requiring parameters
    outside no_grad) would still be compiled; and the backward's compile may
    finish first, so `torch_tpu.debug.last_graphs()` and the compile log can
    list it before the forward. It is meant for hosts with cores to spare.
    """
    raw = os.environ.get("TORCH_TPU_PREBUILD_BACKWARD", "").strip().lower()
    return raw in ("1", "true", "yes", "on")


def _prebuilt_entry(future):
    """The entry a background build made, or None (none, or it failed: the
    caller builds again, and a lowering error then raises where it always did)."""
    if future is None:
        return None
    try:
        return future.result()
    except Exception:
        return None


def _contiguous(size, stride) -> bool:
    expected = 1
    for n, s in zip(reversed(size), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _plain_fake(t: torch.Tensor) -> bool:
    """Is fake tensor `t` laid out as a new tensor of its shape is?"""
    try:
        return (int(t.storage_offset()) == 0
                and _contiguous([int(d) for d in t.shape], [int(d) for d in t.stride()]))
    except (TypeError, ValueError):  # symbolic sizes
        return False


class _LoadedProgram:
    """A graph executable loaded by the graph tier: called like a jax Compiled
    (donated, kept, consts, rng) -> (outputs, mutated input values), through
    the PJRT executable itself (nothing was traced in this process)."""

    __slots__ = ("exe", "device", "n_out", "n_total", "relower")

    def __init__(self, exe, device, n_out, n_total, relower=None):
        self.exe = exe
        self.device = device
        self.n_out = n_out
        self.n_total = n_total
        # () -> jax.stages.Lowered of the same program, traced on demand
        # (torch_tpu.debug's 'stablehlo' and 'hlo' stages); None: unavailable.
        self.relower = relower

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
    kwargs = {"keep_unused": True}
    if donating:
        kwargs["donate_argnums"] = (0,)
    return lambda: jax.jit(fn, **kwargs).lower(*abstract)


class _Entry:
    """The executable(s) of one graph specialization.

    `donating` takes the buffers of the inputs the graph overwrites; it is
    used when nothing else can see those buffers (checked per call), else
    `plain` (compiled on first need).
    """

    __slots__ = ("fn", "lower_args", "name", "key", "values", "donate_idx", "keep_idx",
                 "plain", "donating", "layouts", "opt_level")

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

    def run(self, graph, args, arrays, consts, rng):
        donated = [arrays[i] for i in self.donate_idx]
        kept = [arrays[i] for i in self.keep_idx]
        if self.donating is not None and _can_donate(graph, self.donate_idx, args, donated):
            GRAPH_STATS.donating_calls += 1
            return self.donating(donated, kept, consts, rng)
        if self.plain is None:
            self.plain = programs.hooked_compile()(self.name, self.key, self.fn,
                                                   self.lower_args, opt_level=self.opt_level)
        return self.plain(donated, kept, consts, rng)


_OWN_REFS = 6


def _whole_reshape(layout, array) -> bool:
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
    return _contiguous(sizes, strides)


def _can_donate(graph, donate_idx, args, donated) -> bool:
    """Are the donated arrays only held by their own (plain) input tensors?"""
    seen = set()
    for i, arr in zip(donate_idx, donated):
        t = args[graph.tensor_pos[i]]
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


def _precision_token():
    """The matmul precision setting: part of every graph executable's key."""
    try:
        from ..precision import cache_token
    except ImportError:  # pragma: no cover - no precision module
        return None
    return cache_token()


# --------------------------------------------------------------------------
# the dynamo backend


_DECOMP_TABLE = {"key": None, "table": None}


def _core_table():
    """PyTorch's core-ATen decompositions.

    By default the post-autograd table alone: the full table
    (`core_aten_decompositions`, what export uses) adds an entry for every
    CompositeImplicitAutograd op, which tracing decomposes by itself anyway,
    and collecting those ops costs ~0.5 s per process.
    ``TORCH_TPU_DECOMP_TABLE=full`` uses the full table.
    """
    if os.environ.get("TORCH_TPU_DECOMP_TABLE", "core") == "full":
        from torch._decomp import core_aten_decompositions

        return dict(core_aten_decompositions())
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
    except ImportError:  # pragma: no cover - another torch
        from torch._decomp import core_aten_decompositions

        return dict(core_aten_decompositions())
    return dict(_core_aten_decompositions_post_autograd())


def _decompositions():
    """Core-ATen decompositions, minus ops the lowering table runs directly.

    Built once per process (building PyTorch's table takes ~0.2 s) and
    rebuilt only if the lowering table grew since.
    """
    key = len(registry.LOWERINGS)
    if _DECOMP_TABLE["key"] != key:
        table = _core_table()
        for op in list(table):
            if op in registry.LOWERINGS:
                del table[op]
        _DECOMP_TABLE["table"], _DECOMP_TABLE["key"] = table, key
    return dict(_DECOMP_TABLE["table"])


def _partition_fn(options):
    """How AOTAutograd splits a training graph into forward and backward.

    Default: save what the backward needs (`default_partition`). The min-cut
    partitioner (``options={"partitioner": "min_cut"}``) recomputes cheap ops
    in the backward to save memory, but its first use imports inductor's
    lowering tables (about a second).
    """
    from torch._functorch import partitioners

    choice = options.get("partitioner") or os.environ.get("TORCH_TPU_PARTITIONER", "default")
    if choice in ("min_cut", "min-cut", "mincut"):
        return partitioners.min_cut_rematerialization_partition
    if choice != "default":
        raise ValueError(f"unknown partitioner {choice!r} (use 'default' or 'min_cut')")
    return partitioners.default_partition


def _compiler(kind, options, packaged=False, made=None):
    def compile_graph(gm, example_inputs):
        graph = CompiledGraph(gm, example_inputs, kind, options)
        if made is not None:
            made.append(graph)
        return graph

    if packaged:
        # TORCH_TPU_PRECOMPILE: graphs AOTAutograd can bundle into packages.
        return _artifacts.serializable_compiler(compile_graph)
    return compile_graph


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
    """`torch.compile(model, backend="tpu")`: see the module docstring.

    options (``torch.compile(..., options={...})``):
      - ``"dynamic"``: the policy for symbolic shapes, ``"bucket"`` (default)
        or ``"exact"``; see torch_tpu.compile.dynamic.
      - ``"buckets"``: the bucket sizes (a sorted list of ints) for "bucket".
      - ``"max_specializations"``: cap on executables per symbolic graph.
      - ``"partitioner"``: ``"default"`` or ``"min_cut"`` (see _partition_fn).
      - ``"opt_level"``: XLA optimization level 0-3 of these graphs' programs
        (default: ``TORCH_TPU_XLA_OPT_LEVEL``, else 3; see
        torch_tpu.runtime.opt_level).
    """
    from torch._dynamo.backends.common import aot_autograd

    t0 = time.perf_counter()
    gc_pause.install_dynamo_hooks()
    options = dict(options or {})
    if options.get("opt_level") is not None:
        options["opt_level"] = _olevel.check(
            options["opt_level"], 'torch.compile(backend="tpu"): options["opt_level"]')
    # TORCH_TPU_PRECOMPILE: only graphs of frames dynamo is packaging.
    packaged = _artifacts is not None and _artifacts.packaged(gm)
    # Static training graphs: AOTAutograd hands over the backward graph at
    # once (not at the first backward call), so that its program compiles
    # in the background from the forward's first call (_prebuild_backward).
    prebuild = not packaged and _prebuild_enabled()
    made = [] if prebuild else None
    aot = aot_autograd(
        fw_compiler=_compiler("forward", options, packaged, made),
        bw_compiler=_compiler("backward", options, packaged, made),
        inference_compiler=_compiler("inference", options, packaged),
        decompositions=_decompositions(),
        partition_fn=_partition_fn(options),
        keep_inference_input_mutations=True,
    )
    try:
        if packaged:
            with _artifacts.aot_context():
                return aot(gm, example_inputs)
        if not prebuild:
            return aot(gm, example_inputs)
        from torch._functorch import config as functorch_config

        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            compiled = aot(gm, example_inputs)
        kinds = [g.kind for g in made]
        if kinds == ["forward", "backward"] and not made[0].symbolic:
            made[0].backward_graph = made[1]
        return compiled
    finally:
        with _lock:
            GRAPH_STATS.backend_seconds += time.perf_counter() - t0


_registered = False


def register() -> None:
    """Register "tpu" with dynamo and make it the backend for tpu inputs."""
    global _registered
    if _registered:
        return
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "tpu" not in _COMPILER_FNS:
        register_backend(name="tpu")(tpu_backend)
    # Dynamo must never trace torch_tpu's own Python (the device kernels run
    # eagerly between graphs, e.g. `.item()` at a graph break), nor the JAX
    # those kernels call: a frame dynamo skips still has its callees traced,
    # and tracing jax.device_put under an eager op at a graph break (ctc_loss,
    # whose output shape depends on data) broke the call.
    from torch._dynamo import trace_rules

    for module in ("torch_tpu", "jax", "jaxlib"):
        trace_rules.add(module)
    _redirect_inductor()
    _skip_cudagraph_import()
    _lighter_dynamo_bookkeeping()
    gc_pause.install_dynamo_hooks()
    if _artifacts is not None:
        _artifacts.install()  # TORCH_TPU_PRECOMPILE=1: dynamo packages in the cache dir
    _registered = True


def _lighter_dynamo_bookkeeping():
    """Two pieces of dynamo bookkeeping that cost more than tracing itself
    on the first call, and only feed logs and metrics:

    - after building a frame's guards, dynamo times one guard evaluation for
      its metrics (``guard_latency_us``) after flushing the CPU caches
      (`profile_guard_manager`); here it reports 0 instead;
    - for every traced call it computes the enclosing function's name for a
      debug log line (`get_funcname`), tokenizing whole source files
      (torch/nn/functional.py, ...) the first time; here the name comes from
      files already tokenized, or is left out unless dynamo's verbose
      logging is on.

    Nothing else changes: guards, graphs and error messages are the same.
    ``TORCH_TPU_DYNAMO_BOOKKEEPING=1`` keeps PyTorch's behaviour.
    """
    if os.environ.get("TORCH_TPU_DYNAMO_BOOKKEEPING", "0") in ("1", "true", "True"):
        return
    try:
        from torch._dynamo import funcname_cache
        from torch._dynamo import guards as dyn_guards
        from torch._dynamo import symbolic_convert
    except Exception:  # pragma: no cover - another torch layout
        return
    original_profile = getattr(dyn_guards, "profile_guard_manager", None)
    if original_profile is not None and not getattr(original_profile, "_torch_tpu", False):

        def profile_guard_manager(*args, **kwargs):
            return 0.0

        profile_guard_manager._torch_tpu = True
        dyn_guards.profile_guard_manager = profile_guard_manager
    original_funcname = getattr(symbolic_convert, "get_funcname", None)
    if original_funcname is not None and not getattr(original_funcname, "_torch_tpu", False):

        def get_funcname(filename, lineno):
            names = funcname_cache.cache.get(filename)
            if names is not None:
                return names.get(lineno)
            if _dynamo_verbose():
                return original_funcname(filename, lineno)
            return None

        get_funcname._torch_tpu = True
        symbolic_convert.get_funcname = get_funcname


def _dynamo_verbose() -> bool:
    try:
        import logging

        from torch._dynamo import config

        if config.verbose:
            return True
        return logging.getLogger("torch._dynamo").isEnabledFor(logging.DEBUG)
    except Exception:  # pragma: no cover
        return True


def _skip_cudagraph_import():
    """Dynamo's optimizer tracing asks every grad "is it static for CUDA graphs?"
    by importing inductor's cudagraph_trees (0.5-1.3 s of imports) even for
    non-CUDA tensors, for which the answer is always True. Answer that case
    without the import; CUDA tensors still go to PyTorch's function.
    """
    try:
        from torch._dynamo.variables import optimizer as opt_vars
    except Exception:  # pragma: no cover - another torch layout
        return
    original = getattr(opt_vars, "_is_static_for_cudagraphs", None)
    if original is None or getattr(original, "_torch_tpu", False):
        return

    @functools.wraps(original)
    def _is_static_for_cudagraphs(x):
        if not x.is_cuda:
            return True
        return original(x)

    _is_static_for_cudagraphs._torch_tpu = True
    opt_vars._is_static_for_cudagraphs = _is_static_for_cudagraphs


def _redirect_inductor():
    """`torch.compile(model)` (inductor) on tpu inputs uses this backend.

    Inductor has no code generator for the tpu device; without this, the
    default backend would fail on tpu tensors. Graphs on other devices still
    go to inductor. TORCH_TPU_INDUCTOR_REDIRECT=0 turns this off.
    """
    if os.environ.get("TORCH_TPU_INDUCTOR_REDIRECT", "1") in ("0", "false", "False"):
        return
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_torch_tpu", False):
        return
    original = wrapper.__call__

    @functools.wraps(original)
    def __call__(self, model_, inputs_):
        if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs_):
            return tpu_backend(model_, inputs_)
        return original(self, model_, inputs_)

    __call__._torch_tpu = True
    wrapper.__call__ = __call__
