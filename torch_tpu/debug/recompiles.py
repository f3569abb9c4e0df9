"""Why a program compiled again: the reason on each compile event after an
op's or a graph's first, and `explain_recompiles()`.

A compile event is a miss of the in-memory program cache. When the op (or
graph) compiled before, the event's `reason` names the nearest earlier key of
the same op (the one with the fewest differing fields) and the fields that
differ, read back by the modules that build the keys (`key_decode.key_fields`
for eager ops, `compile.graph_key.key_fields` for graphs), plus dynamo's guard
failure for a graph dynamo traced again. All of it runs at compile events
only: a cache hit never reaches this module.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any

import torch

from ..runtime import programs  # cheap (no JAX)
from ..runtime import fused, key_decode

# Earlier keys kept per op or graph (the nearest is searched among them).
HISTORY = 32
# Differing fields a reason prints (all are in `Reason.changes`).
SHOWN = 6

# What to do about each kind of cause, shown once per op or graph.
HINTS = {
    "shape": "pad or bucket sizes to a few values; under torch.compile mark the dim "
             "dynamic (torch._dynamo.mark_dynamic(x, dim)) and it is padded to buckets "
             "(TORCH_TPU_BUCKETS)",
    "dtype": "cast once, before the loop, so every call sees one dtype",
    "static value": "a value baked into the program: keep it fixed (or bucket it); pass a "
                    "number that changes every step as a tensor",
    "scalar type": "pass one Python type (2.0, not 2): a scalar's value is a runtime input, "
                   "its type is not",
    "layout": "call .contiguous() once, or pass the same view every call",
    "precision": "set the matmul precision once, before the loop "
                 "(torch.tpu.set_matmul_precision)",
    "opt level": "set the XLA optimization level once, before the loop "
                 "(TORCH_TPU_XLA_OPT_LEVEL, torch_tpu.runtime.opt_level.set_level)",
    "default dtype": "call torch.set_default_dtype once, before the loop",
    "device": "expected once per device: each device compiles its own programs",
    "evicted": "the program left the in-memory cache: raise TORCH_TPU_CACHE_SIZE / "
               "TORCH_TPU_CACHE_BYTES (or do not clear it)",
    "guard": "for sizes that change, torch._dynamo.mark_dynamic(x, dim) or "
             "torch.compile(dynamic=True); pass Python numbers that change as tensors",
    "bucket": "one program per bucket: fewer, larger buckets with TORCH_TPU_BUCKETS or "
              "options={'buckets': [...]}",
    "graph": "dynamo traced this function into another graph",
    "other": "",
}


@dataclasses.dataclass
class Change:
    """One differing field of a key: `arg 0 shape (4, 8) -> (4, 9)`."""

    field: str
    old: str
    new: str
    cause: str

    def __str__(self) -> str:
        return f"{self.field} {self.old} -> {self.new}"


@dataclasses.dataclass
class Reason:
    """Why a program compiled although its op or graph had compiled before.

    previous: seq of the compile event of the nearest earlier key (fewest
    differing fields); changes: the fields that differ from it (empty: the
    same key, compiled again after leaving the cache); guard: dynamo's guard
    failure, for a graph dynamo traced again.
    """

    previous: int
    changes: list
    guard: str | None = None
    group: str = ""   # the op, or the graph and its frame ("graph_forward of f, frame 0")

    @property
    def causes(self) -> list:
        """The kinds of cause (keys of HINTS), each once, in order."""
        out = ["guard"] if self.guard else []
        out += [c.cause for c in self.changes]
        if not out:
            out = ["evicted"]
        return list(dict.fromkeys(out))

    def __str__(self) -> str:
        parts = [f"dynamo: {self.guard}"] if self.guard else []
        parts += [str(c) for c in self.changes[:SHOWN]]
        if len(self.changes) > SHOWN:
            parts.append(f"and {len(self.changes) - SHOWN} more")
        if not parts:
            parts = [f"the same key as #{self.previous} (its program left the cache)"]
        return "; ".join(parts)


def group_of(name: str, key: Any = None) -> str:
    """The op or graph whose keys are compared: the op, or a graph kind and
    the frame dynamo traced it from (a graph's bucketed programs count with
    its others; graphs of other functions are not recompiles of it)."""
    name = name.removesuffix("_bucketed")
    fingerprint = _fingerprint(key)
    graph_key = sys.modules.get("torch_tpu.compile.graph_key")
    frame = graph_key.graph_frame(fingerprint) if fingerprint and graph_key else None
    return f"{name} of {frame}" if frame else name


def _fingerprint(key: Any) -> str | None:
    """A graph program key's graph fingerprint (graph_key.program_key, or
    dynamic.py's bucketed key), else None."""
    if type(key) is not tuple or len(key) < 3:
        return None
    head = key[0]
    if head is programs.ProgramKind.GRAPH:
        head = key[1]
    elif not (len(key) == 3 and type(key[2]) is tuple and key[2][:1] == ("bucket",)):
        return None
    return head if type(head) is str else None


