"""The eager context: the process settings every eager op reads, in one object.

An eager op's cache key ends with its context (programs.EAGER_CONTEXT:
device, default dtype, precision, opt level), and whether it runs at all
depends on two modes (fused recording, launch blocking). Each setting has an
owner that validates and writes it; this object is where it is held and
where its readers, the C++ kernel included, read it:

| field             | owner (writes it)                     | read by                                 |
|-------------------|---------------------------------------|-----------------------------------------|
| `opt_level`       | `opt_level.set_level` (and its env)   | every program key, the C++ kernel       |
| `fused`           | `fused` (its `mode` stack, default)   | the executor, the C++ kernel            |
| `launch_blocking` | the environment, read here once       | executor, fused, asserts, the C++ kernel |
| `precision_state` | `executor`, from `runtime.precision` | the C++ kernel: its `.value` is the token |
| `precision_token` | `executor`, from `runtime.precision` | the C++ kernel, where there is no state |

The precision token itself lives in JAX's config (Python code calls
`precision.cache_token()`), the current device index is per thread
(runtime/device_index.py, or the native device guard), and the default
dtype is PyTorch's: they are read where they live (the device index also
through `device()`).

`CONTEXT` is the one instance; the C++ kernel gets it once
(`_native.setup_kernel`) and reads its slots by offset, so the class keeps
`__slots__` (csrc/README.md lists the names). It imports only
`device_index` (no JAX: both are in the start-up set).
"""

from __future__ import annotations

from typing import Any

from . import device_index
from .switches import switch_set


class EagerContext:
    """The eager settings of the process (see the module docstring)."""

    __slots__ = ("opt_level", "fused", "launch_blocking", "precision_state", "precision_token")

    opt_level: int
    """XLA optimization level of the programs compiled now (runtime.opt_level)."""
    fused: bool
    """Whether eager ops are recorded instead of run (runtime.fused)."""
    launch_blocking: bool
    """TORCH_TPU_LAUNCH_BLOCKING=1 (CUDA_LAUNCH_BLOCKING's analogue): every op
    waits for its results, so an asynchronous failure is raised by its op;
    every op runs in Python (the C++ kernel hands it back)."""
    precision_state: Any
    """JAX's matmul-precision config state (its `.value` is the token), or None."""
    precision_token: Any
    """`precision.cache_token`: the token where `precision_state` is None."""

    def __init__(self) -> None:
        self.opt_level = 3  # opt_level.DEFAULT; opt_level sets it from its env at import
        self.fused = False
        self.launch_blocking = switch_set("TORCH_TPU_LAUNCH_BLOCKING")
        self.precision_state = None
        self.precision_token = None

    @staticmethod
    def device() -> int:
        """This thread's current device index (runtime.device_index.current)."""
        return device_index.current()

    def __repr__(self) -> str:
        return (f"EagerContext(opt_level={self.opt_level}, fused={self.fused}, "
                f"launch_blocking={self.launch_blocking})")


CONTEXT = EagerContext()
