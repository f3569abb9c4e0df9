"""`torch.distributed.checkpoint` (DCP) with `tpu` tensors, across world sizes.

Checkpoints are written and read with PyTorch's own DCP (`dcp.save`,
`dcp.load`, `dcp.async_save`) and its state-dict helpers (`get_state_dict`,
`set_state_dict`), model and AdamW state, and every loaded value is compared
bit for bit (`torch.equal`, dtype included) with the full state the saver
wrote next to the checkpoint (`torch.save` of CPU copies):

- single process, no process group: save and load, and async_save;
- 1 -> 2: a single-process checkpoint loaded into FSDP2 (`fully_shard`, an
  uneven 8/7 row split) and into replicated modules on 2 ranks;
- 2 -> 2 and 2 -> 1: plain (replicated) modules and FSDP2 saved by 2 ranks,
  loaded by 2 ranks (FSDP2 again) and by one process without a group;
- a one-process "tpu" group: async_save on the default group, a full
  state dict loaded with `broadcast_from_rank0`, and the 2-rank FSDP2
  checkpoint loaded into FSDP2 on a one-device mesh;
- slow: DDP, tensor parallel DTensor state dicts (Colwise/Rowwise; also
  1 -> 2), async_save on 2 ranks (a thread with its own gloo group, and a
  checkpoint process; training goes on while they write), each 2 -> 2 and
  2 -> 1, and a full state dict broadcast from rank 0 into FSDP2;
- damage: a truncated or missing shard file raises DCP's
  `CheckpointException` (on every rank), the same as the same damaged
  checkpoint loaded into CPU tensors (never a silent partial load; as on
  CPU, the intact parts may already be in the module when it raises).

The 2-rank runs use test_distributed's launcher (2 processes on localhost,
each with its own `tpu:0`, collectives through the "tpu" backend).
"""

from __future__ import annotations

import shutil
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import torch_tpu  # noqa: F401
from test_distributed import _env, run_ranks

# Models, training step and comparison: shared by the rank scripts and this
# process (exec'd into a namespace here).
COMMON = """
import torch, torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_state_dict, set_state_dict, StateDictOptions)

def mlp():
    # 15 hidden units: FSDP2 splits the first layer's rows 8/7 over 2 ranks
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 15), nn.ReLU(), nn.Linear(15, 4))

def tp_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 6))

def step(model, opt, steps=1, seed=1, rank=0, world=1, d_in=6):
    # AdamW steps on a fixed batch (each rank its share of it)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4 * world, d_in, generator=g).chunk(world)[rank].to("tpu")
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

def train(model, steps=2, rank=0, world=1, d_in=6):
    # a model with AdamW state to checkpoint
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    step(model, opt, steps, rank=rank, world=world, d_in=d_in)
    return opt

def full_state(model, opt):
    # the full (unsharded) model and optimizer state, CPU copies, on every rank
    from torch.utils._pytree import tree_map_only
    sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return tree_map_only(torch.Tensor, lambda t: t.detach().cpu().clone(), sd)

def diff(a, b, path="sd"):
    # first difference between two nested states (bitwise for tensors), or None
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if hasattr(a, "full_tensor"):
            a = a.full_tensor()
        if hasattr(b, "full_tensor"):
            b = b.full_tensor()
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)} differ"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            d = diff(a[k], b[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: lengths {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"

def fresh(wrap=lambda m: m, device="tpu", make=mlp):
    # a model and optimizer whose values differ from every checkpoint's
    m = wrap(make().to(device))
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(-1.0)
    return m, torch.optim.AdamW(m.parameters(), lr=0.05)

def load_into(model, opt, path):
    # DCP load through the state-dict helpers (the documented recipe)
    import torch.distributed.checkpoint as dcp
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

def save_from(model, opt, path):
    import torch.distributed.checkpoint as dcp
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
"""


def _ns():
    ns: dict = {}
    exec(COMMON, ns)
    return ns


