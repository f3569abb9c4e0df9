"""Roofline of XLA programs: how far each program is from this device's roofs, and another's.

    rep = torch_tpu.debug.roofline(step)          # a callable over tpu tensors
    rep = torch_tpu.debug.roofline(prog)          # a Program (debug.lower, last_graphs())
    print(rep)                                    # first line: the summary
    rep.rows[0].intensity, rep.mfu, rep.plot()

Why: a step time alone does not say whether a program is slow because it
does too much arithmetic or because it moves too many bytes, nor what it
would do on a chip you do not have. The roofline model answers both from
two numbers per program and two per device: XLA's own count of FLOPs and
bytes accessed (`Program.cost`, the one cost analysis of debug.hlo) against
peak FLOP/s and memory bandwidth. A program whose arithmetic intensity
(FLOPs per byte) is below a device's ridge point (peak FLOP/s / bandwidth)
is memory-bound there, above it compute-bound; that depends only on the
program and the device, so a CPU user can read "on a v6e this program would
be memory-bound" without a TPU.

Each program is timed by running its own compiled executable on inputs of
its shapes (ones; a dense program's time does not depend on the values):
the median of `repeats` runs, each waited for. So FLOP/s and bytes/s are
exactly cost / measured seconds of the same executable. A callable's
programs are those it compiled on its first call here (compile log events);
when it compiled nothing (all cached), the whole call is lowered into one
program (`debug.lower`, what fused mode or compile_step would run).

This device's peaks are measured once per kind of host (device kind, CPU
model, feature flags, CPU count), by a few matmuls in float32 and bfloat16
and a large elementwise copy, the best of several runs each, and kept in
`<cache dir>/roofline/peaks.json` (`host_peaks(remeasure=True)` measures
again). A program measured faster than that peak raises it, so the MFU
printed against it is at most 100 %. The published peaks of TPU
v4, v5e, v5p, v6e, v7 (Ironwood) and NVIDIA H100/H200 are in `PUBLISHED`,
each with its source; docs/benchmarks.md ("Roofline") cites them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import hashlib
import os
import statistics
import threading
import time
from .. import cache
from ..cache import store
from ..cache.trust import TrustedDir
from ..runtime import platform, programs
from .hlo import Program
from . import _events
from .timing import block
from .hlo import lower

__all__ = ["roofline", "RooflineReport", "RooflineRow", "Peaks", "PUBLISHED", "host_peaks",
           "raise_host_peak", "reference_peaks"]


# --------------------------------------------------------------------------
# peaks


@dataclasses.dataclass(frozen=True)
class Peaks:
    """A device's two roofs: peak FLOP/s and memory bytes/s."""

    name: str
    flops_per_second: float
    bytes_per_second: float
    dtype: str = "bfloat16"
    source: str = ""

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two roofs meet."""
        return self.flops_per_second / self.bytes_per_second

    def bound(self, intensity: float) -> str:
        """'compute' or 'memory': the roof that limits a program of this intensity."""
        return "compute" if intensity >= self.ridge else "memory"

    def attainable(self, intensity: float) -> float:
        """The roofline: the most FLOP/s a program of this intensity can reach."""
        if math.isinf(intensity):
            return self.flops_per_second
        return min(self.flops_per_second, intensity * self.bytes_per_second)

    def seconds(self, flops: float, bytes_accessed: float) -> float:
        """The least time the roofs allow for this much work (one program)."""
        return max(flops / self.flops_per_second, bytes_accessed / self.bytes_per_second)


_TB = 1e12
_GB = 1e9

# Published per-chip peaks: dense bf16 FLOP/s and HBM bandwidth.
PUBLISHED: dict[str, Peaks] = {
    # https://cloud.google.com/tpu/docs/v4 : 275 teraflops (bf16 or int8), HBM2 32 GiB, 1200 GBps
    "v4": Peaks("TPU v4", 275 * _TB, 1200 * _GB, source="https://cloud.google.com/tpu/docs/v4"),
    # https://cloud.google.com/tpu/docs/v5e : 197 TFLOPs (bf16), HBM2 16 GB, 819 GBps
    "v5e": Peaks("TPU v5e", 197 * _TB, 819 * _GB, source="https://cloud.google.com/tpu/docs/v5e"),
    # https://cloud.google.com/tpu/docs/v5p : 459 TFLOPs (bf16), HBM2e 95 GB, 2765 GBps
    "v5p": Peaks("TPU v5p", 459 * _TB, 2765 * _GB, source="https://cloud.google.com/tpu/docs/v5p"),
    # https://cloud.google.com/tpu/docs/v6e : 918 TFLOPs (bf16), 32 GB, 1638 GBps
    "v6e": Peaks("TPU v6e", 918 * _TB, 1638 * _GB, source="https://cloud.google.com/tpu/docs/v6e"),
    # https://cloud.google.com/tpu/docs/tpu7x : 2307 TFLOPs (BF16), 192 GiB, 7380 GBps
    "v7": Peaks("TPU7x (Ironwood)", 2307 * _TB, 7380 * _GB,
                source="https://cloud.google.com/tpu/docs/tpu7x"),
    # https://www.nvidia.com/en-us/data-center/h100/ : H100 SXM, BF16 Tensor Core 1,979
    # TFLOPS with sparsity (989.5 dense), 3.35 TB/s
    "h100": Peaks("NVIDIA H100 SXM", 989.5 * _TB, 3350 * _GB,
                  source="https://www.nvidia.com/en-us/data-center/h100/"),
    # https://www.nvidia.com/en-us/data-center/h200/ : H200 SXM, BF16 Tensor Core 1,979
    # TFLOPS with sparsity (989.5 dense), 4.8 TB/s
    "h200": Peaks("NVIDIA H200 SXM", 989.5 * _TB, 4800 * _GB,
                  source="https://www.nvidia.com/en-us/data-center/h200/"),
}

_ALIASES = {"tpu v4": "v4", "tpu v5e": "v5e", "v5 lite": "v5e", "v5litepod": "v5e",
            "tpu v5p": "v5p", "tpu v6e": "v6e", "trillium": "v6e", "v6 lite": "v6e",
            "tpu7x": "v7", "tpu v7": "v7", "v7x": "v7", "ironwood": "v7",
            "nvidia h100": "h100", "h100 sxm": "h100", "nvidia h200": "h200", "h200 sxm": "h200"}


def reference_peaks(device) -> Peaks:
    """The published peaks of `device` ('v4', 'v5e', 'v5p', 'v6e', 'v7', 'h100',
    'h200', or an alias such as 'TPU v6e', 'Trillium', 'Ironwood'), or a Peaks."""
    if isinstance(device, Peaks):
        return device
    key = str(device).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PUBLISHED:
        raise ValueError(f"no published peaks for {device!r}; known: {', '.join(PUBLISHED)} "
                         "(or pass a torch_tpu.debug.roofline.Peaks)")
    return PUBLISHED[key]


# <cache dir>/roofline/peaks.json: one entry per kind of host, read and
# written through the cache's trust checks (a directory and file only this
# user may change; cache.trust), so a peak is never another user's number.
_PEAKS_TIER = "roofline"
_PEAKS_FILE = "peaks.json"
_host_memo: dict = {}
_host_lock = threading.Lock()


def _cpu_identity() -> tuple[str, str]:
    """(model name, feature flags) of this host's CPU: /proc/cpuinfo where there is one."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "model name" and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if model and flags:
                    break
    except OSError:
        pass
    import platform as host_platform

    return model or host_platform.processor() or host_platform.machine(), flags


