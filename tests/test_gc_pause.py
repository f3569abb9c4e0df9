"""The collector pause around compiles and the freeze at the backend's load (torch_tpu.runtime.gc_pause).

The freeze is checked in new processes: `import torch` (which imports
torch_tpu) freezes nothing; the first `tpu` tensor loads the backend and
freezes what is alive then, unless TORCH_TPU_GC_FREEZE=0 or the collector is
off; cycles made afterwards are still collected; a compiled training step
gives the CPU losses in a cold process and in a warm one that loads its
graph programs from the cache directory the cold one filled.
"""

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import gc_pause


def test_pause_nests_and_resumes():
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc_pause.end()  # an unmatched end is ignored
    assert gc.isenabled()


def test_user_disabled_collector_stays_off():
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_opt_out(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COMPILE_GC", "1")
    with gc_pause.paused():
        assert gc.isenabled()


def test_collector_paused_during_compile_and_back_after(monkeypatch, cache_dir):
    # cache_dir: a private, empty disk tier, so the ops below compile
    seen = []
    from torch_tpu.runtime import executor

    real = executor.jax.jit

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    torch._dynamo.reset()  # clears dynamo's callbacks: the backend re-installs ours
    monkeypatch.setattr(executor.jax, "jit", spy)

    @torch.compile(backend="tpu")
    def f(x):
        return torch.sin(x) * 3 + 1

    x = torch.arange(7.0).to("tpu")
    torch.testing.assert_close(f(x).cpu(), torch.sin(torch.arange(7.0)) * 3 + 1)
    assert seen and not any(seen)
    assert gc.isenabled()
    from torch._dynamo.callback import callback_handler

    assert gc_pause._on_compile_start in callback_handler.start_callbacks



def test_collector_paused_while_an_eager_op_is_built(monkeypatch):
    """An eager miss (PyTorch's meta kernel, our lowering) runs with the collector
    paused; the op's first call imports torch._dynamo through PyTorch's meta
    kernels in a new process, whose collections were most of that import."""
    from torch_tpu.runtime import executor

    seen = []
    real = executor.run_meta

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(executor, "run_meta", spy)
    x = torch.arange(11.0).to("tpu")
    torch.testing.assert_close((x * 2.5 - 7).cpu(), torch.arange(11.0) * 2.5 - 7)
    assert seen and not any(seen)
    assert gc.isenabled()


def test_collector_paused_while_the_backend_loads():
    got = _child("""
        import gc, json, sys
        import torch, torch_tpu
        seen = []
        class Spy:  # sees every import the backend's load makes
            def find_spec(self, name, path=None, target=None):
                if name.startswith("torch_tpu.ops"):
                    seen.append(gc.isenabled())
        sys.meta_path.insert(0, Spy())
        torch.ones(2, device="tpu")
        print(json.dumps({"seen": seen, "after": gc.isenabled()}))
    """)
    assert got["seen"] and not any(got["seen"]) and got["after"]


def _child(code, **env):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_FROZEN = """
    import gc, json, os
    if os.environ.get("GC_OFF_BEFORE_IMPORT") == "1":
        gc.disable()
    import torch
    import torch_tpu  # (with the autoload off: imported late, by the user)
    at_import = gc.get_freeze_count()
    torch.ones(2, device="tpu").cpu()  # the first tpu tensor: the backend loads
    print(json.dumps([at_import, gc.get_freeze_count()]))
"""


@pytest.mark.parametrize("env, frozen", [({}, True),
                                         ({"TORCH_TPU_GC_FREEZE": "0"}, False),
                                         ({"GC_OFF_BEFORE_IMPORT": "1"}, False),
                                         ({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, True)],
                         ids=["default", "opt-out", "collector-off", "late-import"])
def test_the_backend_load_freezes_what_is_alive(env, frozen):
    at_import, after_load = _child(_FROZEN, **env)
    assert at_import == 0, "import torch froze objects"
    # torch's, JAX's and torch_tpu's modules, classes and functions: ~400k objects
    assert (after_load > 50_000) if frozen else (after_load == 0), after_load


_STEP = """
    import copy, gc, json, weakref
    import torch
    import torch.nn.functional as F
    import torch_tpu.cache as cache

    # A cycle made after the backend's load (holding a device tensor) is collected.
    class Node:
        pass

    first = torch.ones(3).to("tpu")  # the backend loads (and freezes what is alive)
    node = Node()
    node.self, node.t = node, first
    alive = weakref.ref(node)
    del node
    gc.collect()

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(8, 16), torch.randn(8, 4)

    def losses(model, x, y, compile):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fn = lambda x, y: F.mse_loss(model(x), y)
        fn = torch.compile(fn, backend="tpu") if compile else fn
        out = []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = fn(x, y)
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    tpu = copy.deepcopy(cpu).to("tpu")
    got = losses(tpu, x.to("tpu"), y.to("tpu"), True)
    g = cache.stats()["graphs"]
    print(json.dumps({"frozen": gc.get_freeze_count(), "collected": alive() is None,
                      "losses": got, "expected": losses(cpu, x, y, False),
                      "lowered": g["lowered"], "loaded": g["disk_loads"]}))
"""


def test_cold_then_warm_compiled_step_with_frozen_objects(tmp_path):
    d = str(tmp_path / "cache")
    cold = _child(_STEP, TORCH_TPU_CACHE_DIR=d)
    warm = _child(_STEP, TORCH_TPU_CACHE_DIR=d)
    assert cold["lowered"] > 0 and cold["loaded"] == 0, cold
    assert warm["lowered"] == 0 and warm["loaded"] == cold["lowered"], warm
    for run in (cold, warm):
        assert run["frozen"] > 50_000 and run["collected"], run
        torch.testing.assert_close(run["losses"], run["expected"], rtol=1e-4, atol=1e-5)
    assert warm["losses"] == cold["losses"]
