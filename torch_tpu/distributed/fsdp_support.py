"""What FSDP2 (`torch.distributed.fsdp.fully_shard`) needs from the tpu device.

FSDP2's collectives (all_gather_into_tensor, reduce_scatter_tensor) and its
copy ops (`torch.ops.fsdp.*`, which have PrivateUse1 kernels made of ATen
ops) run on tpu as they are. Two device facilities it uses were missing:

- streams and events through the device module (`torch.tpu`, FSDP's
  "device handle"): `Stream.record_event()`, `Stream.wait_event()` and
  `torch.tpu.Event`. A tpu device has one in-order stream (PJRT orders the
  work of a device) and the process group's `Work.wait()` returns only when a
  collective's results are written, so waiting on an event or a stream has
  nothing to do; `Event.synchronize()` waits for the device.
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

import torch

_installed = False


class Event(torch.Event):
    """A tpu event (`torch.tpu.Event`): recorded on the device's one stream."""

    def synchronize(self):
        torch.tpu.synchronize()


def _record_event(self, event=None):
    if event is None:
        event = Event()
    event.record()
    return event


def _wait_event(self, event):
    # One in-order stream per device: work recorded before `event` already
    # precedes everything issued after this call.
    return None


_storage_resize = None


def _resize_(self, size):
    if self.device.type != "tpu":
        return _storage_resize(self, size)
    size = int(size)
    if size == 0 or size == self.nbytes():
        # resize_(0): the buffer is kept (see the module docstring).
        return self
    raise RuntimeError(
        f"resizing a tpu storage from {self.nbytes()} to {size} bytes is not supported "
        "(only resize_(0), which keeps the buffer, and resize_ to the current size)")


def install() -> None:
    """Give the tpu device module and tpu storages what FSDP2 uses (idempotent)."""
    global _installed, _storage_resize
    if _installed:
        return
    from ..device import module

    stream_cls = module.Stream
    if not hasattr(stream_cls, "record_event"):
        stream_cls.record_event = _record_event
    if not hasattr(stream_cls, "wait_event"):
        stream_cls.wait_event = _wait_event
    if not hasattr(module, "Event"):
        module.Event = Event
    if _storage_resize is None:
        _storage_resize = torch.UntypedStorage.resize_
        torch.UntypedStorage.resize_ = _resize_
    _installed = True
