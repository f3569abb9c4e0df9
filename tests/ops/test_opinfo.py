"""PyTorch's OpInfo database (op_db) on `tpu`, compared with CPU.

One test per (OpInfo entry, dtype, kind): `test_forward[<op>-<dtype>]` runs
every sample input on CPU and on tpu and compares outputs (values, dtypes,
shapes; mutated inputs too); `test_grad[<op>-float32]` compares the input
gradients for a random cotangent. Random samples are compared by shape,
dtype and distribution (two-sample KS test), uninitialized outputs (empty*)
by shape and dtype.

Default run: float32, bfloat16 and int64 forward, float32 gradients. The
other dtypes (float16, int32, bool, complex64) are marked slow.
Tolerances and expected failures: tests/ops/expectations.py.

Why plain pytest parametrization rather than instantiate_device_type_tests:
the device-type machinery builds unittest classes (PrivateUse1TestBase) per
device and runs a test on one device at a time; here every test needs both
devices (CPU reference, tpu subject), per-(op, dtype, kind) xfail(strict)
and slow marks from one table, stable pytest ids for the JSON results and
the refresher, and items that pytest-xdist can balance. The device-type
base works with our backend, but buys nothing over `op.sample_inputs("cpu",
dtype)` plus an explicit copy to tpu, which also keeps the inputs
bit-identical on both sides.
"""

from __future__ import annotations

import time

import pytest

from . import expectations, harness
from .harness import metrics_snapshot

_FWD, _GRAD = [], []
for _name, _op, _dt, _kind in harness.cases():
    marks = [] if harness.is_default(_dt, _kind) else [pytest.mark.slow]
    p = pytest.param(_name, _op, _dt, id=f"{_name}-{_dt}", marks=marks)
    (_FWD if _kind == "forward" else _GRAD).append(p)


def _run(record_property, name, op, dtype, kind):
    record_property("opinfo_op", name)
    record_property("opinfo_dtype", dtype)
    record_property("opinfo_kind", kind)
    stats = {}
    before = metrics_snapshot()
    cpu0 = time.process_time()
    failure = not_capturable = None
    harness.NOT_CAPTURED.clear()
    try:
        harness.run_case(name, op, dtype, kind, stats)
    except harness.NotCapturable as e:
        not_capturable = e.cause
    except Exception as e:  # noqa: BLE001
        cause = harness.classify_exception(e)
        record_property("opinfo_cause", cause)
        failure = f"{cause}\n\n{harness.format_failure(e)}"
    if failure is None:
        failure = harness.unexpected_outcome(name, dtype, kind, stats)
    if failure is None and not_capturable is None and harness.NOT_CAPTURED:
        not_capturable = harness.NOT_CAPTURED[0]
    if not_capturable is not None:
        record_property("opinfo_cause", not_capturable)
    record_property("opinfo_cpu_s", round(time.process_time() - cpu0, 3))
    record_property("opinfo_samples", stats.get("samples", 0))
    record_property("opinfo_random_samples", stats.get("random_samples", 0))
    for k, v in harness.metrics_delta(before).items():
        record_property("opinfo_" + k, v)
    if failure:
        # A plain-text failure outside the except block: pytest's own
        # traceback would repr the tpu tensors of every frame (more tpu ops,
        # slow and noisy).
        pytest.fail(failure, pytrace=False)
    if not_capturable:
        # The compiled path only: dynamo cannot capture this call on any
        # device (harness._dynamo_on_cpu is the control).
        pytest.xfail(not_capturable)
    if stats.get("expected_failed"):
        reason = harness.expected_failure_reason(name, dtype, kind, stats)
        record_property("opinfo_cause", reason)
        pytest.xfail(reason)


def test_xfail_samples_are_listed_expected_failures():
    """Each XFAIL_SAMPLES entry names a cause and samples, and has its reason
    in XFAILS; every XFAILS entry that is not a missing lowering (which fails
    every sample) is keyed to its failing samples, so that it is strict in
    any selection of samples (tests/README.md); a case with no samples fails
    in every selection."""
    for key, (cause, indices, *flag) in expectations.XFAIL_SAMPLES.items():
        assert key in (expectations.XFAILS if len(key) == 3 else expectations.PATH_XFAILS), key
        assert cause and indices and all(isinstance(i, int) for i in indices), key
        assert len(flag) <= 1, key
    listed = {**expectations.XFAILS, **expectations.PATH_XFAILS}
    for key, reason in listed.items():
        if key[2] in ("forward", "grad"):  # (test_bad_input's kinds have no samples)
            assert (reason.startswith(("no lowering:", "no samples"))
                    or key in expectations.XFAIL_SAMPLES), key


@pytest.mark.parametrize("name,op,dtype", _FWD)
def test_forward(record_property, name, op, dtype):
    _run(record_property, name, op, dtype, "forward")


@pytest.mark.parametrize("name,op,dtype", _GRAD)
def test_grad(record_property, name, op, dtype):
    _run(record_property, name, op, dtype, "grad")


test_forward._opinfo_key = lambda p: (p["name"], p["dtype"], "forward")
test_grad._opinfo_key = lambda p: (p["name"], p["dtype"], "grad")
