"""Print `tpu` tensors from one host copy, as PyTorch does for XLA tensors.

`repr` formats a tensor with many small tensor ops (abs, min, max, masking).
On `tpu` each would be a device op, and a new shape a new compile, so the
formatter gets a CPU copy instead: one transfer, no compiles. The suffix
(`device='tpu:0'`, `grad_fn=...`) is computed from the original tensor.
"""

from __future__ import annotations

import torch
import torch._tensor_str as _ts

_original = _ts._tensor_str


def _tensor_str(self, indent):
    if self.device.type == "tpu":
        with torch.no_grad():
            self = self.detach().to("cpu")
    return _original(self, indent)


def install() -> None:
    if _ts._tensor_str is not _tensor_str:
        _ts._tensor_str = _tensor_str
