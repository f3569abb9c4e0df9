"""The OpInfo conformance harness: run PyTorch's op database on CPU and `tpu`.

Everything the test file, the expectation refresher and tools/op_coverage.py
share lives here: which OpInfo entries and dtypes are tested, how a sample
input is copied to `tpu` (layout preserved), how one sample is run and
compared (values, dtypes, shapes; input gradients; distributions for random
samples), and how a failure is classified into a short cause.

The reference is always PyTorch's own CPU kernel on the same sample.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import re
import warnings

import numpy as np
import torch
from torch.testing._comparison import default_tolerances
from torch.testing._internal import common_methods_invocations as _cmi
from torch.testing._internal import common_utils as _common_utils
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import torch_tpu  # noqa: F401  (registers the device)

from . import expectations

TPU = torch.device("tpu", 0)

# The dtypes the harness knows, in report order, by their short names.
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
    "complex64": torch.complex64,
}
# The default (CI) run: these forward dtypes and float32 gradients. Every
# other (dtype, kind) is marked slow.
DEFAULT_FORWARD = ("float32", "bfloat16", "int64")
GRAD_DTYPES = ("float32",)

# OpInfo entries whose outputs are uninitialized memory (compared by shape,
# dtype and strides of the result only).
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided",
                 "empty_strided", "empty_permuted"}

# Random OpInfo entries: their purpose is sampling, so their outputs are
# compared by shape, dtype and distribution, and the pass-rate counts
# leave them out. (Samples of other ops that happen to draw random numbers,
# e.g. scaled_dot_product_attention with dropout, are detected per sample by
# the `nondeterministic_seeded` tag and compared the same way.)
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal",
    "multinomial", "normal", "normal.in_place", "normal.number_mean", "uniform",
    "rand_like", "randint", "randint_like", "randn", "randn_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "svd_lowrank", "pca_lowrank",
}


def _call_unseeded(op, *args, **kwargs):
    return op(*args, **kwargs)


# PyTorch wraps its random OpInfo entries in wrapper_set_seed, which calls
# torch.manual_seed(42) before every call (and so reseeds the tpu generator
# too): every draw would be the same. The distribution comparison needs
# independent draws, so the harness calls those ops without reseeding (it
# seeds the CPU generator itself before each sample).
_cmi.wrapper_set_seed = _call_unseeded


def full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def is_jiterator(op) -> bool:
    return op.name.startswith("jiterator_")


def tested_ops():
    """(name, OpInfo) for every entry of op_db the harness runs, in op_db order."""
    out = []
    for op in op_db:
        if is_jiterator(op):  # CUDA-only by construction
            continue
        out.append((full_name(op), op))
    return out


def cpu_dtypes(op):
    """The harness dtypes (names) the CPU kernel of `op` supports."""
    sup = op.supported_dtypes("cpu")
    return [n for n, d in DTYPES.items() if d in sup]


def grad_dtypes(op):
    if not op.supports_autograd:
        return []
    sup = op.supported_backward_dtypes("cpu")
    return [n for n in GRAD_DTYPES if DTYPES[n] in sup and DTYPES[n] in op.supported_dtypes("cpu")]


def cases():
    """Every (name, op, dtype name, kind) the harness can run."""
    for name, op in tested_ops():
        for dt in cpu_dtypes(op):
            yield name, op, dt, "forward"
        for dt in grad_dtypes(op):
            yield name, op, dt, "grad"


def is_default(dtype: str, kind: str) -> bool:
    if kind == "forward":
        return dtype in DEFAULT_FORWARD
    return dtype in GRAD_DTYPES


# --------------------------------------------------------------------------
# the CPU fallback switch


@contextlib.contextmanager
def cpu_fallback(enabled: bool):
    """Set TORCH_TPU_CPU_FALLBACK for the duration (it is read at call time)."""
    old = os.environ.get("TORCH_TPU_CPU_FALLBACK")
    os.environ["TORCH_TPU_CPU_FALLBACK"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TORCH_TPU_CPU_FALLBACK"]
        else:
            os.environ["TORCH_TPU_CPU_FALLBACK"] = old


# --------------------------------------------------------------------------
# copying samples to tpu


def to_tpu(t: torch.Tensor) -> torch.Tensor:
    """A tpu copy of CPU tensor `t` with the same sizes, strides and offset.

    Non-contiguous samples stay non-contiguous: the whole CPU storage is
    copied and the tpu tensor is the same strided view of it. Leaves keep
    `requires_grad` (as fresh leaves).
    """
    d = t.detach()
    if d.layout != torch.strided:  # sparse / mkldnn samples: whatever tpu does
        out = d.to(TPU)
        return out.requires_grad_(True) if t.requires_grad else out
    # Move the stored values (a copy would materialize lazy conjugate/negative
    # bits), then give the tpu view the same bits.
    if d.is_conj():
        d = d.conj()
    if d.is_neg():
        d = d._neg_view()
    if d.is_contiguous() and d.storage_offset() == 0 and d.numel() > 0:
        out = d.to(TPU)
    elif d.numel() == 0:
        out = torch.empty(tuple(d.shape), dtype=d.dtype, device=TPU)
    else:
        span = d.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(d.shape, d.stride()))
        flat = d.as_strided((span,), (1,), 0).clone()
        out = flat.to(TPU).as_strided(tuple(d.shape), tuple(d.stride()), d.storage_offset())
    if t.is_conj():
        out = out.conj()  # the conj bit travels with the view, not the data
    if t.is_neg():
        out = out._neg_view()
    if t.requires_grad:
        out = out.detach().requires_grad_(True)
    return out


def _map_device(x):
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        return to_tpu(x)
    if isinstance(x, torch.device) and x.type == "cpu":
        return TPU
    return x


# Sample arguments PyTorch requires on the CPU whatever the device (positions
# in sample.args): OpInfo builds them on the default device, which is the CPU
# in a CUDA test run too.
CPU_ARGS = {"tensor_split": (0,)}


def sample_to_tpu(sample, op_name=None):
    """(input, args, kwargs) of `sample` with tensors and devices on tpu.

    Aliasing is kept: the same CPU tensor in two places (an input passed as
    out=) becomes the same tpu tensor, and CPU tensors sharing a storage
    become views of one tpu storage, so PyTorch's memory-overlap errors
    (error_inputs of cat, take, gather, ...) can happen on tpu too.
    """
    leaves = [x for x in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(x, torch.Tensor) and x.device.type == "cpu"
              and x.layout == torch.strided]
    users = {}
    for x in leaves:
        if x.untyped_storage().nbytes():
            users.setdefault(x.untyped_storage().data_ptr(), set()).add(id(x))
    bases, done = {}, {}

    def move(x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return _map_device(x)
        if id(x) in done:
            return done[id(x)]
        key = x.untyped_storage().data_ptr() if x.layout == torch.strided else None
        if key is not None and len(users.get(key, ())) > 1:
            if key not in bases:
                flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
                bases[key] = flat.detach().clone().to(TPU)
            out = bases[key].as_strided(tuple(x.shape), tuple(x.stride()), x.storage_offset())
            if x.is_conj():  # the lazy bits belong to the view, not the storage
                out = out.conj()
            if x.is_neg():
                out = out._neg_view()
            if x.requires_grad:
                out = out.detach().requires_grad_(True)
        else:
            out = _map_device(x)
        done[id(x)] = out
        return out

    inp = pytree.tree_map(move, sample.input)
    keep = CPU_ARGS.get(op_name, ())
    args = tuple(a if i in keep and isinstance(a, torch.Tensor) else pytree.tree_map(move, a)
                 for i, a in enumerate(sample.args))
    kwargs = {}
    for k, v in sample.kwargs.items():
        if k == "device" and isinstance(v, str) and v.startswith("cpu"):
            v = "tpu"
        kwargs[k] = pytree.tree_map(move, v)
    return inp, args, kwargs


def to_cpu(x):
    """Results of a tpu run, moved to the CPU for comparison."""
    def f(v):
        if isinstance(v, torch.Tensor):
            if v.device.type == "tpu":
                return v.detach().cpu()
            return v.detach()
        if isinstance(v, torch.device) and v.type == "tpu":
            return torch.device("cpu")
        return v
    return pytree.tree_map(f, x)


# --------------------------------------------------------------------------
# running


class RandomRecorder(TorchDispatchMode):
    """Notes whether any ATen op with the nondeterministic_seeded tag ran."""

    def __init__(self):
        super().__init__()
        self.random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
        return func(*args, **(kwargs or {}))


class OpRecorder(TorchDispatchMode):
    """Records the ATen overloads an op call dispatches (top level)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


