"""Print `tpu` tensors from one host copy, as PyTorch does for XLA tensors.

`repr` formats a tensor with many small tensor ops (abs, min, max, masking).
On `tpu` each would be a device op, and a new shape a new compile, so the
formatter gets a CPU copy instead: one transfer, no compiles. The suffix
(`device='tpu:0'`, `grad_fn=...`) is computed from the original tensor.
Installed when the backend loads (the first `tpu` tensor): a process that
never makes one prints with PyTorch's formatter untouched.
"""

from __future__ import annotations

import torch

from .._compat import Patch, apply

FEATURE = "printing tpu tensors from one host copy"


def _formatter(original):
    def _tensor_str(self, indent):
        if self.device.type == "tpu":
            with torch.no_grad():
                self = self.detach().to("cpu")
        return original(self, indent)

    return _tensor_str


def patches() -> dict:
    return {FEATURE: [Patch("torch._tensor_str:_tensor_str", FEATURE,
                            "PyTorch has no per-device hook for its tensor formatter", _formatter)]}


def install() -> None:
    apply(FEATURE, patches()[FEATURE])
