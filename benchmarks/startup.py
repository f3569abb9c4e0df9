"""Start-up cost of torch_tpu, measured as whole processes, side by side in one run.

Each number is the median of several fresh interpreters (`--runs`, default 5;
every sample is listed too), with the machine's load average printed before
and after, because on a shared machine the load moves every number:

- `import torch` with the torch_tpu autoload on vs off
  (`TORCH_DEVICE_BACKEND_AUTOLOAD=0`): CPU seconds of the process (user +
  system, from wait4) and wall seconds; the ratio on/off is judged against
  the target 1.3. On and off runs alternate, so a change of load hits both.
- `import torch_tpu` (autoload off, so the package import is what is timed),
  and the first `tpu` op: `torch.ones(2, device="tpu") + 1` read back, timed
  inside a process that has done `import torch` (backend load, JAX start,
  two executables) with a warm cache.
- The tiny Llama's first eager step (`examples/llama/train.py --device tpu`,
  the `first step` of its summary line) and its whole process, cold (a fresh
  empty TORCH_TPU_CACHE_DIR) then warm (the same directory, a new process).
- Each guide notebook (`guide/notebooks/*.py`, run as a script: what marimo
  runs), cold then warm in the same way; targets < 60 s cold, < 20 s warm
  (on 2 idle cores: on a loaded machine the wall time is inflated, and the
  process CPU seconds printed beside it are the steadier number).

    python benchmarks/startup.py                          # everything (long: notebooks)
    python benchmarks/startup.py --quick                  # 3 runs, imports + first op + llama
    python benchmarks/startup.py --only import,first-op --runs 7
    python benchmarks/startup.py --only notebooks --notebooks 01,04 --runs 1
    python benchmarks/startup.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "guide" / "notebooks").glob("[0-9][0-9]_*.py"))
SECTIONS = ("import", "torch_tpu", "first-op", "llama", "notebooks")
IMPORT_TARGET = 1.3
NOTEBOOK_TARGETS = {"cold": 60.0, "warm": 20.0}

_FIRST_OP = """
import resource, time, torch
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t, c = time.perf_counter(), cpu()
x = (torch.ones(2, device="tpu") + 1).cpu()
assert x.tolist() == [2.0, 2.0]
print("FIRST_OP", time.perf_counter() - t, cpu() - c)
"""


def load() -> str:
    """`uptime`'s load averages (1, 5, 15 min) and the CPU count."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


class Run:
    """One whole process: wall seconds, CPU seconds (user + sys), output."""

    def __init__(self, argv, env=None, timeout=900.0):
        full_env = {**os.environ, **(env or {})}
        for k, v in (env or {}).items():
            if v is None:
                full_env.pop(k, None)
        with tempfile.TemporaryFile("w+") as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                    cwd=ROOT)
            deadline = t0 + timeout
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.02)
            self.wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.rc = proc.returncode
            self.cpu = usage.ru_utime + usage.ru_stime
            out.seek(0)
            self.output = out.read()
        if self.rc != 0:
            tail = "\n".join(self.output.splitlines()[-15:])
            raise RuntimeError(f"{' '.join(map(str, argv))} exited with {self.rc}:\n{tail}")

    def value(self, pattern: str) -> float:
        m = re.search(pattern, self.output)
        if m is None:
            raise RuntimeError(f"no {pattern!r} in the output:\n{self.output[-2000:]}")
        return float(m.group(1))


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(xs, unit="s"):
    return f"{median(xs):7.2f} {unit}  [{', '.join(f'{x:.2f}' for x in xs)}]"


def python(*args):
    return [sys.executable, *args]


