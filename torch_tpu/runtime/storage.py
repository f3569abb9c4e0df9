"""Device tensors and the JAX arrays behind them.

A `tpu` tensor is a plain `torch.Tensor` (a storage-less PrivateUse1
TensorImpl). Its storage is real as far as PyTorch can see: it has a size in
bytes, a unique (never dereferenced) address and the tensor's device, so
sizes, strides, storage offsets, `_base`, `data_ptr()` and PyTorch's own
metadata-only view kernels all behave as on CPU. The data lives on the
storage's Python object as a `DeviceData`: one `jax.Array` in the natural
shape of the tensor that created the storage.

Every tensor sharing the storage (views, `detach()`, autograd's saved
copies, `.data`) therefore sees the same value, and an in-place op replaces
`DeviceData.array`, which is how writes reach every alias. A tensor whose
layout is exactly the array's is "plain" and is read without any work; any
other layout (a view) is read and written through `strided_read` /
`strided_write`, which the executor compiles into the op's program.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import oom, platform
from . import _dlpack
from ._dlpack import empty_on_device
from .fastpath import NATIVE as _NATIVE

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset._handle
_alias = torch.ops.aten.alias.default._handle
_view_dtype = torch.ops.aten.view.dtype._handle
_storage_from_ptr = torch._C._construct_storage_from_data_pointer
_create_empty = torch._C._acc.create_empty_tensor

# --------------------------------------------------------------------------
# dtypes

TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
    torch.float8_e4m3fnuz: jnp.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: jnp.float8_e5m2fnuz,
}
JAX_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}

# complex32 (`chalf`) has no XLA type. Its storages hold complex64 arrays (the
# carrier) whose parts are float16 values: every result of that dtype is
# rounded by `convert`, as CUDA computes ComplexHalf ops in complex64 and
# stores halves. The carrier is ambiguous only where bytes are reinterpreted
# (a float16 or float32 view of a chalf storage): such view layouts carry the
# storage's dtype as a fifth entry (`view_layout`).
TORCH_TO_JAX[torch.complex32] = jnp.complex64


def jax_dtype(dtype: torch.dtype) -> Any:
    try:
        jd = TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the tpu device") from None
    if dtype in (torch.float64, torch.complex128) and not platform.supports_float64():
        raise TypeError(
            f"Cannot use dtype {dtype} on a tpu device: the {platform.platform()!r} "
            "platform has no 64-bit floating point. Use float32 (or complex64) instead.")
    return jd


def torch_dtype(dtype: Any) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


def convert(x: jax.Array, dtype: torch.dtype) -> jax.Array:
    """`x` as a value of torch `dtype` (in its carrier): PyTorch's casting rules.

    complex -> real keeps the real part, -> bool is `!= 0`, and complex32
    rounds both parts to float16.
    """
    want = TORCH_TO_JAX[dtype]
    if x.dtype != want:
        if jnp.issubdtype(x.dtype, jnp.complexfloating) and not jnp.issubdtype(
                want, jnp.complexfloating):
            x = jnp.real(x)
        if dtype in _FLOAT8_NAN_BITS and x.dtype != jnp.bool_:
            x = _to_float8(x, dtype)
        elif want == jnp.bool_:
            x = x != 0
        elif jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(want) in _VIA_WIDE:
            x = float_to_int(x, want)
        else:
            x = from_bool(x, want)
    if dtype is torch.complex32:
        x = lax.complex(jnp.real(x).astype(jnp.float16).astype(jnp.float32),
                        jnp.imag(x).astype(jnp.float16).astype(jnp.float32))
    return x


def from_bool(x: jax.Array, want: Any) -> jax.Array:
    """`x` as jax dtype `want`; a bool `x` becomes a select of 1 and 0.

    XLA's algebraic simplifier rewrites `convert(pred) * y` into
    `select(pred, y, 0)` (and `convert(pred) / c` for a constant c into that
    product by 1/c), which drops 0 * inf = nan and 0 / 0 = nan wherever the
    cast and the arithmetic meet in one program (fused and compiled code). A
    select of 1 and 0 is the same value without that pattern, and fuses as well.
    """
    x = jnp.asarray(x)
    if x.dtype != jnp.bool_ or jnp.issubdtype(want, jnp.integer) or want == jnp.bool_:
        return x.astype(want)
    return lax.select(x, lax.full(x.shape, 1, want), lax.full(x.shape, 0, want))


# The integer a float converts through on x86 CPU: cvttss2si/cvttsd2si give
# int32 or int64 (c10 casts to uint8 through int64), narrower types keep its
# low bits.
_VIA_WIDE = {jnp.dtype(jnp.int64): jnp.int64, jnp.dtype(jnp.uint8): jnp.int64,
             jnp.dtype(jnp.int32): jnp.int32, jnp.dtype(jnp.int16): jnp.int32,
             jnp.dtype(jnp.int8): jnp.int32}


def float_to_int(x: jax.Array, want: Any) -> jax.Array:
    """Real float `x` as integer jax dtype `want`, as PyTorch's CPU gives it on
    x86: truncated toward zero into int32 or int64 (`_VIA_WIDE`), where a value
    outside that type's range, inf or NaN becomes its minimum (the
    instruction's "integer indefinite"), then wrapped into `want`
    (`tensor([-2.]).to(uint8)` is 254, `tensor([300.]).to(int8)` 44). XLA's
    own convert saturates instead."""
    wide = _VIA_WIDE.get(jnp.dtype(want))
    if wide is None:  # unsigned 16-64 bit: no CPU kernel to match
        return x.astype(want)
    low = jnp.iinfo(wide).min
    if x.dtype not in (jnp.float32, jnp.float64):
        x = x.astype(jnp.float32)  # exact; 2**31 overflows float16
    ok = (x >= float(low)) & (x < -float(low))  # NaN fails both
    y = jnp.where(ok, jnp.where(ok, x, 0).astype(wide), low)
    return y if y.dtype == want else y.astype(want)


# NaN's encoding in each float8 type, as c10 writes it (the sign bit is ORed in
# for the two types that have a signed NaN).
_FLOAT8_NAN_BITS = {torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7F,
                    torch.float8_e4m3fnuz: 0x80, torch.float8_e5m2fnuz: 0x80}


def _to_float8(x: jax.Array, dtype: torch.dtype) -> jax.Array:
    """`x` (real) as float8 `dtype`, bit for bit as CPU's c10 conversion.

    c10 converts through float32 (a double is rounded to float first, so two
    roundings, as on the CPU), saturates float8_e4m3fn (which has no infinity)
    to +-448 for every larger value and for +-inf where XLA's convert gives
    NaN, and writes NaN as 0x7F with the input's sign for e4m3fn and e5m2
    (XLA keeps part of the payload: 0x7E for e5m2). The fnuz types already
    agree: every overflow and NaN is 0x80.
    """
    want = TORCH_TO_JAX[dtype]
    if x.dtype != jnp.float32:
        x = x.astype(jnp.float32)
    y = x
    if dtype is torch.float8_e4m3fn:
        y = jnp.clip(x, -448.0, 448.0)  # NaN passes through clip
    y = y.astype(want)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        bits = lax.bitcast_convert_type(y, jnp.uint8)
        sign = (lax.bitcast_convert_type(x, jnp.uint32) >> 24).astype(jnp.uint8) & 0x80
        bits = jnp.where(jnp.isnan(x), jnp.uint8(0x7F) | sign, bits)
        y = lax.bitcast_convert_type(bits, want)
    return y


# --------------------------------------------------------------------------
# device data and tensor creation

# The memory history's hook (runtime.memory_history): called with (array,
# device index, op name or None) where an array becomes a storage's value;
# None while no history is recorded (the one test this costs when off).
RECORD: Any = None


class Deferred:
    """A storage value that is not computed yet.

    Modes that let the host run ahead of the device put one of these where
    a jax.Array would be: fused eager mode records ops and runs them later
    as one program, asynchronous compilation runs an op once its executable
    is built. Reading `DeviceData.array` resolves it (that read is the
    synchronisation point); code that only needs shape and dtype uses
    `DeviceData.shape`/`dtype`, and code that must not force a value (memory
    accounting, recorders) reads `DeviceData.raw`. Subclasses must give
    `shape` and `dtype` (the jax dtype) without resolving.
    """

    __slots__ = ()
    shape: tuple[int, ...]
    dtype: Any

    def resolve(self) -> jax.Array:
        raise NotImplementedError


class DeviceData:
    """The value of one storage: a jax.Array in the storage's natural shape.

    `shape` and `dtype` (a torch dtype) describe `array` and never change:
    in-place ops replace `array` with one of the same shape and dtype. They
    are kept as Python values because the executor's hot path compares them
    on every op. `raw` is the stored value as it is, a jax.Array or a
    `Deferred`; `array` is the jax.Array, resolving a deferred value first.
    """

    __slots__ = ("raw", "index", "shape", "dtype", "sig", "origin", "__weakref__")

    def __init__(self, array: jax.Array | Deferred, index: int,
                 dtype: torch.dtype | None = None, origin: str | None = None):
        self.raw = array
        self.index = index
        self.shape = tuple(array.shape)
        self.dtype = dtype if dtype is not None else JAX_TO_TORCH[np.dtype(array.dtype)]
        self.sig = (self.shape, self.dtype)
        # The op that created the storage (torch.tpu.memory_snapshot() shows it).
        self.origin = origin
        if RECORD is not None and not isinstance(array, Deferred):
            RECORD(array, index, origin)

    @property
    def array(self) -> jax.Array:
        v = self.raw
        if isinstance(v, Deferred):
            v = self.raw = v.resolve()
            if RECORD is not None:
                RECORD(v, self.index, self.origin)
        return v

    @array.setter
    def array(self, value: jax.Array | Deferred) -> None:
        self.raw = value
        if RECORD is not None and not isinstance(value, Deferred):
            RECORD(value, self.index, None)

    def write(self, value: jax.Array | Deferred, op: str) -> None:
        """`array = value`, written by `op` (the memory history names it)."""
        self.raw = value
        if RECORD is not None and not isinstance(value, Deferred):
            RECORD(value, self.index, op)

    @property
    def nbytes(self) -> int:
        """Bytes of the value, known without resolving it."""
        return math.prod(self.shape) * np.dtype(self.raw.dtype).itemsize


if _NATIVE is not None:
    _NATIVE.setup(DeviceData)  # the class the native wrap() instantiates

# Origins of storages created empty: the first op that writes one is recorded
# as its origin instead (torch.tpu.memory_snapshot()).
ALLOCATING_OPS = frozenset((None, "aten.empty.memory_format", "aten.empty_strided.default"))

# Addresses are virtual: unique per storage so that PyTorch's data_ptr()-based
# aliasing checks (and users' `a.data_ptr() == b.data_ptr()`) tell storages
# apart. They are never dereferenced.
_next_address = itertools.count(1 << 44, 1 << 6)
_seeds: dict = {}


def _seed(index: int, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor on tpu:index of `dtype`, the template new tensors alias."""
    key = (index, dtype)
    t = _seeds.get(key)
    if t is None:
        if index == 0:
            t = torch._C._acc.create_empty_tensor((0,), dtype)
        else:
            t = _view_dtype.redispatch_boxed(_CPU_KEYS, empty_on_device(index), dtype) \
                if dtype != torch.float32 else empty_on_device(index)
        _seeds[key] = t
    return t


