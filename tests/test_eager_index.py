"""The eager index (torch_tpu.cache.eager): eager ops run without being lowered again.

In one process (the memory tier dropped, as a new process has none): an op's
program comes back from the index, not lowered, with the same values; an
index entry whose executable was evicted, a damaged entry and the switch
each make the op lowered again, with the same values. Across processes (the
second run): a cold then a warm training process on one directory, where
the warm one lowers none of the executor's programs, gives bitwise the same
losses and parameters, runs the loaded programs in the native kernel, and
its debug tools still show the lowered program.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu  # noqa: F401
import torch_tpu.cache as cache
from torch_tpu.cache import eager
from torch_tpu.cache import store as store_mod
from torch_tpu.runtime import executor, programs


def _index_entries(path):
    """The eager index's files (their header key carries its prefix)."""
    out = []
    d = path / store_mod.SUBDIR
    for f in sorted(d.glob("*" + store_mod.SUFFIX)) if d.exists() else []:
        blob = f.read_bytes()
        (hlen,) = store_mod.struct.unpack(">I", blob[8:12])
        if json.loads(blob[12:12 + hlen])["key"].startswith(eager.PREFIX):
            out.append(f)
    return out


def _lowered_ops(monkeypatch):
    """The names of the executor programs lowered from now on."""
    seen: list = []
    monkeypatch.setattr(programs, "LOWERED_LISTENERS",
                        programs.LOWERED_LISTENERS + [lambda name, key, lowered: seen.append(name)])
    return seen


def _op(a, b):
    # Shapes no other test uses: a true miss of every tier at first.
    return ((a * 1.375 + b).tanh() @ b.t()).sum(0)


def _run_fresh(a, b):
    executor.clear_cache()  # the memory tier, as in a new process
    return _op(a, b).cpu()


@pytest.fixture
def ab():
    g = torch.Generator().manual_seed(7)
    return torch.randn(6, 11, generator=g).to("tpu"), torch.randn(6, 11, generator=g).to("tpu")


def test_an_op_comes_back_from_the_index(cache_dir, ab, monkeypatch):
    a, b = ab
    ref = _op(a.cpu(), b.cpu())
    s0 = eager.stats()
    cold = _run_fresh(a, b)
    torch.testing.assert_close(cold, ref)
    s1 = eager.stats()
    assert s1["writes"] >= s0["writes"] + 4  # mul, add, tanh, mm, sum (t() is a view)
    assert len(_index_entries(cache_dir)) == s1["writes"] - s0["writes"]
    lowered = _lowered_ops(monkeypatch)
    warm = _run_fresh(a, b)
    s2 = eager.stats()
    assert lowered == [] and s2["hits"] - s1["hits"] == s1["writes"] - s0["writes"]
    assert torch.equal(warm, cold)
    assert cache.stats()["eager_index"]["hits"] == s2["hits"]


def test_evicted_executable_is_lowered_again(cache_dir, ab, monkeypatch):
    a, b = ab
    cold = _run_fresh(a, b)
    index = set(_index_entries(cache_dir))
    for f in (cache_dir / store_mod.SUBDIR).glob("*" + store_mod.SUFFIX):
        if f not in index:
            f.unlink()  # the executables; their index entries stay
    misses = eager.stats()["misses"]
    lowered = _lowered_ops(monkeypatch)
    assert torch.equal(_run_fresh(a, b), cold)
    assert eager.stats()["misses"] - misses == len(index) and len(lowered) == len(index)


def test_damaged_index_entry_is_a_miss(cache_dir, ab, monkeypatch):
    a, b = ab
    cold = _run_fresh(a, b)
    keys = _keys_seen(a, b)
    assert keys
    for k in keys:  # sound files (checksums match) holding no usable entry
        cache.disk_store().put(k, b'{"jax_key": 3, "meta": []}', count=False)
    lowered = _lowered_ops(monkeypatch)
    assert torch.equal(_run_fresh(a, b), cold)
    assert len(lowered) == len(keys)


