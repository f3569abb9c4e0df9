"""torch_tpu.compile_step: forward, backward and optimizer.step as one program.

Parity with eager CPU over several steps (SGD with momentum, AdamW), one
program per step after warm-up, parameters and optimizer state updated in
place (identity kept, donated), user references seeing the new values,
hyperparameter changes honored, and cold and warm processes sharing one
cache directory.
"""

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
import torch_tpu.debug
from torch_tpu.compile import graph_cache


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _data(n=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)) for _ in range(n)]


def _make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def _mse_step(model, opt):
    """The training step every test compiles: zero_grad, MSE loss, backward, step."""
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _train(model, opt, batches, device, compiled):
    step = _mse_step(model, opt)

    fn = torch_tpu.compile_step(step) if compiled else step
    return [fn(x.to(device), y.to(device)).detach().cpu() for x, y in batches]


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_matches_eager_cpu_over_steps(kind):
    batches = _data(4)
    ref = _model()
    ref_opt = _make_opt(kind, ref.parameters())
    ref_losses = _train(ref, ref_opt, batches, "cpu", compiled=False)

    model = _model().to("tpu")
    opt = _make_opt(kind, model.parameters())
    params = list(model.parameters())
    losses = _train(model, opt, batches, "tpu", compiled=True)
    for got, want in zip(losses, ref_losses):
        _close(got, want)
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p, q)
        _close(p.grad, q.grad)
    # Same Parameter objects; the optimizer state matches CPU's.
    assert all(a is b for a, b in zip(params, model.parameters()))
    for p, q in zip(model.parameters(), ref.parameters()):
        st, ref_st = opt.state[p], ref_opt.state[q]
        assert set(st) == set(ref_st)
        for k in st:
            _close(torch.as_tensor(st[k]).float(), torch.as_tensor(ref_st[k]).float())


def test_one_program_per_step_with_state_donated_in_place(cache_dir):
    # cache_dir: a private, empty disk tier, so the step is traced here (counted below)
    model = _model().to("tpu")
    opt = _make_opt("adamw", model.parameters())

    step = torch_tpu.compile_step(_mse_step(model, opt))

    x, y = (t.to("tpu") for t in _data(1)[0])
    step(x, y)
    step(x, y)  # the optimizer state exists now: the steady-state program
    w = model[0].weight
    alias = w.detach()  # shares w's storage, as a user's reference would
    states = {k: v for k, v in opt.state[w].items()}
    before = w.detach().cpu().clone()
    donating = graph_cache.GRAPH_STATS.donating_calls
    with torch_tpu.debug.capture() as cap:
        step(x, y)
        step(x, y)
    m = cap.metrics
    # Two steps, two graph programs, no eager op executions.
    assert m["cache"]["graphs"]["runs"] == 2, m["cache"]
    assert m["ops_total"] == 0, m["ops"]
    assert m["cache"]["misses"] == 0
    assert step.traces == 2  # first step (state created) and the steady state
    # Identity: the same Parameter and state tensors, holding new values.
    assert model[0].weight is w
    assert all(opt.state[w][k] is v for k, v in states.items())
    assert not torch.equal(w.detach().cpu(), before)
    # The user's alias sees the update (as on CUDA): its storage is shared.
    _close(alias, w)
    del alias
    step(x, y)
    assert graph_cache.GRAPH_STATS.donating_calls > donating


def test_hyperparameter_change_is_honored():
    batches = _data(3)
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model = _model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run(m, o, dev, compiled):
        step = _mse_step(m, o)
        fn = torch_tpu.compile_step(step) if compiled else step
        for i, (x, y) in enumerate(batches):
            o.param_groups[0]["lr"] = 0.1 / (i + 1)
            fn(x.to(dev), y.to(dev))

    run(ref, ref_opt, "cpu", False)
    run(model, opt, "tpu", True)
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p, q)


