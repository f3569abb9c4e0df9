"""Sparse tensors on `tpu`: COO (SparsePrivateUse1) and CSR/CSC/BSR/BSC (SparseCsrPrivateUse1).

This lives in `ops/` next to `core.py` because, like the storage kernels, it
is a set of ATen kernels registered with the dispatcher, not device plumbing.

A sparse COO `tpu` tensor is PyTorch's own `SparseTensorImpl` whose indices
(int64, sparse_dim x nnz) and values (nnz x dense sizes) are ordinary dense
`tpu` tensors. Three kinds of kernels cover the SparsePrivateUse1 key:

- structure (construction, `_indices`/`_values`, `_nnz`, `sparse_dim`,
  `is_coalesced`, `sparse_resize_`, `clone`, `copy_`, `zero_`, ...): PyTorch's
  SparseCPU kernels for these only build or query the `SparseTensorImpl` and
  call dispatched ATen ops on the indices/values, never their memory, and the
  impl takes its dispatch key from the device, so they are redispatched as
  they are;
- native kernels built from dense `tpu` ops: `_to_sparse` (dense -> COO, a
  `nonzero` read of the count like CPU), `_to_dense` (scatter-add of the
  values), `_coalesce` (`unique` of the flattened indices, then `index_add`)
  and `sparse_mask` of a dense tensor (a gather at the mask's indices);
- every other op with a SparseCPU kernel runs on the CPU through
  `fallback.cpu_fallback`, which carries sparse tensors over as their parts
  (with the fallback off: `NotImplementedError` naming the op).

The compressed layouts get the same treatment with less native work: their
`SparseCsrTensorImpl` structure (`crow_indices`, `col_indices`, `values`,
`_nnz`, `clone`, `copy_`, ...) is redispatched to the SparseCsrCPU kernels,
and every computation on them runs on the CPU. Conversions from a dense
tensor to these layouts run on the CPU too.
"""

from __future__ import annotations

import torch

from .._compat.torch_api import pytree
from . import fallback
# The CPU fallback's conversions of sparse layouts live with it (fallback.py).
from .fallback import COMPRESSED, compressed_moved, coo_from_cpu, coo_to_cpu  # noqa: F401

aten = torch.ops.aten
_SPARSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)
_SPARSE_CSR_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCsrCPU)

# SparseCPU kernels that only build or query the SparseTensorImpl (and call
# dispatched ATen ops on indices/values): device-generic, redispatched as is.
STRUCTURAL = (
    aten._sparse_coo_tensor_with_dims.default,
    aten._sparse_coo_tensor_with_dims_and_tensors.default,
    aten._indices.default,
    aten._values.default,
    aten.indices.default,
    aten.values.default,
    aten._nnz.default,
    aten.sparse_dim.default,
    aten.dense_dim.default,
    aten._dimI.default,
    aten._dimV.default,
    aten.is_coalesced.default,
    aten._coalesced_.default,
    aten.sparse_resize_.default,
    aten.sparse_resize_and_clear_.default,
    aten.resize_as_sparse_.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.clone.default,
    aten.copy_.default,
    aten.copy_sparse_to_sparse_.default,
    aten.zero_.default,
    aten.is_pinned.default,
)

# The same for the compressed layouts (CSR/CSC/BSR/BSC: SparseCsrCPU kernels).
STRUCTURAL_COMPRESSED = (
    aten._nnz.default,
    aten.crow_indices.default,
    aten.col_indices.default,
    aten.ccol_indices.default,
    aten.row_indices.default,
    aten.values.default,
    aten.sparse_dim.default,
    aten.dense_dim.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.clone.default,
    aten.copy_.default,
    aten.resize_.default,
    aten.resize_as_sparse_.default,
    aten.is_pinned.default,
)

# Native kernels on the SparsePrivateUse1 key (filled below).
NATIVE: dict = {}
# Native kernels on the PrivateUse1 key: dense -> sparse conversions.
DENSE: dict = {}


def _native(table, *ops):
    def deco(fn):
        for op in ops:
            table[op] = fn
        return fn

    return deco


def _redispatch(op, keys=_SPARSE_CPU):
    handle = op._handle

    def kernel(*args, **kwargs):
        return handle.redispatch_boxed(keys, *args, **kwargs)

    kernel.__name__ = op.__name__
    return kernel


