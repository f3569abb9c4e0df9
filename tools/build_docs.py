"""Run the guide's marimo notebooks and build the documentation site.

    python tools/build_docs.py                 # run stale notebooks, build site/ (strict)
    python tools/build_docs.py --force         # re-run every notebook first
    python tools/build_docs.py --run-only      # only run the notebooks (session snapshots)
    python tools/build_docs.py --check         # run + report per-notebook status, no site
    python tools/build_docs.py --serve         # run, then `mkdocs serve`

How it works: each notebook is executed headless with marimo's own machinery
(`marimo export session`), which writes a session snapshot - every cell's
outputs and console - to guide/notebooks/__marimo__/session/<name>.py.json.
A snapshot is reused while every cell's code hash still matches the notebook.
The mkdocs hook (tools/mkdocs_hooks.py) turns notebook code + snapshot into
one Markdown page per notebook (code, printed output, HLO dumps, plots as
embedded PNGs), so the site shows what the notebooks produced when they ran
at build time; `mkdocs build --strict` alone also works (the hook runs stale
notebooks itself). torch and JAX cannot run in a browser (Pyodide), so the
site is static; `marimo edit guide/notebooks/<name>.py` is the live version.

The same functions serve tests/test_guide.py: `run_notebook` and
`cell_results` (every cell's error, test cells by name).
"""

from __future__ import annotations

import argparse
import ast
import base64
import concurrent.futures
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "guide" / "notebooks"
TIMINGS = NOTEBOOK_DIR / "__marimo__" / "run_times.json"


# --------------------------------------------------------------------------
# notebooks and their cells


def notebooks() -> list[Path]:
    """The guide's notebooks, in order (guide/notebooks/NN_name.py)."""
    return sorted(p for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))


def resolve(name) -> Path:
    """A notebook by path, file name or stem ('01_tensors' or '01')."""
    p = Path(name)
    if p.exists():
        return p.resolve()
    for nb in notebooks():
        if nb.stem == name or nb.name == name or nb.stem.split("_")[0] == str(name):
            return nb
    raise FileNotFoundError(f"no guide notebook {name!r}; have: "
                            f"{', '.join(n.stem for n in notebooks())}")


def snapshot_path(nb: Path) -> Path:
    nb = Path(nb)
    return nb.parent / "__marimo__" / "session" / f"{nb.name}.json"


def _code_hash(code: str) -> str:
    return hashlib.md5(code.encode("utf-8"), usedforsecurity=False).hexdigest()


def load_cells(nb: Path) -> list[dict]:
    """The notebook's cells in order: id, name, code, hide_code (as marimo parses them)."""
    from marimo._ast.load import load_app

    app = load_app(str(nb))
    if app is None:
        raise ValueError(f"{nb} is not a marimo notebook")
    out = []
    for cd in app._cell_manager.cell_data():
        cfg = cd.config
        out.append({"id": cd.cell_id, "name": cd.name, "code": cd.code,
                    "hide_code": bool(getattr(cfg, "hide_code", False))})
    return out


def test_cell_names(nb: Path) -> list[str]:
    """Names of the notebook's test cells (`def test_...` cells), without running it."""
    tree = ast.parse(Path(nb).read_text())
    return [n.name for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def load_snapshot(nb: Path) -> dict | None:
    p = snapshot_path(nb)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def snapshot_status(nb: Path) -> str:
    """'fresh' (every cell's code matches the snapshot and ran without error),
    'failed' (it matches, but a cell raised), 'stale' or 'missing'."""
    snap = load_snapshot(nb)
    if snap is None:
        return "missing"
    cells = load_cells(nb)
    by_id = {c["id"]: c for c in snap.get("cells", [])}
    for c in cells:
        s = by_id.get(c["id"])
        if s is None or s.get("code_hash") != _code_hash(c["code"]):
            return "stale"
        if any(o.get("type") == "error" for o in s.get("outputs", [])):
            return "failed"
    return "fresh"


# --------------------------------------------------------------------------
# running


def _marimo() -> list[str]:
    return [sys.executable, "-m", "marimo"]


def run_notebook(nb: Path, force: bool = True, timeout: float | None = None,
                 env: dict | None = None) -> dict:
    """Execute one notebook headless (`marimo export session`).

    Returns {"notebook", "returncode", "seconds", "output", "skipped"}. A
    non-zero return code means a cell raised (marimo still writes the
    snapshot, with the error in that cell's outputs).
    """
    nb = Path(nb)
    if not force and snapshot_status(nb) == "fresh":
        return {"notebook": nb.stem, "returncode": 0, "seconds": 0.0, "output": "",
                "skipped": True}
    cmd = _marimo() + ["export", "session", "--force-overwrite", str(nb)]
    run_env = dict(os.environ)
    run_env.setdefault("PYTHONPATH", "")
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), run_env["PYTHONPATH"]) if p)
    run_env.setdefault("MPLBACKEND", "Agg")
    if env:
        run_env.update(env)
    t0 = time.perf_counter()
    cpu = None
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env, stdout=out, stderr=subprocess.STDOUT,
                                text=True)
        deadline = None if timeout is None else t0 + timeout
        rc = None
        while rc is None:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                proc.returncode = rc
                cpu = usage.ru_utime + usage.ru_stime
                break
            if deadline is not None and time.perf_counter() > deadline:
                proc.kill()
                proc.wait()
                rc = -9
                out.write(f"\ntimed out after {timeout} s\n")
                break
            time.sleep(0.2)
        out.seek(0)
        output = out.read()
    seconds = time.perf_counter() - t0
    _record_time(nb.stem, seconds, rc, cpu)
    return {"notebook": nb.stem, "returncode": rc, "seconds": seconds, "cpu_seconds": cpu,
            "output": output, "skipped": False}


