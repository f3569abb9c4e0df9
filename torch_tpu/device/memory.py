"""Device memory statistics for `torch.tpu.memory_*`.

Where PJRT reports allocator statistics (TPU, GPU) they are used as they are.
XLA:CPU reports none, so there the numbers are the bytes of live jax.Arrays
on the device (what tensors and cached values hold); the peak is the largest
value seen at any query, synchronize, or reset, which is documented as a
sampled peak on CPU. An array whose computation failed (an allocation that
did not fit) is never counted.

`mem_get_info`, `summary` (torch.tpu.memory_summary) and `snapshot`
(torch.tpu.memory_snapshot: every live buffer, largest first, with the op that
produced it) answer "what is holding my device memory?". The producing op is
recorded when a storage is created (`DeviceData.origin`: one attribute store)
and looked up only when a snapshot is taken.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import sys

from ..runtime import memory_history, oom, platform
from ..runtime import storage as st
from ..runtime.oom import fmt

_peak: dict = {}


raw_stats = oom.raw_stats
_live_bytes = oom.live_bytes


def allocated(index: int) -> int:
    stats = raw_stats(index)
    if stats and "bytes_in_use" in stats:
        value = int(stats["bytes_in_use"])
    else:
        value = _live_bytes(index)
    if st.RECORD is not None:  # a memory history: its arrays become the live ones
        memory_history.reconcile(index, oom.live_arrays(index))
    _peak[index] = max(_peak.get(index, 0), value)
    return value


def peak(index: int) -> int:
    """PJRT's peak where reported; else the largest value sampled, or, while
    a memory history records, the largest it saw (exact at op granularity)."""
    stats = raw_stats(index)
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    allocated(index)
    return max(_peak.get(index, 0), memory_history.recorded_peak(index))


def reset_peak(index: int) -> None:
    _peak[index] = 0
    _peak[index] = allocated(index)
    memory_history.reset_peak(index)


def keep_peaks(peaks: dict) -> None:
    """Keep a stopping memory history's peaks (device index -> bytes) as the
    sampled peaks, so max_memory_allocated() still reports them after it."""
    for i, v in peaks.items():
        _peak[i] = max(_peak.get(i, 0), v)


def reserved(index: int) -> int:
    stats = raw_stats(index)
    if stats and "bytes_reserved" in stats:
        return int(stats["bytes_reserved"])
    return allocated(index)


def sample() -> None:
    for i in list(_peak):
        allocated(i)


def stats(index: int) -> dict:
    cur = allocated(index)
    out = {
        "allocated_bytes.all.current": cur,
        "allocated_bytes.all.peak": peak(index),
        "reserved_bytes.all.current": reserved(index),
        "num_live_arrays": len(oom.live_arrays(index)),
    }
    raw = raw_stats(index)
    if raw:
        out.update({f"pjrt.{k}": v for k, v in raw.items()})
    return out


def empty_cache(wait=None) -> None:
    """Release what Python still holds for dead tensors (PJRT frees a buffer
    when it is released). On XLA:CPU, whose buffers live in the process's
    heap, also wait for dispatched work (`wait`: the buffers it still uses
    are freed when it ends) and hand the heap's freed memory back to the
    system: glibc keeps it for reuse, so after an eager training step
    resident memory runs well above the live arrays (docs/troubleshooting.md).
    That is this platform's counterpart of torch.cuda.empty_cache returning
    the caching allocator's blocks."""
    cpu = platform.platform() == "cpu"
    if cpu and wait is not None:
        wait()
    gc.collect()
    if cpu:
        trim_heap()


