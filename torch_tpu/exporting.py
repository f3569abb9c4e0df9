"""`torch_tpu.export`: a PyTorch model as a portable StableHLO program.

    exported = torch_tpu.export(model.eval(), (x,), dynamic_shapes=({0: Dim("batch")},))
    blob = exported.serialize()                       # bytes
    # elsewhere, with only jax installed:
    exp = jax.export.deserialize(blob); y = exp.call(x_numpy)

The model goes through `torch.export` (a functional ATen graph with the
parameters lifted to inputs), PyTorch's core-ATen decompositions minus the
ops the backend lowers directly (the table torch.compile uses; ops left
without a lowering are decomposed further, still symbolically), and then
`torch_tpu.compile.lowering.GraphProgram`: the same lowering table eager
mode and `torch.compile(backend="tpu")` run. The JAX function it builds is
exported with `jax.export`, so the result is a `jax.export.Exported`:
StableHLO text (`.mlir_module()`), its calling convention, and bytes that any
JAX process can load (with ``jax_enable_x64`` on when the program has 64-bit
inputs such as int64 token ids: torch_tpu keeps PyTorch's dtypes).

Symbolic sizes: every `torch.export.Dim` of `dynamic_shapes` becomes a
`jax.export` dimension variable with the same name and the range
`torch.export` inferred, so one export serves every size in the range.

Parameters: ``params="constants"`` (default) bakes parameters and buffers
into the program; ``params="arguments"`` makes them a leading dict argument
``{fully qualified name: array}`` (the names of `module.named_parameters()`
and `module.named_buffers()` that the graph reads; `state_arrays(module)`
builds it), so one program serves any weights of that architecture.

What cannot be exported raises a PyTorch exception naming the op: an op
with neither a lowering nor a decomposition (NotImplementedError; the host
CPU fallback of eager/compile cannot be serialized), an op with a
data-dependent output shape (nonzero, unique, ...: NotImplementedError), a
lowering that fails on symbolic sizes (RuntimeError).
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._compat import torch_api
from ._compat.torch_api import pytree
from .runtime import loading
from .compile.backend import decompositions
from .ops import registry
from .compile import graph_ops
from .compile.lowering import GraphProgram
from .runtime import storage as st
from .compile.lowering import const_value, no_host_callbacks
from .compile.lowering import SymEnv

if TYPE_CHECKING:
    import jax

__all__ = ["export", "state_arrays", "parameter_names"]

_MODES = ("constants", "arguments")
_PREFIX = "torch_tpu.export: "


def export(fn_or_module: torch.nn.Module | Callable, args: tuple,
           kwargs: dict | None = None, dynamic_shapes: Any = None, *,
           params: str = "constants", platforms: Sequence[str] | None = None,
           strict: bool = False) -> jax.export.Exported:
    """Export `fn_or_module(*args, **kwargs)` to a `jax.export.Exported`.

    The result's ``call(*args, **kwargs)`` takes numpy / jax arrays in the
    structure of `args` / `kwargs` (``None`` in place of non-tensor
    arguments, which are constants of the program), preceded by the
    parameter dict for ``params="arguments"``, and returns the module's
    outputs (tuples, lists and dicts of arrays keep their structure; any
    other output container is flattened to a tuple).

    Args:
        fn_or_module: an `nn.Module` (export its inference path: call `.eval()`
            first) or a function of tensors.
        args: example positional arguments. Tensors may be on ``cpu`` or
            ``tpu``; only their shapes and dtypes are used (and the module's
            parameter values, for ``params="constants"``).
        kwargs: example keyword arguments.
        dynamic_shapes: as for `torch.export.export`: ``torch.export.Dim``
            objects per input axis. Each Dim becomes a `jax.export` dimension
            variable of the same name.
        params: ``"constants"`` bakes parameters and buffers into the program;
            ``"arguments"`` takes them as a leading dict argument
            ``{name: array}`` (see `parameter_names`, `state_arrays`).
        platforms: the platforms the program may run on (``("cpu", "tpu")``,
            ...); default: JAX's default backend of this process.
        strict: passed to `torch.export.export`.

    Returns:
        The exported program (StableHLO and its calling convention).
    """
    if params not in _MODES:
        raise ValueError(f"torch_tpu.export: params must be one of {_MODES}, not {params!r}")
    loading.load()
    import jax

    kwargs = dict(kwargs or {})
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    module = fn_or_module if isinstance(fn_or_module, torch.nn.Module) else _FnModule(
        fn_or_module)
    if isinstance(fn_or_module, torch.nn.Module) and fn_or_module.training:
        warnings.warn("torch_tpu.export: the module is in training mode; the exported "
                      "program is its training-mode forward without state updates "
                      "(call .eval() to export the inference path)", stacklevel=2)
    ep = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes,
                             strict=strict)
    with warnings.catch_warnings():
        # torch's own run_decompositions deep-copies its module call graph, whose
        # pytree specs warn about their deprecated LeafSpec check (torch 2.13):
        # nothing the caller can act on
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*is deprecated",
                                category=FutureWarning)
        ep = ep.run_decompositions(_decomposition_table(decompositions()))
    ep = _decompose_unlowered(ep)
    _drop_runtime_asserts(ep.graph_module)
    plan = _Plan(ep, module, args, kwargs, dynamic_shapes, params)
    fn = plan.jax_function()
    arg_specs, kwarg_specs = plan.input_specs()
    try:
        exported = jax.export.export(jax.jit(fn), platforms=platforms)(*arg_specs,
                                                                       **kwarg_specs)
    except Exception as e:
        if isinstance(e, (NotImplementedError, RuntimeError)) and \
                str(e).startswith("torch_tpu.export"):
            raise  # our own checks and per-node errors: the op is named
        raise RuntimeError(f"torch_tpu.export: JAX could not export the program: "
                           f"{type(e).__name__}: {e}") from e
    return exported


def parameter_names(exported) -> list[str]:
    """The keys of the parameter dict a ``params="arguments"`` export takes
    (its first argument; JAX flattens it in sorted key order)."""
    import jax

    args, _kwargs = jax.tree_util.tree_unflatten(exported.in_tree,
                                                 list(range(len(exported.in_avals))))
    if not args or not isinstance(args[0], dict):
        raise ValueError("this program was not exported with params='arguments'")
    return sorted(args[0])


def state_arrays(module: torch.nn.Module, exported=None) -> dict:
    """``{name: numpy array}`` of the module's parameters and buffers: the first
    argument of a ``params="arguments"`` export (only the names `exported`
    takes, when given)."""
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(dict(module.named_buffers(remove_duplicate=False)))
    if exported is not None:
        tensors = {n: tensors[n] for n in parameter_names(exported)}
    return {n: _to_numpy(t) for n, t in tensors.items()}


# --------------------------------------------------------------------------


def _decomposition_table(backend_table):
    """torch.export's default table (core ATen, including CompositeImplicit ops
    such as `linear`), plus torch.compile's, minus every op the lowering table
    runs directly: the graph reaches GraphProgram at the level compile's does."""
    table = torch.export.default_decompositions()
    for op, fn in backend_table.items():
        table[op] = fn
    for op in list(table.keys()):
        if op in registry.LOWERINGS:
            table.pop(op)
    return table