class Outcome(Exception):
    """Raised for a comparison failure, with a short `cause` for the report."""

    def __init__(self, cause, detail=""):
        super().__init__(f"{cause}\n{detail}" if detail else cause)
        self.cause = cause
        self.detail = detail


# Sample inputs per (op, dtype, kind) in a run: OpInfo generators range from
# 1 to 1440 samples (max_pool2d), 58k in the default set; each new shape is
# a new executable. A run takes this many, evenly spaced over the generator's
# list so every family of samples is represented (first and last included).
# TORCH_TPU_OPINFO_MAX_SAMPLES=N (--opinfo-max-samples N): N of them; 0: all.
DEFAULT_MAX_SAMPLES = 12
# Unset, the default run (CI's, on 2 cores, where compiling these programs is
# most of the suite's time) takes a subset of those 12 (tests/README.md):
# float32 forward, QUICK_SAMPLES of them, every other one and the last (the
# 1st, 3rd, ..., 11th and 12th); float32 gradients (each sample compiles a
# forward and a backward program) and the other dtypes' forward (bfloat16,
# int64: the same lowerings under another dtype) QUICK_SAMPLES_OTHER, every
# fourth one and the last (1st, 5th, 9th, 12th).
QUICK_SAMPLES = 7
QUICK_SAMPLES_OTHER = 4


def max_samples() -> int | None:
    v = os.environ.get("TORCH_TPU_OPINFO_MAX_SAMPLES", "")
    n = int(v) if v else DEFAULT_MAX_SAMPLES
    return n if n > 0 else None


def quick() -> bool:
    """The default run's selection (TORCH_TPU_OPINFO_MAX_SAMPLES unset)?"""
    return not os.environ.get("TORCH_TPU_OPINFO_MAX_SAMPLES", "")


