"""Shrink a failing program to a minimal one that fails the same way.

Greedy passes, repeated until none helps (or the budget of tries is spent):
drop steps (with every later step that reads what they defined), drop
steps with later ones reading one of their operands instead, drop
inputs nothing reads, make layouts contiguous, shrink each dimension (to 1,
then by one; each part of it tried), and replace special values with ordinary ones (all of an
input's at once, then one by one). A candidate is kept when `fails` says it
still fails the same way (the runner: same path, same kind of mismatch).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator

import numpy as np

from .generator import ORDINARY, Input, Program, defs, uses


def _drop_step(prog: Program, k: int) -> Program:
    """`prog` without step k and the later steps that read what it defined."""
    gone = set(defs(prog.steps[k]))
    kept = []
    for i, s in enumerate(prog.steps):
        if i == k:
            continue
        if uses(s) & gone:
            gone |= set(defs(s))
            continue
        kept.append(s)
    return dataclasses.replace(prog, steps=tuple(kept))


def _bypass_step(prog: Program, k: int) -> Iterator[Program]:
    """`prog` without step k, later steps reading one of its operands instead
    of what it defined (`v1 = x0.cumsum(0); v2 = v1.sum()` -> `v2 = x0.sum()`)."""
    names = defs(prog.steps[k])
    if len(names) != 1:
        return
    rx = re.compile(rf"\b{names[0]}\b")
    if not any(rx.search(s) for s in prog.steps[k + 1:]):
        return  # nothing reads it: the same as dropping it
    for operand in sorted(uses(prog.steps[k])):
        later = tuple(rx.sub(operand, s) for s in prog.steps[k + 1:])
        yield dataclasses.replace(prog, steps=prog.steps[:k] + later)


def _with_input(prog: Program, k: int, inp: Input) -> Program:
    inputs = list(prog.inputs)
    inputs[k] = inp
    return dataclasses.replace(prog, inputs=tuple(inputs))


def _sliced(inp: Input, d: int, start: int, size: int) -> Input:
    """`inp` cut to `size` elements from `start` along dimension `d`."""
    vals = np.empty(len(inp.values), dtype=object)
    vals[:] = inp.values
    kept = vals.reshape(inp.shape).take(range(start, start + size), axis=d)
    shape = inp.shape[:d] + (size,) + inp.shape[d + 1:]
    layout = inp.layout
    if (layout == "channels_last" and len(shape) != 4) or (layout == "transposed" and len(shape) < 2):
        layout = "contiguous"
    return dataclasses.replace(inp, shape=shape, values=tuple(kept.flatten().tolist()),
                               layout=layout)


def _is_ordinary(v: bool | int | float, dtype: str) -> bool:
    if dtype == "bool":
        return True
    if isinstance(v, float):
        return math.isfinite(v) and (v == 0 and math.copysign(1, v) > 0 or 1e-3 <= abs(v) <= 1e3)
    return -1000 <= v <= 1000


def candidates(prog: Program) -> Iterator[Program]:
    """Smaller variants of `prog`, the biggest cuts first."""
    for k in reversed(range(len(prog.steps))):
        yield _drop_step(prog, k)
    for k in reversed(range(len(prog.steps))):
        yield from _bypass_step(prog, k)
    used = set().union(*(uses(s) for s in prog.steps)) if prog.steps else set()
    for k, inp in enumerate(prog.inputs):
        if inp.name not in used:
            yield dataclasses.replace(prog, inputs=prog.inputs[:k] + prog.inputs[k + 1:])
    for k, inp in enumerate(prog.inputs):
        if inp.layout != "contiguous":
            yield _with_input(prog, k, dataclasses.replace(inp, layout="contiguous"))
        for d, size in enumerate(inp.shape):
            for new in sorted({1, size - 1}):
                if 0 < new < size:
                    for start in range(size - new + 1):  # which part to keep
                        yield _with_input(prog, k, _sliced(inp, d, start, new))
        special = [i for i, v in enumerate(inp.values) if not _is_ordinary(v, inp.dtype)]
        ordinary = ORDINARY[inp.dtype]
        if len(special) > 1:
            vals = tuple(ordinary if i in special else v for i, v in enumerate(inp.values))
            yield _with_input(prog, k, dataclasses.replace(inp, values=vals))
        for i in special:
            vals = inp.values[:i] + (ordinary,) + inp.values[i + 1:]
            yield _with_input(prog, k, dataclasses.replace(inp, values=vals))


def shrink(prog: Program, fails: Callable[[Program], bool], budget: int = 200) -> Program:
    """The smallest variant of `prog` the greedy passes reach for which
    `fails` holds (`fails(prog)` is assumed); at most `budget` calls."""
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for cand in candidates(prog):
            if tries >= budget:
                break
            tries += 1
            if fails(cand):
                prog, progress = cand, True
                break
    return prog
