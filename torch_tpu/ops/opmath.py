"""Half precision computes in float32: PyTorch's "opmath" type, in one place.

PyTorch's CPU kernels load bfloat16 and float16 values, compute in float32
(`at::opmath_type`) and round once when they store the result. A lowering
does the same by taking its half-precision inputs in float32; the executor
(and the graph lowering) then casts each output to the dtype PyTorch's meta
kernel gives, which is the one rounding. So a lowering never casts back.

    @lower(aten.mse_loss.default)
    @opmath
    def mse_loss(self, target, reduction=1):
        ...                      # self, target: float32 if they were halves

`@opmath("self", "weight")` upcasts only the named arguments (by the
lowering's own parameter names), for lowerings that must see some inputs as
they are (integer-valued halves used as indices, a dtype that picks a path).
Inside a body, `upcast(x)` does it for one value and `opmath_dtype(dtype)`
names the type, e.g. for an accumulator.

Like `torch._prims_common.wrappers`, the decorator binds the call to the
function's signature, so positional and keyword calls behave the same.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

import jax.numpy as jnp
import numpy as np

HALF = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))

F = TypeVar("F", bound=Callable[..., Any])


def is_half(dtype: Any) -> bool:
    """Is `dtype` (numpy, jax or a scalar type) bfloat16 or float16?"""
    return np.dtype(dtype) in HALF


def opmath_dtype(dtype: Any) -> Any:
    """The dtype PyTorch's CPU kernels compute `dtype` in: float32 for the
    half types, `dtype` itself otherwise."""
    return jnp.float32 if is_half(dtype) else dtype


def upcast(x: Any) -> Any:
    """`x` in its opmath dtype: a half-precision array as float32; lists and
    tuples element by element; anything else (None, Python numbers, integer
    or float32 arrays) as it is."""
    if isinstance(x, (list, tuple)):
        return type(x)(upcast(v) for v in x)
    dtype = getattr(x, "dtype", None)
    if dtype is not None and np.dtype(dtype) in HALF:
        return x.astype(jnp.float32)
    return x


@overload
def opmath(fn: F, /) -> F: ...


@overload
def opmath(*names: str) -> Callable[[F], F]: ...


def opmath(*names: Any) -> Any:
    """Decorate a lowering so its half-precision array arguments (all, or
    those named) arrive in float32; see the module docstring."""
    if len(names) == 1 and callable(names[0]):
        return _wrap(names[0], None)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"opmath: argument names must be strings, got {n!r}")

    def deco(fn: F) -> F:
        return _wrap(fn, tuple(names))

    return deco


def _wrap(fn: F, names: tuple[str, ...] | None) -> F:
    if names is None:
        @functools.wraps(fn)
        def all_args(*args: Any, **kwargs: Any) -> Any:
            return fn(*(upcast(a) for a in args),
                      **{k: upcast(v) for k, v in kwargs.items()})

        return all_args  # type: ignore[return-value]  # same signature as fn

    sig = inspect.signature(fn)
    unknown = [n for n in names if n not in sig.parameters]
    if unknown:
        raise TypeError(f"opmath: {fn.__name__} has no parameter(s) {unknown}")

    @functools.wraps(fn)
    def named(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        for n in names:
            if n in bound.arguments:
                bound.arguments[n] = upcast(bound.arguments[n])
        return fn(*bound.args, **bound.kwargs)

    return named  # type: ignore[return-value]  # same signature as fn
