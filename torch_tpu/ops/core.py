"""Storage-level kernels: creation, copies, views, set_/resize_, item.

These are not lowerings to JAX functions; they manage which storage and
layout a tensor has. View ops reuse PyTorch's own CPU view kernels, which only
compute metadata: our storages have real sizes, so the CPU kernels produce
exactly the sizes, strides and offsets CPU tensors would get, and the result
shares the storage (and with it the device value) of its base.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import counters
from ..runtime import executor, keys, overlap, platform, programs, verdict
from ..runtime import opt_level as _olevel
from ..runtime import storage as st
from ..device import module
from ..runtime import async_compile
from ..runtime import oom
from ..runtime import registry
from ..runtime.context import CONTEXT

aten = torch.ops.aten
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# The storage-level kernels: the `kernel` field of the op table
# (runtime/registry.py), filled with `@kernel(op)` or `KERNELS[op] = fn`;
# `KERNELS.replace(op, fn)` for a kernel that wraps the op's previous one.
KERNELS = registry.KERNELS
kernel = registry.kernel


def checked_kernel(op, check):
    """A PrivateUse1 kernel for `op`: `check(*args, **kwargs)`, then the op's runner.

    For CPU argument checks that PyTorch's meta kernel makes differently or not
    at all (host metadata, or a value read). The lowering stays in the table:
    graphs use it without the check.
    """
    runner = None

    def kernel(*args, **kwargs):
        nonlocal runner
        check(*args, **kwargs)
        if runner is None:
            runner = executor.runner_for(op)
        return runner(*args, **kwargs)

    kernel.__name__ = str(op)
    return kernel


# c10's names of the types `Scalar::to<T>()` converts to (its overflow message).
_C10_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16", torch.int8: "int8_t", torch.int16: "int16_t",
    torch.int32: "int", torch.int64: "int64_t", torch.uint8: "uint8_t",
    torch.uint16: "uint16_t", torch.uint32: "uint32_t", torch.uint64: "uint64_t",
    torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>",
    torch.float8_e4m3fn: "c10::Float8_e4m3fn", torch.float8_e5m2: "c10::Float8_e5m2",
    torch.float8_e4m3fnuz: "c10::Float8_e4m3fnuz", torch.float8_e5m2fnuz: "c10::Float8_e5m2fnuz",
    # CPU fills a multi-element complex32 tensor through complex<float>.
    torch.complex32: "c10::complex<float>",
}
_NO_INFINITY = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _real_overflows(v: int | float, dtype: torch.dtype) -> bool:
    """c10::overflows<dtype's real type>(v) for a Python int or float `v`."""
    if dtype.is_floating_point:
        finfo = torch.finfo(dtype)
        if isinstance(v, int):
            return v < finfo.min or v > finfo.max
        if math.isinf(v):
            return dtype in _NO_INFINITY
        return v < finfo.min or v > finfo.max  # NaN compares false: it has NaN too
    info = torch.iinfo(dtype)
    if isinstance(v, float):
        # c10 compares in double: the limits are rounded to double first.
        return v != v or v < float(info.min) or v > float(info.max)
    if info.min == 0 and -(1 << 63) <= v < 0:
        # A negative int64 may wrap into an unsigned type if its magnitude fits.
        return -v > info.max
    return v < info.min or v > info.max


