"""A compiled graph: one AOT graph (forward, backward, inference or a whole
training step) run as XLA executables.

`CompiledGraph` lowers its graph to one jax function with the same lowering
table eager mode uses (`lowering.py`) and gets one executable per input
signature from `graph_cache.entry_for` (the program cache in memory, the graph
tier on disk, else a compile through the program cache's compile step), under
the keys of `graph_key`. At run time a call reads the jax values of its tpu
inputs (parameters and buffers stay on the device between calls: nothing is
copied in or out), runs the executable (asynchronously: nothing waits for
the result), wraps its outputs as tpu tensors and writes input mutations back
into the input tensors. A graph that cannot be lowered (a higher-order op, a
data-dependent shape) runs op by op on the eager device, with one warning.

Symbolic graphs go through the dynamic-shape policy (`dynamic.py`); the
dynamo glue that makes these graphs is `backend.py`.
"""

from __future__ import annotations

import collections
import hashlib
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch
import torch.fx

from .._compat import dynamo_api
from ..device import module as _device_module
from ..ops import core
from ..runtime import rng as tpu_random
from ..runtime import async_compile, executor
from ..runtime import storage as st
from ..runtime.switches import switch_set
from . import dynamic as dyn
from . import effects, graph_cache, graph_key, padding
from .graph_cache import GRAPH_STATS
from .lowering import GraphProgram, LoweringError, SymEnv, const_value
from .outputs import wrap_outputs
from ..runtime.context import CONTEXT

aten = torch.ops.aten


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
    return _device_module.current_device()


