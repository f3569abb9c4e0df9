"""The native fast path (csrc/, runtime/fastpath.py).

The extension must be built and used by default: a build that silently falls
back to the pure-Python path fails here. Where it runs, it must give exactly
what the Python code it replaces gives (keys, runtime inputs, slots, tensors),
and the pure-Python path (TORCH_TPU_NATIVE=0) must keep working on its own.
"""

import os
import subprocess
import sys

import pytest
import torch

from torch_tpu.runtime import executor, fastpath, programs, storage
from torch_tpu.runtime.context import CONTEXT
from torch_tpu.runtime.switches import switch_on

aten = torch.ops.aten
FORCED_PURE = os.environ.get("TORCH_TPU_NATIVE", "").strip().lower() in ("0", "false", "no", "off")
native = pytest.mark.skipif(FORCED_PURE, reason="TORCH_TPU_NATIVE=0 forces the pure-Python path")


NO_KERNEL = os.environ.get("TORCH_TPU_NATIVE_KERNEL", "").strip().lower() in (
    "0", "false", "no", "off")


def _delta(before, after):
    return {k: after[k] - before[k] for k in after}


@native
def test_native_extension_is_loaded_and_on_the_hot_path():
    assert fastpath.ACTIVE, f"native fast path not loaded: {fastpath.REASON}"
    assert fastpath.KERNEL or NO_KERNEL, "the native kernel is not in front of the Python kernels"
    assert executor.fast_classify is fastpath.NATIVE.classify
    assert storage._NATIVE is fastpath.NATIVE
    assert executor.call_executable is fastpath.NATIVE.call
    assert executor.wrap_array is fastpath.NATIVE.wrap
    a = torch.ones(3, 3, device="tpu")
    b = torch.ones(3, 3, device="tpu")
    (a + b).cpu()  # compiled (a miss, maybe in the background) and done before counting
    (a + b).cpu()
    before = fastpath.NATIVE.calls()
    for _ in range(5):
        c = a + b
    d = _delta(before, fastpath.NATIVE.calls())
    if fastpath.KERNEL:
        # Every call ran in the C++ kernel: no Python kernel, no fallback.
        assert d["kernel"] == 5 and d["kernel_fallback"] == 0 and d["call"] == 5
        assert d["classify"] == 0 and d["classify_fallback"] == 0
    else:
        # Every call's key came from C++ and every result tensor was made there.
        assert d["classify"] == 5 and d["classify_fallback"] == 0
        assert d["wrap"] == 5 and d["call"] == 5
    assert torch.equal(c.cpu(), torch.full((3, 3), 2.0))
    # The Python kernel (the runner) still uses the native classifier and wrap.
    before = fastpath.NATIVE.calls()
    c = executor.runner_for(aten.add.Tensor)(a, b)
    d = _delta(before, fastpath.NATIVE.calls())
    assert d["classify"] == 1 and d["wrap"] == 1 and d["call"] == 1
    assert torch.equal(c.cpu(), torch.full((3, 3), 2.0))


def _switched_off(*variables):
    """A decorator: skip where one of `variables` is set to off (an explicit
    choice of the run, named in the reason); otherwise the test runs, and the
    parts they switch must have loaded (_native_loaded), or it fails."""
    off = [v for v in variables if not switch_on(v)]

    def mark(fn):
        fn = pytest.mark.usefixtures("_native_loaded")(fn)
        return pytest.mark.skipif(bool(off), reason=f"{', '.join(off)}: switched off")(fn)
    return mark


@pytest.fixture
def _native_loaded():
    """The native kernel, its unboxed kernels and its memo are on wherever no
    variable switches them off: one that failed to load fails the test (a skip
    would hide it)."""
    assert fastpath.KERNEL, f"the native kernel is not installed: {fastpath.REASON}"
    assert fastpath.UNBOXED or not switch_on("TORCH_TPU_NATIVE_UNBOXED")
    assert fastpath.MEMO or not switch_on("TORCH_TPU_NATIVE_MEMO")


kernel = _switched_off("TORCH_TPU_NATIVE", "TORCH_TPU_NATIVE_KERNEL")


def _hits_and_runs(op_name, fn, n=4):
    """Run fn n times after a warm-up; the executor's counters and the
    native kernel's over those n calls, and the last result."""
    fn().cpu()
    fn().cpu()
    stats = executor.STATS
    h, r, m, per = stats.hits, stats.requests, stats.misses, stats.per_op[op_name]
    before = fastpath.NATIVE.calls()
    for _ in range(n):
        out = fn()
    d = _delta(before, fastpath.NATIVE.calls())
    return (stats.hits - h, stats.requests - r, stats.misses - m, stats.per_op[op_name] - per,
            d, out)


