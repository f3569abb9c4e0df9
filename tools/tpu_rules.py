"""TPU rules that XLA:CPU forgives, checked on the programs the OpInfo run lowers.

    python tools/tpu_rules.py              # float32 and bfloat16 forward, every op
    python tools/tpu_rules.py --every 8    # every 8th op (a quick look)

For each float32/bfloat16 forward case of the OpInfo harness (tests/ops), every
program torch_tpu lowers while running it is read as StableHLO
(`runtime.programs.LOWERED_LISTENERS`) and checked for:

- **64-bit floating point** (`f64`, `complex<f64>`): a TPU has none; a
  float32 op whose program computes in f64 works on a laptop and fails (or is
  emulated slowly) on a TPU;
- **matmul precision**: each `dot_general` and `convolution` on f32 operands
  must carry the precision `torch.get_float32_matmul_precision()` implies
  (`highest` -> HIGHEST; `high` -> HIGH; `medium` -> DEFAULT), or XLA:TPU
  picks bf16 passes where PyTorch's users asked for float32.

Prints per rule the ops and programs that break it. The eager index is not
consulted while the listener is installed, so every program is lowered.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F64 = re.compile(r"\bf64\b|complex<f64>")
DOT = re.compile(r"stablehlo\.(dot_general|convolution)\b[^\n]*")
WANT = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=1, help="check every n-th op")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()
    os.environ.setdefault("TORCH_TPU_CPU_FALLBACK", "0")
    sys.path.insert(0, ROOT)
    warnings.simplefilter("ignore")
    import torch

    from tests.ops import harness
    from torch_tpu.runtime import programs

    want = WANT[torch.get_float32_matmul_precision()]
    f64: dict = collections.defaultdict(set)
    precision: dict = collections.defaultdict(set)
    current = [""]

    def listener(name, key, lowered):
        try:
            text = lowered.as_text()
        except Exception:  # noqa: BLE001 - a program without text: nothing to check
            return
        if F64.search(text):
            f64[current[0]].add(str(name))
        if not current[0].endswith("(float32)"):
            return  # the precision rule is about float32 operands
        for m in DOT.finditer(text):
            line = m.group(0)
            # (no precision attribute at all means DEFAULT)
            if "xf32>" in line and f"precision = [{want}, {want}]" not in line and not (
                    want == "DEFAULT" and "precision =" not in line):
                precision[current[0]].add(str(name))

    programs.LOWERED_LISTENERS.append(listener)
    dtypes = set(args.dtypes.split(","))
    n = checked = 0
    for name, op, dt, kind in harness.cases():
        if dt not in dtypes or kind != "forward":
            continue
        n += 1
        if n % args.every:
            continue
        checked += 1
        current[0] = f"{name} ({dt})"
        try:
            harness.run_case(name, op, dt, kind, {})
        except Exception:  # noqa: BLE001 - conformance is the OpInfo suite's job
            pass
    print(f"checked {checked} cases ({', '.join(sorted(dtypes))} forward), "
          f"matmul precision {torch.get_float32_matmul_precision()} -> {want}")
    for title, found in (("programs with f64/c128", f64),
                         (f"f32 dots/convolutions without precision {want}", precision)):
        print(f"\n{title}: {len(found)} cases")
        for case, progs in sorted(found.items()):
            print(f"  {case}: {', '.join(sorted(progs)[:5])}")


if __name__ == "__main__":
    main()