def key_fields(key: Any) -> dict:
    """`key` as named fields, by the module that builds it."""
    if type(key) is not tuple or not key:
        return {"key": _short(key)}
    if isinstance(key[0], torch._ops.OpOverload):
        return key_decode.key_fields(key)
    graph_key = sys.modules.get("torch_tpu.compile.graph_key")  # only if graphs exist
    if graph_key is not None:
        fields = graph_key.key_fields(key)
        if fields is not None:
            return fields
    head, parts = key[0], list(key[1:])
    if head is programs.ProgramKind.FUSED:
        # Each recorded op is an executor entry: its own key, found by value.
        keys_of = {id(e): k for k, e in list(programs.CACHE.items())
                   if type(k) is tuple and k and isinstance(k[0], torch._ops.OpOverload)}

        def entry_fields(entry: Any) -> dict:
            k = keys_of.get(id(entry))
            if k is None:
                return {}
            own = key_decode.key_fields(k)
            return {f: v for f, v in own.items() if f not in _CONTEXT}

        return fused.key_fields(key, entry_fields)
    fields = {"program": head.value if isinstance(head, programs.ProgramKind) else _short(head)}
    if parts and type(parts[-1]) is int:  # helper programs end with their opt level
        fields["opt level"] = str(parts.pop())
    fields.update((f"part {i}", _short(p)) for i, p in enumerate(parts))
    return fields


# Context fields of an eager key, shown once per fused program (its opt level).
_CONTEXT = ("device", "default dtype", "precision", "opt level")


