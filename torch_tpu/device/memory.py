"""Device memory statistics for `torch.tpu.memory_*`.

Where PJRT reports allocator statistics (TPU, GPU) they are used as they are.
XLA:CPU reports none, so there the numbers are the bytes of live jax.Arrays
on the device (what tensors and cached values hold); the peak is the largest
value seen at any query, synchronize, or reset, which is documented as a
sampled peak on CPU.
"""

from __future__ import annotations

import gc

import jax

from ..runtime import platform

_peak: dict = {}


def raw_stats(index: int):
    try:
        return platform.jax_device(index).memory_stats()
    except Exception:
        return None


def _live_bytes(index: int) -> int:
    dev = platform.jax_device(index)
    total = 0
    for a in jax.live_arrays(platform.platform()):
        try:
            if dev in a.devices():
                total += a.nbytes
        except Exception:
            continue
    return total


def allocated(index: int) -> int:
    stats = raw_stats(index)
    if stats and "bytes_in_use" in stats:
        value = int(stats["bytes_in_use"])
    else:
        value = _live_bytes(index)
    _peak[index] = max(_peak.get(index, 0), value)
    return value


def peak(index: int) -> int:
    stats = raw_stats(index)
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    allocated(index)
    return _peak.get(index, 0)


def reset_peak(index: int) -> None:
    _peak[index] = 0
    _peak[index] = allocated(index)


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
        "num_live_arrays": sum(1 for a in jax.live_arrays(platform.platform())
                               if platform.jax_device(index) in a.devices()),
    }
    raw = raw_stats(index)
    if raw:
        out.update({f"pjrt.{k}": v for k, v in raw.items()})
    return out


def empty_cache() -> None:
    """Release what Python still holds for dead tensors; PJRT frees on release."""
    gc.collect()
