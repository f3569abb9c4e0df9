"""XLA optimization level: how much work XLA spends on each program.

    TORCH_TPU_XLA_OPT_LEVEL=0 python train.py            # every program
    torch.compile(model, backend="tpu", options={"opt_level": 1})   # one graph

Levels (like a C compiler's -O flags):

- ``3`` (default): XLA's own defaults, exactly what ``jax.jit`` compiles: no
  option is overridden.
- ``2``, ``1``: XLA's effort level ``O2``/``O1`` (the ``optimization_level``
  of its build options) and LLVM code generation at ``-O2``/``-O1``
  (``xla_backend_optimization_level``).
- ``0``: effort level ``O0``, LLVM at ``-O0`` and LLVM's expensive passes
  off (``xla_llvm_disable_expensive_passes``): the fastest compiles and the
  slowest programs.

What each platform does with them: XLA:CPU and XLA:GPU generate their code
with LLVM, so the backend level changes their machine code (on the CPU, -O0
leaves elementwise loops unvectorized: a 1024x1024 GELU ran 15x slower); the
effort level changes XLA's HLO passes where the backend reads it (the TPU
compiler's main knob; on XLA:GPU, O1 and above also turn on collective
pipelining and the latency-hiding scheduler, which cost compile time). The
numbers behind the default are in docs/benchmarks.md.

The level is part of every executable's key: in memory (the executor's op
cache, compiled graphs) and on disk (JAX's key covers the compile options),
so programs compiled at one level are never served at another. Results do
not depend on the level; only compile time and speed do.

`set_level(n)` changes the level of programs compiled from then on (eager ops
and graphs compiled without an ``opt_level`` option); `level()` reads it.
"""

from __future__ import annotations

import warnings
from typing import Any

from .context import CONTEXT
from .switches import switch_value

ENV = "TORCH_TPU_XLA_OPT_LEVEL"
LEVELS = (0, 1, 2, 3)
DEFAULT = 3
# XLA's EffortLevel proto values (O0=9, O1=19, O2=29; JAX's EffortLevel enum
# mirrors them): what ExecutableBuildOptions' optimization_level takes. Proto
# enum numbers are part of XLA's wire format, so no JAX internal is read.
EFFORT = {0: 9, 1: 19, 2: 29}


def check(value: Any, where: str) -> int:
    """`value` as a level, or ValueError naming `where` it came from."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: XLA optimization level must be one of 0, 1, 2, 3, got {value!r}")
    try:
        level = int(value)
    except (TypeError, ValueError):
        level = None
    if level not in LEVELS or (isinstance(value, float) and value != level):
        raise ValueError(f"{where}: XLA optimization level must be one of 0, 1, 2, 3, "
                         f"got {value!r}")
    return level


def _from_env() -> int:
    raw = switch_value(ENV)
    if not raw:
        return DEFAULT
    try:
        return check(raw, ENV)
    except ValueError as e:
        warnings.warn(f"torch_tpu: {e}; using {DEFAULT}", stacklevel=2)
        return DEFAULT


# The process-wide level lives in CONTEXT.opt_level (runtime/context.py), read
# there on every op (an attribute: cheaper than a call on the hot path).
CONTEXT.opt_level = _from_env()


def level() -> int:
    """The XLA optimization level of programs compiled from now on."""
    return CONTEXT.opt_level


def set_level(value: Any) -> None:
    """Compile programs from now on at `value` (0-3); see the module docstring."""
    CONTEXT.opt_level = check(value, "torch_tpu.runtime.opt_level.set_level")


def compiler_options(value: int) -> dict | None:
    """The XLA compile options of a level (None: XLA's defaults)."""
    if value == 3:
        return None
    opts: dict = {"xla_backend_optimization_level": value,
                  "optimization_level": EFFORT[value]}
    if value == 0:
        opts["xla_llvm_disable_expensive_passes"] = True
    return opts
