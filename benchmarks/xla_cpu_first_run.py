"""XLA:CPU's first execution of a loaded executable, with and without XLA flags.

A warm torch_tpu process (executable deserialized from the cache directory)
spends most of its first compiled step in XLA:CPU's *first execution* of the
program, not in loading it. This script reproduces that in pure JAX, with no
torch_tpu involved: a jitted 4-layer MLP training step (1024 wide, batch 64,
fwd + bwd + SGD, as benchmarks/compile.py), compiled, serialized, then in a
*new process* deserialized and run; it prints the deserialize, first and
second execution and the steady-state step (median) in ms, per XLA_FLAGS
setting, alternating settings run by run so machine load hits all alike.

    python benchmarks/xla_cpu_first_run.py --runs 5
    python benchmarks/xla_cpu_first_run.py --flags "--xla_cpu_use_xnnpack=false"
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

DEFAULT_SETTINGS = [
    "",
    "--xla_cpu_use_xnnpack=false",
    "--xla_cpu_use_onednn=false",
    "--xla_cpu_multi_thread_eigen=false",
    "--xla_cpu_opt_preset=FAST_COMPILE",
]


def _child(mode: str, path: str, steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import serialize_executable as se

    def loss(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < LAYERS - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    def step(params, x, y):
        lv, g = jax.value_and_grad(loss)(params, x, y)
        return [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, g)], lv

    rng = np.random.default_rng(0)
    params = [(jnp.asarray(rng.standard_normal((WIDTH, WIDTH), np.float32) * 0.02),
               jnp.zeros((WIDTH,), jnp.float32)) for _ in range(LAYERS)]
    x = jnp.asarray(rng.standard_normal((BATCH, WIDTH), np.float32))
    y = jnp.asarray(rng.standard_normal((BATCH, WIDTH), np.float32))
    out = {}
    t = time.perf_counter()
    lowered = jax.jit(step).lower(params, x, y)
    if mode == "cold":
        compiled = lowered.compile()
        out["compile_ms"] = (time.perf_counter() - t) * 1e3
        payload, in_tree, out_tree = se.serialize(compiled)
        with open(path, "wb") as f:
            f.write(payload)
        return out
    with open(path, "rb") as f:
        payload = f.read()
    in_tree, out_tree = lowered.in_tree, jax.tree.structure((params, x[0, 0]))
    t = time.perf_counter()
    compiled = se.deserialize_and_load(payload, in_tree, out_tree)
    out["load_ms"] = (time.perf_counter() - t) * 1e3
    times = []
    p = params
    for _ in range(steps):
        t = time.perf_counter()
        p, lv = compiled(p, x, y)
        jax.block_until_ready((p, lv))
        times.append((time.perf_counter() - t) * 1e3)
    out["first_ms"], out["second_ms"] = times[0], times[1]
    out["steady_ms"] = statistics.median(times[3:])
    return out


def _run(mode, path, flags, steps):
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, __file__, "--child", mode, path, str(steps)],
                       env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="cold+warm process pairs per setting")
    p.add_argument("--steps", type=int, default=30, help="steps timed in the warm process")
    p.add_argument("--flags", action="append", help="XLA_FLAGS settings to compare "
                   "(repeatable; '' = none); default: a built-in list")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(_child(a.child[0], a.child[1], int(a.child[2]))))
        return
    settings = a.flags if a.flags is not None else DEFAULT_SETTINGS
    res = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.runs):
            for i, s in enumerate(settings):  # alternate settings within each round
                path = os.path.join(d, f"exe{i}")
                cold = _run("cold", path, s, a.steps)
                res[s].append({**cold, **_run("warm", path, s, a.steps)})
    print(f"load: {os.getloadavg()[0]:.2f} (1-min avg at the end); medians of {a.runs} "
          f"processes, ms")
    keys = ("compile_ms", "load_ms", "first_ms", "second_ms", "steady_ms")
    print(f"{'XLA_FLAGS':44s}" + "".join(f"{k[:-3]:>10s}" for k in keys))
    for s, rs in res.items():
        print(f"{(s or '(none)'):44s}"
              + "".join(f"{statistics.median(r[k] for r in rs):10.1f}" for k in keys))


if __name__ == "__main__":
    main()
