"""`ProcessGroupTPU`: the c10d process group of backend "tpu".

A Python `torch.distributed.ProcessGroup` (the PyProcessGroup trampoline):
c10d's Python API calls its methods directly, and C++ callers (DDP's
reducer, `_broadcast_coalesced`, the functional collectives on CPU tensors)
reach the ones the trampoline forwards (allreduce, broadcast, allgather, ...).

Each collective reads its inputs' device values at the call, then runs on
one worker thread per process (so every process issues its collectives in
program order, across all groups), as one XLA program from `programs`. The
call returns a `Work` at once; `wait()` (what c10d's synchronous calls do)
blocks until the results are written into the output tensors. Its future
(`get_future()`, which DDP's comm hooks chain on) completes at the same time.

Errors and timeouts: a collective that fails in XLA (a peer process died:
its connection closed) fails its Work with a RuntimeError. A watchdog fails
a collective still running after the group's timeout (the `timeout` of
`init_process_group`, like c10d's): another process never joined it. After
either, the runtime is unusable, and every later collective raises at once.
A metadata mismatch (shapes, dtypes, operation) fails the Work on every
process and leaves the group usable.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from datetime import timedelta

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import programs as pg_programs
from . import runtime
from ..runtime import platform
from ..runtime import executor
from ..runtime.switches import switch_set
from ..runtime import storage as st
from ..ops import collectives, core

# --------------------------------------------------------------------------
# device values of tensors


def local_device():
    """This process's jax device (each process uses its tpu:0); distributed.spmd
    places its values there too."""
    return platform.jax_device(0)


def value_of(t: torch.Tensor):
    """The jax value of `t` on this process's device (CPU tensors are copied)."""
    if t.device.type == "tpu":
        if t.device.index not in (None, 0):
            raise RuntimeError(
                f"the tpu process group uses each process's tpu:0; got a tensor on {t.device}")

        return executor.value(t)
    if t.device.type == "cpu":
        return st.from_host(t, 0)
    raise RuntimeError(f"the tpu process group cannot use tensors on {t.device}")


def write(t: torch.Tensor, arr) -> None:
    """Store jax value `arr` (t's shape) into tensor `t`."""
    if t.device.type == "tpu":
        data = st.data_of(t)
        if (t.dtype is data.dtype and t.shape == data.shape and t.is_contiguous()
                and t.storage_offset() == 0 and tuple(arr.shape) == data.shape
                and np.dtype(arr.dtype) == np.dtype(st.TORCH_TO_JAX[t.dtype])):
            data.array = arr
        else:
            core.assign(t, arr.reshape(tuple(t.shape)))
        return

    host = st.host_tensor(np.asarray(arr), t.dtype).reshape(t.shape)
    with torch.no_grad():
        t.copy_(host)


_reshape_cache: dict = {}


def _as_block(x):
    """x with at least one dimension (0-d values become shape (1,))."""
    if x.ndim >= 1:
        return x
    return x.reshape((1,))


def reduce_name(op) -> tuple:
    """(name, premul scale) of a c10d ReduceOp / RedOpType / string."""
    scale = None
    if isinstance(op, str):
        name = op.lower()
    else:
        t = op.op if isinstance(op, ReduceOp) else op
        name = t.name.lower()
        if name == "premul_sum":
            raise NotImplementedError(
                "ReduceOp.PREMUL_SUM is not supported by the tpu process group")
    if name not in pg_programs.REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}")
    return name, scale


# --------------------------------------------------------------------------
# Work


class CollectiveError(RuntimeError):
    """A collective failed, timed out or was called inconsistently across ranks."""


class Work(dist.Work):
    """The handle of one collective: wait(), is_completed(), get_future()."""

    def __init__(self, pg, name, run, outputs, result):
        super().__init__()
        self.pg = pg
        self.name = name
        self._run = run          # () -> list of (tensor, array) to write
        self._outputs = outputs
        self._result = result    # what result() / the future return
        self._done = threading.Event()
        self._exc = None
        self._future = torch.futures.Future()
        self.started = None
        self.desc = name

    # -- executed on the worker thread --

    def _execute(self):
        writes = self._run()
        for t, arr in writes:
            write(t, arr)

    def _finish(self, exc=None):
        if self._done.is_set():
            return
        self._exc = exc
        self._done.set()
        try:
            if exc is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(exc)
        except RuntimeError:  # pragma: no cover - already completed
            pass

    # -- c10d Work API --

    def wait(self, timeout=timedelta(0)):
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        if secs > 0:
            if not self._done.wait(secs):
                raise CollectiveError(
                    f"[torch_tpu] {self.desc} did not complete within the wait() timeout "
                    f"of {secs:.1f} s")
        else:
            # The watchdog fails the work when the group's timeout passes.
            while not self._done.wait(0.5):
                WORKER.check_timeouts()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def get_future(self):
        return self._future

    def result(self):
        return self._result

    def synchronize(self):
        pass

    def source_rank(self):
        return -1


