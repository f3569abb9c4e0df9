"""Half-precision products with a Linear's weight on XLA:CPU, whole or in pieces.

XLA:CPU computes `x @ W.T` (W stored row-major, x with more than one row) in
bfloat16 by making a float32, transposed copy of all of W first; torch_tpu
splits such products along W's rows on the CPU platform
(`TORCH_TPU_CPU_DOT_PIECE_MB`, docs/benchmarks.md "Which bfloat16 dots get a
float32 copy"). This measures what that changes where it matters in a model:
a forward pass with the loss over the whole sequence, and a training step
(forward, loss, backward), of a causal LM made on the meta device with random
bfloat16 weights (transformers; Llama-3.2-1B width with 4 layers unless
`--model`/`--layers` say otherwise), on `tpu` eager.

Each setting runs in its own process with a fresh cache directory; the two
settings alternate `--pairs` times so both see the same host load. Prints the
median seconds per call of each process, the ratio whole / pieces, the loss
(equal in both settings) and the load.

    python benchmarks/cpu_dots.py [--pairs 2] [--layers 4] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
import torch, torch_tpu  # noqa: F401
sys.path.insert(0, {here!r})
from scale import model_config
import transformers
cfg = model_config({model!r}, num_hidden_layers={layers})
torch.manual_seed(0)
with torch.device("meta"):
    m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
m = m.to_empty(device="tpu")
with torch.no_grad():
    for p in m.parameters():
        p.normal_(0, 0.02)
m.tie_weights()
ids = torch.randint(0, cfg.vocab_size, (1, {seq})).to("tpu")

def forward():
    with torch.no_grad():
        return m(ids, labels=ids).loss.item()

def train():
    out = m(ids, labels=ids)
    out.loss.backward()
    for p in m.parameters():
        p.grad = None
    return out.loss.item()

res = {{}}
for name, fn in (("forward with loss", forward), ("training step", train)):
    loss = fn()  # compiles
    ts = []
    for _ in range({repeats}):
        t = time.perf_counter()
        loss = fn()
        ts.append(time.perf_counter() - t)
    res[name] = (sorted(ts)[len(ts) // 2], loss)
print("RESULT " + json.dumps(res))
"""


def run(piece: str, args) -> dict:
    code = CHILD.format(here=str(HERE), model=args.model, layers=args.layers, seq=args.seq,
                        repeats=args.repeats)
    with tempfile.TemporaryDirectory(prefix="torch_tpu_cpu_dots_") as cache:
        env = dict(os.environ, TORCH_TPU_CPU_DOT_PIECE_MB=piece, TORCH_TPU_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=args.timeout)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"the child with pieces of {piece} MiB failed:\n{out.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-1b", help="a preset of benchmarks/scale.py")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    load0 = os.getloadavg()
    runs: dict = {"0": [], "16": []}
    for i in range(args.pairs):
        for piece in (("0", "16") if i % 2 == 0 else ("16", "0")):
            runs[piece].append(run(piece, args))
    load1 = os.getloadavg()
    print(f"{args.model}, {args.layers} layers, {args.seq} tokens, bfloat16, tpu eager; "
          f"{os.cpu_count()} cores, load {load0[0]:.1f} at start, {load1[0]:.1f} at end")
    print("| call | whole (pieces off), s | pieces (default), s | whole / pieces | loss |")
    print("|---|---|---|---|---|")
    for name in runs["0"][0]:
        off = [r[name][0] for r in runs["0"]]
        on = [r[name][0] for r in runs["16"]]
        losses = {round(r[name][1], 4) for r in runs["0"] + runs["16"]}
        print(f"| {name} | {', '.join(f'{t:.2f}' for t in off)} | "
              f"{', '.join(f'{t:.2f}' for t in on)} | "
              f"{statistics.median(off) / statistics.median(on):.2f}x | "
              f"{', '.join(str(x) for x in sorted(losses))} |")


if __name__ == "__main__":
    main()
