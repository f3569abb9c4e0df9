"""The program cache: every compiled XLA executable of the process goes through here.

One in-memory LRU, bounded by count (``TORCH_TPU_CACHE_SIZE``, default 8192)
and by bytes (``TORCH_TPU_CACHE_BYTES``), holds the eager ops' executables
(the executor's entries), the helper programs the kernels compile (copies,
casts, view reads, arange, padding, ...), fused eager programs and compiled
graphs (`ProgramKind.GRAPH`, compile/graph_cache.py's entries).
`get_or_compile` is the one way in for helper programs: look the key up, and
on a miss trace, lower and compile the function (`compile`) and insert it.
Statistics (`STATS`, one table: the counters of the eager and helper
programs, counted on the hot path, and a row per kind that counts its own
lookups through `find`, with an optional per-kind cap: `add_kind`) and
listeners (`COMPILE_LISTENERS`, `LOWERED_LISTENERS`) live here too.

Keys are tuples whose first element names the program (`ProgramKind`, or the
op overload for the executor's entries); docs/architecture.md ("cache-key
anatomy") describes them.

Plug-ins, declared here and installed by their owners, never imported by
name from this layer except the default disk tier on first compile:

- the **disk tier** (`set_disk_tier`): `begin()` before a compile returns a
  token, `end(token, name, seconds, trace_seconds, compiled)` after it says
  where the executable came from ("compiled", "disk" or "uncached") and may
  store `compiled`. torch_tpu.cache
  installs itself when imported.
- the **index tier** (`set_index_tier`): finds an eager op's executable by
  the executor's key, without tracing or lowering (`load_indexed`), and
  indexes each one compiled (`compile(..., index_key=...)`).
  torch_tpu.cache installs it with the disk tier.
- **listeners**: callables appended to `COMPILE_LISTENERS` (name, key,
  seconds, compiled) and `LOWERED_LISTENERS` (name, key, lowered) — the
  debug tools.
- **compile hooks** (`add_compile_hook`): wrappers around `compile`, for
  callers that pass ``hooks=True`` (the compiled-graph tier: SPMD programs).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .._compat import jax_api  # (imports no JAX until called)
from . import gc_pause
from .context import CONTEXT
from .host_memory import host_memory, parse_bytes
from .switches import switch_value


class ProgramKind(str, enum.Enum):
    """What a helper program is: the first element of its cache key.

    The executor's entries start with the op overload instead (one program
    per overload and signature).
    """

    VIEW_READ = "view_read"      # read a view's value (runtime.executor.read)
    COPY = "copy_"               # write a value into a (view of a) storage (ops.core.assign)
    CAST = "convert"             # dtype conversion of an array (ops.core._cast)
    ARANGE = "aten.arange"       # arange's values (ops.factories)
    RANDOM_DIRECT = "random"     # kernels without a meta kernel (ops.random)
    MULTINOMIAL_CHECK = "multinomial_check"  # multinomial's weight checks (ops.random)
    LINALG = "linalg"            # multi-output linalg helpers (ops.linalg)
    PAD = "pad_to_bucket"        # dynamic-shape padding (compile.padding)
    UNPAD = "unpad_from_bucket"
    FUSED = "fused_eager"        # a fused eager mode trace (runtime.fused)
    ZEROS = "zeros"              # a zero-filled buffer of one shape (ops.core._zeros)
    GRAPH = "compiled_graph"     # a torch.compile graph's entry (compile.graph_cache)

    # Enum's own __hash__ is Python code (hash of the name), run on every
    # lookup of a key holding a kind: the str's C hash is equal-consistent
    # and costs nothing.
    __hash__ = str.__hash__


class KeyTag(str, enum.Enum):
    """Marker parts of the executor's keys (str-valued: they print as the old tags)."""

    RNG = "rng"          # a random op: a fresh PRNG key is a runtime input
    CPU_SCALAR = "c"     # (KeyTag.CPU_SCALAR, dtype): a 0-dim CPU tensor argument
    ONE = "1"            # a Scalar alpha that is the int 1: in the program, not an input

    __hash__ = str.__hash__  # (see ProgramKind)


