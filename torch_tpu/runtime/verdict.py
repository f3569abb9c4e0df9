"""CPU's verdict on an op call that fails or casts: PyTorch's own error text.

The executor takes shapes, dtypes and argument checks from PyTorch's meta
kernels. For many ops those are Python references (`torch._refs`) whose
checks differ from the CPU kernels users see: `int_tensor.add_(1.5)` says
"Promotion of int.add/sub_(float) in in-place ops are not possible" where CPU
says "result type Float can't be cast to the desired output type Int";
`add(x, x, alpha=1.1)` raises ValueError where CPU raises RuntimeError;
`neg(x, out=double)` passes on meta and fails on CPU. Scripts and PyTorch's
tests match these types and messages.

So on the rare paths where an op call is about to fail, or writes a result
into a tensor of another dtype (an in-place op or `out=` whose dtype differs
from the op's result dtype), the executor asks CPU: it runs the same op on a
host copy of the arguments and reports the exception CPU raises, or None
when CPU accepts the call. This happens only when an executable is built
(the cache key holds every dtype and shape, so later calls with the same
signature never get here), and only for arguments small enough to copy
(`MAX_ELEMENTS`); larger calls keep the meta kernel's verdict.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

# Host copies are made only up to this many elements over all tensor arguments.
MAX_ELEMENTS = 1 << 20


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu":
        return t.detach().clone()
    if t.device.type == "meta":
        return torch.zeros(tuple(t.shape), dtype=t.dtype)
    return t.detach().cpu()


def _on_cpu(x):
    if isinstance(x, torch.Tensor):
        return _host_copy(x)
    if isinstance(x, torch.device) and x.type != "cpu":
        return torch.device("cpu")
    if isinstance(x, torch.Generator):
        return None
    return x


def _numel(args: Any, kwargs: Any) -> int:
    return sum(t.numel() for t in pytree.tree_leaves((args, kwargs))
               if isinstance(t, torch.Tensor))


# cpu_error's answer when CPU cannot be asked (see there).
NO_VERDICT = object()


def cpu_error(op, args, kwargs):
    """The exception CPU raises for `op(*args, **kwargs)`; None when CPU
    accepts the call; NO_VERDICT when the arguments are too large to copy, a
    tensor is not a plain strided tensor, or CPU has no kernel for the op.
    """
    leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if any(t.layout != torch.strided or t.is_quantized for t in leaves):
        return NO_VERDICT
    if _numel(args, kwargs) > MAX_ELEMENTS:
        return NO_VERDICT
    try:
        cargs = pytree.tree_map(_on_cpu, list(args))
        ckwargs = pytree.tree_map(_on_cpu, dict(kwargs))
    except Exception:  # noqa: BLE001 - no host copy, no verdict
        return NO_VERDICT
    try:
        with torch.no_grad():
            op(*cargs, **ckwargs)
    except NotImplementedError as e:
        if "Could not run" in str(e):  # no CPU kernel: no verdict
            return NO_VERDICT
        return e
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        return e
    return None


def as_op_error(e: BaseException, op: object) -> BaseException:
    """`e` (CPU's exception) with the op named after CPU's text (scripts and
    tests match CPU's messages from their start), CPU's kernel names
    ("lt_cpu") given the device's."""
    msg = str(e).replace('_cpu"', '_tpu"')
    name = str(op)
    if name not in msg:
        msg = f"{msg} ({name})"
    try:
        return type(e)(msg)
    except Exception:  # noqa: BLE001 - an exception type with another signature
        return e
