"""Compiles and the disk tier's writes are safe together (runtime/xla_lock.py).

A worker died with SIGSEGV in JAX's persistent-cache write (serializing an
executable) while another thread was compiling. Compiles now share a lock
that each serialization takes exclusively, and the disk tier writes every
entry itself, after the compile, under that lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from torch_tpu.runtime import xla_lock


def test_serializing_waits_for_compiles_and_keeps_new_ones_out():
    order = []
    in_compile = threading.Event()
    release = threading.Event()

    def compile_a():
        with xla_lock.compiling():
            in_compile.set()
            release.wait(10)
            order.append("compile a done")

    def serialize():
        with xla_lock.serializing():
            order.append("serialize")

    def compile_b():
        with xla_lock.compiling():
            order.append("compile b")

    a = threading.Thread(target=compile_a)
    a.start()
    assert in_compile.wait(10)
    s = threading.Thread(target=serialize)
    s.start()
    while xla_lock.state()["waiting"] == 0:  # the writer is queued behind compile a
        time.sleep(0.001)
    b = threading.Thread(target=compile_b)
    b.start()
    time.sleep(0.05)
    assert order == []  # b waits behind the queued writer, the writer behind a
    release.set()
    for t in (a, s, b):
        t.join(10)
    assert order == ["compile a done", "serialize", "compile b"]
    assert xla_lock.state() == {"compiling": 0, "serializing": False, "waiting": 0}


def test_compiling_is_reentrant_and_a_serialization_inside_it_is_refused():
    with xla_lock.compiling():
        with xla_lock.compiling():
            assert xla_lock.state()["compiling"] == 1
        with pytest.raises(RuntimeError, match="inside a compile"):
            with xla_lock.serializing():
                pass
    assert xla_lock.state()["compiling"] == 0


def test_the_tier_writes_each_entry_outside_every_compile(tmp_path):
    """JAX's own write (inside the compile call) is off; the tier's write runs
    with no compile in flight, and the entry serves a new process."""
    script = textwrap.dedent("""
        import json, torch, torch_tpu
        from torch_tpu.runtime import xla_lock
        import torch_tpu.cache as cache
        import contextlib
        seen = []
        original = xla_lock.serializing
        @contextlib.contextmanager
        def watched():
            with original():
                seen.append(xla_lock.state()["compiling"])  # compiles in flight now
                yield
        xla_lock.serializing = watched
        x = torch.arange(12.0).reshape(3, 4).to("tpu")
        disk = cache.stats()["disk"]
        print(json.dumps({"value": float((x.cos() * 3 + x.T.sum()).sum()),
                          "writes": disk["writes"], "hits": disk["hits"],
                          "serialized": len(seen), "inside": sum(1 for n in seen if n)}))
    """)
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["writes"] > 0 and cold["serialized"] >= cold["writes"]
    assert cold["inside"] == 0
    assert warm["hits"] > 0 and warm["writes"] == 0
    assert cold["value"] == warm["value"]


_STRESS = """
import sys, torch, torch_tpu
import torch.nn.functional as F
seed = int(sys.argv[1])
g = torch.Generator().manual_seed(seed)
total = 0.0
for i in range(int(sys.argv[2])):
    n = 3 + (i * 7 + seed) % 41
    m = 2 + (i * 5) % 11
    w = torch.randn(n + 3, m, generator=g, dtype=torch.float64).to("tpu")
    idx = torch.randint(0, n + 3, (n,), generator=g).to("tpu")
    off = torch.tensor([0, n // 2]).to("tpu")
    y = F.embedding_bag(idx, w, off, mode=("sum", "mean", "max")[i % 3])
    x = torch.randn(n, m, generator=g).to("tpu")
    z = (x.sin() * (i + 1)).cumsum(0).sort(0).values @ x.T.cos()
    total += float(y.sum()) + float(z.mean())
print("ok", seed, round(total, 3))
"""


def test_two_processes_compile_and_write_one_directory_at_once(tmp_path):
    """Many distinct programs compiled on the compile threads, with the disk
    tier on, by two processes sharing one directory at the same time: no
    crash, and a second round on the filled directory gives the same values."""
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"),
               TORCH_TPU_COMPILE_THREADS="4")
    script = tmp_path / "stress.py"
    script.write_text(_STRESS)
    outputs = []
    for _ in range(2):  # cold (both writing), then warm (both reading)
        procs = [subprocess.Popen([sys.executable, str(script), str(seed), "24"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for seed in (1, 2)]
        round_out = []
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-3000:]}"
            round_out.append(out.strip().splitlines()[-1])
        outputs.append(round_out)
    assert outputs[0] == outputs[1]
