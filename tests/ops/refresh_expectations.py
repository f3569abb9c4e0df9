"""Rewrite expectations.XFAILS from a run of the OpInfo harness.

    python -m tests.ops.refresh_expectations                  # default run (CI set)
    python -m tests.ops.refresh_expectations --all            # every dtype (slow too)
    python -m tests.ops.refresh_expectations --from run.json  # no run: use results
    python -m tests.ops.refresh_expectations -- -k "conv"     # extra pytest args

It runs `pytest -n 2 tests/ops --opinfo-results <tmp>` (CPU fallback
disabled, as in CI), then, for every test that ran:

* passed / xpassed  -> its XFAILS entry is removed;
* failed / xfailed  -> an entry is added (reason: the failure's cause). An
  existing entry keeps its reason when it was written by hand; reasons the
  harness generated ("no lowering: ...", "mismatch ...", "error: ...",
  "distribution ...", "no error ...", "error type ...") are replaced by the
  current cause.

Entries keyed to their failing samples (expectations.XFAIL_SAMPLES) are left
alone: a new sample-dependent failure's entry needs its samples added there
by hand (the failure names its sample; test_opinfo checks every such entry
is keyed).

Entries of tests that did not run (other dtypes, deselected) are kept.
Only the XFAILS block of expectations.py is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXPECTATIONS = os.path.join(HERE, "expectations.py")

AUTO_REASON = re.compile(
    r"^(no lowering:|mismatch|error:|error type|distribution|no error|error input|"
    r"[\w.]+: (tpu|CPU|unchecked))")


def run_pytest(all_dtypes: bool, extra, workers: int) -> str:
    from .harness import DEFAULT_MAX_SAMPLES  # (imports torch_tpu: only when it runs)

    fd, path = tempfile.mkstemp(suffix=".json", prefix="opinfo-")
    os.close(fd)
    # The expectations hold for the thorough selection (12 samples a case),
    # which the default run's quick one (harness.QUICK_SAMPLES) is a subset of.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/ops", f"--opinfo-results={path}", "--no-header", "-rN",
           f"--opinfo-max-samples={DEFAULT_MAX_SAMPLES}"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if all_dtypes:
        cmd += ["-m", ""]
    cmd += list(extra)
    print("running:", " ".join(cmd), flush=True)
    env = dict(os.environ)
    env.pop("TORCH_TPU_CPU_FALLBACK", None)
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    return path


def load_records(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        if data.get("cpu_fallback"):
            raise SystemExit(f"{p}: a --cpu-fallback run; XFAILS describe the "
                             "run with the fallback disabled")
        recs.extend(data["records"])
    return recs


def key_of(rec):
    if rec["kind"] == "bad_call":
        case = re.search(r"\[(.*)\]$", rec["nodeid"]).group(1)
        return (case, rec["dtype"], rec["kind"])
    return (rec["op"], rec["dtype"], rec["kind"])


def new_xfails(old: dict, records, keyed=frozenset()) -> tuple[dict, dict]:
    """XFAILS after `records`; entries keyed to their samples (`keyed`:
    expectations.XFAIL_SAMPLES) are kept as they are: whether a run saw their
    samples depends on its selection, and they are edited by hand with it."""
    xf = dict(old)
    changes = {"added": 0, "removed": 0, "updated": 0}
    for rec in records:
        key = key_of(rec)
        if key in keyed:
            continue
        outcome = rec["outcome"]
        if outcome in ("passed", "xpassed"):
            if key in xf:
                del xf[key]
                changes["removed"] += 1
        elif outcome in ("failed", "xfailed"):
            cause = rec.get("cause") or "unknown failure"
            cause = re.sub(r"sample \d+", "sample N", cause)
            if key not in xf:
                xf[key] = cause
                changes["added"] += 1
            elif AUTO_REASON.match(xf[key]) and xf[key] != cause:
                xf[key] = cause
                changes["updated"] += 1
    return xf, changes


def render(xf: dict) -> str:
    kinds = {"forward": 0, "grad": 1, "error": 2, "bad_call": 3}
    dts = ["float32", "bfloat16", "float16", "int64", "int32", "bool", "complex64", "any"]
    lines = ["XFAILS = {"]
    for key in sorted(xf, key=lambda k: (k[0], kinds.get(k[2], 9),
                                         dts.index(k[1]) if k[1] in dts else 99)):
        lines.append(f"    {key!r}:\n        {xf[key]!r},")
    lines.append("}")
    return "\n".join(lines)


def rewrite(xf: dict):
    with open(EXPECTATIONS) as f:
        text = f.read()
    m = re.search(r"^XFAILS = \{\n.*?^\}", text, re.S | re.M)
    if m is None:
        raise SystemExit("expectations.py: no XFAILS = {...} block found")
    text = text[:m.start()] + render(xf) + text[m.end():]
    with open(EXPECTATIONS, "w") as f:
        f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="run every dtype (the slow set too)")
    ap.add_argument("--from", dest="results", action="append",
                    help="use these result files (from --opinfo-results) instead of running")
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print the changes only")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    paths = args.results or [run_pytest(args.all, args.pytest_args, args.workers)]
    records = load_records(paths)
    sys.path.insert(0, ROOT)
    from tests.ops import expectations

    xf, changes = new_xfails(expectations.XFAILS, records, frozenset(expectations.XFAIL_SAMPLES))
    print(f"{len(records)} results; XFAILS: {len(expectations.XFAILS)} -> {len(xf)} "
          f"({changes['added']} added, {changes['removed']} removed, "
          f"{changes['updated']} reasons updated)")
    if not args.dry_run:
        rewrite(xf)
        print(f"wrote {EXPECTATIONS}")


if __name__ == "__main__":
    main()
