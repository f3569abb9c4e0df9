"""Quantized tensors on `tpu`: refused with one clear `NotImplementedError`.

PyTorch's eager quantized tensors (dtypes qint8, quint8, qint32, quint4x2,
quint2x4, dispatch key Quantized<backend>) carry a quantizer (scale, zero
point, axis) on a C++ `QTensorImpl`, and every op on them needs a kernel of
its own; PyTorch itself deprecates creating them. XLA has no quantized
element types, so the `tpu` device does not take them. Without this module the
attempts failed three different ways (a `TypeError` about the dtype, a C++
"Could not run ... 'Quantizedtpu' backend", a CPU fallback that then could
not build its result). Now each raises `NotImplementedError` naming the op and
quantization:

- the quantizing ops on a dense `tpu` tensor (`torch.quantize_per_tensor(x)`,
  `quantize_per_channel`, `quantize_per_tensor_dynamic`);
- anything that reaches the QuantizedPrivateUse1 key (a quantized CPU tensor
  moved with `.to("tpu")`, `torch._empty_affine_quantized(..., device="tpu")`,
  `torch.empty(..., dtype=torch.qint8, device="tpu")`).

Dequantized (float) tensors, fake quantization (`torch.fake_quantize_*`, the
float ops `torch.ao` QAT inserts) and integer arithmetic are ordinary tensors
and work. See docs/porting.md, "Quantization".
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .registry import lower

aten = torch.ops.aten

QUANTIZED_DTYPES = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2,
                              torch.quint2x4})

# Ops that turn a dense tensor into a quantized one: PrivateUse1 kernels that refuse.
QUANTIZING = (
    aten.quantize_per_tensor.default,
    aten.quantize_per_tensor.tensor_qparams,
    aten.quantize_per_tensor.tensors,
    aten.quantize_per_channel.default,
    aten.quantize_per_tensor_dynamic.default,
)


def unsupported(op) -> NotImplementedError:
    return NotImplementedError(
        f"{op}: quantized tensors are not supported on the tpu device (XLA has no "
        "quantized element types, and PyTorch deprecates eager quantized tensors). "
        "Keep quantized tensors on the CPU, or run the model in float/bfloat16 on tpu; "
        "see docs/porting.md, 'Quantization'.")


def _refuse(op):
    def kernel(*args, **kwargs):
        raise unsupported(op)

    kernel.__name__ = str(op)
    return kernel


def _quantized_fallback(op, *args, **kwargs):
    raise unsupported(op)


_libs = []


def install() -> None:
    """Register the refusing kernels and the QuantizedPrivateUse1 fallback (once)."""
    if _libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    for op in QUANTIZING:
        lib.impl(op, _refuse(op), "PrivateUse1")
    fb = torch.library.Library("_", "IMPL")
    _libs.append(fb)
    fb.fallback(_quantized_fallback, "QuantizedPrivateUse1")


def _fake_quantize(x, scale, zero_point, quant_min: int, quant_max: int):
    """(output, mask) of fake quantization, as PyTorch's CPU kernel computes
    them: q = round-half-even(x * (1/scale)) + zero_point in float32, output
    (clamp(q, min, max) - zero_point) * scale, mask = min <= q <= max (the
    straight-through estimator's gradient mask)."""
    scale = jnp.asarray(scale, jnp.float32)
    zero_point = jnp.asarray(zero_point).astype(jnp.float32)
    inv_scale = jnp.float32(1) / scale
    q = jnp.round(x.astype(jnp.float32) * inv_scale) + zero_point
    out = (jnp.clip(q, quant_min, quant_max) - zero_point) * scale
    mask = (q >= quant_min) & (q <= quant_max)
    return out.astype(x.dtype), mask


@lower(aten.fake_quantize_per_tensor_affine_cachemask.default)
def fake_quantize_per_tensor_affine_cachemask(self, scale, zero_point, quant_min, quant_max):
    return _fake_quantize(self, scale, zero_point, quant_min, quant_max)


@lower(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default)
def fake_quantize_per_tensor_affine_cachemask_tensor_qparams(self, scale, zero_point, enabled,
                                                             quant_min, quant_max):
    """`enabled` (a 1-element tensor, the observer's switch) < 1: the input and an all-true mask."""
    out, mask = _fake_quantize(self, scale.reshape(()), zero_point.reshape(()), quant_min,
                               quant_max)
    on = enabled.reshape(()) >= 1
    return jnp.where(on, out, self), mask | ~on


@lower(aten.fake_quantize_per_channel_affine_cachemask.default)
def fake_quantize_per_channel_affine_cachemask(self, scale, zero_point, axis, quant_min,
                                               quant_max):
    """Per-channel: `scale` and `zero_point` broadcast along `axis`."""
    shape = [1] * self.ndim
    shape[axis] = -1
    return _fake_quantize(self, scale.reshape(shape), zero_point.reshape(shape), quant_min,
                          quant_max)


# PyTorch has no Meta kernels for the fake-quantization ops (the executor runs
# every op on meta tensors first): shapes, and CPU's checks of the arguments.
_META_LIB = torch.library.Library("aten", "IMPL")


def _check_range(quant_min: int, quant_max: int) -> None:
    torch._check(quant_min <= quant_max, lambda: "`quant_min` should be less than or "
                 "        equal to `quant_max`.")  # CPU's text, its spaces included


def _per_tensor_meta(self, scale, zero_point, quant_min, quant_max):
    _check_range(quant_min, quant_max)
    torch._check(quant_min <= zero_point <= quant_max,
                 lambda: "`zero_point` must be between `quant_min` and `quant_max`.")
    return torch.empty_like(self), torch.empty_like(self, dtype=torch.bool)


def _per_tensor_qparams_meta(self, scale, zero_point, enabled, quant_min, quant_max):
    _check_range(quant_min, quant_max)
    return torch.empty_like(self), torch.empty_like(self, dtype=torch.bool)


def _per_channel_meta(self, scale, zero_point, axis, quant_min, quant_max):
    _check_range(quant_min, quant_max)
    torch._check(scale.dim() == 1, lambda: "scale should be a 1-D tensor")
    torch._check(zero_point.dim() == 1, lambda: "zero point should be a 1-D tensor")
    torch._check(scale.numel() == zero_point.numel(),
                 lambda: "scale and zero-point need to have the same dimensions")
    torch._check(0 <= axis < self.dim(), lambda: "`axis` must be between 0 and number of "
                 "dimensions of input")
    torch._check(scale.numel() == self.size(axis), lambda: "dimensions of scale and "
                 "zero-point are not consistent with input tensor")
    return torch.empty_like(self), torch.empty_like(self, dtype=torch.bool)


for _op, _meta in ((aten.fake_quantize_per_tensor_affine_cachemask.default, _per_tensor_meta),
                   (aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default,
                    _per_tensor_qparams_meta),
                   (aten.fake_quantize_per_channel_affine_cachemask.default,
                    _per_channel_meta)):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(_op.name(), "Meta"):
        _META_LIB.impl(_op, _meta, "Meta")
