"""Asynchronous compilation: the host runs ahead while XLA compiles eager ops.

A cold eager step is compile-bound: every new op signature costs an XLA
compile (tens of milliseconds each on XLA:CPU, a hundred programs in the
tiny Llama's first step) while the host would only need the result's shape
and dtype, which PyTorch's meta kernels already gave. So on a cache miss the
executor (`executor.Runner._build`) still runs the meta kernel, traces and lowers the
program on the host (errors in those raise at once, as before), and then
`compile` hands XLA's compile to a thread pool (XLA compiles outside the
GIL) and returns a `PendingExecutable`. Calling an op whose executable is
still compiling, or whose inputs are values not computed yet, goes to
`launch`: the call is queued on one execution thread, in program order, and
returns `Value`s (a `storage.Deferred`) for its results and the storages it
writes, with their shapes and dtypes. The host goes on with the next op;
reading a value (`DeviceData.array`: `.item()`, `.cpu()`, a kernel outside
the executor) waits for it.

Ordering: executions run one at a time in the order they were launched,
each after its own compile, so an op reads exactly the values strict mode
would give it (its inputs were launched before it). Compiles run in
parallel, up to ``TORCH_TPU_COMPILE_THREADS`` at once (default: the host's
CPU count, see `_default_threads`; ``0`` turns this module off: every
compile blocks, as before).
No task waits for a later one, so the pools cannot deadlock.

Errors, like CUDA's asynchronous errors: an op that fails to compile or to
run raises when one of its values is read (or at `synchronize`, which
`torch.tpu.synchronize()` calls), with the op named; every value computed
from it raises the same error, and later calls of a program that failed to
compile raise it again. ``TORCH_TPU_LAUNCH_BLOCKING=1`` turns this module
off (every op compiles, runs and is checked before it returns).

Statistics: a miss is counted when it is submitted; compile seconds, disk
loads and the compile listeners follow when the compile ends, so readers of
statistics call `programs.settle()` (installed here) to see them complete.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from . import gc_pause, memory_history, oom, platform, programs
from . import opt_level as _olevel
from . import storage as st
from .context import CONTEXT
from .switches import switch_set, switch_value

ENV_THREADS = "TORCH_TPU_COMPILE_THREADS"
_PREFIX = "torch_tpu-async-"  # the pools' thread names


def _default_threads() -> int:
    """The host's CPU count. Measured on 2 CPUs (tiny Llama, cold first step,
    medians of 3 alternating runs at load ~1): 0 threads 3.99 s, 1 thread
    3.50 s, 2 threads 2.64 s, the same process CPU seconds. At load 4-8 from
    other processes there is no spare core and the gain disappears in the noise."""
    return max(1, os.cpu_count() or 1)


def _threads() -> int:
    raw = switch_value(ENV_THREADS)
    if not raw:
        return _default_threads()
    try:
        n = int(raw)
    except ValueError:
        import warnings

        warnings.warn(f"torch_tpu: {ENV_THREADS}={raw!r} is not a number of threads; "
                      "using the default", stacklevel=2)
        return _default_threads()
    return max(0, n)


def _launch_blocking() -> bool:
    return switch_set("TORCH_TPU_LAUNCH_BLOCKING")


THREADS = _threads()
# Whether misses compile in the background (read by the executor).
ENABLED = THREADS > 0 and not _launch_blocking()

# Tasks (compiles and executions) submitted and not finished. The executor
# reads it on every op: while it is 0 nothing is pending and the ordinary
# synchronous path runs.
OUTSTANDING = 0
_count_lock = threading.Lock()
_live: set = set()  # their futures
_pools: list = []
_pool_lock = threading.Lock()
# The first error of a value nobody read yet, for `synchronize` to raise.
_unread: list = []


def _executors() -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    if not _pools:
        with _pool_lock:
            if not _pools:
                _pools.append(ThreadPoolExecutor(max(1, THREADS),
                                                 thread_name_prefix=_PREFIX + "compile"))
                _pools.append(ThreadPoolExecutor(1, thread_name_prefix=_PREFIX + "run"))
    return _pools[0], _pools[1]


def compile_pool() -> ThreadPoolExecutor:
    """The compile threads, for other compile work done ahead (the compile
    backend's backward programs); such work is not counted in OUTSTANDING."""
    return _executors()[0]


def _submit(pool: ThreadPoolExecutor, fn: Any, *args: Any) -> Future:
    global OUTSTANDING
    with _count_lock:
        OUTSTANDING += 1
        f = pool.submit(fn, *args)
        _live.add(f)
    f.add_done_callback(_finished)
    return f


def _finished(f: Future) -> None:
    global OUTSTANDING
    with _count_lock:
        if f in _live:
            _live.discard(f)
            OUTSTANDING -= 1


def _named(e: BaseException, name: str) -> BaseException:
    """`e` with the op `name` in its message (same type where possible)."""
    msg = str(e)
    if name in msg:
        return e
    try:
        err = type(e)(f"{name}: {msg}")
    except Exception:  # noqa: BLE001 - an exception type with another signature
        err = RuntimeError(f"{name}: {type(e).__name__}: {msg}")
    return err


def _reraise(e: BaseException) -> None:
    raise e.with_traceback(None)


# --------------------------------------------------------------------------
# compiling


class PendingExecutable:
    """An eager op's executable while XLA compiles it in the pool.

    The executor's entry holds it as `compiled` until the compile ends; then
    the entry is given the real executable (`attach`). Calling it waits for
    the compile (or raises its error, the op named).
    """

    __slots__ = ("name", "future", "compiled", "error", "entry", "_torch_tpu_bytes",
                 "_torch_tpu_specs")
    # _torch_tpu_specs: (result specs, new storage value specs, committed), see specs_of

    def __init__(self, name: str):
        self.name = name
        self.future: Future | None = None
        self.compiled: Any = None
        self.error: BaseException | None = None
        self.entry: Any = None
        # What the program cache counts for it (programs.grown_footprint's
        # estimate for an executable without measurements).
        self._torch_tpu_bytes = max(programs.DEFAULT_FOOTPRINT, programs.MIN_FOOTPRINT)
        self._torch_tpu_specs: Any = None

    def result(self) -> Any:
        if self.compiled is None:
            assert self.future is not None
            self.future.result()  # the error is kept in self.error
            if self.error is not None:
                _reraise(self.error)
        return self.compiled

    def done(self) -> bool:
        return self.compiled is not None or self.error is not None

    def __call__(self, *args: Any) -> Any:
        return self.result()(*args)


_attach_lock = threading.Lock()


def attach(entry: Any) -> None:
    """Let `entry.compiled` (a PendingExecutable) become the executable once compiled."""
    p = entry.compiled
    if type(p) is not PendingExecutable:
        return
    with _attach_lock:
        if p.compiled is not None:
            entry.compiled = p.compiled
        else:
            p.entry = entry


def lower(name: str, key: Any, fn: Any, args: Any, **jit_kwargs: Any) -> tuple[Any, int, float]:
    """Trace and lower `fn` on this thread (JAX raises bad input here), telling
    `programs.LOWERED_LISTENERS`: (lowered, optimization level, seconds)."""
    import jax

    level = CONTEXT.opt_level
    clock = programs.STATS.compile_clock  # trace_s is part of the compile's seconds
    t0 = time.perf_counter()
    gc_pause.begin()
    clock.begin()
    try:
        with programs.flushing_denormals():
            lowered = jax.jit(fn, **jit_kwargs).lower(*args)
    finally:
        gc_pause.end()
        clock.end()
    trace_s = time.perf_counter() - t0
    for listener in programs.LOWERED_LISTENERS:
        listener(name, key, lowered)
    return lowered, level, trace_s


def compile(name: str, key: Any, fn: Any, args: Any, index_key: str | None = None,  # noqa: A001
            **jit_kwargs: Any) -> PendingExecutable:
    """`programs.compile`, with XLA's compile in the pool: trace and lower
    `fn` here (raising what JAX raises for bad input), then return at once."""
    lowered, level, trace_s = lower(name, key, fn, args, **jit_kwargs)
    # Counted now, so that a miss is seen as soon as it happened.
    programs.STATS.misses += 1
    programs.STATS.compiles_per_op[name] += 1
    p = PendingExecutable(name)
    p._torch_tpu_specs = specs_of(lowered.out_info, is_committed(lowered))
    pool, _ = _executors()
    p.future = _submit(pool, compile_pending, p, name, key, lowered, level, trace_s, index_key)
    return p


def compile_pending(p: PendingExecutable, name: str, key: Any, lowered: Any, level: int,
                    trace_s: float, index_key: str | None = None) -> None:
    """Compile `lowered` into `p` (its executable, or the error it raises when
    read): the compile pool runs it; fused mode calls it in the caller's thread."""
    try:
        with programs.STATS.compile_clock:  # overlapping compiles: their wall-clock union
            compiled, seconds, source = programs.compile_lowered(
                name, lowered, _olevel.compiler_options(level), trace_s)
    except BaseException as e:  # noqa: BLE001 - kept, raised where the op's values are read
        import jax

        if isinstance(e, jax.errors.JaxRuntimeError):  # no raw JAX error reaches the user
            p.error = RuntimeError(f"{name}: XLA failed to compile the op's program: {e}")
        else:
            p.error = _named(e, name)
        return
    programs.store_indexed(index_key, compiled)
    try:
        compiled._torch_tpu_bytes = p._torch_tpu_bytes
        compiled._torch_tpu_specs = p._torch_tpu_specs
    except AttributeError:
        pass
    with programs.STATS.lock:
        programs.STATS.compile_seconds += seconds
        if source == "disk":
            programs.STATS.disk_loads += 1
    programs.mark_source(compiled, source)
    for listener in programs.COMPILE_LISTENERS:
        try:
            listener(name, key, seconds, compiled)
        except Exception:  # noqa: BLE001 - a debug listener must not lose the program
            pass
    with _attach_lock:
        p.compiled = compiled
        if p.entry is not None:
            p.entry.compiled = compiled
            p.entry = None


# --------------------------------------------------------------------------
# running


class Value(st.Deferred):
    """A result, or a written storage's new array, of a launched op."""

    __slots__ = ("shape", "dtype", "future", "index", "committed")

    def __init__(self, shape: tuple, dtype: Any, future: Future, index: int,
                 committed: bool | None = None):
        self.shape = shape
        self.dtype = dtype
        # The launched op's future: (its results + its new storage values).
        self.future = future
        self.index = index
        # Whether the array will be committed to its device (None: unknown).
        self.committed = committed

    def done(self) -> bool:
        return self.future.done()

    def peek(self) -> Any:
        """The array if it is computed (without waiting), else None."""
        f = self.future
        if not f.done() or f.exception() is not None:
            return None
        return f.result()[self.index]

    def resolve(self) -> Any:
        f = self.future
        try:
            return f.result()[self.index]
        except BaseException as e:
            f._torch_tpu_reported = True  # type: ignore[attr-defined]
            _reraise(e)
            raise  # unreachable


def abstract(data: st.DeviceData) -> Any:
    """For a value of this module not computed yet, what the executor compiles
    a new program against: its shape and dtype, committed to its device
    exactly as the array will be, so the program lowers to the same text (and
    disk-cache key) as for the array; None for anything else (fused.abstract
    asks this first)."""
    raw = data.raw
    if type(raw) is Value and raw.committed is not None and not raw.done():
        import jax

        sharding = (jax.sharding.SingleDeviceSharding(platform.jax_device(data.index))
                    if raw.committed else None)
        return jax.ShapeDtypeStruct(raw.shape, raw.dtype, sharding=sharding)
    return None


def deferred(entry: Any, sig: Any) -> bool:
    """Whether this call of a compiled entry must be launched (`launch`):
    its executable is still compiling or an input is a launched op's value."""
    if entry.compiled is None:  # an eager (data-dependent) lowering: runs on the host
        return False
    if type(entry.compiled) is PendingExecutable and not entry.compiled.done():
        return True
    for d in sig.slot_data:
        raw = d.raw
        if type(raw) is Value and not raw.done():
            return True
    return False


def is_committed(lowered: Any) -> bool | None:
    """Whether the program's results are committed to their device (JAX's
    rule: any input or output sharding given); None where JAX does not say.
    Also fused mode's, for the specs of the programs it lowers."""
    try:
        return bool(lowered._lowering.compile_args["committed"])
    except Exception:  # noqa: BLE001 - another JAX: values resolve before a compile
        return None


def specs_of(out_info: Any, committed: bool | None) -> tuple:
    """((shape, dtype) of each result, of each new storage value, whether they
    are committed) of a program; the executor and fused mode attach these to
    the executables they make (`_torch_tpu_specs`)."""
    outs, bases = out_info
    return (tuple((tuple(o.shape), o.dtype) for o in outs),
            tuple((tuple(b.shape), b.dtype) for b in bases), committed)


def _specs(exe: Any) -> tuple:
    specs = getattr(exe, "_torch_tpu_specs", None)
    if specs is None:  # compiled before this module ran it: once per executable
        specs = specs_of(exe.out_info, None)
        try:
            exe._torch_tpu_specs = specs
        except AttributeError:
            pass
    return specs


def launch(entry: Any, sig: Any, name: str) -> tuple[list, list]:
    """Queue one call of `entry` on the execution thread: (results, new storage values)."""
    inputs = []
    for d in sig.slot_data:
        raw = d.raw
        if type(raw) is Value:  # resolved by _run (a failure propagates)
            inputs.append(raw)
        elif isinstance(raw, st.Deferred):  # another mode's pending value: compute it now
            inputs.append(d.array)
        else:
            inputs.append(raw)
    out_specs, base_specs, committed = _specs(entry.compiled)
    _, runner = _executors()
    # The launching stack, for the memory history (its allocs happen in _run).
    where = memory_history.launch_frames(name) if st.RECORD is not None else None
    f = _submit(runner, _run, entry.compiled, inputs, list(sig.dyn), name, sig.device,
                entry.nbytes, where)
    f.add_done_callback(_keep_error)
    n = len(out_specs)
    outs = [Value(shape, dtype, f, i, committed) for i, (shape, dtype) in enumerate(out_specs)]
    bases = [Value(shape, dtype, f, n + i, committed)
             for i, (shape, dtype) in enumerate(base_specs)]
    return outs, bases


def _run(exe: Any, inputs: list, dyn: list, name: str, device: int, nbytes: int,
         where: list | None = None) -> list:
    import jax

    if type(exe) is PendingExecutable:
        exe = exe.result()
    # Launched earlier on this thread: finished (or failed: raise the same error).
    arrays = [v.resolve() if type(v) is Value else v for v in inputs]
    try:
        outs, bases = exe(arrays, dyn)
    except jax.errors.JaxRuntimeError as e:
        raise oom.translate(e, name, device, nbytes) from None
    except Exception as e:  # noqa: BLE001
        raise _named(e, name) from None
    if where is not None:
        memory_history.launched(list(outs) + list(bases), device, name, where)
    return list(outs) + list(bases)


def _keep_error(f: Future) -> None:
    if f.exception() is not None and not _unread:
        _unread.append(f)


def on_worker_thread() -> bool:
    """Whether this thread is one of the pools' (a task there never waits for them)."""
    return threading.current_thread().name.startswith(_PREFIX)


def wait() -> None:
    """Wait for every compile and launched op to finish (errors stay with their values)."""
    from concurrent.futures import wait as _wait

    if on_worker_thread():
        return  # a task (e.g. an error's memory report) never waits for the pools
    while True:
        with _count_lock:
            live = list(_live)
        if not live:
            return
        _wait(live)


def synchronize() -> None:
    """`wait`, then raise the error of a failed op whose values nobody read
    yet (once), naming the op: what `torch.tpu.synchronize()` calls."""
    wait()
    if _unread:
        f = _unread.pop()
        if not getattr(f, "_torch_tpu_reported", False):
            f._torch_tpu_reported = True
            e = f.exception()
            assert e is not None
            _reraise(e)


programs.SETTLE_HOOKS.append(wait)
