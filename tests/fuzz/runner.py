"""Run a fuzz program on CPU and on `tpu` (eager, fused, compiled) and compare.

What is compared, per result name and per input (its final state, so
in-place writes through views count):

- **errors**: both raise or neither; the types agree (a subclass either way
  counts, as `DeviceIndexError` is an `IndexError`). On the compiled path a
  difference is also run through dynamo on the CPU (`aot_eager`): an error
  dynamo raises there too is dynamo's, not the backend's; any other
  difference it shares is still one, reported with that said.
- **dtype and shape**: equal.
- **values**: integers and bools exactly; floats with NaN in the same
  places, infinities equal, and the rest within `rtol * |cpu| + atol * scale`,
  where `scale` is the largest finite magnitude among the value and
  everything it was computed from (its operands, theirs, ...; a product for
  `@`): a sum or matmul may round differently in another order, and
  cancellation makes that error relative to the operands, not the result.
  Two float rules are exact whatever the tolerance: a subnormal CPU value
  must not come back as zero ("subnormal"), and a zero must have CPU's sign
  ("signed-zero"; `1 / x` tells them apart).
- **layout**: only where PyTorch promises one and code can observe it: a
  4-D result CPU gives in channels_last must be channels_last. Other
  strides are the backend's choice (docs/troubleshooting.md, "Results
  differ from the CPU"), as XLA picks its own layouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Iterable

import torch

import torch_tpu
from tests.ops import harness

from .generator import Program, defs, generate, uses

PATHS = ("eager", "fused", "compiled")
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}  # (rtol, atol per unit scale)


@dataclasses.dataclass
class Run:
    """One execution: the error it raised, or every name's value and layout."""

    error: BaseException | None = None
    values: dict = dataclasses.field(default_factory=dict)
    layouts: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    path: str
    kind: str    # error, no-error, error-type, dtype, shape, nan, value, subnormal, signed-zero, layout
    name: str    # the result or input that differs ("" for errors)
    detail: str

    @property
    def signature(self) -> tuple[str, str]:
        """What "fails the same way" means to the shrinker."""
        return (self.path, self.kind)

    def __str__(self) -> str:
        where = f" {self.name}" if self.name else ""
        return f"[{self.path}] {self.kind}{where}: {self.detail}"


def _layout(t: torch.Tensor) -> str:
    if t.dim() == 4 and t.numel() > 1 and not t.is_contiguous() and t.is_contiguous(
            memory_format=torch.channels_last):
        return "channels_last"
    return ""


def _read(run: Run, names: Iterable[str], tensors: Iterable[object]) -> None:
    for n, t in zip(names, tensors):
        if isinstance(t, torch.Tensor):
            run.layouts[n] = _layout(t)
            run.values[n] = t.detach().to("cpu", copy=True)


@contextlib.contextmanager
def _quiet():
    """No warnings (deprecated expanded writes, ...) and no CPU fallback: an op
    without a lowering raises instead of comparing CPU with itself."""
    log = logging.getLogger("torch._subclasses.fake_tensor")  # logs each meta error it re-raises
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), harness.cpu_fallback(False):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def execute(prog: Program, path: str = "eager", device: str = "tpu",
            backend: str = "tpu") -> Run:
    """Run `prog` once on fresh inputs; `device="cpu"` is the reference."""
    run = Run()
    try:
        ins = prog.make_inputs()
        if device == "tpu":
            ins = [harness.to_tpu(t) for t in ins]
        fn = prog.function()
        with _quiet():
            if path == "fused":
                with torch_tpu.fused():
                    out = fn(*ins)
            elif path == "compiled":
                torch._dynamo.reset()
                out = torch.compile(fn, backend=backend, dynamic=False)(*ins)
            else:
                out = fn(*ins)
            _read(run, prog.results(), out)
            _read(run, [i.name for i in prog.inputs], ins)
    except Exception as e:  # noqa: BLE001 - the outcome compared
        return Run(error=harness._unwrap(e))
    finally:
        if path == "compiled":
            torch._dynamo.reset()
    return run


