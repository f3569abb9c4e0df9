"""DLPack for `tpu` tensors, as PyTorch gives it to a PrivateUse1 device.

PyTorch's `Tensor.__dlpack_device__` names a PrivateUse1 device kDLExtDev only
while the backend is called "privateuse1"; renamed to `tpu` it raises
"Unknown device type tpu for Dlpack". Here a `tpu` tensor reports
(kDLExtDev, index), and every export of one (`__dlpack__`, `to_dlpack`) is
noted, so that the tensor PyTorch's importer makes from it shares its storage
(runtime.storage.adopt_imported): `torch.from_dlpack(t)` and
`torch.asarray(torch.utils.dlpack.to_dlpack(t))` alias `t`, as on CPU and CUDA.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.dlpack as _dl

from .._compat import Patch, apply
from ..runtime import storage

_KDL_EXT_DEV = 12
FEATURE = "DLPack for tpu tensors"
_WHY = ("PyTorch names a PrivateUse1 DLPack device only while the backend is called "
        "privateuse1, and has no hook to note an export")


def _device(original):
    def __dlpack_device__(self: torch.Tensor) -> Any:
        if self.device.type == "tpu":
            return (_dl.DLDeviceType(_KDL_EXT_DEV), self.device.index or 0)
        return original(self)

    return __dlpack_device__


def _export(original):
    def __dlpack__(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.device.type == "tpu":
            storage.note_exported(self)
        return original(self, *args, **kwargs)

    return __dlpack__


def _to_dlpack(original):
    def to_dlpack(tensor: torch.Tensor) -> Any:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
            storage.note_exported(tensor)
        return original(tensor)

    return to_dlpack


def patches() -> dict:
    return {FEATURE: [Patch("torch:Tensor.__dlpack_device__", FEATURE, _WHY, _device),
                      Patch("torch:Tensor.__dlpack__", FEATURE, _WHY, _export),
                      Patch("torch.utils.dlpack:to_dlpack", FEATURE, _WHY, _to_dlpack),
                      Patch("torch:to_dlpack", FEATURE, _WHY, _to_dlpack)]}


def install() -> None:
    """Put the four in place (idempotent)."""
    apply(FEATURE, patches()[FEATURE])
