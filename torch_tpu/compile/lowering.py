"""An ATen FX graph as one JAX function, through the eager lowering table.

`GraphProgram(gm)` walks a functional ATen graph (what AOTAutograd hands a
backend) once per trace and builds the jax computation of the whole graph:

- a node whose op has a graph rule (`graph_ops`: ops whose eager kernel
  calls their lowering on other arguments) uses it;
- a node whose op has an entry in `torch_tpu.ops.registry.LOWERINGS` calls
  that lowering (the same function eager mode compiles per op), with the
  node's output metadata as `registry.out_meta()`, and its outputs are cast
  to PyTorch's dtypes exactly as the eager executor does;
- `*_functional` ops (BatchNorm's running-stat update) reuse the lowering of
  the mutating op and return the new values as extra outputs;
- in-place / out= overloads reuse the functional lowering;
- views, copies, factories and a few random ops without a table entry use
  the graph-only rules in `graph_ops`;
- anything else is decomposed with PyTorch's decomposition table (re-traced
  with make_fx into a small ATen graph, interpreted recursively), and as a
  last resort runs on the CPU through `jax.pure_callback` (one warning per op).

Random ops get one raw key per node, derived inside the program from the
single raw key the graph takes as input, so a graph call consumes exactly one
`torch_tpu.runtime.rng.next_key` and is reproducible under a seed.

Input mutations that stay in the graph (`copy_` into a placeholder, what
AOTAutograd emits for inference graphs with keep_inference_input_mutations)
become extra outputs that the runtime writes back into the input tensors.
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx

from .._compat.torch_api import decomposition_table, pytree
from ..ops import registry
from ..runtime import calling
from ..runtime import storage as st
from . import graph_ops
from ..runtime import rng as tpu_random
from ..runtime import executor
from ..ops import fallback

aten = torch.ops.aten

class Meta:
    """Concrete metadata of one tensor value: shape, torch dtype, strides, offset."""

    __slots__ = ("shape", "dtype", "stride", "offset")

    def __init__(self, shape, dtype, stride=None, offset=0):
        self.shape = shape
        self.dtype = dtype
        self.stride = stride
        self.offset = offset

    def __repr__(self):
        return f"Meta({self.shape}, {self.dtype})"


class LoweringError(NotImplementedError):
    """The graph has something this backend cannot put into one program."""


# --------------------------------------------------------------------------
# symbolic shapes


class SymEnv:
    """Concrete values for the shape symbols of one trace."""

    def __init__(self):
        self.values = {}

    def bind(self, sym, value):
        if isinstance(sym, torch.SymInt):
            expr = sym.node.expr
            if getattr(expr, "is_Symbol", False):
                self.values.setdefault(expr, int(value))

    def int(self, x):
        if isinstance(x, torch.SymInt):
            expr = x.node.expr
            if getattr(expr, "is_number", False):
                return int(expr)
            try:
                return int(expr.xreplace(self.values))
            except TypeError:
                hint = x.node.hint
                if hint is None:
                    raise LoweringError(f"cannot evaluate the symbolic size {x}") from None
                return int(hint)
        if isinstance(x, torch.SymBool):
            return bool(x.node.expr.xreplace(self.values))
        if isinstance(x, torch.SymFloat):
            return float(x.node.expr.xreplace(self.values))
        return x

    def meta(self, val):
        """A Meta (or list of them) for a fake tensor (or a structure of them)."""
        if isinstance(val, torch.Tensor):
            return Meta(tuple(self.int(s) for s in val.shape), val.dtype,
                        tuple(self.int(s) for s in val.stride()),
                        self.int(val.storage_offset()))
        if isinstance(val, (list, tuple)):
            return type(val)(self.meta(v) for v in val)
        return val


class SymbolicMeta:
    """What `registry.out_meta()` gives a lowering when sizes are jax.export
    dimension variables (torch_tpu.export): a meta tensor cannot hold them."""

    __slots__ = ("shape", "dtype", "_stride")

    def __init__(self, m):
        self.shape = tuple(m.shape)
        self.dtype = m.dtype
        self._stride = m.stride

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return len(self.shape)

    def size(self, d=None):
        return self.shape if d is None else self.shape[d]

    def stride(self, d=None):
        s = self._stride if self._stride is not None else ()
        return s if d is None else s[d]


def _arg_metas(op, n):
    """Node `n`'s tensor arguments' fake tensors by name (their strides say
    how each is stored: registry.arg_meta), or None."""
    if n is None:
        return None
    try:
        bound = calling.bind(op, n.args, n.kwargs)
    except Exception:  # an argument list the schema does not bind: no layouts
        return None
    vals = {k: v.meta.get("val") for k, v in bound.items() if isinstance(v, torch.fx.Node)}
    return {k: v for k, v in vals.items() if isinstance(v, torch.Tensor)}


def _meta_tensor(m):
    if isinstance(m, Meta):
        if not all(isinstance(d, int) for d in m.shape):
            return SymbolicMeta(m)
        stride = m.stride if m.stride is not None else st.contiguous_strides(m.shape)
        return torch.empty_strided(m.shape, stride, dtype=m.dtype, device="meta")
    if isinstance(m, (list, tuple)):
        return type(m)(_meta_tensor(x) for x in m)
    return m


# --------------------------------------------------------------------------
# node context for graph-only rules


class _NodeCtx:
    __slots__ = ("prog", "node", "out", "named_nodes", "trace")

    def __init__(self, prog, node, out, named_nodes, trace):
        self.prog = prog
        self.node = node
        self.out = out
        self.named_nodes = named_nodes
        self.trace = trace

    def meta(self, name):
        n = self.named_nodes.get(name)
        if isinstance(n, torch.fx.Node):
            return self.trace.syms.meta(n.meta["val"])
        raise LoweringError(f"no metadata for argument {name!r} of {self.node.target}")

    def rng(self):
        return self.trace.next_rng()


class _Trace:
    """State of one trace of the program (jax values, rng counter, symbols)."""

    def __init__(self, rng_raw, syms):
        self.rng_raw = rng_raw
        self.rng_count = 0
        self.syms = syms

    def next_rng(self):
        if self.rng_raw is None:
            raise LoweringError("a random op in a graph compiled without a key")
        i = self.rng_count
        self.rng_count += 1
        return derive_key(self.rng_raw, i)


def derive_key(raw, i):
    """The raw key (uint32[4]) of the i-th random op of a graph from the graph's key."""
    k = jax.random.fold_in(tpu_random.jax_key(raw), i)
    data = jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k
    data = data.reshape(-1).astype(jnp.uint32)[:2]
    return jnp.concatenate([data, jnp.zeros((2,), jnp.uint32)])


