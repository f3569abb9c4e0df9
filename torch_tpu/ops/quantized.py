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

import torch

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
