"""XLA programs of eager functions, single ops and graphs: HLO text and analyses.

    prog = torch_tpu.debug.lower(lambda a, b: a @ b + 1, a, b)
    print(prog.stablehlo)          # StableHLO (MLIR) as lowered from JAX
    print(prog.hlo)                # HLO before XLA's optimization passes
    print(prog.optimized)          # HLO after XLA's passes (what runs)
    prog.cost                      # {'flops': ..., 'bytes_accessed': ..., ...}
    prog.memory                    # {'argument_size_in_bytes': ..., ...}

    torch_tpu.debug.hlo(fn, *args, stage="optimized")   # just the text

`fn` may be a Python function or `nn.Module` run on tpu tensors (traced once
into an ATen graph and lowered through the lowering table as one program),
an ATen op (`torch.ops.aten.addmm.default` or the packet
`torch.ops.aten.addmm`), or a `torch.fx.GraphModule` (a torch.compile
graph). Programs the process actually compiled are in
`torch_tpu.debug.compile_log()`; `last_graphs()` gives those of the most
recent torch.compile graphs.
"""

from __future__ import annotations

import re

import torch

from .._compat.torch_api import pytree
from ..runtime.storage import TORCH_TO_JAX
from . import _graph

STAGES = ("stablehlo", "hlo", "optimized")


def _check_stage(stage):
    if stage not in STAGES:
        raise ValueError(f"unknown HLO stage {stage!r}; valid stages: "
                         f"{', '.join(repr(s) for s in STAGES)}")


class Program:
    """One XLA program: its text at each stage, cost and memory analysis.

    A program a warm process loaded from the compile cache without lowering
    it (a torch.compile graph served by the graph tier) has its executable
    only; its 'stablehlo' and 'hlo' stages are then lowered again on first
    use, from the graph it was built from (`relower`, a thunk returning the
    jax.stages.Lowered; a `compiled` object may carry one as `.relower`).
    """

    def __init__(self, name, lowered=None, compiled=None, fn=None, args=None,
                 optimized_text=None, relower=None):
        self.name = name
        self._lowered = lowered
        self._compiled = compiled
        self._optimized_text = optimized_text
        if relower is None and compiled is not None:
            relower = getattr(compiled, "relower", None)
        self._relower = relower if lowered is None else None

    # -- stages -------------------------------------------------------------

    def has_stage(self, stage) -> bool:
        _check_stage(stage)
        if stage == "optimized":
            return (self._compiled is not None or self._lowered is not None
                    or self._optimized_text is not None)
        return self._lowered is not None or self._relower is not None

    def _lowered_form(self):
        if self._lowered is None:
            if self._relower is None:
                raise RuntimeError(
                    f"program {self.name!r} was recorded without its lowered form, so only "
                    "the 'optimized' stage (and cost/memory analysis) is available")
            try:
                self._lowered = self._relower()
            except Exception as e:
                raise RuntimeError(
                    f"program {self.name!r} was loaded from the compile cache without its "
                    f"lowered form, and lowering it again failed ({type(e).__name__}: {e}); "
                    "only the 'optimized' stage (and cost/memory analysis) is available"
                ) from e
            self._relower = None
        return self._lowered

    def text(self, stage="stablehlo") -> str:
        """The program text at `stage` ('stablehlo', 'hlo' or 'optimized')."""
        _check_stage(stage)
        if stage == "optimized":
            if self._optimized_text is None:
                self._optimized_text = self.compiled.as_text()
            return self._optimized_text
        lowered = self._lowered_form()
        if stage == "stablehlo":
            return lowered.as_text()
        return lowered.as_text(dialect="hlo")

    @property
    def stablehlo(self) -> str:
        return self.text("stablehlo")

    @property
    def hlo(self) -> str:
        return self.text("hlo")

    @property
    def optimized(self) -> str:
        return self.text("optimized")

    @property
    def lowered(self):
        """The jax.stages.Lowered (lowered again for a program loaded from disk;
        None when it cannot be had)."""
        try:
            return self._lowered_form()
        except RuntimeError:
            return None

    @property
    def compiled(self):
        if self._compiled is None:
            if self._lowered is None and self._relower is None:
                raise RuntimeError(f"program {self.name!r} is no longer held")
            self._compiled = self._lowered_form().compile()
        return self._compiled

    def _analysis(self, method):
        fn = getattr(self.compiled, method, None)
        if fn is None:
            raise RuntimeError(f"program {self.name!r}: its executable "
                               f"({type(self.compiled).__name__}) has no {method}")
        return fn()

    # -- analyses -----------------------------------------------------------

    @property
    def cost(self) -> dict:
        """XLA's cost analysis: flops, bytes_accessed, transcendentals, ...

        Keys are XLA's with spaces turned into underscores; per-operand
        entries (`bytes accessed0{}`) are kept under 'raw'.
        """
        raw = self._analysis("cost_analysis")
        if isinstance(raw, (list, tuple)):  # older JAX: one dict per device
            raw = raw[0] if raw else {}
        raw = dict(raw or {})
        out = {}
        for k, v in raw.items():
            if "{" in k:
                continue
            out[k.replace(" ", "_")] = float(v)
        out.setdefault("flops", 0.0)
        out.setdefault("bytes_accessed", 0.0)
        out["raw"] = raw
        return out

    @property
    def flops(self) -> float:
        return self.cost["flops"]

    @property
    def memory(self) -> dict:
        """XLA's memory analysis (bytes): arguments, outputs, temporaries, code."""
        stats = self._analysis("memory_analysis")
        if stats is None:
            return {}
        out = {}
        for k in dir(stats):
            if k.endswith("_in_bytes"):
                try:
                    out[k] = int(getattr(stats, k))
                except (TypeError, ValueError):
                    continue
        return out

    def __repr__(self):
        stages = [s for s in STAGES if self.has_stage(s)]
        return f"Program({self.name!r}, stages={stages})"

    def __str__(self):
        if self.has_stage("stablehlo"):
            try:
                return self.text("stablehlo")
            except RuntimeError:
                pass
        return self.text("optimized")


