"""Values that once differed from CPU with no error (issue 48, item 2).

Each reproducer runs on the three paths (strict eager, `torch_tpu.fused()`,
`torch.compile(backend="tpu")`) and is compared with the same function on CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_tpu

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

PATHS = ("eager", "fused", "compiled")
INF, NAN = math.inf, math.nan


def on_path(path, fn, *args):
    """fn(*args) with every tensor argument moved to `tpu`, run on `path`, back on CPU."""
    moved = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    if path == "compiled":
        torch._dynamo.reset()
        return _cpu(torch.compile(fn, backend="tpu", fullgraph=True)(*moved))
    if path == "fused":
        with torch_tpu.fused():
            out = fn(*moved)
        return _cpu(out)
    return _cpu(fn(*moved))


def _cpu(out):
    return tuple(_cpu(o) for o in out) if isinstance(out, tuple) else out.cpu()


def assert_like_cpu(path, fn, *args):
    """fn on `path` equals fn on CPU: dtype, shape, values, NaN where CPU has NaN."""
    want, got = _tuple(fn(*args)), _tuple(on_path(path, fn, *args))
    for w, g in zip(want, got, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


# -- NaN from 0 * inf and 0 / 0 where a bool was cast ---------------------------
#
# XLA's algebraic simplifier rewrites convert(pred) * y into select(pred, y, 0)
# (and convert(pred) / c into that product by 1/c), losing the NaN; any bool
# cast to a float that meets arithmetic in one program could hit it.


def _float_div_zero(b):
    return b.float() / torch.zeros((), device=b.device)


def _div_long_zero(b):
    return b / torch.zeros((), dtype=torch.long, device=b.device)


NAN_CASES = {
    "float_div_zero": (_float_div_zero, torch.tensor(False)),
    "div_long_zero": (_div_long_zero, torch.tensor(False)),
    "div_long_zero_2": (_div_long_zero, torch.tensor([False, True])),
    "bool_times_inf": (lambda b, x: b * x, torch.tensor(False), torch.tensor(INF)),
    "float_times_inf": (lambda b, x: b.float() * x, torch.tensor([False, True]),
                        torch.tensor([INF, INF])),
    "inf_times_half": (lambda b, x: x * b.half(), torch.tensor([False, True]),
                       torch.tensor([INF, NAN], dtype=torch.half)),
    "bf16_div_zero": (lambda b: b.bfloat16() / torch.zeros((), dtype=torch.bfloat16,
                                                           device=b.device),
                      torch.tensor([False])),
    "complex_times_nan": (lambda b, x: b.to(torch.complex64) * x, torch.tensor(False),
                          torch.tensor(complex(NAN, 0))),
    "scalar_false_times_inf": (lambda x: x * False, torch.tensor([INF, -INF])),
    "zero_times_inf": (lambda x: x * 0, torch.tensor([INF, NAN, 1.0])),
    "inf_minus_inf": (lambda x: x - x, torch.tensor([INF, -INF, 2.0])),
    "float_div_zero_dtypes": (lambda x, y: (x / y, x.half() / y, x.bfloat16() / y),
                              torch.tensor([0.0, 1.0, -1.0]), torch.zeros(())),
    "int_true_div_zero": (lambda x: x / torch.zeros((), dtype=x.dtype, device=x.device),
                          torch.tensor([0, 3, -2])),
    "mask_where_sum": (lambda b, x: (x * (b > 0).float()).sum(), torch.tensor([0, 1]),
                       torch.tensor([INF, 1.0])),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(NAN_CASES))
def test_nan_from_cast_bool_kept(path, case):
    fn, *args = NAN_CASES[case]
    assert_like_cpu(path, fn, *args)


def test_dropout_of_inf_is_nan_like_cpu_on_every_path():
    """CPU's dropout multiplies by its mask: a dropped inf is NaN, a kept one inf."""
    x = torch.full((4096,), INF)
    for path in PATHS:
        out = on_path(path, lambda t: torch.nn.functional.dropout(t, 0.5, training=True), x)
        assert out.isnan().any() and out.isinf().any(), path
        assert (out.isnan() | (out == INF)).all(), path


# -- float -> integer casts out of range: CPU's x86 result ----------------------

CAST_VALUES = [-2.0, 300.0, 1e10, -1e10, NAN, INF, -INF, 3e9, -129.7, 2.0**31, 1e19,
               70000.0, 0.5, -0.7, 255.9]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_to_int_cast_wraps_like_cpu(path, src):
    def to_all(t):
        return (t.to(torch.uint8), t.to(torch.int8), t.to(torch.int16), t.to(torch.int32),
                t.long())
    assert_like_cpu(path, to_all, torch.tensor(CAST_VALUES, dtype=src))


def test_float_to_uint8_reproducer():
    assert torch.tensor([-2.0], device="tpu").to(torch.uint8).item() == 254


@pytest.mark.parametrize("path", PATHS)
def test_copy_into_int_tensor_wraps_like_cpu(path):
    def fn(x):
        out = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
        return out.copy_(x)
    assert_like_cpu(path, fn, torch.tensor([-2.0, 300.0, NAN]))


# -- integer linspace / logspace -------------------------------------------------


def _spaces(device):
    return (torch.linspace(0.3, 1.1, 137, dtype=torch.int64, device=device).sum(),
            torch.linspace(-9, 0, 5, dtype=torch.uint8, device=device),
            torch.linspace(0.5, 10.7, 7, dtype=torch.int32, device=device),
            torch.logspace(0.5, 10.7, 7, base=2, dtype=torch.uint8, device=device),
            torch.logspace(0, 9, 5, base=2, dtype=torch.uint8, device=device),
            torch.logspace(-9, 0, 5, base=2, dtype=torch.uint8, device=device))