class EagerKey(NamedTuple):
    """The named parts of an eager op's key (the executor builds the flat tuple).

    Layout, in order: the op overload; one part per argument (`args`, see
    docs/architecture.md "cache-key anatomy": a storage's signature the first
    time a storage is seen, then the tensor's slot and layout; a Scalar's
    Python type; a static value; a list's length); `KeyTag.RNG` for random
    ops; then the `EAGER_CONTEXT` parts, always last, in this order.
    """

    op: Any
    args: tuple
    rng: bool
    device: int
    default_dtype: Any
    precision: Any
    opt_level: int


# The parts every eager key ends with, in order (the executor appends them).
EAGER_CONTEXT = ("device", "default_dtype", "precision", "opt_level")


def eager_key(key: tuple) -> EagerKey:
    """Name the parts of executor key `key` (debugging, docs; not the hot path)."""
    n = len(EAGER_CONTEXT)
    body, context = key[1:-n], key[-n:]
    rng = bool(body) and body[-1] is KeyTag.RNG
    if rng:
        body = body[:-1]
    return EagerKey(key[0], tuple(body), rng, *context)


def key_name(key: tuple) -> str:
    """What a cached program is: its kind's value, or the op of an eager key."""
    head = key[0]
    return head.value if isinstance(head, ProgramKind) else str(head)


# --------------------------------------------------------------------------
# statistics and listeners


class KindStats:
    """One row of the stats table: a kind of program that counts its own
    lookups (`find`) apart from the hot path's counters, with its own
    counters beside them (`counters`: name -> zero value) and an optional
    cap on its entries (`capacity`: () -> int) inside the cache's bounds."""

    COMMON = {"requests": 0, "hits": 0, "misses": 0, "evictions": 0}

    def __init__(self, kind: Any, counters: dict | None = None,
                 capacity: Callable[[], int] | None = None) -> None:
        self.kind = kind
        self.counters = {**self.COMMON, **(counters or {})}
        self.capacity = capacity
        self.entries = 0  # this kind's programs in CACHE: state, kept by reset()
        self.reset()

    def reset(self) -> None:
        for name, zero in self.counters.items():
            setattr(self, name, zero)

    if TYPE_CHECKING:  # the counters are attributes named at run time
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.counters}
        out["entries"] = self.entries
        return out


class WallClock:
    """Wall seconds during which at least one interval was open: the wall-clock
    union of intervals that may overlap (compiles on several threads).

    `begin` / `end` (or `with clock:`) open and close one interval; a count of
    open intervals, under a lock, accumulates elapsed time while it is above
    zero. Summing each interval's own seconds instead counts overlapping time
    once per interval: two 1 s compiles on two threads sum to 2 s, in 1 s.
    `now` is the clock read (a test gives a manual one).
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.lock = threading.Lock()
        self.open = 0           # intervals open now
        self.since = 0.0        # when `open` last went from 0 to 1
        self.total = 0.0        # closed busy time

    def begin(self) -> None:
        with self.lock:
            if self.open == 0:
                self.since = self.now()
            self.open += 1

    def end(self) -> None:
        with self.lock:
            self.open -= 1
            if self.open == 0:
                self.total += self.now() - self.since

    def __enter__(self) -> WallClock:
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    @property
    def seconds(self) -> float:
        """Busy wall seconds so far (an interval still open counts up to now)."""
        with self.lock:
            return self.total + (self.now() - self.since if self.open else 0.0)

    def reset(self) -> None:
        """Zero the busy time (intervals still open count from now on)."""
        with self.lock:
            self.total = 0.0
            self.since = self.now()


class CacheStats:
    """In-memory executable cache statistics (see torch_tpu.cache.stats).

    The table: the counters here count the eager ops' and helper programs'
    lookups (the hot path: `lookup`, `get_or_compile`, the executor, the
    native kernel) and every compile (`misses`, from `record_compile`); each
    kind in `rows` (`add_kind`; compiled graphs) counts its own lookups and
    evictions there instead.

    `requests`, `hits` and `per_op` also count the native C++ kernel's cache
    hits (csrc/, see csrc/README.md), which it keeps in C++ rather than make Python
    objects per call: `native_counts` (its take_stats) hands them over
    whenever one of the three is read or written.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # The wall time during which a compile (tracing and lowering included,
        # or a load from the disk tier) was in flight, on any thread:
        # `compile_seconds` sums each compile's own seconds, which exceeds
        # the wall time when compiles overlap (runtime.async_compile's pool).
        self.compile_clock = WallClock()
        self.native_counts: Any = None  # () -> None | (hits, {op name: hits})
        self.rows: dict = {}  # kind -> KindStats
        self.reset()

    def _take_native(self) -> None:
        taken = self.native_counts()
        if taken is not None:
            n, per_op = taken
            self._requests += n
            self._hits += n
            self._per_op.update(per_op)

    @property
    def requests(self) -> int:
        if self.native_counts is not None:
            self._take_native()
        return self._requests

    @requests.setter
    def requests(self, value: int) -> None:
        self._requests = value

    @property
    def hits(self) -> int:
        if self.native_counts is not None:
            self._take_native()
        return self._hits

    @hits.setter
    def hits(self, value: int) -> None:
        self._hits = value

    @property
    def per_op(self) -> collections.Counter:
        """Executions per op."""
        if self.native_counts is not None:
            self._take_native()
        return self._per_op

    @per_op.setter
    def per_op(self, value: collections.Counter) -> None:
        self._per_op = value

    # The executor's per-call counting: plain additions, without the
    # properties' hand-over of the native counts (sums commute; readers take them).
    def count_request(self) -> None:
        self._requests += 1

    def count_run(self, name: str, hit: bool) -> None:
        self._hits += hit
        self._per_op[name] += 1

    def reset(self) -> None:
        if self.native_counts is not None:
            self.native_counts()  # the native kernel's counts so far: dropped too
        self.requests = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.map_evictions = 0   # times the mapping bound (map_limit) evicted
        self.compile_seconds = 0.0   # summed over compiles (overlapping ones each count)
        self.compile_clock.reset()   # ... and their wall-clock union
        self.disk_loads = 0                       # misses served by the disk tier
        self.per_op = collections.Counter()  # executions per op
        self.compiles_per_op: collections.Counter = collections.Counter()
        for row in self.rows.values():
            row.reset()

    def as_dict(self) -> dict:
        settle()
        return {
            "requests": self.requests,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "entries": len(CACHE),
            "capacity": capacity(),
            "bytes": BYTES[0],
            "byte_capacity": byte_capacity(),
            "compile_seconds": self.compile_seconds,
            "compile_wall_seconds": self.compile_wall_seconds,
            "disk_loads": self.disk_loads,
        }

    @property
    def compile_wall_seconds(self) -> float:
        """Wall seconds during which at least one compile was in flight."""
        return self.compile_clock.seconds


