"""Register PrivateUse1 as the `tpu` device with PyTorch's Python backend API.

This is all the `torch.backends` autoload does in `import torch`: the device
name, `torch.tpu`, the hooks and guard, `torch.accelerator` routing, printing
and serialization, and one cheap boxed fallback for PrivateUse1. No JAX, no
op table, no dynamo. The first op that reaches the device (a factory with
`device="tpu"`, `.to("tpu")`, `torch.tensor(..., device="tpu")`, ...) lands
in that fallback, which loads the backend (`torch_tpu._load()`: JAX, the
lowering table, every kernel) and dispatches the op again, now to its real
kernel. From then on the fallback hands ops without a kernel of their own to
the real one (`torch_tpu.ops.fallback.handle`, set by `set_fallback()`).
"""

from __future__ import annotations

import sys
import threading

import torch

from .._compat import torch_api
from ..runtime import loading
from . import accelerator, memory_module, module, serialization


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


# -- the PrivateUse1 fallback ---------------------------------------------------

_handler = None  # the real fallback, set by torch_tpu.ops once the backend is loaded
_fallback_lib = None
_loading = threading.local()


def set_fallback(handler) -> None:
    """Route ops without a tpu kernel to `handler(op, *args, **kwargs)`."""
    global _handler
    _handler = handler


def _fallback(keyset, op, *args, **kwargs):
    handler = _handler
    if handler is not None:
        return handler(op, *args, **kwargs)
    # The first op on the device: load the backend, then dispatch the op again.
    if getattr(_loading, "active", False):
        raise RuntimeError(f"{op}: a tpu op ran while the tpu backend was still loading")
    _loading.active = True
    try:
        loading.load()
    except Exception as e:
        raise RuntimeError(f"{op}: the tpu backend failed to load: {e}") from e
    finally:
        _loading.active = False
    if _handler is None:
        raise RuntimeError(f"{op}: the tpu backend loaded without its fallback kernel")
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
        return op.redispatch(keyset, *args, **kwargs)
    return _handler(op, *args, **kwargs)


_done = False


def register() -> None:
    """Make `tpu` a PyTorch device (idempotent). Imports no JAX."""
    global _done, _fallback_lib
    if _done:
        return
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch_api.setup_privateuseone_for_python_backend(
            "tpu", backend_module=module, hook=_Hooks(), device_guard=_Guard())

    # torch.tpu.memory: torch.cuda.memory's names and the memory history (no JAX)
    module.memory = memory_module  # type: ignore[attr-defined]
    sys.modules.setdefault("torch.tpu.memory", memory_module)
    accelerator.install()
    serialization.install()
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_fallback, "PrivateUse1", with_keyset=True)
    _fallback_lib = lib
    _done = True
