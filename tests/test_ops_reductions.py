"""Reductions, scans, softmax, sorting and selection on `tpu` vs PyTorch CPU.

Inputs are built on the CPU and copied to the device, so these tests only
exercise the ops under test (plus copies and views).
"""

import pytest
import torch

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

DEV = "tpu"
NAN = float("nan")
INF = float("inf")

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
ALL = FLOATS + [torch.int32, torch.int64, torch.bool, torch.complex64]

_TOL = {torch.float16: dict(rtol=2e-3, atol=1e-3), torch.bfloat16: dict(rtol=2e-2, atol=1e-2),
        torch.float32: dict(rtol=1e-5, atol=1e-5), torch.complex64: dict(rtol=1e-5, atol=1e-5)}


def make(shape, dtype, *, noncontig=False, low=-3, high=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    if noncontig and shape:
        # A strided, permuted view of a bigger tensor with the same logical shape.
        n = len(shape)
        big = make((2 * shape[0],) + tuple(reversed(shape[1:])), dtype, low=low, high=high,
                   seed=seed)
        v = big[::2].permute(0, *range(n - 1, 0, -1))
        assert v.shape == shape and not v.is_contiguous()
        return v
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)
    return torch.randint(low, high + 1, shape, generator=g, dtype=dtype)


def to_dev(x):
    if isinstance(x, torch.Tensor):
        return x.to(DEV)
    if isinstance(x, (list, tuple)):
        return type(x)(to_dev(y) for y in x)
    return x


def compare(actual, expected, **tol):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            compare(a, e, **tol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.device.type == DEV, actual.device
    a = actual.cpu()
    assert a.dtype == expected.dtype, (a.dtype, expected.dtype)
    assert a.shape == expected.shape, (a.shape, expected.shape)
    t = tol or _TOL.get(expected.dtype, {})
    torch.testing.assert_close(a, expected, equal_nan=True, **t)


def check(fn, *inputs, tol=None, **kwargs):
    """fn on the CPU inputs and on their tpu copies: the same result. A CPU
    error fails the test (the errors are check_error's, in tests named so)."""
    expected = fn(*inputs, **kwargs)
    actual = fn(*to_dev(inputs), **kwargs)
    compare(actual, expected, **(tol or {}))
    return actual, expected


def check_error(fn, *inputs, **kwargs):
    """The CPU raises for these inputs, and the tpu raises the same type."""
    with pytest.raises(Exception) as cpu:  # noqa: PT011 - whatever the CPU raises
        fn(*inputs, **kwargs)
    with pytest.raises(cpu.type):
        r = fn(*to_dev(inputs), **kwargs)
        # Errors raised lazily would surface on the host copy.
        torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, r)


def check_values(fn, *inputs, **kwargs):
    """Like check for (values, indices) ops, comparing the values only."""
    expected = fn(*inputs, **kwargs)
    actual = fn(*to_dev(inputs), **kwargs)
    compare(actual[0], expected[0])
    assert actual[1].dtype == expected[1].dtype and actual[1].shape == expected[1].shape
    return actual, expected


def check_index_consistent(x, values, indices, dim, keepdim):
    """Tie order is unspecified: the indices must point at the returned values."""
    idx = indices.cpu() if keepdim else indices.cpu().unsqueeze(dim)
    got = torch.gather(x, dim, idx)
    want = values.cpu() if keepdim else values.cpu().unsqueeze(dim)
    torch.testing.assert_close(got, want, equal_nan=True)


# -- sum / mean / prod / nansum -------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (-1, True), ((0, 2), False),
                                         ((), True), ([-1, 1], False)])
def test_sum(dtype, dim, keepdim):
    x = make((3, 4, 5), dtype, noncontig=dim == 0)
    if dim is None:
        check(torch.sum, x)
    else:
        check(torch.sum, x, dim, keepdim=keepdim)


