"""Dynamo's, AOTAutograd's and inductor's private objects that torch_tpu uses: one checked list.

``from torch_tpu._compat.dynamo_api import aot_autograd`` gives PyTorch's
own object, imported at first use (see reads.py); each name below is a
target that `python -m torch_tpu._compat` fingerprints. Importing this
module imports no dynamo. The two pieces of dynamo state that precompile
sets (`serializable_guard_types`, `skip_unique_ids`) are set here too.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
from collections.abc import Container, Iterator
from typing import Any

from . import Patch
from .reads import Names

BACKEND = "the tpu backend: AOTAutograd, dynamo's backend registry and tracing rules"
PRECOMPILE = "TORCH_TPU_PRECOMPILE: dynamo's compile packages in torch_tpu's store"

_GUARDS = "torch._dynamo.guards"
_AOT_CACHE = "torch._functorch._aot_autograd.autograd_cache"
_PICKLER = "torch.fx._graph_pickler"
_PACKAGE = "torch._dynamo.package"

_NAMES = Names(__name__, {
    # dynamo's aot_autograd wraps functorch.compile.aot_module_simplified with
    # dynamo's own steps (nested inputs, disabled backward compilers, fake
    # modes); registering a backend by function has no public API, and
    # torch.compiler.list_backends imports every built-in backend (0.5 s).
    BACKEND: {
        "aot_autograd": "torch._dynamo.backends.common:aot_autograd",
        "register_backend": "torch._dynamo.backends.registry:register_backend",
        "COMPILER_FNS": "torch._dynamo.backends.registry:_COMPILER_FNS",
        "BACKENDS": "torch._dynamo.backends.registry:_BACKENDS",
        "skip_module": "torch._dynamo.trace_rules:add",
        "dynamo_config": "torch._dynamo:config",
        "funcname_cache": "torch._dynamo.funcname_cache:cache",
        "callback_handler": "torch._dynamo.callback:callback_handler",
    },
    "recompile reasons in the compile log and graph metadata": {
        "guard_failures": "torch._dynamo.utils:guard_failures",
        "CompileContext": "torch._guards:CompileContext",
        "TracingContext": "torch._guards:TracingContext",
    },
    PRECOMPILE: {
        "CompilePackage": f"{_PACKAGE}:CompilePackage",
        "DiskDynamoCache": f"{_PACKAGE}:DiskDynamoCache",
        "DynamoCodeCacheEntry": f"{_PACKAGE}:_DynamoCodeCacheEntry",
        "PrecompileContext": "torch._dynamo.precompile_context:PrecompileContext",
        "counters": "torch._dynamo.utils:counters",
        "innermost_fn": "torch._dynamo.eval_frame:innermost_fn",
        "CheckFunctionManager": f"{_GUARDS}:CheckFunctionManager",
        "GuardMissing": f"{_GUARDS}:_Missing",
        "DictGetItemSource": "torch._dynamo.source:DictGetItemSource",
        "GlobalSource": "torch._dynamo.source:GlobalSource",
        "sanitize_gm_for_cache": f"{_AOT_CACHE}:sanitize_gm_for_cache",
        "check_cacheable": f"{_AOT_CACHE}:check_cacheable",
        "AOTAUTOGRAD_CACHE_PREFIX": f"{_AOT_CACHE}:AOTAUTOGRAD_CACHE_PREFIX",
        "SerializableAOTDispatchCompiler":
            "torch._functorch._aot_autograd.schemas:SerializableAOTDispatchCompiler",
        "OutputCode": "torch._inductor.output_code:OutputCode",
        "GraphPickler": f"{_PICKLER}:GraphPickler",
        "GraphPicklerOptions": f"{_PICKLER}:Options",
        "node_metadata_key_filter_safe": f"{_PICKLER}:_node_metadata_key_filter_safe",
    },
})

# Set for a moment (serializable_guard_types) or moved forward (skip_unique_ids).
_GUARD_TYPES = f"{_GUARDS}:CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES"
_UNIQUE_IDS = "torch._dynamo.bytecode_transformation:_unique_id_counter"


def __getattr__(name: str) -> Any:
    return _NAMES.resolve(name, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES.names()))


def patches() -> dict:
    """Every target read or set here, as patches that replace nothing (releases.PROVIDERS)."""
    found = _NAMES.patches()
    found[PRECOMPILE] += [
        Patch(_GUARD_TYPES, PRECOMPILE, "set for the serialization of one frame's guards",
              lambda o: o),
        Patch(_UNIQUE_IDS, PRECOMPILE, "moved past the names a loaded package installed",
              lambda o: o),
    ]
    return found


@contextlib.contextmanager
def serializable_guard_types(also: Container[str]) -> Iterator[None]:
    """Inside, dynamo serializes the guard kinds `also` too (identity guards
    on objects found by name, which precompile pins with a fingerprint)."""
    manager = __getattr__("CheckFunctionManager")
    unsupported = manager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    manager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES = tuple(
        t for t in unsupported if t not in also)
    try:
        yield
    finally:
        manager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES = unsupported


def skip_unique_ids(used: int) -> None:
    """Dynamo's next generated global name (``__builtins_dict___<n>``) gets an
    n above `used`: a loaded package installed names up to it, and dynamo's
    counter starts at 0 in every process."""
    module_name, _, attr = _UNIQUE_IDS.partition(":")
    module = importlib.import_module(module_name)
    nxt = next(getattr(module, attr))
    setattr(module, attr, itertools.count(max(nxt, used + 1)))