# The default 2-rank run: 1 -> 2 loads, then plain and FSDP2 saves and their
# 2 -> 2 reload, and a missing shard on 2 ranks.
TWO_RANKS = COMMON + """
import shutil
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
base = os.environ["DCP_BASE"]
mesh = init_device_mesh("tpu", (world,))
t0 = time.monotonic()

def fsdp(model):
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model

out = {}
# 1 -> 2: the single-process checkpoint into FSDP2 and into replicated modules
ref1 = torch.load(f"{base}/single_ref.pt")
for name, wrap in (("fsdp", fsdp), ("plain", lambda m: m)):
    m, o = fresh(wrap)
    load_into(m, o, f"{base}/single")
    out[f"load_1to2_{name}"] = diff(full_state(m, o), ref1) or "ok"
    if name == "fsdp":
        w = m[0].weight
        out["fsdp_sharded"] = tuple(w.to_local().shape) == ((8, 6) if rank == 0 else (7, 6))

# 2 ranks save: replicated modules (trained alike on every rank: DCP writes
# replicated values once) and FSDP2; rank 0 writes the reference
for name, wrap in (("plain", lambda m: m), ("fsdp", fsdp)):
    m = wrap(mlp().to("tpu"))
    part = dict(rank=rank, world=world) if name == "fsdp" else {}
    o = train(m, **part)
    ref = full_state(m, o)
    save_from(m, o, f"{base}/{name}")
    if rank == 0:
        torch.save(ref, f"{base}/{name}_ref.pt")
    # 2 -> 2
    m2, o2 = fresh(wrap)
    load_into(m2, o2, f"{base}/{name}")
    out[f"load_2to2_{name}"] = diff(full_state(m2, o2), ref) or "ok"
    # training continues identically from the reloaded state
    step(m, o, seed=2, **part)
    step(m2, o2, seed=2, **part)
    out[f"resume_{name}"] = diff(full_state(m2, o2), full_state(m, o)) or "ok"

# a missing shard on 2 ranks: every rank raises CheckpointException
if rank == 0:
    shutil.copytree(f"{base}/fsdp", f"{base}/fsdp_missing")
    os.remove(f"{base}/fsdp_missing/__1_0.distcp")
dist.barrier()
m, o = fresh(fsdp)
try:
    load_into(m, o, f"{base}/fsdp_missing")
    out["missing_2ranks"] = "no error"
except CheckpointException as e:
    out["missing_2ranks"] = "CheckpointException: " + str(e).strip().splitlines()[-1]
out["seconds"] = time.monotonic() - t0
report(**{f"{k}_{rank}": v for k, v in out.items()})
dist.destroy_process_group()
"""


