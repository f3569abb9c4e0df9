"""Aliasing and layout as on CPU (issue 48, item 2: the aliasing/layout classes).

Writes into memory that an argument shares (an expanded tensor written in
place, an out= tensor partly overlapping an input), out= into a
non-contiguous view, a boolean mask indexing the tensor it writes, and the
memory format results carry. Each reproducer runs on strict eager,
`torch_tpu.fused()` and `torch.compile(backend="tpu")`; eager and fused are
compared with the same function on CPU, the compiled path with CPU's
compiled behaviour (`backend="aot_eager"`: functionalization, which accepts
some writes eager CPU refuses).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import torch_tpu

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

PATHS = ("eager", "fused", "compiled")


def _outcome(fn, args, path, device):
    """('value', result on CPU) or ('error', exception) of fn on `path`."""
    moved = [a.clone().to(device) for a in args]  # (fn may write its arguments)
    try:
        if path == "compiled":
            torch._dynamo.reset()
            out = torch.compile(fn, backend="tpu" if device == "tpu" else "aot_eager")(*moved)
        elif path == "fused" and device == "tpu":
            with torch_tpu.fused():
                out = fn(*moved)
        else:
            out = fn(*moved)
    except RuntimeError as e:
        return "error", e
    return "value", out.cpu()


def assert_like_cpu(path, fn, *args):
    """fn's outcome on tpu and `path` is CPU's: the same values, or an error
    of the same type whose message starts with CPU's (the op named after it)."""
    want_kind, want = _outcome(fn, args, path, "cpu")
    kind, got = _outcome(fn, args, path, "tpu")
    assert kind == want_kind, f"tpu: {kind} {got!r}; cpu: {want_kind} {want!r}"
    if kind == "error":
        assert type(got) is type(want)
        if path != "compiled":  # (compiled: dynamo's wrapper of the fake kernel's error)
            assert str(got).startswith(str(want)), (str(got), str(want))
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- in-place writes into expanded (internally overlapping) tensors -----------------


def _expanded_add_(x):
    return x.expand(2, 3).add_(1)


def _expanded_copy_(x, src):
    return x.expand(2, 3).copy_(src)


def _expanded_uniform_(x):
    return x.expand(2, 3).uniform_()


def _expanded_fill_(x):  # CPU's fill_ does not check overlap
    return x.expand(2, 3).fill_(4.0)


def _expanded_cumsum_out(x, src):
    return torch.cumsum(src, 1, out=x.expand(2, 3))


def _expanded_empty_add_(x):  # nothing stored: CPU accepts it
    x.expand(2, 0).add_(1)
    return x


def _expanded_index_fill_(x):  # CPU writes the filled elements only (and warns)
    x.expand(2, 3).index_fill_(0, torch.tensor([0], device=x.device), 5.0)
    return x


def _expanded_masked_fill_(x):
    mask = torch.tensor([[True, False, False], [False, False, True]], device=x.device)
    x.expand(2, 3).masked_fill_(mask, -0.0)
    return x


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fn,shapes", [
    (_expanded_empty_add_, [(0,)]),
    (_expanded_index_fill_, [(1, 3)]),
    (_expanded_masked_fill_, [(1, 3)]),
    (_expanded_add_, [(1, 3)]),
    (_expanded_copy_, [(1, 3), (2, 3)]),
    (_expanded_uniform_, [(1, 3)]),
    (_expanded_fill_, [(1, 3)]),
    (_expanded_cumsum_out, [(1, 3), (2, 3)]),
], ids=lambda v: getattr(v, "__name__", "") if callable(v) else "")
@pytest.mark.filterwarnings("ignore:Use of .* on expanded tensors is deprecated")
def test_write_into_expanded_tensor_as_cpu(path, fn, shapes):
    if fn is _expanded_uniform_ and path == "compiled":
        pytest.skip("random values: compared on the eager paths only")
    if path == "compiled" and fn in (_expanded_index_fill_, _expanded_masked_fill_):
        pytest.skip("functionalization writes every alias (as aot_eager on the CPU); "
                    "tests/fuzz/known.py 'as torch.compile on the CPU'")
    args = [torch.arange(float(torch.Size(s).numel())).reshape(s) + 1 for s in shapes]
    assert_like_cpu(path, fn, *args)


# -- out= partly sharing an input's memory -----------------------------------------


def _add_out_overlapping(a):
    torch.add(a[:4], 1, out=a[2:])
    return a


def _add_inplace_row_of_self(a):
    m = a.view(2, 3)
    return m.add_(m[0])


def _copy_overlapping(a):
    a[1:].copy_(a[:-1])
    return a


def _add_inplace_disjoint(a):  # one storage, no shared element: allowed
    a[:3].add_(a[3:])
    return a


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fn", [_add_out_overlapping, _add_inplace_row_of_self,
                                _copy_overlapping, _add_inplace_disjoint],
                         ids=lambda f: f.__name__)
def test_partly_overlapping_write_raises_as_cpu(path, fn):
    assert_like_cpu(path, fn, torch.arange(6.0))


def test_overlap_checked_at_every_call_of_one_program():
    """A view's offset is a runtime input: one program serves a[:3] += a[3:]
    and a[1:4] += a[3:6]; the second must still raise."""
    a = torch.arange(8.0, device="tpu")
    a[:3].add_(a[3:6])
    with pytest.raises(RuntimeError, match="some elements of the input tensor"):
        a[1:4].add_(a[3:6])


