"""What ordinary training scripts do with a module, on `tpu` as on CPU/CUDA.

`module.to(device)` keeps every Parameter object and swaps its data (CUDA does
it through `param.data = new`, which needs `torch._has_compatible_shallow_copy_type`
to hold between the old and the new tensor); buffers are new tensors, as on
CUDA. References taken before the move (tied weights, an optimizer, hooks)
therefore keep working. Each test runs the same script on CPU and compares.
"""

import warnings

import pytest
import torch
from torch import nn

# The CPU fallback off, and no fallback counted, in every test: an op without
# a lowering would otherwise compare CPU with CPU.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


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
    sparse = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,),
                                     check_invariants=True)
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


# -- bad input raises what CPU raises -----------------------------------------------------------


def _raises_like_cpu(fn):
    """fn(device) raises on tpu the CPU's exception type, with the CPU's message
    (the tpu message may name the op first)."""
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(Exception) as tpu:
        fn("tpu")
    assert type(tpu.value) is type(cpu.value), (tpu.value, cpu.value)
    assert str(cpu.value) in str(tpu.value)
    return tpu.value


@pytest.mark.parametrize("case", ["pow", "pow_method", "pow_out", "pow_inplace", "bool_base"])
def test_integer_to_negative_integer_power_raises(case):
    def fn(device):
        x = torch.tensor([2, 3], device=device)
        if case == "pow":
            return x ** -1
        if case == "pow_method":
            return x.pow(-2)
        if case == "pow_out":
            return torch.pow(x, -1, out=torch.empty_like(x))
        if case == "pow_inplace":
            return x.pow_(-1)
        return x.bool() ** -1

    err = _raises_like_cpu(fn)
    assert "Integers to negative integer powers are not allowed." in str(err)


def test_allowed_powers_still_compute():
    for exponent in (2, 0, -1.0, torch.tensor(-1)):
        x = torch.tensor([2, 3])
        torch.testing.assert_close((x.to("tpu") ** exponent).cpu(), x ** exponent)


FILL_OVERFLOWS = [
    (float("nan"), torch.int64), (float("inf"), torch.int32), (float("-inf"), torch.uint8),
    (256, torch.uint8), (-256, torch.uint8), (255.5, torch.uint8), (-0.5, torch.uint8),
    (2 ** 40, torch.int32), (-129, torch.int8), (2 ** 63, torch.int64),
    (1e300, torch.float32), (70000, torch.float16), (1e39, torch.bfloat16),
    (1 + 2j, torch.int64), (1 + 2j, torch.float32), (complex(1e300, 0), torch.complex64),
    (500.0, torch.float8_e4m3fn), (float("inf"), torch.float8_e4m3fn),
]
FILL_FITS = [
    (-1, torch.uint8), (2.7, torch.uint8), (-1, torch.uint64), (True, torch.int8),
    (5, torch.bool), (float("nan"), torch.bool), (float("inf"), torch.float16),
    (float("nan"), torch.float32), (3, None), (1j, None), (2 ** 62, torch.int64),
]


@pytest.mark.parametrize("value,dtype", FILL_OVERFLOWS, ids=str)
@pytest.mark.parametrize("how", ["full", "fill_", "full_like", "new_full"])
def test_fill_value_that_does_not_fit_raises(value, dtype, how):
    def fn(device):
        if how == "full":
            return torch.full((3,), value, dtype=dtype, device=device)
        base = torch.zeros(3, dtype=dtype, device=device)
        if how == "fill_":
            return base.fill_(value)
        if how == "full_like":
            return torch.full_like(base, value)
        return base.new_full((3,), value)

    err = _raises_like_cpu(fn)
    assert "without overflow" in str(err)


@pytest.mark.parametrize("value,dtype", FILL_FITS, ids=str)
def test_fill_value_that_fits_matches_cpu(value, dtype):
    want = torch.full((3,), value, dtype=dtype)
    got = torch.full((3,), value, dtype=dtype, device="tpu")
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    filled = torch.zeros(3, dtype=want.dtype, device="tpu").fill_(value)
    torch.testing.assert_close(filled.cpu(), want, equal_nan=True)