# --------------------------------------------------------------------------
# comparing


def _maxabs(t: torch.Tensor) -> float:
    if not t.is_floating_point() or t.numel() == 0:
        return 0.0 if t.dtype == torch.bool or t.numel() == 0 else float(t.abs().max())
    f = t.double()
    f = f[torch.isfinite(f)]
    return float(f.abs().max()) if f.numel() else 0.0


def scales(prog: Program, expected: Run) -> dict[str, float]:
    """Each name's magnitude scale: its own, its operands' (transitively), and
    the product of the two largest operands for a matmul."""
    scale = {n: _maxabs(v) for n, v in expected.values.items()}
    for i in prog.inputs:
        scale[i.name] = max(scale.get(i.name, 0.0), _maxabs(i.make()))
    for line in prog.steps:
        ops = sorted((scale.get(u, 0.0) for u in uses(line)), reverse=True)
        s = max(ops, default=0.0)
        if "@" in line and len(ops) >= 1:
            s = max(s, ops[0] * (ops[1] if len(ops) > 1 else ops[0]))
        for n in defs(line) or tuple(uses(line)):  # a write: every name it touches
            scale[n] = max(scale.get(n, 0.0), s)
    return {n: max(1.0, s) for n, s in scale.items()}


def compare_values(name: str, a: torch.Tensor, e: torch.Tensor,
                   scale: float = 1.0) -> tuple[str, str] | None:
    """(kind, detail) of the first difference between tensors `a` (tpu) and `e` (CPU), or None."""
    if a.dtype != e.dtype:
        return "dtype", f"tpu {a.dtype}, CPU {e.dtype}"
    if a.shape != e.shape:
        return "shape", f"tpu {tuple(a.shape)}, CPU {tuple(e.shape)}"
    if not e.is_floating_point():
        if torch.equal(a, e):
            return None
        i = int((a != e).flatten().nonzero()[0])
        return "value", f"tpu {a.flatten()[i].item()}, CPU {e.flatten()[i].item()} at flat index {i}"
    ad, ed = a.double().flatten(), e.double().flatten()
    an, en = ad.isnan(), ed.isnan()
    if not torch.equal(an, en):
        i = int((an != en).nonzero()[0])
        return "nan", f"tpu {ad[i].item()}, CPU {ed[i].item()} at flat index {i}"
    rtol, atol = TOL.get(e.dtype, TOL[torch.float32])
    fin = torch.isfinite(ed)
    tiny = torch.finfo(e.dtype).tiny
    checks = [
        ("subnormal", fin & (ed != 0) & (ed.abs() < tiny) & (ad == 0)),
        ("value", ~fin & ~en & (ad != ed)),                                 # an infinity
        ("value", fin & ~torch.isfinite(ad)),
        ("value", fin & ((ad - ed).abs() > atol * scale + rtol * ed.abs())),
        ("signed-zero", (ed == 0) & (ad == 0) & (ed.signbit() != ad.signbit())),
    ]
    for kind, bad in checks:
        if bad.any():
            i = int(bad.nonzero()[0])
            return kind, f"tpu {ad[i].item()!r}, CPU {ed[i].item()!r} at flat index {i}"
    return None


def _same_error_type(a: BaseException, e: BaseException) -> bool:
    return isinstance(a, type(e)) or isinstance(e, type(a))


def _error_text(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:160]}"


