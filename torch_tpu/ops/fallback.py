"""What runs an op that has no kernel of its own on `tpu`.

In order: a lowering reached indirectly (in-place/out= forms of a lowered
op), PyTorch's own decomposition (`torch._decomp`) into ops we do lower, and
last the CPU: inputs copied to the host, the op run there, results copied
back, with one warning per op and a counter. `TORCH_TPU_CPU_FALLBACK=0`
turns the CPU step into a `NotImplementedError` naming the op.

Sparse tensors travel as their parts (COO: indices and values; CSR/CSC/
BSR/BSC: compressed and plain indices and values, see `ops/sparse.py`); a
result in a layout `tpu` does not have (mkldnn) raises `NotImplementedError`
naming the op and the layout.
"""

from __future__ import annotations

import threading
import warnings

import torch

from .._compat.torch_api import decomposition_table, pytree
from ..runtime import counters
from ..runtime import executor, verdict
from ..runtime.asserts import DeviceIndexError
from ..runtime.switches import switch_on
from . import core

_warned: set = set()
# Ops whose decomposition is wrong or slower than the CPU for eager use.
_NO_DECOMP: set = set()


def cpu_fallback_enabled() -> bool:
    return switch_on("TORCH_TPU_CPU_FALLBACK")


def handle(op, *args, **kwargs):
    """The boxed PrivateUse1 fallback: every op without a registered kernel."""
    runner = executor.runner_for(op)
    if runner is not None:
        return runner(*args, **kwargs)
    decomp = decomposition_table.get(op)
    if decomp is not None and op not in _NO_DECOMP and op not in _active.ops:
        counters.count(f"decomposed.{op}")
        # A decomposition may call back into `op` (in-place <-> functional
        # pairs); the inner call then goes to the CPU instead of recursing.
        _active.ops.add(op)
        try:
            return decomp(*args, **kwargs)
        except _ARGUMENT_ERRORS as e:
            raise _cpu_error(op, args, kwargs, e) from None
        finally:
            _active.ops.discard(op)
    return cpu_fallback(op, *args, **kwargs)


# What a decomposition's argument checks raise; NotImplementedError (a missing
# lowering) and OutOfMemoryError are RuntimeErrors that are not about arguments.
_ARGUMENT_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)


def _cpu_error(op, args, kwargs, e):
    """The error CPU raises for a call whose decomposition (a Python reference, with
    its own words and sometimes types: `torch.complex`'s dtype check names
    torch.float32 where CPU says Float) rejected it: CPU's, where CPU rejects it too."""
    if isinstance(e, (NotImplementedError, torch.OutOfMemoryError, DeviceIndexError)):
        return e
    cpu = verdict.cpu_error(op, args, kwargs)
    return verdict.as_op_error(cpu, op) if isinstance(cpu, BaseException) else e


class _Active(threading.local):
    def __init__(self):
        self.ops = set()


_active = _Active()