class _Done(dist.Work):
    """A completed Work (for operations with nothing to do)."""

    def __init__(self, result=None):
        super().__init__()
        self._result = result if result is not None else []
        self._future = torch.futures.Future()
        self._future.set_result(self._result)

    def wait(self, timeout=timedelta(0)):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._future

    def result(self):
        return self._result

    def synchronize(self):
        pass


# --------------------------------------------------------------------------
# the worker thread and the watchdog


class _Worker:
    """One thread running every collective of this process, in call order."""

    def __init__(self):
        self.queue = collections.deque()
        self.cv = threading.Condition()
        self.thread = None
        self.current = None
        self.watchdog = None

    def submit(self, work: Work):
        rt = runtime.state()
        if rt.broken is not None:
            raise CollectiveError(
                f"[torch_tpu] the tpu process group is unusable after an earlier failure: "
                f"{rt.broken}")
        with self.cv:
            self._ensure_threads()
            self.queue.append(work)
            self.cv.notify_all()

    def _ensure_threads(self):
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="torch_tpu-collectives",
                                           daemon=True)
            self.thread.start()
        if self.watchdog is None or not self.watchdog.is_alive():
            self.watchdog = threading.Thread(target=self._watch, name="torch_tpu-watchdog",
                                             daemon=True)
            self.watchdog.start()

    def _loop(self):
        while True:
            with self.cv:
                while not self.queue:
                    self.cv.wait()
                work = self.queue.popleft()
                broken = runtime.broken_by()
                if broken is not None:
                    work._finish(CollectiveError(
                        f"[torch_tpu] {work.desc} was not run: the tpu process group is "
                        f"unusable after an earlier failure: {broken}"))
                    continue
                work.started = time.monotonic()
                self.current = work
                self.cv.notify_all()
            try:
                work._execute()
                exc = None
            except CollectiveError as e:
                exc = e
            except Exception as e:  # noqa: BLE001 - reported through the Work
                exc = _runtime_failure(work, e)
            finally:
                with self.cv:
                    self.current = None
            if exc is not None and getattr(exc, "fatal", False):
                runtime.mark_broken(exc)
                self._fail_queued(exc)
            work._finish(exc)

    def _fail_queued(self, exc):
        with self.cv:
            pending = list(self.queue)
            self.queue.clear()
        for w in pending:
            w._finish(CollectiveError(
                f"[torch_tpu] {w.desc} was not run: an earlier collective failed: {exc}"))

    def _watch(self):
        while True:
            time.sleep(0.2)
            self.check_timeouts()

    def check_timeouts(self):
        work = self.current
        if work is None or work.started is None or work.is_completed():
            return
        limit = work.pg.timeout_seconds
        elapsed = time.monotonic() - work.started
        if elapsed <= limit:
            return
        exc = CollectiveError(
            f"[torch_tpu] {work.desc} timed out after {elapsed:.1f} s (the process group's "
            f"timeout is {limit:.1f} s): another process of the group did not join this "
            f"collective; it may have died, hung, or called a different collective. The "
            f"tpu process group is now unusable in this process.")
        exc.fatal = True
        runtime.mark_broken(exc)
        work._finish(exc)
        self._fail_queued(exc)


WORKER = _Worker()


def _runtime_failure(work, e):
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    low = msg.lower()
    if any(s in low for s in ("connection closed", "connection reset", "broken pipe",
                              "gloo", "unavailable", "deadline", "peer")):
        why = ("a peer process of the group failed or exited (its connection closed). "
               "The tpu process group is now unusable in this process.")
        fatal = True
    else:
        why = "see the error above"
        fatal = False
    exc = CollectiveError(f"[torch_tpu] {work.desc} failed: {msg} -- {why}")
    exc.fatal = fatal
    exc.__cause__ = e
    if switch_set("TORCH_TPU_DIST_DEBUG"):
        traceback.print_exception(e)
    return exc


# --------------------------------------------------------------------------
# the process group