class CompiledGraph:
    """One AOT graph (forward, backward or inference) as XLA executables."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                 options: dict | None = None, n_user_outputs: int | None = None):
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
        graph_key.note_dynamo_reason(self.fingerprint)  # for the debug tools' recompile reasons
        # specialization key -> entry
        self.executables: collections.OrderedDict[Any, graph_cache.Entry] = \
            collections.OrderedDict()
        self.policy = dyn.Policy.from_options(self.options) if self.symbolic else None
        self.pad_ok = None       # False once padding to buckets proved unsafe
        self.pad_plan = None
        # symbol -> values seen (only changing ones are padded)
        self.seen_sizes: dict[Any, set[int]] = {}
        self.warned_cap = False
        # Outputs [0, n_user_outputs) are what the user (or AOTAutograd's
        # wrapper) sees; the rest of a forward graph's outputs are saved for
        # the backward graph.
        self.n_user_outputs = len(self.out_specs)
        if kind == "forward":
            try:
                ctx = dynamo_api.TracingContext.try_get()
                md = ctx.fw_metadata if ctx is not None else None
                if md is not None:
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
        self.consts: list[Any] | None = None
        # A forward graph's backward graph (linked by tpu_backend), whose
        # program is compiled in the background from the forward's first call
        # on (`_prebuild_backward`); the futures wait in the backward's
        # `prebuilt`, by specialization token.
        self.backward_graph: CompiledGraph | None = None
        self.prebuilt: dict[Any, Any] = {}  # specialization token -> future of an Entry
        graph_cache.record(graphs=1)

    def _analyze_outputs(self):
        """Which outputs come from the program, the inputs, or are not tensors."""
        outs = self.program.output_node.args[0]
        if not isinstance(outs, (list, tuple)):
            outs = (outs,)
        index = {n: i for i, n in enumerate(self.program.placeholders)}
        self.output_nodes = list(outs)
        # Per output: (kind, its fields...), kind "none", "input", "array",
        # "value", "const" or "input_view".
        self.out_specs: list[tuple[Any, ...]] = []
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
                    if layouts[i] is not None and graph_cache.whole_reshape(layouts[i], arrays[i])}
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
            unique: list[Any] = []
            index: list[int] = []
            seen: dict[int, int] = {}  # id of a value -> its position in unique
            for v in arr_outs:
                k = seen.get(id(v))
                if k is None:
                    k = seen[id(v)] = len(unique)
                    unique.append(v)
                index.append(k)
            value_results["__out_index__"] = index
            return unique, muts

        value_results: dict[Any, Any] = {}  # output position (or "__out_index__") -> value

        rng = np.zeros((4,), np.uint32) if uses_rng else None
        lower_args = ([arrays[i] for i in donate_idx], [arrays[i] for i in keep_idx],
                      list(consts), rng)
        level = self.level()
        entry = graph_cache.Entry(fn, lower_args, self.name,
                                  graph_key.program_key(self, key, donate_idx, consts, level),
                                  value_results, donate_idx, keep_idx)
        entry.layouts = layouts
        entry.opt_level = level
        return graph_cache.entry_for(self, entry, consts)

    # -- running -----------------------------------------------------------

    def __call__(self, *call_args: Any) -> Any:
        # Boxed (one list, which we may clear) or unboxed (the values) calls:
        # AOTAutograd uses both; a graph input is never a list.
        if len(call_args) == 1 and type(call_args[0]) is list:
            args = call_args[0]
        else:
            args = list(call_args)
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
            self.consts = [const_value(v, self.device) for _, v in self.program.constants]
        ints = [int(args[p]) for p in self.int_pos]
        if self.symbolic:
            # The policy reads the inputs itself (padded inputs are not re-read).
            assert self.policy is not None  # made for every symbolic graph
            return self.policy.run(self, args, None, ints)
        arrays, layouts = self.read_storages(args)
        return self._run_static(args, arrays, ints, layouts)

    def read_storages(self, args):
        """Storage arrays of the tensor inputs and their view layouts (None: plain)."""
        arrays: list[Any] = []
        layouts: list[Any] = []
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
        token = graph_key.call_token(self, arrays, layouts)
        entry = self.executables.get(token)
        if entry is None:
            if self.backward_graph is not None:
                self._prebuild_backward(arrays, layouts)
            if self.prebuilt:
                entry = _prebuilt_entry(self.prebuilt.pop(token, None))
                if entry is not None:
                    graph_cache.record(prebuilt=1)
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
        `prebuild_enabled`.
        """
        bw, self.backward_graph = self.backward_graph, None
        if (bw is None or bw.eager or bw.symbolic or bw.int_pos or bw.executables
                or padding.SPECS or not prebuild_enabled()):
            return
        try:
            predicted = bw._inputs_from_forward(self, arrays, layouts)
        except Exception:  # nothing we can predict: the backward builds on its first call
            predicted = None
        if predicted is None:
            return
        b_arrays, b_layouts = predicted[0], tuple(predicted[1])
        if bw.consts is None:
            bw.consts = [const_value(v, bw.device) for _, v in bw.program.constants]
        precision = graph_key.precision_token()
        token = graph_key.call_token(bw, b_arrays, b_layouts)
        key = bw.signature(b_arrays, []) + (b_layouts,)
        # JAX's options are dynamic attributes of jax.config (not in its stubs).
        matmul = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]

        def build():
            if graph_key.precision_token() != precision:  # a thread-local precision context
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
        saved: dict[str, int] = {}  # node name -> its position among fw's outputs
        for i, n in enumerate(fw.output_nodes):
            if i >= fw.n_user_outputs and isinstance(n, torch.fx.Node):
                saved.setdefault(n.name, i)
        fw_index = {p: k for k, p in enumerate(fw.tensor_pos)}
        arrays: list[Any] = []
        layouts: list[Any] = []
        for p in self.tensor_pos:
            node = self.program.placeholders[p]
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.dtype is torch.complex32:
                return None
            pos = saved.get(node.name)
            if pos is None:
                # A tangent: a new, plain tensor (AOTAutograd makes it so).
                if not node.name.startswith("tangents") or not _plain_fake(val):
                    return None
                arrays.append(jax.ShapeDtypeStruct(tuple(int(d) for d in val.shape),
                                                   st.jax_dtype(val.dtype), sharding=sharding))
                layouts.append(None)
                continue
            spec = fw.out_specs[pos]
            if spec[0] == "array":
                out = fw.output_nodes[pos].meta.get("val")
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
                        and st.is_contiguous(size, stride)):
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
            reg = dyn.registered_spec(args[p])
            if reg is not None:
                arrays[i] = padding.unpad(arrays[i], reg[0], reg[2])

    def signature(self, arrays, ints):
        """The specialization key of these input values (graph_key.specialization)."""
        return graph_key.specialization(self, arrays, ints)

    def level(self) -> int:
        """The XLA optimization level this graph compiles at now."""
        return CONTEXT.opt_level if self.opt_level is None else self.opt_level

    def _execute(self, entry, args, arrays, out_slices=None):
        value_results = entry.values
        rng = None
        if self.program.uses_rng:
            rng = tpu_random.next_key(self.device)
        outs, muts = entry.run(self, args, arrays, self.consts, rng)
        GRAPH_STATS.runs += 1
        out_index = value_results.get("__out_index__")
        if out_index is not None and len(out_index) != len(outs):
            outs = [outs[j] for j in out_index]
        device = self.device

        strides = self._user_out_strides()

        def array(i, spec):
            arr = outs[spec[1]]
            if out_slices is not None and out_slices[i] is not None:
                arr = out_slices[i](arr)
            t = st.wrap(arr, device, spec[2])
            return t if strides[i] is None else core.restrided(t, strides[i])

        return wrap_outputs(self, args, muts, array, value_results.__getitem__)

    def _user_out_strides(self) -> list:
        """Per output, the strides its fake value has where the user gets it
        (a user output, not one saved for the backward) and they are a dense
        permutation other than row-major (channels_last in, channels_last
        out, as PyTorch's own compiled graphs return it); else None."""
        cached = getattr(self, "_out_strides", None)
        if cached is not None:
            return cached
        strides: list = [None] * len(self.output_nodes)
        for i, o in enumerate(self.output_nodes[:self.n_user_outputs]):
            val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
            if (self.out_specs[i][0] != "array" or not isinstance(val, torch.Tensor)
                    or val.numel() <= 1 or val.is_contiguous()):
                continue
            try:
                shape, stride = tuple(int(d) for d in val.shape), tuple(int(d) for d in val.stride())
            except (TypeError, ValueError):  # symbolic
                continue
            order = executor.dense_order(shape, stride)
            if order is not None and order != tuple(range(len(shape))):
                strides[i] = stride
        self._out_strides = strides
        return strides

    # -- eager fallback ------------------------------------------------------

    def _to_eager(self, err):
        self.eager = True
        graph_cache.record(eager_fallbacks=1)
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




def prebuild_enabled() -> bool:
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
    return switch_set("TORCH_TPU_PREBUILD_BACKWARD")


def _prebuilt_entry(future):
    """The entry a background build made, or None (none, or it failed: the
    caller builds again, and a lowering error then raises where it always did)."""
    if future is None:
        return None
    try:
        return future.result()
    except Exception:
        return None


def _plain_fake(t: torch.Tensor) -> bool:
    """Is fake tensor `t` laid out as a new tensor of its shape is?"""
    try:
        return (int(t.storage_offset()) == 0
                and st.is_contiguous([int(d) for d in t.shape], [int(d) for d in t.stride()]))
    except (TypeError, ValueError):  # symbolic sizes
        return False


