"""The executor: every eager op runs as one cached, compiled XLA executable.

For an op call it builds a key from the op, each tensor's storage
(device, array shape and dtype), each tensor's view layout, the static
arguments, and the Python types of `Scalar` arguments (their values are
runtime inputs, so a learning-rate schedule does not recompile): the key's
encoding is runtime/keys.py's (runtime/key_decode.py reads it back for the
debug tools). On a miss it

1. runs the op on `meta` tensors: PyTorch's own shape and dtype rules and
   argument checks, so bad input raises exactly what PyTorch raises;
2. traces a program: read the inputs (views resolved with strided_read),
   apply the lowering, cast to PyTorch's output dtypes, write mutated
   arguments back into their storages (strided_write);
3. compiles it with `jax.jit(...).lower(...).compile()`, timing the compile.

On a hit it only calls the compiled executable, which dispatches
asynchronously: nothing blocks until a value is read on the host. PyTorch
CPU's memory-overlap checks on written tensors are runtime/overlap.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch

from .._compat.torch_api import pytree
from . import rng as tpu_random
from .precision import JAX_PRECISION_STATE
from .precision import cache_token as precision_token
from . import async_compile as _aco
from . import device_index, fastpath, loading
from . import calling, fused, gc_pause, oom, platform, programs, registry, scalars, verdict
from . import opt_level  # noqa: F401  (its import sets CONTEXT.opt_level from its env)
from . import storage as st
from .calling import functional_of  # also executor.functional_of, as ops/ use it
from .fastpath import NATIVE as _NATIVE
from .context import CONTEXT
from . import keys
from .keys import Plan, Signature, classify, fast_classify, helper_key
from .overlap import check_out_overlap, internal_overlap, partial_overlap, raise_overlap


# --------------------------------------------------------------------------
# the program cache (runtime.programs); these names are kept for the callers
# and tests that read them here


STATS = programs.STATS
COMPILE_LISTENERS = programs.COMPILE_LISTENERS
LOWERED_LISTENERS = programs.LOWERED_LISTENERS
CacheStats = programs.CacheStats
_CACHE = programs.CACHE  # (the native kernel gets programs.CACHE at setup_kernel)

# The precision token's source (runtime/precision.py, which imports no other
# runtime module) in the eager context, where the native kernel reads it.
CONTEXT.precision_state = JAX_PRECISION_STATE
CONTEXT.precision_token = precision_token

# TORCH_TPU_LAUNCH_BLOCKING=1 (CUDA_LAUNCH_BLOCKING's analogue; read into
# CONTEXT.launch_blocking): every op waits for its results before returning,
# so an asynchronous failure is raised by the op that caused it, and timers
# and profilers see each op's own time.


def clear_cache():
    """Drop the in-memory tier's programs (runtime.programs.clear)."""
    programs.clear()


# --------------------------------------------------------------------------
# reading values



def value(t: torch.Tensor) -> jax.Array:
    """The jax.Array holding tpu tensor `t`'s value in its logical shape."""
    data = st.data_of(t)
    layout = st.layout_of(t, data)
    if layout is None:
        return data.array
    return read(data, layout)


def read(data, layout):
    """The value of the view `layout` of the storage holding `data`."""
    arr = data.array
    # The offset is a runtime input: one program reads every row of a loop.
    layout, offset = st.dynamic_layout(layout)
    key = helper_key(programs.ProgramKind.VIEW_READ, arr.shape, arr.dtype, layout, data.index)
    fn = programs.get_or_compile(
        key, lambda a, o: st.strided_read(a, layout, o), (arr, offset))
    return fn(arr, offset)


def run_program(kind: programs.ProgramKind, name: str, fn: Callable, arrays: list,
                device: int, static: tuple = ()) -> Any:
    """Run `fn(*arrays, *static)` as one cached executable: for the ops
    kernels written in Python (no meta kernel, or results whose shapes depend
    on the data), which check arguments themselves and wrap the results.
    Keyed by `kind`, `name`, `static`, the arrays' shapes and dtypes, the
    device and the matmul precision; counted as a run of op `name`."""
    key = helper_key(kind, name, static, tuple((a.shape, a.dtype) for a in arrays), device,
                     precision_token())
    compiled = programs.get_or_compile(key, lambda *a: fn(*a, *static), tuple(arrays), name=name)
    STATS.per_op[name] += 1
    return compiled(*arrays)


