"""Prefetching the eager index: a warm process loads its next programs before its ops ask.

In a warm process every eager op's first call finds its program through the
eager index (`eager.load`): read the entry, deserialize the executable. On
XLA:CPU that is ~3 ms a program, on the host's critical path, once per
program: the tiny Llama's first training step asks for 114 of them (0.35-
0.47 s at load 4). Deserializing releases the GIL, and the order in which a
program asks for its ops repeats from one run to the next.

So each process records the index keys it looks up, in first-lookup order
(its *sequence*, at most `MAX_KEYS`), and stores the sequence in the disk
tier under its first `HEAD` keys (two scripts that start with the same op
rarely share three): after every `_WRITE_EVERY` new keys and at exit, and
only where it differs from the sequence it was given. A later process whose
first `HEAD` lookups have a stored sequence loads the rest of its entries on
the compile threads (`runtime.async_compile.compile_pool`), in order, ahead
of the ops; an op whose program was prefetched takes it from memory, or
waits for the load in flight instead of starting a second one.

Nothing about a result changes: a prefetched program is what `eager.load`
would have loaded, and it is still checked against the op's arguments
(`eager._rebuild`). A stale sequence (another script started with the same
op), a malformed one or one that names evicted entries costs only those
loads; programs prefetched and never asked for stay in memory (at most
`MAX_KEYS`). ``TORCH_TPU_EAGER_PREFETCH=0`` turns prefetching off; so does
turning the eager index or the compile threads off.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from concurrent.futures import Future
from typing import Any

from ..runtime.switches import switch_on
from .. import cache as _cache  # this package (its disk_store() is read at each call)

# eager.fetch(key, device), installed by cache.eager when it loads (it imports
# this module); a prefetch starts only from its lookups.
FETCH: list = []

PREFIX = "torch_tpu-eager-seq-v1:"
MAX_KEYS = 512
HEAD = 3
_WRITE_EVERY = 32
SWITCH = "TORCH_TPU_EAGER_PREFETCH"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seq: list = []          # [index key, JAX device id] in first-lookup order
        self.seen: set = set()
        self.given: list = []        # the stored sequence this process was given
        self.written = 0             # len(seq) at the last write
        self.futures: dict = {}      # index key -> Future of (jax_key, meta, exe) or None
        self.at_exit = False
        self.listed = self.loaded = self.used = self.waited = 0
        self.wait_seconds = 0.0


_S = _State()


def enabled() -> bool:
    return switch_on(SWITCH)


def _seq_key(head: list) -> str:
    """The disk-tier key of the sequence whose first lookups are `head` ([key, device] pairs)."""
    import hashlib

    h = hashlib.sha256(json.dumps(head[:HEAD]).encode())
    return PREFIX + h.hexdigest()


def note(index_key: str, device: Any) -> None:
    """Record a lookup of `index_key` (for JAX device `device`); the process's
    `HEAD`-th lookup starts the prefetch of the sequence stored under its first ones."""
    s = _S
    if index_key in s.seen or len(s.seq) >= MAX_KEYS or not enabled():
        return
    with s.lock:
        if index_key in s.seen:
            return
        s.seen.add(index_key)
        s.seq.append([index_key, int(device.id)])
        n = len(s.seq)
    if n == HEAD:
        try:
            _start(s.seq[:HEAD])
        except Exception:  # noqa: BLE001 - an optimization: the ops load as without it
            pass
    if n == 1:
        if not s.at_exit:
            s.at_exit = True
            atexit.register(flush)
    elif len(s.seq) - s.written >= _WRITE_EVERY:
        flush()


def flush() -> None:
    """Store this process's sequence, if it is not the one it was given."""
    s = _S
    if len(s.seq) < HEAD or len(s.seq) == s.written:
        return
    s.written = len(s.seq)
    if s.seq == s.given[:len(s.seq)]:
        return  # the same order as last time: the stored sequence stays right
    try:
        blob = json.dumps({"keys": s.seq}).encode()
        _cache.disk_store().put(_seq_key(s.seq), blob, count=False)
    except Exception:  # noqa: BLE001 - a sequence is an optimization; its loss costs time only
        pass


