"""Sparse COO tensors on tpu (torch_tpu/ops/sparse.py) against the CPU.

Construction, indices/values, the native kernels (to_sparse, to_dense,
coalesce, sparse_mask), moving between devices and dtypes, autograd through
to_sparse, ops that run through the CPU fallback, the compressed layouts
(structure on tpu, computation on the CPU) and the error for a result layout
tpu does not have.
"""

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.debug import metrics

T = torch.device("tpu", 0)


def _coo(dtype=torch.float32, dense=()):
    # Uncoalesced on purpose: (1, 0) appears twice, and the order is not sorted.
    i = torch.tensor([[1, 0, 1, 2], [0, 2, 0, 1]])
    v = (torch.arange(4 * max(1, torch.Size(dense).numel())).reshape((4,) + dense) + 1).to(dtype)
    return torch.sparse_coo_tensor(i, v, (3, 3) + dense, check_invariants=True)


def _same(actual, expected):
    assert actual.device.type == "tpu"
    assert actual.layout == expected.layout
    a = actual.cpu()
    if expected.layout == torch.sparse_coo:
        assert a.sparse_dim() == expected.sparse_dim()
        assert a.dense_dim() == expected.dense_dim()
        assert a.is_coalesced() == expected.is_coalesced()
        torch.testing.assert_close(a._indices(), expected._indices(), rtol=0, atol=0)
        torch.testing.assert_close(a._values(), expected._values(), rtol=0, atol=0)
    torch.testing.assert_close(a, expected, rtol=0, atol=0)


@pytest.fixture
def native_only(monkeypatch):
    """The CPU fallback off: what runs must be a tpu kernel."""
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")


