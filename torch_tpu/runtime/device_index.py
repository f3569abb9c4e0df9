"""The current tpu device index of this thread (`torch.tpu.current_device()`).

Held here, below everything that reads it (the executor, the platform,
compile, ops); `torch.tpu.set_device` writes it. Once the runtime's native
device guard is installed, the guard's per-thread index is the one (autograd's
per-device workers set it). No JAX: part of the start-up set.
"""

from __future__ import annotations

import sys
import threading

_tls = threading.local()
_FASTPATH = __name__.rsplit(".", 1)[0] + ".fastpath"


def current() -> int:
    """This thread's current device index (0 unless set)."""
    fastpath = sys.modules.get(_FASTPATH)  # loaded with the runtime; never imported here
    if fastpath is not None and fastpath.GUARD:
        # The C++ guard's: also what autograd's per-device workers set.
        return fastpath.NATIVE.device_index()
    return getattr(_tls, "index", 0)


def set_current(idx: int) -> None:
    """Make `idx` (already checked) this thread's current device index."""
    _tls.index = idx
    # PyTorch's C++ side (torch.accelerator, the device guard) sees it too,
    # once the runtime (and its native guard) is loaded.
    fastpath = sys.modules.get(_FASTPATH)
    if fastpath is not None:
        fastpath.set_device_index(idx)
