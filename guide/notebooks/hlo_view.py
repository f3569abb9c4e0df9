"""Showing XLA programs in the guide's notebooks (imported by 01, 04 and 06).

`readable_hlo` drops what makes a dump hard to read (XLA's source-location
tables, per-instruction metadata, sharding and frontend attributes);
`side_by_side` puts programs in columns, each in its own box: a long line
scrolls inside its box instead of running into the next column.
"""

from __future__ import annotations

import html
import re

_LOCATION_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_ATTRIBUTES = re.compile(r",? ?(metadata|frontend_attributes|sharding)=\{[^}]*\}")


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


def side_by_side(*columns):
    """`(title, text)` columns next to each other, as a marimo HTML output.

    The columns share the width equally (`minmax(0, 1fr)` lets a column be
    narrower than its longest line); each program is a `<pre>` that scrolls
    in both directions inside its own bordered box.
    """
    import marimo as mo

    boxes = "".join(
        '<div style="min-width:0">'
        f'<div style="font-weight:600;margin-bottom:0.3em">{html.escape(title)}</div>'
        '<pre style="overflow:auto;max-height:32em;margin:0;padding:0.5em;font-size:0.75em;'
        'line-height:1.35;white-space:pre;border:1px solid rgba(128,128,128,0.35);'
        f'border-radius:4px">{html.escape(text)}</pre></div>'
        for title, text in columns)
    return mo.Html('<div class="hlo-side-by-side" style="display:grid;gap:1em;'
                   f'grid-template-columns:repeat({len(columns)},minmax(0,1fr))">{boxes}</div>')
