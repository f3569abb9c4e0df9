"""Sorting and selection: sort, topk, searchsorted/bucketize, histc, and the
data-dependent ops (nonzero, masked_select, unique*, bincount).

Sort order follows PyTorch CPU: sorts are stable; ascending puts NaN last,
descending puts NaN first; -0.0 and 0.0 compare equal (lax.sort standardizes
both, so a stable sort keeps them in input order). A descending stable sort
is the reverse of the ascending stable sort of the reversed input, which
keeps equal elements in input order without negating keys (negation would
overflow integer minima and misplace NaN).

Data-dependent output shapes (nonzero, masked_select, unique*, bincount) run
eagerly on concrete arrays (`eager=True`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime import executor, platform
from ..runtime import storage as st
from . import core
from .registry import LOWERINGS, lower, out_dtype

aten = torch.ops.aten


def _orderable(x):
    return x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x


# -- sort, topk ----------------------------------------------------------------


def sort_last(x, descending=False):
    """Stable sort along the last axis: (values, int32 source indices)."""
    n = x.shape[-1]
    last = x.ndim - 1
    xs = _orderable(x)
    if descending:
        xs = jnp.flip(xs, last)
    iota = lax.broadcasted_iota(jnp.int32, xs.shape, last)
    v, i = lax.sort((xs, iota), dimension=last, is_stable=True, num_keys=1)
    if descending:
        v = jnp.flip(v, last)
        i = (n - 1) - jnp.flip(i, last)
    return v.astype(x.dtype), i


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return sort_stable(x, stable=True, dim=dim, descending=descending)


@lower(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    # The unstable sort is allowed to be stable (PyTorch's CPU sort is).
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    if x.shape[d] == 0 or x.size == 0:
        return x, jnp.zeros(x.shape, jnp.int64)
    v, i = sort_last(jnp.moveaxis(x, d, -1), descending)
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d).astype(jnp.int64)


def _order_key(x):
    """An integer key whose order is PyTorch's order of `x`: NaN largest, -0 == 0."""
    x = _orderable(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    bits = np.dtype(x.dtype).itemsize * 8
    itype = {16: jnp.int16, 32: jnp.int32, 64: jnp.int64}[bits]
    i = lax.bitcast_convert_type(x, itype)
    imax = np.iinfo(itype).max
    # Sign-magnitude to two's-complement order; -0.0 maps onto 0.0.
    key = jnp.where(i < 0, -(i & jnp.asarray(imax, itype)), i)
    return jnp.where(jnp.isnan(x), jnp.asarray(imax, itype), key)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    xm = jnp.moveaxis(x, d, -1)
    if k == 0 or xm.size == 0:
        shape = xm.shape[:-1] + (k,)
        return (jnp.moveaxis(jnp.zeros(shape, x.dtype), -1, d),
                jnp.moveaxis(jnp.zeros(shape, jnp.int64), -1, d))
    key = _order_key(xm)
    if not largest:
        key = ~key  # order-reversing, no overflow (also for unsigned types)
    _, i = lax.top_k(key, k)
    v = jnp.take_along_axis(xm, i, axis=-1)
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d).astype(jnp.int64)


# -- searchsorted, bucketize, histc ----------------------------------------------


def _searchsorted(seq, values, right):
    side = "right" if right else "left"
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side)
    batch = seq.shape[:-1]
    s = seq.reshape((-1, seq.shape[-1]))
    v = values.reshape((s.shape[0], -1))
    r = jax.vmap(lambda a, b: jnp.searchsorted(a, b, side=side))(s, v)
    return r.reshape(batch + values.shape[-1:])


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int32), axis=-1)
    t = jnp.result_type(seq, x)
    return _searchsorted(seq.astype(t), jnp.asarray(x).astype(t), right or side == "right")


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    t = jnp.result_type(boundaries, x)
    return _searchsorted(boundaries.astype(t), jnp.asarray(x).astype(t), right)


@lower(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    od = out_dtype()
    xf = x.reshape(-1)
    acc = jnp.float32 if np.dtype(xf.dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)) \
        else xf.dtype
    xf = xf.astype(acc)
    lo = jnp.asarray(min, acc)
    hi = jnp.asarray(max, acc)
    if xf.size:
        auto = lo == hi
        lo = jnp.where(auto, jnp.min(xf), lo)
        hi = jnp.where(auto, jnp.max(xf), hi)
    same = lo == hi
    lo = jnp.where(same, lo - 1, lo)
    hi = jnp.where(same, hi + 1, hi)
    pos = ((xf - lo) * bins / (hi - lo)).astype(jnp.int32)
    pos = jnp.where(xf == hi, bins - 1, pos)
    inside = (xf >= lo) & (xf <= hi)
    counts = jnp.zeros((bins,), acc).at[jnp.where(inside, pos, bins)].add(
        jnp.ones((), acc), mode="drop")
    return counts.astype(od)


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    idx = jnp.nonzero(_truth(x), size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=1).astype(jnp.int64)


# -- data-dependent shapes (eager) ----------------------------------------------------