def _record_time(stem, seconds, rc, cpu=None):
    """Remember a run's wall and CPU seconds (user+sys of marimo and its kernel)."""
    try:
        TIMINGS.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(TIMINGS.read_text())
        except (OSError, ValueError):
            data = {}
        data[stem] = {"seconds": round(seconds, 2), "returncode": rc, "when": time.time(),
                      "cpu_seconds": None if cpu is None else round(cpu, 2)}
        fd, tmp = tempfile.mkstemp(dir=TIMINGS.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, TIMINGS)
    except OSError:
        pass


def run_times() -> dict:
    try:
        return json.loads(TIMINGS.read_text())
    except (OSError, ValueError):
        return {}


def run_all(nbs=None, force=False, jobs=2, timeout=None, echo=print) -> list[dict]:
    nbs = [resolve(n) for n in nbs] if nbs else notebooks()
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = {pool.submit(run_notebook, nb, force, timeout): nb for nb in nbs}
        for fut in concurrent.futures.as_completed(futs):
            r = fut.result()
            results.append(r)
            if echo:
                state = ("up to date" if r["skipped"] else
                         "ok" if r["returncode"] == 0 else f"FAILED (rc {r['returncode']})")
                cpu = r.get("cpu_seconds")
                echo(f"{r['notebook']:<28} {state:<16} {r['seconds']:7.1f} s wall"
                     + (f", {cpu:6.1f} s CPU" if cpu is not None else ""))
    return sorted(results, key=lambda r: r["notebook"])


# --------------------------------------------------------------------------
# results of a run