@kernel
@pytest.mark.parametrize("case", ["add", "alpha", "wrapped_int", "wrapped_float", "mul_bool",
                                  "sum_dim", "sum_dtype", "matmul", "relu", "var_mean",
                                  "gelu_tanh", "same_storage", "clamp_none", "matmul_view",
                                  "slices", "row_views"])
def test_native_kernel_runs_hits_as_the_python_kernel(case):
    """Cache hits run in the C++ kernel, with the Python kernel's key (the
    same cache entry: no miss), statistics and values."""
    xc, yc = torch.randn(4, 5), torch.randn(4, 5)
    x, y = xc.to("tpu"), yc.to("tpu")
    fn, ref, name = {
        "add": (lambda a, b: a + b, None, "aten.add.Tensor"),
        "alpha": (lambda a, b: torch.add(a, b, alpha=2.5), None, "aten.add.Tensor"),
        "wrapped_int": (lambda a, b: a + 3, None, "aten.add.Tensor"),
        "wrapped_float": (lambda a, b: a * 0.25, None, "aten.mul.Tensor"),
        "mul_bool": (lambda a, b: (a > 0) * (b > 0), None, "aten.mul.Tensor"),
        "sum_dim": (lambda a, b: a.sum(1, keepdim=True), None, "aten.sum.dim_IntList"),
        "sum_dtype": (lambda a, b: a.sum(0, dtype=torch.float64), None, "aten.sum.dim_IntList"),
        "matmul": (lambda a, b: a @ b.t(), None, "aten.mm.default"),
        "relu": (lambda a, b: torch.relu(a), None, "aten.relu.default"),
        "var_mean": (lambda a, b: torch.var_mean(a, 1)[1], None, "aten.var_mean.correction"),
        "gelu_tanh": (lambda a, b: torch.nn.functional.gelu(a, approximate="tanh"), None,
                      "aten.gelu.default"),
        "same_storage": (lambda a, b: a * a, None, "aten.mul.Tensor"),
        "clamp_none": (lambda a, b: a.clamp(None, 0.5), None, "aten.clamp.default"),
        # View inputs: the layout in the key, the storage offset a runtime input.
        "matmul_view": (lambda a, b: a @ b.t(), None, "aten.mm.default"),
        "slices": (lambda a, b: a[1:, ::2] * b[:3, :3], None, "aten.mul.Tensor"),
        "row_views": (None, None, "aten.add.Tensor"),
    }[case]
    if case == "matmul":  # a plain operand:
        yt = yc.t().contiguous().to("tpu")
        fn = lambda a, b: a @ yt  # noqa: E731
        expected = xc @ yc.t()
    elif case == "row_views":  # every row of x: one program, the offset an input
        row = iter(range(10**9))
        fn = lambda a, b: a[next(row) % 4] + b[0]  # noqa: E731
        expected = xc[(2 + 3) % 4] + yc[0]  # the last of 2 warm-up + 4 calls
    else:
        expected = fn(xc, yc)
    hits, requests, misses, per_op, d, out = _hits_and_runs(name, lambda: fn(x, y))
    ops_per_call = 3 if case == "mul_bool" else 1  # (a > 0) and (b > 0) too
    assert misses == 0 and hits == requests == 4 * ops_per_call and per_op == 4
    assert d["kernel"] == 4 * ops_per_call and d["kernel_fallback"] == 0, d
    got = out.cpu()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    assert storage.data_of(out).origin == name


@kernel
def test_native_kernel_counts_reach_every_reader_of_the_statistics():
    """The C++ kernel keeps its hit counts in C++; STATS's readers (the
    counters, as_dict, debug.metrics) see them, and reset() drops them."""
    import torch_tpu.debug.metrics as metrics

    x = torch.randn(3, 3).to("tpu")
    torch.relu(x).cpu()
    torch.relu(x).cpu()
    stats = executor.STATS
    before = fastpath.NATIVE.calls()["kernel"]
    d0 = stats.as_dict()
    for _ in range(5):
        torch.relu(x)
    assert fastpath.NATIVE.calls()["kernel"] - before == 5
    d1 = stats.as_dict()
    assert d1["hits"] - d0["hits"] == 5 and d1["requests"] - d0["requests"] == 5
    snap0 = metrics.snapshot()
    torch.relu(x)
    delta = metrics.diff(metrics.snapshot(), snap0)
    assert delta["cache:hits"] == delta["op:aten.relu.default"] == 1, delta
    torch.relu(x)
    stats.reset()
    assert stats.hits == stats.requests == 0 and not stats.per_op
    torch.relu(x)
    assert stats.hits == stats.requests == stats.per_op["aten.relu.default"] == 1


