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
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .. import _compat as compat
from .._compat import dynamo_api, torch_api
from ..ops import registry
from ..runtime import gc_pause
from ..runtime import opt_level as _olevel
from ..runtime.switches import switch_set, switch_value
from . import graph_cache
from .. import compile as compile_package  # (this package: whole_step)
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
    (`torch.export.default_decompositions()`, what export uses) adds an entry for every
    CompositeImplicitAutograd op, which tracing decomposes by itself anyway,
    and collecting those ops costs ~0.5 s per process.
    ``TORCH_TPU_DECOMP_TABLE=full`` uses the full table.
    """
    if switch_value("TORCH_TPU_DECOMP_TABLE") == "full":
        return dict(torch.export.default_decompositions())
    try:
        post_autograd = torch_api.core_aten_decompositions_post_autograd
    except ImportError:  # pragma: no cover - another torch
        return dict(torch.export.default_decompositions())
    return dict(post_autograd())


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
    from functorch import compile as partitioners

    choice = options.get("partitioner") or switch_value("TORCH_TPU_PARTITIONER")
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
    aot = dynamo_api.aot_autograd(
        fw_compiler=_compiler("forward", options, packaged, made, pending),
        bw_compiler=_compiler("backward", options, packaged, made, pending),
        inference_compiler=_compiler("inference", options, packaged),
        decompositions=decompositions(),
        partition_fn=_partition_fn(options),
        keep_inference_input_mutations=True,
    )
    from functorch.compile import config as functorch_config

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
BOOKKEEPING = "lighter dynamo bookkeeping"
CUDAGRAPH = "no cudagraph import for non-CUDA optimizer steps"
WHOLE_STEP = 'torch.compile(backend="tpu", options={"whole_step": True})'


def register() -> None:
    """Prepare dynamo for tpu compiles (idempotent; imports dynamo).

    Runs when dynamo loads the "tpu" backend (the `torch_dynamo_backends`
    entry point, torch_tpu.compile.entry), at the first tpu compile, or from
    `torch_tpu.compile.register()`: everything here serves tpu compiles
    only, and a process that never asks for one never runs it. "tpu" is
    registered by name only where the entry point is not installed.
    """
    global _registered
    if _registered:
        return
    if "tpu" not in dynamo_api.COMPILER_FNS and dynamo_api.BACKENDS.get("tpu") is None:
        dynamo_api.register_backend(name="tpu")(tpu_backend)
    # Dynamo must never trace torch_tpu's own Python (the device kernels run
    # eagerly between graphs, e.g. `.item()` at a graph break), nor the JAX
    # those kernels call: a frame dynamo skips still has its callees traced,
    # and tracing jax.device_put under an eager op at a graph break (ctc_loss,
    # whose output shape depends on data) broke the call.
    for module in ("torch_tpu", "jax", "jaxlib"):
        dynamo_api.skip_module(module)
    found = patches()
    if not switch_set("TORCH_TPU_DYNAMO_BOOKKEEPING"):
        compat.apply(BOOKKEEPING, found[BOOKKEEPING])
    compat.apply(CUDAGRAPH, found[CUDAGRAPH])
    compat.apply(WHOLE_STEP, found[WHOLE_STEP])
    gc_pause.install_dynamo_hooks()
    if _artifacts is not None:
        _artifacts.install()  # TORCH_TPU_PRECOMPILE=1: dynamo packages in the cache dir
    _registered = True


def patches() -> dict:
    """Dynamo patches of the tpu backend (artifacts.patches has precompile's).

    Two pieces of dynamo bookkeeping cost more than tracing itself on the
    first call and only feed logs and metrics:

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

    And dynamo's optimizer tracing asks every grad "is it static for CUDA
    graphs?" by importing inductor's cudagraph_trees (0.5-1.3 s of imports)
    even for non-CUDA tensors, for which the answer is always True: that case
    is answered without the import; CUDA tensors still go to PyTorch's function.
    """
    return {
        BOOKKEEPING: [
            compat.Patch("torch._dynamo.guards:profile_guard_manager", BOOKKEEPING,
                         "times a guard evaluation for metrics only, after flushing CPU caches",
                         lambda original: _no_guard_profile),
            compat.Patch("torch._dynamo.symbolic_convert:get_funcname", BOOKKEEPING,
                         "tokenizes whole source files for a debug log line", _funcname),
        ],
        CUDAGRAPH: [
            compat.Patch("torch._dynamo.variables.optimizer:_is_static_for_cudagraphs",
                         CUDAGRAPH, "imports inductor's cudagraph_trees for any tensor",
                         _static_for_cudagraphs),
        ],
        WHOLE_STEP: [
            compat.Patch("torch._dynamo:optimize", WHOLE_STEP,
                         "a backend sees graphs, never the function: a training step as one "
                         "program must be taken before dynamo splits it into frames",
                         _whole_step_option),
        ],
    }


def _whole_step_option(optimize):
    """`options={"whole_step": True}` of a tpu compile: the step goes to
    torch_tpu.compile_step (one program) instead of dynamo's frames."""
    def optimize_(*args, **kwargs):
        wrapper = kwargs.get("backend", args[0] if args else None)
        opts = (getattr(wrapper, "kwargs", None) or {}).get("options")
        fn = getattr(wrapper, "compiler_fn", None)
        if isinstance(opts, dict) and opts.get("whole_step") and \
                str(getattr(fn, "__module__", "")).startswith("torch_tpu"):
            rest = {k: v for k, v in opts.items() if k != "whole_step"}
            return lambda step: compile_package.whole_step(step, rest)
        return optimize(*args, **kwargs)

    return optimize_


def _no_guard_profile(*args, **kwargs):
    return 0.0


def _funcname(original):
    def get_funcname(filename, lineno):
        names = dynamo_api.funcname_cache.get(filename)
        if names is not None:
            return names.get(lineno)
        if _dynamo_verbose():
            return original(filename, lineno)
        return None

    return get_funcname


def _static_for_cudagraphs(original):
    @functools.wraps(original)
    def _is_static_for_cudagraphs(x):
        if not x.is_cuda:
            return True
        return original(x)

    return _is_static_for_cudagraphs


def _dynamo_verbose() -> bool:
    try:
        import logging

        if dynamo_api.dynamo_config.verbose:
            return True
        return logging.getLogger("torch._dynamo").isEnabledFor(logging.DEBUG)
    except Exception:  # pragma: no cover
        return True