@pytest.mark.parametrize("dtype", FLOATS + [torch.complex64])
@pytest.mark.parametrize("dim", [None, 1, (0, -1)])
def test_mean(dtype, dim):
    x = make((3, 4, 5), dtype, noncontig=True)
    if dim is None:
        check(torch.mean, x)
    else:
        check(torch.mean, x, dim, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_mean_of_integers_is_an_error(dtype):
    x = make((3, 4, 5), dtype, noncontig=True)
    check_error(torch.mean, x)
    check_error(torch.mean, x, 1, keepdim=True)
    check_error(torch.mean, x, (0, -1), keepdim=True)


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_prod(dtype, dim):
    x = make((3, 4, 5), dtype, low=-2, high=2)
    if dtype.is_floating_point:
        x = make((3, 4, 5), dtype, low=0.5, high=1.5)
    if dim is None:
        check(torch.prod, x)
    else:
        check(torch.prod, x, dim, keepdim=dim == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_sum_prod_dtype_arg(dtype):
    x = make((4, 6), dtype)
    check(torch.sum, x, 1, dtype=torch.float32)
    check(torch.sum, x, dtype=torch.int64)
    check(torch.prod, x, 0, dtype=torch.float32)
    check(torch.cumsum, x, 1, dtype=torch.float32)
    if dtype.is_floating_point:
        check(torch.mean, x, 1, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_nansum_nanmean(dtype):
    x = make((4, 6), dtype)
    if dtype.is_floating_point:
        x[0, 1] = NAN
        x[2] = NAN
    check(torch.nansum, x)
    check(torch.nansum, x, 1)
    check(torch.nansum, x, (0, 1), keepdim=True)
    if dtype.is_floating_point:
        check(torch.nanmean, x, 1)


# -- max / min and indices ------------------------------------------------------------


def _with_specials(dtype):
    x = make((4, 7), dtype, seed=1)
    if dtype.is_floating_point:
        x[1, 2] = NAN
        x[1, 5] = NAN
        x[2, 3] = INF
        x[3, 1] = -INF
    elif dtype != torch.bool:
        x[0, :] = 2  # ties: first occurrence wins
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
@pytest.mark.parametrize("op", [torch.max, torch.min])
def test_max_min(dtype, op):
    x = _with_specials(dtype)
    check(op, x)
    check(op, x, 1)
    check(op, x, 0, keepdim=True)
    check(op, x, -1, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
@pytest.mark.parametrize("op", [torch.amax, torch.amin])
@pytest.mark.parametrize("dim", [(), (0, 1), -1])
def test_amax_amin(dtype, op, dim):
    check(op, _with_specials(dtype), dim)
    check(op, make((2, 3, 4), dtype, noncontig=True), dim, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_aminmax(dtype):
    x = _with_specials(dtype)
    check(torch.aminmax, x)
    check(torch.aminmax, x, keepdim=True)
    check(torch.aminmax, x, dim=1)
    check(torch.aminmax, x, dim=0, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.int64])
@pytest.mark.parametrize("op", [torch.argmax, torch.argmin])
def test_argmax_argmin(dtype, op):
    x = _with_specials(dtype)
    check(op, x)
    check(op, x, keepdim=True)
    check(op, x, 1)
    check(op, x, 0, keepdim=True)
    check(op, make((3, 4, 5), dtype, noncontig=True), -1)
    ties = torch.tensor([[1, 3, 3, 0, 0], [2, 2, 2, 2, 2]]).to(dtype)
    check(op, ties, 1)
    check(op, ties)


@pytest.mark.parametrize("op", [torch.argmax, torch.argmin])
def test_argmax_argmin_of_bool_is_an_error(op):
    x = _with_specials(torch.bool)
    check_error(op, x)
    check_error(op, x, 1)
    check_error(op, x, 0, keepdim=True)


def test_max_min_scalar_and_empty():
    check(torch.max, torch.tensor(3.0))
    check(torch.max, torch.tensor(3.0), 0)
    check(torch.argmax, torch.tensor(3.0), 0, keepdim=True)
    check(torch.amax, torch.empty(0, 3), 1)
    check(torch.max, torch.empty(0, 3), 1)


# -- all / any / count_nonzero ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32, torch.uint8,
                                   torch.complex64])
def test_all_any(dtype):
    x = make((3, 4, 5), dtype, low=0, high=2) if dtype != torch.uint8 else \
        torch.randint(0, 2, (3, 4, 5), dtype=torch.uint8)
    for op in (torch.all, torch.any):
        check(op, x)
        check(op, x, 1)
        check(op, x, -1, keepdim=True)
        check(op, x, (0, 2))
        check(op, x, ())
        check(op, x.transpose(0, 2), (0, 1), keepdim=True)
        check(op, torch.empty(0, 3, dtype=dtype), 0)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64])
