"""`python -m tests.fuzz --seed N --count M --paths eager,fused,compiled`.

Runs the programs of seeds N..N+M-1 on CPU and on `tpu` on each path, prints
each difference as it is found, then shrinks every failure (one per class
and path, unless --shrink-all) and prints the minimal reproducer as runnable
code with the class it belongs to (a KNOWN entry of tests/fuzz/known.py, or
NEW). Exit status 1 when a failure is in no known class.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import known, runner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--paths", default="eager,fused,compiled")
    ap.add_argument("--compiled-every", type=int, default=1,
                    help="run the compiled path on every k-th program only (it compiles a graph each)")
    ap.add_argument("--shrink-budget", type=int, default=120, help="tries per failure")
    ap.add_argument("--shrink-all", action="store_true", help="shrink every failure, not one per class")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    paths = tuple(p for p in args.paths.split(",") if p)
    bad = [p for p in paths if p not in runner.PATHS]
    if bad:
        ap.error(f"unknown path {bad[0]!r}: one of {', '.join(runner.PATHS)}")
    t0 = time.perf_counter()
    rep = runner.fuzz(args.seed, args.count, paths, args.compiled_every,
                      log=None if args.quiet else print)
    t1 = time.perf_counter()
    new = known.triage(rep, args.shrink_budget, args.shrink_all)
    print(f"\nprograms run per path: {rep.runs}; seconds per path: "
          + ", ".join(f"{p} {s:.1f}" for p, s in rep.seconds.items())
          + f"; fuzzing {t1 - t0:.1f} s, shrinking {time.perf_counter() - t1:.1f} s")
    print(known.summary(rep))
    for f in rep.failures:
        if f.shrunk is not None:
            print(f"\n# ---- seed {f.seed}: {f.shrunk_mismatch or f.mismatch}"
                  f"\n# class: {f.known or 'NEW'}\n{f.shrunk.source((f.mismatch.path,))}")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
