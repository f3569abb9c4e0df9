"""Collectives as XLA programs over a mesh of the group's devices.

A group of n processes is a 1-D mesh (axis "g") of their devices. Each
process contributes its local array as its block of a global array
(`jax.make_array_from_single_device_arrays`), runs one jitted, shard_map'ed
program (psum, all_gather, psum_scatter, all_to_all, ppermute) and takes its
own block of the result back. Every process compiles and runs the same
program: the collectives in it are XLA collectives between the devices.

Checks: before the payload, each program all-gathers a small metadata
vector (operation, reduce op / root, dtype, shape, sequence number) from
every process. If they all agree, the payload collective runs; otherwise
every process skips it (a `lax.cond` on a value every process computes
identically) and reports the mismatch. So mismatched shapes or a different
collective on another rank give an error on every rank instead of a gloo
crash or a hang. `TORCH_TPU_DIST_CHECKS=0` leaves the check out.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..runtime import programs
from ..runtime.switches import switch_on
from . import runtime

AXIS = "g"
META_LEN = 12
_MAGIC = 0x7470752D  # "tpu-"

# operation codes in the metadata vector
OPS = {name: i + 1 for i, name in enumerate((
    "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "p2p",
    "barrier", "gather", "scatter", "reduce", "all_to_all_splits"))}
OP_NAMES = {v: k for k, v in OPS.items()}

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")


def checks_enabled() -> bool:
    return switch_on("TORCH_TPU_DIST_CHECKS")


try:
    from jax import shard_map as _shard_map
except ImportError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map as _shard_map


def shard_map(fn, mesh, in_specs, out_specs):
    try:
        return _shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    except TypeError:  # pragma: no cover - older jax
        return _shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


@functools.cache
def mesh_of(ranks: tuple) -> Mesh:
    """The 1-D mesh of the devices of global ranks `ranks` (in group order)."""
    return Mesh(np.array([runtime.device_of(r) for r in ranks]), (AXIS,))


@functools.cache
def sharding_of(ranks: tuple) -> NamedSharding:
    return NamedSharding(mesh_of(ranks), P(AXIS))


_DTYPE_CODES: dict = {}


def dtype_code(dtype) -> int:
    d = np.dtype(dtype)
    code = _DTYPE_CODES.get(d)
    if code is None:
        code = _DTYPE_CODES[d] = int.from_bytes(
            hashlib.blake2b(d.str.encode(), digest_size=4).digest(), "little")
    return code


def meta_vector(op: str, param: int, dtype, shape, seq: int) -> np.ndarray:
    m = np.full((GATHER_LEN,), -1, np.int64)  # META_LEN words, then the check's room
    m[0] = _MAGIC
    m[1] = OPS[op]
    m[2] = param
    m[3] = dtype_code(dtype) if dtype is not None else -1
    m[4] = len(shape)
    m[5] = int(np.prod(shape)) if shape is not None else -1
    dims = list(shape)[:5]
    if len(shape) > 5:
        dims[4] = int.from_bytes(hashlib.blake2b(repr(tuple(shape)).encode(),
                                                 digest_size=6).digest(), "little")
    m[6:6 + len(dims)] = dims
    m[11] = seq
    return m


def describe_meta(m) -> str:
    m = [int(v) for v in m]
    if m[0] != _MAGIC:
        return "<not a torch_tpu collective>"
    op = OP_NAMES.get(m[1], f"op{m[1]}")
    dt = next((str(d) for d, c in _DTYPE_CODES.items() if c == m[3]), "?")
    ndim = m[4]
    dims = m[6:6 + min(ndim, 5)]
    shape = "x".join(str(d) for d in dims) if ndim <= 5 else f"{ndim}-d"
    extra = ""
    if op in ("all_reduce", "reduce_scatter", "reduce") and 0 <= m[2] < len(REDUCE_OPS):
        extra = f", op={REDUCE_OPS[m[2]]}"
    elif op in ("broadcast", "gather", "scatter", "reduce") and m[2] >= 0:
        extra = f", root={m[2] % 1000}"
    return f"{op}({dt}[{shape}]{extra}) #{m[11]}"


# --------------------------------------------------------------------------
# building blocks inside shard_map bodies


def _bits_dtype(dtype):
    return {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[np.dtype(dtype).itemsize]


def to_bits(x):
    """Exact integer image of x (for moving bits with a sum; the process group's
    scatter moves its blocks as bits)."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        part = jnp.real(x).dtype
        return jnp.stack([lax.bitcast_convert_type(jnp.real(x), _bits_dtype(part)),
                          lax.bitcast_convert_type(jnp.imag(x), _bits_dtype(part))], -1)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    return lax.bitcast_convert_type(x, _bits_dtype(x.dtype))


