"""torch.distributed backend "tpu" (torch_tpu.distributed), tested with real processes.

Multi-process tests start 2 processes on localhost (loopback ports only),
each with its own `tpu:0` (an XLA:CPU device; collectives run through
gloo), bounded by timeouts:

- every collective against expected values (launched as a 2-"host" torchrun:
  the multi-host code path, one coordinator), async work handles, CPU
  tensors, object collectives, subgroups, point to point, the c10d
  functional collectives, and a shape mismatch (an error on both ranks, the
  group still usable afterwards);
- DDP (mp.spawn): 10 steps equal single-process training on the
  concatenated batch;
- tensor parallelism: init_device_mesh("tpu", (2,)) + parallelize_module
  (Colwise/Rowwise) on an MLP and an attention block equal the unsharded
  modules, eager and under torch.compile; a compiled graph with a
  functional collective is one SPMD program containing the collective;
- a 2-D mesh (slow set, CI's slow tier): 8 processes, (dp=2, tp=4), the
  Llama example's tensor-parallel plan on tp and FSDP2 on dp, equal to
  training the unsharded model;
- faults: a rank that dies (error on the survivor at once) and a rank that
  hangs (timeout error after the group's timeout, then a prompt exit).

In-process: registration, a single-process group, errors before init, the
launch environment helper. Test code never changes this process's
environment (subprocesses get their own env dicts; monkeypatch otherwise).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torch_tpu  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]),
        TORCH_TPU_HEARTBEAT_TIMEOUT="30",
        TORCH_TPU_SHUTDOWN_TIMEOUT="30",
        PYTHONUNBUFFERED="1",
        TORCH_TPU_CPU_FALLBACK="1",
    )
    for k in ("TORCH_TPU_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "RANK", "WORLD_SIZE",
              "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


PRELUDE = textwrap.dedent("""
    import json, os, sys, time, datetime
    import torch, torch.distributed as dist
    def report(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
""")


def _results(out: str) -> dict:
    res = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res.update(json.loads(line[len("RESULT "):]))
    return res


def _run(procs, timeout):
    """Wait for all processes (killing all at the deadline); (rc, stdout, stderr) each."""
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, e = p.communicate()
            outs.append((None, o, e))
            continue
        outs.append((p.returncode, o, e))
    return outs


def run_ranks(tmp_path, body, n=2, timeout=150, launcher="env", env=None):
    """Run `body` in n processes on localhost; returns [(rc, results dict, stdout+stderr)]."""
    script = tmp_path / "rank_script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    port = _free_port()
    env = dict(env or _env())
    procs = []
    for r in range(n):
        if launcher == "torchrun":
            # One torchrun agent per "host" (static rendezvous): the multi-host launch.
            cmd = [PY, "-m", "torch.distributed.run", f"--nnodes={n}", f"--node-rank={r}",
                   "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
                   str(script)]
            penv = env
        else:
            cmd = [PY, str(script)]
            penv = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                        WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n))
        procs.append(subprocess.Popen(cmd, env=penv, cwd=str(tmp_path), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return [(rc, _results(o), o + e) for rc, o, e in _run(procs, timeout)]


def _assert_ok(runs):
    for rc, _res, log in runs:
        assert rc == 0, log[-4000:]


# --------------------------------------------------------------------------
# in-process


def test_backend_registered():
    assert "tpu" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["tpu"] == ["tpu"]
    assert dist.Backend.default_device_backend_map.get("tpu") == "tpu"
    # registration must not take over the CPU's default backend
    assert dist.Backend.default_device_backend_map.get("cpu") == "gloo"


def test_collective_before_init_is_a_clear_error():
    assert not dist.is_initialized(), "an earlier test left its process group behind"
    t = torch.ones(2, device="tpu")
    with pytest.raises((RuntimeError, ValueError), match="not been initialized|init_process_group"):
        dist.all_reduce(t)
    from torch_tpu.distributed import process_group as pgm, runtime

    if not runtime.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            runtime.state()
    del pgm


def test_single_process_group():
    """world_size 1: the same code path with a one-device mesh."""
    assert not dist.is_initialized(), "an earlier test left its process group behind"
    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    try:
        pg = dist.distributed_c10d._get_default_group()
        assert type(pg).__name__ == "ProcessGroupTPU" and pg.size() == 1
        assert dist.get_backend() == "tpu"
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3).to("tpu")
        dist.all_reduce(x)
        assert x.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
        out = torch.empty(2, 3, device="tpu")
        dist.all_gather_into_tensor(out, x)
        torch.testing.assert_close(out.cpu(), x.cpu())
        w = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
        assert w.wait() and w.is_completed()
        assert w.get_future().wait()[0] is x
        dist.barrier()
        # a one-process DDP step equals plain training
        model = torch.nn.Linear(3, 2).to("tpu")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(x).sum().backward()
        assert model.weight.grad is not None
        torch.testing.assert_close(model.weight.grad.cpu(), x.cpu().sum(0).expand(2, 3))
    finally:
        dist.destroy_process_group()


def test_set_tpu_launch_env(monkeypatch):
    from torch_tpu.distributed import set_tpu_launch_env

    keys = ["TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
            "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT", "CLOUD_TPU_TASK_ID",
            "CUDA_VISIBLE_DEVICES", "XLA_FLAGS", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]
    for k in keys:
        # setenv first: it records the variable's state before the test (absent
        # or a value), which the undo restores; delenv(raising=False) of an
        # absent variable records nothing, and what set_tpu_launch_env sets
        # below would outlive the test.
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    env = set_tpu_launch_env(local_rank=2, local_world_size=4, platform="tpu")
    assert env["TPU_VISIBLE_CHIPS"] == "2" and os.environ["TPU_VISIBLE_CHIPS"] == "2"
    assert env["TPU_PROCESS_BOUNDS"] == "4,1,1"
    assert env["TPU_PROCESS_ADDRESSES"].count("localhost:") == 4
    assert env["TPU_PROCESS_PORT"] == str(8476 + 2) and env["CLOUD_TPU_TASK_ID"] == "2"
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "7")
    env = set_tpu_launch_env(local_rank=1, local_world_size=2, platform="tpu", only_if_unset=True)
    assert "TPU_VISIBLE_CHIPS" not in env and os.environ["TPU_VISIBLE_CHIPS"] == "7"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --foo")
    set_tpu_launch_env(local_rank=0, local_world_size=2, platform="cpu")
    assert os.environ["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=1"
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert set_tpu_launch_env(platform="gpu") == {"CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(ValueError):
        set_tpu_launch_env(local_rank=3, local_world_size=2, platform="tpu")


# --------------------------------------------------------------------------
# every collective, 2 processes (a 2-host torchrun launch on localhost)

COLLECTIVES = """
dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=60))
r, n = dist.get_rank(), dist.get_world_size()
dev = "tpu"
out = {"rank": r, "world": n, "device_count": torch.tpu.device_count(),
       "local_rank": int(os.environ.get("LOCAL_RANK", -1))}