def selection(n_total: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> list:
    """The indices of the samples a run checks, out of n_total, for `dtype`
    (forward, or gradients with `grad`)."""
    idx = pick(n_total, max_samples())
    if quick():
        step, limit = ((2, QUICK_SAMPLES) if dtype == torch.float32 and not grad
                       else (4, QUICK_SAMPLES_OTHER))
        if len(idx) > limit:
            idx = sorted(set(idx[::step]) | {idx[-1]})
    return idx


def pick(n_total: int, n: int | None):
    """Indices of n samples evenly spaced over n_total (all when n is None)."""
    if n is None or n_total <= n:
        return list(range(n_total))
    if n == 1:
        return [0]
    return sorted({round(i * (n_total - 1) / (n - 1)) for i in range(n)})


def _seed_cpu(seed: int) -> None:
    """What OpInfo's sample iterator does before each sample (common_utils.
    set_rng_seed), for the generators CPU samples draw from: torch's CPU
    generator, `random` and NumPy. Not torch.manual_seed, which also queues the
    seed for CUDA, XPU and MTIA, each queue taking a traceback.format_stack()
    (~3 ms under pytest's deep stacks, ~30% of an OpInfo test's time,
    measured): the samples are the same, bit for bit."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _seeded(iterable):
    """`iterable`'s items, each drawn after the seeding OpInfo's iterator does
    (see _seed_cpu; its seed is common_utils.SEED where no unittest method
    runs it, as here)."""
    it = iter(iterable)
    while True:
        _seed_cpu(_common_utils.SEED)
        try:
            yield next(it)
        except StopIteration:
            return


def samples(op, dtype, requires_grad):
    """(index, CPU sample input) pairs of `op`: max_samples() of them."""
    # op.sample_inputs_func itself: op.sample_inputs wraps it in a tracker
    # that walks the stack twice (inspect.stack(), ~0.13 s under pytest)
    all_ = list(_seeded(op.sample_inputs_func(op, "cpu", dtype, requires_grad)))
    for i in selection(len(all_), dtype, grad=requires_grad):
        yield i, all_[i]


def error_inputs(op):
    """`op`'s ErrorInputs on the CPU, seeded as OpInfo seeds them: from
    `op.error_inputs_func` itself, as op.error_inputs() also runs a stack walk
    (inspect.stack()) per input."""
    return _seeded(op.error_inputs_func(op, "cpu"))


def tolerance(name, dtype, kind):
    t = expectations.TOLERANCES.get((name, dtype, kind))
    if t is None:
        t = expectations.TOLERANCES.get((name, dtype))
    if t is None:
        return {}
    return {"atol": t[0], "rtol": t[1]}


def _call(op, inp, args, kwargs):
    return op(inp, *args, **kwargs)


# --------------------------------------------------------------------------
# the path a tpu call takes (--opinfo-path, TORCH_TPU_OPINFO_PATH)
#
# eager: each op as its own cached executable (the default); fused: inside
# `torch_tpu.fused()`, the sample's ops recorded and run as one program when
# the block ends; compiled: through `torch.compile(backend="tpu")` of a
# function calling the op (dynamo reset per sample: no recompile limit can
# send a sample back to eager). A compiled sample that ran no compiled graph
# (dynamo broke the graph at the op) or whose graph fell back to running op
# by op fails as "not compiled". The warm path is the eager path in a second
# process on the cache the first one filled (tools/op_coverage.py --path warm).

PATHS = ("eager", "fused", "compiled")


def path() -> str:
    p = os.environ.get("TORCH_TPU_OPINFO_PATH", "eager") or "eager"
    if p not in PATHS:
        raise ValueError(f"TORCH_TPU_OPINFO_PATH={p!r}: one of {PATHS}")
    return p


def _graph_counts():
    from torch_tpu.compile import graph_cache

    s = graph_cache.GRAPH_STATS
    return s.runs, s.eager_fallbacks


def tpu_call(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on tpu arguments, on this run's path."""
    p = path()
    if p == "fused":
        with torch_tpu.fused():
            return fn(*args, **kwargs)
    if p == "compiled":
        torch._dynamo.reset()
        torch._dynamo.utils.counters["graph_break"].clear()
        runs, fallbacks = _graph_counts()
        try:
            out = torch.compile(fn, backend="tpu", dynamic=False)(*args, **kwargs)
        except Exception as e:
            if type(e).__module__.startswith("torch._dynamo"):
                _, cpu_e = _dynamo_on_cpu(fn, args, kwargs)
                if cpu_e is not None and type(cpu_e) is type(e):
                    first = (str(e).strip().splitlines() or [""])[0][:120]
                    raise NotCapturable(f"not capturable: dynamo raises {type(e).__name__} on "
                                        f"the CPU too ({first})") from e
            raise
        runs2, fallbacks2 = _graph_counts()
        if runs2 == runs:
            graphs, cpu_e = _dynamo_on_cpu(fn, args, kwargs)
            if graphs == 0 and cpu_e is None:
                # Not ours to compile: the values are still compared.
                NOT_CAPTURED.append("not capturable: dynamo captures no graph of this call "
                                    "on the CPU either (a data-dependent op or nothing to "
                                    "compile); its values match eager")
                return out
            raise Outcome("not compiled: no compiled graph ran (dynamo ran the op eagerly"
                          f"{_break_reason()})")
        if fallbacks2 != fallbacks:
            raise Outcome("not compiled: the graph ran op by op (a lowering failed inside it)")
        return out
    return fn(*args, **kwargs)


def _break_reason() -> str:
    """Dynamo's first graph-break reason of the last compile, as a clause."""
    reasons = list(torch._dynamo.utils.counters["graph_break"])
    if not reasons:
        return ""
    lines = [ln.strip() for ln in str(reasons[0]).strip().splitlines() if ln.strip()]
    text = "; ".join(lines[:2])[:160]
    return f"; graph break: {text}"


class NotCapturable(Outcome):
    """A compiled-path sample that no backend could compile: dynamo fails on
    the same call with CPU arguments too. Reported as an expected failure
    with this cause, not as a miss of the tpu backend."""


# Samples of the current case that dynamo captured no graph of, on tpu and
# on the CPU alike (their values were compared); test_opinfo reports the
# case as an expected failure with the reason when nothing else failed.
NOT_CAPTURED: list[str] = []


def _dynamo_on_cpu(fn, args, kwargs):
    """(graphs dynamo hands a backend, exception or None) for `fn` on CPU
    copies of the arguments: the control that says whether a graph the tpu
    backend never received could have been captured at all."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def cpu(v):
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return v.detach().cpu().requires_grad_(v.requires_grad)
        if isinstance(v, torch.device) and v.type == "tpu":
            return torch.device("cpu")
        return v

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, dynamic=False)(
            *pytree.tree_map(cpu, args), **pytree.tree_map(cpu, kwargs))
    except Exception as e:  # noqa: BLE001 - the control's outcome is the answer
        return len(graphs), e
    finally:
        torch._dynamo.reset()
    return len(graphs), None


def _unwrap(e: BaseException) -> BaseException:
    """The user-facing error under dynamo's wrappers (compiled path): the
    exception PyTorch's own check raised while tracing."""
    seen = 0
    while (type(e).__module__.startswith("torch._dynamo") and e.__cause__ is not None
           and seen < 8):
        e, seen = e.__cause__, seen + 1
    return e


def _compare(actual, expected, tol, what):
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False,
                                   check_stride=False, **tol)
    except AssertionError as e:
        msg = str(e)
        raise Outcome(f"mismatch ({what}): {_summarize_assert(msg)}", msg) from None
    except TypeError as e:  # structure differs (tuple vs tensor, ...)
        raise Outcome(f"mismatch ({what}): {e}"[:200]) from None


def _summarize_assert(msg: str) -> str:
    """One line from assert_close's message: what differs and by how much."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    first = lines[0] if lines else msg
    parts = [first]
    for ln in lines[1:]:
        m = re.match(r"Mismatched elements: (\d+) / (\d+)", ln)
        if m:
            parts.append(f"{m.group(1)}/{m.group(2)} elements")
        m = re.match(r"Greatest (absolute|relative) difference: (\S+) at index (.*?) ?"
                     r"\(up to (\S+) allowed\)", ln)
        if m:
            parts.append(f"max {m.group(1)[:3]} diff {m.group(2)} (allowed {m.group(4)})")
        m = re.match(r"(Absolute|Relative) difference: (\S+) \(up to (\S+) allowed\)", ln)
        if m:
            parts.append(f"{m.group(1)[:3].lower()} diff {m.group(2)} (allowed {m.group(3)})")
        m = re.match(r"The failure occurred for item (\S+)", ln)
        if m:
            parts.append(f"output {m.group(1)}")
    if "Tensor-likes" not in first and "Scalars" not in first:
        return ", ".join([first[:200]] + parts[1:])[:300]
    return ", ".join(parts)[:300]


def compare(actual, expected, tol, what):
    """assert_close, with non-tensor leaves it cannot handle compared by ==."""
    if not any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(expected)) and not any(
            isinstance(v, torch.Tensor) for v in pytree.tree_leaves(actual)):
        try:
            _compare(actual, expected, tol, what)
            return
        except Outcome:
            if actual == expected or (actual is expected):
                return
            raise
    _compare(actual, expected, tol, what)


def _metadata(x):
    def f(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.dtype)
        return v
    return pytree.tree_map(f, x)


def _compare_meta(actual, expected, what):
    a, e = _metadata(actual), _metadata(expected)
    if a != e:
        raise Outcome(f"mismatch ({what}): shape/dtype {a} != {e}"[:300])


def _ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic of 1-D float tensors."""
    a, _ = torch.sort(a)
    b, _ = torch.sort(b)
    allv = torch.cat([a, b])
    ca = torch.searchsorted(a, allv, right=True).double() / a.numel()
    cb = torch.searchsorted(b, allv, right=True).double() / b.numel()
    return float((ca - cb).abs().max())


