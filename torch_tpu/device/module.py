"""`torch.tpu`: the device module, named like `torch.cuda`.

Registered with `torch._register_device_module("tpu", ...)`, so after
`import torch_tpu` (or plain `import torch`, through the backend entry point)
`torch.tpu.device_count()`, `torch.tpu.manual_seed(0)` and friends work, and
`torch.accelerator` finds the device through the same functions.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass

import torch

from ..runtime import counters, device_index, loading  # no JAX: the start-up set
from ..runtime.switches import switch_value


class LazyModule:
    """A module imported on its first attribute access.

    `torch.tpu` is registered by the `torch.backends` autoload in every
    `import torch`, so this module imports no JAX: the runtime (JAX, the PJRT
    client) loads when a function here first needs it, after
    `torch_tpu.runtime.platform` has configured JAX.
    """

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr):
        mod = self._module
        if mod is None:
            importlib.import_module("torch_tpu.runtime.platform")
            mod = self._module = importlib.import_module(self._name)
        return getattr(mod, attr)

    def __repr__(self):
        return f"<lazy module {self._name!r}>"


jax = LazyModule("jax")
platform = LazyModule("torch_tpu.runtime.platform")
_memory = LazyModule("torch_tpu.device.memory")
_random = LazyModule("torch_tpu.runtime.rng")


def index_of(device=None) -> int:
    """The device index named by `device` (int, str, torch.device or None: the
    current device), checked against device_count(); serialization resolves
    its target device with it."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device) if not isinstance(device, torch.device) else device
        if d.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {d}")
        idx = d.index if d.index is not None else current_device()
    if idx < 0 or idx >= device_count():
        raise RuntimeError(
            f"Invalid device index tpu:{idx}: {device_count()} tpu device(s) available")
    return idx


# -- availability ----------------------------------------------------------


def is_available() -> bool:
    """Whether a tpu device exists.

    Until the runtime starts this is answered without starting it: dynamo
    asks `torch.accelerator.is_available()` for every frame it traces, in
    processes that never use tpu too, and starting JAX for that would load it
    into every `torch.compile`. JAX always has its CPU platform, which torch_tpu
    runs on when there is no TPU or GPU, so an installed JAX is a device;
    only a platform named by ``TORCH_TPU_PLATFORM`` (which may be missing)
    needs the runtime to answer.
    """
    wanted = switch_value("TORCH_TPU_PLATFORM").lower()
    if not is_initialized() and wanted in ("", "cpu") and \
            importlib.util.find_spec("jax") is not None:
        return True
    try:
        return device_count() > 0
    except Exception:
        return False


def is_initialized() -> bool:
    """Whether the runtime (JAX's client and devices) has started in this process."""
    mod = sys.modules.get("torch_tpu.runtime.platform")
    return mod is not None and mod.devices.cache_info().currsize > 0


def _is_in_bad_fork() -> bool:
    return False


def init() -> None:
    platform.devices()


def device_count() -> int:
    return platform.device_count()


def current_device() -> int:
    return device_index.current()


def set_device(device) -> None:
    device_index.set_current(index_of(device))


class device:
    """Context manager that changes the current tpu device, like torch.cuda.device."""

    def __init__(self, device):
        self.idx = index_of(device) if device is not None else None
        self.prev = None

    def __enter__(self):
        self.prev = current_device()
        if self.idx is not None:
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