def L(t):
    return t.detach().cpu().tolist()

x = torch.tensor([1.0, -2.0, 3.5], device=dev) * (r + 1)
for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
    y = x.clone(); dist.all_reduce(y, op=getattr(dist.ReduceOp, op)); out["all_reduce_" + op] = L(y)
y = torch.tensor([[1, 2], [3, 4]], device=dev) + 10 * r; dist.all_reduce(y); out["all_reduce_int64"] = L(y)
y = torch.tensor([r == 0, False, True], device=dev); dist.all_reduce(y); out["all_reduce_bool"] = L(y)
y = torch.tensor([1.5, 2.25], device=dev, dtype=torch.bfloat16) * (r + 1); dist.all_reduce(y)
out["all_reduce_bf16"] = L(y.float())
y = torch.tensor(float(r + 1), device=dev); dist.all_reduce(y); out["all_reduce_0d"] = L(y)
big = torch.arange(12.0, device=dev).reshape(3, 4)
view = big[:, 1]; dist.all_reduce(view); out["all_reduce_view"] = L(big)
y = torch.tensor([5, 6, 7], device=dev, dtype=torch.int32) + r
dist.all_reduce(y, op=dist.ReduceOp.BXOR); out["all_reduce_bxor"] = L(y)
y = torch.full((2, 2), float(r), device=dev); dist.broadcast(y, src=1); out["broadcast"] = L(y)
y = torch.tensor([-0.0, float("inf"), float("nan")], device=dev) if r == 0 else torch.zeros(3, device=dev)
dist.broadcast(y, src=0); out["broadcast_special"] = [str(v) for v in L(y)]
y = torch.tensor([1.0 + 2.0j, -3.0j], device=dev) * (r + 1); dist.all_reduce(y)
out["all_reduce_complex"] = [[v.real, v.imag] for v in y.cpu().tolist()]
lst = [torch.empty(2, device=dev) for _ in range(n)]
dist.all_gather(lst, torch.tensor([r, 10.0 + r], device=dev)); out["all_gather"] = [L(t) for t in lst]
o = torch.empty(2 * n, 2, device=dev); dist.all_gather_into_tensor(o, torch.full((2, 2), float(r), device=dev))
out["all_gather_into_tensor"] = L(o)
i = torch.arange(4.0 * n, device=dev).reshape(2 * n, 2) * (r + 1)
o = torch.empty(2, 2, device=dev); dist.reduce_scatter_tensor(o, i); out["reduce_scatter_tensor"] = L(o)
o = torch.empty(2, 2, device=dev); dist.reduce_scatter_tensor(o, i, op=dist.ReduceOp.AVG); out["reduce_scatter_avg"] = L(o)
o = torch.empty(2, device=dev)
dist.reduce_scatter(o, [torch.full((2,), float(r + 10 * j), device=dev) for j in range(n)]); out["reduce_scatter_list"] = L(o)
i = torch.arange(2.0 * n, device=dev) + 100 * r; o = torch.empty(2 * n, device=dev)
dist.all_to_all_single(o, i); out["all_to_all_single"] = L(o)
# uneven: rank 0 sends 1 row to 0 and 2 to 1; rank 1 sends 3 rows to 0 and 1 to 1
ins = [[1, 2], [3, 1]][r]; outs = [[1, 3], [2, 1]][r]
i = torch.arange(float(sum(ins)), device=dev).unsqueeze(1).repeat(1, 2) + 100 * r
o = torch.empty(sum(outs), 2, device=dev); dist.all_to_all_single(o, i, outs, ins); out["all_to_all_uneven"] = L(o)
outl = [torch.empty(1, device=dev) for _ in range(n)]
dist.all_to_all(outl, [torch.tensor([10.0 * r + j], device=dev) for j in range(n)]); out["all_to_all_list"] = [L(t) for t in outl]
y = torch.tensor([1.0, 2.0], device=dev) * (r + 1); dist.reduce(y, dst=0); out["reduce"] = L(y)
g = [torch.empty(1, device=dev) for _ in range(n)] if r == 1 else None
dist.gather(torch.tensor([r + 0.5], device=dev), g, dst=1); out["gather"] = [L(t) for t in g] if g else None
s = torch.empty(2, device=dev)
dist.scatter(s, [torch.full((2,), 7.0 + j, device=dev) for j in range(n)] if r == 0 else None, src=0)
out["scatter"] = L(s)
dist.barrier(); out["barrier"] = True
if r == 0:
    dist.send(torch.tensor([7.0, 8.0], device=dev), dst=1)
    z = torch.zeros(2, dtype=torch.int64, device=dev); dist.recv(z, src=1); out["recv"] = L(z)