def bench_import(runs, results):
    print("\n== import torch: CPU seconds of the whole process, autoload on vs off")
    on, off = {"cpu": [], "wall": []}, {"cpu": [], "wall": []}
    for _ in range(runs):  # alternate, so a change of load hits both
        for store, flag in ((on, "1"), (off, "0")):
            r = Run(python("-c", "import torch"), {"TORCH_DEVICE_BACKEND_AUTOLOAD": flag})
            store["cpu"].append(r.cpu)
            store["wall"].append(r.wall)
    ratio = median(on["cpu"]) / median(off["cpu"])
    print(f"  autoload on   cpu {fmt(on['cpu'])}   wall {median(on['wall']):.2f} s")
    print(f"  autoload off  cpu {fmt(off['cpu'])}   wall {median(off['wall']):.2f} s")
    verdict = "meets" if ratio <= IMPORT_TARGET else "MISSES"
    print(f"  ratio on/off (CPU): {ratio:.2f}x  ({verdict} the target <= {IMPORT_TARGET}x)")
    results["import_torch"] = {"on": on, "off": off, "ratio_cpu": ratio,
                               "target": IMPORT_TARGET}


def bench_torch_tpu(runs, results):
    print("\n== import torch_tpu (autoload off: the package import itself), and with the "
          "backend loaded (torch_tpu._load())")
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    plain, loaded = {"cpu": [], "wall": []}, {"cpu": [], "wall": []}
    for _ in range(runs):
        for store, code in ((plain, "import torch_tpu"),
                            (loaded, "import torch_tpu; torch_tpu._load()")):
            r = Run(python("-c", code), env)
            store["cpu"].append(r.cpu)
            store["wall"].append(r.wall)
    print(f"  import torch_tpu           cpu {fmt(plain['cpu'])}   wall "
          f"{median(plain['wall']):.2f} s")
    print(f"  import torch_tpu + _load() cpu {fmt(loaded['cpu'])}   wall "
          f"{median(loaded['wall']):.2f} s")
    results["import_torch_tpu"] = {"plain": plain, "loaded": loaded}


def bench_first_op(runs, results):
    print("\n== first tpu op after `import torch` (ones + add + read back, in-process wall; "
          "loads the backend)")
    out = {}
    for kind in ("cold", "warm"):
        out[kind] = {"op": [], "op_cpu": [], "cpu": []}
    for _ in range(runs):
        d = tempfile.mkdtemp(prefix="torch_tpu-startup-")
        try:
            for kind in ("cold", "warm"):
                r = Run(python("-c", _FIRST_OP), {"TORCH_TPU_CACHE_DIR": d})
                out[kind]["op"].append(r.value(r"FIRST_OP ([\d.]+)"))
                out[kind]["op_cpu"].append(r.value(r"FIRST_OP [\d.]+ ([\d.]+)"))
                out[kind]["cpu"].append(r.cpu)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    for kind in ("cold", "warm"):
        print(f"  {kind}: first op wall {fmt(out[kind]['op'])}   its cpu "
              f"{median(out[kind]['op_cpu']):.2f} s   process cpu "
              f"{median(out[kind]['cpu']):.2f} s")
    results["first_op"] = out


def bench_llama(runs, steps, results):
    print(f"\n== tiny Llama, first eager step (examples/llama/train.py --device tpu "
          f"--steps {steps}); cold = fresh cache dir, warm = same dir, new process")
    out = {k: {"first_step": [], "wall": [], "cpu": []} for k in ("cold", "warm")}
    argv = python("examples/llama/train.py", "--device", "tpu", "--steps", str(steps),
                  "--no-progress")
    for _ in range(runs):
        d = tempfile.mkdtemp(prefix="torch_tpu-startup-")
        try:
            for kind in ("cold", "warm"):
                r = Run(argv, {"TORCH_TPU_CACHE_DIR": d})
                out[kind]["first_step"].append(r.value(r"first step ([\d.]+) s"))
                out[kind]["wall"].append(r.wall)
                out[kind]["cpu"].append(r.cpu)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    for kind in ("cold", "warm"):
        o = out[kind]
        print(f"  {kind}: first step {fmt(o['first_step'])}   process wall "
              f"{median(o['wall']):.2f} s, cpu {median(o['cpu']):.2f} s")
    results["llama"] = out


