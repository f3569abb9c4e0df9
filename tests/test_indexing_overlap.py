"""Indexing writes into memory they also read, on `tpu` as on PyTorch CPU.

CPU refuses an in-place index_add_/index_copy_/scatter*_/put_/masked_scatter_
into an expanded tensor (several elements stored in one place) and any
indexing write whose index or source shares memory with the written tensor;
index_fill_/index_put_/masked_fill_ into an expanded tensor only warn. A
functional lowering would compute *some* answer for each of these, so tpu
checks them before running (torch_tpu/ops/indexing.py, `_WRITE_RULES`). Each
case runs on both devices and must raise the same error (with the op named on
tpu) or succeed with the same warnings and values.
"""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

L = torch.long


def _cases(dev):
    def z(*shape, dtype=torch.float32):
        return torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape).to(dev)

    def expanded():
        return z(1, 5).expand(4, 5)

    def t(v):
        return torch.tensor(v, device=dev)

    rows = t([2, 0])
    srows = t([[1, 3, 0, 2, 1]])
    mask = t([[True, False, True, False, True]] * 4)

    def own(f, *shape, dtype=torch.float32):
        return lambda: (lambda a: (f(a), a)[1])(z(*shape, dtype=dtype))

    return {
        "index_add_ expanded": lambda: expanded().index_add_(0, rows, z(2, 5)),
        "index_add_ source is self": own(lambda a: a.index_add_(0, rows, a[1:3]), 4, 5),
        "index_add_ index is self": own(lambda a: a.index_add_(0, a[0, 1:3], z(2, 5, dtype=L)), 4, 5, dtype=L),
        "index_copy_ expanded": lambda: expanded().index_copy_(0, rows, z(2, 5)),
        "index_copy_ source overlaps": own(lambda a: a.index_copy_(0, rows, a[2:]), 4, 5),
        "index_fill_ expanded warns": lambda: expanded().index_fill_(1, t([1, 3]), -1.0),
        "index_fill_ index is self": own(lambda a: a.index_fill_(0, a[1:3], 7), 6, dtype=L),
        "scatter_ expanded": lambda: expanded().scatter_(0, srows, z(1, 5)),
        "scatter_ value expanded": lambda: expanded().scatter_(0, srows, 2.5),
        "scatter_ source overlaps": own(lambda a: a.scatter_(0, srows, a[3:]), 4, 5),
        "scatter_ index is self": own(lambda a: a.scatter_(0, a[:1] % 4, z(1, 5, dtype=L)), 4, 5, dtype=L),
        "scatter_ reduce warns and refuses": own(lambda a: a.scatter_(0, srows, a[:1], reduce="multiply"), 4, 5),
        "scatter_ reduce warns": own(lambda a: a.scatter_(0, srows, z(1, 5), reduce="add"), 4, 5),
        "scatter_add_ source overlaps": own(lambda a: a.scatter_add_(0, srows, a[1:2]), 4, 5),
        "scatter_reduce_ expanded": lambda: expanded().scatter_reduce_(0, srows, z(1, 5), "amin"),
        "scatter_reduce_ source overlaps": own(lambda a: a.scatter_reduce_(0, srows, a[2:3], "mean"), 4, 5),
        "put_ expanded": lambda: expanded().put_(t([1, 7]), z(2)),
        "put_ source overlaps": own(lambda a: a.put_(t([0, 9]), a.flatten()[3:5], accumulate=True), 4, 5),
        "index_put_ expanded warns": lambda: expanded().index_put_((rows,), z(2, 5)),
        "index_put_ values overlap": own(lambda a: a.index_put_((rows,), a[1:3]), 4, 5),
        "index_put_ index is self": own(lambda a: a.index_put_((a[:2],), z(2, dtype=L)), 6, dtype=L),
        "setitem values overlap": own(lambda a: a.__setitem__(rows, a[:2] * 1), 4, 5),
        "setitem values are a view of self": own(lambda a: a.__setitem__(rows, a[1:3]), 4, 5),
        "masked_fill_ expanded warns": lambda: expanded().masked_fill_(mask, 9.0),
        "masked_scatter_ expanded": lambda: expanded().masked_scatter_(mask, z(20)),
        "index_add out= is source": lambda: (lambda o: torch.index_add(z(4, 5), 0, rows, o[:2], out=o))(z(4, 5)),
        "index_add out= is self": lambda: (lambda o: torch.index_add(o, 0, rows, z(2, 5), out=o))(z(4, 5)),
        "index_add out= expanded": lambda: torch.index_add(z(4, 5), 0, rows, z(2, 5), out=expanded()),
        "index_copy out= is source": lambda: (lambda o: torch.index_copy(z(4, 5), 0, rows, o[2:], out=o))(z(4, 5)),
        "scatter out= is source": lambda: (lambda o: torch.scatter(z(4, 5), 0, srows, o[:1], out=o))(z(4, 5)),
        "scatter_add out= is source": lambda: (lambda o: torch.scatter_add(z(4, 5), 0, srows, o[1:2], out=o))(z(4, 5)),
        "no overlap: disjoint views of one storage": own(lambda a: a[:2].index_add_(0, t([1, 0]), a[2:]), 4, 5),
    }