@pytest.mark.parametrize("case", ["tensor_float", "float_float", "normal_", "tensor_tensor",
                                  "float_tensor", "float_tensor_nan", "complex_std"])
def test_normal_with_negative_std_raises(case):
    def fn(device):
        mean = torch.zeros(2, device=device)
        if case == "tensor_float":
            return torch.normal(mean, -1.0)
        if case == "float_float":
            return torch.normal(0.0, -1.5, (2,), device=device)
        if case == "normal_":
            return mean.normal_(0, -1)
        if case == "tensor_tensor":
            return torch.normal(mean, torch.tensor([1.0, -1.0], device=device))
        if case == "float_tensor":
            return torch.normal(0.0, torch.tensor([-1.0, 1.0], device=device))
        if case == "float_tensor_nan":
            return torch.normal(0.0, torch.tensor([float("nan")], device=device))
        return torch.normal(0.0, torch.tensor([1j], device=device))

    _raises_like_cpu(fn)


def test_normal_with_valid_std_still_samples():
    std = torch.tensor([0.0, 2.0], device="tpu")
    x = torch.normal(torch.ones(2, device="tpu"), std)
    assert x.cpu()[0] == 1.0  # std 0: the mean
    assert torch.normal(0.0, std).shape == (2,)
    assert torch.normal(0.0, torch.empty(0, device="tpu")).shape == (0,)


@pytest.mark.parametrize("case", ["p_high", "p_low", "p_nan", "inplace", "out"])
def test_bernoulli_scalar_p_out_of_range_raises(case):
    def fn(device):
        x = torch.zeros(3, device=device)
        if case == "p_high":
            return torch.bernoulli(x, 1.5)
        if case == "p_low":
            return torch.bernoulli(x, -0.5)
        if case == "p_nan":
            return torch.bernoulli(x, float("nan"))
        if case == "inplace":
            return x.bernoulli_(2.0)
        return torch.ops.aten.bernoulli.float_out(x, 1.5, out=torch.empty_like(x))

    err = _raises_like_cpu(fn)
    assert "bernoulli_ expects p to be in [0, 1]" in str(err)


def test_bernoulli_tensor_p_is_not_checked_like_cuda():
    """A Tensor p is checked by CUDA inside its kernel (a device-side assert), not
    on the host; tpu does no host read either: values outside [0, 1] act as
    clamped (documented in docs/troubleshooting.md)."""
    p = torch.tensor([1.5, -0.5, 1.0, 0.0], device="tpu")
    assert torch.bernoulli(p).cpu().tolist() == [1.0, 0.0, 1.0, 0.0]


# -- quantized tensors and resize_ ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["per_tensor", "per_tensor_tensors", "per_channel", "dynamic",
                                  "move", "empty", "affine", "to_dtype"])
def test_quantized_tensors_raise_not_implemented_naming_quantization(case):
    x = torch.randn(2, 3, device="tpu")

    def run():
        if case == "per_tensor":
            return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
        if case == "per_tensor_tensors":
            return torch.quantize_per_tensor(x, torch.tensor(0.1, device="tpu"),
                                             torch.tensor(0, device="tpu"), torch.quint8)
        if case == "per_channel":
            return torch.quantize_per_channel(x, torch.tensor([0.1, 0.2]),
                                              torch.tensor([0, 0]), 0, torch.quint8)
        if case == "dynamic":
            return torch.quantize_per_tensor_dynamic(x, torch.quint8, False)
        if case == "move":
            q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
            return q.to("tpu")
        if case == "empty":
            return torch.empty(2, dtype=torch.qint8, device="tpu")
        if case == "affine":
            return torch._empty_affine_quantized((2,), scale=0.1, zero_point=0,
                                                 dtype=torch.quint8, device="tpu")
        return x.to(torch.qint8)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's deprecation of quantized tensors
        with pytest.raises(NotImplementedError, match="quantized tensors are not supported "
                                                      "on the tpu device"):
            run()