def _decompose_unlowered(ep, rounds=4):
    """Ops left without a lowering or graph rule, decomposed here, at export
    level, where sizes stay symbolic (GraphProgram's own per-op fallback
    re-traces them at concrete sizes, which a symbolic export does not have)."""
    decomposition_table = torch_api.decomposition_table
    for _ in range(rounds):
        extra = {}
        for n in ep.graph.nodes:
            op = n.target
            if (n.op == "call_function" and isinstance(op, torch._ops.OpOverload)
                    and op not in registry.LOWERINGS and op not in graph_ops.GRAPH_OPS
                    and op in decomposition_table):
                extra[op] = decomposition_table[op]
        if not extra:
            break
        ep = ep.run_decompositions(extra)
    return ep


_ASSERT_OPS = ("_assert_tensor_metadata", "_assert_scalar", "_assert_async",
               "sym_constrain_range", "sym_constrain_range_for_size")


def _drop_runtime_asserts(gm):
    """torch.export's checks of metadata it already verified while tracing (dtype
    of `.to()`, size conditions): no values, nothing to lower."""
    graph = gm.graph
    for n in list(graph.nodes):
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
                and n.target._schema.name.split("::")[-1] in _ASSERT_OPS and not n.users:
            graph.erase_node(n)
    gm.recompile()