@kernel
def test_native_kernel_results_are_python_results():
    """A result made by the kernel: the storage, DeviceData and tensor the
    Python kernel makes (storage.wrap), and usable everywhere a tpu tensor is."""
    x = torch.randn(3, 4).to("tpu")
    (x + x).cpu()
    before = fastpath.NATIVE.calls()
    k = x + x
    assert _delta(before, fastpath.NATIVE.calls())["kernel"] == 1
    p = executor.runner_for(aten.add.Tensor)(x, x)
    dk, dp = storage.data_of(k), storage.data_of(p)
    assert type(dk) is storage.DeviceData
    for f in ("index", "shape", "dtype", "sig", "origin"):
        assert getattr(dk, f) == getattr(dp, f), f
    assert dk.array.shape == dp.array.shape and dk.array.dtype == dp.array.dtype
    assert (k.shape, k.stride(), k.dtype, k.device, k.storage_offset()) == (
        p.shape, p.stride(), p.dtype, p.device, p.storage_offset())
    assert k.untyped_storage().nbytes() == p.untyped_storage().nbytes()
    assert k.data_ptr() != p.data_ptr() != x.data_ptr()
    assert torch.equal(k.cpu(), p.cpu())
    k[0] = 7.0  # a view write into a kernel-made storage
    assert torch.equal(k.cpu()[0], torch.full((4,), 7.0))


@kernel
@pytest.mark.parametrize("case", ["miss", "complex32_view", "cpu_scalar", "launch_blocking",
                                  "autograd", "inplace", "deferred"])
def test_native_kernel_hands_other_calls_to_python(case, monkeypatch):
    """Calls the kernel does not run itself reach the Python kernel, which
    gives its usual results."""
    from torch_tpu.runtime import async_compile

    xc = torch.randn(6, 5)
    x = xc.to("tpu")
    (x + x).cpu()
    (x + x).cpu()
    before = fastpath.NATIVE.calls()
    if case == "miss":
        out = x + torch.ones(6, 5, dtype=torch.float64).to("tpu")
        expected = xc.double() + 1.0
    elif case == "complex32_view":
        h = torch.randn(6, 4, dtype=torch.float16)
        hv = h.to("tpu").view(torch.complex32)
        hv[1:].clone().cpu()
        before = fastpath.NATIVE.calls()
        out = torch.view_as_real(hv[1:].clone())
        expected = torch.view_as_real(h.view(torch.complex32)[1:])
    elif case == "cpu_scalar":
        out, expected = x + torch.tensor(2.0), xc + 2.0
    elif case == "launch_blocking":
        monkeypatch.setattr(CONTEXT, "launch_blocking", True)
        out, expected = x + x, xc + xc
    elif case == "autograd":
        w = x.clone().requires_grad_()
        out = w + w
        out.sum().backward()
        assert torch.equal(w.grad.cpu(), torch.full((6, 5), 2.0))
        expected = xc + xc
    elif case == "inplace":
        y = x.clone()
        y.add_(x)
        out, expected = y, xc + xc
    else:  # an input whose value is a launched op's (asynchronous compilation's)
        from concurrent.futures import Future

        data = storage.data_of(x)
        done = Future()
        done.set_result([data.raw])
        monkeypatch.setattr(data, "raw", async_compile.Value(data.shape, data.raw.dtype, done, 0))
        monkeypatch.setattr(async_compile, "OUTSTANDING", 1)
        out, expected = x + x, xc + xc
    d = _delta(before, fastpath.NATIVE.calls())
    if case in ("miss", "cpu_scalar", "launch_blocking", "deferred"):
        assert d["kernel_fallback"] >= 1 and d["kernel"] == 0, d
    elif case == "complex32_view":  # (clone has no C++ kernel: the classifier hands back)
        assert d["classify_fallback"] + d["kernel_fallback"] >= 1 and d["kernel"] == 0, d
    torch.testing.assert_close(out.cpu(), expected)


