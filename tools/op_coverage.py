"""Operator coverage of the `tpu` backend: docs/ops.md from the OpInfo harness.

    python tools/op_coverage.py                      # run the default set, write docs/ops.md
    python tools/op_coverage.py --all                # run every dtype (slow set too)
    python tools/op_coverage.py --from run.json ...  # use result files, no run
    python tools/op_coverage.py --from native.json --fallback-results fb.json

A run is `pytest -n 2 tests/ops --opinfo-results <file>` with the CPU
fallback disabled (TORCH_TPU_CPU_FALLBACK=0, the harness's default), so an op
that needs the CPU counts as failing. `--fallback-results` adds a run made
with `--cpu-fallback` (the issue's "100 % produce a result or the same
exception type" check). `--with-fallback-run` makes that run itself, over
the native run's failures only: a test that passes with the fallback
disabled never reached the fallback, so enabling it cannot change the result.

It prints the counts issue 4 is judged by (float32 forward, float32
gradients, bfloat16 forward; random OpInfo entries and CUDA-only jiterator
entries excluded) and writes the page: per OpInfo entry, forward status per
dtype and float32 gradient status, and how it runs (native lowering,
PyTorch decomposition, CPU fallback), then the failures grouped by cause.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ops.md")
DTYPE_ORDER = ["float32", "bfloat16", "float16", "int64", "int32", "bool", "complex64"]
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64",
         "int32": "i32", "bool": "bool", "complex64": "c64"}


def run_pytest(all_dtypes, fallback, extra, workers=2, files=("tests/ops/test_opinfo.py",),
               nodeids=None):
    fd, path = tempfile.mkstemp(suffix=".json", prefix="opinfo-")
    os.close(fd)
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    opts = [f"--opinfo-results={path}", "-rN", "--no-header"]
    if workers > 1:
        opts += ["-n", str(workers)]
    if all_dtypes:
        opts += ["-m", ""]
    if fallback:
        opts += ["--cpu-fallback"]
    opts += list(extra)
    targets = list(files) if nodeids is None else list(nodeids)
    cmd = pytest + targets + opts
    shown = targets if nodeids is None else [f"<{len(nodeids)} tests by node id>"]
    print("running:", " ".join(pytest + shown + opts), flush=True)
    env = dict(os.environ)
    env.pop("TORCH_TPU_CPU_FALLBACK", None)
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    return path


def load(paths):
    recs, fallback = [], None
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        fb = bool(data.get("cpu_fallback"))
        if fallback is not None and fb != fallback:
            raise SystemExit("mixing --cpu-fallback and native result files")
        fallback = fb
        recs.extend(r for r in data["records"] if r["kind"] in ("forward", "grad"))
    by_key = {}
    for r in recs:
        by_key[(r["op"], r["dtype"], r["kind"])] = r
    return by_key


def failed_nodeids(paths):
    """The node ids of the failing (or expected-failing) tests of result files
    `paths` (a later file's record of a test replaces an earlier one's)."""
    return sorted({r["nodeid"] for r in load(paths).values() if failed(r)})


def with_native_passes(fallback, native):
    """Fallback results over the native run's tests: the fallback run's records,
    and the native passes (which never reached the fallback) as they are."""
    out = {k: r for k, r in native.items() if passed(r)}
    out.update(fallback)
    return out


def passed(rec):
    return rec is not None and rec["outcome"] in ("passed", "xpassed")


def failed(rec):
    return rec is not None and rec["outcome"] in ("failed", "xfailed")


def summary(cases, results, random_ops):
    """The issue's counts: {label: (passed, total, not_run)}."""
    out = {}
    for label, dtype, kind in (("float32 forward", "float32", "forward"),
                               ("float32 gradient", "float32", "grad"),
                               ("bfloat16 forward", "bfloat16", "forward"),
                               ("float16 forward", "float16", "forward"),
                               ("int64 forward", "int64", "forward"),
                               ("int32 forward", "int32", "forward"),
                               ("bool forward", "bool", "forward"),
                               ("complex64 forward", "complex64", "forward")):
        keys = [k for k in cases if k[1] == dtype and k[2] == kind and k[0] not in random_ops]
        ran = [k for k in keys if k in results]
        ok = sum(passed(results[k]) for k in ran)
        out[label] = (ok, len(keys), len(keys) - len(ran))
    return out


