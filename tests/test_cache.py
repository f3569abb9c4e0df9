"""The compile cache: tiers, statistics, the second process, and every fault."""

import errno
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu  # noqa: F401
import torch_tpu.cache as cache
from torch_tpu.cache import store as store_mod
from torch_tpu.runtime import executor

_counter = [0]


@pytest.fixture
def cache_dir(tmp_path):
    """A private, empty disk tier for one test (the previous one restored after)."""
    s = cache.disk_store()
    old_root, old_max = s.root, s.max_bytes
    store_mod._warned.clear()
    cache.set_dir(str(tmp_path / "cache"))
    yield tmp_path / "cache"
    s.max_bytes = old_max
    s.set_dir(old_root)
    store_mod._warned.clear()


def _program():
    """A program no other test compiles (so the first compile is a true miss)."""
    _counter[0] += 1
    c = float(_counter[0]) + 0.25 + os.getpid() % 1000 * 1e-3
    return (lambda a: jnp.tanh(a * c) + c), c


def _arr(n):
    """Input values made without compiling anything (jnp.arange would)."""
    return jax.device_put(np.arange(n, dtype=np.float32))


def _ones2():
    return jax.device_put(np.ones(2, dtype=np.float32))


def _compile(fn, arr):
    # A fresh function object each time, so that JAX's own in-process caches
    # do not answer: what is not in our memory tier must come from the disk.
    return executor._compile("cache_test", None, lambda a: fn(a), (arr,))


def _entries(path):
    d = path / store_mod.SUBDIR
    return sorted(d.glob("*" + store_mod.SUFFIX)) if d.exists() else []


def _cache_warnings(record):
    return [w for w in record if issubclass(w.category, cache.CacheWarning)]


# -- API -----------------------------------------------------------------------


def test_stats_structure(cache_dir):
    s = cache.stats()
    assert s["requests"] == s["memory"]["hits"] + s["memory"]["misses"]
    for key in ("hits", "misses", "entries", "capacity", "evictions"):
        assert key in s["memory"]
    for key in ("enabled", "dir", "hits", "misses", "writes", "corrupt", "evictions",
                "entries", "bytes", "max_bytes"):
        assert key in s["disk"]
    assert s["disk"]["dir"] == str(cache_dir)
    assert isinstance(s["compile_seconds"], float)
    assert set(s["compile_seconds_by_source"]) == {"compiled", "disk", "uncached"}
    assert isinstance(s["per_entry"], list)


def test_eager_ops_and_graphs_share_the_cache(cache_dir):
    before = cache.stats()
    x = torch.randn(3, 5, device="tpu")
    (x * 3.5 - 1).relu().sum().item()
    after = cache.stats()
    assert after["requests"] > before["requests"]
    assert after["memory"]["hits"] + after["memory"]["misses"] == after["requests"]
    assert after["disk"]["writes"] + after["disk"]["hits"] > 0


def test_disk_tier_round_trip(cache_dir):
    fn, c = _program()
    arr = _arr(6)
    before = cache.stats()["disk"]
    first = _compile(fn, arr)
    mid = cache.stats()["disk"]
    assert mid["misses"] == before["misses"] + 1 and mid["writes"] == before["writes"] + 1
    assert len(_entries(cache_dir)) == 1
    second = _compile(fn, arr)  # the memory tier is bypassed: this reads the disk
    after = cache.stats()
    assert after["disk"]["hits"] == mid["hits"] + 1
    assert after["per_entry"][-1]["source"] == "disk"
    assert after["disk"]["bytes"] > 0
    np.testing.assert_allclose(np.asarray(second(arr)), np.asarray(first(arr)))
    np.testing.assert_allclose(np.asarray(second(arr)), np.tanh(np.arange(6.0) * c) + c,
                               rtol=1e-5)


def test_clear_and_size_cap(cache_dir):
    arr = _arr(4)
    for _ in range(4):
        fn, _ = _program()
        _compile(fn, arr)
    files = _entries(cache_dir)
    assert len(files) == 4
    sizes = sorted(f.stat().st_size for f in files)
    # Keep roughly two entries: the least recently used go first.
    oldest = min(files, key=lambda f: f.stat().st_mtime)
    cache.set_max_bytes(sizes[0] + sizes[1] + 10)
    left = _entries(cache_dir)
    assert 1 <= len(left) <= 2
    assert oldest not in left
    assert cache.stats()["disk"]["evictions"] >= 2
    assert cache.stats()["disk"]["bytes"] <= sizes[0] + sizes[1] + 10
    cache.set_max_bytes(1 << 30)
    assert cache.clear(memory=True, disk=True) == len(left)
    assert _entries(cache_dir) == []
    assert cache.stats()["disk"]["entries"] == 0


