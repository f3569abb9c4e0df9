"""The guide as a person opens it: `marimo edit` in a real browser.

Headless Chromium (Debian's `chromium` and `chromium-driver`, driven by
selenium) opens notebooks 01, 04 and 06 with `marimo edit --headless
--no-token`, exactly as the README's command serves them, and without
pressing anything waits until the cells have run. Then:

- every cell ran on open (the repository's `[tool.marimo.runtime]
  auto_instantiate = true`), and no cell shows an error;
- the HLO text and a plot are on the page;
- side-by-side HLO columns stay in their own boxes (each scrolls inside it);
- a full-page screenshot of each notebook is saved as a test artifact
  (`test-artifacts/browser/<notebook>.png`, or under
  `$TORCH_TPU_TEST_ARTIFACTS`).
- 04 opened twice on one cache directory starts warm the second time
  (dynamo's package of a class defined in a cell loaded; its compiled first
  step at most a fifth of the first open's, both saved as
  `04_first_step_ms.json`).

Set-up: the browser packages are installed with `apt-get` when they are
missing (as root, or through passwordless `sudo`); the test is skipped, with
the reason, only where that is impossible (no apt-get, no root nor
passwordless sudo, the package archive unreachable) or the `browser` extra
(selenium, marimo) is not installed; an apt-get install that runs and fails
otherwise is an error. selenium comes from pip (the `dev` and
`browser` extras) and is pointed at /usr/bin/chromium and
/usr/bin/chromedriver, so selenium-manager never downloads a browser or a
driver. Marked slow: `python -m pytest -q -p no:xdist -m slow tests/test_browser.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "guide" / "notebooks"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
APT_PACKAGES = ("chromium", "chromium-driver")
# Every notebook of the guide -> text its page must show once run (the HLO
# it prints, where it prints some). Each run is screenshotted.
NOTEBOOKS = {
    "01_tensors": ("stablehlo.dot_general", "HloModule"),        # §5, addmm lowered / optimized
    "02_ops_and_lowering": ("HloModule",),                        # §3-4, one call's program
    "03_autograd_and_training": (),
    "04_torch_compile": ("HloModule", "fused_computation"),       # §3, the forward graph
    "05_compile_cache": (),
    "06_debugging": ("stablehlo.log_plus_one", "HloModule"),     # §3, the dumped softplus
    "07_performance": (),
    "08_distributed": (),
    "09_models": (),
    "10_custom_ops": (),
}
# Notebooks without a matplotlib plot (02's fusion graph is drawn inside
# marimo's Mermaid element, which the page's query does not see into).
NO_PLOT = {"02_ops_and_lowering", "08_distributed", "10_custom_ops"}
# Seconds a notebook may take to run on open (a cold compile cache, 2 busy cores).
RUN_TIMEOUT = float(os.environ.get("TORCH_TPU_BROWSER_TIMEOUT", "600"))
# Seconds before giving up when no cell has started at all.
START_TIMEOUT = 90.0

sys.path.insert(0, str(ROOT / "tools"))
import build_docs  # noqa: E402


def artifact_dir() -> Path:
    path = Path(os.environ.get("TORCH_TPU_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "browser"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------
# set-up: the browser from apt, the driver binding from pip


def _apt_install(packages) -> str | None:
    """Install `packages` with apt-get: None on success; the reason where this
    system cannot install them (no apt-get, no root nor passwordless sudo,
    the archive unreachable), the documented conditions for a skip. An
    install that ran and failed otherwise raises: a broken set-up, not a
    reason to skip."""
    apt = shutil.which("apt-get")
    if apt is None:
        return "apt-get is not available (not a Debian/Ubuntu system)"
    if os.geteuid() == 0:
        prefix = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"],
                                                 capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]
    else:
        return "apt-get needs root and passwordless sudo is not available"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*prefix, apt, "install", "-y", "-q", "--no-install-recommends", *packages]
    proc = subprocess.run(install, capture_output=True, text=True, env=env)
    if proc.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run([*prefix, apt, "update", "-q"], capture_output=True, text=True, env=env)
        proc = subprocess.run(install, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        text = f"`apt-get install {' '.join(packages)}` failed:\n{(proc.stdout + proc.stderr)[-1500:]}"
        if any(s in proc.stdout + proc.stderr for s in _APT_OFFLINE):
            return "the package archive cannot be reached (offline): " + text
        raise RuntimeError(text)
    return None


# apt-get's words for an archive it cannot reach: an offline machine, which
# cannot install Chromium (a skip), unlike a failing install (an error).
_APT_OFFLINE = ("Temporary failure resolving", "Could not resolve", "Failed to fetch",
                "Unable to fetch", "Network is unreachable", "Could not connect")


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven by selenium, using the system's binaries only."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is missing: pip install -e '.[browser]'")
    pytest.importorskip("marimo", reason="the guide needs the `guide` extra (marimo)")
    missing = [p for p, path in zip(APT_PACKAGES, (CHROMIUM, CHROMEDRIVER))
               if not os.path.exists(path)]
    if missing:
        why = _apt_install(missing)
        if why is not None:
            pytest.skip(f"Chromium is not installed and cannot be installed: {why}")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1600"):
        options.add_argument(arg)
    # An explicit driver path: selenium-manager is skipped (it would download).
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


# --------------------------------------------------------------------------
# a marimo server, as the README starts it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def marimo_edit(notebook: Path, log_path: Path, env: dict | None = None):
    """`marimo edit --headless --no-token <notebook>` from the repository root
    (with `env` added to the environment); yields its URL."""
    port = _free_port()
    cmd = [sys.executable, "-m", "marimo", "edit", "--headless", "--no-token",
           "--skip-update-check", "--port", str(port), str(notebook)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"marimo edit did not start:\n{log_path.read_text()[-2000:]}") from e
                time.sleep(0.3)
        yield url
    finally:
        # the server and the kernel process it started: one process group, ours.
        # SIGINT (Ctrl-C) first: marimo exits cleanly. Killed by SIGTERM, it dies
        # by the signal before Python's exit handlers run, and multiprocessing's
        # resource tracker reports its kernel queues' 12 semaphores as leaked
        # (docs/troubleshooting.md).
        for sig, wait_s in ((signal.SIGINT, 30), (signal.SIGTERM, 20), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


# --------------------------------------------------------------------------
# reading the page

# Per cell: marimo's status ("idle", "queued", "running", "outdated", ...),
# whether it shows an error, its elapsed time, its name and its output text.
_CELLS_JS = """
return Array.from(document.querySelectorAll('.marimo-cell')).map(e => {
  const s = e.querySelector('[data-testid=cell-status]');
  const out = e.querySelector('.output-area, [data-testid=cell-output], .marimo-output');
  return {id: e.getAttribute('data-cell-id'), name: e.getAttribute('data-cell-name'),
          status: s ? s.getAttribute('data-status') : null,
          elapsed: s ? s.textContent.trim() : '',
          error: e.classList.contains('has-error'),
          text: e.innerText || ''};
});
"""
_BUSY = ("queued", "running")


def wait_for_run(driver, timeout: float = RUN_TIMEOUT) -> tuple[list[dict], float]:
    """Wait, without touching the page, until the notebook's cells have run.

    Returns the cells and the seconds from page load until the last cell
    finished. Fails if no cell starts on its own (the notebook did not run on
    open) or the run does not finish in `timeout` seconds.
    """
    t0 = time.monotonic()
    started = False
    quiet_since = None
    while True:
        cells = driver.execute_script(_CELLS_JS)
        busy = [c for c in cells if c["status"] in _BUSY]
        ran = [c for c in cells if c["elapsed"]]
        now = time.monotonic()
        if busy or ran:
            started = True
        if started and cells and not busy:
            quiet_since = quiet_since or now
            if now - quiet_since >= 3.0:     # nothing queued for 3 s: the run is over
                return cells, quiet_since - t0
        else:
            quiet_since = None
        if not started and now - t0 > START_TIMEOUT:
            raise AssertionError(
                f"no cell ran within {START_TIMEOUT:.0f} s of opening the notebook: "
                "it does not run on open (marimo's runtime.auto_instantiate is off)")
        if now - t0 > timeout:
            raise AssertionError(f"the notebook was still running after {timeout:.0f} s: "
                                 f"{[c['name'] + ':' + c['status'] for c in busy]}")
        time.sleep(1.0)


def full_page_screenshot(driver, path: Path) -> None:
    """The whole notebook in one PNG (the window grown to the page's height)."""
    height = driver.execute_script(
        "const a = document.querySelector('#App') || document.body;"
        "return Math.max(document.body.scrollHeight, a.scrollHeight,"
        " ...Array.from(document.querySelectorAll('*')).filter(e => e.scrollHeight > e.clientHeight"
        " && getComputedStyle(e).overflowY !== 'visible').map(e => e.scrollHeight));")
    size = driver.get_window_size()
    driver.set_window_size(size["width"], min(int(height) + 200, 30000))
    time.sleep(1.0)
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(size["width"], size["height"])


# Geometry of every side-by-side HLO box: its columns must not overlap (side by
# side, or stacked where the page is narrow), columns side by side end level,
# and a column's text must stay inside its own box (it scrolls or wraps there).
_SIDE_BY_SIDE_JS = """
return Array.from(document.querySelectorAll('.hlo-side-by-side')).map(grid => {
  const cols = Array.from(grid.querySelectorAll(':scope > div'));
  return cols.map(c => {
    // a program's <pre>, or a drawn graph's scroll box (hlo_view.fusions_beside_hlo)
    const pre = c.querySelector('pre') || c.querySelector('div[style*=overflow]') || c;
    const r = c.getBoundingClientRect(), p = pre.getBoundingClientRect();
    const st = getComputedStyle(pre);
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
            pre_left: p.left, pre_right: p.right, pre_bottom: p.bottom,
            overflow_x: st.overflowX, white_space: st.whiteSpace,
            scroll_width: pre.scrollWidth, client_width: pre.clientWidth,
            text: pre.textContent.slice(0, 200)};
  });
});
"""


@pytest.mark.parametrize("stem", list(NOTEBOOKS))
def test_notebook_runs_on_open(stem, browser):
    notebook = NOTEBOOK_DIR / f"{stem}.py"
    out = artifact_dir()
    with marimo_edit(notebook, out / f"{stem}.marimo.log") as url:
        browser.get(url)
        cells, seconds = wait_for_run(browser)
        full_page_screenshot(browser, out / f"{stem}.png")
        side_by_side = browser.execute_script(_SIDE_BY_SIDE_JS)
        has_plot = browser.execute_script(
            "return Array.from(document.querySelectorAll('.marimo-cell img, .marimo-cell svg'))"
            ".some(e => { const r = e.getBoundingClientRect();"
            " return r.width > 200 && r.height > 100 &&"
            " (e.tagName === 'svg' || (e.getAttribute('src') || '').startsWith('data:image')); });")
    (out / f"{stem}.seconds").write_text(f"{seconds:.1f}\n")

    errors = [f"{c['name']} ({c['id']}): {c['text'][-600:]}" for c in cells if c["error"]]
    assert not errors, "cells show errors:\n" + "\n".join(errors)
    source = build_docs.load_cells(notebook)
    assert [c["id"] for c in cells] == [c["id"] for c in source], "the page lacks cells"
    # A pure `mo.md("...")` cell shows marimo 0.25's "outdated" mark in edit mode
    # (its markdown editor re-writes the code), run or not; every other cell
    # must have run: idle, with its run time shown.
    markdown = {c["id"] for c in source if build_docs._md_source(c["code"]) is not None}
    not_run = [f"{c['name']} ({c['id']}): status {c['status']}" for c in cells
               if c["id"] not in markdown and not (c["status"] == "idle" and c["elapsed"])]
    assert not not_run, "cells that did not run on open:\n" + "\n".join(not_run)
    text = "\n".join(c["text"] for c in cells)
    for wanted in NOTEBOOKS[stem]:
        assert wanted in text, f"the page shows no HLO ({wanted!r} missing)"
    assert has_plot or stem in NO_PLOT, "no plot on the page"
    for grid in side_by_side:
        assert len(grid) == 2, grid
        left, right = grid
        beside = left["right"] <= right["left"] + 0.5
        assert beside or left["bottom"] <= right["top"] + 0.5, ("columns overlap", left, right)
        if beside:
            assert abs(left["pre_bottom"] - right["pre_bottom"]) <= 1.0, (
                "the boxes side by side end at different heights", left, right)
        for col in grid:
            assert col["pre_right"] <= col["right"] + 0.5, ("a column's text leaves its box", col)
            wider = col["scroll_width"] > col["client_width"]
            assert not wider or col["overflow_x"] in ("auto", "scroll"), (
                "long lines spill out of their column", col)
    if stem in ("01_tensors", "04_torch_compile"):
        assert side_by_side, "no side-by-side HLO on the page"


def test_04_opens_warm_on_one_cache_directory(browser, tmp_path):
    """04 opened twice on one cache directory (two kernels): the first open
    leaves dynamo's packages in torch-v1, and the second's compiled first
    step, which loads them, takes at most a fifth of the first's."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    out = artifact_dir()
    first_ms = {}
    for run in ("cold", "warm"):
        with marimo_edit(NOTEBOOK_DIR / "04_torch_compile.py", out / f"04_{run}.marimo.log",
                         env={"TORCH_TPU_CACHE_DIR": str(cache)}) as url:
            browser.get(url)
            cells, _ = wait_for_run(browser)
        text = "\n".join(c["text"] for c in cells)
        found = re.search(r"compiled: first step\s+([\d.]+) ms", text)
        assert found, f"{run}: the page shows no compiled first step"
        first_ms[run] = float(found[1])
        if run == "cold":
            assert list((cache / "torch-v1").glob("*.tpk")), "the first open left no package"
    (out / "04_first_step_ms.json").write_text(json.dumps(first_ms) + "\n")
    assert "nothing traced" in text, "the second open traced Block.forward again"
    assert first_ms["warm"] <= first_ms["cold"] / 5, first_ms
