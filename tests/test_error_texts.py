"""Errors of bad calls: CPU's exception type and text, on tpu (the every-path issue's
cases and those the native fuzz found, tests/native_fuzz.py)."""

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off, and no fallback counted: an op without a lowering
# would otherwise raise CPU's own error through the fallback.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

CASES = {
    "nonzero out dtype": lambda d: torch.nonzero(torch.ones(3, 3, device=d),
                                                 out=torch.empty(0, device=d)),
    "rot90 dim out of range": lambda d: torch.rot90(torch.ones(3, 3, device=d), 1, [0, 5]),
    "rot90 same dims": lambda d: torch.rot90(torch.ones(3, 3, device=d), 1, [0, 0]),
    "argmax bool empty": lambda d: torch.argmax(torch.ones(0, dtype=torch.bool, device=d)),
    "argmin complex empty": lambda d: torch.argmin(torch.ones(0, dtype=torch.complex64,
                                                              device=d)),
    "clamp complex": lambda d: torch.clamp(torch.ones(2, dtype=torch.complex64, device=d), -1),
    "relu complex": lambda d: torch.relu(torch.ones(2, dtype=torch.complex64, device=d)),
    "relu bool": lambda d: torch.relu(torch.ones(2, dtype=torch.bool, device=d)),
    "sub bool scalar": lambda d: torch.sub(torch.ones(2, device=d), False),
    "rsub bool scalar": lambda d: torch.rsub(torch.ones(2, device=d), True),
    "abs bool": lambda d: torch.ones(2, dtype=torch.bool, device=d).abs(),
    "floor bool": lambda d: torch.ones(2, dtype=torch.bool, device=d).floor(),
    "remainder bool": lambda d: torch.ones(2, dtype=torch.bool, device=d).remainder(True),
    "sign complex": lambda d: torch.ones(2, dtype=torch.complex64, device=d).sign(),
    "maximum complex": lambda d: torch.maximum(torch.ones(2, dtype=torch.complex64, device=d),
                                               torch.ones(2, device=d)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_matches_cpu(case):
    fn = CASES[case]
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(Exception) as tpu:
        fn("tpu")
    assert type(tpu.value) is type(cpu.value)
    # The tpu may name the op after CPU's text; CPU's text must be there.
    assert str(cpu.value).splitlines()[0] in str(tpu.value)
