"""Which JAX/PJRT platform backs the `tpu` device, and its devices.

`TORCH_TPU_PLATFORM=tpu|gpu|cpu` picks one; by default the best present
(TPU, then GPU, then the host CPU through XLA:CPU). JAX is configured once,
before any array is created: 64-bit types are enabled so int64/float64 keep
PyTorch's dtypes exactly.
"""

from __future__ import annotations

import functools
import importlib.util

from .switches import switch_value
from .xla_flags import add_cpu_defaults

add_cpu_defaults()  # before JAX creates a backend: XLA reads XLA_FLAGS then

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from .._compat import jax_api  # noqa: E402
from . import device_index, fastpath  # noqa: E402 (after JAX's configuration)

_ORDER = ("tpu", "gpu", "cpu")


@functools.cache
def platform() -> str:
    """The JAX platform name used for `tpu` devices ('tpu', 'gpu' or 'cpu')."""
    wanted = switch_value("TORCH_TPU_PLATFORM").lower()
    if wanted:
        if wanted == "cuda":
            wanted = "gpu"
        if wanted not in _ORDER:
            raise RuntimeError(
                f"TORCH_TPU_PLATFORM={wanted!r} is not one of tpu, gpu, cpu")
        try:
            jax.devices(wanted)
        except RuntimeError as e:
            raise RuntimeError(
                f"TORCH_TPU_PLATFORM={wanted!r} but JAX has no such backend: {e}") from None
        return wanted
    for name in _ORDER:
        try:
            if jax.devices(name):
                return name
        except RuntimeError:
            continue
    return "cpu"


def platform_hint() -> str:
    """The platform `platform()` will choose, without starting any JAX client
    (distributed.launch.set_tpu_launch_env picks the environment variables to
    set by it, before the TPU runtime may start)."""
    want = switch_value("TORCH_TPU_PLATFORM").lower()
    if want:
        return "gpu" if want == "cuda" else want
    if jax_api.backends_started():
        return platform()
    if importlib.util.find_spec("libtpu") is not None:
        return "tpu"
    for mod in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin"):
        if importlib.util.find_spec(mod) is not None:
            return "gpu"
    return "cpu"


@functools.cache
def devices() -> tuple:
    """The PJRT devices of the chosen platform; `tpu:i` is devices()[i]."""
    devs = tuple(jax.local_devices(backend=platform()))
    index = device_index.current()  # torch.tpu.set_device's, before the guard takes over
    fastpath.install_device_guard(len(devs))
    fastpath.set_device_index(index)
    return devs


def device_count() -> int:
    return len(devices())


def jax_device(index: int) -> jax.Device:
    devs = devices()
    if index < 0 or index >= len(devs):
        raise RuntimeError(
            f"Invalid device index tpu:{index}: only {len(devs)} tpu device(s) "
            f"are available (platform {platform()!r})")
    return devs[index]


@functools.cache
def array_class() -> type[jax.Array]:
    """The concrete class of the platform's jax.Arrays (for exact type checks
    on hot paths), from one transferred scalar: `type(jnp.zeros(()))`
    compiled a program for it, ~0.1 s of every process's start-up."""
    import numpy as np

    return type(jax.device_put(np.zeros((), np.float32), jax_device(0)))


def supports_float64() -> bool:
    """TPUs have no float64; XLA:CPU and GPUs do."""
    return platform() != "tpu"


fastpath.JAX_DEVICE.append(jax_device)  # the native call's scalar arrays (fastpath)
