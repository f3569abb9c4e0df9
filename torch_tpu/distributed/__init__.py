"""`torch.distributed` on the `tpu` device: the process group backend "tpu".

    torchrun --nproc-per-node=N train.py

    dist.init_process_group("tpu")            # one process per device
    model = DistributedDataParallel(model.to("tpu"))

Importing torch_tpu (the `torch.backends` autoload in `import torch`)
registers the backend (cheap: nothing else is imported until a process group
is created). `init_process_group("tpu")` starts JAX's
multi-process runtime (`jax.distributed`) from torchrun's environment; each
process sees its own device as `tpu:0`, and every collective runs as an XLA
collective over a mesh of the group's devices (on the CPU platform through
gloo). See `torch_tpu.distributed.launch` for single- and multi-host launches
and `torch_tpu.distributed.process_group` for errors and timeouts.

Public helpers:
- `initialize(...)`: start the runtime explicitly (before any device use).
- `set_tpu_launch_env(...)`: per-process device environment for launchers.
- `is_initialized()`, `jax_mesh(group=None)`: the JAX mesh of a group.
"""

from __future__ import annotations

import torch.distributed as _dist

from ..runtime import loading
from .launch import set_tpu_launch_env as _set

BACKEND = "tpu"


def _create_process_group(dist_backend_opts, backend_options=None):
    loading.load()  # the backend loads on first use (see torch_tpu/__init__.py)
    # lazy: JAX (this package is in the start-up set)
    from . import fsdp_support, process_group, spmd

    pg = process_group.create(dist_backend_opts, backend_options)
    spmd.install()  # compiled graphs with collectives: one SPMD program
    fsdp_support.install()  # device streams/events and storage resize_ for FSDP2
    return pg


def register() -> None:
    """Register the c10d backend "tpu" (idempotent)."""
    if not _dist.is_available():  # pragma: no cover
        return
    if BACKEND in _dist.Backend.backend_list and \
            getattr(_dist.Backend, "_plugins", {}).get(BACKEND.upper()) is not None:
        return
    _dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True,
                                   devices=["tpu"])


register()


def initialize(coordinator_address=None, num_processes=None, process_id=None,
               local_device_ids=None, *, timeout=None):
    """Start the multi-process runtime now (see runtime.initialize)."""
    from . import runtime  # lazy: JAX (this package is in the start-up set)

    return runtime.initialize(coordinator_address, num_processes, process_id,
                              local_device_ids, timeout=timeout)


def is_initialized() -> bool:
    from . import runtime  # lazy: as above

    return runtime.is_initialized()


def set_tpu_launch_env(*args, **kwargs):
    return _set(*args, **kwargs)


def jax_mesh(group=None):
    """The 1-D `jax.sharding.Mesh` (axis "g") of a tpu process group's devices."""
    from . import programs  # lazy: as above

    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    ranks = getattr(pg, "global_ranks", None)
    if ranks is None:
        raise TypeError(f"{pg!r} is not a tpu process group")
    return programs.mesh_of(tuple(ranks))


def __getattr__(name):
    if name in ("ProcessGroupTPU", "Work", "CollectiveError"):
        from . import process_group  # lazy: as above

        return getattr(process_group, name)
    raise AttributeError(f"module 'torch_tpu.distributed' has no attribute {name!r}")