# --------------------------------------------------------------------------
# running ops


class Entry:
    __slots__ = ("compiled", "out_tree", "out_meta", "writes", "eager_fn", "nbytes", "check",
                 "program", "fused_specs", "fast", "narrow", "aliases", "orders")
    # Set only for eager (data-dependent) lowerings, which run without jit.
    eager_fn: Callable[..., Any]

    def __init__(self, compiled, out_tree, out_meta, writes):
        self.compiled = compiled
        self.out_tree = out_tree
        self.out_meta = out_meta
        self.writes = writes
        # Bytes one call allocates (results and rewritten storages), and
        # whether they are large enough to check against free memory on
        # every call (torch_tpu.runtime.oom).
        self.nbytes = 0
        self.check = False
        # The un-jitted program, which fused eager mode inlines into a
        # bigger trace (runtime.fused), and its output specs there.
        self.program = None
        self.fused_specs = None
        # What the native kernel needs to run a hit of this entry (_fast_spec,
        # made on its first hit there), False where it never does.
        self.fast = None
        # Whether its Python float/complex scalars enter the program in 32
        # bits (runtime.scalars): set by Runner._build.
        self.narrow = False
        # (written, input) argument positions sharing a storage as views,
        # whose overlap each call checks (Runner._check_aliases); None: none.
        self.aliases: tuple | None = None
        # Per tensor result, the dim order of the memory format PyTorch's
        # meta kernel gives it where that is not row-major (_result_orders);
        # None where every result is row-major.
        self.orders: tuple | None = None



def call_python(compiled, arrays, dyn, device):
    return compiled(arrays, dyn)


# An entry's executable called through JAX's C++ path with cached device
# scalars (runtime/fastpath.py), and results made in one C++ step; else Python.
call_executable = _NATIVE.call if _NATIVE is not None else call_python
wrap_array = _NATIVE.wrap if _NATIVE is not None else st.wrap


def _fast_spec(entry):
    """What the native kernel (csrc/, see csrc/README.md) needs to run a cache hit of
    `entry` itself: (executable, ((dtype, shape) of each result, ...)); None
    while its executable is still compiling; False for an entry whose hits
    take Runner.__call__'s other branches (an eager lowering, a memory check
    per call, storages it writes, results that are not all tensors)."""
    compiled = entry.compiled
    if compiled is None or entry.check or entry.writes or entry.orders is not None:
        return False
    if type(compiled) is not jax.stages.Compiled and type(compiled) is not fused.LazyExecutable:
        # (an entry built while ops were recorded: the kernel records its
        # fused-mode hits, and its strict ones go to Python, which compiles)
        return None if type(compiled) is _aco.PendingExecutable else False
    metas = entry.out_meta
    if not metas or not all(isinstance(m, torch.Tensor) for m in metas):
        return False
    return compiled, tuple((m.dtype, tuple(m.shape)) for m in metas), entry.narrow


_KERNEL_READY: list = []


def install_kernel(lib: Any, op: Any, runner: Any, kernel: Any = None) -> None:
    """Register `kernel` (default: `runner`) as `op`'s PrivateUse1 kernel:
    behind the native C++ kernel (runtime/fastpath.py KERNEL), which runs the
    op's cache hits itself and hands every other call to `kernel`, registered
    for the PrivateUse2 key for that; `kernel` alone where the native kernel
    does not handle the op (in-place, out=, random, list or non-tensor
    results). A `kernel` other than the runner must do exactly the runner's
    call on a cache hit."""
    if kernel is None:
        kernel = runner.__call__
    low = runner.lowering
    native = _NATIVE
    if (native is not None and fastpath.KERNEL and runner.functional is None and not low.mutates and not runner.rng
            and not low.eager and not runner.returns_nothing):
        if not _KERNEL_READY:
            native.setup_kernel(CONTEXT, programs.CACHE, fused.record_native, scalars.narrow,
                                _fast_spec, platform.array_class())
            # Its hits are counted in C++ and read back with the statistics.
            STATS.native_counts = getattr(native, "take_stats", None)
            # The kernel's memo of recent hits holds entries: emptied whenever
            # the cache drops or replaces one.
            programs.ON_DROP.append(native.forget)
            native.set_memo(fastpath.MEMO)
            _KERNEL_READY.append(True)
        lib.impl(op, kernel, "PrivateUse2")
        schema = op._schema
        if native.register_kernel(schema.name, schema.overload_name, runner.plan.op,
                                  runner.plan.name, runner.plan.kinds, fastpath.UNBOXED):
            return
    lib.impl(op, kernel, "PrivateUse1")