_devices: dict = {}


def torch_device(index: int) -> torch.device:
    d = _devices.get(index)
    if d is None:
        d = _devices[index] = torch.device("tpu", index)
    return d


def _address_for(nbytes: int) -> int:
    # Reserve a block of the virtual address space as large as the storage.
    if _NATIVE is not None:  # one counter for both ways of making storages
        return _NATIVE.next_address(nbytes)
    global _next_address
    start = next(_next_address)
    if nbytes > 64:
        _next_address = itertools.count(start + ((nbytes + 63) // 64) * 64, 64)
    return start


def empty_tensor(shape: Sequence[int], dtype: torch.dtype, index: int,
                 nbytes: int | None = None, stride: Sequence[int] | None = None) -> torch.Tensor:
    """A new tpu tensor with its own storage (no DeviceData attached yet)."""
    if _NATIVE is not None:  # the same tensor in one C++ step (csrc/, see csrc/README.md)
        return _NATIVE.new_tensor(shape, dtype, index, nbytes, stride)
    shape = tuple(shape)
    if stride is None:
        stride = contiguous_strides(shape)
    if nbytes is None:
        nbytes = math.prod(shape) * dtype.itemsize
    if index == 0:
        t = _create_empty(shape, dtype)
    else:
        t = _alias.redispatch_boxed(_CPU_KEYS, _seed(index, dtype))
    st = _storage_from_ptr(_address_for(nbytes), torch_device(index), nbytes)
    _set_storage.redispatch_boxed(_CPU_KEYS, t, st, 0, shape, tuple(stride))
    return t


def wrap(array: jax.Array, index: int, dtype: torch.dtype | None = None,
         origin: str | None = None) -> torch.Tensor:
    """A new tpu tensor whose value is `array` (a jax.Array on tpu:index);
    `origin` names the op that produced it."""
    if dtype is None:
        dtype = JAX_TO_TORCH[array.dtype]
    if _NATIVE is not None:  # empty_tensor + the DeviceData below, in one C++ call
        return _NATIVE.wrap(array, index, dtype, origin)
    t = empty_tensor(array.shape, dtype, index)
    # The device data rides on torch's storage object as an attribute of ours.
    t.untyped_storage()._tpu = DeviceData(  # type: ignore[attr-defined]
        array, index, dtype, origin)
    return t


def attach(t: torch.Tensor, array: jax.Array, origin: str | None = None) -> None:
    """Give the freshly created tensor `t` (which owns its storage) a value."""
    t.untyped_storage()._tpu = DeviceData(  # type: ignore[attr-defined]  # see wrap
        array, t.device.index, t.dtype, origin)


def data_of(t: torch.Tensor) -> DeviceData:
    try:
        return t.untyped_storage()._tpu  # type: ignore[attr-defined]  # see wrap
    except AttributeError:
        if adopt_imported(t):
            return t.untyped_storage()._tpu  # type: ignore[attr-defined]
        raise RuntimeError(
            "tpu tensor has no device data (it was created by a kernel that "
            "bypassed torch_tpu); please report this with the op that made it") from None


def note_exported(t: torch.Tensor) -> None:
    """Note tpu tensor `t` as exported through DLPack (runtime._dlpack)."""
    _dlpack.exported(t)


def note_exported_storage(s: torch.UntypedStorage) -> None:
    """Note tpu storage `s` as reachable by its address (runtime._dlpack)."""
    _dlpack.exported_storage(s)


def adopt_imported(t: torch.Tensor) -> bool:
    """Give tpu tensor `t`, imported through DLPack, its exporter's storage;
    False where it was not imported from a tpu tensor (runtime._dlpack)."""
    return _dlpack.adopt(t)


def has_data(t: torch.Tensor) -> bool:
    return hasattr(t.untyped_storage(), "_tpu")


def is_contiguous(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Row-major strides for `size` (size-1 dims' strides ignored): a tensor's
    is_contiguous() from its sizes and strides."""
    expected = 1
    for n, s in zip(reversed(size), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def layout_of(t: torch.Tensor, data: DeviceData) -> tuple | None:
    """None when `t` is exactly its storage's array, else its view layout."""
    if (t.dtype is data.dtype and t.shape == data.shape and t.is_contiguous()
            and t.storage_offset() == 0):
        return None
    return view_layout(t, data)


def view_layout(t: torch.Tensor, data: DeviceData) -> tuple:
    """The layout of view `t` of `data`'s storage, as strided_read/write take it.

    (dtype, sizes, strides, offset), plus the storage's dtype where exactly one
    of the two is complex32 (its carrier does not tell). Hashable: it is part
    of every executable's cache key.
    """
    layout: tuple = (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
    if (t.dtype is torch.complex32) is not (data.dtype is torch.complex32):
        layout += (data.dtype,)
    return layout


def dynamic_layout(layout: tuple) -> tuple[tuple, int]:
    """`layout` with its offset made a runtime input: (layout', offset).

    layout' holds None where the offset was; strided_read/strided_write take
    the offset as an argument instead (a traced value inside a program). Keys
    built from layout' are the same for every offset of one shape and
    strides, so a loop over rows (`x[i] = src[i]`) compiles one program, not
    one per row.
    """
    return layout[:3] + (None,) + layout[4:], layout[3]


# --------------------------------------------------------------------------
# strided access inside programs


def reinterpret(flat: jax.Array, dtype: torch.dtype,
                src: torch.dtype | None = None) -> jax.Array:
    """View a 1-D array's bytes as elements of `dtype` (1-D result); ops.shape's
    dtype views (`Tensor.view(dtype)`) use it too.

    `src` is flat's torch dtype where its jax dtype may be complex32's carrier.
    """
    if src is torch.complex32:
        if dtype is torch.complex32:
            return flat
        # The storage's bytes: float16 (real, imag) pairs.
        flat = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)
        flat = flat.astype(jnp.float16)
    elif dtype is torch.complex32 and (src is not None or not jnp.iscomplexobj(flat)):
        parts = reinterpret(flat, torch.float16, src).reshape(-1, 2).astype(jnp.float32)
        return lax.complex(parts[:, 0], parts[:, 1])
    target = TORCH_TO_JAX[dtype]
    have = flat.dtype
    if np.dtype(have) == np.dtype(target):
        return flat
    if jnp.issubdtype(have, jnp.complexfloating):
        parts = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)
        return reinterpret(parts, dtype)
    if jnp.issubdtype(target, jnp.complexfloating):
        real_t = torch.float32 if dtype == torch.complex64 else torch.float64
        parts = reinterpret(flat, real_t).reshape(-1, 2)
        return lax.complex(parts[:, 0], parts[:, 1])
    if have == jnp.bool_:
        flat = flat.astype(jnp.uint8)
        have = jnp.uint8
    to_bool = target == jnp.bool_
    if to_bool:
        target = jnp.uint8
    si, ti = np.dtype(have).itemsize, np.dtype(target).itemsize
    if si < ti:
        flat = flat.reshape(-1, ti // si)
    out = lax.bitcast_convert_type(flat, target).reshape(-1)
    return out != 0 if to_bool else out


def flat_index(sizes: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    """The storage position of each element of a strided view (an array of `sizes`);
    compile.graph_ops gathers a generic view's elements with it."""
    idx = np.full(sizes, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return idx


def _structured_plan(sizes, strides):
    """Order of the dims for a slice/reshape/transpose read, or None."""
    dims = [d for d in range(len(sizes)) if sizes[d] != 1 and strides[d] != 0]
    order = sorted(dims, key=lambda d: -strides[d])
    for a, b in zip(order, order[1:]):
        if strides[b] <= 0 or strides[a] % strides[b] or strides[a] < strides[b] * sizes[b]:
            return None
    if order and strides[order[-1]] <= 0:
        return None
    return order


def extent(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a (non-empty) view's first element to its last, inclusive."""
    return 1 + sum((n - 1) * s for n, s in zip(sizes, strides))


def _slice(flat: jax.Array, offset: Any, n: int) -> jax.Array:
    """flat[offset:offset + n]; `offset` an int or a traced scalar."""
    if isinstance(offset, (int, np.integer)):
        return lax.slice(flat, (int(offset),), (int(offset) + n,))
    return lax.dynamic_slice(flat, (offset,), (n,))


def strided_read(base, layout, offset=None):
    """The value of a view with `layout` of the storage whose array is `base`.

    `offset` is the view's storage offset where the layout's own is None
    (`dynamic_layout`): an int or a traced scalar. Every read slices the
    view's extent at the offset first, so the program's shapes do not depend
    on the offset's value.
    """
    dtype, sizes, strides, own = layout[:4]
    if own is not None:
        offset = own
    flat = reinterpret(base.reshape(-1), dtype, layout[4] if len(layout) > 4 else None)
    n = math.prod(sizes)
    if n == 0:
        return jnp.zeros(sizes, flat.dtype)
    if strides == contiguous_strides(sizes):
        return _slice(flat, offset, n).reshape(sizes)
    x = _slice(flat, offset, extent(sizes, strides))
    order = _structured_plan(sizes, strides)
    if order is None:
        return x[flat_index(sizes, strides, 0)]
    if not order:  # every dim has size 1 or stride 0: one element, broadcast
        return jnp.broadcast_to(x.reshape(()), sizes)
    first = order[0]
    span = strides[first] * sizes[first]
    if x.shape[0] < span:  # the last row's stride reaches past the view's end
        x = jnp.pad(x, (0, span - x.shape[0]))
    x = x.reshape(sizes[first], strides[first])
    for b in order[1:]:
        x = x[..., : sizes[b] * strides[b]]
        x = x.reshape(x.shape[:-1] + (sizes[b], strides[b]))
    x = x[..., 0]
    # x's axes follow `order`; put them in view order, then add the size-1
    # and stride-0 (broadcast) dims.
    x = jnp.transpose(x, [order.index(d) for d in sorted(order)])
    shape_kept = [sizes[d] if d in order else 1 for d in range(len(sizes))]
    x = x.reshape(shape_kept)
    return jnp.broadcast_to(x, sizes)


def _differs(new: jax.Array, old: jax.Array) -> jax.Array:
    """Where `new` is not `old`, a NaN and a zero's sign counting as values."""
    out = new != old
    if jnp.issubdtype(new.dtype, jnp.floating):
        out = out | (jnp.signbit(new) != jnp.signbit(old))
    return out


def strided_write(base, layout, value, offset=None):
    """`base` with the view described by `layout` replaced by `value`.

    `offset` as for strided_read. A non-contiguous view is written into its
    extent, sliced at the offset, which is then put back in place.
    """
    dtype, sizes, strides, own = layout[:4]
    if own is not None:
        offset = own
    storage_dtype = layout[4] if len(layout) > 4 else None
    n = math.prod(sizes)
    if n == 0:
        return base
    value = jnp.broadcast_to(convert(value, dtype), sizes)
    flat = base.reshape(-1)
    same = storage_dtype is None and np.dtype(flat.dtype) == np.dtype(TORCH_TO_JAX[dtype])
    work = flat if same else reinterpret(flat, dtype, storage_dtype)
    if strides == contiguous_strides(sizes):
        work = lax.dynamic_update_slice(work, value.reshape(-1), (offset,))
    else:
        region = _slice(work, offset, extent(sizes, strides))
        index: Any = flat_index(sizes, strides, 0)
        if any(s == 0 and k > 1 for k, s in zip(sizes, strides)):
            # An expanded view (several elements in one place) that CPU lets
            # an op write (fill_, masked_fill_, index_fill_, index_put_):
            # CPU's loop writes only the elements the op sets, so only those
            # that changed are written here; the others would put the old
            # value back over them, in an order XLA does not define.
            index = jnp.where(_differs(value, region[index]), index, region.shape[0])
            region = region.at[index].set(value, mode="drop")
        else:
            region = region.at[index].set(value)
        work = lax.dynamic_update_slice(work, region, (offset,))
    if not same:
        work = reinterpret(work, storage_dtype or JAX_TO_TORCH[np.dtype(flat.dtype)], dtype)
    return work.reshape(base.shape)


# --------------------------------------------------------------------------
# host transfers


def host_array(value: jax.Array, op: str, index: int) -> np.ndarray:
    """jax.Array `value` as numpy; the failure of the work that computed it
    raised as PyTorch's error for `op` (reading a failed buffer's memory
    directly would abort the process). Device-side checks pending from
    earlier ops are raised first (`asserts`, through BEFORE_HOST_READ), as CUDA
    reports its asserts."""
    for hook in BEFORE_HOST_READ:
        hook()
    oom.ready((value,), op, index)
    return np.asarray(value)


# Called before every host read of a device value: runtime.asserts adds its
# check() when it loads (no pending device-side check exists before that).
BEFORE_HOST_READ: list = []

NUMPY_MAX_DIMS = 64


def from_host(src: torch.Tensor, index: int) -> jax.Array:
    """A jax.Array on tpu:index holding the CPU tensor `src`."""
    src = src.detach()
    if src._is_zerotensor():
        # autograd's efficient zeros (CPU kernels return them, e.g. through
        # the fallback) have no data to copy.
        src = torch.zeros(src.shape, dtype=src.dtype)
    if src.is_conj():
        src = src.resolve_conj()
    if src.is_neg():
        src = src.resolve_neg()
    shape = tuple(src.shape)
    if len(shape) > NUMPY_MAX_DIMS:
        # numpy (the transfer's carrier) stops at 64 dimensions, XLA does not:
        # move the elements flat and give them their shape on the device.
        return from_host(src.contiguous().reshape(-1), index).reshape(shape)
    if src.dtype is torch.complex32:
        return from_host(src.to(torch.complex64), index)
    jd = jax_dtype(src.dtype)
    if src.dtype == torch.bfloat16:
        host = src.contiguous().view(torch.int16).numpy().view(jnp.bfloat16)
    elif src.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                       torch.float8_e5m2fnuz, torch.uint16,
                       torch.uint32, torch.uint64):
        host = src.contiguous().view(torch.uint8 if src.dtype.itemsize == 1 else
                                     {2: torch.int16, 4: torch.int32, 8: torch.int64}[src.dtype.itemsize]
                                     ).numpy().view(jd)
    else:
        host = src.contiguous().numpy()
    device = platform.jax_device(index)
    if device.platform == "cpu":
        # XLA:CPU adopts suitably aligned host buffers without copying, even
        # with may_alias=False (measured on jax 0.10.2 with torch's 64-byte
        # aligned storages), and the CPU tensor may change after the copy.
        # Give it a private copy, which it may then adopt.
        host = np.array(host, copy=True)
    try:
        if device.platform == "cpu":
            return jax.device_put(host, device)
        return jax.device_put(host, device, may_alias=False)
    except jax.errors.JaxRuntimeError as e:
        raise oom.translate(e, "aten.copy_.default", index, host.nbytes) from None


def host_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor with the contents of numpy `array` (of jax dtype for `dtype`)."""
    array = np.ascontiguousarray(array).reshape(np.shape(array))
    if dtype is torch.complex32:
        return torch.from_numpy(array.copy()).to(torch.complex32)
    if dtype == torch.bfloat16 or dtype in (torch.float8_e4m3fn, torch.float8_e5m2,
                                           torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
                                           torch.uint16, torch.uint32, torch.uint64):
        carrier = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[dtype.itemsize]
        return torch.from_numpy(array.view(carrier).copy()).view(dtype)
    return torch.from_numpy(array.copy())
