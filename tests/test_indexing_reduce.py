"""`index_reduce_` on `tpu` against PyTorch CPU, for the cases that differ by
more than values: integer dtypes (mean rounds down, prod wraps around),
half precision, every dimension, non-contiguous destination, source and
index, int32 and int64 indices, repeated and absent indices, and
`include_self=False` (rows never indexed keep their value, indexed ones start
from the reduction's identity). PyTorch's own test_indexing.py
`test_index_reduce` covers the same ground with random sizes; these are fixed
cases of our own.
"""

import itertools

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

SIZE = (3, 4, 5)


def _make(shape, dtype, seed, noncontig):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 3
    elif dtype is torch.uint8:
        x = torch.randint(0, 20, shape, generator=g)
    else:
        x = torch.randint(-20, 20, shape, generator=g)
    x = x.to(dtype)
    if noncontig:
        # the same values in a tensor with doubled strides
        wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        wide[..., ::2] = x
        x = wide[..., ::2]
        assert not x.is_contiguous() or x.numel() <= 1
    return x


_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float64]
_REDUCES = ["prod", "mean", "amax", "amin"]


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_index_reduce_matches_cpu(dtype):
    # One pass over the reductions, with dim, include_self, the index dtype
    # and which operand is non-contiguous cycling through their values.
    layouts = itertools.cycle(itertools.product([False, True], repeat=3))
    index_dtypes = itertools.cycle([torch.int64, torch.int32])
    case = 0
    for reduce, include_self, dim in itertools.product(_REDUCES, (True, False), range(3)):
        dest_nc, src_nc, idx_nc = next(layouts)
        # repeated indices, and some rows of `dim` never indexed
        picks = [0, 2, 0, 2, 1, 0][: SIZE[dim] + 2]
        src_shape = SIZE[:dim] + (len(picks),) + SIZE[dim + 1:]
        dest = _make(SIZE, dtype, case, dest_nc)
        src = _make(src_shape, dtype, 100 + case, src_nc)
        index = torch.tensor(picks, dtype=next(index_dtypes))
        if idx_nc:
            index = torch.stack([index, index], 1)[:, 0]
        case += 1
        want = dest.clone().index_reduce_(dim, index, src, reduce, include_self=include_self)
        got = dest.to("tpu")
        out = got.index_reduce_(dim, index.to("tpu"), src.to("tpu"), reduce,
                                include_self=include_self)
        assert out is got
        tol = {} if dtype in (torch.float16, torch.bfloat16) else {"rtol": 0, "atol": 0}
        torch.testing.assert_close(got.cpu(), want, **tol,
                                   msg=lambda m: f"{reduce} dim={dim} self={include_self}: {m}")


def _error_cases(dev):
    x = torch.zeros(3, 4, device=dev)
    src = torch.ones(2, 4, device=dev)
    idx = torch.tensor([0, 1], device=dev)

    def t(*a, **k):
        return torch.tensor(*a, device=dev, **k)

    return {
        "reduce sum": lambda: x.index_reduce_(0, idx, src, "sum"),
        "reduce before dim": lambda: x.index_reduce_(5, idx, src, "sum"),
        "dim": lambda: x.index_reduce_(2, idx, src, "prod"),
        "negative dim": lambda: x.index_reduce_(-3, idx, src, "amax"),
        "dim of a 0-d self": lambda: torch.zeros((), device=dev).index_reduce_(
            1, t([0]), torch.ones((), device=dev), "amax"),
        "2-d float index": lambda: x.index_reduce_(0, idx.reshape(1, 2).float(), src, "prod"),
        "int16 index": lambda: x.index_reduce_(0, idx.short(), src, "prod"),
        "source dtype": lambda: x.index_reduce(0, t([0, 1, 2]), src.double(), "mean"),
        "source rank": lambda: x.index_reduce_(1, t([0]), torch.ones(4, device=dev), "prod"),
        "index count": lambda: x.index_reduce_(0, idx, src.reshape(8), "prod"),
        "0-d source": lambda: x.index_reduce_(0, t([0, 1]), torch.ones((), device=dev), "prod"),
        "source shape": lambda: x.index_reduce_(0, idx, torch.ones(2, 5, device=dev), "prod"),
        "bool": lambda: torch.zeros(3, dtype=torch.bool, device=dev).index_reduce_(
            0, t([0]), torch.ones(1, dtype=torch.bool, device=dev), "amax"),
        "complex": lambda: torch.zeros(3, dtype=torch.complex64, device=dev).index_reduce_(
            0, t([0]), torch.ones(1, dtype=torch.complex64, device=dev), "prod"),
        "out reduce": lambda: torch.index_reduce(x, 0, idx, src, "sum",
                                                 out=torch.zeros(3, 4, device=dev)),
        "expanded self": lambda: torch.zeros(1, 4, device=dev).expand(3, 4).index_reduce_(
            0, idx, src, "prod"),
        "source is self": lambda: x.index_reduce_(0, idx, x[:2], "prod"),
        "out is source": lambda: (lambda o: torch.index_reduce(x, 0, idx, o[:2], "prod",
                                                               out=o))(torch.ones(3, 4, device=dev)),
    }


def test_index_reduce_errors_match_cpu():
    """CPU's exception type and text for every argument error (the op's name
    follows on tpu), checked from shapes, dtypes and memory only: no index
    value is read back. Before, several of these ran and returned a result."""
    cpu, tpu = _error_cases("cpu"), _error_cases("tpu")
    for name in cpu:
        with pytest.raises(Exception) as want:
            cpu[name]()
        with pytest.raises(want.type) as got:
            tpu[name]()
        assert str(got.value).startswith(str(want.value)), (name, str(got.value))
        assert "aten.index_reduce" in str(got.value), name