def check_scalar_fits(op: object, value: object, dtype: torch.dtype) -> None:
    """CPU's `Scalar::to<T>()` check for a fill value (full, fill_): RuntimeError
    "value cannot be converted to type T without overflow" where the value does
    not fit `dtype` (NaN or inf into an integer type, 256 into uint8, 1e300 into
    float32, a complex with an imaginary part into a real type). Bool targets
    are not checked (CPU converts to bool without a check). CPU's own
    one-element fast path skips the check for some types; CUDA and CPU's
    general path check, and so does this.
    """
    name = _C10_NAMES.get(dtype)
    if name is None or isinstance(value, bool) or not isinstance(value, (int, float, complex)):
        return
    if dtype is torch.complex32:
        dtype = torch.complex64
    if isinstance(value, complex):
        real = dtype.to_real() if dtype.is_complex else dtype
        bad = ((not dtype.is_complex and value.imag != 0)
               or _real_overflows(value.real, real) or _real_overflows(value.imag, real))
    else:
        bad = _real_overflows(value, dtype.to_real() if dtype.is_complex else dtype)
    if bad:
        raise RuntimeError(f"{op}: value cannot be converted to type {name} without overflow")


def device_index(device: torch.device | str | int | None) -> int:
    """The tpu index a factory's `device` argument names (None: the current
    device); the factories in ops.factories resolve theirs with it."""
    if device is None:
        return module.current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, int):
        return device
    idx = device.index if device.index is not None else module.current_device()
    platform.jax_device(idx)  # raises for a bad index
    return idx


# A zero-filled buffer needs no program to be created. A (shape, dtype,
# device) seen for the first time gets zeros copied from the host (measured
# 0.2-1 ms) while its broadcast program compiles on the compile threads
# (runtime.async_compile); later uses copy too until that compile is done,
# then call it (6 us against a transfer's 80 us for 256 bytes, at load ~8).
# Compiling on first use instead blocked the host ~120 ms a shape cold, and
# ~30 ms of lowering in a warm process: the tiny Llama's first eager step
# makes 7 such shapes (gradients, optimizer state), 1.75 s cold and 0.42 s
# warm of host time. Buffers above _ZEROS_TRANSFER_MAX are never copied
# (no large host allocation); without compile threads (TORCH_TPU_COMPILE_
# THREADS=0, TORCH_TPU_LAUNCH_BLOCKING=1) every shape compiles on first use.
# The compiled programs live in the program cache (runtime.programs), under
# (ProgramKind.ZEROS, shape, dtype, device), bounded with every other program;
# finished background compiles move there on the next miss.
_ZEROS_TRANSFER_MAX = 64 << 20
_zeros_compiling: dict = {}  # key -> Future of its compiled program


def _zeros_program(key, shape, jd, index, level):
    """Compile (or load from the disk tier) the zeros program of `key`, counted
    as every program is (`programs.record_compile`: a miss, its seconds, a
    compile event), on whichever thread builds it."""
    name = programs.ProgramKind.ZEROS.value
    sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(index))
    with programs.STATS.compile_clock:  # the wall time of `seconds`
        t0 = time.perf_counter()
        lowered = jax.jit(lambda: jnp.zeros(shape, jd), out_shardings=sharding).lower()
        compiled, seconds, source = programs.compile_lowered(
            name, lowered, _olevel.compiler_options(level), time.perf_counter() - t0)
    try:
        compiled._torch_tpu_bytes = programs.footprint(name, compiled)
    except AttributeError:
        pass
    programs.record_compile(name, key, seconds, compiled, source)
    return compiled


def _zeros_wait() -> None:
    """Wait for the zeros programs compiling in the background (a settle hook:
    readers of statistics see them counted, as the ops' own compiles)."""
    if async_compile.on_worker_thread():
        return  # a compile task never waits for the pool it runs on
    for pending in list(_zeros_compiling.values()):
        concurrent.futures.wait([pending])


programs.SETTLE_HOOKS.append(_zeros_wait)


