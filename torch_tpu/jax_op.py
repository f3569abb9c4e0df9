"""Custom PyTorch ops from JAX functions (a Pallas kernel on a TPU, or any jnp code).

    @torch_tpu.jax_op
    def gelu_tanh(x):                       # JAX arrays in, JAX arrays out
        return jax.nn.gelu(x, approximate=True)

    y = gelu_tanh(torch.randn(8, device="tpu", requires_grad=True))
    y.sum().backward()                      # gradient from jax.vjp

`jax_op(fn)` defines a real PyTorch operator (`torch.ops.torch_tpu_jax.<name>`,
schema `(Tensor[] args) -> Tensor[]`) and returns a callable taking tensors
positionally and returning the tensors in the structure `fn` returns (one
tensor, a tuple, a dict...). The operator:

- runs on `tpu` tensors in eager mode as one cached, compiled executable
  through the executor (a lowering registered in the lowering table), so it
  shows in metrics, the compile log and the profiler like any ATen op;
- works under `torch.compile(backend="tpu")`: dynamo sees an opaque op with a
  fake (shape) implementation from `jax.eval_shape`, and the backend lowers
  it inside the graph's program through the same lowering table entry;
- has a backward computed with `jax.vjp` (itself an operator, `<name>_bwd`,
  so it compiles too) unless `vjp=False`;
- also runs on CPU tensors (through JAX on the host), handy for checks.

Non-tensor configuration goes in with `functools.partial` before wrapping:
each distinct function is a distinct operator. The function must be pure and
traceable by `jax.jit` (static shapes).
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import torch
from .runtime.storage import JAX_TO_TORCH
from .runtime.storage import TORCH_TO_JAX
from .runtime import registry  # (ops.registry re-exports it: the op layer is not imported)
from .runtime import executor
from .runtime import storage as st

NAMESPACE = "torch_tpu_jax"
_lib = None
_lock = threading.Lock()
_names = set()
_counter = itertools.count()


def _library():
    global _lib
    if _lib is None:
        _lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    return _lib


def _op_name(fn, name):
    base = name or getattr(fn, "__name__", None) or type(fn).__name__
    if isinstance(fn, functools.partial) and name is None:
        base = getattr(fn.func, "__name__", "partial")
    base = re.sub(r"[^A-Za-z0-9_]", "_", base).strip("_") or "op"
    if base[0].isdigit():
        base = "op_" + base
    with _lock:
        cand = base
        while cand in _names or hasattr(getattr(torch.ops, NAMESPACE), cand):
            cand = f"{base}_{next(_counter)}"
        _names.add(cand)
    return cand


def _torch_dtype(jdt):
    return JAX_TO_TORCH[np.dtype(jdt)]


def _spec(t):
    return jax.ShapeDtypeStruct(tuple(t.shape), TORCH_TO_JAX[t.dtype])


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class JaxOp:
    """A JAX function registered as a PyTorch operator (see module docstring)."""

    def __init__(self, fn, name=None, vjp=True):
        if not callable(fn):
            raise TypeError(f"jax_op() takes a JAX function, got {type(fn).__name__}")
        self.fn = fn
        self.name = _op_name(fn, name)
        self.vjp = vjp
        self._trees = {}
        functools.update_wrapper(self, fn, updated=())
        self._define()
        _OPS[self.name] = self

    # -- the JAX side ---------------------------------------------------------

    def _flat_fn(self, *arrays):
        return jax.tree_util.tree_leaves(self.fn(*arrays))

    def _out_tree(self, key):
        """The output pytree structure of fn for inputs (shape, dtype name) `key`."""
        tree = self._trees.get(key)
        if tree is None:
            specs = [jax.ShapeDtypeStruct(shape, TORCH_TO_JAX[getattr(torch, d.split(".")[-1])])
                     for shape, d in key]
            out = jax.eval_shape(self.fn, *specs)
            tree = self._trees[key] = jax.tree_util.tree_structure(out)
        return tree

    def _bwd_arrays(self, args, grads):
        primals, pullback = jax.vjp(self._flat_fn, *args)
        cts = []
        for p, g in zip(primals, grads):
            if _is_float(p.dtype):
                cts.append(jnp.asarray(g).astype(p.dtype).reshape(p.shape))
            else:
                cts.append(np.zeros(p.shape, jax.dtypes.float0))
        in_cts = pullback(cts)
        out = []
        for a, c in zip(args, in_cts):
            if getattr(c, "dtype", None) == jax.dtypes.float0:
                out.append(jnp.zeros(a.shape, a.dtype))
            else:
                out.append(c)
        return out

    # -- the PyTorch side -----------------------------------------------------

    def _define(self):

        lib = _library()
        name = self.name
        lib.define(f"{name}(Tensor[] args) -> Tensor[]")
        lib.define(f"{name}_bwd(Tensor[] args, Tensor[] grads) -> Tensor[]")
        packet = getattr(torch.ops, NAMESPACE)
        self.op = getattr(packet, name).default
        self.bwd_op = getattr(packet, f"{name}_bwd").default

        registry.lower(self.op)(lambda args: self._flat_fn(*args))
        registry.lower(self.bwd_op)(lambda args, grads: self._bwd_arrays(args, grads))
        lib.impl(name, executor.runner_for(self.op).__call__, "PrivateUse1")
        lib.impl(f"{name}_bwd", executor.runner_for(self.bwd_op).__call__, "PrivateUse1")
        lib.impl(name, self._cpu_fwd, "CPU")
        lib.impl(f"{name}_bwd", self._cpu_bwd, "CPU")

        qual = f"{NAMESPACE}::{name}"
        torch.library.register_fake(qual, self._fake_fwd, lib=lib)
        torch.library.register_fake(f"{qual}_bwd", self._fake_bwd, lib=lib)
        if self.vjp:
            torch.library.register_autograd(qual, self._backward,
                                            setup_context=self._setup_context, lib=lib)

    def _fake_fwd(self, args):
        if not args:
            raise ValueError(f"{self.name}: a jax_op needs at least one tensor argument")
        out = jax.eval_shape(self._flat_fn, *[_spec(t) for t in args])
        dev = args[0].device
        return [torch.empty(o.shape, dtype=_torch_dtype(o.dtype), device=dev) for o in out]

    def _fake_bwd(self, args, grads):
        return [torch.empty_like(a) for a in args]

    @staticmethod
    def _setup_context(ctx, inputs, output):
        (args,) = inputs
        ctx.save_for_backward(*args)

    def _backward(self, ctx, grads):
        args = list(ctx.saved_tensors)
        outs = self._fake_shapes(args)
        gl = []
        for g, (shape, dtype) in zip(grads, outs):
            if g is None:
                g = torch.zeros(shape, dtype=dtype, device=args[0].device)
            gl.append(g)
        in_grads = self.bwd_op(args, gl)
        return ([g if a.is_floating_point() or a.is_complex() else None
                 for a, g in zip(args, in_grads)],)

    def _fake_shapes(self, args):
        out = jax.eval_shape(self._flat_fn, *[_spec(t) for t in args])
        return [(tuple(o.shape), _torch_dtype(o.dtype)) for o in out]

    # CPU: the same function through JAX on the host.

    def _cpu_run(self, f, *groups):
        cpu = jax.devices("cpu")[0]
        arrays = [[jax.device_put(_host_numpy(t), cpu) for t in g] for g in groups]
        with jax.default_device(cpu):
            outs = f(*arrays)
        return [st.host_tensor(np.asarray(o), _torch_dtype(o.dtype)) for o in outs]

    def _cpu_fwd(self, args):
        return self._cpu_run(lambda a: jax.jit(self._flat_fn)(*a), args)

    def _cpu_bwd(self, args, grads):
        return self._cpu_run(lambda a, g: jax.jit(self._bwd_arrays)(a, g), args, grads)

    # -- calling ----------------------------------------------------------------

    # torch_tpu is a dynamo skip directory (its kernels run between graphs);
    # this method is the exception: dynamo traces it and records the op.
    @torch._dynamo.dont_skip_tracing
    def __call__(self, *tensors):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"{self.name}: argument {i} is a {type(t).__name__}; a jax_op takes "
                    "tensors only (bind other values with functools.partial)")
        outs = self.op(list(tensors))
        key = tuple((tuple(int(s) for s in t.shape), str(t.dtype)) for t in tensors)
        kind = _structure(self.name, key)
        # Plain Python on a constant description, so that dynamo traces through it.
        if kind[0] == "single":
            return outs[0]
        if kind[0] == "tuple":
            return tuple(outs)
        if kind[0] == "list":
            return list(outs)
        if kind[0] == "dict":
            return {k: outs[i] for i, k in enumerate(kind[1])}
        return _unflatten(self.name, key, list(outs))

    def __repr__(self):
        return f"<jax_op {NAMESPACE}::{self.name} of {getattr(self.fn, '__name__', self.fn)!r}>"


_OPS: dict = {}


@torch.compiler.assume_constant_result
def _structure(name, key):
    """How to rebuild fn's output from the op's list: ('single',), ('tuple',),
    ('list',), ('dict', keys) or ('tree',) (anything else)."""
    tree = _OPS[name]._out_tree(key)
    leaf = jax.tree_util.tree_structure(0)
    n = tree.num_leaves
    children = tree.children()
    if tree == leaf:
        return ("single",)
    if all(c == leaf for c in children) and len(children) == n:
        probe = jax.tree_util.tree_unflatten(tree, list(range(n)))
        if type(probe) is tuple:
            return ("tuple",)
        if type(probe) is list:
            return ("list",)
        if type(probe) is dict and all(isinstance(k, str) for k in probe):
            keys = tuple(probe)
            if [probe[k] for k in keys] == list(range(n)):
                return ("dict", keys)
    return ("tree",)


@torch.compiler.disable
def _unflatten(name, key, outs):
    return jax.tree_util.tree_unflatten(_OPS[name]._out_tree(key), outs)


def _host_numpy(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy()


def jax_op(fn=None, *, name: str | None = None, vjp: bool = True):
    """Wrap the JAX function `fn` as a PyTorch operator (usable as a decorator).

    name: the operator's name in `torch.ops.torch_tpu_jax` (default: fn's
    name, made unique). vjp: register a backward computed with `jax.vjp`.
    """
    if fn is None:
        return lambda f: JaxOp(f, name=name, vjp=vjp)
    return JaxOp(fn, name=name, vjp=vjp)


class _CallableModule(types.ModuleType):
    def __call__(self, fn=None, *, name=None, vjp=True):
        return jax_op(fn, name=name, vjp=vjp)


sys.modules[__name__].__class__ = _CallableModule
