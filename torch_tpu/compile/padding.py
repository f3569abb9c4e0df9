"""Bucketed shapes: run a symbolic graph at a padded size, masking the padding.

When a size changes between calls, dynamo re-captures the graph with that
size as a symbol `s` (or the user marks it dynamic). XLA needs static
shapes, so compiling every new value of `s` would compile forever. Instead
each symbol is rounded up to a *bucket* `b >= s` (powers of two by
default), the inputs are padded to the bucket (edge padding: padded rows
repeat real ones, so they stay finite), and the graph runs at size `b` with
the true size `v` as a runtime input. One executable serves every `v` in
the bucket.

Padding is invisible only if padded positions never leak into real ones.
`PadHook` tracks, for every value of the trace, which dimensions carry
padding (`spec`: per dimension, the factors a padded dimension is made of,
so reshapes that merge batch and sequence dims stay exact), and rewrites the
ops that mix positions along a padded dimension:

- pointwise ops, views, layer norm over unpadded dims: nothing to do;
- reductions (sum, mean, var, amax, softmax, logsumexp, ...) over a padded
  dim: padded entries are replaced by the reduction's identity and means
  divide by the true count;
- matmuls contracting a padded dim: padded entries are zeroed first;
- losses (nll_loss): padded targets become `ignore_index`;
- embedding backward: padded rows of the gradient are zeroed.

Any other op that touches a padded dimension, a slice that cuts one, or a
size used as a number (`x / x.shape[1]`) makes the trace raise `PadUnsafe`,
and that graph falls back to exact shapes (see dynamic.py).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.fx
from jax import lax

from ..ops.opmath import opmath_dtype
from ..runtime import keys, programs
from ..runtime import storage as st
from ..runtime.registry import PADDING_RULES, padding_rule

aten = torch.ops.aten

# The padding rules: the `padding` field of the op table (runtime/registry.py),
# filled by @padding_rule(op, ...) below. A rule is
# `rule(hook, n, op, args, kwargs, call) -> (value, spec)`; an op with none runs
# padded only if it is pointwise (_pointwise), else raises PadUnsafe.
RULES = PADDING_RULES


class PadUnsafe(Exception):
    """The graph cannot run padded without changing its results."""


# A spec is None (no padded dim) or a tuple with one entry per dimension:
# None (not padded) or a tuple of factors (size, symbol-or-None), outermost
# first, whose product is the dimension's (padded) size.
Factor = tuple[int, Any]          # (size, sympy symbol or None)
DimSpec = tuple[Factor, ...] | None
Spec = tuple[DimSpec, ...] | None


def _masked(dim: DimSpec) -> bool:
    return dim is not None and any(sym is not None for _, sym in dim)


def spec_masked(spec: Spec) -> bool:
    """Whether a padding spec has a masked (padded) dimension; compile.dynamic
    asks it of the specs of a graph's inputs and outputs."""
    return spec is not None and any(_masked(d) for d in spec)


def _norm(spec):
    if spec is None:
        return None
    spec = tuple(d if _masked(d) else None for d in spec)
    return spec if any(d is not None for d in spec) else None


def _full(spec, rank):
    return spec if spec is not None else (None,) * rank


# Pad-spec of storages produced padded (saved activations with merged dims):
# DeviceData -> (spec, padded shape). Weak: it dies with the storage.
SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _is_sym(x):
    return isinstance(x, torch.SymInt)


def dim_spec(size, buckets, exact=None):
    """The spec of one dimension of symbolic size `size`.

    `buckets` maps the padded symbols to their bucket; `exact` the other
    symbols to their values. A dim that is one padded symbol is padded; a dim
    that mixes a padded symbol with anything else cannot be described.
    """
    if not _is_sym(size):
        return None
    expr = size.node.expr
    if exact:
        expr = expr.xreplace(exact)
    free: set[Any] = getattr(expr, "free_symbols", set())
    if not free & set(buckets):
        return None
    if getattr(expr, "is_Symbol", False):
        return ((buckets[expr], expr),)
    raise PadUnsafe(f"a dimension of size {expr} mixes a padded size with others")


def meta_spec(val, buckets, exact=None):
    if not isinstance(val, torch.Tensor):
        return None
    return _norm(tuple(dim_spec(s, buckets, exact) for s in val.shape))