def _zeros_settle() -> None:
    """Move the finished background zeros compiles into the program cache (a
    failed one stays, for its own shape's next call to raise)."""
    for key, pending in list(_zeros_compiling.items()):
        if pending.done() and pending.exception() is None:
            del _zeros_compiling[key]
            programs.insert(key, pending.result())


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, index: int) -> jax.Array:
    key = keys.helper_key(programs.ProgramKind.ZEROS, shape, dtype, index)
    fn = programs.peek(key)
    if fn is not None:
        return fn()
    jd = st.jax_dtype(dtype)

    if async_compile.ENABLED and math.prod(shape) * dtype.itemsize <= _ZEROS_TRANSFER_MAX:
        pending = _zeros_compiling.get(key)
        if pending is None or not pending.done():
            _zeros_settle()
            if pending is None:
                _zeros_compiling[key] = async_compile.compile_pool().submit(
                    _zeros_program, key, shape, jd, index, key[-1])
            return jax.device_put(np.zeros(shape, jd), platform.jax_device(index))
        del _zeros_compiling[key]
        if pending.exception() is None:
            fn = pending.result()
            programs.insert(key, fn)
            return fn()
        # The compile failed: compiling here raises its error for this op.
    fn = _zeros_program(key, shape, jd, index, key[-1])
    programs.insert(key, fn)
    return fn()


# `empty` storages of at least this many bytes are not allocated until an op
# reads them (`Unwritten`): `module.to_empty(device="tpu")` followed by
# `load_state_dict(..., assign=True)` (the state dict's tensors become the
# parameters) or by copies into whole tensors then never holds the weights
# twice. Smaller ones are made at once: the native call path takes only
# arrays, so a deferred input costs one call through Python.
_UNWRITTEN_MIN_BYTES = 1 << 20


class Unwritten(st.Deferred):
    """An `empty` storage no op has read or written yet: resolves to zeros
    (memory is never garbage) on the first read; a copy into the whole
    storage replaces it without making the zeros (`assign`). It is not an
    array, so `torch.tpu.memory_allocated` does not count it, as PJRT does not
    count an allocation that was never made."""

    __slots__ = ("shape", "dtype", "_torch_dtype", "_index", "_op")

    def __init__(self, shape, dtype, index, op):
        self.shape = shape
        self.dtype = st.jax_dtype(dtype)
        self._torch_dtype = dtype
        self._index = index
        self._op = op

    def resolve(self) -> jax.Array:
        return _new_zeros(self.shape, self._torch_dtype, self._index, self._op)


def _storage_value(shape, dtype, index, op):
    """The value of a new `empty` storage: zeros, or `Unwritten` for a large
    one (checked against the memory limit now, as if it were allocated)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _UNWRITTEN_MIN_BYTES or CONTEXT.launch_blocking:
        return _new_zeros(shape, dtype, index, op)
    if nbytes >= oom.check_threshold(index):
        oom.check(op, nbytes, index)
    return Unwritten(shape, dtype, index, op)


def _check_strides(shape, stride):
    """c10's computeStorageNbytes checks of empty_strided's sizes and strides, in CPU's
    words: as many strides as sizes, and no element before the first (a negative span)."""
    if len(stride) != len(shape):
        raise RuntimeError(f"dimensionality of sizes ({len(shape)}) must match "
                           f"dimensionality of strides ({len(stride)})")
    if all(shape) and any((n - 1) * d < 0 for n, d in zip(shape, stride)):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(shape)} "
                           f"and strides={list(stride)}")


def new_tensor(shape, dtype, index, stride=None):
    """A tpu tensor of zeros (what `empty` gives: memory is never garbage),
    made on first use where it is large (`Unwritten`)."""
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shape)}")
    if stride is not None:
        _check_strides(shape, tuple(int(s) for s in stride))
    op = "aten.empty.memory_format" if stride is None else "aten.empty_strided.default"
    if stride is not None and tuple(int(s) for s in stride) == st.contiguous_strides(shape):
        # empty_strided with contiguous strides (empty_like, a CPU tensor's
        # .to("tpu") before the backend loaded): a plain storage of that
        # shape, not a flat one every later op would read as a view.
        stride = None
    if stride is None:
        value = _storage_value(shape, dtype, index, op)
        t = st.empty_tensor(shape, dtype, index)
        st.attach(t, value, op)
        return t
    stride = tuple(int(s) for s in stride)
    n = 1 + sum((s - 1) * d for s, d in zip(shape, stride)) if all(shape) else 0
    value = _storage_value((n,), dtype, index, "aten.empty_strided.default")
    t = st.empty_tensor(shape, dtype, index, nbytes=n * dtype.itemsize, stride=stride)
    st.attach(t, value, "aten.empty_strided.default")
    return t


def _new_zeros(shape, dtype, index, op):
    """_zeros, with torch.OutOfMemoryError where it does not fit (runtime.oom)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= oom.check_threshold(index):
        oom.check(op, nbytes, index)
    try:
        value = _zeros(shape, dtype, index)
        if CONTEXT.launch_blocking:
            value.block_until_ready()
    except jax.errors.JaxRuntimeError as e:
        raise oom.translate(e, op, index, nbytes) from None
    return value


