"""The native fast path of eager ops (csrc/; csrc/README.md states the contract), or None.

The eager hot path spends most of its host time on bookkeeping: building the
cache key, creating each result tensor (a TensorImpl, a sized storage at a
virtual address, the DeviceData on it). `torch_tpu.runtime._native`, built
by `pip install` from csrc/*.cpp, does those steps in C++; the
behaviour stays defined by the Python code it replaces (keys.classify,
storage.empty_tensor/wrap), which still runs whenever the native part hands a
call back and when the extension is absent.

`NATIVE` is the loaded module, or None when TORCH_TPU_NATIVE=0 (forces the
pure-Python path) or the extension was not built or does not match this
torch (`REASON` says why, and a warning at import says it too).
tests/test_fastpath.py fails when an installed build silently goes unused.
"""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

from .switches import switch_on
from .._compat import jax_api

_T = TypeVar("_T")

NATIVE: ModuleType | None = None
REASON = ""
NATIVE_API = 4  # csrc/fastpath.cpp's KERNEL_API: the signatures this module calls

if not switch_on("TORCH_TPU_NATIVE"):
    REASON = "TORCH_TPU_NATIVE=0"
else:
    from .._version import reinstall_command

    try:
        from . import _native
    except ImportError as e:
        REASON = f"the extension is not built ({e}); build it with `{reinstall_command()}`"
    else:
        import torch

        # C++ ABI: only into the torch release it was built against (a CPU
        # or CUDA build of it alike: "2.13.0+cpu" and "2.13.0" share it); and
        # only a build of this source's function signatures (csrc/README.md).
        if _native.TORCH_VERSION.split("+")[0] != torch.__version__.split("+")[0]:
            REASON = (f"the extension was built for torch {_native.TORCH_VERSION}, this is "
                      f"{torch.__version__}; rebuild it for this torch with `{reinstall_command()}`")
        elif (api := getattr(_native, "KERNEL_API", 1)) != NATIVE_API:
            REASON = (f"the extension was built from an older torch_tpu (API {api}, this one "
                      f"needs {NATIVE_API}); rebuild it with `{reinstall_command()}`")
        elif not jax_api.native_call_usable():  # (its one warning said so)
            REASON = f"JAX's Compiled changed: {jax_api.NATIVE_CALL} is off"
        else:
            NATIVE = _native

ACTIVE = NATIVE is not None
if not ACTIVE and REASON != "TORCH_TPU_NATIVE=0" and not REASON.startswith("JAX's"):
    # A build that silently goes unused makes every eager op slower: said out
    # loud (TORCH_TPU_NATIVE=0 chooses the pure-Python path and stays quiet).
    import warnings

    warnings.warn(f"torch_tpu: the native fast path is off: {REASON} (eager ops take the "
                  "slower pure-Python path)", RuntimeWarning, stacklevel=2)

# The native kernel (executor.install_kernel): ops' cache hits run in C++ from
# the dispatcher, without entering the Python kernel. TORCH_TPU_NATIVE_KERNEL=0
# keeps the Python kernels in front (the rest of the native path stays).
KERNEL = ACTIVE and switch_on("TORCH_TPU_NATIVE_KERNEL")
# Ops with a common signature (tensors, Scalars, an optional dtype) get the
# kernel unboxed; TORCH_TPU_NATIVE_UNBOXED=0 registers every one boxed.
UNBOXED = KERNEL and switch_on("TORCH_TPU_NATIVE_UNBOXED")
# Each kernel remembers its recent hits by a key of plain numbers, so a repeat
# builds no Python key and looks up no dict; TORCH_TPU_NATIVE_MEMO=0 turns the
# memo off (every hit goes through the executor's dict).
MEMO = KERNEL and switch_on("TORCH_TPU_NATIVE_MEMO")


def install_device_guard(count: int) -> None:
    """Make PyTorch's `tpu` device guard the native one (csrc/device_guard.cpp),
    reporting `count` devices, once the runtime knows them.

    The guard torch's Python backend API registers reports one device, so the
    autograd engine, which sizes its per-device queues from it at the first
    backward, failed an internal assert on a backward through tpu:1 and up.
    Without the extension that guard stays (one device for autograd).
    """
    global GUARD
    if NATIVE is not None and hasattr(NATIVE, "install_device_guard"):
        NATIVE.install_device_guard(max(1, count))
        GUARD = True


# Whether the native guard is PyTorch's tpu guard: the current device is then
# the guard's (per thread; autograd's worker for tpu:N has N), as on CUDA.
GUARD = False


def set_device_index(index: int) -> None:
    """Tell the native guard this thread's current device (torch.tpu.set_device)."""
    if NATIVE is not None and hasattr(NATIVE, "set_device_index"):
        NATIVE.set_device_index(index)


# platform.jax_device, installed by runtime.platform when it loads (it imports
# this module); the native call asks for scalar arrays only after that.
JAX_DEVICE: list = []


class ScalarArrays:
    """A bounded table of Python scalars as device arrays: {key: array}.

    Eager ops take their Python numbers as device scalars made once per
    value (a transfer per call otherwise). A program that makes a new float
    every step (an optimizer's bias corrections, a schedule's learning rate)
    would keep one 0-dim device buffer per value for the life of the
    process, so the table holds at most `limit` entries and evicts the
    oldest first: live buffers stay flat at `limit` (device bytes at most
    16 x `limit`, a complex128 each). First in, first out rather than least
    recently used: the native call reads `arrays` (a plain dict) directly on
    every hit and must not pay for bookkeeping there; a value evicted while
    still in use is made again, one transfer.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.arrays: dict = {}  # insertion order is age: the first key is the oldest

    def put(self, key: object, array: _T) -> _T:
        """Remember `array` under `key`, evicting the oldest entries beyond the limit."""
        arrays = self.arrays
        arrays.pop(key, None)
        while len(arrays) >= self.limit:
            del arrays[next(iter(arrays))]
        arrays[key] = array
        return array


# Python scalars as the device arrays a jitted call makes of them, by
# (type, value, device index): filled through _scalar_array (the native
# `call` asks it on a miss) and by fused programs (fused._device_scalars),
# read by both. Floats equal to zero are keyed by their text (-0.0), and the
# native call caches none (it cannot tell the sign apart). scalars.weak32's
# 32-bit arrays are another value of the same number and have their own table.
SCALARS = ScalarArrays(1024)
SCALAR_ARRAYS = SCALARS.arrays


def _scalar_array(value: object, index: int) -> object:
    """`value`, a Python scalar input of an executable, as the device array a
    jitted call makes of it on tpu:index (same aval, weak type included),
    remembered in SCALARS for the native `call`'s next lookup; `value` itself
    (remembered too) when no such array exists."""
    import jax

    try:
        array = jax.device_put(value, JAX_DEVICE[0](index))
    except (OverflowError, TypeError, ValueError):
        array = value
    else:
        if jax.typeof(array) != jax.typeof(value):
            array = value
    return SCALARS.put((type(value), value, index), array)


if NATIVE is not None:
    from jax import stages as _stages

    NATIVE.setup_call(_stages.Compiled, _scalar_array, SCALAR_ARRAYS)
