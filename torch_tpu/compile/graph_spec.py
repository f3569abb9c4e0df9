"""What a compiled graph is, as one frozen value: `GraphSpec`.

`CompiledGraph` (compile/graph.py) analyses its AOT graph once and produces
a `GraphSpec`; the modules that key, cache and specialize its programs
(`graph_key`, `graph_cache`, `dynamic`) read that value and never the graph
object, so none of them imports compile/graph.py: the graph imports them,
not the other way round. The mutable state of a graph (its table of
executables, its constants once made, the eager fallback) stays on the
graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..runtime.context import CONTEXT
from .lowering import GraphProgram


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """How one placeholder is passed: "t" a tensor (`dtype`), "s" a SymInt or
    int, "x" another Python value (`static`, the same at every call)."""

    kind: str
    dtype: torch.dtype | None = None
    static: Any = None


# eq=False: the fields hold the FX program and its nodes, compared by
# identity (two graphs are the same graph only if they are one object).
@dataclasses.dataclass(frozen=True, eq=False)
class GraphSpec:
    """One AOT graph's analysis: its inputs, outputs and identity.

    `out_specs` say per output where its value comes from (see
    compile/outputs.py); outputs [0, n_user_outputs) are what the user (or
    AOTAutograd's wrapper) sees, the rest of a forward graph's are saved for
    its backward graph. `donate_idx` are the positions, among the tensor
    inputs, of those the graph overwrites.
    """

    name: str
    kind: str                       # "forward", "backward", "inference", "step"
    fingerprint: str                # sha256 of `code`
    code: str                       # the FX module's code, after effects.hoist
    device: int                     # the tpu index the graph runs on
    program: GraphProgram
    inputs: tuple[InputSpec, ...]
    tensor_pos: tuple[int, ...]     # positions of the "t" inputs
    int_pos: tuple[int, ...]        # positions of the "s" inputs
    symbolic: bool                  # symbolic sizes: runs through dynamic.Policy
    output_nodes: tuple[Any, ...]
    out_specs: tuple[tuple[Any, ...], ...]
    n_user_outputs: int
    donate_idx: tuple[int, ...]
    opt_level: int | None           # the "opt_level" option; None: the process's

    def level(self) -> int:
        """The XLA optimization level this graph compiles at now."""
        return CONTEXT.opt_level if self.opt_level is None else self.opt_level

    def static_values(self) -> tuple[str, ...]:
        """The reprs of the "x" inputs (part of the specialization key)."""
        return tuple(repr(s.static) for s in self.inputs if s.kind == "x")
