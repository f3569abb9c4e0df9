"""The classes of differences the fuzzer finds that are not fixed yet.

Each entry: a predicate on the *shrunk* program and its mismatch (so one
class is recognised however the random program around it looked), the
reason, the issue that tracks it, and a minimal reproducer. tests/test_fuzz.py
runs every reproducer: while the class is unfixed it is an expected failure
with its reason; once it passes the test fails until the entry is removed
(strict). A failure no entry recognises is a new class: the bounded run fails
with its shrunk reproducer.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from .generator import Input, Program
from .runner import (SAME_AS_CPU_COMPILE, Failure, Mismatch, Report, check, execute,
                     shrink_failure)


@dataclasses.dataclass(frozen=True)
class Known:
    reason: str
    issue: int
    matches: Callable[[Program, Mismatch], bool]
    reproducer: Program
    path: str


def _src(p: Program) -> str:
    return "\n".join(p.steps)


def _inp(name: str, shape: tuple[int, ...], dtype: str, values: tuple,
         layout: str = "contiguous") -> Input:
    return Input(name, shape, dtype, tuple(values), layout)


_TINY = 1.1754943508222875e-38  # float32's (and bfloat16's) smallest normal
_SUBNORMAL_LIT = re.compile(r"\b\d(?:\.\d+)?e-(?:39|4[0-5])\b|\b1e-38\b")


def _subnormal(v: object) -> bool:
    return isinstance(v, float) and 0 < abs(v) < _TINY


def _touches_subnormals(p: Program) -> bool:
    """A subnormal in an input, a literal, or any value CPU computes."""
    if any(_subnormal(v) for i in p.inputs for v in i.values) or _SUBNORMAL_LIT.search(_src(p)):
        return True
    run = execute(p, device="cpu")
    return any(t.is_floating_point() and bool(((t != 0) & (t.abs() < _TINY)).any())
               for t in run.values.values())


def _flushed(p: Program) -> Program:
    """`p` with its subnormal inputs and literals written as (signed) zeros."""
    inputs = tuple(dataclasses.replace(i, values=tuple(
        math.copysign(0.0, v) if _subnormal(v) else v for v in i.values)) for i in p.inputs)
    steps = tuple(_SUBNORMAL_LIT.sub("0.0", s) for s in p.steps)
    return Program(inputs, steps)


def _subnormal_class(p: Program, m: Mismatch) -> bool:
    """The difference involves subnormals and goes away when the subnormals the
    program writes are zeros (where it only computes them, that is the sign)."""
    if m.kind not in ("subnormal", "value", "nan", "signed-zero", "shape"):
        return False
    if not _touches_subnormals(p):
        return False
    flushed = _flushed(p)
    return flushed == p or check(flushed, m.path) is None


def _error_says(kind: str, text: str) -> Callable[[Program, Mismatch], bool]:
    return lambda p, m: m.kind == kind and text in m.detail


KNOWN: dict[str, Known] = {
    "subnormals flushed": Known(
        "float32/bfloat16 subnormals are flushed to zero in arithmetic and comparisons "
        "(XLA:CPU's denormals-are-zero: 1e-40 > 0 is False, so x[x > 0] drops it; "
        "log(1e-40) is -inf; 1e-38 * inf is NaN)",
        48, _subnormal_class,
        Program((_inp("x0", (2,), "float32", (1e-40, -2.0)),), ("v0 = x0 > 0",)), "eager"),
    "empty bool log_softmax": Known(
        "log_softmax of an empty bool tensor raises (its lowering subtracts two bool "
        "tensors); CPU returns the empty float result (softmax and integer inputs agree)",
        48, lambda p, m: m.kind == "error" and "_log_softmax" in m.detail,
        Program((_inp("x0", (0, 1), "bool", ()),), ("v0 = torch.log_softmax(x0, 0)",)), "eager"),
    "write to expanded view accepted (compiled)": Known(
        "torch.compile accepts an in-place write into an expanded view and adds into every "
        "alias, as PyTorch's own torch.compile on the CPU does (AOTAutograd functionalizes "
        "the write); CPU eager raises 'more than one element of the written-to tensor ...'",
        48, lambda p, m: m.path == "compiled" and m.kind == "no-error"
        and "more than one element of the written-to tensor" in m.detail,
        Program((_inp("x0", (1, 1, 1, 1), "float32", (-0.39,)),),
                ("x0.expand(3, 4, 4, 3).sub_(-2)",)), "compiled"),
    "as torch.compile on the CPU": Known(
        "a compiled-path difference PyTorch's own torch.compile shows on the CPU too "
        "(aot_eager): AOTAutograd's functionalization of a write through an expanded view "
        "adds every alias's write, dynamo folds the constant -0.0 as 0.0",
        48, lambda p, m: m.path == "compiled" and m.detail.endswith(SAME_AS_CPU_COMPILE),
        Program((_inp("x1", (), "float32", (1.38,)),),
                ("v1 = x1.expand(2)", "v1.masked_fill_(v1 > 0, 5.0)")), "compiled"),
    "dot overflow under fused multiply-add": Known(
        "a matmul whose products overflow: XLA:CPU fuses each multiply-add, so "
        "inf + (-3e38 * 2.42) stays inf where CPU rounds the product to -inf first and "
        "gets inf - inf = NaN (a rounding-order difference at the float limits)",
        48, lambda p, m: m.kind in ("nan", "value") and " @ " in _src(p) and any(
            isinstance(v, float) and not abs(v) < 1e38 for i in p.inputs for v in i.values),
        Program((_inp("x1", (2, 2), "float32", (-3.46, -3e38, -math.inf, 2.42)),),
                ("v2 = x1 @ x1.mT",)), "eager"),
    "sum of -0.0 is -0.0": Known(
        "a sum (sum, mean, cumsum, matmul) of only -0.0 terms is -0.0 on tpu, as IEEE adds "
        "them; CPU's kernels start from +0.0 and give +0.0",
        48, lambda p, m: m.kind == "signed-zero" and "CPU 0.0" in m.detail
        and bool(re.search(r"\.(cumsum|sum|mean)\(| @ ", _src(p))),
        Program((_inp("x0", (1,), "float32", (-0.0,)),), ("v0 = x0.cumsum(0)",)), "eager"),
    "relu or clamp of -0.0": Known(
        "relu(-0.0) and clamp(-0.0, min=0) give +0.0 on tpu; CPU returns the input "
        "unchanged when it is not below the bound: -0.0",
        48, lambda p, m: m.kind == "signed-zero" and "CPU -0.0" in m.detail
        and bool(re.search(r"relu|clamp", _src(p))),
        Program((_inp("x0", (1,), "float32", (-0.0,)),), ("v0 = torch.relu(x0)",)), "eager"),
    "same-memory setitem raises partial overlap": Known(
        "v = x.unsqueeze(0); v[...] = x raises 'some elements of the input tensor and the "
        "written-to tensor refer to a single memory location'; CPU sees a full overlap (the "
        "same elements) and allows it (came with the overlap checks, uncommitted when found)",
        48, _error_says("error", "some elements of the input tensor and the written-to"),
        Program((_inp("x0", (), "int32", (4,)),),
                ("v2 = x0.unsqueeze(0)", "v2[...] = x0")), "eager"),
    "NaN into an integer setitem accepted": Known(
        "x[idx] = nan on an integer tensor (even with no element selected) is accepted; CPU "
        "raises 'value cannot be converted to type int without overflow'",
        48, _error_says("no-error", "cannot be converted to type"),
        Program((_inp("x0", (1, 0), "int32", ()),),
                ("x0[torch.tensor([], dtype=torch.long, device=x0.device)] = nan",)), "eager"),
    "pow 0.5 of -0.0": Known(
        "x ** 0.5 (a Python scalar exponent) of -0.0 gives +0.0; CPU's kernel computes it "
        "as sqrt(x), which keeps the sign (-0.0); IEEE pow and a tensor exponent give +0.0",
        48, lambda p, m: m.kind == "signed-zero" and "** 0.5" in _src(p),
        Program((_inp("x0", (1,), "float32", (-0.0,)),), ("v0 = x0 ** 0.5",)), "eager"),
}


def classify(prog: Program, m: Mismatch) -> str | None:
    for key, k in KNOWN.items():
        if k.matches(prog, m):
            return key
    return None


def _dedup_key(f: Failure) -> tuple:
    """Path, kind, the detail without its numbers, and the op of the step that
    last defined or wrote the differing name (its names and numbers aside)."""
    detail = re.sub(r"[-+.\deE]+|nan|inf", "#", f.mismatch.detail)
    name = f.mismatch.name
    line = next((s for s in reversed(f.program.steps)
                 if name and re.search(rf"\b{name}\b", s)), "")
    op = re.sub(r"\b[xv]\d+\b|[-+.\deE]+|nan|inf", "#", line.split(" = ", 1)[-1])
    return (f.mismatch.path, f.mismatch.kind, detail[:120], op)


def triage(rep: Report, budget: int = 120, shrink_all: bool = False) -> list[Failure]:
    """Shrink and classify the report's failures; the shrunk ones of no known class.

    Failures with the same path, kind and detail (numbers aside) are shrunk
    once unless `shrink_all`; the others take that one's class (and are not
    returned: the shrunk one stands for them)."""
    seen: dict[tuple, Failure] = {}
    for f in rep.failures:
        key = _dedup_key(f)
        if key in seen and not shrink_all:
            f.known = seen[key].known
            continue
        shrink_failure(f, budget)
        if f.shrunk_mismatch is None:  # flaky: the original failed, the shrunk passes
            f.shrunk, f.shrunk_mismatch = f.program, f.mismatch
        f.known = classify(f.shrunk, f.shrunk_mismatch)
        seen[key] = f
    return [f for f in rep.failures if f.known is None and f.shrunk is not None]


def summary(rep: Report) -> str:
    counts: dict[str, int] = {}
    for f in rep.failures:
        counts[f.known or "NEW"] = counts.get(f.known or "NEW", 0) + 1
    if not counts:
        return "no differences"
    return "differences by class: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