@native
def test_cached_device_scalars_give_cpus_values_without_recompiling():
    """Scalar inputs reach executables as cached device arrays of the same
    type: every value (signed zeros, NaN, huge ints, bools) as on CPU, and a
    changing value (a learning rate) is still a runtime input."""
    import jax

    x = torch.randn(8)
    i = torch.arange(8)
    xt, it = x.to("tpu"), i.to("tpu")
    for v in (2.5, -0.0, 0.0, float("nan"), float("inf"), 3, True, -7):
        torch.testing.assert_close((xt * v).cpu(), x * v, equal_nan=True)
        if type(v) is not bool:  # (a bool alpha is for bool results only)
            torch.testing.assert_close(torch.add(xt, xt, alpha=v).cpu(),
                                       torch.add(x, x, alpha=v), equal_nan=True)
    for v in (2**40, -(2**62), True, 5):
        assert torch.equal((it + v).cpu(), i + v)
    assert torch.equal(torch.full((2,), 1.5, device="tpu").cpu(), torch.full((2,), 1.5))
    (xt * 0.125).cpu()
    misses = executor.STATS.misses
    for step in range(20):
        lr = 0.01 * (step + 1)
        torch.testing.assert_close((xt * lr).cpu(), x * lr)
    assert executor.STATS.misses == misses
    for v in (1, 2.5, True, 2**40):
        a = fastpath._scalar_array(v, 0)
        assert isinstance(a, jax.Array) and jax.typeof(a) == jax.typeof(v)
    assert fastpath._scalar_array(2**70, 0) == 2**70  # no array holds it: the value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
def test_alpha_one_is_part_of_the_program(dtype):
    """alpha == 1 (the int: every call that leaves it out) is in the key, not a
    runtime input: the executable takes the tensors alone; other alphas share
    one program per Python type. Values match CPU either way."""
    x = (torch.randn(4, 5) * 8).to(dtype)
    y = (torch.randn(4, 5) * 8).to(dtype)
    xt, yt = x.to("tpu"), y.to("tpu")
    plan = executor.Plan(aten.add.Tensor)
    sig = _python_signature(plan, plan.bind((xt, yt), {}))
    assert sig.dyn == [] and sig.key[-1] is programs.KeyTag.ONE
    assert _python_signature(plan, plan.bind((xt, yt, True), {})).dyn == [True]
    for fn in (torch.add, torch.sub):
        assert torch.equal(fn(xt, yt).cpu(), fn(x, y))
        misses = executor.STATS.misses
        for alpha in (2, 3, 1):
            got, want = fn(xt, yt, alpha=alpha).cpu(), fn(x, y, alpha=alpha)
            if alpha == 1 or not dtype.is_floating_point or dtype == torch.float32:
                assert torch.equal(got, want)
            else:
                # Half types: tpu computes x + alpha * y in float32 and rounds
                # once, which here is the exactly rounded result (float32 holds
                # these sums exactly); CPU's kernel can differ from it by a few
                # ulps where x and alpha * y nearly cancel.
                exact = fn(x.double(), y.double(), alpha=alpha).to(dtype)
                assert torch.equal(got, exact)
        assert executor.STATS.misses - misses <= 1  # alpha=2 once; 3 shares it; 1 is cached
    if dtype.is_floating_point:
        torch.testing.assert_close(torch.add(xt, yt, alpha=0.5).cpu(), torch.add(x, y, alpha=0.5),
                                   rtol=1e-2, atol=1e-2)


def _python_signature(plan, vals):
    sig = executor.Signature(plan)
    executor.classify(plan, vals, sig)
    return sig


def _native_signature(plan, vals):
    sig = executor.Signature(plan)
    return sig if fastpath.NATIVE.classify(sig, plan.kinds, vals) else None


@native
@pytest.mark.parametrize("case", ["binary", "alpha", "alpha_one", "alpha_true", "alpha_int",
                                  "same_storage", "wrapped_number", "static", "device_arg",
                                  "optional_none", "int_list", "bool_dtype", "view",
                                  "view_transposed", "view_expanded", "view_dtype"])
def test_native_signature_is_the_python_one(case):
    x = torch.randn(4, 5).to("tpu")
    y = torch.randn(4, 5).to("tpu")
    op, args = {
        # Views: a (slot, layout) key part and the storage offset in dyn.
        "view": (aten.add.Tensor, (x[1:], x[:3])),
        "view_transposed": (aten.mul.Tensor, (x.t(), y.t()[1:])),
        "view_expanded": (aten.add.Tensor, (x[2].expand(4, 5), y)),
        "view_dtype": (aten.bitwise_xor.Tensor, (x.view(torch.int32)[:, 1:], y.view(torch.int32)[:, :4])),
        "binary": (aten.mul.Tensor, (x, y)),
        "alpha": (aten.add.Tensor, (x, y, 2.5)),
        "alpha_one": (aten.add.Tensor, (x, y, 1)),
        "alpha_true": (aten.add.Tensor, (x, y, True)),
        "alpha_int": (aten.sub.Tensor, (x, y, 3)),
        "same_storage": (aten.add.Tensor, (x, x)),
        "wrapped_number": (aten.add.Tensor, (x, 3)),
        "static": (aten.sum.dim_IntList, (x, [1], True)),
        "device_arg": (aten._to_copy.default, (x,)),
        "optional_none": (aten.clamp.default, (x, None, 0.5)),
        "int_list": (aten.permute.default, (x, [1, 0])),
        "bool_dtype": (aten.eq.Tensor, (x > 0, y > 0)),
    }[case]
    plan = executor.Plan(op)
    kwargs = {"device": torch.device("tpu", 0)} if case == "device_arg" else {}
    vals = plan.bind(args, kwargs)
    n = _native_signature(plan, vals)
    assert n is not None, "the native classifier handed a simple call back"
    p = _python_signature(plan, vals)
    assert n.key == p.key
    assert n.dyn == p.dyn and [type(v) for v in n.dyn] == [type(v) for v in p.dyn]
    assert [id(d) for d in n.slot_data] == [id(d) for d in p.slot_data]
    assert n.device == p.device


