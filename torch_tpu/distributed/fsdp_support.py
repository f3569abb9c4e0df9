"""What FSDP2 (`torch.distributed.fsdp.fully_shard`) needs from the tpu device.

FSDP2's collectives (all_gather_into_tensor, reduce_scatter_tensor) and its
copy ops (`torch.ops.fsdp.*`, which have PrivateUse1 kernels made of ATen
ops) run on tpu as they are, and its streams and events are the device
module's (`torch.tpu.Stream.record_event/wait_event`, `torch.tpu.Event`).
One facility it uses is missing from the device:

- `UntypedStorage.resize_` on a tpu storage: FSDP2 frees the unsharded
  parameters after forward / backward with `storage.resize_(0)` and
  re-allocates them with `storage.resize_(nbytes)`. A tpu storage's size is
  fixed when it is created (the C++ hook PyTorch calls for PrivateUse1
  storages, `resizePrivateUse1Bytes`, cannot be provided from Python), so
  `resize_(0)` keeps the buffer: the results are exact, but the unsharded
  parameters stay allocated between uses (gradients and optimizer state
  are sharded as usual). Any other size change raises.

`install()` adds what is missing (it never replaces what the device module
already provides); `create()` of the "tpu" process group calls it.
"""

from __future__ import annotations

from .._compat import Patch, apply

FEATURE = "storage.resize_ for FSDP2 on tpu"


def _resizer(original):
    def _resize_(self, size):
        if self.device.type != "tpu":
            return original(self, size)
        size = int(size)
        if size == 0 or size == self.nbytes():
            # resize_(0): the buffer is kept (see the module docstring).
            return self
        raise RuntimeError(
            f"resizing a tpu storage from {self.nbytes()} to {size} bytes is not supported "
            "(only resize_(0), which keeps the buffer, and resize_ to the current size)")

    return _resize_


def patches() -> dict:
    return {FEATURE: [Patch("torch:UntypedStorage.resize_", FEATURE,
                            "the C++ hook PyTorch calls to resize a PrivateUse1 storage "
                            "(resizePrivateUse1Bytes) cannot be provided from Python",
                            _resizer)]}


def install() -> None:
    """Give tpu storages the `resize_` FSDP2 uses (idempotent)."""
    apply(FEATURE, patches()[FEATURE])
