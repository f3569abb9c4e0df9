"""The dynamo backend "tpu": AOTAutograd, one XLA executable per graph.

    model = torch.compile(model, backend="tpu")

Dynamo captures a graph of torch calls; AOTAutograd functionalizes it,
applies PyTorch's core-ATen decompositions (except for ops the lowering
table handles directly) and splits training graphs into a forward and a
backward graph. Each graph becomes a `CompiledGraph` (compile/graph.py): the
graph is lowered to one jax function with the same lowering table eager mode
uses (`lowering.py`) and jit-compiled once per input signature, through the
executor's compile path, so both tiers of the compile cache apply
(torch_tpu.cache). Static graphs are also indexed in the graph tier
(torch_tpu.cache.graphs): a later process with the same graph loads its
executable without lowering it (compile/graph_cache.py; the keys are built in
compile/graph_key.py).

This module is the dynamo glue: `tpu_backend` (AOTAutograd with this
backend's decompositions and partitioner), `register`, and the patches of
torch internals that registration installs. How a graph runs (inputs read
in place, the executable run asynchronously, outputs wrapped, mutations
written back; a graph that cannot be lowered runs op by op, with one
warning, so a graph never fails to run because of the backend) is
compile/graph.py's docstring.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ..ops import registry
from ..runtime import gc_pause
from ..runtime import opt_level as _olevel
from ..runtime.switches import switch_on, switch_set
from . import graph_cache
from .graph import CompiledGraph, prebuild_enabled

try:
    from .persist import artifacts as _artifacts
except Exception:  # pragma: no cover - the cache package failed to import
    # Typed as the module: every use checks for None first (or runs only
    # where `packaged`, which needs the module).
    _artifacts = None  # type: ignore[assignment]

# --------------------------------------------------------------------------
# the dynamo backend


# "key": the lowering table's size when "table" (a decomposition dict) was built.
_DECOMP_TABLE: dict[str, Any] = {"key": None, "table": None}


def _core_table():
    """PyTorch's core-ATen decompositions.

    By default the post-autograd table alone: the full table
    (`core_aten_decompositions`, what export uses) adds an entry for every
    CompositeImplicitAutograd op, which tracing decomposes by itself anyway,
    and collecting those ops costs ~0.5 s per process.
    ``TORCH_TPU_DECOMP_TABLE=full`` uses the full table.
    """
    if os.environ.get("TORCH_TPU_DECOMP_TABLE", "core") == "full":
        from torch._decomp import core_aten_decompositions

        return dict(core_aten_decompositions())
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
    except ImportError:  # pragma: no cover - another torch
        from torch._decomp import core_aten_decompositions

        return dict(core_aten_decompositions())
    return dict(_core_aten_decompositions_post_autograd())


def decompositions():
    """Core-ATen decompositions, minus ops the lowering table runs directly:
    the table torch.compile's backend, compile_step's trace and export use.

    Built once per process (building PyTorch's table takes ~0.2 s) and
    rebuilt only if the lowering table grew since.
    """
    key = len(registry.LOWERINGS)
    if _DECOMP_TABLE["key"] != key:
        table = _core_table()
        for op in list(table):
            if op in registry.LOWERINGS:
                del table[op]
        _DECOMP_TABLE["table"], _DECOMP_TABLE["key"] = table, key
    return dict(_DECOMP_TABLE["table"])


def _partition_fn(options):
    """How AOTAutograd splits a training graph into forward and backward.

    Default: save what the backward needs (`default_partition`). The min-cut
    partitioner (``options={"partitioner": "min_cut"}``) recomputes cheap ops
    in the backward to save memory, but its first use imports inductor's
    lowering tables (about a second).
    """
    from torch._functorch import partitioners

    choice = options.get("partitioner") or os.environ.get("TORCH_TPU_PARTITIONER", "default")
    if choice in ("min_cut", "min-cut", "mincut"):
        return partitioners.min_cut_rematerialization_partition
    if choice != "default":
        raise ValueError(f"unknown partitioner {choice!r} (use 'default' or 'min_cut')")
    return partitioners.default_partition


def _compiler(kind, options, packaged=False, made=None, pending=None):
    def compile_graph(gm, example_inputs):
        graph = CompiledGraph(gm, example_inputs, kind, options)
        if made is not None:
            made.append(graph)
        return graph

    if packaged:
        # TORCH_TPU_PRECOMPILE: graphs AOTAutograd can bundle into packages.
        return _artifacts.serializable_compiler(compile_graph, pending)
    return compile_graph


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                options: dict | None = None) -> Callable[..., Any]:
    """`torch.compile(model, backend="tpu")`: see the module docstring.

    options (``torch.compile(..., options={...})``):
      - ``"dynamic"``: the policy for symbolic shapes, ``"bucket"`` (default)
        or ``"exact"``; see torch_tpu.compile.dynamic.
      - ``"buckets"``: the bucket sizes (a sorted list of ints) for "bucket".
      - ``"max_specializations"``: cap on executables per symbolic graph.
      - ``"partitioner"``: ``"default"`` or ``"min_cut"`` (see _partition_fn).
      - ``"opt_level"``: XLA optimization level 0-3 of these graphs' programs
        (default: ``TORCH_TPU_XLA_OPT_LEVEL``, else 3; see
        torch_tpu.runtime.opt_level).
    """
    from torch._dynamo.backends.common import aot_autograd

    t0 = time.perf_counter()
    gc_pause.install_dynamo_hooks()
    options = dict(options or {})
    if options.get("opt_level") is not None:
        options["opt_level"] = _olevel.check(
            options["opt_level"], 'torch.compile(backend="tpu"): options["opt_level"]')
    # TORCH_TPU_PRECOMPILE: only graphs of frames dynamo is packaging.
    packaged = _artifacts is not None and _artifacts.packaged(gm)
    # Static training graphs: AOTAutograd hands over the backward graph at
    # once (not at the first backward call), so that its program compiles
    # in the background from the forward's first call (_prebuild_backward).
    # A packaged frame's backward is always lowered at once: AOTAutograd
    # bundles the pair into the package while precompile is on, which is
    # only during this frame's compile (artifacts._scope_to_tpu_compiles).
    prebuild = prebuild_enabled()
    made: list[CompiledGraph] | None = [] if prebuild else None
    pending: list[Any] = []  # (packaged: pairs the frame's forward and backward)
    aot = aot_autograd(
        fw_compiler=_compiler("forward", options, packaged, made, pending),
        bw_compiler=_compiler("backward", options, packaged, made, pending),
        inference_compiler=_compiler("inference", options, packaged),
        decompositions=decompositions(),
        partition_fn=_partition_fn(options),
        keep_inference_input_mutations=True,
    )
    from torch._functorch import config as functorch_config

    try:
        if not (prebuild or packaged):
            return aot(gm, example_inputs)
        with (_artifacts.aot_context() if packaged else contextlib.nullcontext()), \
                functorch_config.patch(force_non_lazy_backward_lowering=True):
            compiled = aot(gm, example_inputs)
        kinds = [g.kind for g in made or ()]
        if made and kinds == ["forward", "backward"] and not made[0].symbolic:
            made[0].backward_graph = made[1]
        return compiled
    finally:
        graph_cache.record(backend_seconds=time.perf_counter() - t0)


_registered = False


def register() -> None:
    """Register "tpu" with dynamo and make it the backend for tpu inputs."""
    global _registered
    if _registered:
        return
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "tpu" not in _COMPILER_FNS:
        register_backend(name="tpu")(tpu_backend)
    # Dynamo must never trace torch_tpu's own Python (the device kernels run
    # eagerly between graphs, e.g. `.item()` at a graph break), nor the JAX
    # those kernels call: a frame dynamo skips still has its callees traced,
    # and tracing jax.device_put under an eager op at a graph break (ctc_loss,
    # whose output shape depends on data) broke the call.
    from torch._dynamo import trace_rules

    for module in ("torch_tpu", "jax", "jaxlib"):
        trace_rules.add(module)
    _redirect_inductor()
    _skip_cudagraph_import()
    _lighter_dynamo_bookkeeping()
    gc_pause.install_dynamo_hooks()
    if _artifacts is not None:
        _artifacts.install()  # TORCH_TPU_PRECOMPILE=1: dynamo packages in the cache dir
    _registered = True


def _lighter_dynamo_bookkeeping():
    """Two pieces of dynamo bookkeeping that cost more than tracing itself
    on the first call, and only feed logs and metrics:

    - after building a frame's guards, dynamo times one guard evaluation for
      its metrics (``guard_latency_us``) after flushing the CPU caches
      (`profile_guard_manager`); here it reports 0 instead;
    - for every traced call it computes the enclosing function's name for a
      debug log line (`get_funcname`), tokenizing whole source files
      (torch/nn/functional.py, ...) the first time; here the name comes from
      files already tokenized, or is left out unless dynamo's verbose
      logging is on.

    Nothing else changes: guards, graphs and error messages are the same.
    ``TORCH_TPU_DYNAMO_BOOKKEEPING=1`` keeps PyTorch's behaviour.
    """
    if switch_set("TORCH_TPU_DYNAMO_BOOKKEEPING"):
        return
    try:
        from torch._dynamo import funcname_cache
        from torch._dynamo import guards as dyn_guards
        from torch._dynamo import symbolic_convert
    except Exception:  # pragma: no cover - another torch layout
        return
    original_profile = getattr(dyn_guards, "profile_guard_manager", None)
    if original_profile is not None and not getattr(original_profile, "_torch_tpu", False):

        def profile_guard_manager(*args, **kwargs):
            return 0.0

        profile_guard_manager._torch_tpu = True  # type: ignore[attr-defined]  # our marker
        dyn_guards.profile_guard_manager = profile_guard_manager
    original_funcname = getattr(symbolic_convert, "get_funcname", None)
    if original_funcname is not None and not getattr(original_funcname, "_torch_tpu", False):

        def get_funcname(filename, lineno):
            names = funcname_cache.cache.get(filename)
            if names is not None:
                return names.get(lineno)
            if _dynamo_verbose():
                return original_funcname(filename, lineno)
            return None

        get_funcname._torch_tpu = True  # type: ignore[attr-defined]  # our marker
        symbolic_convert.get_funcname = get_funcname


def _dynamo_verbose() -> bool:
    try:
        import logging

        from torch._dynamo import config

        if config.verbose:
            return True
        return logging.getLogger("torch._dynamo").isEnabledFor(logging.DEBUG)
    except Exception:  # pragma: no cover
        return True


def _skip_cudagraph_import():
    """Dynamo's optimizer tracing asks every grad "is it static for CUDA graphs?"
    by importing inductor's cudagraph_trees (0.5-1.3 s of imports) even for
    non-CUDA tensors, for which the answer is always True. Answer that case
    without the import; CUDA tensors still go to PyTorch's function.
    """
    try:
        from torch._dynamo.variables import optimizer as opt_vars
    except Exception:  # pragma: no cover - another torch layout
        return
    original = getattr(opt_vars, "_is_static_for_cudagraphs", None)
    if original is None or getattr(original, "_torch_tpu", False):
        return

    @functools.wraps(original)
    def _is_static_for_cudagraphs(x):
        if not x.is_cuda:
            return True
        return original(x)

    _is_static_for_cudagraphs._torch_tpu = True  # type: ignore[attr-defined]  # our marker
    opt_vars._is_static_for_cudagraphs = _is_static_for_cudagraphs


def _redirect_inductor():
    """`torch.compile(model)` (inductor) on tpu inputs uses this backend.

    Inductor has no code generator for the tpu device; without this, the
    default backend would fail on tpu tensors. Graphs on other devices still
    go to inductor. TORCH_TPU_INDUCTOR_REDIRECT=0 turns this off.
    """
    if not switch_on("TORCH_TPU_INDUCTOR_REDIRECT"):
        return
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_torch_tpu", False):
        return
    original = wrapper.__call__

    @functools.wraps(original)
    def __call__(self, model_, inputs_):
        if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs_):
            return tpu_backend(model_, inputs_)
        return original(self, model_, inputs_)

    __call__._torch_tpu = True  # type: ignore[attr-defined]  # our marker
    wrapper.__call__ = __call__
