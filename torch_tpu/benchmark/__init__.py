"""Sync-aware timing of PyTorch code on the `tpu` device.

    res = torch_tpu.benchmark.benchmark(model, x, warmup=3, iters=20)
    print(res)               # median / min / p90, first call, compile time, FLOP/s, MFU
    res.median               # seconds per call in steady state
    res.compile_seconds      # wall time spent compiling during warm-up
    res.plot()               # per-iteration times (matplotlib, from the `guide` extra)

Why "sync-aware": ops dispatch asynchronously, so timing a call without
waiting measures only how fast the host enqueues work. Each timed call here
ends by waiting for its result (sync="outputs": the tpu tensors it returned;
sync="device": everything on the device; "auto": outputs when the call
returns tpu tensors, else the device). When the call's outputs are ready
before all of its work (an optimizer step after the loss), the leftover work
delays the next call, so the median over iterations still measures the
steady-state step time.

The first call is timed on its own (it includes tracing and compiling every
program that is not cached yet); compile seconds are the wall time during
which the executor had a compile in flight (compiles run in parallel on
background threads: their own seconds summed can exceed the elapsed time),
within the first call (`first_call_compile_seconds`, at most the first
call's time) and within the whole warm-up (`compile_seconds`, at most
`warmup_seconds`: a compile can finish after the first call returns).
Timed iterations that compile again are counted in `recompiles` (a shape
or dtype that changes between calls).

FLOPs: flops="auto" lowers the callable once into a single XLA program
(torch_tpu.debug.lower: one more call of `fn`, with fake tensors, after the
timed ones) and takes XLA's cost analysis, so `flops_per_second` is the
achieved rate; pass a number to use your own count, None to skip. The count
covers what the lowering table lowers; ops that would run on the CPU are
not counted.

MFU (model FLOPs utilisation): the achieved FLOP/s as a fraction of this
device's peak FLOP/s, measured once per kind of host by a few matmuls and
cached (torch_tpu.debug.roofline.host_peaks); a benchmark faster than that
peak (FLOPs counted by XLA) raises it, so MFU against it is at most 100 %
(a count you pass as `flops=` is yours, not checked); peaks="v6e" (or
another published device, or a Peaks) divides by that device's peak
instead, None skips it.
`torch_tpu.debug.roofline(fn, *args)` breaks a step into its programs.

`python -m torch_tpu.benchmark` runs registered models and scripts; see
`torch_tpu.benchmark.__main__` and `register_model`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings

import torch

from .._compat.torch_api import pytree
from ..debug.timing import block
from ..runtime import executor
from ..debug import lower
from ..debug.roofline import PUBLISHED, host_peaks, raise_host_peak, reference_peaks

__all__ = ["benchmark", "BenchmarkResult", "BenchmarkCase", "register_model", "models",
           "get_case", "format_table"]


# --------------------------------------------------------------------------
# the result


def _percentile(sorted_times, q):
    if not sorted_times:
        return math.nan
    k = (len(sorted_times) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return sorted_times[lo]
    return sorted_times[lo] + (sorted_times[hi] - sorted_times[lo]) * (k - lo)


@dataclasses.dataclass
class BenchmarkResult:
    """Timings of one benchmark (all times in seconds)."""

    name: str
    times: list                  # steady-state seconds of each timed call
    warmup: int
    first_call_seconds: float    # the first call: tracing + compiling + running
    # Wall seconds of the warm-up during which an XLA compile (or a load from
    # the disk cache) was in flight: parallel compiles count once, so it is at
    # most warmup_seconds.
    compile_seconds: float
    compiles: int                # programs compiled during warm-up
    recompiles: int              # programs compiled during the timed calls
    flops: float | None = None   # floating point operations per call
    sync: str = "auto"
    device: str = ""
    peak_flops_per_second: float | None = None  # the peak MFU is measured against
    peak_name: str = ""
    peak_source: str = ""        # "measured on this host", "published", or the Peaks' own
    # The same wall-clock count within the first call alone (<= first_call_seconds).
    first_call_compile_seconds: float = 0.0
    warmup_seconds: float = 0.0  # wall seconds of all the warm-up calls, the first included

    @property
    def iters(self) -> int:
        return len(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times) if self.times else math.nan

    @property
    def min(self) -> float:
        return min(self.times) if self.times else math.nan

    @property
    def max(self) -> float:
        return max(self.times) if self.times else math.nan

    @property
    def p90(self) -> float:
        return _percentile(sorted(self.times), 0.9)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    @property
    def flops_per_second(self) -> float | None:
        """Achieved FLOP/s at the median step time (None without a FLOP count)."""
        if not self.flops or not self.times or self.median <= 0:
            return None
        return self.flops / self.median

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: achieved FLOP/s over the peak (None without both)."""
        fps = self.flops_per_second
        if not fps or not self.peak_flops_per_second:
            return None
        return fps / self.peak_flops_per_second

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(median=self.median, mean=self.mean, min=self.min, max=self.max, p90=self.p90,
                 stdev=self.stdev, iters=self.iters, flops_per_second=self.flops_per_second,
                 mfu=self.mfu)
        return d

    def summary(self) -> str:
        parts = [f"{self.name}: median {_ms(self.median)}, min {_ms(self.min)}, "
                 f"p90 {_ms(self.p90)} over {self.iters} iters",
                 f"first call {_ms(self.first_call_seconds)} (compiling "
                 f"{_ms(self.first_call_compile_seconds)} of it)",
                 f"warm-up {self.warmup} calls {_ms(self.warmup_seconds)} (compiling "
                 f"{_ms(self.compile_seconds)} of it, {self.compiles} program"
                 f"{'s' if self.compiles != 1 else ''})"]
        if self.recompiles:
            parts.append(f"{self.recompiles} recompiles during timing")
        if self.flops_per_second:
            parts.append(f"{self.flops / 1e9:.3f} GFLOP/call, "
                         f"{self.flops_per_second / 1e9:.2f} GFLOP/s")
        if self.mfu is not None:
            parts.append(f"MFU {_pct(self.mfu)} of {self.peak_name or 'peak'} "
                         f"({self.peak_source or 'given'}: "
                         f"{self.peak_flops_per_second / 1e9:.4g} GFLOP/s)")
        return "; ".join(parts)

    __str__ = summary

    def plot(self, ax=None, kind: str = "timeline"):
        """Plot the timed calls: kind='timeline' (ms per iteration) or 'hist'.

        Returns the matplotlib Axes. Needs matplotlib (`pip install torch_tpu[guide]`).
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("BenchmarkResult.plot needs matplotlib: "
                              "pip install 'torch_tpu[guide]'") from e
        if kind not in ("timeline", "hist"):
            raise ValueError(f"unknown plot kind {kind!r}; valid: 'timeline', 'hist'")
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3))
        ms = [t * 1e3 for t in self.times]
        if kind == "timeline":
            ax.plot(range(1, len(ms) + 1), ms, marker="o", ms=3, label=self.name)
            ax.axhline(self.median * 1e3, ls="--", lw=1, color="gray",
                       label=f"median {self.median * 1e3:.3f} ms")
            ax.set_xlabel("iteration")
            ax.set_ylabel("ms")
        else:
            ax.hist(ms, bins=min(30, max(5, len(ms) // 2)), label=self.name)
            ax.set_xlabel("ms")
            ax.set_ylabel("iterations")
        ax.set_title(self.name)
        ax.legend(loc="best", fontsize="small")
        return ax

    def _repr_html_(self):
        return "<pre>" + self.summary() + "</pre>"


def _pct(x):
    return f"{x * 100:.3g}%"


def _ms(s):
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


# --------------------------------------------------------------------------
# timing


def _tpu_tensors(tree):
    return [x for x in pytree.tree_leaves(tree)
            if isinstance(x, torch.Tensor) and x.device.type == "tpu"]


def _wait(out, sync):
    if sync in (None, False, "none"):
        return
    ts = _tpu_tensors(out) if sync in ("auto", "outputs") else []
    if ts:
        block(ts)
    elif sync in ("auto", "device"):
        torch.tpu.synchronize()


def _compile_stats():
    return executor.STATS.misses, executor.STATS.compile_wall_seconds


def _auto_flops(fn, args, kwargs):
    try:
        return lower(fn, *args, **kwargs).flops or None
    except Exception as e:
        warnings.warn(f"benchmark: could not count FLOPs ({type(e).__name__}: {e}); "
                      "pass flops=<number> to set them", stacklevel=3)
        return None


_SYNC = ("auto", "outputs", "device", "none", None, False)


def _peak(peaks, achieved=None, what=""):
    """(peak FLOP/s, name, where it comes from) for benchmark's `peaks` argument,
    or (None, '', ''). `achieved`: a rate XLA counted for this benchmark, which
    raises this host's measured peak when it is faster (MFU <= 100 %)."""
    if peaks is None:
        return None, "", ""
    if not (isinstance(peaks, str) and peaks == "host"):
        p = reference_peaks(peaks)  # an unknown name raises, naming the known ones
        return p.flops_per_second, p.name, "published" if p in PUBLISHED.values() else p.source
    try:
        p = raise_host_peak(achieved, what) if achieved else host_peaks()
    except Exception as e:
        warnings.warn(f"benchmark: could not measure this device's peak FLOP/s "
                      f"({type(e).__name__}: {e}); MFU is not reported", stacklevel=3)
        return None, "", ""
    return p.flops_per_second, "this host's peak", "measured on this host"


