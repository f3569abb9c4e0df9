"""The one way to make a PrivateUse1 tensor on a device other than index 0.

PyTorch's Python backend API creates tensors on `tpu:0` only, and refuses to
move a tensor to a storage of another device. DLPack's "extension device"
(kDLExtDev) maps to PrivateUse1 with the producer's device index, so an empty
DLPack tensor yields the first tensor on `tpu:i`; every other tensor on that
device aliases it (see storage._seed) and then gets its own storage.
"""

from __future__ import annotations

import ctypes
import functools
import weakref

import torch

_KDL_EXT_DEV = 12
_KDL_FLOAT = 2


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


# The structs must outlive the tensors made from them; there is one per device.
_keep: list = []

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def empty_on_device(index: int) -> torch.Tensor:
    """An empty float32 PrivateUse1 tensor on device `index`."""
    shape = (ctypes.c_int64 * 1)(0)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(None, _DLDevice(_KDL_EXT_DEV, index), 1,
                                  _DLDataType(_KDL_FLOAT, 32, 1), shape, None, 0)
    managed.deleter = None
    _keep.append((managed, shape))
    capsule = _capsule_new(ctypes.addressof(managed), b"dltensor", None)
    t = torch.utils.dlpack.from_dlpack(capsule)
    if t.device != torch.device(torch._C._get_privateuse1_backend_name(), index):
        raise RuntimeError(f"could not create a tensor on tpu:{index} (got {t.device})")
    return t


# -- tpu tensors through DLPack -------------------------------------------------------
#
# A tpu tensor exports as PyTorch exports a PrivateUse1 tensor: a kDLExtDev
# capsule whose data pointer is its storage's (virtual) address; PyTorch's
# importer (`torch.from_dlpack`, `torch.asarray(capsule)`) then makes a tpu
# tensor with a storage of its own at that address, which holds no value.
# torch_tpu notes each exported storage (device.dlpack), and the first time an
# imported tensor is used (`adopt`), points it at the exported storage: the two
# tensors then share one storage, and writes through either are seen by both.

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset._handle
# storage address -> (bytes, weak reference to the exported storage object)
_EXPORTED: dict[int, tuple[int, weakref.ref]] = {}


def exported(t: torch.Tensor) -> None:
    """Note tpu tensor `t`'s storage as exported through DLPack."""
    exported_storage(t.untyped_storage())


def exported_storage(s: torch.UntypedStorage) -> None:
    """Note tpu storage `s` as reachable by its address: PyTorch's C++ code that
    makes a tensor from a data pointer (DLPack's importer, the storage reads and
    writes of `pickle` and legacy `torch.save`/`torch.load`) then gets `s`
    (`adopt`). The note goes with the storage."""
    if hasattr(s, "_tpu"):
        addr = s.data_ptr()
        _EXPORTED[addr] = (s.nbytes(), weakref.ref(s, functools.partial(_forget, addr)))


def _forget(addr: int, ref: weakref.ref) -> None:
    """Drop the note of a storage that died (unless another replaced it)."""
    entry = _EXPORTED.get(addr)
    if entry is not None and entry[1] is ref:
        del _EXPORTED[addr]


def adopt(t: torch.Tensor) -> bool:
    """Point tpu tensor `t`, imported through DLPack from an exported tpu
    tensor, at that tensor's storage (same sizes, strides and elements).
    False when `t`'s memory is no exported storage's."""
    addr = t.untyped_storage().data_ptr()
    for base, (nbytes, ref) in list(_EXPORTED.items()):
        src = ref()
        if src is None:
            del _EXPORTED[base]
            continue
        delta = addr - base
        if 0 <= delta < max(nbytes, 1) and delta % t.element_size() == 0:
            _set_storage.redispatch_boxed(_CPU_KEYS, t, src,
                                          t.storage_offset() + delta // t.element_size(),
                                          tuple(t.shape), tuple(t.stride()))
            return True
    return False