@native
@pytest.mark.parametrize("case", ["complex32_view", "cpu_scalar", "tensor_list", "conj",
                                  "cpu_tensor"])
def test_native_signature_hands_other_calls_back(case):
    x = torch.randn(4, 5).to("tpu")
    z = torch.randn(3, dtype=torch.complex64).to("tpu")
    h = torch.randn(4, 6, dtype=torch.float16).to("tpu").view(torch.complex32)
    op, args = {
        "complex32_view": (aten.clone.default, (h[1:],)),
        "cpu_scalar": (aten.add.Tensor, (x, torch.tensor(2.0))),
        "tensor_list": (aten.cat.default, ([x, x],)),
        "conj": (aten.add.Tensor, (z, z.conj())),
        "cpu_tensor": (aten.add.Tensor, (x, torch.ones(4, 5))),
    }[case]
    plan = executor.Plan(op)
    assert _native_signature(plan, plan.bind(args, {})) is None
    if case == "complex32_view":  # (a layout that may carry the storage's dtype)
        assert torch.equal(torch.view_as_real(op(*args).cpu()),
                           torch.view_as_real(h.cpu()[1:]))
    elif case != "cpu_tensor":  # the ops still run, through the Python classifier
        torch.testing.assert_close(op(*args).cpu(), op(*[
            [t.cpu() for t in a] if isinstance(a, list) else
            a.cpu() if isinstance(a, torch.Tensor) else a for a in args]))
    else:
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            op(*args)


@native
def test_native_tensors_are_the_python_ones():
    t = storage.empty_tensor((2, 3), torch.float16, 0)
    assert t.device == torch.device("tpu", 0) and t.dtype == torch.float16
    assert t.shape == (2, 3) and t.stride() == (3, 1) and t.storage_offset() == 0
    s = t.untyped_storage()
    assert s.nbytes() == 12 and not s.resizable() and s.device == t.device
    assert str(torch._C._dispatch_keys(t)) == (
        "DispatchKeySet(PrivateUse1, ADInplaceOrView, AutogradPrivateUse1, AutocastPrivateUse1)")
    u = storage.empty_tensor((4,), torch.float32, 0, nbytes=64, stride=(2,))
    assert u.stride() == (2,) and u.untyped_storage().nbytes() == 64
    # One address counter: storages never overlap, whoever made them.
    a = storage._address_for(1000)
    assert storage.empty_tensor((1,), torch.float32, 0).data_ptr() >= a + 1000
    # wrap: the value rides on the storage, as storage.wrap documents.
    w = storage.wrap(executor.value(torch.arange(6.0).to("tpu")), 0, torch.float32, "aten.test")
    data = storage.data_of(w)
    assert isinstance(data, storage.DeviceData) and data.origin == "aten.test"
    assert data.sig == ((6,), torch.float32) and w.shape == (6,)
    assert torch.equal(w.cpu(), torch.arange(6.0))
    # Views and autograd see the same storage as on any tpu tensor.
    v = w[2:]
    assert v._base is w and storage.data_of(v) is data
    g = torch.ones(3, device="tpu", requires_grad=True)
    (g * 2).sum().backward()
    assert torch.equal(g.grad.cpu(), torch.full((3,), 2.0))


@native  # (not again inside its own child process)
@pytest.mark.slow  # ~12-25 s, most of it a second process's start; .ci/run runs this subset
def test_pure_python_path_runs_eager_ops():
    """TORCH_TPU_NATIVE=0: the pure-Python path, on a smoke subset of the eager tests
    (the same subset as .ci/run's step)."""
    env = dict(os.environ, TORCH_TPU_NATIVE="0")
    env.pop("PYTEST_XDIST_WORKER", None)
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-n", "0", os.path.join(here, "test_fastpath.py"),
           os.path.join(here, "test_views.py"), os.path.join(here, "test_calling.py"),
           "-k", "fastpath or calling or inplace_through_view or setitem or out_ or resize_ "
                 "or set_data or autograd or version_counter"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


