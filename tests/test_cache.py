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
from torch_tpu.runtime import programs

_counter = [0]


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
    return programs.compile("cache_test", None, lambda a: fn(a), (arr,))


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


def _as_rank_one(monkeypatch):
    """Make this process look like rank 1 of a multi-process job: JAX then
    leaves persistent-cache writes to process 0."""
    from jax._src import distributed

    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    monkeypatch.setattr(jax, "process_index", lambda *a, **k: 1)


def test_other_ranks_write_their_executables(cache_dir, monkeypatch):
    _as_rank_one(monkeypatch)
    fn, c = _program()
    arr = _arr(5)
    first = _compile(fn, arr)
    assert len(_entries(cache_dir)) == 1  # written by us, not by JAX
    second = _compile(fn, arr)
    assert cache.stats()["per_entry"][-1]["source"] == "disk"
    np.testing.assert_allclose(np.asarray(second(arr)), np.asarray(first(arr)))


def test_other_ranks_never_store_host_callbacks(cache_dir, monkeypatch):
    _as_rank_one(monkeypatch)
    _, c = _program()

    def fn(a):
        host = jax.pure_callback(lambda v: np.asarray(v) * c,
                                 jax.ShapeDtypeStruct(a.shape, a.dtype), a)
        return host + 1

    arr = _arr(4)
    out = _compile(fn, arr)
    np.testing.assert_allclose(np.asarray(out(arr)), np.arange(4.0) * c + 1, rtol=1e-6)
    assert _entries(cache_dir) == []  # its callback lives in this process only


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
        "eager_prefetch": s["eager_index"]["prefetch"],
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
    from torch_tpu.compile import graph_cache

    torch._dynamo.reset()
    graph_cache.clear_cache()
    return torch.compile(fn, backend="tpu")(*args)


def test_graph_tier_in_process(cache_dir):
    from torch_tpu.compile import graph_cache

    def f(a, b):
        return (a * 1.75 + b).tanh().sum(0)

    a = torch.randn(5, 7, device="tpu")
    b = torch.randn(5, 7, device="tpu")
    ref = (a.cpu() * 1.75 + b.cpu()).tanh().sum(0)
    s0 = graph_cache.cache_stats()
    out = _fresh_compile(f, a, b)
    torch.testing.assert_close(out.cpu(), ref)
    s1 = graph_cache.cache_stats()
    assert s1["lowered"] == s0["lowered"] + 1
    assert len(_graph_index_entries(cache_dir)) == 1
    # A new graph object (as in a new process): loaded, not lowered.
    out = _fresh_compile(f, a, b)
    torch.testing.assert_close(out.cpu(), ref)
    s2 = graph_cache.cache_stats()
    assert s2["lowered"] == s1["lowered"] and s2["disk_loads"] == s1["disk_loads"] + 1
    # The executable behind the index entry is gone: a miss, lowered again, same values.
    index = set(_graph_index_entries(cache_dir))
    for e in _entries(cache_dir):
        if e not in index:
            e.unlink()
    misses = cache.stats()["graph_disk"]["misses"]
    out = _fresh_compile(f, a, b)
    torch.testing.assert_close(out.cpu(), ref)
    s3 = graph_cache.cache_stats()
    assert s3["lowered"] == s2["lowered"] + 1 and s3["disk_loads"] == s2["disk_loads"]
    assert cache.stats()["graph_disk"]["misses"] == misses + 1


def test_graph_tier_off(cache_dir, monkeypatch):
    from torch_tpu.compile import graph_cache

    monkeypatch.setenv("TORCH_TPU_GRAPH_CACHE", "0")

    def f(a):
        return (a - 0.625).exp()

    a = torch.randn(4, 3, device="tpu")
    _fresh_compile(f, a)
    lowered = graph_cache.cache_stats()["lowered"]
    out = _fresh_compile(f, a)
    torch.testing.assert_close(out.cpu(), (a.cpu() - 0.625).exp())
    assert graph_cache.cache_stats()["lowered"] == lowered + 1
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


# -- debug APIs on programs a warm process loaded from disk --------------------------