def _on_cpu(op):
    def kernel(*args, **kwargs):
        # The CPU run would accept a CPU sparse operand next to the moved tpu
        # ones; on the device (as on CUDA) that is a device mismatch.
        for a in pytree.tree_leaves((args, kwargs)):
            if (isinstance(a, torch.Tensor) and a.layout != torch.strided
                    and a.device.type != "tpu"):
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least "
                    f"two devices, tpu and {a.device} (in {op})")
        return fallback.cpu_fallback(op, *args, **kwargs)

    kernel.__name__ = op.__name__
    return kernel


def make_coo(indices, values, size, *, coalesced=None):
    """A sparse COO tensor on the device of `values` (no checks, no copies)."""
    sparse_dim = indices.shape[0]
    return aten._sparse_coo_tensor_with_dims_and_tensors.default(
        sparse_dim, values.dim() - 1, list(size), indices, values, dtype=values.dtype,
        layout=torch.sparse_coo, device=values.device, pin_memory=False,
        is_coalesced=coalesced)


# -- dense -> COO ---------------------------------------------------------------


def _check_like_cpu(op, self, *args, **kwargs):
    """Raise what the CPU raises for these arguments (checks depend on dims only).

    The CPU kernel runs on a zero tensor with the same number of dims and at
    most one element, so invalid arguments raise PyTorch's own error.
    """
    probe = torch.zeros([min(int(s), 1) for s in self.shape], dtype=self.dtype)
    op(probe, *args, **kwargs)


@_native(DENSE, aten._to_sparse.sparse_dim)
def dense_to_coo(self, sparse_dim):
    _check_like_cpu(aten._to_sparse.sparse_dim, self, sparse_dim)
    dims = self.dim()
    if dims == 0:
        nnz = int(bool(self.ne(0).item()))
        indices = torch.zeros((0, nnz), dtype=torch.int64, device=self.device)
        values = self.reshape(1)[:nnz].clone()
        return make_coo(indices, values, (), coalesced=True)
    mask = self.ne(0)
    if sparse_dim < dims:
        mask = mask.flatten(sparse_dim).any(-1)
    # nonzero lists the positions in row-major order: coalesced indices.
    indices = mask.nonzero().t().contiguous()
    values = self[tuple(indices.unbind(0))].clone()
    return make_coo(indices, values, self.shape, coalesced=True)


@_native(DENSE, aten._to_sparse.default)
def dense_to_sparse(self, *, layout=None, blocksize=None, dense_dim=None):
    if layout not in (None, torch.sparse_coo):  # CSR/CSC/BSR/BSC: on the CPU
        return fallback.cpu_fallback(aten._to_sparse.default, self, layout=layout,
                                     blocksize=blocksize, dense_dim=dense_dim)
    _check_like_cpu(aten._to_sparse.default, self, layout=layout, blocksize=blocksize,
                    dense_dim=dense_dim)
    return dense_to_coo(self, self.dim() - (dense_dim or 0))


# -- COO -> dense, coalesce, sparse_mask -----------------------------------------


@_native(NATIVE, aten._to_dense.default)
def to_dense(self, dtype=None, masked_grad=None):
    torch._check(dtype is None, lambda: "dtype argument is not supported by sparse_to_dense")
    sparse_dim = self.sparse_dim()
    indices, values = self._indices(), self._values()
    if sparse_dim == 0:  # every value sits at the one position: their sum
        if self.dtype == torch.bool:
            return values.any(0)
        return values.sum(0, dtype=self.dtype)
    out = torch.zeros(tuple(self.shape), dtype=self.dtype, device=self.device)
    if self._nnz() == 0:
        return out
    if self.dtype == torch.bool:  # duplicates add as "or", as in CPU's add_
        acc = torch.zeros(tuple(self.shape), dtype=torch.int32, device=self.device)
        acc.index_put_(tuple(indices.unbind(0)), values.to(torch.int32), accumulate=True)
        return acc.ne(0)
    out.index_put_(tuple(indices.unbind(0)), values, accumulate=True)
    return out


