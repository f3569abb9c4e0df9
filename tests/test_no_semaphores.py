"""torch_tpu makes no multiprocessing semaphores that could leak.

`marimo edit`, stopped by SIGTERM, prints "resource_tracker: There appear to
be 12 leaked semaphore objects to clean up at shutdown": those are marimo's
own kernel queues (docs/troubleshooting.md). This checks that nothing of
torch_tpu adds to them: in a fresh process, the guide's imports, eager ops,
background compiles, zero-fill programs, the disk tier and `torch.compile`
never register a semaphore with multiprocessing's resource tracker (the
tracker, started by the first registration, is never started).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import multiprocessing.resource_tracker as rt
    import torch, torch_tpu, torch_tpu.cache, torch_tpu.debug
    from torch_tpu.runtime import programs

    x = torch.randn(8, 8, device="tpu")
    (x @ x).relu().sum().item()
    torch.empty(5, 7, device="tpu")                          # a zero-fill program
    f = torch.compile(lambda a: (a * 2).sin().sum(), backend="tpu")
    f(x).item()
    with torch_tpu.debug.capture(sync=True):
        (x + 1).cpu()
    programs.settle()
    print("TRACKER", rt._resource_tracker._pid)
""")


def test_torch_tpu_registers_no_semaphores(tmp_path):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TRACKER None" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "leaked semaphore" not in out.stderr