def _keys_seen(a, b):
    """The index keys of _op's programs (computed as the executor does)."""
    keys = []
    real = eager.key_for

    def spy(key, device=None):
        k = real(key, device)
        if k is not None:
            keys.append(k)
        return k

    eager.key_for = spy
    try:
        _run_fresh(a, b)
    finally:
        eager.key_for = real
    return keys


def test_switched_off(cache_dir, ab, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EAGER_INDEX", "0")
    a, b = ab
    cold = _run_fresh(a, b)
    lowered = _lowered_ops(monkeypatch)
    assert torch.equal(_run_fresh(a, b), cold)
    assert lowered and _index_entries(cache_dir) == []


def test_key_parts_without_a_stable_text_are_not_indexed():
    key = (torch.ops.aten.add.Tensor, ((2, 3), torch.float32), 0, 0, torch.float32, "highest", 3)
    k = eager.key_for(key)
    assert k is not None and k.startswith(eager.PREFIX) and eager.key_for(key) == k
    assert eager.key_for(key[:-1] + (2,)) != k  # another optimization level
    assert eager.key_for(key[:2] + (0.5,) + key[3:]) != eager.key_for(key[:2] + (0.25,) + key[3:])
    assert eager.key_for(key + (object(),)) is None



def test_a_new_process_prefetches_what_the_last_one_asked_for(cache_dir, ab, monkeypatch):
    """The sequence of lookups is stored under the first ones; a new process
    (reset) whose first lookups match loads the rest ahead of the ops, which
    take them from memory: nothing lowered, the same values. A damaged
    sequence entry prefetches nothing and changes nothing."""
    from torch_tpu.cache import prefetch

    a, b = ab
    prefetch.reset()
    cold = _run_fresh(a, b)
    recorded = prefetch.stats()["recorded"]
    assert recorded >= prefetch.HEAD + 2 and prefetch.stats()["listed"] == 0
    prefetch.flush()

    prefetch.reset()  # a new process
    lowered = _lowered_ops(monkeypatch)
    s0 = cache.stats()
    warm = _run_fresh(a, b)
    s1 = cache.stats()
    st = prefetch.stats()
    assert lowered == [] and torch.equal(warm, cold)
    assert st["listed"] == recorded - prefetch.HEAD, st  # all but those that started it
    assert st["used"] == st["listed"], st
    # A prefetched program is loaded from disk (read on a prefetch thread):
    # counted so, each once, not as a program the disk tier cannot hold.
    by0, by1 = s0["compile_seconds_by_source"], s1["compile_seconds_by_source"]
    assert by1["uncached"]["count"] == by0["uncached"]["count"], (by0, by1)
    index_hits = s1["eager_index"]["hits"] - s0["eager_index"]["hits"]
    assert index_hits >= st["used"] + prefetch.HEAD
    assert s1["memory"]["disk_loads"] - s0["memory"]["disk_loads"] >= index_hits
    assert by1["disk"]["count"] - by0["disk"]["count"] >= index_hits

    # The same order again: the stored sequence is not rewritten.
    key = prefetch._seq_key(prefetch._S.seq)
    before = cache.disk_store().get(key, count=False)
    prefetch.flush()
    assert cache.disk_store().get(key, count=False) == before

    cache.disk_store().put(key, b'{"keys": [["x", "not an id"]', count=False)
    prefetch.reset()
    warm2 = _run_fresh(a, b)
    assert torch.equal(warm2, cold) and prefetch.stats()["listed"] == 0
    assert lowered == []
    prefetch.reset()


_CHILD = textwrap.dedent(r"""
    import hashlib, json
    import torch
    import torch.nn.functional as F
    import torch_tpu
    import torch_tpu.cache as cache
    import torch_tpu.debug as dbg
    from torch_tpu.runtime import fastpath, programs

    lowered = []
    programs.LOWERED_LISTENERS.append(lambda name, key, low: lowered.append(name))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(),
                                torch.nn.Linear(24, 3)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(10, 12).to("tpu"), torch.randn(10, 3).to("tpu")
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    extra = (x[2:7].t().contiguous() * 2.5).softmax(-1).cumsum(0)
    (x * y.sum()).cpu()  # compiled (cold) or loaded (warm), and done
    calls = fastpath.NATIVE.calls()["kernel"] if fastpath.KERNEL else None
    for _ in range(5):
        z = x * y.sum()
    calls = fastpath.NATIVE.calls()["kernel"] - calls if fastpath.KERNEL else None
    # every addmm program by its key (stable across processes): the cold
    # process compiles them on threads, so their order in the log may vary
    adds = {e.key_hash: e for e in dbg.compile_log(kind="op") if e.name == "aten.addmm.default"}
    print(json.dumps({
        "losses": losses, "w": [p.detach().cpu().tolist() for p in model.parameters()],
        "extra": extra.cpu().tolist(), "z": z.cpu().tolist(), "lowered": lowered,
        "index": cache.stats()["eager_index"], "kernel_calls": calls,
        "addmm": {k: {"tier": e.tier,
                      "stablehlo": hashlib.sha256(e.program.stablehlo.encode()).hexdigest(),
                      "flops": e.program.cost["flops"]} for k, e in sorted(adds.items())}}))
""")


def _child(root):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(root))
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_lowers_no_eager_op(tmp_path):
    root = tmp_path / "eager-index"
    cold = _child(root)
    warm = _child(root)
    assert cold["index"]["hits"] == 0 and cold["index"]["writes"] >= 20, cold["index"]
    # Every program the cold run indexed comes back; only what it could not
    # index (skipped) and the helper programs (copies, casts) are lowered.
    assert warm["index"]["hits"] == cold["index"]["writes"], (cold["index"], warm["index"])
    assert warm["index"]["misses"] == cold["index"]["skipped"] and warm["index"]["writes"] == 0
    assert len(warm["lowered"]) <= len(cold["lowered"]) - cold["index"]["writes"], warm["lowered"]
    assert not any(n.startswith("aten.") for n in warm["lowered"]), warm["lowered"]
    for k in ("losses", "w", "extra", "z"):
        assert warm[k] == cold[k], k  # bitwise: the same executables
    if cold["kernel_calls"] is not None:
        assert warm["kernel_calls"] == cold["kernel_calls"] == 10  # sum, mul: in the C++ kernel
    # The debug tools lower a loaded program on demand: the same StableHLO.
    assert len(cold["addmm"]) == 2 and warm["addmm"].keys() == cold["addmm"].keys()
    for k, c in cold["addmm"].items():
        w = warm["addmm"][k]
        assert c["tier"] == "compile" and w["tier"] == "disk", (c, w)
        assert w["stablehlo"] == c["stablehlo"], k
        assert w["flops"] == c["flops"] > 0, k
    # The warm process loaded its programs ahead of the ops (cache.prefetch),
    # in the order the cold one asked for them.
    pre = warm["index"]["prefetch"]
    assert cold["index"]["prefetch"]["listed"] == 0
    assert pre["listed"] >= cold["index"]["writes"] - 3 and pre["used"] >= pre["listed"] // 2, pre



def test_a_forked_child_never_waits_for_its_parents_prefetch():
    """A load in flight at a fork never finishes in the child: the child starts
    with nothing prefetched, and its ops load their programs themselves."""
    import time
    import warnings
    from concurrent.futures import Future

    from torch_tpu.cache import prefetch

    prefetch.reset()
    running = Future()
    assert running.set_running_or_notify_cancel()
    prefetch._S.futures["k"] = running
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns that fork() and threads do not mix
        pid = os.fork()
    if pid == 0:
        os._exit(0 if prefetch.take("k") is None and not prefetch._S.futures else 1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the forked child waited for its parent's prefetch")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    running.set_result(None)
    prefetch.reset()
