"""nn lowerings beyond OpInfo: batch-norm saved statistics, negative replicate
padding, grid sampling, antialiased bilinear resampling, rrelu, fractional
max pooling — each against PyTorch's CPU kernels."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

aten = torch.ops.aten


def _tpu(*xs):
    return [x.to("tpu") if isinstance(x, torch.Tensor) else x for x in xs]


@pytest.mark.parametrize("wdtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_saved_stats_like_cpu(wdtype, training):
    torch.manual_seed(0)
    x = torch.randn(3, 2, 4, dtype=torch.bfloat16)
    sd = wdtype or torch.float32
    w = None if wdtype is None else torch.randn(2, dtype=wdtype)
    rm, rv = torch.zeros(2, dtype=sd), torch.ones(2, dtype=sd)
    cpu = aten._native_batch_norm_legit(x, w, w, rm.clone(), rv.clone(), training, 0.1, 1e-5)
    tpu = aten._native_batch_norm_legit(*_tpu(x, w, w, rm.clone(), rv.clone()), training, 0.1,
                                        1e-5)
    for c, t in zip(cpu, tpu):
        assert t.dtype == c.dtype and t.shape == c.shape
    torch.testing.assert_close(tpu[0].cpu(), cpu[0], atol=0.02, rtol=0.016)


def test_batch_norm_running_stats_update():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 4)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    trm, trv = _tpu(rm.clone(), rv.clone())
    aten._native_batch_norm_legit(x, None, None, rm, rv, True, 0.3, 1e-5)
    aten._native_batch_norm_legit(x.to("tpu"), None, None, trm, trv, True, 0.3, 1e-5)
    torch.testing.assert_close(trm.cpu(), rm)
    torch.testing.assert_close(trv.cpu(), rv)


@pytest.mark.parametrize("pad", [(-4, 5), (-3, 5), (5, -4), (-4, 1), (-1, 2), (2, -3), (-2, -1)])
def test_replicate_pad_negative(pad):
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(F.pad(x.to("tpu"), pad, mode="replicate").cpu(),
                               F.pad(x, pad, mode="replicate"))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d(mode, padding_mode, align_corners):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    g = (torch.rand(2, 4, 7, 2) * 2.4 - 1.2).requires_grad_()
    out = F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    xt = x.detach().to("tpu").requires_grad_()
    gt = g.detach().to("tpu").requires_grad_()
    outt = F.grid_sample(xt, gt, mode=mode, padding_mode=padding_mode,
                         align_corners=align_corners)
    torch.testing.assert_close(outt.detach().cpu(), out.detach(), atol=1e-5, rtol=1e-5)
    go = torch.randn_like(out)
    out.backward(go)
    outt.backward(go.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gt.grad.cpu(), g.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding_mode):
    torch.manual_seed(2)
    x = torch.randn(1, 2, 3, 4, 5, requires_grad=True)
    g = (torch.rand(1, 2, 3, 4, 3) * 2.4 - 1.2).requires_grad_()
    out = F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=False)
    xt = x.detach().to("tpu").requires_grad_()
    gt = g.detach().to("tpu").requires_grad_()
    outt = F.grid_sample(xt, gt, mode=mode, padding_mode=padding_mode, align_corners=False)
    torch.testing.assert_close(outt.detach().cpu(), out.detach(), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    outt.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gt.grad.cpu(), g.grad, atol=1e-4, rtol=1e-4)


def test_grid_sample_bfloat16_like_cpu():
    torch.manual_seed(3)
    x = torch.randn(2, 3, 5, 6).bfloat16()
    g = (torch.rand(2, 4, 7, 2) * 2 - 1).bfloat16()
    torch.testing.assert_close(F.grid_sample(x.to("tpu"), g.to("tpu"), align_corners=False).cpu(),
                               F.grid_sample(x, g, align_corners=False), atol=0.02, rtol=0.016)


@pytest.mark.parametrize("size", [(3, 3), (5, 7), (12, 30)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_bilinear_antialias(size, align_corners):
    torch.manual_seed(4)
    x = torch.randn(2, 3, 10, 20, requires_grad=True)
    out = F.interpolate(x, size=size, mode="bilinear", antialias=True,
                        align_corners=align_corners)
    xt = x.detach().to("tpu").requires_grad_()
    outt = F.interpolate(xt, size=size, mode="bilinear", antialias=True,
                         align_corners=align_corners)
    torch.testing.assert_close(outt.detach().cpu(), out.detach(), atol=1e-5, rtol=1e-5)
    go = torch.randn_like(out)
    out.backward(go)
    outt.backward(go.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)


def test_upsample_bilinear_antialias_half_raises_like_cpu():
    x = torch.randn(1, 1, 4, 4).bfloat16()
    with pytest.raises(NotImplementedError):
        aten._upsample_bilinear2d_aa(x, [2, 2], False)
    with pytest.raises(NotImplementedError):
        aten._upsample_bilinear2d_aa(x.to("tpu"), [2, 2], False)


def test_rrelu_training_slopes_and_noise():
    torch.manual_seed(5)
    x = torch.randn(200)
    xt = x.to("tpu")
    noise = torch.empty(200, device="tpu")
    y = aten.rrelu_with_noise(xt, noise, 0.1, 0.3, True).cpu()
    n = noise.cpu()
    neg = x <= 0
    assert torch.all(n[~neg] == 1)
    assert torch.all((n[neg] >= 0.1) & (n[neg] <= 0.3))
    torch.testing.assert_close(y, x * n)
    # eval: the mean slope, noise untouched
    torch.testing.assert_close(F.rrelu(xt, 0.1, 0.3, training=False).cpu(),
                               F.rrelu(x, 0.1, 0.3, training=False))
    z = x.to("tpu")
    F.rrelu_(z, 0.1, 0.3, training=True)
    r = z.cpu() / x
    assert torch.all(r[~neg] == 1) and torch.all((r[neg] >= 0.1 - 1e-6) & (r[neg] <= 0.3 + 1e-6))


@pytest.mark.parametrize("shape,k,o", [((2, 3, 9, 11), (3, 2), (4, 5)), ((3, 9, 9), (3, 3), (2, 3)),
                                       ((2, 2, 7, 8, 9), (2, 3, 2), (3, 4, 5))])
def test_fractional_max_pool_given_samples(shape, k, o):
    torch.manual_seed(6)
    nsp = len(k)
    x = torch.randn(shape, requires_grad=True)
    n = shape[0] if len(shape) == nsp + 2 else 1
    s = torch.rand(n, shape[-nsp - 1], nsp)
    f = F.fractional_max_pool2d if nsp == 2 else F.fractional_max_pool3d
    out, idx = f(x, k, output_size=o, return_indices=True, _random_samples=s)
    xt = x.detach().to("tpu").requires_grad_()
    outt, idxt = f(xt, k, output_size=o, return_indices=True, _random_samples=s.to("tpu"))
    assert torch.equal(outt.detach().cpu(), out.detach())
    assert torch.equal(idxt.cpu(), idx)
    go = torch.randn_like(out)
    out.backward(go)
    outt.backward(go.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


@pytest.mark.parametrize("wdtype", [None, torch.bfloat16, torch.float32])
def test_layer_norm_stats_dtype_like_cpu(wdtype):
    # CPU keeps mean/rstd in the input's dtype (float32 only with float32
    # parameters); PyTorch's meta function says float32 for halves.
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.bfloat16)
    w = None if wdtype is None else torch.randn(5, dtype=wdtype)
    cpu = aten.native_layer_norm(x, [5], w, w, 1e-5)
    tpu = aten.native_layer_norm(*_tpu(x, [5], w, w), 1e-5)
    for c, t in zip(cpu, tpu):
        assert t.dtype == c.dtype and t.shape == c.shape
        torch.testing.assert_close(t.cpu(), c, atol=0.02, rtol=0.016)


def test_layer_norm_one_element_rows_are_exact():
    # Over one element x - mean is exactly 0: the output is the bias and the
    # weight gradient 0. CPU's kernels (fma(x, rstd, -rstd * mean)) leave the
    # rounding error of rstd * mean there; the tolerance table says so.
    x = torch.tensor([[-8.5], [3.3]])
    w = torch.tensor([-8.5, ])
    out = aten.native_layer_norm(*_tpu(x.bfloat16(), [1], w.bfloat16()), None, 1e-5)[0]
    assert torch.equal(out.cpu(), torch.zeros(2, 1, dtype=torch.bfloat16))
    xx, ww = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    g = torch.autograd.grad(F.layer_norm(xx, [1], ww).sum(), ww)[0]
    assert torch.equal(g.cpu(), torch.zeros(1))


def _half_error_no_worse_than_cpu(fn, *args, slack=1.05):
    """fn on bfloat16/float16 `args` on tpu is at least as close to the float64
    result as CPU's half-precision kernel (which may accumulate in the half
    type: the tpu keeps float32 accumulation, as CUDA and XLA do)."""
    exact = fn(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args])
    cpu = fn(*args)
    tpu = fn(*_tpu(*args)).cpu()
    assert tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
    err_cpu = (cpu.double() - exact).abs().max().item()
    err_tpu = (tpu.double() - exact).abs().max().item()
    ulp = exact.abs().max().item() * (2 ** -7 if cpu.dtype == torch.bfloat16 else 2 ** -10)
    assert err_tpu <= slack * err_cpu + ulp, (err_tpu, err_cpu)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_margin_loss_backward_like_cpu(reduction):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    t = torch.randint(0, 5, (6,), generator=g)
    w = torch.rand(5, generator=g)
    # repeated labels and labels after the -1 terminator (ignored)
    mt = torch.tensor([[1, 1, -1, 2, 0], [0, 3, 4, -1, -1], [-1, 2, 2, 2, 2],
                       [4, 3, 2, 1, 0], [2, -1, 0, 0, 0], [3, 0, -1, 4, 4]])
    cases = [
        (F.multi_margin_loss, (t,), dict(p=1, margin=1.0)),
        (F.multi_margin_loss, (t,), dict(p=2, margin=-0.5, weight=w)),
        (F.multilabel_margin_loss, (mt,), {}),
    ]
    for fn, extra, kw in cases:
        grads = []
        for dev in ("cpu", "tpu"):
            xx = x.to(dev).requires_grad_()
            out = fn(xx, *_tpu(*extra) if dev == "tpu" else extra, reduction=reduction,
                     **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v)
                        for k, v in kw.items()})
            cot = torch.linspace(0.5, 2, out.numel()).reshape(out.shape).to(dev)
            grads.append(torch.autograd.grad(out, xx, cot)[0].cpu())
        torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)
    # one sample: a 1-D input
    for fn, tt in ((F.multi_margin_loss, t[0]), (F.multilabel_margin_loss, mt[0])):
        xc = x[0].clone().requires_grad_()
        gc = torch.autograd.grad(fn(xc, tt, reduction=reduction).sum(), xc)[0]
        xd = x[0].to("tpu").requires_grad_()
        gd = torch.autograd.grad(fn(xd, tt.to("tpu"), reduction=reduction).sum(), xd)[0]
        torch.testing.assert_close(gd.cpu(), gc, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conv_transpose_half_accumulates_in_float32(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 4, 4, generator=g).to(dtype)
    w = torch.randn(2, 2, 4, 5, generator=g).to(dtype)
    b = torch.randn(4, generator=g).to(dtype)
    kw = dict(stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=(4, 4))
    _half_error_no_worse_than_cpu(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), x, w, b)


@pytest.mark.parametrize("out", [(5, 7, 4), (2, 1, 3), (1, 1, 1)])
def test_adaptive_avg_pool3d_bfloat16_accumulates_in_float32(out):
    x = torch.randn(2, 3, 8, 9, 20, generator=torch.Generator().manual_seed(0)).bfloat16()
    _half_error_no_worse_than_cpu(lambda x: aten._adaptive_avg_pool3d(x, out), x)


@pytest.mark.parametrize("n", [17, 4097])
@pytest.mark.parametrize("ignore", [False, True])
def test_nll_loss_bfloat16_accumulates_in_float32(n, ignore):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, 5, generator=g) * 3).bfloat16()
    t = torch.randint(0, 5, (n,), generator=g)
    if ignore:
        t[torch.rand(n, generator=g) < 0.3] = -100
    w = torch.rand(5, generator=g).bfloat16()
    for red in ("sum", "mean"):
        _half_error_no_worse_than_cpu(lambda x, t, w: F.nll_loss(x, t, w, reduction=red), x, t, w)


def test_bce_with_logits_bfloat16_like_cpu():
    # CPU's composite rounds every step to bfloat16.
    g = torch.Generator().manual_seed(0)
    x, t = (torch.randn(6, 5, generator=g) * 4).bfloat16(), torch.rand(6, 5, generator=g).bfloat16()
    w, pw = torch.rand(5, generator=g).bfloat16(), torch.rand(5, generator=g).bfloat16() * 3
    for kw in ({}, {"weight": w}, {"pos_weight": pw}, {"weight": w, "pos_weight": pw}):
        cpu = F.binary_cross_entropy_with_logits(x, t, reduction="none", **kw)
        tpu = F.binary_cross_entropy_with_logits(
            *_tpu(x, t), reduction="none", **{k: v.to("tpu") for k, v in kw.items()}).cpu()
        assert torch.equal(tpu, cpu), kw


@pytest.mark.parametrize("is_causal", [True, False])
def test_sdpa_backward_row_term_like_cpu(is_causal):
    # ds = p * (dp - rowsum(dO * out)), as CPU's fused backward: with peaked
    # softmaxes (logits ~ +-100) the gradients stay within CPU's own float32
    # error of the float64 result (sum(p * dp) was 3-15x worse).
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 3 if i == 0 else 6, 8, generator=g) * 4 for i in range(3))
    cot = torch.linspace(-1, 1, 4 * 3 * 8).reshape(4, 3, 8)

    def grads(dev, dt):
        ins = [t.to(dev, dt).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*ins, is_causal=is_causal)
        return [x.cpu().double() for x in torch.autograd.grad(out, ins, cot.to(dev, dt))]

    exact = grads("cpu", torch.float64)
    for t, c, e in zip(grads("tpu", torch.float32), grads("cpu", torch.float32), exact):
        assert (t - e).abs().max() <= 1.5 * (c - e).abs().max() + 2e-6


@pytest.mark.parametrize("mode,shape,size", [("linear", (2, 3, 7), (12,)),
                                             ("trilinear", (2, 3, 4, 3, 5), (5, 4, 6))])
@pytest.mark.parametrize("align_corners", [True, False])
def test_upsample_linear_bfloat16_weights_like_cpu(mode, shape, size, align_corners):
    # CPU's generic kernel keeps a bfloat16 input's interpolation weights in
    # bfloat16 (lambda1, then 1 - lambda1, each rounded). Bit-exact.
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).bfloat16()
    cpu = F.interpolate(x, size=size, mode=mode, align_corners=align_corners)
    tpu = F.interpolate(x.to("tpu"), size=size, mode=mode, align_corners=align_corners)
    assert torch.equal(tpu.cpu(), cpu)
