"""Views and in-place ops alias exactly as on CPU.

Each case is a function of a fresh base tensor; it runs once on CPU and once
on tpu, and every tensor it returns (views, bases, results) must match, as
must the base itself afterwards (writes through views reach it).
"""

import pytest
import torch

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback): an op here without a tpu
# lowering fails instead of comparing the CPU with itself.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


def _base(device, shape=(4, 6), dtype=torch.float32):
    return torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape).clone().to(device)


def _check(fn, shape=(4, 6), dtype=torch.float32):
    cpu_base = _base("cpu", shape, dtype)
    tpu_base = _base("tpu", shape, dtype)
    cpu_out = fn(cpu_base)
    tpu_out = fn(tpu_base)
    torch.testing.assert_close(tpu_base.cpu(), cpu_base, rtol=0, atol=0)
    cpu_leaves = cpu_out if isinstance(cpu_out, (tuple, list)) else [cpu_out]
    tpu_leaves = tpu_out if isinstance(tpu_out, (tuple, list)) else [tpu_out]
    assert len(cpu_leaves) == len(tpu_leaves)
    for c, t in zip(cpu_leaves, tpu_leaves):
        if isinstance(c, torch.Tensor):
            assert t.device.type == "tpu"
            assert t.shape == c.shape and t.dtype == c.dtype
            assert t._is_view() == c._is_view()
            if c._is_view():
                # Computed results are always dense row-major on tpu (their
                # memory format is not preserved); views match CPU exactly.
                assert t.stride() == c.stride(), (t.stride(), c.stride())
                assert t.storage_offset() == c.storage_offset()
            torch.testing.assert_close(t.cpu(), c, rtol=0, atol=0)
        else:
            assert t == c


def _inplace(view_fn, op=lambda v: v.add_(100)):
    def fn(x):
        v = view_fn(x)
        op(v)
        return v, x
    return fn


