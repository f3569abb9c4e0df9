"""PyTorch's private op-level helpers that torch_tpu uses: one checked list (see reads.py).

``from torch_tpu._compat.torch_api import decomposition_table`` gives
PyTorch's own object, imported at first use; each name below is a target
that `python -m torch_tpu._compat` fingerprints. Eager ops, tracing and
export use these; dynamo's and AOTAutograd's are in dynamo_api.
"""

from __future__ import annotations

from typing import Any

from .reads import Names

_NAMES = Names(__name__, {
    # What PyTorch's own CPU kernels and refs use, so that tpu ops promote
    # dtypes, pick memory formats and resize out= tensors exactly as CPU does.
    # rename_privateuse1_backend and generate_methods_for_privateuse1_backend,
    # the public pair, register no device hooks nor device guard.
    "the tpu device: PrivateUse1 with Python hooks and device guard": {
        "setup_privateuseone_for_python_backend":
            "torch.utils.backend_registration:_setup_privateuseone_for_python_backend",
    },
    "eager ops: CPU's type promotion, memory format and out= rules": {
        "ELEMENTWISE_TYPE_PROMOTION_KIND": "torch._prims_common:ELEMENTWISE_TYPE_PROMOTION_KIND",
        "elementwise_dtypes": "torch._prims_common:elementwise_dtypes",
        "suggest_memory_format": "torch._prims_common:suggest_memory_format",
        "maybe_resize_out": "torch._prims_common.wrappers:_maybe_resize_out",
    },
    # The whole table (torch.export.default_decompositions is the core-ATen
    # subset only) and its post-autograd part, ~0.5 s cheaper to build.
    "decompositions of ops without a lowering": {
        "decomposition_table": "torch._decomp:decomposition_table",
        "core_aten_decompositions_post_autograd":
            "torch._decomp:_core_aten_decompositions_post_autograd",
    },
    "nested arguments and outputs (PyTorch's pytrees)": {
        "pytree": "torch.utils:_pytree",
    },
    "tracing with fake tensors and dispatch modes": {
        "TorchDispatchMode": "torch.utils._python_dispatch:TorchDispatchMode",
        "disable_current_modes": "torch.utils._python_dispatch:_disable_current_modes",
        "FakeTensor": "torch._subclasses.fake_tensor:FakeTensor",
        "FakeTensorMode": "torch._subclasses.fake_tensor:FakeTensorMode",
        "unset_fake_temporarily": "torch._subclasses.fake_tensor:unset_fake_temporarily",
        "reparametrize_module": "torch.nn.utils.stateless:_reparametrize_module",
    },
    # DTensor's own block arithmetic (uneven chunks, FSDP2's strided shards)
    "torch_tpu.debug.sharding: each device's block of a DTensor": {
        "compute_local_shape_and_global_offset":
            "torch.distributed.tensor._utils:_compute_local_shape_and_global_offset",
    },
    "torch_tpu.export: unbounded size ranges": {
        "int_oo": "torch.utils._sympy.numbers:int_oo",
    },
})


def __getattr__(name: str) -> Any:
    return _NAMES.resolve(name, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES.names()))


def patches() -> dict:
    """Every name's target, as patches that replace nothing (releases.PROVIDERS)."""
    return _NAMES.patches()
