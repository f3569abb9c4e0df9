"""Per-op cost of small eager ops on `tpu`, against the limit and a peer.

For each op (add, mul, matmul 64x64, relu, sum) it times, side by side in one
run and on the same device:

- torch_tpu eager: `a + b` on tpu tensors (dispatcher, executor, cached
  executable);
- the limit: a cached `jax.jit` function doing the same work on jax.Arrays;
- torch CPU: the same op on CPU tensors (a peer for small ops).

Dispatch is asynchronous in both torch_tpu and JAX, so each timed loop ends
with a wait for the last result, and the loops are long enough that the wait
is amortized. Prints the median per-op time of several repeats and the
ratio torch_tpu / jax.jit (target: <= 1.3).

    python benchmarks/eager_overhead.py [--iters 2000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import executor


def _time(fn, wait, iters, repeats):
    fn()
    wait(fn())
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            r = fn()
        wait(r)
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def _wait_tpu(t):
    executor.value(t).block_until_ready()


def _wait_jax(a):
    a.block_until_ready()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(64, 64), torch.randn(64, 64)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    ja, jb = executor.value(a), executor.value(b)

    cases = {
        "add": (lambda: a + b, jax.jit(lambda x, y: x + y), lambda: a_cpu + b_cpu),
        "mul": (lambda: a * b, jax.jit(lambda x, y: x * y), lambda: a_cpu * b_cpu),
        "matmul 64x64": (lambda: a @ b,
                         jax.jit(lambda x, y: jnp.matmul(x, y, precision="highest")),
                         lambda: a_cpu @ b_cpu),
        "relu": (lambda: torch.relu(a), jax.jit(lambda x, y: jnp.maximum(x, 0)),
                 lambda: torch.relu(a_cpu)),
        "sum": (lambda: a.sum(), jax.jit(lambda x, y: jnp.sum(x)), lambda: a_cpu.sum()),
    }
    print(f"device: {torch.tpu.get_device_name()}   iters={args.iters} repeats={args.repeats}")
    print(f"{'op':<14}{'torch_tpu us':>14}{'jax.jit us':>12}{'torch cpu us':>14}"
          f"{'tpu/jit':>9}{'tpu/cpu':>9}")
    ratios = []
    for name, (tpu_fn, jit_fn, cpu_fn) in cases.items():
        t_tpu = _time(tpu_fn, _wait_tpu, args.iters, args.repeats)
        t_jit = _time(lambda: jit_fn(ja, jb), _wait_jax, args.iters, args.repeats)
        t_cpu = _time(cpu_fn, lambda r: None, args.iters, args.repeats)
        ratios.append(t_tpu / t_jit)
        print(f"{name:<14}{t_tpu * 1e6:>14.1f}{t_jit * 1e6:>12.1f}{t_cpu * 1e6:>14.1f}"
              f"{t_tpu / t_jit:>9.2f}{t_tpu / t_cpu:>9.1f}")
    print(f"median ratio torch_tpu / jax.jit: {statistics.median(ratios):.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
