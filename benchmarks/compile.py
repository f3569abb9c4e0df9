"""torch.compile(backend="tpu") against pure JAX, torchax, torch CPU eager and inductor.

    python benchmarks/compile.py            # all measurements, one table
    python benchmarks/compile.py --quick    # fewer timed steps
    python benchmarks/compile.py --opt-levels 0,1,2,3   # + the XLA optimization levels

Model: 4 Linear layers of width 1024 (ReLU between), batch 64, MSE loss,
SGD. A training step is forward + backward + the SGD update.

1. steady-state step time: torch_tpu compiled (forward+loss and the optimizer
   step compiled), the same network in pure JAX under one `jax.jit` (params
   donated), the same torch model under torchax's `jax_jit` (its
   `jax_value_and_grad` and the SGD update in one jitted torch function,
   params donated; a child process of this run, see benchmarks/_torchax.py;
   "not installed" when torchax is missing), torch CPU eager, torch CPU
   inductor. Target: torch_tpu / JAX <= 1.1.
2. first-call time: the first compiled step (dynamo + AOTAutograd + lowering
   + XLA compile, plus the eager ops of the step: zero_grad, the backward
   seed) against `jax.jit`'s first call (trace + compile). Both run with an
   empty persistent cache (a private temporary directory), so both compile.
   Target <= 2x.
3. warm start: a new process running the first compiled step with the
   persistent compile cache filled by a previous process, against a cold one
   (empty cache directory). Target: >= 10x faster. Each side is the median
   of --warm-runs whole processes (default 5): a cold run gets a fresh
   directory, the warm run after it uses the directory that cold run filled.
   ``--warm-only`` runs just this part. It runs with the default
   (precompile on: the warm process also loads the dynamo packages at the
   ``torch.compile(...)`` calls) and with ``TORCH_TPU_PRECOMPILE=0``
   (``--precompile``): the comparison is of those calls plus the first step.
   Besides the phases below, "gc" is the
   cyclic garbage collector's share of the first step (gc.callbacks), and
   ``--profile-warm`` prints the top functions of one warm first step
   (cProfile, cumulative). "second step" is the wall time of the next
   step: the floor a warm first step approaches (XLA:CPU's first run of an
   executable adds its own one-time work, which `jax.jit` pays too).
   compile_step's warm process rebuilds the traced graph from the cache
   directory (`torch_tpu.compile.persist.steps`) instead of tracing the step.

What the times include: "first step" is the wall time of the first
`step()` call only. Process start-up (importing torch, jax and torch_tpu),
building the model, moving it to the device and the `torch.compile(...)`
calls themselves are outside it; the start-up import time is reported on
its own line. The first step is split into phases: "dynamo" (dynamo's
bytecode tracing, guards, and everything else not listed), "aot" (the
backend call: AOTAutograd's functionalization, decompositions and
partitioning, plus the backend's graph set-up), "graphs" (our lowering to
a jaxpr/StableHLO and XLA compilation, or a load from the persistent
tiers) and "eager" (eager op executables compiled or loaded during the
step). A garbage collection counts in the phase it interrupts: a full one
(0.28 s before torch_tpu froze the import-time objects, see
`torch_tpu.runtime.gc_pause.freeze`) fell in "graphs" in a cold process and
in "dynamo" (an eager op's submit) in a warm one. Timings on a shared
machine vary by tens of percent; compare runs
made back to back.

Whole step as one program (unless --no-whole-step): the same step through
`torch_tpu.compile_step` (forward, backward, the SGD update and
zero_grad(set_to_none=True) traced into one program, parameters donated; the
gradients are dropped in the step as the JAX step drops them): its steady-state step time
and first call (a private empty cache) in the table, and its warm start
(new processes) after the others.

4. with --opt-levels: per XLA optimization level (TORCH_TPU_XLA_OPT_LEVEL,
   torch_tpu.runtime.opt_level), a new process with an empty cache: the
   first compiled step (its graph programs' lowering + XLA compile, and its
   CPU seconds) and the steady-state step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WIDTH, BATCH, LAYERS, LR = 1024, 64, 4, 1e-3


def _timeit(step, sync, n, warmup=3):
    for _ in range(warmup):
        step()
    sync()
    samples = []
    for _ in range(max(3, n // 10)):
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        sync()
        samples.append((time.perf_counter() - t0) / 10)
    return statistics.median(samples), min(samples)


def _torch_model(device):
    import torch

    torch.manual_seed(0)
    layers = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < LAYERS - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


class _GcClock:
    """Seconds the cyclic garbage collector ran in this process (gc.callbacks)."""

    def __init__(self):
        import gc

        self.seconds = 0.0
        self.collections = 0
        self._t0 = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.collections += 1
            self._t0 = None


_GC = None


def gc_clock():
    global _GC
    if _GC is None:
        _GC = _GcClock()
    return _GC


def torch_step(device, backend=None, compile_optimizer=True, whole_step=False):
    """(first-step seconds, step function, sync function).

    whole_step: the whole step (zero_grad, forward, backward, optimizer
    step) through `torch_tpu.compile_step`, one program.
    """
    import torch
    import torch.nn.functional as F

    model = _torch_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(BATCH, WIDTH).to(device)
    y = torch.randn(BATCH, WIDTH).to(device)

    def forward_loss(x, y):
        return F.mse_loss(model(x), y)

    t0 = time.perf_counter()
    if whole_step:
        import torch_tpu

        def train_step(x, y):
            loss = forward_loss(x, y)
            loss.backward()
            opt.step()
            # Gradients dropped inside the step (as the JAX step drops
            # them): the program does not write them out (1.5x -> 1.0x JAX
            # on XLA:CPU); zero_grad at the start would keep them in .grad.
            opt.zero_grad(set_to_none=True)
            return loss

        compiled = torch_tpu.compile_step(train_step, modules=model, optimizers=opt)

        def step():
            return compiled(x, y)
    else:
        loss_fn = torch.compile(forward_loss, backend=backend) if backend else forward_loss
        opt_step = (torch.compile(opt.step, backend=backend)
                    if backend == "tpu" and compile_optimizer else opt.step)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(x, y)
            loss.backward()
            opt_step()
            return loss
    # With TORCH_TPU_PRECOMPILE=1 a warm process loads its packages here.
    compile_calls = time.perf_counter() - t0

    if device == "tpu":
        sync = torch.tpu.synchronize
    else:
        def sync():
            pass
    # Counters just before the first step (set-up compiled eager ops already).
    step.before = phases(0.0) if device == "tpu" else None
    gc0 = (gc_clock().seconds, gc_clock().collections)
    prof = getattr(torch_step, "profiler", None)
    c0 = time.process_time()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    step().item()
    if prof is not None:
        prof.disable()
    first = time.perf_counter() - t0
    # CPU seconds of this process (all threads): steadier than wall time
    # on a machine shared with other work.
    step.first_cpu = time.process_time() - c0
    step.first_gc = (gc_clock().seconds - gc0[0], gc_clock().collections - gc0[1])
    step.compile_calls = compile_calls
    if device == "tpu":
        # The second step: what the first one costs once nothing is traced,
        # lowered or loaded, minus XLA's one-time work in its first run.
        t0 = time.perf_counter()
        step().item()
        step.second = time.perf_counter() - t0
    return first, step, sync


def jax_step():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from torch_tpu.runtime import platform

    dev = platform.jax_device(0)
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(WIDTH)
    params = [(jax.device_put(rng.uniform(-bound, bound, (WIDTH, WIDTH)).astype(np.float32), dev),
               jax.device_put(rng.uniform(-bound, bound, (WIDTH,)).astype(np.float32), dev))
              for _ in range(LAYERS)]
    x = jax.device_put(rng.standard_normal((BATCH, WIDTH)).astype(np.float32), dev)
    y = jax.device_put(rng.standard_normal((BATCH, WIDTH)).astype(np.float32), dev)

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w.T + b
            if i < LAYERS - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    def train(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)
        return params, loss

    train = jax.jit(train, donate_argnums=0)
    state = {"params": params}

    def step():
        state["params"], loss = train(state["params"], x, y)
        return loss

    c0 = time.process_time()
    t0 = time.perf_counter()
    float(step())
    first = time.perf_counter() - t0
    step.first_cpu = time.process_time() - c0

    def sync():
        jax.block_until_ready(state["params"])

    return first, step, sync


def phases(first, before=None):
    """Split a first step's wall time into phases (see the module docstring)."""
    import torch_tpu.cache as cache

    s = cache.stats()
    g = s["graphs"]
    eager = sum(e["seconds"] for e in s["per_entry"] if not e["name"].startswith("graph"))
    out = {"first": first, "aot": g["backend_seconds"],
           "graphs": g["lower_compile_seconds"] + g["load_seconds"], "eager": eager,
           "lowered": g["lowered"], "loaded": g["disk_loads"], "prebuilt": g.get("prebuilt", 0),
           "compile": s["compile_seconds"],
           "trace": sum(e["trace_seconds"] for e in s["per_entry"]),
           "by_source": s["compile_seconds_by_source"]}
    if before is not None:
        for k in ("aot", "graphs", "eager", "lowered", "loaded", "prebuilt", "compile", "trace"):
            out[k] -= before[k]
    out["dynamo"] = out["first"] - out["aot"] - out["graphs"] - out["eager"]
    return out


