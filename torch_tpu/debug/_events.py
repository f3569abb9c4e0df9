"""Compile events: the compile log, `TORCH_TPU_DUMP_DIR`, `TORCH_TPU_LOG`.

Installed once (idempotently) as a listener on the executor's
`COMPILE_LISTENERS`, so every program the executor compiles (eager ops, view
reads, and whatever else goes through `programs.compile`) is recorded.
Other producers (the torch.compile backend, `debug.hlo`) call
`record(...)` directly, with the `jax.stages.Lowered` when they have it so
that the dump holds the StableHLO and pre-optimization HLO as well.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import re
import threading
import time

from ..runtime import counters as _metrics  # (debug.metrics reads the same counters)
from ..runtime import executor, programs
from ..runtime.switches import switch_raw, switch_value
from .hlo import Program, safe_name  # noqa: F401  (safe_name: also this module's, for callers)
from . import recompiles as _recompiles

log = logging.getLogger("torch_tpu.compile")

# How many recent events keep a reference to their compiled program (for
# `Program` access); older events keep only their numbers.
KEEP_PROGRAMS = 64
MAX_EVENTS = 10000

TOTALS = {"compiles": 0}
TOTALS_BY_TIER: collections.Counter = collections.Counter()

_lock = threading.Lock()
_events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
_seq = 0
_disk_hits_seen = 0


@dataclasses.dataclass
class CompileEvent:
    """One compiled program.

    seq: order in this process (1, 2, ...); name: the op (`aten.add.Tensor`)
    or graph name; key_hash: a stable hash of the executable cache key;
    kind: 'op', 'graph', 'hlo' (from debug.hlo) or 'other'; tier: where the
    executable came from on this in-memory cache miss: 'compile' (XLA
    compiled it) or 'disk' (JAX's persistent compilation cache had it);
    seconds: wall time of lower+compile (or load); program_bytes: size of the
    optimized HLO text; time: time.time() when recorded; reason: why it
    compiled although its op or graph had compiled before (a
    debug.recompiles.Reason: the nearest earlier key and the differing
    fields), None for the first compile of an op or graph; dumped: the
    files written for it to a dump directory.
    """

    seq: int
    name: str
    key_hash: str
    kind: str
    tier: str
    seconds: float
    program_bytes: int
    time: float
    program: object = dataclasses.field(default=None, repr=False, compare=False)
    reason: object = None
    dumped: tuple = ()  # the files TORCH_TPU_DUMP_DIR / debug.dump_to got for it

    def as_dict(self):
        # (not dataclasses.asdict: it deep-copies `program`, an executable)
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name != "program"}
        d["reason"] = None if self.reason is None else str(self.reason)
        return d


def key_hash(key) -> str:
    """A short hash of a cache key, stable across processes."""
    if key is None:
        return "nokey"
    try:
        text = repr(key)
    except Exception:
        text = str(id(key))
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:10]


def _kind_of(name: str) -> str:
    if name.startswith(("aten.", "prims.", "torch_tpu_jax.")) or "::" in name:
        return "op"
    if name.startswith(("graph", "compiled", "torch_compile", "dynamo")):
        return "graph"
    if name.startswith("hlo:"):
        return "hlo"
    return "other"


def _tier(known: str | None = None) -> str:
    """`known` (the executor says where the program came from), else a guess:
    "disk" if the disk tier counted a hit since the last event. The counter
    is read either way, so a guess after known events starts from them."""
    global _disk_hits_seen
    hits = _metrics.DISK_CACHE["hits"]
    hit = hits != _disk_hits_seen
    _disk_hits_seen = hits
    return known or ("disk" if hit else "compile")


def record(name: str, key=None, seconds: float = 0.0, compiled=None, lowered=None,
           kind: str | None = None, tier: str | None = None, fn=None, args=None):
    """Record one compiled program (called by the executor listener and others).

    Returns the CompileEvent. `compiled` is a jax.stages.Compiled, `lowered`
    an optional jax.stages.Lowered of the same program.
    """
    global _seq
    try:
        text = compiled.as_text() if compiled is not None else ""
    except Exception:
        text = ""
    program = Program(name, lowered=lowered, compiled=compiled, fn=fn, args=args,
                      optimized_text=text or None)
    with _lock:
        _seq += 1
        kind = kind or _kind_of(name)
        # Why it compiled, if its op or graph compiled before (compile events only).
        try:
            reason = _recompiles.HISTORY_OF_KEYS.reason(name, key, _seq) if (
                key is not None and kind != "hlo") else None
        except Exception:  # noqa: BLE001 - a debugging aid never fails a compile
            reason = None
        ev = CompileEvent(
            seq=_seq, name=name, key_hash=key_hash(key), kind=kind,
            tier=_tier(tier), seconds=float(seconds), program_bytes=len(text),
            time=time.time(), program=program, reason=reason)
        _events.append(ev)
        TOTALS["compiles"] += 1
        TOTALS_BY_TIER[ev.tier] += 1
        # Drop old program references (they hold executables alive).
        if len(_events) > KEEP_PROGRAMS:
            old = _events[-KEEP_PROGRAMS - 1]
            old.program = None
    if log.isEnabledFor(logging.INFO):
        log.info("compile %-32s key=%s kind=%s tier=%s %.1f ms, program %d bytes%s",
                 name, ev.key_hash, ev.kind, ev.tier, ev.seconds * 1e3, ev.program_bytes,
                 "" if ev.reason is None else f"; recompiled: {ev.reason}")
    dump_dir = switch_raw("TORCH_TPU_DUMP_DIR")
    if dump_dir:
        ev.dumped = tuple(dump(ev, program, dump_dir))
    return ev


def _on_compile(name, key, seconds, compiled):
    """The executor's COMPILE_LISTENERS callback."""
    lowered = _PENDING_LOWERED.pop(id(key), None) if _PENDING_LOWERED else None
    if lowered is not None and lowered[0] is not key:
        lowered = None
    source = getattr(compiled, "_torch_tpu_source", None)  # runtime.programs.mark_source
    record(str(name), key, seconds, compiled,
           lowered=lowered[1] if lowered is not None else None,
           tier=None if source is None else ("disk" if source == "disk" else "compile"))


def _on_lowered(name, key, lowered):
    """Executor hook (`LOWERED_LISTENERS`, when the executor has it): the
    jax.stages.Lowered of the program about to be compiled under `key`."""
    _PENDING_LOWERED[id(key)] = (key, lowered)


_PENDING_LOWERED: dict = {}


# --------------------------------------------------------------------------
# dump directory





STAGE_FILES = {
    "stablehlo": "stablehlo.mlir",
    "hlo": "hlo.txt",
    "optimized": "optimized.hlo.txt",
}


_DUMP_NEXT: dict = {}  # dump directory -> the number its next program gets
_LEADING = re.compile(r"(\d{5,})-")


def _dump_number(dump_dir: str) -> int:
    """The next file number in `dump_dir`: 1 in a new directory, one past the
    highest there in one that has dumps already (a reader lists a directory in
    compile order whatever else this process compiled before)."""
    n = _DUMP_NEXT.get(dump_dir)
    if n is None:
        n = 1 + max((int(m.group(1)) for f in os.listdir(dump_dir)
                     if (m := _LEADING.match(f))), default=0)
    _DUMP_NEXT[dump_dir] = n + 1
    return n


def dump(ev: CompileEvent, program, dump_dir: str) -> list:
    """Write `program`'s stages as `<n>-<name>-<keyhash>.<stage file>`, n
    counting the programs of that directory from 1 (`ev.dumped` names them)."""
    written: list = []
    try:
        os.makedirs(dump_dir, exist_ok=True)
        with _lock:
            stem = f"{_dump_number(dump_dir):05d}-{safe_name(ev.name)}-{ev.key_hash}"
        for stage, suffix in STAGE_FILES.items():
            if not program.has_stage(stage):
                continue
            try:
                text = program.text(stage)
            except RuntimeError:  # a stage that cannot be had (the error names it)
                continue
            path = os.path.join(dump_dir, f"{stem}.{suffix}")
            with open(path, "w") as f:
                f.write(text)
            written.append(path)
    except OSError as e:
        _warn_dump_once(dump_dir, e)
    return written


_dump_warned: set = set()


def _warn_dump_once(dump_dir, e):
    if dump_dir in _dump_warned:
        return
    _dump_warned.add(dump_dir)
    import warnings

    warnings.warn(f"TORCH_TPU_DUMP_DIR={dump_dir!r} is not writable ({e}); programs are "
                  "not dumped", stacklevel=3)


# --------------------------------------------------------------------------
# the log


def events(kind: str | None = None, name: str | None = None, since: int = 0) -> list:
    """The recorded CompileEvents (oldest first), optionally filtered; `since`:
    only those after the event numbered `since` (a `last_seq()` taken before)."""
    programs.settle()  # compiles still running are recorded first
    with _lock:
        evs = [e for e in _events if e.seq > since] if since else list(_events)
    if kind is not None:
        evs = [e for e in evs if e.kind == kind]
    if name is not None:
        evs = [e for e in evs if e.name == name]
    return evs


def last_seq() -> int:
    """The number of the newest event (0 before any): a mark for `events(since=)`,
    which stays right when the log is full and drops its oldest."""
    programs.settle()
    with _lock:
        return _seq


def clear() -> None:
    """Forget the events, and the keys later reasons are compared with."""
    with _lock:
        _events.clear()
        _recompiles.HISTORY_OF_KEYS.clear()


# --------------------------------------------------------------------------
# JAX persistent cache events -> tier counters


def _on_jax_event(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits":
        _metrics.DISK_CACHE["hits"] += 1
    elif event == "/jax/compilation_cache/compile_requests_use_cache":
        _metrics.DISK_CACHE["requests"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        _metrics.DISK_CACHE["misses"] += 1


# --------------------------------------------------------------------------
# TORCH_TPU_LOG


_LOGGERS = {"compile": "torch_tpu.compile", "fallback": "torch_tpu.fallback"}
_handlers: dict = {}


def set_log(kinds) -> None:
    """Print events of `kinds` ('compile', 'fallback', 'all', a comma list,
    or None/'' for none) through Python logging (stderr handler, INFO)."""
    if kinds is None:
        kinds = ""
    if isinstance(kinds, str):
        kinds = [k.strip().lower() for k in kinds.split(",") if k.strip()]
    kinds = set(kinds)
    if "all" in kinds:
        kinds = set(_LOGGERS)
    bad = kinds - set(_LOGGERS)
    if bad:
        raise ValueError(f"unknown log kind(s) {sorted(bad)}; valid: "
                         f"{sorted(_LOGGERS) + ['all']}")
    for kind, lname in _LOGGERS.items():
        logger = logging.getLogger(lname)
        if kind in kinds:
            logger.setLevel(logging.INFO)
            if kind not in _handlers:
                h = logging.StreamHandler()
                h.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
                logger.addHandler(h)
                _handlers[kind] = h
        else:
            h = _handlers.pop(kind, None)
            if h is not None:
                logger.removeHandler(h)
                logger.setLevel(logging.NOTSET)


_installed = False


def install() -> None:
    """Hook into the executor and JAX (idempotent)."""
    global _installed
    if _installed:
        return
    if _on_compile not in executor.COMPILE_LISTENERS:
        executor.COMPILE_LISTENERS.append(_on_compile)
    lowered_listeners = getattr(executor, "LOWERED_LISTENERS", None)
    if lowered_listeners is not None and _on_lowered not in lowered_listeners:
        lowered_listeners.append(_on_lowered)
    try:
        import jax.monitoring

        jax.monitoring.register_event_listener(_on_jax_event)
    except Exception:  # pragma: no cover - older JAX
        pass
    env = switch_value("TORCH_TPU_LOG")
    if env:
        try:
            set_log(env)
        except ValueError as e:
            import warnings

            warnings.warn(f"TORCH_TPU_LOG: {e}", stacklevel=2)
    _installed = True
