"""torch.compile(backend="tpu"): parity with eager and CPU, training, mutations,
RNG, graph breaks and bucketed dynamic shapes."""

import collections
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu  # noqa: F401
import torch_tpu.cache
from torch_tpu.compile import graph_cache, padding

ATOL = 2e-5
RTOL = 2e-5


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def close(a, b, atol=ATOL, rtol=RTOL):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=atol, rtol=rtol)


def graph_compiles(prefix="graph_"):
    """How many graph executables were built so far, by name."""
    return collections.Counter(e["name"] for e in torch_tpu.cache.stats()["per_entry"]
                               if e["name"].startswith(prefix))


# -- models ---------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d=32, h=64, o=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.GELU(),
                                 nn.Linear(h, o))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.b2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.b2(self.c2(x)))
        return self.fc(x.mean((2, 3)))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP, with dropout."""

    def __init__(self, d=32, heads=4, p=0.1):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (D // self.h) ** 0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = self.drop(att.masked_fill(~causal, float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def _three_way(model, x, train=True, loss=lambda y: (y * y).mean()):
    """Compiled tpu vs eager tpu vs CPU: outputs, gradients and buffers."""
    cpu = copy.deepcopy(model).train(train)
    eager = copy.deepcopy(model).to("tpu").train(train)
    comp_model = copy.deepcopy(model).to("tpu").train(train)
    compiled = torch.compile(comp_model, backend="tpu")
    y_cpu, y_eager, y_comp = cpu(x), eager(x.to("tpu")), compiled(x.to("tpu"))
    assert y_comp.device.type == "tpu"
    close(y_comp, y_cpu)
    close(y_comp, y_eager)
    if train:
        loss(y_cpu).backward()
        loss(y_eager).backward()
        loss(y_comp).backward()
        for (name, p_cpu), p_eager, p_comp in zip(cpu.named_parameters(), eager.parameters(),
                                                   comp_model.parameters()):
            assert p_comp.grad is not None, name
            close(p_comp.grad, p_cpu.grad)
            close(p_comp.grad, p_eager.grad)
    for (_name, b_cpu), b_comp in zip(cpu.named_buffers(), comp_model.buffers()):
        close(b_comp.float(), b_cpu.float())
    return compiled


# -- registration -----------------------------------------------------------------


def test_backend_is_registered():
    torch_tpu.compile.register()
    assert "tpu" in torch._dynamo.list_backends()


def test_default_backend_on_tpu_inputs_is_tpu():
    # Inductor has no tpu code generator: torch.compile(fn) uses "tpu" for tpu inputs.
    before = graph_cache.GRAPH_STATS.graphs
    f = torch.compile(lambda a, b: (a * b + a).relu())
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    close(f(a.to("tpu"), b.to("tpu")), (a * b + a).relu())
    assert graph_cache.GRAPH_STATS.graphs > before


# -- parity ------------------------------------------------------------------------


def test_mlp_parity():
    torch.manual_seed(0)
    _three_way(MLP(), torch.randn(8, 32))


def test_cnn_batchnorm_train_parity():
    torch.manual_seed(0)
    _three_way(CNN(), torch.randn(4, 3, 16, 16), train=True)


def test_cnn_batchnorm_eval_parity():
    torch.manual_seed(0)
    model = CNN()
    with torch.no_grad():  # non-trivial running statistics
        for bn in (model.b1, model.b2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    _three_way(model, torch.randn(4, 3, 16, 16), train=False)


def test_transformer_block_parity():
    torch.manual_seed(0)
    _three_way(Block(p=0.0), torch.randn(2, 8, 32), train=True)
    _three_way(Block(p=0.1), torch.randn(2, 8, 32), train=False)


def test_dropout_in_graph_is_seeded():
    torch.manual_seed(0)
    model = Block(p=0.5).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 8, 32).to("tpu")
    torch.manual_seed(7)
    a = compiled(x).cpu()
    torch.manual_seed(7)
    b = compiled(x).cpu()
    c = compiled(x).cpu()
    assert torch.equal(a, b), "same seed, same dropout masks"
    assert not torch.equal(b, c), "the key advances between calls"
    # The fraction of dropped units is about p.
    f = torch.compile(lambda t: F.dropout(t, 0.5, training=True), backend="tpu")
    torch.manual_seed(1)
    y = f(torch.ones(4096, device="tpu")).cpu()
    assert set(y.unique().tolist()) <= {0.0, 2.0}
    assert 0.45 < (y == 0).float().mean().item() < 0.55


# -- training -----------------------------------------------------------------------


def _train(model, device, compile_model, compile_step=False, steps=20):
    torch.manual_seed(0)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    f = torch.compile(model, backend="tpu") if compile_model else model
    step = torch.compile(opt.step, backend="tpu") if compile_step else opt.step
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(f(x), y)
        loss.backward()
        step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_twenty_training_steps_match_eager():
    torch.manual_seed(0)
    model = MLP()
    loss_cpu, p_cpu = _train(model, "cpu", False)
    loss_eager, p_eager = _train(model, "tpu", False)
    loss_comp, p_comp = _train(model, "tpu", True)
    assert loss_comp[-1] < loss_comp[0] * 0.5
    torch.testing.assert_close(loss_comp, loss_eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_comp, loss_cpu, atol=1e-5, rtol=1e-5)
    for a, b, c in zip(p_comp, p_eager, p_cpu):
        close(a, b)
        close(a, c)


@pytest.mark.slow
def test_training_with_compiled_optimizer_step():
    torch.manual_seed(0)
    model = MLP()
    loss_cpu, p_cpu = _train(model, "cpu", False, steps=10)
    loss_comp, p_comp = _train(model, "tpu", True, compile_step=True, steps=10)
    torch.testing.assert_close(loss_comp, loss_cpu, atol=1e-5, rtol=1e-5)
    for a, c in zip(p_comp, p_cpu):
        close(a, c)


# -- mutations, graph breaks, fallbacks ---------------------------------------------------


def test_input_mutation_inside_graph():
    def f(x, buf):
        buf.add_(x.sum())
        x.mul_(2)
        return x + buf

    x, buf = torch.randn(5), torch.zeros(5)
    xt, bt = x.to("tpu"), buf.to("tpu")
    out = torch.compile(f, backend="tpu")(xt, bt)
    want = f(x, buf)
    close(out, want)
    close(xt, x)
    close(bt, buf)


def test_mutation_of_a_view_input():
    def f(x):
        x[:, 1].add_(1)
        return x.sum()

    base = torch.arange(12.0).reshape(3, 4)
    t = base.clone().to("tpu")
    view = t[1:]
    out = torch.compile(f, backend="tpu")(view)
    want = f(base[1:])
    close(out, want)
    close(t, base)


def test_graph_break_falls_back_to_eager():
    def f(x):
        y = x.sin() * 2
        if y.sum().item() > 0:  # data-dependent: dynamo breaks the graph here
            y = y + 1
        else:
            y = y - 1
        return y.cos()

    x = torch.randn(6)
    compiled = torch.compile(f, backend="tpu")
    close(compiled(x.to("tpu")), f(x))
    close(compiled((-x.abs() - 1).to("tpu")), f(-x.abs() - 1))


def test_eager_op_at_a_graph_break_is_not_traced_into_jax():
    # ctc_loss's output shape depends on data: dynamo breaks the graph and runs
    # it eagerly; the device kernel's JAX calls must run, not be traced.
    torch.manual_seed(0)
    lp = torch.randn(12, 3, 5).log_softmax(2)
    tg = torch.randint(1, 5, (3, 4))
    il, tl = torch.full((3,), 12, dtype=torch.long), torch.tensor([4, 3, 2])

    def f(lp, tg, il, tl):
        return F.ctc_loss(lp, tg, il, tl)

    lp_cpu = lp.clone().requires_grad_()
    ref = f(lp_cpu, tg, il, tl)
    ref.backward()
    lp_tpu = lp.to("tpu").requires_grad_()
    out = torch.compile(f, backend="tpu")(lp_tpu, tg.to("tpu"), il.to("tpu"), tl.to("tpu"))
    out.backward()
    close(out, ref)
    close(lp_tpu.grad, lp_cpu.grad)


def test_op_without_lowering_still_runs(monkeypatch):
    # An op missing from the lowering table runs through its decomposition or,
    # as the last resort, on the CPU inside the graph (host callback).
    from torch_tpu.ops import registry

    monkeypatch.delitem(registry.LOWERINGS, torch.ops.aten.exp.default, raising=False)
    monkeypatch.delitem(padding.RULES, torch.ops.aten.exp.default,
                        raising=False)
    f = torch.compile(lambda t: torch.exp(t) + 1, backend="tpu")
    x = torch.randn(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(f(x.to("tpu")), torch.exp(x) + 1)



def test_factory_without_lowering_runs_on_the_cpu_in_the_callback(monkeypatch):
    # The host callback runs the op on CPU tensors: a factory's device=tpu
    # argument must not make it build tpu tensors there (empty_like(device=)'s
    # aten.empty_permuted did, before it had a graph rule).
    from torch_tpu.compile import graph_ops
    from torch_tpu.ops import registry

    op = torch.ops.aten.empty_permuted.default
    monkeypatch.delitem(graph_ops.GRAPH_OPS, op)
    monkeypatch.delitem(registry.LOWERINGS, op, raising=False)
    f = torch.compile(lambda t: torch.empty_like(t, device=t.device).fill_(1.5) + t,
                      backend="tpu")
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(f(x.to("tpu")), x + 1.5)


def test_empty_like_with_a_device_compiles():
    # empty_like(t, device=...) is aten.empty_permuted in the graph
    g = torch.compile(lambda t: torch.empty_like(t, device=t.device).fill_(2.0) * t,
                      backend="tpu")
    x = torch.randn(3, 4)
    runs, fallbacks = graph_cache.GRAPH_STATS.runs, graph_cache.GRAPH_STATS.eager_fallbacks
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*has no tpu lowering")
        close(g(x.to("tpu")), x * 2.0)
    assert graph_cache.GRAPH_STATS.runs == runs + 1  # one graph, run as one program
    assert graph_cache.GRAPH_STATS.eager_fallbacks == fallbacks



@pytest.mark.parametrize("fn", [
    lambda t: torch.trace(t),  # diagonal_copy, then sum, in the graph
    lambda t: torch.diagonal_copy(t[1:].t(), 1),
    lambda t: torch.as_strided_copy(t, (2, 2), (1, 5), 3),
], ids=["trace", "diagonal_copy", "as_strided_copy"])
def test_copy_of_a_view_reads_the_views_elements(fn):
    # A *_copy op's output is a new contiguous tensor: its elements are the
    # view's (diagonal, as_strided), not the input's first ones (trace of a
    # 5x5 matrix compiled to the sum of its first row).
    x = torch.randn(5, 5)
    close(torch.compile(fn, backend="tpu")(x.to("tpu")), fn(x))

# -- dynamic shapes ---------------------------------------------------------------------------


def _sweep(lengths, train):
    torch.manual_seed(0)
    model = Block(d=16, heads=2, p=0.0)
    comp_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(comp_model, backend="tpu")
    before = graph_compiles()
    for T in lengths:
        x = torch.randn(2, T, 16)
        for p in list(model.parameters()) + list(comp_model.parameters()):
            p.grad = None
        with torch.set_grad_enabled(train):
            y = compiled(x.to("tpu"))
            want = model(x)
        assert tuple(y.shape) == (2, T, 16)
        close(y, want)
        if train:
            (y * y).sum().backward()
            (want * want).sum().backward()
            for p_cpu, p in zip(model.parameters(), comp_model.parameters()):
                close(p.grad, p_cpu.grad, atol=1e-4, rtol=1e-4)
    return graph_compiles() - before


def test_sequence_length_sweep_compiles_a_bounded_number_of_times():
    # Ten lengths: a static graph for the first length, the symbolic graph once
    # at the second (sizes seen to change are padded from then on), then one
    # program per bucket (8, 16, 32) instead of one per length.
    made = _sweep([3, 4, 5, 7, 9, 11, 13, 16, 17, 23], train=False)
    assert sum(made.values()) <= 2 + 3, made
    assert made["graph_inference_bucketed"] <= 3, made


@pytest.mark.slow
def test_sequence_length_sweep_training_compiles_a_bounded_number_of_times():
    made = _sweep([3, 4, 5, 6, 7, 9, 11, 13, 16, 17, 21, 25, 30, 33], train=True)
    # forward and backward: two exact pairs, then one pair per bucket (8..64)
    assert sum(made.values()) <= 2 * (2 + 4), made
    assert made["graph_forward_bucketed"] <= 4


def test_dynamic_batch_of_batchnorm_model_stays_correct():
    # BatchNorm statistics over a padded batch cannot be masked: exact shapes.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())
    comp_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(comp_model, backend="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (4, 5, 6, 9):
            x = torch.randn(n, 8)
            close(compiled(x.to("tpu")), model(x))
    close(comp_model[1].running_mean, model[1].running_mean)
    close(comp_model[1].running_var, model[1].running_var)


def test_padding_masks_reductions_and_losses():
    # Mean/var/softmax/logsumexp/cross-entropy over a dynamic dim padded to a bucket.
    def f(x, w, target):
        h = x @ w
        stats = torch.stack([h.mean(1), h.var(1), h.amax(1), torch.logsumexp(h, 1)], -1)
        logits = h.reshape(-1, h.shape[-1])
        loss = F.cross_entropy(logits, target.reshape(-1))
        return stats, h.softmax(1), loss

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    w = torch.randn(6, 5)
    before = graph_compiles()
    for T in (3, 5, 6, 7, 12):
        x, target = torch.randn(2, T, 6), torch.randint(0, 5, (2, T))
        got = compiled(x.to("tpu"), w.to("tpu"), target.to("tpu"))
        for g, want in zip(got, f(x, w, target)):
            close(g, want, atol=1e-5, rtol=1e-5)
    made = graph_compiles() - before
    assert sum(made.values()) <= 3, made


def test_unknown_policy_is_rejected():
    from torch_tpu.compile.dynamic import Policy

    with pytest.raises(ValueError):
        Policy("sometimes")


def test_optimizer_step_donates_parameters_when_safe():
    from torch_tpu.runtime import storage as st

    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    ref = copy.deepcopy(model)
    model = model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(2, 4)
    model(x.to("tpu")).sum().backward()
    ref(x).sum().backward()
    before = graph_cache.GRAPH_STATS.donating_calls
    held = st.data_of(model.weight).array  # someone else holds the buffer: no donation
    step()
    ref_opt.step()
    assert not held.is_deleted()
    assert graph_cache.GRAPH_STATS.donating_calls == before
    del held
    for _ in range(2):
        step()
        ref_opt.step()
    assert graph_cache.GRAPH_STATS.donating_calls == before + 2
    close(model.weight, ref.weight)
    close(model.bias, ref.bias)


def test_compiled_whole_step_with_adamw_matches_cpu():
    """forward + backward + AdamW.step() under one torch.compile: AdamW's CPU
    `step` counters are graph inputs the optimizer graph updates in place."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model.load_state_dict(ref.state_dict())
    model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x = torch.randn(4, 8)

    def step(m, o, x):
        o.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        return loss

    compiled = torch.compile(step, backend="tpu")
    xt = x.to("tpu")
    for _ in range(3):
        loss = compiled(model, opt, xt)
        ref_loss = step(ref, ref_opt, x)
        torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
        assert float(opt.state[p]["step"]) == float(ref_opt.state[q]["step"]) == 3.0