def _phase_line(p):
    # A backward program compiled in the background (graph.CompiledGraph._prebuild_backward)
    # overlaps the other phases: "graphs" then counts seconds of two threads
    # and "dynamo" (the rest of the wall time) comes out too small.
    bg = (f", {p['prebuilt']} of them compiled in the background (overlapping: graphs "
          f"counts both threads)" if p.get("prebuilt") else "")
    return (f"dynamo {p['dynamo']:.2f} s, aot {p['aot']:.2f} s, graphs {p['graphs']:.2f} s "
            f"({p['lowered']} lowered, {p['loaded']} loaded without lowering{bg}), "
            f"eager {p['eager']:.2f} s")


_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import importlib.util
import torch, torch_tpu, torch_tpu.cache as cache
t_import = time.perf_counter() - t0
spec = importlib.util.spec_from_file_location("bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
sys.modules["bench"] = bench  # as an imported module is (compile packages name it)
spec.loader.exec_module(bench)
torch.tpu.set_matmul_precision(sys.argv[2])
profile = sys.argv[3] == "profile"
if profile:
    import cProfile, io, pstats
    prof = cProfile.Profile()
    bench.torch_step.profiler = prof
first, step, sync = bench.torch_step("tpu", backend="tpu",
                                     compile_optimizer=sys.argv[4] != "0",
                                     whole_step=sys.argv[4] == "step")
out = bench.phases(first, step.before)
out["import"] = t_import
out["cpu"] = step.first_cpu
out["gc"], out["gc_collections"] = step.first_gc
out["compile_calls"] = step.compile_calls
out["first_total"] = first + step.compile_calls
out["second"] = step.second
from torch_tpu.compile.persist import steps as _steps
out["step_cache"] = _steps.stats()
if profile:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    out["profile"] = text.getvalue()
print(json.dumps(out))
"""


_LEVEL_CHILD = r"""
import json, sys, time
import importlib.util
import torch, torch_tpu
spec = importlib.util.spec_from_file_location("bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
sys.modules["bench"] = bench  # as an imported module is (compile packages name it)
spec.loader.exec_module(bench)
torch.tpu.set_matmul_precision(sys.argv[2])
first, step, sync = bench.torch_step("tpu", backend="tpu")
out = bench.phases(first, step.before)
out["cpu"] = step.first_cpu
out["step"] = bench._timeit(step, sync, int(sys.argv[3]))
print(json.dumps(out))
"""


def opt_level_runs(levels, precision, n):
    """Per level, a new process with an empty cache: first step and step time."""
    runs = {}
    for level in levels:
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TORCH_TPU_CACHE_DIR=d, TORCH_TPU_XLA_OPT_LEVEL=str(level))
            out = subprocess.run([sys.executable, "-c", _LEVEL_CHILD, os.path.abspath(__file__),
                                  precision, str(n)], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            runs[level] = json.loads(out.stdout.strip().splitlines()[-1])
    return runs


def _child(precision, env, profile=False, compile_optimizer=True):
    mode = compile_optimizer if isinstance(compile_optimizer, str) else (
        "1" if compile_optimizer else "0")
    argv = [sys.executable, "-c", _CHILD, os.path.abspath(__file__), precision,
            "profile" if profile else "-", mode]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def warm_start(precision, runs=5, profile=False, precompile=False, compile_optimizer=True):
    """(cold, warm): per-key medians over `runs` cold/warm process pairs.

    Each pair: a cold process on a fresh cache directory, then a warm one
    on the directory it filled. With `profile`, one more warm process runs
    under cProfile (its report in warm["profile"]).
    """
    cold_runs, warm_runs = [], []
    for i in range(max(1, runs)):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TORCH_TPU_CACHE_DIR=d,
                       TORCH_TPU_PRECOMPILE="1" if precompile else "0")
            cold_runs.append(_child(precision, env, compile_optimizer=compile_optimizer))
            warm_runs.append(_child(precision, env, compile_optimizer=compile_optimizer))
            if profile and i == 0:
                prof = _child(precision, env, True, compile_optimizer)["profile"]
    cold, warm = _median_runs(cold_runs), _median_runs(warm_runs)
    if profile:
        warm["profile"] = prof
    return cold, warm


def _median_runs(runs):
    """The median of every numeric field; the samples of the first step."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)):
            out[k] = statistics.median(r[k] for r in runs)
    out["step_cache"] = runs[0].get("step_cache")
    out["by_source"] = {src: {f: statistics.median(r["by_source"][src][f] for r in runs)
                              for f in ("count", "seconds")}
                        for src in runs[0]["by_source"]}
    out["samples"] = [r["first"] for r in runs]
    out["cpu_samples"] = [r["cpu"] for r in runs]
    out["runs"] = len(runs)
    return out


def _warm_lines(cold, warm, label="default"):
    lines = [f"-- {label}"]
    for name, r in (("cold", cold), ("warm", warm)):
        samples = ", ".join(f"{x:.2f}" for x in r["samples"])
        lines.append(
            f"new process, {name} cache (median of {r['runs']}): imports {r['import']:.2f} s "
            f"(not in the first step); torch.compile calls {r['compile_calls']:.2f} s; "
            f"first step {r['first']:.2f} s [{samples}] (CPU "
            f"{r['cpu']:.2f} s) = {_phase_line(r)}; gc {r['gc']:.2f} s in "
            f"{r['gc_collections']:.0f} collections (inside the phases); executables "
            f"{r['compile']:.2f} s, of which tracing {r['trace']:.2f} s (XLA compiled "
            f"{r['by_source']['compiled']['count']:.0f}, from disk "
            f"{r['by_source']['disk']['count']:.0f}); second step {r['second']:.3f} s")
        sc = r.get("step_cache")
        if label.startswith("torch_tpu.compile_step") and sc:
            lines[-1] += (f"; compile_step graphs rebuilt from the cache dir "
                          f"{sc['hits']}, traced and stored {sc['misses']}")
    lines.append(
        f"warm start: torch.compile calls + first step {cold['first_total']:.2f} s -> "
        f"{warm['first_total']:.2f} s = {cold['first_total'] / warm['first_total']:.1f}x; "
        f"first step {cold['first'] / warm['first']:.1f}x faster, in CPU seconds "
        f"{cold['cpu'] / warm['cpu']:.1f}x (target >= 10x); executables "
        f"{cold['compile'] / max(warm['compile'], 1e-9):.1f}x, graph programs "
        f"{cold['graphs'] / max(warm['graphs'], 1e-9):.1f}x; "
        + ("phases 'dynamo' + 'aot' (compile_step: the trace, or the graph's rebuild, "
           "and XLA's first execution) " if label.startswith("torch_tpu.compile_step")
           else "dynamo and AOTAutograd ")
        + f"{warm['dynamo'] + warm['aot']:.2f} s warm vs "
        f"{cold['dynamo'] + cold['aot']:.2f} s cold; the warm first step is "
        f"{warm['first'] / warm['second']:.1f}x the second step's {warm['second']:.3f} s")
    if "profile" in warm:
        lines.append("one warm first step under cProfile (cumulative):")
        lines.append(warm["profile"])
    return lines


def _warm_runs(args):
    """The warm-start comparison per --precompile setting (lists of lines)."""
    out = []
    for on in {"off": [False], "on": [True], "both": [False, True]}[args.precompile]:
        cold, warm = warm_start(args.precision, args.warm_runs, args.profile_warm, on,
                                not args.eager_optimizer)
        label = "default (precompile)" if on else "TORCH_TPU_PRECOMPILE=0"
        if args.eager_optimizer:
            label += ", optimizer step eager (not compiled)"
        out.append(_warm_lines(cold, warm, label))
    if not args.no_whole_step:
        # torch_tpu.compile_step: nothing of dynamo or AOTAutograd runs; a
        # warm process rebuilds the traced graph from the cache directory
        # (torch_tpu.compile.persist.steps) and loads its program.
        cold, warm = warm_start(args.precision, args.warm_runs, args.profile_warm, False,
                                "step")
        out.append(_warm_lines(cold, warm, "torch_tpu.compile_step (whole step, one program)"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-inductor", action="store_true")
    p.add_argument("--precision", default="default", choices=["default", "high", "highest"],
                   help="torch.tpu.set_matmul_precision for the torch_tpu runs (default: "
                        "'default', what jax.jit uses)")
    p.add_argument("--no-torchax", action="store_true", help="skip the torchax row")
    p.add_argument("--opt-levels", default="",
                   help="comma-separated XLA optimization levels to compare (e.g. 0,1,2,3)")
    p.add_argument("--warm-runs", type=int, default=5,
                   help="cold/warm process pairs for the warm-start comparison (median)")
    p.add_argument("--warm-only", action="store_true",
                   help="run only the warm-start comparison (new processes)")
    p.add_argument("--profile-warm", action="store_true",
                   help="also profile one warm first step (cProfile, top functions)")
    p.add_argument("--precompile", default="both", choices=["off", "on", "both"],
                   help="warm start with TORCH_TPU_PRECOMPILE=0 (off) and/or with the "
                        "default (on: dynamo packages in the cache dir)")
    p.add_argument("--no-whole-step", action="store_true",
                   help="skip the torch_tpu.compile_step rows (the whole step as one program)")
    p.add_argument("--eager-optimizer", action="store_true",
                   help="warm start: run optimizer.step eagerly (PyTorch never packages a "
                        "compiled one, so it is traced in every process)")
    args = p.parse_args(argv)
    n = 30 if args.quick else 100
    if args.warm_only:
        print(f"4-layer MLP, width {WIDTH}, batch {BATCH}, fwd+bwd+SGD; matmul precision "
              f"{args.precision}; load average {os.getloadavg()[0]:.1f}")
        for lines in _warm_runs(args):
            print("\n".join(lines))
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        return

    import torch
    import torch_tpu
    import torch_tpu.cache as cache
    from torch_tpu.runtime import opt_level

    # Cold first calls for both torch_tpu and jax.jit: a private, empty
    # persistent cache (the default directory may hold earlier runs' programs).
    tmp_cache = tempfile.TemporaryDirectory()
    cache.set_dir(tmp_cache.name)
    # jax.jit runs float32 dots at JAX's default precision: compare like with like.
    torch.tpu.set_matmul_precision(args.precision)
    rows = []
    first_tpu, step, sync = torch_step("tpu", backend="tpu")
    main_phases = phases(first_tpu, step.before)
    main_phases["cpu"] = step.first_cpu
    t_tpu = _timeit(step, sync, n)
    first_jax, jstep, jsync = jax_step()
    t_jax = _timeit(jstep, jsync, n)
    # The load changes between rows on a shared machine: torch.compile and
    # JAX also timed alternately (3 rounds), the ratio per round.
    plain_rounds = []
    for _ in range(3):
        a = _timeit(step, sync, n)
        b = _timeit(jstep, jsync, n)
        plain_rounds.append((a[0] / b[0], a[1] / b[1], a[0], b[0]))
    _, cstep, csync = torch_step("cpu")
    rows.append(("torch_tpu compiled (backend='tpu')", t_tpu, first_tpu))
    if not args.no_whole_step:
        # A private empty cache again: this first call compiles too.
        tmp_step = tempfile.TemporaryDirectory()
        cache.set_dir(tmp_step.name)
        first_ws, wstep, wsync = torch_step("tpu", whole_step=True)
        ws_cpu = wstep.first_cpu
        t_ws = _timeit(wstep, wsync, n)
        cache.set_dir(tmp_cache.name)
        rows.append(("torch_tpu.compile_step (one program)", t_ws, first_ws))
    if not args.no_whole_step:
        # On a shared machine the load changes between rows: also time
        # compile_step and JAX alternately (3 rounds), the ratio per round.
        interleaved = []
        for _ in range(3):
            a = _timeit(wstep, wsync, n)
            b = _timeit(jstep, jsync, n)
            interleaved.append((a[0] / b[0], a[1] / b[1], a[0], b[0]))
    rows.append(("pure JAX (jax.jit)", t_jax, first_jax))
    # torchax: a child process (it and torch_tpu both claim PrivateUse1).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _torchax

    tx = ({"error": "torchax skipped (--no-torchax)"} if args.no_torchax
          else _torchax.run("compile", "--steps", str(n)))
    if "error" in tx:
        rows.append((f"torchax: {tx['error']}", (float("nan"),) * 2, None))
    else:
        rows.append((f"torchax {tx['version']} (jax_jit)", (tx["step_median"], tx["step_min"]),
                     tx["first"]))
    rows.append(("torch CPU eager", _timeit(cstep, csync, n), None))
    if not args.skip_inductor:
        try:
            first_ind, istep, isync = torch_step("cpu", backend="inductor")
            rows.append(("torch CPU inductor", _timeit(istep, isync, n), first_ind))
        except Exception as e:  # noqa: BLE001 - no C++ compiler, etc.
            rows.append((f"inductor failed ({type(e).__name__})", (float("nan"),) * 2, None))
    levels = ([opt_level.check(v, "--opt-levels") for v in args.opt_levels.split(",")]
              if args.opt_levels else [])
    level_runs = opt_level_runs(levels, args.precision, n) if levels else {}

    print(f"4-layer MLP, width {WIDTH}, batch {BATCH}, fwd+bwd+SGD; platform "
          f"{torch_tpu.runtime.platform.platform()}, matmul precision {args.precision}, "
          f"XLA opt level {opt_level.level()}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':40s} {'step ms (median/min)':>22s} {'first call s':>13s}")
    for name, (med, best), first in rows:
        f = f"{first:13.2f}" if first is not None else f"{'-':>13s}"
        print(f"{name:40s} {med * 1e3:11.2f} /{best * 1e3:8.2f} {f}")
    print(f"step time torch_tpu / JAX: {t_tpu[0] / t_jax[0]:.2f} median, "
          f"{t_tpu[1] / t_jax[1]:.2f} min (target <= 1.1)")
    print("torch.compile / JAX step time, alternating rounds (median, min ratios; ms): " +
          "; ".join(f"{r[0]:.2f}, {r[1]:.2f} ({r[2] * 1e3:.2f} vs {r[3] * 1e3:.2f})"
                    for r in plain_rounds))
    print(f"first call torch_tpu / jax.jit: {first_tpu / first_jax:.2f}, in CPU seconds "
          f"{main_phases['cpu'] / jstep.first_cpu:.2f} (target <= 2); "
          f"torch_tpu first step {first_tpu:.2f} s (CPU {main_phases['cpu']:.2f} s) = "
          f"{_phase_line(main_phases)}")
    if not args.no_whole_step:
        print(f"compile_step: step time / JAX {t_ws[0] / t_jax[0]:.2f} median, "
              f"{t_ws[1] / t_jax[1]:.2f} min (target <= 1.1); first call / jax.jit "
              f"{first_ws / first_jax:.2f}, in CPU seconds {ws_cpu / jstep.first_cpu:.2f} "
              f"(target <= 2)")
        print("compile_step / JAX step time, alternating rounds (median, min ratios; ms): " +
              "; ".join(f"{r[0]:.2f}, {r[1]:.2f} ({r[2] * 1e3:.2f} vs {r[3] * 1e3:.2f})"
                        for r in interleaved))
    sys.stdout.flush()  # the table first: the warm runs below take minutes
    for lines in _warm_runs(args):
        print("\n".join(lines))
    if "error" not in tx:
        print(f"torchax row: first call {tx['first']:.2f} s (CPU {tx['first_cpu']:.2f} s); a child "
              f"process; {len(set(tx['shimmed']))} named-tensor overloads missing in torch "
              f"{torch.__version__.split('+')[0]} stood in at its import (benchmarks/_torchax.py)")
    if level_runs:
        print("XLA optimization level (new process, empty cache each): first compiled step "
              "and steady-state step")
        print(f"{'level':>6s} {'first step s':>13s} {'CPU s':>7s} {'graphs s':>9s} "
              f"{'eager s':>8s} {'step ms (median/min)':>22s}")
        for level, r in level_runs.items():
            med, best = r["step"]
            print(f"{level:>6d} {r['first']:13.2f} {r['cpu']:7.2f} {r['graphs']:9.2f} "
                  f"{r['eager']:8.2f} {med * 1e3:11.2f} /{best * 1e3:8.2f}")
    tmp_cache.cleanup()
    if not args.no_whole_step:
        tmp_step.cleanup()


if __name__ == "__main__":
    main()
