"""The lowering table: one place mapping ATen overloads to JAX functions.

A lowering is a small pure function written against the op's ATen schema:
tensor arguments arrive as jax arrays (already in the tensor's logical shape,
views resolved), `Scalar` arguments as traced weak-typed scalars, everything
else (dims, sizes, flags, dtypes) as plain Python values. It returns arrays
in the structure the op returns. The executor casts each output to the dtype
PyTorch's meta kernel says the op produces, so a lowering only has to get the
values right.

In-place (`add_`) and out= (`add.out`) overloads need no lowering of their
own: the executor runs the functional overload and writes the result back.

    @lower(aten.add.Tensor)
    def add(x, y, *, alpha=1):
        return x + alpha * y

It lives in the runtime, the bottom layer, as a leaf (torch and storage's dtype table): the
executor and the graph lowering read it without importing the op families
that fill it. The families use it as `torch_tpu.ops.registry` (a re-export);
importing that name loads every family, so the table is full.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import torch

from .storage import TORCH_TO_JAX

aten = torch.ops.aten


@dataclass(frozen=True)
class Lowering:
    op: torch._ops.OpOverload
    fn: Callable
    # Names of mutable (non-out) arguments the lowering returns new values for,
    # after its outputs: fn returns (outputs, {name: new_value}).
    mutates: tuple = ()
    # Ops whose lowering needs a fresh PRNG key: passed as keyword `rng_key`.
    random: bool = False
    # Data-dependent output shapes (nonzero, masked_select, unique): run on
    # concrete arrays, outside jit, instead of as one cached executable.
    eager: bool = False
    # Scalar arguments baked into the program (their values are part of the
    # key) instead of runtime inputs: for values that select the program's
    # structure and hardly ever change (a norm's order), where a runtime value
    # would compile every alternative into one program.
    static: tuple = ()


LOWERINGS: dict[Any, Lowering] = {}


def lower(*ops, mutates=(), random=False, eager=False, static=()):
    """Register `fn` as the lowering of each ATen overload in `ops`."""

    def deco(fn):
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {op}")
            LOWERINGS[op] = Lowering(op, fn, tuple(mutates), random, eager, tuple(static))
        return fn

    return deco


class _Context(threading.local):
    meta_out: Any = None  # pytree of meta tensors: what the op returns


CONTEXT = _Context()


def out_meta():
    """The meta tensor(s) PyTorch says the op being lowered returns."""
    return CONTEXT.meta_out


def out_dtype():
    """The jax dtype of the (first) output of the op being lowered."""
    meta = CONTEXT.meta_out
    while isinstance(meta, (tuple, list)):
        meta = meta[0]
    return TORCH_TO_JAX[meta.dtype]


def out_torch_dtype():
    meta = CONTEXT.meta_out
    while isinstance(meta, (tuple, list)):
        meta = meta[0]
    return meta.dtype
