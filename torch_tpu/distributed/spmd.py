"""Compiled graphs with collectives as one SPMD program over the group's mesh.

A graph from `torch.compile(..., backend="tpu")` that calls c10d functional
collectives (DTensor, `torch.distributed._functional_collectives`) is
lowered as usual, but the whole jax function is `shard_map`'ed over the
mesh of the group's devices: every array input is this process's block of
a global array, the graph's ops run on the blocks, and the collectives
become psum / all_gather / psum_scatter / all_to_all on the mesh axis
inside the XLA program. Each process runs the same program on its device.

How it plugs in: the graph lowering rules for `_c10d_functional.*`
(registered into `torch_tpu.compile.graph_ops.GRAPH_OPS` by `install()`)
raise `NeedsSpmd` when they are traced outside an SPMD context. The
compile path catches it in `compile_hook`, declared to the program cache
(`runtime.programs.add_compile_hook`, used by the graph tier's compiles),
and traces the
graph again under `shard_map` with the group's mesh. Graphs whose
collectives use several different groups, or uneven all_to_all splits,
raise `LoweringError`, and the compile backend runs them op by op (each
collective then runs through the process group).

Executions of these programs go through the process group's worker queue
(in order with the eager collectives, under the group's timeout), and the
program first all-gathers a fingerprint of its input signature: if the
processes disagree (different shapes), no collective runs and every
process gets a `CollectiveError`.
"""

from __future__ import annotations

import hashlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import programs
from ..runtime import programs as program_cache  # (not this package's `programs`)
from ..compile.lowering import LoweringError
from ..ops.collectives import tpu_group
from .process_group import CollectiveError, Work, WORKER, local_device
from ..compile import graph_ops

_fc = torch.ops._c10d_functional


class _Ctx(threading.local):
    plan = None


CTX = _Ctx()


def _lowering_error():
    return LoweringError


class NeedsSpmd(Exception):
    """Raised while tracing a graph collective outside an SPMD context."""

    def __init__(self, plan):
        super().__init__(f"graph collective over ranks {list(plan.ranks)} needs an SPMD program")
        self.plan = plan


# --------------------------------------------------------------------------
# plans


class SpmdPlan:
    def __init__(self, pg):
        self.pg = pg
        self.ranks = tuple(pg.global_ranks)
        self.n = len(self.ranks)


_PLANS: dict = {}


def plan_of_group(group_name) -> SpmdPlan:
    pg = tpu_group(group_name)
    if pg is None:
        raise _lowering_error()(
            f"graph collective on group {group_name!r}, which is not a tpu process group")
    plan = _PLANS.get(pg.global_ranks)
    if plan is None or plan.pg is not pg:
        plan = _PLANS[pg.global_ranks] = SpmdPlan(pg)
    return plan


def _active(group_name) -> SpmdPlan:
    plan = plan_of_group(group_name)
    active = CTX.plan
    if active is None:
        raise NeedsSpmd(plan)
    if active.ranks != plan.ranks:
        raise _lowering_error()(
            f"a compiled graph with collectives over several groups ({list(active.ranks)} and "
            f"{list(plan.ranks)}) is not supported as one program")
    return active


# --------------------------------------------------------------------------
# graph rules (g: node context, a: schema argument name -> value)


def _rule_all_reduce(g, a):
    plan = _active(a["group_name"])
    return programs.reduce_values(a["input"], str(a["reduce_op"]).lower(), plan.n)


def _rule_all_reduce_coalesced(g, a):
    plan = _active(a["group_name"])
    return [programs.reduce_values(x, str(a["reduce_op"]).lower(), plan.n) for x in a["inputs"]]


def _gather(x):
    if x.ndim == 0:
        return lax.all_gather(x, programs.AXIS)
    return lax.all_gather(x, programs.AXIS, axis=0, tiled=True)


def _rule_all_gather(g, a):
    _active(a["group_name"])
    return _gather(a["input"])