def _truth(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lower(aten.nonzero.default, eager=True)
def nonzero(x):
    if x.ndim == 0:
        return jnp.zeros((int(_truth(x)), 0), jnp.int64)
    idx = jnp.nonzero(_truth(x))
    return jnp.stack(idx, axis=1).astype(jnp.int64)


@lower(aten.masked_select.default, eager=True)
def masked_select(x, mask):
    torch._check(mask.dtype == jnp.bool_,
                 lambda: f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    return jnp.broadcast_to(x, shape)[jnp.broadcast_to(mask, shape)]


@lower(aten.bincount.default, eager=True)
def bincount(x, weights=None, minlength=0):
    torch._check(minlength >= 0, lambda: "minlength should be >= 0")
    torch._check(x.ndim == 1 and jnp.issubdtype(x.dtype, jnp.integer)
                 and (x.size == 0 or int(jnp.min(x)) >= 0),
                 lambda: "bincount only supports 1-d non-negative integral inputs.")
    if weights is not None:
        torch._check(weights.ndim == 1 and weights.shape[0] == x.shape[0],
                     lambda: "weights should be 1-d and have the same length as input")
    length = max(int(jnp.max(x)) + 1 if x.size else 0, minlength)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[x].add(1)
    wdtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros((length,), wdtype).at[x].add(weights.astype(wdtype))


def _unique_flat(flat):
    """Sorted unique values of a 1-D array (NaNs distinct), inverse and counts."""
    n = flat.shape[0]
    if n == 0:
        e = jnp.zeros((0,), jnp.int64)
        return flat, e, e
    v, perm = sort_last(flat)
    vs = _orderable(v)
    new = jnp.concatenate([jnp.ones((1,), bool), vs[1:] != vs[:-1]])
    gid = jnp.cumsum(new.astype(jnp.int64)) - 1
    inverse = jnp.zeros((n,), jnp.int64).at[perm].set(gid)
    m = int(gid[-1]) + 1
    counts = jnp.zeros((m,), jnp.int64).at[gid].add(1)
    return v[new], inverse, counts


_EMPTY_I64 = (0,)


@lower(aten._unique2.default, eager=True)
def _unique2(x, sorted=True, return_inverse=False, return_counts=False):
    u, inv, cnt = _unique_flat(x.reshape(-1))
    return (u,
            inv.reshape(x.shape) if return_inverse else jnp.zeros(_EMPTY_I64, jnp.int64),
            cnt if return_counts else jnp.zeros(_EMPTY_I64, jnp.int64))


@lower(aten._unique.default, eager=True)
def _unique(x, sorted=True, return_inverse=False):
    u, inv, _ = _unique_flat(x.reshape(-1))
    return u, inv.reshape(x.shape) if return_inverse else jnp.zeros(_EMPTY_I64, jnp.int64)


def _rows(x, dim):
    """`x` with `dim` first, the rest flattened: one row per slice."""
    xm = jnp.moveaxis(x, dim, 0)
    return xm, _orderable(xm.reshape((xm.shape[0], -1)))


def _check_unique_dim(x, dim):
    torch._check_index(-max(x.ndim, 1) <= dim < max(x.ndim, 1),
                       lambda: f"Dimension out of range (expected to be in range of "
                               f"[{-max(x.ndim, 1)}, {max(x.ndim, 1) - 1}], but got {dim})")
    d = dim % max(x.ndim, 1)
    if x.size == 0:
        torch._check(x.shape[d] == 0 or sum(s == 0 for s in x.shape) == 0,
                     lambda: "There are 0 sized dimensions, and they aren't selected, so "
                             "unique cannot be applied")
    return d


@lower(aten.unique_dim.default, eager=True)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    d = _check_unique_dim(x, dim)
    if x.ndim == 0:
        return x, jnp.zeros((1,), jnp.int64), jnp.ones((1,), jnp.int64)
    xm, rows = _rows(x, d)
    n = rows.shape[0]
    if n == 0:
        e = jnp.zeros((0,), jnp.int64)
        return x, e, e
    # Lexicographic stable sort of the rows: the columns are the sort keys.
    iota = jnp.arange(n, dtype=jnp.int32)
    cols = tuple(rows[:, j] for j in range(rows.shape[1]))
    out = lax.sort(cols + (iota,), dimension=0, is_stable=True, num_keys=len(cols))
    perm = out[-1]
    srt = rows[perm]
    new = jnp.concatenate([jnp.ones((1,), bool), jnp.any(srt[1:] != srt[:-1], axis=1)])
    gid = jnp.cumsum(new.astype(jnp.int64)) - 1
    inverse = jnp.zeros((n,), jnp.int64).at[perm].set(gid)
    counts = jnp.zeros((int(gid[-1]) + 1,), jnp.int64).at[gid].add(1)
    u = jnp.moveaxis(xm[perm][new], 0, d)
    return u, inverse, counts


@lower(aten.unique_consecutive.default, eager=True)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        flat = x.reshape(-1)
        n = flat.shape[0]
        if n == 0:
            e = jnp.zeros((0,), jnp.int64)
            return flat, e.reshape(x.shape) if return_inverse else e, e
        fo = _orderable(flat)
        new = jnp.concatenate([jnp.ones((1,), bool), fo[1:] != fo[:-1]])
        gid = jnp.cumsum(new.astype(jnp.int64)) - 1
        counts = jnp.zeros((int(gid[-1]) + 1,), jnp.int64).at[gid].add(1)
        empty = jnp.zeros((0,), jnp.int64)
        return (flat[new], gid.reshape(x.shape) if return_inverse else empty,
                counts if return_counts else empty)
    d = _check_unique_dim(x, dim)
    if x.ndim == 0:
        return x, jnp.zeros((1,), jnp.int64), jnp.ones((1,), jnp.int64)
    xm, rows = _rows(x, d)
    n = rows.shape[0]
    if n == 0:
        e = jnp.zeros((0,), jnp.int64)
        return x, e, e
    new = jnp.concatenate([jnp.ones((1,), bool), jnp.any(rows[1:] != rows[:-1], axis=1)])
    gid = jnp.cumsum(new.astype(jnp.int64)) - 1
    counts = jnp.zeros((int(gid[-1]) + 1,), jnp.int64).at[gid].add(1)
    return jnp.moveaxis(xm[new], 0, d), gid, counts


# -- eager kernels ---------------------------------------------------------------------
#
# The executor runs every lowering through PyTorch's meta kernel first, which
# data-dependent ops do not have (nonzero's raises on purpose). Until the
# executor's eager path skips that step, these ops get direct kernels that run
# the lowerings above on concrete arrays; out= forms resize and copy.


def _bind(schema, args, kwargs):
    vals = list(args)
    for a in schema.arguments[len(vals):]:
        if a.name in kwargs:
            vals.append(kwargs[a.name])
        else:
            vals.append(a.default_value if a.has_default_value() else None)
    return vals


def _eager_kernel(op):
    fn = LOWERINGS[op].fn
    schema = op._schema

    def kernel(*args, **kwargs):
        vals = _bind(schema, args, kwargs)
        index = None
        for v in vals:
            if isinstance(v, torch.Tensor) and v.device.type == "tpu":
                index = v.device.index
                break
        if index is None:
            from ..device import module

            index = module.current_device()
        pos, kw = [], {}
        for a, v in zip(schema.arguments, vals):
            if isinstance(v, torch.Tensor):
                if v.device.type == "tpu":
                    torch._check(v.device.index == index, lambda: (
                        f"Expected all tensors to be on the same device (when checking "
                        f"arguments for {op})"))
                    arr = executor.value(v)
                    if v.is_conj():
                        arr = jnp.conj(arr)
                elif v.dim() == 0:
                    arr = jnp.asarray(v.item(), st.TORCH_TO_JAX[v.dtype])
                else:
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least "
                        f"two devices, tpu:{index} and {v.device}! (when checking arguments "
                        f"for {op})")
                v = arr
            (kw.__setitem__(a.name, v) if a.kwarg_only else pos.append(v))
        out = fn(*pos, **kw)
        dev = platform.jax_device(index)

        def wrap(a):
            a = jax.device_put(jnp.asarray(a), dev)
            return st.wrap(a, index)

        if isinstance(out, tuple):
            return tuple(wrap(a) for a in out)
        return wrap(out)

    kernel.__name__ = str(op)
    return kernel


def _eager_out_kernel(out_op, functional):
    schema = out_op._schema
    out_names = [a.name for a in schema.arguments if a.is_out]

    def kernel(*args, **kwargs):
        vals = _bind(schema, args, kwargs)
        named = {a.name: v for a, v in zip(schema.arguments, vals)}
        outs = [named.pop(n) for n in out_names]
        fpos, fkw = [], {}
        for a in functional._schema.arguments:
            (fkw.__setitem__(a.name, named[a.name]) if a.kwarg_only
             else fpos.append(named[a.name]))
        res = functional(*fpos, **fkw)
        res = res if isinstance(res, tuple) else (res,)
        for o, r in zip(outs, res):
            torch._check(o.dtype == r.dtype, lambda: (
                f"{out_op}: Expected out tensor to have dtype {r.dtype}, but got {o.dtype} "
                "instead"))
            if tuple(o.shape) != tuple(r.shape):
                o.resize_(r.shape)
            o.copy_(r)
        return outs[0] if len(outs) == 1 else tuple(outs)

    kernel.__name__ = str(out_op)
    return kernel


_EAGER_OPS = (aten.nonzero.default, aten.masked_select.default, aten.bincount.default,
              aten._unique2.default, aten._unique.default, aten.unique_dim.default,
              aten.unique_consecutive.default)


def _register_eager():
    for op in _EAGER_OPS:
        core.KERNELS[op] = _eager_kernel(op)
        packet = getattr(aten, op._schema.name.split("::")[1])
        for name in packet.overloads():
            cand = getattr(packet, name)
            if cand is op or cand in core.KERNELS:
                continue
            if executor.functional_of(cand) is op:
                core.KERNELS[cand] = _eager_out_kernel(cand, op)


_register_eager()
