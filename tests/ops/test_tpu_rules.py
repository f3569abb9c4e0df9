"""What a real TPU rejects and XLA:CPU forgives, checked on the CPU (issue 33).

A TPU has no 64-bit floating point, and its matmul units round float32
operands to bfloat16 unless a dot asks for more. So the OpInfo float32 (and
bfloat16) forward samples run in a new process that takes the TPU's
branches (`platform.supports_float64()` is False there, as on a TPU: the
lowerings that widen to float64 where a platform has it take their float32
path, and float64 tensors are refused), on an empty cache so that every
program is lowered, and each lowered program's StableHLO is walked
(`programs.LOWERED_LISTENERS`):

- no 64-bit float value: no f64/complex<f64> parameter or result of the
  program, and no operation computing one. JAX's own weakly typed Python
  constants (`jax.random.uniform`'s default bounds, `jnp.where(m, x,
  jnp.nan)`) appear as f64 constants converted to the operand's type at once;
  XLA folds those before a TPU sees them, so constants and their narrowing
  converts are not values here.
- every float32 dot and convolution carries the precision
  `torch.tpu.get_matmul_precision()` implies (`highest` by default, as
  PyTorch's `float32_matmul_precision`).

One sample per op in the default run; every sample, and bfloat16, in the slow set.
Run by hand: `python -m tests.ops.test_tpu_rules float32 1 OUT.json`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# OpInfo entries whose float32 programs keep 64-bit float values, and why.
WIDE_ALLOWED = {
    "pinverse": "PyTorch's composite linalg_pinv makes its atol/rtol float64 tensors on the "
                "input's device (get_atol_rtol: at::full(..., kDouble)) before any tpu kernel runs",
    "linalg.pinv": "as pinverse",
    "linalg.pinv.hermitian": "as pinverse",
    "linalg.matrix_rank": "PyTorch's composite linalg_matrix_rank makes float64 atol/rtol "
                          "tensors (get_atol_rtol) and compares the singular values to them",
    "linalg.matrix_rank.hermitian": "as linalg.matrix_rank",
}

_WIDE = r"(?:f64|complex<f64>)"
_WIDE_TYPE = re.compile(r"tensor<[\dx]*" + _WIDE + ">")
_DOT = re.compile(r"stablehlo\.(dot_general|convolution)\b")
# torch.tpu.get_matmul_precision() -> the precision XLA must see on float32 operands
_XLA_PRECISION = {"highest": "HIGHEST", "high": "HIGH", "default": "DEFAULT"}


def carries(line: str, want: str) -> bool:
    """Whether a dot or convolution line asks for precision `want` (no
    precision attribute at all is DEFAULT)."""
    if f"precision = [{want}, {want}]" in line or (
            f"precision_config = [#stablehlo<precision {want}>, #stablehlo<precision {want}>]"
            in line):
        return True
    return want == "DEFAULT" and "precision" not in line


def wide_values(text: str) -> list[str]:
    """The lines of a StableHLO module that make or pass a 64-bit float value
    (see the module docstring for what is not one)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not _WIDE_TYPE.search(s):
            continue
        if "func.func public @main" in s:
            out.append(s)
            continue
        if s.startswith(("func.func private", "return", "}")) or "stablehlo.constant" in s \
                or " call @" in s:
            continue
        result = s.rsplit("->", 1)[-1] if "->" in s else s.rsplit(":", 1)[-1]
        if _WIDE_TYPE.search(result):
            out.append(s)
    return out


def float32_dots(text: str) -> list[str]:
    """The dot and convolution lines of a module whose result is float32."""
    return [s.strip() for s in text.splitlines()
            if _DOT.search(s) and re.search(r"xf32>\s*$|tensor<f32>\s*$", s.rsplit("->", 1)[-1])]


def walk(dtype_name: str, samples: int, every: int = 1) -> dict:
    """Run every OpInfo forward sample of `dtype_name` (of every `every`-th
    op) as a TPU would lower it and report what the rules find. It changes
    this process (the platform's answer, the environment): call it in a new
    one (the tests, tools/tpu_rules.py)."""
    import torch

    from torch_tpu.runtime import platform

    platform.supports_float64 = lambda: False  # the TPU's branches
    from torch_tpu.runtime import programs

    from . import harness

    want = _XLA_PRECISION[torch.tpu.get_matmul_precision()]
    found: dict = {"ran": 0, "wide": {}, "dots": 0, "imprecise": {}, "precision": want}
    current = [""]

    def listener(name, key, lowered):
        text = lowered.as_text()
        wide = wide_values(text)
        if wide:
            found["wide"].setdefault(current[0], {})[name] = [w[:240] for w in wide[:3]]
        for d in float32_dots(text):
            found["dots"] += 1
            if not carries(d, want):
                found["imprecise"].setdefault(current[0], {})[name] = d[:240]

    programs.LOWERED_LISTENERS.append(listener)
    os.environ["TORCH_TPU_OPINFO_MAX_SAMPLES"] = str(samples)
    os.environ["TORCH_TPU_CPU_FALLBACK"] = "0"
    for i, (name, op) in enumerate(harness.tested_ops()):
        if dtype_name not in harness.cpu_dtypes(op) or i % every:
            continue
        current[0] = name
        found["ran"] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                harness.run_forward(name, op, dtype_name)
            except Exception:  # noqa: BLE001 - values are the op suite's to judge
                pass
    return found


