"""Showing XLA programs in the guide's notebooks (imported by 01, 02, 04 and 06).

`readable_hlo` drops what makes a dump hard to read (XLA's source-location
tables, per-instruction metadata, sharding and frontend attributes);
`side_by_side` puts programs in columns of equal height, each in its own
box, stacked where the page is too narrow for two (the documentation site);
long lines wrap, so a program never scrolls sideways;
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
    # a flex column, so that the program's box fills the grid row's height:
    # columns side by side end level
    return ('<div style="min-width:0;display:flex;flex-direction:column">'
            f'<div style="font-weight:600;margin-bottom:0.3em">{html.escape(title)}</div>'
            f'{inner}</div>')


# pre-wrap: a long HLO line wraps (indented by its own leading spaces) instead
# of scrolling sideways; anywhere: a long operand list may break mid-token
_PRE = ('<pre style="overflow:auto;max-height:{height};flex:1;margin:0;padding:0.5em;'
        'font-size:0.75em;line-height:1.35;white-space:pre-wrap;overflow-wrap:anywhere;'
        'border:1px solid rgba(128,128,128,0.35);border-radius:4px">{text}</pre>')


def _pre(text: str, height: str = "24em") -> str:
    """`text` in a bordered <pre> at most `height` (in the page's em) tall."""
    # the <pre>'s own em is 0.75 of the page's: its max-height is given in that
    value = float(height.removesuffix("em")) / 0.75
    return _PRE.format(height=f"{value:.2f}em", text=html.escape(text))


# columns of at least 20em (~50 characters of the 0.75em code) each; fewer
# per row (down to one, stacked) where the page is narrower than that
_GRID = ('<div class="hlo-side-by-side" style="display:grid;gap:1em;align-items:stretch;'
         'grid-template-columns:repeat(auto-fit,minmax(min(100%,20em),1fr))">{}</div>')


def program_box(title: str, text: str, summary: str = ""):
    """One program in a bordered box that scrolls inside a bounded height,
    under a summary line (the line a reader needs, on the first screen)."""
    import marimo as mo

    head = f'<p style="margin:0 0 0.5em 0">{html.escape(summary)}</p>' if summary else ""
    return mo.Html(head + _box(title, _pre(text)))


# Mermaid scales a diagram down to its column's width by default: a training
# step's forward graph (~40 kernels) in a half-page column had unreadable
# 3-pixel text on the documentation site. At its own size it scrolls in its box.
_NATURAL_SIZE = '%%{init: {"flowchart": {"useMaxWidth": false}}}%%\n'


def fusions_beside_hlo(graph, max_lines: int = 60, max_nodes: int = 80):
    """A FusionGraph drawn (left) next to the optimized HLO it was read from (right)."""
    import marimo as mo

    left = _box("what XLA fused: kernels, their ATen ops, bytes between them",
                '<div style="overflow:auto;max-height:40em;flex:1;'
                'border:1px solid rgba(128,128,128,0.35);border-radius:4px">'
                f"{mo.mermaid(_NATURAL_SIZE + graph.to_mermaid(max_nodes=max_nodes)).text}</div>")
    right = _box("the optimized HLO (what runs)",
                 _pre(readable_hlo(graph.text, max_lines=max_lines), height="40em"))
    return mo.Html(_GRID.format(left + right))


def side_by_side(*columns):
    """`(title, text)` columns next to each other, as a marimo HTML output.

    The columns share the width equally and stretch to the row's height;
    below 20em a column moves under the previous one. Each program is a
    `<pre>` that wraps long lines and scrolls down inside its own bordered box.
    """
    import marimo as mo

    boxes = "".join(_box(title, _pre(text)) for title, text in columns)
    return mo.Html(_GRID.format(boxes))


def kernels_sentence(graph, first: str, then: str) -> str:
    """What XLA made of a program on this host, read from its fusion graph
    (`torch_tpu.debug.fusions`): the kernels and their JAX ops, and whether the
    ops `first` and `then` (e.g. 'dot_general', 'add') share one kernel.

    Prose generated from the HLO shown beside it, so it is true on whichever
    host's compiler produced that HLO.
    """
    kernels = [n for n in graph.nodes if n.is_compute]
    listed = ", ".join(f"`{n.name}` ({', '.join(n.jax_ops) or n.opcode})" for n in kernels)
    together = any(first in n.jax_ops and then in n.jax_ops for n in kernels)
    verdict = (f"`{then}` is fused into the `{first}` kernel" if together else
               f"`{then}` runs as a kernel of its own after `{first}`")
    count = f"{len(kernels)} kernel{'s' if len(kernels) != 1 else ''}"
    return f"On this host XLA compiled it into {count}: {listed}. So here {verdict}."
