"""A process that never uses `tpu` runs PyTorch as if torch_tpu were not installed.

torch_tpu is imported by every `import torch` of its environment (the
`torch.backends` autoload), so code that only compiles CPU programs shares
the process with it. Each test runs a fresh interpreter and checks there:
`torch.compile` is PyTorch's own object, JAX and torch_tpu's compile package
are not imported, no attribute of PyTorch is patched beyond what registering
the device needs (the `torch.accelerator` entry points and `storage.tpu()`),
and the collector has frozen nothing. The tpu backend, named by a compile,
then prepares dynamo itself (through the `torch_dynamo_backends` entry point).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# the features registering the device applies at `import torch` (and only those)
AT_IMPORT = {"torch.accelerator for tpu", "storage.tpu()"}

_REPORT = """
import gc, json, sys
import torch
from torch_tpu import _compat
def report(**extra):
    print(json.dumps({
        "jax": sorted(m for m in ("jax", "jaxlib") if m in sys.modules),
        "torch_tpu_compile": sorted(m for m in sys.modules if m.startswith("torch_tpu.compile")),
        "compile_is_torchs": torch.compile.__module__ == "torch"
                             and not hasattr(torch.compile, "__wrapped__"),
        "features": sorted(set(_compat.applied().values())),
        "marked": sorted(n for n, o in (
            ("optimize", getattr(torch._dynamo, "optimize", None)),
            ("_optimize", getattr(sys.modules.get("torch._dynamo.eval_frame"), "_optimize", None)),
            ("inductor", torch._TorchCompileInductorWrapper.__call__),
            ("tensor_str", sys.modules["torch._tensor_str"]._tensor_str),
            ("dlpack", torch.Tensor.__dlpack__),
        ) if getattr(o, "_torch_tpu_patch", None)),
        "frozen": gc.get_freeze_count(),
        **extra}))
"""


def _run(code: str, timeout: int = 600) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    env["TORCH_TPU_CACHE_DIR"] = os.environ.get("TORCH_TPU_CACHE_DIR", "")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_REPORT + code)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _untouched(out: dict) -> None:
    assert out["jax"] == [], "JAX was imported"
    assert out["torch_tpu_compile"] == [], "torch_tpu's compile package was imported"
    assert out["compile_is_torchs"], "torch.compile is not PyTorch's own"
    assert set(out["features"]) <= AT_IMPORT, out["features"]
    assert out["marked"] == [], f"patched: {out['marked']}"
    assert out["frozen"] == 0, "gc.freeze() was called"


def test_import_torch_changes_nothing_but_the_device_registration():
    _untouched(_run("report()"))


def test_cpu_compile_with_the_eager_backend_leaves_pytorch_alone():
    out = _run("""
f = torch.compile(lambda x: x * 2 + 1, backend="eager")
y = f(torch.ones(3))
report(y=y.tolist(), available=torch.accelerator.is_available())
""")
    _untouched(out)
    assert out["y"] == [3.0, 3.0, 3.0]


@pytest.mark.slow
def test_cpu_compile_with_inductor_leaves_pytorch_alone():
    """(slow: inductor compiles C++ for the CPU, 10-60 s on the 2-core host)"""
    out = _run("""
f = torch.compile(lambda x: (x * 2 + 1).sin())
y = f(torch.ones(3))
report(y=[round(v, 5) for v in y.tolist()])
""")
    _untouched(out)
    assert out["y"] == [round(float(__import__("math").sin(3.0)), 5)] * 3


def test_a_tpu_compile_prepares_dynamo_through_the_entry_point():
    """Naming the backend is what loads and patches: torch.compile itself stays
    PyTorch's, and the patched targets are those the tpu features need."""
    out = _run("""
f = torch.compile(lambda x: x * 2 + 1, backend="tpu")
y = f(torch.ones(3, device="tpu")).cpu()
report(y=y.tolist())
""")
    assert out["y"] == [3.0, 3.0, 3.0]
    assert out["compile_is_torchs"] and out["jax"]
    assert "torch_tpu.compile.entry" in out["torch_tpu_compile"]
    assert {"lighter dynamo bookkeeping", "torch.compile's default backend on tpu inputs",
            'torch.compile(backend="tpu", options={"whole_step": True})'} <= set(out["features"])
    assert {"optimize", "inductor", "tensor_str", "dlpack"} <= set(out["marked"])
    assert out["frozen"] > 0  # the backend loaded: gc.freeze (runtime/gc_pause.freeze)


_UNSUPPORTED = """
import json, sys, warnings
import torch
torch.__version__ = "2.99.0"  # a release outside the supported range
out = {}
if sys.argv[1] == "explicit":
    try:
        import torch_tpu  # noqa: F401
        out["raised"] = None
    except ImportError as e:
        out["raised"] = str(e)
else:  # as torch's autoload imports it (torch/__init__.py: _import_device_backends)
    g = {"__name__": "torch"}
    exec("def _import_device_backends():\\n    import torch_tpu\\n", g)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g["_import_device_backends"]()
    out["warnings"] = [str(x.message) for x in w]
    out["backend"] = torch._C._get_privateuse1_backend_name()
    out["cpu"] = (torch.ones(2) + 1).tolist()
print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["explicit", "autoload"])
def test_a_torch_outside_the_range_is_refused_with_one_message(how):
    """An explicit import raises ImportError naming the range; through torch's
    autoload it warns once and registers nothing, so CPU code still runs."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", _UNSUPPORTED, how], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if how == "explicit":
        assert out["raised"] and "torch>=2.13,<2.15" in out["raised"]
        assert "2.99.0" in out["raised"]
    else:
        [message] = [m for m in out["warnings"] if "torch_tpu" in m]
        assert "torch>=2.13,<2.15" in message and "not registered" in message
        assert out["backend"] == "privateuseone" and out["cpu"] == [2.0, 2.0]