def _check_forced_pure_path():
    assert not fastpath.ACTIVE and fastpath.REASON == "TORCH_TPU_NATIVE=0"
    assert executor.fast_classify is None and storage._NATIVE is None
    assert executor.call_executable is executor.call_python and executor.wrap_array is storage.wrap
    x = torch.ones(2, 2, device="tpu")
    assert torch.equal((x + x).cpu(), torch.full((2, 2), 2.0))


def test_forced_pure_python_path_is_pure():
    """TORCH_TPU_NATIVE=0 leaves nothing native on the path: checked here when
    this process runs that way (CI's pure-Python step), else in a child that does."""
    if FORCED_PURE:
        _check_forced_pure_path()
        return
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TORCH_TPU_NATIVE="0")
    code = (f"import sys; sys.path.insert(0, {here!r}); import test_fastpath; "
            "test_fastpath._check_forced_pure_path(); print('pure: ok')")
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and "pure: ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_contiguous_empty_strided_is_a_plain_storage():
    """empty_strided with contiguous strides (empty_like; a CPU tensor's first
    .to("tpu"), which runs before the kernels load) makes a storage of its own
    shape, so later ops see a plain tensor, not a view of a flat array."""
    e = torch.empty_strided((3, 4), (4, 1), device="tpu")
    data = storage.data_of(e)
    assert data.shape == (3, 4) and data.origin == "aten.empty_strided.default"
    assert storage.layout_of(e, data) is None
    f = torch.empty_strided((3, 4), (1, 3), device="tpu")  # column-major: a flat storage
    assert storage.data_of(f).shape == (12,) and f.stride() == (1, 3)
    x = torch.randn(3, 4)
    y = torch.empty_like(x, device="tpu").copy_(x)
    assert storage.layout_of(y, storage.data_of(y)) is None and torch.equal(y.cpu(), x)


unboxed = _switched_off("TORCH_TPU_NATIVE", "TORCH_TPU_NATIVE_KERNEL", "TORCH_TPU_NATIVE_UNBOXED")


@unboxed
@pytest.mark.parametrize("case", ["add", "add_alpha", "add_number", "mul", "matmul", "relu",
                                  "sum", "sum_dtype", "mul_scalar"])
def test_common_signatures_take_the_unboxed_kernel(case):
    """Ops of the common signatures (tensor, tensor and scalar arguments) are
    served by the unboxed kernel, which never boxes its arguments, with the
    Python kernel's values; its misses and errors still reach Python."""
    xc, yc = torch.randn(6, 6), torch.randn(6, 6)
    x, y = xc.to("tpu"), yc.to("tpu")
    fns = {
        "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=3),
        "add_number": lambda a, b: a + 2.5, "mul": lambda a, b: a * b,
        "matmul": lambda a, b: a @ b, "relu": lambda a, b: torch.relu(a),
        "sum": lambda a, b: a.sum(), "sum_dtype": lambda a, b: a.sum(dtype=torch.float64),
        "mul_scalar": lambda a, b: aten.mul.Scalar(a, 3),
    }
    fn = fns[case]
    fn(x, y).cpu()  # compiles: the Python kernel
    before = fastpath.NATIVE.calls()
    out = fn(x, y)
    d = _delta(before, fastpath.NATIVE.calls())
    assert d["unboxed"] == 1 and d["kernel"] == 1, d
    torch.testing.assert_close(out.cpu(), fn(xc, yc))
    assert out.dtype == fn(xc, yc).dtype and out.shape == fn(xc, yc).shape


@unboxed
def test_unboxed_kernel_hands_errors_to_the_python_kernel():
    x = torch.randn(6, 5, device="tpu")
    (x + x).cpu()
    with pytest.raises(RuntimeError, match="must match the size"):
        x + torch.randn(4, 5, device="tpu")
    before = fastpath.NATIVE.calls()
    out = x + x  # the kernel is still in place after an error
    assert _delta(before, fastpath.NATIVE.calls())["unboxed"] == 1
    torch.testing.assert_close(out.cpu(), x.cpu() * 2)


