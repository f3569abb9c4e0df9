"""The views and in-place suite (tests/test_views.py) inside fused eager mode.

Every test of test_views.py is collected here again and runs inside
`torch_tpu.fused()`: aliasing through views, in-place writes, out= and
resize, autograd's saved views must behave as in strict mode when the ops
are recorded and run later as one program (runtime/fused.py).
"""

import pytest

import torch_tpu
from torch_tpu.runtime import fused

from test_views import *  # noqa: F401,F403  (the suite's tests, collected here too)


@pytest.fixture(autouse=True)
def _fused_mode():
    with torch_tpu.fused():
        yield
    assert fused.pending() == 0
    assert not fused.enabled()