def cpu_fallback(op, *args, **kwargs):
    name = str(op)
    if not cpu_fallback_enabled():
        raise NotImplementedError(
            f"The operator '{name}' is not implemented for the tpu device, and the "
            "CPU fallback is disabled (TORCH_TPU_CPU_FALLBACK=0).")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"The operator '{name}' has no tpu lowering: it runs on the CPU (inputs "
            "copied to the host and results back), which is slow. See "
            "torch_tpu.debug.fallback_report().", stacklevel=3)
    counters.fallback(name)

    device = None
    cpu_of = {}

    def dense_to_cpu(x):
        c = torch.empty(tuple(x.shape), dtype=x.dtype)
        core.copy_(c, x)
        return c

    def to_cpu(x):
        nonlocal device
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            device = device or x.device
            if x.layout == torch.sparse_coo:
                c = coo_to_cpu(x, dense_to_cpu)
            elif x.layout in COMPRESSED:
                c = compressed_moved(x, torch.device("cpu"), dense_to_cpu)
            else:
                c = dense_to_cpu(x)
            cpu_of[id(c)] = x
            return c
        if isinstance(x, torch.device) and x.type == "tpu":
            device = device or x
            return torch.device("cpu")
        return x

    cargs, ckwargs = pytree.tree_map(to_cpu, (args, kwargs))
    if any(x.layout != torch.strided for x in cpu_of.values()):
        # Some sparse CPU kernels read their inputs' requires_grad (e.g.
        # _sparse_mm_reduce_impl saves arg indices for its backward only
        # then): the copies keep it. This runs below autograd, so nothing
        # is recorded.
        for c in pytree.tree_leaves((cargs, ckwargs)):
            if (isinstance(c, torch.Tensor) and id(c) in cpu_of
                    and cpu_of[id(c)].requires_grad):
                c.requires_grad_(True)
    out = op(*cargs, **ckwargs)
    # Mutated arguments: copy the CPU result back into the tpu tensor.
    schema = op._schema
    flat_args = _bind(schema, cargs, ckwargs)
    for a, v in zip(schema.arguments, flat_args):
        if a.alias_info and a.alias_info.is_write:
            for c in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(c, torch.Tensor) and id(c) in cpu_of:
                    orig = cpu_of[id(c)]
                    if orig.layout != torch.strided:
                        orig.copy_(c)  # the sparse copy_ (structure, then indices/values)
                        continue
                    if tuple(orig.shape) != tuple(c.shape):
                        orig.resize_(c.shape)
                    core.copy_(orig, c)
    device = device or torch.device("tpu", 0)

    index = device.index or 0

    def dense_back(x):
        return core.new_tensor_like_value(x, x.dtype, index)

    def back(x):
        if isinstance(x, torch.Tensor):
            if id(x) in cpu_of:
                return cpu_of[id(x)]
            if x.layout == torch.sparse_coo:
                return coo_from_cpu(x, torch.device("tpu", index), dense_back)
            if x.layout in COMPRESSED:
                return compressed_moved(x, torch.device("tpu", index), dense_back)
            if x.layout != torch.strided:
                raise NotImplementedError(
                    f"The operator '{name}' returned a tensor with layout {x.layout}, which "
                    "the tpu device does not support.")
            return dense_back(x)
        return x

    return pytree.tree_map(back, out)


def _bind(schema, args, kwargs):
    vals = list(args)
    for a in schema.arguments[len(vals):]:
        vals.append(kwargs.get(a.name, None))
    return vals


aten = torch.ops.aten
COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


# -- the CPU fallback's conversions ------------------------------------------------


def _compressed_parts(x):
    if x.layout in (torch.sparse_csr, torch.sparse_bsr):
        return x.crow_indices(), x.col_indices(), x.values()
    return x.ccol_indices(), x.row_indices(), x.values()


def compressed_moved(x, device, move):
    """A copy on `device` of CSR/CSC/BSR/BSC tensor `x`, its parts moved by `move`."""
    compressed, plain, values = _compressed_parts(x)
    return aten._sparse_compressed_tensor_unsafe.default(
        move(compressed), move(plain), move(values), list(x.shape), dtype=x.dtype,
        layout=x.layout, device=device, pin_memory=False)


def _overlapping_copy(t, copy):
    """copy(t), keeping t's strides where elements share memory (an expanded
    tensor): CPU's sparse kernels choose their algorithm by the contiguity of
    the values (`add_` merges the matching entries of contiguous values and
    concatenates the others), so the CPU copy of a sparse tensor whose values
    are expanded (an embedding's sparse gradient of a `sum()`) keeps them so."""
    if t.is_contiguous() or t.numel() == 0 or any(s < 0 for s in t.stride()):
        return copy(t)
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    if extent >= t.numel():
        return copy(t)
    region = copy(t.as_strided((extent,), (1,), t.storage_offset()))
    return region.as_strided(tuple(t.shape), tuple(t.stride()))


def coo_to_cpu(x, copy):
    """CPU copy of sparse COO tpu tensor `x`; `copy(dense_tpu)` moves a dense part."""
    return aten._sparse_coo_tensor_with_dims_and_tensors.default(
        x.sparse_dim(), x.dense_dim(), list(x.shape), copy(x._indices()),
        _overlapping_copy(x._values(), copy),
        dtype=x.dtype, layout=torch.sparse_coo, device=torch.device("cpu"),
        pin_memory=False, is_coalesced=x.is_coalesced())


def coo_from_cpu(x, device, to_device):
    """A copy on `device` of CPU sparse COO tensor `x`; `to_device(dense_cpu)` moves a part."""
    return aten._sparse_coo_tensor_with_dims_and_tensors.default(
        x.sparse_dim(), x.dense_dim(), list(x.shape), to_device(x._indices()),
        to_device(x._values()), dtype=x.dtype, layout=torch.sparse_coo,
        device=device, pin_memory=False, is_coalesced=x.is_coalesced())
