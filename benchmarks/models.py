"""Training throughput of the example models: tpu eager (strict and fused), tpu compiled, torch CPU.

For each example (tiny configs by default) it runs training steps
(forward, loss, backward, SGD) side by side in one process and prints
throughput in the model's unit (tokens, images, samples per second), the
first compiled step's time (dynamo + AOTAutograd + XLA compile), and the
ratios. "fused" is eager inside `torch_tpu.fused()`: each step's ops are
recorded and run as one cached program at the optimizer step. Each timed step ends by reading the loss on the host, so
asynchronous dispatch is inside the measurement.

    python benchmarks/models.py [--models llama,resnet] [--steps 5] [--config tiny]
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(list_examples()))
    p.add_argument("--config", default="tiny")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
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