def _cpus() -> int:
    """The CPUs this process may run on (what XLA:CPU's thread pool gets)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _host_key() -> str:
    """What the peaks depend on: the device kind and platform, the CPU model, its
    feature flags (AVX2, AVX-512, AMX, ... change a dot's speed) and the CPU count."""
    dev = platform.jax_device(0)
    model, flags = _cpu_identity()
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{platform.platform()}|{dev.device_kind}|{model}|flags {digest}|{_cpus()} cpus"


def _peaks_dir(create: bool):
    """The checked directory that holds the peaks file (None when the cache is off or
    the directory is refused: the peaks are then measured once per process)."""
    try:
        root = cache.cache_dir()
    except Exception:  # noqa: BLE001 - no cache configured yet
        root = None
    root = root or store.configured_dir()
    if not root:
        return None
    d, _ = TrustedDir.open(root, _PEAKS_TIER, create=create)
    return d


def _read_entries(d) -> dict:
    if d is None:
        return {}
    blob, _ = d.read(_PEAKS_FILE)
    try:
        data = json.loads(blob) if blob else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _store_entry(key: str, peaks: Peaks) -> None:
    """Write this host's entry (other hosts' entries kept)."""
    try:
        d = _peaks_dir(create=True)
        if d is None:
            return
        data = _read_entries(d)
        data[key] = dict(dataclasses.asdict(peaks), measured_at=time.time())
        d.write(_PEAKS_FILE, json.dumps(data, indent=1, sort_keys=True).encode())
    except OSError:
        pass  # a read-only cache: the peaks are measured again next process


def _entry_peaks(entry) -> Peaks | None:
    if not isinstance(entry, dict):
        return None
    try:
        return Peaks(name=str(entry["name"]), flops_per_second=float(entry["flops_per_second"]),
                     bytes_per_second=float(entry["bytes_per_second"]),
                     dtype=str(entry.get("dtype", "")), source=str(entry.get("source", "")))
    except (KeyError, TypeError, ValueError):
        return None


def host_peaks(remeasure: bool = False) -> Peaks:
    """This device's measured peaks (tpu:0), cached per kind of host in the cache directory.

    Measured once by a few matmuls (float32 and bfloat16: the fastest is the
    peak FLOP/s) and an elementwise copy (bytes/s), each the best of several
    runs and counted by XLA's cost analysis. The key is the device kind, the
    CPU model, its feature flags and the CPU count, so a cache directory
    shared between hosts never gives one host another's peak.
    remeasure=True measures again and rewrites the entry. A rate measured
    later above the peak raises it (`raise_host_peak`): MFU against this
    peak is at most 100 % by construction.
    """
    key = _host_key()
    with _host_lock:
        if not remeasure and key in _host_memo:
            return _host_memo[key]
        peaks = None if remeasure else _entry_peaks(_read_entries(_peaks_dir(False)).get(key))
        if peaks is None:
            peaks = _measure()
            _store_entry(key, peaks)
        _host_memo[key] = peaks
        return peaks


def raise_host_peak(flops_per_second: float, what: str) -> Peaks:
    """This host's peaks, with the peak FLOP/s raised to `flops_per_second` when
    a measured run (`what`: whose) was faster than the calibration: a peak is
    the fastest rate seen here, so no MFU against it exceeds 100 %."""
    peaks = host_peaks()
    if not flops_per_second > peaks.flops_per_second:
        return peaks
    key = _host_key()
    with _host_lock:
        base = peaks.source.split("; raised to ")[0]
        peaks = dataclasses.replace(
            peaks, flops_per_second=float(flops_per_second),
            source=f"{base}; raised to {flops_per_second / 1e9:.4g} GFLOP/s by {what}, a "
                   "faster measured run")
        _host_memo[key] = peaks
        _store_entry(key, peaks)
    return peaks


def _best_seconds(fn, repeats):
    """The least of `repeats` timed runs: a peak is the best the host does (a
    median would carry the load of whatever else runs at that moment)."""
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def _calibration_cases(on_cpu: bool) -> tuple[list, int]:
    """([(dtype name, n)] of the square matmuls, elements of the copy)."""
    if on_cpu:
        return [("float32", 512), ("float32", 1024), ("bfloat16", 1024)], 16 << 20
    return [("bfloat16", 8192), ("float32", 4096)], 256 << 20


def _measure(repeats: int = 5) -> Peaks:
    """Peak FLOP/s (the fastest of a few square matmuls, float32 and bfloat16) and
    bytes/s (x + 1 over an array larger than the caches) of tpu:0."""
    import jax
    import jax.numpy as jnp

    plat = platform.platform()
    dev = platform.jax_device(0)
    dots, elems = _calibration_cases(plat == "cpu")

    def rate(name, fn, what, dtype, *shapes):
        sh = jax.sharding.SingleDeviceSharding(dev)
        specs = [jax.ShapeDtypeStruct(s, dtype, sharding=sh) for s in shapes]
        compiled, _, _ = programs.compile_lowered(f"roofline:{name}", jax.jit(fn).lower(*specs))
        count = Program(f"roofline:{name}", compiled=compiled).cost[what]
        args = [jax.device_put(jnp.ones(s, dtype), dev) for s in shapes]
        jax.block_until_ready(compiled(*args))
        return count / _best_seconds(lambda: compiled(*args), repeats)

    flops = {(dt, n): rate(f"matmul_{dt}_{n}", lambda a, b: a @ b, "flops", jnp.dtype(dt),
                           (n, n), (n, n))
             for dt, n in dots}
    copy_dtype = jnp.dtype(dots[0][0])
    bandwidth = rate("copy", lambda x: x + 1, "bytes_accessed", copy_dtype, (elems,))
    best = max(flops, key=flops.get)
    dots_text = ", ".join(f"{dt} {n}x{n} matmul {r / 1e9:.4g} GFLOP/s"
                          for (dt, n), r in flops.items())
    return Peaks(name=f"this host ({dev.device_kind}, {plat})",
                 flops_per_second=flops[best], bytes_per_second=bandwidth, dtype=best[0],
                 source=f"measured on this host: {dots_text}; "
                        f"{elems * copy_dtype.itemsize >> 20} MiB x + 1 "
                        f"{bandwidth / 1e9:.4g} GB/s (best of {repeats} runs each{_load()})")


def _load() -> str:
    """The host's load while it was measured: a busy host measures low peaks."""
    try:
        return f"; load average {os.getloadavg()[0]:.1f} on {_cpus()} CPUs"
    except (AttributeError, OSError):
        return ""


# --------------------------------------------------------------------------
# the report


@dataclasses.dataclass
class RooflineRow:
    """One program: XLA's counts, its measured time and where it sits under the roofs."""

    name: str
    flops: float
    bytes_accessed: float
    seconds: float          # median of the timed runs, each waited for (nan: not timed)
    bound: str              # 'compute' or 'memory' on this host
    reference_bound: str    # the same against the reference device ('' without one)
    reference_seconds: float  # least time the reference's roofs allow (nan without one)

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else math.nan

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_accessed / self.seconds if self.seconds > 0 else math.nan

    @property
    def intensity(self) -> float:
        """FLOPs per byte accessed (inf when the program reads and writes nothing)."""
        if self.bytes_accessed > 0:
            return self.flops / self.bytes_accessed
        return math.inf if self.flops > 0 else 0.0


@dataclasses.dataclass
class RooflineReport:
    """Rows per program, the peaks used, and the totals; str() starts with the summary."""

    rows: list
    host: Peaks
    reference: Peaks | None = None
    call_seconds: float | None = None   # median time of the whole call (callables only)
    source: str = ""                    # how the programs were obtained
    notes: list = dataclasses.field(default_factory=list)

    @property
    def flops(self) -> float:
        return sum(r.flops for r in self.rows)

    @property
    def bytes_accessed(self) -> float:
        return sum(r.bytes_accessed for r in self.rows)

    @property
    def seconds(self) -> float:
        """Sum of the programs' measured times."""
        return sum(r.seconds for r in self.rows if not math.isnan(r.seconds))

    @property
    def intensity(self) -> float:
        b = self.bytes_accessed
        return self.flops / b if b > 0 else (math.inf if self.flops > 0 else 0.0)

    @property
    def bound(self) -> str:
        return self.host.bound(self.intensity)

    @property
    def mfu(self) -> float:
        """Achieved FLOP/s over the programs' time, as a fraction of this host's peak."""
        if any(math.isnan(r.seconds) for r in self.rows):
            return math.nan
        s = self.seconds
        return self.flops / s / self.host.flops_per_second if s > 0 else math.nan

    @property
    def reference_seconds(self) -> float:
        if self.reference is None:
            return math.nan
        return sum(r.reference_seconds for r in self.rows)

    @property
    def reference_bound(self) -> str:
        return self.reference.bound(self.intensity) if self.reference is not None else ""

    def against(self, device) -> RooflineReport:
        """The same measurements compared with another device (a published name or
        a Peaks): nothing runs again."""
        ref = reference_peaks(device)
        rows = [dataclasses.replace(r, reference_bound=ref.bound(r.intensity),
                                    reference_seconds=ref.seconds(r.flops, r.bytes_accessed))
                for r in self.rows]
        return dataclasses.replace(self, rows=rows, reference=ref, notes=list(self.notes))

    def summary(self) -> str:
        n = len(self.rows)
        if not n:
            return "roofline: no programs" + ("; " + self.notes[-1] if self.notes else "")
        timed = any(not math.isnan(r.seconds) for r in self.rows)
        # Each program is timed alone (waited for), so their sum is not a share of
        # the whole call's time, which overlaps them: both are said as what they are.
        parts = [f"roofline: {n} program{'s' if n != 1 else ''}, {_si(self.flops)}FLOP, "
                 f"{_si(self.bytes_accessed)}B"
                 + (f", timed one by one: {_time(self.seconds)} in all" if timed
                    else " (not timed)")
                 + (f", the whole call {_time(self.call_seconds)}" if self.call_seconds else ""),
                 (f"{_pct(self.mfu)} of {_peak_words(self.host)}, " if timed else "")
                 + f"{self.bound}-bound here"]
        if self.reference is not None:
            parts.append(f"on a {self.reference.name}: {self.reference_bound}-bound, "
                         f">= {_time(self.reference_seconds)}")
        return "; ".join(parts)

    def table(self) -> str:
        head = ("program", "FLOP", "bytes", "time", "FLOP/s", "B/s", "FLOP/B", "bound")
        if self.reference is not None:
            head += (f"{_short(self.reference)} bound", f"{_short(self.reference)} >=")
        rows = []
        for r in self.rows:
            row = (r.name, _si(r.flops), _si(r.bytes_accessed), _time(r.seconds),
                   _si(r.flops_per_second), _si(r.bytes_per_second), f"{r.intensity:.3g}", r.bound)
            if self.reference is not None:
                row += (r.reference_bound, _time(r.reference_seconds))
            rows.append(row)
        widths = [max([len(h)] + [len(x[i]) for x in rows]) for i, h in enumerate(head)]
        fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
        out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        out += [fmt.format(*x) for x in rows]
        return "\n".join(out)

    def __str__(self) -> str:
        lines = [self.summary(), ""]
        peaks = [self.host] + ([self.reference] if self.reference is not None else [])
        for p in peaks:
            lines.append(f"  {p.name}: {_si(p.flops_per_second)}FLOP/s, "
                         f"{_si(p.bytes_per_second)}B/s, ridge {p.ridge:.3g} FLOP/B "
                         f"({p.source})")
        lines += ["", self.table()]
        if self.source:
            lines += ["", f"programs: {self.source}"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self):
        import html

        return "<pre>" + html.escape(str(self)) + "</pre>"

    def as_dict(self) -> dict:
        rows = []
        for r in self.rows:
            d = dataclasses.asdict(r)
            d.update(flops_per_second=r.flops_per_second, bytes_per_second=r.bytes_per_second,
                     intensity=r.intensity)
            rows.append(d)
        return {"rows": rows, "host": dataclasses.asdict(self.host),
                "reference": dataclasses.asdict(self.reference) if self.reference else None,
                "call_seconds": self.call_seconds, "flops": self.flops,
                "bytes_accessed": self.bytes_accessed, "seconds": self.seconds, "mfu": self.mfu,
                "bound": self.bound, "reference_bound": self.reference_bound,
                "reference_seconds": self.reference_seconds, "source": self.source,
                "notes": list(self.notes)}

    def plot(self, ax=None, reference=None):
        """Log-log roofline: this host's roofs, the reference's (dashed), a point per
        program at its intensity and achieved FLOP/s here. Returns the Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("RooflineReport.plot needs matplotlib: "
                              "pip install 'torch_tpu[guide]'") from e
        ref = reference_peaks(reference) if reference is not None else self.reference
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4))
        pts = [(r.intensity, r.flops_per_second, r.name) for r in self.rows
               if r.flops > 0 and r.bytes_accessed > 0 and r.seconds > 0]
        roofs = [self.host] + ([ref] if ref is not None else [])
        xs = [p[0] for p in pts] + [p.ridge for p in roofs]
        lo, hi = min(xs) / 10, max(xs) * 10
        grid = [lo * (hi / lo) ** (i / 99) for i in range(100)]
        for p, style in zip(roofs, ("-", "--")):
            ax.plot(grid, [p.attainable(x) for x in grid], style, lw=1.5,
                    label=f"{p.name} (ridge {p.ridge:.3g} FLOP/B)")
        for x, y, name in pts:
            ax.plot([x], [y], "o", ms=5)
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte accessed)")
        ax.set_ylabel("FLOP/s")
        ax.set_title("roofline: " + self.summary().split(";")[0].removeprefix("roofline: "),
                     fontsize=9)
        ax.legend(loc="lower right", fontsize="small")
        return ax


def _peak_words(p: Peaks) -> str:
    """Whose peak FLOP/s an MFU divides by, and where the number comes from."""
    rate = f"{p.flops_per_second / 1e9:.4g} GFLOP/s"
    if is_measured(p):
        return f"this host's peak FLOP/s (measured on this host: {rate})"
    return f"the peak FLOP/s of {p.name} ({rate}, {p.source or 'given'})"


def is_measured(p: Peaks) -> bool:
    """Peaks measured on this host by host_peaks (not published, not given)."""
    return p.source.startswith("measured on this host")


def _si(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def _time(s) -> str:
    if s is None or math.isnan(s):
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.1f} ns"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 100:.3g}%"


def _short(p: Peaks) -> str:
    return p.name.removeprefix("NVIDIA ").removeprefix("TPU ").split(" ")[0]


# --------------------------------------------------------------------------
# timing one program


def _inputs(compiled):
    """Arrays of the program's input shapes and placements: ones (zeros for
    integers and booleans, which index)."""
    import jax
    import numpy as np

    avals = jax.tree_util.tree_leaves(compiled.in_avals)
    # An input whose placement the program leaves open has sharding None.
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings, is_leaf=lambda x: x is None)
    if len(shardings) != len(avals):
        shardings = [None] * len(avals)
    default = next((s for s in shardings if s is not None), platform.jax_device(0))
    out = []
    for aval, sh in zip(avals, shardings):
        dt = np.dtype(aval.dtype)
        fill = 1 if np.issubdtype(dt, np.floating) or np.issubdtype(dt, np.complexfloating) else 0
        out.append(jax.device_put(np.full(aval.shape, fill, dtype=dt),
                                  default if sh is None else sh))
    return out


def _timeable(program):
    """A jax Compiled of `program` to call on fresh inputs: its own executable,
    or, for one loaded from the compile cache (a deserialized executable or a
    graph tier's, which carry no input signature), the program lowered again
    and compiled here (the same text, so the same machine code)."""
    compiled = program.compiled
    try:
        _ = (compiled.in_avals, compiled.in_tree, compiled.input_shardings)
        return compiled
    except Exception:  # noqa: BLE001 - no signature: lower and compile it again
        pass
    lowered = program.lowered
    if lowered is None:
        raise RuntimeError(f"program {program.name!r} was loaded from the compile cache "
                           "without its lowered form, so it cannot be run with new inputs")
    return lowered.compile()


def time_program(program, repeats: int = 5) -> float:
    """Median seconds of `repeats` runs of the program's executable, each waited for."""
    import jax

    compiled = _timeable(program)
    donated = bool(getattr(compiled, "donate_argnums", ()))
    flat = _inputs(compiled)

    def call(flat):
        args, kwargs = jax.tree_util.tree_unflatten(compiled.in_tree, flat)
        return compiled(*args, **kwargs)

    jax.block_until_ready(call(flat))  # first run: allocations, thread pools
    times = []
    for _ in range(max(1, repeats)):
        if donated:
            flat = _inputs(compiled)
        t0 = time.perf_counter()
        jax.block_until_ready(call(flat))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --------------------------------------------------------------------------
# the entry point


def _last_seq() -> int:
    evs = _events.events()
    return evs[-1].seq if evs else 0


def _sync(out) -> None:
    block(out)
    import torch

    if torch.tpu.is_available():
        torch.tpu.synchronize()


def _programs_of_call(fn, args, kwargs, repeats, mode):
    """(programs, call seconds, source text, notes) for a callable."""

    notes = []
    progs: list = []
    call_seconds = None
    if mode in ("auto", "run"):
        seq0 = _last_seq()
        _sync(fn(*args, **kwargs))
        new = [e for e in _events.events() if e.seq > seq0 and e.kind != "hlo"]
        progs = [e.program for e in new if e.program is not None]
        if len(progs) < len(new):
            notes.append(f"{len(new) - len(progs)} programs compiled by the call are no longer "
                         f"held (the compile log keeps the last {_events.KEEP_PROGRAMS})")
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _sync(fn(*args, **kwargs))
            times.append(time.perf_counter() - t0)
        call_seconds = statistics.median(times) if times else None
        if progs:
            return (progs, call_seconds, "compiled by the call's first run here (each "
                    "counted once; programs it had already cached are not listed)", notes)
        if mode == "run":
            notes.append("the call compiled no program here (all were cached); "
                         "programs='lower' shows it as one program")
            return [], call_seconds, "compiled by the call (none)", notes
        notes.append("the call compiled nothing new (its programs were cached), so it is "
                     "shown as one program: the whole call lowered by torch_tpu.debug.lower")
    try:
        prog = lower(fn, *args, **kwargs)
    except Exception as e:
        if mode == "lower":
            raise
        notes.append(f"lowering the call as one program failed ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}); pass its programs instead, "
                     "e.g. roofline(torch_tpu.debug.last_graphs(2)) for a torch.compile step")
        return [], call_seconds, "none", notes
    return [prog], call_seconds, "the whole call as one XLA program (debug.lower)", notes


def roofline(target, *args, device=None, repeats: int = 5, programs: str = "auto",
             host: Peaks | None = None, **kwargs) -> RooflineReport:
    """The roofline of `target`'s XLA programs on this device and on a reference device.

    target: a Program (torch_tpu.debug.lower, last_graphs(), compile_log()[i].program),
    a list of Programs, or a callable over tpu tensors (called with *args, **kwargs).
    device: the device to compare against: a published name ('v4', 'v5e',
    'v5p', 'v6e', 'v7', 'h100', 'h200'; default 'v6e') or a Peaks.
    repeats: timed runs per program (the median is kept); 0 skips timing
    (counts, intensity and bounds only: no wait for a large program on a CPU).
    programs (callables only): 'auto' (those the first call compiles, else the
    whole call lowered as one), 'run' (only those it compiles) or 'lower'.
    host: peaks to use for this device instead of the measured ones.
    """
    if programs not in ("auto", "run", "lower"):
        raise ValueError(f"programs must be 'auto', 'run' or 'lower', got {programs!r}")
    measured_host = host is None
    host = host if host is not None else host_peaks()
    ref = reference_peaks("v6e" if device is None else device)
    call_seconds, source, notes = None, "", []
    if isinstance(target, Program):
        progs = [target]
        source = "given"
    elif isinstance(target, (list, tuple)) and all(isinstance(p, Program) for p in target):
        progs = list(target)
        source = "given"
    elif callable(target):
        progs, call_seconds, source, notes = _programs_of_call(target, args, kwargs, repeats,
                                                               programs)
    else:
        raise ValueError("roofline() takes a torch_tpu.debug.Program, a list of them, or a "
                         f"callable; got {type(target).__name__}")
    measured = []
    for p in progs:
        cost = p.cost
        try:
            secs = time_program(p, repeats) if repeats > 0 else math.nan
        except Exception as e:
            secs = math.nan
            notes.append(f"{p.name}: not timed ({type(e).__name__}: {e})")
        measured.append((p.name, cost["flops"], cost["bytes_accessed"], secs))
    fastest = max((f / s for _, f, _, s in measured if s > 0), default=0.0)
    if measured_host and fastest > host.flops_per_second:
        host = raise_host_peak(fastest, "a program timed by roofline()")
    rows = []
    for name, flops, nbytes, secs in measured:
        inten = flops / nbytes if nbytes > 0 else (math.inf if flops > 0 else 0.0)
        rows.append(RooflineRow(
            name=name, flops=flops, bytes_accessed=nbytes, seconds=secs,
            bound=host.bound(inten), reference_bound=ref.bound(inten) if ref else "",
            reference_seconds=ref.seconds(flops, nbytes) if ref else math.nan))
    return RooflineReport(rows=rows, host=host, reference=ref, call_seconds=call_seconds,
                          source=source, notes=notes)
