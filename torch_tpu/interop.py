"""`tpu` tensors and JAX arrays, both ways, without a copy.

A `tpu` tensor's value is a `jax.Array` on the same device, so the two can
share one buffer; DLPack cannot carry it (JAX imports CPU and CUDA capsules
only, and has no DLPack on a TPU at all), hence these two functions:

    a = torch_tpu.to_jax(t)        # the jax.Array holding t's values
    t = torch_tpu.from_jax(a)      # a tpu tensor whose value is `a`

JAX arrays are immutable: a later in-place write to `t` gives its storage a
new array, so an array taken before the write keeps the old values (as a
copy would), and an in-place write never changes an array a JAX program
holds. Sharing is safe under buffer donation too: torch_tpu donates only
buffers nothing else references.
"""

from __future__ import annotations

import jax
import torch

from .runtime import platform, storage


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """The values of `tpu` tensor `tensor` as a `jax.Array` on its device.

    The tensor's own buffer (no copy) when it is a whole contiguous storage,
    as tensors made by ops are; a view (a slice, a transpose) is gathered
    into a new array first, by one program. Pending fused work runs first.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu":
        where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"torch_tpu.to_jax: expected a tpu tensor, got {where}")
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    data = storage.data_of(tensor)
    if storage.layout_of(tensor, data) is not None:  # a view: gathered once
        tensor = tensor.clone(memory_format=torch.contiguous_format)
        data = storage.data_of(tensor)
    return data.array


def from_jax(array: jax.Array) -> torch.Tensor:
    """A `tpu` tensor whose value is `array` (no copy), on `array`'s device.

    `array` must live on one of the devices torch_tpu uses (`tpu:i` is JAX's
    i-th device of the platform, `torch_tpu.runtime.platform`); an array on
    another device or sharded over several is refused: move it with
    `jax.device_put` first.
    """
    if not isinstance(array, jax.Array):
        raise TypeError(f"torch_tpu.from_jax: expected a jax.Array, got {type(array).__name__}")
    devices = array.devices()
    if len(devices) != 1:
        raise ValueError(f"torch_tpu.from_jax: the array is sharded over {len(devices)} "
                         "devices; a tpu tensor holds a single-device array (gather it, or "
                         "use torch.distributed's DTensor)")
    (device,) = devices
    try:
        index = list(platform.devices()).index(device)
    except ValueError:
        raise ValueError(f"torch_tpu.from_jax: the array is on {device}, not a device of "
                         f"torch_tpu's platform ({platform.platform()}); jax.device_put it "
                         "onto one first") from None
    try:
        dtype = storage.torch_dtype(array.dtype)
    except KeyError:
        raise TypeError(f"torch_tpu.from_jax: JAX dtype {array.dtype} has no PyTorch "
                        "counterpart") from None
    return storage.wrap(array, index, dtype, origin="torch_tpu.from_jax")
