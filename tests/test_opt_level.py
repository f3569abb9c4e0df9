"""XLA optimization level (torch_tpu.runtime.opt_level): keys, options, results."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from jax._src import compiler as jax_compiler

import torch_tpu.cache as cache
from torch_tpu.runtime import executor, opt_level, programs


@pytest.fixture
def level_reset():
    before = opt_level.level()
    yield
    opt_level.set_level(before)


@pytest.fixture
def xla_calls(monkeypatch):
    """What reaches XLA: (effort level, option overrides) of each compile."""
    calls = []
    original = jax_compiler.backend_compile_and_load

    def spy(backend, module, devices, options, host_callbacks):
        calls.append((options.executable_build_options.optimization_level,
                      dict(options.env_option_overrides)))
        return original(backend, module, devices, options, host_callbacks)

    monkeypatch.setattr(jax_compiler, "backend_compile_and_load", spy)
    return calls


def test_compiler_options_of_each_level():
    assert opt_level.compiler_options(3) is None  # XLA's defaults, as jax.jit
    o0, o1, o2 = (opt_level.compiler_options(n) for n in (0, 1, 2))
    assert o0["xla_backend_optimization_level"] == 0 and o0["xla_llvm_disable_expensive_passes"]
    assert o1["xla_backend_optimization_level"] == 1 and o2["xla_backend_optimization_level"] == 2
    assert o0["optimization_level"] < o1["optimization_level"] < o2["optimization_level"]
    for bad in (4, -1, "fast", 1.5, True, None):
        with pytest.raises(ValueError, match="optimization level"):
            opt_level.set_level(bad)


def test_eager_key_changes_with_level_and_option_reaches_xla(level_reset, xla_calls, cache_dir):
    # A private, empty disk tier and an empty memory tier: the first call at
    # each level compiles (reaches XLA), whatever ran before, in this process or
    # in an earlier run on the same cache directory.
    executor.clear_cache()
    a = torch.randn(7, 13)
    b = torch.randn(7, 13)
    ta, tb = a.to("tpu"), b.to("tpu")
    results = {}
    for level in (3, 0, 1):
        opt_level.set_level(level)
        xla_calls.clear()
        misses = executor.STATS.misses
        results[level] = torch.addcmul(ta, ta, tb, value=0.5).cpu()
        assert executor.STATS.misses > misses, f"level {level} reused another level's program"
        effort, overrides = xla_calls[0]
        want = opt_level.compiler_options(level) or {}
        assert overrides == {k: v for k, v in want.items() if k != "optimization_level"}
        assert effort == want.get("optimization_level", 0)
    # The same call at a level seen before is a memory hit, compiled at its own level.
    opt_level.set_level(0)
    misses = executor.STATS.misses
    again = torch.addcmul(ta, ta, tb, value=0.5).cpu()
    assert executor.STATS.misses == misses
    expected = torch.addcmul(a, a, b, value=0.5)
    for level, r in results.items():
        torch.testing.assert_close(r, expected, msg=f"level {level}")
    torch.testing.assert_close(again, expected)
    levels = {k[-1] for k in programs.CACHE if str(k[0]) == "aten.addcmul.default"}
    assert levels >= {0, 1, 3}


def test_disk_key_changes_with_level(level_reset, monkeypatch, cache_dir):
    # A private, empty disk tier (on, whatever the run's setting) and an empty
    # memory tier: both levels' programs are compiled here, whatever ran before.
    # last_compile_keys() is this thread's last compile: compile the ops here,
    # not on the background pool (runtime.async_compile).
    from torch_tpu.runtime import async_compile

    assert cache.is_enabled()
    executor.clear_cache()
    monkeypatch.setattr(async_compile, "ENABLED", False)
    t = torch.randn(11, 3, device="tpu")
    keys = {}
    for level in (3, 2):
        opt_level.set_level(level)
        (t.exp() * 3).cpu()
        keys[level] = cache.last_compile_keys()
    assert keys[3] and keys[2] and set(keys[3]).isdisjoint(keys[2])


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(9, 17)
        self.b = torch.nn.Linear(17, 5)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x))).sum()


def test_compile_backend_option(level_reset, xla_calls, cache_dir):
    # (a private, empty disk tier: the graphs are compiled here, reaching XLA,
    # not loaded from an earlier run's cache)
    torch.manual_seed(0)
    model = _MLP()
    x = torch.randn(6, 9)
    model.zero_grad()
    model(x).backward()
    ref_grad = model.a.weight.grad.clone()
    ref = model(x).detach()

    opt_level.set_level(3)  # the process level; the graph's option wins
    tmodel = _MLP()
    tmodel.load_state_dict(model.state_dict())
    tmodel = tmodel.to("tpu")
    tx = x.to("tpu")
    compiled = torch.compile(tmodel, backend="tpu", options={"opt_level": 1})
    xla_calls.clear()
    out = compiled(tx)
    out.backward()
    graph_efforts = {e for e, _ in xla_calls}
    assert opt_level.compiler_options(1)["optimization_level"] in graph_efforts
    torch.testing.assert_close(out.detach().cpu(), ref)
    torch.testing.assert_close(tmodel.a.weight.grad.cpu(), ref_grad)

    from torch_tpu.compile import graph_cache

    entries = [k for k in graph_cache.cached_keys() if ("opt_level", 1) in k]
    assert len(entries) >= 2  # forward and backward, keyed by the level


def test_compile_backend_rejects_bad_level():
    model = torch.nn.Linear(3, 3).to("tpu")
    compiled = torch.compile(model, backend="tpu", options={"opt_level": 7})
    with pytest.raises(Exception, match="opt_level") as info:
        compiled(torch.randn(2, 3, device="tpu"))
    assert "0, 1, 2, 3" in str(info.value)


_CHILD = textwrap.dedent("""
    import json
    import torch
    import torch_tpu.cache as cache
    from torch_tpu.runtime import opt_level

    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    y = (x.sin() * 2 + 1).cpu()
    s = cache.stats()
    print(json.dumps({"level": opt_level.level(), "y": y.tolist(),
                      "by_source": s["compile_seconds_by_source"]}))