else:
    z = torch.zeros(2, device=dev); dist.recv(z, src=0); out["recv"] = L(z)
    dist.send(torch.tensor([3, 4], device=dev), dst=0)
w = dist.all_reduce(torch.ones(3, device=dev), async_op=True)
fut = w.get_future().then(lambda f: f.value()[0] * 10)
out["async"] = [w.wait(), w.is_completed(), L(fut.wait())]
c = torch.tensor([float(r), 1.0]); dist.all_reduce(c); out["cpu_tensor"] = L(c)
objs = [None] * n; dist.all_gather_object(objs, {"rank": r}); out["all_gather_object"] = objs
lst = [{"a": 1}, None] if r == 0 else [None, None]; dist.broadcast_object_list(lst, src=0)
out["broadcast_object_list"] = lst
sub = dist.new_group([1])
if r == 1:
    y = torch.tensor([2.0], device=dev); dist.all_reduce(y, group=sub); out["subgroup"] = L(y)
both = dist.new_group([0, 1])
y = torch.tensor([float(r)], device=dev); dist.all_reduce(y, group=both); out["subgroup_all"] = L(y)
import torch.distributed._functional_collectives as funcol
W = dist.group.WORLD
t = torch.tensor([1.0, 2.0], device=dev) * (r + 1)
out["funcol_all_reduce"] = L(funcol.all_reduce(t, "sum", W))
out["funcol_all_gather"] = L(funcol.all_gather_tensor(t, 0, W))
out["funcol_reduce_scatter"] = L(funcol.reduce_scatter_tensor(torch.arange(4.0, device=dev) * (r + 1), "sum", 0, W))
out["funcol_all_to_all"] = L(funcol.all_to_all_single(torch.arange(2.0, device=dev) + 10 * r, None, None, W))
out["funcol_broadcast"] = L(funcol.broadcast(t, 1, W))
# a shape mismatch: an error on every rank, and the group stays usable
try:
    dist.all_reduce(torch.ones(3 if r == 0 else 4, device=dev)); out["mismatch"] = "no error"
except Exception as e:
    out["mismatch"] = f"{type(e).__name__}: {e}"
y = torch.ones(2, device=dev); dist.all_reduce(y); out["after_mismatch"] = L(y)
report(**out)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collectives")
    # 4 virtual CPU devices per process are asked for: each rank must still see one.
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    runs = run_ranks(tmp, COLLECTIVES, launcher="torchrun", env=env, timeout=240)
    _assert_ok(runs)
    by_rank = {res["rank"]: res for _, res, _ in runs}
    assert sorted(by_rank) == [0, 1], [log[-2000:] for _, _, log in runs]
    return by_rank


def _both(collectives, key):
    return collectives[0][key], collectives[1][key]


def test_launch_one_device_per_process(collectives):
    for r in (0, 1):
        assert collectives[r]["world"] == 2
        assert collectives[r]["device_count"] == 1
        assert collectives[r]["local_rank"] == 0  # one process per "host"


@pytest.mark.parametrize("op,expect", [
    ("SUM", [3.0, -6.0, 10.5]), ("AVG", [1.5, -3.0, 5.25]), ("MAX", [2.0, -2.0, 7.0]),
    ("MIN", [1.0, -4.0, 3.5]), ("PRODUCT", [2.0, 8.0, 24.5])])
