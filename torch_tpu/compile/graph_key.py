"""The keys of a compiled graph's executables, all built here.

A `CompiledGraph` (compile/graph.py) finds the executable for a call through
keys that each extend the one before, each made from the graph's
`GraphSpec` (compile/graph_spec.py) and the call's inputs:

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
- the bucketed programs of a symbolic graph (compile/dynamic.py) are keyed
  `(fingerprint, kind, ("bucket", precision, level, buckets, exact sizes,
  padded input shapes, padding specs))`;
- `persistent_key`: the graph tier's key (torch_tpu.cache.graphs), the
  program key plus what a later process must match to reuse the executable
  (graph code, output and mutation layout, placeholder metadata), or None
  when the graph is not stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import torch

# The matmul precision setting: part of every graph executable's key.
from .._compat import dynamo_api
from ..runtime.precision import cache_token as precision_token
from ..runtime.programs import ProgramKind
from .graph_spec import GraphSpec

try:
    from ..cache import graphs as _graph_tier
except Exception:  # pragma: no cover - the cache package failed to import
    # Typed as the module: persistent_key checks for None before any use.
    _graph_tier = None  # type: ignore[assignment]


def call_token(spec: GraphSpec, arrays: Sequence[Any], layouts: tuple) -> tuple:
    """A static graph's key of one call's inputs (storage arrays, layouts)."""
    return (precision_token(), spec.level(), layouts, tuple(a.shape for a in arrays))


def specialization(spec: GraphSpec, arrays: Sequence[Any], ints: Sequence[int]) -> tuple:
    """The specialization key of these input values."""
    return (tuple((a.shape, str(a.dtype)) for a in arrays), tuple(ints),
            spec.static_values(), precision_token(), spec.level())


def program_key(spec: GraphSpec, key: tuple, donate_idx: Sequence[int],
                consts: Sequence[Any], level: int) -> tuple:
    """The key of one program of graph `spec`: specialization `key`, compiled
    with inputs `donate_idx` donated, constants `consts`, at optimization `level`."""
    return (ProgramKind.GRAPH, spec.fingerprint, spec.kind, key, spec.device, tuple(donate_idx),
            tuple(tuple(c.shape) + (str(c.dtype),) if hasattr(c, "shape") else repr(c)
                  for c in consts), ("opt_level", level))


def persistent_key(spec: GraphSpec, gkey: tuple, donating: bool,
                   consts: Sequence[Any]) -> str | None:
    """The graph tier's key of program `gkey`, or None (not stored)."""
    if spec.symbolic or _graph_tier is None:
        return None
    try:
        if not _graph_tier.enabled():
            return None
        if any(not isinstance(c, jax.Array) for c in consts):
            return None
        parts = [spec.kind, spec.code, repr(gkey), repr(list(spec.out_specs)),
                 str(spec.n_user_outputs), repr(spec.program.mutated_inputs),
                 "donate" if donating else "plain"]
        for n in spec.program.placeholders:
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


# --------------------------------------------------------------------------
# reading keys back (debug tools: why a graph program compiled again)


def key_fields(key: tuple) -> dict[str, str] | None:
    """A graph program's key (`program_key`, or dynamic.py's bucketed key)
    as named, printable fields; None for another key. Compile events only."""
    if type(key) is not tuple or not key:
        return None
    fields: dict[str, str] = {}
    if key[0] is ProgramKind.GRAPH and len(key) >= 8:
        _, fingerprint, kind, spec, device, donate, consts = key[:7]
        fields["graph"] = f"{kind} {str(fingerprint)[:12]}"
        fields["program"] = "exact shapes"
        shapes, ints, statics, precision, level = spec[:5]
        _input_fields(fields, shapes)
        for i, layout in enumerate(spec[5] if len(spec) > 5 else ()):
            fields[f"input {i} layout"] = "storage" if layout is None else f"view {layout[1:3]}"
        if ints:
            fields["int inputs"] = str(tuple(ints))
        if statics:
            fields["static inputs"] = ", ".join(statics)
        fields["device"] = f"tpu:{device}"
        fields["donated inputs"] = str(tuple(donate)) if donate else "none"
        fields["constants"] = str(len(consts))
        fields["donating"] = "yes" if key[-1] == "donate" else "no"
    elif len(key) == 3 and type(key[2]) is tuple and key[2][:1] == ("bucket",):
        fingerprint, kind, (_, precision, level, buckets, exact, shapes, _specs) = key
        fields["graph"] = f"{kind} {str(fingerprint)[:12]}"
        fields["program"] = "bucketed"
        for sym, size in buckets:
            fields[f"bucket {sym}"] = str(size)
        for sym, size in exact:
            fields[f"size {sym}"] = str(size)
        _input_fields(fields, shapes)
    else:
        return None
    fields["precision"] = str(precision)
    fields["opt level"] = str(level)
    return fields


def _input_fields(fields: dict, shapes: Iterable[tuple[Any, Any]]) -> None:
    for i, (shape, dtype) in enumerate(shapes):
        fields[f"input {i} shape"] = str(tuple(shape))
        fields[f"input {i} dtype"] = str(dtype)


# What dynamo said about each graph as AOTAutograd handed it over, by the
# graph's fingerprint: the frame it traced ("f, frame 0") and, on a
# recompile, the guard failures that made it trace again (`recompile_reason`
# takes them once: the graph's first compile event).
_FRAMES: dict = {}
_DYNAMO_REASONS: dict = {}


def note_dynamo_reason(fingerprint: str) -> None:
    """Called as a graph is handed over, inside dynamo's compile of a frame."""
    frame, reason = _dynamo_frame()
    if frame is not None:
        if len(_FRAMES) > 4096:  # (a bound: graphs are few, but processes can be long)
            _FRAMES.clear()
        _FRAMES[fingerprint] = frame
    if reason is not None:
        _DYNAMO_REASONS[fingerprint] = reason


def graph_frame(fingerprint: str) -> str | None:
    """The frame dynamo traced graph `fingerprint` from ("f, frame 0"), if known."""
    return _FRAMES.get(fingerprint)


def recompile_reason(fingerprint: str) -> str | None:
    """The dynamo guard failure behind graph `fingerprint` (once)."""
    return _DYNAMO_REASONS.pop(fingerprint, None)


def _dynamo_frame() -> tuple[str | None, str | None]:
    """(the frame dynamo is compiling, why it compiles it again): the guard
    failures it recorded (`torch._dynamo.guard_failures`, "0/0: tensor 'x'
    size mismatch at index 1. expected 8, actual 9") for the frame's earlier
    compiles; None on a frame's first compile, (None, None) outside dynamo."""
    try:
        guard_failures = dynamo_api.guard_failures
        cid = dynamo_api.CompileContext.current_compile_id()
        tc = dynamo_api.TracingContext.try_get()
    except Exception:  # noqa: BLE001 - another torch: no reason, nothing else changes
        return None, None
    if cid is None or cid.frame_id is None:
        return None, None
    codes = getattr(tc, "traced_code", None) or []
    frame = f"{codes[0].co_name}, frame {cid.frame_id}" if codes else f"frame {cid.frame_id}"
    if not cid.frame_compile_id:
        return frame, None
    prefix = f"{cid.frame_id}/"
    found = [r for failures in list(guard_failures.values()) for r in failures
             if isinstance(r, str) and r.startswith(prefix)]
    # This recompile checked each earlier entry of the frame: the last ones.
    latest = list(dict.fromkeys(found[-cid.frame_compile_id:]))
    return frame, "; ".join(latest) if latest else None
