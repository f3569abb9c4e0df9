"""The small command line every example shares, and what it sets up.

Flags: ``--device tpu|cpu``, ``--config NAME``, ``--steps N``, ``--seed S``,
``--batch-size``, ``--lr``, ``--dtype``, ``--compile``, ``--compile-backend``,
``--log-interval``, ``--no-progress``, and for the language models ``--dp N``
/ ``--tp N`` (data and tensor parallel under ``torchrun``). Every flag has a
help line: ``--help`` describes exactly the options the script accepts.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys

import torch

DEVICES = ("tpu", "cpu")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_parser(description: str, configs, *, default_config: str = "tiny",
                default_steps: int = 20, default_batch_size: int | None = None,
                default_lr: float | None = None, distributed: bool = False,
                training: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", choices=DEVICES, default="tpu",
                   help="where the model runs (default: tpu)")
    p.add_argument("--config", choices=sorted(configs), default=default_config,
                   help=f"model configuration (default: {default_config})")
    p.add_argument("--steps", type=int, default=default_steps,
                   help="training steps, or generation/sampling steps for inference scripts")
    p.add_argument("--batch-size", type=int, default=default_batch_size,
                   help=f"examples per step (default: {default_batch_size})")
    if training:
        p.add_argument("--lr", type=float, default=default_lr,
                       help=f"learning rate (default: {default_lr})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model's initialization and the data (default: 0)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="parameter/activation dtype (default float32)")
    p.add_argument("--compile", action="store_true",
                   help="wrap the model in torch.compile (the backend: --compile-backend)")
    p.add_argument("--compile-backend", default=None, metavar="NAME",
                   help="the torch.compile backend --compile uses (default: 'tpu' on "
                        "--device tpu, 'inductor' on --device cpu)")
    p.add_argument("--log-interval", type=int, default=10,
                   help="print a log line every N steps (default: 10)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    if distributed:
        p.add_argument("--dp", type=int, default=1,
                       help="data-parallel degree (run under torchrun with dp*tp processes)")
        p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    return p


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds the tpu generator (torch.tpu.manual_seed_all)


def setup(args) -> torch.device:
    """Seeds, imports the backend when needed; returns the device to run on."""
    if args.device == "tpu":
        import torch_tpu  # noqa: F401  (registered by `import torch` once installed)
    seed_everything(args.seed)
    return torch.device(args.device)


def synchronize(device) -> None:
    device = torch.device(device)
    if device.type == "tpu":
        torch.tpu.synchronize()
    elif device.type == "cuda":
        torch.cuda.synchronize()


# -- torch.compile ----------------------------------------------------------------


class CompileUnavailable(RuntimeError):
    pass


def tpu_compile_available() -> tuple[bool, str]:
    """Whether `torch.compile(backend="tpu")` can be used, and if not, why."""
    try:
        mod = importlib.import_module("torch_tpu.compile")
    except Exception as e:  # noqa: BLE001
        return False, f"torch_tpu.compile cannot be imported ({type(e).__name__}: {e})"
    if getattr(mod, "__file__", None) is None:
        return False, "torch_tpu.compile is not a package yet (the compile issue has not landed)"
    try:
        if hasattr(mod, "register"):  # the backend registers with dynamo lazily
            mod.register()
        import torch._dynamo

        backends = torch._dynamo.list_backends(exclude_tags=())
    except Exception as e:  # noqa: BLE001
        return False, f"torch._dynamo unavailable ({e})"
    if "tpu" not in backends:
        return False, "torch_tpu.compile did not register a torch.compile backend named 'tpu'"
    return True, ""


def maybe_compile(model, args):
    """`torch.compile(model, backend=...)` when --compile is given, else the model."""
    if not getattr(args, "compile", False):
        return model
    backend = args.compile_backend or ("tpu" if args.device == "tpu" else "inductor")
    if backend == "tpu":
        ok, why = tpu_compile_available()
        if not ok:
            raise CompileUnavailable(f"--compile on tpu needs torch.compile(backend='tpu'): {why}")
    return torch.compile(model, backend=backend)


def compile_seconds() -> float | None:
    """Wall seconds so far during which the tpu backend was producing an
    executable (None if unknown). Compiles overlap on the background compile
    threads, so this is their wall-clock union, not the sum of each compile's
    seconds (`torch_tpu.cache.stats()["compile_seconds"]`), which can exceed
    the elapsed time."""
    try:
        from torch_tpu.runtime import programs

        # Read as of now, without waiting for compiles in flight (the clock
        # counts them up to now), so that a difference of two readings fits in
        # the time between them; cache.stats() would wait for them first.
        return float(programs.STATS.compile_wall_seconds)
    except Exception:  # noqa: BLE001
        return None


def graph_programs() -> int | None:
    """Graph programs the tpu compile backend has made so far (compiled, or
    loaded from its disk tier); None when the backend is not loaded."""
    mod = sys.modules.get("torch_tpu.compile.graph_cache")
    if mod is None:
        return 0 if "torch_tpu" in sys.modules else None
    try:
        s = mod.cache_stats()
        return int(s["lowered"] + s["disk_loads"])
    except Exception:  # noqa: BLE001
        return None


def fallback_counts() -> dict:
    """A copy of the CPU-fallback counter (op name -> calls) of torch_tpu.debug.metrics."""
    try:
        from torch_tpu.debug import metrics

        return dict(metrics.FALLBACKS)
    except Exception:  # noqa: BLE001
        return {}


# -- data / tensor parallel -------------------------------------------------------


class ParallelContext:
    """Process groups of a dp x tp run; a single process has dp = tp = 1."""

    def __init__(self, dp=1, tp=1, rank=0, mesh=None):
        self.dp, self.tp, self.rank, self.mesh = dp, tp, rank, mesh

    @property
    def enabled(self) -> bool:
        return self.dp * self.tp > 1

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp") if self.mesh is not None else 0

    @property
    def dp_group(self):
        return self.mesh.get_group("dp") if self.mesh is not None else None

    @property
    def tp_mesh(self):
        return self.mesh["tp"] if self.mesh is not None else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def tpu_distributed_available() -> tuple[bool, str]:
    try:
        importlib.import_module("torch_tpu.distributed")
    except Exception as e:  # noqa: BLE001
        return False, f"torch_tpu.distributed cannot be imported ({type(e).__name__}: {e})"
    import torch.distributed as dist

    if "tpu" not in dist.Backend.backend_list:
        return False, "no torch.distributed backend named 'tpu' is registered"
    return True, ""


def init_parallel(args) -> ParallelContext:
    """Set up the dp x tp process groups for --dp/--tp (under torchrun)."""
    dp, tp = getattr(args, "dp", 1), getattr(args, "tp", 1)
    if dp < 1 or tp < 1:
        raise ValueError("--dp and --tp must be >= 1")
    if dp * tp == 1:
        return ParallelContext()
    if args.device == "tpu":
        ok, why = tpu_distributed_available()
        if not ok:
            raise NotImplementedError(
                f"--dp/--tp on --device tpu need the torch.distributed backend 'tpu' "
                f"(torch_tpu.distributed, the distributed issue), which is not available "
                f"yet: {why}. Use --device cpu (gloo) to try the parallel code path.")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != dp * tp:
        raise SystemExit(f"--dp {dp} --tp {tp} needs {dp * tp} processes; run under "
                         f"`torchrun --nproc-per-node {dp * tp} {' '.join(sys.argv)}` "
                         f"(WORLD_SIZE is {world})")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group(backend="tpu" if args.device == "tpu" else "gloo")
    mesh = init_device_mesh(args.device, (dp, tp), mesh_dim_names=("dp", "tp"))
    return ParallelContext(dp, tp, dist.get_rank(), mesh)


def average_gradients(model: torch.nn.Module, ctx: ParallelContext) -> None:
    """Mean of the gradients over the data-parallel group (each rank saw its own shard).

    As DDP's reducer does it: the gradients of one dtype go through one flat
    buffer and one all_reduce, so a step runs one collective program and
    waits for the other ranks once, not once per parameter (22 times for
    the tiny Llama)."""
    if ctx.dp <= 1:
        return
    import torch.distributed as dist

    buckets: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad
        local = g.to_local() if hasattr(g, "to_local") else g
        buckets.setdefault(local.dtype, []).append(local)
    for grads in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=ctx.dp_group)
        flat.div_(ctx.dp)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def mean_over_dp(loss: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """The mean of a per-rank scalar over the data-parallel group (for logging)."""
    if ctx.dp <= 1:
        return loss
    import torch.distributed as dist

    loss = loss.clone()
    dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=ctx.dp_group)
    return loss / ctx.dp


def clip_grad_norm_tp(model: torch.nn.Module, max_norm: float, ctx: ParallelContext):
    """`clip_grad_norm_` for a model with tensor-parallel (DTensor) and replicated parameters.

    The squared norm of the sharded gradients is summed over the tensor-parallel
    group, replicated gradients are counted once; the scale factor is PyTorch's
    (max_norm / (norm + 1e-6), at most 1).
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    sharded = [g.to_local() for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    dev = (sharded or plain)[0].device
    sq_sharded = sum((g.float().pow(2).sum() for g in sharded), torch.zeros((), device=dev))
    if ctx.tp > 1:
        dist.all_reduce(sq_sharded, op=dist.ReduceOp.SUM, group=ctx.mesh.get_group("tp"))
    sq_plain = sum((g.float().pow(2).sum() for g in plain), torch.zeros((), device=dev))
    total = (sq_sharded + sq_plain).sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in sharded + plain:
        g.mul_(coef.to(g.dtype))
    return total
