"""What ordinary training scripts do with a module, on `tpu` as on CPU/CUDA.

`module.to(device)` keeps every Parameter object and swaps its data (CUDA does
it through `param.data = new`, which needs `torch._has_compatible_shallow_copy_type`
to hold between the old and the new tensor); buffers are new tensors, as on
CUDA. References taken before the move (tied weights, an optimizer, hooks)
therefore keep working. Each test runs the same script on CPU and compares.
"""

import copy

import pytest
import torch
from torch import nn


class TiedLM(nn.Module):
    """An embedding and an output head sharing one weight, plus a buffer."""

    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.BatchNorm1d(dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.norm(self.emb(ids))
        return self.head(torch.tanh(self.mid(h)))


IDS = torch.tensor([1, 4, 2, 9, 0, 4])


def _model():
    torch.manual_seed(0)
    return TiedLM()


def _loss(model, device):
    logits = model(IDS.to(device))
    return nn.functional.cross_entropy(logits, IDS.roll(1).to(device))


def _params_by_name(model):
    return dict(model.named_parameters(remove_duplicate=False))


# -- torch._has_compatible_shallow_copy_type ----------------------------------------------


def test_shallow_copy_compatibility_matches_cuda_rule():
    cpu, tpu = torch.ones(2), torch.ones(2, device="tpu")
    compatible = torch._has_compatible_shallow_copy_type
    # CUDA <-> CPU dense tensors are compatible; tpu now is too, both ways.
    assert compatible(cpu, tpu) and compatible(tpu, cpu) and compatible(tpu, tpu)
    assert compatible(tpu.to(torch.int64), cpu.to(torch.float16))
    # Meta and sparse are not (as for CUDA: c10 keeps them out of the dense family).
    assert not compatible(tpu, torch.ones(2, device="meta"))
    sparse = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,))
    assert not compatible(tpu, sparse) and not compatible(cpu, sparse)


def test_param_data_assignment_keeps_the_parameter():
    p = nn.Parameter(torch.randn(3, 2))
    value = torch.randn(3, 2, device="tpu")
    p.data = value
    assert isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf
    assert p.device == value.device and p.data_ptr() == value.data_ptr()
    (p * 2).sum().backward()
    assert p.grad.device.type == "tpu"
    torch.testing.assert_close(p.grad.cpu(), torch.full((3, 2), 2.0))
    p.data = torch.zeros(3, 2)  # and back to the CPU
    assert p.device.type == "cpu" and p.data_ptr() != value.data_ptr()
    assert torch.equal(value.cpu(), value.cpu())  # the tpu tensor itself is unchanged


# -- identity across moves -------------------------------------------------------------------


@pytest.mark.parametrize("move", ["to", "tpu", "to_device_dtype"])
def test_move_keeps_parameters_and_ties(move):
    model = _model()
    params = _params_by_name(model)
    buf = model.norm.running_mean
    if move == "to":
        out = model.to("tpu")
    elif move == "tpu":
        out = model.tpu()
    else:
        out = model.to("tpu", torch.bfloat16)
    assert out is model
    for name, p in _params_by_name(model).items():
        assert p is params[name], name
        assert p.device.type == "tpu" and isinstance(p, nn.Parameter), name
    assert model.head.weight is model.emb.weight
    # Buffers are new tensors, as on CUDA (Module._apply assigns fn(buf)).
    assert model.norm.running_mean is not buf
    assert model.norm.running_mean.device.type == "tpu"
    if move == "to_device_dtype":
        assert model.emb.weight.dtype == torch.bfloat16
        assert model.norm.num_batches_tracked.dtype == torch.int64  # integers keep theirs


def test_round_trip_and_dtype_changes_keep_identity_like_cpu():
    ref, model = _model(), _model()
    params = _params_by_name(model)
    ref_params = _params_by_name(ref)
    steps = [lambda m: m.to(torch.float64), lambda m: m.half(), lambda m: m.float()]
    for i, step in enumerate(steps):
        step(ref)
        model.to("tpu")
        step(model)
        model.cpu()
        for name, p in _params_by_name(model).items():
            assert p is params[name], (i, name)
            assert ref_params[name] is _params_by_name(ref)[name]
            assert p.device.type == "cpu" and p.dtype == ref_params[name].dtype, (i, name)
            torch.testing.assert_close(p, ref_params[name], rtol=0, atol=0)
    assert model.head.weight is model.emb.weight


def test_existing_gradients_move_with_their_parameters():
    ref, model = _model(), _model()
    _loss(ref, "cpu").backward()
    _loss(model, "cpu").backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    model.to("tpu")
    for n, p in model.named_parameters():
        assert p.grad is grads[n], n  # the same gradient tensor, moved like CUDA's
        assert p.grad.device.type == "tpu", n
        torch.testing.assert_close(p.grad.cpu(), dict(ref.named_parameters())[n].grad)


