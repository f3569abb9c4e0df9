"""Python scalars as device buffers: bounded, so a new float per step holds a
flat number of live buffers (issue 48 item 3: 3,000 distinct floats used to
leave 3,001 live buffers, an eager AdamW loop one more per step).

The tables' limits are lowered here so that a few hundred steps cross them;
the values stay right after their arrays were evicted and made again.
"""

from __future__ import annotations

import gc

import jax
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import fastpath, scalars

LIMIT = 32


@pytest.fixture
def small_tables(monkeypatch):
    """Both scalar tables bounded at LIMIT for the test (their real bound is 1024)."""
    monkeypatch.setattr(fastpath.SCALARS, "limit", LIMIT)
    monkeypatch.setattr(scalars._WEAK32, "limit", LIMIT)
    fastpath.SCALAR_ARRAYS.clear()  # earlier tests' entries: beyond the lowered limit
    scalars._WEAK32.arrays.clear()
    yield


def _live() -> int:
    gc.collect()  # count reachable buffers only
    torch.tpu.synchronize()
    return len(jax.live_arrays())


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_new_float_each_step_holds_flat_buffers(small_tables, path):
    x = torch.arange(4.0, device="tpu")
    counts = []
    for i in range(12 * LIMIT):
        f = 1.0 + i * 1e-3
        if path == "fused":
            with torch_tpu.fused():
                y = x * f + f
        else:
            y = x * f + f
        if i in (4 * LIMIT, 8 * LIMIT, 12 * LIMIT - 1):
            counts.append(_live())
    # flat once the tables are full: no buffer per value
    assert counts[0] == counts[1] == counts[2], counts
    assert len(fastpath.SCALAR_ARRAYS) <= LIMIT and len(scalars._WEAK32.arrays) <= LIMIT
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) * f + f)


def test_evicted_scalar_is_made_again_with_its_value(small_tables):
    x = torch.ones(3, device="tpu")
    first = (x * 3.25).cpu()
    for i in range(3 * LIMIT):  # push 3.25 out of both tables
        (x * (7.0 + i)).cpu()
    held = list(fastpath.SCALAR_ARRAYS) + list(scalars._WEAK32.arrays)
    assert not any(k[1] == 3.25 for k in held)
    torch.testing.assert_close((x * 3.25).cpu(), first)
    torch.testing.assert_close(first, torch.full((3,), 3.25))


def test_adamw_loop_with_a_schedule_holds_flat_buffers(small_tables):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    x = torch.randn(4, 8, device="tpu")
    counts = []
    for i in range(12 * LIMIT):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        if i % LIMIT == LIMIT - 1:
            counts.append(_live())
    assert counts[5] == counts[-1], counts


def test_table_evicts_oldest_first():
    table = fastpath.ScalarArrays(3)
    for k in "abcd":
        table.put(k, k.upper())
    assert list(table.arrays) == ["b", "c", "d"]
    table.put("b", "B2")  # put again: now the newest
    table.put("e", "E")
    assert list(table.arrays) == ["d", "b", "e"] and table.arrays["b"] == "B2"
