"""Device-side asserts: value-dependent errors reported when the host next waits.

An index out of range is a property of values on the device. Checking it on
the host before each op would read the index tensor back and serialize the
program; CUDA instead checks inside the kernel and reports a "device-side
assert" at the next synchronizing call. Here an op that needs such a check
dispatches a small check *op* of its own next to it (`torch_tpu::index_bounds`,
see `torch_tpu.ops.bounds`): its result, a tensor still on the device, is
handed to `defer` with a function that builds the error. Nothing waits.

Pending checks are read, and the first failure raised, at the next point
where the host waits anyway: any read of a device value (`.item()`,
`.cpu()`, printing; `storage.host_array`), and `torch.tpu.synchronize()`.
With ``TORCH_TPU_LAUNCH_BLOCKING=1`` each check is read at once, so the
error is raised by the op that caused it. A loop that never reads a value is
checked every `MAX_PENDING` checks, so the list stays bounded.

Each failure is raised once; the checks pending with it are dropped (their
ops ran after the failure, as CUDA's do after an assert).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import storage as st
from .context import CONTEXT

MAX_PENDING = 1024

_lock = threading.Lock()
_pending: list[tuple[Any, Callable[[np.ndarray], BaseException | None]]] = []


class DeviceIndexError(IndexError, RuntimeError):
    """An index out of range found by a device-side check.

    Both an `IndexError` (what CPU raises for indexing, `index_select`,
    `embedding`, `take`) and a `RuntimeError` (what CPU raises for `gather`
    and `scatter`, and CUDA for any device-side assert), so code written for
    either catches it."""


def defer(flags: Any, make_error: Callable[[np.ndarray], BaseException | None]) -> None:
    """Hold device tensor `flags` until the host next waits; then
    `make_error(host value)` returns the error to raise, or None."""
    if CONTEXT.launch_blocking:
        _raise_first([(flags, make_error)])
        return
    with _lock:
        _pending.append((flags, make_error))
        full = len(_pending) >= MAX_PENDING
    if full:
        check()


def check() -> None:
    """Read every pending check; raise the first failure (once)."""
    if not _pending:
        return
    with _lock:
        todo = _pending[:]
        _pending.clear()
    _raise_first(todo)


def pending() -> int:
    return len(_pending)


def discard() -> None:
    """Drop the pending checks unread (a process that forks, tests)."""
    with _lock:
        _pending.clear()


def _raise_first(todo: list) -> None:
    for flags, make_error in todo:
        try:
            value = np.asarray(st.data_of(flags).array)
        except Exception:  # noqa: BLE001 - the check's own op failed: its error is reported elsewhere
            continue
        err = make_error(value)
        if err is not None:
            raise err


st.BEFORE_HOST_READ.append(check)  # host reads raise the pending checks first
