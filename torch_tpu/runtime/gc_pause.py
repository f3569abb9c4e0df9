"""Pause Python's cyclic garbage collector while a program is being compiled.

Compiling (dynamo's bytecode tracing, AOTAutograd, our lowering, JAX's
tracing) allocates hundreds of thousands of short-lived objects, many in
reference cycles (FX nodes, proxies, tracers). Every 700 net allocations
Python runs a collection, and the older generations rescan the ~360k objects
that importing torch and jax leaves alive: on the compile benchmark's first
step this was 0.3-0.5 s of a 1.3-1.5 s first call (183 collections). With the
collector paused for the duration of a compile the same step runs ~60
collections fewer and spends ~0.05 s in them; garbage made during the compile
is collected by the first collection after it.

The same pause covers the backend's load (JAX and the op table: long-lived
objects a collection would only rescan) and an eager op's first call
(PyTorch's meta kernel, which in a new process imports torch._dynamo, and
our lowering): 0.1 s of the ~0.5 s a warm Llama training process spent in
the collector.

Reference counting still frees everything acyclic while paused; only cycles
wait until the compile ends, so memory grows by at most one compile's cyclic
garbage. The pause nests and is thread-safe (the collector is process-wide:
it resumes when the last concurrent compile ends), and it never turns on a
collector the user had turned off. ``TORCH_TPU_COMPILE_GC=1`` keeps the
collector running during compiles.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Any

from .._compat import dynamo_api
from .switches import switch_on, switch_set

_lock = threading.Lock()
_depth = 0
_resume = False   # was the collector on when the outermost pause began?


def enabled() -> bool:
    return not switch_set("TORCH_TPU_COMPILE_GC")


def begin() -> None:
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled() and enabled()
            if _resume:
                gc.disable()
        _depth += 1


def end() -> None:
    global _depth
    with _lock:
        if _depth == 0:
            return  # an end without a begin (e.g. hooks installed mid-compile)
        _depth -= 1
        if _depth == 0 and _resume:
            gc.enable()


@contextlib.contextmanager
def paused():
    begin()
    try:
        yield
    finally:
        end()


def _on_compile_start(_args: Any) -> None:
    begin()


def _on_compile_end(_args: Any) -> None:
    end()


def install_dynamo_hooks() -> None:
    """Pause the collector for each dynamo compile (tracing through backend).

    `torch._dynamo.reset()` clears dynamo's callbacks; calling this again
    (the backend does on every graph it compiles) puts them back.
    """
    try:
        callback_handler = dynamo_api.callback_handler
    except Exception:  # pragma: no cover - another torch layout
        return
    if _on_compile_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_on_compile_start)
    if _on_compile_end not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_on_compile_end)


def freeze() -> None:
    """Move the objects alive now out of the collector's reach (`gc.freeze`).

    Called once, when the backend has loaded (the process's first `tpu` use,
    torch_tpu._load): what is alive then is mostly torch's, JAX's and our
    modules, classes and functions (~250k objects with torch 2.13 and JAX
    0.10), which live as long as the process. A full collection scans every tracked object that is not
    frozen: without this, the one that lands in the compile benchmark's first
    compiled step scans ~430k objects for ~0.28 s (a third of a warm
    process's first step), and every later full collection pays the same.
    Frozen: warm first step 0.80 s -> 0.44-0.53 s, gc over that step + 300
    steps + a second compiled model 0.9 s -> 0.45 s.

    A full collection runs first, so no garbage is frozen. The user's objects
    alive at that moment are frozen too (a script's model, made before its
    first `.to("tpu")`): they are still freed by reference counting, but one
    that later becomes part of a garbage reference cycle is not collected.
    A process that never uses `tpu` is not touched (nothing is frozen at
    `import torch`). ``TORCH_TPU_GC_FREEZE=0`` turns this off; nothing is
    frozen while the collector is off.
    """
    if switch_on("TORCH_TPU_GC_FREEZE") and gc.isenabled():
        gc.collect()
        gc.freeze()