def _strip_tags(text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def cell_results(nb: Path) -> list[dict]:
    """Per cell of the last run: id, name, error (None or the message and traceback)."""
    snap = load_snapshot(nb)
    if snap is None:
        raise FileNotFoundError(f"{nb} has not been run (no session snapshot)")
    cells = {c["id"]: c for c in load_cells(nb)}
    out = []
    for s in snap.get("cells", []):
        c = cells.get(s["id"], {"name": "?", "code": ""})
        err = None
        errors = [o for o in s.get("outputs", []) if o.get("type") == "error"]
        if errors:
            tb = "".join(_strip_tags(o.get("text", "")) for o in s.get("console", [])
                         if o.get("name") == "stderr")
            err = "; ".join(str(e.get("evalue") or e.get("ename")) for e in errors)
            err = (err + "\n" + tb).strip()
        out.append({"id": s["id"], "name": c["name"], "error": err})
    return out


# --------------------------------------------------------------------------
# rendering a notebook page


def _md_source(code: str) -> str | None:
    """The Markdown text of a cell that is only `mo.md(<string literal>)` (no f-string)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "md" and len(call.args) == 1 and not call.keywords
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return None
    return textwrap.dedent(call.args[0].value.lstrip("\n")).strip()


def _json_attr(attrs: str, name: str):
    m = re.search(name + r"='([^']*)'", attrs)
    if not m:
        return None
    try:
        return json.loads(html.unescape(m.group(1)))
    except ValueError:
        return html.unescape(m.group(1))


def _static_html(text: str) -> str:
    """marimo's custom elements -> plain HTML a static page can show."""

    def control(m):
        kind, attrs = m.group(1), m.group(2)
        label = _json_attr(attrs, "data-label")
        label = _strip_tags(label).strip() if isinstance(label, str) else kind
        value = _json_attr(attrs, "data-initial-value")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if kind == "button" or kind == "run-button":
            value = None
        shown = "" if value is None else f" = <code>{html.escape(str(value))}</code>"
        return (f'<span class="nb-control" title="an interactive control in the live notebook">'
                f'{html.escape(label or kind)}{shown}</span>')

    text = re.sub(r"<marimo-ui-element[^>]*>\s*<marimo-([\w-]+)((?:[^>'\"]|'[^']*'|\"[^\"]*\")*)>"
                  r".*?</marimo-\1>\s*</marimo-ui-element>", control, text, flags=re.S)

    def accordion(m):
        labels = _json_attr(m.group(1), "data-labels") or []
        bodies = re.findall(r"<div>(.*?)</div>(?=<div>|$)", m.group(2), flags=re.S) or [m.group(2)]
        parts = []
        for i, body in enumerate(bodies):
            label = _strip_tags(labels[i]) if i < len(labels) else "details"
            parts.append(f"<details><summary>{html.escape(label)}</summary>{body}</details>")
        return "".join(parts)

    text = re.sub(r"<marimo-accordion((?:[^>'\"]|'[^']*'|\"[^\"]*\")*)>(.*?)</marimo-accordion>",
                  accordion, text, flags=re.S)

    def mermaid(m):  # marimo's mo.mermaid: the markup Material for MkDocs draws with Mermaid
        diagram = _json_attr(m.group(1), "data-diagram")
        return f'<pre class="mermaid"><code>{html.escape(str(diagram or ""))}</code></pre>'

    text = re.sub(r"<marimo-mermaid((?:[^>'\"]|'[^']*'|\"[^\"]*\")*)>\s*</marimo-mermaid>",
                  mermaid, text)
    # Any other custom element: keep its children, drop the wrapper.
    text = re.sub(r"</?marimo-[\w-]+(?:[^>'\"]|'[^']*'|\"[^\"]*\")*>", "", text)
    return text


def _fence(text: str, lang: str = "text") -> str:
    text = text.rstrip("\n")
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _html_block(inner: str, cls: str = "nb-output") -> str:
    # A <div> at the start of a line is kept by Python-Markdown as one raw HTML
    # block (to its closing tag); markdown="0" keeps md_in_html out of it.
    return f'<div class="{cls}" markdown="0">\n{inner}\n</div>'


def _render_output(mime: str, data) -> str | None:
    if mime == "application/vnd.marimo+mimebundle":
        bundle = json.loads(data) if isinstance(data, str) else data
        for m in ("image/png", "image/svg+xml", "text/html", "text/markdown", "text/plain"):
            if m in bundle:
                return _render_output(m, bundle[m])
        return None
    if mime in ("image/png", "image/jpeg"):
        src = data if str(data).startswith("data:") else f"data:{mime};base64,{data}"
        return _html_block(f'<img alt="figure" src="{src}"/>', "nb-output nb-figure")
    if mime == "image/svg+xml":
        if str(data).startswith("data:"):
            _, b64 = data.split(",", 1)
            data = base64.b64decode(b64).decode("utf-8", "replace")
        return _html_block(data, "nb-output nb-figure")
    if mime in ("text/html", "text/markdown"):
        if not str(data).strip():
            return None
        return _html_block(_static_html(data))
    if mime == "application/json":
        try:
            text = json.dumps(json.loads(data), indent=2)
        except (TypeError, ValueError):
            text = str(data)
        return _fence(text, "json")
    if mime == "text/plain":
        return _fence(data) if str(data).strip() else None
    return None


def _render_console(console: list) -> list[str]:
    parts, buf = [], []

    def flush():
        if buf:
            parts.append(_fence("".join(buf)))
            buf.clear()

    for o in console:
        text = o.get("text", "")
        if o.get("mimetype") == "application/vnd.marimo+traceback":
            flush()
            parts.append('!!! failure "This cell raised"\n\n' +
                         textwrap.indent(_fence(_strip_tags(text)), "    "))
        elif o.get("name") == "stderr":
            flush()
            if text.strip():
                parts.append('??? warning "stderr"\n\n' + textwrap.indent(_fence(text), "    "))
        else:
            buf.append(text)
    flush()
    return parts


def render(nb: Path, source_url: str | None = None) -> str:
    """The Markdown page of one notebook: its cells with the outputs of the last run."""
    nb = Path(nb)
    snap = load_snapshot(nb)
    if snap is None:
        raise FileNotFoundError(f"{nb} has not been run: python tools/build_docs.py --run-only")
    outputs = {c["id"]: c for c in snap.get("cells", [])}
    cells = load_cells(nb)
    stale = snapshot_status(nb) != "fresh"
    times = run_times().get(nb.stem, {})
    rel = nb.relative_to(ROOT).as_posix()
    lines = []
    header = [f"Rendered from [`{rel}`]({source_url})" if source_url else f"Rendered from `{rel}`"]
    if times.get("seconds"):
        cpu = times.get("cpu_seconds")
        header.append(f"executed headless in {times['seconds']:.0f} s"
                      + (f" ({cpu:.0f} s of CPU time)" if cpu else "") + " when the site was built")
    info = ", ".join(header) + "."
    info += (f" Run it live (sliders and dropdowns work there): "
             f"`marimo edit {rel}`.")
    if stale:
        info += " **The outputs below are from an older version of the notebook.**"
    body_started = False
    for c in cells:
        snap_cell = outputs.get(c["id"], {})
        code = c["code"].strip()
        if c["name"] == "_" and code in ("import marimo as mo", ""):
            continue
        md = _md_source(code) if c["hide_code"] else None
        if md is not None:
            lines.append(md)
            if not body_started:
                lines.append('!!! info "About this page"\n\n    ' + info)
                body_started = True
            continue
        if not body_started:
            lines.append('!!! info "About this page"\n\n    ' + info)
            body_started = True
        if not c["hide_code"] and code:
            title = f' title="{c["name"]}"' if c["name"] != "_" else ""
            lines.append(f"```python{title}\n{code}\n```")
        lines.extend(_render_console(snap_cell.get("console", [])))
        for o in snap_cell.get("outputs", []):
            if o.get("type") == "error":
                continue  # shown from the console traceback
            for mime, data in (o.get("data") or {}).items():
                r = _render_output(mime, data)
                if r:
                    lines.append(r)
    return "\n\n".join(lines) + "\n"


def cell_output(nb: Path, name: str) -> str | None:
    """The rendered outputs (no code) of the cell called `name` in the last run."""
    snap = load_snapshot(nb)
    if snap is None:
        return None
    ids = [c["id"] for c in load_cells(nb) if c["name"] == name]
    if not ids:
        return None
    parts = []
    for cell in snap.get("cells", []):
        if cell["id"] != ids[0]:
            continue
        for o in cell.get("outputs", []):
            for mime, data in (o.get("data") or {}).items() if o.get("type") == "data" else ():
                r = _render_output(mime, data)
                if r:
                    parts.append(r)
    return "\n\n".join(parts) or None


def page_title(nb: Path) -> str:
    for c in load_cells(nb):
        md = _md_source(c["code"])
        if md:
            m = re.search(r"^#\s+(.+)$", md, flags=re.M)
            if m:
                return m.group(1).strip()
    return nb.stem


# --------------------------------------------------------------------------
# CLI


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("notebooks", nargs="*", help="only these notebooks (default: all)")
    p.add_argument("--force", action="store_true", help="re-run notebooks whose snapshot is fresh")
    p.add_argument("--jobs", type=int, default=2, help="notebooks run in parallel")
    p.add_argument("--timeout", type=float, default=900, help="seconds per notebook")
    p.add_argument("--run-only", action="store_true", help="run notebooks, do not build the site")
    p.add_argument("--check", action="store_true",
                   help="run notebooks and report failing cells; exit 1 on any failure")
    p.add_argument("--serve", action="store_true", help="mkdocs serve after running")
    p.add_argument("--site-dir", default="site")
    args = p.parse_args(argv)

    results = run_all(args.notebooks, force=args.force, jobs=args.jobs, timeout=args.timeout)
    failed = [r for r in results if r["returncode"] != 0]
    for r in failed:
        print(f"\n--- {r['notebook']} failed ---\n{r['output'][-4000:]}")
        for c in cell_results(resolve(r["notebook"])) if snapshot_path(
                resolve(r["notebook"])).exists() else []:
            if c["error"]:
                print(f"cell {c['name']} ({c['id']}): {c['error'][:2000]}")
    if args.run_only or args.check:
        return 1 if failed else 0
    if failed:
        print("not building the site: notebooks failed", file=sys.stderr)
        return 1
    cmd = [sys.executable, "-m", "mkdocs", "serve" if args.serve else "build"]
    if not args.serve:
        cmd += ["--strict", "--site-dir", args.site_dir]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
