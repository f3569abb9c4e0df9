"""The guide's notebooks as tests.

Each notebook in guide/notebooks/ is run headless, whole, by marimo's own
machinery (`marimo export session`, through tools/build_docs.py): the run
must exit 0, no cell may raise, and every test cell of the notebook (a cell
named `test_*`, asserting what the notebook claims) must have run and passed
— the test cells are collected from the notebook source, so one that marimo
skipped or that raised fails here by name. `marimo check` must pass on every
notebook.

The default run keeps to the light notebooks; those that start processes of
their own or train whole models are marked slow (`pytest -m slow`). The
second run of a notebook is the one most users see, so every notebook but
the two longest, and the strict docs build, also run twice, cold then warm,
in new processes sharing one cache directory (slow; the default run's guard
for that path is
tests/test_cache.py::test_debug_apis_on_programs_loaded_from_disk). The
notebooks' test cells can also be run by pytest directly, marimo's own way:
`pytest guide/notebooks/01_tensors.py`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

marimo = pytest.importorskip("marimo", reason="the guide needs the `guide` extra (marimo)")
pytest.importorskip("matplotlib", reason="the guide needs the `guide` extra (matplotlib)")

import build_docs  # noqa: E402

NOTEBOOKS = build_docs.notebooks()
# Notebooks that launch processes (cold/warm starts, torchrun) or train several
# models: minutes on 2 CPU cores, so not in the default run.
SLOW = {"05_compile_cache", "08_distributed", "09_models"}
TIMEOUT = 900


def _param(nb):
    marks = [pytest.mark.slow] if nb.stem in SLOW else []
    return pytest.param(nb, id=nb.stem, marks=marks)


def test_all_ten_notebooks_exist():
    stems = [nb.stem for nb in NOTEBOOKS]
    assert len(stems) == 10, stems
    assert [s[:2] for s in stems] == [f"{i:02d}" for i in range(1, 11)]
    for nb in NOTEBOOKS:
        assert build_docs.test_cell_names(nb), f"{nb.name} has no test cells"


def test_marimo_check():
    proc = subprocess.run([sys.executable, "-m", "marimo", "check", "--strict",
                           *map(str, NOTEBOOKS)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("nb", [_param(nb) for nb in NOTEBOOKS])
def test_notebook_runs(nb):
    result = build_docs.run_notebook(nb, force=True, timeout=TIMEOUT)
    _assert_passed(nb, result)


def _assert_passed(nb, result):
    """The run exited 0, no cell raised, every test cell ran, the page renders."""
    cells = build_docs.cell_results(nb) if build_docs.snapshot_path(nb).exists() else []
    failed = [f"cell {c['name']} ({c['id']}):\n{c['error']}" for c in cells if c["error"]]
    assert result["returncode"] == 0 and not failed, (
        f"{nb.name} failed (exit {result['returncode']}, {result['seconds']:.0f} s)\n"
        + "\n\n".join(failed) + "\n" + result["output"][-3000:])
    # every test cell written in the notebook ran in this run and passed
    ran = {c["name"] for c in cells}
    for name in build_docs.test_cell_names(nb):
        assert name in ran, f"{nb.name}: test cell {name} did not run"
    # and the page renders from this run (HLO text and figures included)
    page = build_docs.render(nb)
    assert "```python" in page


# Notebooks whose warm run is tested: all but 08 and 09 (minutes each, and
# the programs they load warm are the examples' own, which test_examples and
# test_eager_index run twice). 04 checks torch.compile's programs and their
# HLO and cost analysis, 05 the cache itself, 06 the debug APIs; the others
# the eager index and its prefetch under each notebook's ops.
WARM = ("01_tensors", "02_ops_and_lowering", "03_autograd_and_training", "04_torch_compile",
        "05_compile_cache", "06_debugging", "07_performance", "10_custom_ops")
# 05 points the cache at temporary directories of its own while it compiles
# (it starts its own cold and warm processes) and leaves TORCH_TPU_CACHE_DIR
# empty: its second run is checked to pass, not to load from that directory.
OWN_CACHE_DIRS = {"05_compile_cache"}


def _cache_entries(root: Path) -> set:
    from torch_tpu.cache import store

    d = root / store.SUBDIR
    return {p.name for p in d.glob("*" + store.SUFFIX)} if d.exists() else set()


@pytest.mark.slow
@pytest.mark.parametrize("name", WARM)
def test_notebook_runs_warm(name, tmp_path):
    """Cold, then again in a new process on the cache the first run filled."""
    nb = build_docs.resolve(name)
    cache = tmp_path / "cache"
    env = {"TORCH_TPU_CACHE_DIR": str(cache)}
    cold = build_docs.run_notebook(nb, force=True, timeout=TIMEOUT, env=env)
    _assert_passed(nb, cold)
    after_cold = _cache_entries(cache)
    assert after_cold or name in OWN_CACHE_DIRS, "the cold run left nothing in the cache"
    warm = build_docs.run_notebook(nb, force=True, timeout=TIMEOUT, env=env)
    _assert_passed(nb, warm)
    if after_cold:
        # The warm run found its programs on disk: it compiled (and wrote)
        # almost nothing of its own.
        new = _cache_entries(cache) - after_cold
        assert len(new) <= len(after_cold) // 10, (len(new), len(after_cold))


def test_render_static_controls():
    """marimo's widgets become static text in the docs; accordions become <details>."""
    html = ("<marimo-ui-element object-id='a-0' random-id='x'><marimo-slider "
            "data-initial-value='3' data-label='&quot;&lt;span&gt;size&lt;/span&gt;&quot;' "
            "data-start='1'></marimo-slider></marimo-ui-element>")
    out = build_docs._static_html(html)
    assert "size" in out and "<code>3</code>" in out and "marimo-" not in out
    acc = ("<marimo-accordion data-labels='[&quot;HLO&quot;]'><div><pre>x</pre></div>"
           "</marimo-accordion>")
    assert build_docs._static_html(acc) == "<details><summary>HLO</summary><pre>x</pre></details>"
    assert build_docs._md_source('mo.md(r"""\n    # Title\n    text\n""")') == "# Title\ntext"
    assert build_docs._md_source('mo.md(f"""{x}""")') is None


def test_mkdocs_config_lists_every_notebook():
    text = (ROOT / "mkdocs.yml").read_text()
    for nb in NOTEBOOKS:
        assert f"guide/{nb.stem}.md" in text, nb.stem
    assert (ROOT / "tools" / "mkdocs_hooks.py").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs the `docs` extra")
def test_docs_build_strict(tmp_path):
    """The whole site builds with --strict (runs every notebook whose snapshot is stale)."""
    _build_docs(tmp_path / "site")


def _build_docs(site, env=None):
    run_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], capture_output=True, text=True, cwd=ROOT,
                          timeout=3600, env=run_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for nb in NOTEBOOKS:
        page = site / "guide" / nb.stem / "index.html"
        assert page.exists(), page


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs the `docs` extra")
def test_docs_build_strict_warm(tmp_path):
    """Every notebook run by the build, twice, sharing one cache directory: the
    warm build (the one every writer of the docs makes) passes --strict too."""
    cache = tmp_path / "cache"
    env = {"TORCH_TPU_CACHE_DIR": str(cache), "TORCH_TPU_DOCS_FORCE": "1"}
    _build_docs(tmp_path / "cold", env)
    assert _cache_entries(cache)
    _build_docs(tmp_path / "warm", env)