@pytest.mark.parametrize("path", PATHS)
def test_integer_linspace_logspace_like_cpu(path):
    got = on_path(path, _spaces, "tpu")
    for w, g in zip(_spaces("cpu"), got, strict=True):
        assert torch.equal(w, g)


@pytest.mark.parametrize("path", PATHS)
def test_integer_linspace_out_like_cpu(path):
    def fn(out):
        return torch.linspace(0.3, 1.1, 137, out=out).sum()
    assert_like_cpu(path, fn, torch.empty(137, dtype=torch.int64))


# -- subnormals: flushed as a TPU (and XLA:CPU) does -----------------------------
#
# docs/troubleshooting.md: float arithmetic and comparisons on `tpu` give what
# CPU gives under torch.set_flush_denormal(True); moving values keeps them.

SUBNORMALS = [1e-45, 0.0, -1e-45, 3e-45, 1e-40, -0.0, 1e-38, 1.0, -1e-39]


def _subnormal_ops(x):
    return (x > 0, x * 0.01, x.sum(), torch.sort(x, stable=True).indices, x.abs(), -x,
            x.amax(), x.eq(0), x / 2, torch.where(x > 0, x, 1.0), x.exp(),
            x.to(torch.bfloat16) * 1, x.half() * 1)


@pytest.fixture
def cpu_flushing():
    """CPU's results under FTZ/DAZ (restored after: the state is per thread)."""
    assert torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


def _bits(t):
    return t.reshape(-1).view(torch.uint8) if t.dtype.is_floating_point else t


@pytest.mark.parametrize("path", PATHS)
def test_subnormals_flushed_like_cpu_flush_denormal(path, cpu_flushing):
    x = torch.tensor(SUBNORMALS)
    want = _subnormal_ops(x)
    torch.set_flush_denormal(False)  # the tpu result must not depend on it
    got = on_path(path, _subnormal_ops, x)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert torch.equal(_bits(w), _bits(g)), (i, w, g)


def _folded_subnormal(device):
    return torch.full((3,), 1e-38, device=device) * 0.01


@pytest.mark.parametrize("path", PATHS)
def test_subnormal_folded_at_compile_time_is_flushed(path):
    """A graph of constants only is folded while it compiles: still flushed."""
    assert torch.equal(on_path(path, _folded_subnormal, "tpu"), torch.zeros(3))


def test_subnormals_move_bit_for_bit():
    x = torch.tensor(SUBNORMALS)
    t = x.to("tpu")
    assert torch.equal(_bits(t.cpu()), _bits(x))
    assert torch.equal(_bits(t[1:].clone().cpu()), _bits(x[1:]))
    assert torch.equal(_bits(torch.cat([t, t]).cpu()), _bits(torch.cat([x, x])))


# -- unique(dim=0) with NaN rows ---------------------------------------------------
#
# docs/troubleshooting.md: CPU sorts rows with std::sort under a comparator for
# which NaN is neither less nor greater than anything (no ordering: equal
# NaN-free rows can end up apart and be listed twice); `tpu` sorts rows
# lexicographically with NaN after every number, so equal rows without NaN
# form one group and each row holding a NaN is a group of its own.

NAN_ROWS = [[2.0, 1.0, 2.0, 0.0], [NAN, 1.0, NAN, NAN], [1.0, NAN, 1.0, 2.0],
            [2.0, 1.0, 2.0, 0.0], [2.0, 0.0, 0.0, 2.0], [NAN, 1.0, NAN, NAN],
            [-0.0, 2.0, 1.0, 1.0], [0.0, 2.0, 1.0, 1.0], [2.0, 1.0, NAN, NAN]]


# unique's result size depends on the values: its compiled graph runs op by op.
_OP_BY_OP = pytest.mark.filterwarnings("ignore:torch_tpu. a compiled inference graph runs op by op")


def _unique_rows(x):
    return torch.unique(x, dim=0, return_inverse=True, return_counts=True)


def _rule_groups(x):
    """(row, count) pairs of the documented rule, computed in Python."""
    counts: dict = {}
    for i, row in enumerate(x.tolist()):
        row = [v + 0.0 for v in row]  # -0.0 == 0.0
        key = (i, str(row)) if any(math.isnan(v) for v in row) else (-1, str(row))
        counts[key] = counts.get(key, 0) + 1
    return sorted((label, c) for (_, label), c in counts.items())


def _lex_key(row):
    return [(math.isnan(v), 0.0 if math.isnan(v) else v) for v in row]


@_OP_BY_OP
@pytest.mark.parametrize("path", PATHS)
def test_unique_dim_nan_rows_follow_the_rule(path):
    x = torch.tensor(NAN_ROWS)
    u, inverse, counts = on_path(path, _unique_rows, x)
    torch.testing.assert_close(u[inverse], x, rtol=0, atol=0, equal_nan=True)
    got = sorted((str([v + 0.0 for v in r]), int(c)) for r, c in zip(u.tolist(), counts))
    assert got == _rule_groups(x)
    keys = [_lex_key(r) for r in u.tolist()]
    assert keys == sorted(keys)


@_OP_BY_OP
@pytest.mark.parametrize("path", PATHS)
def test_unique_dim_without_nan_like_cpu(path):
    x = torch.tensor([[3.0, 1.0], [0.0, 2.0], [3.0, 1.0], [-0.0, 2.0], [-1.0, 5.0]])
    assert_like_cpu(path, _unique_rows, x)