# The slow 2-rank run: DDP, tensor parallel, async_save, broadcast_from_rank0.
# (in main(): the process-based async_save spawns a child that imports this script)
SLOW_TWO_RANKS = COMMON + """
import copy
import torch.distributed.checkpoint as dcp

def main():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    base = os.environ["DCP_BASE"]
    mesh = init_device_mesh("tpu", (world,))
    t0 = time.monotonic()
    out = {}

    def fsdp(model):
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def tp(model):
        return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    # 1 -> 2: a single-process checkpoint into tensor-parallel DTensors
    m, o = fresh(tp, make=tp_mlp)
    load_into(m, o, f"{base}/single_tp")
    out["load_1to2_tp"] = diff(full_state(m, o), torch.load(f"{base}/single_tp_ref.pt")) or "ok"

    # DDP (each rank its share of the batch; the replicas stay equal) and tensor
    # parallel (every rank the whole batch): saved by 2 ranks, reloaded by 2 ranks
    for name, wrap, make, part in (("ddp", DDP, mlp, dict(rank=rank, world=world)),
                                   ("tp", tp, tp_mlp, {})):
        m = wrap(make().to("tpu"))
        o = train(m, **part)
        ref = full_state(m, o)
        save_from(m, o, f"{base}/{name}")
        if rank == 0:
            torch.save(ref, f"{base}/{name}_ref.pt")
        m2, o2 = fresh(wrap, make=make)
        load_into(m2, o2, f"{base}/{name}")
        out[f"load_2to2_{name}"] = diff(full_state(m2, o2), ref) or "ok"
        if name == "tp":
            w = m2[0].weight
            out["tp_sharded"] = (tuple(w.to_local().shape) == (8, 6)
                                 and tuple(m2[2].weight.to_local().shape) == (6, 8))

    # async_save of FSDP2 state on 2 ranks (staged to CPU, written by a thread
    # whose collectives run on a gloo group, apart from training's on "tpu")
    ckpt_group = dist.new_group(backend="gloo")
    m = fsdp(mlp().to("tpu"))
    o = train(m, rank=rank, world=world)
    ref = full_state(m, o)
    msd, osd = get_state_dict(m, o)
    fut = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=f"{base}/async",
                         process_group=ckpt_group)
    step(m, o, seed=2, rank=rank, world=world)   # training goes on while it writes
    fut.result()
    if rank == 0:
        torch.save(ref, f"{base}/async_ref.pt")
    m2, o2 = fresh(fsdp)
    load_into(m2, o2, f"{base}/async")
    out["load_2to2_async"] = diff(full_state(m2, o2), ref) or "ok"

    # async_save in a checkpoint process of its own (its own gloo group)
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    ref = full_state(m, o)
    msd, osd = get_state_dict(m, o)
    fut = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=f"{base}/async_process",
                         async_checkpointer_type=AsyncCheckpointerType.PROCESS)
    step(m, o, seed=3, rank=rank, world=world)
    fut.result()
    if rank == 0:
        torch.save(ref, f"{base}/async_process_ref.pt")
    m2, o2 = fresh(fsdp)
    load_into(m2, o2, f"{base}/async_process")
    out["load_2to2_async_process"] = diff(full_state(m2, o2), ref) or "ok"

    # a full state dict on rank 0 only, broadcast into FSDP2 shards (model and
    # optimizer in separate calls, as set_state_dict with an empty dict on the
    # other ranks would treat their call as optimizer-only)
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict, set_optimizer_state_dict)
    m3, o3 = fresh(fsdp)
    # (set_*_state_dict put the loaded DTensors into the dicts they are given: a copy)
    full = copy.deepcopy(ref) if rank == 0 else ({}, {})
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(m3, full[0], options=opts)
    set_optimizer_state_dict(m3, o3, full[1], options=opts)
    out["broadcast_from_rank0"] = diff(full_state(m3, o3), ref) or "ok"
    out["seconds"] = time.monotonic() - t0
    report(**{f"{k}_{rank}": v for k, v in out.items()})
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""

def _checkpoint_runs(base, model, single, script, timeout, label):
    """A one-process save of `model` (and its full state, the reference) under
    base/`single`, then `script` on 2 ranks; (base dir, merged rank results)."""
    ns = _ns()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        m = ns[model]().to("tpu")
        o = ns["train"](m)
        ns["save_from"](m, o, str(base / single))
    torch.save(ns["full_state"](m, o), base / f"{single}_ref.pt")
    t0 = time.monotonic()
    runs = run_ranks(base, script, env=_env(DCP_BASE=str(base)), timeout=timeout)
    elapsed = time.monotonic() - t0
    for rc, _, log in runs:
        assert rc == 0, log[-4000:]
    res = {}
    for _, r, _ in runs:
        res.update(r)
    res["wall"] = elapsed
    print(f"{label}: {elapsed:.1f} s wall, {res.get('seconds_0', 0):.1f} s after init")
    return base, res


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """The single-process checkpoint, then the default 2-rank run; (base dir, results)."""
    return _checkpoint_runs(tmp_path_factory.mktemp("dcp"), "mlp", "single", TWO_RANKS,
                            240, "2-rank run")


def _load_single(ns, path, device="tpu"):
    """Load checkpoint `path` into a fresh plain model + AdamW in this process (no group)."""
    m, o = ns["fresh"](device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ns["load_into"](m, o, str(path))
    return m, o


def test_single_process_save_load(tmp_path):
    """No process group: model + AdamW round trip bit-equal, sync and async_save."""
    assert not dist.is_initialized(), "an earlier test left its process group behind"
    ns = _ns()
    m = ns["mlp"]().to("tpu")
    o = ns["train"](m)
    ref = ns["full_state"](m, o)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ns["save_from"](m, o, str(tmp_path / "sync"))
        msd, osd = ns["get_state_dict"](m, o)
        fut = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "async"))
        fut.result()
    loaded = {}
    for name in ("sync", "async"):
        m2, o2 = loaded[name] = _load_single(ns, tmp_path / name)
        assert next(m2.parameters()).device.type == "tpu"
        assert ns["diff"](ns["full_state"](m2, o2), ref) is None, name
    # training continues identically from the loaded state
    ns["step"](m, o, seed=2)
    m2, o2 = loaded["async"]
    ns["step"](m2, o2, seed=2)
    assert ns["diff"](ns["full_state"](m2, o2), ns["full_state"](m, o)) is None


def test_load_1_to_2(ckpts):
    """A single-process checkpoint into FSDP2 (8/7 row shards) and replicated modules."""
    _, res = ckpts
    for r in (0, 1):
        assert res[f"load_1to2_fsdp_{r}"] == "ok", res
        assert res[f"load_1to2_plain_{r}"] == "ok", res
        assert res[f"fsdp_sharded_{r}"] is True


@pytest.mark.parametrize("name", ["plain", "fsdp"])
def test_save_2_load_2(ckpts, name):
    """Saved by 2 ranks, reloaded by 2 ranks; one more AdamW step matches the original."""
    _, res = ckpts
    for r in (0, 1):
        assert res[f"load_2to2_{name}_{r}"] == "ok", res
        assert res[f"resume_{name}_{r}"] == "ok", res


@pytest.mark.parametrize("name", ["plain", "fsdp"])
def test_save_2_load_1(ckpts, name):
    """Saved by 2 ranks (FSDP2: one shard file each), loaded by one process without a group."""
    base, _ = ckpts
    ns = _ns()
    files = sorted(p.name for p in (base / name).iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"], files
    m, o = _load_single(ns, base / name)
    ref = torch.load(base / f"{name}_ref.pt")
    assert ns["diff"](ns["full_state"](m, o), ref) is None


def test_missing_shard_on_two_ranks(ckpts):
    _, res = ckpts
    for r in (0, 1):
        assert res[f"missing_2ranks_{r}"].startswith("CheckpointException"), res
        assert "__1_0.distcp" in res[f"missing_2ranks_{r}"], res


def _damage(src, dst, how):
    shutil.copytree(src, dst)
    f = dst / "__1_0.distcp"
    if how == "truncated":
        size = f.stat().st_size
        with open(f, "r+b") as fh:
            fh.truncate(size // 2)
    else:
        f.unlink()


@pytest.mark.parametrize("how", ["truncated", "missing"])
def test_damaged_shard_raises_like_cpu(ckpts, tmp_path, how):
    """A damaged shard of a 2-rank checkpoint: DCP's CheckpointException, as for CPU tensors."""
    base, _ = ckpts
    ns = _ns()
    bad = tmp_path / "bad"
    _damage(base / "fsdp", bad, how)
    causes, after = {}, {}
    for device in ("cpu", "tpu"):
        m, o = ns["fresh"](device=device)
        with pytest.raises(CheckpointException) as info:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                ns["load_into"](m, o, str(bad))
        ((cause, _tb),) = info.value.failures.values()  # (exception, traceback) per rank
        causes[device] = (type(cause), str(cause))
        after[device] = {k: v.detach().cpu() for k, v in m.state_dict().items()}
    assert causes["tpu"] == causes["cpu"]
    # DCP reads in place: what the intact file held may have reached the
    # module before the error, on CPU as on tpu (the same values either way)
    assert ns["diff"](after["tpu"], after["cpu"]) is None
    if how == "missing":
        assert issubclass(causes["tpu"][0], FileNotFoundError), causes


