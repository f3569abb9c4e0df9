"""Compiles share, serializing an executable excludes: one rule for the process.

XLA compiles in several threads at once (the compile pool of
`runtime.async_compile`, the background zeros programs, the main thread),
and that is safe. Serializing a compiled executable for the disk tier
(`executable.serialize()` in JAX's `put_executable_and_time`) while another
thread is inside XLA's compile or load is not: a test worker died with
SIGSEGV in that write while a second thread was in
`backend_compile_and_load` (XLA:CPU's compiler keeps process-wide LLVM
state). So:

- every compile, and every load of a serialized executable, holds this lock
  shared (`compiling()`): they run in parallel as before;
- every serialization holds it exclusively (`serializing()`): it waits for the
  compiles in flight and keeps new ones out for the few milliseconds it takes.

A waiting serializer blocks new compiles (writer preference), so the writes
cannot starve under a steady stream of compiles. The runtime's compiles
(`programs.compile_lowered`) turn JAX's own write, which serializes inside
the compile call, off for their thread; the disk tier (`torch_tpu.cache`)
writes each entry itself, under `serializing()`, after the compile has left
its shared section. (JAX compiles outside the runtime, such as an eager
`jnp` call in a kernel, still write as JAX does; there are few.)
Neither side may take the other inside itself
(a compile never serializes, a serialization never compiles), so the lock
cannot deadlock.

Its cost, measured (2026-12-06, 2-core EPYC, tiny Llama's first step on a
fresh cache directory): 7.7 s with the exclusive section, 6.8 s with it made
a no-op, 6.2-6.5 s with the disk tier off: each write stalls the compile
pool during a cold start. The SIGSEGV it guards against was later traced to
memory mappings past vm.max_map_count (programs.py's third bound), so the
lock is a candidate for removal once a stress run shows the write safe
without it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_cond = threading.Condition(threading.Lock())
_shared = 0  # compiles and loads in flight
_exclusive = False  # a serialization in flight
_waiting = 0  # serializations waiting for the compiles in flight
_held = threading.local()  # this thread's depth of compiling() (re-entrant)


@contextmanager
def compiling() -> Iterator[None]:
    """Held around an XLA compile or an executable load."""
    global _shared
    depth = getattr(_held, "depth", 0)
    if depth:  # already shared on this thread: a waiting writer must not block it
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    with _cond:
        while _exclusive or _waiting:
            _cond.wait()
        _shared += 1
    _held.depth = 1
    try:
        yield
    finally:
        _held.depth = 0
        with _cond:
            _shared -= 1
            if _shared == 0:
                _cond.notify_all()


@contextmanager
def serializing() -> Iterator[None]:
    """Held around `executable.serialize()` (the disk tier's write)."""
    global _exclusive, _waiting
    if getattr(_held, "depth", 0):
        raise RuntimeError("torch_tpu: an executable was serialized inside a compile")
    with _cond:
        _waiting += 1
        try:
            while _exclusive or _shared:
                _cond.wait()
        finally:
            _waiting -= 1
        _exclusive = True
    try:
        yield
    finally:
        with _cond:
            _exclusive = False
            _cond.notify_all()


def state() -> dict:
    """What is in flight now (for tests and debugging)."""
    with _cond:
        return {"compiling": _shared, "serializing": _exclusive, "waiting": _waiting}