def bench_notebooks(runs, selected, results):
    print("\n== guide notebooks run as scripts (process wall); cold = fresh cache dir, "
          f"warm = same dir; targets < {NOTEBOOK_TARGETS['cold']:.0f} s cold, "
          f"< {NOTEBOOK_TARGETS['warm']:.0f} s warm")
    out = {}
    for nb in selected:
        o = out[nb.stem] = {k: {"wall": [], "cpu": []} for k in ("cold", "warm")}
        for _ in range(runs):
            d = tempfile.mkdtemp(prefix="torch_tpu-startup-")
            try:
                for kind in ("cold", "warm"):
                    r = Run(python(str(nb.relative_to(ROOT))), {"TORCH_TPU_CACHE_DIR": d})
                    o[kind]["wall"].append(r.wall)
                    o[kind]["cpu"].append(r.cpu)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        verdict = " ".join(
            f"{k} {'ok' if median(o[k]['wall']) < NOTEBOOK_TARGETS[k] else 'OVER'}"
            for k in ("cold", "warm"))
        print(f"  {nb.stem:28s} cold {fmt(o['cold']['wall'])} cpu {median(o['cold']['cpu']):.2f} s"
              f"   warm {fmt(o['warm']['wall'])} cpu {median(o['warm']['cpu']):.2f} s"
              f"   ({verdict})", flush=True)
    results["notebooks"] = out


def select_notebooks(spec):
    if not spec:
        return NOTEBOOKS
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    chosen = [nb for nb in NOTEBOOKS if any(nb.stem.startswith(w) for w in wanted)]
    missing = [w for w in wanted if not any(nb.stem.startswith(w) for nb in NOTEBOOKS)]
    if missing:
        raise SystemExit(f"no notebook matches {', '.join(missing)} "
                         f"(have: {', '.join(nb.stem for nb in NOTEBOOKS)})")
    return chosen


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Start-up cost of torch_tpu as whole processes (median of --runs each).")
    p.add_argument("--runs", type=int, default=None,
                   help="processes per measurement (default 5; --quick: 3)")
    p.add_argument("--quick", action="store_true",
                   help="3 runs each, and no notebooks unless --only names them")
    p.add_argument("--only", default=None,
                   help=f"comma-separated sections: {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--notebooks", default=None,
                   help="comma-separated notebook prefixes, e.g. 01,04 (default: all)")
    p.add_argument("--notebook-runs", type=int, default=None,
                   help="cold/warm pairs per notebook (default: --runs)")
    p.add_argument("--llama-steps", type=int, default=2,
                   help="training steps of the Llama runs (default 2; the first is timed)")
    p.add_argument("--json", type=Path, default=None, help="also write the samples as JSON")
    args = p.parse_args(argv)

    runs = args.runs or (3 if args.quick else 5)
    if args.only:
        sections = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            p.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    else:
        sections = [s for s in SECTIONS if not (args.quick and s == "notebooks")]
    notebooks = select_notebooks(args.notebooks) if "notebooks" in sections else []

    results = {"runs": runs, "python": sys.version.split()[0], "cpus": os.cpu_count(),
               "load_before": os.getloadavg()}
    print(f"torch_tpu start-up benchmark: median of {runs} processes each; {load()}")
    t0 = time.perf_counter()
    if "import" in sections:
        bench_import(runs, results)
    if "torch_tpu" in sections:
        bench_torch_tpu(runs, results)
    if "first-op" in sections:
        bench_first_op(runs, results)
    if "llama" in sections:
        bench_llama(runs, args.llama_steps, results)
    if notebooks:
        bench_notebooks(args.notebook_runs or runs, notebooks, results)
    results["load_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - t0
    print(f"\ndone in {results['seconds']:.0f} s; {load()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
