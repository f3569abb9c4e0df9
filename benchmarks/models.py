"""Training throughput of the example models: tpu eager (strict and fused), tpu compiled, torch CPU.

For each example (tiny configs by default) it runs training steps
(forward, loss, backward, SGD) side by side in one process and prints
throughput in the model's unit (tokens, images, samples per second), the
first compiled step's time (dynamo + AOTAutograd + XLA compile), and the
ratios. "fused" is eager inside `torch_tpu.fused()`: each step's ops are
recorded and run as one cached program at the optimizer step. Each timed step ends by reading the loss on the host, so
asynchronous dispatch is inside the measurement.

    python benchmarks/models.py [--models llama,resnet] [--steps 5] [--config tiny]
    python benchmarks/models.py --mlp [--rounds 7]

`--mlp` measures issue 17's fused-mode target instead: the MLP training step
(4 x Linear 1024 with ReLU, batch 64, MSE, AdamW) in strict eager, fused
eager and torch.compile(backend="tpu"), next to the same step written in
pure JAX as one jax.jit with its parameters and AdamW state donated (the
compute floor of this machine). Alternating rounds of steps, each step reading
its loss; medians of the rounds: wall time, and the process's CPU time (all
threads) per step, which other jobs' load changes less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch_tpu  # noqa: E402,F401
from examples.registry import example_info, get_example, list_examples  # noqa: E402


def _step_fn(model, inputs, loss_fn, compiled, fused=False):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    forward = torch.compile(model, backend="tpu") if compiled else model

    def step():
        with torch_tpu.fused(fused):
            loss = loss_fn(forward(*inputs))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()

    return step


def _measure(name, config, device, compiled, steps, warmup, fused=False):
    model, inputs, loss_fn = get_example(name, config, device=device)
    step = _step_fn(model, inputs, loss_fn, compiled, fused)
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


_W, _B, _LAYERS = 1024, 64, 4


def _mlp_torch_step(mode):
    """One MLP + AdamW training step in `mode`: strict, fused or compiled."""
    torch.manual_seed(0)
    layers: list = []
    for _ in range(_LAYERS):
        layers += [torch.nn.Linear(_W, _W), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(_B, _W, device="tpu")
    y = torch.randn(_B, _W, device="tpu")
    forward = torch.compile(model, backend="tpu") if mode == "compiled" else model

    def step():
        with torch_tpu.fused(mode == "fused"):
            loss = torch.nn.functional.mse_loss(forward(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return loss.item()

    return step


def _mlp_jax_step():
    """The same step in pure JAX: one jax.jit, parameters and AdamW state donated."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    bound = 1 / _W ** 0.5
    params = []
    for i in range(_LAYERS):
        kw, kb = jax.random.split(jax.random.fold_in(key, i))
        params.append((jax.random.uniform(kw, (_W, _W), minval=-bound, maxval=bound),
                       jax.random.uniform(kb, (_W,), minval=-bound, maxval=bound)))
    x = jax.random.normal(jax.random.fold_in(key, 100), (_B, _W))
    y = jax.random.normal(jax.random.fold_in(key, 101), (_B, _W))

    def loss_fn(ps, x, y):
        h = x
        for i, (w, b) in enumerate(ps):
            h = h @ w.T + b
            if i < len(ps) - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    def train(ps, m, v, t, x, y):
        lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        ps = jax.tree_util.tree_map(
            lambda p, m, v: p * (1 - lr * wd) - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
            ps, m, v)
        return loss, ps, m, v, t

    fn = jax.jit(train, donate_argnums=(0, 1, 2))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = [params, zeros, jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0)]

    def step():
        loss, *state[:] = fn(*state, x, y)
        return float(loss)

    return step


def mlp(rounds, steps):
    """Issue 17's MLP step: strict, fused, compiled and the pure-JAX floor (ms)."""
    import os

    fns = {"strict": _mlp_torch_step("strict"), "fused": _mlp_torch_step("fused"),
           "compiled": _mlp_torch_step("compiled"), "jax.jit": _mlp_jax_step()}
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
            cpu[name].append((time.process_time() - c0) / steps * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"MLP step: {_LAYERS} x Linear {_W}, batch {_B}, AdamW; median of {rounds} rounds "
          f"of {steps} steps (ms per step); load {os.getloadavg()[0]:.1f}")
    print(f"{'':>10}" + "".join(f"{k:>12}" for k in med) + f"{'strict/fused':>14}"
          f"{'fused/compiled':>16}{'fused/jax':>11}")
    print(f"{'wall ms':>10}" + "".join(f"{v:>12.2f}" for v in med.values())
          + f"{med['strict'] / med['fused']:>14.2f}{med['fused'] / med['compiled']:>16.2f}"
          f"{med['fused'] / med['jax.jit']:>11.2f}")
    # CPU time of the whole process (all threads): the work a step costs,
    # which the load of other jobs changes less than the wall time.
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"{'cpu ms':>10}" + "".join(f"{v:>12.2f}" for v in cmed.values())
          + f"{cmed['strict'] / cmed['fused']:>14.2f}{cmed['fused'] / cmed['compiled']:>16.2f}"
          f"{cmed['fused'] / cmed['jax.jit']:>11.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(list_examples()))
    p.add_argument("--config", default="tiny")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mlp", action="store_true", help="issue 17's MLP step (see above)")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.mlp:
        mlp(args.rounds, args.steps)
        return
    print(f"device: {torch.tpu.get_device_name()}   config={args.config} "
          f"steps={args.steps} (median step; throughput = items per batch / step)")
    head = (f"{'model':<8}{'unit':>8}{'tpu eager/s':>13}{'tpu fused/s':>13}{'tpu compiled/s':>16}"
            f"{'cpu eager/s':>13}{'compile s':>11}{'compiled/eager':>16}{'fused/eager':>13}"
            f"{'eager/cpu':>11}")
    print(head)
    for name in args.models.split(","):
        info = example_info(name, args.config)
        items = info["items_per_batch"]
        _, eager = _measure(name, args.config, "tpu", False, args.steps, args.warmup)
        _, fz = _measure(name, args.config, "tpu", False, args.steps, args.warmup, fused=True)
        first, comp = _measure(name, args.config, "tpu", True, args.steps, args.warmup)
        _, cpu = _measure(name, args.config, "cpu", False, args.steps, args.warmup)
        print(f"{name:<8}{info['unit']:>8}{items / eager:>13.0f}{items / fz:>13.0f}"
              f"{items / comp:>16.0f}{items / cpu:>13.0f}{first:>11.2f}{eager / comp:>16.2f}"
              f"{eager / fz:>13.2f}{cpu / eager:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