@kernel
@pytest.mark.parametrize("switch,check", [
    # only boxed kernels: no unboxed call
    ("TORCH_TPU_NATIVE_UNBOXED", "c['unboxed'] == 0"),
    # no memo: every hit goes through the executor's dict
    ("TORCH_TPU_NATIVE_MEMO", "not fastpath.MEMO and c['memo'] == 0"),
])
def test_switched_off_parts_give_the_same_results(switch, check):
    """A part of the C++ kernel switched off by its variable: the kernel still
    runs hits, with the same values."""
    code = (
        "import torch, torch_tpu\n"
        "from torch_tpu.runtime import fastpath\n"
        "x = torch.arange(12.).reshape(3, 4).to('tpu')\n"
        "for _ in range(3): r = (torch.add(x, x, alpha=2) * x).relu().sum(); r.cpu()\n"
        "c = fastpath.NATIVE.calls()\n"
        f"assert {check} and c['kernel'] > 0, c\n"
        "print(r.item())\n")
    env = dict(os.environ, **{switch: "0"})
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    xc = torch.arange(12.).reshape(3, 4)
    assert float(r.stdout.strip()) == (torch.add(xc, xc, alpha=2) * xc).relu().sum().item()

memo = _switched_off("TORCH_TPU_NATIVE", "TORCH_TPU_NATIVE_KERNEL", "TORCH_TPU_NATIVE_MEMO")


def _memo_calls(fn, n=3):
    """fn's result, the memo hits and executor misses over n calls after the
    warm-up (a compile, then a hit through the executor's dict)."""
    fn().cpu()
    fn().cpu()
    misses, before = executor.STATS.misses, fastpath.NATIVE.calls()
    for _ in range(n):
        out = fn()
    return out, _delta(before, fastpath.NATIVE.calls())["memo"], executor.STATS.misses - misses


@memo
@pytest.mark.parametrize("case", ["add", "alpha", "add_number", "same_storage", "sum_dtype",
                                  "matmul", "sum_dim", "clamp_none"])
def test_memo_serves_repeated_calls_with_cpus_values(case):
    """A repeated call runs from the kernel's memo (no Python key, no dict
    lookup): the same entry, no miss, CPU's values."""
    xc, yc = torch.randn(5, 5), torch.randn(5, 5)
    x, y = xc.to("tpu"), yc.to("tpu")
    fns = {
        "add": lambda a, b: a + b, "alpha": lambda a, b: torch.add(a, b, alpha=3),
        "add_number": lambda a, b: a + 2.5, "same_storage": lambda a, b: a * a,
        "sum_dtype": lambda a, b: a.sum(dtype=torch.float64), "matmul": lambda a, b: a @ b,
        "sum_dim": lambda a, b: a.sum(1, keepdim=True),
        "clamp_none": lambda a, b: torch.clamp(a, min=-0.5),
    }
    fn = fns[case]
    out, memo_hits, misses = _memo_calls(lambda: fn(x, y))
    assert memo_hits == 3 and misses == 0, (memo_hits, misses)
    ref = fn(xc, yc)
    torch.testing.assert_close(out.cpu(), ref)
    assert out.dtype == ref.dtype and out.shape == ref.shape


@memo
def test_memo_passes_each_calls_scalars():
    """The memo keys a Scalar by its type: every call's value reaches the
    program (one entry for all floats, as in the dict)."""
    xc = torch.randn(4, 3)
    x = xc.to("tpu")
    _memo_calls(lambda: x * 1.5)
    before, misses = fastpath.NATIVE.calls()["memo"], executor.STATS.misses
    outs = {s: x * s for s in (0.5, -3.25, 7.0)}
    outs_alpha = {s: torch.add(x, x, alpha=s) for s in (2, 5)}
    assert executor.STATS.misses - misses == 1  # alpha: an int, compiled once
    assert fastpath.NATIVE.calls()["memo"] - before >= 3
    for s, out in outs.items():
        torch.testing.assert_close(out.cpu(), xc * s)
    for s, out in outs_alpha.items():
        torch.testing.assert_close(out.cpu(), torch.add(xc, xc, alpha=s))


@memo
def test_memo_is_not_used_under_another_context():
    """Matmul precision, the default dtype and views are part of the entry's
    key: a call under another setting misses instead of reusing the memo."""
    xc = torch.randn(8, 8)
    x = xc.to("tpu")
    _memo_calls(lambda: x @ x)
    misses = executor.STATS.misses
    with torch.tpu.matmul_precision("high"):
        (x @ x).cpu()
    assert executor.STATS.misses - misses == 1
    _memo_calls(lambda: x + 1)
    old = torch.get_default_dtype()
    misses = executor.STATS.misses
    try:
        torch.set_default_dtype(torch.float64)
        (x + 1).cpu()
    finally:
        torch.set_default_dtype(old)
    assert executor.STATS.misses - misses == 1
    before = fastpath.NATIVE.calls()["memo"]
    v = x.view(64)[:32]  # a view: the dict path (the memo never describes views)
    out = v + 1
    assert fastpath.NATIVE.calls()["memo"] == before
    torch.testing.assert_close(out.cpu(), xc.view(64)[:32] + 1)