def test_count_nonzero(dtype):
    x = make((3, 4, 5), dtype, low=0, high=1)
    check(torch.count_nonzero, x)
    check(torch.count_nonzero, x, 1)
    check(torch.count_nonzero, x, (0, -1))


# -- var / std ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("dim", [None, (0, 2)])
@pytest.mark.parametrize("correction", [None, 0, 2, 0.5])
def test_var_std(dtype, dim, correction):
    # `correction` is a runtime scalar: 0 and 2 share one executable.
    x = make((3, 4, 5), dtype, noncontig=dim is None)
    kw = dict(dim=dim, correction=correction)
    check(torch.var, x, **kw)
    check(torch.std, x, keepdim=True, **kw)
    check(torch.var_mean, x, **kw)
    check(torch.std_mean, x, keepdim=True, **kw)


@pytest.mark.parametrize("dim", [None, (0, 2)])
def test_var_std_of_integers_is_an_error(dim):
    x = make((3, 4, 5), torch.int32)
    for op in (torch.var, torch.std, torch.var_mean, torch.std_mean):
        check_error(op, x, dim=dim)
        check_error(op, x, dim=dim, correction=0)


def test_var_unbiased_and_small():
    x = make((4, 6), torch.float32)
    check(torch.var, x, 1, unbiased=False)
    check(torch.std, x, unbiased=True)
    check(torch.var, torch.tensor([2.0]))            # n - 1 == 0: nan
    check(torch.var, torch.tensor([2.0, 3.0]), correction=5)  # clamped divisor: inf
    check(torch.std, torch.empty(0, 3), 0)
    check(torch.var_mean, torch.tensor(3.0))


# -- norms ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ord", [2, 1, 0, INF, -INF, 3, 0.5, -1, 2.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
def test_vector_norm(ord, dtype):
    x = make((3, 4, 5), dtype)
    if dtype != torch.complex64:
        x[0, 0, 0] = 0
    check(torch.linalg.vector_norm, x, ord)
    check(torch.linalg.vector_norm, x, ord, dim=1, keepdim=True)
    check(torch.linalg.vector_norm, x, ord, dim=(0, 2))


def test_norm_overloads():
    x = make((3, 4, 5), torch.float32)
    check(torch.norm, x)
    check(torch.norm, x, 1)
    check(torch.norm, x, 3, dim=1)
    check(torch.norm, x, INF, dim=(0, 1), keepdim=True)
    check(torch.norm, x, 2, dim=1, dtype=torch.float32)
    check(lambda t: t.norm(p=2, dtype=torch.float32), x)
    check(torch.linalg.vector_norm, x.to(torch.bfloat16), 2, dtype=torch.float32)
    check(torch.linalg.vector_norm, torch.empty(0, 3), 2)
    check(torch.linalg.vector_norm, torch.empty(0, 3), INF, 1)


# -- logsumexp, softmax -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_logsumexp(dtype):
    x = make((3, 4, 5), dtype)
    check(torch.logsumexp, x, 1)
    check(torch.logsumexp, x, (0, 2), keepdim=True)
    if dtype.is_floating_point:
        y = x.clone()
        y[0] = -INF
        y[1, 0] = INF
        y[2, 1] = NAN
        check(torch.logsumexp, y, -1)
    check(torch.logsumexp, torch.empty(0, 3, dtype=dtype), 0)


