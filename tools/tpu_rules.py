"""TPU rules that XLA:CPU forgives, checked on the programs the OpInfo run lowers.

    python tools/tpu_rules.py                       # float32 and bfloat16, one sample per op
    python tools/tpu_rules.py --samples 0           # every sample
    python tools/tpu_rules.py --every 8             # every 8th op (a quick look)
    python tools/tpu_rules.py --precision high      # the dots under another matmul precision

Each dtype runs in a new process that lowers every program as a TPU would
(`platform.supports_float64()` False, an empty cache): no 64-bit float value,
and every float32 dot and convolution at the precision
`torch.tpu.get_matmul_precision()` implies. The rules and the walk are
`tests/ops/test_tpu_rules.py`'s (the default test run checks float32, one
sample per op); this prints what they find instead of asserting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--samples", type=int, default=1, help="samples per op (0: all)")
    ap.add_argument("--every", type=int, default=1, help="check every n-th op")
    ap.add_argument("--precision", default=None, choices=("highest", "high", "medium"),
                    help="torch.set_float32_matmul_precision for the run")
    args = ap.parse_args()
    for dtype in args.dtypes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "found.json")
            code = ("import sys, json, torch\n"
                    + (f"torch.set_float32_matmul_precision({args.precision!r})\n"
                       if args.precision else "")
                    + "from tests.ops.test_tpu_rules import walk\n"
                    + f"json.dump(walk({dtype!r}, {args.samples}, {args.every}), "
                    + f"open({out!r}, 'w'))\n")
            env = dict(os.environ, TORCH_TPU_CACHE_DIR=os.path.join(tmp, "cache"))
            subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
            with open(out) as f:
                found = json.load(f)
        print(f"{dtype}: {found['ran']} OpInfo entries, {found['dots']} float32 dots "
              f"(want precision {found['precision']})")
        for title, key in (("programs with 64-bit float values", "wide"),
                           (f"float32 dots/convolutions without {found['precision']}",
                            "imprecise")):
            print(f"  {title}: {len(found[key])} ops")
            for op, progs in sorted(found[key].items()):
                print(f"    {op}: {', '.join(sorted(progs)[:5])}")


if __name__ == "__main__":
    main()
