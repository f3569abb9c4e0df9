"""Memory-overlap checks: PyTorch CPU's rules for written tensors that share memory.

The executor runs them when it builds an op's program (a written tensor
with internal overlap, out= tensors overlapping inputs) and on each call of
an entry whose written and read tensors share a storage (partial overlap);
ops/ kernels outside the executor call them directly. Each answers from
host metadata (shapes, strides, offsets, storages); `raise_overlap` asks
CPU for its exact error (runtime.verdict).
"""

from __future__ import annotations

import torch

from . import verdict


# out= overloads whose CPU kernels reject an output with internal overlap
# (at::assert_no_internal_overlap: a stride-0 dimension of size > 1), and those
# that also reject an output sharing memory with an input (at::assert_no_overlap).
# Elementwise (TensorIterator) ops get the first check from their meta kernels.
_NO_INTERNAL_OVERLAP = frozenset({"cat", "index_select", "take", "masked_select", "kthvalue",
                                  "bernoulli", "gather"})
_NO_INPUT_OVERLAP = frozenset({"cat", "index_select", "take", "masked_select", "kthvalue",
                               "gather", "topk", "median"})


def _tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def _mem_range(t):
    item = t.element_size()
    return t.storage_offset() * item, (t.storage_offset() + t.numel()) * item


def check_out_overlap(op, args, kwargs):
    """PyTorch CPU's memory-overlap checks on the out= tensors of `op`."""
    schema = op._schema
    base = schema.name.split("::")[1]
    if base not in _NO_INTERNAL_OVERLAP and base not in _NO_INPUT_OVERLAP:
        return
    vals = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
    outs: list[torch.Tensor] = []
    ins: list[torch.Tensor] = []
    for a, v in zip(schema.arguments, vals):
        (outs if a.is_out else ins).extend(_tensors(v))
    if base in _NO_INTERNAL_OVERLAP:
        for o in outs:
            if any(st == 0 and sz > 1 for sz, st in zip(o.shape, o.stride())):
                raise RuntimeError(
                    "unsupported operation: more than one element of the written-to tensor "
                    "refers to a single memory location. Please clone() the tensor before "
                    "performing the operation.")
    if base in _NO_INPUT_OVERLAP:
        for o in outs:
            for i in ins:
                if overlaps(o, i):
                    raise RuntimeError(
                        "unsupported operation: some elements of the input tensor and the "
                        "written-to tensor refer to a single memory location. Please clone() "
                        "the tensor before performing the operation.")


def overlaps(a, b):
    """at::get_overlap_status(a, b) is Full or Partial."""
    if a is b:
        return True
    da = getattr(a.untyped_storage(), "_tpu", None)  # (first: the cheap, common answer)
    if da is None or da is not getattr(b.untyped_storage(), "_tpu", None):
        return False
    if a.numel() == 0 or b.numel() == 0:
        return False
    if not (_dense(a) and _dense(b)):
        return False  # TooHard: CPU does not raise
    (a0, a1), (b0, b1) = _mem_range(a), _mem_range(b)
    return a0 < b1 and b0 < a1


def internal_overlap(t):
    """at::has_internal_overlap(t) is Yes: a dimension of size > 1 with stride 0
    (an expanded tensor), where one memory location stands for several elements."""
    stride = t.stride()
    return (0 in stride and any(s == 0 and n > 1 for n, s in zip(t.shape, stride))
            and t.numel() > 0)  # (an empty tensor stores nothing: CPU accepts it)


def partial_overlap(a, b):
    """at::get_overlap_status(a, b) is Partial: they share memory, but not
    element for element (Full: the same range with the same strides)."""
    if a is b or not overlaps(a, b):
        return False
    (a0, a1), (b0, b1) = _mem_range(a), _mem_range(b)
    return not (a0 == b0 and a1 == b1 and a.stride() == b.stride())


def raise_overlap(op, args, kwargs, text):
    """Raise CPU's memory-overlap error for this call if CPU raises one
    (runtime.verdict.overlap_error, run on host tensors aliased as these are);
    `text` (CPU's message) where the call is too large to ask; else return."""
    err = verdict.overlap_error(op, args, kwargs)
    if err is verdict.NO_VERDICT:
        raise RuntimeError(f"{text} ({op})")
    if err is not None:
        raise verdict.as_op_error(err, op) from None


def _dense(t):
    """TensorImpl::is_non_overlapping_and_dense."""
    dims = sorted((stride, sz) for sz, stride in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for stride, sz in dims:
        if stride != expected:
            return False
        expected *= sz
    return True