STATS = CacheStats()


def add_kind(kind: Any, counters: dict | None = None,
             capacity: Callable[[], int] | None = None) -> KindStats:
    """Give `kind` (a key's first element) its own row of the stats table and
    its cap; the row (the one already there if `kind` has one)."""
    row = STATS.rows.get(kind)
    if row is None:
        row = STATS.rows[kind] = KindStats(kind, counters, capacity)
    return row


def graph_capacity() -> int:
    """TORCH_TPU_GRAPH_CACHE_SIZE: the most compiled graphs the cache holds
    (within its bounds, `capacity` and `byte_capacity`)."""
    return int(switch_value("TORCH_TPU_GRAPH_CACHE_SIZE"))


# Compiled graphs (compile/graph_cache.py) count their own lookups, and what
# only graphs have; declared here so that the table has the row before the
# backend loads (torch_tpu.cache.stats()["graphs"]).
add_kind(ProgramKind.GRAPH, {
    "graphs": 0,            # CompiledGraph objects created
    "eager_fallbacks": 0,   # graphs that run op by op
    "donating_calls": 0,    # calls that gave their overwritten inputs' buffers to XLA
    "runs": 0,              # graph programs executed (one per compiled-graph call)
    "lowered": 0,           # graph specializations traced, lowered and compiled/loaded by XLA
    "disk_loads": 0,        # ... loaded from the graph tier instead (nothing traced)
    "prebuilt": 0,          # backward programs compiled ahead, at the forward's first call
    "backend_seconds": 0.0,        # in tpu_backend: AOTAutograd + graph setup
    "lower_compile_seconds": 0.0,  # tracing + lowering + XLA compile (or executable load)
    "load_seconds": 0.0,           # graph-tier loads
}, capacity=graph_capacity)
# Observers of compile events: callables (name, key, seconds, compiled).
COMPILE_LISTENERS: list = []

# Observers of lowered programs, before XLA compiles them: callables
# (name, key, lowered) — the debug tools keep StableHLO and unoptimized HLO.
LOWERED_LISTENERS: list = []