_DEBUG_CHILD = textwrap.dedent(r"""
    import hashlib, json, re
    import torch
    import torch_tpu
    import torch_tpu.cache as cache
    import torch_tpu.debug as dbg

    torch.manual_seed(0)
    w = torch.randn(16, 4).to("tpu").requires_grad_()
    x = torch.randn(8, 16).to("tpu")
    f = torch.compile(lambda x, w: torch.relu(x @ w).sum(), backend="tpu")
    f(x, w).backward()
    y = (x * 3).exp()

    def digest(text):
        return hashlib.sha256(text.encode()).hexdigest()

    def program_only(text):
        # An executable's debug tables (source files and stack frames) come
        # back from serialization in another order: compare the program.
        text = re.sub(r", metadata=\{[^}]*\}", "", text)
        return digest("\n".join(
            line for line in text.splitlines() if not re.match(r"\d+ |[A-Z][a-z]+Names$|"
                                                               r"FileLocations$|StackFrames$",
                                                               line)))

    out = {"graphs": [], "ops": []}
    for p in dbg.last_graphs():
        out["graphs"].append({
            "name": p.name, "executable": type(p.compiled).__name__,
            "stages": [s for s in ("stablehlo", "hlo", "optimized") if p.has_stage(s)],
            "stablehlo": digest(p.stablehlo), "hlo": digest(p.hlo),
            "optimized": program_only(p.optimized), "text": digest(str(p)),
            "flops": p.cost["flops"], "bytes": p.cost["bytes_accessed"],
            "memory": p.memory, "has_dot": "dot" in p.hlo,
            "optimized_via_api": program_only(dbg.hlo(p, stage="optimized")),
            "cost_via_api": dbg.cost_analysis(p)["flops"]})
    mul = [e for e in dbg.compile_log(kind="op") if e.name == "aten.mul.Tensor"][-1]
    out["ops"].append({"stablehlo": digest(mul.program.stablehlo),
                       "flops": mul.program.cost["flops"], "tier": mul.tier})
    out["log"] = [[e.name, e.kind, e.tier, e.program_bytes]
                  for e in dbg.compile_log(kind="graph")]
    m = dbg.metrics()
    out["by_tier"] = m["compiles"]["by_tier"]
    s = cache.stats()
    out["graph_disk"] = s["graph_disk"]
    out["lowered"] = s["graphs"]["lowered"]
    print(json.dumps(out))
""")


def test_debug_apis_on_programs_loaded_from_disk(tmp_path):
    """Cold, then a new process: every debug API answers for graphs the graph
    tier loaded without lowering them (the guide's notebook 04 warm-path bug)."""
    root = tmp_path / "debug-warm"
    cold = _run_child(root, _DEBUG_CHILD)
    warm = _run_child(root, _DEBUG_CHILD)
    assert cold["lowered"] == 2 and warm["lowered"] == 0, (cold["lowered"], warm["lowered"])
    assert warm["graph_disk"]["hits"] == 2
    assert {g["executable"] for g in warm["graphs"]} == {"_LoadedProgram"}
    assert [g["name"] for g in warm["graphs"]] == [g["name"] for g in cold["graphs"]] == [
        "graph_forward", "graph_backward"]
    for c, w in zip(cold["graphs"], warm["graphs"]):
        assert w["stages"] == ["stablehlo", "hlo", "optimized"]
        # The same program at every stage, the same analyses.
        for k in ("stablehlo", "hlo", "optimized", "text", "flops", "bytes", "memory",
                  "optimized_via_api", "cost_via_api"):
            assert w[k] == c[k], (w["name"], k)
        assert w["flops"] > 0 and w["has_dot"]
    assert warm["ops"] == [dict(cold["ops"][0], tier="disk")]
    assert [e[2] for e in warm["log"]] == ["disk", "disk"]
    assert [e[:2] for e in warm["log"]] == [e[:2] for e in cold["log"]]
    assert all(e[3] > 0 for e in warm["log"])  # the size of the optimized program text
    assert set(warm["by_tier"]) == {"disk"} and set(cold["by_tier"]) == {"compile"}


