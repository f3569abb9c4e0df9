"""Showing XLA programs in the guide's notebooks (imported by 01, 02, 04 and 06).

`readable_hlo` drops what makes a dump hard to read (XLA's source-location
tables, per-instruction metadata, sharding and frontend attributes);
`side_by_side` puts programs in columns, each in its own box: a long line
scrolls inside its box instead of running into the next column;
`fusions_beside_hlo` puts a program's fusion graph (`torch_tpu.debug.fusions`,
drawn by marimo's Mermaid) in the left column and its optimized HLO in the right.
"""

from __future__ import annotations

import html
import re

_LOCATION_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
# (one level of nested braces: frontend_attributes hold `[{}, {}]` shardings)
_ATTRIBUTES = re.compile(r",? ?(metadata|frontend_attributes|sharding)=\{(?:[^{}]|\{[^{}]*\})*\}")


def readable_hlo(text: str, max_lines: int = 40) -> str:
    """`text` (HLO or StableHLO) without location tables and attributes, at most `max_lines`."""
    keep, skipping = [], False
    for line in text.splitlines():
        if line.strip() in _LOCATION_TABLES:
            skipping = True
            continue
        if skipping and (not line.strip() or line[:1].isdigit() or line.startswith(" ")):
            continue
        skipping = False
        keep.append(_ATTRIBUTES.sub("", line))
    if len(keep) > max_lines:
        keep = keep[:max_lines] + [f"... ({len(keep) - max_lines} more lines)"]
    return "\n".join(keep)


def _box(title, inner):
    return ('<div style="min-width:0">'
            f'<div style="font-weight:600;margin-bottom:0.3em">{html.escape(title)}</div>'
            f'{inner}</div>')


_PRE = ('<pre style="overflow:auto;max-height:32em;margin:0;padding:0.5em;font-size:0.75em;'
        'line-height:1.35;white-space:pre;border:1px solid rgba(128,128,128,0.35);'
        'border-radius:4px">{}</pre>')


def fusions_beside_hlo(graph, max_lines: int = 60, max_nodes: int = 80):
    """A FusionGraph drawn (left) next to the optimized HLO it was read from (right)."""
    import marimo as mo

    left = _box("what XLA fused: kernels, their ATen ops, bytes between them",
                '<div style="overflow:auto;max-height:40em">'
                f"{mo.mermaid(graph.to_mermaid(max_nodes=max_nodes)).text}</div>")
    right = _box("the optimized HLO (what runs)",
                 _PRE.format(html.escape(readable_hlo(graph.text, max_lines=max_lines))))
    return mo.Html('<div class="hlo-side-by-side" style="display:grid;gap:1em;'
                   f'grid-template-columns:repeat(2,minmax(0,1fr))">{left}{right}</div>')


def side_by_side(*columns):
    """`(title, text)` columns next to each other, as a marimo HTML output.

    The columns share the width equally (`minmax(0, 1fr)` lets a column be
    narrower than its longest line); each program is a `<pre>` that scrolls
    in both directions inside its own bordered box.
    """
    import marimo as mo

    boxes = "".join(_box(title, _PRE.format(html.escape(text))) for title, text in columns)
    return mo.Html('<div class="hlo-side-by-side" style="display:grid;gap:1em;'
                   f'grid-template-columns:repeat({len(columns)},minmax(0,1fr))">{boxes}</div>')
