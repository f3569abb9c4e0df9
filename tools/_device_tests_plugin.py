"""pytest plugin for tools/pytorch_device_tests.py: device-side checks are
reported by the test that made them.

A device-side check (an index out of range, `torch_tpu.runtime.asserts`) is
read when the host next waits. In a run of PyTorch's test files, a test that
indexes out of range and reads nothing would otherwise pass its error to
whichever later test reads a value first. Each test starts with no check
pending; the checks a passing test leaves are read when it ends, so their
error fails that test; after a failing one they are dropped (its own error is
the one to report). Inert for a CPU run (nothing is ever pending).
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    from torch_tpu.runtime import asserts

    asserts.discard()
    try:
        result = yield
    except BaseException:
        asserts.discard()
        raise
    asserts.check()
    return result