def test_logsumexp_complex():
    x = make((3, 5), torch.complex64) * 3
    check(torch.logsumexp, x, 1)
    check(torch.logsumexp, x, (0, 1))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax(dtype, dim):
    x = make((4, 5), dtype, noncontig=True)
    check(torch.softmax, x, dim)
    check(torch.log_softmax, x, dim)
    check(torch.softmax, x, dim, dtype=torch.float32)
    y = x.clone()
    y[1] = -INF
    check(torch.softmax, y, -1)
    check(torch.log_softmax, y, 0)
    check(torch.softmax, torch.tensor(2.0, dtype=dtype), 0)
    check(torch.softmax, torch.empty(0, 3, dtype=dtype), 1)
    if dtype == torch.float16:
        # half_to_float: CPU refuses it; tpu computes it like CUDA does.
        for op in (torch.ops.aten._softmax, torch.ops.aten._log_softmax):
            compare(op(x.to(DEV), dim, True), op(x.float(), dim, False), rtol=1e-5, atol=1e-5)


def test_safe_softmax():
    x = make((3, 4), torch.float32)
    x[1] = -INF
    x[2, 0] = -INF
    check(torch.ops.aten._safe_softmax, x, 1)
    check(torch.ops.aten._safe_softmax, x, 0, torch.float32)
    check(torch.ops.aten._safe_softmax, x.to(torch.bfloat16), -1)


