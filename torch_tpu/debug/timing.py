"""Per-op host timing and profiler annotations through a TorchDispatchMode
(debug.capture(timing=...), torch_tpu.profiler), and `block`, the wait on a
tensor tree's values that debug.roofline and torch_tpu.benchmark time with.

The executor has no per-op timing hook, so while timing (or profiling) is
on, a dispatch mode wraps every ATen op that reaches the backend. It sits
below autograd and above the tpu kernels, so it sees the ops the executor
runs (and the storage-level ones: copies, views), named like the executor
names them (`aten.add.Tensor`).

Without sync, the time is host dispatch time: argument handling, the cache
lookup, compilation on a miss, and enqueueing the executable. The device
runs asynchronously, so this is not device time. With sync, each op blocks
until its outputs are ready, so the time includes device execution (and the
blocking changes the pipelining the program would otherwise get).

torch.compile'd functions keep running as compiled graphs while the mode is
active (`ignore_compile_internals`); their graphs run as one executable, so
their ops are not timed or annotated one by one.
"""

from __future__ import annotations

import time

import torch

from .._compat.torch_api import TorchDispatchMode, pytree
from . import metrics as _metrics


def _tpu_tensors(tree):
    return [x for x in pytree.tree_leaves(tree)
            if isinstance(x, torch.Tensor) and x.device.type == "tpu"]


def block(tree) -> None:
    """Wait until every tpu tensor in `tree` has its value computed."""

    for t in _tpu_tensors(tree):
        data = getattr(t.untyped_storage(), "_tpu", None)
        if data is not None:
            try:
                data.array.block_until_ready()
            except Exception:
                pass


class OpTimer(TorchDispatchMode):
    """Times each op (host, or host+device with sync) into metrics.OP_SECONDS;
    with `annotate`, wraps it in a jax.profiler.TraceAnnotation of its name."""

    def __init__(self, sync: bool = False, annotate: bool = False, time_ops: bool = True):
        super().__init__()
        self.sync = sync
        self.annotate = annotate
        self.time_ops = time_ops

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile'd code keeps running as compiled graphs while this
        # mode is active (otherwise dynamo falls back to eager for it).
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if self.annotate:
            import jax

            with jax.profiler.TraceAnnotation(name):
                return self._run(func, name, args, kwargs)
        return self._run(func, name, args, kwargs)

    def _run(self, func, name, args, kwargs):
        if not self.time_ops:
            return func(*args, **kwargs)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        if self.sync:
            block(out)
        dt = time.perf_counter() - t0
        if self.sync or _tpu_tensors(out) or _tpu_tensors((args, kwargs)):
            _metrics.OP_SECONDS[name] += dt
            _metrics.OP_TIMED[name] += 1
        return out
