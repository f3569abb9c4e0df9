"""torch_tpu: a PyTorch backend that gives PyTorch a real `tpu` device.

ATen ops on `tpu` tensors run as cached XLA executables through JAX's PJRT
runtime: on a Cloud TPU when present, otherwise on the GPU or the host CPU.

Importing this package (which the `torch.backends` entry point does in every
`import torch` of an environment where it is installed) registers the `tpu`
device, `torch.tpu` and the `torch.distributed` backend, and nothing heavier
and nothing else: JAX, the lowering table, the kernels and the patches of
PyTorch that tpu tensors need load on first use (`_load()`): the first op
that reaches the device, a `torch.tpu` call that needs the runtime, the first
`torch.compile(..., backend="tpu")` (dynamo loads torch_tpu.compile.entry
through the `torch_dynamo_backends` entry point), or the first attribute of
this package that is not one of those (`torch_tpu.debug`, `torch_tpu.jax_op`,
...). A process that never uses `tpu` therefore runs PyTorch as without the
backend (torch.compile, dynamo and the collector untouched), and `import
torch` costs about what it costs without it (see benchmarks/startup.py).
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import threading as _threading
import warnings as _warnings

from ._version import __version__  # noqa: F401
from ._version import unsupported_torch as _unsupported_torch


def _autoload():
    """Entry point for PyTorch's device-backend autoload (`torch.backends`).

    Defined before anything else: when `import torch_tpu` runs first, torch's
    autoload re-enters this partially initialized module and needs it.
    Importing the package does the (cheap) registration.
    """


import torch as _torch  # noqa: E402  (after _autoload: torch's autoload may re-enter)


def _in_torch_autoload() -> bool:
    """Whether `import torch`'s backend autoload is importing this package.

    PyTorch turns any exception raised there into a failed `import torch`,
    which would break every CPU program of the environment."""
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_import_device_backends" and \
                frame.f_globals.get("__name__") == "torch":
            return True
        frame = frame.f_back
    return False


# A torch outside the supported range: an explicit `import torch_tpu` fails
# with one message naming the range; through torch's autoload the message is
# a warning and nothing is registered (CPU code keeps working).
_UNSUPPORTED = _unsupported_torch(_torch.__version__)
if _UNSUPPORTED is not None:
    if not _in_torch_autoload():
        raise ImportError(_UNSUPPORTED)
    _warnings.warn(_UNSUPPORTED + " (the tpu device is not registered)", RuntimeWarning,
                   stacklevel=2)

from .device import module as tpu  # noqa: E402,F401

if _UNSUPPORTED is None:
    from .device import registration as _registration

    _registration.register()
    from . import distributed as _distributed  # noqa: F401  (torch.distributed backend "tpu")
from .runtime import gc_pause as _gc_pause  # noqa: E402
from .runtime import loading as _loading_hook  # noqa: E402

_load_lock = _threading.RLock()
_loaded = False
_loading = False


def _load() -> None:
    """Load the backend: JAX, the lowering table, every kernel (once, thread-safe)."""
    global _loaded, _loading
    if _loaded:
        return
    if _UNSUPPORTED is not None:
        raise ImportError(_UNSUPPORTED)
    with _load_lock:
        if _loaded or _loading:
            return
        _loading = True
        # JAX and the op table leave ~200k long-lived objects: collections
        # while they load would only rescan them (0.1 s a process, measured).
        _gc_pause.begin()
        try:
            _importlib.import_module(f"{__name__}.runtime.platform")  # configures JAX first
            # The disk tier is JAX's compilation cache before any JAX compile:
            # kernels also compile through jnp directly, off the program
            # cache's compile step (which installed it first only by chance).
            _importlib.import_module(f"{__name__}.cache").disk_store()
            # debug listens to compile events (and JAX's cache events) from the
            # first program on: a plug-in of the runtime, nothing below imports it.
            _importlib.import_module(f"{__name__}.debug")
            _importlib.import_module(f"{__name__}.ops").install()
            _importlib.import_module(f"{__name__}.device.autocast").install()  # torch.tpu precision/AMP API
            # Tensor.__dlpack__ for tpu tensors: replaced only once one can exist
            _importlib.import_module(f"{__name__}.device.dlpack").install()
            _importlib.import_module(f"{__name__}.device.printing").install()  # one host copy
            # torch.compile(model) (inductor) on tpu inputs: the tpu backend
            _importlib.import_module(f"{__name__}.compile.redirect").install()
            _loaded = True
        finally:
            _gc_pause.end()
            _loading = False
        if _loaded:
            _gc_pause.freeze()  # what is alive now lives as long as the process


_loading_hook.set_loader(_load, lambda: _loaded)  # the layers below load through it


def fused(enabled: bool = True):
    """Fused eager mode for a region: `with torch_tpu.fused(): ...`.

    Eager ops inside are recorded and run as one cached XLA program at the
    next host read, `torch.tpu.synchronize()`, optimizer step, or the end of
    the region (torch_tpu.runtime.fused; TORCH_TPU_EAGER=fused for a whole
    process). `fused(False)` runs strict eager inside a fused region.
    """
    _load()
    from .runtime import fused as _fused  # lazy: JAX (the package imports none at start-up)

    return _fused.mode(enabled)


def compile_step(fn=None, **kwargs):
    """A training step (forward, backward, optimizer.step) as one XLA program.

    Parameters and optimizer state are donated and updated in place (see
    torch_tpu.compile.step); ``@torch_tpu.compile_step`` or
    ``compile_step(fn, modules=..., optimizers=..., options=...)``.
    """
    _load()
    from .compile import step as _step  # lazy: dynamo

    return _step.compile_step(fn, **kwargs)


def to_jax(tensor):
    """The values of a `tpu` tensor as a `jax.Array`, sharing its buffer
    (torch_tpu.interop.to_jax: a view is gathered first)."""
    _load()
    from .interop import to_jax as _to_jax  # lazy: JAX

    return _to_jax(tensor)


def from_jax(array):
    """A `tpu` tensor whose value is the `jax.Array` `array`, without a copy
    (torch_tpu.interop.from_jax)."""
    _load()
    from .interop import from_jax as _from_jax  # lazy: JAX

    return _from_jax(array)


def __getattr__(name):
    # Any other attribute (torch_tpu.debug, .cache, .jax_op, .ops, ...) is a
    # use of the backend: load it, then the submodule if that is what it names.
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loading_now = _sys.modules.get(f"{__name__}.{name}")
    if loading_now is not None:
        # a subpackage being imported (`from .. import cache` inside
        # torch_tpu.cache): not a use of the backend
        return loading_now
    if not _loading:
        _load()
    if name in globals():
        return globals()[name]
    if name == "export":  # torch_tpu.export(...): the function (module torch_tpu.exporting)
        from .exporting import export  # lazy: torch.export

        return export
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
