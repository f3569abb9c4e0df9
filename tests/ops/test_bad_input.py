"""Bad input on `tpu` raises what PyTorch raises on CPU.

Two sources of bad calls:

* `test_error_inputs[<op>]`: every OpInfo entry's `error_inputs` (PyTorch's
  own list of calls its kernels reject), run on CPU and on tpu: the tpu must
  raise the same exception type as CPU (or, where CPU accepts the call,
  return the same result).
* `test_bad_call[<case>]`: hand-written calls covering the classes the issue
  names: wrong dtype, bad dim, shape mismatch, out-of-range index, device
  mismatch, bad out= and in-place casts.

Out-of-range *tensor* indices (gather, index_select, take, embedding,
scatter, advanced indexing with an index tensor) are values inside a
compiled program: checking them would cost a device-to-host round trip per
call. Where the tpu does not raise, the behaviour must be the documented one
in expectations.UNCHECKED_INDEX and deterministic (two runs give identical
results); the test checks both.

Expected failures: expectations.XFAILS[(op_name, "any", "error")].
"""

from __future__ import annotations

import re

import pytest
from torch_tpu.runtime.asserts import DeviceIndexError
import torch

from . import expectations, harness
from .harness import classify_exception, format_failure, to_cpu

# --------------------------------------------------------------------------
# OpInfo error_inputs


def _error_ops():
    out = []
    for name, op in harness.tested_ops():
        if op.error_inputs_func is None:
            continue
        out.append(pytest.param(name, op, id=name))
    return out


_INDEX_WORDS = re.compile(r"index|out of (range|bounds)|bounds|num_classes", re.I)


def _tensors_equal(a, b):
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return True
    except Exception:  # noqa: BLE001
        return False


def check_bad_call(name, fn_cpu, fn_tpu, what):
    """fn_cpu / fn_tpu: the same call on CPU / tpu arguments. Raises on a mismatch."""
    try:
        expected, cpu_exc = fn_cpu(), None
    except Exception as e:  # noqa: BLE001
        expected, cpu_exc = None, e
    try:
        actual, tpu_exc = to_cpu(fn_tpu()), None
        torch.tpu.synchronize()  # device-side checks of calls that return nothing
    except Exception as e:  # noqa: BLE001
        actual, tpu_exc = None, e
    if cpu_exc is None:
        if tpu_exc is not None:
            raise harness.Outcome(f"{what}: CPU accepts the call, tpu raises "
                                  f"{classify_exception(tpu_exc)}") from tpu_exc
        try:
            harness.compare(actual, expected, {}, what)
        except harness.Outcome as e:
            raise harness.Outcome(f"{what}: CPU accepts the call, tpu result differs",
                                  str(e)) from None
        return "both accept"
    if tpu_exc is not None:
        if type(tpu_exc) is type(cpu_exc):
            return "same error"
        if isinstance(tpu_exc, DeviceIndexError) and isinstance(tpu_exc, type(cpu_exc)):
            return "same error (device-side index check)"  # an IndexError and a RuntimeError
        raise harness.Outcome(
            f"{what}: tpu raises {type(tpu_exc).__name__} ({classify_exception(tpu_exc)}), "
            f"CPU raises {type(cpu_exc).__name__}: {str(cpu_exc).splitlines()[0][:120]}"
        ) from tpu_exc
    # CPU raises, tpu returns: only an unchecked tensor index may do that.
    doc = expectations.UNCHECKED_INDEX.get(name)
    if doc is None or not _INDEX_WORDS.search(str(cpu_exc)):
        raise harness.Outcome(
            f"{what}: tpu returns a result, CPU raises {type(cpu_exc).__name__}: "
            f"{str(cpu_exc).splitlines()[0][:120]}")
    again = to_cpu(fn_tpu())
    if not _tensors_equal(again, actual):
        raise harness.Outcome(f"{what}: unchecked out-of-range index gives "
                              f"non-deterministic results on tpu")
    return "unchecked index (deterministic)"


def _failure(record_property, e):
    cause = classify_exception(e)
    record_property("opinfo_cause", cause)
    return f"{cause}\n\n{format_failure(e)}"