def test_all_reduce_ops(collectives, op, expect):
    for v in _both(collectives, "all_reduce_" + op):
        assert v == pytest.approx(expect)


def test_all_reduce_dtypes_and_layouts(collectives):
    for r in (0, 1):
        c = collectives[r]
        assert c["all_reduce_int64"] == [[12, 14], [16, 18]]
        assert c["all_reduce_bool"] == [True, False, True]
        assert c["all_reduce_bf16"] == [4.5, 6.75]
        assert c["all_reduce_0d"] == 3.0
        assert c["all_reduce_view"] == [[0, 2, 2, 3], [4, 10, 6, 7], [8, 18, 10, 11]]
        assert c["all_reduce_bxor"] == [5 ^ 6, 6 ^ 7, 7 ^ 8]
        assert c["all_reduce_complex"] == [[3.0, 6.0], [0.0, -9.0]]


def test_broadcast(collectives):
    for r in (0, 1):
        assert collectives[r]["broadcast"] == [[1.0, 1.0], [1.0, 1.0]]
        # bit-exact: -0.0 keeps its sign, inf and nan arrive
        assert collectives[r]["broadcast_special"] == ["-0.0", "inf", "nan"]


def test_all_gather(collectives):
    for r in (0, 1):
        c = collectives[r]
        assert c["all_gather"] == [[0.0, 10.0], [1.0, 11.0]]
        assert c["all_gather_into_tensor"] == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert c["funcol_all_gather"] == [1.0, 2.0, 2.0, 4.0]


def test_reduce_scatter(collectives):
    full = [[3 * v for v in (2 * i, 2 * i + 1)] for i in range(4)]
    assert collectives[0]["reduce_scatter_tensor"] == full[:2]
    assert collectives[1]["reduce_scatter_tensor"] == full[2:]
    assert collectives[1]["reduce_scatter_avg"] == [[v / 2 for v in row] for row in full[2:]]
    assert collectives[0]["reduce_scatter_list"] == [1.0, 1.0]
    assert collectives[1]["reduce_scatter_list"] == [21.0, 21.0]
    assert collectives[0]["funcol_reduce_scatter"] == [0.0, 3.0]
    assert collectives[1]["funcol_reduce_scatter"] == [6.0, 9.0]


def test_all_to_all(collectives):
    assert collectives[0]["all_to_all_single"] == [0.0, 1.0, 100.0, 101.0]
    assert collectives[1]["all_to_all_single"] == [2.0, 3.0, 102.0, 103.0]
    # rank 0 gets its own row 0 and rank 1's rows 0-2; rank 1 gets rank 0's rows 1-2 and its row 3
    assert collectives[0]["all_to_all_uneven"] == [[0, 0], [100, 100], [101, 101], [102, 102]]
    assert collectives[1]["all_to_all_uneven"] == [[1, 1], [2, 2], [103, 103]]
    assert collectives[0]["all_to_all_list"] == [[0.0], [10.0]]
    assert collectives[1]["all_to_all_list"] == [[1.0], [11.0]]
    assert collectives[0]["funcol_all_to_all"] == [0.0, 10.0]
    assert collectives[1]["funcol_all_to_all"] == [1.0, 11.0]


def test_rooted_collectives(collectives):
    assert collectives[0]["reduce"] == [3.0, 6.0]
    assert collectives[1]["gather"] == [[0.5], [1.5]]
    assert collectives[0]["scatter"] == [7.0, 7.0] and collectives[1]["scatter"] == [8.0, 8.0]
    assert collectives[0]["recv"] == [3, 4] and collectives[1]["recv"] == [7.0, 8.0]
    for r in (0, 1):
        assert collectives[r]["barrier"] is True


def test_async_cpu_objects_subgroups(collectives):
    for r in (0, 1):
        c = collectives[r]
        assert c["async"] == [True, True, [20.0, 20.0, 20.0]]
        assert c["cpu_tensor"] == [1.0, 2.0]
        assert c["all_gather_object"] == [{"rank": 0}, {"rank": 1}]
        assert c["broadcast_object_list"] == [{"a": 1}, None]
        assert c["subgroup_all"] == [1.0]
        assert c["funcol_all_reduce"] == [3.0, 6.0]
        assert c["funcol_broadcast"] == [2.0, 4.0]
    assert collectives[1]["subgroup"] == [2.0]


def test_shape_mismatch_is_an_error_on_every_rank(collectives):
    for r in (0, 1):
        msg = collectives[r]["mismatch"]
        assert msg.startswith("CollectiveError") and "mismatch" in msg
        assert "float32[3]" in msg and "float32[4]" in msg
        assert collectives[r]["after_mismatch"] == [2.0, 2.0]


# --------------------------------------------------------------------------
# DDP (mp.spawn)