# -- scans ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("dim", [0, -1])
def test_cumsum_cumprod(dtype, dim):
    x = make((4, 5), dtype, noncontig=dim == 0, low=-2, high=2)
    check(torch.cumsum, x, dim)
    if dtype.is_floating_point:
        x = make((4, 5), dtype, low=0.5, high=1.5)
    check(torch.cumprod, x, dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_cummax_cummin(dtype, op):
    x = make((4, 9), dtype, low=-2, high=2)
    check(op, x, 1)
    check(op, x, 0)
    if dtype.is_floating_point:
        x = torch.tensor([1, NAN, 3, NAN, 3, -INF, INF, 0]).to(dtype)
        check(op, x, 0)
    check(op, torch.tensor([1, 3, 3, 2, 3, 0, 0]).to(dtype), 0)
    check(op, torch.tensor(2).to(dtype), 0)
    check(op, torch.empty(0, 3, dtype=dtype), 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
def test_logcumsumexp(dtype):
    x = make((4, 6), dtype)
    check(torch.logcumsumexp, x, 1)
    check(torch.logcumsumexp, x, 0)
    if dtype != torch.complex64:
        x[0, :2] = -INF
        x[1, 3] = INF
        check(torch.logcumsumexp, x, 1)


def test_scalar_and_empty_scans():
    for op in (torch.cumsum, torch.cumprod, torch.logcumsumexp):
        check(op, torch.tensor(1.5), 0)
        check(op, torch.empty(0, 2), 0)
        check(op, torch.empty(0, 2), 1)


# -- median, kthvalue, mode -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64])
@pytest.mark.parametrize("n", [5, 6])
def test_median(dtype, n):
    x = make((3, n), dtype, seed=n)  # floats: distinct values, so indices are exact
    check(torch.median, x)
    check(torch.nanmedian, x)
    r = check(torch.median, x, 1)
    if not dtype.is_floating_point:
        check_index_consistent(x, *r[0], 1, False)
    check(torch.nanmedian, x.t(), 0, keepdim=True)
    if dtype.is_floating_point:
        y = x.clone()
        y[0, 1] = NAN
        y[1, :] = NAN
        y[2, 0] = NAN
        y[2, 3] = NAN
        check(torch.median, y)
        check(torch.nanmedian, y)
        check(torch.median, y, 1)  # the first NaN, with its index
        # An all-NaN row's nanmedian index depends on CPU nth_element internals.
        r = check_values(torch.nanmedian, y, 1)
        compare(r[0][1][[0, 2]], r[1][1][[0, 2]])


def test_median_edge_cases():
    check(torch.median, torch.empty(0))
    check(torch.nanmedian, torch.empty(0))
    check(torch.median, torch.empty(0, 2), 1)
    check(torch.median, torch.tensor(4.0), 0)
    check(torch.kthvalue, torch.tensor(4.0), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_kthvalue(dtype, k):
    x = make((4, 5), dtype, seed=k)
    # Integers have ties, whose index PyTorch leaves unspecified: compare values.
    cmp = check if dtype.is_floating_point else check_values
    r = cmp(torch.kthvalue, x, k, 1)
    check_index_consistent(x, *r[0], 1, False)
    r = cmp(torch.kthvalue, x, min(k, 4), 0, True)
    check_index_consistent(x, *r[0], 0, True)
    if dtype.is_floating_point:
        y = x.clone()
        y[:, 2] = NAN
        check(torch.kthvalue, y, k, 1)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_mode(dtype):
    x = torch.tensor([[1, 2, 2, 3, 2], [2, 2, 1, 1, 0], [5, 5, 1, 5, 1], [0, 1, 2, 3, 4]])
    x = x.to(dtype)
    check(torch.mode, x, 1)
    check(torch.mode, x)
    check(torch.mode, x.t(), 0, keepdim=True)
    check(torch.mode, torch.tensor(3).to(dtype))


# -- sort, argsort, topk ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dtype, descending):
    x = make((5, 8), dtype, low=-2, high=2, seed=3)  # many ties
    if dtype.is_floating_point:
        x = x.round()
        x[0, 1] = NAN
        x[0, 4] = NAN
        x[1, 2] = -0.0
        x[1, 3] = 0.0
        x[1, 5] = -0.0
        x[2, 0] = INF
        x[2, 6] = -INF
    for dim in (1, 0):
        check(torch.sort, x, dim=dim, descending=descending, stable=True)
        check(torch.argsort, x, dim=dim, descending=descending, stable=True)
    check(torch.sort, x.t(), 0, descending)
    check(torch.msort, x)
    if dtype == torch.int64:
        ext = torch.tensor([torch.iinfo(torch.int64).min, 5, torch.iinfo(torch.int64).max, 5, 0])
        check(torch.sort, ext, descending=descending, stable=True)


def test_sort_edge_cases():
    check(torch.sort, torch.tensor(3.0))
    check(torch.sort, torch.empty(0, 3), 0)
    check(torch.sort, torch.empty(0, 3), 1, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(dtype, largest):
    x = make((5, 9), dtype, seed=5)
    if dtype.is_floating_point:
        x[0, 3] = NAN
        x[1, 4] = -0.0
        x[2, 2] = -INF
    cmp = check if dtype.is_floating_point else check_values  # integer ties
    r = cmp(torch.topk, x, 3, largest=largest)
    check_index_consistent(x, *r[0], 1, True)
    r = cmp(torch.topk, x, 2, 0, largest, True)
    check_index_consistent(x, *r[0], 0, True)
    cmp(torch.topk, x, 9, largest=largest)
    check(torch.topk, x, 0, largest=largest)
    if dtype == torch.int64:
        ext = torch.tensor([torch.iinfo(torch.int64).min, 5, torch.iinfo(torch.int64).max, 0])
        check(torch.topk, ext, 2, largest=largest)


# -- searchsorted, bucketize, histc ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(dtype, right):
    seq = torch.tensor([0, 1, 1, 2, 4, 4, 4, 7]).to(dtype)
    vals = torch.tensor([[-1, 0, 1, 3], [4, 7, 8, 2]]).to(dtype)
    check(torch.searchsorted, seq, vals, right=right)
    check(torch.searchsorted, seq, vals, side="right" if right else "left", out_int32=True)
    check(torch.searchsorted, seq, 4, right=right)
    seq2 = torch.sort(make((2, 6), dtype, seed=2), dim=1)[0]
    check(torch.searchsorted, seq2, vals, right=right)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    unsorted = seq[perm]
    check(lambda s, v, p: torch.searchsorted(s, v, sorter=p), unsorted, vals,
          torch.argsort(unsorted, stable=True))
    check(torch.bucketize, vals, seq, right=right)
    check(torch.bucketize, vals, seq, out_int32=True)
    check(torch.bucketize, 3, seq, right=right)
    check(torch.searchsorted, torch.empty(0, 0, dtype=dtype), torch.empty(0, 0, dtype=dtype))
    check(torch.searchsorted, torch.empty(0, dtype=dtype), vals, right=right)
    check(torch.searchsorted, seq2, torch.empty(2, 0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_histc(dtype):
    x = make((50,), dtype)
    check(torch.histc, x)
    check(torch.histc, x, 7, -2, 2)
    check(torch.histc, x, 4, 0, 3)
    check(torch.histc, torch.full((5,), 2.0, dtype=dtype), 3)
    check(torch.histc, torch.tensor([0.0, 1.0, 2.0, 3.0]).to(dtype), 3, 0, 3)
    check(torch.histc, torch.empty(0, dtype=dtype), 5)


# -- data-dependent: nonzero, masked_select, unique, bincount ---------------------------------------


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.complex64])
def test_nonzero(dtype):
    x = make((3, 4, 5), dtype, low=0, high=1)
    check(torch.nonzero, x)
    check(torch.nonzero, x.transpose(0, 2))
    check(torch.nonzero, x, as_tuple=True)
    check(torch.nonzero, torch.tensor(3).to(dtype))
    check(torch.nonzero, torch.tensor(0).to(dtype))
    check(torch.nonzero, torch.zeros(2, 3, dtype=dtype))
    check(torch.nonzero, torch.empty(0, 3, dtype=dtype))
    check(torch.argwhere, x)
    check(torch.nonzero_static, x.reshape(-1), size=10)
    check(torch.nonzero_static, x, size=100, fill_value=-7)
    check(torch.nonzero_static, torch.empty(5, 0, 5, dtype=dtype), size=2)


def test_nonzero_out():
    x = make((4, 5), torch.float32, low=0, high=1)
    out = torch.empty(0, dtype=torch.long)
    torch.nonzero(x, out=out)
    out_d = torch.empty(0, dtype=torch.long, device=DEV)
    torch.nonzero(x.to(DEV), out=out_d)
    compare(out_d, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_masked_select(dtype):
    x = make((3, 4), dtype)
    m = make((3, 4), torch.bool, seed=7)
    check(torch.masked_select, x, m)
    check(torch.masked_select, x.t(), m.t())
    check(torch.masked_select, x, m[0])           # broadcast mask
    check(torch.masked_select, x[0], m)           # broadcast input
    check(torch.masked_select, x, torch.zeros(3, 4, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_unique(dtype):
    x = make((4, 6), dtype, low=-2, high=2).round() if dtype.is_floating_point else \
        make((4, 6), dtype, low=-2, high=2)
    check(torch.unique, x, return_inverse=True, return_counts=True)
    check(torch.unique_consecutive, x, return_inverse=True, return_counts=True)
    check(torch.unique, x.t(), dim=1, return_inverse=True, return_counts=True)
    if dtype in (torch.bool, torch.bfloat16):
        return
    check(torch.unique, x)
    check(torch.unique, x, sorted=False, return_inverse=True)
    check(torch.ops.aten._unique, x, True, True)
    check(torch.unique, x, dim=0, return_inverse=True, return_counts=True)
    check(torch.unique_consecutive, x)
    rows = torch.tensor([[1, 1], [1, 1], [2, 3], [2, 3], [1, 1]]).to(dtype)
    check(torch.unique_consecutive, rows, return_inverse=True, return_counts=True, dim=0)
    check(torch.unique_consecutive, rows, dim=1)
    check(torch.unique, rows, dim=0, return_inverse=True, return_counts=True)
    check(torch.ops.aten.unique_dim_consecutive, rows, 0, True, True)
    check(torch.unique, torch.empty(0, dtype=dtype), return_inverse=True, return_counts=True)
    check(torch.unique, torch.empty(0, 3, dtype=dtype), dim=0)


def test_unique_nan():
    x = torch.tensor([NAN, 1.0, NAN, 1.0, 2.0])
    check(torch.unique, x, return_inverse=True, return_counts=True)
    check(torch.unique_consecutive, torch.tensor([NAN, NAN, 1.0, 1.0]), return_counts=True)


def test_bincount():
    x = torch.tensor([3, 1, 2, 3, 1, 5, 0])
    check(torch.bincount, x)
    check(torch.bincount, x, minlength=10)
    check(torch.bincount, x, torch.rand(7))
    check(torch.bincount, x, torch.rand(7, dtype=torch.float16))
    check(torch.bincount, x, torch.ones(7, dtype=torch.int32))
    check(torch.bincount, x.int())
    check(torch.bincount, torch.empty(0, dtype=torch.long))
    check(torch.bincount, torch.empty(0, dtype=torch.long), minlength=3)


def test_bincount_errors():
    check_error(torch.bincount, torch.tensor([1, -1]))
    check_error(torch.bincount, torch.tensor([[1, 2]]))
    check_error(torch.bincount, torch.tensor([1.0, 2.0]))
    check_error(torch.bincount, torch.tensor([3, 1, 2]), torch.ones(2))


# -- errors PyTorch raises -------------------------------------------------------------------------------


def test_errors():
    check_error(torch.mean, torch.arange(5))            # integer mean
    check_error(torch.sum, torch.ones(2, 3), 3)        # dim out of range
    check_error(torch.amax, torch.ones(2, 3), (0, 0))  # repeated dim
    check_error(torch.var, torch.arange(5))            # integer var
    check_error(torch.cumsum, torch.tensor(1.0), 1)
    check_error(torch.cumsum, torch.ones(3, 4), 2)
    check_error(torch.logsumexp, torch.ones(2, 3), 5)
    check_error(torch.argmax, torch.ones(2, 3), 2)
    check_error(torch.sort, torch.ones(2, 3), 2)
    check_error(torch.sort, torch.randn(3, dtype=torch.complex64))  # no complex sort on CPU
    check_error(torch.linalg.vector_norm, torch.tensor([3, 4]), 2)  # integer input
    check_error(torch.linalg.vector_norm, torch.empty(0, 3), INF)  # inf norm of nothing
    check_error(torch.mode, torch.empty(0))
    check_error(torch.kthvalue, torch.arange(5.0), 6)  # k out of range
    check_error(torch.median, torch.empty(2, 0), 1)   # a reduction over a 0-size dim
    check_error(torch.max, torch.empty(0))            # max of nothing, no dim
    check_error(torch.max, torch.randn(3, dtype=torch.complex64))  # complex has no order
    for dtype in (torch.float32, torch.int32):
        check_error(torch.masked_select, make((3, 4), dtype), torch.ones(3, 4, dtype=torch.int32))
    for dtype in (torch.float32, torch.int64):
        check_error(torch.topk, make((5, 9), dtype), 10)  # k too large
        check_error(torch.topk, make((5, 9), dtype), 10, largest=False)
        check_error(torch.unique, torch.empty(0, 3, dtype=dtype), dim=1)  # a 0-size dim kept


@pytest.mark.parametrize("case", ["amax", "kthvalue", "argmax", "argmin_all", "max", "min"])
def test_zero_size_reduction_dim_is_an_index_error(case):
    # PyTorch's meta kernels raise RuntimeError (or, for max/min over a dim,
    # nothing) where CPU raises IndexError; the tpu kernels check first.
    if case == "amax":
        check_error(torch.amax, torch.empty(2, 0), 1)
    elif case == "argmax":
        check_error(torch.argmax, torch.empty(0))
    elif case == "argmin_all":
        check_error(torch.argmin, torch.empty(3, 0))
    elif case in ("max", "min"):
        check_error(getattr(torch, case), torch.empty(0, 2), 0)
    else:
        check_error(torch.kthvalue, torch.empty(0), 1)


# -- out= and in-place forms -------------------------------------------------------------------------------


def test_out_and_inplace_forms():
    x = make((3, 4), torch.float32)
    out = torch.empty(0)
    out_d = torch.empty(0, device=DEV)
    torch.sum(x, 1, out=out)
    torch.sum(x.to(DEV), 1, out=out_d)
    compare(out_d, out)
    vals, idx = torch.empty(0), torch.empty(0, dtype=torch.long)
    vals_d, idx_d = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.long, device=DEV)
    torch.max(x, 1, out=(vals, idx))
    torch.max(x.to(DEV), 1, out=(vals_d, idx_d))
    compare((vals_d, idx_d), (vals, idx))
    torch.sort(x, 0, out=(vals, idx))
    torch.sort(x.to(DEV), 0, out=(vals_d, idx_d))
    compare((vals_d, idx_d), (vals, idx))
    y, y_d = x.clone(), x.to(DEV)
    y.cumsum_(1)
    y_d.cumsum_(1)
    compare(y_d, y)
    torch.median(x, 1, out=(vals, idx))
    torch.median(x.to(DEV), 1, out=(vals_d, idx_d))
    compare((vals_d, idx_d), (vals, idx))
    # Writing into a view of a bigger tensor.
    big, big_d = torch.zeros(4, 5), torch.zeros(4, 5, device=DEV)
    torch.amax(x, 1, out=big[1:, 2])
    torch.amax(x.to(DEV), 1, out=big_d[1:, 2])
    compare(big_d, big)


# -- autograd ---------------------------------------------------------------------------------------------------

GRAD_CASES = {
    "sum": lambda t: t.sum(1),
    "sum_all": lambda t: t.sum(),
    "mean": lambda t: t.mean((0, 2), keepdim=True),
    "prod": lambda t: t.prod(1),
    "prod_all": lambda t: t.prod(),
    "amax": lambda t: t.amax(1),
    "amin_all": lambda t: t.amin(),
    "max_dim": lambda t: t.max(1)[0],
    "min_dim": lambda t: t.min(-1, keepdim=True)[0],
    "max": lambda t: t.max(),
    "var": lambda t: t.var(1),
    "std": lambda t: t.std((0, 1), correction=0),
    "var_mean": lambda t: torch.var_mean(t, 1)[0] + torch.var_mean(t, 1)[1],
    "norm2": lambda t: torch.linalg.vector_norm(t, dim=1),
    "norm3": lambda t: torch.linalg.vector_norm(t, 3),
    "norm_inf": lambda t: torch.linalg.vector_norm(t, INF, dim=-1),
    "logsumexp": lambda t: torch.logsumexp(t, 1),
    "softmax": lambda t: torch.softmax(t, 1),
    "log_softmax": lambda t: torch.log_softmax(t, -1),
    "cumsum": lambda t: t.cumsum(1),
    "cumprod": lambda t: t.cumprod(2),
    "cummax": lambda t: t.cummax(1)[0],
    "logcumsumexp": lambda t: t.logcumsumexp(1),
    "sort": lambda t: t.sort(1)[0],
    "topk": lambda t: t.topk(2, 1)[0],
    "median": lambda t: t.median(1)[0],
    "kthvalue": lambda t: t.kthvalue(2, 1)[0],
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_grad(name):
    fn = GRAD_CASES[name]
    x = make((3, 4, 5), torch.float32, low=0.5, high=2, seed=11)
    g = make(tuple(fn(x).shape), torch.float32, seed=12)
    xc = x.clone().requires_grad_()
    fn(xc).backward(g)
    xd = x.to(DEV).requires_grad_()
    fn(xd).backward(g.to(DEV))
    compare(xd.grad, xc.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int64, torch.int32, torch.bool])
def test_hash_tensor_bit_exact(dtype):
    # float32 subnormals, signed zeros, infinities, quiet and signalling NaNs
    # widen to float64 bit patterns as on the host
    import numpy as np

    special = torch.from_numpy(np.array(
        [0x7F800001, 0xFF800001, 1, 0x80000001, 0x7FFFFF, 0, 0x80000000, 0x7F800000,
         0x3FC00000], dtype=np.uint32).view(np.float32))
    r = torch.randn(64, 7, generator=torch.Generator().manual_seed(0)) * torch.logspace(-45, 38, 7)
    x = r.to(dtype) if dtype.is_floating_point else (r * 100).to(dtype)
    cases = [(x, {}), (x, {"dim": 0}), (x, {"dim": (0, 1), "keepdim": True})]
    if dtype == torch.float32:
        cases.append((special[:, None], {"dim": 1}))
    for t, kw in cases:
        want = torch.hash_tensor(t, **kw)
        got = torch.hash_tensor(t.to(DEV), **kw).cpu()
        assert got.dtype == torch.uint64 and torch.equal(got, want), (t.dtype, kw)
    with pytest.raises(RuntimeError, match="Unknown hash_tensor mode"):
        torch.hash_tensor(x.to(DEV), mode=1)
