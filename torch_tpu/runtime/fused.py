"""Fused eager mode: record eager ops, run them later as one cached XLA program.

    with torch_tpu.fused():          # or TORCH_TPU_EAGER=fused for the process
        loss = model(x).sum()
        loss.backward()
        opt.step()                   # the step's ops run here, as one program

In strict eager mode (the default) every op runs at once as its own cached
executable. In fused mode the executor (`executor.Runner.__call__`) still does
everything an op does up to running it: PyTorch's meta kernels check the
arguments and give shapes and dtypes (so a bad call raises at once, as in
strict mode), the op's program is traced and lowered once per signature (XLA
compiles it only if it is ever called on its own: `LazyExecutable`), a
random op draws its key from the same stream. Then, instead of running, the
op is *recorded* (`record`): its results and the storages it writes get
`_Node` values (a `storage.Deferred`) that stand for arrays not computed yet.

The recorded ops run, as one jitted program inlining each op's un-jitted
program, at the first of (`flush`):

- a read of a pending value: `.item()`, `.cpu()`, printing, `.numpy()`, a
  kernel outside the executor (a copy, a view read, a collective, a compiled
  graph, an eager data-dependent op such as `nonzero`) — any read of
  `DeviceData.array` resolves the node, which flushes;
- `torch.tpu.synchronize()`;
- the first op of a backward pass after ops recorded outside one: the
  forward program runs while the backward pass is recorded;
- the end of `optimizer.step()` (a global optimizer hook), so a training
  loop's traces are a step's forward pass and its backward pass with the
  optimizer step, and repeat;
- `TORCH_TPU_FUSED_MAX_OPS` recorded ops (default 2000);
- leaving the mode.

Semantics are strict mode's: each recorded op is the same traced program,
fed the same values, so results are the same (bitwise for elementwise
chains: XLA may fuse across op boundaries, which changes nothing for
elementwise ops and may reorder reductions within the OpInfo tolerances).
Views and in-place ops work as in strict mode because the storages are the
unit: an in-place op's new storage value is a node, and every alias reads it.

The fused program's inputs are the arrays the trace read from outside it
and every op's dynamic inputs (scalars, view offsets, random keys); its
outputs are the nodes still referenced at the flush (weak references: a
temporary that died is not an output). It is cached in the one program
cache (`programs.get_or_compile`) under the trace's signature: the sequence
of the ops' executor entries and how each op's inputs connect. A loop whose
trace repeats hits the cache every step; the number of distinct fused
programs is bounded by the cache's size like every other program.

Donation: an external input that only the trace still references (the old
value of a parameter, gradient or optimizer state the trace overwrote in
place) is donated, so XLA writes the new values into its buffer instead of
allocating fresh ones (`_donatable`; the donation mask is part of the key;
TORCH_TPU_DONATE=0 turns it off).

Errors, like CUDA's asynchronous errors: a failure while the fused program
runs is raised at the flush (the read, synchronize or step that triggered
it), naming the recorded op that caused it — the trace is replayed op by op
to find it — and every value that trace would have produced raises it again
when read. `TORCH_TPU_LAUNCH_BLOCKING=1` turns fused mode off (each op runs
and is checked at once).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import async_compile as aco
from . import fastpath, keys, memory_history, oom, platform, programs, scalars
from .switches import switch_on, switch_value
from . import storage as st
from .context import CONTEXT

ENV = "TORCH_TPU_EAGER"
# Recorded ops after which the trace is flushed (bounds the program size).
MAX_OPS = int(switch_value("TORCH_TPU_FUSED_MAX_OPS"))

# Whether ops are recorded: CONTEXT.fused (runtime/context.py), written here.
_modes: list[bool] = []          # the stack of `fused(enabled)` contexts
_default = False                 # TORCH_TPU_EAGER=fused
_lock = threading.RLock()
_trace: _Trace | None = None     # the ops recorded and not run yet


class Stats:
    """What fused mode did (tests and benchmarks read it)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.recorded = 0        # ops recorded
        self.flushes = 0         # non-empty traces run
        self.programs = 0        # distinct fused programs compiled
        self.donated = 0         # input buffers given to fused programs (donation)


STATS = Stats()