def trim_heap() -> bool:
    """glibc's malloc_trim(0): True if memory was returned (False elsewhere)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def synchronize(devs) -> None:
    """torch.tpu.synchronize: wait, raise failed asynchronous work, sample the peak."""
    try:
        oom.synchronize(devs)
    finally:
        sample()


def mem_get_info(index: int) -> tuple:
    """(free, total) bytes of tpu:index, as torch.cuda.mem_get_info.

    TPU/GPU: PJRT's bytes_limit and bytes_limit - bytes_in_use. XLA:CPU
    reports nothing: total is the memory limit the out-of-memory check uses
    (TORCH_TPU_MEMORY_LIMIT, else the host's memory or cgroup limit) and free
    is total minus the live device arrays, at most the host's MemAvailable.
    """
    stats = raw_stats(index)
    if stats and stats.get("bytes_limit"):
        total = int(stats["bytes_limit"])
        lim = oom.limit(index)
        if lim is not None:
            total = min(total, lim)
        return max(total - int(stats.get("bytes_in_use", 0)), 0), total
    total = oom.limit(index) or oom.host_memory()
    free = max(total - allocated(index), 0)
    avail = _host_available()
    if avail is not None:
        free = min(free, avail)
    return free, total


def _host_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def snapshot(index: int | None = None) -> list:
    """Every live buffer on tpu:index (every device if None), largest first.

    Each is a dict: device, nbytes, shape, dtype, op (the op that created the
    tensor storage; None where it was made outside the executor, e.g. by a
    compiled graph), and tensor (False for arrays that no tensor holds: RNG
    state, cached constants, values kept alive by Python references).
    """
    owners = {}
    for o in gc.get_objects():
        if type(o) is st.DeviceData:
            raw = o.raw
            # A value computed in the background (runtime.async_compile): its array.
            peek = getattr(raw, "peek", None)
            owners[id(peek() if peek is not None else raw)] = o
    indices = range(platform.device_count()) if index is None else (index,)
    out = []
    for i in indices:
        for a in oom.live_arrays(i):
            d = owners.get(id(a))
            out.append({
                "device": f"tpu:{i}",
                "nbytes": int(a.nbytes),
                "shape": tuple(a.shape),
                "dtype": d.dtype if d is not None else str(a.dtype),
                "op": d.origin if d is not None else None,
                "tensor": d is not None,
            })
    out.sort(key=lambda b: -b["nbytes"])
    return out


def summary(index: int, abbreviated: bool = False, top: int = 10) -> str:
    """A readable table of tpu:index's memory, like torch.cuda.memory_summary."""
    cur = allocated(index)
    pk = peak(index)
    stats = raw_stats(index)
    free, total = mem_get_info(index)
    bufs = snapshot(index)
    tensors = [b for b in bufs if b["tensor"]]
    source = "PJRT allocator" if stats and "bytes_in_use" in stats else \
        "live arrays (XLA:CPU reports no allocator statistics; peak is sampled)"
    rows = [
        ("Allocated memory", fmt(cur)),
        ("Peak allocated memory", fmt(pk)),
        ("Reserved memory", fmt(int(stats["bytes_reserved"])) if stats and "bytes_reserved" in stats
         else "not reported by this platform"),
        ("Free / total", f"{fmt(free)} / {fmt(total)} ({oom.limit_source(index)})"),
        ("Live buffers", f"{len(bufs)} ({len(tensors)} held by tensors, "
                         f"{fmt(sum(b['nbytes'] for b in tensors))})"),
    ]
    if stats:
        for k in ("num_allocs", "largest_alloc_size", "largest_free_block_bytes"):
            if k in stats:
                rows.append((f"PJRT {k}", str(stats[k])))
    width = 78
    lines = ["=" * width,
             f" torch.tpu memory summary, device tpu:{index} ({platform.platform()} platform)",
             f" source: {source}",
             "-" * width]
    lines += [f" {k:<28}| {v}" for k, v in rows]
    if not abbreviated and bufs:
        lines += ["-" * width, f" Largest live buffers (of {len(bufs)}):",
                  f" {'size':>12}  {'dtype':<16} {'shape':<20} op"]
        for b in bufs[:top]:
            dtype = str(b["dtype"]).replace("torch.", "")
            op = b["op"] or ("(tensor)" if b["tensor"] else "(no tensor)")
            shape = str(list(b["shape"]))
            if len(shape) > 20:
                shape = shape[:17] + "..."
            lines.append(f" {fmt(b['nbytes']):>12}  {dtype:<16} {shape:<20} {op}")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
