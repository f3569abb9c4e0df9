"""The c10d functional collectives (`torch.ops._c10d_functional.*`) on tpu.

DTensor and `torch.distributed._functional_collectives` call these ops;
dynamo puts them into graphs. Two implementations:

- eager: PrivateUse1 kernels that run the collective through the group's
  `ProcessGroupTPU` (one XLA collective program over the group's devices)
  and return the result as a new tpu tensor. They complete before they
  return, so `wait_tensor` has nothing left to wait for.
- graphs: lowerings used by the compile backend when it builds a graph
  with collectives as one SPMD program over the group's mesh (the program
  is shard_map'ed over the mesh axis `programs.AXIS`): the collectives
  become psum / all_gather / psum_scatter / all_to_all inside the XLA
  program (see `torch_tpu.distributed.spmd`).

A group that is not a tpu process group (e.g. gloo) still works: the
tensor goes through the CPU.
"""

from __future__ import annotations

import torch

from ..runtime import storage as st

_fc = torch.ops._c10d_functional

# The tpu process group class (distributed.process_group.ProcessGroupTPU),
# added by that module when it loads: a layer above, so never imported here.
# Before it loads no tpu group exists.
TPU_GROUP_TYPES: list = []

_lib = None


def tpu_group(group_name):
    """The tpu process group `group_name` names (a ProcessGroup or a registered
    group name), or None for another backend's group; the functional
    collectives here and distributed.spmd dispatch on it."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if isinstance(group_name, dist.ProcessGroup):
        group = group_name
    else:
        group = c10d._resolve_process_group(group_name)
    return group if TPU_GROUP_TYPES and isinstance(group, tuple(TPU_GROUP_TYPES)) else None


def _run(work, box):
    work.wait()
    return box


def _wrap(arr, dtype):
    return st.wrap(arr, 0, dtype)


def _via_cpu(op, t, *args, **kwargs):
    """A non-tpu group: run the functional op on a CPU copy, bring the result back."""
    res = op(t.cpu(), *args, **kwargs)
    res = _fc.wait_tensor(res)
    return res.to(t.device)


def _one(pg, run_kind, t, **kw):
    """Run one collective on `t` through ProcessGroupTPU, return the new tensor."""
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    if run_kind == "all_reduce":
        src = t.contiguous()
        with torch.no_grad():
            out.copy_(src)
        pg._allreduce([out], kw["op"]).wait()
    elif run_kind == "broadcast":
        with torch.no_grad():
            out.copy_(t)
        opts = _Opts(rootRank=kw["src"])
        pg.broadcast([out], opts).wait()
    else:  # pragma: no cover
        raise NotImplementedError(run_kind)
    return out


class _Opts:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _op_name(reduce_op):
    return str(reduce_op).lower()


# -- kernels -------------------------------------------------------------------


def all_reduce(input, reduce_op, group_name):
    pg = tpu_group(group_name)
    if pg is None:
        return _via_cpu(_fc.all_reduce, input, reduce_op, group_name)
    return _one(pg, "all_reduce", input, op=_op_name(reduce_op))


def all_reduce_(input, reduce_op, group_name):
    pg = tpu_group(group_name)
    if pg is None:
        res = _via_cpu(_fc.all_reduce, input, reduce_op, group_name)
    else:
        res = _one(pg, "all_reduce", input, op=_op_name(reduce_op))
    with torch.no_grad():
        input.copy_(res)
    return input


def all_reduce_coalesced(inputs, reduce_op, group_name):
    return [all_reduce(t, reduce_op, group_name) for t in inputs]


def all_reduce_coalesced_(inputs, reduce_op, group_name):
    for t in inputs:
        all_reduce_(t, reduce_op, group_name)
    return inputs


def all_gather_into_tensor(input, group_size, group_name):
    pg = tpu_group(group_name)
    if pg is None:
        return _via_cpu(_fc.all_gather_into_tensor, input, group_size, group_name)
    _check_size(pg, group_size, "all_gather_into_tensor")
    shape = tuple(input.shape)
    out_shape = ((group_size * shape[0],) + shape[1:]) if shape else (group_size,)
    out = torch.empty(out_shape, dtype=input.dtype, device=input.device)
    pg.all_gather_single(out, input.contiguous()).wait()
    return out


def all_gather_into_tensor_out(input, group_size, group_name, *, out):
    res = all_gather_into_tensor(input, group_size, group_name)
    with torch.no_grad():
        if tuple(out.shape) != tuple(res.shape):
            out.resize_(res.shape)
        out.copy_(res)
    return out


def all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    return [all_gather_into_tensor(t, group_size, group_name) for t in inputs]


def reduce_scatter_tensor(input, reduce_op, group_size, group_name):
    pg = tpu_group(group_name)
    if pg is None:
        return _via_cpu(_fc.reduce_scatter_tensor, input, reduce_op, group_size, group_name)
    _check_size(pg, group_size, "reduce_scatter_tensor")
    shape = tuple(input.shape)
    if not shape or shape[0] % group_size:
        raise ValueError(f"reduce_scatter_tensor: dim 0 of {list(shape)} is not divisible by "
                         f"the group size {group_size}")
    out = torch.empty((shape[0] // group_size,) + shape[1:], dtype=input.dtype,
                      device=input.device)
    pg.reduce_scatter_single(out, input.contiguous(),
                             _Opts(reduceOp=_op_name(reduce_op))).wait()
    return out


def reduce_scatter_tensor_out(input, reduce_op, group_size, group_name, *, out):
    res = reduce_scatter_tensor(input, reduce_op, group_size, group_name)
    with torch.no_grad():
        out.copy_(res)
    return out


def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    return [reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in inputs]


def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    pg = tpu_group(group_name)
    if pg is None:
        return _via_cpu(_fc.all_to_all_single, input, output_split_sizes, input_split_sizes,
                        group_name)
    out_splits = [int(s) for s in output_split_sizes]
    shape = tuple(input.shape)
    rows = sum(out_splits) if out_splits else (shape[0] if shape else 1)
    out = torch.empty((rows,) + shape[1:], dtype=input.dtype, device=input.device)
    pg.all_to_all_single(out, input.contiguous(), out_splits,
                         [int(s) for s in input_split_sizes]).wait()
    return out


def broadcast(input, src, group_name):
    pg = tpu_group(group_name)
    if pg is None:
        return _via_cpu(_fc.broadcast, input, src, group_name)
    return _one(pg, "broadcast", input, src=int(src))


def broadcast_(input, src, group_name):
    res = broadcast(input, src, group_name)
    with torch.no_grad():
        input.copy_(res)
    return input


def wait_tensor(tensor):
    # The eager kernels above complete before they return.
    return tensor


def _check_size(pg, group_size, what):
    if int(group_size) != pg.size():
        raise ValueError(f"{what}: group_size {group_size} does not match the group's size "
                         f"{pg.size()}")


KERNELS = {
    "all_reduce": all_reduce,
    "all_reduce_": all_reduce_,
    "all_reduce_coalesced": all_reduce_coalesced,
    "all_reduce_coalesced_": all_reduce_coalesced_,
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather_into_tensor_out": all_gather_into_tensor_out,
    "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
    "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
    "all_to_all_single": all_to_all_single,
    "broadcast": broadcast,
    "broadcast_": broadcast_,
    "wait_tensor": wait_tensor,
}


def install() -> None:
    """Register the eager kernels for PrivateUse1 (once)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("_c10d_functional", "IMPL")
    for name, fn in KERNELS.items():
        if hasattr(_fc, name):
            lib.impl(name, fn, "PrivateUse1")
    _lib = lib


install()