# -- out= into a non-contiguous view -------------------------------------------------


def _logspace_into_narrowed(x):
    torch.logspace(0, 3, 4, base=2, out=x.narrow(1, 1, 2))
    return x


def _linspace_into_narrowed(x):
    torch.linspace(0, 3, 4, out=x.narrow(1, 1, 2))
    return x


def _linspace_into_transposed(x):
    torch.linspace(0, 3, 4, out=x[:2, :2].t())
    return x


def _linspace_into_expanded(x):
    return torch.linspace(1, 10, 10, out=x.expand(10))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fn,shape", [
    (_logspace_into_narrowed, (2, 3)),
    (_linspace_into_narrowed, (2, 3)),
    (_linspace_into_transposed, (3, 3)),
    (_linspace_into_expanded, (1,)),
], ids=lambda v: getattr(v, "__name__", "") if callable(v) else "")
def test_out_into_view_writes_through_it(path, fn, shape):
    assert_like_cpu(path, fn, torch.zeros(shape))


# -- a boolean mask indexing the tensor it writes ------------------------------------


def _mask_is_self(x):
    x[x] = False
    return x


def _masked_fill_mask_is_self(x):
    return x.masked_fill_(x, False)


def _mask_partly_self(x):  # CPU refuses a mask partly sharing the written memory
    x[1:][x[:-1]] = False
    return x


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fn", [_mask_is_self, _masked_fill_mask_is_self, _mask_partly_self],
                         ids=lambda f: f.__name__)
def test_mask_aliasing_written_tensor(path, fn):
    assert_like_cpu(path, fn, torch.tensor([True, False, True, True]))


# -- the memory format of results ------------------------------------------------------
#
# CPU's TensorIterator (and cat, dropout) lay a result out like its input: a
# channels_last input gives a channels_last result, a transposed one a
# transposed result. The executor allocates results in the strides of PyTorch's
# meta kernel, which computes the same; a compiled graph returns its user
# outputs in their fake values' strides.


def _cl_add(x):
    return x + 1


def _cl_mul_self(x):
    return x * x


def _cl_relu(x):
    return torch.relu(x)


def _cl_cat(x):
    return torch.cat([x, x])


def _cl_cat_channels(x):
    return torch.cat([x, x], 1)


def _cl_dropout(x):
    return torch.nn.functional.dropout(x, 0.5, True)  # random: layout, and 0 or 2x


def _cl_native_dropout_mask(x):
    return torch.ops.aten.native_dropout(x, 0.5, True)[1]  # the mask: layout only


def _transposed_exp(x):
    return x[0, 0].t().exp()


def _cl_add_then_views(x):  # (a copy at the end: a values check of views of such results)
    return (x + 1)[:, 1:, ::2].permute(0, 2, 3, 1).reshape(2, -1)


def _cl_add_then_inplace(x):
    y = x * 2
    y[:, 1].add_(1)
    return y


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fn", [_cl_add, _cl_mul_self, _cl_relu, _cl_cat, _cl_cat_channels,
                                _cl_dropout, _cl_native_dropout_mask, _transposed_exp,
                                _cl_add_then_views, _cl_add_then_inplace],
                         ids=lambda f: f.__name__)
def test_result_memory_format_as_cpu(path, fn):
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    want = fn(x)
    if path == "fused":
        with torch_tpu.fused():
            got = fn(x.to("tpu"))
    elif path == "compiled":
        torch._dynamo.reset()
        got = torch.compile(fn, backend="tpu")(x.to("tpu"))
    else:
        got = fn(x.to("tpu"))
    assert got.stride() == want.stride()
    assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(
        memory_format=torch.channels_last)
    if fn is _cl_native_dropout_mask:
        return
    if fn is _cl_dropout:
        got = got.cpu()
        assert bool(((got == 0) | (got == 2 * x)).all())
        return
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


# -- DLPack within the device ------------------------------------------------------------
#
# A tpu tensor exports as PyTorch exports a PrivateUse1 tensor (kDLExtDev); the
# tensor PyTorch's importer makes shares the exporter's storage, as on CPU.


def _through_dlpack(t, how):
    if how == "from_dlpack":
        return torch.from_dlpack(t)
    return torch.asarray(torch.utils.dlpack.to_dlpack(t))


@pytest.mark.parametrize("path", ("eager", "fused"))
@pytest.mark.parametrize("how", ("from_dlpack", "asarray_capsule"))
def test_dlpack_round_trip_aliases(path, how):
    base = torch.arange(12.0).view(3, 4)
    want = base.clone()
    want[1:, 1::2] = 0
    want[1:, 1::2] += 5
    t = base.to("tpu")
    assert t.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLExtDev, 0)
    with torch_tpu.fused() if path == "fused" else contextlib.nullcontext():
        v = t[1:, 1::2]
        u = _through_dlpack(v, how)
        assert u.device == t.device and u.shape == v.shape and u.stride() == v.stride()
        assert u.data_ptr() == v.data_ptr()
        u.zero_()  # a write through the import is seen through the export ...
        v.add_(5)  # ... and the other way round
        torch.testing.assert_close(u.cpu(), want[1:, 1::2])
    torch.testing.assert_close(t.cpu(), want)
    torch.testing.assert_close(u.clone().cpu(), want[1:, 1::2])
