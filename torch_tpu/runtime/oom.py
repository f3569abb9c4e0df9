"""Device memory limits and out-of-memory errors.

`torch.OutOfMemoryError` is raised, naming the op, the bytes it asked for, the
device and what is in use there, in three places:

1. before an op runs, when the bytes of its results (known from PyTorch's
   shape rules before anything executes) exceed what is free on the device:
   the device's limit minus what is in use;
2. when PJRT fails to allocate while the op is dispatched (its
   RESOURCE_EXHAUSTED status, translated);
3. when asynchronous work failed after the op returned: at the next read of
   the value (`.cpu()`, `.item()`, print), at `torch.tpu.synchronize()`, or at
   the op itself under `TORCH_TPU_LAUNCH_BLOCKING=1`.

The limit of a device is `TORCH_TPU_MEMORY_LIMIT` (bytes, or with a K/M/G/T
suffix; `off` turns the check before running off), else PJRT's `bytes_limit`
(TPU, GPU), else, on XLA:CPU, whose PJRT client reports no memory statistics,
the host's memory (physical memory, or the cgroup's limit when lower): the
device *is* host memory there. What is in use is PJRT's `bytes_in_use` where
reported, else the bytes of the live arrays on the device.

The check before running costs nothing on the hot path of small ops: only
results of at least 1/64 of the limit are checked (on every call; on the CPU
platform the check walks the live arrays). A smaller result that does not
fit fails to allocate, which is reported as the same error (2. and 3.).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import jax
import torch

from . import platform, programs
from .host_memory import host_memory, parse_bytes
from .switches import switch_value

def raw_stats(index: int) -> dict[str, Any] | None:
    """PJRT's memory statistics of tpu:index (None on XLA:CPU)."""
    try:
        return platform.jax_device(index).memory_stats()
    except Exception:  # noqa: BLE001  (a client without the call)
        return None


_limits: dict = {}


def limit(index: int) -> int | None:
    """The memory limit of tpu:index in bytes (None: not checked)."""
    try:
        return _limits[index]
    except KeyError:
        pass
    env = switch_value("TORCH_TPU_MEMORY_LIMIT")
    if env:
        value = parse_bytes(env, "TORCH_TPU_MEMORY_LIMIT")
    else:
        stats = raw_stats(index)
        value = int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else host_memory()
    _limits[index] = value
    return value


def limit_source(index: int) -> str:
    if switch_value("TORCH_TPU_MEMORY_LIMIT"):
        return "TORCH_TPU_MEMORY_LIMIT"
    stats = raw_stats(index)
    return "PJRT bytes_limit" if stats and stats.get("bytes_limit") else "host memory"


def failed(array: Any, wait_from: float = float("inf")) -> bool:
    """Whether `array`'s computation finished with an error (`array`: a
    concrete jax array; `is_ready` is not on the abstract `jax.Array`). Pending arrays
    of at least `wait_from` bytes are waited for; smaller ones count as
    allocated."""
    try:
        if not array.is_ready() and array.nbytes < wait_from:
            return False
        array.block_until_ready()
        return False
    except Exception:  # noqa: BLE001  (the failure itself, or a deleted array)
        return True


def live_arrays(index: int) -> list[jax.Array]:
    """The live arrays on tpu:index whose allocation succeeded.

    Pending arrays of at least 1/64 of the device's limit (those that may not
    fit) are waited for, so one that failed to allocate is never counted;
    smaller pending ones count as allocated without waiting.
    """
    programs.settle()  # ops whose executables were compiling have allocated by now
    dev = platform.jax_device(index)
    wait_from = (limit(index) or host_memory()) / 64
    out = []
    for a in jax.live_arrays(platform.platform()):
        try:
            if a.is_deleted() or dev not in a.devices() or failed(a, wait_from):
                continue
        except Exception:  # noqa: BLE001
            continue
        out.append(a)
    return out


def live_bytes(index: int) -> int:
    total = 0
    for a in live_arrays(index):
        try:
            total += a.nbytes
        except Exception:  # noqa: BLE001
            continue
    return total


def in_use(index: int) -> int:
    programs.settle()  # (see live_arrays)
    stats = raw_stats(index)
    if stats and "bytes_in_use" in stats:
        return int(stats["bytes_in_use"])
    return live_bytes(index)