def test_disable_enable(cache_dir, monkeypatch):
    cache.disable()
    assert not cache.is_enabled() and cache.cache_dir() is None
    fn, c = _program()
    arr = _arr(3)
    _compile(fn, arr)  # memory only: nothing written, no error
    assert _entries(cache_dir) == []
    cache.enable(str(cache_dir))
    assert cache.is_enabled() and cache.cache_dir() == str(cache_dir)
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", "")
    assert store_mod.configured_dir() is None
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(cache_dir))
    assert store_mod.configured_dir() == str(cache_dir)
    monkeypatch.delenv("TORCH_TPU_CACHE_DIR")
    assert store_mod.configured_dir() == store_mod.default_dir()


def test_key_covers_versions_and_flags(cache_dir, monkeypatch):
    s = cache.disk_store()
    name = s.file_for("some-jax-key")
    assert name == s.file_for("some-jax-key")
    assert name != s.file_for("another-jax-key")
    env = store_mod.environment()
    for field in ("torch_tpu", "jax", "jaxlib", "platform", "device_kind", "device_count",
                  "xla_flags"):
        assert field in env
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    other = store_mod.DiskStore(str(cache_dir))
    assert other.file_for("some-jax-key") != name


# -- faults ------------------------------------------------------------------------


def _damage_and_reload(cache_dir, damage):
    fn, c = _program()
    arr = _arr(5)
    existing = set(_entries(cache_dir))
    _compile(fn, arr)
    (entry,) = set(_entries(cache_dir)) - existing
    damage(entry)
    before = cache.stats()["disk"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = _compile(fn, arr)
    after = cache.stats()["disk"]
    np.testing.assert_allclose(np.asarray(again(arr)), np.tanh(np.arange(5.0) * c) + c,
                               rtol=1e-5)
    assert after["corrupt"] == before["corrupt"] + 1
    assert after["hits"] == before["hits"]
    # Recompiled and rewritten: the entry is sound again.
    assert after["writes"] == before["writes"] + 1
    assert entry.exists()
    _compile(fn, arr)
    assert cache.stats()["disk"]["hits"] == after["hits"] + 1
    return _cache_warnings(record)


def test_corrupted_entry_is_detected(cache_dir):
    def flip(path):
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))

    ws = _damage_and_reload(cache_dir, flip)
    assert len(ws) == 1 and "checksum" in str(ws[0].message)


def test_truncated_entry_is_detected(cache_dir):
    def truncate(path):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])

    ws = _damage_and_reload(cache_dir, truncate)
    assert len(ws) == 1 and "truncated" in str(ws[0].message)


def test_foreign_entry_is_detected(cache_dir):
    def garbage(path):
        path.write_bytes(os.urandom(2000))

    ws = _damage_and_reload(cache_dir, garbage)
    assert len(ws) == 1 and "not a torch_tpu cache entry" in str(ws[0].message)


def test_entry_of_another_program_is_detected(cache_dir):
    other_fn, _ = _program()
    _compile(other_fn, _arr(5))
    (other,) = _entries(cache_dir)
    stolen = other.read_bytes()
    other.unlink()

    def swap(path):
        path.write_bytes(stolen)  # a sound entry, but of a different key

    ws = _damage_and_reload(cache_dir, swap)
    assert len(ws) == 1 and "another program" in str(ws[0].message)


def test_bad_entries_warn_once(cache_dir):
    def flip(path):
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))

    first = _damage_and_reload(cache_dir, flip)
    second = _damage_and_reload(cache_dir, flip)
    assert len(first) == 1 and second == []