class _Trace:
    """The ops recorded since the last flush (on one device)."""

    __slots__ = ("ops", "dyns", "ext", "ext_ids", "nodes", "error", "backward", "device")

    def __init__(self, device: int, backward: bool) -> None:
        self.device = device
        self.backward = backward  # recording began inside a backward pass
        # (entry, refs, name) per op: the fused program's signature as it is
        # recorded (the flush's key is `tuple(ops)`, no per-flush rebuilding).
        # refs: one per storage slot of the op, >= 0 a node's position in
        # `nodes`, < 0 an external array (-1 - index into `ext`).
        self.ops: list[tuple] = []
        self.dyns: list[list] = []  # each op's dynamic inputs (sig.dyn)
        self.ext: list[jax.Array] = []
        self.ext_ids: dict[int, int] = {}
        # Every node made, held strongly (a weak reference per node cost more
        # than the flush's reference count of each, `_live`).
        self.nodes: list[_Node] = []
        self.error: BaseException | None = None


class _Node(st.Deferred):
    """One value a recorded op produces: a result or a written storage's new array."""

    __slots__ = ("spec", "trace", "pos", "value")

    def __init__(self, spec, trace, pos):
        self.spec = spec  # (shape, jax dtype), shared by the entry's nodes (_specs)
        self.trace = trace
        self.pos = pos
        self.value = None

    @property
    def shape(self) -> tuple:  # type: ignore[override]  # read-only: the entry's shared spec
        return self.spec[0]

    @property
    def dtype(self) -> Any:
        return self.spec[1]

    def resolve(self) -> jax.Array:
        v = self.value
        if v is None:
            tr = self.trace
            if tr is not None and tr.error is None:
                flush()
            v = self.value
            if v is None:
                err = self.trace.error if self.trace is not None else None
                if err is None:  # not reachable: a flush sets every live node
                    raise RuntimeError("fused eager mode: a recorded value was never computed")
                raise _again(err)
        return v


def _again(err: BaseException) -> BaseException:
    """A fresh exception like `err` (re-raising one object grows its traceback)."""
    try:
        return type(err)(*err.args)
    except Exception:  # noqa: BLE001
        return RuntimeError(str(err))


# --------------------------------------------------------------------------
# the mode


def _set_active() -> None:
    on = _modes[-1] if _modes else _default
    if on and CONTEXT.launch_blocking:
        on = False
    CONTEXT.fused = on
    if on:
        _install_hooks()


class mode(contextlib.ContextDecorator):
    """`torch_tpu.fused()`: record eager ops inside, run them as fused programs.

    `fused(False)` runs strict eager inside an outer fused region. Leaving
    either flushes what was recorded. (A class, not a generator context
    manager: entering and leaving cost a third as much, which a short fused
    region, a few ops per `with`, pays every time.)
    """

    __slots__ = ("enabled",)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)

    def __enter__(self) -> None:
        with _lock:
            if _modes and _modes[-1] and not self.enabled:
                flush()
            _modes.append(self.enabled)
            _set_active()

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            _modes.pop()
            _set_active()
            if not CONTEXT.fused:
                flush()


def enabled() -> bool:
    """Whether eager ops are being recorded now."""
    return CONTEXT.fused


def set_default(on: bool) -> None:
    """The mode outside any `fused()` context (TORCH_TPU_EAGER=fused sets it)."""
    global _default
    with _lock:
        _default = bool(on)
        _set_active()
        if not CONTEXT.fused:
            flush()


_hooks_installed = False