# torch.testing.assert_close's default (atol, rtol) per dtype.
_DEFAULT_TOL = {torch.float16: (1e-5, 1e-3), torch.bfloat16: (1e-5, 1.6e-2),
                torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7)}


def _snap_to(a: torch.Tensor, bs: torch.Tensor, dtype) -> torch.Tensor:
    """`a` with each value within rounding tolerance of a value of sorted `bs` set to it.

    Random ops with few outcomes (dropout over a handful of attention
    weights) give atoms: the same value many times. The tpu computes each
    atom's value with rounding-level differences from CPU's, and the KS
    statistic would count the whole mass of an atom as a difference between
    the two distributions. Values equal within the dtype's default
    tolerance are the same outcome.
    """
    if bs.numel() == 0 or not a.dtype.is_floating_point:
        return a
    atol, rtol = _DEFAULT_TOL.get(dtype, (1e-5, 1.3e-6))
    hi = torch.searchsorted(bs, a).clamp(max=bs.numel() - 1)
    lo = (hi - 1).clamp(min=0)
    near = torch.where((bs[hi] - a).abs() <= (bs[lo] - a).abs(), bs[hi], bs[lo])
    close = (near - a).abs() <= atol + rtol * near.abs()
    return torch.where(close, near, a)


def _design_effect(draws, pooled_sorted):
    """Kish's design effect of `draws` (1-D tensors of equal size), on ranks.

    Values inside one draw may be correlated (dropout2d zeroes whole
    channels), which makes the pooled sample worth fewer independent
    values. The variance of the per-draw mean rank against the variance of
    single ranks measures it. Ranks keep it finite for heavy tails (cauchy).
    """
    if len(draws) < 4 or draws[0].numel() < 2:
        return 1.0
    ranks = [torch.searchsorted(pooled_sorted, d, right=True).double() for d in draws]
    per_draw = torch.stack([r.mean() for r in ranks])
    allr = torch.cat(ranks)
    var_single = float(allr.var())
    if var_single == 0:
        return 1.0
    return max(1.0, float(per_draw.var()) * draws[0].numel() / var_single)


def _compare_distribution(draws_tpu, draws_cpu, what):
    """Shape/dtype per draw, then the value distributions.

    A two-sample Kolmogorov-Smirnov test on the pooled draws at
    alpha = 1e-6, its sample sizes divided by the design effect of the
    draws (correlated values within a draw count less). Seeds are fixed, so
    the outcome is deterministic for a given build.
    """
    for t, c in zip(draws_tpu, draws_cpu):
        _compare_meta(t, c, what)
    leaves_t = [pytree.tree_leaves(d) for d in draws_tpu]
    leaves_c = [pytree.tree_leaves(d) for d in draws_cpu]
    for i in range(len(leaves_c[0])):
        ct = [d[i] for d in leaves_c]
        tt = [d[i] for d in leaves_t]
        if not isinstance(ct[0], torch.Tensor) or ct[0].numel() == 0:
            continue
        if ct[0].dtype.is_complex:
            ct = [torch.view_as_real(x) for x in ct]
            tt = [torch.view_as_real(x) for x in tt]
        dt = [x.reshape(-1).double() for x in tt]
        dc = [x.reshape(-1).double() for x in ct]
        a, b = torch.cat(dt), torch.cat(dc)
        fa, fb = torch.isfinite(a), torch.isfinite(b)
        # Non-finite values (cauchy overflow, -inf logs): same proportion.
        na, nb = a.numel(), b.numel()
        pa, pb = 1 - fa.double().mean().item(), 1 - fb.double().mean().item()
        if abs(pa - pb) > 6 * math.sqrt(max(pa * (1 - pa), pb * (1 - pb), 1e-4) * (1 / na + 1 / nb)) + 1e-9:
            raise Outcome(f"distribution ({what}): non-finite fraction {pa:.3g} vs CPU {pb:.3g}")
        if not (fa.all() and fb.all()):
            dt = [x[torch.isfinite(x)] for x in dt]
            dc = [x[torch.isfinite(x)] for x in dc]
            a, b = a[fa], b[fb]
        if a.numel() == 0 or b.numel() == 0:
            continue
        b_sorted, _ = torch.sort(b)  # once for the pooled sample and every draw
        a = _snap_to(a, b_sorted, tt[0].dtype)
        dt = [_snap_to(x, b_sorted, tt[0].dtype) for x in dt]
        d = _ks_statistic(a, b)
        pooled, _ = torch.sort(torch.cat([a, b]))
        deff = 1.0
        if all(x.numel() == dt[0].numel() for x in dt + dc):
            deff = max(_design_effect(dt, pooled), _design_effect(dc, pooled))
        n, m = a.numel() / deff, b.numel() / deff
        # alpha = 1e-6: a correct backend fails this check about once in a
        # million comparisons; a wrong distribution fails it reliably.
        crit = math.sqrt(-math.log(0.5e-6) / 2) * math.sqrt((n + m) / (n * m))
        if d > crit:
            raise Outcome(
                f"distribution ({what}): KS statistic {d:.3g} > {crit:.3g} "
                f"(tpu mean {a.mean():.4g} std {a.std():.4g} vs CPU mean {b.mean():.4g} "
                f"std {b.std():.4g}, n={a.numel()}, design effect {deff:.3g})")


# Randomized low-rank factorizations of exactly low-rank samples: the factors
# depend on the random projection (signs, rotations), the reconstruction
# U diag(S) V^H and the singular values do not.
LOWRANK = {"svd_lowrank", "pca_lowrank"}