def _short(v: Any, limit: int = 80) -> str:
    text = str(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def cause_of(field: str, old: str, new: str) -> str:
    """The kind of cause (a key of HINTS) of a differing field."""
    if field in ("precision", "opt level", "default dtype", "device"):
        return field
    last = field.rsplit(" ", 1)[-1]
    if field.startswith(("bucket ", "program")):
        return "bucket"
    if last in ("shape", "length") or field.startswith("size ") or field == "int inputs":
        return "shape"
    if last == "dtype":
        return "dtype"
    if last in ("layout", "storage"):
        return "layout"
    if last == "value":
        if field.endswith(("(size) value", "(shape) value")):
            return "shape"   # a factory's size
        if field.endswith("(dtype) value"):
            return "dtype"
        if old.startswith("runtime") and new.startswith("runtime"):
            return "scalar type"
        return "static value"
    if field == "graph":
        return "graph"
    if field.startswith("part ") and old.startswith("(") and new.startswith("("):
        return "shape"   # a helper program's shape part
    return "other"


def diff(old: dict, new: dict) -> list:
    """The fields of `new` that differ from `old` (and those only one has;
    between another graph's programs, or an exact graph program and a
    bucketed one, only the bucket sizes of those)."""
    out = []
    other_kind = old.get("program") != new.get("program") or old.get("graph") != new.get("graph")
    for field in list(dict.fromkeys([*new, *old])):
        a, b = old.get(field, "-"), new.get(field, "-")
        if a == b or (other_kind and (field not in old or field not in new)
                      and not field.startswith("bucket ")):
            continue
        out.append(Change(field, a, b, cause_of(field, a, b)))
    return out


class History:
    """The keys compiled so far, per op or graph (the last HISTORY of each)."""

    def __init__(self) -> None:
        self.keys: dict = {}

    def clear(self) -> None:
        self.keys.clear()

    def reason(self, name: str, key: Any, seq: int) -> Reason | None:
        """Note that `key` compiled as event `seq`: the reason, or None for
        the first compile of its op or graph. Called at compile events only."""
        try:
            fields = key_fields(key)
        except Exception:  # noqa: BLE001 - a key we cannot read: compared whole
            fields = {"key": _short(key, 200)}
        group = group_of(name, key)
        earlier = self.keys.get(group)
        if earlier is None:
            earlier = self.keys[group] = collections.deque(maxlen=HISTORY)
        best = None
        for prev_seq, prev_fields in reversed(earlier):  # newest first: ties go to it
            changes = diff(prev_fields, fields)
            if best is None or len(changes) < len(best[1]):
                best = (prev_seq, changes)
        earlier.append((seq, fields))
        guard = _dynamo_reason(key)
        if best is None and guard is None:
            return None
        if best is None:  # a graph dynamo traced again, none of its group compiled here
            return Reason(0, [], guard, group)
        return Reason(best[0], best[1], guard, group)


def _dynamo_reason(key: Any) -> str | None:
    fingerprint = _fingerprint(key)
    graph_key = sys.modules.get("torch_tpu.compile.graph_key")
    return graph_key.recompile_reason(fingerprint) if fingerprint and graph_key else None


HISTORY_OF_KEYS = History()


# --------------------------------------------------------------------------
# the report


class RecompileReport:
    """The recompiles among compile events, grouped by op or graph.

    `str()` starts with a summary line, then per op or graph (most
    recompiles first) each recompile's reason and a hint per kind of cause.
    `groups`: {op or graph: [CompileEvent with a reason]}; `causes`: a
    Counter of the kinds of cause; `compiles`: the events looked at.
    """

    def __init__(self, events: list) -> None:
        self.compiles = len(events)
        self.groups: dict = {}
        self.causes: collections.Counter = collections.Counter()
        for ev in events:
            if ev.reason is None:
                continue
            self.groups.setdefault(ev.reason.group or ev.name, []).append(ev)
            self.causes.update(ev.reason.causes)
        self.groups = dict(sorted(self.groups.items(), key=lambda kv: -len(kv[1])))

    @property
    def recompiles(self) -> int:
        return sum(len(evs) for evs in self.groups.values())

    def hints(self, name: str) -> dict:
        """{cause: hint} for the recompiles of op or graph `name`."""
        causes = dict.fromkeys(c for ev in self.groups.get(name, ()) for c in ev.reason.causes)
        if "guard" in causes:
            causes.pop("graph", None)  # the guard failure says why the graph is new
        return {c: HINTS[c] for c in causes if HINTS.get(c)}

    def summary(self) -> str:
        if not self.recompiles:
            return (f"no recompiles: {self.compiles} compile(s), each the first of its "
                    "op or graph")
        causes = ", ".join(f"{c} {n}" for c, n in self.causes.most_common())
        return (f"{self.recompiles} recompile(s) of {len(self.groups)} op(s)/graph(s) "
                f"among {self.compiles} compile(s); causes: {causes}")

    def __str__(self) -> str:
        lines = [self.summary()]
        for name, evs in self.groups.items():
            lines.append("")
            lines.append(f"{name}: {len(evs)} recompile(s)")
            for ev in evs:
                since = f" (vs #{ev.reason.previous})" if ev.reason.previous else ""
                lines.append(f"  #{ev.seq}{since}: {ev.reason}")
            for cause, hint in self.hints(name).items():
                lines.append(f"  hint ({cause}): {hint}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<RecompileReport: {self.summary()}>"

    def as_dict(self) -> dict:
        return {"compiles": self.compiles, "recompiles": self.recompiles,
                "causes": dict(self.causes),
                "groups": {name: [{"seq": ev.seq, "reason": str(ev.reason),
                                   "causes": ev.reason.causes} for ev in evs]
                           for name, evs in self.groups.items()},
                "hints": {name: self.hints(name) for name in self.groups}}


def explain(events: list, name: str | None = None) -> RecompileReport:
    """The recompiles among compile events `events` (of op or graph `name`
    only if given), grouped by op or graph: debug.explain_recompiles, which
    passes the compile log (this module is below the log, which imports it)."""
    evs = list(events)
    if name is not None:
        evs = [ev for ev in evs if _named(ev, name)]
    return RecompileReport(evs)


def _named(ev: Any, name: str) -> bool:
    """Event `ev` is of op or graph `name` ("graph_forward" names every
    forward graph, "graph_forward of f, frame 0" one)."""
    group = ev.reason.group if ev.reason is not None else ev.name.removesuffix("_bucketed")
    name = name.removesuffix("_bucketed")
    return group == name or group.startswith(name + " of ") or \
        ev.name.removesuffix("_bucketed") == name
