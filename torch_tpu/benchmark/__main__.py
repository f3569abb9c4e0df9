"""`python -m torch_tpu.benchmark`: time named models or scripts on the tpu device.

    python -m torch_tpu.benchmark --list
    python -m torch_tpu.benchmark mlp mlp-train --iters 50
    python -m torch_tpu.benchmark llama --batch-size 4 --compile
    python -m torch_tpu.benchmark path/to/train.py
    python -m torch_tpu.benchmark mlp --json results.json

Shows a progress bar per model on stderr and prints a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from . import benchmark, format_table, get_case, models


class ProgressBar:
    """A one-line text progress bar on a stream (no dependencies)."""

    def __init__(self, name, warmup, iters, stream=None, width=24, enabled=True):
        self.name = name
        self.total = warmup + iters
        self.warmup = warmup
        self.stream = stream or sys.stderr
        self.width = width
        self.enabled = enabled
        self.done = 0
        self._last = 0.0

    def __call__(self, phase, i, n, seconds):
        self.done = i if phase == "warmup" else self.warmup + i
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.done < self.total and now - self._last < 0.05:
            return
        self._last = now
        filled = int(self.width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.name:<16} [{bar}] {self.done}/{self.total} "
                          f"{phase:<6} {seconds * 1e3:9.3f} ms")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.benchmark",
                                description="Time models or scripts on the tpu device.")
    p.add_argument("targets", nargs="*", help="registered model names or script paths")
    p.add_argument("--list", action="store_true", help="list the available models")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--device", default="tpu")
    p.add_argument("--compile", action="store_true",
                   help='wrap the callable in torch.compile(backend="tpu")')
    p.add_argument("--sync", default="auto", choices=("auto", "outputs", "device", "none"))
    p.add_argument("--no-flops", action="store_true", help="skip the FLOP count")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)

    if args.list or not args.targets:
        avail = models()
        width = max((len(n) for n in avail), default=4)
        print("available models:")
        for name, desc in avail.items():
            print(f"  {name:<{width}}  {desc}")
        print("or a path to a Python script (see torch_tpu.benchmark.models)")
        return 0 if args.list else 2

    results = []
    for target in args.targets:
        try:
            case = get_case(target, device=args.device, batch_size=args.batch_size)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        fn = case.fn
        if args.compile:
            fn = torch.compile(fn, backend="tpu")
        bar = ProgressBar(case.name, args.warmup, args.iters,
                          enabled=not args.no_progress)
        try:
            res = benchmark(fn, *case.args, warmup=args.warmup, iters=args.iters,
                            flops=None if args.no_flops else case.flops,
                            sync=args.sync, name=case.name + (" (compiled)" if args.compile else ""),
                            progress=bar, **case.kwargs)
        finally:
            bar.close()
        results.append(res)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.as_dict() for r in results], f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