def check_threshold(index: int) -> float:
    """Results at least this large are checked on every call (1/64 of the limit)."""
    lim = limit(index)
    return float("inf") if lim is None else lim / 64


def check(op: str, nbytes: int, index: int) -> None:
    """Raise OutOfMemoryError when `nbytes` more do not fit on tpu:index."""
    lim = limit(index)
    if lim is None or nbytes <= 0:
        return
    if nbytes > lim:
        raise error(op, index, nbytes, used=None)
    used = in_use(index)
    if nbytes > lim - used:
        raise error(op, index, nbytes, used=used)


def fmt(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def error(op: str, index: int, nbytes: int | None, used: int | None = None,
          cause: str | None = None) -> torch.OutOfMemoryError:
    lim = limit(index)
    if used is None:
        try:
            used = in_use(index)
        except Exception:  # noqa: BLE001
            used = None
    asked = f"Tried to allocate {fmt(nbytes)} ({nbytes} bytes)" if nbytes else "Allocation failed"
    parts = [f"tpu out of memory in {op}. {asked} on tpu:{index} ({platform.platform()} platform)."]
    if lim is not None:
        free = max(lim - used, 0) if used is not None else None
        parts.append(f"The device has a limit of {fmt(lim)} ({limit_source(index)})"
                     + (f" of which {fmt(free)} is free" if free is not None else "") + ".")
    if used is not None:
        parts.append(f"In use by live tensors and buffers: {fmt(used)} "
                     "(torch.tpu.memory_snapshot() lists the largest).")
    if cause:
        parts.append(f"PJRT: {cause}")
    return torch.OutOfMemoryError(" ".join(parts))


_OOM = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory")
_ASKED = re.compile(r"(?:allocating|allocate)\s+(\d+)\s+bytes")


def is_oom(exc: BaseException) -> bool:
    return bool(_OOM.search(str(exc)))


def translate(exc: BaseException, op: str, index: int, nbytes: int | None = None) -> BaseException:
    """PJRT's error `exc` raised for `op`: OutOfMemoryError when it is one, else a
    RuntimeError naming the op (JaxRuntimeError is a RuntimeError)."""
    msg = str(exc)
    if is_oom(exc):
        m = _ASKED.search(msg)
        asked = int(m.group(1)) if m else nbytes
        return error(op, index, asked, cause=msg.strip().splitlines()[0] if msg else None)
    if op in msg:
        return exc
    return RuntimeError(f"{op}: {msg}")


def ready(arrays: Iterable[Any], op: str, index: int) -> None:
    """Wait for `arrays`; raise their failure as PyTorch's error for `op`."""
    for a in arrays:
        if not hasattr(a, "block_until_ready"):
            continue
        try:
            a.block_until_ready()
        except Exception as e:  # noqa: BLE001
            if getattr(a, "is_deleted", None) and a.is_deleted():
                continue
            raise translate(e, op, index) from None


# Failed arrays already reported by synchronize() (each is reported once).
_reported: set = set()


def synchronize(devs: Iterable[jax.Device]) -> None:
    """Wait for all work on `devs` (PJRT devices); then raise, as PyTorch's
    error, the failure of the first failed array not reported before.

    A failed array is reported by one synchronize(); reading its tensor
    (`.cpu()`, `.item()`) raises the same error again every time.
    """
    import weakref

    devs = set(devs)
    first = None
    for a in jax.live_arrays(platform.platform()):
        try:
            if a.is_deleted() or not (a.devices() & devs):
                continue
            a.block_until_ready()
        except Exception as e:  # noqa: BLE001
            try:
                if a.is_deleted() or id(a) in _reported:
                    continue
                dev = next(iter(a.devices()))
            except Exception:  # noqa: BLE001
                continue
            key = id(a)
            _reported.add(key)
            weakref.finalize(a, _reported.discard, key)
            if first is None:
                index = platform.devices().index(dev) if dev in platform.devices() else 0
                first = translate(e, "asynchronous work dispatched earlier (set "
                                  "TORCH_TPU_LAUNCH_BLOCKING=1 to raise it at its op)",
                                  index, getattr(a, "nbytes", None))
    if first is not None:
        raise first