def _compare_lowrank(op_name, sample, actual, expected, tol, what):
    """svd_lowrank / pca_lowrank(a @ b.mT, q, M or center)."""
    _compare_meta(actual, expected, what)
    tol = tol or {"atol": 1e-3, "rtol": 1e-3}

    def recon(usv):
        u, s_, v = usv
        return (u * s_.unsqueeze(-2).to(u.dtype)) @ v.mH

    a = (sample.input @ sample.args[0].mT).detach()
    if sample.kwargs.get("M") is not None:
        a = a - sample.kwargs["M"].detach()
    if op_name == "pca_lowrank" and sample.kwargs.get("center", True):
        a = a - a.mean(dim=-2, keepdim=True)
    norm = float(torch.linalg.matrix_norm(a).max()) or 1.0
    r_cpu = float(torch.linalg.matrix_norm(a - recon(expected)).max()) / norm
    r_tpu = float(torch.linalg.matrix_norm(a - recon(actual)).max()) / norm
    if r_cpu < 1e-3:
        # Exactly low rank: the factorization is determined up to rotations.
        _compare(actual[1], expected[1], tol, what + " singular values")
        _compare(recon(actual), recon(expected), tol, what + " reconstruction")
    elif r_tpu > 1.5 * r_cpu + 1e-3:
        # A rank-q approximation of a full-rank matrix: as good as CPU's.
        raise Outcome(f"mismatch ({what}): relative residual of the rank-q approximation "
                      f"{r_tpu:.3g}, CPU {r_cpu:.3g}")


def _cpu_run(fn, recorder=None):
    """Run `fn` on CPU; return (result, exception)."""
    try:
        if recorder is not None:
            with recorder:
                return fn(), None
        return fn(), None
    except Exception as e:  # noqa: BLE001  (the tpu must then raise the same type)
        return None, e


def _tpu_run(fn):
    try:
        return fn(), None
    except Outcome:
        raise
    except Exception as e:  # noqa: BLE001
        return None, _unwrap(e)


def classify_exception(e: BaseException) -> str:
    """A short cause for a tpu-side exception."""
    if isinstance(e, Outcome):
        return e.cause
    msg = str(e)
    m = re.search(r"The operator '([^']+)' is not implemented for the tpu device", msg)
    if m:
        return f"no lowering: {m.group(1)}"
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    # Strip addresses and long numbers so causes group.
    first = re.sub(r"0x[0-9a-f]+", "0x…", first)
    return f"error: {type(e).__name__}: {first[:200]}"


def _raise_mismatched_exceptions(cpu_exc, tpu_exc, what):
    if cpu_exc is not None and tpu_exc is None:
        raise Outcome(f"no error ({what}): CPU raises {type(cpu_exc).__name__}: "
                      f"{str(cpu_exc).splitlines()[0][:120] if str(cpu_exc) else ''}")
    if tpu_exc is not None and cpu_exc is None:
        raise tpu_exc
    if type(tpu_exc) is not type(cpu_exc):
        raise Outcome(f"error type ({what}): tpu raises {type(tpu_exc).__name__} "
                      f"({classify_exception(tpu_exc)}), CPU {type(cpu_exc).__name__}") from tpu_exc


RANDOM_DRAW_ELEMENTS = 2000
RANDOM_MAX_DRAWS = 40
RANDOM_MIN_DRAWS = 8  # enough to estimate the design effect


def _numel(x):
    return sum(v.numel() for v in pytree.tree_leaves(x) if isinstance(v, torch.Tensor))


# --------------------------------------------------------------------------
# expected failures of single samples (expectations.XFAIL_SAMPLES)