@pytest.mark.parametrize("name,op", _error_ops())
def test_error_inputs(record_property, name, op):
    record_property("opinfo_op", name)
    record_property("opinfo_dtype", "any")
    record_property("opinfo_kind", "error")
    n = 0
    failure = None
    try:
        for i, ei in enumerate(harness.error_inputs(op)):
            s = ei.sample_input
            t_inp, t_args, t_kwargs = harness.sample_to_tpu(s)
            n += 1
            check_bad_call(
                name,
                lambda: op(s.input, *s.args, **s.kwargs),
                lambda: op(t_inp, *t_args, **t_kwargs),
                f"error input {i}")
    except Exception as e:  # noqa: BLE001
        failure = _failure(record_property, e)
    record_property("opinfo_samples", n)
    if failure:
        pytest.fail(failure, pytrace=False)


test_error_inputs._opinfo_key = lambda p: (p["name"], "any", "error")


# --------------------------------------------------------------------------
# hand-written bad calls


def _f(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _i(*vals):
    return torch.tensor(vals, dtype=torch.int64)


# (case id, op name for expectations, function of a device -> result)
# Arguments are built on the CPU, then moved: the same values on both sides.
BAD_CALLS = [
    # wrong dtype
    ("mm_int_float", "mm", lambda a: torch.mm(a(_f(2, 3)), a(_i(1, 2, 3).reshape(3, 1)))),
    ("bitwise_and_float", "bitwise_and", lambda a: torch.bitwise_and(a(_f(3)), a(_f(3)))),
    ("index_select_float_index", "index_select",
     lambda a: torch.index_select(a(_f(3, 4)), 0, a(torch.tensor([0.0, 1.0])))),
    ("gather_int32_index", "gather",
     lambda a: torch.gather(a(_f(3, 4)), 1, a(torch.zeros(3, 2, dtype=torch.float32)))),
    ("add_inplace_int_float", "add", lambda a: a(_i(1, 2, 3)).add_(a(_f(3)))),
    ("mul_inplace_int_float_scalar", "mul", lambda a: a(_i(1, 2, 3)).mul_(1.5)),
    ("add_out_int", "add",
     lambda a: torch.add(a(_f(3)), a(_f(3)), out=a(torch.zeros(3, dtype=torch.int64)))),
    ("where_cond_float", "where", lambda a: torch.where(a(_f(3)), a(_f(3)), a(_f(3)))),
    ("cross_entropy_float_target", "nn.functional.cross_entropy",
     lambda a: torch.nn.functional.cross_entropy(a(_f(4, 3)), a(_f(4, 2)))),
    ("matmul_bool", "matmul",
     lambda a: torch.matmul(a(_f(2, 2)), a(torch.ones(2, 2, dtype=torch.bool)))),
    # bad dim
    ("sum_dim", "sum", lambda a: torch.sum(a(_f(2, 3)), dim=2)),
    ("softmax_dim", "softmax", lambda a: torch.softmax(a(_f(2, 3)), dim=-3)),
    ("cat_dim", "cat", lambda a: torch.cat([a(_f(2, 3)), a(_f(2, 3))], dim=2)),
    ("transpose_dim", "transpose", lambda a: a(_f(2, 3)).transpose(0, 5)),
    ("argmax_dim", "argmax", lambda a: torch.argmax(a(_f(2, 3)), dim=3)),
    ("cumsum_dim", "cumsum", lambda a: torch.cumsum(a(_f(2, 3)), dim=-4)),
    ("topk_k", "topk", lambda a: torch.topk(a(_f(2, 3)), k=5)),
    ("squeeze_dim", "squeeze", lambda a: a(_f(2, 3)).squeeze(4)),
    ("unsqueeze_dim", "unsqueeze", lambda a: a(_f(2, 3)).unsqueeze(4)),
    ("mean_int", "mean", lambda a: a(_i(1, 2)).mean()),
    # shape mismatch
    ("add_broadcast", "add", lambda a: a(_f(2, 3)) + a(_f(4))),
    ("mm_shapes", "mm", lambda a: torch.mm(a(_f(2, 3)), a(_f(2, 3)))),
    ("bmm_batch", "bmm", lambda a: torch.bmm(a(_f(2, 3, 4)), a(_f(3, 4, 5)))),
    ("view_numel", "view", lambda a: a(_f(2, 3)).view(7)),
    ("view_stride", "view", lambda a: a(_f(2, 3)).t().view(6)),
    ("reshape_numel", "reshape", lambda a: a(_f(2, 3)).reshape(4, 2)),
    ("stack_shapes", "stack", lambda a: torch.stack([a(_f(2, 3)), a(_f(3, 2))])),
    ("cat_shapes", "cat", lambda a: torch.cat([a(_f(2, 3)), a(_f(2, 4))], dim=0)),
    ("expand_size", "expand", lambda a: a(_f(2, 3)).expand(3, 3)),
    ("copy_broadcast", "copy_", lambda a: a(_f(2, 3)).copy_(a(_f(4)))),
    ("linear_shapes", "nn.functional.linear",
     lambda a: torch.nn.functional.linear(a(_f(2, 3)), a(_f(4, 5)))),
    ("conv2d_channels", "nn.functional.conv2d",
     lambda a: torch.nn.functional.conv2d(a(_f(1, 3, 5, 5)), a(_f(4, 2, 3, 3)))),
    ("layer_norm_shape", "nn.functional.layer_norm",
     lambda a: torch.nn.functional.layer_norm(a(_f(2, 3)), (4,))),
    ("masked_fill_shape", "masked_fill",
     lambda a: a(_f(2, 3)).masked_fill(a(torch.ones(3, 2, dtype=torch.bool)), 0.0)),
    ("inplace_broadcast_self", "add", lambda a: a(_f(3)).add_(a(_f(2, 3)))),
    ("negative_size", "zeros", lambda a: torch.zeros(-1, device=a(torch.empty(0)).device)),
    ("item_numel", "item", lambda a: a(_f(3)).item()),
    # out-of-range index
    ("getitem_int", "__getitem__", lambda a: a(_f(3, 4))[5]),
    ("select_index", "select", lambda a: a(_f(3, 4)).select(1, -5)),
    ("narrow_range", "narrow", lambda a: a(_f(3, 4)).narrow(0, 2, 3)),
    ("getitem_slice_step", "__getitem__", lambda a: a(_f(3, 4))[::0]),
    ("index_tensor_oob", "index", lambda a: a(_f(3, 4))[a(_i(0, 5))]),
    ("index_select_oob", "index_select",
     lambda a: torch.index_select(a(_f(3, 4)), 0, a(_i(0, 3)))),
    ("gather_oob", "gather", lambda a: torch.gather(a(_f(3, 4)), 1, a(_i(0, 4).expand(3, 2)))),
    ("take_oob", "take", lambda a: torch.take(a(_f(3, 4)), a(_i(12)))),
    ("embedding_oob", "nn.functional.embedding",
     lambda a: torch.nn.functional.embedding(a(_i(1, 7)), a(_f(5, 2)))),
    ("scatter_oob", "scatter",
     lambda a: torch.zeros(3, device=a(torch.empty(0)).device).scatter(0, a(_i(4)), a(_f(1)))),
    ("index_put_oob", "index_put",
     lambda a: a(_f(3)).index_put_((a(_i(3)),), a(_f(1)))),
    ("setitem_oob", "__setitem__", lambda a: a(_f(3)).__setitem__(a(_i(-4)), 1.0)),
    ("one_hot_oob", "nn.functional.one_hot",
     lambda a: torch.nn.functional.one_hot(a(_i(0, 3)), num_classes=3)),
    ("nll_loss_target_oob", "nn.functional.nll_loss",
     lambda a: torch.nn.functional.nll_loss(a(_f(2, 3)), a(_i(0, 3)))),
]


@pytest.mark.parametrize("case,name,fn", [pytest.param(*c, id=c[0]) for c in BAD_CALLS])
def test_bad_call(record_property, case, name, fn):
    record_property("opinfo_op", name)
    record_property("opinfo_dtype", "any")
    record_property("opinfo_kind", "bad_call")

    def run_on(device_fn):
        torch.manual_seed(0)
        return fn(device_fn)

    failure = None
    try:
        check_bad_call(name, lambda: run_on(lambda t: t),
                       lambda: run_on(harness.to_tpu), case)
    except Exception as e:  # noqa: BLE001
        failure = _failure(record_property, e)
    if failure:
        pytest.fail(failure, pytrace=False)


test_bad_call._opinfo_key = lambda p: (p["case"], "any", "bad_call")


def test_device_mismatch():
    """A tpu tensor with a CPU tensor (not a 0-dim scalar): RuntimeError, like CUDA."""
    x = harness.to_tpu(_f(3))
    with pytest.raises(RuntimeError, match="same device|device"):
        x + _f(3)
    with pytest.raises(RuntimeError, match="same device|device"):
        torch.mm(harness.to_tpu(_f(2, 2)), _f(2, 2))
    # A 0-dim CPU tensor is a scalar, as on CUDA.
    torch.testing.assert_close((x + torch.tensor(2.0)).cpu(), x.cpu() + 2.0)
