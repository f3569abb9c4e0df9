"""Launching one process per device, on one host or several.

Single host, N devices (or N CPU processes in CI)::

    torchrun --standalone --nproc-per-node=N train.py

Several hosts (one coordinator: the host of rank 0)::

    # on every host h = 0 .. H-1
    torchrun --nnodes=H --node-rank=h --nproc-per-node=N \\
             --master-addr=HOST0 --master-port=29500 train.py

In ``train.py``::

    import torch, torch.distributed as dist
    dist.init_process_group("tpu")       # before any tensor goes to the device
    device = torch.device("tpu")         # every process uses its own tpu:0
    model = DDP(model.to(device))

`init_process_group("tpu")` starts JAX's multi-process runtime: process 0
runs the coordination service on a free port of the address the other hosts
reach it at (published through torchrun's store), every process joins it,
and the devices of all processes form one global device list. Set
``TORCH_TPU_COORDINATOR_ADDRESS=host:port`` to choose the coordinator's
address and port (e.g. one a firewall lets through). The same code path runs
on one host with several processes, which is how the tests exercise it.

On a Cloud TPU host with several chips, each process must see only its own
chip before the TPU runtime starts; `set_tpu_launch_env` sets the
environment libtpu reads for that (it is called by `init_process_group`
when torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE say there are several
processes on the host, unless the variables are already set). A launcher
that starts processes itself can call it in each child before importing
anything that starts JAX.
"""

from __future__ import annotations

import os


def set_tpu_launch_env(local_rank: int | None = None, local_world_size: int | None = None,
                       *, base_port: int = 8476, only_if_unset: bool = False,
                       platform: str | None = None) -> dict:
    """Environment for one process per device on this host; returns what it set.

    - TPU (libtpu): ``TPU_VISIBLE_CHIPS=<local_rank>``,
      ``TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1``, ``TPU_PROCESS_BOUNDS`` (the local
      processes along x), ``TPU_PROCESS_ADDRESSES`` (localhost ports from
      `base_port`), ``TPU_PROCESS_PORT`` and ``CLOUD_TPU_TASK_ID``.
    - CPU (XLA:CPU, tests): one device per process
      (``--xla_force_host_platform_device_count=1`` in XLA_FLAGS).
    - GPU: ``CUDA_VISIBLE_DEVICES=<local_rank>``.

    Defaults come from torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE. With
    `only_if_unset`, variables that already have a value are kept.
    """
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not (0 <= local_rank < max(1, local_world_size)):
        raise ValueError(f"local_rank {local_rank} is not in [0, {local_world_size})")
    if platform is None:
        from ..runtime.platform import platform_hint  # lazy: JAX (launch runs before any JAX import)

        platform = platform_hint()
    env = {}
    if platform == "tpu":
        env.update({
            "TPU_VISIBLE_CHIPS": str(local_rank),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": f"{local_world_size},1,1",
            "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{base_port + i}"
                                              for i in range(local_world_size)),
            "TPU_PROCESS_PORT": str(base_port + local_rank),
            "CLOUD_TPU_TASK_ID": str(local_rank),
        })
    elif platform == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    else:
        flags = os.environ.get("XLA_FLAGS", "")
        parts = [f for f in flags.split() if not f.startswith(
            "--xla_force_host_platform_device_count")]
        parts.append("--xla_force_host_platform_device_count=1")
        env["XLA_FLAGS"] = " ".join(parts)
    applied = {}
    for k, v in env.items():
        if only_if_unset and os.environ.get(k):
            continue
        os.environ[k] = v
        applied[k] = v
    return applied
