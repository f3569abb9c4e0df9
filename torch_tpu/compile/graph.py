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
from .graph_spec import GraphSpec, InputSpec
from .lowering import GraphProgram, LoweringError, SymEnv, const_value
from .outputs import wrap_outputs

aten = torch.ops.aten


def _device_of(example_inputs):
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return x.device.index if x.device.index is not None else 0
    return _device_module.current_device()


class CompiledGraph:
    """One AOT graph (forward, backward or inference) as XLA executables.

    What the graph is (its inputs, outputs, fingerprint: `self.spec`, a
    `GraphSpec`) is fixed at construction; what it has built (executables,
    constants, the eager fallback) is this object's state.
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                 options: dict | None = None, n_user_outputs: int | None = None):
        # Boxed calling convention (one list of inputs, cleared after use). An
        # instance attribute, so that wrappers made with functools.wraps keep it.
        self._boxed_call = True
        self.gm = gm
        self.options = options or {}
        name = f"graph_{kind}"
        # Effectful ops (linalg's error checks) leave the graph and run after it.
        self.hoisted, tokens, self.n_graph_outputs = effects.hoist(gm)
        program = GraphProgram(gm, name)
        inputs = _input_specs(program, example_inputs, tokens)
        tensor_pos = tuple(i for i, s in enumerate(inputs) if s.kind == "t")
        int_pos = tuple(i for i, s in enumerate(inputs) if s.kind == "s")
        symbolic = bool(int_pos) or any(
            isinstance(d, torch.SymInt)
            for n in program.placeholders
            for d in (n.meta["val"].shape if isinstance(n.meta.get("val"), torch.Tensor)
                      else ()))
        output_nodes, out_specs = _analyze_outputs(program)
        code = gm.code
        fingerprint = hashlib.sha256(code.encode()).hexdigest()
        graph_key.note_dynamo_reason(fingerprint)  # for the debug tools' recompile reasons
        n_users = _n_user_outputs(kind, len(out_specs), n_user_outputs)
        if kind == "forward" and not symbolic:
            out_specs = _saved_views_of_inputs(program, output_nodes, out_specs, n_users)
        mutated = set(program.mutated_inputs)
        self.spec = GraphSpec(
            name=name, kind=kind, fingerprint=fingerprint, code=code,
            device=_device_of(example_inputs), program=program, inputs=inputs,
            tensor_pos=tensor_pos, int_pos=int_pos, symbolic=symbolic,
            output_nodes=tuple(output_nodes), out_specs=tuple(out_specs),
            n_user_outputs=n_users,
            donate_idx=tuple(i for i, p in enumerate(tensor_pos) if p in mutated),
            # The XLA optimization level of this graph's programs (the
            # "opt_level" option); None: the process-wide level when compiled.
            opt_level=self.options.get("opt_level"))
        # A static graph's specializations: call token -> entry (a symbolic
        # graph's are its policy's).
        self.executables: collections.OrderedDict[Any, graph_cache.Entry] = \
            collections.OrderedDict()
        self.policy = dyn.Policy.from_options(self.options) if symbolic else None
        self.eager = False
        self.consts: list[Any] | None = None
        # A forward graph's backward graph (linked by tpu_backend), whose
        # program is compiled in the background from the forward's first call
        # on (`_prebuild_backward`); the futures wait in the backward's
        # `prebuilt`, by specialization token.
        self.backward_graph: CompiledGraph | None = None
        self.prebuilt: dict[Any, Any] = {}  # specialization token -> future of an Entry
        graph_cache.record(graphs=1)

    # What the compile front (backend.py, step.py, persist/) reads of a graph.
    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def symbolic(self) -> bool:
        return self.spec.symbolic

    @property
    def n_user_outputs(self) -> int:
        return self.spec.n_user_outputs

    # -- compiling ---------------------------------------------------------

    def build(self, arrays: Sequence[Any], ints: Sequence[int], consts: Sequence[Any],
              key: tuple, layouts: Sequence[Any] | None = None) -> graph_cache.Entry:
        """The entry (executables) of one specialization: these input values
        under specialization `key`, from the program cache, the graph tier or a
        compile (graph_cache.entry_for).

        `layouts[i]` (static graphs): tensor input i arrives as its storage's
        array and is read through that view layout inside the program, so a
        view input (`t(weight)` saved for the backward) costs no separate copy.
        """
        gspec = self.spec
        program = gspec.program
        specs = gspec.inputs
        tensor_pos = gspec.tensor_pos
        int_pos = gspec.int_pos
        out_specs = gspec.out_specs
        uses_rng = program.uses_rng
        placeholders = program.placeholders
        value_outs = [i for i, spec in enumerate(out_specs) if spec[0] == "value"]

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
        layouts = tuple(layouts if layouts is not None else [None] * len(tensor_pos))
        # An input that is its whole storage in another shape (a flat storage
        # read as a matrix): a reshape in the program; its new value goes back
        # in the storage's shape, so it can be donated like a plain input.
        reshaped = {i: tuple(arrays[i].shape) for i in gspec.donate_idx
                    if layouts[i] is not None and graph_cache.whole_reshape(layouts[i], arrays[i])}
        donate_idx = [i for i in gspec.donate_idx if layouts[i] is None or i in reshaped]
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
            inputs: list[Any] = [None] * len(specs)
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
            arr_outs = [v for spec, v in zip(out_specs, outs) if spec[0] == "array"]
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
        level = gspec.level()
        entry = graph_cache.Entry(fn, lower_args, gspec.name,
                                  graph_key.program_key(gspec, key, donate_idx, consts, level),
                                  value_results, donate_idx, keep_idx)
        entry.layouts = layouts
        entry.opt_level = level
        return graph_cache.entry_for(gspec, entry, consts)

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
        spec = self.spec
        if self.consts is None:
            self.consts = [const_value(v, spec.device) for _, v in spec.program.constants]
        consts = self.consts
        ints = [int(args[p]) for p in spec.int_pos]
        if spec.symbolic:
            # The policy reads the inputs itself (padded inputs are not re-read).
            assert self.policy is not None  # made for every symbolic graph
            return self.policy.run(spec, args, ints, consts, self.build, self.execute)
        arrays, layouts = self.read_storages(args)
        return self._run_static(args, arrays, ints, layouts, consts)

    def read_storages(self, args):
        """Storage arrays of the tensor inputs and their view layouts (None: plain)."""
        arrays: list[Any] = []
        layouts: list[Any] = []
        for p in self.spec.tensor_pos:
            t = args[p]
            data = getattr(t.untyped_storage(), "_tpu", None) if t.device.type == "tpu" else None
            if data is None:
                arrays.append(executor.value(t) if t.device.type == "tpu"
                              else st.from_host(t, self.spec.device))
                layouts.append(None)
                continue
            arrays.append(data.array)
            layouts.append(st.layout_of(t, data))
        if padding.SPECS:
            dyn.unpad_inputs(self.spec, args, arrays)
        return arrays, tuple(layouts)

    def _run_static(self, args, arrays, ints, layouts, consts):
        # Dynamo's guards fix the shapes of a static graph; what can still
        # change the program is the matmul precision and the inputs' layouts.
        token = graph_key.call_token(self.spec, arrays, layouts)
        entry = self.executables.get(token)
        if entry is None:
            if self.backward_graph is not None:
                self._prebuild_backward(arrays, layouts)
            if self.prebuilt:
                entry = _prebuilt_entry(self.prebuilt.pop(token, None))
                if entry is not None:
                    graph_cache.record(prebuilt=1)
            if entry is None:
                entry = self.build(arrays, ints, consts,
                                   graph_key.specialization(self.spec, arrays, ints) + (layouts,),
                                   layouts)
            self.executables[token] = entry
        return self.execute(entry, args, arrays)

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
        if (bw is None or bw.eager or bw.symbolic or bw.spec.int_pos or bw.executables
                or padding.SPECS or not prebuild_enabled()):
            return
        try:
            predicted = _backward_inputs(bw.spec, self.spec, arrays, layouts)
        except Exception:  # nothing we can predict: the backward builds on its first call
            predicted = None
        if predicted is None:
            return
        b_arrays, b_layouts = predicted[0], tuple(predicted[1])
        if bw.consts is None:
            bw.consts = [const_value(v, bw.spec.device) for _, v in bw.spec.program.constants]
        consts = bw.consts
        precision = graph_key.precision_token()
        token = graph_key.call_token(bw.spec, b_arrays, b_layouts)
        key = graph_key.specialization(bw.spec, b_arrays, []) + (b_layouts,)
        # JAX's options are dynamic attributes of jax.config (not in its stubs).
        matmul = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]

        def build():
            if graph_key.precision_token() != precision:  # a thread-local precision context
                with jax.default_matmul_precision(matmul):
                    return bw.build(b_arrays, [], consts, key, b_layouts)
            return bw.build(b_arrays, [], consts, key, b_layouts)

        # The compile pool eager ops compile on (runtime.async_compile); not
        # counted as outstanding work, which would defer eager ops.
        bw.prebuilt[token] = async_compile.compile_pool().submit(build)

    def execute(self, entry: graph_cache.Entry, args: list, arrays: Sequence[Any],
                out_slices: Sequence[Any] | None = None) -> list:
        """Run `entry` (one specialization's executables, from `build`) on
        `args` (their tensor inputs' values `arrays`): the graph's results."""
        value_results = entry.values
        rng = None
        if self.spec.program.uses_rng:
            rng = tpu_random.next_key(self.spec.device)
        assert self.consts is not None  # made by _run, before any program runs
        outs, muts = entry.run(self.spec, args, arrays, self.consts, rng)
        GRAPH_STATS.runs += 1
        out_index = value_results.get("__out_index__")
        if out_index is not None and len(out_index) != len(outs):
            outs = [outs[j] for j in out_index]
        device = self.spec.device

        strides = self._user_out_strides()

        def array(i, spec):
            arr = outs[spec[1]]
            if out_slices is not None and out_slices[i] is not None:
                arr = out_slices[i](arr)
            t = st.wrap(arr, device, spec[2])
            return t if strides[i] is None else core.restrided(t, strides[i])

        return wrap_outputs(self.spec, args, muts, array, value_results.__getitem__)

    def _user_out_strides(self) -> list:
        """Per output, the strides its fake value has where the user gets it
        (a user output, not one saved for the backward) and they are a dense
        permutation other than row-major (channels_last in, channels_last
        out, as PyTorch's own compiled graphs return it); else None."""
        cached = getattr(self, "_out_strides", None)
        if cached is not None:
            return cached
        spec = self.spec
        strides: list = [None] * len(spec.output_nodes)
        for i, o in enumerate(spec.output_nodes[:spec.n_user_outputs]):
            val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
            if (spec.out_specs[i][0] != "array" or not isinstance(val, torch.Tensor)
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


def _input_specs(program: GraphProgram, example_inputs: Sequence[Any],
                 tokens: Any) -> tuple[InputSpec, ...]:
    """How each placeholder is passed, from its fake value (else its example)."""
    specs = []
    for n, ex in zip(program.placeholders, example_inputs):
        val = n.meta.get("val", ex)
        if n in tokens:  # an effect token: None at run time
            specs.append(InputSpec("x", static=None))
        elif isinstance(val, torch.Tensor):
            specs.append(InputSpec("t", val.dtype))
        elif isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            specs.append(InputSpec("s"))
        else:
            specs.append(InputSpec("x", static=val))
    return tuple(specs)


def _analyze_outputs(program: GraphProgram) -> tuple[list, list[tuple[Any, ...]]]:
    """(output nodes, out specs): which outputs come from the program, the
    inputs, or are not tensors. Per output: (kind, its fields...), kind
    "none", "input", "array", "value" or "const" (see compile/outputs.py)."""
    outs = program.output_node.args[0]
    if not isinstance(outs, (list, tuple)):
        outs = (outs,)
    index = {n: i for i, n in enumerate(program.placeholders)}
    out_specs: list[tuple[Any, ...]] = []
    n_prog = 0
    for o in outs:
        if o is None:
            out_specs.append(("none", None))
        elif isinstance(o, torch.fx.Node) and o in index and o.op == "placeholder" \
                and isinstance(o.meta.get("val"), torch.Tensor):
            out_specs.append(("input", index[o]))
        elif isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor):
            out_specs.append(("array", n_prog, o.meta["val"].dtype))
            n_prog += 1
        elif isinstance(o, torch.fx.Node):
            out_specs.append(("value", None))
        else:
            out_specs.append(("const", o))
    return list(outs), out_specs


def _n_user_outputs(kind: str, n_outputs: int, given: int | None) -> int:
    """How many outputs the user (or AOTAutograd's wrapper) sees: all but a
    forward graph's saved-for-backward ones (AOTAutograd's metadata, or
    `given` when rebuilt from a compile package)."""
    n = n_outputs
    if kind != "forward":
        return n
    try:
        ctx = dynamo_api.TracingContext.try_get()
        md = ctx.fw_metadata if ctx is not None else None
        if md is not None:
            n = int(md.num_forward)
    except Exception:
        pass
    return int(given) if given is not None else n


def _saved_views_of_inputs(program: GraphProgram, output_nodes: list,
                           out_specs: list[tuple[Any, ...]],
                           n_user_outputs: int) -> list[tuple[Any, ...]]:
    """`out_specs` with the saved-for-backward outputs that are views of
    inputs (`t(weight)`) returned as views (metadata only) instead of
    materialized copies, and the program's outputs renumbered."""
    out_specs = list(out_specs)
    index = {n: i for i, n in enumerate(program.placeholders)}
    for i, o in enumerate(output_nodes):
        if i < n_user_outputs or out_specs[i][0] != "array":
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
        out_specs[i] = ("input_view", index[base], view, out_specs[i][1])
    # The program no longer computes those: renumber its outputs.
    n = 0
    for i, spec in enumerate(out_specs):
        if spec[0] == "array":
            out_specs[i] = ("array", n, spec[2])
            n += 1
    return out_specs


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


def _backward_inputs(bw: GraphSpec, fw: GraphSpec, fw_arrays: Sequence[Any],
                     fw_layouts: Sequence[Any]) -> tuple[list, list] | None:
    """(arrays, layouts) backward graph `bw` will read at its first call,
    as `read_storages` will give them: arrays are forward `fw`'s own input
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
    for p in bw.tensor_pos:
        node = bw.program.placeholders[p]
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
            if fw_layouts[k] is not None or fw.inputs[spec[1]].dtype is not val.dtype:
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


def _plain_fake(t: torch.Tensor) -> bool:
    """Is fake tensor `t` laid out as a new tensor of its shape is?"""
    try:
        return (int(t.storage_offset()) == 0
                and st.is_contiguous([int(d) for d in t.shape], [int(d) for d in t.stride()]))
    except (TypeError, ValueError):  # symbolic sizes
        return False