def test_unusable_directory_degrades_to_memory(cache_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.set_dir(str(blocker / "cache"))
        cache.set_dir(str(blocker / "cache"))
        fn, c = _program()
        out = _compile(fn, _ones2())
    assert not cache.is_enabled()
    assert "cannot create" in cache.disk_store().info()["status"]
    assert len(_cache_warnings(record)) == 1
    np.testing.assert_allclose(np.asarray(out(_ones2())), np.tanh(c) + c, rtol=1e-5)


def test_directory_writable_by_others_is_refused(cache_dir, tmp_path):
    root = tmp_path / "shared"
    (root / store_mod.SUBDIR).mkdir(parents=True)
    os.chmod(root / store_mod.SUBDIR, 0o777)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.set_dir(str(root))
    assert not cache.is_enabled()
    assert "writable by other users" in cache.disk_store().info()["status"]
    assert len(_cache_warnings(record)) == 1


def test_full_disk_degrades_to_memory(cache_dir, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.os, "replace", no_space)
    before = cache.stats()["disk"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            fn, c = _program()
            out = _compile(fn, _ones2())
            np.testing.assert_allclose(np.asarray(out(_ones2())), np.tanh(c) + c,
                                       rtol=1e-5)
    after = cache.stats()["disk"]
    ws = _cache_warnings(record)
    assert len(ws) == 1 and "full" in str(ws[0].message)
    assert after["write_errors"] == before["write_errors"] + 1  # then no more attempts
    assert after["writes"] == before["writes"]
    assert not after["writable"]
    assert not list((cache_dir / store_mod.SUBDIR).glob("*.tmp-*"))


def test_concurrent_writers_of_one_entry(cache_dir):
    s = cache.disk_store()
    payload = os.urandom(50_000)
    errors = []

    def write():
        try:
            for _ in range(20):
                s.put("same-key", payload)
        except Exception as e:  # pragma: no cover - the failure being tested
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert s.get("same-key") == payload
    assert len(_entries(cache_dir)) == 1
    assert not list((cache_dir / store_mod.SUBDIR).glob("*.tmp-*"))


def test_nothing_is_unpickled_from_the_cache(cache_dir, monkeypatch):
    fn, c = _program()
    arr = _arr(3)
    _compile(fn, arr)

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used on cache data")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    hits = cache.stats()["disk"]["hits"]
    out = _compile(fn, arr)
    assert cache.stats()["disk"]["hits"] == hits + 1
    np.testing.assert_allclose(np.asarray(out(arr)), np.tanh(np.arange(3.0) * c) + c,
                               rtol=1e-5)


# -- other processes -------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import torch_tpu
    import torch_tpu.cache as cache

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to("tpu")
    x = torch.randn(8, 16).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    y = compiled(x)
    y.sum().backward()
    eager = (x * 2 + 1).exp().sum()
    s = cache.stats()
    print(json.dumps({
        "y": y.detach().cpu().tolist(), "grad": model[0].weight.grad.cpu().sum().item(),
        "eager": eager.item(), "disk": s["disk"], "by_source": s["compile_seconds_by_source"],
        "graphs": [e for e in s["per_entry"] if e["name"].startswith("graph")],
    }))
""")


def _child_env(cache_root):
    env = dict(os.environ)
    env["TORCH_TPU_CACHE_DIR"] = str(cache_root)
    env.setdefault("TORCH_TPU_CPU_FALLBACK", "1")
    return env


def _run_child(cache_root, code=_CHILD):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_child_env(cache_root), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk(tmp_path):
    root = tmp_path / "shared-cache"
    cold = _run_child(root)
    warm = _run_child(root)
    assert cold["disk"]["writes"] > 0 and cold["disk"]["hits"] == 0
    assert warm["disk"]["misses"] == 0, warm["disk"]
    assert warm["disk"]["hits"] >= cold["disk"]["writes"] - 1
    assert warm["by_source"]["compiled"]["count"] == 0
    assert {g["source"] for g in warm["graphs"]} == {"disk"}
    assert len(warm["graphs"]) == 2  # forward and backward
    assert warm["y"] == cold["y"] and warm["grad"] == cold["grad"]
    assert warm["eager"] == cold["eager"]


@pytest.mark.slow
def test_two_processes_writing_at_once(tmp_path):
    # (test_concurrent_writers_of_one_entry covers the same code path in-process.)
    root = tmp_path / "race"
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_child_env(root))
             for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["y"] == results[1]["y"]
    # Every entry on disk is sound: a third process reads all of them.
    s = store_mod.DiskStore(str(root))
    assert s.info()["entries"] > 0
    third = _run_child(root)
    assert third["disk"]["misses"] == 0 and third["disk"]["corrupt"] == 0


def test_command_line_info_and_clear(tmp_path, monkeypatch, capsys):
    from torch_tpu.cache.__main__ import main

    root = tmp_path / "cli-cache"
    store_mod.DiskStore(str(root)).put("k", b"payload")
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(root))
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entries"] == 1 and data["dir"] == str(root) and data["bytes"] > 0
    assert main(["clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", "")
    assert main(["info"]) == 0
    assert "disabled" in capsys.readouterr().out
    # The module entry point itself.
    out = subprocess.run([sys.executable, "-m", "torch_tpu.cache", "info"],
                         capture_output=True, text=True, env=_child_env(root))
    assert out.returncode == 0, out.stderr
    assert str(root) in out.stdout and "entries   : 0" in out.stdout


# -- the graph tier: a warm process runs compiled graphs without lowering them ---------

_TRAIN_CHILD = textwrap.dedent("""
    import json
    import torch
    import torch.nn.functional as F
    import torch_tpu
    import torch_tpu.cache as cache

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Dropout(0.25), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16).to("tpu")
    y = torch.randn(8, 4).to("tpu")
    loss_fn = torch.compile(lambda x, y: F.mse_loss(model(x), y), backend="tpu")
    opt_step = torch.compile(opt.step, backend="tpu")
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        opt_step()
        losses.append(loss.item())
    s = cache.stats()
    print(json.dumps({"losses": losses, "w": model[3].weight.detach().cpu().tolist(),
                      "graphs": s["graphs"], "graph_disk": s["graph_disk"]}))
""")


def test_warm_process_skips_lowering(tmp_path):
    root = tmp_path / "graph-tier"
    cold = _run_child(root, _TRAIN_CHILD)
    warm = _run_child(root, _TRAIN_CHILD)
    # forward, backward and the optimizer's (donating) graph
    assert cold["graphs"]["lowered"] >= 3 and cold["graphs"]["disk_loads"] == 0
    assert cold["graph_disk"]["writes"] == cold["graphs"]["lowered"]
    assert warm["graphs"]["lowered"] == 0, warm
    assert warm["graphs"]["disk_loads"] == cold["graphs"]["lowered"]
    assert warm["graph_disk"]["misses"] == 0 and warm["graph_disk"]["writes"] == 0
    # Same values (dropout's random stream included), same parameter updates.
    assert warm["losses"] == cold["losses"]
    assert warm["w"] == cold["w"]


def _graph_index_entries(path):
    """The graph tier's index files (their header key carries the tier's prefix)."""
    from torch_tpu.cache import graphs

    out = []
    for f in _entries(path):
        blob = f.read_bytes()
        (hlen,) = store_mod.struct.unpack(">I", blob[8:12])
        header = json.loads(blob[12:12 + hlen])
        if header["key"].startswith(graphs.PREFIX):
            out.append(f)
    return out


def _fresh_compile(fn, *args):
    from torch_tpu.compile import backend

    torch._dynamo.reset()
    backend.clear_cache()
    return torch.compile(fn, backend="tpu")(*args)


def test_graph_tier_in_process(cache_dir):
    from torch_tpu.compile import backend

    def f(a, b):
        return (a * 1.75 + b).tanh().sum(0)

    a = torch.randn(5, 7, device="tpu")
    b = torch.randn(5, 7, device="tpu")
    ref = (a.cpu() * 1.75 + b.cpu()).tanh().sum(0)
    s0 = backend.cache_stats()
    out = _fresh_compile(f, a, b)
    torch.testing.assert_close(out.cpu(), ref)
    s1 = backend.cache_stats()
    assert s1["lowered"] == s0["lowered"] + 1
    assert len(_graph_index_entries(cache_dir)) == 1
    # A new graph object (as in a new process): loaded, not lowered.
    out = _fresh_compile(f, a, b)
    torch.testing.assert_close(out.cpu(), ref)
    s2 = backend.cache_stats()
    assert s2["lowered"] == s1["lowered"] and s2["disk_loads"] == s1["disk_loads"] + 1
    # The executable behind the index entry is gone: a miss, lowered again, same values.
    index = set(_graph_index_entries(cache_dir))
    for e in _entries(cache_dir):
        if e not in index:
            e.unlink()
    misses = cache.stats()["graph_disk"]["misses"]
    out = _fresh_compile(f, a, b)
    torch.testing.assert_close(out.cpu(), ref)
    s3 = backend.cache_stats()
    assert s3["lowered"] == s2["lowered"] + 1 and s3["disk_loads"] == s2["disk_loads"]
    assert cache.stats()["graph_disk"]["misses"] == misses + 1


def test_graph_tier_off(cache_dir, monkeypatch):
    from torch_tpu.compile import backend

    monkeypatch.setenv("TORCH_TPU_GRAPH_CACHE", "0")

    def f(a):
        return (a - 0.625).exp()

    a = torch.randn(4, 3, device="tpu")
    _fresh_compile(f, a)
    lowered = backend.cache_stats()["lowered"]
    out = _fresh_compile(f, a)
    torch.testing.assert_close(out.cpu(), (a.cpu() - 0.625).exp())
    assert backend.cache_stats()["lowered"] == lowered + 1
    assert _graph_index_entries(cache_dir) == []


def test_graph_key_covers_sources_and_settings(monkeypatch):
    from torch_tpu.cache import graphs

    k = graphs.key_for("graph")
    assert k.startswith(graphs.PREFIX) and graphs.key_for("graph") == k
    assert graphs.key_for("graph2") != k
    monkeypatch.setattr(graphs, "_source_fp", "edited sources")
    assert graphs.key_for("graph") != k
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    assert graphs.key_for("graph") != k


def test_graph_values_round_trip():
    from torch_tpu.cache import graphs

    for value in (3, -1.5, True, None, "s", (1, 2), [3, (4, [5])], ()):
        assert graphs.decode_value(json.loads(json.dumps(graphs.encode_value(value)))) == value
    with pytest.raises(graphs.NotPortable):
        graphs.encode_value(torch.float32)
