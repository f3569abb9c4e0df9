"""CTC loss on `tpu` vs PyTorch CPU: `aten._ctc_loss` (IntList and Tensor
lengths) and `aten._ctc_loss_backward`, through `F.ctc_loss` and directly.

Inputs are bit-identical on both sides; the lowering follows the CPU kernel's
log-space arithmetic, so float32 agrees to a few ulps. Cases cover the three
reductions, zero_infinity (with impossible alignments, whose gradient is NaN
without it, as on CPU), a non-zero blank, padded (2-D) and concatenated (1-D)
targets, zero input/target lengths, repeated labels, unbatched input and
unnormalized log_probs (PyTorch's gradient formula, not the autograd gradient
of the forward).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from torch_tpu.debug import metrics

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

DEV = "tpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def _fallbacks(before):
    return sorted(k for k, v in metrics.FALLBACKS.items()
                  if v > before.get(k, 0) and "ctc" in k)


def _case(seed, T=12, N=5, C=6, S=6, blank=0, dtype=torch.float32, normalized=True):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(T, N, C, generator=g, dtype=dtype)
    if normalized:
        lp = lp.log_softmax(2)
    labels = [c for c in range(C) if c != blank]
    tl = [S, 0, 3, 4, 2][:N]
    il = [T, T - 2, 2, 0, T][:N]   # sample 2 (3 labels in 2 steps) and 3 are impossible
    tg = torch.tensor(labels)[torch.randint(0, len(labels), (N, S), generator=g)]
    tg[0, 1] = tg[0, 0]            # a repeated label: needs a blank in between
    return lp, tg, il, tl


def _targets(tg, tl, layout):
    if layout == "2d":
        return tg
    return torch.cat([tg[b, :n] for b, n in enumerate(tl)])


def _lengths(v, kind):
    if kind == "list":
        return list(v)
    t = torch.tensor(v, dtype=torch.long)
    return t.to(DEV) if kind == "tpu" else t


def _run(lp, tg, il, tl, dev, **kw):
    x = lp.detach().to(dev).requires_grad_()
    il = il.to(dev) if isinstance(il, torch.Tensor) and il.device.type != "cpu" else il
    out = F.ctc_loss(x, tg.to(dev), il, tl, **kw)
    return x, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lengths", ["list", "cpu", "tpu"])
@pytest.mark.parametrize("layout", ["2d", "1d"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_loss_vs_cpu(reduction, zero_infinity, layout, lengths, dtype):
    lp, tg, il, tl = _case(0, dtype=dtype)
    tgt = _targets(tg, tl, layout)
    before = dict(metrics.FALLBACKS)
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    xc, ref = _run(lp, tgt, _lengths(il, "list" if lengths == "list" else "cpu"),
                   _lengths(tl, "list" if lengths == "list" else "cpu"), "cpu", **kw)
    xt, out = _run(lp, tgt, _lengths(il, lengths), _lengths(tl, lengths), DEV, **kw)
    assert out.device.type == DEV and out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu(), ref, equal_nan=True, **TOL[dtype])
    cot = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    (gc,) = torch.autograd.grad(ref, xc, cot)
    (gt,) = torch.autograd.grad(out, xt, cot.to(DEV))
    torch.testing.assert_close(gt.cpu(), gc, equal_nan=True, **TOL[dtype])
    if zero_infinity:
        assert torch.isfinite(gt.cpu()).all()
    elif reduction == "none":
        assert gc.isnan().any()  # the impossible samples: NaN gradient, on both devices
    assert _fallbacks(before) == []


@pytest.mark.parametrize("layout", ["2d", "1d"])
def test_ctc_blank_last(layout):
    C = 7
    lp, tg, il, tl = _case(3, C=C, blank=C - 1)
    tgt = _targets(tg, tl, layout)
    kw = dict(blank=C - 1, reduction="sum", zero_infinity=True)
    xc, ref = _run(lp, tgt, il, tl, "cpu", **kw)
    xt, out = _run(lp, tgt, il, tl, DEV, **kw)
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
    (gc,) = torch.autograd.grad(ref, xc)
    (gt,) = torch.autograd.grad(out, xt)
    torch.testing.assert_close(gt.cpu(), gc, **TOL[torch.float32])


@pytest.mark.parametrize("overload", ["intlist", "tensor"])
@pytest.mark.parametrize("layout", ["2d", "1d"])
def test_ctc_raw_outputs(overload, layout):
    """`_ctc_loss` returns (nll, log_alpha) as CPU: shapes, dtypes and the
    values of log_alpha where CPU defines them (t < input_length,
    s < 2 * target_length + 1; CPU leaves the rest uninitialized)."""
    lp, tg, il, tl = _case(5)
    tgt = _targets(tg, tl, layout)
    if overload == "tensor":
        ilc, tlc = torch.tensor(il), torch.tensor(tl)
        ref = torch.ops.aten._ctc_loss.Tensor(lp, tgt, ilc, tlc, 0, False)
        out = torch.ops.aten._ctc_loss.Tensor(lp.to(DEV), tgt.to(DEV), ilc.to(DEV), tlc.to(DEV),
                                              0, False)
    else:
        ref = torch.ops.aten._ctc_loss(lp, tgt, il, tl, 0, False)
        out = torch.ops.aten._ctc_loss(lp.to(DEV), tgt.to(DEV), il, tl, 0, False)
    nll, la = (o.cpu() for o in out)
    assert nll.shape == ref[0].shape and la.shape == ref[1].shape
    assert nll.dtype == ref[0].dtype and la.dtype == ref[1].dtype
    assert la.shape == (lp.shape[1], lp.shape[0], 2 * max(tl) + 1)
    torch.testing.assert_close(nll, ref[0], **TOL[torch.float32])
    mask = torch.zeros(la.shape, dtype=torch.bool)
    for b in range(la.shape[0]):
        mask[b, :il[b], :2 * tl[b] + 1] = True
    mask[:, 0] = True  # CPU fills the first time step with -inf
    torch.testing.assert_close(la[mask], ref[1][mask], **TOL[torch.float32])
    # the backward from the same saved values
    grad = torch.rand(lp.shape[1])
    if overload == "tensor":
        gref = torch.ops.aten._ctc_loss_backward.Tensor(grad, lp, tgt, ilc, tlc, *ref, 0, False)
        gout = torch.ops.aten._ctc_loss_backward.Tensor(
            grad.to(DEV), lp.to(DEV), tgt.to(DEV), ilc.to(DEV), tlc.to(DEV), *out, 0, False)
    else:
        gref = torch.ops.aten._ctc_loss_backward(grad, lp, tgt, il, tl, *ref, 0, False)
        gout = torch.ops.aten._ctc_loss_backward(grad.to(DEV), lp.to(DEV), tgt.to(DEV), il, tl,
                                                 *out, 0, False)
    assert gout.shape == gref.shape and gout.dtype == gref.dtype
    torch.testing.assert_close(gout.cpu(), gref, equal_nan=True, **TOL[torch.float32])


def test_ctc_unnormalized_gradient_is_pytorch_formula():
    """PyTorch's backward is exp(log_probs) - posterior: not the autograd
    gradient of the forward when log_probs are not normalized; match CPU."""
    lp, tg, il, tl = _case(7, normalized=False)
    il, tl = [12, 10, 9, 12, 12], [6, 0, 3, 4, 2]
    xc, ref = _run(lp, tg, il, tl, "cpu", reduction="sum")
    xt, out = _run(lp, tg, il, tl, DEV, reduction="sum")
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
    (gc,) = torch.autograd.grad(ref, xc)
    (gt,) = torch.autograd.grad(out, xt)
    torch.testing.assert_close(gt.cpu(), gc, **TOL[torch.float32])
    # and that formula really differs from the true derivative here
    z = lp.clone().requires_grad_()
    (true,) = torch.autograd.grad(_ctc_true_nll(z, tg, il, tl), z)
    torch.testing.assert_close(_ctc_true_nll(lp, tg, il, tl), ref)
    assert not torch.allclose(true, gc, atol=1e-3)


def _ctc_true_nll(lp, tg, il, tl):
    """A plain autograd-able alpha recursion (reference for the true gradient)."""
    total = lp.new_zeros(())
    for b in range(lp.shape[1]):
        ext = [0]
        for c in tg[b, :tl[b]].tolist():
            ext += [c, 0]
        L = len(ext)
        neg = lp.new_full((), -math.inf)
        a = [lp[0, b, 0]] + ([lp[0, b, ext[1]]] if L > 1 else []) + [neg] * (L - 2 if L > 1 else 0)
        for t in range(1, il[b]):
            new = []
            for s in range(L):
                terms = [a[s]] + ([a[s - 1]] if s > 0 else [])
                if s > 1 and ext[s] != ext[s - 2]:
                    terms.append(a[s - 2])
                new.append(torch.logsumexp(torch.stack(terms), 0) + lp[t, b, ext[s]])
            a = new
        ends = [a[L - 1]] + ([a[L - 2]] if L > 1 else [])
        total = total - torch.logsumexp(torch.stack(ends), 0)
    return total


def test_ctc_unbatched():
    lp, tg, il, tl = _case(9)
    kw = dict(reduction="mean")
    xc, ref = _run(lp[:, 0], tg[0], [il[0]], [tl[0]], "cpu", **kw)
    xt, out = _run(lp[:, 0], tg[0], [il[0]], [tl[0]], DEV, **kw)
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
    (gc,) = torch.autograd.grad(ref, xc)
    (gt,) = torch.autograd.grad(out, xt)
    torch.testing.assert_close(gt.cpu(), gc, **TOL[torch.float32])


def test_ctc_empty_targets_everywhere():
    lp, tg, il, tl = _case(11)
    tl = [0] * lp.shape[1]
    for layout in ("2d", "1d"):
        tgt = tg[:, :0] if layout == "2d" else torch.zeros(0, dtype=torch.long)
        xc, ref = _run(lp, tgt, il, tl, "cpu", reduction="none")
        xt, out = _run(lp, tgt, il, tl, DEV, reduction="none")
        torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
        (gc,) = torch.autograd.grad(ref.sum(), xc)
        (gt,) = torch.autograd.grad(out.sum(), xt)
        torch.testing.assert_close(gt.cpu(), gc, **TOL[torch.float32])


@pytest.mark.parametrize("bad", ["input_too_long", "negative_target", "targets_too_short",
                                 "blank", "float_lengths"])
def test_ctc_errors(bad):
    lp, tg, il, tl = _case(13)
    blank = 0
    if bad == "input_too_long":
        il = [lp.shape[0] + 1] + il[1:]
    elif bad == "negative_target":
        tl = [-1] + tl[1:]
    elif bad == "targets_too_short":
        tl = [tg.shape[1] + 1] + tl[1:]
    elif bad == "blank":
        blank = lp.shape[2]
    elif bad == "float_lengths":
        il, tl = torch.tensor(il, dtype=torch.float32), torch.tensor(tl, dtype=torch.float32)
    with pytest.raises(RuntimeError) as cpu_err:
        F.ctc_loss(lp, tg, il, tl, blank=blank)
    before = dict(metrics.FALLBACKS)
    til = il.to(DEV) if isinstance(il, torch.Tensor) else il
    ttl = tl.to(DEV) if isinstance(tl, torch.Tensor) else tl
    with pytest.raises(RuntimeError) as tpu_err:
        F.ctc_loss(lp.to(DEV), tg.to(DEV), til, ttl, blank=blank)
    first = str(cpu_err.value).splitlines()[0].split("(while")[0].strip()
    assert first in str(tpu_err.value)
    assert _fallbacks(before) == []


@pytest.mark.parametrize("layout", ["2d", "1d"])
def test_ctc_new_lengths_reuse_the_executable(layout):
    """The lengths are data in the program: a new batch of lengths (same
    shapes, same padded state count) compiles nothing new."""
    from torch_tpu.runtime import executor

    lp, tg, il, tl = _case(17, T=10, N=4, S=8)
    x = lp.to(DEV).requires_grad_()
    runs = [([10, 9, 8, 7], [8, 5, 3, 2]), ([7, 10, 10, 9], [1, 8, 4, 6]),
            ([10, 10, 6, 8], [7, 2, 8, 5])]
    if layout == "1d":  # longest target 5..8: one power-of-two bucket
        runs = [(a, [min(max(v, 5), 8) for v in b]) for a, b in runs]
    for i, (il, tl) in enumerate(runs):
        if i == 1:
            before = executor.STATS.misses
        tgt = _targets(tg, tl, layout).to(DEV)
        loss = F.ctc_loss(x, tgt, il, tl, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
        ref_x = lp.clone().requires_grad_()
        ref = F.ctc_loss(ref_x, _targets(tg, tl, layout), il, tl, reduction="sum")
        torch.testing.assert_close(loss.cpu(), ref, **TOL[torch.float32])
        torch.testing.assert_close(g.cpu(), torch.autograd.grad(ref, ref_x)[0],
                                   equal_nan=True, **TOL[torch.float32])
    if layout == "2d":
        assert executor.STATS.misses == before


@pytest.mark.parametrize("layout", ["2d", "1d"])
def test_ctc_intlist_lowering_for_graphs(layout):
    """The table's IntList lowerings (used inside graphs; eager runs the
    kernels) agree with CPU too."""
    from torch_tpu.runtime import executor

    aten = torch.ops.aten
    lp, tg, il, tl = _case(19)
    tgt = _targets(tg, tl, layout)
    nll, la = aten._ctc_loss(lp, tgt, il, tl, 0, True)
    out = executor.runner_for(aten._ctc_loss.default)(lp.to(DEV), tgt.to(DEV), il, tl, 0, True)
    torch.testing.assert_close(out[0].cpu(), nll, **TOL[torch.float32])
    assert out[1].shape == la.shape
    grad = torch.rand(lp.shape[1])
    ref = aten._ctc_loss_backward(grad, lp, tgt, il, tl, nll, la, 0, True)
    got = executor.runner_for(aten._ctc_loss_backward.default)(
        grad.to(DEV), lp.to(DEV), tgt.to(DEV), il, tl, out[0], out[1], 0, True)
    torch.testing.assert_close(got.cpu(), ref, **TOL[torch.float32])
