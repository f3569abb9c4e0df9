"""Per-op cost of small eager ops on `tpu`, against the limit and peers.

For each op (add, mul, matmul 64x64, relu, sum) it times, side by side in one
run and on the same device:

- torch_tpu eager: `a + b` on tpu tensors (dispatcher, executor, cached
  executable);
- the limit: a cached `jax.jit` function doing the same work on jax.Arrays;
- torch CPU: the same op on CPU tensors (a peer for small ops);
- torchax eager: the same op on torchax tensors (its `jax` device), on the
  same JAX platform. torchax and torch_tpu both claim PyTorch's PrivateUse1
  device, so it runs in a child process of this run (benchmarks/_torchax.py);
  the column says so when torchax is not installed (`pip install -e ".[bench]"`).

Dispatch is asynchronous in torch_tpu, JAX and torchax, so each timed loop
ends with a wait for the last result, and the loops are long enough that the
wait is amortized. Prints the median per-op time of several repeats (torch_tpu's
and jax.jit's taken in turn, so that both see the same host load) and the
ratio torch_tpu / jax.jit (target: <= 1.3). Then the per-op cost of a chain of 10
small ops in strict and fused eager mode (torch_tpu.fused()) against jax.jit.

Then large matmuls (128x2048 @ 2048x8192, float32 and bfloat16): GFLOP/s of
torch_tpu, of jax.jit (the limit) and of torch's own CPU kernel, and the
ratio torch_tpu / torch CPU (issue 34's target: >= 0.5). On a host without
AVX-512 BF16/AMX, torch's bfloat16 CPU matmul has no fast kernel (a 2-core
AVX2 EPYC: ~0.1 GFLOP/s, against ~15-20 for XLA:CPU); `--no-large` skips it.

`--opt-levels 0,1,2,3` adds the effect of the XLA optimization level
(torch_tpu.runtime.opt_level) on eager executables: per level, the time to
produce each op's executable (cold: fresh shapes, an empty private disk
cache; wall seconds from torch_tpu.cache.stats and the process's CPU
seconds) and the per-op time at 64x64 and 1024x1024 (adding gelu and
softmax, whose generated code the level changes most).

    python benchmarks/eager_overhead.py [--iters 2000] [--repeats 7] [--no-torchax]
    python benchmarks/eager_overhead.py --opt-levels 0,1,2,3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import executor, opt_level

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _torchax  # noqa: E402


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


def _time_side_by_side(pairs, iters, repeats):
    """`_time` of each (fn, wait) in `pairs`, their repeats taken in turn
    (in either order), so that a change in the host's load falls on every
    column alike rather than on whichever was timed last: the medians."""
    for fn, wait in pairs:
        fn()
        wait(fn())
    samples = [[] for _ in pairs]
    for rep in range(repeats):
        turn = list(zip(pairs, samples))
        for (fn, wait), out in (turn if rep % 2 == 0 else turn[::-1]):  # either order
            t0 = time.perf_counter()
            for _ in range(iters):
                r = fn()
            wait(r)
            out.append((time.perf_counter() - t0) / iters)
    return [statistics.median(s) for s in samples]


def _wait_tpu(t):
    executor.value(t).block_until_ready()


def _wait_jax(a):
    a.block_until_ready()


_SWEEP_OPS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "matmul": lambda a, b: a @ b,
    "relu": lambda a, b: torch.relu(a),
    "sum": lambda a, b: a.sum(),
    "gelu": lambda a, b: torch.nn.functional.gelu(a),
    "softmax": lambda a, b: torch.softmax(a, -1),
}


def _chain(x, y):
    """Ten small elementwise ops (fused mode's unit of measure)."""
    z = x + y
    z = z * 0.5
    z = torch.relu(z)
    z = z - y
    z = torch.tanh(z)
    z = z * x
    z = z + 1.0
    z = torch.sigmoid(z)
    z = z.abs()
    return z.neg()


def fused_chain(iters, repeats):
    """Per-op cost of a chain of 10 small ops: strict eager, fused eager (the
    chain recorded, then run as one cached program per chain), and jax.jit
    (one dispatch per op, and the whole chain as one function)."""
    from torch_tpu.runtime import fused

    a = torch.randn(64, 64, device="tpu")
    b = torch.randn(64, 64, device="tpu")
    ja, jb = executor.value(a), executor.value(b)
    n = 10
    jit_ops = [jax.jit(f) for f in (
        lambda x, y: x + y, lambda z: z * 0.5, lambda z: jnp.maximum(z, 0),
        lambda z, y: z - y, jnp.tanh, lambda z, x: z * x, lambda z: z + 1.0,
        jax.nn.sigmoid, jnp.abs, jnp.negative)]

    def jax_ops():
        add, half, relu, sub, tanh, mul, inc, sig, ab, neg = jit_ops
        z = add(ja, jb)
        z = tanh(sub(relu(half(z)), jb))
        return neg(ab(sig(inc(mul(z, ja)))))

    whole = jax.jit(lambda x, y: -jnp.abs(jax.nn.sigmoid(
        jnp.tanh(jnp.maximum((x + y) * 0.5, 0) - y) * x + 1.0)))

    def fused_step():
        with fused.mode():
            z = _chain(a, b)
        return z  # leaving the mode ran the chain as one program

    strict = _time(lambda: _chain(a, b), _wait_tpu, iters // n, repeats) / n
    fz = _time(fused_step, _wait_tpu, iters // n, repeats) / n
    per_op = _time(jax_ops, _wait_jax, iters // n, repeats) / n
    one = _time(lambda: whole(ja, jb), _wait_jax, iters // n, repeats) / n
    ok = torch.equal(fused_step().cpu(), _chain(a, b).cpu())
    print(f"\nchain of {n} small ops (64x64 float32), per op:")
    print(f"{'strict eager us':>18}{'fused eager us':>16}{'jax.jit/op us':>15}"
          f"{'jit(chain) us':>15}{'strict/fused':>14}")
    print(f"{strict * 1e6:>18.1f}{fz * 1e6:>16.1f}{per_op * 1e6:>15.1f}{one * 1e6:>15.1f}"
          f"{strict / fz:>14.2f}")
    print(f"fused == strict bitwise: {ok}")
    return {"strict": strict, "fused": fz, "jit_per_op": per_op, "jit_chain": one}


def opt_level_sweep(levels, iters, repeats, rounds=3):
    """Per level: executable compile time of each op (cold) and per-op times."""
    import torch_tpu.cache as cache

    tmp = tempfile.TemporaryDirectory()
    previous_dir = cache.cache_dir()
    cache.set_dir(tmp.name)
    before = opt_level.level()
    results = {}
    try:
        for level in levels:
            opt_level.set_level(level)
            wall, cpu = [], []
            for r in range(rounds):
                n = 40 + 10 * level + r  # shapes no other level or round used: cold
                a = torch.randn(n, n, device="tpu")
                b = torch.randn(n, n, device="tpu")
                for fn in _SWEEP_OPS.values():
                    c0, p0 = executor.STATS.compile_seconds, time.process_time()
                    _wait_tpu(fn(a, b))
                    wall.append(executor.STATS.compile_seconds - c0)
                    cpu.append(time.process_time() - p0)
            run = {}
            for n, k in ((64, 1), (1024, 20)):
                a = torch.randn(n, n, device="tpu")
                b = torch.randn(n, n, device="tpu")
                for name, fn in _SWEEP_OPS.items():
                    run[(name, n)] = _time(lambda: fn(a, b), _wait_tpu, max(iters // k, 20), repeats)
            results[level] = {"compile": statistics.median(wall), "cpu": statistics.median(cpu),
                              "run": run}
    finally:
        opt_level.set_level(before)
        cache.set_dir(previous_dir)
        tmp.cleanup()
    print(f"\nXLA optimization level, eager executables ({len(_SWEEP_OPS)} ops x {rounds} "
          "cold compiles each, median):")
    print(f"{'':22s}" + "".join(f"{'level ' + str(lv):>11s}" for lv in levels))
    print(f"{'compile ms (wall)':22s}" + "".join(f"{results[lv]['compile'] * 1e3:11.1f}"
                                                 for lv in levels))
    print(f"{'first call CPU ms':22s}" + "".join(f"{results[lv]['cpu'] * 1e3:11.1f}"
                                                 for lv in levels))
    for n in (64, 1024):
        for name in _SWEEP_OPS:
            label = f"{name} {n}x{n} us"
            print(f"{label:22s}" + "".join(f"{results[lv]['run'][(name, n)] * 1e6:11.1f}"
                                           for lv in levels))
    return results


def _gflops(fn, flops, repeats, budget_s=5.0, warm=True):
    """Median GFLOP/s of `fn()` (which waits for its result): at least one run,
    at most `repeats`, stopping early past `budget_s` (a slow CPU kernel);
    `warm`: one untimed call first (a compile)."""
    if warm:
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times) / 1e9


def large_matmuls(repeats):
    """Compute-bound dots: how close torch_tpu's matmul is to XLA's and to
    torch's own CPU kernel (issue 34 item 4)."""
    m, k, n = 128, 2048, 8192
    flops = 2 * m * k * n
    print(f"\nlarge matmul {m}x{k} @ {k}x{n} (GFLOP/s, median of <= {repeats}):")
    print(f"{'dtype':<10}{'torch_tpu':>11}{'jax.jit':>10}{'torch cpu':>11}{'tpu/cpu':>9}{'tpu/jit':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        a_cpu, b_cpu = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
        ja, jb = executor.value(a), executor.value(b)
        prec = "highest" if dtype is torch.float32 else None  # torch_tpu's float32 default
        # the same work as torch_tpu's: bfloat16 accumulated in float32, rounded once
        # (a bfloat16-accumulating jnp.matmul takes a slower XLA:CPU path on AMX hosts)
        acc = jnp.float32

        def same_work(x, y, prec=prec, acc=acc):
            return jnp.matmul(x, y, precision=prec, preferred_element_type=acc).astype(x.dtype)

        jit = jax.jit(same_work)
        g_tpu = _gflops(lambda: _wait_tpu(a @ b), flops, repeats)
        g_jit = _gflops(lambda: _wait_jax(jit(ja, jb)), flops, repeats)
        # torch compiles nothing: no warm-up call (its bfloat16 kernel can take
        # tens of seconds a call on a host without AVX-512 BF16/AMX)
        g_cpu = _gflops(lambda: a_cpu @ b_cpu, flops, repeats, warm=False)
        print(f"{str(dtype).split('.')[-1]:<10}{g_tpu:>11.1f}{g_jit:>10.1f}{g_cpu:>11.1f}"
              f"{g_tpu / g_cpu:>9.2f}{g_tpu / g_jit:>9.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-torchax", action="store_true", help="skip the torchax column")
    p.add_argument("--no-large", action="store_true", help="skip the large-matmul rows")
    p.add_argument("--opt-levels", default="",
                   help="comma-separated XLA optimization levels to compare (e.g. 0,1,2,3)")
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
    print(f"device: {torch.tpu.get_device_name()}   iters={args.iters} repeats={args.repeats}"
          f"   XLA opt level {opt_level.level()}")
    measured = {}
    for name, (tpu_fn, jit_fn, cpu_fn) in cases.items():
        t_tpu, t_jit = _time_side_by_side(
            [(tpu_fn, _wait_tpu), (lambda jit_fn=jit_fn: jit_fn(ja, jb), _wait_jax)],
            args.iters, args.repeats)
        # The CPU column on its own: torch's CPU threads keep spinning after a
        # CPU matmul, which would slow whichever loop came next.
        measured[name] = (t_tpu, t_jit, _time(cpu_fn, lambda r: None, args.iters, args.repeats))
    # torchax after the in-process loops (never concurrently with them).
    if args.no_torchax:
        tx = {"error": "torchax skipped (--no-torchax)"}
    else:
        tx = _torchax.run("eager", "--iters", str(args.iters), "--repeats", str(args.repeats))
    tx_times = tx.get("per_op_s", {})
    print(f"{'op':<14}{'torch_tpu us':>14}{'jax.jit us':>12}{'torch cpu us':>14}"
          f"{'torchax us':>12}{'tpu/jit':>9}{'tpu/cpu':>9}{'tpu/torchax':>13}")
    ratios = []
    for name, (t_tpu, t_jit, t_cpu) in measured.items():
        ratios.append(t_tpu / t_jit)
        t_tx = tx_times.get(name)
        tx_col = f"{t_tx * 1e6:>12.1f}" if t_tx else f"{'n/a':>12}"
        tx_ratio = f"{t_tpu / t_tx:>13.2f}" if t_tx else f"{'n/a':>13}"
        print(f"{name:<14}{t_tpu * 1e6:>14.1f}{t_jit * 1e6:>12.1f}{t_cpu * 1e6:>14.1f}"
              f"{tx_col}{t_tpu / t_jit:>9.2f}{t_tpu / t_cpu:>9.1f}{tx_ratio}")
    print(f"median ratio torch_tpu / jax.jit: {statistics.median(ratios):.2f} (target <= 1.3)")
    if "error" in tx:
        print(f"torchax: {tx['error']}")
    else:
        print(f"torchax {tx['version']} on {tx['device']} (child process; "
              f"{len(set(tx['shimmed']))} named-tensor overloads missing in torch "
              f"{torch.__version__.split('+')[0]} stood in at its import, see benchmarks/_torchax.py)")
    fused_chain(args.iters, args.repeats)
    if not args.no_large:
        large_matmuls(min(args.repeats, 5))
    if args.opt_levels:
        levels = [opt_level.check(v, "--opt-levels") for v in args.opt_levels.split(",")]
        opt_level_sweep(levels, args.iters, args.repeats)


if __name__ == "__main__":
    main()
