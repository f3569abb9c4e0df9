"""The program cache (torch_tpu.runtime.programs): one LRU for every compiled program.

Eager ops, view reads, copies, casts and the other helper programs share the
in-memory tier (bounded by count and bytes), its statistics and listeners;
the disk tier plugs in through a declared hook. Cold and warm: a second
process on the first one's cache directory loads the helper programs from
disk.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import executor, opt_level, programs


def _key(tag):
    return (programs.ProgramKind.CAST, "test_programs", tag, opt_level.level())


def test_get_or_compile_caches_in_the_lru():
    arr = jnp.arange(4.0)
    key = _key(1)
    before = programs.memory_stats()
    fn = programs.get_or_compile(key, lambda a: a * 2, (arr,))
    mid = programs.memory_stats()
    again = programs.get_or_compile(key, lambda a: a * 3, (arr,))  # a hit: not recompiled
    after = programs.memory_stats()
    assert again is fn and key in programs.CACHE
    np.testing.assert_array_equal(np.asarray(again(arr)), [0.0, 2.0, 4.0, 6.0])
    assert mid["misses"] == before["misses"] + 1
    assert after["hits"] == mid["hits"] + 1 and after["misses"] == mid["misses"]
    assert programs.STATS.compiles_per_op["convert"] >= 1  # named after the kind


def test_helper_programs_share_the_lru_and_its_bound(monkeypatch):
    """View reads and dtype casts are entries of the one LRU: the count bound evicts them."""
    programs.clear()
    x = torch.arange(24.0, device="tpu").reshape(4, 6)
    x[:, 1:3].cpu()                     # a view read
    x.to(torch.float16).cpu()           # a cast
    (x + 1).cpu()                       # an eager op
    kinds = {k[0] for k in programs.CACHE}
    assert {programs.ProgramKind.ARANGE, programs.ProgramKind.VIEW_READ,
            programs.ProgramKind.CAST} <= kinds
    assert any(isinstance(k[0], torch._ops.OpOverload) for k in programs.CACHE)
    monkeypatch.setenv("TORCH_TPU_CACHE_SIZE", "2")
    ev = programs.STATS.evictions
    for n in range(3):
        programs.get_or_compile(_key(("bound", n)), lambda a: a + 1, (jnp.zeros(3),))
    assert len(programs.CACHE) == 2 and programs.STATS.evictions - ev >= 1
    assert set(programs.ENTRY_BYTES) == set(programs.CACHE)
    assert programs.BYTES[0] == sum(programs.ENTRY_BYTES.values())
    assert torch_tpu.cache.stats()["memory"]["entries"] >= 2


def test_executor_names_are_the_program_cache():
    # The executor's names for the cache are the same objects (the native
    # kernel is handed programs.CACHE itself at setup_kernel).
    assert executor.STATS is programs.STATS and executor.__dict__["_CACHE"] is programs.CACHE
    assert executor.COMPILE_LISTENERS is programs.COMPILE_LISTENERS


def test_no_private_names_of_the_executor_or_program_cache_outside_them():
    """The executor's and the program cache's surface is public: no module
    reaches into their underscore names (issue 36), nor into those of the
    modules split out of the executor (issue 52: keys, key_decode, overlap)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    owners = ("executor", "programs", "keys", "key_decode", "overlap")
    pattern = re.compile(rf"\b({'|'.join(owners)})\._[A-Za-z]")
    offenders = []
    for d in ("torch_tpu", "tests", "tools", "benchmarks", "examples", "guide"):
        for f in sorted((root / d).rglob("*.py")):
            if f.parent.name == "runtime" and f.stem in owners:
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if pattern.search(line) and "pattern = re.compile" not in line:
                    offenders.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_eager_key_parts_are_named():
    programs.clear()
    a = torch.ones(3, device="tpu")
    a.add(2.5)
    torch.rand(2, device="tpu")
    keys = {str(k[0]): k for k in programs.CACHE if not isinstance(k[0], programs.ProgramKind)}
    add = programs.eager_key(keys["aten.add.Tensor"])
    assert add.device == 0 and add.default_dtype == torch.get_default_dtype()
    assert add.opt_level == opt_level.level() and add.rng is False
    assert add.args[0] == ((3,), torch.float32)  # the storage's signature
    rand = programs.eager_key(next(k for n, k in keys.items() if n.startswith("aten.rand")))
    assert rand.rng is True and programs.KeyTag.RNG not in rand.args
    assert programs.key_name(keys["aten.add.Tensor"]) == "aten.add.Tensor"


def test_disk_tier_is_a_declared_hook():
    import torch_tpu.cache as cache

    tier = programs.disk_tier()
    assert isinstance(tier, cache._Tier)
    seen = []

    class Spy:
        def begin(self):
            return tier.begin()

        def end(self, token, name, seconds, trace_seconds, compiled=None):
            seen.append(name)
            return tier.end(token, name, seconds, trace_seconds)

    # Compiles an earlier test left in the background would end inside the
    # window and reach the spy (CI saw aten.rand.default's).
    programs.settle()
    programs.set_disk_tier(Spy())
    try:
        programs.compile("spy_program", None, lambda a: a - 1, (jnp.zeros(5),))
    finally:
        programs.set_disk_tier(tier)
    assert seen == ["spy_program"]


def test_compile_hooks_wrap_hooked_compile_only():
    calls = []

    def hook(inner):
        def wrapped(name, key, fn, args, **kw):
            calls.append(name)
            return inner(name, key, fn, args, **kw)
        return wrapped

    saved = list(programs.COMPILE_HOOKS)
    try:
        programs.add_compile_hook(hook)
        programs.add_compile_hook(hook)  # once
        programs.hooked_compile()("hooked", None, lambda a: a, (jnp.zeros(2),))
        programs.compile("plain", None, lambda a: a, (jnp.zeros(2),))
    finally:
        programs.COMPILE_HOOKS[:] = saved
        programs.HOOKED.clear()
    assert calls == ["hooked"]


_CHILD = """
import json, torch, torch_tpu
from torch_tpu.runtime import programs
x = torch.arange(30.0, device="tpu").reshape(5, 6)
y = x[1:4, ::2].to(torch.float16).cpu()  # a view read and a cast: helper programs
s = torch_tpu.cache.stats()
kinds = sorted({k[0].value for k in programs.CACHE if isinstance(k[0], programs.ProgramKind)})
print(json.dumps({"sum": float(y.float().sum()), "disk": s["disk"], "kinds": kinds}))
"""


def _child(cache_dir):
    env = {**os.environ, "TORCH_TPU_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD)], capture_output=True,
                          text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_helper_programs_cold_then_warm_from_disk(tmp_path):
    cold = _child(tmp_path)
    warm = _child(tmp_path)
    assert cold["sum"] == warm["sum"] == float(torch.arange(30.0).reshape(5, 6)[1:4, ::2].sum())
    assert "view_read" in cold["kinds"]
    assert cold["disk"]["writes"] > 0 and cold["disk"]["hits"] == 0
    assert warm["disk"]["misses"] == 0 and warm["disk"]["hits"] >= cold["disk"]["writes"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