@_native(NATIVE, aten._coalesce.default)
def coalesce(self):
    if self._nnz() < 2:
        dst = self.clone()
        dst._coalesced_(True)
        return dst
    sparse_dim = self.sparse_dim()
    sizes = tuple(self.shape[:sparse_dim])
    indices, values = self._indices(), self._values()
    if sparse_dim == 0:
        inverse = torch.zeros((self._nnz(),), dtype=torch.int64, device=self.device)
        n = 1
        new_indices = torch.zeros((0, 1), dtype=torch.int64, device=self.device)
    else:
        flat = indices[0]
        for d in range(1, sparse_dim):
            flat = flat * sizes[d] + indices[d]
        # One device-to-host read: the number of distinct positions.
        unique, inverse = torch.unique(flat, sorted=True, return_inverse=True)
        n = unique.shape[0]
        rows = []
        rest = unique
        for d in reversed(range(sparse_dim)):
            rows.append(torch.remainder(rest, sizes[d]))
            rest = torch.div(rest, sizes[d], rounding_mode="floor")
        new_indices = torch.stack(rows[::-1])
    acc_dtype = torch.int32 if self.dtype == torch.bool else self.dtype
    new_values = torch.zeros((n,) + tuple(values.shape[1:]), dtype=acc_dtype, device=self.device)
    new_values.index_add_(0, inverse, values.to(acc_dtype))
    if self.dtype == torch.bool:
        new_values = new_values.ne(0)
    return make_coo(new_indices, new_values, self.shape, coalesced=True)


@_native(NATIVE, aten.sparse_mask.default)
def sparse_mask(self, mask):
    if self.layout != torch.strided:
        return fallback.cpu_fallback(aten.sparse_mask.default, self, mask)
    torch._check(
        mask.device == self.device,
        lambda: f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {self.device} and {mask.device} (in aten.sparse_mask)")
    torch._check(
        tuple(mask.shape) == tuple(self.shape),
        lambda: f"sparse_mask(): operands have incompatible sizes; self has size "
                f"{list(self.shape)} but mask has size {list(mask.shape)}")
    if mask._nnz() == 0:
        return mask.clone().to(self.device, self.dtype)
    sparse_dim = mask.sparse_dim()
    indices = mask._indices()
    if sparse_dim == 0:
        values = self.unsqueeze(0).expand((mask._nnz(),) + tuple(self.shape)).clone()
    else:
        values = self[tuple(indices.unbind(0))]
    return make_coo(indices.clone(), values, self.shape, coalesced=mask.is_coalesced())


# -- registration ----------------------------------------------------------------

_libs: list = []


def _cpu_ops(key):
    """Every aten overload with a kernel for dispatch key `key` (SparseCPU, ...)."""
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            continue
        base, _, overload = name[len("aten::"):].partition(".")
        packet = getattr(aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None:
            yield op


def install() -> None:
    """Register the SparsePrivateUse1 kernels and the dense -> sparse kernels (once)."""
    if _libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    done = set()
    for op in STRUCTURAL:
        lib.impl(op, _redispatch(op), "SparsePrivateUse1")
        done.add(op)
    for op, fn in NATIVE.items():
        lib.impl(op, fn, "SparsePrivateUse1")
        done.add(op)
    # Every other SparseCPU op runs on the CPU. Registering each one (rather
    # than only a backend fallback) matters: many also have a dense
    # CompositeExplicitAutograd kernel, which would otherwise win over a
    # fallback and fail on a sparse tensor.
    for op in _cpu_ops("SparseCPU"):
        if op not in done:
            lib.impl(op, _on_cpu(op), "SparsePrivateUse1")
            done.add(op)
    done = set()
    for op in STRUCTURAL_COMPRESSED:
        lib.impl(op, _redispatch(op, _SPARSE_CSR_CPU), "SparseCsrPrivateUse1")
        done.add(op)
    for op in _cpu_ops("SparseCsrCPU"):
        if op not in done:
            lib.impl(op, _on_cpu(op), "SparseCsrPrivateUse1")
            done.add(op)
    for op, fn in DENSE.items():
        lib.impl(op, fn, "PrivateUse1")
    fb = torch.library.Library("_", "IMPL")
    _libs.append(fb)
    fb.fallback(fallback.cpu_fallback, "SparsePrivateUse1")
    fb.fallback(fallback.cpu_fallback, "SparseCsrPrivateUse1")