@memo
def test_memo_forgets_entries_the_cache_drops(monkeypatch):
    """An entry dropped from the executor cache (clear, discard, eviction)
    is not run from the memo: the next call misses and compiles again."""
    x = torch.randn(3, 7, device="tpu")
    fn = lambda: torch.exp(x)  # noqa: E731
    _memo_calls(fn)
    misses = executor.STATS.misses
    executor.clear_cache()
    fn().cpu()
    assert executor.STATS.misses - misses == 1
    _memo_calls(fn)
    key = next(k for k in programs.CACHE if k[0] is aten.exp.default)
    misses = executor.STATS.misses
    programs.discard(key)
    fn().cpu()
    assert executor.STATS.misses - misses == 1
    _memo_calls(fn)
    monkeypatch.setenv("TORCH_TPU_CACHE_SIZE", "1")
    torch.sin(x).cpu()  # evicts every other entry
    monkeypatch.delenv("TORCH_TPU_CACHE_SIZE")
    misses = executor.STATS.misses
    out = fn()
    assert executor.STATS.misses - misses == 1
    torch.testing.assert_close(out.cpu(), torch.exp(x.cpu()))


# -- fused mode: the kernel records hits ------------------------------------------


def _chain(t):
    return torch.sigmoid(torch.tanh(t * 0.5 - t) + 1.0).abs().neg()


@kernel
def test_native_kernel_records_fused_hits():
    """In fused mode the kernel records a cache hit itself (fused.record_native)
    where the Python kernel would: no Python kernel call, the same program, the
    same values bitwise."""
    import torch_tpu

    x = torch.randn(6, 5, device="tpu")
    strict = _chain(x).cpu()
    _chain(x).cpu()  # every op's entry compiled in strict mode
    recorded = torch_tpu.runtime.fused.STATS.recorded
    before = fastpath.NATIVE.calls()
    with torch_tpu.fused():
        out = _chain(x)
    d = _delta(before, fastpath.NATIVE.calls())
    assert d["fused"] == 7 and d["kernel"] == 7 and d["kernel_fallback"] == 0, d
    assert torch_tpu.runtime.fused.STATS.recorded - recorded == 7
    assert torch.equal(out.cpu(), strict)


@kernel
def test_native_kernel_records_ops_first_seen_in_fused_mode():
    """An op first seen in fused mode (only lowered, its executable compiled at
    its first strict call) is recorded by the kernel from its second call; its
    first strict call compiles it in Python, and later strict hits run in C++."""
    import torch_tpu

    y = torch.randn(7, 3, device="tpu")  # a shape no other test uses
    runs = []
    for _ in range(3):
        before = fastpath.NATIVE.calls()
        with torch_tpu.fused():
            out = torch.cos(y) * 3.0
        runs.append(_delta(before, fastpath.NATIVE.calls())["fused"])
        out.cpu()
    assert runs[0] == 0 and runs[1] == 2 and runs[2] == 2, runs
    expected = torch.cos(y.cpu()) * 3.0
    torch.testing.assert_close(out.cpu(), expected)
    first = torch.cos(y)  # the executable is compiled now, in Python
    before = fastpath.NATIVE.calls()
    again = torch.cos(y)
    d = _delta(before, fastpath.NATIVE.calls())
    assert d["kernel"] == 1 and d["kernel_fallback"] == 0, d
    assert torch.equal(first.cpu(), again.cpu())
    torch.testing.assert_close(again.cpu(), torch.cos(y.cpu()))


@kernel
def test_native_kernel_leaves_flushing_recordings_to_python(monkeypatch):
    """A recording that runs the trace (the op limit reached) goes through the
    executor, which raises what the flush raises; values stay strict mode's."""
    import torch_tpu
    from torch_tpu.runtime import fused

    x = torch.randn(6, 5, device="tpu")
    strict = _chain(x).cpu()
    _chain(x).cpu()
    monkeypatch.setattr(fused, "MAX_OPS", 3)
    before = fastpath.NATIVE.calls()
    with torch_tpu.fused():
        out = _chain(x)
    d = _delta(before, fastpath.NATIVE.calls())
    # Every third recording flushes: 7 ops, two of them through Python.
    assert d["fused"] == 5 and d["kernel_fallback"] == 2, d
    assert torch.equal(out.cpu(), strict)