def _walked(tmp_path_factory, dtype_name, samples):
    out = tmp_path_factory.mktemp("tpu_rules") / "found.json"
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(out.parent / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "tests.ops.test_tpu_rules", dtype_name,
                        str(samples), str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=3000)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module", params=[
    pytest.param(("float32", 1), id="float32"),
    pytest.param(("float32", 0), id="float32-all", marks=pytest.mark.slow),
    pytest.param(("bfloat16", 0), id="bfloat16-all", marks=pytest.mark.slow)])
def walked(request, tmp_path_factory):
    dtype_name, samples = request.param
    return dtype_name, _walked(tmp_path_factory, dtype_name, samples)


def test_no_64_bit_float_values_in_32_bit_programs(walked):
    dtype_name, found = walked
    assert found["ran"] > 400, f"only {found['ran']} {dtype_name} OpInfo entries ran"
    wide = {op: programs for op, programs in found["wide"].items() if op not in WIDE_ALLOWED}
    assert not wide, f"{dtype_name} programs with 64-bit float values: {wide}"


def test_float32_dots_carry_the_matmul_precision(walked):
    dtype_name, found = walked
    assert found["precision"] == "HIGHEST"  # torch's default float32_matmul_precision
    if dtype_name == "float32":
        assert found["dots"] > 50, f"only {found['dots']} float32 dots were walked"
    assert not found["imprecise"], f"float32 dots without HIGHEST precision: {found['imprecise']}"


def test_the_rules_see_what_they_look_for():
    """The walkers flag a float64 scalar parameter and an f64 computation, pass
    a folded constant, and read a dot's precision."""
    scalar_param = ("func.func public @main(%arg0: tensor<3xf32>, %arg1: tensor<f64>) -> "
                    "(tensor<3xf32>) {")
    computed = "%1 = stablehlo.multiply %0, %0 : tensor<3xf64>"
    folded = ["%cst = stablehlo.constant dense<1.0> : tensor<f64>",
              "%2 = stablehlo.convert %cst : (tensor<f64>) -> tensor<f32>",
              "%3 = call @_uniform(%k, %cst) : (tensor<2xui32>, tensor<f64>) -> tensor<3xf32>"]
    assert wide_values("\n".join([scalar_param, computed] + folded)) == [scalar_param, computed]
    dot = ("%2 = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0], precision = "
           "[DEFAULT, DEFAULT] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>")
    assert float32_dots(dot) == [dot] and not carries(dot, "HIGHEST") and carries(dot, "DEFAULT")


def _lowered_texts(fn):
    import torch_tpu  # noqa: F401
    from torch_tpu.runtime import programs

    texts = []
    listener = lambda name, key, lowered: texts.append(lowered.as_text())  # noqa: E731
    programs.LOWERED_LISTENERS.append(listener)
    try:
        fn()
    finally:
        programs.LOWERED_LISTENERS.remove(listener)
    return texts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "complex64", "int32"])
def test_python_scalars_of_32_bit_ops_enter_in_32_bits(dtype, cache_dir):
    """`x * 0.1`, `add(x, y, alpha=2.5)`, `x.clamp(min=-0.3)`: no f64 input, the
    values CPU's, on the first call (lowered: a private, empty disk tier, as a
    filled one serves the program without lowering it) and the repeated ones
    (the native kernel's hits narrow the call's own numbers)."""
    import torch

    dt = getattr(torch, dtype)
    x = (torch.randn(6) * 4).to(dt) if not dt.is_complex else torch.randn(6, dtype=dt)
    xt = x.to("tpu")
    scale = 0.1 if not dt.is_complex else 0.1 + 2j
    fns = [lambda a: a * scale, lambda a: torch.add(a, a, alpha=2.5 if dt.is_floating_point else 2)]
    if not dt.is_complex:
        fns.append(lambda a: a.clamp(min=-0.3))
    for f in fns:
        texts = _lowered_texts(lambda: f(xt))
        assert texts and not any(wide_values(t) for t in texts), texts
        for v in (scale, 0.25, -0.0, float("nan")) if f is fns[0] else (None,):
            if v is not None:
                scale = v if not dt.is_complex else complex(v, 1)
            for _ in range(3):  # hits, through the native kernel where it is built
                torch.testing.assert_close(f(xt).cpu(), f(x), equal_nan=True)


def test_64_bit_ops_keep_64_bit_scalars():
    """float64 tensors, and integral results from no floating tensor, keep a
    Python float's 64 bits (values CPU's exactly)."""
    import torch

    x = torch.randn(5, dtype=torch.float64)
    assert torch.equal((x.to("tpu") * 0.1).cpu(), x * 0.1)
    assert torch.equal(torch.full((3,), 123456789.0, dtype=torch.int64, device="tpu").cpu(),
                       torch.full((3,), 123456789.0, dtype=torch.int64))
    assert torch.full((2,), 0.1, dtype=torch.float64, device="tpu")[0].item() == 0.1
    i = torch.tensor([16777217], dtype=torch.int32)
    assert torch.equal((i.to("tpu") > 16777216.5).cpu(), i > 16777216.5)


if __name__ == "__main__":
    result = walk(sys.argv[1], int(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(result))