def _rebuild(recipe, arrays, dyn):
    tag = recipe[0]
    if tag == "t":
        base = arrays[recipe[1]]
        return base if recipe[2] is None else st.strided_read(base, recipe[2], dyn[recipe[3]])
    if tag == "s" or tag == "c":
        return dyn[recipe[1]]
    if tag == "b":
        v = st.strided_read(arrays[recipe[1]], recipe[2], dyn[recipe[4]])
        conj, neg = recipe[3]
        if conj:
            v = jnp.conj(v)
        return -v if neg else v
    if tag == "l":
        return [None if r is None else _rebuild(r, arrays, dyn) for r in recipe[1]]
    return recipe[1]


def _meta_value(x, device_index):
    if isinstance(x, torch.Tensor):
        if x.device.type == "cpu":
            return x
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype,
                                   device="meta")
    if isinstance(x, torch.device) and x.type != "cpu":
        return torch.device("meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_value(y, device_index) for y in x)
    return x


def run_meta(op, args, kwargs):
    """Run `op` on meta copies of its arguments: PyTorch's checks and shapes."""
    margs = [_meta_value(a, None) for a in args]
    mkwargs = {k: _meta_value(v, None) for k, v in kwargs.items()}
    if "device" in mkwargs and mkwargs["device"] is None and not any(
            isinstance(a, torch.Tensor) for a in pytree.tree_leaves((args, kwargs))):
        mkwargs["device"] = torch.device("meta")
    try:
        return op(*margs, **mkwargs), margs, mkwargs
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        # PyTorch's own check failed. Meta kernels that are Python references
        # word (and type) some errors differently from CPU: raise CPU's.
        raise _cpu_error_or(e, op, args, kwargs) from None
    except AssertionError as e:
        # Some Python meta kernels and decompositions check with `assert`
        # (embedding's 2-D weight, nll_loss's 1-D target) where the CPU
        # kernel's TORCH_CHECK raises RuntimeError: raise what the CPU raises.
        raise RuntimeError(f"{op}: {e}") from None


def _cpu_error_or(e, op, args, kwargs):
    """The exception CPU raises for this call (runtime.verdict), else `e`;
    either with the op named. With an expanded tensor argument, CPU's
    memory-overlap error first (the meta kernel, which does not check
    overlap, may fail restriding it)."""
    if any(internal_overlap(t) for t in pytree.tree_leaves((args, kwargs))
           if isinstance(t, torch.Tensor)):
        err = verdict.overlap_error(op, args, kwargs)
        if isinstance(err, BaseException):
            return verdict.as_op_error(err, op)
    cpu = verdict.cpu_error(op, args, kwargs)
    if isinstance(cpu, BaseException):
        return verdict.as_op_error(cpu, op)
    return _with_op_name(e, op)


def _with_op_name(e, op):
    msg = str(e)
    name = str(op)
    if name in msg:
        return e
    try:
        return type(e)(f"{name}: {msg}")
    except Exception:
        return e


class Runner:
    """Runs one ATen overload through its lowering and the executable cache."""

    def __init__(self, op, lowering, functional=None):
        self.op = op
        self.plan = Plan(op)
        if lowering.static or lowering.traced:  # registry.Lowering.static / .traced:
            # Scalars baked into the program, ints made runtime inputs
            self.plan.kinds = tuple(
                keys.STATIC if a.name in lowering.static
                else keys.SCALAR if a.name in lowering.traced else k
                for a, k in zip(self.plan.args, self.plan.kinds))
        self.lowering = lowering
        # For in-place/out= overloads: the functional overload whose lowering
        # computes the values, and which arguments receive them.
        self.functional = functional
        fplan = Plan(functional) if functional is not None else self.plan
        self.fplan = fplan
        if functional is None:
            self.targets = tuple(self.plan.arg_index[n] for n in lowering.mutates)
        elif self.plan.out_names:
            self.targets = tuple(self.plan.arg_index[n] for n in self.plan.out_names)
        else:
            self.targets = tuple(i for i, w in enumerate(self.plan.writes) if w)
        self.rng = lowering.random
        self.returns_nothing = len(op._schema.returns) == 0

    def __call__(self, *args, **kwargs):
        plan = self.plan
        vals = plan.bind(args, kwargs)
        sig = Signature(plan)
        if fast_classify is None:
            recipes = classify(plan, vals, sig)
        elif fast_classify(sig, plan.kinds, vals):
            recipes = None  # only a miss needs them (below)
        else:
            sig = Signature(plan)  # the native part handed the call back
            recipes = classify(plan, vals, sig)
        if self.rng:
            sig.dyn.append(tpu_random.next_key(
                sig.device if sig.device is not None else _factory_device(vals, plan)))
            sig.key.append(programs.KeyTag.RNG)
        if sig.device is None:
            sig.device = _factory_device(vals, plan)
        key = sig.finish()  # (the context parts, last: programs.EAGER_CONTEXT)
        STATS.count_request()
        entry = _CACHE.get(key)
        hit = entry is not None
        if entry is None:
            if recipes is None:  # the same slots and dyn indices as `sig`'s
                recipes = classify(plan, vals, Signature(plan))
            with gc_pause.paused():  # meta kernels and tracing: short-lived cycles
                entry = self._build(key, vals, args, kwargs, sig, recipes)
            if entry is None:  # out= tensors were resized: the signature changed
                return self(*args, **kwargs)
        else:
            _CACHE.move_to_end(key)
            if entry.check:
                oom.check(plan.name, entry.nbytes, sig.device)
            if entry.narrow:
                scalars.narrow(sig.dyn, sig.device)
        if entry.aliases is not None:
            self._check_aliases(entry, vals, args, kwargs)
        STATS.count_run(plan.name, hit)
        if CONTEXT.fused and entry.program is not None:  # recorded, run later (runtime.fused)
            outs, new_bases = fused.record(entry, sig, plan.name)
        elif _aco.OUTSTANDING and _aco.deferred(entry, sig):  # runtime.async_compile
            outs, new_bases = _aco.launch(entry, sig, plan.name)
        else:
            arrays = [d.array for d in sig.slot_data]
            try:
                if entry.compiled is None:  # eager (data-dependent) lowering
                    outs, new_bases = entry.eager_fn(arrays, sig.dyn)
                else:
                    outs, new_bases = call_executable(entry.compiled, arrays, sig.dyn, sig.device)
                if CONTEXT.launch_blocking:
                    oom.ready(outs, plan.name, sig.device)
                    oom.ready(new_bases, plan.name, sig.device)
            except jax.errors.JaxRuntimeError as e:
                raise oom.translate(e, plan.name, sig.device, entry.nbytes) from None
        for slot, arr in zip(entry.writes, new_bases):
            data = sig.slot_data[slot]
            data.write(arr, plan.name)
            if data.origin in st.ALLOCATING_OPS:
                # A storage made by empty() and filled in place (randn is
                # empty + normal_): the op that filled it produced it.
                data.origin = plan.name
        return self._wrap(entry, outs, vals, sig.device)

    # -- building ---------------------------------------------------------

    def _build(self, key, vals, args, kwargs, sig, recipes):
        op = self.op
        if self.functional is not None:
            self._check_result_cast(vals, args, kwargs)
        meta_out, margs, mkwargs = run_meta(op, args, kwargs)
        plan, fplan = self.plan, self.fplan
        if plan.out_names:
            # The key holds every tensor's storage slot and layout, so a call
            # that passes here passes on every cache hit of this entry.
            check_out_overlap(op, args, kwargs)
        if plan.out_names and self._resize_outs(vals, margs, mkwargs):
            return None
        if self.functional is not None:
            # The functional overload's output metadata (the values to write).
            meta_named = {a.name: _meta_value(v, None) for a, v in zip(plan.args, vals)}
            fa, fk = calling.split(fplan.args, meta_named)
            fmeta = self.functional(*fa, **fk)
        else:
            fmeta = meta_out
        meta_leaves, out_tree = pytree.tree_flatten(meta_out)
        n_tensor_out = sum(isinstance(m, torch.Tensor) for m in meta_leaves)
        fmeta_tensors = [m for m in pytree.tree_leaves(fmeta) if isinstance(m, torch.Tensor)]
        lowering, rng, name = self.lowering, self.rng, plan.name
        is_derived = self.functional is not None
        orders = None if is_derived else _result_orders(
            [m for m in meta_leaves if isinstance(m, torch.Tensor)])
        # Each written tensor: (argument index, list position or None), its
        # recipe, and its meta after the op (an out= tensor may be resized).
        targets: list[tuple[int, int | None, Any, Any]] = []
        for i in self.targets:
            v = vals[i]
            m = margs[i] if i < len(margs) else mkwargs[plan.args[i].name]
            if isinstance(v, (list, tuple)):
                targets.extend((i, j, recipes[i][1][j], m[j]) for j in range(len(v)))
            else:
                targets.append((i, None, recipes[i], m))
        for t in targets:
            if t[2][0] == "b":
                raise RuntimeError(f"{name}: cannot write into a lazy conjugate/negative "
                                   "view; call resolve_conj()/resolve_neg() first")
            if t[2][0] != "t":
                raise RuntimeError(f"{name}: cannot write to a CPU tensor argument")
        if is_derived and not plan.out_names:
            _check_inplace_cast(name, targets, fmeta)
        # The key holds each written tensor's strides: an expanded one is seen here.
        if any(internal_overlap(_arg_at(vals, (i, j))) for i, j, _, _ in targets):
            raise_overlap(op, args, kwargs, verdict.INTERNAL_OVERLAP_TEXT)
        aliases = _alias_pairs(recipes, targets)
        out_slots = tuple(dict.fromkeys(t[2][1] for t in targets))
        # What one call allocates, known before anything runs: its results
        # and the new arrays of the storages it writes.
        nbytes = sum(m.numel() * m.element_size() for m in meta_leaves
                     if isinstance(m, torch.Tensor))
        nbytes += sum(sig.slot_data[s].nbytes for s in out_slots)
        large = nbytes >= oom.check_threshold(sig.device)
        if large:
            oom.check(name, nbytes, sig.device)

        # the arguments' strides, for lowerings that choose a form by layout
        # (registry.arg_meta; the key holds every tensor's layout)
        meta_in = {a.name: m for a, m in zip(plan.args, margs) if isinstance(m, torch.Tensor)}
        meta_in.update((k, m) for k, m in mkwargs.items() if isinstance(m, torch.Tensor))

        def program(arrays, dyn):
            args_v = [_rebuild(r, arrays, dyn) for r in recipes]
            fargs, fkw = calling.split(fplan.args, {a.name: v for a, v in zip(plan.args, args_v)})
            if rng:
                fkw["rng_key"] = dyn[-1]
            registry.CONTEXT.meta_out = fmeta
            registry.CONTEXT.meta_in = meta_in
            try:
                result = lowering.fn(*fargs, **fkw)
            finally:
                registry.CONTEXT.meta_out = registry.CONTEXT.meta_in = None
            if is_derived:
                # Computed in the op's result dtype (PyTorch's rounding), then
                # cast to the written tensor's dtype by _write, as on CPU.
                values, outs = jax.tree_util.tree_leaves(result), []
                if len(values) == len(fmeta_tensors):
                    values = [st.convert(jnp.asarray(v), m.dtype)
                              for v, m in zip(values, fmeta_tensors)]
            else:
                updates = {}
                if lowering.mutates:
                    result, updates = result
                values = [updates[plan.args[i].name] if j is None
                          else updates[plan.args[i].name][j] for i, j, _, _ in targets]
                leaves = jax.tree_util.tree_leaves(result)
                if len(leaves) != n_tensor_out:
                    raise RuntimeError(
                        f"internal error in the lowering of {name}: it returned "
                        f"{len(leaves)} arrays, PyTorch's op returns {n_tensor_out}")
                outs = [calling.conform(x, m.shape, m.dtype, name) for x, m in
                        zip(leaves, [m for m in meta_leaves if isinstance(m, torch.Tensor)])]
                if orders is not None:  # stored in that order, flat (as empty_strided's)
                    outs = [x if o is None else jnp.transpose(x, o).reshape(-1)
                            for x, o in zip(outs, orders)]
            bases = list(arrays)
            for (_, _, r, m), val in zip(targets, values):
                offset = None if r[2] is None else dyn[r[3]]
                bases[r[1]] = _write(bases[r[1]], r[2], val, m, name, offset)
            return outs, [bases[s] for s in out_slots]

        program.__name__ = name.replace(".", "_")
        narrow = scalars.are_narrow(vals, meta_leaves) and scalars.narrow(sig.dyn, sig.device)
        # Compiling needs only shapes: a value fused mode has not computed yet
        # stays pending (runtime.fused.abstract).
        arrays = [fused.abstract(d) for d in sig.slot_data]  # (and async compilation's)
        if lowering.eager:
            entry = Entry(None, out_tree, meta_leaves, out_slots)
            entry.eager_fn = program
        else:
            # The outputs' device, always explicit: a factory has no device
            # inputs, and JAX drops inputs a program does not read (zero_,
            # fill_, ones_like's fill) together with the device they name, so
            # such a program would otherwise run on the default device.
            jax_device = platform.jax_device(sig.device)
            jit_kwargs: dict[str, Any] = {"out_shardings": jax.sharding.SingleDeviceSharding(
                jax_device)}
            # A warm process finds the executable by this key, without
            # tracing or lowering (torch_tpu.cache.eager); the debug tools
            # lower it when asked for its stages. Not for fused mode's recordings.
            index = None if CONTEXT.fused else programs.index_tier()
            index_key = index.key(key, jax_device) if index is not None else None
            compiled = None if index_key is None else programs.load_indexed(
                name, key, index_key, (arrays, list(sig.dyn)), jax_device,
                relower=_relowerer(program, jit_kwargs, (arrays, list(sig.dyn))))
            if compiled is not None:  # results committed: out_shardings names their device
                compiled._torch_tpu_specs = _aco.specs_of(compiled.out_info, True)
            try:
                # XLA compiles in the background (runtime.async_compile); in
                # fused mode at the first call only (fused.LazyExecutable).
                if compiled is None and CONTEXT.fused:
                    compiled = fused.compile_later(name, key, program, (arrays, list(sig.dyn)),
                                                   **jit_kwargs)
                elif compiled is None:
                    compiled = (_aco.compile if _aco.ENABLED and not CONTEXT.launch_blocking
                                else programs.compile)(name, key, program, (arrays, list(sig.dyn)),
                                               index_key=index_key, **jit_kwargs)
            except (TypeError, ValueError):
                # JAX rejected the lowering's input (a dtype or shape PyTorch's
                # meta kernel let through): CPU's error if CPU has one.
                cpu = verdict.cpu_error(op, args, kwargs)
                if isinstance(cpu, BaseException):
                    raise verdict.as_op_error(cpu, op) from None
                raise
            entry = Entry(compiled, out_tree, meta_leaves, out_slots)
            _aco.attach(entry)
            entry.program = program
        entry.nbytes = nbytes
        entry.check = large
        entry.narrow = narrow
        entry.aliases = aliases
        entry.orders = orders
        programs.insert(key, entry)
        return entry

    def _check_aliases(self, entry, vals, args, kwargs):
        """CPU's check that a written tensor and an input sharing its storage
        do not partly overlap (`torch.add(a[:4], 1, out=a[2:])`). Views'
        offsets are runtime inputs, not in the key: checked at every call of
        an entry whose written and read tensors share a storage."""
        for w, u in entry.aliases:
            if partial_overlap(_arg_at(vals, w), _arg_at(vals, u)):
                raise_overlap(self.op, args, kwargs, verdict.PARTIAL_OVERLAP_TEXT)
                entry.aliases = None  # CPU does not check this op's overlap
                return

    def _check_result_cast(self, vals, args, kwargs):
        """An in-place or out= call whose written tensor has another dtype than
        the op's result: CPU decides (TensorIterator's casting rules, and the
        ops that require equal dtypes), with CPU's message. Host metadata, plus
        a host copy of small arguments once per executable (runtime.verdict)."""
        plan = self.plan
        meta_named = {a.name: _meta_value(v, None) for a, v in zip(plan.args, vals)}
        fa, fk = calling.split(self.fplan.args, meta_named)
        try:
            fmeta = self.functional(*fa, **fk)
        except Exception:  # noqa: BLE001 - run_meta raises PyTorch's error
            return
        results = [m for m in pytree.tree_leaves(fmeta) if isinstance(m, torch.Tensor)]
        written: list[Any] = []
        for i in self.targets:
            v = vals[i]
            written.extend(v if isinstance(v, (list, tuple)) else [v])
        if all(not isinstance(w, torch.Tensor) or w.dtype == r.dtype
               for w, r in zip(written, results)):
            return
        cpu = verdict.cpu_error(self.op, args, kwargs)
        if isinstance(cpu, BaseException):
            raise verdict.as_op_error(cpu, self.op) from None
        if cpu is verdict.NO_VERDICT and plan.out_names:
            for w, r in zip(written, results):
                if isinstance(w, torch.Tensor) and not torch.can_cast(r.dtype, w.dtype):
                    raise RuntimeError(
                        f"{plan.name}: result type {dtype_name(r.dtype)} can't be cast to "
                        f"the desired output type {dtype_name(w.dtype)}")

    def _resize_outs(self, vals, margs, mkwargs):
        """Resize out= tensors whose shape the op changes (PyTorch warned already)."""
        resized = False
        for i in self.targets:
            m = margs[i] if i < len(margs) else mkwargs[self.plan.args[i].name]
            pairs = zip(vals[i], m) if isinstance(vals[i], (list, tuple)) else [(vals[i], m)]
            for t, mt in pairs:
                if tuple(t.shape) != tuple(mt.shape):
                    t.resize_(tuple(mt.shape))
                    resized = True
        return resized

    # -- results ----------------------------------------------------------

    def _wrap(self, entry, outs, vals, device):
        if self.returns_nothing:  # e.g. _foreach_add_ returns ()
            return None
        if self.functional is not None:
            # The op returns its written arguments (self, or the out tensors).
            res = [vals[i] for i in self.targets]
            if self.plan.out_names and len(res) > 1:
                return tuple(res)
            return res[0] if len(res) == 1 else tuple(res)
        if self.lowering.mutates and not entry.out_meta:
            return None
        if entry.orders is not None:
            return self._wrap_strided(entry, outs, device)
        if len(entry.out_meta) == 1 and entry.out_tree.is_leaf():
            return wrap_array(outs[0], device, entry.out_meta[0].dtype, self.plan.name)
        it = iter(outs)
        leaves = []
        for m in entry.out_meta:
            if isinstance(m, torch.Tensor):
                leaves.append(wrap_array(next(it), device, m.dtype, self.plan.name))
            else:
                leaves.append(m)
        return pytree.tree_unflatten(leaves, entry.out_tree)


    def _wrap_strided(self, entry, outs, device):
        """Results with the strides of PyTorch's meta kernel (entry.orders):
        their arrays are the values in that memory order, flat."""
        it = iter(zip(outs, entry.orders))
        leaves = []
        for m in entry.out_meta:
            if not isinstance(m, torch.Tensor):
                leaves.append(m)
                continue
            arr, order = next(it)
            if order is None:
                leaves.append(wrap_array(arr, device, m.dtype, self.plan.name))
                continue
            t = st.empty_tensor(tuple(m.shape), m.dtype, device,
                                nbytes=m.numel() * m.element_size(), stride=tuple(m.stride()))
            st.attach(t, arr, self.plan.name)
            leaves.append(t)
        return pytree.tree_unflatten(leaves, entry.out_tree)


def _arg_at(vals, pos):
    """The argument at (index, list position or None)."""
    v = vals[pos[0]]
    return v if pos[1] is None else v[pos[1]]


def _alias_pairs(recipes, targets):
    """(written, input) argument positions in one storage, other than both the
    whole storage: the calls whose overlap CPU checks depend on the views'
    offsets, which are runtime inputs. None where there are none (nearly
    every op: the check costs those nothing)."""
    inputs: list[tuple[tuple[int, int | None], Any]] = []
    for i, r in enumerate(recipes):
        if r[0] == "l":
            inputs.extend(((i, j), x) for j, x in enumerate(r[1])
                          if x is not None and x[0] in ("t", "b"))
        elif r[0] in ("t", "b"):
            inputs.append(((i, None), r))
    pairs = []
    for i, j, r, _ in targets:
        for pos, u in inputs:
            if pos == (i, j) or u[1] != r[1]:
                continue
            if r[2] is None and u[0] == "t" and u[2] is None:
                continue  # the same whole array: CPU's Full overlap, allowed
            pairs.append(((i, j), pos))
    return tuple(pairs) or None


def dense_order(shape, stride):
    """Dims from outermost to innermost if `stride` is dense (no gaps, no
    overlap) for `shape`; None otherwise. Size-1 dims may sit anywhere."""
    order = tuple(sorted(range(len(shape)), key=lambda d: -stride[d]))
    expected = 1
    for d in reversed(order):
        if shape[d] == 1:
            continue
        if stride[d] != expected:
            return None
        expected *= shape[d]
    return order


def _result_orders(metas):
    """Per result, its dim order where PyTorch's meta kernel lays it out other
    than row-major but dense (channels_last in, channels_last out; a
    transposed input's elementwise result transposed, as CPU's TensorIterator
    does), else None; None when every result is row-major."""
    orders = []
    for m in metas:
        order = None
        if m.numel() > 1 and not m.is_contiguous():
            order = dense_order(tuple(m.shape), tuple(m.stride()))
            if order == tuple(range(m.dim())):
                order = None
        orders.append(order)
    return tuple(orders) if any(o is not None for o in orders) else None


def _relowerer(program, jit_kwargs, args):
    """A thunk lowering `program` for `args` again (debug tools, on demand), holding
    their shapes only: an argument's device memory is not kept alive by it."""
    def shape_of(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding,
                                        weak_type=x.aval.weak_type)
        return x

    shapes = jax.tree_util.tree_map(shape_of, args)
    return lambda: jax.jit(program, **jit_kwargs).lower(*shapes)


def _check_inplace_cast(name, targets, fmeta):
    """An in-place op whose result type cannot be cast back to self's dtype
    (int.mul_(1.5), int.sqrt_()): PyTorch's CPU kernels (TensorIterator)
    refuse it; several meta kernels do not check. Host metadata only."""
    results = [m for m in pytree.tree_leaves(fmeta) if isinstance(m, torch.Tensor)]
    for (_, _, _, m), r in zip(targets, results):
        if m is not None and not torch.can_cast(r.dtype, m.dtype):
            raise RuntimeError(f"{name}: result type {dtype_name(r.dtype)} can't be cast to "
                               f"the desired output type {dtype_name(m.dtype)}")


def dtype_name(dtype):
    """PyTorch's C++ name of a dtype (torch.float32 -> Float), as CPU messages print it."""
    try:
        return torch.empty((), dtype=dtype, device="meta").type().split(".")[-1][:-len("Tensor")]
    except Exception:  # noqa: BLE001
        return str(dtype)


def _write(base, layout, val, meta, name, offset=None):
    val = calling.conform(val, meta.shape, meta.dtype, name) if meta is not None else val
    if layout is None:
        return val.reshape(base.shape).astype(base.dtype)
    return st.strided_write(base, layout, val, offset)


def _factory_device(vals, plan):
    """The device of an op without device inputs: its `device` argument
    ("tpu" alone: the current device); without one, the device of its tensor
    argument (`ones_like(x)`, `x.new_zeros(...)` follow x, as on CPU and CUDA);
    else the current device."""
    i = plan.arg_index.get("device")
    if i is not None and vals[i] is not None:
        d = vals[i]
        if isinstance(d, str):
            d = torch.device(d)
        if d.index is not None:
            platform.jax_device(d.index)  # raises for a device that does not exist
            return d.index
        return _current()
    for v in vals:
        if isinstance(v, torch.Tensor):
            data = getattr(v.untyped_storage(), "_tpu", None)
            if data is not None:
                return data.index
    return _current()


def _current():
    return device_index.current()


# --------------------------------------------------------------------------


_RUNNERS: dict = {}
_OPS_MODULE = __name__.rsplit(".", 2)[0] + ".ops"


def runner_for(op):
    """The cached runner of `op`, or None when there is no lowering for it."""
    r = _RUNNERS.get(op)
    if r is None and op not in _RUNNERS:
        r = _make_runner(op)
        _RUNNERS[op] = r
    return r


def _make_runner(op):
    if _OPS_MODULE not in sys.modules:
        # The op families (a layer above) fill the table when imported; a
        # runner asked for before they load (a direct import of this module)
        # must still find its lowering: load the backend (the package's load
        # step, installed in runtime.loading; the runtime never imports the
        # op layer). Once per op (runners are cached).
        loading.load()
    low = registry.LOWERINGS.get(op)
    if low is not None:
        return Runner(op, low)
    functional = functional_of(op)
    if functional is not None and functional in registry.LOWERINGS:
        return Runner(op, registry.LOWERINGS[functional], functional)
    return None
