"""torch.compile(backend="tpu") compiles a training graph's backward program in
the background from the forward's first call (graph.CompiledGraph._prebuild_backward):
the prebuilt program is the one the backward uses, values are the same as
with TORCH_TPU_PREBUILD_BACKWARD=0 and as on CPU, and a warm process loads
it from the cache."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from torch_tpu.compile import graph_cache


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train(device, compiled, steps=3, transposed_input=False):
    """Parameters and losses after `steps` SGD steps of a small MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4).to(device)
    x = x.t() if transposed_input else x.t().contiguous()
    y = torch.randn(4, 8).to(device)

    def loss_fn(x, y):
        return F.mse_loss(model(x), y)

    if compiled:
        loss_fn = torch.compile(loss_fn, backend="tpu")
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return [p.detach().cpu() for p in model.parameters()], losses


@pytest.mark.parametrize("transposed_input", [False, True])
def test_backward_prebuilt_is_used_and_matches(monkeypatch, transposed_input):
    monkeypatch.setenv("TORCH_TPU_PREBUILD_BACKWARD", "1")
    # Traced here: graphs loaded from a package are not paired again
    # (test_cold_then_warm_process).
    monkeypatch.setenv("TORCH_TPU_PRECOMPILE", "0")
    before = graph_cache.cache_stats()
    params, losses = _train("tpu", True, transposed_input=transposed_input)
    after = graph_cache.cache_stats()
    # The backward's program came from the background build: one forward and
    # one backward program for three steps, nothing built twice.
    assert after["prebuilt"] - before["prebuilt"] == 1
    assert after["lowered"] + after["disk_loads"] - before["lowered"] - before["disk_loads"] == 2

    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_TPU_PREBUILD_BACKWARD", "0")
    mid = graph_cache.cache_stats()
    params_off, losses_off = _train("tpu", True, transposed_input=transposed_input)
    assert graph_cache.cache_stats()["prebuilt"] == mid["prebuilt"]
    for a, b in zip(params + losses, params_off + losses_off):
        assert torch.equal(a, b)

    params_cpu, losses_cpu = _train("cpu", False, transposed_input=transposed_input)
    for a, b in zip(params + losses, params_cpu + losses_cpu):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_unforeseen_tangent_layout_builds_at_backward(monkeypatch):
    """A backward called with a tangent laid out otherwise than predicted
    (transposed) still gets the right gradients."""
    monkeypatch.setenv("TORCH_TPU_PREBUILD_BACKWARD", "1")
    torch.manual_seed(0)
    w_cpu = torch.randn(6, 5, requires_grad=True)
    g_cpu = torch.randn(5, 6)

    def f(w):
        return (w.t() * 2.0).relu()

    f(w_cpu).backward(g_cpu)
    w = w_cpu.detach().to("tpu").requires_grad_(True)
    g = g_cpu.t().contiguous().to("tpu").t()  # a transposed tangent
    torch.compile(f, backend="tpu")(w).backward(g)
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch, torch_tpu
    from torch_tpu.compile import graph_cache
    import test_compile_prebuild as t
    params, losses = t._train("tpu", True)
    s = graph_cache.cache_stats()
    print(json.dumps({"values": [p.flatten().tolist() for p in params + losses],
                      "prebuilt": s["prebuilt"], "lowered": s["lowered"],
                      "disk_loads": s["disk_loads"]}))
""")


@pytest.mark.parametrize("precompile", ["0", "1"])
def test_cold_then_warm_process(tmp_path, precompile):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"),
               TORCH_TPU_PREBUILD_BACKWARD="1", TORCH_TPU_PRECOMPILE=precompile)
    here = os.path.dirname(os.path.abspath(__file__))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CHILD, here], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["prebuilt"] == 1 and cold["lowered"] == 2 and cold["disk_loads"] == 0
    # The warm process loads both programs without lowering them: traced
    # again (precompile off), the backward on the background thread; from
    # the function's package (on, the default), the backward at its first
    # call (a package's graphs are not paired again).
    assert warm["prebuilt"] == (1 if precompile == "0" else 0)
    assert warm["disk_loads"] == 2 and warm["lowered"] == 0
    assert warm["values"] == cold["values"]