def how_it_runs(op, results):
    """'native' / 'decomposed' / 'CPU fallback' (+ the ATen ops) from the records."""
    missing, fb, dec, nat = set(), set(), set(), set()
    for (name, _, _), r in results.items():
        if name != op:
            continue
        cause = r.get("cause") or ""
        m = re.match(r"no lowering: (\S+)", cause)
        if m:
            missing.add(m.group(1))
        fb.update(r.get("fallback") or [])
        dec.update(r.get("decomposed") or [])
        nat.update(r.get("native") or [])
    if missing or fb:
        return "CPU fallback", sorted(missing | fb)
    if dec:
        return "decomposed", sorted(dec)
    if nat:
        return "native", []
    return ("native" if any(k[0] == op for k in results) else "not run"), []


def _cell(rec, supported):
    if not supported:
        return "—"
    if rec is None:
        return "·"
    if passed(rec):
        return "✅"
    return "❌"


def write_page(path, cases, results, fb_results, random_ops, sums, fb_sum, meta):
    ops = []
    seen = set()
    for k in cases:
        if k[0] not in seen:
            seen.add(k[0])
            ops.append(k[0])
    supported = set(cases)
    lines = [
        "# Operator coverage",
        "",
        "What runs on `tpu`: every entry of PyTorch's operator database",
        "(`torch.testing._internal.common_methods_invocations.op_db`, the suite",
        "PyTorch judges its own backends by) run on CPU and on `tpu`, outputs",
        "compared value by value; input gradients for float32.",
        "",
        f"Generated by `python tools/op_coverage.py` on {meta['date']} "
        f"(torch {meta['torch']}, commit {meta['commit']}), from a run with the CPU",
        "fallback **disabled** (`TORCH_TPU_CPU_FALLBACK=0`): an op that would run on the",
        "CPU counts as failing here. With the fallback on (the default for users) such",
        "ops still work, only slower.",
        "",
        "## Summary",
        "",
        "Random OpInfo entries (compared by distribution) and CUDA-only jiterator",
        "entries are left out of these counts.",
        "",
        "| set | passing | of | % | not run |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, (ok, total, not_run) in sums.items():
        if total == not_run:
            continue
        pct = 100.0 * ok / total if total else 0.0
        lines.append(f"| {label} | {ok} | {total} | {pct:.1f} | {not_run} |")
    if fb_sum is not None:
        ok, total = fb_sum
        lines += ["", f"With the CPU fallback on: {ok} of {total} tests "
                  f"({100.0 * ok / max(total, 1):.1f} %) give CPU's result or CPU's exception type."]
        others = sorted(k for k, r in fb_results.items() if failed(r))
        if others:
            lines[-1] += " The others: " + ", ".join(
                f"`{op}` {dt} {kind}" for op, dt, kind in others) + " (see below)."
    lines += [
        "",
        "## Per operator",
        "",
        "✅ passes · ❌ fails (see the causes below) · — the CPU kernel does not support",
        "the dtype · `·` not run (dtype outside the run). *How* is how the op runs on",
        "`tpu`: **native** (lowerings in `torch_tpu.ops.registry.LOWERINGS` or storage",
        "kernels in `torch_tpu.ops.core.KERNELS`), **decomposed** (PyTorch's",
        "`torch._decomp` decomposition into lowered ops), **CPU fallback** (at least",
        "one ATen op, listed, has no lowering). *random*: compared by distribution.",
        "",
        "| op | how | " + " | ".join(SHORT[d] for d in DTYPE_ORDER) + " | grad f32 |",
        "|---|---|" + "---|" * (len(DTYPE_ORDER) + 1),
    ]
    for op in ops:
        how, aten = how_it_runs(op, results)
        if how == "CPU fallback":
            how = "CPU fallback: " + ", ".join(f"`{a}`" for a in aten[:3])
        elif how == "decomposed":
            how = "decomposed"
        if op in random_ops:
            how += " (random)"
        cells = [_cell(results.get((op, d, "forward")), (op, d, "forward") in supported)
                 for d in DTYPE_ORDER]
        g = (op, "float32", "grad")
        cells.append(_cell(results.get(g), g in supported))
        lines.append(f"| `{op}` | {how} | " + " | ".join(cells) + " |")

    # failures grouped by cause
    groups = collections.defaultdict(list)
    for k, r in results.items():
        if failed(r):
            cause = re.sub(r"sample \d+", "sample N", r.get("cause") or "unknown")
            groups[_group(cause)].append((k, cause))
    lines += ["", "## Failures by cause", ""]
    if not groups:
        lines.append("None.")
    for g, items in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"### {g} ({len(items)})")
        lines.append("")
        for (op, dt, kind), cause in sorted(items):
            detail = cause if cause != g else ""
            lines.append(f"- `{op}` {dt} {kind}" + (f": {detail}" if detail else ""))
            why = _documented_reason((op, dt, kind))
            if why:
                lines.append(f"  *Expected failure:* {why}")
        lines.append("")
    missing = collections.Counter()
    for r in results.values():
        m = re.match(r"no lowering: (\S+)", r.get("cause") or "")
        if m and failed(r):
            missing[m.group(1)] += 1
    if missing:
        lines += ["## ATen ops without a lowering", "",
                  "The first op without a lowering each failing test reached, and how many",
                  "tests it stops:", ""]
        for a, n in missing.most_common():
            lines.append(f"- `{a}`: {n}")
        lines.append("")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def _documented_reason(key):
    """The hand-written reason of an expected failure (not a recorded cause)."""
    from tests.ops import expectations

    reason = expectations.XFAILS.get(key) or expectations.XFAILS.get((key[0], "any", key[2]))
    if not reason or re.match(r"(no lowering|mismatch|error|distribution|no error)", reason):
        return None
    return reason


