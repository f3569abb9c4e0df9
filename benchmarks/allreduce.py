"""all_reduce bandwidth vs message size: backend "tpu" against gloo.

Runs, side by side in one invocation, `dist.all_reduce(x)` (sum, float32)
over N processes (default 2) on this machine for each message size:

- ``gloo``: PyTorch's own c10d gloo backend on CPU tensors
  (`init_process_group("gloo")`);
- ``tpu``: torch_tpu's backend on `tpu` tensors (`init_process_group("tpu")`),
  an XLA collective over the group's mesh (on the CPU platform, XLA's
  collectives also go through gloo over TCP); with the default cross-rank
  metadata check, which adds a small all-gather to every collective;
- ``tpu-nocheck`` (optional): the same with ``TORCH_TPU_DIST_CHECKS=0``.

Each backend gets its own N processes (spawned, loopback, a free port).
For each size every process does a barrier, one first call (compiles the
collective's program on tpu: reported as "first ms" and "compile ms", from
JAX's compile events, and checked: every element must equal the sum of the
ranks' values), `--warmup` more untimed calls, then `--iters` timed calls.
A timed call is `dist.all_reduce` plus waiting for the result to be on the
device (`block_until_ready`), so asynchronous dispatch is not measured as
free. The latency reported is the largest of the processes' medians.

- algbw = bytes / latency
- busbw = algbw * 2 (n - 1) / n   (the bytes each link carries in a ring)
- tpu/gloo = latency ratio (< 1: tpu faster)

    python benchmarks/allreduce.py [--sizes 4096,65536,...] [--iters 20]
        [--warmup 2] [--nprocs 2] [--backends gloo,tpu,tpu-nocheck] [--json out.json]

Sizes are bytes (suffixes K/M allowed: 4K, 64M); the default is 4 KiB to
64 MiB in steps of 4x. This is a measurement, not a test: nothing asserts
on time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
BACKENDS = ("gloo", "tpu", "tpu-nocheck")
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


def _parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    if s[-1:] in "KMG":
        s = s[:-1]
    n = int(float(s) * mult)
    if n < 4 or n % 4:
        raise argparse.ArgumentTypeError(f"size {n} is not a positive multiple of 4 bytes")
    return n


def _human(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# one process of one backend


def _worker(rank, backend, nprocs, port, sizes, warmup, iters, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(nprocs))
    if backend == "tpu-nocheck":
        os.environ["TORCH_TPU_DIST_CHECKS"] = "0"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    on_tpu = backend.startswith("tpu")
    compile_secs = [0.0]
    if on_tpu:
        import jax

        import torch_tpu  # noqa: F401
        from torch_tpu.runtime import executor

        def on_event(event, secs, **_):
            if event in _COMPILE_EVENTS:
                compile_secs[0] += secs

        jax.monitoring.register_event_duration_secs_listener(on_event)

        def sync(t):
            executor.value(t).block_until_ready()
        device = "tpu"
    else:
        def sync(t):
            pass
        device = "cpu"
    try:
        dist.init_process_group("tpu" if on_tpu else "gloo")
        expect = float(sum(range(1, nprocs + 1)))
        rows = []
        for size in sizes:
            numel = size // 4
            x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
            sync(x)
            dist.barrier()
            compile_secs[0] = 0.0
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync(x)
            first = time.perf_counter() - t0
            compiled = compile_secs[0]
            xc = x.cpu()
            ok = bool((xc == expect).all())
            for _ in range(warmup):
                dist.all_reduce(x)
                sync(x)
            x.fill_(1e-6)  # the timed sums grow n-fold per call: stay finite for long runs
            sync(x)
            dist.barrier()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                dist.all_reduce(x)
                sync(x)
                times.append(time.perf_counter() - t0)
            rows.append({"size": size, "median": statistics.median(times), "min": min(times),
                         "first": first, "compile": compiled, "ok": ok})
        dist.barrier()
        dist.destroy_process_group()
        queue.put((backend, rank, rows, None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        queue.put((backend, rank, None, f"{type(e).__name__}: {e}"))
        raise


def run_backend(backend, nprocs, sizes, warmup, iters, timeout=1800):
    """Spawn `nprocs` processes for `backend`; returns one row per size (worst rank)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        pc = mp.start_processes(_worker, args=(backend, nprocs, port, sizes, warmup, iters, queue),
                                nprocs=nprocs, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not pc.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in pc.processes:
                    p.kill()
                raise TimeoutError(f"{backend}: the benchmark processes did not finish in "
                                   f"{timeout} s")
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    per_rank = {}
    while not queue.empty():
        b, r, rows, err = queue.get()
        if err is not None:
            raise RuntimeError(f"{backend} rank {r}: {err}")
        per_rank[r] = rows
    if len(per_rank) != nprocs:
        raise RuntimeError(f"{backend}: got results from ranks {sorted(per_rank)} only")
    merged = []
    for i, size in enumerate(sizes):
        rs = [per_rank[r][i] for r in range(nprocs)]
        merged.append({"size": size,
                       "median": max(x["median"] for x in rs),
                       "min": max(x["min"] for x in rs),
                       "first": max(x["first"] for x in rs),
                       "compile": max(x["compile"] for x in rs),
                       "ok": all(x["ok"] for x in rs)})
    return merged


# --------------------------------------------------------------------------
# table


def _bw(size, secs):
    return size / secs / 1e9 if secs > 0 else float("nan")


def format_table(results, nprocs):
    backends = list(results)
    factor = 2 * (nprocs - 1) / nprocs
    head = f"{'size':>9} {'backend':<12}{'median ms':>10}{'min ms':>9}{'algbw GB/s':>11}" \
           f"{'busbw GB/s':>11}{'first ms':>10}{'compile ms':>11}{'tpu/gloo':>9}"
    lines = [head, "-" * len(head)]
    sizes = [r["size"] for r in results[backends[0]]]
    for i, size in enumerate(sizes):
        gloo = results.get("gloo")
        for b in backends:
            r = results[b][i]
            alg = _bw(size, r["median"])
            ratio = ""
            if b != "gloo" and gloo is not None:
                ratio = f"{r['median'] / gloo[i]['median']:.2f}"
            bad = "" if r["ok"] else "  WRONG RESULT"
            lines.append(f"{_human(size) if b == backends[0] else '':>9} {b:<12}"
                         f"{r['median'] * 1e3:>10.3f}{r['min'] * 1e3:>9.3f}{alg:>11.3f}"
                         f"{alg * factor:>11.3f}{r['first'] * 1e3:>10.1f}"
                         f"{r['compile'] * 1e3:>11.1f}{ratio:>9}{bad}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: [_parse_size(x) for x in s.split(",") if x],
                   default=DEFAULT_SIZES, help="comma-separated message sizes in bytes")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--backends", default="gloo,tpu",
                   help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in BACKENDS:
            p.error(f"unknown backend {b!r} (choose from {', '.join(BACKENDS)})")
    if args.iters < 1 or args.warmup < 0 or args.nprocs < 1:
        p.error("--iters must be >= 1, --warmup >= 0, --nprocs >= 1")

    import jax
    import torch

    print(f"all_reduce(sum, float32), {args.nprocs} processes on "
          f"{socket.gethostname()} ({os.cpu_count()} CPUs), loopback; torch {torch.__version__}, "
          f"jax {jax.__version__}; iters={args.iters} warmup={args.warmup}", flush=True)
    results = {}
    for b in backends:
        t0 = time.perf_counter()
        results[b] = run_backend(b, args.nprocs, args.sizes, args.warmup, args.iters)
        print(f"  {b}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(format_table(results, args.nprocs))
    print("algbw = bytes / median latency; busbw = algbw * 2(n-1)/n; tpu/gloo = latency "
          "ratio; first = first call (includes compile); compile = JAX compile time in it")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nprocs": args.nprocs, "iters": args.iters, "results": results}, f,
                      indent=1)
    return 0 if all(r["ok"] for rows in results.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
