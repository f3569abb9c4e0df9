"""Errors as CPU raises them, and no error where CPU has none (issue 48, items 2 and 6).

Each reproducer raises on `tpu` what CPU raises (exception type, CPU's text),
on strict eager and, where the issue names them, in `torch_tpu.fused()` and
`torch.compile(backend="tpu")`; the CPU fallback is off, so a missing lowering
cannot compare the CPU with itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torch_tpu

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

F = torch.nn.functional
PATHS = ("eager", "fused", "compiled")


def run_on(path, fn, device):
    """fn(device) on `path` (CPU runs it plainly)."""
    if device == "cpu" or path == "eager":
        return fn(device)
    if path == "fused":
        with torch_tpu.fused():
            return fn(device)
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu")(device)


def assert_error_like_cpu(fn, path="eager"):
    """fn raises on tpu (on `path`) CPU's exception type with CPU's text."""
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(Exception) as tpu:
        run_on(path, fn, "tpu")
    assert type(tpu.value) is type(cpu.value), (tpu.value, cpu.value)
    # The tpu may name the op after CPU's text, and its kernels after the device
    # ("repeat_interleave_tpu", as runtime.verdict does); CPU's text must be there.
    assert str(cpu.value).splitlines()[0].replace('_cpu"', '_tpu"') in str(tpu.value)


def assert_result_like_cpu(fn, path="eager"):
    want, got = fn("cpu"), run_on(path, fn, "tpu")
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


# -- random_: CPU's argument checks ---------------------------------------------


def _random(dtype, *args):
    return lambda d: torch.empty(20, dtype=dtype, device=d).random_(*args)


RANDOM_ERRORS = {
    "int8 from below the dtype": _random(torch.int8, -129, 42),
    "int8 to above the dtype": _random(torch.int8, 0, 300),
    "int8 to only above the dtype": _random(torch.int8, 300),
    "bool to above": _random(torch.bool, 0, 3),
    "from >= to": _random(torch.float32, 5, 3),
    "to 0": _random(torch.int64, 0),
    "float16 from below the dtype": _random(torch.float16, -2**63, 2**63 - 1),
    "float16 to above the dtype": _random(torch.float16, 70000),
    "bfloat16 from/to equal once cast": _random(torch.bfloat16, 2**24 + 1, 2**24 + 2),
    "complex": _random(torch.complex64, 3),
    "full range int8": _random(torch.int8, -2**63, None),
    "full range float16": _random(torch.float16, -2**63, None),
    "randint int8 low below the dtype":
        lambda d: torch.randint(-129, 3, (4,), dtype=torch.int8, device=d),
    "randint high 0": lambda d: torch.randint(0, (4,), device=d),
}


@pytest.mark.parametrize("case", sorted(RANDOM_ERRORS))
def test_random_argument_errors_match_cpu(case):
    assert_error_like_cpu(RANDOM_ERRORS[case])


@pytest.mark.parametrize("path", PATHS)
def test_random_int8_out_of_range_raises_on_every_path(path):
    def fn(d):
        return torch.empty(2000, dtype=torch.int8, device=d).random_(-129, 42) + 0

    assert_error_like_cpu(fn, path)


def test_random_draws_within_from_to():
    x = torch.empty(2000, dtype=torch.int8, device="tpu").random_(-128, 42).cpu()
    assert x.min() >= -128 and x.max() < 42
    # Floats: the ends CPU casts to the dtype (update_from/update_to), and CPU's
    # warning at each call (also where the program comes from the cache).
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            y = torch.empty(500, dtype=torch.bfloat16, device="tpu").random_(0, 1000).cpu()
            assert y.min() >= 0 and y.max() < 1000
    texts = [str(w.message) for w in record if "out of bounds" in str(w.message)]
    assert len(texts) == 2 and texts[0].startswith(
        "to - 1 is out of bounds [-(2^8), 2^8]. Due to precision limitations c10::BFloat16")


# -- repeat_interleave: negative repeats, at the op -----------------------------


REPEAT_ERRORS = {
    "negative": lambda d: torch.repeat_interleave(torch.tensor([1, 2, -1, 3, 4], device=d)),
    "negative int32": lambda d: torch.repeat_interleave(
        torch.tensor([1, -2], dtype=torch.int32, device=d)),
    "negative, self and repeats": lambda d: torch.ones(3, device=d).repeat_interleave(
        torch.tensor([1, -2, 3], device=d), dim=0),
    "0-dim repeats": lambda d: torch.repeat_interleave(torch.tensor(3, device=d)),
    "int16 repeats": lambda d: torch.repeat_interleave(
        torch.tensor([1, 2], dtype=torch.int16, device=d)),
}


@pytest.mark.parametrize("case", sorted(REPEAT_ERRORS))
def test_repeat_interleave_errors_match_cpu(case):
    assert_error_like_cpu(REPEAT_ERRORS[case])


@pytest.mark.parametrize("path", PATHS)
def test_repeat_interleave_negative_raises_at_the_op_on_every_path(path):
    reached = []

    def fn(d):
        out = torch.repeat_interleave(torch.tensor([1, 2, -1, 3, 4], device=d))
        reached.append(d)  # not reached: the op raises, not a later read
        return out

    assert_error_like_cpu(fn, path)
    assert reached == []


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("repeats", [[1, 3], [1, -2]])
def test_repeat_interleave_output_size_mismatch_raises_at_the_next_read(repeats, path):
    """A device-side assert: CPU's error, at the read after the op."""
    with pytest.raises(RuntimeError, match="^allocated size does not match required size"):
        torch.repeat_interleave(torch.tensor(repeats), output_size=3)

    def fn(d):
        return torch.repeat_interleave(torch.tensor(repeats, device=d), output_size=3)

    out = run_on(path, fn, "tpu")  # no error yet: nothing was read
    with pytest.raises(RuntimeError, match="^allocated size does not match required size "
                                           r"\(aten.repeat_interleave.Tensor\) \(a device-side"):
        out.cpu()