def _rule_all_gather_coalesced(g, a):
    _active(a["group_name"])
    return [_gather(x) for x in a["inputs"]]


def _rule_reduce_scatter(g, a):
    plan = _active(a["group_name"])
    return programs.reduce_scatter_values(a["input"], str(a["reduce_op"]).lower(), plan.n)


def _rule_reduce_scatter_coalesced(g, a):
    plan = _active(a["group_name"])
    return [programs.reduce_scatter_values(x, str(a["reduce_op"]).lower(), plan.n)
            for x in a["inputs"]]


def _rule_all_to_all(g, a):
    plan = _active(a["group_name"])
    x = a["input"]
    outs = [int(s) for s in (a["output_split_sizes"] or [])]
    ins = [int(s) for s in (a["input_split_sizes"] or [])]
    rows = x.shape[0]
    if (ins and len(set(ins)) != 1) or (outs and len(set(outs)) != 1) or rows % plan.n:
        raise _lowering_error()("all_to_all_single with uneven splits inside a compiled graph")
    return lax.all_to_all(x, programs.AXIS, 0, 0, tiled=True)


def _rule_broadcast(g, a):
    _active(a["group_name"])
    return programs.select_from(a["input"], int(a["src"]))


def _rule_wait(g, a):
    return a["tensor"]


RULES = {
    "all_reduce": _rule_all_reduce,
    "all_reduce_coalesced": _rule_all_reduce_coalesced,
    "all_gather_into_tensor": _rule_all_gather,
    "all_gather_into_tensor_coalesced": _rule_all_gather_coalesced,
    "reduce_scatter_tensor": _rule_reduce_scatter,
    "reduce_scatter_tensor_coalesced": _rule_reduce_scatter_coalesced,
    "all_to_all_single": _rule_all_to_all,
    "broadcast": _rule_broadcast,
    "wait_tensor": _rule_wait,
}


# --------------------------------------------------------------------------
# the SPMD program


def _is_array(x):
    return isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)) or hasattr(x, "aval")


