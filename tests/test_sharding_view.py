"""torch_tpu.debug.sharding: block layouts of DTensors / FSDP2 + TP modules, and
the collectives of a program with their bytes and ICI roofline time.

Layouts use an in-process "fake" process group of 8 ranks (torch's own test
backend: no communication; DTensor and fully_shard only need the metadata),
destroyed after each test. The real program with collectives is compiled in
a subprocess with 8 emulated XLA:CPU devices (XLA_FLAGS must be set before
JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import torch_tpu  # noqa: F401
from torch_tpu.debug import sharding
from torch_tpu.debug.sharding import ICI, parse_collectives


@pytest.fixture
def mesh_2x4():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("cpu:fake,tpu:fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


def _blocks(view_tensor):
    return {b.device: b.ranges for b in view_tensor.blocks}


def _dtensor(mesh, shape, placements):
    from torch.distributed.tensor import DTensor

    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
    stride = torch.empty(shape).stride()
    return DTensor.from_local(torch.zeros(local_shape, device="tpu"), mesh, placements,
                              run_check=False, shape=torch.Size(shape), stride=stride)


def test_dtensor_shard0_x_shard1_blocks_per_device(mesh_2x4):
    from torch.distributed.tensor import Shard

    d = _dtensor(mesh_2x4, (8, 12), [Shard(0), Shard(1)])
    view = sharding(d, name="w")
    t = view.tensor("w")
    # device 4*i + j sits at mesh coordinate (i, j): rows by dp, columns by tp
    assert _blocks(t) == {4 * i + j: ((4 * i, 4 * i + 4), (3 * j, 3 * j + 3))
                          for i in range(2) for j in range(4)}
    assert t.blocks_of(6)[0].coordinate == (1, 2)
    # this process (rank 0) holds exactly the block the view gives device 0
    assert tuple(d.to_local().shape) == t.blocks_of(0)[0].shape
    text = str(view)
    assert "[4:8, 6:9]" in text and "mesh (dp=2, tp=4)" in text and "48 B" in text


def test_uneven_and_replicated_blocks(mesh_2x4):
    from torch.distributed.tensor import Replicate, Shard

    # torch.chunk semantics: 10 columns over 4 devices are 3, 3, 3, 1
    t = sharding(_dtensor(mesh_2x4, (7, 10), [Shard(0), Shard(1)])).tensors[0]
    cols = [(0, 3), (3, 6), (6, 9), (9, 10)]
    rows = [(0, 4), (4, 7)]
    assert _blocks(t) == {4 * i + j: (rows[i], cols[j]) for i in range(2) for j in range(4)}
    # replicated over dp: devices j and 4 + j hold the same block
    r = sharding(_dtensor(mesh_2x4, (8,), [Replicate(), Shard(0)])).tensors[0]
    assert _blocks(r) == {4 * i + j: ((2 * j, 2 * j + 2),) for i in range(2) for j in range(4)}


def test_fsdp2_x_tensor_parallel_module(mesh_2x4):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 16)).to("tpu")
    parallelize_module(m, mesh_2x4["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(m, mesh=mesh_2x4["dp"])
    view = sharding(m)
    assert [t.name for t in view.tensors] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    # column-parallel weight [32, 16]: tp cuts rows into 4 blocks of 8, FSDP cuts
    # each tp block in 2 (a strided shard): device (i, j) holds rows 8j + 4i ...
    w0 = view.tensor("0.weight")
    assert _blocks(w0) == {4 * i + j: ((8 * j + 4 * i, 8 * j + 4 * i + 4), (0, 16))
                           for i in range(2) for j in range(4)}
    # row-parallel weight [16, 32]: FSDP rows (dp), tp columns
    w2 = view.tensor("2.weight")
    assert _blocks(w2) == {4 * i + j: ((8 * i, 8 * i + 8), (8 * j, 8 * j + 8))
                           for i in range(2) for j in range(4)}
    # the row-parallel bias is replicated over tp, sharded by FSDP
    assert _blocks(view.tensor("2.bias")) == {4 * i + j: ((8 * i, 8 * i + 8),)
                                              for i in range(2) for j in range(4)}


def test_plot_draws_one_panel_per_tensor(mesh_2x4):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from torch.distributed.tensor import Shard

    view = sharding(_dtensor(mesh_2x4, (8, 12), [Shard(0), Shard(1)]))
    fig = view.plot()
    (ax,) = fig.axes
    assert len(ax.patches) == 8 and {t.get_text() for t in ax.texts} == {
        f"dev {d}" for d in range(8)}
    matplotlib.pyplot.close(fig)


# Optimized HLO of a shard_map program over a (2, 4) mesh (JAX 0.10, XLA:CPU),
# plus the forms TPU programs use: iota replica groups, async -start/-done pairs.
HLO = """
HloModule jit_f, entry_computation_layout={(f32[4,4]{1,0})->f32[16,4]{1,0}}, num_partitions=8