def _read(head: list) -> list:
    blob = _cache.disk_store().get(_seq_key(head), count=False)
    if blob is None:
        return []
    try:
        keys = json.loads(blob.decode())["keys"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return []
    if not isinstance(keys, list):
        return []
    out = []
    for item in keys[:MAX_KEYS]:
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and type(item[1]) is int):
            out.append(item)
    return out


def _start(head: list) -> None:
    """Read the sequence stored under `head` and load the rest of its entries on
    the compile threads."""
    from ..runtime import async_compile  # lazy: JAX (the cache is in the start-up set)

    if not async_compile.ENABLED:
        return
    given = _read(head)
    if given[:HEAD] != head:
        return  # malformed, or (by a hash collision) another sequence
    _S.given = given
    todo = [(k, d) for k, d in given[HEAD:]]
    if not todo:
        return
    with _S.lock:
        for k, _ in todo:
            _S.futures.setdefault(k, Future())
        _S.listed += len(todo)
    pool = async_compile.compile_pool()
    if not _STOP_HOOKED:
        _STOP_HOOKED.append(True)
        # Called when the interpreter starts to exit, before it joins the pool's
        # threads (the hook concurrent.futures itself uses; absent: loads finish).
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            register(_stop)
    # One loader keeps ahead of the host on 2 cores; more cores, more loaders
    # (interleaved, so the order still follows the ops).
    n = max(1, min(4, (os.cpu_count() or 1) - 1))
    for i in range(n):
        pool.submit(_load_all, todo[i::n])


_STOP = False
_STOP_HOOKED: list = []


def _stop() -> None:
    global _STOP
    _STOP = True


def _load_all(todo: list) -> None:
    import jax

    devices = {d.id: d for d in jax.devices()}
    for key, dev_id in todo:
        if _STOP:
            return  # the interpreter is exiting: do not hold it up (the futures stay pending)
        fut = _S.futures.get(key)
        if fut is None or not fut.set_running_or_notify_cancel():
            continue  # the op asked first and loaded it itself
        try:
            device = devices.get(dev_id)
            result = FETCH[0](key, device) if device is not None else None
        except Exception:  # noqa: BLE001 - the op loads it (or lowers) as without prefetching
            result = None
        if result is not None:
            with _S.lock:
                _S.loaded += 1
        fut.set_result(result)


def take(index_key: str) -> Any:
    """(JAX key, meta, loaded executable) of `index_key` if it was prefetched
    (waiting for a load in flight), or None: load it as usual."""
    s = _S
    if not s.futures:
        return None
    with s.lock:
        fut = s.futures.pop(index_key, None)
    if fut is None or fut.cancel():
        return None  # not listed, or not started: the caller loads it now
    t0 = time.perf_counter()
    waited = not fut.done()
    result = fut.result()
    with s.lock:
        if waited:
            s.waited += 1
            s.wait_seconds += time.perf_counter() - t0
        if result is not None:
            s.used += 1
    return result


def stats() -> dict:
    """listed: entries named by the sequence this process was given; loaded:
    prefetched; used: asked for by an op (waited: of those, still loading)."""
    s = _S
    with s.lock:
        return {"enabled": enabled(), "listed": s.listed, "loaded": s.loaded, "used": s.used,
                "waited": s.waited, "wait_seconds": s.wait_seconds, "recorded": len(s.seq)}


def reset() -> None:
    """Forget this process's sequence and prefetched programs (tests)."""
    with _S.lock:
        for fut in _S.futures.values():
            fut.cancel()
    _forget()


def _forget() -> None:
    # Also a forked child's first step: its copies of the loads in flight
    # would never finish, and a lock held at the fork would never be
    # released, so nothing of the old state is touched but its exit hook.
    global _S
    at_exit = _S.at_exit
    _S = _State()
    _S.at_exit = at_exit


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
