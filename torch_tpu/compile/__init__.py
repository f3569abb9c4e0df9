"""`torch.compile(model, backend="tpu")`.

Importing torch_tpu (or the `torch.backends` autoload) makes the backend
available without importing dynamo or JAX (which take seconds): `install()`
wraps `torch.compile` so that the first call loads the tpu backend, registers
"tpu" with dynamo, and points the default backend (inductor, which has no tpu
code generator) at "tpu" for graphs whose inputs are on the tpu device.
`register()` does the dynamo registration directly (e.g. before
`torch._dynamo.optimize("tpu")`).

See `torch_tpu.compile.backend` for how graphs run, and
`torch_tpu.compile.dynamic` for the dynamic-shape policy.
"""

from __future__ import annotations

import functools

import torch

from .. import cache as _cache  # noqa: F401  (torch_tpu.cache, the compile cache API)

__all__ = ["register", "install", "tpu_backend", "cache_stats", "clear_cache"]


def register() -> None:
    """Load the tpu backend and register "tpu" with dynamo (imports dynamo)."""
    import torch_tpu

    torch_tpu._load()
    from . import backend

    backend.register()


def tpu_backend(gm, example_inputs, mode=None, options=None):
    import torch_tpu

    torch_tpu._load()
    from . import backend

    return backend.tpu_backend(gm, example_inputs, mode=mode, options=options)


def cache_stats() -> dict:
    from . import backend

    return backend.cache_stats()


def clear_cache() -> None:
    from . import backend

    backend.clear_cache()


_installed = False


def install() -> None:
    """Make torch.compile know "tpu" (lazily) and prefer it for tpu inputs."""
    global _installed
    if _installed:
        return
    original = torch.compile
    if not getattr(original, "_torch_tpu", False):

        @functools.wraps(original)
        def compile(*args, **kwargs):
            register()
            return original(*args, **kwargs)

        compile._torch_tpu = True
        compile._torch_tpu_original = original
        torch.compile = compile
    # register() (at the first torch.compile call) also points inductor at
    # "tpu" for tpu inputs: torch.compile is the only caller of inductor's
    # wrapper that this redirects.
    _installed = True


install()
