"""The program cache's third bound: the process's memory mappings.

XLA:CPU maps each executable's kernels separately; past vm.max_map_count
LLVM's JIT fails ("Cannot allocate memory") and the next compile dies with
SIGSEGV (PyTorch's test_embedding_bag_1D_padding_idx on tpu, issue 38). The
LRU evicts its oldest entries when the count nears the limit.
"""

from __future__ import annotations

import gc

import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import programs


def test_mapping_count_is_read_on_linux():
    assert programs.map_limit() > 1000
    assert programs.map_count() > 10


def _new_programs(first):
    """20 new programs, one shape each; their results must stay right."""
    for n in range(first, first + 20):
        y = torch.arange(float(n)).to("tpu") * 3
        assert y[-1].item() == 3 * (n - 1)  # results stay right while entries go


def test_near_the_mapping_limit_the_oldest_programs_are_evicted(monkeypatch):
    monkeypatch.setattr(programs, "MAP_CHECK_EVERY", 1)
    # the same work with the bound off: every entry stays
    monkeypatch.setattr(programs, "MAP_LIMIT", 0)
    programs.clear()
    _new_programs(107)
    unbounded = len(programs.CACHE)
    programs.clear()
    x = torch.arange(6.0).to("tpu")
    (x + 1).sum().item()  # the runtime's first programs
    # the executables that clear() dropped unmap when they are collected:
    # done now, or the count would fall under the limit below mid-loop
    gc.collect()
    base = programs.map_count()
    # a limit whose threshold (MAP_FRACTION of it) is 90 % of the count now:
    # every check finds the count above it, however much of it is the cache's
    # (in a worker that ran notebooks first, most mappings are not), so each
    # insertion evicts the oldest entries
    monkeypatch.setattr(programs, "MAP_LIMIT", int(0.9 * base / programs.MAP_FRACTION))
    before = programs.STATS.map_evictions
    _new_programs(7)
    assert programs.STATS.map_evictions > before
    assert len(programs.CACHE) < unbounded / 2, (len(programs.CACHE), unbounded)


def test_below_the_limit_nothing_is_evicted(monkeypatch):
    programs.clear()
    monkeypatch.setattr(programs, "MAP_CHECK_EVERY", 1)
    monkeypatch.setattr(programs, "MAP_LIMIT", 10**9)
    before = programs.STATS.map_evictions
    for n in range(30, 40):
        (torch.ones(n).to("tpu") * 2).sum().item()
    assert programs.STATS.map_evictions == before
