"""torchax as a peer in the benchmarks: its numbers, measured in a child process.

torchax (https://github.com/google/torchax, `pip install -e ".[bench]"`) runs
PyTorch programs on JAX with a Python tensor subclass. It claims PyTorch's
PrivateUse1 device for itself (as "jax") when imported, and torch_tpu claims
it as "tpu", so the two cannot share a process: the benchmark scripts run
this file as a child process, with the `torch.backends` autoload off
(TORCH_DEVICE_BACKEND_AUTOLOAD=0, so torch_tpu is not loaded there), in the
same run and on the same JAX platform as the torch_tpu measurements.

    python benchmarks/_torchax.py eager   --iters 2000 --repeats 7   # one JSON line
    python benchmarks/_torchax.py compile --steps 100

torchax releases up to 0.0.13 look up named-tensor (Dimname) overloads of a
few ATen ops at import time, which torch 2.13 no longer has
(`aten.prod.dim_Dimname`, ...). This child stands in a placeholder for those
missing lookups only (a table entry that matches no op); the names are
reported in the output ("shimmed"). Nothing else of torchax is changed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def version() -> str | None:
    """torchax's installed version, or None (not installed)."""
    if importlib.util.find_spec("torchax") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("torchax")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return "unknown"


NOT_INSTALLED = 'torchax not installed (pip install -e ".[bench]")'


def run(mode: str, *args: str, timeout: float = 1800) -> dict:
    """Run this file's `mode` in a child process: its JSON result, or {"error": why}."""
    if version() is None:
        return {"error": NOT_INSTALLED}
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    try:
        out = subprocess.run([sys.executable, os.path.join(HERE, "_torchax.py"), mode, *args],
                             capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"torchax child timed out after {timeout:.0f} s"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"torchax failed: {last[:200]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# the child


class _MissingOverload:
    """Stands for an ATen overload this torch no longer has (see the module docstring)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<overload {self.name} missing in torch {__import__('torch').__version__}>"


def _import_torchax():
    import torch
    import torch._ops as ops

    if "torch_tpu" in sys.modules:
        raise RuntimeError("torchax must run in a process without torch_tpu "
                           "(both claim PyTorch's PrivateUse1 device)")
    shimmed = []
    original = ops.OpOverloadPacket.__getattr__

    def getattr_(self, key):
        try:
            return original(self, key)
        except AttributeError:
            low = key.lower()
            if "dimname" not in low and "names" not in low:
                raise
            name = f"{self._qualified_op_name}.{key}"
            shimmed.append(name)
            return _MissingOverload(name)

    # torchax loads its op tables lazily (on the first op): keep the shim
    # until then. It only answers lookups that would raise AttributeError.
    ops.OpOverloadPacket.__getattr__ = getattr_
    import torchax

    env = torchax.default_env()
    with env:
        torch.ones(2, device="jax") + 1
    ops.OpOverloadPacket.__getattr__ = original
    return torchax, env, shimmed


def _eager(args):
    import statistics

    import jax
    import torch

    torchax, env, shimmed = _import_torchax()

    def wait(t):
        jax.block_until_ready(t.jax())

    def timed(fn):
        fn()
        wait(fn())
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                r = fn()
            wait(r)
            samples.append((time.perf_counter() - t0) / args.iters)
        return statistics.median(samples)

    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(64, 64), torch.randn(64, 64)
    with env:
        a, b = a_cpu.to("jax"), b_cpu.to("jax")
        cases = {"add": lambda: a + b, "mul": lambda: a * b, "matmul 64x64": lambda: a @ b,
                 "relu": lambda: torch.relu(a), "sum": lambda: a.sum()}
        per_op = {name: timed(fn) for name, fn in cases.items()}
    return {"version": version(), "device": str(jax.devices()[0].platform),
            "per_op_s": per_op, "shimmed": shimmed}


def _compile(args):
    import jax
    import torch
    import torch.nn.functional as F

    spec = importlib.util.spec_from_file_location("bench_compile", os.path.join(HERE, "compile.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torchax, env, shimmed = _import_torchax()
    from torchax import interop

    model = bench._torch_model("cpu")
    x = torch.randn(bench.BATCH, bench.WIDTH)
    y = torch.randn(bench.BATCH, bench.WIDTH)
    with env:
        params = {k: v.detach().to("jax") for k, v in model.named_parameters()}
        x, y = x.to("jax"), y.to("jax")

    def loss_fn(params, x, y):
        return F.mse_loss(torch.func.functional_call(model, params, (x,)), y)

    grad_fn = interop.jax_value_and_grad(loss_fn)

    def train(params, x, y):
        loss, grads = grad_fn(params, x, y)
        return {k: p - bench.LR * grads[k] for k, p in params.items()}, loss

    # torchax's jax_jit: the torch function traced by jax.jit (params donated,
    # as in the pure-JAX and torch_tpu rows).
    train = interop.jax_jit(train, kwargs_for_jax_jit={"donate_argnums": 0})
    state = {"params": params}

    def step():
        with env:
            state["params"], loss = train(state["params"], x, y)
        return loss

    def sync():
        jax.block_until_ready([p.jax() for p in state["params"].values()])

    c0 = time.process_time()
    t0 = time.perf_counter()
    first_loss = float(step().jax())
    first = time.perf_counter() - t0
    first_cpu = time.process_time() - c0
    med, best = bench._timeit(step, sync, args.steps)
    return {"version": version(), "device": str(jax.devices()[0].platform), "first": first,
            "first_cpu": first_cpu, "step_median": med, "step_min": best,
            "first_loss": first_loss, "shimmed": shimmed}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["eager", "compile"])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args(argv)
    out = _eager(args) if args.mode == "eager" else _compile(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
