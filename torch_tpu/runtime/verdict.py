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

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._compat.torch_api import pytree

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


def _host_args(args: Any, kwargs: Any, limit: int,
               copy: Callable[[Any], Any]) -> tuple[list, dict] | None:
    """Host copies of an op's arguments made by `copy`; None when CPU cannot
    be asked: a tensor that is not plain strided, more than `limit` elements
    in all, or an argument that has no host copy."""
    leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if any(t.layout != torch.strided or t.is_quantized for t in leaves):
        return None
    if sum(t.numel() for t in leaves) > limit:
        return None
    try:
        return pytree.tree_map(copy, list(args)), pytree.tree_map(copy, dict(kwargs))
    except Exception:  # noqa: BLE001 - no host copy, no verdict
        return None


# cpu_error's answer when CPU cannot be asked (see there).
NO_VERDICT = object()


def cpu_error(op, args, kwargs):
    """The exception CPU raises for `op(*args, **kwargs)`; None when CPU
    accepts the call; NO_VERDICT when the arguments are too large to copy, a
    tensor is not a plain strided tensor, or CPU has no kernel for the op.
    """
    host = _host_args(args, kwargs, MAX_ELEMENTS, _on_cpu)
    if host is None:
        return NO_VERDICT
    cargs, ckwargs = host
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


# --------------------------------------------------------------------------
# memory overlap: CPU's verdict on a write into memory an argument shares

OVERLAP_PREFIX = "unsupported operation:"
INTERNAL_OVERLAP_TEXT = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation.")
PARTIAL_OVERLAP_TEXT = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer "
    "to a single memory location. Please clone() the tensor before performing the operation.")
# An aliased host run computes the op on CPU: up to this many elements.
MAX_ALIASED_ELEMENTS = 1 << 24


def _aliased_storage(t: torch.Tensor, data: Any) -> torch.Tensor:
    """A flat CPU byte tensor standing for `data`'s storage: its bytes when the
    value is computed and small, else zeros (the overlap checks come before
    any value is read)."""
    nbytes = t.untyped_storage().nbytes()
    if nbytes > MAX_ALIASED_ELEMENTS * 8:
        raise ValueError("storage too large for a host run")
    raw = data.raw
    if not hasattr(raw, "resolve") and nbytes <= MAX_ELEMENTS:
        host = np.ascontiguousarray(np.asarray(raw)).reshape(-1).view(np.uint8)
        if host.size == nbytes:
            return torch.from_numpy(host.copy())
    return torch.zeros(nbytes, dtype=torch.uint8)


def _aliased_copier() -> Callable[[Any], Any]:
    """A host-copy function under which tpu tensors sharing a storage share
    one CPU storage, with the same sizes, strides and offset."""
    storages: dict[int, torch.Tensor] = {}

    def copy(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.device.type == "cpu" or x.device.type == "meta":
            return _on_cpu(x)
        data = getattr(x.untyped_storage(), "_tpu", None)
        if data is None:
            return _on_cpu(x)
        flat = storages.get(id(data))
        if flat is None:
            flat = storages[id(data)] = _aliased_storage(x, data)
        usable = flat[:flat.numel() - flat.numel() % x.element_size()]
        return usable.view(x.dtype).as_strided(tuple(x.shape), tuple(x.stride()),
                                               x.storage_offset())
    return copy


def _call_quietly(op: Any, args: list, kwargs: dict) -> None:
    """Call `op` through its Python binding (torch.foo or Tensor.foo) where it
    has one: a binding gathers the C++ warnings of its call and issues them
    as Python warnings on return, where the caller's filter drops them. A
    call through torch.ops inside a tpu kernel adds them to the outer call's
    warnings instead, and CPU's warning (index_fill_ on an expanded tensor)
    would be issued twice."""
    name = op._schema.name.split("::")[1]
    binding = getattr(torch, name, None) or getattr(torch.Tensor, name, None)
    if binding is not None:
        try:
            binding(*args, **kwargs)
            return
        except TypeError:
            pass  # another signature: the op itself
    op(*args, **kwargs)


def overlap_error(op: Any, args: Any, kwargs: Any) -> Any:
    """CPU's memory-overlap error for `op(*args, **kwargs)` run on host tensors
    that alias as the tpu arguments do (an expanded tensor written in place,
    an out= tensor sharing memory with an input); None when CPU accepts the
    call or fails for another reason (those checks are the meta kernel's and
    `cpu_error`'s); NO_VERDICT when the call is too large to run on the host.
    """
    host = _host_args(args, kwargs, MAX_ALIASED_ELEMENTS, _aliased_copier())
    if host is None:
        return NO_VERDICT
    cargs, ckwargs = host
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the op's own kernel warned already
            _call_quietly(op, cargs, ckwargs)
    except RuntimeError as e:
        return e if str(e).startswith(OVERLAP_PREFIX) else None
    except Exception:  # noqa: BLE001 - another error: not this check's to report
        return None
    return None