class device_of(device):
    """Context manager that makes the device of `obj` (a tensor) current."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


def synchronize(device=None) -> None:
    """Wait for every op dispatched to `device` (all devices if None) to finish."""
    if not loading.is_loaded():
        # The backend has not loaded (it does at the first op): nothing was
        # dispatched, so there is nothing to wait for.
        if device is not None:
            index_of(device)
        return
    counters.count("synchronize")
    from ..runtime import fused  # lazy: JAX (this module is in the start-up set)

    fused.flush()  # ops recorded in fused eager mode run now
    from ..runtime import async_compile  # lazy: as above

    async_compile.synchronize()  # ops waiting for their executables run now
    jax.effects_barrier()
    devs = platform.devices() if device is None else (platform.jax_device(index_of(device)),)
    # Raises the error of failed asynchronous work, as torch.cuda.synchronize().
    _memory.synchronize(devs)
    from ..runtime import asserts  # lazy: as above

    asserts.check()  # device-side checks (index bounds) of the ops that ran


# -- properties ------------------------------------------------------------


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    platform: str
    device_kind: str
    index: int
    total_memory: int
    jax_device: str

    def __repr__(self):
        return (f"_TpuDeviceProperties(name={self.name!r}, platform={self.platform!r}, "
                f"device_kind={self.device_kind!r}, total_memory={self.total_memory // 2**20}MB)")


def get_device_properties(device=None) -> _DeviceProperties:
    idx = index_of(device)
    d = platform.jax_device(idx)
    stats = _memory.raw_stats(idx)
    total = int(stats.get("bytes_limit", 0)) if stats else 0
    if not total:
        import os
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return _DeviceProperties(get_device_name(idx), platform.platform(), d.device_kind, idx,
                             total, repr(d))


def get_device_name(device=None) -> str:
    d = platform.jax_device(index_of(device))
    return f"{d.device_kind} ({platform.platform()})"


def get_device_capability(device=None):
    return (0, 0)


# -- RNG -------------------------------------------------------------------


def manual_seed(seed: int) -> None:
    _random.manual_seed(seed, current_device())


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _random.manual_seed(seed, i)


def seed() -> None:
    _random.seed(current_device())


def seed_all() -> None:
    s = _random.seed(0)
    for i in range(1, device_count()):
        _random.manual_seed(s, i)


def initial_seed() -> int:
    return _random.initial_seed(current_device())


def get_rng_state(device="tpu") -> torch.Tensor:
    return _random.get_state(index_of(device))


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _random.set_state(new_state, index_of(device))


def get_rng_state_all():
    return [_random.get_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        _random.set_state(s, i)


# -- memory ----------------------------------------------------------------


def memory_allocated(device=None) -> int:
    return _memory.allocated(index_of(device))


def max_memory_allocated(device=None) -> int:
    return _memory.peak(index_of(device))


def reset_peak_memory_stats(device=None) -> None:
    _memory.reset_peak(index_of(device))


def memory_stats(device=None) -> dict:
    return _memory.stats(index_of(device))


def empty_cache() -> None:
    """As torch.cuda.empty_cache. On XLA:CPU it first waits for dispatched
    work, as synchronize() (raising its deferred errors), then returns the
    process heap's freed memory to the system (device/memory.empty_cache)."""
    _memory.empty_cache(synchronize if loading.is_loaded() else None)


def memory_reserved(device=None) -> int:
    return _memory.reserved(index_of(device))


def max_memory_reserved(device=None) -> int:
    return _memory.peak(index_of(device))


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the device, as torch.cuda.mem_get_info."""
    return _memory.mem_get_info(index_of(device))


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of the device's memory and its largest live buffers."""
    return _memory.summary(index_of(device), abbreviated)


def memory_snapshot(device=None) -> list:
    """Every live device buffer (all devices if None), largest first, with
    shape, dtype and the op that produced it."""
    return _memory.snapshot(None if device is None else index_of(device))


# -- streams (PJRT orders work per device; one stream each) ----------------


class Stream:
    """The single in-order stream of a tpu device (PJRT keeps one per device)."""

    def __init__(self, device=None, priority=0):
        self.device = torch.device("tpu", index_of(device))

    def synchronize(self):
        synchronize(self.device)

    def wait_stream(self, stream):
        pass

    def query(self):
        return True

    def record_event(self, event=None):
        """Record `event` (a new `torch.tpu.Event` if None) here and return it."""
        if event is None:
            event = Event()
        event.record()
        return event

    def wait_event(self, event):
        # One in-order stream per device: the work recorded before `event`
        # already precedes everything issued after this call.
        return None


class Event(torch.Event):
    """A tpu event (`torch.tpu.Event`), recorded on the device's one stream."""

    def synchronize(self):
        synchronize()


def current_stream(device=None) -> Stream:
    return Stream(device)


def default_stream(device=None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(s):
    yield s


# -- the rest of the backend -------------------------------------------------

# Functions the rest of torch_tpu adds to `torch.tpu` when it loads (see
# torch_tpu/device/autocast.py); asking for one loads the backend first.
_BACKEND_NAMES = frozenset(("set_matmul_precision", "get_matmul_precision", "matmul_precision",
                            "get_amp_supported_dtype", "is_bf16_supported"))


def __getattr__(name):
    if name in _BACKEND_NAMES:
        loading.load()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")