def benchmark(fn, *args, warmup: int = 3, iters: int = 20, flops="auto", sync="auto",
              name: str | None = None, progress=None, peaks="host", **kwargs) -> BenchmarkResult:
    """Time `fn(*args, **kwargs)`: warm-up calls, then `iters` timed calls.

    flops: 'auto' (XLA cost analysis of fn as one program), a number, or None.
    sync: 'auto', 'outputs', 'device' or 'none' (see the module docstring).
    peaks: what MFU divides by: 'host' (this device, measured once per host),
    a published device ('v6e', 'h100', ...), a Peaks, or None (no MFU).
    progress: optional callable(phase, i, n, seconds) called after each call,
    phase being 'warmup' or 'timed'.
    """
    if not callable(fn):
        raise ValueError(f"benchmark() takes a callable, got {type(fn).__name__}")
    if sync not in _SYNC:
        raise ValueError(f"unknown sync mode {sync!r}; valid: 'auto', 'outputs', 'device', 'none'")
    if warmup < 1:
        raise ValueError("warmup must be >= 1 (the first call compiles and is timed apart)")
    if iters < 1:
        raise ValueError("iters must be >= 1")
    name = name or getattr(fn, "__name__", None) or type(fn).__name__
    if torch.tpu.is_available():
        torch.tpu.synchronize()
    misses0, secs0 = _compile_stats()
    t0 = t_start = time.perf_counter()
    out = fn(*args, **kwargs)
    _wait(out, sync)
    first = time.perf_counter() - t0
    _, secs_first = _compile_stats()
    if progress:
        progress("warmup", 1, warmup, first)
    for i in range(1, warmup):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        _wait(out, sync)
        if progress:
            progress("warmup", i + 1, warmup, time.perf_counter() - t0)
    misses1, secs1 = _compile_stats()
    warmup_seconds = time.perf_counter() - t_start
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        _wait(out, sync)
        dt = time.perf_counter() - t0
        times.append(dt)
        if progress:
            progress("timed", i + 1, iters, dt)
    misses2, _ = _compile_stats()
    del out
    counted = flops == "auto"  # XLA's count: a rate above the measured peak raises it
    if flops == "auto":
        flops = _auto_flops(fn, args, kwargs)
    elif flops is not None:
        flops = float(flops)
    device = ""
    try:
        device = torch.tpu.get_device_name()
    except Exception:
        pass
    achieved = flops / statistics.median(times) if counted and flops else None
    peak, peak_name, peak_source = (_peak(peaks, achieved, f"benchmark {name!r}") if flops
                                    else (None, "", ""))
    recompiles = misses2 - misses1
    if recompiles:
        warnings.warn(f"benchmark {name!r}: {recompiles} programs were compiled during the "
                      "timed calls (input shapes or dtypes change between calls?)", stacklevel=2)
    return BenchmarkResult(name=name, times=times, warmup=warmup, first_call_seconds=first,
                           compile_seconds=secs1 - secs0, compiles=misses1 - misses0,
                           recompiles=recompiles, flops=flops,
                           sync=str(sync), device=device, peak_flops_per_second=peak,
                           peak_name=peak_name, peak_source=peak_source,
                           first_call_compile_seconds=secs_first - secs0,
                           warmup_seconds=warmup_seconds)


def format_table(results) -> str:
    """A text table of BenchmarkResults."""
    head = ("benchmark", "median", "min", "p90", "first call", "of it compiling", "GFLOP/s",
            "MFU")
    rows = []
    for r in results:
        fps = r.flops_per_second
        rows.append((r.name, _ms(r.median), _ms(r.min), _ms(r.p90), _ms(r.first_call_seconds),
                     _ms(r.first_call_compile_seconds), f"{fps / 1e9:.2f}" if fps else "-",
                     _pct(r.mfu) if r.mfu is not None else "-"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


from .models import BenchmarkCase, get_case, models, register_model  # noqa: E402,F401
