"""Trace a PyTorch callable to an ATen graph and lower it to one JAX function.

Used by `torch_tpu.debug.hlo` to show the whole program of an eager
function (or an fx graph, or a single op) as XLA would compile it when the
function is captured as a graph: `make_fx` (fake tensors, functionalized) gives
ATen ops; each op goes through the same lowering table the executor uses
(`torch_tpu.ops.registry.LOWERINGS`); view and storage-level ops, which the
executor runs as storage kernels rather than lowerings, have small value
semantics rules here. Ops with no lowering are decomposed with PyTorch's
decomposition table, as the eager fallback does.

When the torch.compile backend's graph lowering (`torch_tpu.compile.lowering.
GraphProgram`) is importable it is used first, so that `hlo()` shows what the
backend compiles; this module's own interpreter is the fallback.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
import torch
from .._compat import torch_api
from ..runtime.storage import TORCH_TO_JAX
from ..ops import registry
from ..runtime import executor

aten = torch.ops.aten


# --------------------------------------------------------------------------
# value rules for ops that are storage kernels in eager mode


def _to_jax_dtype(dtype):
    return TORCH_TO_JAX[dtype]


def _norm_dims(dims, ndim):
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(d % ndim if ndim else 0 for d in dims)


def _view(x, size):
    return jnp.reshape(x, tuple(size))


def _slice(x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(*slice(start, end, step).indices(n))
    return x[tuple(idx)]


def _squeeze(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = _norm_dims(dim, x.ndim)
    dims = tuple(d for d in dims if x.shape[d] == 1)
    return jnp.squeeze(x, dims) if dims else x


def _expand(x, size, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    for i, s in enumerate(size):
        if s == -1:
            size[i] = x.shape[i - lead]
    return jnp.broadcast_to(x, tuple(size))


def _to_copy(x, dtype=None, **_):
    return x if dtype is None else x.astype(_to_jax_dtype(dtype))


def _full_like_meta(value):
    def rule(*args, **kwargs):
        meta = _CTX.meta
        return jnp.full(tuple(meta.shape), value, _to_jax_dtype(meta.dtype))
    return rule


def _copy(x, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


def _diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1, dim2)


def _unbind(x, dim=0):
    return tuple(jnp.moveaxis(x, dim, 0))


def _split(x, split_size, dim=0):
    n = x.shape[dim]
    sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    return _split_with_sizes(x, sizes or [0], dim)


def _split_with_sizes(x, split_sizes, dim=0):
    out, start = [], 0
    for s in split_sizes:
        out.append(_slice(x, dim, start, start + s))
        start += s
    return tuple(out)


VALUE_RULES = {
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.reshape.default: _view,
    aten._reshape_alias.default: lambda x, size, stride: jnp.reshape(x, tuple(size)),
    aten.view.dtype: lambda x, dtype: jax.lax.bitcast_convert_type(x, _to_jax_dtype(dtype)),
    aten.t.default: lambda x: x.T if x.ndim == 2 else x,
    aten.transpose.int: lambda x, dim0, dim1: jnp.swapaxes(x, dim0, dim1),
    aten.permute.default: lambda x, dims: jnp.transpose(x, _norm_dims(dims, x.ndim)),
    aten.expand.default: _expand,
    aten.unsqueeze.default: lambda x, dim: jnp.expand_dims(x, dim % (x.ndim + 1)),
    aten.squeeze.default: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.select.int: lambda x, dim, index: jnp.take(x, index % x.shape[dim], axis=dim),
    aten.slice.Tensor: _slice,
    aten.diagonal.default: _diagonal,
    aten.unbind.int: _unbind,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split_with_sizes,
    aten.alias.default: lambda x: x,
    aten.detach.default: lambda x: x,
    aten.lift_fresh_copy.default: lambda x: x,
    aten.lift_fresh.default: lambda x: x,
    aten.clone.default: lambda x, memory_format=None: x,
    aten.contiguous.default: lambda x, memory_format=None: x,
    aten._to_copy.default: _to_copy,
    aten.copy.default: _copy,
    aten.copy_.default: _copy,
    aten.empty.memory_format: _full_like_meta(0),
    aten.empty_strided.default: _full_like_meta(0),
    aten.empty_like.default: _full_like_meta(0),
    aten.zeros.default: _full_like_meta(0),
    aten.ones.default: _full_like_meta(1),
}


class _Ctx:
    meta = None


_CTX = _Ctx()


# --------------------------------------------------------------------------
# tracing


def decompositions() -> dict:
    """PyTorch decompositions for every op the lowering table cannot run."""
    return {op: fn for op, fn in torch_api.decomposition_table.items()
            if op not in registry.LOWERINGS and op not in VALUE_RULES
            and isinstance(op, torch._ops.OpOverload)}


def trace(fn, tensors):
    """(graph, inputs): an ATen-level, functionalized fx graph of `fn(*tensors)`
    traced with fake tensors, and the tensors its placeholders stand for.

    Functions that call `.backward()` (a training step) cannot run under
    functionalization; they are traced first as they are (autograd runs and
    its ops are recorded), the tensors they close over (weights, optimizer
    state) are lifted into inputs, and that graph is functionalized. Their
    inputs are then `tensors` followed by the lifted ones.
    """
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.func import functionalize

    def _make_fx(f):
        return make_fx(f, tracing_mode="fake", decomposition_table=decompositions(),
                       _allow_non_fake_inputs=True)

    try:
        gm = _make_fx(functionalize(fn, remove="mutations"))(*tensors)
        return _strip_profiler(gm), list(tensors)
    except RuntimeError as e:
        if "backward() called inside a functorch transform" not in str(e):
            raise
    raw = _strip_profiler(_make_fx(fn)(*tensors))
    lifted = _lift_constants(raw)
    inputs = [t.detach() for t in list(tensors) + lifted]
    gm = _make_fx(functionalize(raw, remove="mutations"))(*inputs)
    return _strip_profiler(gm), inputs


def _strip_profiler(gm):
    """Drop torch.profiler record_function nodes (no value semantics)."""
    g = gm.graph
    changed = False
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
                and n.target.namespace == "profiler":
            for u in list(n.users):
                if u.op == "call_function" and getattr(u.target, "namespace", None) == "profiler":
                    continue
                break
            else:
                for u in list(n.users):
                    g.erase_node(u)
                g.erase_node(n)
                changed = True
    if changed:
        gm.recompile()
    return gm


def _lift_constants(gm):
    """Turn the graph's get_attr tensors into trailing placeholders; their values."""
    g = gm.graph
    anchor = next(n for n in g.nodes if n.op != "placeholder")
    values = []
    for n in list(g.nodes):
        if n.op != "get_attr":
            continue
        val = _fetch(gm, n.target)
        if not isinstance(val, torch.Tensor):
            continue
        with g.inserting_before(anchor):
            ph = g.placeholder(f"lifted_{len(values)}")
        ph.meta.update(n.meta)
        n.replace_all_uses_with(ph)
        g.erase_node(n)
        values.append(val)
    gm.recompile()
    return values


