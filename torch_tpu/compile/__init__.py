"""`torch.compile(model, backend="tpu")`.

Importing torch_tpu (or the `torch.backends` autoload) makes the backend
available without importing dynamo or JAX (which take seconds): `install()`
wraps `torch.compile` so that the first call loads the tpu backend, registers
"tpu" with dynamo, and points the default backend (inductor, which has no tpu
code generator) at "tpu" for graphs whose inputs are on the tpu device.
`register()` does the dynamo registration directly (e.g. before
`torch._dynamo.optimize("tpu")`).

A training step (forward, ``backward()``, ``optimizer.step()``) given to
``torch.compile`` becomes several dynamo frames and programs; with
``options={"whole_step": True}`` (or `torch_tpu.compile_step`) it is traced
into one program whose parameters and optimizer state are donated: see
`torch_tpu.compile.step`.

See `torch_tpu.compile.backend` for the dynamo glue, `torch_tpu.compile.graph`
for how graphs run, and
`torch_tpu.compile.dynamic` for the dynamic-shape policy.
"""

from __future__ import annotations

import functools

import torch

from .. import cache as _cache  # noqa: F401  (torch_tpu.cache, the compile cache API)
from ..runtime import loading
from ..runtime import programs as _programs  # (no JAX: loaded with torch_tpu.cache)

__all__ = ["register", "install", "tpu_backend", "cache_stats", "clear_cache"]


def register() -> None:
    """Load the tpu backend and register "tpu" with dynamo (imports dynamo)."""
    loading.load()
    from . import backend  # lazy: dynamo

    backend.register()


def tpu_backend(gm, example_inputs, mode=None, options=None):
    loading.load()
    from . import backend  # lazy: dynamo

    return backend.tpu_backend(gm, example_inputs, mode=mode, options=options)


def cache_stats() -> dict:
    """Compiled graphs' row of the program cache's statistics (graph_cache.cache_stats)."""
    return _programs.STATS.rows[_programs.ProgramKind.GRAPH].as_dict()


def clear_cache() -> None:
    """Drop every compiled graph from the program cache (other programs stay)."""
    _programs.clear(_programs.ProgramKind.GRAPH)


_installed = False


def _whole_step(fn, options):
    def compile_step(f):
        loading.load()
        from .step import compile_step  # lazy: dynamo

        return compile_step(f, options=options)

    if fn is None:  # @torch.compile(backend="tpu", options={"whole_step": True})
        return compile_step
    if isinstance(fn, torch.nn.Module):
        raise TypeError('torch.compile(backend="tpu", options={"whole_step": True}) takes a '
                        "training-step function (forward, backward and optimizer.step), "
                        f"not a module ({type(fn).__name__})")
    return compile_step(fn)


def install() -> None:
    """Make torch.compile know "tpu" (lazily) and prefer it for tpu inputs."""
    global _installed
    if _installed:
        return
    original = torch.compile
    if not getattr(original, "_torch_tpu", False):

        @functools.wraps(original)
        def compile(*args, **kwargs):
            opts = kwargs.get("options") or {}
            if kwargs.get("backend") == "tpu" and opts.get("whole_step"):
                # options={"whole_step": True}: the training step as one
                # program (torch_tpu.compile_step) instead of dynamo's frames.
                return _whole_step(args[0] if args else kwargs.get("model"),
                                   {k: v for k, v in opts.items() if k != "whole_step"})
            register()
            return original(*args, **kwargs)

        # markers on our wrapper (install() runs once per wrapper)
        compile._torch_tpu = True  # type: ignore[attr-defined]
        compile._torch_tpu_original = original  # type: ignore[attr-defined]
        torch.compile = compile
    # register() (at the first torch.compile call) also points inductor at
    # "tpu" for tpu inputs: torch.compile is the only caller of inductor's
    # wrapper that this redirects.
    _installed = True


install()
