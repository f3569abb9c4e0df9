"""Neural-network ops on `tpu` vs PyTorch CPU: forward values and, through
PyTorch's own autograd, the gradients of every floating input.

float32 compares against CPU float32. bfloat16 compares against CPU float32
run on the same (bfloat16-rounded) inputs: our kernels compute in float32 and
round once, which is what a bfloat16 result can at best be, so the tolerance
is a few bfloat16 ulps.

The training-parity tests at the end run small models (MLP, CNN with
BatchNorm, a transformer block) for 20 optimizer steps on both devices.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_tpu.debug import metrics
from torch_tpu.runtime import executor

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

DEV = "tpu"
F32, BF16 = torch.float32, torch.bfloat16
DTYPES = [F32, BF16]
TOL = {F32: dict(rtol=1e-5, atol=1e-5), BF16: dict(rtol=2e-2, atol=2e-2)}

# Ops of this family: none of them may run through the CPU fallback.
_FAMILY = ("convolution", "pool", "norm", "nll_loss", "mse_loss", "smooth_l1", "huber",
           "binary_cross_entropy", "embedding", "dropout", "attention", "upsample", "pad",
           "pixel_")


def _family_fallbacks(before):
    return sorted(k for k, v in metrics.FALLBACKS.items()
                  if v > before.get(k, 0) and any(f in k for f in _FAMILY))


def rand(*shape, dtype=F32, seed=0, low=-2.0, high=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def check(fn, *args, dtype=F32, grad=True, tol=None, gtol=None, nondiff=(), const=()):
    """Run fn on CPU and on tpu; compare outputs and input gradients.

    Floating tensor arguments are cast to `dtype` (indices stay as they are)
    and require grad when `grad` (except arguments at the indices in
    `const`). The CPU reference runs in float32. Outputs at the indices in
    `nondiff` get no cotangent.
    """
    before = dict(metrics.FALLBACKS)

    def prep(i, a, dev, ref):
        if not isinstance(a, torch.Tensor):
            return a
        if a.is_floating_point():
            a = a.to(dtype)
            if ref:
                a = a.float()
        a = a.detach().to(dev)
        if grad and a.is_floating_point() and i not in const:
            a.requires_grad_(True)
        return a

    cargs = [prep(i, a, "cpu", True) for i, a in enumerate(args)]
    dargs = [prep(i, a, DEV, False) for i, a in enumerate(args)]
    want_dtypes = None
    if dtype != F32:  # PyTorch's output dtypes for these inputs, from meta tensors
        try:
            want_dtypes = [t.dtype for t in _tensors(fn(*[prep(i, a, "meta", False)
                                                           for i, a in enumerate(args)]))]
        except Exception:  # noqa: BLE001  (an op without a meta kernel)
            pass
    expected = fn(*cargs)
    actual = fn(*dargs)
    t = tol or TOL[dtype]
    exp_l, act_l = _tensors(expected), _tensors(actual)
    assert len(exp_l) == len(act_l)
    for i, (a, e) in enumerate(zip(act_l, exp_l)):
        assert a.device.type == DEV
        ac = a.detach().cpu()
        if want_dtypes is not None:
            assert ac.dtype == want_dtypes[i], (i, ac.dtype, want_dtypes[i])
        if dtype != F32 and ac.is_floating_point():
            ac = ac.float()
        assert ac.shape == e.shape, (i, ac.shape, e.shape)
        torch.testing.assert_close(ac, e.detach(), equal_nan=True, msg=f"output {i}", **t)
    if grad:
        outs = [(a, e) for i, (a, e) in enumerate(zip(act_l, exp_l))
                if e.requires_grad and i not in nondiff]
        cin = [a for a in cargs if isinstance(a, torch.Tensor) and a.requires_grad]
        din = [a for a in dargs if isinstance(a, torch.Tensor) and a.requires_grad]
        if outs and cin:
            cots = [rand(*e.shape, seed=7 + i).to(dtype) for i, (_, e) in enumerate(outs)]
            eg = torch.autograd.grad([e for _, e in outs], cin, [c.float() for c in cots],
                                     allow_unused=True)
            ag = torch.autograd.grad([a for a, _ in outs], din, [c.to(DEV) for c in cots],
                                     allow_unused=True)
            gt = gtol or t
            for i, (a, e) in enumerate(zip(ag, eg)):
                if e is None:
                    assert a is None or not a.cpu().any()
                    continue
                assert a is not None, f"no gradient for input {i}"
                torch.testing.assert_close(a.cpu().float(), e, equal_nan=True,
                                           msg=f"grad {i}", **gt)
    assert not _family_fallbacks(before), _family_fallbacks(before)
    return actual, expected


# --------------------------------------------------------------------------
# convolution


CONV_CASES = [
    # (dims, N, Cin, Cout, spatial, kwargs)
    (1, 2, 4, 6, (9,), dict(stride=2, padding=1)),
    (2, 2, 4, 6, (7, 8), dict(stride=1, padding=1, bias=False)),
    (2, 2, 4, 6, (9, 9), dict(stride=(2, 1), padding=(0, 2), dilation=(2, 1), groups=2)),
    (2, 1, 3, 4, (6, 6), dict(padding="same", dilation=2)),
    (3, 1, 2, 4, (5, 4, 6), dict(stride=2, padding=1)),
]


def _conv_args(dims, n, cin, cout, sp, kw, transposed=False):
    kw = dict(kw)
    groups = kw.get("groups", 1)
    bias = kw.pop("bias", True)
    k = (3,) * dims
    x = rand(n, cin, *sp, seed=1)
    w = rand(*((cin, cout // groups) if transposed else (cout, cin // groups)), *k, seed=2) * 0.3
    b = rand(cout, seed=3) if bias else None
    return x, w, b, kw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv(case, dtype):
    dims, n, cin, cout, sp, kw = CONV_CASES[case]
    x, w, b, kw = _conv_args(dims, n, cin, cout, sp, kw)
    conv = getattr(F, f"conv{dims}d")
    gt = dict(rtol=1e-4, atol=1e-4) if dtype == F32 else dict(rtol=3e-2, atol=6e-2)
    check(lambda x, w, b: conv(x, w, b, **kw), x, w, b, dtype=dtype, gtol=gt)


TCONV_CASES = [
    (1, 2, 4, 6, (5,), dict(stride=2, padding=1, output_padding=1)),
    (2, 2, 4, 6, (4, 5), dict(stride=2, padding=1, output_padding=(1, 0), groups=2)),
    (2, 1, 3, 4, (4, 4), dict(stride=1, padding=2, dilation=2)),
    (3, 1, 2, 2, (3, 3, 2), dict(stride=(2, 1, 2), padding=0)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(TCONV_CASES)))
def test_conv_transpose(case, dtype):
    dims, n, cin, cout, sp, kw = TCONV_CASES[case]
    x, w, b, kw = _conv_args(dims, n, cin, cout, sp, kw, transposed=True)
    conv = getattr(F, f"conv_transpose{dims}d")
    gt = dict(rtol=1e-4, atol=1e-4) if dtype == F32 else dict(rtol=3e-2, atol=6e-2)
    check(lambda x, w, b: conv(x, w, b, **kw), x, w, b, dtype=dtype, gtol=gt)


def test_conv_unbatched_and_module():
    x, w = rand(3, 8, 8), rand(5, 3, 3, 3)
    check(lambda x, w: F.conv2d(x, w, padding=1), x, w)
    m = nn.Conv2d(3, 4, 3, stride=2)
    md = nn.Conv2d(3, 4, 3, stride=2).to(DEV)
    md.load_state_dict(m.state_dict())
    xb = rand(2, 3, 9, 9)
    torch.testing.assert_close(md(xb.to(DEV)).cpu(), m(xb), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# pooling


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=3, stride=2, ceil_mode=True),
                                dict(kernel_size=(2, 3), stride=1, dilation=2)])
def test_max_pool2d(kw, dtype):
    x = rand(2, 3, 9, 10)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), x, dtype=dtype, nondiff=(1,))


def test_max_pool_nan_inf_and_1d_3d():
    x = rand(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, :3, :3] = -float("inf")
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x, grad=False)
    check(lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True), rand(2, 3, 11),
          nondiff=(1,))
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), rand(1, 2, 4, 5, 6),
          nondiff=(1,))
    with torch.no_grad():
        check(lambda x: F.max_pool1d(x, 2), rand(2, 3, 8), grad=False)
    check(lambda x: F.max_pool2d(x, 2), rand(3, 6, 6))  # unbatched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(1, 2), divisor_override=5),
])
def test_avg_pool2d(kw, dtype):
    check(lambda x: F.avg_pool2d(x, **kw), rand(2, 3, 9, 10), dtype=dtype)


def test_avg_pool1d_3d():
    check(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
          rand(2, 3, 10))
    check(lambda x: F.avg_pool3d(x, 2, padding=1), rand(1, 2, 4, 5, 6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [(3, 3), (2, 4), 1, (5, 7)])
def test_adaptive_pool2d(size, dtype):
    x = rand(2, 3, 7, 9)
    check(lambda x: F.adaptive_avg_pool2d(x, size), x, dtype=dtype)
    check(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), x, dtype=dtype,
          nondiff=(1,))


def test_adaptive_pool_1d_3d():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), rand(2, 3, 10))
    check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), rand(2, 3, 10),
          nondiff=(1,))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), rand(1, 2, 5, 6, 4))
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True),
          rand(1, 2, 5, 6, 4), nondiff=(1,))


# --------------------------------------------------------------------------
# normalization


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(dtype):
    x, w, b = rand(2, 5, 8), rand(8), rand(8)
    check(lambda x, w, b: F.layer_norm(x, (8,), w, b), x, w, b, dtype=dtype)
    check(lambda x: F.layer_norm(x, (5, 8), eps=1e-3), x, dtype=dtype)
    m = nn.LayerNorm(8)

    def ln_stats_f32(x):
        # mean/rstd: CPU keeps a bf16 input's dtype, the meta function `check`
        # reads dtypes from says float32 (test_ops_nn_extra checks CPU's dtypes)
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)
        return y, mean.float(), rstd.float()

    check(ln_stats_f32, x, dtype=dtype, nondiff=(1, 2))
    del m


def _bn_pair(cls, *args, **kw):
    torch.manual_seed(0)
    m = cls(*args, **kw)
    if m.weight is not None:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
    md = cls(*args, **kw).to(DEV)
    md.load_state_dict(m.state_dict())
    return m, md


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls,shape", [(nn.BatchNorm2d, (4, 3, 5, 5)), (nn.BatchNorm1d, (6, 3)),
                                       (nn.BatchNorm1d, (4, 3, 7)),
                                       (nn.BatchNorm3d, (2, 3, 3, 4, 2))])
def test_batch_norm(cls, shape, dtype):
    m, md = _bn_pair(cls, 3, momentum=0.2)
    if dtype == BF16:
        md = md.to(BF16)
        m = m.double().float()
    x = rand(*shape, low=-1, high=3)
    tol = TOL[dtype]
    gt = dict(rtol=1e-4, atol=1e-4) if dtype == F32 else dict(rtol=5e-2, atol=5e-2)
    for train in (True, False):
        m.train(train)
        md.train(train)
        xc = x.to(dtype).float().clone().requires_grad_(True)
        xd = x.to(dtype).to(DEV).requires_grad_(True)
        yc, yd = m(xc), md(xd)
        assert yd.dtype == dtype
        torch.testing.assert_close(yd.detach().cpu().float(), yc.detach(), **tol)
        cot = rand(*shape, seed=5).to(dtype)
        yc.backward(cot.float())
        yd.backward(cot.to(DEV))
        torch.testing.assert_close(xd.grad.cpu().float(), xc.grad, **gt)
        for p, pd in zip(m.parameters(), md.parameters()):
            torch.testing.assert_close(pd.grad.cpu().float(), p.grad, **gt)
            p.grad = pd.grad = None
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(md, name).cpu().to(getattr(m, name).dtype),
                                       getattr(m, name), **tol)


def test_batch_norm_functional_variants():
    x, w, b = rand(4, 3, 5), rand(3), rand(3)
    rm, rv = rand(3, seed=4), rand(3, seed=5, low=0.5, high=2)
    # No running statistics (track_running_stats=False, instance norm).
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b)
    check(lambda x: F.instance_norm(x), x)
    m, md = _bn_pair(nn.InstanceNorm2d, 3, affine=True, track_running_stats=True)
    xi = rand(2, 3, 4, 4)
    check(lambda x: md(x) if x.device.type == DEV else m(x), xi)
    torch.testing.assert_close(md.running_mean.cpu(), m.running_mean)
    torch.testing.assert_close(md.running_var.cpu(), m.running_var)
    # Eval with given statistics, gradients through the affine params.
    check(lambda x, w, b, rm, rv: F.batch_norm(x, rm.detach(), rv.detach(), w, b,
                                               training=False), x, w, b, rm, rv)
    a = torch.ops.aten
    outs = a._native_batch_norm_legit_functional(x.to(DEV), w.to(DEV), b.to(DEV), rm.to(DEV),
                                                 rv.to(DEV), True, 0.1, 1e-5)
    rmc, rvc = rm.clone(), rv.clone()
    ref = a.native_batch_norm(x, w, b, rmc, rvc, True, 0.1, 1e-5)
    for o, r in zip(outs, list(ref) + [rmc, rvc]):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-5)
    rmd, rvd = rm.to(DEV), rv.to(DEV)
    outs = a._batch_norm_with_update(x.to(DEV), w.to(DEV), b.to(DEV), rmd, rvd, 0.1, 1e-5)
    torch.testing.assert_close(outs[0].cpu(), ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rmd.cpu(), rmc)
    torch.testing.assert_close(rvd.cpu(), rvc)


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm(dtype):
    x, w, b = rand(2, 6, 4, 5), rand(6), rand(6)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), x, w, b, dtype=dtype)
    check(lambda x: F.group_norm(x, 2), rand(3, 4, 7), dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    x, w = rand(2, 5, 8), rand(8)
    gt = None if dtype == F32 else dict(rtol=4e-2, atol=4e-2)
    check(lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), x, w, dtype=dtype, gtol=gt)
    n = executor.STATS.per_op["aten._fused_rms_norm.default"]
    check(lambda x: F.rms_norm(x, (5, 8)), x, dtype=dtype, gtol=gt)
    assert executor.STATS.per_op["aten._fused_rms_norm.default"] > n


# --------------------------------------------------------------------------
# losses


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_nll(reduction, dtype):
    x = rand(6, 5)
    t = torch.tensor([0, 4, 2, 2, 1, 3])
    w = rand(5, low=0.2, high=1.5)
    check(lambda x: F.cross_entropy(x, t.to(x.device), reduction=reduction), x, dtype=dtype)
    check(lambda x, w: F.cross_entropy(x, t.to(x.device), w, ignore_index=2,
                                       reduction=reduction), x, w, dtype=dtype, const=(1,))
    check(lambda x: F.nll_loss(x, t.to(x.device), reduction=reduction, ignore_index=4), x,
          dtype=dtype)
    # Spatial (nll_loss2d) targets.
    x2 = rand(2, 4, 3, 5)
    t2 = torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(1))
    check(lambda x, w: F.cross_entropy(x, t2.to(x.device), w[:4], ignore_index=1,
                                       reduction=reduction), x2, w, dtype=dtype, const=(1,))


def test_cross_entropy_extra():
    x = rand(5)
    check(lambda x: F.cross_entropy(x, torch.tensor(3, device=x.device)), x)
    x = rand(4, 6)
    t = torch.tensor([1, 5, 0, 2])
    check(lambda x: F.cross_entropy(x, t.to(x.device), label_smoothing=0.1), x)
    # Everything ignored: mean is 0/0 = nan, like CPU.
    check(lambda x: F.nll_loss(x, torch.full((4,), 3, device=x.device), ignore_index=3), x,
          grad=False)
    check(lambda x: F.nll_loss(x.unsqueeze(-1), t.unsqueeze(-1).to(x.device)), x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction, dtype):
    x, y = rand(4, 5), rand(4, 5, seed=3)
    x[0, 0] = y[0, 0]  # exactly on a kink
    for fn in (lambda x, y: F.mse_loss(x, y, reduction=reduction),
               lambda x, y: F.l1_loss(x, y, reduction=reduction),
               lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5),
               lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.0),
               lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.7)):
        check(fn, x, y, dtype=dtype)
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), rand(4, 5), rand(5, seed=2),
          dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_kl(reduction, dtype):
    p = rand(4, 5, low=0.05, high=0.95)
    t = rand(4, 5, seed=3, low=0, high=1)
    w = rand(5, low=0.5, high=1.5)
    gt = None if dtype == F32 else dict(rtol=5e-2, atol=5e-2)
    check(lambda p, t, w: F.binary_cross_entropy(p, t, w, reduction=reduction), p, t, w,
          dtype=dtype, gtol=gt, const=(1, 2))
    check(lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, w, reduction=reduction,
                                                             pos_weight=w * 2),
          rand(4, 5), t, w, dtype=dtype, gtol=gt, const=(2,))
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction),
          rand(4, 5), t, dtype=dtype)
    red = "batchmean" if reduction == "mean" else reduction
    check(lambda x, t: F.kl_div(F.log_softmax(x, -1), t, reduction=red), rand(4, 5), t,
          dtype=dtype, gtol=gt)


def test_bce_saturates_like_cpu():
    p = torch.tensor([0.0, 1.0, 0.5, 1e-30])
    t = torch.tensor([1.0, 0.0, 0.5, 1.0])
    check(lambda p, t: F.binary_cross_entropy(p, t, reduction="none"), p, t, const=(1,))


# --------------------------------------------------------------------------
# embedding


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [dict(), dict(padding_idx=1), dict(scale_grad_by_freq=True),
                                dict(padding_idx=0, scale_grad_by_freq=True)])
def test_embedding(kw, dtype):
    w = rand(7, 4)
    idx = torch.tensor([[0, 1, 1, 6], [3, 1, 0, 0]])
    check(lambda w: F.embedding(idx.to(w.device), w, **kw), w, dtype=dtype)
    check(lambda w: F.embedding(idx[0, 1].to(w.device), w, **kw), w, dtype=dtype)


def test_embedding_max_norm():
    w = rand(6, 4) * 3
    i = torch.tensor([1, 3, 3, 5])
    for norm_type in (2.0, 1.0):
        wc, wd = w.clone(), w.to(DEV)
        oc = F.embedding(i, wc, max_norm=1.5, norm_type=norm_type)
        od = F.embedding(i.to(DEV), wd, max_norm=1.5, norm_type=norm_type)
        torch.testing.assert_close(od.cpu(), oc)
        torch.testing.assert_close(wd.cpu(), wc)  # renormalized in place


def test_embedding_module():
    torch.manual_seed(0)
    m = nn.Embedding(10, 3, padding_idx=2)
    md = nn.Embedding(10, 3, padding_idx=2).to(DEV)
    md.load_state_dict(m.state_dict())
    idx = torch.tensor([2, 5, 5, 9])
    torch.testing.assert_close(md(idx.to(DEV)).cpu(), m(idx))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    w = rand(6, 3)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 0])
    off = torch.tensor([0, 2, 2, 5])  # bag 1 is empty
    for pad in (None, 4):
        check(lambda w: F.embedding_bag(idx.to(w.device), w, off.to(w.device), mode=mode,
                                        padding_idx=pad), w)
    check(lambda w: F.embedding_bag(torch.tensor([[1, 2, 4], [5, 4, 0]], device=w.device), w,
                                    mode=mode), w)
    if mode == "sum":
        check(lambda w, p: F.embedding_bag(idx.to(w.device), w, off.to(w.device), mode=mode,
                                           per_sample_weights=p), w, rand(8, seed=3))
    ends = torch.tensor([0, 2, 2, 8])
    check(lambda w: F.embedding_bag(idx.to(w.device), w, ends.to(w.device), mode=mode,
                                    include_last_offset=True), w)


# --------------------------------------------------------------------------
# dropout


def test_dropout():
    x = rand(64, 128, low=1, high=2).to(DEV).requires_grad_(True)
    torch.manual_seed(0)
    y = F.dropout(x, 0.3, training=True)
    torch.manual_seed(0)
    y2 = F.dropout(x, 0.3, training=True)
    y3 = F.dropout(x, 0.3, training=True)
    yc, y2c, y3c, xc = y.detach().cpu(), y2.detach().cpu(), y3.detach().cpu(), x.detach().cpu()
    assert torch.equal(yc, y2c), "same seed must give the same mask"
    assert not torch.equal(yc, y3c), "next call must give a new mask"
    keep = yc != 0
    frac = keep.float().mean().item()
    assert abs(frac - 0.7) < 0.02, frac
    torch.testing.assert_close(yc[keep], xc[keep] / 0.7)
    y.backward(torch.ones_like(y))
    g = x.grad.cpu()
    torch.testing.assert_close(g, keep.float() / 0.7)
    # eval, p=0 and p=1
    assert torch.equal(F.dropout(x, 0.3, training=False).detach().cpu(), xc)
    assert torch.equal(F.dropout(x, 0.0, training=True).detach().cpu(), xc)
    assert not F.dropout(x, 1.0, training=True).detach().cpu().any()
    out, mask = torch.ops.aten.native_dropout(x.detach(), 0.5, True)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    torch.testing.assert_close(out.cpu(), xc * mask.cpu() * 2)
    out, mask = torch.ops.aten.native_dropout(x.detach(), 0.5, False)
    assert mask.cpu().all() and torch.equal(out.cpu(), xc)
    m = nn.Dropout(0.5).to(DEV)
    m.eval()
    assert torch.equal(m(x).detach().cpu(), xc)


def test_dropout_bf16():
    x = torch.ones(32, 32, dtype=BF16, device=DEV)
    y = F.dropout(x, 0.5).cpu()
    assert y.dtype == BF16
    assert set(y.unique().tolist()) <= {0.0, 2.0}


# --------------------------------------------------------------------------
# attention


def _qkv(b=2, hq=4, hk=4, lq=5, lk=6, e=8, ev=8, seed=0):
    return rand(b, hq, lq, e, seed=seed), rand(b, hk, lk, e, seed=seed + 1), \
        rand(b, hk, lk, ev, seed=seed + 2)


def _fused_count():
    return executor.STATS.per_op["aten._scaled_dot_product_fused_attention_overrideable.default"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "gqa", "scale",
                                  "3d", "causal_rect", "ev"])
def test_sdpa(case, dtype):
    q, k, v = _qkv()
    kw = {}
    extra = ()
    if case == "causal":
        kw["is_causal"] = True
    elif case == "causal_rect":
        q, k, v = _qkv(lq=6, lk=4)
        kw["is_causal"] = True
    elif case == "bool_mask":
        mask = rand(5, 6, seed=9) > -1
        mask[2] = False  # a fully masked row gives zeros
        extra = (mask,)
    elif case == "float_mask":
        extra = (rand(2, 1, 5, 6, seed=9),)
    elif case == "gqa":
        q, k, v = _qkv(hq=6, hk=2)
        kw["enable_gqa"] = True
    elif case == "scale":
        kw["scale"] = 0.3
    elif case == "3d":
        q, k, v = q[0], k[0], v[0]
    elif case == "ev":
        q, k, v = _qkv(ev=3)

    def fn(q, k, v, *m):
        if m:
            mm = m[0]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mm, **kw)
        return F.scaled_dot_product_attention(q, k, v, **kw)

    n = _fused_count()
    gt = None if dtype == F32 else dict(rtol=5e-2, atol=5e-2)
    check(fn, q, k, v, *extra, dtype=dtype, gtol=gt)
    assert _fused_count() > n, "sdpa did not run as the fused op"


def test_sdpa_dropout():
    q, k, v = _qkv(lq=16, lk=16)
    q, k, v = (t.to(DEV).requires_grad_(True) for t in (q, k, v))
    torch.manual_seed(1)
    o1 = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(1)
    o2 = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    o3 = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(o1.detach().cpu(), o2.detach().cpu())
    assert not torch.equal(o1.detach().cpu(), o3.detach().cpu())
    o0 = F.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(o1.detach().cpu(), o0.detach().cpu())
    # The backward regenerates the forward's mask: compare with jax-free
    # finite differences of the same seeded forward along a direction.
    g = rand(*o1.shape, seed=3).to(DEV)
    gq, = torch.autograd.grad(o1, q, g)
    d = rand(*q.shape, seed=4).to(DEV) * 1e-2

    def f(qq):
        torch.manual_seed(1)
        return (F.scaled_dot_product_attention(qq, k, v, dropout_p=0.5) * g).sum()

    with torch.no_grad():
        fd = (f(q + d) - f(q - d)).cpu() / 2
    lin = (gq * d).sum().cpu()
    torch.testing.assert_close(lin, fd, rtol=2e-2, atol=1e-4)


def test_sdpa_math_fallback_shapes():
    # Broadcast batch dims and 5-d inputs use PyTorch's math path: still correct.
    q = rand(2, 3, 4, 5, 8)
    k = rand(1, 3, 4, 6, 8, seed=1)
    v = rand(1, 3, 4, 6, 8, seed=2)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)


def test_sdpa_errors():
    q, k, v = (t.to(DEV) for t in _qkv())
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.bool,
                                                                      device=DEV),
                                       is_causal=True)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k.bfloat16(), v)


def test_sdpa_inference_mode():
    q, k, v = _qkv()
    with torch.inference_mode():
        out = F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), is_causal=True)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v,
                                                                         is_causal=True),
                               rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------
# upsampling, padding, pixel shuffle


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(7, 5)),
                                dict(scale_factor=1.5), dict(size=(3, 2)),
                                dict(scale_factor=2, mode="nearest-exact"),
                                dict(size=(7, 9), mode="nearest-exact"),
                                dict(scale_factor=2, mode="bilinear"),
                                dict(size=(7, 5), mode="bilinear", align_corners=True),
                                dict(scale_factor=1.7, mode="bilinear"),
                                dict(size=(3, 2), mode="bilinear"),
                                dict(scale_factor=(1.5, 2.5), mode="bilinear",
                                     recompute_scale_factor=False),
                                dict(scale_factor=1.7, mode="bicubic"),
                                dict(size=(3, 8), mode="bicubic", align_corners=True)])
def test_upsample2d(kw, dtype):
    check(lambda x: F.interpolate(x, **kw), rand(2, 3, 4, 6), dtype=dtype)


def test_upsample_1d_3d():
    check(lambda x: F.interpolate(x, scale_factor=2.5), rand(2, 3, 5))
    check(lambda x: F.interpolate(x, size=8, mode="linear"), rand(2, 3, 5))
    check(lambda x: F.interpolate(x, size=7, mode="linear", align_corners=True), rand(2, 3, 5))
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), rand(1, 2, 2, 3, 2))
    check(lambda x: F.interpolate(x, size=(3, 5, 4), mode="trilinear"), rand(1, 2, 2, 3, 2))
    check(lambda x: F.interpolate(x, size=(3, 5, 4), mode="nearest-exact"),
          rand(1, 2, 2, 3, 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pad(dtype):
    x = rand(2, 3, 5, 6)
    check(lambda x: F.pad(x, (1, 2)), x, dtype=dtype)
    check(lambda x: F.pad(x, (1, 2, 0, 3), value=1.5), x, dtype=dtype)
    check(lambda x: F.pad(x, (-1, 2, 1, -2)), x, dtype=dtype)
    for mode in ("reflect", "replicate", "circular"):
        check(lambda x: F.pad(x, (1, 2, 2, 0), mode=mode), x, dtype=dtype)
        if dtype == F32:
            check(lambda x: F.pad(x, (1, 2), mode=mode), rand(2, 3, 5))
            check(lambda x: F.pad(x, (1, 0, 2, 1, 1, 1), mode=mode), rand(1, 2, 3, 4, 5))
    check(lambda x: F.pad(x, (2, 2)), torch.arange(6).reshape(2, 3), grad=False)
    # Negative padding crops.
    check(lambda x: F.pad(x, (-1, 2, 1, -2), mode="replicate"), x, dtype=dtype)
    check(lambda x: F.pad(x, (2, -1), mode="reflect"), rand(2, 3, 5), dtype=dtype)


def test_pixel_shuffle():
    check(lambda x: F.pixel_shuffle(x, 2), rand(2, 8, 3, 4))
    check(lambda x: F.pixel_unshuffle(x, 2), rand(2, 2, 4, 6))
    check(lambda x: F.pixel_shuffle(x, 3), rand(9, 2, 2))


# --------------------------------------------------------------------------
# training parity: 20 optimizer steps on CPU and tpu


def _train(make_model, make_batch, loss_fn, opt_name, steps=20, seed=0):
    torch.manual_seed(seed)
    model = make_model()
    model_d = make_model().to(DEV)
    model_d.load_state_dict(model.state_dict())

    def opt(m):
        if opt_name == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)

    oc, od = opt(model), opt(model_d)
    losses_c, losses_d = [], []
    for step in range(steps):
        x, y = make_batch(step % 2)
        for m, o, dev, out in ((model, oc, "cpu", losses_c), (model_d, od, DEV, losses_d)):
            o.zero_grad()
            loss = loss_fn(m(x.to(dev)), y.to(dev))
            loss.backward()
            o.step()
            out.append(loss.detach())
    lc = torch.stack(losses_c)
    ld = torch.stack([t.cpu() for t in losses_d])
    torch.testing.assert_close(ld, lc, rtol=1e-4, atol=1e-6)
    if opt_name == "sgd":
        # (Not for AdamW: parameters whose gradient is zero up to rounding, such
        # as a bias before BatchNorm or attention's key bias, take +-lr steps
        # on the sign of the rounding noise, on CPU as on any device.)
        for (n, p), pd in zip(model.named_parameters(), model_d.parameters()):
            torch.testing.assert_close(pd.detach().cpu(), p.detach(), rtol=1e-3, atol=1e-4,
                                       msg=n)
    assert lc[-1] < lc[0]


def _batch(shape, ncls, *, tshape=None):
    def make(step):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(shape, generator=g)
        y = torch.randint(0, ncls, tshape or (shape[0],), generator=g)
        return x, y
    return make


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_train_mlp(opt):
    def make():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(),
                             nn.Dropout(0.0), nn.Linear(32, 5))
    _train(make, _batch((8, 16), 5), F.cross_entropy, opt)


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 2 * 2, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.relu(self.b2(self.c2(x)))
        x = F.adaptive_avg_pool2d(x, 2)
        return self.fc(torch.flatten(x, 1))


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_train_cnn(opt):
    _train(_CNN, _batch((4, 3, 8, 8), 4), F.cross_entropy, opt)


class _Block(nn.Module):
    def __init__(self, vocab=11, d=16, heads=4, explicit=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
                                 nn.Dropout(0.0))
        self.head = nn.Linear(d, vocab)
        self.heads, self.explicit = heads, explicit

    def attend(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.explicit:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = F.dropout(att, 0.0, self.training) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, idx):
        x = self.emb(idx)
        x = x + self.attend(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


def _lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _tokens(step):
    g = torch.Generator().manual_seed(200 + step)
    idx = torch.randint(0, 11, (3, 7), generator=g)
    return idx, torch.roll(idx, -1, dims=1)


@pytest.mark.parametrize("explicit", [False, True], ids=["sdpa", "matmul_softmax"])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_train_transformer_block(opt, explicit):
    _train(lambda: _Block(explicit=explicit), _tokens, _lm_loss, opt)
