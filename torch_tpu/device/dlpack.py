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

from ..runtime import storage

_KDL_EXT_DEV = 12
_original_device = torch.Tensor.__dlpack_device__
_original_export = torch.Tensor.__dlpack__
_original_to_dlpack = _dl.to_dlpack


def _dlpack_device(self: torch.Tensor) -> Any:
    if self.device.type == "tpu":
        return (_dl.DLDeviceType(_KDL_EXT_DEV), self.device.index or 0)
    return _original_device(self)


def _dlpack_export(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if self.device.type == "tpu":
        storage.note_exported(self)
    return _original_export(self, *args, **kwargs)


def _to_dlpack(tensor: torch.Tensor) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
        storage.note_exported(tensor)
    return _original_to_dlpack(tensor)


def install() -> None:
    """Put the three in place (idempotent)."""
    torch.Tensor.__dlpack_device__ = _dlpack_device  # type: ignore[method-assign]
    torch.Tensor.__dlpack__ = _dlpack_export  # type: ignore[method-assign]
    _dl.to_dlpack = _to_dlpack
    torch.to_dlpack = _to_dlpack
