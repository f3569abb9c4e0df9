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
import re
from collections.abc import Callable

from .generator import Input, Program
from .runner import Failure, Mismatch, Report, shrink_failure


@dataclasses.dataclass(frozen=True)
class Known:
    reason: str
    issue: int
    matches: Callable[[Program, Mismatch], bool]
    reproducer: Program
    path: str


def _src(p: Program) -> str:
    return "\n".join(p.steps)


def _has(pattern: str) -> Callable[[Program], bool]:
    rx = re.compile(pattern)
    return lambda p: bool(rx.search(_src(p)))


def _inp(name, shape, dtype, values, layout="contiguous") -> Input:
    return Input(name, shape, dtype, tuple(values), layout)


KNOWN: dict[str, Known] = {}


def classify(prog: Program, m: Mismatch) -> str | None:
    for key, k in KNOWN.items():
        if k.matches(prog, m):
            return key
    return None


def _dedup_key(f: Failure) -> tuple:
    detail = re.sub(r"[-+.\deE]+|nan|inf", "#", f.mismatch.detail)
    return (f.mismatch.path, f.mismatch.kind, detail[:120])


def triage(rep: Report, budget: int = 120, shrink_all: bool = False) -> list[Failure]:
    """Shrink and classify the report's failures; the ones of no known class.

    Failures with the same path, kind and detail (numbers aside) are shrunk
    once unless `shrink_all`; the others take that one's class."""
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
    return [f for f in rep.failures if f.known is None]


def summary(rep: Report) -> str:
    counts: dict[str, int] = {}
    for f in rep.failures:
        counts[f.known or "NEW"] = counts.get(f.known or "NEW", 0) + 1
    if not counts:
        return "no differences"
    return "differences by class: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