def test_program_without_lowered_form_says_which_stages_are_missing():
    from torch_tpu.compile.graph_cache import _LoadedProgram
    from torch_tpu.debug.hlo import Program

    compiled = jax.jit(lambda a: jnp.sin(a) @ a).lower(jnp.ones((4, 4))).compile()
    loaded = _LoadedProgram(compiled.runtime_executable(), jax.devices()[0], 1, 1)
    prog = Program("loaded", compiled=loaded)
    assert not prog.has_stage("stablehlo") and prog.has_stage("optimized")
    assert repr(prog) == "Program('loaded', stages=['optimized'])"
    with pytest.raises(RuntimeError, match="'loaded'.*only the 'optimized' stage"):
        _ = prog.hlo
    assert prog.lowered is None
    assert prog.optimized == compiled.as_text() and str(prog) == prog.optimized
    want = compiled.cost_analysis()
    assert prog.cost["flops"] == want["flops"] > 0
    mem = compiled.memory_analysis()
    assert prog.memory["argument_size_in_bytes"] == mem.argument_size_in_bytes > 0

    # A re-lowering that fails is reported as such, the other stages still work.
    def broken():
        raise ValueError("graph gone")

    prog = Program("relowered", compiled=loaded, relower=broken)
    assert prog.has_stage("hlo")
    with pytest.raises(RuntimeError, match="lowering it again failed.*graph gone"):
        _ = prog.stablehlo
    assert str(prog) == compiled.as_text()


# -- directory edge cases ------------------------------------------------------------


def test_directory_in_an_entrys_place_is_healed(cache_dir):
    fn, c = _program()
    arr = _ones2()
    _compile(fn, arr)
    (entry,) = _entries(cache_dir)
    entry.unlink()
    entry.mkdir()
    (entry / "junk").write_bytes(b"x")
    s = cache.disk_store()
    assert s.info()["entries"] == 0 and s.info()["other_files"] == 1
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = _compile(fn, arr)  # a miss: the directory is removed, the entry written
    np.testing.assert_allclose(np.asarray(out(arr)), np.tanh(c) + c, rtol=1e-5)
    assert entry.is_file() and s.info()["entries"] == 1 and s.info()["other_files"] == 0
    assert s.info()["writable"] and len(_cache_warnings(record)) == 1
    hits = s.stats.hits
    _compile(fn, arr)
    assert s.stats.hits == hits + 1


def test_put_replaces_a_directory_in_an_entrys_place(cache_dir):
    s = cache.disk_store()
    fname = s.file_for("key-with-a-dir")
    os.makedirs(os.path.join(fname, "sub"))
    s.put("key-with-a-dir", b"payload")
    assert os.path.isfile(fname) and s.get("key-with-a-dir") == b"payload"
    assert s.info()["writable"]


def test_fifo_in_an_entrys_place_does_not_hang(cache_dir):
    s = cache.disk_store()
    fname = s.file_for("key-with-a-fifo")
    os.mkfifo(fname)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert s.get("key-with-a-fifo") is None
    assert not os.path.exists(fname)
    s.put("key-with-a-fifo", b"v")
    assert s.get("key-with-a-fifo") == b"v"


