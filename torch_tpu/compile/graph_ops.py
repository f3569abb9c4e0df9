"""Graph-only lowerings: ops that eager mode runs without the lowering table,
and the graph-mode rules of ops whose eager kernel does more than their lowering.

In eager mode, view ops (view, permute, slice, ...) are metadata kernels
(torch_tpu/ops/core.py): the result shares its base's storage. Copies,
dtype conversions and factories are storage kernels too. Inside a compiled
graph every value is an immutable jax array in its logical shape, so these
ops need value semantics. An op's rule here wins over its lowering: the
few ops with both (`_linalg_det`, `_linalg_slogdet`) have an eager kernel
that calls the lowering on another argument, and the rule does the same.

Each function takes `(g, a)`: `g` is the node context (`g.out` the concrete
output meta(s), `g.meta(name)` the meta of a tensor argument, `g.rng()` a
raw PRNG key) and `a` maps the ATen schema's argument names to values
(tensors as jax arrays).

A view op without an entry here is computed generically from PyTorch's own
view metadata: the output's (sizes, strides, offset) over the storage it
shares with its input, translated into a gather from the input's value.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..ops import registry
from ..ops.opmath import opmath_dtype
from ..runtime import storage as st
from ..ops.linalg import geqrf_values
from ..runtime import rng as tpu_random

aten = torch.ops.aten

# The `graph` field of the op table (runtime/registry.py), filled by @graph_op.
GRAPH_OPS = registry.GRAPH_OPS
graph_op = registry.graph_op


def _dim(d, n):
    return d + n if d < 0 else d


# -- identity and copies ---------------------------------------------------------


@graph_op(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
          aten.lift_fresh.default, aten.clone.default, aten.contiguous.default,
          aten.alias_copy.default, aten.detach_copy.default)
def _identity(g, a):
    return a["self"]


@graph_op(aten._to_copy.default)
def _to_copy(g, a):
    dev = a.get("device")
    if dev is not None and torch.device(dev).type not in ("tpu", "meta"):
        raise NotImplementedError("a device transfer inside a compiled graph")
    return st.convert(a["self"], g.out.dtype)


@graph_op(aten.copy.default)
def _copy(g, a):
    return jnp.broadcast_to(st.convert(a["src"], g.out.dtype), g.out.shape)


# -- linear algebra with no lowering-table entry ---------------------------------


@graph_op(aten.cholesky_solve.default)
def _cholesky_solve(g, a):
    # Eager runs PyTorch's composite (batch broadcasting, then the helper).
    b, f = a["self"], a["input2"]
    batch = g.out.shape[:-2]
    b = jnp.broadcast_to(b, tuple(batch) + tuple(b.shape[-2:]))
    f = jnp.broadcast_to(f, tuple(batch) + tuple(f.shape[-2:]))
    helper = registry.LOWERINGS[aten._cholesky_solve_helper.default].fn
    return helper(b, f, bool(a.get("upper", False)))


@graph_op(aten.geqrf.default)
def _geqrf(g, a):
    x = a["self"]
    if x.size == 0:
        m, n = x.shape[-2:]
        return x, jnp.zeros(tuple(x.shape[:-2]) + (min(m, n),), x.dtype)
    return geqrf_values(x)


@graph_op(aten._linalg_det.default, aten._linalg_slogdet.default)
def _det_of_transpose(g, a):
    # PyTorch factors A^T where A is contiguous and real (det(A^T) == det(A)),
    # and the backward's lu_solve assumes that LU: eager's kernel
    # (ops/linalg._det_kernel) passes A.mT to the lowering, and so does this
    # rule, reading A's contiguity from the graph's metadata. (With A's own
    # LU the compiled gradient of det/slogdet/logdet came out transposed.)
    x, m = a["A"], g.meta("A")
    if st.is_contiguous(m.shape, m.stride) and not m.dtype.is_complex:
        x = jnp.swapaxes(x, -1, -2)
    return registry.LOWERINGS[g.node.target].fn(x)


# -- factories -------------------------------------------------------------------


@graph_op(aten.empty.memory_format, aten.empty_strided.default, aten.zeros.default,
          aten.new_empty.default, aten.new_zeros.default, aten.new_empty_strided.default,
          aten.zeros_like.default, aten.empty_like.default, aten.empty_permuted.default)
def _zeros(g, a):
    return jnp.zeros(g.out.shape, st.TORCH_TO_JAX[g.out.dtype])


@graph_op(aten.ones.default, aten.new_ones.default, aten.ones_like.default)
def _ones(g, a):
    return jnp.ones(g.out.shape, st.TORCH_TO_JAX[g.out.dtype])


@graph_op(aten.full.default, aten.new_full.default, aten.full_like.default)
def _full(g, a):
    return jnp.full(g.out.shape, a["fill_value"], st.TORCH_TO_JAX[g.out.dtype])


@graph_op(aten.scalar_tensor.default)
def _scalar_tensor(g, a):
    return jnp.asarray(a["s"]).astype(st.TORCH_TO_JAX[g.out.dtype])


@graph_op(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(g, a):
    start = a.get("start", 0)
    step = a.get("step", 1)
    n = g.out.shape[0]
    dt = st.TORCH_TO_JAX[g.out.dtype]
    if jnp.issubdtype(dt, jnp.integer):
        return (start + step * jnp.arange(n, dtype=jnp.int64)).astype(dt)
    return (start + step * jnp.arange(n, dtype=jnp.float64 if dt == jnp.float64
                                       else jnp.float32)).astype(dt)


# -- randomness (only when the lowering table has no entry) -----------------------


def _key(g):
    return tpu_random.jax_key(g.rng())


def _uniform(g, shape, dtype):
    dt = st.TORCH_TO_JAX[dtype]
    compute = opmath_dtype(dt)
    return jax.random.uniform(_key(g), shape, compute).astype(dt)


@graph_op(aten.rand.default, aten.rand_like.default)
def _rand(g, a):
    return _uniform(g, g.out.shape, g.out.dtype)


@graph_op(aten.randn.default, aten.randn_like.default)
def _randn(g, a):
    dt = st.TORCH_TO_JAX[g.out.dtype]
    compute = opmath_dtype(dt)
    return jax.random.normal(_key(g), g.out.shape, compute).astype(dt)


@graph_op(aten.bernoulli.p)
def _bernoulli_p(g, a):
    x = a["self"]
    keep = jax.random.uniform(_key(g), x.shape, jnp.float32) < a["p"]
    return st.from_bool(keep, x.dtype)


@graph_op(aten.bernoulli.default)
def _bernoulli(g, a):
    x = a["self"]
    keep = jax.random.uniform(_key(g), x.shape, jnp.float32) < x.astype(jnp.float32)
    return st.from_bool(keep, x.dtype)


@graph_op(aten.native_dropout.default)
def _native_dropout(g, a):
    x, p, train = a["input"], a["p"], a["train"]
    if train is False or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p >= 1:  # x * 0, as CPU's kernel: an inf or NaN input gives NaN
        return x * jnp.zeros((), x.dtype), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.uniform(_key(g), x.shape, jnp.float32) >= p
    scale = 1.0 / (1.0 - p)
    # CPU's kernel multiplies by the mask: a dropped inf or NaN gives NaN.
    return x * st.from_bool(keep, x.dtype) * jnp.asarray(scale, x.dtype), keep


# -- views -----------------------------------------------------------------------


@graph_op(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten._reshape_alias.default, aten.view_copy.default, aten._reshape_copy.default)
def _reshape(g, a):
    return jnp.reshape(a["self"], g.out.shape)


@graph_op(aten.permute.default, aten.permute_copy.default)
def _permute(g, a):
    x = a["self"]
    return jnp.transpose(x, [_dim(d, x.ndim) for d in a["dims"]])


@graph_op(aten.t.default)
def _t(g, a):
    x = a["self"]
    return x.T if x.ndim == 2 else x


@graph_op(aten.transpose.int)
def _transpose(g, a):
    x = a["self"]
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, _dim(a["dim0"], x.ndim), _dim(a["dim1"], x.ndim))


@graph_op(aten.expand.default, aten.expand_copy.default)
def _expand(g, a):
    return jnp.broadcast_to(a["self"], g.out.shape)


@graph_op(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def _unsqueeze(g, a):
    return jnp.reshape(a["self"], g.out.shape)


@graph_op(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
          aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def _squeeze(g, a):
    return jnp.reshape(a["self"], g.out.shape)


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


@graph_op(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(g, a):
    x = a["self"]
    if x.ndim == 0:
        return x
    d = _dim(a.get("dim", 0), x.ndim)
    start, end, step = _slice_bounds(x.shape[d], a.get("start"), a.get("end"),
                                     a.get("step", 1))
    starts = [0] * x.ndim
    limits = list(x.shape)
    strides = [1] * x.ndim
    starts[d], limits[d], strides[d] = start, end, step
    if end <= start:
        shape = list(x.shape)
        shape[d] = 0
        return jnp.zeros(shape, x.dtype)
    return lax.slice(x, starts, limits, strides)


@graph_op(aten.select.int, aten.select_copy.int)
def _select(g, a):
    x = a["self"]
    d = _dim(a["dim"], x.ndim)
    i = a["index"]
    if i < 0:
        i += x.shape[d]
    return lax.index_in_dim(x, i, d, keepdims=False)


@graph_op(aten.split.Tensor, aten.split_with_sizes.default, aten.split_copy.Tensor,
          aten.split_with_sizes_copy.default, aten.unbind.int, aten.unbind_copy.int)
def _split(g, a):
    """Consecutive slices along `dim` (sizes from the outputs' metadata): no
    gather, and valid for symbolic sizes (torch_tpu.export)."""
    x = a["self"]
    outs = g.out if isinstance(g.out, (list, tuple)) else [g.out]
    d = _dim(a.get("dim", 0) or 0, x.ndim)
    results, start = [], 0
    for o in outs:
        if len(o.shape) < x.ndim:  # unbind
            results.append(lax.index_in_dim(x, start, d, keepdims=False))
            start += 1
            continue
        size = o.shape[d]
        results.append(lax.slice_in_dim(x, start, start + size, axis=d))
        start = start + size
    return results if isinstance(g.out, (list, tuple)) else results[0]


@graph_op(aten._conj.default, aten._neg_view.default)
def _lazy_view(g, a):
    # Eager keeps these as views with a conj/neg bit that readers resolve; a
    # graph's arrays are values, so the conjugation or negation happens here
    # (read as a plain alias, a compiled ifft returned its conjugate).
    x = a["self"]
    return jnp.conj(x) if g.node.target is aten._conj.default else -x


@graph_op(aten.view_as_real.default, aten.view_as_complex.default)
def _complex_view(g, a):
    # By value, as their *_copy lowerings: a graph's arrays are logical
    # values whatever the strides (a solver's column-major result), and these
    # views change the element size, which storage positions cannot follow.
    copy = {aten.view_as_real.default: aten.view_as_real_copy.default,
            aten.view_as_complex.default: aten.view_as_complex_copy.default}[g.node.target]
    return registry.LOWERINGS[copy].fn(a["self"])


@graph_op(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(g, a):
    return generic_view(g, a)


# The view each of these copies: a copy's output is a new tensor (its
# metadata is contiguous, offset 0), so which of the input's elements it
# holds is the view's layout, not the output's.
_VIEW_OF_COPY = {aten.as_strided_copy.default: aten.as_strided.default,
                 aten.diagonal_copy.default: aten.diagonal.default}


def _copied_view_layout(g, a, src):
    """The layout (shape, stride, offset) of the view that g's *_copy op
    copies: the view op run on a meta tensor laid out as the input."""
    view = _VIEW_OF_COPY[g.node.target]
    size = src.offset + (st.extent(src.shape, src.stride) if math.prod(src.shape) else 0)
    base = torch.empty(size, dtype=src.dtype, device="meta").as_strided(
        tuple(src.shape), tuple(src.stride), src.offset)
    out = view(base, **{k: v for k, v in a.items() if k != "self"})
    return SimpleNamespace(shape=tuple(out.shape), stride=tuple(out.stride()),
                           offset=out.storage_offset(), dtype=out.dtype)


def generic_view(g, a):
    """Any view: gather the output's storage positions from the input's value
    (compile.lowering's fallback for a view op with no lowering of its own).
    A *_copy op reads what its view would (_VIEW_OF_COPY)."""
    src = g.meta("self")
    x = a["self"]
    outs = g.out if isinstance(g.out, (list, tuple)) else [g.out]
    if g.node.target in _VIEW_OF_COPY:
        outs = [_copied_view_layout(g, a, src)]
    # Which storage position each element of the input occupies.
    pos = st.flat_index(tuple(src.shape), tuple(src.stride), src.offset).reshape(-1)
    flat = x.reshape(-1)
    contiguous = tuple(src.stride) == st.contiguous_strides(tuple(src.shape))
    results = []
    for o in outs:
        if math.prod(o.shape) == 0:
            results.append(jnp.zeros(o.shape, x.dtype))
            continue
        want = st.flat_index(tuple(o.shape), tuple(o.stride), o.offset)
        if contiguous:
            layout = (o.dtype, tuple(o.shape), tuple(o.stride), o.offset - src.offset)
            results.append(st.strided_read(flat, layout))
            continue
        else:
            inverse = np.full(int(pos.max()) + 1 if pos.size else 1, -1, dtype=np.int64)
            inverse[pos] = np.arange(pos.size)
            if want.max() >= inverse.size or (inverse[want] < 0).any():
                raise NotImplementedError("a view reaching outside its input in a graph")
            idx = inverse[want]
        results.append(_gather_static(flat, idx))
    return results if isinstance(g.out, (list, tuple)) else results[0]


def _gather_static(flat: jax.Array, idx: np.ndarray) -> jax.Array:
    """flat[idx] for a constant index array, as a slice when it is a plain range."""
    r = idx.reshape(-1)
    if r.size and (r.size == 1 or (np.diff(r) == 1).all()):
        return lax.slice(flat, (int(r[0]),), (int(r[0]) + r.size,)).reshape(idx.shape)
    return flat[jnp.asarray(idx)]


@graph_op(aten.diagonal.default, aten.unfold.default, aten.diagonal_copy.default)
def _other_views(g, a):
    return generic_view(g, a)