""")


def _child(root, level):
    """A new process at `level` (None: the variable unset) over cache dir `root`."""
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(root))
    env.pop("TORCH_TPU_XLA_OPT_LEVEL", None)
    if level is not None:
        env["TORCH_TPU_XLA_OPT_LEVEL"] = level
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_env_level_cold_and_warm_processes(tmp_path):
    root = tmp_path / "cache"
    cold = _child(root, "0")
    warm = _child(root, "0")
    other = _child(root, None)
    assert (cold["level"], warm["level"], other["level"]) == (0, 0, 3)
    assert cold["by_source"]["compiled"]["count"] > 0
    # Same level, new process: every executable from disk.
    assert warm["by_source"]["compiled"]["count"] == 0
    assert warm["by_source"]["disk"]["count"] == cold["by_source"]["compiled"]["count"]
    # Another level, same directory: nothing of level 0 is served.
    assert other["by_source"]["disk"]["count"] == 0
    assert other["by_source"]["compiled"]["count"] > 0
    assert cold["y"] == warm["y"] == other["y"]


def test_env_values(monkeypatch):
    for raw, want in (("0", 0), (" 2 ", 2), ("", 3)):
        monkeypatch.setenv("TORCH_TPU_XLA_OPT_LEVEL", raw)
        assert opt_level._from_env() == want
    monkeypatch.setenv("TORCH_TPU_XLA_OPT_LEVEL", "fast")
    with pytest.warns(UserWarning, match="TORCH_TPU_XLA_OPT_LEVEL.*0, 1, 2, 3"):
        assert opt_level._from_env() == opt_level.DEFAULT
