"""The OpInfo suite on every path a user takes: docs/op_paths.md.

    python tools/op_paths.py                          # float32 fwd + grad, 3 samples per case
    python tools/op_paths.py --samples 0 --all        # every sample, every dtype (hours)
    python tools/op_paths.py --from-dir DIR           # tables from an earlier run's files

Paths, each a whole pytest run of tests/ops/test_opinfo.py (CPU fallback off):

- ``cold``: eager ops, a new process on an empty cache directory;
- ``warm``: the same run again in new processes on the directory ``cold``
  filled (the second run of a notebook or a training script: programs come
  from the eager index without lowering);
- ``fused``: inside ``torch_tpu.fused()`` (``--opinfo-path fused``);
- ``compiled``: through ``torch.compile(backend="tpu")``
  (``--opinfo-path compiled``; a sample that ran no graph, or whose graph ran
  op by op, fails as "not compiled", unless dynamo captures no graph of the
  same call with CPU arguments either, or raises the same error there: then
  no backend could compile it, and the case is an expected failure, "not
  capturable", with its values still compared).

Below the table, the compiled path's passes as a share of the eager (cold)
passes that dynamo can capture at all: the issue's target (98 % forward,
95 % grad) is about those.

A worker killed by a signal is recorded as a ``crash`` of its test (xdist
starts a new worker; tests/ops/conftest.py) and the run goes on. The page
lists per path pass/total for forward and gradient, crashes, and every case
whose outcome differs from the cold eager run's, with its cause.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "op_paths.md")
PATHS = ("cold", "warm", "fused", "compiled")
PASSING = ("passed", "xpassed")


def run(path: str, out: str, cache: str, args) -> float:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "tests/ops/test_opinfo.py", f"--opinfo-results={out}", "-n", str(args.workers),
           "--opinfo-max-samples", str(args.samples)]
    if args.all:
        cmd += ["-m", ""]
    else:
        cmd += ["-k", args.k]
    if path in ("fused", "compiled"):
        cmd += ["--opinfo-path", path]
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache)
    env.pop("TORCH_TPU_CPU_FALLBACK", None)
    print(f"[{path}]", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def load(path: str) -> dict:
    with open(path) as f:
        recs = json.load(f)["records"]
    return {(r["op"], r["dtype"], r["kind"]): r for r in recs}


def summary(results: dict, seconds: dict) -> str:
    cold = results.get("cold", {})
    lines = ["| path | forward pass/total (xfail) | grad pass/total (xfail) | crashes "
             "| differs from cold | wall s |", "|---|---|---|---|---|---|"]
    for p in PATHS:
        if p not in results:
            continue
        r = results[p]
        row = [p]
        for kind in ("forward", "grad"):
            cases = [v for k, v in r.items() if k[2] == kind and v["outcome"] != "skipped"]
            ok = sum(v["outcome"] in PASSING for v in cases)
            xf = sum(v["outcome"] == "xfailed" for v in cases)
            row.append(f"{ok}/{len(cases)} ({xf})")
        row.append(str(sum(v["outcome"] == "crash" for v in r.values())))
        diff = [k for k, v in r.items() if k in cold and (v["outcome"] in PASSING)
                != (cold[k]["outcome"] in PASSING)]
        row.append(str(len(diff)) if p != "cold" else "-")
        row.append(f"{seconds.get(p, 0):.0f}")
        lines.append("| " + " | ".join(row) + " |")
    comp = results.get("compiled")
    if comp and cold:
        shares = []
        for kind in ("forward", "grad"):
            eager_ok = {k for k, v in cold.items() if k[2] == kind and v["outcome"] in PASSING}
            uncapturable = {k for k in eager_ok if comp.get(k, {}).get("outcome") == "xfailed"
                            and str(comp[k].get("cause", "")).startswith("not capturable")}
            base = eager_ok - uncapturable
            ok = sum(comp.get(k, {}).get("outcome") in PASSING for k in base)
            shares.append(f"{kind} {ok}/{len(base)} ({100 * ok / max(1, len(base)):.1f} %; "
                          f"{len(uncapturable)} not capturable on any device)")
        lines += ["", "compiled, of the eager passes dynamo can capture: " + "; ".join(shares)]
    return "\n".join(lines)


def differences(results: dict) -> str:
    cold = results.get("cold", {})
    out = []
    for p in PATHS[1:]:
        if p not in results:
            continue
        rows = []
        for k, v in sorted(results[p].items()):
            c = cold.get(k)
            if c is None or (v["outcome"] in PASSING) == (c["outcome"] in PASSING):
                continue
            cause = (v.get("cause") or c.get("cause") or "").replace("|", "\\|")[:160]
            rows.append(f"| `{k[0]}` | {k[1]} | {k[2]} | {c['outcome']} | {v['outcome']} | "
                        f"{cause} |")
        out.append(f"### {p}: cases whose outcome differs from cold eager ({len(rows)})\n")
        if rows:
            out.append("| op | dtype | kind | cold | " + p + " | cause |\n|---|---|---|---|---|---|")
            out.extend(rows)
        out.append("")
    return "\n".join(out)


def causes(results: dict, path: str) -> str:
    counter = collections.Counter()
    for v in results.get(path, {}).values():
        if v["outcome"] in ("failed", "crash"):
            counter[(v.get("cause") or "?").split(":")[0]] += 1
    return ", ".join(f"{k} {n}" for k, n in counter.most_common(8)) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=3, help="samples per case (0: all)")
    ap.add_argument("-k", default="float32", help="pytest -k selection (default: float32)")
    ap.add_argument("--all", action="store_true", help="every dtype (the slow set too)")
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--from-dir", help="read <path>.json files from this directory, no run")
    ap.add_argument("--out-dir", help="keep the result files here (default: a temp dir)")
    ap.add_argument("-o", "--output", default=DOC)
    args = ap.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    d = args.from_dir or args.out_dir or tempfile.mkdtemp(prefix="op-paths-")
    os.makedirs(d, exist_ok=True)
    seconds: dict = {}
    if os.path.exists(os.path.join(d, "seconds.json")):  # a rerun of some paths keeps the rest
        with open(os.path.join(d, "seconds.json")) as f:
            seconds = json.load(f)
    if not args.from_dir:
        cache = tempfile.mkdtemp(prefix="op-paths-cache-")
        for p in paths:
            if p == "warm" and "cold" not in paths:
                raise SystemExit("the warm path needs the cold one first (same cache)")
            seconds[p] = run(p, os.path.join(d, f"{p}.json"),
                             cache if p in ("cold", "warm") else tempfile.mkdtemp(), args)
        with open(os.path.join(d, "seconds.json"), "w") as f:
            json.dump(seconds, f)
    results = {p: load(os.path.join(d, f"{p}.json")) for p in PATHS
               if os.path.exists(os.path.join(d, f"{p}.json"))}
    table = summary(results, seconds)
    print(table)
    for p in results:
        print(f"{p}: failure causes: {causes(results, p)}")
    selection = "every dtype" if args.all else f"-k {args.k!r}"
    page = [
        "# The OpInfo suite on every path",
        "",
        "Generated by `python tools/op_paths.py` "
        f"({selection}, {args.samples or 'all'} samples per case, "
        f"{datetime.date.today().isoformat()}). Each path is a whole run of "
        "`tests/ops/test_opinfo.py` with the CPU fallback off; see the tool's "
        "docstring for what each path is. In brackets: listed expected failures "
        "(tests/ops/expectations.py), which every path shares.",
        "",
        table,
        "",
        differences(results),
    ]
    with open(args.output, "w") as f:
        f.write("\n".join(page).rstrip() + "\n")
    print("wrote", args.output, "and the result files in", d)


if __name__ == "__main__":
    main()
