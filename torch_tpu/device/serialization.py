"""torch.save / torch.load of `tpu` tensors, and `storage.tpu()`.

PyTorch moves a loaded CPU storage to a device by allocating a storage there
(`torch.UntypedStorage(n, device=...)`) and copying into it. A Python backend
has no C++ allocator for that, so `tpu` registers its own deserializer (ahead
of the generic one) and `UntypedStorage.tpu()`: the bytes go to the device as
one uint8 array, and the first typed tensor set onto the storage retypes it
(see ops.core.set_storage_offset).

`pickle` and the legacy `torch.save` format read and write a storage's bytes
in C++ through a tensor made at the storage's address, which holds no device
data; every storage the tagger or deserializer sees is therefore noted as
reachable by its address (runtime._dlpack.exported_storage), as DLPack's
exports are.
"""

from __future__ import annotations

import re

import torch

from .._compat import Patch, apply
from ..device import module

_TPU_LOCATION = re.compile(r"^tpu(:\d+)?$")


def storage_to_tpu(storage, device=None):
    """A tpu storage with the bytes of CPU (or tpu) `storage`."""
    index = module.index_of(device)
    if storage.device.type == "tpu":
        if storage.device.index == index:
            return storage
        src = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    else:
        src = torch.empty(0, dtype=torch.uint8).set_(storage)
    return src.to(torch.device("tpu", index)).untyped_storage()


def _deserialize(obj, location):
    if isinstance(location, str) and _TPU_LOCATION.match(location):
        device = torch.serialization._validate_device(location, "tpu")
        moved = storage_to_tpu(obj, device)
        _reachable(moved)  # legacy torch.load then reads the file into it by address
        return moved
    return None


def _tag(obj):
    if obj.device.type == "tpu":
        _reachable(obj)  # pickle and legacy torch.save read it by address
        return f"tpu:{obj.device.index}"
    return None


def _reachable(obj) -> None:
    """Let PyTorch's C++ storage reader and writer (`_write_file`,
    `_set_from_file`: a tensor made at the storage's address) find the storage."""
    from ..runtime import storage  # lazy: JAX (tagging runs only for tpu storages)

    untyped = obj._untyped_storage if isinstance(obj, torch.storage.TypedStorage) else obj
    storage.note_exported_storage(untyped)


def _storage_tpu(self, device=None, non_blocking=False):
    return storage_to_tpu(self, device)


FEATURE = "storage.tpu()"


def patches() -> dict:
    return {FEATURE: [Patch("torch.storage:_StorageBase.tpu", FEATURE,
                            "PyTorch's generated storage.tpu() copies through a C++ "
                            "allocator a Python backend does not have",
                            lambda _absent: _storage_tpu)]}


def install() -> None:
    torch.serialization.register_package(19, _tag, _deserialize)
    apply(FEATURE, patches()[FEATURE])
