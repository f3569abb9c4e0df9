"""Register PrivateUse1 as the `tpu` device with PyTorch's Python backend API."""

from __future__ import annotations

import torch

from . import module


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return module.is_available()

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


_done = False


def register() -> None:
    """Make `tpu` a PyTorch device (idempotent)."""
    global _done
    if _done:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    if torch._C._get_privateuse1_backend_name() != "tpu":
        _setup_privateuseone_for_python_backend(
            "tpu", backend_module=module, hook=_Hooks(), device_guard=_Guard())
    from . import accelerator, printing, serialization

    accelerator.install()
    printing.install()
    serialization.install()
    _done = True