def test_construct_on_device(native_only):
    c = _coo()
    s = torch.sparse_coo_tensor(c._indices().to(T), c._values().to(T), (3, 3))
    assert s.is_sparse and s.device == T
    assert s._indices().device == T and s._values().device == T
    assert s._nnz() == 4 and s.sparse_dim() == 2 and s.dense_dim() == 0
    assert not s.is_coalesced()
    _same(s, c)
    # Size inferred from the indices, as on CPU.
    _same(torch.sparse_coo_tensor(c._indices().to(T), c._values().to(T)),
          torch.sparse_coo_tensor(c._indices(), c._values()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("dense", [(), (2,)])
def test_to_dense_and_coalesce(native_only, dtype, dense):
    c = _coo(dtype, dense)
    s = c.to(T)
    _same(s, c)
    _same(s.to_dense(), c.to_dense())
    co = s.coalesce()
    assert co.is_coalesced()
    _same(co, c.coalesce())
    _same(co.indices(), c.coalesce().indices())
    _same(co.values(), c.coalesce().values())
    with pytest.raises(RuntimeError, match="uncoalesced"):
        s.indices()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_to_sparse(native_only, dtype):
    x = torch.arange(12).reshape(3, 4).to(dtype)
    x[1] = 0
    x[0, 2] = 0
    for args in [(), (1,), (2,)]:
        _same(x.to(T).to_sparse(*args), x.to_sparse(*args))
    _same(x.to(T).to_sparse(dense_dim=1), x.to_sparse(dense_dim=1))
    for v in (torch.tensor(0, dtype=dtype), torch.tensor(3, dtype=dtype)):
        _same(v.to(T).to_sparse(), v.to_sparse())
    _same(torch.zeros(2, 3, dtype=dtype).to(T).to_sparse(1), torch.zeros(2, 3, dtype=dtype).to_sparse(1))
    with pytest.raises(RuntimeError, match="sparse_dim"):
        x.to(T).to_sparse(3)
    with pytest.raises(RuntimeError, match="blocksize"):
        x.to(T).to_sparse(blocksize=(1, 1))


def test_to_sparse_grad(native_only):
    x = torch.randn(4, 5)
    x[2] = 0
    cot = torch.randn(4, 5)
    xc = x.clone().requires_grad_()
    (gc,) = torch.autograd.grad(xc.to_sparse().to_dense(), xc, cot)
    xt = x.to(T).requires_grad_()
    out = xt.to_sparse()
    assert out.requires_grad and out.device == T
    (gt,) = torch.autograd.grad(out.to_dense(), xt, cot.to(T))
    _same(gt, gc)


def test_sparse_mask(native_only):
    c = _coo(dense=(2,))
    d = torch.randn(3, 3, 2)
    _same(d.to(T).sparse_mask(c.to(T)), d.sparse_mask(c))
    _same(d.to(T).sparse_mask(c.coalesce().to(T)), d.sparse_mask(c.coalesce()))


def test_move_and_convert(native_only):
    c = _coo(dense=(2,))
    s = c.to(T)
    _same(s.clone(), c.clone())
    _same(s.to(torch.bfloat16), c.to(torch.bfloat16))
    _same(s.detach(), c)
    back = s.cpu()
    assert back.device.type == "cpu" and back.is_sparse
    assert "device='tpu:0'" in repr(s) and "nnz=4" in repr(s)
    assert torch.empty((2, 3), layout=torch.sparse_coo, device=T).device == T
    _same(torch.zeros((2, 3), layout=torch.sparse_coo, device=T),
          torch.zeros((2, 3), layout=torch.sparse_coo))
    _same(torch.empty_like(s), torch.empty_like(c))
    _same(s.clone().zero_(), c.clone().zero_())


def test_fallback_ops_carry_sparse(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    c = _coo(dense=(2,))
    s = c.to(T)
    before = dict(metrics.FALLBACKS)
    _same(torch.sparse.sum(s), torch.sparse.sum(c))
    _same(torch.sparse.sum(s, dim=0), torch.sparse.sum(c, dim=0))
    _same(s * 2, c * 2)                    # sparse result
    _same(s.abs(), c.abs())
    d = torch.randn(3, 3, 2)
    _same(d.to(T) + s, d + c)              # dense result
    inplace = s.clone()
    inplace.add_(s)                        # a mutated sparse argument
    _same(inplace, c + c)
    ran = {k for k, v in metrics.FALLBACKS.items() if v != before.get(k, 0)}
    assert "aten.mul.Tensor" in ran and "aten.add_.Tensor" in ran
    with pytest.raises(RuntimeError, match="same device"):
        s + c


def test_fallback_off_names_op(native_only):
    s = _coo().to(T)
    with pytest.raises(NotImplementedError, match="aten.abs"):
        s.abs()


@pytest.mark.parametrize("layout,blocksize", [
    (torch.sparse_csr, None), (torch.sparse_csc, None),
    (torch.sparse_bsr, (2, 2)), (torch.sparse_bsc, (2, 2))])
def test_compressed_layouts_structure_and_fallback(monkeypatch, layout, blocksize):
    """CSR/CSC/BSR/BSC: structure on tpu, every computation on the CPU."""
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    x = torch.randn(4, 6)
    x[1] = 0
    c = x.to_sparse(layout=layout, blocksize=blocksize)
    t = c.to(T)
    assert t.layout == layout and t.device == T and t.values().device == T
    assert t._nnz() == c._nnz()
    _same(t, c)
    _same(x.to(T).to_sparse(layout=layout, blocksize=blocksize), c)
    _same(t.to_dense(), x)
    _same(t.clone(), c)
    if layout == torch.sparse_csr:
        d = torch.randn(6, 3)
        _same(torch.mm(t, d.to(T)), torch.mm(c, d))
        _same(t * 2, c * 2)


def test_compressed_layouts_fallback_off(native_only):
    t = torch.randn(3, 4).to_sparse_csr().to(T)
    assert t.crow_indices().device == T  # structure needs no fallback
    with pytest.raises(NotImplementedError, match="aten.mul.Tensor"):
        t * 2


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no mkldnn")
def test_unsupported_layout_result_names_op_and_layout(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    with pytest.raises(NotImplementedError, match=r"aten\.to_mkldnn.*_mkldnn"):
        torch.randn(2, 3).to(T).to_mkldnn()
