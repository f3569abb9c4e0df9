"""docs/architecture.md names every module of torch_tpu/ (issue 36): its
"Every module, one line each" section has a row for each, under its folder."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _section() -> str:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    start = doc.index("## Every module, one line each")
    end = doc.index("\n## ", start + 1)
    return doc[start:end]


def _rows() -> set[str]:
    """'torch_tpu/<folder>/<module>.py' of each row, from the folder headings."""
    rows, folder = set(), None
    for line in _section().splitlines():
        heading = re.fullmatch(r"\*\*`(torch_tpu/(?:[\w/]+/)?)`\*\*", line.strip())
        if heading:
            folder = heading.group(1)
            continue
        row = re.match(r"\| `([\w.]+\.py)` \| (.+) \|$", line)
        if row and folder:
            assert row.group(2).strip(), line
            rows.add(folder + row.group(1))
    return rows


def test_every_module_has_its_line():
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "torch_tpu").rglob("*.py")}
    rows = _rows()
    assert modules - rows == set(), "modules docs/architecture.md does not list"
    assert rows - modules == set(), "rows for modules that do not exist"
