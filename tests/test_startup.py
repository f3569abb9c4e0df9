"""Start-up cost: `import torch` with torch_tpu installed registers the device only.

The `torch.backends` entry point runs in every `import torch` of the
environment. It registers the `tpu` name, `torch.tpu`, hooks, guard and one
PrivateUse1 fallback; JAX, the op table and dynamo load on first use. Each
test runs a fresh interpreter (this process has imported torch_tpu already,
see conftest.py) and checks `sys.modules` there.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("jax", "jaxlib", "ml_dtypes", "torch._dynamo", "torch._inductor", "torch_tpu.ops",
         "torch_tpu.runtime.executor")


def _run(code, env=None, args=(), timeout=240):
    """Run `code` in a fresh interpreter; return the JSON object of its last line."""
    proc = subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_PRELUDE = f"""
import json, sys
HEAVY = {HEAVY!r}
def loaded():
    return sorted(m for m in HEAVY if m in sys.modules)
"""


def test_import_torch_registers_the_device_and_nothing_heavy():
    out = _run(_PRELUDE + """
import torch
import torch.distributed as dist
heavy = loaded()
print(json.dumps({
    "heavy": heavy,
    "backend": torch._C._get_privateuse1_backend_name(),
    "module": torch.tpu.__name__,
    "device": str(torch.device("tpu", 1)),
    "is_tpu": torch.empty(0).is_tpu,
    "initialized": torch.tpu.is_initialized(),
    "dist": "tpu" in dist.Backend.backend_list,
    "compile_is_torchs": torch.compile.__module__ == "torch" and not hasattr(torch.compile, "__wrapped__"),
    "still_light": loaded(),
}))
""")
    assert out["heavy"] == [] and out["still_light"] == []
    assert out["backend"] == "tpu" and out["module"] == "torch_tpu.device.module"
    assert out["device"] == "tpu:1" and out["is_tpu"] is False
    assert out["initialized"] is False
    assert out["dist"] and out["compile_is_torchs"]


# Each is the first thing that touches the device in its process.
FIRST_OPS = {
    "empty": ("torch.empty(2, 3, device='tpu:0', dtype=torch.int64)",
              "x.shape == (2, 3) and x.dtype == torch.int64"),
    "randn": ("torch.randn(4, 5, device='tpu')",
              "x.shape == (4, 5) and bool(torch.isfinite(x.cpu()).all())"),
    "to": ("torch.arange(6.).reshape(2, 3).to('tpu')",
           "x.cpu().tolist() == [[0., 1., 2.], [3., 4., 5.]]"),
    "tensor": ("torch.tensor([[1, 2], [3, 4]], device='tpu')",
               "x.cpu().tolist() == [[1, 2], [3, 4]] and x.dtype == torch.int64"),
    "load": ("torch.load(buf, map_location='tpu')", "x.cpu().tolist() == [1.5, -2.0, 3.25]"),
}


@pytest.mark.parametrize("name", sorted(FIRST_OPS))
def test_first_tpu_op_loads_the_backend(name):
    expr, check = FIRST_OPS[name]
    out = _run(_PRELUDE + f"""
import io
import torch
buf = io.BytesIO()
torch.save(torch.tensor([1.5, -2.0, 3.25]), buf)
buf.seek(0)
before = loaded()
x = {expr}
ok = {check}
y = (x.float() * 2 + 1).sum().item()  # more ops, through the loaded kernels
print(json.dumps({{"before": before, "after": loaded(), "device": str(x.device), "ok": ok,
                  "y": y, "expect": (x.cpu().float() * 2 + 1).sum().item()}}))
""")
    assert out["before"] == []
    assert out["device"] == "tpu:0" and out["ok"]
    assert out["y"] == pytest.approx(out["expect"])
    assert {"jax", "torch_tpu.ops", "torch_tpu.runtime.executor"} <= set(out["after"])


def test_loading_the_backend_imports_no_compiler():
    """The load itself (JAX, op table, kernels) imports neither dynamo nor inductor.

    (PyTorch's own Python meta kernels import dynamo on their first call,
    through torch._compile._disable_dynamo; the executor runs ops on meta
    tensors, so an eager program may still import it later.)
    """
    out = _run(_PRELUDE + """
import torch
torch.tpu.device_count()
before = loaded()
import torch_tpu
torch_tpu._load()
print(json.dumps({"before": before, "after": loaded(),
                  "kernel": torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor",
                                                                           "PrivateUse1")}))
