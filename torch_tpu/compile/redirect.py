"""`torch.compile(model)` (the default backend, inductor) on `tpu` inputs uses "tpu".

Inductor has no code generator for the tpu device; without this, the default
backend would fail on tpu tensors. Graphs on other devices still go to
inductor. Installed when the backend loads (the first `tpu` tensor), so a
process that never makes one runs PyTorch's inductor wrapper untouched;
``TORCH_TPU_INDUCTOR_REDIRECT=0`` leaves it off. Importing this module loads
neither dynamo nor JAX.
"""

from __future__ import annotations

import functools

import torch

from .._compat import Patch, apply
from ..runtime.switches import switch_on

FEATURE = "torch.compile's default backend on tpu inputs"


def _redirect(original):
    @functools.wraps(original)
    def __call__(self, model_, inputs_):
        if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs_):
            from . import tpu_backend  # lazy: the backend (dynamo is loaded by now)

            return tpu_backend(model_, inputs_)
        return original(self, model_, inputs_)

    return __call__


def patches() -> dict:
    return {FEATURE: [Patch("torch:_TorchCompileInductorWrapper.__call__", FEATURE,
                            "inductor has no tpu code generator and PyTorch has no hook "
                            "choosing a backend by the inputs' device", _redirect)]}


def install() -> None:
    if switch_on("TORCH_TPU_INDUCTOR_REDIRECT"):
        apply(FEATURE, patches()[FEATURE])