@kernel(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None,
          memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    st.jax_dtype(dtype)
    return new_tensor(size, dtype, device_index(device))


@kernel(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    st.jax_dtype(dtype)
    return new_tensor(size, dtype, device_index(device), stride)


# -- copies ------------------------------------------------------------------


def assign(dst: torch.Tensor, value: jax.Array) -> None:
    """Write jax array `value` (broadcastable to dst) into tpu tensor `dst`."""
    data = st.data_of(dst)
    layout = st.layout_of(dst, data)
    shape = tuple(dst.shape)
    want = dst.dtype
    if layout is None and type(data.raw) is Unwritten:
        # The whole of a storage never read: its value is `value`, no zeros made.
        whole = keys.helper_key(programs.ProgramKind.COPY, "whole", value.shape, value.dtype,
                                shape, want)

        def fill(v):
            return jnp.broadcast_to(st.convert(v, want), shape)

        out = programs.get_or_compile(whole, fill, (value,))(value)
        data.array = jax.device_put(out, platform.jax_device(data.index))
        if data.origin in st.ALLOCATING_OPS:
            data.origin = "aten.copy_.default"
        return
    base = data.array
    key: tuple  # the program's key: one layout of three
    if layout is None:
        key = keys.helper_key(programs.ProgramKind.COPY, base.shape, base.dtype, None,
                              value.shape, value.dtype, shape, want)

        def write(base, v):
            return jnp.broadcast_to(st.convert(v, want), shape)

        data.array = programs.get_or_compile(key, write, (base, value))(base, value)
    elif (order := _whole_permutation(dst, data)) is not None:
        # A dense permutation of the whole storage (channels_last, a transposed
        # tensor): the storage is the value transposed. (strided_write would
        # scatter through an index array as large as the tensor: 4 GB of
        # temporaries to make an 80M-element tensor channels_last.)
        key = keys.helper_key(programs.ProgramKind.COPY, "permuted", base.shape, base.dtype,
                              order, value.shape, value.dtype, shape, want)

        def write_all(base, v):
            v = jnp.broadcast_to(st.convert(v, want), shape)
            return jnp.transpose(v, order).reshape(base.shape)

        data.array = programs.get_or_compile(key, write_all, (base, value))(base, value)
    else:
        # The view's offset is a runtime input: `x[i] = row` for every i
        # shares one program.
        layout, offset = st.dynamic_layout(layout)
        key = keys.helper_key(programs.ProgramKind.COPY, base.shape, base.dtype, layout,
                              value.shape, value.dtype, shape, want)

        def write_view(base, v, o):
            return st.strided_write(base, layout, jnp.broadcast_to(st.convert(v, want), shape), o)

        fn = programs.get_or_compile(key, write_view, (base, value, offset))
        data.array = fn(base, value, offset)
    if data.origin in st.ALLOCATING_OPS:
        data.origin = "aten.copy_.default"


def _same_data(self: torch.Tensor, src: torch.Tensor) -> bool:
    """CPU's copy_ returns at once for a tensor copied onto the same elements."""
    return self is src or (
        self.device == src.device and self.storage_offset() == src.storage_offset()
        and self.stride() == src.stride() and self.shape == src.shape
        and self.dtype == src.dtype and self.is_conj() == src.is_conj()
        and self.is_neg() == src.is_neg()
        and self.untyped_storage().data_ptr() == src.untyped_storage().data_ptr())


def _check_copy_overlap(self: torch.Tensor, src: torch.Tensor) -> None:
    """CPU copy_'s memory checks (TensorIterator's): no element of `self`
    stored for several (an expanded tensor), none shared in part with `src`."""
    text = None  # (per copy: ~0.5 us on this 2-core host; the cheap tests first)
    if 0 in self.stride() and overlap.internal_overlap(self):
        text = verdict.INTERNAL_OVERLAP_TEXT
    elif overlap.partial_overlap(self, src):  # (a CPU src has no device data: False)
        text = verdict.PARTIAL_OVERLAP_TEXT
    if text is not None and not _same_data(self, src):
        raise RuntimeError(f"{text} (aten.copy_.default)")


@kernel(aten.copy_.default)
def copy_(self, src, non_blocking=False):
    if self.device.type == "tpu":
        _check_copy_overlap(self, src)
        if src.device.type == "tpu":
            value = device_value(src)
            if src.device.index != self.device.index:
                value = jax.device_put(value, platform.jax_device(self.device.index))
                counters.transfer("device_to_device", value.nbytes)
        else:
            if src.dim() == 0 and not src.is_meta:
                value = np.asarray(src.item(), dtype=st.TORCH_TO_JAX[src.dtype])
                value = jax.device_put(value, platform.jax_device(self.device.index))
            else:
                value = st.from_host(src, self.device.index)
            counters.transfer("host_to_device", value.nbytes)
        torch._check(
            _broadcastable(tuple(src.shape), tuple(self.shape)),
            lambda: f"copy_: the source of shape {tuple(src.shape)} cannot be broadcast "
                    f"to the destination's {tuple(self.shape)}")
        assign(self, value)
        return self
    # tpu -> cpu (or another host device)
    value = device_value(src)
    if value.ndim > st.NUMPY_MAX_DIMS:  # numpy's limit: carry the elements flat
        value = value.reshape(-1)
    host = st.host_array(value, "aten.copy_.default", src.device.index)
    counters.transfer("device_to_host", host.nbytes)
    cpu = st.host_tensor(host, src.dtype).reshape(tuple(src.shape))
    with torch.no_grad():
        self.copy_(cpu)
    return self


def _broadcastable(src: Sequence[int], dst: Sequence[int]) -> bool:
    if len(src) > len(dst):
        return False
    for a, b in zip(reversed(src), reversed(dst)):
        if a != b and a != 1:
            return False
    return True


@kernel(aten._copy_from.default)
def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


@kernel(aten._copy_from_and_resize.default)
def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return copy_(dst, self)


@kernel(aten._to_copy.default)
def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    stride = _copy_strides(self, dtype, memory_format)
    if target.type == "tpu":
        out = new_tensor_like_value(self, dtype, device_index(target))
        return out if stride is None else restrided(out, stride)
    if stride is None:
        out = torch.empty(tuple(self.shape), dtype=dtype, device=target)
    else:
        out = torch.empty_strided(tuple(self.shape), stride, dtype=dtype, device=target)
    copy_(out, self)
    return out


def _copy_strides(self, dtype, memory_format):
    """The strides of `self.to(..., memory_format=memory_format)` (PyTorch's
    rule: preserve_format keeps a dense tensor's strides, channels_last stays
    channels_last); None for contiguous ones."""
    if memory_format in (None, torch.preserve_format, torch.contiguous_format) \
            and (self.is_contiguous() or memory_format is torch.contiguous_format):
        return None
    meta = torch.empty_strided(tuple(self.shape), tuple(self.stride()), dtype=self.dtype,
                               device="meta")
    stride = tuple(aten._to_copy.default(meta, dtype=dtype, memory_format=memory_format)
                   .stride())
    return None if stride == st.contiguous_strides(tuple(self.shape)) else stride


def device_value(src):
    """The value of tpu tensor `src` with its lazy conjugate/negative bits applied
    (ops.linalg's Python kernels read their inputs with it)."""
    value = executor.value(src)
    if src.is_conj():
        value = jnp.conj(value)
    if src.is_neg():
        value = -value
    return value


def new_tensor_like_value(src, dtype, index):
    """A fresh tpu tensor on tpu:index holding src (tpu or cpu) as `dtype`."""
    want = st.jax_dtype(dtype)  # raises for a dtype the platform lacks
    if src.device.type == "tpu":
        value = device_value(src)
        if src.device.index != index:
            value = jax.device_put(value, platform.jax_device(index))
            counters.transfer("device_to_device", value.nbytes)
    else:
        value = st.from_host(src, index)
        counters.transfer("host_to_device", value.nbytes)
    if value.dtype != want or (dtype is torch.complex32 and src.dtype is not torch.complex32):
        value = _cast(value, dtype)
    return st.wrap(value, index, dtype, "aten._to_copy.default")


def _cast(value, want):
    key = keys.helper_key(programs.ProgramKind.CAST, value.shape, value.dtype, want)
    return programs.get_or_compile(key, lambda v: st.convert(v, want), (value,))(value)


@kernel(aten._local_scalar_dense.default)
def _local_scalar_dense(self):
    counters.count("item")
    return st.host_array(executor.value(self), "aten._to_copy.default",
                         self.device.index).reshape(()).item()


# -- results in the memory format PyTorch's meta kernel gives them --------------
#
# The executor lays each result out in the strides PyTorch's meta kernel gives it
# (the executor's result orders: channels_last in, channels_last out, as CPU's
# TensorIterator, cat and dropout do). Ops whose CPU strides differ from their
# meta kernel's (unbatched max_pool3d) get `strided_kernel`: the op's runner,
# then each result laid out in CPU's strides (one transpose program; the
# storage is then the flat array in that order, like `empty_strided`).
# tests/test_nn_parity.py compares pooling's strides with CPU's.


_dense_order = executor.dense_order  # (the executor lays results out by it too)


def _whole_permutation(t: torch.Tensor, data: st.DeviceData) -> tuple | None:
    """The dim order if `t` is a dense permutation covering all of its
    storage's array (same dtype, offset 0), else None."""
    if (t.storage_offset() != 0 or t.dtype is not data.dtype or t.numel() <= 1
            or t.numel() != math.prod(data.shape)):
        return None
    return _dense_order(tuple(t.shape), tuple(t.stride()))


def restrided(t: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """Plain tpu tensor `t`'s value as a new tensor with strides `stride`."""
    shape, stride = tuple(t.shape), tuple(int(s) for s in stride)
    if t.numel() <= 1 or stride == tuple(t.stride()):
        return t
    order = _dense_order(shape, stride)
    index = t.device.index or 0
    if order is None:  # not a permutation of a dense layout: write the view
        out = new_tensor(shape, t.dtype, index, stride)
        copy_(out, t)
        return out
    value = executor.value(t)
    key = keys.helper_key(programs.ProgramKind.COPY, "restride", value.shape, value.dtype,
                          order)
    flat = programs.get_or_compile(
        key, lambda v: jnp.transpose(v, order).reshape(-1), (value,))(value)
    out = st.empty_tensor(shape, t.dtype, index, nbytes=t.numel() * t.element_size(),
                          stride=stride)
    st.attach(out, flat, st.data_of(t).origin)
    return out


def _layout_key(args, kwargs):
    """A hashable key of the arguments' metadata (tensors by sizes, strides,
    dtype), or None where an argument is not hashable."""
    def part(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), tuple(v.stride()), v.dtype)
        if isinstance(v, (list, tuple)):
            return tuple(part(x) for x in v)
        return v

    key = (tuple(part(a) for a in args), tuple(sorted((k, part(v)) for k, v in kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _meta_strides(op, args, kwargs, layout):
    """The strides of `op`'s results for these arguments: from its meta
    kernel, or `layout(args, metas)` where that gives them."""
    meta = executor.run_meta(op, args, kwargs)[0]
    metas = tuple(meta) if isinstance(meta, (tuple, list)) else (meta,)
    if layout is not None:
        want = layout(args, metas)
        if want is not None:
            return want
    return tuple(tuple(m.stride()) if isinstance(m, torch.Tensor) else None for m in metas)


def strided_kernel(op, check=None, layout=None):
    """A PrivateUse1 kernel for `op`: `check(*args, **kwargs)` if given (as
    `checked_kernel`), then its runner, with each result in the strides
    PyTorch's meta kernel gives it (channels_last in, channels_last out).
    Calls whose tensor arguments are all contiguous return the runner's
    results as they are. `layout(args, metas)`, if given, returns the
    results' strides where CPU's differ from the meta kernel's (else None)."""
    runner = None
    strides: dict = {}  # argument metadata -> the results' strides

    def kernel(*args, **kwargs):
        nonlocal runner
        if check is not None:
            check(*args, **kwargs)
        if runner is None:
            runner = executor.runner_for(op)
        out = runner(*args, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if all(a.is_contiguous() for a in tensors):
            return out
        key = _layout_key(args, kwargs)
        want = strides.get(key) if key is not None else None
        if want is None:
            want = _meta_strides(op, args, kwargs, layout)
            if key is not None and len(strides) < 4096:
                strides[key] = want
        if isinstance(out, (tuple, list)):
            return type(out)(restrided(o, s) if s is not None else o for o, s in zip(out, want))
        return restrided(out, want[0])

    kernel.__name__ = str(op)
    return kernel


# -- views: PyTorch's CPU kernels compute the metadata -------------------------

_VIEW_OPS = (
    aten.as_strided.default,
    aten.view.default,
    aten._reshape_alias.default,
    aten.unfold.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    aten.view.dtype,
    aten._unsafe_view.default,
    aten.alias.default,
    aten._conj.default,
    aten._neg_view.default,
)


def _view_kernel(op):
    handle = op._handle

    def view(*args, **kwargs):
        return handle.redispatch_boxed(_CPU, *args, **kwargs)

    view.__name__ = op.__name__
    return view


for _op in _VIEW_OPS:
    KERNELS[_op] = _view_kernel(_op)


@kernel(aten.set_.source_Storage_storage_offset)
def set_storage_offset(self, source, storage_offset, size, stride=()):
    data = getattr(source, "_tpu", None)
    if data is None and source.nbytes() > 0:
        raise RuntimeError("set_: the storage has no tpu data (expected a tpu storage)")
    if (data is not None and data.dtype == torch.uint8 and self.dtype != torch.uint8
            and len(data.shape) == 1 and data.shape[0] % self.dtype.itemsize == 0):
        # Bytes from torch.load or a uint8 view: retype the storage once, so
        # reads of the typed tensor need no bitcast.
        n = data.shape[0] // self.dtype.itemsize
        retyped = executor.read(data, (self.dtype, (n,), (1,), 0))
        source._tpu = st.DeviceData(retyped, data.index, self.dtype)
    return aten.set_.source_Storage_storage_offset._handle.redispatch_boxed(
        _CPU, self, source, storage_offset, size, stride)


@kernel(aten.set_.source_Storage)
def set_storage(self, source):
    n = source.nbytes() // self.dtype.itemsize
    return set_storage_offset(self, source, 0, (n,), (1,))


@kernel(aten.set_.source_Tensor)
def set_tensor(self, source):
    return set_storage_offset(self, source.untyped_storage(), source.storage_offset(),
                              tuple(source.shape), tuple(source.stride()))


@kernel(aten.set_.default)
def set_empty(self):
    fresh = new_tensor((0,), self.dtype, self.device.index)
    return set_tensor(self, fresh)


@kernel(aten.resize_.default)
def resize_(self, size, memory_format=None):
    # Sizes and strides as CPU gives them (the same sizes keep the strides,
    # others become contiguous, then `memory_format` restrides, channels_last
    # included), with CPU's errors: PyTorch's meta kernel on a meta copy.
    meta = torch.empty_strided(tuple(self.shape), tuple(self.stride()), dtype=self.dtype,
                               device="meta")
    try:
        meta.resize_(tuple(size), memory_format=memory_format)
    except (RuntimeError, ValueError, TypeError) as e:
        raise type(e)(f"{aten.resize_.default}: {e}") from None
    size, stride = tuple(meta.shape), tuple(meta.stride())
    extent = 1 + sum((n - 1) * d for n, d in zip(size, stride)) if all(size) else 0
    need = self.storage_offset() + extent
    stor = self.untyped_storage()
    if need * self.dtype.itemsize > stor.nbytes():
        # Grow: a new storage whose prefix keeps the old contents, as on CPU.
        data = st.data_of(self)
        old = data.array.reshape(-1)
        if st.JAX_TO_TORCH.get(old.dtype) != self.dtype:
            old = executor.value(self).reshape(-1)
        grown = jnp.zeros((need,), old.dtype).at[: old.shape[0]].set(old[: need])
        fresh = st.empty_tensor((need,), self.dtype, self.device.index)
        st.attach(fresh, jax.device_put(grown, platform.jax_device(self.device.index)))
        stor = fresh.untyped_storage()
    return set_storage_offset(self, stor, self.storage_offset(), size, stride)


@kernel(aten.is_pinned.default)
def is_pinned(self, device=None):
    return False


# Backends whose dense tensors c10's TensorImpl::has_compatible_shallow_copy_type
# treats as one family: a tensor of one may take another's data through
# `param.data = new` (set_data, which module.to uses). PrivateUse1 is not in
# c10's list, so without this kernel a tpu tensor was compatible only with a
# tensor of its exact dispatch key set, and `module.to("tpu")` replaced every
# Parameter (tied weights came untied, an optimizer made before the move kept
# stale CPU tensors). CUDA is compatible with CPU; tpu is made so too. Sparse
# COO stays as c10 has it (SparseTensorImpl's shallow copy asserts c10's own
# rule), so a sparse parameter is replaced on the move.
_SHALLOW_COPY_DENSE = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", "tpu"})
_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _shallow_copy_family(t):
    if t.is_quantized or t.is_nested:
        return None
    if t.layout == torch.strided:
        return "dense" if t.device.type in _SHALLOW_COPY_DENSE else None
    if t.layout in _COMPRESSED:
        return "compressed"  # c10: any two compressed-sparse tensors
    return None


@kernel(aten._has_compatible_shallow_copy_type.default)
def has_compatible_shallow_copy_type(self, from_):
    """c10's rule with PrivateUse1 among the dense backends (see above)."""
    if torch._C._dispatch_keys(self) == torch._C._dispatch_keys(from_):
        return True
    family = _shallow_copy_family(self)
    return family is not None and family == _shallow_copy_family(from_)


@kernel(aten.is_set_to.default)
def is_set_to(self, tensor):
    return (self.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
            and self.storage_offset() == tensor.storage_offset()
            and tuple(self.shape) == tuple(tensor.shape)
            and tuple(self.stride()) == tuple(tensor.stride()))


@kernel(aten.equal.default)
def equal(self, other):
    if tuple(self.shape) != tuple(other.shape):
        return False
    return bool(torch.eq(self, other).all().item())