def compare(prog: Program, expected: Run, actual: Run, path: str) -> Mismatch | None:
    """The first way `actual` (tpu on `path`) differs from `expected` (CPU)."""
    e, a = expected.error, actual.error
    if e is not None or a is not None:
        if e is None:
            assert a is not None
            return Mismatch(path, "error", "", f"tpu raises {_error_text(a)}; CPU does not")
        if a is None:
            return Mismatch(path, "no-error", "", f"CPU raises {_error_text(e)}; tpu does not")
        if not _same_error_type(a, e):
            return Mismatch(path, "error-type", "",
                            f"tpu raises {_error_text(a)}; CPU {_error_text(e)}")
        return None
    sc = scales(prog, expected)
    for name, ev in expected.values.items():
        av = actual.values.get(name)
        if av is None:
            return Mismatch(path, "value", name, "no tpu value")
        diff = compare_values(name, av, ev, sc.get(name, 1.0))
        if diff is not None:
            return Mismatch(path, diff[0], name, diff[1])
        if expected.layouts.get(name) != actual.layouts.get(name):
            return Mismatch(path, "layout", name, f"tpu {actual.layouts.get(name) or 'other'}, "
                            f"CPU {expected.layouts.get(name) or 'other'}")
    return None


def check(prog: Program, path: str, expected: Run | None = None) -> Mismatch | None:
    """Run `prog` on CPU (unless given) and on tpu on `path`; the first difference."""
    expected = execute(prog, device="cpu") if expected is None else expected
    actual = execute(prog, path)
    m = compare(prog, expected, actual, path)
    if m is not None and path == "compiled":
        # Is the difference dynamo's own? The same program compiled for the CPU.
        control = execute(prog, "compiled", "cpu", backend="aot_eager")
        if control.error is not None and actual.error is not None and _same_error_type(
                control.error, actual.error):
            return None
        if compare(prog, control, actual, path) is None:
            m = dataclasses.replace(m, detail=m.detail + SAME_AS_CPU_COMPILE)
    return m


# Said of a compiled-path difference torch.compile shows on the CPU too (aot_eager).
SAME_AS_CPU_COMPILE = " (torch.compile on the CPU, aot_eager, gives the tpu's result)"


# --------------------------------------------------------------------------
# many programs


@dataclasses.dataclass
class Failure:
    seed: int
    program: Program
    mismatch: Mismatch
    shrunk: Program | None = None
    shrunk_mismatch: Mismatch | None = None
    known: str | None = None


@dataclasses.dataclass
class Report:
    runs: dict = dataclasses.field(default_factory=dict)       # path -> programs run
    failures: list = dataclasses.field(default_factory=list)
    seconds: dict = dataclasses.field(default_factory=dict)    # path -> wall seconds

    def add_time(self, path: str, t0: float) -> None:
        self.seconds[path] = self.seconds.get(path, 0.0) + time.perf_counter() - t0


def fuzz(seed: int, count: int, paths: Iterable[str] = PATHS, compiled_every: int = 1,
         log: Callable[[str], object] | None = None) -> Report:
    """Programs of seeds `seed .. seed+count-1` on each path (the compiled path
    on every `compiled_every`-th one only: it compiles a graph per program)."""
    rep = Report()
    for s in range(seed, seed + count):
        t0 = time.perf_counter()
        prog = generate(s)
        expected = execute(prog, device="cpu")
        rep.add_time("cpu", t0)
        for path in paths:
            if path == "compiled" and (s - seed) % compiled_every:
                continue
            t0 = time.perf_counter()
            m = check(prog, path, expected)
            rep.add_time(path, t0)
            rep.runs[path] = rep.runs.get(path, 0) + 1
            if m is not None:
                rep.failures.append(Failure(s, prog, m))
                if log:
                    log(f"seed {s}: {m}")
    return rep


def shrink_failure(f: Failure, budget: int = 120) -> None:
    """Shrink `f.program` while it fails on the same path in the same way."""
    from .shrink import shrink

    path, sig = f.mismatch.path, f.mismatch.signature

    def fails(p: Program) -> bool:
        m = check(p, path)
        return m is not None and m.signature == sig

    f.shrunk = shrink(f.program, fails, budget)
    f.shrunk_mismatch = check(f.shrunk, path)