@functools.cache
def cpu_flags() -> frozenset:
    """This host's CPU feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def expected_failures(name: str, dtype_name: str, kind: str) -> dict:
    """{sample index: the start of its expected failure's cause} for the case
    on this run's path (expectations.XFAIL_SAMPLES, keyed by the case or by
    the case and a path); empty where none is listed, or where the entry's
    CPU flag (a host-dependent failure) is not on this host."""
    key = (name, dtype_name, kind)
    entry = expectations.XFAIL_SAMPLES.get(key, expectations.XFAIL_SAMPLES.get(key + (path(),)))
    if entry is None:
        return {}
    cause, indices, *flag = entry
    if flag and flag[0] not in cpu_flags():
        return {}
    return dict.fromkeys(indices, cause)


def _check_sample(expected: dict, i: int, stats: dict, check) -> None:
    """Run `check` (one sample's comparison). A sample listed in `expected`
    must fail with the listed cause: it is noted in stats["expected_failed"]
    and the run goes on; one that passes is noted in stats["expected_passed"],
    one that fails otherwise raises. Other samples raise on failure."""
    if i not in expected:
        check()
        return
    try:
        check()
    except Exception as e:  # noqa: BLE001 - classified; the wrong kind raises
        cause = classify_exception(e)
        if not cause.startswith(expected[i]):
            raise
        stats.setdefault("expected_failed", []).append(i)
    else:
        stats.setdefault("expected_passed", []).append(i)


def unexpected_outcome(name: str, dtype_name: str, kind: str, stats: dict) -> str | None:
    """Why a case whose samples raised nothing still fails, or None: a sample
    listed in expectations.XFAIL_SAMPLES passed, or no sample was compared at
    all (a test that compares nothing would pass for the wrong reason)."""
    if stats.get("expected_passed"):
        # "[XPASS(strict)]": the results file records the case as xpassed.
        return (f"[XPASS(strict)] samples {stats['expected_passed']} of {name} {dtype_name} "
                f"{kind} pass: remove them from expectations.XFAIL_SAMPLES (and the "
                "XFAILS entry with the last of them)")
    if not stats.get("samples") and not stats.get("expected_failed"):
        return (f"no samples compared: OpInfo gave {name} no sample input in {dtype_name} "
                f"for {kind} that this run selects (an expected one is an XFAILS entry "
                "whose reason starts with 'no samples')")
    return None


def expected_failure_reason(name: str, dtype_name: str, kind: str, stats: dict) -> str:
    """The xfail reason of a case whose listed samples failed as listed."""
    key = (name, dtype_name, kind)
    why = expectations.XFAILS.get(key) or expectations.PATH_XFAILS[key + (path(),)]
    return f"samples {stats['expected_failed']} (expectations.XFAIL_SAMPLES): {why}"


def run_forward(name, op, dtype_name, *, stats=None):
    """Run every sample of `op` in `dtype_name` on CPU and tpu and compare.

    Raises Outcome (or the tpu's exception) on the first failing sample,
    except the ones expectations.XFAIL_SAMPLES lists (see _check_sample).
    `stats` (a dict) receives counts: samples, random samples.
    """
    dtype = DTYPES[dtype_name]
    tol = tolerance(name, dtype_name, "forward")
    uninit = op.name in UNINITIALIZED
    stats = stats if stats is not None else {}
    stats.setdefault("samples", 0)
    stats.setdefault("random_samples", 0)
    expected = expected_failures(name, dtype_name, "forward")
    for i, sample in samples(op, dtype, False):
        _check_sample(expected, i, stats, functools.partial(
            _forward_sample, name, op, dtype, tol, uninit, i, sample, stats))


def _forward_sample(name, op, dtype, tol, uninit, i, sample, stats):
    """run_forward's check of sample `i` (raises Outcome or the tpu's error)."""
    what = f"forward sample {i}"
    # Copy first: the CPU run may mutate its inputs.
    t_inp, t_args, t_kwargs = sample_to_tpu(sample, op.name)
    exact_inputs = _upcast_exact(sample, dtype) if judged(dtype) else None
    rec = RandomRecorder()
    if dtype.is_complex:
        # PyTorch's CPU kernels can give wrong complex results under a
        # TorchDispatchMode (measured: linalg.pinv of a random 5x5
        # complex64 matrix is 4.9 off): the recorder only watches a run on
        # copies, and the reference is a plain run on the sample itself.
        ci, ca, ck = sample_clone(sample)
        torch.manual_seed(1234 + i)
        _cpu_run(lambda: _call(op, ci, ca, ck), rec)
        torch.manual_seed(1234 + i)
        expected, cpu_exc = _cpu_run(lambda: _call(op, sample.input, sample.args,
                                                   sample.kwargs))
    else:
        torch.manual_seed(1234 + i)
        expected, cpu_exc = _cpu_run(lambda: _call(op, sample.input, sample.args,
                                                   sample.kwargs), rec)
    actual, tpu_exc = _tpu_run(lambda: to_cpu(tpu_call(_call, op, t_inp, t_args, t_kwargs)))
    stats["samples"] += 1
    if cpu_exc is not None or tpu_exc is not None:
        _raise_mismatched_exceptions(cpu_exc, tpu_exc, what)
        return
    if uninit:
        _compare_meta(actual, expected, what)
        return
    if op.name in LOWRANK:
        stats["random_samples"] += 1
        _compare_lowrank(op.name, sample, actual, expected, tol, what)
        return
    if rec.random or name in RANDOM_OPS:
        stats["random_samples"] += 1
        draws = max(RANDOM_MIN_DRAWS, min(RANDOM_MAX_DRAWS, math.ceil(
            RANDOM_DRAW_ELEMENTS / max(_numel(expected), 1))))
        d_cpu, d_tpu = [expected], [actual]
        for _ in range(draws - 1):
            ci, ca, ck = sample_clone(sample)
            ti, ta, tk = sample_to_tpu(sample, op.name)
            d_cpu.append(_call(op, ci, ca, ck))
            d_tpu.append(to_cpu(tpu_call(_call, op, ti, ta, tk)))
        _compare_distribution(d_tpu, d_cpu, what)
        return
    exact = None
    try:
        compare(actual, expected, tol, what)
    except Outcome:
        if not (tie_equivalent(op.name, sample, actual, expected, tol)
                or well_defined_parts_equal(op.name, sample, actual, expected, tol, what)):
            exact = _exact_run(op, exact_inputs, i)
            if not no_less_accurate_than_cpu(op.name, actual, expected,
                                             exact and exact[0], dtype, tol):
                raise
    # In-place ops: the mutated inputs must agree too.
    inputs_tpu = _tensor_leaves(to_cpu((t_inp, t_args, t_kwargs)))
    inputs_cpu = _tensor_leaves((sample.input, tuple(sample.args), sample.kwargs))
    try:
        _compare(inputs_tpu, inputs_cpu, tol, what + " inputs after the call")
    except Outcome:
        exact = exact or _exact_run(op, exact_inputs, i)
        if not no_less_accurate_than_cpu(op.name, inputs_tpu, inputs_cpu,
                                         exact and _tensor_leaves(exact[1]), dtype, tol):
            raise


# --------------------------------------------------------------------------
# half precision and complex64: judged against a wider run, not only CPU
#
# CPU's bfloat16/float16 kernels differ in how they accumulate: some sum in
# the half type, some in float32, and which one a host takes depends on its
# CPU (oneDNN's paths on AVX-512 vs AVX2-only hosts, AVX512-FP16 kernels).
# The tpu accumulates in float32 and rounds once, as CUDA and XLA do.
# complex64 sums of products (matmuls, convolutions, powers) round
# differently from one host's kernels to another's as well. Where the tpu
# and CPU are further apart than the dtype's tolerance, the harness runs the
# sample in float64 / complex128 (the inputs upcast exactly) and passes it
# when, at every element, the tpu is no further from that result than CPU
# is, plus one tolerance. A wrong result still fails unless CPU is as wrong;
# by the triangle inequality the rule admits everything the plain
# comparison does.

# The judged dtype -> what its tensors (and a complex sample's float32 ones) become.
JUDGED_DTYPES = {torch.bfloat16: {torch.bfloat16: torch.float64},
                 torch.float16: {torch.float16: torch.float64},
                 torch.complex64: {torch.complex64: torch.complex128,
                                   torch.float32: torch.float64}}

# A compiled graph is one XLA program: XLA fuses across ops and contracts
# a * b + c into fused multiply-adds, so its float32 results round
# differently from CPU's op-by-op kernels (atanh's gradient g / (1 - x*x) near
# |x| = 1: CPU 7.5e-5 from float64, the compiled graph 9.5e-8). On the
# compiled path float32 is judged against float64 too; eager and fused
# float32 stay held to CPU's own results.
_COMPILED_JUDGED = {torch.float32: {torch.float32: torch.float64}}


def judged(dtype):
    """The dtype -> wider dtype map whose float64 run judges `dtype`'s
    results on this run's path (JUDGED_DTYPES), or None: CPU alone judges."""
    if dtype in JUDGED_DTYPES:
        return JUDGED_DTYPES[dtype]
    if path() == "compiled":
        return _COMPILED_JUDGED.get(dtype)
    return None


# Ops whose result is defined by the dtype's precision, so a float64 run is
# not the exact answer of the half-precision one (nextafter steps one ulp of
# its own dtype).
_PRECISION_DEFINED = {"nextafter"}


def _upcast_exact(sample, dtype, differentiable=False):
    """(input, args, kwargs) of `sample`, its `dtype` tensors as exact wider
    copies (judged(dtype); taken before the CPU run, which may mutate the
    sample), requiring grad where the sample's do if `differentiable`; None
    where a leaf cannot be copied that way."""
    wider = judged(dtype)

    def up(x):
        if not isinstance(x, torch.Tensor):
            return x
        y = x.detach().to(wider[x.dtype]) if x.dtype in wider else x.detach().clone()
        return y.requires_grad_(x.requires_grad) if differentiable else y
    try:
        return pytree.tree_map(up, (sample.input, tuple(sample.args), dict(sample.kwargs)))
    except Exception:  # noqa: BLE001  (an exotic leaf: the plain comparison alone judges)
        return None


def _exact_run(op, exact_inputs, i):
    """(result, inputs after the call) of `op` on the wider inputs, or None."""
    if exact_inputs is None:
        return None
    inp, args, kwargs = exact_inputs
    torch.manual_seed(1234 + i)
    out, exc = _cpu_run(lambda: _call(op, inp, args, kwargs))
    if exc is not None:
        return None
    return out, (inp, args, kwargs)


def no_less_accurate_than_cpu(op_name, actual, expected, exact, dtype, tol) -> bool:
    """Every element of `actual` (tpu) is as close to `exact` as `expected` (CPU).

    |tpu - exact| <= |cpu - exact| + atol + rtol * |exact| wherever CPU's
    result is finite and the float64 one too; elsewhere (overflow to inf,
    NaN) the tpu must equal CPU exactly, and non-floating outputs must
    match exactly.
    """
    if exact is None or not judged(dtype) or op_name in _PRECISION_DEFINED:
        return False
    la, le, lx = (pytree.tree_leaves(v) for v in (actual, expected, exact))
    if not (len(la) == len(le) == len(lx)):
        return False
    default_rtol, default_atol = default_tolerances(dtype)
    atol, rtol = tol.get("atol", default_atol), tol.get("rtol", default_rtol)
    for a, e, x in zip(la, le, lx):
        if not isinstance(e, torch.Tensor):
            if a != e:
                return False
            continue
        if not (isinstance(a, torch.Tensor) and isinstance(x, torch.Tensor)
                and a.shape == e.shape == x.shape and a.dtype == e.dtype):
            return False
        if not (e.is_floating_point() or e.is_complex()):
            if not _exactly_equal(a, e):
                return False
            continue
        wide = torch.complex128 if e.is_complex() or x.is_complex() else torch.float64
        a64, e64, x64 = a.to(wide), e.to(wide), x.to(wide)
        finite = torch.isfinite(e64) & torch.isfinite(x64)
        if not _exactly_equal(a64[~finite], e64[~finite]):
            return False
        err_tpu = (a64 - x64).abs()[finite]
        bound = ((e64 - x64).abs() + atol + rtol * x64.abs())[finite]
        if not bool((err_tpu <= bound).all()):
            return False
    return True


# Ops whose raw outputs are not unique (eigenvector signs/phases, singular
# vectors); their OpInfo samples carry an output_process_fn_grad keeping the
# well-defined part (over the samples, every output is covered).
NONUNIQUE_OPS = {"linalg.eigh", "linalg.eig", "linalg.svd", "svd"}


def well_defined_parts_equal(op_name, sample, actual, expected, tol, what):
    """Compare what the sample's output_process_fn_grad keeps.

    OpInfo gives samples whose raw outputs are not unique (eigenvectors up
    to sign or phase, U/V of an SVD) a function keeping the well-defined
    part (e.g. |eigenvectors|, U @ V^H); PyTorch's gradient tests compare
    that, and so does the harness when raw outputs differ.
    """
    fn = sample.output_process_fn_grad
    if fn is None or op_name not in NONUNIQUE_OPS:
        return False
    try:
        pa, pe = fn(actual), fn(expected)
    except Exception:  # noqa: BLE001
        return False
    if pa is actual and pe is expected:
        return False  # the identity: nothing more to compare
    try:
        compare(pa, pe, tol, what + " (well-defined part)")
    except Outcome:
        return False
    return True


# Ops whose index outputs are unspecified among equal values (ties): sort and
# argsort unless stable=True, topk, kthvalue, mode. Different indices pass
# when they select the same values as CPU's (and, for sort, are a
# permutation).
TIE_OPS = {"sort", "argsort", "topk", "kthvalue", "mode"}


def _exactly_equal(a, b):
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return True
    except (AssertionError, TypeError):
        return False


def tie_equivalent(op_name, sample, actual, expected, tol):
    if op_name not in TIE_OPS or sample.kwargs.get("stable"):
        return False
    if op_name in ("sort", "argsort") and len(sample.args) >= 3 and sample.args[2]:
        return False  # sort(input, dim, descending, stable=True) positionally
    inp = sample.input
    if not isinstance(inp, torch.Tensor):
        return False
    if op_name == "argsort":
        vals_a, idx_a, idx_e, vals_e = None, actual, expected, None
    else:
        if not (isinstance(actual, (tuple, list)) and len(actual) == 2):
            return False
        vals_a, idx_a = actual
        vals_e, idx_e = expected
        try:
            compare(vals_a, vals_e, tol, "values")
        except Outcome:
            return False
    if not (isinstance(idx_a, torch.Tensor) and idx_a.shape == idx_e.shape
            and idx_a.dtype == idx_e.dtype):
        return False
    if inp.dim() == 0:
        return _exactly_equal(idx_a, idx_e)
    for d in range(inp.dim()):
        ia, ie = idx_a, idx_e
        if ia.dim() < inp.dim():
            ia, ie = ia.unsqueeze(d), ie.unsqueeze(d)
        try:
            ga = torch.take_along_dim(inp.detach(), ia, d)
            ge = torch.take_along_dim(inp.detach(), ie, d)
        except (RuntimeError, IndexError):
            continue
        if not _exactly_equal(ga, ge):
            continue
        if vals_e is not None and not _exactly_equal(ge.reshape(vals_e.shape), vals_e):
            continue
        if op_name in ("sort", "argsort"):
            perm = torch.sort(ia, dim=d).values
            ref = torch.arange(inp.shape[d]).view([-1 if i == d else 1 for i in range(inp.dim())])
            if not _exactly_equal(perm, ref.expand_as(perm)):
                continue
        return True
    return False


def _tensor_leaves(x):
    return [v for v in pytree.tree_leaves(x) if isinstance(v, torch.Tensor)]


def sample_clone(sample):
    def f(x):
        if isinstance(x, torch.Tensor):
            return x.detach().clone().requires_grad_(x.requires_grad)
        return x
    return (pytree.tree_map(f, sample.input), pytree.tree_map(f, tuple(sample.args)),
            {k: pytree.tree_map(f, v) for k, v in sample.kwargs.items()})


def _diff_outputs(out):
    return [t for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.dtype.is_floating_point or t.dtype.is_complex)]


