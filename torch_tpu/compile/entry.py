"""What dynamo loads for ``backend="tpu"`` (the `torch_dynamo_backends` entry point).

Dynamo imports this module when a process first names the "tpu" backend
(`torch.compile(..., backend="tpu")`, `torch._dynamo.optimize("tpu")`), after
resolving the name and before it wraps the function: the moment to prepare
dynamo for tpu compiles (backend.register: the patches the backend needs,
checked by torch_tpu._compat). Nothing imports it otherwise.
"""

from __future__ import annotations

from . import backend as _backend
from . import tpu_backend

_backend.register()

__all__ = ["tpu_backend"]
