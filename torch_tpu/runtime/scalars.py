"""Python scalars as program inputs: 64 bits only where the op computes in 64.

An eager op's Python numbers (`x * 0.5`, `add(..., alpha=2)`) and 0-dim CPU
tensors are inputs of its program (runtime.executor's `dyn`), not constants,
so one program serves every value. With JAX's 64-bit types on (PyTorch's
int64 and float64 need them), a Python float would enter as a weak float64:
a TPU has none, and PyTorch computes a float32/bfloat16/float16 op in at most
float32 with its scalars cast to that type. So an entry whose op is not a
64-bit float op takes its floats as weak float32 (complex: complex64) device
scalars, made once per value (`weak32`), which a program traces as Python
scalars still (PyTorch's promotion: ops.elementwise.standin). The executor,
fused mode and the native kernel (csrc/kernel.cpp, FastSpec.narrow) call
`narrow` on an entry's inputs when the entry says so (Entry.narrow).
tests/ops/test_tpu_rules.py walks the OpInfo programs for 64-bit values.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from . import fastpath, platform

_WIDE = (torch.float64, torch.complex128)


def are_narrow(vals: Any, results: Any) -> bool:
    """Whether an op's Python float and complex scalars (and 0-dim CPU
    float64/complex128 tensors) enter its program as float32/complex64.

    A TPU has no 64-bit floating point, and PyTorch computes a float32,
    bfloat16 or float16 op in (at most) float32 with its scalars cast to that
    type, so such a program needs no f64 (tests/ops/test_tpu_rules.py walks them).
    64 bits stay where they are the op's own precision: a float64 or
    complex128 tensor argument or result, or an integral result computed from
    no floating tensor (`full(..., 123456789.0, dtype=torch.int64)` is exact).
    """
    floating_in = False
    for v in vals:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor) and (t.device.type != "cpu" or t.dim() != 0):
                if t.dtype in _WIDE:
                    return False
                floating_in = floating_in or t.dtype.is_floating_point or t.dtype.is_complex
    for m in results:
        if isinstance(m, torch.Tensor):
            if m.dtype in _WIDE:
                return False
            if not floating_in and not (m.dtype.is_floating_point or m.dtype.is_complex
                                        or m.dtype is torch.bool):
                return False
    return True


# (type, value, device index) -> a weak 32-bit scalar array there (bounded, as
# fastpath.SCALARS: a new float per step must not keep a buffer per value)
_WEAK32 = fastpath.ScalarArrays(1024)


def weak32(v: Any, device: int) -> Any:
    """Python float or complex `v` as a weakly typed float32/complex64 scalar
    on tpu:`device`: what JAX makes of a Python number when 64-bit types are
    off, so a program traced with it treats it as a Python scalar (PyTorch's
    promotion, elementwise.standin) in 32 bits. Cached per value. Made by
    `device_put` on the device itself (`lax.full_like` of a placed zero would
    leave it uncommitted on the default device, and a program reading only
    such scalars would run there)."""
    t = type(v)
    key = (t, v, device) if v == v and v != 0 else (t, str(v), device)  # NaN, -0.0
    a = _WEAK32.arrays.get(key)
    if a is None:
        # beyond float32's range is inf, as PyTorch's cast of the scalar: no warning
        with jax.enable_x64(False), np.errstate(over="ignore"):
            a = _WEAK32.put(key, jax.device_put(v, platform.jax_device(device)))
    return a


def narrow(dyn: list, device: int) -> bool:
    """Make `dyn`'s float and complex scalars 32-bit, in place (see
    are_narrow): Python numbers become weak float32/complex64 arrays
    (weak32), 0-dim CPU float64/complex128 tensors float32/complex64 ones, as
    PyTorch's kernels compute with them (in the op's opmath type). Whether
    there were any."""
    found = False
    for i, v in enumerate(dyn):
        tv = type(v)
        if tv is float or tv is complex:
            dyn[i] = weak32(v, device)
        elif tv is np.ndarray and v.dtype in (np.float64, np.complex128):
            dyn[i] = v.astype(np.float32 if v.dtype == np.float64 else np.complex64)
        else:
            continue
        found = True
    return found
