"""Device traces for TensorBoard / XProf, with PyTorch op names.

    with torch_tpu.profiler.trace("runs/profile") as prof:
        for step in range(3):
            with torch_tpu.profiler.step(step):
                loss = train_step(batch)
    print(prof.files)          # .../plugins/profile/<run>/<host>.xplane.pb (+ trace.json.gz)

    tensorboard --logdir runs/profile       # Profile tab (needs tensorboard-plugin-profile)
    xprof --logdir runs/profile             # or XProf directly

The trace is JAX's profiler (`jax.profiler.start_trace`): host activity,
XLA compilation, and device execution of every executable. While tracing,
every ATen op that reaches the tpu backend runs inside a
`jax.profiler.TraceAnnotation` named like the op (`aten.addmm.default`), so
the timeline shows which PyTorch op dispatched which executable;
`annotate("name")` marks a region of your own, and `step(n)` marks a
training step (XProf's step-time view uses them).

The per-op annotations come from a dispatch mode that is active only inside
`trace()`/`start()`: outside a trace there is no overhead. Each annotation
costs a few microseconds of host time, which the trace includes.
"""

from __future__ import annotations

import glob
import os
import time

import jax
from .debug.timing import OpTimer
from .device import module
from .runtime.switches import switch_raw

_active = None


def _default_dir():
    return switch_raw("TORCH_TPU_PROFILE_DIR") or os.path.join(os.getcwd(), "tpu_profile")


def _options(python_tracer: bool, host_tracer_level: int | None):
    try:
        opts = jax.profiler.ProfileOptions()
    except Exception:  # pragma: no cover - older JAX
        return None
    opts.python_tracer_level = 1 if python_tracer else 0
    if host_tracer_level is not None:
        opts.host_tracer_level = host_tracer_level
    return opts


def trace_files(log_dir) -> list:
    """Trace files under `log_dir` (xplane.pb and trace.json.gz), oldest first."""
    pats = ("*.xplane.pb", "*.trace.json.gz")
    files = []
    for p in pats:
        files += glob.glob(os.path.join(str(log_dir), "plugins", "profile", "*", p))
    return sorted(files, key=lambda f: (os.path.getmtime(f), f))


class trace:
    """Context manager (or start()/stop()) recording a device trace into `log_dir`.

    annotate_ops: name each PyTorch op in the trace (default True).
    python_tracer: also record every Python function call (large traces).
    perfetto: also write a Perfetto trace (`create_perfetto_trace`).
    """

    def __init__(self, log_dir=None, *, annotate_ops: bool = True, python_tracer: bool = False,
                 host_tracer_level: int | None = None, perfetto: bool = False):
        self.log_dir = str(log_dir) if log_dir is not None else _default_dir()
        self.annotate_ops = annotate_ops
        self.python_tracer = python_tracer
        self.host_tracer_level = host_tracer_level
        self.perfetto = perfetto
        self.files: list = []
        self._mode = None
        self._before = set()
        self.seconds = None

    def start(self):
        global _active
        if _active is not None:
            raise RuntimeError("a torch_tpu.profiler trace is already running; stop it first")
        os.makedirs(self.log_dir, exist_ok=True)
        self._before = set(trace_files(self.log_dir))
        kwargs = {}
        opts = _options(self.python_tracer, self.host_tracer_level)
        if opts is not None:
            kwargs["profiler_options"] = opts
        if self.perfetto:
            kwargs["create_perfetto_trace"] = True
        jax.profiler.start_trace(self.log_dir, **kwargs)
        _active = self
        self._t0 = time.perf_counter()
        if self.annotate_ops:
            self._mode = OpTimer(annotate=True, time_ops=False)
            self._mode.__enter__()
        return self

    def stop(self) -> list:
        """Finish the trace (waiting for the device) and return the new trace files."""
        global _active
        if _active is not self:
            raise RuntimeError("this trace is not running")
        try:
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None

            module.synchronize()
        finally:
            jax.profiler.stop_trace()
            _active = None
        self.seconds = time.perf_counter() - self._t0
        self.files = [f for f in trace_files(self.log_dir) if f not in self._before]
        return self.files

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def xplane(self):
        """The .xplane.pb file of this trace (what TensorBoard/XProf read)."""
        for f in self.files:
            if f.endswith(".xplane.pb"):
                return f
        return None


def start(log_dir=None, **kwargs) -> trace:
    """Start a trace (see `trace`); `stop()` ends it and returns its files."""
    return trace(log_dir, **kwargs).start()


def stop() -> list:
    if _active is None:
        raise RuntimeError("no torch_tpu.profiler trace is running")
    return _active.stop()


def is_tracing() -> bool:
    return _active is not None


def annotate(name: str, **metadata):
    """Context manager/decorator naming a region of the trace."""
    return jax.profiler.TraceAnnotation(name, **metadata)


def step(step_num: int, name: str = "train"):
    """Mark one training step (XProf's step-time analysis uses these)."""
    return jax.profiler.StepTraceAnnotation(name, step_num=step_num)


def trace_events(path) -> list:
    """The events of a `.trace.json.gz` file (Chrome trace format), for checks."""
    import gzip
    import json

    with gzip.open(path, "rt") as f:
        return json.load(f).get("traceEvents", [])
