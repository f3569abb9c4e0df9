# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""08 · Distributed: several `tpu` devices in one process, data parallelism by hand, and DDP/TP processes."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="08 · Distributed")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 08 · Distributed

    Each PJRT device of the platform is a `tpu:N` device: the chips of a TPU
    host, or — on a laptop — as many virtual CPU devices as
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` asks for. This notebook
    shows, with processes it launches itself:

    1. several devices in one process: placing tensors, moving them between
       devices, running ops where the data lives;
    2. data parallelism written by hand across those devices: gradients
       averaged over shards equal the full-batch gradient;
    3. the examples' DDP (`--dp`) and tensor-parallel (`--tp`) training under
       `torchrun`, on torch_tpu's `torch.distributed` backend;
    4. launching on several hosts, timeouts, and the limitations.

    **The backend.** `import torch_tpu` registers the `torch.distributed`
    backend `"tpu"`: one process per device, `dist.init_process_group("tpu")`,
    and every collective compiled as an XLA collective (all-reduce,
    all-gather, …) over the group's devices. DDP, FSDP2 (`fully_shard`) and
    tensor parallelism run on it. Part 3 uses it (`--device tpu`); only if
    the backend were unavailable would it run the same script on the CPU
    with PyTorch's `gloo`, and say so. No output below is pasted: everything
    is produced by this run.
    """)
    return


@app.cell
def _():
    import json
    import os
    import re
    import subprocess
    import sys
    import textwrap
    import threading
    from pathlib import Path

    import torch

    import torch_tpu

    return Path, json, os, re, subprocess, sys, textwrap, threading, torch, torch_tpu


@app.cell
def _(json, os, subprocess, sys, threading):
    # The child reads one program per line (JSON), runs it, and answers with
    # its printed output. Parts 1, 2 and 3's reference run share it: starting a
    # Python that imports torch and JAX is most of what a part costs.
    _CHILD = """
import contextlib, io, json, sys, traceback
for line in sys.stdin:
    out, ok = io.StringIO(), True
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(json.loads(line), "<part>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        ok = not e.code
    except BaseException:
        ok = False
        out.write(traceback.format_exc())
    sys.__stdout__.write(json.dumps({"ok": ok, "out": out.getvalue()}) + "\\n")
    sys.__stdout__.flush()
"""
    _child = {}
    START_DEVICES = 4  # the slider's first value

    def _start(n_devices):
        proc = _child.get(n_devices)
        if proc is None or proc.poll() is not None:
            for _old in _child.values():
                _old.kill()
            _child.clear()
            env = dict(os.environ)
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                f" --xla_force_host_platform_device_count={n_devices}").strip()
            proc = _child[n_devices] = subprocess.Popen(
                [sys.executable, "-c", _CHILD], env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return proc

    def run_child(code, n_devices=None, timeout=600):
        """Run `code` in a child Python with n virtual devices; return what it printed.

        The device count is fixed when JAX starts, so each count gets its own
        child, reused by the next part; `n_devices=None`: any running child."""
        if n_devices is None:
            n_devices = next((n for n, p in _child.items() if p.poll() is None), START_DEVICES)
        proc = _start(n_devices)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            proc.stdin.write(json.dumps(code) + "\n")
            proc.stdin.flush()
            answer = proc.stdout.readline()
        finally:
            watchdog.cancel()
        if not answer:
            raise RuntimeError(f"the child process ended (exit code {proc.wait()})")
        answer = json.loads(answer)
        if not answer["ok"]:
            raise RuntimeError(answer["out"][-3000:])
        return answer["out"]

    # Started now, so that its imports overlap with this process's work.
    _start(START_DEVICES)
    return START_DEVICES, run_child


@app.cell(hide_code=True)
def _(Path, mo, os, subprocess, sys, torch_tpu):
    REPO = Path(torch_tpu.__file__).resolve().parents[1]
    try:
        import sys as _sys

        if str(REPO) not in _sys.path:
            _sys.path.insert(0, str(REPO))
        from examples.common.cli import tpu_distributed_available

        backend_ready, backend_reason = tpu_distributed_available()
    except ImportError as _e:
        backend_ready, backend_reason = False, f"the examples are not importable: {_e}"
    parallel_device = "tpu" if backend_ready else "cpu"
    LLAMA_ARGS = ["--device", parallel_device, "--steps", "4", "--seed", "0", "--batch-size", "4",
                  "--log-interval", "1", "--no-progress"]

    def launch(extra, nproc):
        """Start a run of the Llama example under torchrun (nproc processes); don't wait."""
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(REPO / "examples" / "llama" / "train.py"),
               *LLAMA_ARGS, *extra]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=str(REPO))
        return cmd, proc

    # Independent of parts 1 and 2, and the longest: started first, together
    # (torchrun's --standalone rendezvous picks a free port per run).
    started = {"--dp 2 (DDP)": launch(["--dp", "2"], 2),
               "--tp 2 (tensor parallel)": launch(["--tp", "2"], 2)}
    mo.md("*Part 3's two `torchrun` runs start now, in the background; part 3 "
          "shows them.*")
    return (
        LLAMA_ARGS,
        REPO,
        backend_ready,
        backend_reason,
        launch,
        parallel_device,
        started,
    )


@app.cell(hide_code=True)
def _(mo, torch, torch_tpu):
    mo.md(f"""
    **This (notebook) process:** {torch.tpu.device_count()} `tpu` device(s), kind
    **{torch.tpu.get_device_properties().device_kind}**, platform
    **{torch_tpu.runtime.platform.platform()}**. The device count is fixed when
    JAX starts, so the multi-device parts run in child processes started with
    the flag set.
    """)
    return


@app.cell
def _(START_DEVICES, mo):
    n_devices = mo.ui.slider(2, 8, value=START_DEVICES, label="devices in the child process")
    n_devices
    return (n_devices,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. Several devices in one process

    Tensors are created on a device with `device="tpu:2"`, move with
    `.to("tpu:3")`, and ops run on the device of their inputs (mixing devices in
    one op is an error, as on CUDA). Under the hood each tensor's JAX array is
    committed to that PJRT device, and `.to()` is a device-to-device copy.
    """)
    return


@app.cell
def _(json, n_devices, run_child, textwrap):
    PLACEMENT = textwrap.dedent('''
        import json, torch, torch_tpu
        from torch_tpu.runtime.storage import data_of
        def where(t):
            return str(next(iter(data_of(t).array.devices())))
        n = torch.tpu.device_count()
        xs = [torch.full((2, 2), float(i)).to(f"tpu:{i}") for i in range(n)]   # host -> device i
        made = [torch.zeros(2, device=f"tpu:{i}") for i in range(n)]          # a factory on device i
        moved = xs[0].to(f"tpu:{n - 1}")                                       # device 0 -> device n-1
        total = sum(x.to("tpu:0") for x in xs)                                 # gather on tpu:0
        try:
            xs[0] + xs[1]
            mix_error = None
        except RuntimeError as e:
            mix_error = str(e).splitlines()[0]
        print(json.dumps({
            "device_count": n,
            "devices": [str(x.device) for x in xs],
            "jax_devices": [where(x) for x in xs],
            "factory_jax_devices": [where(t) for t in made],
            "moved_to": str(moved.device),
            "moved_jax_device": where(moved),
            "sum_on_tpu0": total.cpu().tolist(),
            "mix_error": mix_error,
        }))
    ''')
    placement = json.loads(run_child(PLACEMENT, n_devices.value).strip().splitlines()[-1])
    for _k in ("devices", "jax_devices", "factory_jax_devices"):
        print(f"{_k:<20} {placement[_k]}")
    for _k in ("moved_to", "moved_jax_device", "sum_on_tpu0", "mix_error"):
        print(f"{_k:<20} {placement[_k]}")
    # a factory with device="tpu:N" must place its array on device N, as .to() does
    assert placement["factory_jax_devices"] == placement["jax_devices"], placement
    return PLACEMENT, placement


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Data parallelism by hand

    What DDP does, spelled out on these devices: replicate the model on every
    device, give each replica its shard of the batch, run forward and backward
    locally, average the gradients (an all-reduce; here, copies to `tpu:0` and
    a mean), and step. The sharded outputs equal the full batch's, and the
    averaged gradient equals the gradient of the whole batch on one device.
    """)
    return


@app.cell
def _(json, n_devices, run_child, textwrap):
    DATA_PARALLEL = textwrap.dedent('''
        import copy, json, torch, torch_tpu
        n = torch.tpu.device_count()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        x, y = torch.randn(8 * n, 8), torch.randn(8 * n, 1)
        result = {}

        # reference: the whole batch on one device
        ref = copy.deepcopy(model).to("tpu:0")
        ref_out = ref(x.to("tpu:0"))
        torch.nn.functional.mse_loss(ref_out, y.to("tpu:0")).backward()

        # one replica per device, one shard of the batch each
        replicas = [copy.deepcopy(model).to(f"tpu:{i}") for i in range(n)]
        shards = list(zip(x.chunk(n), y.chunk(n)))
        result["replicas"] = [str(next(r.parameters()).device) for r in replicas]
        outs = [replicas[i](xs.to(f"tpu:{i}")) for i, (xs, _) in enumerate(shards)]
        result["forward_difference"] = (
            torch.cat([o.to("tpu:0") for o in outs]) - ref_out).abs().max().item()

        # backward on every device, then the "all-reduce": the mean of the gradients on tpu:0
        for i, (out, (_, ys)) in enumerate(zip(outs, shards)):
            torch.nn.functional.mse_loss(out, ys.to(f"tpu:{i}")).backward()
        result["grad_devices"] = [str(next(r.parameters()).grad.device) for r in replicas]
        avg = [sum(p.grad.to("tpu:0") for p in ps) / n
               for ps in zip(*(r.parameters() for r in replicas))]
        result["grad_difference"] = max((a - p.grad).abs().max().item()
                                        for a, p in zip(avg, ref.parameters()))
        print(json.dumps(result))
    ''')
    data_parallel = json.loads(run_child(DATA_PARALLEL, n_devices.value).strip().splitlines()[-1])
    print(f"replicas on {data_parallel['replicas']}")
    print(f"forward: sharded outputs vs the full batch on one device, largest difference "
          f"{data_parallel['forward_difference']:.2e}")
    print(f"backward on {data_parallel['grad_devices']}: averaged shard gradients vs the "
          f"full-batch gradient, largest difference {data_parallel['grad_difference']:.2e}")
    return DATA_PARALLEL, data_parallel


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. DDP and tensor parallelism under `torchrun`

    The Llama example trains with `--dp N` (data parallel: gradients averaged
    with `all_reduce` over the `dp` process group) and `--tp N` (Megatron-style
    tensor parallelism over a `DeviceMesh`: attention heads and MLP columns
    split across ranks). Below, the notebook launches 2-process runs of each
    and, meanwhile, a single-process reference (the example's `main()` in the
    child process of parts 1 and 2), with the same seed and the same global
    batch, and compares their losses.
    """)
    return


@app.cell
def _(backend_ready, backend_reason, parallel_device):
    print(f"torch.distributed backend 'tpu' available: {backend_ready}"
          + ("" if backend_ready else f" ({backend_reason})"))
    print(f"part 3 runs with --device {parallel_device}")
    return


@app.cell
def _(LLAMA_ARGS, REPO, json, re, run_child, started, subprocess):
    def _losses(text):
        return [float(v) for v in re.findall(r"^step\s+\d+/\d+\s+loss\s+([0-9.]+)", text,
                                             flags=re.M)]

    def result(cmd, proc):
        """Wait for a launched run; its command, exit code and losses (kept on
        `proc`: re-running this cell shows the same runs)."""
        if not hasattr(proc, "outcome"):
            try:
                stdout, stderr = proc.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            proc.outcome = {"cmd": " ".join(cmd[1:]).replace(str(REPO) + "/", ""),
                            "rc": proc.returncode, "losses": _losses(stdout),
                            "tail": (stdout + stderr)[-1500:]}
        return proc.outcome

    def reference():
        """The single-process run: the example's main() in the child process of
        parts 1 and 2, which has torch and JAX loaded already (a new Python
        would spend most of this run importing them)."""
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                "from examples.llama.train import main\n"
                f"main({json.dumps(LLAMA_ARGS)})\n")
        try:
            out, rc = run_child(code), 0
        except RuntimeError as _e:
            out, rc = str(_e), 1
        return {"cmd": " ".join(["examples/llama/train.py", *LLAMA_ARGS])
                + "   (in the child process)", "rc": rc, "losses": _losses(out),
                "tail": out[-1500:]}

    # The torchrun runs started with the notebook (above); the reference runs
    # now, then the notebook waits for the other two.
    runs = {"single process": reference()}
    runs.update({_name: result(*_p) for _name, _p in started.items()})
    for _name, _r in runs.items():
        print(f"{_name:<26} rc={_r['rc']}  losses {[round(v, 4) for v in _r['losses']]}")
        print(f"   $ python {_r['cmd']}")
    return result, runs


@app.cell
def _(mo, runs):
    _failed = {k: r for k, r in runs.items() if r["rc"] != 0}
    mo.md("All three runs finished." if not _failed else "\n\n".join(
        f"**{k}** exited with {r['rc']}:\n\n```\n{r['tail']}\n```" for k, r in _failed.items()))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Where each parameter lives: `torch_tpu.debug.sharding`

    A placement such as `(Shard(0), Shard(1))` says how a parameter is cut,
    not which rows a device holds. `torch_tpu.debug.sharding(module)` lists,
    for every DTensor parameter, each device's block (its mesh coordinate and
    row/column ranges), and `.plot()` draws them. Below: an MLP with tensor
    parallelism over `tp` (column-parallel, then row-parallel `Linear`) and
    FSDP2 over `dp`, on a 2 × 4 mesh of 8 devices. A layout is metadata, so
    it is computed here with PyTorch's "fake" process group (8 ranks, no
    communication): what each of 8 real processes would compute. Note the
    first weight: FSDP cuts each tensor-parallel block again (a strided
    shard), so device 4 holds rows 4:8, next to device 0's 0:4.

    Given a compiled program instead (`torch_tpu.debug.last_graphs(2)` in a
    process of a `torchrun` run, or HLO text), the same call lists its
    collectives: kind, replica groups, bytes from the HLO shapes and the
    time each would take at a TPU v5e or v6e chip's published interconnect
    bandwidth ([API page](../api/debug.md)).
    """)
    return


@app.cell
def _(torch, torch_tpu):
    import torch.distributed as _dist
    from torch.distributed.device_mesh import init_device_mesh as _init_device_mesh
    from torch.distributed.fsdp import fully_shard as _fully_shard
    from torch.distributed.tensor import parallel as _tp
    from torch.testing._internal.distributed.fake_pg import FakeStore as _FakeStore

    _dist.init_process_group("cpu:fake,tpu:fake", store=_FakeStore(), rank=0, world_size=8)
    try:
        _mesh = _init_device_mesh("tpu", (2, 4), mesh_dim_names=("dp", "tp"))
        _mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 8)).to("tpu")
        _tp.parallelize_module(_mlp, _mesh["tp"], {"0": _tp.ColwiseParallel(),
                                                   "2": _tp.RowwiseParallel()})
        _fully_shard(_mlp, mesh=_mesh["dp"])
        layout_view = torch_tpu.debug.sharding(_mlp)
    finally:
        _dist.destroy_process_group()
    print(layout_view.tensor("0.weight"))
    print(layout_view.tensor("2.weight"))
    # device (i, j) of the mesh holds rows 8j + 4i .. 8j + 4i + 4 of the first weight
    assert [b.ranges[0] for b in layout_view.tensor("0.weight").blocks_of(4)] == [(4, 8)]
    _fig = layout_view.plot()
    _fig.tight_layout()
    _fig
    return (layout_view,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Several hosts, timeouts, limitations

    **Launching.** One process per device. On one host:
    `torchrun --standalone --nproc-per-node=N train.py`. On `H` hosts, the
    host of rank 0 is the coordinator; run on every host `h`:

    ```bash
    torchrun --nnodes=H --node-rank=h --nproc-per-node=N \
             --master-addr=HOST0 --master-port=29500 train.py
    # or, with torchrun's rendezvous (the same command everywhere):
    torchrun --nnodes=H --nproc-per-node=N --rdzv-backend=c10d \
             --rdzv-endpoint=HOST0:29500 --rdzv-id=JOB_ID train.py
    ```

    `init_process_group("tpu")` (before any tensor goes to the device) reads
    torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
    `MASTER_ADDR` and `MASTER_PORT`, starts JAX's multi-process runtime with
    process 0 as its coordinator (its `host:port` travels through the c10d
    store; `TORCH_TPU_COORDINATOR_ADDRESS=host:port` fixes it, e.g. for a
    firewall), and gives each process its own device as `tpu:0`. With several
    chips per host, each process is restricted to its chip
    (`torch_tpu.distributed.set_tpu_launch_env(local_rank, local_world_size)`,
    which `init_process_group` calls under torchrun; a launcher that spawns
    processes itself calls it in each child first). The tests run exactly
    this path as two "hosts" on one machine.

    **Timeouts.** `init_process_group("tpu", timeout=timedelta(seconds=...))`
    bounds every collective (a watchdog fails one that another process never
    joins) and the start-up wait for all processes;
    `TORCH_TPU_HEARTBEAT_TIMEOUT` (100 s) is how long the runtime waits
    before declaring a silent process dead, `TORCH_TPU_SHUTDOWN_TIMEOUT`
    (300 s) how long a normal exit waits for the others. A dead peer or a
    timeout raises `CollectiveError` on the survivors, after which the group
    is unusable: restart the processes (`torchrun --max-restarts=K`). Shapes or
    operations that differ between ranks raise on every rank and leave the
    group usable.

    **Limitations.** One device per process; the first `"tpu"` group spans
    every process and must be created before the device is used;
    `ReduceOp.PREMUL_SUM` and `recv` without a source are unsupported; each
    collective has a fixed cost of milliseconds on the CPU platform
    (`python benchmarks/allreduce.py` measures it against gloo); under FSDP2
    the unsharded parameters stay allocated between uses. The
    [backend's reference page](../api/distributed.md) has the details.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (one DDP step profiled in this process: gloo, world size 1)
    and says whether yours is right. A wrong answer gets a hint: where to look,
    with which cell or tool; the measured answer waits under *Show the answer*,
    and the written solution is folded away under each exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 1 · which collective

    Each DDP step, which collective keeps the replicas' gradients equal? (The
    check profiles one DDP step of the MLP of section 2 in this process, with
    PyTorch's `gloo` and a world of one: DDP's reducer issues the same
    collectives on every backend, the `tpu` one included.)
    """)
    return


@app.cell
def _(ex, mo):
    collective_answer = mo.ui.dropdown(ex.COLLECTIVE_OPTIONS, value=None, label="collective")
    collective_answer
    return (collective_answer,)


@app.cell
def _(collective_answer, ex):
    ex.show(ex.check(ex.check_ddp_collective, collective_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **`all_reduce`.** Every rank contributes its gradients and every rank gets
        their sum (DDP divides by the world size): what section 2 did by hand
        with copies to `tpu:0` and a mean. `broadcast` runs once, when DDP wraps
        the model (rank 0's weights to all); `all_gather` and `reduce_scatter` are
        FSDP's.
    """)})
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 2 · how many bytes

    For that MLP, `Linear(8, 32) → Tanh → Linear(32, 1)` in float32, how many
    **bytes** does DDP all-reduce per step (per rank, batch size 4)?
    """)
    return


@app.cell
def _(mo):
    ddp_bytes_answer = mo.ui.number(label="bytes per step")
    ddp_bytes_answer
    return (ddp_bytes_answer,)


@app.cell
def _(ddp_bytes_answer, ex):
    ex.show(ex.check(ex.check_ddp_bytes, ddp_bytes_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **1284** = (8·32 + 32 + 32·1 + 1) = 321 parameters × 4 bytes: every
        gradient once, whatever the batch size. Data parallelism's traffic grows
        with the model; at 1 B parameters in bfloat16 it is 2 GB per step, which is
        why large models shard the parameters instead (FSDP, tensor parallelism).
    """)})
    return


@app.cell
def test_placement(n_devices, placement):
    n = n_devices.value
    assert placement["device_count"] == n
    assert placement["devices"] == [f"tpu:{i}" for i in range(n)]
    assert len(set(placement["jax_devices"])) == n
    assert placement["factory_jax_devices"] == placement["jax_devices"]
    assert placement["moved_to"] == f"tpu:{n - 1}"
    assert placement["sum_on_tpu0"] == [[sum(range(n))] * 2] * 2
    assert placement["mix_error"] and "device" in placement["mix_error"]
    return


@app.cell
def test_data_parallel(data_parallel, n_devices):
    _n = n_devices.value
    assert data_parallel["replicas"] == [f"tpu:{i}" for i in range(_n)]
    assert data_parallel["grad_devices"] == data_parallel["replicas"]
    assert data_parallel["forward_difference"] < 1e-5
    assert data_parallel["grad_difference"] < 1e-5
    return


@app.cell
def test_ddp_and_tp(runs):
    ref = runs["single process"]["losses"]
    assert ref, runs["single process"]["tail"]
    for name in ("--dp 2 (DDP)", "--tp 2 (tensor parallel)"):
        r = runs[name]
        assert r["rc"] == 0, r["tail"]
        assert r["losses"], r["tail"]
        assert abs(r["losses"][0] - ref[0]) <= 1e-3 * max(1.0, abs(ref[0])), (name, r["losses"], ref)
    return


if __name__ == "__main__":
    app.run()
