"""Shape and indexing lowerings against PyTorch CPU.

Every case runs once on CPU and once on tpu (with the CPU fallback disabled,
so a missing lowering fails instead of passing through the CPU) and must give
the same values, shapes and dtypes; differentiable ones also the same
gradients.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import torch_tpu  # noqa: F401
from torch_tpu.runtime import executor


@pytest.fixture(autouse=True)
def _no_cpu_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")


def tpu(x):
    # clone(): on XLA:CPU, .to("tpu") may share the host buffer (reported),
    # and the CPU run modifies some arguments in place.
    return pytree.tree_map(
        lambda t: t.clone().to("tpu") if isinstance(t, torch.Tensor) else t, x)


def compare(got, want, exact=True, **tol):
    gl, wl = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.device.type == "tpu", g
            assert g.shape == w.shape, (g.shape, w.shape)
            assert g.dtype == w.dtype, (g.dtype, w.dtype)
            if exact and not tol:
                tol = dict(rtol=0, atol=0)
            torch.testing.assert_close(g.cpu(), w, equal_nan=True, **tol)
        else:
            assert g == w


def check(fn, *args, **tol):
    targs = tpu(args)  # before fn runs: it may modify its arguments
    want = fn(*args)
    got = fn(*targs)
    compare(got, want, **tol)
    return got, want


def check_grad(fn, *args, **tol):
    """Values and gradients (of every floating input) match CPU."""
    def run(xs):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point())
              if isinstance(x, torch.Tensor) else x for x in xs]
        out = fn(*xs)
        outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        gens = torch.Generator().manual_seed(0)
        grads = [torch.randn(o.shape, generator=gens, dtype=o.dtype).to(o.device) for o in outs]
        torch.autograd.backward(outs, grads)
        return out, [x.grad for x in xs if isinstance(x, torch.Tensor) and x.is_floating_point()]

    targs = tpu(args)
    want = run(list(args))
    got = run(list(targs))
    compare(got, want, exact=False, **(tol or dict(rtol=1e-5, atol=1e-5)))


def make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64]


# -- cat / stack ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype):
    a, b = make((2, 3), dtype), make((4, 3), dtype, 1)
    check(torch.cat, [a, b])
    check(torch.cat, [a, make((2, 5), dtype)], -1)
    check(torch.cat, [a.t(), b.t()], 1)  # non-contiguous inputs
    check(torch.cat, [a, torch.empty(0, dtype=dtype), b])  # 1-d empty is skipped
    check(torch.cat, [torch.empty(0, 3, dtype=dtype), a])
    check(torch.stack, [a, a], 1)
    check(torch.stack, [a, a], -1)


def test_cat_promotes_and_grads():
    check(torch.cat, [make((2,), torch.int32), make((3,), torch.float32)])
    check(torch.cat, [torch.empty(0), torch.empty(0)])
    check_grad(lambda a, b: torch.cat([a, b], 1), make((2, 3)), make((2, 2), seed=1))
    check_grad(lambda a, b: torch.stack([a, b]), make((2, 3)), make((2, 3), seed=1))


# -- clone -----------------------------------------------------------------------------------


def test_clone_is_fresh_and_plain():
    xc = make((4, 6))
    x = xc.to("tpu")
    for view in (lambda t: t, lambda t: t[1:3], lambda t: t[:, ::2], lambda t: t.t()):
        c = view(x).clone()
        want = view(xc).clone()
        assert c.stride() == want.stride()
        assert c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.testing.assert_close(c.cpu(), want, rtol=0, atol=0)
    c = x.clone()
    c.add_(1)
    torch.testing.assert_close(x.cpu() + 1, c.cpu())
    y = make((2, 3, 4, 5)).to("tpu")
    cl = y.clone(memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cl.cpu(), y.cpu())
    assert y.t().clone(memory_format=torch.contiguous_format).is_contiguous() if y.dim() == 2 \
        else y.transpose(0, 1).clone(memory_format=torch.contiguous_format).is_contiguous()


# -- the *_copy ops ------------------------------------------------------------------------------

aten = torch.ops.aten

COPY_CASES = {
    "permute_copy": (aten.permute_copy, (2, 0, 1)),
    "expand_copy": (aten.expand_copy, (2, 3, 4, 5)),
    "view_copy": (aten.view_copy, (12, 5)),
    "view_copy_dtype": (lambda x: aten.view_copy.dtype(x, torch.int32), ),
    "transpose_copy": (aten.transpose_copy, 0, -1),
    "slice_copy": (aten.slice_copy.Tensor, 1, 1, 3),
    "slice_copy_step": (aten.slice_copy.Tensor, 2, -4, None, 2),
    "select_copy": (aten.select_copy.int, 1, -1),
    "diagonal_copy": (aten.diagonal_copy, 1, 1, 2),
    "t_copy": (lambda x: aten.t_copy(x[0]), ),
    "unsqueeze_copy": (aten.unsqueeze_copy, -1),
    "squeeze_copy": (lambda x: aten.squeeze_copy.dim(x[:, :1], 1), ),
    "squeeze_copy_all": (lambda x: aten.squeeze_copy(x[:1, :1]), ),
    "squeeze_copy_dims": (lambda x: aten.squeeze_copy.dims(x[:1, :1], [0, 1]), ),
    "alias_copy": (aten.alias_copy, ),
    "detach_copy": (aten.detach_copy, ),
    "unfold_copy": (aten.unfold_copy, 2, 2, 1),
    "as_strided_copy": (aten.as_strided_copy, (3, 3), (4, 1), 2),
    "narrow_copy": (aten.narrow_copy, 2, -3, 2),
    "split_with_sizes_copy": (aten.split_with_sizes_copy, [1, 2, 2], -1),
    "split_copy": (aten.split_copy.Tensor, 2, 1),
    "unbind_copy": (aten.unbind_copy.int, 1),
    "lift_fresh_copy": (aten.lift_fresh_copy, ),
}


@pytest.mark.parametrize("name", sorted(COPY_CASES))
def test_copy_ops(name):
    op, *args = COPY_CASES[name]
    x = make((3, 4, 5))
    check(lambda t: op(t, *args), x)
    check(lambda t: op(t, *args), x.to(torch.int64))


def test_view_as_real_complex_copy():
    z = make((3, 2), torch.complex64)
    check(aten.view_as_real_copy, z)
    check(aten.view_as_complex_copy, make((3, 2)))


# -- flips, rolls, repeats, triangles, diagonals -------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_reorder_ops(dtype):
    x = make((3, 4, 5), dtype)
    check(torch.flip, x, (0, -1))
    check(torch.flip, x.transpose(0, 2), (1,))
    check(torch.roll, x, 2)
    check(torch.roll, x, (1, -2), (0, 2))
    check(lambda t: t.repeat(2, 1, 1, 3), x)
    check(torch.tile, x, (2,))
    check(torch.rot90, x, 1, (1, 2))
    check(torch.rot90, x, -3, (0, 2))
    check(torch.tril, x, 1)
    check(torch.triu, x.transpose(1, 2), -1)
    check(torch.diag_embed, x, 1, 0, 2)
    check(torch.diag_embed, x[0], -1)
    check(torch.diag, x[0, 0])
    check(torch.diag, x[0], 1)
    check(lambda t: t.unfold(1, 2, 2), x)
    check(torch.block_diag, x[0, :2, :2], x[1, 0], x[2, 0, 0])


def test_scatter_views_ops():
    x, src = make((4, 5, 6)), make((4, 6), seed=1)
    check(torch.select_scatter, x, src, 1, -2)
    check(torch.slice_scatter, x, make((4, 2, 6)), 1, 1, 5, 2)
    check(torch.slice_scatter, x, make((4, 5, 6)), 0)
    check(torch.diagonal_scatter, x, make((6, 4), seed=2), 1, 0, 1)
    check(torch.diagonal_scatter, x, make((4, 5), seed=2), 0, -1, 1)
    check(torch.as_strided_scatter, make((4, 5)), make((2, 2)), (2, 2), (5, 1), 3)
    check_grad(lambda a, b: torch.select_scatter(a, b, 0, 1), make((3, 4)), make((4,)))
    check_grad(lambda a, b: torch.slice_scatter(a, b, 1, 0, 4, 2), make((3, 4)), make((3, 2)))


def test_view_backward_ops():
    check_grad(lambda x: x[1:3, ::2] * 2, make((4, 6)))
    check_grad(lambda x: x[2], make((4, 6)))
    check_grad(lambda x: x.diagonal(1), make((4, 6)))
    check_grad(lambda x: x.unfold(1, 3, 2), make((4, 7)))
    check_grad(lambda x: x.narrow(0, 1, 2).t(), make((4, 6)))


def test_repeat_interleave():
    r = torch.tensor([1, 0, 3, 2])
    check(torch.repeat_interleave, r)
    check(lambda x, r: torch.repeat_interleave(x, r, 0), make((4, 2)), r)
    check(lambda x: torch.repeat_interleave(x, 2, 1), make((4, 2)))
    check(lambda x, r: torch.repeat_interleave(x, r, dim=1), make((4, 2)), torch.tensor([2, 1]))


def test_im2col_col2im():
    x = make((2, 3, 7, 8))
    check(lambda t: F.unfold(t, (3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1)), x)
    check(F.unfold, x[0], 2)
    cols = make((2, 3 * 2 * 2, 12))
    check(lambda t: F.fold(t, (5, 6), (2, 2), padding=1, stride=(2, 2)), cols, exact=False,
          atol=1e-6, rtol=1e-6)
    check_grad(lambda t: F.unfold(t, 3, padding=1), make((1, 2, 4, 5)))


# -- views alias their base ----------------------------------------------------------------------


def test_views_alias_and_setitem():
    def program(x):
        v = x.t()[1:3]
        v.mul_(2)
        x[..., None][0, 1, 0] = -5
        x[1:3, ::2] += 1
        y = x.view(-1)
        y[3] = 7
        x.diagonal().zero_()
        return x, v, x[..., None], x[None, :, None].shape

    check(program, make((4, 6)))


def test_setitem_forms():
    def program(x, idx, mask):
        x = x.clone()
        x[idx] = 3.0
        x[mask] = -1.0
        x[:, idx[:2]] = torch.arange(8.0).reshape(4, 2).to(x.device)
        x[idx[0], 2:4] += 10
        x[x > 5] = torch.zeros((), device=x.device)
        x[mask[:, 0]] = x[0].clone()  # same row into every selected row
        return x

    x = make((4, 6))
    check(program, x, torch.tensor([2, 0, -1]), make((4, 6), torch.bool))


# -- advanced indexing --------------------------------------------------------------------------


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", DTYPES)
def test_index(dtype, idx_dtype):
    x = make((5, 6, 7), dtype)
    i = torch.tensor([[0, -1], [4, 2]], dtype=idx_dtype)
    j = torch.tensor([1, 4], dtype=idx_dtype)
    check(lambda t, i: t[i], x, i)
    check(lambda t, i, j: t[i, j], x, i, j)  # broadcast index tensors
    check(lambda t, i, j: t[:, i, j], x, i, j)
    check(lambda t, i, j: t[i, :, j], x, i, j)  # separated: broadcast dims go first
    check(lambda t, j: t[..., j], x, j)
    check(lambda t, j: t[None, j, 1:3], x, j)
    check(lambda t, j: t.t()[j] if t.dim() == 2 else t.transpose(0, 2)[j], x, j)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_bool_masks(dtype):
    x = make((4, 5, 3), dtype)
    m2 = make((4, 5), torch.bool, 3)
    m1 = make((5,), torch.bool, 4)
    check(lambda t, m: t[m], x, m2)
    check(lambda t, m: t[:, m], x, m1)
    check(lambda t, m: t[m, 1:], x, make((4,), torch.bool, 5))
    check(lambda t, m: t[m, torch.tensor([0, 2, 1]).to(t.device)[: int(m.sum())]],
          x, torch.tensor([True, False, True, True]))
    check(lambda t: t[torch.zeros(4, 5, dtype=torch.bool, device=t.device)], x)
    check(lambda t: t[torch.ones(4, dtype=torch.uint8, device=t.device).bool()], x)


def test_index_put():
    x = make((5, 6))
    i = torch.tensor([0, 3, -1, 3])
    v = make((4, 6), seed=1)
    check(lambda t, i, v: t.index_put((i,), v, accumulate=True), x, i, v)
    check(lambda t, i, v: t.index_put((i[:3],), v[:3]), x, i, v)
    check(lambda t, i: t.index_put((i, i), torch.tensor(2.0).to(t.device), True), x, i)
    check(lambda t, i: torch.ops.aten._index_put_impl_(t.clone(), (None, i), make((5, 4)).to(
        t.device), True), x, i)
    check(lambda t, m: t.index_put((m,), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).to(
        t.device), accumulate=True), x, make((5,), torch.bool, 2))
    check(lambda t, m: t.index_put((m,), torch.tensor(7.0).to(t.device)), x, make((5, 6), torch.bool))
    check(lambda t, m: t.index_put_((m,), torch.tensor([9.0]).to(t.device), True), x.clone(),
          make((5, 6), torch.bool, 1))
    xb = make((5, 6), torch.bool)
    check(lambda t, i: t.index_put((i,), torch.tensor(True).to(t.device), accumulate=True), xb, i)


def test_mask_assignment_does_not_sync():
    x = make((4, 6)).to("tpu")
    m = (x > 0)
    torch_tpu.debug.metrics.reset() if hasattr(torch_tpu.debug, "metrics") else None
    before = executor.STATS.per_op.get("aten.nonzero.default", 0)
    x[m] = 0.0
    x[m] += 0.5
    y = x.clone()
    y[m[:, 0]] = torch.arange(6.0).to("tpu")
    assert executor.STATS.per_op.get("aten.nonzero.default", 0) == before


def test_int_index_is_one_cached_executable():
    x = make((64, 8)).to("tpu")
    idx = torch.tensor([1, 2, 3]).to("tpu")
    x[idx] = x[idx] + 1
    misses = executor.STATS.misses
    for k in range(5):
        idx = torch.tensor([k, k + 1, 60]).to("tpu")
        y = x[idx]
        x[idx] = y + 1
    assert executor.STATS.misses == misses


def test_index_out_of_range():
    x = make((4, 5))
    # Host-known (CPU) index tensors are checked like on CPU.
    with pytest.raises(IndexError, match="out of bounds"):
        x.to("tpu")[torch.tensor([0, 4])]
    with pytest.raises(IndexError, match="out of bounds"):
        x.to("tpu")[torch.tensor([-5])]
    # CPU index tensors are allowed (copied to the device) when in range.
    torch.testing.assert_close(x.to("tpu")[torch.tensor([3, -4])].cpu(), x[[3, -4]])
    with pytest.raises(IndexError):
        x.to("tpu")[torch.ones(3, dtype=torch.bool)]
    # Device index tensors: a device-side check raises at the next read.
    t = x.to("tpu")
    bad = torch.tensor([1, 7, -9]).to("tpu")
    with pytest.raises(IndexError, match=r"aten::index: index 7 is out of bounds for "
                                         r"dimension 0 with size 4"):
        t[bad].cpu()
    with pytest.raises(RuntimeError, match="aten::gather: index 5 is out of bounds"):
        t.gather(1, torch.tensor([[0, 5]]).to("tpu")).sum().item()
    with pytest.raises(IndexError, match="index -9 is out of bounds"):
        t2 = t.clone()
        t2[torch.tensor([-9]).to("tpu")] = 1.0
        torch.tpu.synchronize()
    torch.testing.assert_close(t.cpu(), x)  # nothing pending is raised twice


def test_index_out_of_range_unchecked(monkeypatch):
    """TORCH_TPU_INDEX_CHECKS=0: deterministic fill on reads, dropped writes."""
    from torch_tpu.ops import bounds

    monkeypatch.setattr(bounds, "ENABLED", False)
    x = make((4, 5))
    t = x.to("tpu")
    bad = torch.tensor([1, 7, -9]).to("tpu")
    got = t[bad].cpu()
    torch.testing.assert_close(got[0], x[1])
    assert torch.isnan(got[1:]).all()
    assert (t.to(torch.int64)[bad].cpu()[1:] == torch.iinfo(torch.int64).min).all()
    t2 = t.clone()
    t2[bad] = 100.0
    want = x.clone()
    want[1] = 100.0
    torch.testing.assert_close(t2.cpu(), want)
    g = t.gather(1, torch.tensor([[0, 5], [-1, 2], [1, 1], [4, 4]]).to("tpu")).cpu()
    assert torch.isnan(g[0, 1]) and torch.isnan(g[1, 0]) and g[1, 1] == x[1, 2]
    s = t.scatter(1, torch.tensor([[9], [-1], [0], [4]]).to("tpu"), -1.0).cpu()
    want = x.clone()
    want[2, 0] = want[3, 4] = -1.0
    torch.testing.assert_close(s, want)


def test_index_grads():
    i = torch.tensor([0, 2, 2, -1])
    check_grad(lambda x: x[i.to(x.device)], make((4, 3)))
    check_grad(lambda x: x[:, i.to(x.device)[:2]], make((4, 3)))
    check_grad(lambda x: x[x > 0], make((4, 3)))
    check_grad(lambda x, v: x.index_put((i.to(x.device),), v, accumulate=True),
               make((4, 3)), make((4, 3), seed=1))
    check_grad(lambda x, v: x.index_put((i.to(x.device)[:2],), v), make((4, 3)), make((2, 3)))


# -- dim-wise index ops ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_index_dim_ops(dtype):
    x = make((4, 5), dtype)
    i = torch.tensor([3, 0, 3])
    src = make((4, 3), dtype, 1)
    check(torch.index_select, x, 1, i)
    check(torch.index_select, x, -2, i.to(torch.int32))
    check(torch.index_select, x.t(), 0, i)
    check(torch.index_select, make((), dtype), 0, torch.tensor([0]))
    tol = dict(exact=False, rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    if dtype != torch.bool:
        check(lambda t, i, s: t.index_add(1, i, s), x, i, src, **tol)
        check(lambda t, i, s: t.index_add(1, i, s, alpha=2), x, i, src, **tol)
    check(lambda t, i, s: t.index_copy(1, i, s), x, torch.tensor([4, 0, 2]), src)
    check(lambda t, i: t.index_fill(1, i, True if dtype == torch.bool else 3), x,
          torch.tensor([1, -1]))
    check(lambda t, i: t.index_fill(0, i, torch.tensor(1, dtype=dtype)), x, torch.tensor([2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_gather_scatter(dtype):
    x = make((4, 5), dtype)
    idx = torch.tensor([[0, 1, 1], [3, 2, 0]])
    src = make((2, 4), dtype, 1)
    check(torch.gather, x, 0, idx)
    check(torch.gather, x, -1, idx)
    check(torch.gather, x.t(), 1, idx)
    check(torch.gather, make((), dtype), 0, torch.tensor(0))
    check(torch.gather, x, 1, torch.empty(0, 3, dtype=torch.long))
    uniq = torch.tensor([[0, 1, 2], [3, 2, 0]])  # no duplicates along dim 0 per column
    check(lambda t, i, s: t.scatter(0, i, s), x, uniq, src)
    check(lambda t, i: t.scatter(1, i, 7), x, idx)
    check(lambda t, i, s: t.scatter_add(0, i, s), x, idx, src)
    check(lambda t, i, s: t.scatter(0, i, s, reduce="add"), x, idx, src)
    check(lambda t, i, s: t.scatter(0, i, s, reduce="multiply"), x, idx, src)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
                  x, idx, src, exact=False, rtol=1e-6, atol=1e-6)
            if reduce != "sum":
                check(lambda t, i, s: t.index_reduce(0, i, s, reduce, include_self=include_self),
                      x, torch.tensor([1, 1, 3, 0]), make((4, 5), dtype, 2), exact=False,
                      rtol=1e-6, atol=1e-6)


def test_scatter_reduce_nan_and_grads():
    x = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    idx = torch.tensor([0, 0, 1])
    src = torch.tensor([float("nan"), 3.0, -7.0])
    for reduce in ("amax", "amin"):
        check(lambda t, i, s: t.scatter_reduce(0, i, s, reduce), x, idx, src)
    check_grad(lambda x: x.gather(1, torch.tensor([[0, 0], [1, 0]]).to(x.device)), make((2, 3)))
    check_grad(lambda x, s: x.scatter(1, torch.tensor([[2], [0]]).to(x.device), s),
               make((2, 3)), make((2, 1)))
    check_grad(lambda x, s: x.scatter_add(1, torch.tensor([[2, 2], [0, 1]]).to(x.device), s),
               make((2, 3)), make((2, 2)))
    check_grad(lambda x, s: x.index_add(0, torch.tensor([1, 1]).to(x.device), s),
               make((2, 3)), make((2, 3)))
    check_grad(lambda x: torch.take_along_dim(x, torch.tensor([[1], [0]]).to(x.device), 1),
               make((2, 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_masks_take_put(dtype):
    x = make((3, 4), dtype)
    m = make((3, 4), torch.bool, 7)
    check(lambda t, m: t.masked_fill(m, True if dtype == torch.bool else 2), x, m)
    check(lambda t, m: t.masked_fill(m, torch.tensor(0, dtype=dtype)), x, m)
    check(lambda t, m: t.masked_fill(m[0], torch.tensor(1, dtype=dtype).to(t.device)), x, m)
    check(lambda t, m, s: t.masked_scatter(m, s), x, m, make((12,), dtype, 8))
    check(lambda t, m, s: t.masked_scatter(m[1], s), x, m, make((3, 4), dtype, 8))
    idx = torch.tensor([[0, -1], [5, 11]])
    check(torch.take, x, idx)
    check(torch.take, x.t(), idx)
    check(lambda t, i, s: t.put(i, s), x, torch.tensor([1, -2, 4]), make((3,), dtype, 9))
    if dtype != torch.bool:
        check(lambda t, i, s: t.put(i, s, accumulate=True), x, torch.tensor([1, 1, 4]),
              make((3,), dtype, 9))
    check(torch.take_along_dim, x, torch.tensor([[0], [3], [1]]), 1)


def test_masked_grads():
    m = make((3, 4), torch.bool, 7)
    check_grad(lambda x: x.masked_fill(m.to(x.device), 0.0), make((3, 4)))
    check_grad(lambda x, s: x.masked_scatter(m.to(x.device), s), make((3, 4)), make((12,)))


def test_empty_indexing():
    x = make((0, 3))
    check(lambda t: t[torch.tensor([], dtype=torch.long).to(t.device)], x)
    check(lambda t: t.index_select(1, torch.tensor([2, 0]).to(t.device)), x)
    check(lambda t: t.gather(0, torch.empty(0, 3, dtype=torch.long).to(t.device)), x)
    y = make((3, 4))
    check(lambda t: t[torch.tensor([], dtype=torch.long).to(t.device)], y)
    check(lambda t: t.index_put((torch.tensor([], dtype=torch.long).to(t.device),),
                                torch.tensor(1.0).to(t.device)), y)


# -- factories --------------------------------------------------------------------------------


def _factory(fn, exact=True, **tol):
    want = fn("cpu")
    got = fn("tpu")
    compare(got, want, exact=exact, **tol)


@pytest.mark.parametrize("args", [(10,), (2, 11), (0, 1, 0.1), (-3.5, 4, 1.25), (5, -3, -2),
                                  (0, 0), (1.0, 1e3, 3.7)])
def test_arange(args):
    # CPU's vectorized kernel rounds twice for float32: allow 1 ulp.
    _factory(lambda d: torch.arange(*args, device=d), exact=False, rtol=1e-6, atol=0)
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.float64):
        if dtype.is_floating_point or all(float(a).is_integer() for a in args):
            r = 1e-2 if dtype == torch.bfloat16 else 1e-6  # CPU: bf16 arithmetic, 1 ulp
            _factory(lambda d: torch.arange(*args, device=d, dtype=dtype), exact=False,
                     rtol=r, atol=1e-6)


def test_arange_out_and_cache():
    out = torch.empty(3, device="tpu")
    r = torch.arange(2, 8, out=out)
    assert r is out and out.shape == (6,)
    torch.testing.assert_close(out.cpu(), torch.arange(2.0, 8.0))
    torch.arange(0, 5, device="tpu")
    misses = executor.STATS.misses
    for start in range(1, 4):  # same length, new start: no compile
        torch.testing.assert_close(torch.arange(start, start + 5, device="tpu").cpu(),
                                   torch.arange(start, start + 5))
    assert executor.STATS.misses == misses
    with pytest.raises(RuntimeError):
        torch.arange(0, 5, -1, device="tpu")


def test_linspace_logspace_eye_full():
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.complex64):
        for s, e, n in ((0, 1, 5), (-3, 10, 7), (0.5, 10, 1), (2, 2, 4), (0, 1, 0)):
            _factory(lambda d: torch.linspace(s, e, n, device=d, dtype=dtype), exact=False,
                     rtol=1e-6, atol=1e-6)
    _factory(lambda d: torch.linspace(torch.tensor(1.0, device=d), 4, 6, device=d))
    _factory(lambda d: torch.logspace(0, 3, 4, device=d), exact=False, rtol=1e-6, atol=1e-6)
    _factory(lambda d: torch.logspace(1, 5, 5, base=2, device=d, dtype=torch.int64))
    _factory(lambda d: torch.eye(3, device=d))
    _factory(lambda d: torch.eye(2, 4, device=d, dtype=torch.bool))
    _factory(lambda d: torch.full((2, 3), 7, device=d))
    _factory(lambda d: torch.full((2,), True, device=d))
    _factory(lambda d: torch.full((2, 2), 1.5 + 2j, device=d))
    _factory(lambda d: torch.full((3,), 2.7, device=d, dtype=torch.int32))
    _factory(lambda d: torch.zeros(2, 0, device=d))
    _factory(lambda d: torch.ones(3, device=d, dtype=torch.int8))
    _factory(lambda d: torch.scalar_tensor(3.5, device=d))
    _factory(lambda d: torch.tril_indices(4, 3, device=d))
    _factory(lambda d: torch.tril_indices(3, 5, -1, device=d))
    _factory(lambda d: torch.triu_indices(4, 4, 1, device=d, dtype=torch.int32))
    _factory(lambda d: torch.triu_indices(0, 3, device=d))


def test_like_factories_keep_layout():
    base = make((3, 4, 5))
    for fn in (torch.zeros_like, torch.ones_like, torch.empty_like,
               lambda t: torch.full_like(t, 2.5), lambda t: torch.rand_like(t)):
        for view in (lambda t: t, lambda t: t.transpose(0, 2)):
            want = fn(view(base))
            got = fn(view(base.to("tpu")))
            assert got.shape == want.shape and got.stride() == want.stride()
            assert got.dtype == want.dtype and got.device.type == "tpu"
    torch.testing.assert_close(torch.full_like(base.to("tpu"), 2.5).cpu(), torch.full_like(base, 2.5))


# -- index canonicalization, checks and warnings (issue 22) ----------------------


def _raises_like_cpu(fn, *args):
    """fn(cpu args) and fn(tpu args) raise the same exception type and text
    (the tpu text may name the op after CPU's)."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    with pytest.raises(type(cpu.value)) as dev:
        fn(*tpu(args))
    assert str(dev.value).startswith(str(cpu.value).split("\n")[0][:60]), (cpu.value, dev.value)


def test_uint8_mask_warns_once_per_indexing_as_cpu():
    import warnings

    x = torch.arange(12.0).reshape(4, 3)
    m8 = torch.tensor([0, 1, 1, 0], dtype=torch.uint8)
    for dev in ("cpu", "tpu"):
        xd, md = x.to(dev), m8.to(dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = xd[md]
            xd[md] = torch.zeros(3, device=dev)
            xd[md.bool()]  # bool masks are not deprecated
        msgs = [str(i.message) for i in w if "uint8" in str(i.message)]
        assert len(msgs) == 2, (dev, msgs)
        assert all(m.startswith("indexing with dtype torch.uint8 is now deprecated, please use "
                                "a dtype torch.bool instead.") for m in msgs), msgs
        assert all(i.filename == __file__ for i in w), [i.filename for i in w]
        assert got.shape == (2, 3)


def test_masks_and_index_lists_broadcast_together():
    x = make((2, 3, 4, 5))
    mask = torch.tensor([True, False, True])
    cases = [
        lambda t: t[:, mask, [1, 3]],
        lambda t: t[[0, 1], mask],
        lambda t: t[True, [0, 1], True, True, [1], [[2]]],
        lambda t: t[torch.tensor([[0], [1]]), :, torch.tensor([1, 2, 3])],
        lambda t: t[..., torch.tensor([[True, False, True, False, True]] * 4)],
    ]
    for case in cases:
        compare(case(x.to("tpu")), case(x))


def test_empty_and_zero_size_indices():
    x = make((5,))
    compare(x.to("tpu")[[]], x[[]])
    compare(x.to("tpu")[torch.empty(0, 3, dtype=torch.long)], x[torch.empty(0, 3, dtype=torch.long)])
    y = make((3, 0))
    compare(y.to("tpu")[[2, 0]], y[[2, 0]])
    compare(y.to("tpu")[[], []], y[[], []])
    _raises_like_cpu(lambda t: t[:, [1]], y)
    # an empty index into a size-0 dimension selects nothing and is fine
    compare(y.to("tpu")[:, torch.tensor([], dtype=torch.long)], y[:, torch.tensor([], dtype=torch.long)])


def test_index_errors_are_cpus():
    x = make((4, 5))
    _raises_like_cpu(lambda t: t[[0, 1], [0, 1, 2]], x)
    _raises_like_cpu(lambda t: t.__setitem__(([0, 1], [0, 1, 2]), 1.0), x)
    _raises_like_cpu(lambda t, i: t[i], x, torch.tensor([0.0, 1.0]))
    # issue 18: float indices in index_put_ are PyTorch's IndexError, not JAX's TypeError
    _raises_like_cpu(lambda t, i, v: t.index_put_((i,), v), x[0].clone(), torch.tensor([1.0]),
                     torch.tensor([2.0]))


def test_index_put_value_checks_are_cpus():
    x = make((4,)).abs() + 1
    _raises_like_cpu(lambda t, v: t.__setitem__(t > 0, v), x, torch.tensor([1.0, 2.0, 3.0]))
    _raises_like_cpu(lambda t, v: t.__setitem__(t > 0, v), x, torch.tensor([]))
    _raises_like_cpu(lambda t, v: t.index_put([], v, True), torch.tensor(2.0), torch.tensor([1.0]))
    _raises_like_cpu(lambda t, v: t.__setitem__((slice(None), [1]), v),
                     make((3, 2), torch.float64), torch.zeros(3, 1, dtype=torch.int32))
    # CPU writes a one-element host value through a single mask with masked_fill_:
    # no dtype check there.
    for dev in ("cpu", "tpu"):
        t = torch.zeros(4, device=dev)
        t[t == 0] = torch.tensor(3)
        assert t.cpu().tolist() == [3.0] * 4


def test_setitem_shapes_as_cpu():
    x = make((3, 4))
    for idx, val in [((torch.tensor([True, False, True]),), torch.ones(4)),
                     ((torch.tensor([True, False, True]),), torch.ones(1, 2, 4)[:, :1]),
                     (([[0], [2]], [1, 3]), torch.arange(2.0)),
                     ((slice(None), torch.tensor([[0, 1]])), torch.ones(3, 1, 2))]:
        want = x.clone()
        want[idx] = val
        got = x.to("tpu")
        got[idx] = val.to("tpu")
        compare(got, want)
    for dev in ("cpu", "tpu"):  # a value with leading non-1 dims cannot be written
        t = make((2, 3)).to(dev)
        with pytest.raises(RuntimeError, match="number of sizes provided"):
            t[True] = t.expand(5, 1, 2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_index_fill_value_checks_are_cpus(dtype):
    """index_fill checks its value on the host as CPU does: a complex value
    into a real tensor and a number the dtype cannot hold raise CPU's
    RuntimeError (the fill used to write a converted value); values that fit
    fill as CPU fills."""
    x = make((3, 4)).to(dtype)
    idx = torch.tensor([2, 0])
    _raises_like_cpu(lambda t, i: t.index_fill_(1, i, 2 - 3j), x.clone(), idx)
    _raises_like_cpu(lambda t, i: t.index_fill(0, i, torch.tensor(0.5j)), x.clone(), idx)
    if dtype != torch.float32:  # 1e39 overflows every dtype but float32's neighbours
        _raises_like_cpu(lambda t, i: t.index_fill_(1, i, 1e39), x.clone(), idx)
    if not dtype.is_floating_point:
        _raises_like_cpu(lambda t, i: t.index_fill_(1, i, float("nan")), x.clone(), idx)
    compare(x.to("tpu").index_fill(1, idx.to("tpu"), 7), x.index_fill(1, idx, 7))
    compare(x.to("tpu").index_fill_(0, idx.to("tpu"), torch.tensor(5)),
            x.clone().index_fill_(0, idx, torch.tensor(5)))
    c = make((2, 3)).to(torch.complex64)
    compare(c.to("tpu").index_fill(1, torch.tensor([1], device="tpu"), 2 - 3j),
            c.index_fill(1, torch.tensor([1]), 2 - 3j))


@pytest.mark.parametrize("dtype", [torch.float16, torch.int8, torch.uint8, torch.int64])
def test_fill_value_must_fit_masked_fill_and_scatter(dtype):
    """masked_fill and scatter with a number value convert it to the tensor's
    dtype with CPU's checked conversion: a value the dtype cannot hold (or a
    complex one into a real tensor, or NaN into an integer tensor) raises
    CPU's RuntimeError instead of writing a wrapped or saturated value; a
    negative value that wraps into an unsigned type, as c10 allows, fills."""
    x = make((2, 5)).mul(3).to(dtype)
    mask = torch.tensor([[True, False, True, False, False]] * 2)
    idx = torch.tensor([[4, 0], [1, 3]])
    too_big = {torch.float16: 7e4, torch.int8: 200, torch.uint8: 256,
               torch.int64: 2.0 ** 64}[dtype]
    fills = [
        lambda t, m, i, v: t.masked_fill(m, v),
        lambda t, m, i, v: t.masked_fill_(m, v),
        lambda t, m, i, v: t.masked_fill(m, torch.tensor(v)),  # a CPU 0-dim value
        lambda t, m, i, v: t.scatter(1, i, v),
        lambda t, m, i, v: t.scatter_(1, i, v),
        lambda t, m, i, v: t.scatter(1, i, v, reduce="add"),
        lambda t, m, i, v: torch.scatter(t, 1, i, v, out=torch.empty_like(t)),
    ]
    for fill in fills:
        for bad in (too_big, -too_big, 1 + 2j) + ((float("nan"),) if not dtype.is_floating_point
                                                    else ()):
            if isinstance(bad, complex) and fill is fills[2]:
                continue  # a complex 0-dim tensor: masked_fill's promotion check comes first
            _raises_like_cpu(lambda t, m, i: fill(t, m, i, bad), x.clone(), mask, idx)
        for good in (-1, 5):
            want = fill(x.clone(), mask, idx, good)
            compare(fill(x.to("tpu"), mask.to("tpu"), idx.to("tpu"), good), want)