def test_repeat_interleave_of_no_repeats_ignores_output_size_as_cpu():
    assert_result_like_cpu(lambda d: torch.repeat_interleave(
        torch.tensor([], dtype=torch.long, device=d), output_size=3))
    assert_result_like_cpu(lambda d: torch.repeat_interleave(
        torch.tensor([2, 0, 1], device=d), output_size=3))


def test_repeat_interleave_values():
    assert_result_like_cpu(lambda d: torch.repeat_interleave(torch.tensor([1, 0, 3], device=d)))


# -- convolution of zero-size inputs ---------------------------------------------


CONV_EMPTY = {
    "grouped, no input channels": ((2, 0, 5), (12, 0, 1), 3, False, False),
    "grouped, no batch, no channels": ((0, 0, 5), (12, 0, 1), 3, False, False),
    "no input channels, bias": ((2, 0, 5), (12, 0, 3), 1, True, False),
    "unbatched, no channels": ((0, 5), (12, 0, 1), 1, True, False),
    "no batch, groups": ((0, 4, 5, 5), (4, 2, 3, 3), 2, True, False),
    "transposed, no batch": ((0, 2, 5), (2, 4, 3), 1, True, True),
}


def _conv(case):
    xs, ws, groups, bias, transposed = CONV_EMPTY[case]
    nd = len(ws) - 2
    conv = getattr(F, f"conv_transpose{nd}d" if transposed else f"conv{nd}d")

    def fn(d, grad=False):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(xs, generator=g).to(d).requires_grad_(grad)
        w = torch.randn(ws, generator=g).to(d).requires_grad_(grad)
        b = torch.randn(ws[1] * groups if transposed else ws[0], generator=g).to(d) \
            .requires_grad_(grad) if bias else None
        y = conv(x, w, b, groups=groups, padding=1 if nd == 1 and ws[-1] == 3 else 0)
        if not grad:
            return y
        (y.sum() + 1).backward()
        return y, x.grad, w.grad, None if b is None else b.grad

    return fn


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(CONV_EMPTY))
def test_convolution_of_empty_inputs_matches_cpu(case, path):
    assert_result_like_cpu(_conv(case), path)