# --------------------------------------------------------------------------
# lowering callables


def _describe(target) -> str:
    return f"{type(target).__module__}.{type(target).__qualname__}"


def _unwrap_compiled(target):
    """The original callable of a torch.compile'd function or module."""
    orig = getattr(target, "_orig_mod", None)  # OptimizedModule
    if orig is not None:
        return orig
    orig = getattr(target, "_torchdynamo_orig_callable", None)
    if orig is not None:
        return orig
    return target


def _resolve(target):
    """(python callable, name, module or None) for the supported targets."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return (lambda *a, **k: target(*a, **k)), str(target._qualified_op_name).replace(
            "::", "."), None
    if isinstance(target, torch._ops.OpOverload):
        return (lambda *a, **k: target(*a, **k)), str(target), None
    if isinstance(target, torch.fx.GraphModule):
        return target, "graph:" + type(target).__name__, None
    target = _unwrap_compiled(target)
    if isinstance(target, torch.nn.Module):
        return target, type(target).__name__, target
    if callable(target) and not isinstance(target, (type, str, bytes)):
        return target, getattr(target, "__name__", type(target).__name__), None
    raise ValueError(
        "torch_tpu.debug.hlo: expected a function, an nn.Module, an ATen op "
        "(e.g. torch.ops.aten.add.Tensor) or a torch.fx.GraphModule (a torch.compile "
        f"graph); got {_describe(target)}")


def _jax_spec(t):
    import jax

    return jax.ShapeDtypeStruct(tuple(t.shape), TORCH_TO_JAX[t.dtype])


def lower(target, *args, **kwargs) -> Program:
    """The XLA program of `target(*args, **kwargs)`, as one JAX-lowered program.

    Tensors anywhere in args/kwargs (and an nn.Module's parameters and
    buffers) become the program's parameters, in that order, followed by any
    other tensors the function reads (closed-over weights); other values are
    baked in. Nothing runs on the device: the function is traced with fake
    tensors.
    """
    import jax

    fn, name, module = _resolve(target)
    state = {}
    if module is not None:
        state = dict(module.named_parameters())
        state.update(dict(module.named_buffers()))
    leaves, spec = pytree.tree_flatten((state, args, kwargs))
    is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
    tensors = [x for x, t in zip(leaves, is_tensor) if t]

    def flat_fn(*ts):
        it = iter(ts)
        vals = [next(it) if t else x for x, t in zip(leaves, is_tensor)]
        st_, a, k = pytree.tree_unflatten(vals, spec)
        if module is not None:
            return torch.func.functional_call(module, st_, a, k)
        return fn(*a, **k)

    gm, inputs = _graph.trace(flat_fn, tensors)
    specs = [_jax_spec(t) for t in inputs]
    lowered, first_error = None, None
    for build in _graph.builders():
        try:
            built = build(gm, name)
            if built is None:
                continue
            jfn, consts = built
            jfn.__name__ = _graph_fn_name(name)
            const_specs = [jax.ShapeDtypeStruct(c.shape, c.dtype) for c in consts]
            lowered = jax.jit(jfn).lower(*specs, *const_specs)
            break
        except Exception as e:  # try the next builder
            first_error = first_error or e
    if lowered is None:
        raise first_error
    prog = Program(name, lowered=lowered)
    prog.graph = gm
    return prog


_SAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


def safe_name(name: str) -> str:
    """`name` as a file-name part (the compile log's dump files, graph functions)."""
    return _SAFE.sub("_", name).strip("_")[:120] or "program"


def _graph_fn_name(name):
    return safe_name(name).replace(".", "_").replace("-", "_") or "program"


def hlo(target, *args, stage: str = "stablehlo", **kwargs) -> str:
    """The program text of `target(*args, **kwargs)` at `stage`.

    stage: 'stablehlo' (as lowered), 'hlo' (before XLA's passes) or
    'optimized' (after them: what runs on the device).
    """
    _check_stage(stage)
    if isinstance(target, Program):
        return target.text(stage)
    return lower(target, *args, **kwargs).text(stage)


def cost_analysis(target, *args, **kwargs) -> dict:
    """XLA's cost analysis of `target(*args)` (flops, bytes_accessed, ...)."""
    prog = target if isinstance(target, Program) else lower(target, *args, **kwargs)
    return prog.cost


def memory_analysis(target, *args, **kwargs) -> dict:
    """XLA's memory analysis of `target(*args)` (argument/output/temp bytes)."""
    prog = target if isinstance(target, Program) else lower(target, *args, **kwargs)
    return prog.memory
