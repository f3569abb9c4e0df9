"""PyTorch module state that torch_tpu sets for a moment, checked like a patch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import Patch, verified

COMPILING = "optimizer steps traced by compile_step"
_TARGETS = {COMPILING: ["torch.compiler:is_compiling"]}


def patches() -> dict:
    """The targets read here, as patches that replace nothing (for the checks' listing)."""
    return {feature: [Patch(t, feature, "read and set for a moment, not replaced", lambda o: o)
                      for t in targets] for feature, targets in _TARGETS.items()}


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """`torch.compiler.is_compiling()` true inside.

    compile_step traces a training step with make_fx, not dynamo; optimizers
    read their step counts without `.item()` only while PyTorch says it is
    compiling, and the flag `is_compiling` reads is the only way to say so.
    """
    import torch.compiler as tc

    if not verified(COMPILING, _TARGETS[COMPILING]):
        yield
        return
    old = tc._is_compiling_flag
    tc._is_compiling_flag = True
    try:
        yield
    finally:
        tc._is_compiling_flag = old