DDP_SCRIPT = """
import copy
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def main(rank, world, port):
    dist.init_process_group("tpu", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    if rank == 1:  # DDP broadcasts rank 0's parameters at construction
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ref = copy.deepcopy(model).to("tpu")
    if rank == 1:
        with torch.no_grad():
            for p in ref.parameters():
                p.sub_(1.0)
    # small buckets: several all-reduces per step
    ddp = DDP(copy.deepcopy(model).to("tpu"), bucket_cap_mb=0.0002)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 4, generator=g))
            for _ in range(2)]
    losses = []
    for step in range(10):
        x, y = data[step % 2]
        xs, ys = x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")
        loss = torch.nn.functional.mse_loss(ddp(xs), ys)
        opt.zero_grad(); loss.backward(); opt.step()
        rl = torch.nn.functional.mse_loss(ref(x.to("tpu")), y.to("tpu"))
        ropt.zero_grad(); rl.backward(); ropt.step()
        losses.append(rl.item())
    diff = max((a.detach().cpu() - b.detach().cpu()).abs().max().item()
               for a, b in zip(ddp.module.parameters(), ref.parameters()))
    with open(f"result_{rank}.json", "w") as f:  # the ranks share one stdout
        json.dump({"rank": rank, "diff": diff, "losses": losses}, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(2, int(sys.argv[1])), nprocs=2)
"""


