"""benchmarks/scale.py: the pure-JAX decoder matches the transformers models, and
`--small` runs its paths end to end."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "scale.py"


def _scale():
    spec = importlib.util.spec_from_file_location("scale_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # ~20 s a model on 2 loaded cores (jit compiles)
@pytest.mark.parametrize("model", ["llama-1b", "qwen3-1.7b", "qwen2-0.5b"])
def test_jax_decoder_matches_torch(model):
    """Prefill then one donated decoding step give the torch forward's logits
    (float32; llama3 RoPE, Qwen3's q/k norms, Qwen2's biases)."""
    scale = _scale()
    diff, size = scale.check_jax(scale.model_config(model, small=True))
    assert diff < 1e-4 * max(1.0, size), (diff, size)


def test_peak_rss_resets():
    scale = _scale()
    scale.reset_peak_rss()
    assert scale.peak_rss() >= scale.rss() > 0


@pytest.mark.slow
def test_small_run(tmp_path):
    """--small through a generation path, the JAX limit, a training path and
    two loading paths, each in its own process; the figures land in --json."""
    out = tmp_path / "fig.json"
    paths = "eager,jax,train-eager,load-to,load-assign"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--small", "--prompt", "8", "--tokens", "4",
         "--cache-len", "16", "--train-seq", "16", "--repeats", "1", "--paths", paths,
         "--json", str(out)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())["results"]
    for p in paths.split(","):
        assert "error" not in res[p], res[p]
    assert res["eager"]["decode_tps"] > 0 and res["jax"]["decode_tps"] > 0
    assert res["eager"]["programs_timed"]["graphs"] == 0
    assert res["train-eager"]["step_s"] > 0
    for p in ("load-to", "load-assign"):
        assert res[p]["devices"] == ["tpu:0"] and res[p]["tied"] and res[p]["finite"]
        assert 0.99 < res[p]["tpu_copies"] < 1.01
    assert "| eager |" in r.stdout and "| load-to |" in r.stdout