class ProcessGroupTPU(dist.ProcessGroup):
    """c10d process group whose collectives are XLA collectives (backend "tpu")."""

    def __init__(self, rank: int, size: int, global_ranks, timeout: timedelta | None = None,
                 group_name: str | None = None):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self.global_ranks = tuple(global_ranks)
        self.timeout_seconds = (timeout.total_seconds() if isinstance(timeout, timedelta)
                                else float(timeout) if timeout is not None else 1800.0)
        self._seq = 0
        self._p2p_seq = collections.Counter()
        self._tpu_group_name = group_name
        self._tpu_group_desc = ""

    # -- identity --

    def getBackendName(self):
        return "tpu"

    def name(self):
        return "tpu"

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def __repr__(self):
        return f"ProcessGroupTPU(rank={self._rank}, size={self._size}, ranks={list(self.global_ranks)})"

    def set_timeout(self, timeout):
        self.timeout_seconds = timeout.total_seconds()

    @property
    def _device_types(self):
        """The devices whose tensors this group's collectives take: tpu and cpu.

        c10d's pybind property lists the devices of registered C++ backends,
        and this group has none, so it would be empty. Python callers read
        it: `dcp.async_save` requires cpu in it (its staged state dict is on
        the CPU), `_broadcast_tensors` (full state dict loading with
        `broadcast_from_rank0`) indexes it, and object collectives choose
        "cpu" from it (as they do for an empty list).
        """
        return [torch.device("tpu"), torch.device("cpu")]

    # c10d stores names on a group's C++ backends; this group has none, so it
    # keeps them itself (C++ callers reach these through the trampoline).
    def getGroupName(self):
        if self._tpu_group_name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._tpu_group_name

    def setGroupName(self, name):
        self._tpu_group_name = name

    def getGroupDesc(self):
        return self._tpu_group_desc

    def setGroupDesc(self, desc):
        self._tpu_group_desc = desc

    def _set_group_name(self, name):
        self._tpu_group_name = name

    def _set_group_desc(self, desc):
        self._tpu_group_desc = desc

    @property
    def group_name(self):
        return self.getGroupName()

    @property
    def group_desc(self):
        return self._tpu_group_desc

    # -- helpers --

    def _next_seq(self):
        self._seq += 1
        return self._seq

    def _check_ready(self, name):
        rt = runtime.state()
        if rt.broken is not None:
            raise CollectiveError(
                f"[torch_tpu] {name}: the tpu process group is unusable after an earlier "
                f"failure: {rt.broken}")

    def _launch(self, name, run, outputs, result, desc):
        work = Work(self, name, run, outputs, result)
        work.desc = desc
        WORKER.submit(work)
        return work

    def _collective(self, op, param, inputs, outputs_of_results, payload, out_blocks,
                    meta_shape, meta_dtype, result, extra_key=(), fused_payload=None):
        """Run `payload` over the group.

        inputs: local jax values (any shape); out_blocks: [(shape, dtype)] of
        the payload's local outputs; outputs_of_results: callable(list of
        arrays) -> list of (tensor, array) writes. fused_payload: optional
        callable(*gathered) -> outputs computing the result locally from
        every process's inputs ((n,) + block shape each); used when the
        checks are on and the inputs fit in the check's all-gather
        (`programs.FUSED_BYTES`), so the call is one collective.
        """
        self._check_ready(op)
        seq = self._next_seq()
        check = pg_programs.checks_enabled() and self._size > 1
        blocks = [_as_block(x) for x in inputs]
        sig = tuple((tuple(b.shape), np.dtype(b.dtype)) for b in blocks)
        fused = (check and fused_payload is not None
                 and pg_programs.fused_nbytes(sig) <= pg_programs.FUSED_BYTES)
        key = (op, self.global_ranks, param, extra_key, sig,
               tuple((tuple(s), str(np.dtype(d))) for s, d in out_blocks), check, fused)
        in_shapes = [tuple(b.shape) for b in blocks]
        prog = pg_programs.program(key, lambda: pg_programs.Program(
            self.global_ranks, fused_payload if fused else payload, in_shapes, out_blocks,
            check, fused=fused))
        meta = pg_programs.meta_vector(op, param if isinstance(param, int) else -1,
                                       meta_dtype, tuple(meta_shape), seq)
        desc = (f"{op} #{seq} ({np.dtype(meta_dtype) if meta_dtype is not None else ''}"
                f"{list(meta_shape)}) on ranks {list(self.global_ranks)}")
        dev = local_device()

        def run():
            meta_arr = jax.device_put(meta, dev)
            outs, ok, allm = prog(meta_arr, *blocks)
            if check and not bool(np.asarray(ok)[0]):
                raise CollectiveError(self._mismatch_message(op, seq, np.asarray(allm)))
            return outputs_of_results(outs)

        return self._launch(op, run, None, result, desc)

    def _mismatch_message(self, op, seq, allm):
        rows = np.asarray(allm).reshape(self._size, -1)[:, :pg_programs.META_LEN]
        calls = [f"  rank {self.global_ranks[i]}: {pg_programs.describe_meta(rows[i])}"
                 for i in range(self._size)]
        return (f"[torch_tpu] collective mismatch in {op} #{seq} on ranks "
                f"{list(self.global_ranks)}: the processes called different collectives or "
                f"passed tensors of different shapes/dtypes:\n" + "\n".join(calls)
                + "\nNo data was exchanged; the process group is still usable.")

    # -- all_reduce --

    def allreduce(self, tensors, opts=None):
        if isinstance(opts, ReduceOp) or opts is None:
            op = opts if opts is not None else ReduceOp.SUM
        else:
            op = opts.reduceOp
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        return self._allreduce(list(tensors), reduce_name(op)[0])

    def _allreduce(self, tensors, op, result=None):
        if not tensors:
            return _Done([])
        _check_reduce(op, tensors[0].dtype)
        n = self._size
        values = [value_of(t) for t in tensors]
        shapes = [tuple(t.shape) for t in tensors]
        if any(t.numel() == 0 for t in tensors):
            return _Done(tensors)

        def payload(*xs):
            return [pg_programs.reduce_values(x, op, n) for x in xs]

        def fused_payload(*gathered):
            return [pg_programs.fold_reduce(g, op, n) for g in gathered]

        blocks = [(_block_shape(s), v.dtype) for s, v in zip(shapes, values)]

        def writes(outs):
            return [(t, o.reshape(s)) for t, o, s in zip(tensors, outs, shapes)]

        meta_shape = shapes[0] if len(shapes) == 1 else (len(shapes), sum(map(_numel, shapes)))
        return self._collective("all_reduce", pg_programs.REDUCE_OPS.index(op), values, writes,
                                payload, blocks, meta_shape, values[0].dtype,
                                tensors if result is None else result,
                                fused_payload=fused_payload)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        return self._allreduce(list(tensors), reduce_name(op)[0])

    # -- broadcast --

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        tensors = list(tensors)
        _check_root(root, self._size, "broadcast")
        values = [value_of(t) for t in tensors]
        shapes = [tuple(t.shape) for t in tensors]
        if not tensors or any(t.numel() == 0 for t in tensors):
            return _Done(tensors)

        def payload(*xs):
            return [pg_programs.select_from(x, root) for x in xs]

        blocks = [(_block_shape(s), v.dtype) for s, v in zip(shapes, values)]

        def writes(outs):
            if self._rank == root:
                return []
            return [(t, o.reshape(s)) for t, o, s in zip(tensors, outs, shapes)]

        meta_shape = shapes[0] if len(shapes) == 1 else (len(shapes), sum(map(_numel, shapes)))
        return self._collective("broadcast", root, values, writes, payload, blocks,
                                meta_shape, values[0].dtype, tensors)

    # -- reduce (to one rank) --

    def reduce(self, tensors, opts=None):
        op = reduce_name(opts.reduceOp if opts is not None else ReduceOp.SUM)[0]
        root = opts.rootRank if opts is not None else 0
        _check_root(root, self._size, "reduce")
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        _check_reduce(op, tensors[0].dtype)
        n = self._size
        values = [value_of(t) for t in tensors]
        shapes = [tuple(t.shape) for t in tensors]

        def payload(*xs):
            return [pg_programs.reduce_values(x, op, n) for x in xs]

        blocks = [(_block_shape(s), v.dtype) for s, v in zip(shapes, values)]

        def writes(outs):
            if self._rank != root:
                return []
            return [(t, o.reshape(s)) for t, o, s in zip(tensors, outs, shapes)]

        return self._collective("reduce", pg_programs.REDUCE_OPS.index(op) + 1000 * root,
                                values, writes, payload, blocks, shapes[0], values[0].dtype,
                                tensors)

    # -- all_gather --

    def allgather(self, output_tensors, input_tensors, opts=None):
        """output_tensors: [[n tensors]], input_tensors: [tensor]."""
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("the tpu process group takes one input tensor per process")
        inp = input_tensors[0]
        outs = list(output_tensors[0])
        n = self._size
        if len(outs) != n:
            raise ValueError(f"all_gather: expected {n} output tensors, got {len(outs)}")
        for o in outs:
            if tuple(o.shape) != tuple(inp.shape) or o.dtype != inp.dtype:
                raise ValueError(
                    f"all_gather: every output tensor must match the input "
                    f"({inp.dtype}{list(inp.shape)}), got {o.dtype}{list(o.shape)}")
        shape = tuple(inp.shape)
        if inp.numel() == 0:
            return _Done(output_tensors)
        v = value_of(inp)
        block = _block_shape(shape)

        def payload(x):
            g = jax.lax.all_gather(x, pg_programs.AXIS)  # (n, *block)
            return [g[i] for i in range(n)]

        def writes(res):
            return [(o, r.reshape(shape)) for o, r in zip(outs, res)]

        return self._collective("all_gather", -1, [v], writes, payload,
                                [(block, v.dtype)] * n, shape, v.dtype, output_tensors)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        n = self._size
        shape = tuple(input_tensor.shape)
        want = ((n * shape[0],) + shape[1:]) if shape else (n,)
        if tuple(output_tensor.shape) != want and output_tensor.numel() != n * input_tensor.numel():
            raise ValueError(
                f"all_gather_into_tensor: output has shape {list(output_tensor.shape)}, "
                f"expected {list(want)} (the input {list(shape)} from {n} processes)")
        if output_tensor.dtype != input_tensor.dtype:
            raise ValueError("all_gather_into_tensor: output and input dtypes differ "
                             f"({output_tensor.dtype} vs {input_tensor.dtype})")
        if input_tensor.numel() == 0:
            return _Done([output_tensor])
        v = value_of(input_tensor)
        block = _block_shape(shape)
        out_shape = tuple(output_tensor.shape)

        def payload(x):
            return [jax.lax.all_gather(x, pg_programs.AXIS, axis=0, tiled=True)]

        def writes(res):
            return [(output_tensor, res[0].reshape(out_shape))]

        out_block = (n * block[0],) + block[1:]
        return self._collective("all_gather", -1, [v], writes, payload,
                                [(out_block, v.dtype)], shape, v.dtype, [output_tensor])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, output_tensors, input_tensors, opts=None):
        work = _Done([])
        for o, i in zip(output_tensors, input_tensors):
            work = self.all_gather_single(o, i, opts)
        return work

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        work = _Done([])
        for outs, inp in zip(output_lists, input_tensors):
            work = self.allgather([outs], [inp], opts)
        return work

    # -- gather / scatter --

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        _check_root(root, self._size, "gather")
        inp = input_tensors[0]
        n = self._size
        outs = list(output_tensors[0]) if (output_tensors and self._rank == root) else []
        if self._rank == root and len(outs) != n:
            raise ValueError(f"gather: the root needs {n} output tensors, got {len(outs)}")
        shape = tuple(inp.shape)
        v = value_of(inp)
        block = _block_shape(shape)

        def payload(x):
            g = jax.lax.all_gather(x, pg_programs.AXIS)
            return [g[i] for i in range(n)]

        def writes(res):
            return [(o, r.reshape(shape)) for o, r in zip(outs, res)]

        return self._collective("gather", root, [v], writes, payload, [(block, v.dtype)] * n,
                                shape, v.dtype, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        _check_root(root, self._size, "scatter")
        out = output_tensors[0]
        n = self._size
        shape = tuple(out.shape)
        block = _block_shape(shape)
        if self._rank == root:
            ins = list(input_tensors[0])
            if len(ins) != n:
                raise ValueError(f"scatter: the root needs {n} input tensors, got {len(ins)}")
            vals = [value_of(t) for t in ins]
        else:
            vals = None

        jd = st.TORCH_TO_JAX[out.dtype]
        if vals is None:
            vals = [jnp.zeros(block, jd, device=local_device())] * n

        def payload(*xs):
            stacked = jnp.concatenate([x.reshape(block) for x in xs], axis=0)
            bits = pg_programs.to_bits(stacked)
            mine = jax.lax.axis_index(pg_programs.AXIS) == root
            bits = jnp.where(mine, bits, jnp.zeros_like(bits))
            got = jax.lax.psum_scatter(bits, pg_programs.AXIS, scatter_dimension=0, tiled=True)
            return [pg_programs.from_bits(got, stacked.dtype)]

        def writes(res):
            return [(out, res[0].reshape(shape))]

        return self._collective("scatter", root, vals, writes, payload, [(block, jd)],
                                shape, jd, output_tensors)

    # -- reduce_scatter --

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        op = reduce_name(opts.reduceOp if opts is not None else ReduceOp.SUM)[0]
        _check_reduce(op, input_tensor.dtype)
        n = self._size
        in_shape = tuple(input_tensor.shape)
        out_shape = tuple(output_tensor.shape)
        if input_tensor.numel() != n * output_tensor.numel():
            raise ValueError(
                f"reduce_scatter_tensor: input {list(in_shape)} must hold {n} x the output "
                f"{list(out_shape)}")
        if input_tensor.dtype != output_tensor.dtype:
            raise ValueError("reduce_scatter_tensor: input and output dtypes differ")
        if output_tensor.numel() == 0:
            return _Done([output_tensor])
        v = value_of(input_tensor)
        # Scatter along dim 0 when the blocks are whole rows; else flatten.
        if in_shape and in_shape[0] == n * (out_shape[0] if out_shape else 0) and \
                in_shape[1:] == out_shape[1:]:
            block_in, block_out = in_shape, out_shape
        else:
            block_in, block_out = (input_tensor.numel(),), (output_tensor.numel(),)

        def payload(x):
            return [pg_programs.reduce_scatter_values(x.reshape(block_in), op, n)]

        def writes(res):
            return [(output_tensor, res[0].reshape(out_shape))]

        return self._collective("reduce_scatter", pg_programs.REDUCE_OPS.index(op), [v], writes,
                                payload, [(block_out, v.dtype)], in_shape, v.dtype,
                                [output_tensor])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """output_tensors: [tensor]; input_tensors: [[n tensors]]."""
        op = reduce_name(opts.reduceOp if opts is not None else ReduceOp.SUM)[0]
        out = output_tensors[0]
        ins = list(input_tensors[0])
        n = self._size
        if len(ins) != n:
            raise ValueError(f"reduce_scatter: expected {n} input tensors, got {len(ins)}")
        _check_reduce(op, out.dtype)
        shape = tuple(out.shape)
        for t in ins:
            if tuple(t.shape) != shape or t.dtype != out.dtype:
                raise ValueError("reduce_scatter: every input must match the output's shape "
                                 "and dtype")
        vals = [value_of(t) for t in ins]
        block = _block_shape(shape)

        def payload(*xs):
            stacked = jnp.concatenate([x.reshape(block) for x in xs], axis=0)
            return [pg_programs.reduce_scatter_values(stacked, op, n)]

        def writes(res):
            return [(out, res[0].reshape(shape))]

        return self._collective("reduce_scatter", pg_programs.REDUCE_OPS.index(op), vals,
                                writes, payload, [(block, vals[0].dtype)],
                                (n,) + shape, vals[0].dtype, output_tensors)

    def reduce_scatter_single_coalesced(self, output_tensors, input_tensors, opts=None):
        work = _Done([])
        for o, i in zip(output_tensors, input_tensors):
            work = self.reduce_scatter_single(o, i, opts)
        return work

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all_to_all --

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        n = self._size
        in_shape, out_shape = tuple(input.shape), tuple(output.shape)
        if input.dtype != output.dtype:
            raise ValueError("all_to_all_single: input and output dtypes differ")
        rows_in = in_shape[0] if in_shape else 1
        rows_out = out_shape[0] if out_shape else 1
        inner = in_shape[1:]
        if tuple(out_shape[1:]) != tuple(inner):
            raise ValueError("all_to_all_single: input and output differ beyond dim 0")
        in_splits = list(input_split_sizes or [])
        out_splits = list(output_split_sizes or [])
        equal = not in_splits and not out_splits
        if not in_splits:
            if rows_in % n:
                raise ValueError(f"all_to_all_single: dim 0 ({rows_in}) is not divisible by "
                                 f"the group size {n}")
            in_splits = [rows_in // n] * n
        if not out_splits:
            if rows_out % n:
                raise ValueError(f"all_to_all_single: output dim 0 ({rows_out}) is not "
                                 f"divisible by the group size {n}")
            out_splits = [rows_out // n] * n
        if len(in_splits) != n or len(out_splits) != n or sum(in_splits) != rows_in or \
                sum(out_splits) != rows_out:
            raise ValueError(f"all_to_all_single: split sizes {in_splits} / {out_splits} do "
                             f"not match the tensors ({rows_in} / {rows_out} rows, {n} ranks)")
        v = value_of(input)
        if not in_shape:
            v = v.reshape((1,))
        if equal or (len(set(in_splits)) == 1 and in_splits == out_splits):
            k = in_splits[0]
            block = (n * k,) + inner

            def payload(x):
                return [jax.lax.all_to_all(x, pg_programs.AXIS, 0, 0, tiled=True)]

            def writes(res):
                return [(output, res[0].reshape(out_shape))]

            return self._collective("all_to_all", k, [v], writes, payload,
                                    [(block, v.dtype)], (n * k,) + inner, v.dtype, [output])
        return self._uneven_all_to_all(output, v, in_splits, out_splits, inner, out_shape)

    alltoall_base = all_to_all_single

    def _uneven_all_to_all(self, output, v, in_splits, out_splits, inner, out_shape):
        """Chunks of different sizes: pad every chunk to the largest in the group."""
        n = self._size
        # Step 1: every process learns the largest chunk (a tiny all-gather).
        sizes = np.asarray(in_splits + out_splits, np.int64)
        sizes_dev = jax.device_put(sizes, local_device())
        box = {}

        def payload_sizes(x):
            return [jax.lax.all_gather(x, pg_programs.AXIS, tiled=True)]

        def keep(res):
            box["all"] = np.asarray(res[0]).reshape(n, 2 * n)
            return []

        w = self._collective("all_to_all_splits", -1, [sizes_dev], keep, payload_sizes,
                             [((n * 2 * n,), np.int64)], (2 * n,), np.int64, [])
        w.wait()
        allsz = box["all"]
        # rank j's out_splits[i] must equal rank i's in_splits[j]
        for i in range(n):
            for j in range(n):
                if allsz[j, n + i] != allsz[i, j]:
                    raise CollectiveError(
                        f"[torch_tpu] all_to_all_single: rank {self.global_ranks[j]} expects "
                        f"{allsz[j, n + i]} rows from rank {self.global_ranks[i]}, which sends "
                        f"{allsz[i, j]}")
        m = int(max(1, allsz[:, :n].max()))
        starts = np.concatenate([[0], np.cumsum(in_splits)[:-1]]).astype(int)
        ostarts = np.concatenate([[0], np.cumsum(out_splits)[:-1]]).astype(int)
        in_splits_t, out_splits_t = tuple(in_splits), tuple(out_splits)

        def payload(x):
            chunks = []
            for s, c in zip(starts, in_splits_t):
                part = jax.lax.slice_in_dim(x, int(s), int(s) + c, axis=0)
                pad = [(0, m - c)] + [(0, 0)] * len(inner)
                chunks.append(jnp.pad(part, pad))
            padded = jnp.concatenate(chunks, axis=0)  # (n*m, ...)
            got = jax.lax.all_to_all(padded, pg_programs.AXIS, 0, 0, tiled=True)
            parts = [jax.lax.slice_in_dim(got, j * m, j * m + c, axis=0)
                     for j, c in enumerate(out_splits_t)]
            return [jnp.concatenate(parts, axis=0) if parts else got[:0]]

        del ostarts

        def writes(res):
            return [(output, res[0].reshape(out_shape))]

        rows_out = sum(out_splits)
        return self._collective("all_to_all", -2, [v], writes, payload,
                                [((rows_out,) + tuple(inner), v.dtype)], (n * m,) + tuple(inner),
                                v.dtype, [output], extra_key=(in_splits_t, out_splits_t, m))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != n or len(ins) != n:
            raise ValueError(f"all_to_all: expected {n} input and output tensors")
        dtype = ins[0].dtype
        if any(t.dtype != dtype for t in ins + outs):
            raise ValueError("all_to_all: all tensors must have the same dtype")
        flat_in = torch.cat([t.reshape(-1) for t in ins]) if ins[0].device.type == "cpu" \
            else torch.cat([t.reshape(-1) for t in ins])
        flat_out = torch.empty(sum(t.numel() for t in outs), dtype=dtype,
                               device=outs[0].device)
        in_splits = [t.numel() for t in ins]
        out_splits = [t.numel() for t in outs]
        inner = self.all_to_all_single(flat_out, flat_in, out_splits, in_splits, opts)
        inner.wait()
        offset = 0
        with torch.no_grad():
            for t in outs:
                t.copy_(flat_out[offset:offset + t.numel()].reshape(t.shape))
                offset += t.numel()
        return _Done(outs)

    # -- barrier --

    def barrier(self, opts=None):
        self._check_ready("barrier")
        t = torch.zeros((1,), dtype=torch.int32)
        work = self._allreduce([t], "sum")
        work.desc = work.desc.replace("all_reduce", "barrier")
        return work

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        work = self.barrier()
        if timeout is not None:
            work.wait(timeout)
        else:
            work.wait()

    # -- point to point --

    def send(self, tensors, dst, tag=0):
        return self._p2p(tensors, self._rank, dst, "send")

    def recv(self, tensors, src, tag=0):
        return self._p2p(tensors, src, self._rank, "recv")

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("recv from any source is not supported by the tpu process "
                                  "group; pass src")

    def _p2p(self, tensors, src, dst, what):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise ValueError(f"{what}: the tpu process group takes one tensor")
        t = tensors[0]
        if src == dst:
            raise ValueError(f"{what}: a process cannot send to itself")
        for r in (src, dst):
            if not (0 <= r < self._size):
                raise ValueError(f"{what}: rank {r} is not in the group of size {self._size}")
        self._check_ready(what)
        lo, hi = sorted((src, dst))
        ranks = (self.global_ranks[lo], self.global_ranks[hi])
        perm = [(0, 1)] if src == lo else [(1, 0)]
        pair = (lo, hi)
        self._p2p_seq[pair] += 1
        seq = self._p2p_seq[pair]
        v = value_of(t)
        shape = tuple(t.shape)
        block = _block_shape(shape)
        check = pg_programs.checks_enabled()
        key = ("p2p", ranks, tuple(perm), (block, str(v.dtype)), check)

        def payload(x):
            return [jax.lax.ppermute(x, pg_programs.AXIS, perm)]

        prog = pg_programs.program(key, lambda: pg_programs.Program(
            ranks, payload, [block], [(block, v.dtype)], check))
        meta = pg_programs.meta_vector("p2p", 1000 * self.global_ranks[src]
                                       + self.global_ranks[dst], v.dtype, shape, seq)
        desc = (f"{what} #{seq} ({v.dtype}{list(shape)}) from rank {self.global_ranks[src]} "
                f"to rank {self.global_ranks[dst]}")
        dev = local_device()
        receiving = what == "recv"
        x = _as_block(v)

        def run():
            outs, ok, allm = prog(jax.device_put(meta, dev), x)
            if check and not bool(np.asarray(ok)[0]):
                rows = np.asarray(allm).reshape(2, -1)[:, :pg_programs.META_LEN]
                raise CollectiveError(
                    f"[torch_tpu] {desc}: the two processes disagree:\n"
                    f"  rank {ranks[0]}: {pg_programs.describe_meta(rows[0])}\n"
                    f"  rank {ranks[1]}: {pg_programs.describe_meta(rows[1])}")
            return [(t, outs[0].reshape(shape))] if receiving else []

        return self._launch(what, run, None, [t], desc)

    # -- coalescing (no-op: each collective runs on its own) --

    def _start_coalescing(self, device=None):
        pass

    def _end_coalescing(self, device=None):
        return _Done([])

    # -- lifecycle --

    def abort(self):
        pass

    def shutdown(self):
        pass


def _block_shape(shape):
    return tuple(shape) if len(shape) >= 1 else (1,)


def _numel(shape):
    return int(np.prod(shape)) if shape else 1


def _check_root(root, size, what):
    if not (0 <= root < size):
        raise ValueError(f"{what}: root rank {root} is not in the group of size {size}")


def _check_reduce(op, dtype):
    floating = dtype.is_floating_point or dtype.is_complex
    if op == "avg" and not floating:
        raise ValueError(f"ReduceOp.AVG needs a floating point tensor, got {dtype}")
    if op in ("band", "bor", "bxor") and (floating):
        raise ValueError(f"ReduceOp.{op.upper()} needs an integer or bool tensor, got {dtype}")
    if op in ("max", "min", "product", "band", "bor", "bxor") and dtype.is_complex:
        raise ValueError(f"ReduceOp.{op.upper()} is not supported for complex tensors")


# --------------------------------------------------------------------------
# the backend's creator (torch.distributed.Backend.register_backend)


def create(dist_backend_opts, backend_options=None):
    """Build the process group for `init_process_group("tpu")` / `new_group`."""
    store = dist_backend_opts.store
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    timeout = dist_backend_opts.timeout
    global_ranks = list(dist_backend_opts.global_ranks_in_group or range(size))
    if not runtime.is_initialized():
        if dist.is_initialized():
            world, me = dist.get_world_size(), dist.get_rank()
        else:  # the default group is being created
            world, me = size, rank
        if size != world:
            raise RuntimeError(
                "the first 'tpu' process group must contain every process (JAX's runtime "
                "spans all of them): use init_process_group('tpu'), or call "
                "torch_tpu.distributed.initialize() in every process before new_group")
        runtime.initialize(num_processes=world, process_id=me, store=store,
                           timeout=timeout.total_seconds() if timeout is not None else None)

    pg = ProcessGroupTPU(rank, size, global_ranks, timeout, dist_backend_opts.group_id)
    return pg


collectives.TPU_GROUP_TYPES.append(ProcessGroupTPU)  # the functional collectives run through it