class _FnModule(torch.nn.Module):
    """A plain function as a module (torch.export takes modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _to_numpy(t: torch.Tensor):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _is_builtin_tree(x) -> bool:
    """Only tuples, lists, dicts (str keys) and leaves: a tree JAX and torch agree on."""
    if isinstance(x, (tuple, list)):
        return type(x) in (tuple, list) and all(_is_builtin_tree(v) for v in x)
    if isinstance(x, dict):
        return type(x) is dict and all(isinstance(k, str) and _is_builtin_tree(v)
                                       for k, v in x.items())
    return True


class _Plan:
    """How the exported graph's placeholders map to the JAX function's arguments."""

    def __init__(self, ep, module, args, kwargs, dynamic_shapes, params):
        from torch.export.graph_signature import InputKind, OutputKind

        self.ep = ep
        self.params = params
        self.program = GraphProgram(ep.graph_module, "export")
        sig = ep.graph_signature
        placeholders = self.program.placeholders
        if len(placeholders) != len(sig.input_specs):
            raise RuntimeError("torch_tpu.export: the exported graph's inputs do not match "
                               "its signature")
        for spec in sig.output_specs:
            if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION,
                             OutputKind.PARAMETER_MUTATION):
                raise NotImplementedError(
                    f"torch_tpu.export: the program mutates {spec.target!r} "
                    f"({spec.kind.name}); an exported program has no state to update. "
                    "Export the inference path (module.eval()), without in-place updates "
                    "of buffers or inputs")
        self.n_user_out = sum(1 for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT)
        if self.n_user_out != len(sig.output_specs):
            kinds = sorted({s.kind.name for s in sig.output_specs})
            raise NotImplementedError(f"torch_tpu.export: unsupported graph outputs {kinds}")
        # The user's (args, kwargs), flattened as torch.export flattened them.
        flat, self.in_tree = pytree.tree_flatten((args, kwargs))
        self.flat_user = flat
        self.tensor_leaf = [isinstance(x, torch.Tensor) for x in flat]
        self.builtin_in = _is_builtin_tree((args, kwargs))
        self.args, self.kwargs = args, kwargs
        # placeholder i -> ("state", name) | ("const", value) | ("user", leaf index)
        self.sources = []
        state = dict(module.named_parameters(remove_duplicate=False))
        state.update(dict(module.named_buffers(remove_duplicate=False)))
        self.state_names = []
        self._state_meta = {}
        n_user = 0
        for n, spec in zip(placeholders, sig.input_specs):
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                if spec.kind == InputKind.BUFFER and spec.target in ep.constants:
                    value = ep.constants[spec.target]
                else:
                    value = ep.state_dict.get(spec.target, state.get(spec.target))
                if value is None:
                    raise RuntimeError(f"torch_tpu.export: no value for {spec.target!r}")
                if params == "arguments":
                    self.sources.append(("state", spec.target))
                    self.state_names.append(spec.target)
                    self._state_meta[spec.target] = n.meta["val"]
                else:
                    self.sources.append(("const", value))
            elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
                self.sources.append(("const", ep.constants[spec.target]))
            elif spec.kind == InputKind.USER_INPUT:
                self.sources.append(("user", n_user))
                n_user += 1
            elif spec.kind == InputKind.TOKEN:
                raise NotImplementedError("torch_tpu.export: effectful ops (tokens) cannot be "
                                          "exported")
            else:  # pragma: no cover - a future kind
                raise NotImplementedError(f"torch_tpu.export: input kind {spec.kind}")
        if n_user != len(flat):
            raise RuntimeError(f"torch_tpu.export: the graph takes {n_user} user inputs, the "
                               f"example has {len(flat)} leaves")
        self.user_placeholders = [n for n, s in zip(placeholders, self.sources)
                                  if s[0] == "user"]
        self._dims = _SymbolicDims(ep, self.user_placeholders, args, kwargs, dynamic_shapes)

    # -- the JAX side ----------------------------------------------------------

    def input_specs(self):
        """ShapeDtypeStructs (symbolic where the graph is) in the call structure."""
        import jax

        def sds(val):
            shape = tuple(self._dims.shape(d) for d in val.shape)
            return jax.ShapeDtypeStruct(shape, st.TORCH_TO_JAX[val.dtype])

        leaves = []
        for i, _x in enumerate(self.flat_user):
            if self.tensor_leaf[i]:
                leaves.append(sds(self.user_placeholders[i].meta["val"]))
            else:
                leaves.append(None)
        args, kwargs = self._user_tree(leaves)
        if self.params == "arguments":
            state = {name: sds(self._state_meta[name]) for name in self.state_names}
            args = (state,) + args
        return args, kwargs

    def _user_tree(self, leaves):
        """(positional, keyword) arguments of the call, tensors replaced by `leaves`."""
        if self.builtin_in:
            args, kwargs = pytree.tree_unflatten(leaves, self.in_tree)
            return tuple(args), dict(kwargs)
        return tuple(v for v, t in zip(leaves, self.tensor_leaf) if t), {}

    def _user_leaves(self, call_args, call_kwargs):
        """The call's leaves in torch.export's order. JAX hands dicts back with
        sorted keys, so the walk follows the example's containers, not the
        received ones."""
        if self.builtin_in:
            out: list = []
            _leaves_like((self.args, self.kwargs), (tuple(call_args), call_kwargs), out)
            return out
        it = iter(call_args)
        return [next(it) if t else None for t in self.tensor_leaf]

    def jax_function(self):
        import jax.numpy as jnp

        program = self.program
        uses_rng = program.uses_rng
        if uses_rng:
            op = next((n.target for n in program.nodes if program._may_use_rng(n)), "?")
            raise NotImplementedError(
                f"torch_tpu.export: the graph has a random op ({op}); exported programs are "
                "deterministic (export the inference path: module.eval())")
        consts_graph = [const_value(v) for _, v in program.constants]
        placeholders = program.placeholders
        plan = self

        def fn(*call_args, **call_kwargs):
            if plan.params == "arguments":
                state, call_args = call_args[0], call_args[1:]
            else:
                state = None
            leaves = plan._user_leaves(call_args, call_kwargs)
            inputs = []
            for _n, (kind, v) in zip(placeholders, plan.sources):
                if kind == "state":
                    inputs.append(state[v])
                elif kind == "const":
                    inputs.append(jnp.asarray(_to_numpy(v)) if isinstance(v, torch.Tensor)
                                  else v)
                else:
                    leaf = leaves[v] if plan.tensor_leaf[v] else plan.flat_user[v]
                    inputs.append(leaf)
            syms = plan._dims.env(placeholders, inputs)
            with no_host_callbacks():
                outs, _ = program.trace(inputs, consts_graph, None, syms, hook=_NamingHook(plan))
            outs = [jnp.asarray(o) if not hasattr(o, "shape") and o is not None else o
                    for o in outs[:plan.n_user_out]]
            tree = pytree.tree_unflatten(outs, plan.ep.call_spec.out_spec)
            if _is_builtin_tree(tree):
                return tree
            return tuple(outs)

        return fn


def _leaves_like(example, received, out):
    """Append the leaves of `received` in the order torch's pytree flattens
    `example` (tuples, lists, dicts in insertion order; anything else a leaf)."""
    if isinstance(example, (tuple, list)):
        for e, r in zip(example, received):
            _leaves_like(e, r, out)
    elif isinstance(example, dict):
        for k, e in example.items():
            _leaves_like(e, received[k], out)
    else:
        out.append(received)


class _NamingHook:
    """Wraps every node's lowering so a failure names the op (and never leaks a
    raw JAX exception)."""

    def __init__(self, plan):
        self.plan = plan

    def mutation(self, n):
        raise NotImplementedError(f"torch_tpu.export: the graph writes into its input "
                                  f"{n.args[0].name} (copy_)")

    def node(self, n, args, kwargs, call):
        try:
            return call(args, kwargs)
        except (NotImplementedError, RuntimeError) as e:
            name, msg = _op_name(n), str(e)
            if msg.startswith(_PREFIX):
                if name in msg:
                    raise
                msg = msg[len(_PREFIX):]
            try:
                err = type(e)(f"{_PREFIX}{name}: {msg}")
            except Exception:  # an exception type with another constructor
                err = RuntimeError(f"{_PREFIX}{name}: {msg}")
            raise err from e
        except Exception as e:
            raise RuntimeError(f"torch_tpu.export: lowering {_op_name(n)} failed "
                               f"({type(e).__name__}: {e})") from e


def _op_name(n) -> str:
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    return getattr(t, "__name__", str(t))


# --------------------------------------------------------------------------
# symbolic sizes: torch.export's sympy symbols as jax.export dimension variables


class _SymbolicDims:
    """torch.export's shape symbols, named after the user's Dims, as jax dims."""

    def __init__(self, ep, user_placeholders, args, kwargs, dynamic_shapes):
        import jax

        names = _dim_names(user_placeholders, args, kwargs, dynamic_shapes)
        self.symbols = {}   # sympy Symbol -> name
        for n in user_placeholders:
            val = n.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            for d in val.shape:
                if isinstance(d, torch.SymInt):
                    for s in d.node.expr.free_symbols:
                        if s not in self.symbols:
                            self.symbols[s] = names.get(s, str(s))
        self.jax = {}
        if not self.symbols:
            return
        constraints = []
        for s, name in self.symbols.items():
            vr = ep.range_constraints.get(s)
            if vr is None:
                continue
            lo, hi = vr.lower, vr.upper
            if _finite(lo) and int(lo) > 1:
                constraints.append(f"{name} >= {int(lo)}")
            if _finite(hi):
                constraints.append(f"{name} <= {int(hi)}")
        dims = jax.export.symbolic_shape(", ".join(self.symbols.values()),
                                         constraints=constraints)
        self.jax = dict(zip(self.symbols, dims))

    def shape(self, d):
        if isinstance(d, torch.SymInt):
            return _sympy_to_dim(d.node.expr, self.jax)
        return int(d)

    def env(self, placeholders, inputs):
        return _JaxSymEnv(self.jax)


def _finite(bound) -> bool:
    """A range bound that is a number (not sympy's oo nor torch's int_oo)."""
    import sympy
    int_oo = torch_api.int_oo
    return bool(bound.is_number) and bound not in (sympy.oo, -sympy.oo, int_oo, -int_oo)


def _dim_names(user_placeholders, args, kwargs, dynamic_shapes) -> dict:
    """sympy symbol -> the name of the user's `torch.export.Dim` for it."""
    if dynamic_shapes is None:
        return {}
    names = {}
    leaves, _ = pytree.tree_flatten((args, kwargs))
    if isinstance(dynamic_shapes, dict) and not isinstance(args, dict):
        # by argument name: positional args first, then kwargs, in signature order
        specs = list(dynamic_shapes.values())
    else:
        specs = list(dynamic_shapes)
    tensors = [n for n, x in zip(user_placeholders, leaves) if isinstance(x, torch.Tensor)]
    flat_specs = []
    for s in specs:
        if isinstance(s, (list, tuple)) and s and all(isinstance(a, (dict, list, tuple))
                                                      or a is None for a in s):
            flat_specs.extend(s)
        else:
            flat_specs.append(s)
    if len(flat_specs) != len(tensors):
        return {}
    for n, spec in zip(tensors, flat_specs):
        val = n.meta.get("val")
        if spec is None or not isinstance(val, torch.Tensor):
            continue
        axes = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for axis, dim in axes:
            name = getattr(dim, "__name__", None)
            if name is None or axis >= val.dim() or not isinstance(val.shape[axis],
                                                                   torch.SymInt):
                continue
            expr = val.shape[axis].node.expr
            if getattr(expr, "is_Symbol", False) and name.isidentifier():
                names.setdefault(expr, name)
    return names


