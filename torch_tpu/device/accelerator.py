"""Make `torch.accelerator` work for `tpu`.

`torch.accelerator` calls C++ entry points (`torch._C._accelerator_*`) that
reach a backend through its C++ DeviceGuard and allocator. A backend
registered from Python gets a fixed C++ guard (device index always 0, setting
it a no-op) and has no C++ allocator, so those calls would report device 0
and fail on memory statistics. While `tpu` is the current accelerator, these
entry points are routed to `torch.tpu`; for any other accelerator the
original functions run unchanged.
"""

from __future__ import annotations

import torch

from . import module

from .._compat import Patch, apply

FEATURE = "torch.accelerator for tpu"
_WHY = ("a backend registered from Python has no C++ DeviceGuard index or allocator "
        "for torch.accelerator's C++ entry points to reach")


def _is_tpu() -> bool:
    return torch._C._get_privateuse1_backend_name() == "tpu"


def _routed(name, fn, orig):
    def routed(*args, **kwargs):
        if _is_tpu():
            return fn(*args, **kwargs)
        return orig(*args, **kwargs)

    routed.__name__ = name
    routed.__doc__ = f"{name}, routed to torch.tpu for the tpu device (see {__name__})."
    return routed


def _exchange(idx):
    prev = module.current_device()
    if idx is not None and idx >= 0:
        module.set_device(idx)
    return prev


def _stats(idx):
    s = module.memory_stats(idx if idx is not None and idx >= 0 else None)
    cur = s["allocated_bytes.all.current"]
    peak = s["allocated_bytes.all.peak"]
    reserved = s["reserved_bytes.all.current"]
    return {
        "allocated_bytes": {"all": {"current": cur, "peak": peak}},
        "active_bytes": {"all": {"current": cur, "peak": peak}},
        "reserved_bytes": {"all": {"current": reserved, "peak": max(reserved, peak)}},
        "num_live_arrays": s["num_live_arrays"],
    }


def _memory_info(idx):
    props = module.get_device_properties(idx if idx is not None and idx >= 0 else None)
    used = module.memory_reserved(props.index)
    return (max(props.total_memory - used, 0), props.total_memory)


_ROUTES = {
    "_accelerator_getDeviceIndex": lambda: module.current_device(),
    "_accelerator_setDeviceIndex": lambda idx: module.set_device(idx) if idx >= 0 else None,
    "_accelerator_exchangeDevice": _exchange,
    "_accelerator_maybeExchangeDevice": _exchange,
    "_accelerator_synchronizeDevice":
        lambda idx: module.synchronize(idx if idx is not None and idx >= 0 else None),
    "_accelerator_isAllocatorInitialized": lambda: True,
    "_accelerator_emptyCache": lambda: module.empty_cache(),
    "_accelerator_getDeviceStats": _stats,
    "_accelerator_resetPeakStats":
        lambda idx: module.reset_peak_memory_stats(idx if idx >= 0 else None),
    "_accelerator_resetAccumulatedStats": lambda idx: None,
    "_accelerator_getMemoryInfo": _memory_info,
}


def patches() -> dict:
    """The torch._C entry points routed to torch.tpu while tpu is the accelerator."""
    return {FEATURE: [Patch(f"torch._C:{name}", FEATURE, _WHY,
                            lambda orig, name=name, fn=fn: _routed(name, fn, orig))
                      for name, fn in _ROUTES.items()]}


def install() -> None:
    apply(FEATURE, patches()[FEATURE])