_POINTWISE_EXTRA = {
    aten.native_dropout.default, aten._to_copy.default, aten.clone.default,
    aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
    aten.lift_fresh.default, aten.contiguous.default, aten.tril.default,
    aten.triu.default, aten.fill.Scalar, aten.fill.Tensor, aten.zeros_like.default,
    aten.ones_like.default, aten.full_like.default, aten.empty_like.default,
    aten.rand_like.default, aten.randn_like.default, aten.bernoulli.p,
    aten.bernoulli.default, aten.copy.default, aten.where.self,
    aten.masked_fill.Scalar, aten.masked_fill.Tensor,
}

# Argument types that may carry a (padded) size: the value seen while tracing
# is the bucket, which is what a size must be in the padded program.
_SIZE_ARG_OPS = {aten.arange.default, aten.arange.start, aten.arange.start_step}


class PadHook:
    """Watches a trace of `program` at bucket sizes and keeps padding out of results."""

    def __init__(self, program: Any, buckets: dict, true_sizes: Any, sym_index: dict,
                 exact: dict | None = None):
        self.program = program
        self.buckets = buckets          # symbol -> bucket size
        self.exact = exact or {}        # symbol -> value, for the symbols not padded
        self.true_sizes = true_sizes    # traced int32[n]: the real sizes
        self.sym_index = sym_index      # symbol -> position in true_sizes
        self.specs: dict[Any, Any] = {}   # node -> spec (or tuple of specs)
        self.values: dict[Any, Any] = {}  # node -> traced value
        self.tainted: set[Any] = set()    # nodes holding python ints derived from padded sizes

    # -- masks ------------------------------------------------------------

    def _true(self, sym):
        return self.true_sizes[self.sym_index[sym]]

    def mask(self, spec, shape):
        """bool array (broadcastable to `shape`) of the real positions, or None."""
        if not spec_masked(spec):
            return None
        result = None
        rank = len(shape)
        for d, dim in enumerate(spec):
            if not _masked(dim):
                continue
            size = shape[d]
            idx = lax.iota(jnp.int32, size)
            valid = None
            inner = size
            for fsize, sym in dim:
                inner //= fsize
                if sym is not None:
                    digit = (idx // inner) % fsize
                    ok = digit < self._true(sym)
                    valid = ok if valid is None else valid & ok
            shape_d = [1] * rank
            shape_d[d] = size
            assert valid is not None  # a masked dim has a factor with a symbol
            valid = valid.reshape(shape_d)
            result = valid if result is None else result & valid
        return result

    def sanitize(self, x, spec, fill):
        m = self.mask(spec, x.shape)
        if m is None:
            return x
        return jnp.where(m, x, jnp.asarray(fill, x.dtype))

    def count(self, spec, shape, dims, keepdim):
        """Number of real elements reduced over `dims`."""
        m = self.mask(spec, shape)
        ones = jnp.broadcast_to(m if m is not None else True, shape).astype(jnp.int32)
        return jnp.sum(ones, axis=tuple(dims), keepdims=keepdim)

    # -- bookkeeping --------------------------------------------------------

    def set_input(self, node, value, spec):
        self.values[node] = value
        self.specs[node] = spec

    def spec_of(self, a):
        if isinstance(a, torch.fx.Node):
            return self.specs.get(a)
        return None

    def mutation(self, n):
        if spec_masked(self.specs.get(n.args[0])):
            raise PadUnsafe("an in-place update of a padded input")

    def node(self, n, args, kwargs, call):
        target = n.target
        if target is operator.getitem:
            value = call(args, kwargs)
            src = self.specs.get(n.args[0])
            multi = isinstance(n.args[0].meta.get("val"), (list, tuple))
            self.specs[n] = (src[n.args[1]] if src is not None else None) if multi else src
            self.values[n] = value
            return value
        if not isinstance(target, torch._ops.OpOverload):
            value = call(args, kwargs)
            if any(a in self.tainted for a in n.all_input_nodes):
                self.tainted.add(n)
            return value
        op = target
        if op is aten.sym_size.int:
            value = call(args, kwargs)
            spec = _full(self.specs.get(n.args[0]), len(args[0].shape))
            if _masked(spec[args[1]]):
                self.tainted.add(n)
            return value
        self._check_sizes(n, op)
        in_nodes = [a for a in n.all_input_nodes if a not in self.tainted]
        masked = any(spec_masked(self.specs.get(a)) for a in in_nodes)
        if not masked:
            value = call(args, kwargs)
            self.specs[n] = self._meta_specs(n)
        else:
            rule = RULES.get(op)
            if rule is None:
                if torch.Tag.pointwise in op.tags or op in _POINTWISE_EXTRA:
                    rule = _pointwise
                else:
                    raise PadUnsafe(f"{op} on a padded dimension")
            value, spec = rule(self, n, op, args, kwargs, call)
            self.specs[n] = spec
        self.values[n] = value
        return value

    def _meta_specs(self, n):
        val = n.meta.get("val")
        if isinstance(val, (list, tuple)):
            return tuple(meta_spec(v, self.buckets, self.exact) for v in val)
        return meta_spec(val, self.buckets, self.exact)

    def _check_sizes(self, n, op):
        """A padded size may only be used as a size (shape argument)."""
        if op in _SIZE_ARG_OPS:
            return
        named = _bind_nodes(op, n.args, n.kwargs)
        for a in op._schema.arguments:
            v = named.get(a.name)
            nodes = _nodes_in(v)
            if any(x in self.tainted for x in nodes) and "int" not in str(a.type):
                raise PadUnsafe(f"{op} uses a padded size as a number ({a.name})")

    def output_specs(self):
        outs = self.program.output_node.args[0]
        if not isinstance(outs, (list, tuple)):
            outs = (outs,)
        return [self.specs.get(o) if isinstance(o, torch.fx.Node) else None for o in outs]


def _nodes_in(v):
    out = []
    torch.fx.node.map_arg(v, lambda x: out.append(x))
    return out


def _bind_nodes(op, args, kwargs):
    named = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            named[a.name] = args[i]
        elif a.name in kwargs:
            named[a.name] = kwargs[a.name]
    return named


# --------------------------------------------------------------------------
# rules: (hook, node, op, args, kwargs, call) -> (value, spec)


def _broadcast_spec(hook, n, tensor_nodes, out_shape):
    rank = len(out_shape)
    result = [None] * rank
    for a in tensor_nodes:
        spec = hook.specs.get(a)
        if not spec_masked(spec):
            continue
        shape = hook.values[a].shape
        r = len(shape)
        for i in range(r):
            j = rank - r + i
            if shape[i] != out_shape[j] or not _masked(spec[i]):
                continue
            if result[j] is not None and result[j] != spec[i]:
                raise PadUnsafe(f"{n.target}: operands padded differently")
            result[j] = spec[i]
    return _norm(tuple(result))


def _pointwise(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    first = value[0] if isinstance(value, (list, tuple)) else value
    tensors = [a for a in n.all_input_nodes if hasattr(hook.values.get(a), "shape")]
    spec = _broadcast_spec(hook, n, tensors, first.shape)
    if isinstance(value, (list, tuple)):
        return value, tuple(spec for _ in value)
    return value, spec


def _arg(n, op, name, default=None):
    named = _bind_nodes(op, n.args, n.kwargs)
    return named.get(name, default)


def _replace(op, args, kwargs, name, new):
    """args/kwargs with schema argument `name` replaced by `new`."""
    args = list(args)
    kwargs = dict(kwargs)
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            if i < len(args) and not a.kwarg_only:
                args[i] = new
            else:
                kwargs[name] = new
            return args, kwargs
    raise KeyError(name)


def _get(op, args, kwargs, name, default=None):
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            if i < len(args) and not a.kwarg_only:
                return args[i]
            if name in kwargs:
                return kwargs[name]
            return a.default_value if a.has_default_value() else default
    return default


# -- views --------------------------------------------------------------------


@padding_rule(aten.alias.default, aten.detach.default, aten.clone.default,
              aten.contiguous.default, aten.lift_fresh_copy.default)
def _same(hook, n, op, args, kwargs, call):
    return call(args, kwargs), hook.specs.get(n.args[0])


@padding_rule(aten.permute.default, aten.t.default, aten.transpose.int)
def _permute_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    if op is aten.permute.default:
        dims = [d % max(x.ndim, 1) for d in args[1]]
    elif op is aten.t.default:
        dims = [1, 0] if x.ndim == 2 else list(range(x.ndim))
    else:  # transpose.int
        d0, d1 = args[1] % x.ndim, args[2] % x.ndim
        dims = list(range(x.ndim))
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return value, _norm(tuple(spec[d] for d in dims))


@padding_rule(aten.unsqueeze.default)
def _unsqueeze_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = list(_full(hook.specs.get(n.args[0]), x.ndim))
    d = args[1] % (x.ndim + 1)
    spec.insert(d, None)
    return value, _norm(tuple(spec))


@padding_rule(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    if op in (aten.squeeze.default,):
        dims = [i for i in range(x.ndim) if x.shape[i] == 1]
    else:
        given = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        dims = [d % max(x.ndim, 1) for d in given]
        dims = [d for d in dims if x.shape[d] == 1]
    if any(_masked(spec[d]) for d in dims):
        raise PadUnsafe("squeezing a padded dimension")
    return value, _norm(tuple(s for i, s in enumerate(spec) if i not in dims))


@padding_rule(aten.expand.default)
def _expand_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    out_shape = value.shape
    val = n.meta.get("val")
    rank = len(out_shape)
    result = []
    for j in range(rank):
        i = j - (rank - x.ndim)
        if i >= 0 and x.shape[i] == out_shape[j]:
            result.append(spec[i])
        else:
            result.append(dim_spec(val.shape[j], hook.buckets, hook.exact))
    return value, _norm(tuple(result))


@padding_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
              aten._reshape_alias.default)
def _reshape_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    factors: list[Factor] = []
    for size, dim in zip(x.shape, spec):
        if size == 1:
            continue
        factors.extend(dim if dim is not None else [(size, None)])
    out: list[DimSpec] = []
    k = 0
    for size in value.shape:
        if size == 1:
            out.append(None)
            continue
        dim = []
        prod = 1
        while prod < size:
            if k >= len(factors):
                raise PadUnsafe("reshape of a padded value")
            fsize, sym = factors[k]
            need = size // prod
            if fsize <= need:
                if need % fsize and sym is not None:
                    raise PadUnsafe("reshape splits a padded dimension")
                dim.append((fsize, sym))
                prod *= fsize
                k += 1
            else:  # split this factor
                if sym is not None or fsize % need:
                    raise PadUnsafe("reshape splits a padded dimension")
                dim.append((need, None))
                prod *= need
                factors[k] = (fsize // need, None)
        if prod != size:
            raise PadUnsafe("reshape of a padded value")
        out.append(tuple(dim))
    return value, _norm(tuple(out))


@padding_rule(aten.slice.Tensor)
def _slice_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    d = _get(op, args, kwargs, "dim", 0) % x.ndim
    if _masked(spec[d]):
        start = _get(op, args, kwargs, "start")
        end = _get(op, args, kwargs, "end")
        step = _get(op, args, kwargs, "step", 1)
        start_node = _arg(n, op, "start")
        if start_node in hook.tainted if isinstance(start_node, torch.fx.Node) else False:
            raise PadUnsafe("slicing a padded dimension")
        if (start not in (None, 0)) or step != 1 or (end is not None and end < x.shape[d]):
            raise PadUnsafe("slicing a padded dimension")
    return value, _norm(spec)


@padding_rule(aten.select.int)
def _select_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    d = args[1] % x.ndim
    if _masked(spec[d]):
        raise PadUnsafe("indexing a padded dimension")
    return value, _norm(tuple(s for i, s in enumerate(spec) if i != d))


@padding_rule(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def _split_rule(hook, n, op, args, kwargs, call):
    value = call(args, kwargs)
    x = args[0]
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    d = _get(op, args, kwargs, "dim", 0) % x.ndim
    if _masked(spec[d]):
        raise PadUnsafe("splitting a padded dimension")
    if op is aten.unbind.int:
        spec = tuple(s for i, s in enumerate(spec) if i != d)
    return value, tuple(_norm(spec) for _ in value)


# -- reductions -----------------------------------------------------------------


def _reduce_dims(x, dims):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(x.ndim, 1) for d in dims}) if x.ndim else []


def _reduced_spec(spec, rank, dims, keepdim):
    spec = _full(spec, rank)
    if keepdim:
        return _norm(tuple(None if i in dims else s for i, s in enumerate(spec)))
    return _norm(tuple(s for i, s in enumerate(spec) if i not in dims))


def _identity(kind, dtype):
    if kind == "zero":
        return 0
    if kind == "one":
        return 1
    if dtype == jnp.bool_:
        return kind == "min"
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if kind == "max" else jnp.inf
    info = jnp.iinfo(dtype)
    return info.min if kind == "max" else info.max


def _make_reduce(kind, dim_arg="dim", keep_arg="keepdim", default_all=False):
    def rule(hook, n, op, args, kwargs, call):
        x = args[0]
        spec = hook.specs.get(n.args[0])
        dims = _reduce_dims(x, None if default_all else _get(op, args, kwargs, dim_arg))
        keepdim = bool(_get(op, args, kwargs, keep_arg, False)) if keep_arg else False
        full = _full(spec, x.ndim)
        if any(_masked(full[d]) for d in dims):
            args, kwargs = _replace(op, args, kwargs, "self",
                                    hook.sanitize(x, spec, _identity(kind, x.dtype)))
        value = call(args, kwargs)
        out = _reduced_spec(spec, x.ndim, dims, keepdim)
        if isinstance(value, (list, tuple)):
            return value, tuple(out for _ in value)
        return value, out

    return rule


@padding_rule(aten.mean.dim, aten.mean.default)
def _mean_rule(hook, n, op, args, kwargs, call):
    x = args[0]
    spec = hook.specs.get(n.args[0])
    default_all = op is aten.mean.default
    dims = _reduce_dims(x, None if default_all else _get(op, args, kwargs, "dim"))
    keepdim = False if default_all else bool(_get(op, args, kwargs, "keepdim", False))
    full = _full(spec, x.ndim)
    out_spec = _reduced_spec(spec, x.ndim, dims, keepdim)
    if not any(_masked(full[d]) for d in dims):
        return call(args, kwargs), out_spec
    out_dtype = st.TORCH_TO_JAX[n.meta["val"].dtype]
    acc = opmath_dtype(out_dtype)
    total = jnp.sum(hook.sanitize(x, spec, 0).astype(acc), axis=tuple(dims), keepdims=keepdim)
    count = hook.count(spec, x.shape, dims, keepdim)
    return (total / count.astype(acc)).astype(out_dtype), out_spec


@padding_rule(aten.var.correction, aten.std.correction, aten.var_mean.correction)
def _var_rule(hook, n, op, args, kwargs, call):
    x = args[0]
    spec = hook.specs.get(n.args[0])
    dims = _reduce_dims(x, _get(op, args, kwargs, "dim"))
    keepdim = bool(_get(op, args, kwargs, "keepdim", False))
    full = _full(spec, x.ndim)
    out_spec = _reduced_spec(spec, x.ndim, dims, keepdim)
    multi = op is aten.var_mean.correction
    if not any(_masked(full[d]) for d in dims):
        value = call(args, kwargs)
        return value, ((out_spec, out_spec) if multi else out_spec)
    correction = _get(op, args, kwargs, "correction")
    correction = 1 if correction is None else correction
    val = n.meta["val"]
    out_dtype = st.TORCH_TO_JAX[(val[0] if multi else val).dtype]
    acc = opmath_dtype(out_dtype)
    m = hook.mask(spec, x.shape)
    xs = jnp.where(m, x, 0).astype(acc)
    count = hook.count(spec, x.shape, dims, True).astype(acc)
    mean = jnp.sum(xs, axis=tuple(dims), keepdims=True) / count
    dev = jnp.where(m, xs - mean, 0)
    var = jnp.sum(dev * jnp.conj(dev), axis=tuple(dims), keepdims=True).real / jnp.maximum(
        count - correction, 0)
    if op is aten.std.correction:
        var = jnp.sqrt(var)
    if not keepdim:
        var = jnp.squeeze(var, axis=tuple(dims))
        mean = jnp.squeeze(mean, axis=tuple(dims))
    if multi:
        return (var.astype(out_dtype), mean.astype(out_dtype)), (out_spec, out_spec)
    return var.astype(out_dtype), out_spec


@padding_rule(aten._softmax.default, aten._log_softmax.default)
def _softmax_rule(hook, n, op, args, kwargs, call):
    x = args[0]
    spec = hook.specs.get(n.args[0])
    d = args[1] % x.ndim
    if _masked(_full(spec, x.ndim)[d]):
        low = jnp.finfo(x.dtype).min if jnp.issubdtype(x.dtype, jnp.floating) else 0
        args = [hook.sanitize(x, spec, low)] + list(args[1:])
    return call(args, kwargs), spec


@padding_rule(aten._softmax_backward_data.default,
              aten._log_softmax_backward_data.default)
def _softmax_backward_rule(hook, n, op, args, kwargs, call):
    g, y = args[0], args[1]
    d = args[2] % g.ndim
    gspec, yspec = hook.specs.get(n.args[0]), hook.specs.get(n.args[1])
    spec = _broadcast_spec(hook, n, [n.args[0], n.args[1]], g.shape)
    if _masked(_full(spec, g.ndim)[d]):
        g = hook.sanitize(g, gspec, 0)
        if op is aten._softmax_backward_data.default:
            y = hook.sanitize(y, yspec, 0)
        else:
            low = jnp.finfo(y.dtype).min if jnp.issubdtype(y.dtype, jnp.floating) else 0
            y = hook.sanitize(y, yspec, low)
        args = [g, y] + list(args[2:])
    return call(args, kwargs), spec


@padding_rule(aten.cumsum.default, aten.cumprod.default)
def _cumulative_rule(hook, n, op, args, kwargs, call):
    # A prefix scan: real positions only see earlier (real) positions.
    return call(args, kwargs), hook.specs.get(n.args[0])


# -- matmuls -----------------------------------------------------------------------


@padding_rule(aten.mm.default, aten.bmm.default, aten.addmm.default)
def _mm_rule(hook, n, op, args, kwargs, call):
    if op is aten.addmm.default:
        bias, a, b = args[0], args[1], args[2]
        an, bn = n.args[1], n.args[2]
    else:
        a, b = args[0], args[1]
        an, bn = n.args[0], n.args[1]
    sa = _full(hook.specs.get(an), a.ndim)
    sb = _full(hook.specs.get(bn), b.ndim)
    spec: tuple[DimSpec, ...]
    if a.ndim == 2:
        contract = _masked(sa[1]) or _masked(sb[0])
        spec = (sa[0], sb[1])
    else:  # bmm
        contract = _masked(sa[2]) or _masked(sb[1])
        if _masked(sa[0]) and _masked(sb[0]) and sa[0] != sb[0]:
            raise PadUnsafe("bmm of differently padded batches")
        spec = (sa[0] if _masked(sa[0]) else sb[0], sa[1], sb[2])
    if contract:
        a2 = hook.sanitize(a, hook.specs.get(an), 0)
        b2 = hook.sanitize(b, hook.specs.get(bn), 0)
        if op is aten.addmm.default:
            args = [bias, a2, b2] + list(args[3:])
        else:
            args = [a2, b2] + list(args[2:])
    value = call(args, kwargs)
    spec = _norm(spec)
    if op is aten.addmm.default and spec_masked(hook.specs.get(n.args[0])):
        bspec = _full(hook.specs.get(n.args[0]), bias.ndim)
        merged = list(_full(spec, 2))
        for i in range(bias.ndim):
            j = 2 - bias.ndim + i
            if _masked(bspec[i]) and bias.shape[i] == value.shape[j]:
                if merged[j] is not None and merged[j] != bspec[i]:
                    raise PadUnsafe("addmm operands padded differently")
                merged[j] = bspec[i]
        spec = _norm(tuple(merged))
    return value, spec


# -- normalization, embedding, losses ---------------------------------------------


@padding_rule(aten.native_layer_norm.default)
def _layer_norm_rule(hook, n, op, args, kwargs, call):
    x = args[0]
    k = len(args[1])
    spec = _full(hook.specs.get(n.args[0]), x.ndim)
    if any(_masked(d) for d in spec[x.ndim - k:]):
        raise PadUnsafe("layer norm over a padded dimension")
    stats = _norm(tuple(spec[: x.ndim - k]) + (None,) * k)
    return call(args, kwargs), (_norm(spec), stats, stats)


@padding_rule(aten.native_layer_norm_backward.default)
def _layer_norm_backward_rule(hook, n, op, args, kwargs, call):
    g, x = args[0], args[1]
    k = len(args[2])
    spec = _full(hook.specs.get(n.args[1]), x.ndim)
    gspec = hook.specs.get(n.args[0])
    if any(_masked(d) for d in spec[x.ndim - k:]):
        raise PadUnsafe("layer norm over a padded dimension")
    args = list(args)
    args[0] = hook.sanitize(g, gspec, 0)
    args[1] = hook.sanitize(x, hook.specs.get(n.args[1]), 0)
    args[3] = hook.sanitize(args[3], hook.specs.get(n.args[3]), 0)
    args[4] = hook.sanitize(args[4], hook.specs.get(n.args[4]), 1)
    value = call(args, kwargs)
    return value, (_norm(spec), None, None)


@padding_rule(aten.embedding.default)
def _embedding_rule(hook, n, op, args, kwargs, call):
    weight, idx = args[0], args[1]
    if spec_masked(hook.specs.get(n.args[0])):
        raise PadUnsafe("embedding of a padded table")
    ispec = hook.specs.get(n.args[1])
    args = [weight, hook.sanitize(idx, ispec, 0)] + list(args[2:])
    return call(args, kwargs), _norm(_full(ispec, idx.ndim) + (None,))


@padding_rule(aten.embedding_dense_backward.default)
def _embedding_backward_rule(hook, n, op, args, kwargs, call):
    g, idx = args[0], args[1]
    if _get(op, args, kwargs, "scale_grad_by_freq", False):
        raise PadUnsafe("embedding backward with scale_grad_by_freq on padded indices")
    ispec = hook.specs.get(n.args[1])
    gspec = _norm(_full(ispec, idx.ndim) + (None,)) if spec_masked(ispec) else \
        hook.specs.get(n.args[0])
    args = list(args)
    args[0] = hook.sanitize(g, gspec, 0)
    args[1] = hook.sanitize(idx, ispec, 0)
    return call(args, kwargs), None


@padding_rule(aten.nll_loss_forward.default, aten.nll_loss_backward.default)
def _nll_rule(hook, n, op, args, kwargs, call):
    forward = op is aten.nll_loss_forward.default
    xi, ti = (0, 1) if forward else (1, 2)
    x, target = args[xi], args[ti]
    xspec = _full(hook.specs.get(n.args[xi]), x.ndim)
    if x.ndim >= 2 and _masked(xspec[1]):
        raise PadUnsafe("nll_loss over padded classes")
    tspec = hook.specs.get(n.args[ti])
    if not spec_masked(tspec) and x.ndim >= 1 and _masked(xspec[0]):
        tspec = _norm((xspec[0],) + tuple(xspec[2:]))
    ignore = _get(op, args, kwargs, "ignore_index", -100)
    reduction = _get(op, args, kwargs, "reduction", 1)
    args = list(args)
    args[ti] = hook.sanitize(target, tspec, ignore)
    if not forward and reduction == 0:
        args[0] = hook.sanitize(args[0], hook.specs.get(n.args[0]), 0)
    value = call(args, kwargs)
    if forward:
        return value, ((tspec if reduction == 0 else None), None)
    return value, _norm(xspec)


@padding_rule(aten.cat.default)
def _cat_rule(hook, n, op, args, kwargs, call):
    tensors = args[0]
    nodes = n.args[0]
    value = call(args, kwargs)
    d = _get(op, args, kwargs, "dim", 0) % value.ndim
    merged = [None] * value.ndim
    for node, x in zip(nodes, tensors):
        if x.ndim != value.ndim:  # legacy empty 1-D operands
            continue
        spec = _full(hook.specs.get(node), x.ndim)
        for i, dim in enumerate(spec):
            if not _masked(dim):
                continue
            if i == d:
                raise PadUnsafe("concatenating along a padded dimension")
            if merged[i] is not None and merged[i] != dim:
                raise PadUnsafe("cat of differently padded operands")
            merged[i] = dim
    return value, _norm(tuple(merged))


@padding_rule(aten.stack.default)
def _stack_rule(hook, n, op, args, kwargs, call):
    tensors = args[0]
    value = call(args, kwargs)
    d = _get(op, args, kwargs, "dim", 0) % value.ndim
    merged = None
    for node, x in zip(n.args[0], tensors):
        spec = _full(hook.specs.get(node), x.ndim)
        if merged is None:
            merged = list(spec)
        for i, dim in enumerate(spec):
            if _masked(dim) or _masked(merged[i]):
                if merged[i] != dim and _masked(merged[i]) and _masked(dim):
                    raise PadUnsafe("stack of differently padded operands")
                merged[i] = dim if _masked(dim) else merged[i]
    merged = list(merged or [])
    merged.insert(d, None)
    return value, _norm(tuple(merged))


# The reductions' rules, one per identity: made by _make_reduce.
padding_rule(aten.sum.dim_IntList, aten.nansum.default)(_make_reduce("zero"))
padding_rule(aten.sum.default)(_make_reduce("zero", keep_arg=None, default_all=True))
padding_rule(aten.prod.dim_int)(_make_reduce("one"))
padding_rule(aten.prod.default)(_make_reduce("one", keep_arg=None, default_all=True))
padding_rule(aten.amax.default, aten.max.dim, aten.argmax.default,
             aten.logsumexp.default)(_make_reduce("max"))
padding_rule(aten.amin.default, aten.min.dim, aten.argmin.default)(_make_reduce("min"))
padding_rule(aten.any.dim, aten.any.dims)(_make_reduce("min"))
padding_rule(aten.all.dim, aten.all.dims)(_make_reduce("max"))


# --------------------------------------------------------------------------
# bucket sizes and the small programs that pad inputs


def next_bucket(v: int, buckets: Sequence[int] | None = None) -> int:
    """The bucket for size `v`: the first listed bucket >= v, else the next power of two."""
    if buckets:
        for b in buckets:
            if b >= v:
                return int(b)
        # Past the largest bucket: keep doubling it.
        b = int(buckets[-1])
        while b < v:
            b *= 2
        return b
    b = 8
    while b < v:
        b *= 2
    return b


def pad_to(arr, shape):
    """`arr` edge-padded at the end of each dimension up to `shape` (one cached program)."""
    if tuple(arr.shape) == tuple(shape):
        return arr
    key = keys.helper_key(programs.ProgramKind.PAD, tuple(arr.shape), str(arr.dtype),
                          tuple(shape))
    widths = [(0, t - s) for s, t in zip(arr.shape, shape)]
    mode = "edge" if all(s > 0 for s in arr.shape) else "constant"
    return programs.get_or_compile(key, lambda a: jnp.pad(a, widths, mode=mode), (arr,))(arr)


def unpad(arr: jax.Array, spec: Spec, true_sizes: dict) -> jax.Array:
    """The real part of padded array `arr` (spec: its padded dims' factors)."""
    key = keys.helper_key(programs.ProgramKind.UNPAD, tuple(arr.shape), str(arr.dtype),
                          _spec_str(spec), tuple(sorted((str(k), v) for k, v in true_sizes.items())))

    def program(a):
        spec_full = _full(spec, a.ndim)
        split_shape, limits, out_shape = [], [], []
        for size, dim in zip(a.shape, spec_full):
            if dim is None:
                split_shape.append(size)
                limits.append(size)
                out_shape.append(size)
                continue
            n = 1
            for fsize, sym in dim:
                split_shape.append(fsize)
                keep = true_sizes[sym] if sym is not None else fsize
                limits.append(keep)
                n *= keep
            out_shape.append(n)
        x = a.reshape(split_shape)
        x = lax.slice(x, [0] * len(split_shape), limits)
        return x.reshape(out_shape)

    return programs.get_or_compile(key, program, (arr,))(arr)


def _spec_str(spec):
    if spec is None:
        return None
    return tuple(None if d is None else tuple((f, str(s)) for f, s in d) for d in spec)


def true_view(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A view of padded tensor `t` with the leading `shape` of each dim (no copy)."""
    if tuple(t.shape) == tuple(shape):
        return t
    return torch.ops.aten.as_strided.default(t, list(shape), list(t.stride()), 0)


def is_padded_prefix(t: torch.Tensor, padded_shape: Sequence[int]) -> bool:
    """Is `t` the real part of a padded storage (what `true_view` returned)?"""
    if not st.has_data(t):
        return False
    data = st.data_of(t)
    return (data.shape == tuple(padded_shape) and t.storage_offset() == 0
            and t.dtype is data.dtype
            and tuple(t.stride()) == st.contiguous_strides(tuple(padded_shape)))

