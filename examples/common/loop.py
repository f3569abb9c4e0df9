"""The training loop the examples share: progress bar, loss per interval, summary line."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

from .cli import compile_seconds, fallback_counts, synchronize


class _NoBar:
    """Stand-in for tqdm when it is not installed or bars are off."""

    def __init__(self, iterable=None, total=None, **_):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def set_postfix(self, *a, **k):
        pass

    def set_postfix_str(self, *a, **k):
        pass

    def update(self, n=1):
        pass

    def write(self, s):
        print(s)

    def close(self):
        pass


def progress(iterable=None, *, total=None, desc=None, enabled=True):
    """A tqdm progress bar (stderr), or a silent stand-in without tqdm / when disabled."""
    if enabled:
        try:
            from tqdm.auto import tqdm

            return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True,
                        leave=False)
        except ImportError:
            pass
    return _NoBar(iterable, total=total)


def log(bar, msg: str) -> None:
    if isinstance(bar, _NoBar):
        print(msg, flush=True)
    else:
        bar.write(msg)


@dataclass
class RunStats:
    """What a training or inference run measured."""

    name: str
    device: str
    compiled: bool
    steps: int
    items_per_step: int
    unit: str
    losses: list = field(default_factory=list)
    first_step_s: float = 0.0
    steady_s: float = 0.0
    total_s: float = 0.0
    # Wall seconds with a compile in flight (overlapping compiles counted
    # once): during the first step, and during the whole run.
    first_compile_s: float | None = None
    compile_s: float | None = None
    fallbacks: dict = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Items per second over the steps after the first (all steps if only one)."""
        n = self.steps - 1
        if n >= 1 and self.steady_s > 0:
            return n * self.items_per_step / self.steady_s
        return self.steps * self.items_per_step / max(self.total_s, 1e-9)

    def summary(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        parts = [f"summary: {self.name} on {self.device} ({mode})", f"{self.steps} steps"]
        if self.losses:
            parts.append(f"loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}")
        parts.append(f"{self.throughput:,.1f} {self.unit}/s")
        first = f"first step {self.first_step_s:.2f} s"
        if self.first_compile_s is not None:
            first += f" (compiling {self.first_compile_s:.2f} s of it)"
        parts.append(first)
        later = (self.compile_s or 0.0) - (self.first_compile_s or 0.0)
        if self.compile_s is not None and later >= 0.005:
            parts.append(f"compiling {later:.2f} s after the first step")
        if self.fallbacks:
            parts.append(f"cpu fallbacks: {sum(self.fallbacks.values())} calls of "
                         f"{len(self.fallbacks)} ops ({', '.join(sorted(self.fallbacks))})")
        return " | ".join(parts)


def _diff(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


def _compile_time(device, before_s):
    if torch.device(device).type != "tpu":
        return None
    after = compile_seconds()
    if after is None or before_s is None:
        return None
    return after - before_s


def train(*, name: str, model, optimizer, batch_fn, loss_fn, steps: int, device,
          items_per_step: int, unit: str, log_interval: int = 10, show_progress: bool = True,
          compiled: bool = False, grad_clip: float | None = None, scheduler=None,
          after_backward=None, forward=None, verbose: bool = True,
          reduce_loss=None) -> RunStats:
    """Run `steps` optimizer steps and return what was measured.

    - ``batch_fn(step) -> (inputs: tuple, target)``, already on the device;
    - ``forward(inputs) -> output`` (default ``model(*inputs)``);
    - ``loss_fn(output, target) -> scalar loss``;
    - ``reduce_loss(loss) -> loss`` (optional): what is recorded, e.g. the mean
      over data-parallel ranks.

    Nothing waits for the device inside a step except the logging interval
    (``loss.item()``), so steps are dispatched asynchronously.
    """
    stats = RunStats(name, str(device), compiled, steps, items_per_step, unit)
    fwd = forward or (lambda inputs: model(*inputs))
    fb0 = fallback_counts()
    bar = progress(range(steps), desc=f"train {name}", enabled=show_progress)
    loss_values = []
    cs0 = compile_seconds()
    t0 = time.perf_counter()
    t_first = None
    for step in bar:
        inputs, target = batch_fn(step)
        loss = loss_fn(fwd(inputs), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if after_backward is not None:
            after_backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        loss = loss.detach()
        if reduce_loss is not None:
            loss = reduce_loss(loss)
        loss_values.append(loss)
        if step == 0:
            synchronize(device)
            t_first = time.perf_counter()
            stats.first_step_s = t_first - t0
            stats.first_compile_s = stats.compile_s = _compile_time(device, cs0)
        if (step + 1) % log_interval == 0 or step == 0 or step == steps - 1:
            v = loss.item()
            bar.set_postfix(loss=f"{v:.4f}")
            if verbose:
                log(bar, f"step {step + 1:5d}/{steps}  loss {v:.4f}")
    synchronize(device)
    t_end = time.perf_counter()
    run_compile_s = _compile_time(device, cs0)  # the run's, before the losses are read
    bar.close()
    stats.total_s = t_end - t0
    stats.steady_s = t_end - t_first if t_first is not None else 0.0
    stats.losses = [float(v) for v in torch.stack(loss_values).float().cpu()] if loss_values else []
    stats.fallbacks = _diff(fallback_counts(), fb0)
    if stats.compile_s is not None:
        stats.compile_s = run_compile_s  # everything compiled during the run
    if verbose:
        print(stats.summary(), flush=True)
    return stats


def timed_inference(*, name: str, fn, steps: int, device, items_per_step: int, unit: str,
                    show_progress: bool = True, compiled: bool = False,
                    verbose: bool = True):
    """Call ``fn(step)`` `steps` times (no grad); returns (last output, RunStats)."""
    stats = RunStats(name, str(device), compiled, steps, items_per_step, unit)
    fb0 = fallback_counts()
    bar = progress(range(steps), desc=f"infer {name}", enabled=show_progress)
    out = None
    cs0 = compile_seconds()
    t0 = time.perf_counter()
    t_first = None
    with torch.no_grad():
        for step in bar:
            out = fn(step)
            if step == 0:
                synchronize(device)
                t_first = time.perf_counter()
                stats.first_step_s = t_first - t0
                stats.first_compile_s = _compile_time(device, cs0)
    synchronize(device)
    t_end = time.perf_counter()
    bar.close()
    stats.total_s = t_end - t0
    stats.steady_s = t_end - t_first
    stats.compile_s = _compile_time(device, cs0)
    stats.fallbacks = _diff(fallback_counts(), fb0)
    if verbose:
        print(stats.summary(), flush=True)
    return out, stats