def test_swap_tensors_conversion_keeps_identity():
    prev = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = _model()
        params = _params_by_name(model)
        model.to("tpu")
        for name, p in _params_by_name(model).items():
            assert p is params[name] and p.device.type == "tpu", name
        assert model.head.weight is model.emb.weight
    finally:
        torch.__future__.set_swap_module_params_on_conversion(prev)


# -- training after the move ------------------------------------------------------------------


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.AdamW])
def test_optimizer_created_before_the_move_trains_like_cpu(opt_cls):
    kwargs = {"lr": 0.1, "momentum": 0.9} if opt_cls is torch.optim.SGD else {"lr": 0.01}
    ref, model = _model(), _model()
    ref_opt = opt_cls(ref.parameters(), **kwargs)
    opt = opt_cls(model.parameters(), **kwargs)  # made while the model is on the CPU
    model.to("tpu")
    for _ in range(3):
        for m, o, dev in ((ref, ref_opt, "cpu"), (model, opt, "tpu")):
            o.zero_grad()
            _loss(m, dev).backward()
            o.step()
    for group in opt.param_groups:
        assert all(p.device.type == "tpu" for p in group["params"])
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                assert v.device.type == "tpu"
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().cpu(), ref_params[n].detach(), rtol=1e-4,
                                   atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    torch.testing.assert_close(model.norm.running_var.cpu(), ref.norm.running_var)


def test_tied_weight_gradient_sums_both_uses():
    ref, model = _model(), _model()
    model.to("tpu")
    _loss(ref, "cpu").backward()
    _loss(model, "tpu").backward()
    torch.testing.assert_close(model.emb.weight.grad.cpu(), ref.emb.weight.grad)
    assert model.head.weight.grad is model.emb.weight.grad


def test_hooks_registered_before_the_move_still_run():
    def run(device):
        model = _model()
        calls = []
        model.mid.weight.register_hook(lambda g: calls.append(("grad", g.device.type)) or g * 3)
        model.mid.weight.register_post_accumulate_grad_hook(
            lambda p: calls.append(("post", p.grad.device.type)))
        model.mid.register_forward_hook(lambda mod, i, o: calls.append(("fwd", o.device.type)))
        model.mid.register_full_backward_hook(
            lambda mod, gi, go: calls.append(("bwd", go[0].device.type)))
        model.to(device)
        _loss(model, device).backward()
        return model, calls

    ref, ref_calls = run("cpu")
    model, calls = run("tpu")
    assert [c[0] for c in calls] == [c[0] for c in ref_calls]
    assert sorted(c[0] for c in calls) == ["bwd", "fwd", "grad", "post"]
    assert all(dev == "tpu" for _, dev in calls)
    torch.testing.assert_close(model.mid.weight.grad.cpu(), ref.mid.weight.grad)


# -- to_empty and load_state_dict ----------------------------------------------------------------


def test_to_empty_like_cuda():
    model = _model()
    params = _params_by_name(model)
    model.to_empty(device="tpu")  # from CPU: set_data, identity kept
    assert all(p is params[n] and p.device.type == "tpu"
               for n, p in _params_by_name(model).items())
    assert model.head.weight is model.emb.weight
    with torch.device("meta"):
        meta = TiedLM()
    meta_params = _params_by_name(meta)
    meta.to_empty(device="tpu")  # from meta: new Parameters (CUDA and CPU do the same)
    assert all(p is not meta_params[n] and p.device.type == "tpu"
               for n, p in _params_by_name(meta).items())
    ref = TiedLM().to(device="meta").to_empty(device="cpu")
    assert (meta.head.weight is meta.emb.weight) == (ref.head.weight is ref.emb.weight)


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("source", ["cpu", "tpu"])
def test_load_state_dict_like_cpu(assign, source):
    """The same identity relations as a CPU model loading a CPU state dict."""
    def run(model_device, sd_device):
        model = _model().to(model_device)
        params = _params_by_name(model)
        sd = {k: v.to(sd_device) + 1 for k, v in _model().state_dict().items()}
        model.load_state_dict(sd, assign=assign)
        now = _params_by_name(model)
        return model, {
            "same_objects": {n: now[n] is params[n] for n in now},
            "shares_sd": {n: now[n].data_ptr() == sd[n].data_ptr() for n in sd if n in now},
            "tied": model.head.weight is model.emb.weight,
            "requires_grad": {n: p.requires_grad for n, p in now.items()},
        }

    ref, ref_facts = run("cpu", "cpu")
    model, facts = run("tpu", source)
    assert facts == ref_facts
    want_device = source if assign else "tpu"
    for n, p in model.named_parameters():
        assert p.device.type == want_device, n
        torch.testing.assert_close(p.detach().cpu(), dict(ref.named_parameters())[n].detach())
