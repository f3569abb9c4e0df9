"""XLA:CPU options torch_tpu sets by default, found by measurement.

XLA reads XLA_FLAGS when it creates its first backend, so they are added to
the environment before any JAX device exists (runtime.platform, first thing;
tests/conftest.py, so every test process starts with them). A flag the user
set (either value) is kept; TORCH_TPU_CPU_XLA_DEFAULTS=0 adds none. They
change only XLA:CPU's compiles (TPU and GPU programs compile the same), and
they are part of every disk-cache key through XLA_FLAGS (cache.store's
environment key). No JAX here: the module is imported before it.

The concurrency-optimized scheduler orders independent work early: in a
program holding a model's layers, every bfloat16 weight's float32 convert
(XLA:CPU has no bfloat16 dot) runs before the first dot, so the program
holds float32 copies of all the weights at once (2x their bytes of scratch)
and writes them on every call. The memory-minimizing schedule converts each
weight just before its dot: an 8-layer decoding step (hidden 1024, MLP 4096,
bfloat16) 215 -> 98 ms a call, scratch 2.0x -> 0.25x the weights
(docs/benchmarks.md, "XLA:CPU's scheduler").

One more default is a lowering choice, not a flag: XLA:CPU computes a
half-precision product `x @ W.T` (W stored row-major, as a Linear's weight)
whose x has more than one row by first making a float32, transposed copy of
all of W: a 128256 x 2048 bfloat16 LM head is 1 GB of scratch on every call,
and the product runs 2-3x slower than over cache-sized pieces of W's rows.
On the CPU platform the matrix products (ops/linalg.py) split such a product
along W's stored rows into pieces of `cpu_dot_piece_bytes()` of float32 (16
MiB; TORCH_TPU_CPU_DOT_PIECE_MB sets it, 0 or TORCH_TPU_CPU_XLA_DEFAULTS=0
turns it off). Each output element's dot product is computed whole, so
results are unchanged (docs/benchmarks.md, "Which bfloat16 dots get a
float32 copy"). The value is part of the graph and eager tiers' keys
(cache/graphs.py); the executable tier keys on the program itself.

On a host with AMX-BF16 or AVX512-BF16 the same product is instead written
as a dot that reads W as stored (no transpose before it): XLA:CPU then
multiplies the bfloat16 operands natively in its XNNPACK fusion, 10-16x
faster than on float32 copies with AMX, about 2x with AVX512-BF16 (`cpu_native_bf16_dots`, TORCH_TPU_CPU_NATIVE_BF16_DOTS).

On a host with no native dot unit for a half type (no AMX-BF16 or
AVX512-BF16 for bfloat16; no AMX-FP16 or AVX512-FP16 for float16), XLA:CPU's
half dot is slower than converting both operands to float32 once and taking
the float32 dot, as PyTorch's CPU matmul does (`cpu_half_dots_f32`,
TORCH_TPU_CPU_HALF_DOTS_F32). Each output element is a float32-accumulated
dot rounded once either way.
"""

from __future__ import annotations

import functools
import os

from .switches import switch_auto, switch_on, switch_value

CPU_DEFAULTS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)
DOT_PIECE_MB = 16


def cpu_dot_piece_bytes() -> int:
    """Float32 bytes of one piece of a split half-precision product on
    XLA:CPU (0: not split). Read when a program is traced."""
    if not switch_on("TORCH_TPU_CPU_XLA_DEFAULTS"):
        return 0
    text = switch_value("TORCH_TPU_CPU_DOT_PIECE_MB")
    try:
        mb = float(text) if text else DOT_PIECE_MB
    except ValueError:
        raise ValueError(f"TORCH_TPU_CPU_DOT_PIECE_MB={text!r} is not a number of MiB") from None
    return max(0, int(mb * 2**20))


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    """This host's CPU feature flags (Linux: /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(flags.partition(":")[2].split())


def host_has_amx_bf16() -> bool:
    """Does this host's CPU have AMX-BF16 (Linux: /proc/cpuinfo's flags)?"""
    return "amx_bf16" in host_cpu_flags()


# The CPU flags of units that multiply each half type natively (XLA:CPU's
# oneDNN/XNNPACK kernels use them); without one, XLA:CPU's half dot is slower
# than the float32 dot of float32 copies (docs/benchmarks.md, "Half-precision
# dots per host kind").
NATIVE_DOT_FLAGS = {"bfloat16": ("amx_bf16", "avx512_bf16"),
                    "float16": ("amx_fp16", "avx512_fp16")}


def cpu_half_dots_f32(dtype_name: str) -> bool:
    """Compute a `dtype_name` (bfloat16 or float16) matrix product on XLA:CPU
    as a float32 dot of float32 copies of its operands (ops/linalg._matmul)?
    TORCH_TPU_CPU_HALF_DOTS_F32: `auto` (default: where the host's CPU has no
    native dot unit for the type, NATIVE_DOT_FLAGS), on or off. Off with
    TORCH_TPU_CPU_XLA_DEFAULTS=0. Read when a program is traced."""
    if not switch_on("TORCH_TPU_CPU_XLA_DEFAULTS"):
        return False
    choice = switch_auto("TORCH_TPU_CPU_HALF_DOTS_F32")
    return not host_has_native_dots(dtype_name) if choice is None else choice


def cpu_native_bf16_dots() -> bool:
    """Compute bfloat16 `x @ W.T` products against W as stored, so that XLA:CPU
    multiplies bfloat16 natively (ops/linalg._against_stored)?
    TORCH_TPU_CPU_NATIVE_BF16_DOTS: `auto` (default: where the host has
    AMX-BF16 or AVX512-BF16, both measured faster), on or off. Read when a
    program is traced."""
    if not switch_on("TORCH_TPU_CPU_XLA_DEFAULTS"):
        return False
    choice = switch_auto("TORCH_TPU_CPU_NATIVE_BF16_DOTS")
    return host_has_native_dots("bfloat16") if choice is None else choice


def host_has_native_dots(dtype_name: str) -> bool:
    """Does this host's CPU have a unit that multiplies `dtype_name` natively
    (NATIVE_DOT_FLAGS)?"""
    return bool(host_cpu_flags().intersection(NATIVE_DOT_FLAGS.get(dtype_name, ())))


def add_cpu_defaults() -> None:
    """Add CPU_DEFAULTS to XLA_FLAGS (each unless the user set that flag)."""
    if not switch_on("TORCH_TPU_CPU_XLA_DEFAULTS"):
        return
    flags = os.environ.get("XLA_FLAGS", "")
    added = [f for f in CPU_DEFAULTS if f.split("=", 1)[0] not in flags]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([*flags.split(), *added])
