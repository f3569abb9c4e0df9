"""nn ops on `tpu` against PyTorch's CPU: what PyTorch's own test/nn/test_embedding.py
and test/nn/test_pooling.py found (issue 38).

- pooling keeps its input's memory format (channels_last in, channels_last
  out, backwards included), with CPU's strides;
- CPU's exception types and texts: integer inputs to adaptive pooling, a
  weight that is not 2-D to embedding_bag;
- embedding_bag's out-of-range indices raise (a device-side check: at the
  next synchronize, or at the op with TORCH_TPU_LAUNCH_BLOCKING);
- cases that failed: every bag empty in max mode, pooling backward on an
  empty batch, fractional max pooling to an output size of 0, embedding_bag's
  sparse backward with padding_idx;
- Embedding(sparse=True) gradients accumulate uncoalesced, as on CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_tpu.runtime import asserts
from torch_tpu.runtime.context import CONTEXT

# The CPU fallback off, and no fallback counted, in every test: an op without
# a lowering would otherwise compare CPU with CPU.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

CL = torch.channels_last
CL3 = torch.channels_last_3d


def _tpu(x):
    return x.detach().to("tpu").requires_grad_(x.requires_grad)


def _cpu_error(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the error CPU raises, whatever it is
        return e
    raise AssertionError("CPU raised nothing")


def _assert_same_error(fn, cpu_args, tpu_args):
    want = _cpu_error(fn, *cpu_args)
    with pytest.raises(type(want)) as got:
        fn(*tpu_args)
        torch.tpu.synchronize()
    assert type(got.value) is type(want)
    assert str(want) in str(got.value)


# -- memory format --------------------------------------------------------------

_POOLS = {
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), 4),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), 4),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (3, 5), return_indices=True), 4),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (3, 5)), 4),
    "adaptive_avg_pool2d_1": (lambda x: F.adaptive_avg_pool2d(x, 1), 4),
    "adaptive_max_pool2d_1": (lambda x: F.adaptive_max_pool2d(x, 1, return_indices=True), 4),
    "max_pool3d": (lambda x: F.max_pool3d(x, 2, return_indices=True), 5),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 3, 2, 1), 5),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, 3, return_indices=True), 5),
    "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, 3), 5),
}


def _results(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", sorted(_POOLS))
@pytest.mark.parametrize("layout", ["channels_last", "sliced"])
def test_pooling_keeps_memory_format(name, layout):
    fn, ndim = _POOLS[name]
    shape = (2, 6, 7, 9) if ndim == 4 else (2, 6, 5, 7, 6)
    base = torch.randn(shape).contiguous(memory_format=CL if ndim == 4 else CL3)
    x, xt = base, base.to("tpu")
    assert xt.stride() == x.stride()
    if layout == "sliced":  # a channels_last tensor's channel slice (no longer dense)
        x, xt = x[:, ::2], xt[:, ::2]
    x.requires_grad_(True)
    xt.requires_grad_(True)
    want, got = _results(fn(x)), _results(fn(xt))
    for w, g in zip(want, got):
        assert g.stride() == w.stride(), name
        torch.testing.assert_close(g.cpu(), w)
    grad = torch.randn_like(want[0])
    want[0].backward(grad)
    got[0].backward(grad.to("tpu"))
    assert xt.grad.stride() == x.grad.stride(), name
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


def _cl3d_unbatched(t):
    return t.unsqueeze(0).contiguous(memory_format=CL3).squeeze(0)


@pytest.mark.parametrize("x_cl", [False, True])
@pytest.mark.parametrize("grad_cl", [False, True])
def test_unbatched_max_pool3d_layout(x_cl, grad_cl):
    # CPU lays out a (C, D, H, W) max_pool3d as a batch of one; its backward
    # follows grad_output there (the meta kernel says contiguous for both).
    x = torch.randn(6, 8, 9, 10)
    x = _cl3d_unbatched(x) if x_cl else x
    xt = x.to("tpu")
    want, got = F.max_pool3d(x, 2, return_indices=True), F.max_pool3d(xt, 2, return_indices=True)
    for w, g in zip(want, got):
        assert g.stride() == w.stride()
        torch.testing.assert_close(g.cpu(), w)
    grad = torch.randn(want[0].shape)
    grad = _cl3d_unbatched(grad) if grad_cl else grad
    aten = torch.ops.aten
    gi = aten.max_pool3d_with_indices_backward(grad, x, [2] * 3, [2] * 3, [0] * 3, [1] * 3,
                                               False, want[1])
    gt = aten.max_pool3d_with_indices_backward(grad.to("tpu"), xt, [2] * 3, [2] * 3, [0] * 3,
                                               [1] * 3, False, got[1])
    assert gt.stride() == gi.stride()
    torch.testing.assert_close(gt.cpu(), gi)


def test_pooling_contiguous_stays_contiguous():
    x = torch.randn(2, 3, 8, 8)
    out = F.max_pool2d(x.to("tpu"), 2)
    assert out.is_contiguous() and out.stride() == F.max_pool2d(x, 2).stride()


def test_channels_last_result_feeds_the_next_op():
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=CL)
    conv = nn.Conv2d(4, 3, 3)
    want = conv(F.max_pool2d(x, 2)).relu().sum(dim=(0, 2))
    got = conv.to("tpu")(F.max_pool2d(x.to("tpu"), 2)).relu().sum(dim=(0, 2))
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


# -- errors in CPU's words ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("fn,ndim", [(F.adaptive_avg_pool2d, 3), (F.adaptive_max_pool2d, 3),
                                     (F.adaptive_avg_pool3d, 4), (F.adaptive_max_pool3d, 4)])
def test_adaptive_pooling_rejects_integers(fn, ndim, dtype):
    x = torch.ones((4,) * ndim, dtype=dtype)
    _assert_same_error(fn, (x, 2), (x.to("tpu"), 2))


def test_adaptive_pooling_channels_last_integer_error():
    x = torch.ones(1, 4, 4, 4, dtype=torch.long).contiguous(memory_format=CL)
    _assert_same_error(F.adaptive_max_pool2d, (x, 2), (x.to("tpu"), 2))


@pytest.mark.parametrize("fn", [torch.embedding_bag, torch._embedding_bag,
                                torch._embedding_bag_forward_only])
def test_embedding_bag_weight_must_be_2d(fn):
    w = torch.zeros(2, 2, 2)
    idx = torch.full((2,), 2)  # out of range for 2 rows: must not leave a pending check
    off = torch.zeros(2, dtype=torch.long)
    _assert_same_error(fn, (w, idx, off), (w.to("tpu"), idx.to("tpu"), off.to("tpu")))
    assert asserts.pending() == 0


# -- embedding_bag index bounds -------------------------------------------------------

_BAG_TEXT = "Expected idx >= 0 && idx < num_embeddings but found idx to be"


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("bad", [-1, 11])
def test_embedding_bag_out_of_range_raises_at_synchronize(mode, bad):
    w = torch.randn(10, 2)
    idx = torch.tensor([[bad, 1]])
    with pytest.raises(RuntimeError, match=_BAG_TEXT):  # CPU, at the op
        F.embedding_bag(idx, w, mode=mode, padding_idx=0)
    F.embedding_bag(idx.to("tpu"), w.to("tpu"), mode=mode, padding_idx=0)
    with pytest.raises(IndexError, match=f"{_BAG_TEXT} {bad}"):
        torch.tpu.synchronize()


def test_embedding_bag_out_of_range_raises_at_the_op_when_blocking(monkeypatch):
    monkeypatch.setattr(CONTEXT, "launch_blocking", True)
    w = torch.randn(10, 2, device="tpu")
    psw = torch.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match=f"{_BAG_TEXT} 11"):
        F.embedding_bag(torch.tensor([11, 8], device="tpu"), w,
                        torch.tensor([0], device="tpu"), mode="sum", per_sample_weights=psw)


def test_embedding_out_of_range_raises_index_error():
    w = torch.randn(10, 2)
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([11]), w)
    F.embedding(torch.tensor([11], device="tpu"), w.to("tpu"))
    with pytest.raises(IndexError, match="index 11 is out of bounds"):
        torch.tpu.synchronize()


# -- cases that failed ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_bag_max_every_bag_empty(dtype):
    w = torch.randn(5, 2, dtype=dtype, requires_grad=True)
    wt = _tpu(w)
    idx, off = torch.tensor([], dtype=torch.long), torch.tensor([0, 0, 0, 0])
    want = torch.ops.aten._embedding_bag(w, idx, off, False, 2)
    got = torch.ops.aten._embedding_bag(wt, idx.to("tpu"), off.to("tpu"), False, 2)
    for g, c in zip(got, want):
        torch.testing.assert_close(g.cpu(), c)
    F.embedding_bag(idx, w, off, mode="max").sum().backward()
    F.embedding_bag(idx.to("tpu"), wt, off.to("tpu"), mode="max").sum().backward()
    torch.testing.assert_close(wt.grad.cpu(), w.grad)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_sparse_backward_with_padding_idx(mode):
    w = torch.randn(10, 3, requires_grad=True)
    wt = _tpu(w)
    idx, off = torch.tensor([1, 2, 0, 4, 0, 0]), torch.tensor([0, 2, 2, 5])
    F.embedding_bag(idx, w, off, mode=mode, sparse=True, padding_idx=0).sum().backward()
    F.embedding_bag(idx.to("tpu"), wt, off.to("tpu"), mode=mode, sparse=True,
                    padding_idx=0).sum().backward()
    # (a dense gradient on tpu: docs/troubleshooting.md)
    torch.testing.assert_close(wt.grad.cpu(), w.grad.to_dense())


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_padding_idx_is_an_input_not_a_program(mode):
    """padding_idx is a runtime input of embedding_bag's programs and of the
    backwards (registry `traced`): each new value matches CPU and compiles
    nothing (PyTorch's test_embedding_bag_1D_padding_idx walks every index of
    its input and spent minutes compiling a program per value)."""
    from torch_tpu import debug

    idx, off = torch.tensor([1, 2, 0, 4, 0, 3, 2, 1]), torch.tensor([0, 2, 2, 5])

    def both(p):
        w = torch.randn(10, 3, requires_grad=True)
        wt = _tpu(w)
        want = F.embedding_bag(idx, w, off, mode=mode, padding_idx=p)
        got = F.embedding_bag(idx.to("tpu"), wt, off.to("tpu"), mode=mode, padding_idx=p)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(wt.grad.cpu(), w.grad)
        e = nn.Embedding(10, 3, padding_idx=p)
        et = nn.Embedding(10, 3, padding_idx=p).to("tpu")
        et.load_state_dict(e.state_dict())
        e(idx).sum().backward()
        et(idx.to("tpu")).sum().backward()
        torch.testing.assert_close(et.weight.grad.cpu(), e.weight.grad)

    both(0)  # the programs exist from here on (compiled, or hits)
    with debug.Capture() as cap:
        for p in (1, 2, 3, 4):
            both(p)
    names = [ev.name for ev in cap.compiles]
    assert not [n for n in names if "embedding" in n], names


@pytest.mark.parametrize("pool,shape", [
    (lambda x: F.max_pool2d(x, 2), (0, 3, 8, 8)),
    (lambda x: F.adaptive_max_pool2d(x, 3), (0, 3, 8, 8)),
    (lambda x: F.max_pool3d(x, 2), (0, 3, 6, 6, 6)),
    (lambda x: F.adaptive_max_pool3d(x, 3), (0, 3, 6, 6, 6)),
    (lambda x: F.fractional_max_pool2d(x, 3, output_ratio=(0.5, 0.5)), (0, 3, 8, 8)),
    (lambda x: F.fractional_max_pool3d(x, 3, output_ratio=(0.5, 0.5, 0.5)), (0, 3, 8, 8, 8)),
])
def test_pooling_backward_on_an_empty_batch(pool, shape):
    x = torch.randn(shape, requires_grad=True)
    xt = _tpu(x)
    out, outt = pool(x), pool(xt)
    assert outt.shape == out.shape
    out.sum().backward()
    outt.sum().backward()
    assert xt.grad.shape == x.grad.shape


@pytest.mark.parametrize("mod,shape", [
    (lambda: nn.FractionalMaxPool2d([2, 2], output_size=[0, 1]), (4, 5, 8, 8)),
    (lambda: nn.FractionalMaxPool3d([3, 2, 2], output_size=[0, 1, 1]), (4, 8, 8, 8)),
])
def test_fractional_max_pool_to_size_zero(mod, shape):
    x = torch.rand(shape)
    want = mod()(x)
    got = mod()(x.to("tpu"))
    assert got.shape == want.shape


# -- sparse gradients -------------------------------------------------------------------


def _sparse_embedding_grad(device, backwards):
    """(is_coalesced, indices, values) of a sparse Embedding's weight gradient
    after `backwards` backward passes over the same indices."""
    torch.manual_seed(0)
    e = nn.Embedding(10, 3, sparse=True).to(device)
    t = torch.tensor([7, 1, 3], device=device)
    for _ in range(backwards):
        e(t).sum().backward()
    g = e.weight.grad
    return g.is_coalesced(), g._indices().cpu(), g._values().cpu()


@pytest.mark.parametrize("backwards", [
    1,
    pytest.param(2, marks=pytest.mark.xfail(
        strict=True, raises=NotImplementedError,
        reason="the second backward accumulates with sparse add_, which has no tpu lowering "
               "(sparse ops other than to_sparse/to_dense/coalesce/sparse_mask run through "
               "the CPU fallback: docs/porting.md, Sparse tensors)")),
])
def test_sparse_embedding_grads_accumulate_uncoalesced(backwards):
    (c_want, i_want, v_want) = _sparse_embedding_grad("cpu", backwards)
    (c_got, i_got, v_got) = _sparse_embedding_grad("tpu", backwards)
    assert c_got == c_want
    assert i_got.tolist() == i_want.tolist()  # [[7, 1, 3, 7, 1, 3]] on CPU after two
    torch.testing.assert_close(v_got, v_want)
