"""`python -m torch_tpu._compat`: every patch target, its fingerprint, and whether it matches.

    python -m torch_tpu._compat           # the table: target, feature, status
    python -m torch_tpu._compat --write   # the fingerprint tables for the installed releases

Exit status 1 when a target differs from its table (a new PyTorch or JAX
release: review each patch against the new code, then record the table
`--write` prints as ``torch_tpu/_compat/<package>_<major>_<minor>.py``).
"""

from __future__ import annotations

import argparse
import sys

from . import current, expected
from .releases import all_patches, describe, package_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu._compat", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help="print the fingerprint table(s) of the installed releases")
    args = parser.parse_args(argv)
    rows = []
    for feature, patch in all_patches():
        try:
            fp = current(patch.target)
        except (ImportError, AttributeError) as e:
            fp = f"missing ({type(e).__name__})"
        want = expected(patch.target)
        rows.append((patch.target, feature, fp, want))
    if args.write:
        for package in ("torch", "jax"):
            mine = [r for r in rows if package_of(r[0]) == package]
            if not mine:
                continue
            print(f"# {describe(package)}")
            print("FINGERPRINTS = {")
            for target, _, fp, _ in sorted(set((r[0], "", r[2], None) for r in mine)):
                print(f"    {target!r}: {fp!r},")
            print("}\n")
        return 0
    bad = 0
    print(f"{describe('torch')}, {describe('jax')}")
    for target, feature, fp, want in rows:
        ok = want is not None and fp in want
        bad += not ok
        status = "ok" if ok else ("NOT RECORDED" if want is None else "CHANGED")
        print(f"{status:13s} {target:70s} {fp:18s} {feature}")
    print(f"{len(rows)} patch targets, {bad} not matching")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