CASES = sorted(_cases("cpu"))


def _run(f):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = f()
            error = None
        except Exception as e:  # noqa: BLE001 - compared with CPU's below
            value, error = None, e
    # scatter_'s reduce= warning is once per process: see test_scatter_reduce_warns_once.
    texts = [str(w.message).split(" (Triggered internally")[0] for w in caught
             if "deprecated" in str(w.message) and "reduce argument" not in str(w.message)]
    return value, error, texts


@pytest.mark.parametrize("name", CASES)
def test_matches_cpu(name):
    want, want_err, want_warn = _run(_cases("cpu")[name])
    got, got_err, got_warn = _run(_cases("tpu")[name])
    assert got_warn == want_warn
    if want_err is not None:
        assert type(got_err) is type(want_err), got_err
        assert str(got_err).startswith(str(want_err)), (str(got_err), str(want_err))
        assert "aten." in str(got_err)  # the op is named
    else:
        assert got_err is None, got_err
        if isinstance(want, torch.Tensor) and name != "index_put_ expanded warns":
            # (index_put_ into an expanded tensor: rows stored in one place,
            # which write lands last is unspecified; only the warning counts.)
            torch.testing.assert_close(got.cpu(), want)


def test_cases_cover_both_outcomes():
    outcomes = [_run(_cases("cpu")[n])[1] is None for n in CASES]
    assert any(outcomes) and not all(outcomes)


def test_masked_scatter_reading_its_own_memory():
    """CPU's masked_scatter_ reads a source that aliases self element by
    element while writing (later elements see earlier writes); tpu reads the
    source as it was before the op, as any functional program does. CPU
    raises nothing for this, so neither does tpu; the values differ."""
    a = torch.arange(12.0, device="tpu").reshape(3, 4)
    m = torch.tensor([[True, False, True, True]] * 3, device="tpu")
    a.masked_scatter_(m, a.flatten())
    b = torch.arange(12.0).reshape(3, 4)
    expected = b.clone().masked_scatter_(m.cpu(), b.flatten().clone())  # the source as before
    torch.testing.assert_close(a.cpu(), expected)


def test_scatter_reduce_warns_once():
    """CPU warns about scatter_'s reduce= once per process (TORCH_WARN_ONCE)."""
    code = textwrap.dedent("""
        import warnings, torch, torch_tpu
        counts = []
        for dev in ("cpu", "tpu"):
            for _ in range(3):
                x = torch.zeros(3, 4, device=dev)
                i = torch.tensor([[0, 1, 2, 0]], device=dev)
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    x.scatter_(0, i, torch.ones(1, 4, device=dev), reduce="add")
                counts.append(sum("reduce argument" in str(m.message) for m in w))
        print(counts)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip().splitlines()[-1] == "[1, 0, 0, 1, 0, 0]"