def test_clear_removes_everything_it_does_not_recognise(cache_dir, monkeypatch, capsys):
    from torch_tpu.cache.__main__ import main

    s = cache.disk_store()
    s.put("a", b"1")
    s.put("b", b"2")
    d = cache_dir / store_mod.SUBDIR
    (d / ("0" * 64 + store_mod.SUFFIX)).mkdir()          # a directory named like an entry
    (d / "stray.txt").write_text("foreign")              # a foreign file
    (d / ("1" * 64 + store_mod.SUFFIX + ".tmp-1-2-3")).write_bytes(b"half")  # a killed writer
    os.symlink(d / "nowhere", d / ("2" * 64 + store_mod.SUFFIX))  # a dangling link
    packages = cache_dir / store_mod.PACKAGES_SUBDIR   # a torch.compile package beside it
    packages.mkdir(mode=0o700)
    (packages / "graph.tpk").write_bytes(b"package")
    info = s.info()
    assert info["entries"] == 2 and info["other_files"] == 4 and info["packages"] == 1
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(cache_dir))
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entries"] == 2 and data["other_files"] == 4 and data["packages"] == 1
    assert main(["info"]) == 0
    shown = capsys.readouterr().out
    assert "entries   : 2" in shown and "4 unrecognised item(s)" in shown
    assert "packages  : 1 " in shown
    assert main(["clear"]) == 0
    # counted in info's kinds, from the same scan: the numbers match info's
    assert (f"removed 2 cached program(s), 1 compile package item(s), 4 unrecognised "
            f"item(s) from {cache_dir}") in capsys.readouterr().out
    assert list(d.iterdir()) == [] and list(packages.iterdir()) == []
    assert s.info()["entries"] == 0 and s.info()["other_files"] == 0


@pytest.mark.parametrize("err", [errno.EFBIG, errno.ENOSPC, errno.EIO])
def test_write_failure_stops_writing_for_the_process(cache_dir, monkeypatch, err):
    calls = []

    def failing_write(fname, blob, where=None):
        calls.append(fname)
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(store_mod, "write_atomic", failing_write)
    s = cache.disk_store()
    errors = s.stats.write_errors
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for i in range(4):
            s.put(f"k{i}", b"v")
        fn, c = _program()
        out = _compile(fn, _ones2())
    np.testing.assert_allclose(np.asarray(out(_ones2())), np.tanh(c) + c, rtol=1e-5)
    ws = _cache_warnings(record)
    assert len(ws) == 1 and "memory only" in str(ws[0].message)
    assert len(calls) == 1  # "memory only" means it: no write is tried again
    assert s.stats.write_errors == errors + 1 and not s.info()["writable"]
    # Reads go on.
    monkeypatch.undo()
    s.writable = True
    s.put("readable", b"r")
    s.writable = False
    assert s.get("readable") == b"r"


def test_directory_removed_under_the_process_is_made_again(cache_dir):
    import shutil

    s = cache.disk_store()
    s.put("before", b"1")
    shutil.rmtree(cache_dir)
    errors = s.stats.write_errors
    s.put("after", b"2")
    assert s.get("after") == b"2" and s.info()["writable"] and s.stats.write_errors == errors


# -- the read-only shared tier ---------------------------------------------------------