def _sympy_to_dim(expr, dims: dict) -> Any:
    """A sympy size expression with torch.export's symbols replaced by jax dims."""
    import sympy

    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        d = dims.get(expr)
        if d is None:
            raise NotImplementedError(
                f"torch_tpu.export: the size {expr} depends on tensor data (a data-dependent "
                "shape) and cannot be a static or symbolic size of the exported program")
        return d
    args = [_sympy_to_dim(a, dims) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return _fold(operator.add, args)
    if isinstance(expr, sympy.Mul):
        return _fold(operator.mul, args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) >= 0:
        return _fold(operator.mul, [args[0]] * int(expr.exp)) if int(expr.exp) else 1
    name = type(expr).__name__
    if name in ("FloorDiv", "IntTrueDiv", "CleanDiv"):
        return args[0] // args[1]
    if name in ("Mod", "PythonMod"):
        return args[0] % args[1]
    if name in ("Max", "Min"):
        import jax.core

        f = jax.core.max_dim if name == "Max" else jax.core.min_dim
        return _fold(f, args)
    raise NotImplementedError(f"torch_tpu.export: the size expression {expr} ({name}) has no "
                              "jax.export equivalent")


def _fold(f, xs):
    out = xs[0]
    for x in xs[1:]:
        out = f(out, x)
    return out


def _sym_value(x, dims):
    import sympy

    expr = x.node.expr
    if isinstance(x, torch.SymBool) or isinstance(expr, sympy.core.relational.Relational):
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        rel = {"Equality": operator.eq, "Unequality": operator.ne,
               "StrictLessThan": operator.lt, "LessThan": operator.le,
               "StrictGreaterThan": operator.gt, "GreaterThan": operator.ge}
        f = rel.get(type(expr).__name__)
        if f is None:
            raise NotImplementedError(f"torch_tpu.export: the size condition {expr}")
        return f(_sympy_to_dim(expr.lhs, dims), _sympy_to_dim(expr.rhs, dims))
    if isinstance(x, torch.SymFloat):
        if expr.is_number:
            return float(expr)
        raise NotImplementedError(f"torch_tpu.export: the float size expression {expr}")
    return _sympy_to_dim(expr, dims)


def _jax_sym_env_class():
    class JaxSymEnv(SymEnv):
        """SymEnv whose symbols are jax.export dimension variables, not ints."""

        def __init__(self, dims):
            super().__init__()
            self.values = dict(dims)

        def bind(self, sym, value):
            pass

        def int(self, x):
            if isinstance(x, (torch.SymInt, torch.SymBool, torch.SymFloat)):
                return _sym_value(x, self.values)
            return x

    return JaxSymEnv


def _JaxSymEnv(dims):
    global _JAX_SYM_ENV
    if _JAX_SYM_ENV is None:
        _JAX_SYM_ENV = _jax_sym_env_class()
    return _JAX_SYM_ENV(dims)


_JAX_SYM_ENV = None
