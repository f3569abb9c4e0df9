"""`torch.compile(model, backend="tpu")`.

Dynamo finds "tpu" through the `torch_dynamo_backends` entry point
(torch_tpu.compile.entry), so `torch.compile` stays PyTorch's own object and a
process that never compiles for tpu never imports this package, dynamo's
patches or JAX. Loading the entry point prepares dynamo for tpu compiles
(`register()`, backend.register); the default backend (inductor, which has no
tpu code generator) is pointed at "tpu" for graphs whose inputs are on the
tpu device once the process makes its first tpu tensor (compile.redirect).

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

import torch

from .. import cache as _cache  # noqa: F401  (torch_tpu.cache, the compile cache API)
from ..runtime import loading
from ..runtime import programs as _programs  # (no JAX: loaded with torch_tpu.cache)

__all__ = ["register", "tpu_backend", "cache_stats", "clear_cache", "whole_step"]


def register() -> None:
    """Load the tpu backend and register "tpu" with dynamo (imports dynamo)."""
    loading.load()
    from . import backend  # lazy: dynamo

    backend.register()


def tpu_backend(gm, example_inputs, mode=None, options=None):
    loading.load()
    from . import backend  # lazy: dynamo

    backend.register()  # (a backend passed as a function: no entry point ran)
    return backend.tpu_backend(gm, example_inputs, mode=mode, options=options)


def cache_stats() -> dict:
    """Compiled graphs' row of the program cache's statistics (graph_cache.cache_stats)."""
    return _programs.STATS.rows[_programs.ProgramKind.GRAPH].as_dict()


def clear_cache() -> None:
    """Drop every compiled graph from the program cache (other programs stay)."""
    _programs.clear(_programs.ProgramKind.GRAPH)


def whole_step(fn, options):
    """`torch.compile(fn, backend="tpu", options={"whole_step": True, ...})`:
    `fn` traced as one training-step program (torch_tpu.compile_step)."""
    loading.load()
    from .step import compile_step  # lazy: dynamo

    if isinstance(fn, torch.nn.Module):
        raise TypeError('torch.compile(backend="tpu", options={"whole_step": True}) takes a '
                        "training-step function (forward, backward and optimizer.step), "
                        f"not a module ({type(fn).__name__})")
    return compile_step(fn, options=options)