def test_ddp_matches_single_process(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(PRELUDE + textwrap.dedent(DDP_SCRIPT))
    p = subprocess.Popen([PY, str(script), str(_free_port())], env=_env(), cwd=str(tmp_path),
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    (rc, o, e), = _run([p], 180)
    assert rc == 0, (o + e)[-4000:]
    lines = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in (0, 1)]
    assert sorted(x["rank"] for x in lines) == [0, 1]
    for x in lines:
        assert x["diff"] < 1e-5, x
        assert x["losses"][-1] < x["losses"][0]


# --------------------------------------------------------------------------
# FSDP2 (fully_shard, mp.spawn)

FSDP_SCRIPT = """
import copy
import torch.multiprocessing as mp
import torch.nn as nn

def main(rank, world, port):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
    dist.init_process_group("tpu", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("tpu", (world,))
    out = {"rank": rank}
    for name, kw in (("default", {}), ("no_reshard", {"reshard_after_forward": False}),
                     ("bf16", {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                 reduce_dtype=torch.float32)})):
        torch.manual_seed(0)
        # hidden size 15: the first layer's rows do not divide evenly over 2 ranks
        base = nn.Sequential(nn.Linear(8, 15), nn.ReLU(), nn.Linear(15, 4))
        ref = copy.deepcopy(base).to("tpu")
        model = copy.deepcopy(base).to("tpu")
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 4, generator=g))
                for _ in range(2)]
        losses, norms = [], []
        for step in range(10):
            x, y = data[step % 2]
            xs, ys = x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu")
            loss = torch.nn.functional.mse_loss(model(xs), ys)
            opt.zero_grad(); loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)
            opt.step()
            rl = torch.nn.functional.mse_loss(ref(x.to("tpu")), y.to("tpu"))
            ropt.zero_grad(); rl.backward()
            rnorm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e6)
            ropt.step()
            losses.append(rl.item())
            norms.append(abs((norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
                             - rnorm.item()))
        w = model[0].weight
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        out[name] = {
            "diff": max((a.full_tensor().detach().cpu() - b.detach().cpu()).abs().max().item()
                        for a, b in zip(model.parameters(), ref.parameters())),
            "state_dict": max((full[k].cpu() - v.detach().cpu()).abs().max().item()
                              for k, v in ref.state_dict().items()),
            "norm_diff": max(norms), "losses": losses,
            "sharded": isinstance(w, DTensor) and w.placements == (Shard(0),)
                       and tuple(w.to_local().shape) == ((8,) if rank == 0 else (7,)) + (8,)
                       and isinstance(w.grad, DTensor),
        }
    with open(f"result_{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(2, int(sys.argv[1])), nprocs=2)
"""


def test_fsdp2_matches_single_process(tmp_path):
    """fully_shard over 2 processes: 10 SGD steps equal training on the full batch."""
    script = tmp_path / "fsdp.py"
    script.write_text(PRELUDE + textwrap.dedent(FSDP_SCRIPT))
    p = subprocess.Popen([PY, str(script), str(_free_port())], env=_env(), cwd=str(tmp_path),
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    (rc, o, e), = _run([p], 240)
    assert rc == 0, (o + e)[-4000:]
    res = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in (0, 1)]
    for r in res:
        for name in ("default", "no_reshard"):
            x = r[name]
            assert x["sharded"], (name, x)
            assert x["diff"] < 1e-5 and x["state_dict"] < 1e-5 and x["norm_diff"] < 1e-4, (name, x)
            assert x["losses"][-2] < x["losses"][0]  # the same batch, 8 steps later
        # bfloat16 parameters in forward/backward: close to the float32 reference
        assert r["bf16"]["sharded"] and r["bf16"]["diff"] < 5e-2, r["bf16"]


# --------------------------------------------------------------------------
# tensor parallelism (DTensor) and compiled graphs

TP_SCRIPT = """
import copy, warnings
import torch.nn as nn, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor import DTensor
import torch.distributed._functional_collectives as funcol
from torch_tpu.runtime import executor

programs = []
executor.COMPILE_LISTENERS.append(
    lambda name, key, secs, c: programs.append(
        (str(key[0]) if isinstance(key, tuple) else None, "all-reduce" in c.as_text())))
dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=90))
r, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("tpu", (n,))

class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.w1 = nn.Linear(8, 16); s.w2 = nn.Linear(16, 8)
    def forward(s, x):
        return s.w2(F.relu(s.w1(x)))

class Attention(nn.Module):
    def __init__(s, d=16, heads=4):
        super().__init__(); s.hd = d // heads
        s.wq, s.wk, s.wv, s.wo = (nn.Linear(d, d) for _ in range(4))
    def forward(s, x):
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, -1, s.hd).transpose(1, 2) for w in (s.wq, s.wk, s.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return s.wo(o.transpose(1, 2).reshape(B, T, -1))

def grads(m):
    return [(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).cpu()
            for p in m.parameters()]

out = {"rank": r}
torch.manual_seed(0)
cases = [("mlp", MLP, {"w1": ColwiseParallel(), "w2": RowwiseParallel()}, (4, 8), False),
         ("attention", Attention, {"wq": ColwiseParallel(), "wk": ColwiseParallel(),
                                   "wv": ColwiseParallel(), "wo": RowwiseParallel()}, (2, 5, 16), False),
         ("mlp_compiled", MLP, {"w1": ColwiseParallel(), "w2": RowwiseParallel()}, (4, 8), True)]
for name, mk, plan, shape, compiled in cases:
    base = mk()
    ref = copy.deepcopy(base).to("tpu")
    tp = parallelize_module(copy.deepcopy(base).to("tpu"), mesh, plan)
    run = torch.compile(tp, backend="tpu") if compiled else tp
    x = torch.randn(*shape).to("tpu")
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        y = run(x)
        (y * y).sum().backward()
    ry = ref(x); (ry * ry).sum().backward()
    out[name] = {"fwd": (y.detach().cpu() - ry.detach().cpu()).abs().max().item(),
                 "grad": max((a - b).abs().max().item() for a, b in zip(grads(tp), grads(ref))),
                 "sharded": isinstance(tp.w1.weight if hasattr(tp, "w1") else tp.wq.weight, DTensor),
                 "eager_fallback": [str(w.message)[:200] for w in ws if "op by op" in str(w.message)]}

# a compiled function with a functional collective: one SPMD program with the all-reduce
def f(a, w):
    h = torch.relu(a @ w)
    return funcol.all_reduce(h, "sum", dist.group.WORLD) * 2 + 1
a = (torch.arange(8.0).reshape(2, 4) + r).to("tpu"); w = torch.ones(4, 3).to("tpu")
before = len(programs)
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    got = torch.compile(f, backend="tpu")(a, w)
import torch_tpu.debug
view = torch_tpu.debug.sharding(torch_tpu.debug.last_graphs(1))
out["graph"] = {"value": got.cpu().tolist(), "eager": f(a, w).cpu().tolist(),
                "programs": programs[before:],
                "collectives": [[c.kind, c.bytes, [list(g) for g in c.replica_groups]]
                                for c in view.collectives],
                "warnings": [str(x.message)[:200] for x in ws if "torch_tpu" in str(x.message)
                             or "lowering" in str(x.message)]}
report(**out)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def tensor_parallel(tmp_path_factory):
    runs = run_ranks(tmp_path_factory.mktemp("tp"), TP_SCRIPT, timeout=240)
    _assert_ok(runs)
    return {res["rank"]: res for _, res, _ in runs}


@pytest.mark.parametrize("name", ["mlp", "attention", "mlp_compiled"])
def test_tensor_parallel_matches_unsharded(tensor_parallel, name):
    for r in (0, 1):
        res = tensor_parallel[r][name]
        assert res["sharded"]
        assert res["fwd"] < 1e-5 and res["grad"] < 1e-4, res
        assert not res["eager_fallback"], res


def test_compiled_graph_with_collective(tensor_parallel):
    for r in (0, 1):
        g = tensor_parallel[r]["graph"]
        assert g["value"] == g["eager"] == [[33.0] * 3, [97.0] * 3]
        assert not g["warnings"], g
        # the graph is one SPMD program, and the all-reduce is inside it
        assert ["spmd", True] in g["programs"], g
        # debug.sharding reads it from the program's HLO: relu(a @ w) is f32[2, 3]
        # on each rank, all-reduced over both (plus the input-signature check's
        # all-gather, torch_tpu.distributed.spmd)
        assert ["all-reduce", 2 * 3 * 4, [[0, 1]]] in g["collectives"], g


# --------------------------------------------------------------------------
# faults

DEAD_RANK = """
dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=20))
r = dist.get_rank()
x = torch.ones(4, device="tpu"); dist.all_reduce(x)
if r == 1:
    os._exit(7)   # dies without a word