def _meta_of(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype,
                                   device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_of(x) for x in v)
    return v


def _conform(x, meta):
    if not isinstance(meta, torch.Tensor):
        return x
    x = jnp.asarray(x)
    want = _to_jax_dtype(meta.dtype)
    if x.dtype != want:
        x = x.astype(want)
    shape = tuple(meta.shape)
    if x.shape != shape:
        x = jnp.broadcast_to(x, shape)
    return x


def _bind(op, args, kwargs):
    """Schema-ordered positional and keyword-only arguments with defaults."""
    schema = op._schema
    pos, kw = [], {}
    for i, a in enumerate(schema.arguments):
        if a.kwarg_only:
            if a.name in kwargs:
                kw[a.name] = kwargs[a.name]
            elif a.has_default_value():
                kw[a.name] = a.default_value
            continue
        if i < len(args):
            pos.append(args[i])
        elif a.name in kwargs:
            pos.append(kwargs[a.name])
        elif a.has_default_value():
            pos.append(a.default_value)
        else:
            pos.append(None)
    return pos, kw


def _const(v):
    if isinstance(v, torch.Tensor):
        if v.device.type == "tpu":
            return executor.value(v)
        return jnp.asarray(_host_array(v))
    return v


def _host_array(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy()


def _call(node, env):
    op = node.target
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    if op is operator.getitem:
        return args[0][args[1]]
    meta = _meta_of(node.meta.get("val"))
    low = registry.LOWERINGS.get(op)
    if low is not None:
        pos, kw = _bind(op, args, kwargs)
        if low.random:
            kw["rng_key"] = np.zeros(4, np.uint32)
        registry.CONTEXT.meta_out = meta
        try:
            result = low.fn(*pos, **kw)
        finally:
            registry.CONTEXT.meta_out = None
        if low.mutates:
            result = result[0]
    elif op in VALUE_RULES:
        _CTX.meta = meta
        try:
            result = VALUE_RULES[op](*args, **kwargs)
        finally:
            _CTX.meta = None
    else:
        raise NotImplementedError(
            f"torch_tpu.debug.hlo: the operator '{op}' has no tpu lowering (in eager mode "
            "it runs through the CPU fallback), so it cannot be part of a tpu program")
    if isinstance(meta, (list, tuple)):
        leaves = list(result) if isinstance(result, (list, tuple)) else [result]
        return type(meta)(_conform(x, m) for x, m in zip(leaves, meta))
    return _conform(result, meta)


def constants(gm: torch.fx.GraphModule) -> list:
    """The tensors the graph's get_attr nodes read, in node order."""
    return [_fetch(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]


def _fetch(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def to_jax(gm: torch.fx.GraphModule):
    """(program, constants): program(*placeholders, *constants) computes the
    graph's outputs; constants are the values of its get_attr tensors, passed
    as parameters rather than baked into the program."""
    nodes = list(gm.graph.nodes)
    consts = [_const(c) for c in constants(gm)]
    n_in = sum(1 for n in nodes if n.op == "placeholder")

    def program(*flat):
        env = {}
        it = iter(flat[:n_in])
        cit = iter(flat[n_in:])
        for n in nodes:
            if n.op == "placeholder":
                env[n] = next(it)
            elif n.op == "get_attr":
                env[n] = next(cit)
            elif n.op == "call_function":
                with jax.named_scope(str(n.target)):  # the ATen op, in HLO metadata
                    env[n] = _call(n, env)
            elif n.op == "output":
                return torch.fx.node.map_arg(n.args[0], lambda m: env[m])
            else:
                raise NotImplementedError(f"fx node kind {n.op!r} is not supported")

    return program, consts


def backend_program(gm: torch.fx.GraphModule, name: str):
    """(program, constants) through the torch.compile backend's lowering
    (`torch_tpu.compile.lowering.GraphProgram`), or None when unavailable."""
    try:
        # lazy: compile's graph lowering (34 ms) loads with a graph, not with debug
        from ..compile.lowering import GraphProgram, SymEnv, const_value
    except Exception:
        return None
    prog = GraphProgram(gm, name)
    consts = [const_value(v, 0) for _, v in prog.constants]
    rng = np.zeros((4,), np.uint32) if prog.uses_rng else None
    n_in = len(prog.placeholders)

    def program(*flat):
        outs, _mutations = prog.trace(list(flat[:n_in]), list(flat[n_in:]), rng, SymEnv())
        return outs

    return program, consts


def builders():
    """Ways to turn a traced graph into a JAX function, preferred first."""
    return [backend_program, lambda gm, name: to_jax(gm)]