VIEWS = {
    "slice": lambda x: x[1:3],
    "slice_step": lambda x: x[:, ::2],
    "select": lambda x: x[2],
    "select_col": lambda x: x[:, 3],
    "transpose": lambda x: x.t(),
    "permute": lambda x: x.reshape(2, 2, 6).permute(2, 0, 1),
    "view": lambda x: x.view(-1),
    "view_split_dim": lambda x: x.view(2, 2, 3, 2),
    "reshape_view": lambda x: x.reshape(6, 4),
    "expand": lambda x: x[:1].expand(3, 6),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[:1].squeeze(0),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(offset=2),
    "unfold": lambda x: x.unfold(1, 2, 2),
    "narrow": lambda x: x.narrow(1, 2, 3),
    "as_strided": lambda x: x.as_strided((3, 3), (5, 1), 2),
    "chain": lambda x: x.t()[1:4].transpose(0, 1)[::2],
    "alias": lambda x: torch.ops.aten.alias(x),
    "detach": lambda x: x.detach(),
    "movedim": lambda x: x.reshape(2, 3, 4).movedim(0, 2),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_values_and_metadata(name):
    _check(VIEWS[name])


INPLACE_VIEWS = {k: v for k, v in VIEWS.items() if k not in ("expand",)}


@pytest.mark.parametrize("name", sorted(INPLACE_VIEWS))
def test_inplace_through_view_reaches_base(name):
    _check(_inplace(INPLACE_VIEWS[name]))


@pytest.mark.parametrize("name", ["slice", "transpose", "diagonal", "chain", "select_col"])
def test_other_views_see_the_write(name):
    def fn(x):
        other = x.view(-1)
        t = x.t()
        VIEWS[name](x).mul_(-1)
        return other, t, x
    _check(fn)


def test_split_chunk_unbind_write_through():
    def fn(x):
        a, b = x.split(3, dim=1)
        c = x.chunk(2, dim=0)[1]
        rows = x.unbind(0)
        a.add_(1)
        c.mul_(2)
        rows[0].zero_()
        return a, b, c, rows[0], rows[3], x
    _check(fn)


def test_setitem_forms():
    def fn(x):
        x[0] = 1
        x[1, 2] = -5
        x[2:, ::3] = 7
        x[:, -1] += 10
        x[..., 0] *= 3
        return x
    _check(fn)


def test_masked_assignment():
    def fn(x):
        x[x > 10] = 0
        x.masked_fill_(x == 3, -1)
        return x
    _check(fn)


def test_index_put_accumulate():
    def fn(x):
        idx = torch.tensor([0, 2, 0], device=x.device)
        x.index_put_((idx,), torch.ones(6, device=x.device), accumulate=True)
        x[torch.tensor([1, 3], device=x.device), torch.tensor([0, 5], device=x.device)] = 42
        return x
    _check(fn)


def test_out_variants():
    def fn(x):
        out = torch.empty(4, 6, device=x.device)
        torch.add(x, 1, out=out)
        view_out = x[:, :3]
        torch.mul(x[:, 3:], 2, out=view_out)
        return out, x
    _check(fn)


def test_out_resize():
    def fn(x):
        out = torch.empty(0, device=x.device)
        torch.add(x, x, out=out)
        return out
    _check(fn)


def test_resize_():
    def fn(x):
        y = x.clone()
        y.resize_(2, 3)
        z = x.clone().reshape(-1)
        z.resize_(30)
        return y, z[:24]
    _check(fn)


def test_copy_between_devices_and_views():
    def fn(x):
        src = torch.arange(4.0).to(x.device) * -1
        x[1].narrow(0, 1, 4).copy_(src)
        x[:, 0].copy_(torch.tensor([9.0, 8.0, 7.0, 6.0]))  # from CPU
        x.t()[5].copy_(torch.tensor(1.5))
        return x
    _check(fn)


def test_dtype_conversion_copy():
    def fn(x):
        i = torch.zeros(4, 6, dtype=torch.int32, device=x.device)
        i.copy_(x * 1.7)
        b = torch.zeros(4, 6, dtype=torch.bool, device=x.device)
        b.copy_(x)
        return i, b, x.to(torch.bfloat16), x.half()
    _check(fn)


def test_version_counter():
    for device in ("cpu", "tpu"):
        x = _base(device)
        v0 = x._version
        x.add_(1)
        assert x._version == v0 + 1
        y = x[1]
        y.mul_(2)
        assert x._version == y._version == v0 + 2


def test_set_data_and_set_():
    def fn(x):
        y = torch.zeros(2, 2, device=x.device)
        y.data = x[:2, :2]
        z = torch.empty(0, device=x.device)
        z.set_(x)
        z[0, 0] = 99
        w = torch.empty(0, device=x.device)
        w.set_(x.untyped_storage(), 6, (3, 2), (6, 1))
        return y, z, w, x
    _check(fn)


def test_detach_aliases_and_is_storage_shared():
    x = _base("tpu")
    d = x.detach()
    d[0, 0] = -1
    assert x[0, 0].item() == -1
    assert d.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert x.clone().untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_view_as_real_complex_and_dtype_views():
    def fn(x):
        c = torch.view_as_complex(x.reshape(4, 3, 2))
        r = torch.view_as_real(c)
        c.mul_(2)
        as_int = x.view(torch.int32)
        return c, r, as_int, x
    _check(fn)


def test_autograd_saved_views():
    # Autograd keeps shallow copies of saved tensors; they must see the data.
    for device in ("cpu", "tpu"):
        a = torch.linspace(-1, 1, 12, device=device).reshape(3, 4).requires_grad_()
        y = a.t().exp()
        y.sum().backward()
        if device == "cpu":
            ref = a.grad.clone()
        else:
            torch.testing.assert_close(a.grad.cpu(), ref)


def test_inplace_on_leaf_view_autograd():
    results = {}
    for device in ("cpu", "tpu"):
        w = torch.ones(4, 3, device=device, requires_grad=True)
        x = w * 2
        x[1:3].mul_(torch.arange(3.0, device=device))
        x.sum().backward()
        results[device] = (x.detach().cpu(), w.grad.cpu())
    torch.testing.assert_close(results["tpu"], results["cpu"])


def _random_layouts(n, seed=0):
    import random

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        ndim = rng.randint(1, 4)
        sizes = tuple(rng.randint(1, 4) for _ in range(ndim))
        strides = tuple(rng.choice([0, 1, 2, 3, 5, 7, 12]) for _ in range(ndim))
        offset = rng.randint(0, 6)
        span = offset + sum((s - 1) * st for s, st in zip(sizes, strides))
        if span < 96:
            out.append((sizes, strides, offset))
    return out


@pytest.mark.parametrize("layout", _random_layouts(40))
def test_strided_read_and_write_match_cpu(layout):
    sizes, strides, offset = layout
    no_overlap = len({sum(i * s for i, s in zip(idx, strides)) for idx in
                      __import__("itertools").product(*[range(n) for n in sizes])}) == \
        torch.Size(sizes).numel()

    def fn(x):
        v = x.as_strided(sizes, strides, offset)
        r = v * 1  # a read through the view
        if no_overlap:
            v.add_(torch.arange(v.numel(), dtype=x.dtype, device=x.device).reshape(sizes))
        return r, x

    _check(fn, shape=(96,))


# Views taken at many offsets of one storage (a loop over rows or columns):
# each case reads and writes through views that differ only in their offset.
_OFFSET_LOOPS = {
    "rows": lambda x, s, i: x[i].copy_(s[i]),
    "setitem": lambda x, s, i: x.__setitem__((i, slice(None)), s[i] * 2),
    "columns": lambda x, s, i: x[:, i % 8].add_(s[:, i % 8]),
    "strided": lambda x, s, i: x[i, ::2].mul_(s[i, 1::2]),
    "reshaped": lambda x, s, i: x.view(-1)[i * 3:i * 3 + 4].sub_(s[i, :4]),
    "dtype_view": lambda x, s, i: x[i].view(torch.int32).bitwise_xor_(
        s[i].view(torch.int32)),
    "neg_view": lambda x, s, i: x[i].add_(torch._neg_view(s[i])),  # a lazy negative view
}


@pytest.mark.parametrize("case", sorted(_OFFSET_LOOPS))
def test_view_offset_is_a_runtime_input(case):
    """A view's storage offset is an input of the program, not part of it:
    a loop over 20 offsets compiles what 2 offsets compile, and every write
    lands where CPU's does."""
    from torch_tpu.runtime import programs

    body = _OFFSET_LOOPS[case]

    def run(device, n):
        x = torch.arange(20 * 8, dtype=torch.float32).reshape(20, 8).to(device)
        s = torch.linspace(-3, 3, 20 * 8).reshape(20, 8).to(device)
        for i in range(n):
            body(x, s, i)
        return x

    run("tpu", 2)  # compile what the loop needs
    before = programs.STATS.misses
    out = run("tpu", 20)
    assert programs.STATS.misses == before, "a new offset compiled a new program"
    # Bitwise: the dtype view's xor makes NaNs.
    assert torch.equal(out.cpu().view(torch.int32), run("cpu", 20).view(torch.int32))