class SpmdExecutable:
    """fn(*args) with local arrays in and out, run as one program on the mesh."""

    def __init__(self, plan, name, key, fn, args, jit_kwargs):
        self.plan = plan
        self.name = name
        n = plan.n
        mesh = programs.mesh_of(plan.ranks)
        self.sharding = NamedSharding(mesh, P(programs.AXIS))
        leaves, self.in_tree = jax.tree_util.tree_flatten(args)
        self.dyn = [i for i, x in enumerate(leaves) if _is_array(x)]
        static = {i: x for i, x in enumerate(leaves) if not _is_array(x)}
        self.in_scalar = [len(leaves[i].shape) == 0 for i in self.dyn]
        n_leaves = len(leaves)
        in_tree = self.in_tree
        box = {}
        sig = repr((name, [(tuple(leaves[i].shape), str(np.dtype(leaves[i].dtype)))
                           for i in self.dyn]))
        fp = int.from_bytes(hashlib.blake2b(sig.encode(), digest_size=7).digest(), "little")
        self.fingerprint = fp

        def local_call(blocks):
            vals = [None] * n_leaves
            for i, v in static.items():
                vals[i] = v
            for j, (i, b) in enumerate(zip(self.dyn, blocks)):
                vals[i] = b.reshape(()) if self.in_scalar[j] else b
            prev = CTX.plan
            CTX.plan = plan
            try:
                out = fn(*jax.tree_util.tree_unflatten(in_tree, vals))
            finally:
                CTX.plan = prev
            out_leaves, out_tree = jax.tree_util.tree_flatten(out)
            box["out_tree"] = out_tree
            box["scalar"] = [jnp.ndim(o) == 0 for o in out_leaves]
            return [jnp.reshape(o, (1,)) if jnp.ndim(o) == 0 else o for o in out_leaves]

        def body(meta, *blocks):
            allm, ok, _ = programs.gather_check(meta)  # the same all-gather as eager checks
            shapes = jax.eval_shape(local_call, list(blocks))
            zeros = [jnp.zeros(s.shape, s.dtype) for s in shapes]
            outs = lax.cond(ok, lambda bs: local_call(list(bs)), lambda bs: zeros, blocks)
            return list(outs), ok.reshape(1), allm.reshape(1, -1)

        smap = programs.shard_map(body, mesh, in_specs=P(programs.AXIS),
                                  out_specs=P(programs.AXIS))

        def glob(x):
            shape = tuple(x.shape)
            block = shape if shape else (1,)
            gshape = (n * block[0],) + block[1:]
            return jax.ShapeDtypeStruct(gshape, x.dtype, sharding=self.sharding)

        meta_abs = jax.ShapeDtypeStruct((n * programs.GATHER_LEN,), jnp.int64,
                                        sharding=self.sharding)
        gargs = [meta_abs] + [glob(leaves[i]) for i in self.dyn]
        jit_kwargs = {k: v for k, v in jit_kwargs.items() if k != "donate_argnums"}
        self.compiled = program_cache.compile(name, ("spmd", plan.ranks) + tuple(key),
                                              lambda *a: smap(*a), gargs, **jit_kwargs)
        self.out_tree = box["out_tree"]
        self.out_scalar = box["scalar"]
        self._seq = 0

    def _global(self, x, scalar):
        if scalar:
            x = jnp.reshape(x, (1,))
        shape = (self.plan.n * x.shape[0],) + tuple(x.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, [x])

    def __call__(self, *args):
        leaves = jax.tree_util.tree_leaves(args)
        dyn = [leaves[i] for i in self.dyn]
        pg = self.plan.pg
        pg._check_ready(self.name)
        self._seq += 1
        meta = programs.meta_vector("all_reduce", -3, None, (), 0)
        meta[1] = 100  # a compiled graph
        meta[5] = self.fingerprint
        gl = [self._global(x, s) for x, s in zip(dyn, self.in_scalar)]
        box = {}
        dev = local_device()
        desc = f"compiled graph {self.name} (collectives over ranks {list(self.plan.ranks)})"

        def run():
            g_meta = jax.make_array_from_single_device_arrays(
                (self.plan.n * programs.GATHER_LEN,), self.sharding, [jax.device_put(meta, dev)])
            outs, ok, allm = self.compiled(g_meta, *gl)
            if not bool(np.asarray(ok.addressable_data(0))[0]):
                raise CollectiveError(
                    f"[torch_tpu] {desc}: the processes ran this graph with different input "
                    f"shapes or a different graph; no data was exchanged")
            res = []
            for o, s in zip(outs, self.out_scalar):
                loc = o.addressable_data(0)
                res.append(loc.reshape(()) if s else loc)
            box["out"] = res
            return []

        work = Work(pg, self.name, run, None, [])
        work.desc = desc
        WORKER.submit(work)
        work.wait()
        return jax.tree_util.tree_unflatten(self.out_tree, box["out"])


def compile_hook(original):
    """Wrap the graph tier's compile (`programs.hooked_compile`): graphs that need
    an SPMD program get one."""

    def _compile(name, key, fn, args, **jit_kwargs):
        try:
            return original(name, key, fn, args, **jit_kwargs)
        except NeedsSpmd as e:
            return SpmdExecutable(e.plan, name, key, fn, args, jit_kwargs)

    _compile._torch_tpu_spmd = True
    _compile.__wrapped__ = original
    return _compile


_installed = False


def install() -> None:
    """Register the graph rules and the compile hook (once, when a group exists)."""
    global _installed
    if _installed:
        return

    for name, rule in RULES.items():
        packet = getattr(_fc, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            graph_ops.GRAPH_OPS.setdefault(getattr(packet, ov), rule)
    program_cache.add_compile_hook(compile_hook)  # once: the same hook is not added twice
    _installed = True