@pytest.mark.parametrize("case", sorted(CONV_EMPTY))
def test_convolution_gradients_of_empty_inputs_match_cpu(case):
    fn = _conv(case)
    for want, got in zip(fn("cpu", True), fn("tpu", True), strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


CONV_ERRORS = {
    "no output channels": lambda d: F.conv2d(torch.ones(2, 3, 5, 5, device=d),
                                             torch.ones(0, 3, 3, 3, device=d)),
    "transposed, no input channels": lambda d: F.conv_transpose1d(
        torch.ones(2, 0, 5, device=d), torch.ones(0, 4, 3, device=d), groups=2),
    "weight not divisible by groups": lambda d: F.conv1d(
        torch.ones(2, 4, 5, device=d), torch.ones(3, 2, 1, device=d), groups=2),
}


@pytest.mark.parametrize("case", sorted(CONV_ERRORS))
def test_convolution_weight_errors_match_cpu(case):
    assert_error_like_cpu(CONV_ERRORS[case])


# -- error texts of torch.complex / polar and new_empty_strided -------------------


TEXT_ERRORS = {
    "complex mixed float dtypes": lambda d: torch.complex(
        torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
    "complex float and half": lambda d: torch.complex(
        torch.ones(2, device=d), torch.ones(2, dtype=torch.float16, device=d)),
    "polar mixed float dtypes": lambda d: torch.polar(
        torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
    "complex out of a real dtype": lambda d: torch.complex(
        torch.ones(2, device=d), torch.ones(2, device=d), out=torch.empty(2, device=d)),
    "new_empty_strided: fewer strides": lambda d: torch.ones(2, device=d).new_empty_strided(
        (2, 3), (1,)),
    "empty_strided: fewer strides": lambda d: torch.empty_strided((2, 3), (1,), device=d),
    "empty_strided: negative stride": lambda d: torch.empty_strided((2, 3), (-1, 1),
                                                                    device=d),
}


@pytest.mark.parametrize("case", sorted(TEXT_ERRORS))
def test_error_texts_match_cpu(case):
    assert_error_like_cpu(TEXT_ERRORS[case])


def test_a_negative_stride_of_a_size_one_or_empty_dimension_is_accepted_as_on_cpu():
    for size in ((1, 3), (0, 3)):
        t = torch.empty_strided(size, (-1, 1), device="tpu")
        c = torch.empty_strided(size, (-1, 1))
        assert t.shape == c.shape and t.stride() == c.stride()


# -- a result too big for the device: torch.OutOfMemoryError ----------------------

_A, _B = (2**18, 1), (1, 2**18)  # their product: 256 GiB of float32
TOO_BIG = {
    "matmul": lambda a, b: a @ b,
    "mm": torch.mm,
    "bmm": lambda a, b: torch.bmm(a[None], b[None]),
    "addmm": lambda a, b: torch.addmm(torch.zeros((), device=a.device), a, b),
    "mul": torch.mul,
}


@pytest.mark.parametrize("op", sorted(TOO_BIG))
def test_a_result_too_big_for_the_device_raises_out_of_memory(op):
    a, b = torch.ones(_A, device="tpu"), torch.ones(_B, device="tpu")
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory .*256.00 GiB"):
        TOO_BIG[op](a, b)


def test_a_matmul_too_big_for_the_device_raises_out_of_memory_in_fused_mode():
    a, b = torch.ones(_A, device="tpu"), torch.ones(_B, device="tpu")
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory"):
        with torch_tpu.fused():
            (a @ b).sum().item()


# -- a compiled tensor constant: no "please report this", saved and loaded --------


def test_a_graph_holding_a_tpu_constant_pickles_it_as_a_host_copy():
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler

    from torch_tpu.compile.persist import _output_code as oc

    class WithConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.tensor([1.0, 2.0, 3.0], device="tpu")

        def forward(self, x):
            return x * self.c

    gm = torch.fx.symbolic_trace(WithConstant())
    back = GraphPickler.loads(oc._pickler().dumps(gm), FakeTensorMode())
    assert back.c.device.type == "tpu" and type(back.c) is torch.Tensor
    assert back.c.cpu().tolist() == [1.0, 2.0, 3.0]


_CONSTANT_CHILD = textwrap.dedent("""
    import json
    import torch, torch_tpu
    from torch_tpu.compile.persist import artifacts

    def add_constant(x):
        return x * torch.tensor([1.0, 2.0, 3.0], device=x.device) + 1

    out = torch.compile(add_constant, backend="tpu")(torch.ones(3, device="tpu"))
    print(json.dumps({"out": out.cpu().tolist(), "stats": artifacts.stats()}))
""")


def _run_child(cache_dir):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir))
    env.pop("TORCH_TPU_PRECOMPILE", None)  # on by default
    out = subprocess.run([sys.executable, "-c", _CONSTANT_CHILD], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_compiled_tensor_constant_is_saved_without_a_warning_cold_then_warm(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cold, cold_err = _run_child(cache)
    warm, warm_err = _run_child(cache)
    for err in (cold_err, warm_err):
        assert "please report this" not in err and "unable to serialize" not in err, err
    assert cold["out"] == warm["out"] == [2.0, 3.0, 4.0]
    assert cold["stats"]["hits"] == 0
    assert warm["stats"]["hits"] == 1, warm  # the graph was saved, and loaded


# -- 0-size operands: softmax as CPU; the meta kernels' dtype checks kept ----------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_softmax_of_an_empty_integer_or_complex_tensor_returns_it_as_cpu(dtype, path):
    assert_result_like_cpu(lambda d: torch.softmax(torch.ones(2, 0, dtype=dtype, device=d), 1),
                           path)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_of_a_long_tensor_raises_cpus_error(fn, dim):
    assert_error_like_cpu(lambda d: getattr(torch, fn)(
        torch.ones(2, 3, dtype=torch.long, device=d), dim))


@pytest.mark.parametrize("path", PATHS)
def test_empty_mixed_dtype_bmm_keeps_the_meta_kernels_check(path):
    """Documented difference (docs/troubleshooting.md, "Errors that differ from the
    CPU"): eager CPU returns an empty long tensor; the meta kernel, which
    torch.compile uses on the CPU too, raises, and tpu does on every path."""
    def fn(d):
        return torch.ones(3, 0, 3, dtype=torch.bool, device=d) @ \
            torch.ones(3, 3, 2, dtype=torch.long, device=d)

    assert fn("cpu").shape == (3, 0, 2)
    with pytest.raises(RuntimeError, match="expected scalar type torch.bool but found "
                                           "torch.int64"):
        run_on(path, fn, "tpu")


def test_empty_bool_log_softmax_keeps_the_meta_kernels_check():
    """Documented difference, as above: PyTorch's log_softmax meta kernel rejects bool."""
    def fn(d):
        return torch.log_softmax(torch.ones(0, dtype=torch.bool, device=d), 0)

    assert fn("cpu").shape == (0,)
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with two bool"):
        fn("tpu")


# -- matrix products of bool tensors: CPU has no kernel (addr and outer it has) --

def _bools(d):
    return (torch.ones(2, 2, dtype=torch.bool, device=d), torch.ones(2, dtype=torch.bool, device=d))


BOOL_PRODUCTS = {
    "dot": lambda d: (lambda m, v: v @ v)(*_bools(d)),
    "vdot": lambda d: (lambda m, v: torch.vdot(v, v))(*_bools(d)),
    "mm": lambda d: (lambda m, v: m @ m)(*_bools(d)),
    "mv": lambda d: (lambda m, v: m @ v)(*_bools(d)),
    "bmm": lambda d: (lambda m, v: m[None] @ m[None])(*_bools(d)),
    "addmm": lambda d: (lambda m, v: torch.addmm(m, m, m))(*_bools(d)),
    "addmv": lambda d: (lambda m, v: torch.addmv(v, m, v))(*_bools(d)),
    "baddbmm": lambda d: (lambda m, v: torch.baddbmm(m[None], m[None], m[None]))(*_bools(d)),
    "addbmm": lambda d: (lambda m, v: torch.addbmm(m, m[None], m[None]))(*_bools(d)),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", sorted(BOOL_PRODUCTS))
def test_bool_matrix_products_raise_as_cpu(op, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the compiled graph's op-by-op notice
        assert_error_like_cpu(BOOL_PRODUCTS[op], path)


EMPTY_BOOL_PRODUCTS = {
    "mm K=0": lambda d: torch.ones(2, 0, dtype=torch.bool, device=d)
    @ torch.ones(0, 3, dtype=torch.bool, device=d),
    "mv M=0": lambda d: torch.ones(0, 2, dtype=torch.bool, device=d)
    @ torch.ones(2, dtype=torch.bool, device=d),
    "bmm of no batch": lambda d: torch.ones(1, 0, 1, 1, dtype=torch.bool, device=d)
    @ torch.ones(1, 0, 1, 1, dtype=torch.bool, device=d).mT,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(EMPTY_BOOL_PRODUCTS))
def test_empty_bool_matrix_products_compute_as_cpu(case, path):
    """CPU returns before it picks a kernel when there is nothing to multiply."""
    assert_result_like_cpu(EMPTY_BOOL_PRODUCTS[case], path)


@pytest.mark.parametrize("path", PATHS)
def test_a_float_bool_product_reports_the_dtype_mismatch_first(path):
    assert_error_like_cpu(lambda d: torch.ones(2, 2, device=d)
                          @ torch.ones(2, 2, dtype=torch.bool, device=d), path)


@pytest.mark.parametrize("path", PATHS)
def test_bool_outer_products_compute_as_cpu(path):
    assert_result_like_cpu(lambda d: (lambda m, v: torch.addr(m, v, v))(*_bools(d)), path)
    assert_result_like_cpu(lambda d: (lambda m, v: torch.outer(v, v))(*_bools(d)), path)
