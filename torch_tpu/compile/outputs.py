"""A compiled graph's results as its caller gets them, from what its program
returned: one implementation for the static path (`graph.CompiledGraph.execute`)
and the bucketed dynamic-shape path (`dynamic.Policy._run_padded`).

A graph's `out_specs` (its `GraphSpec`, compile/graph_spec.py) say, per user-visible output, where its value comes
from: `("array", i, dtype)` program output i as a new tpu tensor,
`("input", pos)` the input itself, `("input_view", pos, view, ...)` a view of
an input, `("value", ...)` a Python value (a SymInt), `("none", ...)` None,
or `("const", value)` a constant of the graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..ops import core
from ..runtime import storage as st
from .graph_spec import GraphSpec
from .lowering import LoweringError


def write_back(t: torch.Tensor, arr: Any) -> None:
    """Store the new value of a mutated graph input."""
    if t.device.type == "cpu":
        # A CPU tensor the graph updates in place: the optimizers' 0-dim
        # `step` counters (Adam, AdamW, ... when not capturable) are one.
        # Its new value is read back to the host, as the CPU holds it.
        with torch.no_grad():
            t.copy_(st.host_tensor(np.asarray(arr), t.dtype).reshape(t.shape))
        return
    data = st.data_of(t)
    if (t.dtype is data.dtype and t.is_contiguous() and t.storage_offset() == 0
            and tuple(arr.shape) == data.shape
            and (t.shape == data.shape or t.numel() == math.prod(data.shape))):
        # The whole storage: the value in the view's shape, or already in the
        # storage's own shape (graph_cache.whole_reshape inputs).
        data.array = arr
    else:
        core.assign(t, arr)


def input_view(t: torch.Tensor, view: tuple) -> torch.Tensor:
    """The view of input `t` that a graph output was (sizes, strides, offset)."""
    size, stride, offset, in_size, in_stride = view
    if tuple(t.shape) != in_size or tuple(t.stride()) != in_stride:
        raise LoweringError("an input's layout changed under a compiled graph")
    with torch.no_grad():
        return torch.ops.aten.as_strided.default(t.detach(), list(size), list(stride),
                                                 t.storage_offset() + offset)


def wrap_outputs(spec: GraphSpec, args: list, muts: Sequence[Any],
                 array: Callable[[int, tuple], torch.Tensor],
                 value: Callable[[int], Any]) -> list:
    """Write the mutated inputs' new values back, then build the results.

    `array(i, spec)` makes output i's tensor from an "array" spec and
    `value(i)` output i's Python value: the two things the static and the
    padded path compute differently. `args` is cleared (the caller's
    references to the inputs are released as soon as the results exist).
    """
    for pos, arr in zip(spec.program.mutated_inputs, muts):
        write_back(args[pos], arr)
    results: list = []
    for i, out in enumerate(spec.out_specs):
        kind = out[0]
        if kind == "array":
            results.append(array(i, out))
        elif kind == "input":
            results.append(args[out[1]])
        elif kind == "input_view":
            results.append(input_view(args[out[1]], out[2]))
        elif kind == "value":
            results.append(value(i))
        elif kind == "none":
            results.append(None)
        else:
            results.append(out[1])
    args.clear()
    return results