def _install_hooks() -> None:
    """Flush at the end of every optimizer step (once per process)."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_step)


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _trace is not None:
        flush()


# --------------------------------------------------------------------------
# recording


def _specs(entry: Any, sig: Any) -> tuple:
    """The recording template of `entry`, made at its first recording (the
    executor's cache entry is per op and input signature, so every later
    recording reuses it instead of inferring shapes again):
    (specs, n, barrier). specs: (shape, jax dtype) of each value the op's
    program returns, its results then its written storages' new arrays
    (each tuple is the `spec` of the nodes made for it); n: how many are
    results; barrier: for each, whether it needs the rounding barrier
    (`_rounded`). From the program itself (its jaxpr), so they match what
    the fused program computes."""
    specs = entry.fused_specs
    if specs is None:
        ins = [jax.ShapeDtypeStruct(d.shape, st.TORCH_TO_JAX[d.dtype]) for d in sig.slot_data]
        closed = jax.make_jaxpr(entry.program)(ins, list(sig.dyn))
        avals = closed.out_avals
        n = len(avals) - len(entry.writes)
        barrier = tuple(jnp.issubdtype(a.dtype, jnp.floating) and _needs_barrier(closed.jaxpr, v)
                        for a, v in zip(avals, closed.jaxpr.outvars))
        specs = entry.fused_specs = (tuple((tuple(a.shape), a.dtype) for a in avals), n, barrier)
        c = entry.compiled
        if type(c) is LazyExecutable and c.entry is None:
            # Built for this recording (the executor builds, then records):
            # a later compile hands the executable to the entry.
            c.entry = entry
    return specs


# Primitives that pass a value on unchanged (or only moved): the barrier
# question is the producer's behind them.
_PASS = frozenset({"reshape", "broadcast_in_dim", "transpose", "convert_element_type", "copy",
                   "copy_p", "squeeze", "expand_dims", "slice", "dynamic_slice", "rev",
                   "reduce_precision"})
# Library calls (matmuls, convolutions): their results never end in a bare
# multiply that XLA:CPU could contract with the next op's add.
_NO_CONTRACT = frozenset({"dot_general", "conv_general_dilated"})


def _needs_barrier(jaxpr: Any, var: Any, depth: int = 0) -> bool:
    """Whether output `var` of `jaxpr` may end in a multiply (conservative:
    yes unless it comes from a matmul or convolution, or is an input)."""
    if type(var).__name__ == "Literal":  # a constant
        return False
    if depth > 32:
        return True
    for eqn in reversed(jaxpr.eqns):
        if var in eqn.outvars:
            name = eqn.primitive.name
            if name in _NO_CONTRACT:
                return False
            if name in _PASS:
                return _needs_barrier(jaxpr, eqn.invars[0], depth + 1)
            inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            if inner is not None:
                inner = getattr(inner, "jaxpr", inner)
                return _needs_barrier(inner, inner.outvars[eqn.outvars.index(var)], depth + 1)
            return True
    return False  # an input of the program: the op that produced it rounded it


def record(entry: Any, sig: Any, name: str) -> tuple:
    """Record one op instead of running it: (results, new storage values) as nodes.

    Called by the executor where strict mode calls `entry.compiled`. The hot
    path of fused mode: everything per op and input signature is in the
    entry's template (`_specs`), the trace's signature is the list of
    (entry, refs, name) it appends, and the flush reads the rest.
    """
    return _record(entry, sig, name, True)  # type: ignore[return-value]


def _record(entry: Any, sig: Any, name: str, may_flush: bool) -> tuple | None:
    """`record`; with may_flush False, None (nothing recorded) where the
    recording would run the trace (a flush raises the recorded ops' errors,
    which must reach the user from the executor's path, not the native one)."""
    global _trace
    with _lock:
        tr = _trace
        if tr is None:
            tr = _trace = _Trace(sig.device, _graph_task() != -1)
        elif tr.device != sig.device or (not tr.backward and _graph_task() != -1):
            if not may_flush:
                return None
            # One program runs on one device. And the first op of a backward
            # pass after ops recorded outside one (a forward pass) flushes:
            # the forward program runs while the backward pass is recorded,
            # instead of the device idling until the whole step is recorded.
            # Not at the backward pass's end: the optimizer step's program
            # would wait for the backward one to release the parameters it
            # donates. The split is the same every step.
            flush()
            tr = _trace = _Trace(sig.device, _graph_task() != -1)
        if not may_flush and len(tr.ops) + 1 >= MAX_OPS:
            return None
        ext = tr.ext
        ids = tr.ext_ids
        refs = []
        for d in sig.slot_data:
            raw = d.raw
            if type(raw) is _Node and raw.trace is tr:  # pending in this trace
                refs.append(raw.pos)
                continue
            if isinstance(raw, st.Deferred):
                raw = d.array
            i = ids.get(id(raw))
            if i is None:
                i = ids[id(raw)] = len(ext)
                ext.append(raw)
            refs.append(-1 - i)
        specs, n, _ = entry.fused_specs or _specs(entry, sig)
        nodes = tr.nodes
        pos = len(nodes)
        if n == 1 and len(specs) == 1:  # one result, no written storage: most ops
            node = _Node(specs[0], tr, pos)
            nodes.append(node)
            outs: tuple = (node,)
            bases: tuple = ()
        else:
            made = [_Node(spec, tr, pos + i) for i, spec in enumerate(specs)]
            nodes.extend(made)
            outs, bases = tuple(made[:n]), tuple(made[n:])
        ops = tr.ops
        ops.append((entry, tuple(refs), name))
        tr.dyns.append(sig.dyn)
        STATS.recorded += 1
        if len(ops) >= MAX_OPS:
            flush()
        return outs, bases


class _NativeCall:
    """What `record` reads of the executor's signature, from the native kernel."""

    __slots__ = ("slot_data", "dyn", "device")

    def __init__(self, slot_data: tuple, dyn: list, device: int) -> None:
        self.slot_data = slot_data
        self.dyn = dyn
        self.device = device


def record_native(entry: Any, slot_data: tuple, dyn: list, device: int, name: str) -> Any:
    """`record` for the native kernel (csrc/, see csrc/README.md), which found `entry`
    for a call of tpu tensors (whole or views) while ops are recorded: what the executor
    does in fused mode on that hit, minus its Python path. None (nothing
    recorded): the executor's path decides, as for an entry without a program."""
    if entry.program is None:
        return None
    if entry.narrow:  # the kernel passes the call's own Python numbers
        dyn = list(dyn)
        scalars.narrow(dyn, device)
    return _record(entry, _NativeCall(slot_data, dyn, device), name, False)


class LazyExecutable:
    """An op's executable when the op is first seen in fused mode: lowered
    now (so JAX's errors for a bad input, the specs and the disk-cache key are
    strict mode's), compiled by XLA at its first call only. Fused mode inlines
    the op's program into the fused one and never calls it, so a cold fused
    step does not compile every op twice; a later strict call of the op (or
    the error replay at a flush) compiles it then, through the disk tier, and
    hands the executable to its entry (and the native kernel)."""

    __slots__ = ("name", "key", "lowered", "level", "trace_s", "compiled", "entry",
                 "_torch_tpu_bytes", "_torch_tpu_specs")

    def __init__(self, name: str, key: Any, lowered: Any, level: int, trace_s: float,
                 specs: tuple) -> None:
        self.name = name
        self.key = key
        self.lowered = lowered
        self.level = level
        self.trace_s = trace_s
        self.compiled: Any = None
        self.entry: Any = None  # set by `record`, which follows the entry's build
        self._torch_tpu_bytes = max(programs.DEFAULT_FOOTPRINT, programs.MIN_FOOTPRINT)
        self._torch_tpu_specs = specs

    def __call__(self, *args: Any) -> Any:
        c = self.compiled
        if c is None:
            c = self._compile()
        return c(*args)

    def _compile(self) -> Any:
        with _lock:
            if self.compiled is not None:
                return self.compiled
            p = aco.PendingExecutable(self.name)
            p._torch_tpu_specs = self._torch_tpu_specs
            with programs.STATS.lock:
                programs.STATS.misses += 1
                programs.STATS.compiles_per_op[self.name] += 1
            aco.compile_pending(p, self.name, self.key, self.lowered, self.level, self.trace_s)
            c = p.result()  # raises the compile's error, the op named
            self.compiled, self.lowered = c, None
            entry = self.entry
            if entry is not None and entry.compiled is self:
                entry.compiled = c
                # The native kernel may run its strict hits now; its memos
                # point into the spec being dropped (`record_native`).
                entry.fast = None
                programs.entry_changed()
            return c


def compile_later(name: str, key: Any, fn: Any, args: Any, **jit_kwargs: Any) -> LazyExecutable:
    """The executor's compile for an op built while ops are recorded (`LazyExecutable`)."""
    lowered, level, trace_s = aco.lower(name, key, fn, args, **jit_kwargs)
    specs = aco.specs_of(lowered.out_info, aco.is_committed(lowered))
    return LazyExecutable(name, key, lowered, level, trace_s, specs)


def abstract(data: st.DeviceData) -> Any:
    """`data`'s array, or for a value fused mode has not computed yet its
    shape, dtype and device (enough to compile a program for it) without
    running the trace. Other deferred values (asynchronous compilation's)
    resolve as before: compiling against their shapes instead changed the
    programs' disk-cache keys (notebook 05's warm start missed twice)."""
    raw = data.raw
    if type(raw) is _Node and raw.value is None:
        return jax.ShapeDtypeStruct(data.shape, raw.dtype, sharding=jax.sharding.SingleDeviceSharding(
            platform.jax_device(data.index)))
    pending = aco.abstract(data)  # asynchronous compilation's values
    return data.array if pending is None else pending


# --------------------------------------------------------------------------
# running


def pending() -> int:
    """Ops recorded and not run yet."""
    tr = _trace
    return 0 if tr is None else len(tr.ops)


def flush() -> None:
    """Run the recorded ops now, as one cached program; give every live node its value."""
    global _trace
    with _lock:
        tr = _trace
        if tr is None:
            return
        _trace = None
        if not tr.ops:
            return
        nodes, tr.nodes = tr.nodes, []
        live_nodes = _live(nodes)
        del nodes  # the dead nodes go (and their reference to the trace)
        live = tuple([n.pos for n in live_nodes])
        plan = tuple(tr.ops)
        donate = _donatable(tr.ext, live_nodes)
        key = keys.helper_key(programs.ProgramKind.FUSED, plan, live, donate)
        device = tr.device
        dyns = _device_scalars(tr.dyns, device)
        STATS.flushes += 1
        try:
            ext = tr.ext
            if donate:
                gone = set(donate)
                args = ([ext[i] for i in donate], [a for i, a in enumerate(ext) if i not in gone],
                        dyns, _zero(device))
            else:
                args = ([], ext, dyns, _zero(device))
            fn = programs.lookup(key)
            if fn is None:
                fn = _compile(key, _program(tr, live, device, donate), args, donate, device)
                STATS.programs += 1
            if donate:
                STATS.donated += len(donate)
                del ext  # the donated arrays' last references are the trace's and args'
                tr.ext.clear()
                tr.ext_ids.clear()
            try:
                values = fn(*args)
            except jax.errors.JaxRuntimeError as e:
                raise _attribute(tr, e, args) from None
            del args
        except BaseException as e:
            tr.error = e
            tr.ops.clear()
            tr.dyns.clear()
            tr.ext.clear()
            tr.ext_ids.clear()
            raise
        if st.RECORD is not None:
            memory_history.fused_outputs(tr.ops, tr.device, live_nodes, values)
        for n, v in zip(live_nodes, values):
            n.value = v
            n.trace = None


def _live(nodes: list) -> list:
    """The nodes referenced from outside the trace (a storage, a result not
    returned yet, a node being resolved): the fused program's outputs. The
    others' tensors died; they are temporaries inside the program."""
    getref = sys.getrefcount
    dead = _DEAD
    return [n for n in nodes if getref(n) > dead]


def _refcounts(nodes: list) -> list:
    getref = sys.getrefcount
    return [getref(n) for n in nodes]


# What `_live` counts for a node only its trace's list holds (the list, the
# comprehension's variable, getrefcount's argument: 3 on CPython 3.11),
# measured by the same construct rather than assumed.
_DEAD = _refcounts([object()])[0]


# -1 outside a backward pass (autograd's engine sets it on the thread running one).
_graph_task = torch._C._current_graph_task_id

_SCALAR_TYPES = (float, int, bool)


def _zero(device: int) -> jax.Array:
    """_ZERO on `device` (cached)."""
    k = (np.int32, 0, device)
    a = fastpath.SCALAR_ARRAYS.get(k)
    if a is None:
        a = fastpath.SCALARS.put(k, jax.device_put(_ZERO, platform.jax_device(device)))
    return a


def _device_scalars(dyns: list, device: int) -> list:
    """The ops' dynamic inputs with Python scalars as (cached) device arrays.

    A Python scalar argument sends a compiled call down JAX's slow Python
    path, which converts each one on every call; a fused program has one
    per Scalar argument and view offset of every recorded op. `device_put`
    of a Python scalar keeps its weak type, so the program (traced with
    these) is the one the Python values would give.
    """
    out = []
    cache = fastpath.SCALAR_ARRAYS  # shared with the native call
    missing: dict = {}  # key -> [(conv list, position)]: sent in one transfer
    for dyn in dyns:
        if not dyn:  # most ops: nothing to convert
            out.append(dyn)
            continue
        conv: list[Any] = []
        for v in dyn:
            t = type(v)
            if t in _SCALAR_TYPES:
                # -0.0 == 0.0: the sign of a zero must not share an entry.
                k = (t, v, device) if v or t is not float else (t, str(v), device)
                a = cache.get(k)
                if a is None:
                    missing.setdefault(k, []).append((conv, len(conv)))
                else:
                    v = a
            conv.append(v)
        out.append(conv)
    if missing:
        # Values new to the cache (an optimizer's per-step bias corrections,
        # a changed learning rate): one batched device_put for all of them.
        keys = list(missing)
        vals = [places[0][0][places[0][1]] for places in missing.values()]
        try:
            arrays = jax.device_put(vals, platform.jax_device(device))
        except OverflowError:  # an int beyond int64 among them: one by one
            arrays = []
            for v in vals:
                try:
                    arrays.append(jax.device_put(v, platform.jax_device(device)))
                except OverflowError:  # as it is
                    arrays.append(v)
        for k, a in zip(keys, arrays):
            if type(a) not in _SCALAR_TYPES:
                fastpath.SCALARS.put(k, a)
            for conv, i in missing[k]:
                conv[i] = a
    return out


# TORCH_TPU_DONATE=0 turns buffer donation off (here and for compiled graphs).
_DONATE = switch_on("TORCH_TPU_DONATE")


def _donatable(ext: list, live_nodes: list) -> tuple:
    """The external inputs whose buffers the fused program may take over (donate).

    An array that only the trace still references: the old value of a storage
    the trace overwrote (a parameter, a gradient or an optimizer state updated
    in place), or of a tensor that died since it was read. Nothing can read it
    after the flush, so XLA may write the new values into its buffer instead
    of allocating fresh ones and copying (~4 bytes x 3 x parameters for an
    AdamW step). Another reference keeps it: a storage still holding it (a
    copy_ between storages may share one array object), a user's handle, the
    cached scalars. Views, `.detach()` and the autograd graph reach arrays
    only through storages, so they count too. References are Python's
    (getrefcount, as compiled graphs check, compile/graph_cache._can_donate): two
    jax.Array objects sharing one buffer would not be seen, which no storage
    does (each op, transfer and copy_ gives a fresh array or the same object).
    Only a buffer that one of the program's outputs (`live_nodes`) can take
    (same shape and dtype) is donated (JAX warns about the others).
    """
    if not _DONATE:
        return ()
    getref = sys.getrefcount
    jarray = platform.array_class()
    out = []
    outputs: dict | None = None  # (shape, dtype) -> outputs left to take a buffer
    for i in range(len(ext)):
        a = ext[i]
        if type(a) is jarray and getref(a) <= 3:  # ext's slot, `a` and the argument
            if outputs is None:  # only when some input is donatable at all
                outputs = {}
                for n in live_nodes:
                    outputs[n.spec] = outputs.get(n.spec, 0) + 1
            k = (a.shape, a.dtype)
            if outputs.get(k, 0) > 0:  # XLA can write an output of its size into it
                outputs[k] -= 1
                out.append(i)
    return tuple(out)


def _compile(key: tuple, fn: Any, args: tuple, donate: tuple, device: int) -> Any:
    """Compile the fused program (donating its first argument's buffers) and cache it."""
    kwargs: dict[str, Any] = {}
    if donate:
        kwargs["donate_argnums"] = (0,)
    if not args[0] and not args[1]:
        # No device inputs (factories only): place the outputs explicitly.
        kwargs["out_shardings"] = jax.sharding.SingleDeviceSharding(platform.jax_device(device))
    compiled = programs.compile("fused eager program", key, fn, args, **kwargs)
    programs.insert(key, compiled)
    return compiled


def _program(tr: _Trace, live: Sequence[int], device: int, donate: tuple = ()) -> Any:
    """The fused program: each recorded op's program, inlined in order.

    Its inputs: the donated external arrays, the other external arrays (each
    list in `ext`'s order), the ops' dynamic inputs and the barrier's zero."""
    steps = [(entry.program, refs, name, entry.fused_specs[2]) for entry, refs, name in tr.ops]
    live = list(live)
    n = len(tr.ext)
    gone = set(donate)
    # Where each external input is: (0, i) in the donated list, (1, i) in the kept one.
    where = [(0, donate.index(i)) if i in gone else (1, i - sum(1 for d in donate if d < i))
             for i in range(n)]

    def fused(donated, kept, dyns, zero):
        ext = [donated[j] if k == 0 else kept[j] for k, j in where]
        vals: list[Any] = []
        for (program, refs, name, barrier), dyn in zip(steps, dyns):
            arrays = [vals[r] if r >= 0 else ext[-1 - r] for r in refs]
            try:
                # The ATen op's name on its HLO (metadata op_name), for
                # debug.fusions(); tracing only: no call-time cost, no key.
                with jax.named_scope(name):
                    outs, bases = program(arrays, dyn)
            except Exception as e:  # noqa: BLE001 - named after the op, as strict mode raises it
                raise _named(e, name) from None
            for v, b in zip((*outs, *bases), barrier):
                vals.append(_rounded(v, zero) if b else v)
        return [vals[p] for p in live]

    return fused


# The fused program's last input: an integer 0, xor-ed into the bits of every
# floating value an op produces. XLA:CPU contracts a multiply and an add into
# one FMA inside a program, also across what were two ops (x * 1.5 then
# + y), which rounds differently from strict mode, where each op's result is
# rounded to its dtype before the next op reads it. Going through the
# integer bits with a runtime (unfoldable) xor leaves every bit as it is
# (NaN payloads and denormals included, which an arithmetic no-op such as
# `+ -0.0` would not: XLA:CPU flushes denormals) and stops the contraction,
# so every op boundary rounds as in strict mode and elementwise chains are
# bitwise equal. One integer op per element, fused into the op's loop.
_ZERO = np.int32(0)
_BITS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _rounded(v: Any, zero: Any) -> Any:
    it = _BITS[np.dtype(v.dtype).itemsize]
    bits = lax.bitcast_convert_type(v, it) ^ zero.astype(it)
    return lax.bitcast_convert_type(bits, v.dtype)


def _named(e: BaseException, name: str) -> BaseException:
    msg = str(e)
    note = " (recorded in fused eager mode; raised when the recorded ops ran)"
    text = msg if name in msg else f"{name}: {msg}"
    try:
        return type(e)(text + note)
    except Exception:  # noqa: BLE001
        return RuntimeError(text + note)


def _attribute(tr: _Trace, err: BaseException, args: tuple) -> BaseException:
    """The error of the fused program's run, attributed to the recorded op that
    causes it: the ops run again one by one (their own executables, the same
    inputs) until one fails. Not when the run took donated inputs' buffers
    (the replay has no inputs): then the message names the trace's ops."""
    names = ", ".join(dict.fromkeys(op[2] for op in tr.ops))
    device = tr.device
    generic = _named(oom.translate(err, "fused eager program", device),
                     f"fused eager program of {names}")
    if args[0]:
        return generic
    ext = args[1]
    vals: list[Any] = []
    for (entry, refs, name), dyn in zip(tr.ops, tr.dyns):
        arrays = [vals[r] if r >= 0 else ext[-1 - r] for r in refs]
        try:
            outs, bases = entry.compiled(arrays, dyn)
            oom.ready(list(outs) + list(bases), name, device)
        except Exception as e:  # noqa: BLE001
            return _named(oom.translate(e, name, device, entry.nbytes), name)
        vals.extend(outs)
        vals.extend(bases)
    return generic


def key_fields(key: tuple, entry_fields: Any = None) -> dict[str, str]:
    """A fused program's key (`flush`: its ops, how their inputs connect, the
    live values, the donated inputs, the optimization level) as named,
    printable fields, for the debug tools (compile events only).
    `entry_fields(entry)`: the fields of a recorded op's own program
    (key_decode.key_fields of its key), shown under the op's name."""
    _, plan, live, donate, level = key
    fields = {"ops": str(len(plan))}
    for j, (entry, refs, name) in enumerate(plan):
        fields[f"op {j}"] = name
        fields[f"op {j} inputs"] = str(refs)
        for field, value in (entry_fields(entry) if entry_fields is not None else {}).items():
            fields[f"op {j} {field}"] = value
    fields["live values"] = str(live)
    fields["donated inputs"] = str(donate)
    fields["opt level"] = str(level)
    return fields


def _from_env() -> None:
    v = switch_value(ENV).lower()
    if v in ("", "strict"):
        return
    if v != "fused":
        warnings.warn(f"{ENV}={v!r} is not a mode (strict or fused); using strict eager",
                      stacklevel=2)
        return
    set_default(True)


_from_env()