def _tree(root):
    """Every path under `root` with its size, mode and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mode, st.st_mtime_ns)
    return out


def _read_only(root):
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)


def _writable(root):
    for dirpath, _dirnames, _filenames in os.walk(root):
        os.chmod(dirpath, 0o755)


def test_shared_read_only_directory_serves_a_new_process(tmp_path):
    shared = tmp_path / "prebuilt"
    cold = _run_child(shared)  # e.g. a CI job filling the directory
    assert cold["disk"]["writes"] > 0
    _read_only(shared)
    before = _tree(shared)
    local = tmp_path / "local"
    env = {"TORCH_TPU_SHARED_CACHE_DIR": str(shared)}
    try:
        code = f"import os; os.environ.update({env!r})\n" + _CHILD
        warm = _run_child(local, code)
        assert _tree(shared) == before  # nothing written, touched or removed
    finally:
        _writable(shared)
    assert warm["disk"]["misses"] == 0 and warm["disk"]["hits"] >= cold["disk"]["writes"] - 1
    assert warm["disk"]["shared_hits"] == warm["disk"]["hits"]
    assert warm["disk"]["writes"] == 0 and warm["disk"]["entries"] == 0
    # Every entry the cold process left is listed: those it had when it
    # reported, and the order of its eager lookups, stored at its exit
    # (torch_tpu.cache.prefetch).
    left = [p for p in before if p.endswith(store_mod.SUFFIX)]
    assert len(left) == cold["disk"]["entries"] + 1
    assert warm["disk"]["shared_entries"] == len(left)
    assert warm["eager_prefetch"]["used"] > 0
    assert warm["by_source"]["compiled"]["count"] == 0
    assert {g["source"] for g in warm["graphs"]} == {"disk"}
    assert warm["y"] == cold["y"] and warm["grad"] == cold["grad"]
    assert warm["eager"] == cold["eager"]


def test_shared_directory_under_the_local_one(cache_dir, tmp_path, monkeypatch, capsys):
    from torch_tpu.cache.__main__ import main

    shared_root = tmp_path / "shared"
    producer = store_mod.DiskStore(str(shared_root), shared=None)
    producer.put("only-shared", b"S")
    producer.put("both", b"shared-version")
    s = cache.disk_store()
    s.put("both", b"local-version")
    cache.set_shared_dir(str(shared_root))
    try:
        assert cache.shared_dir() == str(shared_root)
        hits = s.stats.shared_hits
        assert s.get("both") == b"local-version"       # the local directory first
        assert s.get("only-shared") == b"S"            # then the shared one
        assert s.stats.shared_hits == hits + 1
        s.put("new", b"N")                             # written locally only
        assert s.get("new") == b"N"
        assert producer.get("new") is None
        n = s.clear()
        assert n == 2 and producer.info()["entries"] == 2  # clear leaves the shared one
        assert s.get("only-shared") == b"S"
        info = cache.info()
        assert info["shared_dir"] == str(shared_root) and info["shared_entries"] == 2
        monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(cache_dir))
        monkeypatch.setenv("TORCH_TPU_SHARED_CACHE_DIR", str(shared_root))
        assert main(["info"]) == 0
        assert f"shared    : {shared_root} (ok (read-only); 2 entries" in capsys.readouterr().out
        assert main(["clear"]) == 0 and producer.info()["entries"] == 2
        # A bad shared entry is ignored, counted, never deleted.
        bad = producer.file_for("only-shared")
        data = bytearray(open(bad, "rb").read())
        data[-1] ^= 1
        open(bad, "wb").write(bytes(data))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            assert s.get("only-shared") is None
        assert os.path.exists(bad) and len(_cache_warnings(record)) == 1
    finally:
        cache.set_shared_dir(None)
    assert cache.shared_dir() is None


def test_shared_directory_trust_check(cache_dir, tmp_path):
    shared_root = tmp_path / "team"
    producer = store_mod.DiskStore(str(shared_root), shared=None)
    producer.put("k", b"v")
    s = cache.disk_store()
    try:
        os.chmod(shared_root / store_mod.SUBDIR, 0o777)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            cache.set_shared_dir(str(shared_root))
        assert cache.shared_dir() is None and s.get("k") is None
        assert "writable by other users" in cache.info()["shared_status"]
        assert len(_cache_warnings(record)) == 1
        # A sound directory, but one entry others may rewrite: that entry is ignored.
        os.chmod(shared_root / store_mod.SUBDIR, 0o755)
        cache.set_shared_dir(str(shared_root))
        assert s.get("k") == b"v"
        os.chmod(producer.file_for("k"), 0o666)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert s.get("k") is None
        # A directory that is not there.
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            cache.set_shared_dir(str(tmp_path / "missing"))
        assert len(_cache_warnings(record)) == 1
        assert cache.shared_dir() is None
        assert "does not exist" in cache.info()["shared_status"]
    finally:
        cache.set_shared_dir(None)


def test_read_only_local_directory_serves_hits(cache_dir, monkeypatch):
    s = cache.disk_store()
    s.put("k", b"v")
    real_access = os.access

    def no_write(path, mode, *a, **k):  # a read-only mount (chmod does not stop root)
        return False if mode & os.W_OK else real_access(path, mode, *a, **k)

    monkeypatch.setattr(store_mod.os, "access", no_write)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache.set_dir(str(cache_dir))
    assert cache.is_enabled() and cache.info()["status"] == "read-only"
    assert not cache.info()["writable"]
    assert len(_cache_warnings(record)) == 1
    assert s.get("k") == b"v"
    s.put("k2", b"w")
    assert s.get("k2") is None and not os.path.exists(s.file_for("k2"))