def test_batchnorm_buffers_and_dropout():
    """Running statistics (mutated without a schema annotation) are updated
    in place as on CPU; dropout draws a new mask every call."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8))
    model = copy.deepcopy(ref).to("tpu")
    running_mean = model[1].running_mean
    ref_losses = _train(ref, _make_opt("sgd", ref.parameters()), _data(3), "cpu", False)
    losses = _train(model, _make_opt("sgd", model.parameters()), _data(3), "tpu", True)
    for got, want in zip(losses, ref_losses):
        _close(got, want)
    assert model[1].running_mean is running_mean
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        _close(getattr(model[1], name), getattr(ref[1], name))
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p, q)

    drop = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).to("tpu")
    opt = torch.optim.SGD(drop.parameters(), lr=0.0)

    @torch_tpu.compile_step
    def step(x):
        opt.zero_grad()
        out = drop(x)
        out.sum().backward()
        opt.step()
        return out

    x = torch.randn(8, 16).to("tpu")
    assert not torch.equal(step(x).cpu() == 0, step(x).cpu() == 0)


def test_gradient_accumulation_without_zero_grad():
    """Grads that exist before the step are inputs; backward adds to them."""
    ref = _model()
    model = copy.deepcopy(ref).to("tpu")

    def accumulate(m):
        def step(x, y):
            loss = F.mse_loss(m(x), y)
            loss.backward()
            return loss
        return step

    fn = torch_tpu.compile_step(accumulate(model), modules=model, optimizers=[])
    for x, y in _data(3):
        accumulate(ref)(x, y)
        fn(x.to("tpu"), y.to("tpu"))
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p.grad, q.grad)


_CHILD = textwrap.dedent("""
    import json, sys
    import torch, torch.nn as nn, torch.nn.functional as F
    import torch_tpu, torch_tpu.cache as cache
    from torch_tpu.compile import graph_cache
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)

    @torch_tpu.compile_step
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    losses = [step(x.to("tpu"), y.to("tpu")).item() for _ in range(3)]
    s = graph_cache.cache_stats()
    print(json.dumps({"losses": losses, "w": model[0].weight.cpu().flatten()[:8].tolist(),
                      "lowered": s["lowered"], "disk_loads": s["disk_loads"],
                      "traces": step.traces, "loads": step.loads}))