""")
    assert "torch_tpu.ops" not in out["before"]
    assert {"jax", "torch_tpu.ops", "torch_tpu.runtime.executor"} <= set(out["after"])
    assert "torch._dynamo" not in out["after"] and "torch._inductor" not in out["after"]
    assert out["kernel"]


def test_import_torch_tpu_with_autoload_off():
    """`import torch_tpu` after torch (autoload off) is as light, and works the same."""
    out = _run(_PRELUDE + """
import torch
assert not hasattr(torch, "tpu")
import torch_tpu
before = loaded()
x = torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")
print(json.dumps({"before": before, "after": loaded(), "x": x.cpu().tolist(),
                  "debug": torch_tpu.debug.__name__}))
""", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out["before"] == []
    assert out["x"] == [[2.0, 2.0], [2.0, 2.0]]
    assert "torch_tpu.ops" in out["after"] and out["debug"] == "torch_tpu.debug"


def test_first_ops_from_two_threads():
    """Two threads that both make the first tpu tensor: one load, both correct."""
    out = _run(_PRELUDE + """
import threading
import torch
results, errors = {}, []
def work(i):
    try:
        results[i] = (torch.full((3,), float(i), device="tpu") + 1).cpu().tolist()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps({"results": results, "errors": errors}))
""")
    assert out["errors"] == []
    assert out["results"] == {"0": [1.0, 1.0, 1.0], "1": [2.0, 2.0, 2.0]}


def test_torch_tpu_module_from_a_fresh_import_torch():
    """`torch.tpu` calls start the runtime (JAX) without the op table."""
    out = _run(_PRELUDE + """
import torch
before = loaded()
n = torch.tpu.device_count()
info = {"count": n, "available": torch.tpu.is_available(),
        "initialized": torch.tpu.is_initialized(), "name": torch.tpu.get_device_name(),
        "allocated": torch.tpu.memory_allocated(), "acc": torch.accelerator.device_count()}
torch.tpu.manual_seed(123)
info["seed"] = torch.tpu.initial_seed()
info["rng_state_bytes"] = torch.tpu.get_rng_state().numel()
torch.tpu.synchronize()
runtime_only = loaded()
info["precision"] = torch.tpu.get_matmul_precision()  # the rest of the backend
t = torch.arange(256, dtype=torch.float32).to("tpu")  # a transfer: 1 KiB, nothing else
torch.tpu.synchronize()
info["allocated_1k"] = torch.tpu.memory_allocated()
print(json.dumps({"before": before, "runtime_only": runtime_only, "after": loaded(), **info}))
""")
    assert out["before"] == []
    assert out["count"] >= 1 and out["available"] and out["initialized"]
    assert out["acc"] == out["count"] and out["name"]
    # Starting the runtime holds no device memory; one tensor holds its bytes.
    assert out["allocated"] == 0 and out["allocated_1k"] == 1024
    assert out["seed"] == 123 and out["rng_state_bytes"] == 16
    assert "jax" in out["runtime_only"] and "torch_tpu.ops" not in out["runtime_only"]
    assert out["precision"] in ("highest", "high", "default")
    assert "torch_tpu.ops" in out["after"]


@pytest.mark.parametrize("command", ["info", "clear"])
def test_cache_cli_imports_no_jax(tmp_path, command):
    """`python -m torch_tpu.cache info|clear` reads files: no JAX, no compiler."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torch_tpu.cache", command,
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "torch" in imported and "torch_tpu.cache.store" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert str(tmp_path) in proc.stdout or "nothing to clear" in proc.stdout or \
        "removed" in proc.stdout


def test_startup_benchmark_cli():
    """benchmarks/startup.py parses its options (the benchmark itself is not a test)."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "startup.py")
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "--quick" in proc.stdout and "--notebooks" in proc.stdout
    proc = subprocess.run([sys.executable, script, "--only", "imports"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown section(s) imports" in proc.stderr


@pytest.mark.slow
def test_torch_compile_from_a_fresh_import_torch():
    """torch.compile(backend="tpu"), and inductor's default on tpu inputs, load the backend."""
    out = _run(_PRELUDE + """
import torch
before = loaded()
f = torch.compile(lambda x: (x * 2 + 1).relu(), backend="tpu")
g = torch.compile(lambda x: x.sin() + 1)  # the default backend, redirected for tpu inputs
x = torch.tensor([-1.0, 0.5, 2.0], device="tpu")
print(json.dumps({"before": before, "f": f(x).cpu().tolist(), "g": g(x).cpu().tolist(),
                  "expect_g": (x.cpu().sin() + 1).tolist(), "after": loaded()}))
""")
    assert out["before"] == []
    assert out["f"] == [0.0, 2.0, 5.0]
    assert out["g"] == pytest.approx(out["expect_g"])
    assert {"torch._dynamo", "torch_tpu.ops"} <= set(out["after"])