@pytest.fixture(scope="module")
def slow_ckpts(tmp_path_factory):
    return _checkpoint_runs(tmp_path_factory.mktemp("dcp_slow"), "tp_mlp", "single_tp",
                            SLOW_TWO_RANKS, 300, "slow 2-rank run")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "tp", "async", "async_process"])
def test_slow_save_2_load_2_and_1(slow_ckpts, name):
    """DDP, tensor parallel (Colwise/Rowwise DTensors), async_save (thread, process): 2 -> 2, 2 -> 1."""
    base, res = slow_ckpts
    for r in (0, 1):
        assert res[f"load_2to2_{name}_{r}"] == "ok", res
        if name == "tp":
            assert res[f"tp_sharded_{r}"] is True, res
    ns = _ns()
    m, o = ns["fresh"](make=ns["tp_mlp"] if name == "tp" else ns["mlp"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ns["load_into"](m, o, str(base / name))
    ref = torch.load(base / f"{name}_ref.pt")
    assert ns["diff"](ns["full_state"](m, o), ref) is None


@pytest.mark.slow
def test_slow_load_1_to_2_tensor_parallel(slow_ckpts):
    """A single-process checkpoint loaded into Colwise/Rowwise DTensors on 2 ranks."""
    _, res = slow_ckpts
    for r in (0, 1):
        assert res[f"load_1to2_tp_{r}"] == "ok", res


@pytest.mark.slow
def test_slow_broadcast_from_rank0(slow_ckpts):
    """set_state_dict(full_state_dict, broadcast_from_rank0) into FSDP2 shards."""
    _, res = slow_ckpts
    for r in (0, 1):
        assert res[f"broadcast_from_rank0_{r}"] == "ok", res


def test_one_rank_group_async_save_and_broadcast_from_rank0(ckpts, tmp_path):
    """With a one-process "tpu" group: async_save on the default group,
    broadcast_from_rank0, and the 2-rank FSDP2 checkpoint into FSDP2 on 1 rank.

    Both read the group's `_device_types` (empty for a Python process group
    before torch_tpu declared tpu and cpu): async_save refused the group,
    and the broadcast indexed the empty list.
    """
    import copy
    from datetime import timedelta

    assert not dist.is_initialized(), "an earlier test left its process group behind"
    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    try:
        ns = _ns()
        m = ns["mlp"]().to("tpu")
        o = ns["train"](m)
        ref = ns["full_state"](m, o)
        msd, osd = ns["get_state_dict"](m, o)
        dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path)).result()
        m2, o2 = ns["fresh"]()
        ns["load_into"](m2, o2, str(tmp_path))
        assert ns["diff"](ns["full_state"](m2, o2), ref) is None

        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, set_model_state_dict, set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        m3, o3 = ns["fresh"]()
        full = copy.deepcopy(ref)
        set_model_state_dict(m3, full[0], options=opts)
        set_optimizer_state_dict(m3, o3, full[1], options=opts)
        assert ns["diff"](ns["full_state"](m3, o3), ref) is None

        # 2 -> 1 with a group: FSDP2 on a one-device mesh
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        base, _ = ckpts
        mesh = init_device_mesh("tpu", (1,))

        def fsdp(model):
            for layer in (model[0], model[2]):
                fully_shard(layer, mesh=mesh)
            return fully_shard(model, mesh=mesh)

        m4, o4 = ns["fresh"](fsdp)
        ns["load_into"](m4, o4, str(base / "fsdp"))
        assert ns["diff"](ns["full_state"](m4, o4), torch.load(base / "fsdp_ref.pt")) is None
    finally:
        dist.destroy_process_group()