def _grad_inputs(inp, args, kwargs):
    return [t for t in pytree.tree_leaves((inp, args, kwargs))
            if isinstance(t, torch.Tensor) and t.requires_grad]


def run_grad(name, op, dtype_name, *, stats=None):
    """Input gradients of `op` (a random cotangent per output) on CPU vs tpu."""
    dtype = DTYPES[dtype_name]
    tol = tolerance(name, dtype_name, "grad")
    stats = stats if stats is not None else {}
    stats.setdefault("samples", 0)
    stats.setdefault("random_samples", 0)
    fn = op.get_op()

    def call(inp, args, kwargs):
        out = op.gradcheck_wrapper(fn, inp, *args, **kwargs)
        return out

    expected = expected_failures(name, dtype_name, "grad")
    for i, sample in samples(op, dtype, True):
        _check_sample(expected, i, stats, functools.partial(
            _grad_sample, name, op, dtype, tol, call, i, sample, stats))


def _grad_sample(name, op, dtype, tol, call, i, sample, stats):
    """run_grad's check of sample `i` (raises Outcome or the tpu's error)."""
    what = f"grad sample {i}"
    t_inp, t_args, t_kwargs = sample_to_tpu(sample, op.name)
    rec = RandomRecorder()
    torch.manual_seed(1234 + i)

    def cpu_side():
        with rec:  # only the op: the cotangents below are random too
            out = call(sample.input, sample.args, sample.kwargs)
        out = sample.output_process_fn_grad(out)
        outs = _diff_outputs(out)
        ins = _grad_inputs(sample.input, sample.args, sample.kwargs)
        if not outs or not ins:
            return None
        g = torch.Generator().manual_seed(4321 + i)
        cots = [torch.randn(o.shape, dtype=o.dtype, generator=g) for o in outs]
        grads = torch.autograd.grad(outs, ins, cots, allow_unused=True)
        return cots, grads

    res, cpu_exc = _cpu_run(cpu_side)
    if cpu_exc is None and res is None:
        return  # nothing differentiable in this sample
    stats["samples"] += 1

    def tpu_side():
        # fused: the forward and the backward recorded in one block;
        # compiled: the forward compiled (its backward graph with it).
        fwd = tpu_call if path() == "compiled" else (lambda f, *a: f(*a))
        fallbacks = _graph_counts()[1] if path() == "compiled" else 0
        with torch_tpu.fused() if path() == "fused" else contextlib.nullcontext():
            out = sample.output_process_fn_grad(fwd(call, t_inp, t_args, t_kwargs))
            outs = _diff_outputs(out)
            ins = _grad_inputs(t_inp, t_args, t_kwargs)
            if len(outs) != len(res[0]):
                raise Outcome(f"mismatch ({what}): {len(outs)} differentiable outputs, "
                              f"CPU has {len(res[0])}")
            cots = [c.to(o.device) for c, o in zip(res[0], outs)]
            grads = torch.autograd.grad(outs, ins, cots, allow_unused=True)
        if path() == "compiled" and _graph_counts()[1] != fallbacks:
            raise Outcome("not compiled: the backward graph ran op by op")
        return to_cpu(grads)

    actual, tpu_exc = _tpu_run(tpu_side)
    if cpu_exc is not None or tpu_exc is not None:
        _raise_mismatched_exceptions(cpu_exc, tpu_exc, what)
        return
    expected = res[1]
    if rec.random or name in RANDOM_OPS:
        stats["random_samples"] += 1
        _compare_meta(actual, expected, what)
        return
    try:
        _compare(actual, expected, tol, what)
    except Outcome:
        exact = _exact_grads(call, sample, dtype, res[0], i) if judged(dtype) else None
        if not no_less_accurate_than_cpu(op.name, actual, expected, exact, dtype, tol):
            raise


