"""ops/opmath.py: half-precision lowering arguments arrive in float32."""

import jax.numpy as jnp
import numpy as np
import pytest

from torch_tpu.ops.opmath import is_half, opmath, opmath_dtype, upcast

BF16 = jnp.ones(2, jnp.bfloat16)
F16 = jnp.ones(2, jnp.float16)
I32 = jnp.ones(2, jnp.int32)
F64 = np.ones(2, np.float64)


def test_dtype_helpers():
    assert is_half(jnp.bfloat16) and is_half(np.float16) and not is_half(jnp.float32)
    assert opmath_dtype(jnp.bfloat16) == jnp.float32
    assert opmath_dtype(F16.dtype) == jnp.float32
    assert opmath_dtype(np.float64) == np.float64
    assert opmath_dtype(jnp.int32) == jnp.int32


def test_upcast_values():
    assert upcast(BF16).dtype == jnp.float32
    assert upcast(I32) is I32 and upcast(F64) is F64
    assert upcast(None) is None and upcast(1.5) == 1.5
    lst = upcast([BF16, I32])
    assert isinstance(lst, list) and [a.dtype for a in lst] == [jnp.float32, jnp.int32]
    assert isinstance(upcast((F16,)), tuple)


def test_decorator_all_arguments():
    @opmath
    def f(a, b=None, *, c=None):
        return a.dtype, None if b is None else b.dtype, c

    assert f(BF16) == (jnp.float32, None, None)
    assert f(I32, F16, c=2) == (jnp.int32, jnp.float32, 2)
    assert f(a=F64, b=BF16) == (np.float64, jnp.float32, None)
    assert f.__name__ == "f"


def test_decorator_named_arguments_positional_or_keyword():
    @opmath("b")
    def g(a, b, c=3):
        return a.dtype, b.dtype, c

    assert g(BF16, F16) == (jnp.bfloat16, jnp.float32, 3)
    assert g(BF16, b=F16, c=1) == (jnp.bfloat16, jnp.float32, 1)
    assert g(a=F16, b=I32) == (jnp.float16, jnp.int32, 3)


def test_decorator_rejects_unknown_names():
    with pytest.raises(TypeError, match="no parameter"):
        opmath("weight")(lambda self: self)
    with pytest.raises(TypeError, match="strings"):
        opmath("self", 3)