time.sleep(1.0)
t0 = time.monotonic()
try:
    dist.all_reduce(x); report(rank=r, error=None)
except Exception as e:
    report(rank=r, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
try:
    dist.all_reduce(x); report(later=None)
except Exception as e:
    report(later=str(e))
report(exited_at=time.monotonic())
"""


WARM_RANKS = """
dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=60))
r = dist.get_rank()
x = torch.arange(6.0, device="tpu").reshape(2, 3) * (r + 1)
y = (x.sin() + 1).relu().sum(0)
dist.all_reduce(y)
torch.tpu.synchronize()
stats = torch_tpu.cache.stats()
disk, index = stats["disk"], stats["eager_index"]
report(rank=r, y=y.cpu().tolist(), hits=disk["hits"], misses=disk["misses"], writes=disk["writes"],
       index_hits=index["hits"], index_misses=index["misses"], index_writes=index["writes"])
dist.destroy_process_group()
"""


def test_every_rank_starts_warm(tmp_path):
    """JAX writes persistent-cache entries from process 0 only; the other ranks'
    per-device programs (keyed by their device) must be written too, or each
    rank but the first compiles every op again on every run. Each rank's eager
    index entries are its own: every rank's `tpu:0` is another global device."""
    env = _env(TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))
    body = "import torch_tpu\n" + WARM_RANKS
    cold = run_ranks(tmp_path, body, env=env, timeout=240)
    _assert_ok(cold)
    warm = run_ranks(tmp_path, body, env=env, timeout=240)
    _assert_ok(warm)
    by_rank = {res["rank"]: res for _, res, _ in warm}
    assert sorted(by_rank) == [0, 1]
    for r, res in by_rank.items():
        cold_res = next(c for _, c, _ in cold if c["rank"] == r)
        assert cold_res["writes"] > 0, cold_res           # rank 1 wrote its programs too
        assert res["y"] == cold_res["y"]
        assert res["misses"] == 0 and res["hits"] > 0, (r, res)
        assert cold_res["index_writes"] > 0 and res["index_writes"] == 0, (r, cold_res, res)
        assert res["index_hits"] == cold_res["index_writes"] and res["index_misses"] == 0, res


def _dead_rank(tmp_path):
    runs = run_ranks(tmp_path, DEAD_RANK, timeout=120)
    (rc0, res0, log0), (rc1, _, _) = runs
    assert rc1 == 7
    assert rc0 == 0, log0[-3000:]
    err = res0["error"]
    # the peer's death is what the survivor reports, not the group's timeout
    assert err and err.startswith("CollectiveError"), log0[-3000:]
    assert "peer process" in err and "unusable" in err and "timeout is" not in err
    assert "unusable after an earlier failure" in res0["later"]
    assert "exiting without JAX's distributed shutdown barrier" in log0
    return res0


def test_dead_rank_is_an_error_on_the_survivor(tmp_path):
    _dead_rank(tmp_path)


@pytest.mark.slow  # wall-clock bounds: flaky on a loaded machine, so not in the default run
def test_dead_rank_is_detected_before_the_timeout(tmp_path):
    res0 = _dead_rank(tmp_path)
    assert res0["seconds"] < 20  # well within the group's timeout


HUNG_RANK = """
dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=4))
r = dist.get_rank()
x = torch.ones(4, device="tpu"); dist.all_reduce(x)
if r == 1:
    report(sleep_start=time.monotonic())
    time.sleep(60)   # alive, but never joins the next collective
    report(slept_through=True)   # only if nothing ended this process first
    os._exit(0)
t0 = time.monotonic()
try:
    dist.all_reduce(x); report(error=None)
except Exception as e:
    report(error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
w = dist.all_reduce(x, async_op=True) if False else None
try:
    dist.broadcast(x, 0); report(later=None)
except Exception as e:
    report(later=str(e))
"""


def _hung_rank(tmp_path):
    runs = run_ranks(tmp_path, HUNG_RANK, timeout=120)
    ended = time.monotonic()
    rc0, res0, log0 = runs[0]
    assert rc0 == 0, log0[-3000:]
    err = res0["error"]
    assert err and "timed out" in err and "timeout is 4.0 s" in err, log0[-3000:]
    assert "unusable" in res0["later"]
    # rank 1 does not outlive the coordinator: it never wakes from its 60 s sleep
    rc1, res1, log1 = runs[1]
    assert "sleep_start" in res1, log1[-3000:]
    assert "slept_through" not in res1, log1[-3000:]
    return res0, ended - res1["sleep_start"]


def test_hung_rank_times_out(tmp_path):
    _hung_rank(tmp_path)


@pytest.mark.slow  # wall-clock bounds: flaky on a loaded machine, so not in the default run
def test_hung_rank_times_out_after_the_group_timeout(tmp_path):
    res0, lived = _hung_rank(tmp_path)
    assert 3.5 <= res0["seconds"] < 15
    # measured from the start of rank 1's sleep, so that slow process start-up
    # on a loaded machine does not count
    assert lived < 55, lived