# Waits for compiles still running in the background (runtime.async_compile
# installs one): readers of statistics and compile events call `settle()`
# first, so they see every compile that was started.
SETTLE_HOOKS: list = []


def settle() -> None:
    """Wait until the compiles started so far are counted and announced."""
    for hook in SETTLE_HOOKS:
        hook()


# --------------------------------------------------------------------------
# the LRU, bounded by count and by bytes

CACHE: collections.OrderedDict = collections.OrderedDict()


def capacity() -> int:
    """TORCH_TPU_CACHE_SIZE: the most entries the in-memory tier holds."""
    return int(switch_value("TORCH_TPU_CACHE_SIZE"))


# Bytes of the executables in CACHE (one-element list: mutated in place), and
# each entry's footprint.
BYTES = [0]
ENTRY_BYTES: dict = {}
_byte_cap: list = []


def byte_capacity() -> float:
    """TORCH_TPU_CACHE_BYTES: the in-memory tier's bound in bytes (read once).

    Default: 1/16 of the host's memory, at least 256 MiB. Executables are
    host memory on every platform (on XLA:CPU all of them; on TPU and GPU
    their host side, plus the device code PJRT reports).
    """
    if not _byte_cap:
        env = switch_value("TORCH_TPU_CACHE_BYTES")
        cap = parse_bytes(env, "TORCH_TPU_CACHE_BYTES") if env else max(
            host_memory() // 16, 256 * 2**20)
        _byte_cap.append(cap if cap is not None else float("inf"))
    return _byte_cap[0]


# An executable's footprint: the growth of the process's resident memory
# while it was compiled (or loaded from disk), plus the device code PJRT
# reports (0 on XLA:CPU). Growth is a measurement only until the cache first
# evicts: from then on new executables reuse the memory evicted ones freed
# and resident memory hardly grows (measured: estimates fell from ~1.2 MB to
# ~140 KB an entry, and the cache, holding ever more entries, kept growing).
# An op's first compile is no measurement either (it carries one-time work:
# XLA's initialization, the op's first tracing). An executable counts the
# median of its op's measurements (at most nine), or DEFAULT_FOOTPRINT
# where it has fewer than three; at least MIN_FOOTPRINT, at most 16 MiB a
# measurement. Measured on XLA:CPU (jax 0.10.2): ~0.5-1 MB an executable.
MIN_FOOTPRINT = 64 * 2**10
DEFAULT_FOOTPRINT = 512 * 2**10
_MAX_SAMPLE = 16 * 2**20
_OP_SAMPLES: dict = {}
_SAMPLING = [True]   # until the first eviction
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def grown_footprint(name: str, grown: int, compiled: Any) -> int:
    try:
        code = int(compiled.memory_analysis().generated_code_size_in_bytes or 0)
    except Exception:  # noqa: BLE001  (no analysis for this executable)
        code = 0
    samples = _OP_SAMPLES.get(name)
    if samples is None:
        _OP_SAMPLES[name] = []  # the op's first compile: no measurement
    elif _SAMPLING[0] and len(samples) < 9 and grown > 0:
        samples.append(min(grown, _MAX_SAMPLE))
        samples.sort()
    known = samples[len(samples) // 2] if samples and len(samples) >= 3 else DEFAULT_FOOTPRINT
    return max(known, MIN_FOOTPRINT) + code


def _row_of(key: Any) -> KindStats | None:
    """The stats row of `key`'s kind, or None (counted on the hot path)."""
    rows = STATS.rows
    if not rows or type(key) is not tuple or not key:
        return None
    return rows.get(key[0])


def find(key: Any) -> Any:
    """`lookup` of a key whose kind has its own row (`add_kind`): a request,
    and a hit or a miss, counted there."""
    row = STATS.rows[key[0]]
    row.requests += 1
    entry = CACHE.get(key)
    if entry is None:
        row.misses += 1
        return None
    row.hits += 1
    CACHE.move_to_end(key)
    return entry


def keys(kind: Any) -> list:
    """The keys of the cached programs of `kind` (least recently used first)."""
    return [k for k in list(CACHE) if type(k) is tuple and k and k[0] is kind]


def lookup(key: Any) -> Any:
    """The entry cached under `key` (now the most recently used), or None."""
    STATS.requests += 1
    entry = CACHE.get(key)
    if entry is not None:
        STATS.hits += 1
        CACHE.move_to_end(key)
    return entry


def peek(key: Any) -> Any:
    """`lookup` without counting a request: for programs compiled outside
    `compile` (the zeros programs, ops.core), which count no miss either."""
    entry = CACHE.get(key)
    if entry is not None:
        CACHE.move_to_end(key)
    return entry


def footprint(name: str, compiled: Any) -> int:
    """The bytes `insert` charges for `compiled`, a program compiled outside
    `compile` (which measures its own)."""
    return grown_footprint(name, 0, compiled)


def insert(key: Any, entry: Any) -> None:
    """Insert `entry` (an executor entry, a compiled executable or another
    kind's entry with a `compiled` executable); evict the least recently used
    entries beyond TORCH_TPU_CACHE_SIZE entries or TORCH_TPU_CACHE_BYTES
    bytes, and the least recently used of `key`'s kind beyond its own cap
    (`add_kind`; the new entry itself always stays but for a cap of 0)."""
    compiled = getattr(entry, "compiled", entry)
    nbytes = getattr(compiled, "_torch_tpu_bytes", 0) if compiled is not None else 0
    old = ENTRY_BYTES.pop(key, 0)
    dropped = key in CACHE
    row = _row_of(key)
    if row is not None and not dropped:
        row.entries += 1
    CACHE[key] = entry
    ENTRY_BYTES[key] = nbytes
    BYTES[0] += nbytes - old
    if row is not None and row.capacity is not None and row.entries > row.capacity():
        oldest = next(k for k in list(CACHE) if _row_of(k) is row)
        del CACHE[oldest]
        _evicted(oldest)
        dropped = True
    cap, byte_cap = capacity(), byte_capacity()
    while len(CACHE) > 1 and (len(CACHE) > cap or BYTES[0] > byte_cap):
        _evict_oldest()
        dropped = True
    for _ in range(min(_over_map_budget(), len(CACHE) - 1)):
        _evict_oldest()
        dropped = True
    if dropped:
        _dropped()


# The process's memory mappings, a third bound. XLA:CPU maps each compiled
# kernel's code and data separately: an executable holds from a few to ~40
# mappings (embedding_bag with its backward, measured), and Linux refuses new
# ones past vm.max_map_count (65530 by default), where LLVM's JIT fails with
# "Cannot allocate memory" and the next compile dies with SIGSEGV (PyTorch's
# test_embedding_bag_1D_padding_idx, ~1,600 programs into the run, issue 38).
# Every MAP_CHECK_EVERY insertions the count is read (/proc/self/maps, a few
# ms at tens of thousands of lines); above MAP_FRACTION of the limit, the
# least recently used entries go, as many as bring it to MAP_TARGET of it at
# the current mappings per entry.
MAP_FRACTION = 0.6
MAP_TARGET = 0.45
MAP_CHECK_EVERY = 16
# The limit the bound works against: None reads vm.max_map_count once; a test
# (or a user on a kernel that lies about it) may set a number, 0 turns it off.
MAP_LIMIT: int | None = None
_max_map_count: int | None = None  # vm.max_map_count, read once
_inserts = 0  # insertions so far (the bound checks every MAP_CHECK_EVERY)


def map_limit() -> int:
    """vm.max_map_count, or MAP_LIMIT where set (0 where the platform has
    none: the bound is off)."""
    global _max_map_count
    if MAP_LIMIT is not None:
        return MAP_LIMIT
    if _max_map_count is None:
        try:
            with open("/proc/sys/vm/max_map_count") as f:
                _max_map_count = int(f.read().strip())
        except (OSError, ValueError):
            _max_map_count = 0
    return _max_map_count


def map_count() -> int:
    """The process's memory mappings now (0 where /proc is absent)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _over_map_budget() -> int:
    """How many entries to evict for the mapping bound (0 almost always)."""
    global _inserts
    _inserts += 1
    if _inserts % MAP_CHECK_EVERY:
        return 0
    limit = map_limit()
    if not limit:
        return 0
    maps = map_count()
    if maps <= MAP_FRACTION * limit or not CACHE:
        return 0
    per_entry = max(maps / len(CACHE), 1.0)
    STATS.map_evictions += 1
    return int((maps - MAP_TARGET * limit) / per_entry) + 1


def _evict_oldest() -> None:
    k, _ = CACHE.popitem(last=False)
    _evicted(k)


def _evicted(key: Any) -> None:
    """Account for `key`, just evicted from CACHE."""
    BYTES[0] -= ENTRY_BYTES.pop(key, 0)
    row = _row_of(key)
    if row is None:
        STATS.evictions += 1
    else:
        row.evictions += 1
        row.entries -= 1
    _SAMPLING[0] = False


def _forget(key: Any) -> None:
    """Account for `key`, just dropped from CACHE (not an eviction)."""
    BYTES[0] -= ENTRY_BYTES.pop(key, 0)
    row = _row_of(key)
    if row is not None:
        row.entries -= 1


def discard(key: Any) -> None:
    """Drop the entry cached under `key`, if any (its next call misses)."""
    if CACHE.pop(key, None) is not None:
        _forget(key)
        _dropped()


def clear(kind: Any = None) -> None:
    """Drop every cached program of the in-memory tier (`kind`: those of one
    kind only, e.g. ProgramKind.GRAPH)."""
    if kind is None:
        CACHE.clear()
        ENTRY_BYTES.clear()
        BYTES[0] = 0
        for row in STATS.rows.values():
            row.entries = 0
    else:
        for k in keys(kind):
            if CACHE.pop(k, None) is not None:
                _forget(k)
    _dropped()


# Called whenever an entry leaves CACHE or is replaced: the native kernel
# remembers recent hits with their entries (csrc/memo.h, "the memo")
# and forgets them all then (executor.install_kernel registers it). Entries
# leave only through insert, discard and clear.
ON_DROP: list = []


def _dropped() -> None:
    for forget in ON_DROP:
        forget()


def entry_changed() -> None:
    """An entry's executable was replaced in place (fused.LazyExecutable's
    first compile): the native kernel forgets what it remembered of it."""
    _dropped()


def memory_stats() -> dict:
    """The in-memory tier, every kind together: counters, entries and bytes
    with their bounds (`misses`: the programs compiled or loaded)."""
    settle()
    s = STATS
    rows = list(s.rows.values())
    return {"hits": s.hits + sum(r.hits for r in rows), "misses": s.misses,
            "entries": len(CACHE), "capacity": capacity(),
            "evictions": s.evictions + sum(r.evictions for r in rows), "bytes": BYTES[0],
            "byte_capacity": byte_capacity(), "compile_seconds": s.compile_seconds,
            "compile_wall_seconds": s.compile_wall_seconds, "disk_loads": s.disk_loads}


def entries(kind: Any = None) -> int:
    """How many programs the cache holds: of `kind` (one with its own row),
    or (None) of the kinds counted on the hot path."""
    if kind is not None:
        return STATS.rows[kind].entries
    return len(CACHE) - sum(r.entries for r in STATS.rows.values())


# --------------------------------------------------------------------------
# plug-ins


class DiskTier(Protocol):
    """What the persistent tier provides around each compile (torch_tpu.cache)."""

    def begin(self) -> Any: ...

    def end(self, token: Any, name: str, seconds: float, trace_seconds: float,
            compiled: Any = None) -> str: ...

    def abort(self, token: Any) -> None: ...  # stop collecting; nothing is recorded


_DISK_TIER: list = []


def set_disk_tier(tier: DiskTier | None) -> None:
    """Install the persistent tier consulted by every compile (None: none)."""
    _DISK_TIER[:] = [tier]


def disk_tier() -> DiskTier | None:
    """The persistent tier: the default one (torch_tpu.cache) installs itself
    with set_disk_tier when the package imports it (torch_tpu.compile does, at
    start-up); None before that or when turned off."""
    return _DISK_TIER[0] if _DISK_TIER else None


class IndexTier(Protocol):
    """Eager programs found by their executor key, not lowered (torch_tpu.cache.eager)."""

    def key(self, key: tuple, device: Any) -> str | None: ...  # None: not indexable, or off

    def load(self, index_key: str, args: Any, device: Any) -> Any: ...  # an executable or None

    def store(self, index_key: str, compiled: Any) -> None: ...  # after a compile on this thread


_INDEX_TIER: list = []


def set_index_tier(tier: IndexTier | None) -> None:
    """Install the index tier consulted before an eager op is lowered (None: none)."""
    _INDEX_TIER[:] = [tier]


def index_tier() -> IndexTier | None:
    """The index tier (installed with the default disk tier, see `disk_tier`)."""
    if not _INDEX_TIER:
        disk_tier()
    return _INDEX_TIER[0] if _INDEX_TIER else None


def load_indexed(name: str, key: Any, index_key: str, args: Any, device: Any,
                 relower: Callable | None = None) -> Any:
    """The executable that the index tier holds for `index_key`, for `args` on
    JAX device `device`, or None: one memory-tier miss served from disk
    without lowering, counted and announced as `compile` does. `relower`
    (a thunk giving the jax.stages.Lowered) goes with it for the debug tools,
    which show a program's lowered stages on demand."""
    index = index_tier()
    if index is None:
        return None
    tier = disk_tier()
    token = tier.begin() if tier is not None else None
    rss0 = _rss()
    STATS.compile_clock.begin()
    t0 = time.perf_counter()
    compiled = None
    source = "disk"
    try:
        compiled = index.load(index_key, args, device)
    finally:
        seconds = time.perf_counter() - t0
        STATS.compile_clock.end()
        if tier is not None:
            if compiled is None:
                tier.abort(token)
            else:
                source = tier.end(token, name, seconds, 0.0)
    if compiled is None:
        return None
    try:
        compiled._torch_tpu_bytes = grown_footprint(name, _rss() - rss0, compiled)
        compiled.relower = relower
    except AttributeError:
        pass
    record_compile(name, key, seconds, compiled, source)
    return compiled


def store_indexed(index_key: str | None, compiled: Any) -> None:
    """Index `compiled`, just produced on this thread, under `index_key` (if any)."""
    if index_key is None or compiled is None:
        return
    index = index_tier()
    if index is not None:
        try:
            index.store(index_key, compiled)
        except Exception:  # noqa: BLE001 - the program runs; only its index entry is lost
            pass


COMPILE_HOOKS: list = []


def add_compile_hook(hook: Callable[[Callable], Callable]) -> None:
    """Wrap `compile` for the callers that ask for hooks (compiled graphs).

    `hook(compile_fn)` returns a function with `compile`'s signature; hooks
    nest in the order they were added. Adding the same hook twice is a no-op.
    """
    if hook not in COMPILE_HOOKS:
        COMPILE_HOOKS.append(hook)
        HOOKED.clear()


HOOKED: list = []


def hooked_compile() -> Callable:
    """`compile` wrapped by the declared compile hooks (see add_compile_hook)."""
    if not HOOKED:
        fn: Callable = compile
        for hook in COMPILE_HOOKS:
            fn = hook(fn)
        HOOKED.append(fn)
    return HOOKED[0]


# --------------------------------------------------------------------------
# compiling


@contextlib.contextmanager
def flushing_denormals() -> Iterator[None]:
    """This thread's float arithmetic flushes subnormals (FTZ and DAZ) inside.

    XLA:CPU runs every program so (its client's ScopedFlushDenormal), but
    the constant folding done while a program is lowered and compiled runs on
    the calling thread as it is: a subnormal folded there (`full(1e-38) *
    0.01` in a compiled graph) would differ from the same arithmetic at run
    time, in eager code or on a TPU. Lowering and compiling run inside this.
    """
    import torch  # lazy, as jax below: this module is in the start-up set

    if _flushes_denormals() or not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _flushes_denormals() -> bool:
    """Does this thread's float arithmetic flush subnormals now (numpy's scalar
    product, compiled C under the thread's MXCSR)?"""
    import numpy as np

    return bool(np.float32(1e-38) * np.float32(0.01) == 0)


def compile_lowered(name: str, lowered: Any, options: Any = None,
                    trace_s: float = 0.0) -> tuple[Any, float, str]:
    """XLA-compile a lowered program with the disk tier around it: every
    compile of the process goes through here (the executor's, the compile
    threads', the background zeros programs').

    The disk tier writes the new executable after the compile (every process
    its own misses: `cache._write_entry`). Returns
    (compiled, seconds including `trace_s`, source: "compiled" / "disk" /
    "uncached"). A failed compile raises, with the tier's bookkeeping undone.
    """
    # JAX's persistent-cache write inside `compile` (process 0 only) is off
    # for this call, on this thread only: the tier writes the entry in `end`,
    # from every process. JAX compiles outside this function (eager jnp in a
    # kernel) keep JAX's own write.
    tier = disk_tier()
    token = tier.begin() if tier is not None else None
    t0 = time.perf_counter()
    try:
        with jax_api.no_jax_cache_write(), flushing_denormals():
            compiled = lowered.compile(options) if options is not None else lowered.compile()
    except BaseException:
        if tier is not None:
            tier.abort(token)
        raise
    seconds = trace_s + time.perf_counter() - t0
    source = tier.end(token, name, seconds, trace_s, compiled) if tier is not None else "compiled"
    return compiled, seconds, source


def compile(name: str, key: Any, fn: Callable, args: Any, opt_level: int | None = None,  # noqa: A001
            index_key: str | None = None, **jit_kwargs: Any) -> Any:
    """Trace, lower and compile `fn` for `args`: one memory-tier miss (not cached).

    The persistent tier sits under XLA compilation: on a disk hit the
    executable is loaded instead of compiled. `jit_kwargs` go to `jax.jit`
    (e.g. donate_argnums for compiled graphs). `opt_level`: the XLA
    optimization level (torch_tpu.runtime.opt_level; None: the process-wide
    one), which the caller's `key` must hold. `index_key`: the index tier's
    key of this program (the executor's eager ops), indexed once compiled.
    Callers that keep their own entries (the executor, the graph tier) call
    this; others call `get_or_compile`.
    """
    # Lazy: this module loads at start-up (torch_tpu.cache imports it, under
    # the torch.compile wrapper) and must not import JAX there.
    import jax  # lazy: this module is in the start-up set (no JAX there)

    from . import opt_level as _olevel  # lazy: as above (it imports JAX's config)

    rss0 = _rss()
    t0 = time.perf_counter()
    gc_pause.begin()
    STATS.compile_clock.begin()  # the wall time of `seconds` below
    try:
        with flushing_denormals():
            lowered = jax.jit(fn, **jit_kwargs).lower(*args)
        trace_s = time.perf_counter() - t0
        for listener in LOWERED_LISTENERS:
            listener(name, key, lowered)
        compiled, seconds, source = compile_lowered(
            name, lowered, _olevel.compiler_options(
                CONTEXT.opt_level if opt_level is None else opt_level), trace_s)
    finally:
        STATS.compile_clock.end()
        gc_pause.end()
    store_indexed(index_key, compiled)
    try:
        compiled._torch_tpu_bytes = grown_footprint(name, _rss() - rss0, compiled)
    except AttributeError:  # an executable type without a __dict__
        pass
    record_compile(name, key, seconds, compiled, source)
    return compiled


def record_compile(name: str, key: Any, seconds: float, compiled: Any, source: str) -> None:
    """Count one memory-tier miss and tell the listeners: what `compile` does after
    compiling, for tiers that produce executables another way (the graph tier
    loading a graph from disk without lowering it)."""
    with STATS.lock:  # background compiles (runtime.async_compile) count too
        STATS.misses += 1
        STATS.compile_seconds += seconds
        STATS.compiles_per_op[name] += 1
        if source == "disk":
            STATS.disk_loads += 1
    mark_source(compiled, source)
    for listener in COMPILE_LISTENERS:
        listener(name, key, seconds, compiled)


def mark_source(compiled: Any, source: str) -> None:
    """Where the executable came from ("compiled", "disk", ...), on itself for the
    listeners (debug's compile log): programs compile and load on several threads
    at once, so a shared counter cannot say which one a disk hit was."""
    try:
        compiled._torch_tpu_source = source
    except AttributeError:  # an executable type without a __dict__
        pass


def get_or_compile(key: tuple, fn: Callable, args: Any, name: str | None = None) -> Any:
    """The compiled executable cached under `key`, compiling `fn` for `args` on a miss.

    `key` must hold everything the program depends on: `args`' shapes and
    dtypes, the values baked into `fn`, the device where the outputs are
    placed explicitly; it starts with a `ProgramKind` and ends with the XLA
    optimization level (`CONTEXT.opt_level`). `name` (default: the kind's
    value) is what statistics and the debug tools show. (No jit options:
    pass a `jax.jit`-wrapped `fn` for out_shardings, as ops/factories does.)
    """
    # lookup(), inlined: this is on the path of every copy, cast and view read.
    STATS.requests += 1
    compiled = CACHE.get(key)
    if compiled is not None:
        STATS.hits += 1
        CACHE.move_to_end(key)
        return compiled
    if name is None:
        name = key_name(key)
    compiled = compile(name, key, fn, args)
    insert(key, compiled)
    return compiled
