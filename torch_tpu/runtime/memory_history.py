"""The memory history behind `torch.tpu.memory._record_memory_history()`.

PJRT gives no allocation hook, so the history is kept where the bytes are
known: a `jax.Array` becoming a storage's value is an allocation (a result
`DeviceData`, an in-place op's new array, a fused program's outputs), and
the array's death (a weak reference's callback) is its free. An array is
counted once however many storages hold it, and arrays held by no tensor
(RNG state, cached scalars, values a Python reference keeps) are added when
the live arrays are walked anyway (`reconcile`: `torch.tpu.memory_allocated`,
`_snapshot`, `reset_peak_memory_stats`), so at those points the history's
bytes are `memory_allocated`'s and the peak it sees is exact per op.

Off, it costs one global test (`storage.RECORD is None`) where a storage is
created from Python or written; the native kernel's results pay nothing
(while recording it is told to build them through `DeviceData.__init__`).
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
import weakref
from typing import Any

from . import oom, platform
from . import storage as st
from .fastpath import NATIVE as _NATIVE

MAX_FRAMES = 64
_ALIGN = 512  # the virtual addresses' spacing: each array is its own segment
UNTRACKED = "(no tensor op: found in the live arrays)"


class _Block:
    """One followed array: its virtual address, bytes, device and stack."""

    __slots__ = ("addr", "size", "index", "frames", "op", "ref", "time_us")
    addr: int
    size: int
    index: int
    frames: list
    op: str | None
    ref: weakref.ref | None
    time_us: int


def frames(skip: int = 1, limit: int = MAX_FRAMES) -> list[dict]:
    """The Python stack above the caller, innermost first, as PyTorch's
    snapshot frames ({filename, line, name})."""
    f: Any = sys._getframe(1)
    for _ in range(skip):  # (a free's callback can run on a shallow stack)
        if f.f_back is None:
            break
        f = f.f_back
    out: list[dict] = []
    known = _FRAMES
    while f is not None and len(out) < limit:
        code = f.f_code
        if code.co_filename != __file__:  # (skips _native_data, the native kernel's way in)
            key = (code, f.f_lineno)
            d = known.get(key)
            if d is None:
                d = known[key] = {"filename": code.co_filename, "line": f.f_lineno,
                                  "name": code.co_name}
            out.append(d)
        f = f.f_back
    return out


# One dict per (code, line), shared by every event's frames: a recording
# makes the same few hundred frames over and over (and a pickle stores each once).
_FRAMES: dict = {}


def _nbytes(array: Any) -> int:
    """array.nbytes, without jax's property chain (5x the time)."""
    return math.prod(array.shape) * array.dtype.itemsize


def _op_frame(op: str | None) -> list[dict]:
    """The op as the innermost frame: the viewers show it above the stack."""
    return [{"filename": "<tpu op>", "line": 0, "name": op}] if op else []


