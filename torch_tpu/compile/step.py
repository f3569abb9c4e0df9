"""`torch_tpu.compile_step`: a whole training step as one XLA program.

`torch.compile(train_step, backend="tpu")` of a function holding forward,
``loss.backward()`` and ``optimizer.step()`` gives dynamo several frames (it
breaks the graph at ``backward()``; the optimizer step is a graph of its own;
``zero_grad`` and the backward seed run eagerly), so a step is several
programs and the parameters cross program boundaries. `compile_step` traces
the step instead, once per input signature:

- the modules' parameters and buffers, their ``.grad`` and every tensor of
  the optimizers' state are graph inputs (the modules are re-parametrized
  and the optimizers' ``param_groups``/``state`` point at the traced
  tensors while the user's function runs under `make_fx` with fake tensors);
  autograd runs during the trace, so the backward is in the same graph;
- `functionalize` turns the optimizer's in-place updates into ``copy_``
  into those inputs: `CompiledGraph` lowers the graph as one program and
  donates the inputs it overwrites (parameters and optimizer state) to XLA,
  then stores the new values into the same tensors, so ``Parameter`` and
  ``optimizer.state`` objects keep their identity (checkpoints, user
  references and views see the new values);
- the gradients the step leaves in ``.grad`` and state the optimizer creates
  on its first step are outputs, assigned after the call.

What is baked into a trace (as dynamo guards would check): the shapes,
dtypes and devices of all inputs, non-tensor arguments, the optimizers'
hyperparameters (``lr`` etc.: changing one retraces), which ``.grad`` are
None and the keys of the optimizer state. Python side effects of the step
function happen once per trace, not per call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._compat import flags as compat_flags
from .._compat import torch_api
from .._compat.torch_api import pytree
from ..runtime import loading
from . import backend, graph_cache
from .graph import CompiledGraph
from .persist import steps

__all__ = ["compile_step"]


def _as_list(x, kind):
    if x is None:
        return []
    if isinstance(x, kind):
        return [x]
    out = list(x)
    for v in out:
        if not isinstance(v, kind):
            raise TypeError(f"compile_step: expected {kind.__name__} objects, got "
                            f"{type(v).__name__}")
    return out


def _discover(fn):
    """Modules and optimizers the step function refers to (closure and globals)."""
    try:
        cv = inspect.getclosurevars(fn)
    except TypeError:
        return [], []
    mods: list[torch.nn.Module] = []
    opts: list[torch.optim.Optimizer] = []
    for v in (*cv.nonlocals.values(), *cv.globals.values()):
        if isinstance(v, torch.nn.Module) and all(v is not m for m in mods):
            mods.append(v)
        elif isinstance(v, torch.optim.Optimizer) and all(v is not o for o in opts):
            opts.append(v)
    return mods, opts


def _hashable(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, str(v.device), v.requires_grad)
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _hashable(x)) for k, x in sorted(v.items(), key=lambda kv: str(kv[0])))
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


class _Step:
    """The compiled step: one traced graph (a `CompiledGraph`) per signature."""

    def __init__(self, fn, modules, optimizers, options):
        self.fn = fn
        self.modules = modules
        self.optimizers = optimizers
        self.options = dict(options or {})
        self.graphs: dict = {}
        self.traces = 0   # graphs traced in this process
        self.loads = 0    # graphs rebuilt from the cache directory instead
        functools.update_wrapper(self, fn)

    # -- the inputs of one call ----------------------------------------------

    def _state(self):
        params, seen = [], set()
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        for o in self.optimizers:
            for g in o.param_groups:
                for p in g["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        buffers, bseen = [], set()
        for m in self.modules:
            for b in m.buffers():
                if id(b) not in bseen:
                    bseen.add(id(b))
                    buffers.append(b)
        states = []  # (optimizer index, param, key, tensor)
        for oi, o in enumerate(self.optimizers):
            for g in o.param_groups:
                for p in g["params"]:
                    st = o.state.get(p)
                    if not st:
                        continue
                    for k, v in st.items():
                        if isinstance(v, torch.Tensor):
                            if v.device != p.device and v.dim() == 0 and p.device.type == "tpu":
                                # A step count kept on the host by an eager
                                # step: capturable optimizers keep it with
                                # the parameter, as the traced step does.
                                v = st[k] = v.to(p.device)
                            states.append((oi, p, k, v))
        return params, buffers, states

    def _key(self, params, buffers, states, flat_args, spec):
        hyper = []
        for o in self.optimizers:
            # A tensor hyperparameter (a tensor lr) is a constant of the
            # trace: its value is part of the key, as a number's is.
            hyper.append(tuple(_hashable({k: (tuple(v.detach().flatten().tolist())
                                              if isinstance(v, torch.Tensor) else v)
                                          for k, v in g.items() if k != "params"})
                               for g in o.param_groups))
            # By position, not id(p): the key is also the store key of a
            # new process (torch_tpu.compile.persist.steps).
            pos = {id(p): i for i, p in enumerate(params)}
            hyper.append(tuple((pos.get(id(p), -1),
                                _hashable({k: v for k, v in o.state[p].items()}))
                               for g in o.param_groups for p in g["params"] if p in o.state))
        return (tuple(_hashable(p) for p in params),
                tuple(p.grad is not None and _hashable(p.grad) for p in params),
                tuple(_hashable(b) for b in buffers),
                tuple(m.training for m in self.modules for m in m.modules()),
                tuple(hyper), tuple(_hashable(a) for a in flat_args), str(spec),
                torch.is_grad_enabled())

    # -- tracing -------------------------------------------------------------

    def _trace(self, params, buffers, states, flat_args, spec):
        from torch.fx.experimental.proxy_tensor import make_fx

        grads = [p for p in params if p.grad is not None]
        arg_pos = [i for i, a in enumerate(flat_args) if isinstance(a, torch.Tensor)]
        n_p, n_g, n_b, n_s = len(params), len(grads), len(buffers), len(states)
        layout: dict[str, Any] = {}  # "out": (count, treespec); "new_states": their keys

        def step(*flat):
            tp = list(flat[:n_p])
            tg = flat[n_p:n_p + n_g]
            tb = flat[n_p + n_g:n_p + n_g + n_b]
            ts = flat[n_p + n_g + n_b:n_p + n_g + n_b + n_s]
            tu = flat[n_p + n_g + n_b + n_s:]
            traced = {}
            for p, t in zip(params, tp):
                if t.requires_grad != p.requires_grad:
                    t.requires_grad_(p.requires_grad)
                traced[id(p)] = t
            gi = iter(tg)
            for p, t in zip(params, tp):
                if p.grad is not None:
                    t.grad = next(gi)
            bmap = {id(b): t for b, t in zip(buffers, tb)}
            args = list(flat_args)
            for i, t in zip(arg_pos, tu):
                args[i] = t
            a, kw = pytree.tree_unflatten(args, spec)
            with contextlib.ExitStack() as stack:
                for m in self.modules:
                    sub = {n: traced[id(v)] for n, v in m.named_parameters(remove_duplicate=False)}
                    sub.update({n: bmap[id(v)]
                                for n, v in m.named_buffers(remove_duplicate=False)})
                    stack.enter_context(torch_api.reparametrize_module(m, sub, tie_weights=True))
                new_states = []
                for oi, o in enumerate(self.optimizers):
                    stack.enter_context(_swap_optimizer(o, traced, [
                        (p, k, t) for (soi, p, k, _), t in zip(states, ts) if soi == oi]))
                out = self.fn(*a, **kw)
                outs, out_spec = pytree.tree_flatten(out)
                layout["out"] = (len(outs), out_spec)
                for oi, o in enumerate(self.optimizers):
                    for g in o.param_groups:
                        for t in g["params"]:
                            for k, v in o.state.get(t, {}).items():
                                if isinstance(v, torch.Tensor) and not any(
                                        v is s for s in ts):
                                    new_states.append(((oi, _real_of(t, params, tp), k), v))
                layout["new_states"] = [k for k, _ in new_states]
                grads_out = [t.grad for t in tp]
            return (*outs, *grads_out, *[v for _, v in new_states])

        real = [*params, *(p.grad for p in grads), *buffers, *(s[3] for s in states),
                *(flat_args[i] for i in arg_pos)]
        t0 = time.perf_counter()
        with compat_flags.compiling(), torch.enable_grad():
            # Autograd runs in the first trace (functorch transforms refuse
            # requires_grad_ on their inputs); the second one functionalizes
            # the resulting aten graph: in-place updates become copy_ into
            # the inputs they overwrite.
            try:
                gm = make_fx(step, tracing_mode="fake", decomposition_table=_first_pass_table(),
                             _allow_non_fake_inputs=True)(*real)
            except Exception as e:
                e.add_note(f"torch_tpu.compile_step: tracing {getattr(self.fn, '__qualname__', 'the step')} "
                           "with fake tensors failed (.item(), printing a tensor's value or "
                           "Python control flow on tensor values cannot be traced); "
                           "torch.compile(step, backend='tpu') handles those")
                raise
        _check_no_parameter_constants(gm)
        _drop_profiler_ops(gm)
        with torch.no_grad():
            gm = make_fx(torch.func.functionalize(gm, remove="mutations"),
                         tracing_mode="fake", decomposition_table=backend.decompositions(),
                         _allow_non_fake_inputs=True)(*real)
        _check_functional(gm)
        self.traces += 1
        graph_cache.record(backend_seconds=time.perf_counter() - t0)
        graph = CompiledGraph(gm, real, "step", self.options)
        return graph, layout, arg_pos, len(grads)

    def _load_or_trace(self, params, buffers, states, flat_args, spec, key):
        """A new signature: the graph a previous process traced (found in the
        cache directory under a key covering the code the trace runs, see
        torch_tpu.compile.persist.steps), else a trace, remembered for the next one."""
        skey = None
        if steps.enabled():
            real = [*params, *(p.grad for p in params if p.grad is not None), *buffers,
                    *(s[3] for s in states), *flat_args]
            try:
                skey = steps.step_key(self.fn, self.modules, self.optimizers, self.options,
                                      real, key)
            except Exception:  # Unkeyable, or an object that fails to describe itself
                steps.count_unkeyed()
            if skey is not None:
                t0 = time.perf_counter()
                found = steps.load(skey)
                if found is not None:
                    gm, layout, arg_pos, n_grads = found
                    examples = [n.meta.get("val") for n in gm.graph.nodes
                                if n.op == "placeholder"]
                    try:
                        graph = CompiledGraph(gm, examples, "step", self.options)
                    except Exception as e:  # a graph this version cannot run: trace
                        steps.reject(skey, e, undo_hit=True)
                    else:
                        self.loads += 1
                        graph_cache.record(backend_seconds=time.perf_counter() - t0)
                        return graph, layout, arg_pos, n_grads
        entry = self._trace(params, buffers, states, flat_args, spec)
        if skey is not None:
            graph, layout, arg_pos, n_grads = entry
            steps.remember(skey, graph.gm, layout, arg_pos, n_grads)
        return entry

    # -- calls ---------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        params, buffers, states = self._state()
        flat_args, spec = pytree.tree_flatten((args, kwargs))
        key = self._key(params, buffers, states, flat_args, spec)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._load_or_trace(params, buffers, states,
                                                           flat_args, spec, key)
        graph, layout, arg_pos, _ = entry
        inputs = [*params, *(p.grad for p in params if p.grad is not None), *buffers,
                  *(s[3] for s in states), *(flat_args[i] for i in arg_pos)]
        with torch.no_grad():
            results = graph(inputs)
        n_out, out_spec = layout["out"]
        user = results[:n_out]
        grads = results[n_out:n_out + len(params)]
        new = results[n_out + len(params):]
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.grad = g
            for (oi, pi, k), v in zip(layout["new_states"], new):
                self.optimizers[oi].state[params[pi]][k] = v
        return pytree.tree_unflatten(list(user), out_spec)


def _drop_profiler_ops(gm: torch.fx.GraphModule) -> None:
    """Remove record_function markers (Optimizer.step's profiler hooks):
    the program as a whole is what a profile sees."""
    for n in reversed(list(gm.graph.nodes)):
        t = n.target
        if n.op == "call_function" and getattr(t, "namespace", None) == "profiler":
            for u in list(n.users):
                gm.graph.erase_node(u)
            gm.graph.erase_node(n)
    gm.recompile()


def _check_no_parameter_constants(gm: torch.fx.GraphModule) -> None:
    """A parameter the step used but compile_step was not given (a module it
    reaches through `self`, say) would be baked in as a constant."""
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = getattr(gm, n.target, None)
            if isinstance(v, torch.Tensor) and (isinstance(v, torch.nn.Parameter)
                                                or v.requires_grad):
                for m in gm.graph.nodes:  # traced values the backward left in .grad
                    c = getattr(gm, m.target, None) if m.op == "get_attr" else None
                    if isinstance(c, torch.Tensor) and isinstance(c.grad, torch_api.FakeTensor):
                        c.grad = None
                raise ValueError(
                    "torch_tpu.compile_step: the step uses a parameter of a module it was "
                    "not given (found neither in the function's closure nor its globals); "
                    "pass modules=... and optimizers=...")


def _first_pass_table():
    """Decompositions for the autograd trace: `native_batch_norm` updates the
    running statistics without saying so in its schema, which
    functionalization then cannot see; its decomposition writes them with
    copy_, which it can."""
    aten = torch.ops.aten
    return {aten.native_batch_norm.default: torch_api.decomposition_table[aten.native_batch_norm.default]}


def _check_functional(gm: torch.fx.GraphModule) -> None:
    """Only copy_ into inputs may mutate: another in-place op left in the graph
    (one functionalization has no functional form for) would be lost."""
    for n in gm.graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
            continue
        if t is torch.ops.aten.copy_.default:
            continue
        hidden = (t is torch.ops.aten.native_batch_norm.default and n.args[5]
                  and n.args[3] is not None)
        if hidden or any(a.alias_info is not None and a.alias_info.is_write
                         for a in t._schema.arguments):
            raise NotImplementedError(
                f"torch_tpu.compile_step: {t} mutates its inputs and has no functional "
                "form here; run this step with torch.compile instead")


def _real_of(t, params, traced):
    for i, x in enumerate(traced):
        if x is t:
            return i
    raise RuntimeError("compile_step: the optimizer created state for a tensor that is "
                       "not one of the step's parameters")


@contextlib.contextmanager
def _swap_optimizer(opt, traced, states):
    """Point `opt` at the traced parameters and state while the step is traced."""
    groups = [g["params"] for g in opt.param_groups]
    saved = {i: {k: g[k] for k in ("capturable",) if k in g}
             for i, g in enumerate(opt.param_groups)}
    old_state = opt.state
    new_state: defaultdict = defaultdict(dict)
    by_param: dict[int, dict[Any, Any]] = {}  # id of a parameter -> its traced state
    for p, k, t in states:
        by_param.setdefault(id(p), {})[k] = t
    for g in opt.param_groups:
        for p in g["params"]:
            if p in old_state:
                entry = dict(old_state[p])
                entry.update(by_param.get(id(p), {}))
                new_state[traced[id(p)]] = entry
    try:
        for g in opt.param_groups:
            g["params"] = [traced[id(p)] for p in g["params"]]
            if "capturable" in g:
                # Tensor step counts and bias corrections on the device, in
                # the graph (what dynamo sets for a compiled optimizer).
                g["capturable"] = True
        opt.state = new_state
        yield
    finally:
        for g, ps in zip(opt.param_groups, groups):
            g["params"] = ps
        for i, g in enumerate(opt.param_groups):
            g.update(saved[i])
        opt.state = old_state


def compile_step(fn: Callable | None = None, *,
                 modules: torch.nn.Module | Iterable[torch.nn.Module] | None = None,
                 optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
                 options: dict | None = None) -> Any:
    """Compile a training step (forward, ``backward()``, ``optimizer.step()``)
    into one XLA program whose parameters and optimizer state are donated.

    ``fn(*args, **kwargs)`` is the user's step; ``modules`` and
    ``optimizers`` (a module/optimizer or a list) default to those ``fn``
    refers to through its closure and globals. Use as ``step =
    compile_step(fn)`` or as a decorator (``@compile_step`` or
    ``@compile_step(modules=model, optimizers=opt)``). ``options`` are the
    ``torch.compile(backend="tpu")`` options (e.g. ``opt_level``).
    See the module docstring for what a trace assumes.
    """
    def wrap(f):
        mods = _as_list(modules, torch.nn.Module)
        opts = _as_list(optimizers, torch.optim.Optimizer)
        if modules is None or optimizers is None:
            dm, do = _discover(f)
            if modules is None:
                mods = dm
            if optimizers is None:
                opts = do
            if optimizers is None and mods and not opts:
                import warnings

                warnings.warn(
                    f"torch_tpu.compile_step: no optimizer in the closure or globals of "
                    f"{getattr(f, '__qualname__', f)!r}: an optimizer the step reaches "
                    "otherwise (through `self`, say) does not update the traced "
                    "parameters; pass optimizers=... (optimizers=[] for none)", stacklevel=3)
            if not mods and not opts:
                # Tracing would bake the parameters in as constants (and
                # leave traced values in their .grad): refuse up front.
                raise ValueError(
                    f"torch_tpu.compile_step: found no module or optimizer in the closure or "
                    f"globals of {getattr(f, '__qualname__', f)!r} (one reached through "
                    "`self`, say); pass modules=... and optimizers=...")
        loading.load()
        return _Step(f, mods, opts, options)

    if fn is None:
        return wrap
    return wrap(fn)