def test_fake_quantization_is_an_ordinary_float_op():
    """torch.ao's QAT ops (per tensor with float or tensor qparams, per channel, the
    observer switched off) and their straight-through gradient, CPU-equal bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(6, 5) * 3
    x[0, :3] = torch.tensor([0.25, 0.35, -0.05])  # ties round half to even
    x[0, 3] = 100.0  # clamped, masked out of the gradient
    scale, zp = torch.tensor([0.1]), torch.tensor([2], dtype=torch.int32)
    ch_scale = torch.tensor([0.1, 0.2, 0.05, 0.3, 0.07])
    ch_zp = torch.tensor([0, 1, -1, 2, 0], dtype=torch.int32)
    cases = [
        lambda x, d: torch.fake_quantize_per_tensor_affine(x, 0.07, -2, -8, 7),
        lambda x, d: torch.fake_quantize_per_tensor_affine(x, scale.to(d), zp.to(d), 0, 255),
        lambda x, d: torch.fake_quantize_per_channel_affine(x, ch_scale.to(d), ch_zp.to(d), 1,
                                                            -128, 127),
        lambda x, d: torch._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
            x, scale.to(d), zp.to(d), torch.tensor([0]).to(d), -128, 127)[0],  # observer off
    ]
    for case in cases:
        want_x, got_x = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        want, got = case(want_x, "cpu"), case(got_x, "tpu")
        assert torch.equal(got.cpu(), want.detach())
        if want.requires_grad:
            want.sum().backward()
            got.sum().backward()
            assert torch.equal(got_x.grad.cpu(), want_x.grad)
    with pytest.raises(RuntimeError, match="`zero_point` must be between `quant_min` and "
                                           "`quant_max`"):
        torch.fake_quantize_per_tensor_affine(x.to("tpu"), 0.1, 9, 0, 5)


RESIZE_FORMATS = [None, torch.contiguous_format, torch.channels_last, torch.channels_last_3d,
                  torch.preserve_format]


RESIZE_SIZES = [(2, 3, 2, 2), (1, 2, 3, 2, 2), (12,), (3, 2), (0, 4)]


def _resize_fns(memory_format, size, base):
    def make(device):
        if base == "transposed":
            return torch.arange(6.0, device=device).reshape(3, 2).t()
        return torch.arange(30.0, device=device)[1:]

    def resize(device):
        t = make(device)
        if memory_format is None:
            return t.resize_(size)
        return t.resize_(size, memory_format=memory_format)

    return make, resize


def _resize_cases(cpu_raises: bool):
    """The (memory_format, size, base) cases the CPU accepts, or those it refuses
    (a memory format of another rank, preserve_format)."""
    out = []
    for base in ("transposed", "offset_view"):
        for size in RESIZE_SIZES:
            for memory_format in RESIZE_FORMATS:
                try:
                    _resize_fns(memory_format, size, base)[1]("cpu")
                    raises = False
                except RuntimeError:
                    raises = True
                if raises == cpu_raises:
                    out.append(pytest.param(memory_format, size, base,
                                            id=f"{base}-{size}-{memory_format}"))
    return out


@pytest.mark.parametrize("memory_format,size,base", _resize_cases(cpu_raises=False))
def test_resize_with_memory_format_like_cpu(memory_format, size, base):
    make, resize = _resize_fns(memory_format, size, base)
    want = resize("cpu")
    got = resize("tpu")
    assert got.shape == want.shape and got.stride() == want.stride()
    assert got.storage_offset() == want.storage_offset()
    # The values CPU defines: those the old storage held (growth is uninitialized).
    old = make("cpu").untyped_storage().nbytes() // 4 - want.storage_offset()
    if want.numel() <= old and base == "offset_view":
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("memory_format,size,base", _resize_cases(cpu_raises=True))
def test_resize_with_memory_format_errors_like_cpu(memory_format, size, base):
    _raises_like_cpu(_resize_fns(memory_format, size, base)[1])