ENTRY %main.0_spmd (param.2: f32[4,4], param.3: bf16[8,4]) -> (f32[16,4]) {
  %psum.7 = f32[4,4]{1,0} all-reduce(%param.2), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%region_1.0
  %ppermute.3 = f32[4,4]{1,0} collective-permute(%param.2), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}
  %all_gather.3 = f32[16,4]{1,0} all-gather(%param.2), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %reduce_scatter.8 = bf16[4,4]{1,0} reduce-scatter(%x), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, dimensions={0}, to_apply=%region_0.0
  %all-to-all = (f32[2,4]{1,0}, f32[2,4]{1,0}, f32[2,4]{1,0}, f32[2,4]{1,0}) all-to-all(%a, %b, %c, %d), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}
  %ag-start = (bf16[8,128]{1,0}, bf16[16,128]{1,0}) all-gather-start(%p), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}, use_global_device_ids=true
  %ag-done = bf16[16,128]{1,0} all-gather-done(%ag-start)
  %ar-start = f32[1024]{0} all-reduce-start(%q), channel_id=3, replica_groups={}, to_apply=%add
  %ar-done = f32[1024]{0} all-reduce-done(%ar-start)
  ROOT %t = (f32[16,4]{1,0}) tuple(%all_gather.3)
}
"""


def test_collectives_parsed_from_hlo():
    cs = parse_collectives(HLO)
    assert [(c.kind, c.name) for c in cs] == [
        ("all-reduce", "psum.7"), ("collective-permute", "ppermute.3"),
        ("all-gather", "all_gather.3"), ("reduce-scatter", "reduce_scatter.8"),
        ("all-to-all", "all-to-all"), ("all-gather", "ag-start"), ("all-reduce", "ar-start")]
    ar, cp, ag, rs, a2a, ag_async, ar_all = cs
    # bytes: the HLO result shapes
    assert [c.bytes for c in cs] == [4 * 4 * 4, 4 * 4 * 4, 16 * 4 * 4, 4 * 4 * 2, 4 * 2 * 4 * 4,
                                     16 * 128 * 2, 1024 * 4]
    assert ar.replica_groups == (tuple(range(8)),)
    assert rs.replica_groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and rs.group_size == 2
    assert cp.pairs[:2] == ((0, 1), (1, 2)) and len(cp.pairs) == 8
    # iota groups [4,2]<=[2,4]T(1,0): iota(8).reshape(2, 4).T.reshape(4, 2)
    assert ag_async.replica_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert ag_async.shapes == ("bf16[16,128]",)
    # replica_groups={}: every one of num_partitions devices
    assert ar_all.group_size == 8
    # ring algorithm: what one chip sends
    assert ar.wire_bytes == 2 * 7 / 8 * 64
    assert ag.wire_bytes == 3 / 4 * 256
    assert rs.wire_bytes == 1 * 32
    assert a2a.wire_bytes == 3 / 4 * 128
    assert cp.wire_bytes == 64
    assert ag.seconds("v6e") == ag.wire_bytes / 800e9
    assert ag.seconds("v5e") == ag.wire_bytes / 400e9
    view = sharding(HLO, device="v5e")
    assert view.collective_bytes == sum(c.bytes for c in cs)
    text = str(view)
    assert "TPU v5e ICI" in text and ICI["v5e"].source in text and "reduce-scatter" in text


def test_errors():
    with pytest.raises(TypeError, match="not on a mesh"):
        sharding(torch.ones(2))
    with pytest.raises(ValueError, match="no published interconnect"):
        sharding(HLO, device="v9z")
    with pytest.raises(TypeError, match="expected a DTensor"):
        sharding(3)


REAL = """
import json
import torch  # noqa: F401  (loads torch_tpu through torch's backend autoload, as users do)
import jax, numpy as np
from jax import lax, shard_map
from jax.sharding import Mesh, PartitionSpec as P
import jax.numpy as jnp
from torch_tpu.debug import Program, sharding

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))

def step(w, g):
    full = lax.all_gather(w, "dp", tiled=True)          # FSDP: gather the weight
    grad = lax.psum_scatter(g, "dp", tiled=True)        # FSDP: reduce-scatter its grad
    return full, lax.psum(grad, "tp")                  # TP: all-reduce

f = jax.jit(shard_map(step, mesh=mesh, in_specs=(P("dp", "tp"), P(None, "tp")),
                      out_specs=(P(None, "tp"), P("dp", "tp")), check_vma=False))
w = jnp.ones((64, 32), jnp.float32); g = jnp.ones((64, 32), jnp.float32)
view = sharding(Program("step", lowered=f.lower(w, g)))
from jax.sharding import NamedSharding
arr = jax.device_put(jnp.zeros((8, 12)), NamedSharding(mesh, P("dp", "tp")))
blocks = {b.device: b.ranges for b in sharding(arr).tensors[0].blocks}
print(json.dumps({"blocks": {str(d): r for d, r in blocks.items()},
                  "collectives": [[c.kind, c.bytes, [list(x) for x in c.replica_groups]]
                                  for c in view.collectives]}))
"""


def test_collectives_of_a_compiled_program_and_a_jax_array_layout():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(REAL)], env=env, text=True,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # a jax.Array on the same mesh: device 4*i + j holds rows 4i.., columns 3j..
    assert out["blocks"] == {str(4 * i + j): [[4 * i, 4 * i + 4], [3 * j, 3 * j + 3]]
                             for i in range(2) for j in range(4)}
    got = out["collectives"]
    kinds = sorted((k, b) for k, b, _ in got)
    # per device: w's block is [32, 8] f32, gathered over dp (2) -> [64, 8];
    # g's block [64, 8] reduce-scattered over dp -> [32, 8]; all-reduced over tp: [32, 8]
    assert kinds == [("all-gather", 64 * 8 * 4), ("all-reduce", 32 * 8 * 4),
                     ("reduce-scatter", 32 * 8 * 4)]
    groups = {k: g for k, _, g in got}
    assert groups["all-gather"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups["all-reduce"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
