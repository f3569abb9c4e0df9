"""The keys of a compiled graph's executables, all built here.

A `CompiledGraph` (compile/graph.py) finds the executable for a call through
keys that each extend the one before:

- `call_token`: what can still change a static graph's program between
  calls once dynamo's guards fixed its shapes (matmul precision, XLA
  optimization level, the inputs' view layouts and storage shapes); the key
  of the graph's own table of specializations;
- `specialization`: the input signature (tensor shapes and dtypes, int
  values, static values, precision, optimization level); a symbolic graph's
  table is keyed by it, and it is part of
- `program_key`: `ProgramKind.GRAPH`, the graph's fingerprint and kind, the
  specialization, the device, the donated inputs, the constants and the
  optimization level; the graph's key in the program cache
  (runtime/programs.py, through compile/graph_cache.py) and the key under
  which `programs.compile` compiles;
- `persistent_key`: the graph tier's key (torch_tpu.cache.graphs), the
  program key plus what a later process must match to reuse the executable
  (graph code, output and mutation layout, placeholder metadata), or None
  when the graph is not stored.
"""

from __future__ import annotations

import jax
import torch

# The matmul precision setting: part of every graph executable's key.
from ..precision import cache_token as precision_token
from ..runtime.programs import ProgramKind

try:
    from ..cache import graphs as _graph_tier
except Exception:  # pragma: no cover - the cache package failed to import
    _graph_tier = None


def call_token(graph, arrays, layouts) -> tuple:
    """A static graph's key of one call's inputs (storage arrays, layouts)."""
    return (precision_token(), graph.level(), layouts, tuple(a.shape for a in arrays))


def specialization(graph, arrays, ints) -> tuple:
    """The specialization key of these input values."""
    return (tuple((a.shape, str(a.dtype)) for a in arrays), tuple(ints),
            tuple(repr(s.static) for s in graph.specs if s.kind == "x"), precision_token(),
            graph.level())


def program_key(graph, key, donate_idx, consts, level) -> tuple:
    """The key of one program of `graph`: specialization `key`, compiled with
    inputs `donate_idx` donated, constants `consts`, at optimization `level`."""
    return (ProgramKind.GRAPH, graph.fingerprint, graph.kind, key, graph.device, tuple(donate_idx),
            tuple(tuple(c.shape) + (str(c.dtype),) if hasattr(c, "shape") else repr(c)
                  for c in consts), ("opt_level", level))


def persistent_key(graph, gkey, donating, consts):
    """The graph tier's key of program `gkey`, or None (not stored)."""
    if graph.symbolic or _graph_tier is None:
        return None
    try:
        if not _graph_tier.enabled():
            return None
        if any(not isinstance(c, jax.Array) for c in consts):
            return None
        parts = [graph.kind, graph.gm.code, repr(gkey), repr(graph.out_specs),
                 str(graph.n_user_outputs), repr(graph.program.mutated_inputs),
                 "donate" if donating else "plain"]
        for n in graph.program.placeholders:
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                parts.append(repr((tuple(int(d) for d in val.shape),
                                   tuple(int(d) for d in val.stride()),
                                   str(val.dtype), int(val.storage_offset()))))
            else:
                parts.append(type(val).__name__)
        text = "\n".join(parts)
        if " at 0x" in text:  # an object's address: not stable across processes
            return None
        return _graph_tier.key_for(text)
    except Exception:  # anything we cannot describe is simply not stored
        return None