# --------------------------------------------------------------------------
# the all_reduce benchmark (a measurement, never timed here: it runs and prints its table)


@pytest.mark.slow
def test_allreduce_benchmark_runs(tmp_path):
    out_json = tmp_path / "ar.json"
    p = subprocess.Popen([PY, str(ROOT / "benchmarks" / "allreduce.py"), "--sizes", "4096",
                          "--iters", "2", "--json", str(out_json)],
                         env=_env(), cwd=str(tmp_path), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    (rc, o, e), = _run([p], 240)
    assert rc == 0, (o + e)[-4000:]
    lines = [ln for ln in o.splitlines() if ln.strip()]
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["size", "backend"])
    assert "busbw GB/s" in lines[head] and "tpu/gloo" in lines[head]
    assert lines[head + 2].split()[:3] == ["4", "KiB", "gloo"]
    assert lines[head + 3].split()[0] == "tpu"
    data = json.loads(out_json.read_text())
    assert set(data["results"]) == {"gloo", "tpu"}
    for rows in data["results"].values():
        assert [r["size"] for r in rows] == [4096] and rows[0]["ok"]
        assert rows[0]["median"] > 0
    assert data["results"]["tpu"][0]["compile"] > 0  # the first call compiled the program


# --------------------------------------------------------------------------
# 2-D mesh: FSDP2 x tensor parallelism on the Llama example, 8 devices

MESH_2D = """
import copy
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from examples.common.lm import apply_tensor_parallel
from examples.llama.family import FAMILY
from examples.llama.model import Llama, LlamaConfig, lm_loss

dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=120))
r, n = dist.get_rank(), dist.get_world_size()
DP, TP = 2, n // 2
mesh = init_device_mesh("tpu", (DP, TP), mesh_dim_names=("dp", "tp"))
dp_rank = mesh.get_local_rank("dp")
# The Llama example's model; heads divisible by the tp degree, a feed-forward
# hidden size that shards over it.
cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=4,
                  ffn_dim=64, max_seq_len=32)
torch.manual_seed(0)
base = Llama(cfg)
ref = copy.deepcopy(base).to("tpu")
model = copy.deepcopy(base).to("tpu")
apply_tensor_parallel(model, FAMILY, mesh["tp"])       # Megatron plan on the tp axis
for layer in model.layers:                              # FSDP2 on the dp axis
    fully_shard(layer, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.5)
ropt = torch.optim.SGD(ref.parameters(), lr=0.5)
g = torch.Generator().manual_seed(1)
tokens = torch.randint(0, cfg.vocab_size, (2 * DP, 9), generator=g)
x, y = tokens[:, :-1], tokens[:, 1:]
losses, rlosses = [], []
for step in range(3):
    xs, ys = x.chunk(DP)[dp_rank].to("tpu"), y.chunk(DP)[dp_rank].to("tpu")
    loss = lm_loss(model(xs), ys)
    opt.zero_grad(); loss.backward(); opt.step()
    rl = lm_loss(ref(x.to("tpu")), y.to("tpu"))
    ropt.zero_grad(); rl.backward(); ropt.step()
    # the batch mean over dp (each dp rank saw half the batch)
    full = loss.detach().clone(); dist.all_reduce(full, group=mesh.get_group("dp"))
    losses.append(full.item() / DP); rlosses.append(rl.item())
w = model.layers[0].attention.wq.weight
diff = max((a.full_tensor() if isinstance(a, DTensor) else a).detach().cpu().sub(b.detach().cpu())
           .abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
report(rank=r, losses=losses, rlosses=rlosses, diff=diff,
       placements=[str(p) for p in w.placements], local=list(w.to_local().shape),
       mesh=[DP, TP])
dist.destroy_process_group()
"""


@pytest.mark.slow  # 8 processes each compiling a Llama step: minutes on 2 cores (CI's slow tier)
def test_fsdp2_x_tensor_parallel_2d_mesh_llama(tmp_path):
    """8 processes, one device each (XLA:CPU's emulated devices are one per
    process here, as on a TPU host's chips): a (dp=2, tp=4) mesh, the Llama
    example's tensor-parallel plan on "tp" and fully_shard on "dp". Three SGD
    steps equal training the unsharded model on the whole batch, and each weight
    is a DTensor sharded on both axes."""
    runs = run_ranks(tmp_path, MESH_2D, n=8, timeout=900)
    _assert_ok(runs)
    res = {r["rank"]: r for _, r, _ in runs}
    assert sorted(res) == list(range(8))
    for r in res.values():
        assert r["mesh"] == [2, 4]
        # tp's row shard, then fsdp's rows of it: a strided shard on dp
        assert r["placements"] == ["_S(0, 4)", "S(0)"], r
        assert r["local"] == [4, 32], r  # wq: 32 rows / tp 4 / dp 2
        assert r["diff"] < 1e-4, r
        for a, b in zip(r["losses"], r["rlosses"]):
            assert abs(a - b) < 1e-4 * max(1.0, abs(b)), r
        assert r["losses"][-1] < r["losses"][0]