def from_bits(b, dtype):
    """The values of dtype `dtype` whose bits are `b` (the inverse of to_bits)."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = np.dtype(jnp.float32 if dtype == np.complex64 else jnp.float64)
        re = lax.bitcast_convert_type(b[..., 0], part)
        im = lax.bitcast_convert_type(b[..., 1], part)
        return lax.complex(re, im)
    if dtype == np.bool_:
        return b != 0
    return lax.bitcast_convert_type(b, dtype)


def select_from(x, root):
    """Every device gets `root`'s x (bit-exact): a sum where only root is non-zero
    (the process group's broadcast)."""
    b = to_bits(x)
    mine = lax.axis_index(AXIS) == root
    return from_bits(lax.psum(jnp.where(mine, b, jnp.zeros_like(b)), AXIS), x.dtype)


def _is_float(dtype):
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def _low_precision(dtype):
    return np.dtype(dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def _gathered_reduce(x, op, n):
    """Reduce through an all-gather: for ops XLA's all-reduce lacks."""
    g = lax.all_gather(x, AXIS)  # (n, ...)
    if op == "product":
        return jnp.prod(g, axis=0, dtype=x.dtype)
    if op == "band":
        return functools.reduce(jnp.bitwise_and, [g[i] for i in range(n)])
    if op == "bor":
        return functools.reduce(jnp.bitwise_or, [g[i] for i in range(n)])
    if op == "bxor":
        return functools.reduce(jnp.bitwise_xor, [g[i] for i in range(n)])
    raise NotImplementedError(op)


def reduce_values(x, op, n, scale=None):
    """The all-reduce of x over the mesh axis with c10d reduce op `op`."""
    dtype = x.dtype
    if op == "premul_sum":
        x = x * jnp.asarray(scale, dtype)
        op = "sum"
    if dtype == jnp.bool_:
        u = x.astype(jnp.uint8)
        if op in ("sum", "max", "bor", "avg"):
            return lax.pmax(u, AXIS) != 0
        if op in ("min", "product", "band"):
            return lax.pmin(u, AXIS) != 0
        return (lax.psum(u.astype(jnp.int32), AXIS) % 2) != 0  # bxor
    if op in ("product", "band", "bor", "bxor"):
        return _gathered_reduce(x, op, n)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        if op not in ("sum", "avg"):
            raise ValueError(f"ReduceOp.{op.upper()} is not supported for complex tensors")
        re = reduce_values(jnp.real(x), op, n)
        im = reduce_values(jnp.imag(x), op, n)
        return lax.complex(re, im)
    work = x.astype(jnp.float32) if _low_precision(dtype) else x
    if op in ("sum", "avg"):
        r = lax.psum(work, AXIS)
        if op == "avg":
            r = r / n
    elif op == "max":
        r = lax.pmax(work, AXIS)
    elif op == "min":
        r = lax.pmin(work, AXIS)
    else:  # pragma: no cover
        raise NotImplementedError(op)
    return r.astype(dtype)


def reduce_scatter_values(x, op, n, scale=None):
    """x's reduction over the axis, block i of dim 0 to device i."""
    if op in ("sum", "avg", "premul_sum") and x.dtype != jnp.bool_ and \
            not jnp.issubdtype(x.dtype, jnp.complexfloating):
        dtype = x.dtype
        work = x.astype(jnp.float32) if _low_precision(dtype) else x
        if op == "premul_sum":
            work = work * jnp.asarray(scale, work.dtype)
        r = lax.psum_scatter(work, AXIS, scatter_dimension=0, tiled=True)
        if op == "avg":
            r = r / n
        return r.astype(dtype)
    full = reduce_values(x, op, n, scale)
    k = x.shape[0] // n
    return lax.dynamic_slice_in_dim(full, lax.axis_index(AXIS) * k, k, axis=0)


# --------------------------------------------------------------------------
# programs


# The check's all-gather has one size for every collective of every group
# (META_LEN metadata words + FUSED_WORDS words of room), so processes that
# called different collectives still meet in the same all-gather. A small
# all_reduce travels in that room (`fused`): one collective per call instead
# of the all-gather followed by the payload's all-reduce.
FUSED_BYTES = 4096
FUSED_WORDS = FUSED_BYTES // 8
GATHER_LEN = META_LEN + FUSED_WORDS


def gather_check(meta, extra=None):
    """All-gather this process's metadata `meta` (GATHER_LEN int64, from `meta_vector`).

    Returns (allm, ok, extras): allm (n, >= META_LEN), whose first META_LEN
    columns are every process's metadata; ok: they all agree; extras
    (n, FUSED_WORDS): every process's `extra` (<= FUSED_WORDS int64 words,
    sent in the room after the metadata), or None without `extra`.
    """
    if extra is None:
        # meta is already GATHER_LEN long (padded on the host): gathering it
        # as it is keeps the program as cheap to compile as a bare all-gather.
        g = lax.all_gather(meta, AXIS)  # (n, GATHER_LEN)
        return g, jnp.all(g == g[0:1]), None
    buf = lax.concatenate([lax.slice(meta, (0,), (META_LEN,)), extra], 0)
    buf = lax.pad(buf, np.int64(0), [(0, GATHER_LEN - buf.shape[0], 0)])
    g = lax.all_gather(buf, AXIS)  # (n, GATHER_LEN)
    n = g.shape[0]
    allm = lax.slice(g, (0, 0), (n, META_LEN))
    ok = jnp.all(allm == lax.slice(allm, (0, 0), (1, META_LEN)))
    return allm, ok, lax.slice(g, (0, META_LEN), (n, GATHER_LEN))


def _bits_layout(shape, dtype):
    """(shape, dtype) of `to_bits` of an array of `shape`, `dtype`."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = np.dtype(jnp.float32 if dtype == np.complex64 else jnp.float64)
        return tuple(shape) + (2,), np.dtype(_bits_dtype(part))
    if dtype == np.bool_:
        return tuple(shape), np.dtype(np.uint8)
    return tuple(shape), np.dtype(_bits_dtype(dtype))


def fused_nbytes(shapes_dtypes) -> int:
    total = 0
    for shape, dtype in shapes_dtypes:
        bshape, bdt = _bits_layout(shape, dtype)
        total += int(np.prod(bshape, dtype=np.int64)) * bdt.itemsize
    return total


def pack_words(xs):
    """The bytes of arrays xs, concatenated and zero-padded, as int64 words."""
    parts = []
    for x in xs:
        b = to_bits(x).reshape(-1)
        if b.dtype.itemsize > 1:
            b = lax.bitcast_convert_type(b, jnp.uint8).reshape(-1)
        parts.append(b)
    u8 = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    pad = (-u8.shape[0]) % 8
    if pad:
        u8 = jnp.concatenate([u8, jnp.zeros((pad,), jnp.uint8)])
    return lax.bitcast_convert_type(u8.reshape(-1, 8), jnp.int64)


def unpack_words(rows, xs):
    """Every process's copy of xs from the gathered words rows (n, W): (n,) + x.shape each."""
    n = rows.shape[0]
    u8 = lax.bitcast_convert_type(rows, jnp.uint8).reshape(n, -1)
    out, off = [], 0
    for x in xs:
        bshape, bdt = _bits_layout(x.shape, x.dtype)
        count = int(np.prod(bshape, dtype=np.int64))
        nb = count * bdt.itemsize
        seg = lax.slice(u8, (0, off), (n, off + nb))
        off += nb
        if bdt.itemsize > 1:
            seg = lax.bitcast_convert_type(seg.reshape(n, count, bdt.itemsize), bdt)
        out.append(from_bits(seg.reshape((n,) + bshape), x.dtype))
    return out


def fold_reduce(g, op, n):
    """The c10d reduction `op` of the n gathered copies g (n, ...), computed locally."""
    dtype = g.dtype
    if dtype == jnp.bool_:
        if op in ("sum", "max", "bor", "avg"):
            return jnp.any(g, axis=0)
        if op in ("min", "product", "band"):
            return jnp.all(g, axis=0)
        return (jnp.sum(g.astype(jnp.int32), axis=0) % 2) != 0  # bxor
    if op in ("product", "band", "bor", "bxor"):
        if op == "product":
            return jnp.prod(g, axis=0, dtype=dtype)
        f = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[op]
        return functools.reduce(f, [g[i] for i in range(n)])
    if jnp.issubdtype(dtype, jnp.complexfloating):
        if op not in ("sum", "avg"):
            raise ValueError(f"ReduceOp.{op.upper()} is not supported for complex tensors")
        r = functools.reduce(jnp.add, [g[i] for i in range(n)])
        return r / n if op == "avg" else r
    work = g.astype(jnp.float32) if _low_precision(dtype) else g
    if op in ("sum", "avg"):
        r = functools.reduce(jnp.add, [work[i] for i in range(n)])
        if op == "avg":
            r = r / n
    elif op == "max":
        r = functools.reduce(jnp.maximum, [work[i] for i in range(n)])
    elif op == "min":
        r = functools.reduce(jnp.minimum, [work[i] for i in range(n)])
    else:  # pragma: no cover
        raise NotImplementedError(op)
    return r.astype(dtype)


def _guarded(payload, out_shapes, check, fused=False):
    """body(meta, *xs): the metadata check around `payload(*xs)`.

    fused: `payload(*gathered)` takes every process's copy of each input
    ((n,) + shape, from the check's all-gather) and runs no collective.
    """
    if not check:
        def body(meta, *xs):
            outs = tuple(payload(*xs))
            return (outs, jnp.ones((1,), jnp.bool_), jnp.zeros((1, META_LEN), jnp.int64))
        return body

    if fused:
        def body(meta, *xs):
            allm, ok, rows = gather_check(meta, pack_words(xs))
            outs = tuple(payload(*unpack_words(rows, xs)))
            return outs, ok.reshape(1), allm.reshape(1, -1)
        return body

    def body(meta, *xs):
        allm, ok, _ = gather_check(meta)
        zeros = tuple(jnp.zeros(s, d) for s, d in out_shapes)
        outs = lax.cond(ok, lambda *v: tuple(payload(*v)), lambda *v: zeros, *xs)
        return outs, ok.reshape(1), allm.reshape(1, -1)
    return body


class Program:
    """A compiled collective for one group, operation and input signature."""

    def __init__(self, ranks, payload, in_shapes, out_shapes, check, donate=False, fused=False):
        self.ranks = ranks
        self.n = len(ranks)
        self.in_shapes = in_shapes      # local block shapes (each with ndim >= 1)
        self.out_shapes = out_shapes    # [(shape, dtype)] local result blocks
        self.check = check
        mesh = mesh_of(ranks)
        body = _guarded(payload, out_shapes, check, fused and check)
        n_in = len(in_shapes)
        fn = shard_map(body, mesh, in_specs=(P(AXIS),) * (n_in + 1),
                       out_specs=(tuple(P(AXIS) for _ in out_shapes), P(AXIS), P(AXIS)))
        self.fn = fn
        self.compiled = None
        self.sharding = sharding_of(ranks)

    def global_of(self, local):
        shape = (self.n * local.shape[0],) + tuple(local.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, [local])

    def __call__(self, meta_local, *locals_):
        g = [self.global_of(meta_local)] + [self.global_of(x) for x in locals_]
        if self.compiled is None:
            # Through the program cache's compile, so that the disk tier
            # serves it warm on every rank (JAX itself writes only rank 0's).
            self.compiled = programs.compile("collective", None, self.fn, tuple(g))
        outs, ok, allm = self.compiled(*g)
        return [o.addressable_data(0) for o in outs], ok.addressable_data(0), \
            allm.addressable_data(0)


_PROGRAMS: dict = {}


def program(key, build):
    p = _PROGRAMS.get(key)
    if p is None:
        p = _PROGRAMS[key] = build()
    return p


def clear():
    _PROGRAMS.clear()
    mesh_of.cache_clear()
    sharding_of.cache_clear()