""")


def test_program_comes_back_from_the_disk_tier(tmp_path):
    """In-process warm path: the memory tier cleared, a new compile_step of
    the same step loads its program from disk (nothing lowered) and gives
    the same values (the new-process test below is slow)."""
    import torch_tpu.cache as cache

    old = cache.cache_dir()
    cache.set_dir(str(tmp_path / "cache"))
    try:
        runs = []
        for _ in range(2):
            graph_cache.clear_cache()
            before = dict(graph_cache.cache_stats())
            model = _model().to("tpu")
            opt = _make_opt("adamw", model.parameters())
            losses = _train(model, opt, _data(3), "tpu", compiled=True)
            after = graph_cache.cache_stats()
            runs.append(([float(v) for v in losses], after["lowered"] - before["lowered"],
                         after["disk_loads"] - before["disk_loads"]))
        (cold, cold_lowered, cold_loads), (warm, warm_lowered, warm_loads) = runs
        assert (cold_lowered, cold_loads) == (2, 0)
        assert (warm_lowered, warm_loads) == (0, 2)
        assert warm == pytest.approx(cold, rel=1e-6)
    finally:
        cache.set_dir(old)


@pytest.mark.slow
def test_cold_and_warm_processes_share_the_cache(tmp_path):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["lowered"] == 2 and cold["disk_loads"] == 0, cold
    assert warm["disk_loads"] == 2 and warm["lowered"] == 0, warm
    # The warm process rebuilds both traced graphs (torch_tpu.compile.persist.steps).
    assert (cold["traces"], cold["loads"], warm["traces"], warm["loads"]) == (2, 0, 0, 2)
    assert cold["losses"] == pytest.approx(warm["losses"], rel=1e-6)
    assert cold["w"] == pytest.approx(warm["w"], rel=1e-6)
    # And both match eager CPU.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert cold["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    assert cold["w"] == pytest.approx(model[0].weight.flatten()[:8].tolist(), rel=1e-5, abs=1e-6)


def test_torch_compile_whole_step_option():
    """torch.compile(step, backend="tpu", options={"whole_step": True})."""
    batches = _data(3)
    ref = _model()
    ref_opt = _make_opt("sgd", ref.parameters())
    ref_losses = _train(ref, ref_opt, batches, "cpu", compiled=False)
    model = _model().to("tpu")
    opt = _make_opt("sgd", model.parameters())

    step = torch.compile(_mse_step(model, opt), backend="tpu", options={"whole_step": True})

    losses = [step(x.to("tpu"), y.to("tpu")) for x, y in batches]
    for got, want in zip(losses, ref_losses):
        _close(got, want)
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p, q)
    with pytest.raises(TypeError, match="whole_step"):
        torch.compile(model, backend="tpu", options={"whole_step": True})


def test_untraceable_step_says_so_and_leaves_state_alone():
    model = _model().to("tpu")
    opt = _make_opt("sgd", model.parameters())
    params = list(model.parameters())

    @torch_tpu.compile_step
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if loss.item() > 0:  # data-dependent: not traceable
            loss.backward()
        opt.step()
        return loss

    x, y = (t.to("tpu") for t in _data(1)[0])
    with pytest.raises(Exception) as info:
        step(x, y)
    assert any("compile_step" in n for n in getattr(info.value, "__notes__", []))
    # The module and the optimizer point at their own tensors again.
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(a is b for a, b in zip(params, opt.param_groups[0]["params"]))
    assert not opt.state


def test_parameters_it_was_not_given_are_refused():
    class Trainer:
        def __init__(self):
            self.model = _model().to("tpu")
            self.opt = _make_opt("sgd", self.model.parameters())

        def step(self, x, y):
            self.opt.zero_grad()
            loss = F.mse_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            return loss

    tr = Trainer()
    model = tr.model

    def reaches_the_optimizer_through_self(x, y):
        return tr.step(x, y) if model is not None else None

    with pytest.warns(UserWarning, match="no optimizer"):
        torch_tpu.compile_step(reaches_the_optimizer_through_self)
    x, y = (t.to("tpu") for t in _data(1)[0])
    before = [p.detach().cpu().clone() for p in tr.model.parameters()]
    with pytest.raises(ValueError, match="modules=.*optimizers="):
        torch_tpu.compile_step(tr.step)
    assert all(torch.equal(a, p.detach().cpu()) for a, p in zip(before, tr.model.parameters()))
    # A module the step uses but was not given: its parameters would be
    # constants of the program; refused after the trace, .grad left clean.
    other = _model().to("tpu")
    with pytest.raises(ValueError, match="modules=.*optimizers="):
        torch_tpu.compile_step(lambda x, y: F.mse_loss(other(x), y).backward(),
                               modules=tr.model, optimizers=[])(x, y)
    assert all(p.grad is None for p in other.parameters())
    # Given explicitly, it trains.
    step = torch_tpu.compile_step(tr.step, modules=tr.model, optimizers=tr.opt)
    step(x, y)
    assert not all(torch.equal(a, p.detach().cpu()) for a, p in zip(before, tr.model.parameters()))


def test_tensor_learning_rate_change_retraces():
    ref = _model()
    model = _model().to("tpu")
    ref_opt = torch.optim.SGD(ref.parameters(), lr=torch.tensor(0.1))
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))

    def run(m, o, dev, compiled):
        step = _mse_step(m, o)
        fn = torch_tpu.compile_step(step) if compiled else step
        for i, (x, y) in enumerate(_data(3)):
            o.param_groups[0]["lr"].fill_(0.1 / (i + 1))
            fn(x.to(dev), y.to(dev))
        return fn

    run(ref, ref_opt, "cpu", False)
    fn = run(model, opt, "tpu", True)
    assert fn.traces == 3
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p, q)