# --------------------------------------------------------------------------


def _python_value(v):
    """Non-tensor arguments as the lowerings expect them (int lists as tuples)."""
    if isinstance(v, list) and not any(isinstance(x, jax.Array) or hasattr(x, "aval")
                                       for x in v):
        return tuple(v)
    return v


def _is_array(x):
    return isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval")


def _shape_error(name, got, want):
    return LoweringError(f"the lowering of {name} produced shape {got}, PyTorch expects {want}")


def _conform(x: Any, m: Meta, name: str) -> Any:
    return calling.conform(x, m.shape, m.dtype, name, _shape_error)


def _spread_tensor_results(result, metas):
    """A lowering's arrays placed at the tensor positions of the op's outputs.

    Lowerings return the op's tensor outputs only, as the eager executor
    expects (`_scaled_dot_product_fused_attention_overrideable` returns 4
    arrays for a 9-output schema whose undefined tensors are None and whose
    `max_q`/`max_k` are ints); the other positions keep the graph's value.
    `result` unchanged when the counts do not match.
    """
    if sum(isinstance(m, Meta) for m in metas) != len(result):
        return result
    it = iter(result)
    return tuple(next(it) if isinstance(m, Meta) else m for m in metas)


def _conform_tree(result, metas, name):
    if isinstance(metas, Meta):
        if isinstance(result, (list, tuple)) and len(result) == 1:
            result = result[0]
        return _conform(result, metas, name)
    if isinstance(metas, (list, tuple)):
        if isinstance(result, (list, tuple)) and len(result) != len(metas):
            result = _spread_tensor_results(result, metas)
        if not isinstance(result, (list, tuple)) or len(result) != len(metas):
            raise LoweringError(f"the lowering of {name} returned {type(result).__name__}, "
                                f"expected {len(metas)} outputs")
        return tuple(_conform_tree(r, m, name) if m is not None else r
                     for r, m in zip(result, metas))
    return result


