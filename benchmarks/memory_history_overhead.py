"""Per-op cost of small eager ops with the memory history off, on, and off again.

`torch.tpu.memory._record_memory_history()` records an alloc per result
(with its Python stack) and a free per dead array; off, it costs one global
test where a storage is made or written from Python (none on the native
kernel's path). This times, in one process and in turn (so every column sees
the same host load), a chain of small ops (64x64 add, mul, an in-place add_)
in strict eager mode and under `torch_tpu.fused()`, with the history never
enabled, enabled, and disabled again; prints medians of the repeats and the
ratios on/off.

    python benchmarks/memory_history_overhead.py [--iters 2000] [--repeats 7]
    TORCH_TPU_NATIVE=0 python benchmarks/memory_history_overhead.py   # the Python path
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torch_tpu


def _chain(x: torch.Tensor, iters: int) -> torch.Tensor:
    y = x
    for _ in range(iters):
        y = y + x
        y = y * 0.5
        y.add_(1.0)
    return y


def per_op_us(x: torch.Tensor, iters: int, fused: bool) -> float:
    """Microseconds per op of `iters` rounds of three ops, waiting at the end."""
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    if fused:
        with torch_tpu.fused():
            y = _chain(x, iters)
    else:
        y = _chain(x, iters)
    torch.tpu.synchronize()
    del y
    return (time.perf_counter() - t0) / (3 * iters) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    x = torch.randn(64, 64, device="tpu")
    for fused in (False, True):  # warm: every program compiled
        per_op_us(x, 50, fused)
    mem = torch.tpu.memory
    states = {"off": None, "on": "all", "off after on": None}
    for fused in (False, True):
        times: dict = {k: [] for k in states}
        for _ in range(a.repeats):
            for name, enabled in states.items():
                if enabled is not None:
                    mem._record_memory_history(enabled, max_entries=100_000)
                times[name].append(per_op_us(x, a.iters, fused))
                mem._record_memory_history(None)
        med = {k: statistics.median(v) for k, v in times.items()}
        mode = "fused " if fused else "strict"
        cols = "  ".join(f"{k}: {v:6.2f} us/op" for k, v in med.items())
        print(f"{mode}  {cols}  on/off {med['on'] / med['off']:.2f}x  "
              f"off-after-on/off {med['off after on'] / med['off']:.3f}x")


if __name__ == "__main__":
    main()
