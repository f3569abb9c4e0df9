"""The OpInfo harness on the other paths, for a representative subset of ops.

The whole suite on every path is `python tools/op_paths.py` (docs/op_paths.md;
the slow set runs it here too). The default run covers a stated subset, one
or two ops per family (elementwise, reductions, shape, indexing, linalg, nn,
sorting, fft), float32 forward and gradients:

- **fused**: the sample's ops inside `torch_tpu.fused()`;
- **compiled**: through `torch.compile(backend="tpu")`; a sample that ran no
  compiled graph or ran op by op fails;
- **warm**: the subset in a child process on an empty cache directory, then
  in a second child process on that directory: same outcomes, and the second
  one loads its programs from the eager index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from . import harness

SUBSET = ["add", "mul", "exp", "sigmoid", "where", "sum", "amax", "mean", "var",
          "cat", "transpose", "index_select", "gather", "scatter_add", "index_put",
          "linalg.cholesky", "linalg.solve", "linalg.eigh", "matmul", "nn.functional.conv2d",
          "nn.functional.layer_norm", "nn.functional.cross_entropy", "softmax", "sort", "topk",
          "cumsum", "fft.fft"]

_OPS = {name: op for name, op, dt, kind in harness.cases() if dt == "float32"}
_CASES = [(name, kind) for name in SUBSET
          for kind in ("forward", "grad")
          if name in _OPS and any(n == name and k == kind and d == "float32"
                                  for n, _, d, k in harness.cases())]


def _run(name, kind):
    harness.run_case(name, _OPS[name], "float32", kind, {})


@pytest.fixture
def on_path(monkeypatch, request):
    monkeypatch.setenv("TORCH_TPU_OPINFO_PATH", request.param)
    monkeypatch.setenv("TORCH_TPU_OPINFO_MAX_SAMPLES", "4")
    yield request.param


@pytest.mark.parametrize("on_path", ["fused", "compiled"], indirect=True)
@pytest.mark.parametrize("name,kind", _CASES, ids=[f"{n}-{k}" for n, k in _CASES])
def test_subset_on_path(on_path, name, kind):
    from . import expectations

    reason = expectations.XFAILS.get((name, "float32", kind))
    if reason is not None:
        pytest.skip(f"an expected failure on every path: {reason}")
    reason = expectations.PATH_XFAILS.get((name, "float32", kind, on_path))
    if reason is not None and (name, "float32", kind, on_path) not in expectations.XFAIL_SAMPLES:
        with pytest.raises(Exception):  # noqa: B017 - every sample fails (no lowering)
            _run(name, kind)
        pytest.xfail(reason)
    stats: dict = {}
    harness.run_case(name, _OPS[name], "float32", kind, stats)
    failure = harness.unexpected_outcome(name, "float32", kind, stats)
    if failure:
        pytest.fail(failure, pytrace=False)
    if stats.get("expected_failed"):  # listed samples (XFAIL_SAMPLES), failing as listed
        pytest.xfail(harness.expected_failure_reason(name, "float32", kind, stats))


_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
from tests.ops import harness
from tests.ops.test_paths import _CASES, _run
import torch_tpu
out = {{}}
for name, kind in _CASES:
    try:
        _run(name, kind)
        out[name + "-" + kind] = "passed"
    except Exception as e:
        out[name + "-" + kind] = "failed: " + harness.classify_exception(e)
s = torch_tpu.cache.stats()["eager_index"]
print("RESULT" + json.dumps({{"outcomes": out, "index_hits": s["hits"]}}))
"""


def test_subset_warm(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"),
               TORCH_TPU_OPINFO_MAX_SAMPLES="4", TORCH_TPU_CPU_FALLBACK="0")
    env.pop("TORCH_TPU_OPINFO_PATH", None)
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _CHILD.format(root=root)], env=env,
                           capture_output=True, text=True, timeout=1200, cwd=root)
        assert p.returncode == 0, f"exit {p.returncode}:\n{p.stderr[-3000:]}"
        line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT"))
        runs.append(json.loads(line[len("RESULT"):]))
    cold, warm = runs
    assert warm["outcomes"] == cold["outcomes"]
    assert warm["index_hits"] > 0