class Recorder:
    """One recording: the tracked arrays, the events, bytes and peak per device."""

    def __init__(self, enabled: str, context: str | None, max_entries: int) -> None:
        self.events: dict[int, collections.deque] = {}
        self.skip: frozenset = frozenset()  # actions not recorded
        self.configure(enabled, context, max_entries)
        self.blocks: dict[int, _Block] = {}  # id(array) -> its block
        self.by_ref: dict[int, int] = {}  # id(weakref) -> id(array)
        self.current: dict[int, int] = collections.defaultdict(int)
        self.peak: dict[int, int] = collections.defaultdict(int)
        self.active = True
        self._lock = threading.RLock()  # allocs on the async execution thread too
        self._next = 1 << 40
        self._t0 = time.perf_counter_ns()

    def configure(self, enabled: str, context: str | None, max_entries: int) -> None:
        """The settings of `_record_memory_history` (the events so far are kept)."""
        self.trace = enabled == "all"
        self.alloc_frames = context in ("state", "alloc", "all")
        self.event_frames = context in ("alloc", "all")
        self.free_frames = context == "all"
        self.maxlen = None if max_entries >= sys.maxsize else max(int(max_entries), 1)
        for i, q in list(self.events.items()):
            self.events[i] = collections.deque(q, maxlen=self.maxlen)

    # -- events ------------------------------------------------------------

    def _now(self) -> int:
        return (time.perf_counter_ns() - self._t0) // 1000

    def _event(self, action: str, b: _Block, fr: list) -> None:
        if not self.trace or action in self.skip:
            return
        q = self.events.get(b.index)
        if q is None:
            q = self.events[b.index] = collections.deque(maxlen=self.maxlen)
        q.append({"action": action, "addr": b.addr, "size": b.size, "stream": 0,
                  "time_us": self._now(), "frames": fr})

    def _track(self, array: Any, index: int, op: str | None, fr: list) -> _Block | None:
        """Start following `array`; None if it is already followed."""
        key = id(array)
        if key in self.blocks:
            return None
        b = _Block()
        b.size = _nbytes(array)
        b.addr = self._next
        self._next += -(-max(b.size, 1) // _ALIGN) * _ALIGN
        b.index = index
        b.op = op
        b.frames = fr
        b.time_us = self._now()
        b.ref = weakref.ref(array, self._died)
        self.blocks[key] = b
        self.by_ref[id(b.ref)] = key
        self.current[index] += b.size
        if self.current[index] > self.peak[index]:
            self.peak[index] = self.current[index]
        return b

    def alloc(self, array: Any, index: int, op: str | None, skip: int = 2,
              where: list | None = None) -> None:
        """`array` became a storage's value (made by `op`, None: unknown;
        `where`: the stack, if not the caller's)."""
        if id(array) in self.blocks:
            return
        fr: list = []
        if self.alloc_frames:
            fr = _op_frame(op) + (frames(skip) if where is None else where)
        with self._lock:
            b = self._track(array, index, op, fr)
            if b is not None:
                self._event("alloc", b, fr if self.event_frames else [])

    def _died(self, ref: weakref.ref) -> None:
        with self._lock:
            key = self.by_ref.pop(id(ref), None)
            if key is not None:
                self._forget(self.blocks.pop(key))

    def _forget(self, b: _Block) -> None:
        self.current[b.index] -= b.size
        fr = frames(2) if self.free_frames else []
        self._event("free_requested", b, fr)
        self._event("free_completed", b, fr)

    # -- the live arrays -----------------------------------------------------

    def adopt(self, index: int, live: list) -> None:
        """Follow the arrays live when recording starts (no alloc event: a
        viewer shows them as allocated before the history)."""
        for a in live:
            self._track(a, index, None, [])

    def reconcile(self, index: int, live: list) -> None:
        """Make the followed arrays of tpu:index the live ones: add those no
        storage made (an alloc where they are found), drop deleted (donated) ones."""
        for a in live:
            if id(a) not in self.blocks:
                self.alloc(a, index, UNTRACKED, skip=3)
        for key, b in list(self.blocks.items()):
            a = b.ref() if b.index == index and b.ref is not None else None
            if a is not None and a.is_deleted():
                del self.blocks[key]
                self.by_ref.pop(id(b.ref), None)
                self._forget(b)

    def reset_peak(self, index: int) -> None:
        self.peak[index] = self.current[index]

    def stop(self) -> None:
        """No more events: drop the weak references (no callback after this)."""
        self.active = False
        for b in self.blocks.values():
            b.ref = None
        self.by_ref.clear()

    def block_of(self, array: Any) -> _Block | None:
        return self.blocks.get(id(array))


RECORDER: Recorder | None = None  # the last recording (kept after it stops, for _snapshot)


def _native_data(array: Any, index: Any, dtype: Any, origin: Any) -> st.DeviceData:
    """The native kernel's results, while recording: through __init__ (a
    plain callable makes the kernel call it instead of filling slots)."""
    return st.DeviceData(array, index, dtype, origin)


def active() -> Recorder | None:
    r = RECORDER
    return r if r is not None and r.active else None


def start(enabled: str, context: str | None, max_entries: int) -> Recorder:
    """Record from now on (a new history; the old one is dropped)."""
    global RECORDER
    stop()
    rec = RECORDER = Recorder(enabled, context, max_entries)
    for i in range(platform.device_count()):
        rec.adopt(i, oom.live_arrays(i))
    st.RECORD = rec.alloc
    if _NATIVE is not None:
        _NATIVE.setup(_native_data)
    return rec


def stop() -> None:
    """Stop recording; the history stays readable (`RECORDER`)."""
    if st.RECORD is not None:
        st.RECORD = None
        if _NATIVE is not None:
            _NATIVE.setup(st.DeviceData)
    if RECORDER is not None and RECORDER.active:
        RECORDER.stop()


def reconcile(index: int, live: list) -> None:
    rec = active()
    if rec is not None:
        rec.reconcile(index, live)


def recorded_peak(index: int) -> int:
    """The peak the history saw on tpu:index since its last reset (0: not recording)."""
    rec = active()
    return rec.peak[index] if rec is not None else 0


def reset_peak(index: int) -> None:
    rec = active()
    if rec is not None:
        rec.reset_peak(index)


def launch_frames(op: str) -> list:
    """The stack launching `op` asynchronously (its arrays are made on the
    execution thread, whose own stack says nothing)."""
    rec = active()
    return frames(2) if rec is not None and rec.alloc_frames else []


def launched(arrays: list, device: int, op: str, where: list) -> None:
    """The arrays an asynchronously launched `op` made (runtime.async_compile)."""
    rec = active()
    if rec is not None:
        for a in arrays:
            rec.alloc(a, device, op, where=where)


def fused_outputs(ops: list, device: int, nodes: list, values: Any) -> None:
    """A fused program's outputs (`nodes`' new `values`) on tpu:device, each
    named by its op in the trace (`ops`: (entry, refs, name) each; an op
    made one node per value its program returns)."""
    rec = active()
    if rec is None:
        return
    names: list = []
    for entry, _refs, name in ops:
        specs = entry.fused_specs
        names.extend([name] * (len(specs[0]) if specs else 1))
    for n, v in zip(nodes, values):
        op = names[n.pos] if n.pos < len(names) else None
        rec.alloc(v, device, f"{op} (fused)" if op else "(fused program)", skip=2)


def snapshot() -> dict:
    """PyTorch's snapshot dict (torch.cuda.memory._snapshot's schema): a
    segment of one block per live array, and each device's trace."""
    rec = RECORDER
    n = platform.device_count()
    segments = []
    addr = 1 << 46  # arrays the history does not follow
    for i in range(n):
        live = oom.live_arrays(i)
        if rec is not None and rec.active:
            rec.reconcile(i, live)
        for a in live:
            b = rec.block_of(a) if rec is not None and rec.active else None
            size = int(a.nbytes)
            if b is None:
                at, fr = addr, []
                addr += -(-max(size, 1) // _ALIGN) * _ALIGN
            else:
                at, fr = b.addr, b.frames
            segments.append(_segment(i, at, size, fr))
    traces = [list(rec.events.get(i, ())) if rec is not None else [] for i in range(n)]
    return {"segments": segments, "device_traces": traces}


def _segment(index: int, addr: int, size: int, fr: list) -> dict:
    return {"device": index, "address": addr, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "large" if size > (1 << 20) else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": fr,
            "blocks": [{"address": addr, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": fr}]}