def _group(cause):
    """A coarse group for a cause."""
    if cause.startswith("no lowering:"):
        return "no lowering (CPU fallback disabled)"
    if cause.startswith("mismatch"):
        if "shape/dtype" in cause or "dtype" in cause.split(":", 1)[-1][:60]:
            return "wrong dtype or shape"
        return "wrong values"
    if cause.startswith("distribution"):
        return "wrong distribution (random op)"
    if cause.startswith("no error") or cause.startswith("error type"):
        return "different exception behaviour"
    m = re.match(r"error: (\w+)", cause)
    if m:
        return f"raises {m.group(1)}"
    return cause[:60]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="results", action="append",
                    help="result files of a native (fallback disabled) run")
    ap.add_argument("--fallback-results", action="append",
                    help="result files of a --cpu-fallback run")
    ap.add_argument("--all", action="store_true", help="run every dtype (slow set too)")
    ap.add_argument("--with-fallback-run", action="store_true",
                    help="also run with --cpu-fallback")
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("-o", "--output", default=DOC)
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)

    paths = args.results or [run_pytest(args.all, False, args.pytest_args, args.workers)]
    fb_paths = args.fallback_results
    fb_failures_only = False
    if fb_paths is None and args.with_fallback_run:
        fb_failures_only = True
        ids = failed_nodeids(paths)
        fb_paths = ([run_pytest(args.all, True, args.pytest_args, args.workers, nodeids=ids)]
                    if ids else [])

    sys.path.insert(0, ROOT)
    import torch

    from tests.ops import harness

    cases = [(n, d, k) for n, _, d, k in harness.cases()]
    random_ops = set(harness.RANDOM_OPS)
    results = load(paths)
    sums = summary(cases, results, random_ops)
    fb_sum = None
    if fb_paths is not None:
        fbr = load(fb_paths)
        if fb_failures_only:
            fbr = with_native_passes(fbr, results)
        fb_sum = (sum(passed(r) for r in fbr.values()), len(fbr))

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        commit = "?"
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "commit": commit}
    write_page(args.output, cases, results, fbr if fb_sum is not None else None, random_ops, sums, fb_sum, meta)

    n_ops = len({c[0] for c in cases})
    print(f"OpInfo entries tested: {n_ops} (op_db {len(harness.op_db)}, "
          f"minus {sum(harness.is_jiterator(o) for o in harness.op_db)} jiterator)")
    for label, (ok, total, not_run) in sums.items():
        if total == not_run:
            continue
        print(f"{label:20s} {ok:4d} / {total:4d} = {100.0 * ok / max(total, 1):5.1f} %"
              + (f"   ({not_run} not run)" if not_run else ""))
    if fb_sum:
        print(f"with CPU fallback: {fb_sum[0]} / {fb_sum[1]} tests give CPU's result or error type")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