def _exact_grads(call, sample, dtype, cots, i):
    """The input gradients of `sample` computed in the wider dtype (judged),
    for the same cotangents `cots` widened; None where that cannot be done."""
    wider = judged(dtype)
    exact_inputs = _upcast_exact(sample, dtype, differentiable=True)
    if exact_inputs is None:
        return None
    inp, args, kwargs = exact_inputs

    def run():
        torch.manual_seed(1234 + i)
        outs = _diff_outputs(sample.output_process_fn_grad(call(inp, args, kwargs)))
        ins = _grad_inputs(inp, args, kwargs)
        if len(outs) != len(cots) or not ins:
            return None
        wide = [c.to(wider.get(c.dtype, c.dtype)) for c in cots]
        return torch.autograd.grad(outs, ins, wide, allow_unused=True)

    out, exc = _cpu_run(run)
    return None if exc is not None else out


def run_case(name, op, dtype_name, kind, stats=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "forward":
            run_forward(name, op, dtype_name, stats=stats)
        else:
            run_grad(name, op, dtype_name, stats=stats)


# --------------------------------------------------------------------------
# which paths ran


def metrics_snapshot():
    from torch_tpu.debug import metrics
    from torch_tpu.runtime import executor

    return (dict(metrics.COUNTERS), dict(metrics.FALLBACKS), dict(executor.STATS.per_op))


def metrics_delta(before):
    """ATen ops that ran decomposed / on the CPU / natively since `before`."""
    c0, f0, n0 = before
    c1, f1, n1 = metrics_snapshot()
    dec = sorted(k[len("decomposed."):] for k, v in c1.items()
                 if k.startswith("decomposed.") and v != c0.get(k, 0))
    fb = sorted(k for k, v in f1.items() if v != f0.get(k, 0))
    nat = sorted(k for k, v in n1.items() if v != n0.get(k, 0))
    return {"decomposed": dec, "fallback": fb, "native": nat}


def format_failure(e: BaseException, limit: int = 40) -> str:
    """The exception's message and a short traceback, as text."""
    import traceback

    if isinstance(e, Outcome):
        return e.detail[:4000]
    lines = traceback.format_exception(type(e), e, e.__traceback__)
    text = "".join(lines).splitlines()
    if len(text) > limit:
        text = ["..."] + text[-limit:]
    return "\n".join(text)
