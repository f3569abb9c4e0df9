"""Matmul precision control and bfloat16 autocast for the `tpu` device: the
user-facing module (torch.tpu has the same functions).

    torch.tpu.set_matmul_precision("highest")      # process-wide
    torch.tpu.get_matmul_precision()               # 'highest'
    with torch.tpu.matmul_precision("high"):       # this thread, this block
        y = a @ b

    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = model(x)            # matmuls and convolutions in bfloat16

The precision is runtime state, part of every executable's cache key
(`torch_tpu/runtime/precision.py` says what each setting means and how it
reaches XLA); autocast is PyTorch's AutocastPrivateUse1 dispatch key, filled
with CUDA's op policy (`torch_tpu/device/autocast.py`). This module gathers
both for users and the API reference.
"""

from __future__ import annotations

from .device.autocast import (
    FP32_OPS,
    LOWER_PRECISION_OPS,
    PROMOTE_OPS,
    get_amp_supported_dtype,
    get_autocast_dtype,
    is_autocast_enabled,
    is_bf16_supported,
)
from .runtime.precision import (
    PRECISIONS,
    cache_token,
    get_matmul_precision,
    lax_precision,
    matmul_precision,
    set_matmul_precision,
)

__all__ = ["FP32_OPS", "LOWER_PRECISION_OPS", "PRECISIONS", "PROMOTE_OPS", "cache_token",
           "get_amp_supported_dtype", "get_autocast_dtype", "get_matmul_precision",
           "is_autocast_enabled", "is_bf16_supported", "lax_precision", "matmul_precision",
           "set_matmul_precision"]