# --------------------------------------------------------------------------


_warned: set = set()
_warn_lock = threading.Lock()


def _warn_once(key, msg):
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(msg, stacklevel=4)


_FUNCTIONAL_SUFFIX = "_functional"


def _mutating_base(op):
    """For `foo_functional`, the overload `foo` that mutates arguments in place."""
    name = op._schema.name.split("::")[1]
    if not name.endswith(_FUNCTIONAL_SUFFIX):
        return None
    packet = getattr(aten, name[: -len(_FUNCTIONAL_SUFFIX)], None)
    if packet is None:
        return None
    return getattr(packet, op._overloadname, None)


class TraceHook(Protocol):
    """What GraphProgram.trace's `hook` provides (padding.PadHook, exporting's
    naming hook): it sees each input mutation and computes each node's value."""

    def mutation(self, n: torch.fx.Node) -> None: ...

    def node(self, n: torch.fx.Node, args: Any, kwargs: Any,
             call: Callable[..., Any]) -> Any: ...


class GraphProgram:
    """A functional ATen graph, lowered to one jax function."""

    def __init__(self, gm: torch.fx.GraphModule, name: str = "graph"):
        self.gm = gm
        self.name = name
        self.graph = gm.graph
        self.nodes = list(self.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.output_node = next(n for n in reversed(self.nodes) if n.op == "output")
        self.constants = []  # (node, value) for get_attr tensors
        for n in self.nodes:
            if n.op == "get_attr":
                self.constants.append((n, _fetch_attr(gm, n.target)))
        # copy_ into placeholders: input mutations kept in the graph.
        index = {n: i for i, n in enumerate(self.placeholders)}
        self.mutated_inputs: list[int] = []   # placeholder positions written by the graph
        self._mutation_nodes: dict[torch.fx.Node, int] = {}  # copy_ node -> placeholder position
        for n in self.nodes:
            if (n.op == "call_function" and n.target in (aten.copy_.default,)
                    and isinstance(n.args[0], torch.fx.Node) and n.args[0] in index):
                pos = index[n.args[0]]
                self._mutation_nodes[n] = pos
                if pos not in self.mutated_inputs:
                    self.mutated_inputs.append(pos)
        self.uses_rng = any(self._may_use_rng(n) for n in self.nodes)

    # -- analysis ------------------------------------------------------------

    def _may_use_rng(self, n):
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            return False
        low = registry.LOWERINGS.get(n.target)
        if low is not None:
            return low.random
        return torch.Tag.nondeterministic_seeded in n.target.tags

    # -- tracing -------------------------------------------------------------

    def trace(self, inputs: Sequence[Any], consts: Sequence[Any], rng_raw: Any, syms: SymEnv,
              hook: TraceHook | None = None) -> tuple[list[Any], list[Any]]:
        """Outputs and mutated-input values for placeholder values `inputs`.

        `hook` (see padding.py) may watch and rewrite every call: it gets
        `hook.node(n, args, kwargs, call)` and returns the node's value.
        """
        tr = _Trace(rng_raw, syms)
        env = {}
        for n, v in zip(self.placeholders, inputs):
            env[n] = v
        for (n, _), v in zip(self.constants, consts):
            env[n] = v
        mutations = {}
        for n in self.nodes:
            if n.op in ("placeholder", "get_attr"):
                continue
            if n.op == "output":
                outs = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
                break
            if n.op != "call_function":
                raise LoweringError(f"unsupported node {n.op} {n.target}")
            args = torch.fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
            if n in self._mutation_nodes:
                if hook is not None:
                    hook.mutation(n)
                m = syms.meta(n.args[0].meta["val"])
                value = _conform(args[1], m, "copy_")
                mutations[self._mutation_nodes[n]] = value
                env[n] = value
                env[n.args[0]] = value
                continue
            # The ATen op's name on its HLO (metadata op_name), for debug.fusions().
            with jax.named_scope(_scope(n.target)):
                if hook is not None:
                    env[n] = hook.node(n, args, kwargs,
                                       lambda a, k, n=n: self._call(n, a, k, tr))
                else:
                    env[n] = self._call(n, args, kwargs, tr)
        else:  # pragma: no cover
            raise LoweringError("graph without output")
        if not isinstance(outs, (list, tuple)):
            outs = (outs,)
        return list(outs), [mutations[p] for p in self.mutated_inputs]

    def _call(self, n, args, kwargs, tr):
        target = n.target
        if isinstance(target, torch._ops.OpOverload):
            return self._call_op(n, target, args, kwargs, tr)
        if target is operator.getitem:
            return args[0][args[1]]
        if isinstance(target, torch._ops.OpOverloadPacket):
            raise LoweringError(f"unresolved overload packet {target}")
        if isinstance(target, torch._ops.HigherOrderOperator):
            raise LoweringError(f"higher-order op {target} is not supported in graphs")
        # Python arithmetic on sizes (symbolic shapes): concrete ints here.
        return target(*[tr.syms.int(a) for a in args],
                      **{k: tr.syms.int(v) for k, v in kwargs.items()})

    def _call_op(self, n, op, args, kwargs, tr):
        val = n.meta.get("val")
        out = tr.syms.meta(val) if val is not None else None
        name = str(op)
        if op is aten.sym_size.int:
            return args[0].shape[args[1]]
        if op is aten.sym_stride.int or op is aten.sym_storage_offset.default:
            return tr.syms.int(val)
        if op is aten.sym_numel.default:
            return int(np.prod(args[0].shape))
        named = calling.bind(op, args, kwargs)
        rule = graph_ops.GRAPH_OPS.get(op)  # a graph rule wins over the lowering
        if rule is not None:
            node_named = calling.bind(op, n.args, n.kwargs)
            ctx = _NodeCtx(self, n, out, node_named, tr)
            return _conform_tree(rule(ctx, named), out, name) if out is not None else rule(
                ctx, named)
        low = registry.LOWERINGS.get(op)
        if low is not None:
            return self._apply_lowering(low, op, named, out, tr, name, n)
        base = _mutating_base(op)
        if base is not None and base in registry.LOWERINGS and registry.LOWERINGS[base].mutates:
            return self._apply_functional(registry.LOWERINGS[base], base, named, out, tr, name)
        functional = calling.functional_of(op)
        if functional is not None and (functional in registry.LOWERINGS
                                       or functional in graph_ops.GRAPH_OPS):
            return self._apply_inplace(n, op, functional, named, out, tr)
        if op.is_view and val is not None:
            node_named = calling.bind(op, n.args, n.kwargs)
            return graph_ops.generic_view(_NodeCtx(self, n, out, node_named, tr), named)
        decomposed = _decompose(op, n, args, kwargs, tr)
        if decomposed is not _NO_DECOMP:
            return decomposed
        return _cpu_callback(op, args, kwargs, out, name)

    def _apply_lowering(self, low, op, named, out, tr, name, n=None):
        fargs, fkw = calling.split(op, {k: _python_value(v) for k, v in named.items()})
        if low.random:
            fkw["rng_key"] = tr.next_rng()
        if low.eager:
            raise LoweringError(f"{name} has a data-dependent output shape")
        registry.CONTEXT.meta_out = _meta_tensor(out)
        registry.CONTEXT.meta_in = _arg_metas(op, n)
        try:
            result = low.fn(*fargs, **fkw)
        finally:
            registry.CONTEXT.meta_out = registry.CONTEXT.meta_in = None
        if low.mutates:
            result, _updates = result
        if out is None:
            return result
        return _conform_tree(result, out, name)

    def _apply_functional(self, low, base, named, out, tr, name):
        """`foo_functional` through the lowering of mutating `foo`."""
        fargs, fkw = calling.split(base, {k: _python_value(v) for k, v in named.items()})
        if low.random:
            fkw["rng_key"] = tr.next_rng()
        n_main = len(out) - len(low.mutates)
        registry.CONTEXT.meta_out = _meta_tensor(tuple(out[:n_main]) if n_main > 1
                                                 else out[0])
        try:
            result, updates = low.fn(*fargs, **fkw)
        finally:
            registry.CONTEXT.meta_out = None
        if not isinstance(result, (list, tuple)):
            result = (result,)
        # The functional schema returns the new values of the mutated
        # arguments after the op's own outputs, in schema order.
        order = [a.name for a in base._schema.arguments
                 if a.alias_info is not None and a.alias_info.is_write]
        values = list(result) + [updates[k] for k in order]
        return _conform_tree(tuple(values), out, name)

    def _apply_inplace(self, n, op, functional, named, out, tr):
        """An in-place / out= overload: compute the functional op, rebind the target."""
        fnamed = {a.name: named.get(a.name) for a in functional._schema.arguments}
        fout = out
        low = registry.LOWERINGS.get(functional)
        if low is not None:
            value = self._apply_lowering(low, functional, fnamed, fout, tr, str(functional))
        else:
            ctx = _NodeCtx(self, n, out, calling.bind(op, n.args, n.kwargs), tr)
            value = graph_ops.GRAPH_OPS[functional](ctx, fnamed)
        return value

    # -- the jax function ------------------------------------------------------

    def jax_fn(self, syms_factory):
        """fn(inputs, consts, rng) -> (outputs, mutated input values)."""

        def fn(inputs, consts, rng):
            syms = syms_factory(inputs)
            outs, muts = self.trace(inputs, consts, rng, syms)
            return outs, muts

        return fn


def _scope(target: object) -> str:
    """A node's name in the program's HLO metadata: `aten.mm.default` for an op."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", None) or type(target).__name__


def _fetch_attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------
# decompositions: re-trace one op with PyTorch's decomposition table


_NO_DECOMP = object()
_DECOMP_GRAPHS: dict = {}


_decomposing = threading.local()


def _decompose(op, n, args, kwargs, tr):
    decomp = decomposition_table.get(op)
    active = getattr(_decomposing, "ops", None)
    if active is None:
        active = _decomposing.ops = set()
    if decomp is None or op in active:
        return _NO_DECOMP
    active.add(op)
    try:
        return _decompose_with(decomp, op, n, args, kwargs, tr)
    finally:
        active.discard(op)


def _decompose_with(decomp, op, n, args, kwargs, tr):
    flat, spec = pytree.tree_flatten((args, kwargs))
    metas = []
    parts = [op, spec]
    for x in flat:
        if _is_array(x):
            m = Meta(tuple(x.shape), st.JAX_TO_TORCH[np.dtype(x.dtype)], None, 0)
            metas.append(m)
            parts.append((m.shape, m.dtype))
        else:
            parts.append(("v", repr(x)))
    key = tuple(parts)
    prog = _DECOMP_GRAPHS.get(key)
    if prog is None:
        from torch.fx.experimental.proxy_tensor import make_fx

        def meta_of(x):
            if _is_array(x):
                return torch.empty(tuple(x.shape), dtype=st.JAX_TO_TORCH[np.dtype(x.dtype)],
                                   device="meta")
            return x

        margs, mkwargs = pytree.tree_map(meta_of, (args, kwargs))
        tensor_pos = [i for i, x in enumerate(flat) if _is_array(x)]

        def run(*tensors):
            vals = list(pytree.tree_leaves((margs, mkwargs)))
            for i, t in zip(tensor_pos, tensors):
                vals[i] = t
            a, k = pytree.tree_unflatten(vals, spec)
            return decomp(*a, **k)

        meta_inputs = [pytree.tree_leaves((margs, mkwargs))[i] for i in tensor_pos]
        try:
            # Only `op` itself is decomposed: the ATen ops its decomposition
            # calls go through the lowering table like any other node.
            gm = make_fx(torch.func.functionalize(run, remove="mutations_and_views"),
                         tracing_mode="fake")(*meta_inputs)
        except Exception as e:  # the decomposition does not apply to these arguments
            raise LoweringError(f"decomposing {op} failed: {e}") from e
        prog = _DECOMP_GRAPHS[key] = GraphProgram(gm, f"decomp:{op}")
    inputs = [x for x in flat if _is_array(x)]
    consts = [const_value(v) for _, v in prog.constants]  # decompositions: rarely any
    outs, _ = prog.trace(inputs, consts, tr.rng_raw if prog.uses_rng else None, SymEnv())
    if prog.uses_rng:
        # Keep the counter moving so sibling random ops get distinct keys.
        tr.rng_count += 1
    val = n.meta.get("val")
    if isinstance(val, (list, tuple)):
        return tuple(outs)
    return outs[0] if len(outs) == 1 else tuple(outs)


def const_value(v, device_index=0):
    """A get_attr constant as a program input (compile.graph, exporting and
    debug's graph view pass a program's constants through it)."""
    if isinstance(v, torch.Tensor):
        if v.device.type == "tpu":
            return executor.value(v)
        return st.from_host(v, device_index)
    return v


# --------------------------------------------------------------------------
# last resort: the op on the CPU, through a host callback


_no_callbacks = threading.local()


class no_host_callbacks:
    """Within: an op with no lowering raises instead of calling back to the host
    CPU (a program exported with torch_tpu.export cannot call back into torch)."""

    def __enter__(self):
        self._prev = getattr(_no_callbacks, "on", False)
        _no_callbacks.on = True

    def __exit__(self, *exc):
        _no_callbacks.on = self._prev


def _cpu_callback(op, args, kwargs, out, name):
    if getattr(_no_callbacks, "on", False):
        raise LoweringError(
            f"The operator '{name}' has no tpu lowering and no decomposition; an exported "
            "program cannot run it on the host CPU")
    if not fallback.cpu_fallback_enabled():
        raise LoweringError(
            f"The operator '{name}' has no tpu lowering and the CPU fallback is disabled "
            "(TORCH_TPU_CPU_FALLBACK=0)")
    if out is None:
        raise LoweringError(f"no output metadata for {name}")
    _warn_once(("cpu", name),
               f"The operator '{name}' has no tpu lowering: inside compiled graphs it runs "
               "on the CPU through a host callback, which is slow.")
    flat, spec = pytree.tree_flatten((args, kwargs))
    arr_pos = [i for i, x in enumerate(flat) if _is_array(x)]
    arr_dtypes = [st.JAX_TO_TORCH[np.dtype(flat[i].dtype)] for i in arr_pos]
    outs_meta = out if isinstance(out, (list, tuple)) else [out]
    result_shapes = [jax.ShapeDtypeStruct(m.shape, st.TORCH_TO_JAX[m.dtype]) for m in outs_meta]

    # the op runs on CPU tensors: a device argument naming tpu (a factory's
    # `device=`) names the CPU in the callback, or it would make tpu tensors
    vals_cpu = [torch.device("cpu") if isinstance(v, torch.device) and v.type == "tpu" else v
                for v in flat]

    def host(*arrays):
        vals = list(vals_cpu)
        for i, a, dt in zip(arr_pos, arrays, arr_dtypes):
            vals[i] = st.host_tensor(np.asarray(a), dt)
        a, k = pytree.tree_unflatten(vals, spec)
        res = op(*a, **k)
        res = res if isinstance(res, (list, tuple)) else [res]
        return [np.asarray(r.detach().contiguous().view(
            {1: torch.uint8, 2: torch.int16}[r.dtype.itemsize]).numpy()).view(
            st.TORCH_TO_JAX[r.dtype]) if r.dtype == torch.bfloat16 else r.detach().numpy()
            for r in res]

    res = jax.pure_callback(host, result_shapes, *[flat[i] for i in arr_pos])
    return tuple(res) if isinstance(out, (list, tuple)) else res[0]
