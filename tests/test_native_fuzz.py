"""The native fast path cannot crash the interpreter on user input.

tests/native_fuzz.py drives random eager calls (shapes with 0/1 sizes and
broadcasting, eight dtypes, views, Python scalars, in-place forms) through
the C++ kernel and through the pure-Python path (TORCH_TPU_NATIVE=0), each
against PyTorch on the CPU: equal values or the same exception type. Each
runs in a child process, so a signal fails the test with its number instead
of killing the pytest worker.
"""

import os
import subprocess
import sys

import pytest

from torch_tpu.runtime import fastpath

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_fuzz.py")


def _fuzz(examples, native):
    env = dict(os.environ)
    env["TORCH_TPU_NATIVE"] = "1" if native else "0"
    p = subprocess.run([sys.executable, SCRIPT, str(examples)], env=env, capture_output=True,
                       text=True, timeout=1200)
    assert p.returncode == 0, (
        f"exit {p.returncode}" + (" (killed by a signal)" if p.returncode < 0 else "")
        + f"\n{p.stdout[-2000:]}\n{p.stderr[-6000:]}")
    assert ("native" if native else "pure Python") in p.stdout.splitlines()[-1]


@pytest.mark.parametrize("native", [True, False], ids=["native", "pure_python"])
def test_random_calls_match_cpu(native):
    if native and not fastpath.ACTIVE:
        pytest.fail(f"the native extension is not loaded: {fastpath.REASON}")
    _fuzz(80, native)


@pytest.mark.slow
@pytest.mark.parametrize("native", [True, False], ids=["native", "pure_python"])
def test_random_calls_match_cpu_long(native):
    _fuzz(1500, native)
