"""Type promotion, out= and in-place casting, and their errors, against CPU.

The tpu device must give CPU's result dtypes (including those that depend on
torch's default dtype, which a program may change between two calls of the
same op), compute out= and in-place results in the op's own result dtype
before casting them (so rounding and integer wrap-around are CPU's), and
refuse the casts CPU refuses with CPU's exception type and message.
"""

import re

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


@pytest.fixture
def default_float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def both(fn):
    """fn("cpu") and fn("tpu"), the tpu result checked to be on tpu."""
    want, got = fn("cpu"), fn("tpu")
    assert got.device.type == "tpu"
    return want, got


def same(fn):
    want, got = both(fn)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def same_error(fn):
    """fn raises on tpu what it raises on CPU: the type, and CPU's text first."""
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(type(cpu.value)) as dev:
        fn("tpu")
    assert type(dev.value) is type(cpu.value)
    assert str(dev.value).startswith(str(cpu.value)), (str(cpu.value), str(dev.value))


def test_default_dtype_changes_between_calls_of_the_same_op(default_float64):
    # The same op and argument types, first under float32 then under float64
    # (the executable cache must not hand back the float32 program), then back.
    def div(d):
        a = torch.tensor([7, -3, 10], device=d)
        return torch.div(a, torch.tensor([2, 5, 4], device=d))

    for default in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(default)
        same(div)
        same(lambda d: torch.tensor([1, 2], dtype=torch.uint8, device=d) + 0.1)
        same(lambda d: torch.tensor([4, 9], device=d).sqrt())
        same(lambda d: torch.ones(3, dtype=torch.int16, device=d) * 1j)
        same(lambda d: torch.true_divide(torch.tensor([True, False], device=d), 3))


def test_complex_and_zero_dim_promotion(default_float64):
    same(lambda d: torch.arange(3, device=d) + torch.tensor(1.5 + 1j, dtype=torch.complex64))
    same(lambda d: torch.ones(2, dtype=torch.complex64, device=d)
         + torch.tensor(2.5, dtype=torch.float64, device=d))
    same(lambda d: torch.ones(2, dtype=torch.float32, device=d) * (2 - 1j))
    same(lambda d: torch.tensor([3, 4], dtype=torch.uint8, device=d)
         + torch.tensor(0.25, dtype=torch.float64, device=d))


def test_out_computes_in_the_result_dtype_then_casts():
    # float16 arithmetic overflows to inf before the cast to the float64 out=,
    # uint8 wraps around, and a float16 quotient is rounded to float16 first.
    def add_half(d):
        h = torch.tensor([40000.0, 1.0], dtype=torch.float16, device=d)
        return torch.add(h, h, out=torch.empty(0, dtype=torch.float64, device=d))

    def sub_u8(d):
        a = torch.tensor([5, 200], dtype=torch.uint8, device=d)
        b = torch.tensor([8, 100], dtype=torch.uint8, device=d)
        return torch.sub(a, b, out=torch.empty(2, dtype=torch.int64, device=d))

    def div_half(d):
        a = torch.tensor([1.5, 2.0], dtype=torch.float16, device=d)
        b = torch.tensor([0.666, 3.0], dtype=torch.float16, device=d)
        return torch.true_divide(a, b, out=torch.empty(2, dtype=torch.float64, device=d))

    for fn in (add_half, sub_u8, div_half):
        same(fn)
    assert torch.isinf(add_half("tpu")[0])


def test_in_place_computes_in_the_result_dtype():
    def mul_(d):
        x = torch.tensor([1000, 3], dtype=torch.int16, device=d)
        x.mul_(torch.tensor([100, 7], dtype=torch.int64, device=d))
        return x

    def add_(d):
        x = torch.tensor([0.1, 0.2], dtype=torch.float32, device=d)
        x.add_(torch.tensor([1e-9, 3.0], dtype=torch.float64, device=d))
        return x

    same(mul_)
    same(add_)


def test_refused_casts_raise_cpus_errors():
    i32 = lambda d: torch.ones(4, dtype=torch.int32, device=d)  # noqa: E731
    f32 = lambda d: torch.ones(4, device=d)  # noqa: E731
    same_error(lambda d: torch.add(f32(d), f32(d), out=torch.empty(4, dtype=torch.long, device=d)))
    same_error(lambda d: i32(d).add_(1.5))
    same_error(lambda d: torch.ones(3, dtype=torch.bool, device=d).add_(
        torch.ones(3, dtype=torch.uint8, device=d)))
    same_error(lambda d: torch.neg(f32(d), out=torch.empty(4, dtype=torch.float64, device=d)))
    same_error(lambda d: torch.floor(torch.ones(2, dtype=torch.int64, device=d),
                                     out=torch.empty(2, dtype=torch.float32, device=d)))
    same_error(lambda d: torch.div(i32(d), i32(d), out=torch.empty(4, dtype=torch.int32,
                                                                     device=d)))
    same_error(lambda d: i32(d).div_(2))
    # and the casts CPU allows are allowed
    same(lambda d: torch.add(f32(d), f32(d), out=torch.empty(4, dtype=torch.float64, device=d)))
    same(lambda d: i32(d).add_(torch.ones(4, dtype=torch.int64, device=d)))


def test_alpha_and_complex_order_errors_are_cpus():
    for dtype in (torch.int32, torch.bool):
        same_error(lambda d: torch.add(torch.ones(3, dtype=dtype, device=d),
                                       torch.ones(3, dtype=dtype, device=d), alpha=1.5))
    same_error(lambda d: torch.sub(torch.ones(3, device=d), torch.ones(3, device=d), alpha=True))
    same_error(lambda d: torch.add(torch.ones(3, device=d), torch.ones(3, device=d), alpha=2j))
    same(lambda d: torch.add(torch.ones(3, dtype=torch.bool, device=d),
                             torch.ones(3, dtype=torch.bool, device=d), alpha=True))
    for dtype in (torch.complex64, torch.complex128):
        for op in (torch.lt, torch.le, torch.gt, torch.ge):
            with pytest.raises(RuntimeError, match=re.escape(f'"{op.__name__}_tpu" not '
                                                             "implemented for")):
                op(torch.ones(2, dtype=dtype, device="tpu"), torch.ones(2, device="tpu"))
        same(lambda d: torch.eq(torch.ones(2, dtype=dtype, device=d), torch.ones(2, device=d)))


def test_jax_rejections_become_cpus_errors():
    # floor of a complex tensor: JAX rejects the dtype while tracing; the user
    # sees CPU's NotImplementedError, not JAX's TypeError.
    same_error(lambda d: torch.floor(torch.ones(2, dtype=torch.complex64, device=d)))
