"""The `tpu` device as users see it: registration, torch.tpu, factories, transfers."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_tpu  # noqa: F401


def test_plain_import_torch_registers_device():
    # The torch.backends entry point: no `import torch_tpu` in the child.
    code = "import torch; x = torch.ones(2, device='tpu'); print(x.device, x.sum().item())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TORCH_TPU_CPU_FALLBACK": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["tpu:0", "2.0"]


def test_tensor_is_plain_torch_tensor():
    x = torch.ones(3, device="tpu")
    assert type(x) is torch.Tensor
    assert x.device == torch.device("tpu", 0)
    assert x.is_privateuseone if hasattr(x, "is_privateuseone") else True
    assert x.device.type == "tpu"


def test_torch_tpu_module_surface():
    tpu = torch.tpu
    assert tpu.is_available()
    assert tpu.device_count() >= 1
    assert tpu.current_device() == 0
    assert isinstance(tpu.get_device_name(), str)
    props = tpu.get_device_properties(0)
    assert props.total_memory > 0
    tpu.synchronize()
    tpu.empty_cache()
    assert isinstance(tpu.memory_stats(), dict)


def test_memory_stats_track_tensors():
    # Free what earlier tests in this worker left for the collector, or its
    # release between the two readings hides the new buffer.
    gc.collect()
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    x = torch.ones(1024, 1024, device="tpu")
    after = torch.tpu.memory_allocated()
    assert after - before >= 4 * 1024 * 1024
    assert torch.tpu.max_memory_allocated() >= after
    del x
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() <= after


def test_accelerator_api():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.synchronize()
    # A transfer allocates its bytes and nothing else; freeing returns them
    # (the collector first: garbage of earlier tests freed between the
    # readings would hide the new buffer).
    gc.collect()
    torch.accelerator.synchronize()
    before = torch.accelerator.memory_allocated()
    x = torch.randn(1000, 1001).to("tpu")
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() - before == x.nbytes == 4_004_000
    del x
    gc.collect()
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8,
                                   torch.int16, torch.int32, torch.int64, torch.uint8,
                                   torch.bool, torch.complex64, torch.float64])
def test_roundtrip_dtypes(dtype):
    src = (torch.randn(5, 7) * 10).to(dtype)
    x = src.to("tpu")
    assert x.dtype == dtype and x.shape == src.shape
    torch.testing.assert_close(x.cpu(), src, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_float8_fnuz_dtypes_match_cpu_bitwise(dtype):
    """The fnuz float8 formats (no infinity, one NaN, no negative zero) are
    tpu dtypes: transfers keep every byte, conversions from float32 round,
    overflow to NaN and flush -0 as CPU's, and indexing moves their values."""
    vals = torch.tensor([0.0, -0.0, 1.0, -2.5, 0.3, 1e-3, 1e-6, 100.0, 240.0, 250.0, 300.0,
                         57344.0, 7e4, float("inf"), float("-inf"), float("nan")])
    want = vals.to(dtype)
    assert torch.equal(vals.to("tpu").to(dtype).cpu().view(torch.uint8), want.view(torch.uint8))
    moved = want.to("tpu")
    assert moved.dtype == dtype
    assert torch.equal(moved.cpu().view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(moved.float().cpu().nan_to_num(7.0), want.float().nan_to_num(7.0))
    idx = torch.tensor([3, 0, 3, 15])
    assert torch.equal(moved[idx.to("tpu")].cpu().view(torch.uint8), want[idx].view(torch.uint8))


_F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.mark.parametrize("dtype", _F8)
def test_float8_conversion_matches_cpu_bitwise(dtype):
    """Conversion into every float8 type gives CPU's bytes for every float16
    and bfloat16 value (so every overflow, inf, NaN and subnormal), for
    doubles (rounded to float first, as c10 does), integers and the other
    float8 types: e4m3fn saturates to +-448 (XLA's convert gives NaN) and NaN
    is 0x7F with its sign (XLA gave 0x7E for e5m2)."""
    every16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    g = torch.Generator().manual_seed(3)
    # A double just past a float8 rounding midpoint can round to the midpoint
    # in float32 first: 1 + 2**-4 + 2**-30 is e4m3fn's 1.0/1.125 tie plus a bit
    # (CPU gives 1.0), 1 + 2**-3 + 2**-30 is e5m2's 1.0/1.25 one.
    doubles = torch.cat([torch.randn(4000, generator=g, dtype=torch.float64) * 400,
                         torch.tensor([1 + 2**-4 + 2**-30, 1 + 2**-3 + 2**-30, 1e300,
                                       -1e300, 1e-300])])
    sources = [every16.view(torch.float16), every16.view(torch.bfloat16), doubles,
               torch.tensor([0, 1, -7, 448, 449, 500, 70000, -(2**40)], dtype=torch.int64),
               torch.arange(-128, 128, dtype=torch.int8)]
    sources += [torch.arange(256, dtype=torch.int32).to(torch.uint8).view(d) for d in _F8]
    for src in sources:
        want = src.to(dtype).view(torch.uint8)
        got = src.to("tpu").to(dtype).cpu().view(torch.uint8)
        assert torch.equal(got, want), (src.dtype, (got != want).nonzero()[:5].flatten())
    # copy_ into a float8 tensor converts the same way
    vals = torch.tensor([1e6, -float("inf"), float("nan"), -float("nan"), 500.0, 1.0])
    out = torch.zeros(6, dtype=dtype, device="tpu")
    out.copy_(vals.to("tpu"))
    assert torch.equal(out.cpu().view(torch.uint8), vals.to(dtype).view(torch.uint8))


def test_factories():
    d = "tpu"
    assert torch.empty(2, 3, device=d).shape == (2, 3)
    torch.testing.assert_close(torch.zeros(2, 3, device=d).cpu(), torch.zeros(2, 3))
    torch.testing.assert_close(torch.ones(4, device=d, dtype=torch.int64).cpu(),
                               torch.ones(4, dtype=torch.int64))
    torch.testing.assert_close(torch.full((2, 2), 7.5, device=d).cpu(), torch.full((2, 2), 7.5))
    torch.testing.assert_close(torch.arange(10, device=d).cpu(), torch.arange(10))
    torch.testing.assert_close(torch.arange(1, 4, 0.5, device=d).cpu(), torch.arange(1, 4, 0.5))
    torch.testing.assert_close(torch.linspace(0, 1, 11, device=d).cpu(), torch.linspace(0, 1, 11))
    torch.testing.assert_close(torch.eye(3, 4, device=d).cpu(), torch.eye(3, 4))
    torch.testing.assert_close(torch.tensor([[1, 2], [3, 4]], device=d).cpu(),
                               torch.tensor([[1, 2], [3, 4]]))
    x = torch.randn(3, 2, device=d)
    for fn in (torch.zeros_like, torch.ones_like, torch.empty_like, torch.rand_like,
               torch.randn_like):
        y = fn(x)
        assert y.device == x.device and y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(torch.full_like(x, 3.0).cpu(), torch.full((3, 2), 3.0))
    r = torch.randint(0, 10, (100,), device=d)
    assert r.dtype == torch.int64 and 0 <= r.min().item() and r.max().item() < 10
    u = torch.rand(1000, device=d)
    assert 0 <= u.min().item() and u.max().item() < 1
    n = torch.randn(20000, device=d)
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05


def test_seeded_random_is_reproducible():
    torch.manual_seed(123)
    a = torch.randn(16, device="tpu").cpu()
    b = torch.rand(16, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(a, torch.randn(16, device="tpu").cpu())
    assert torch.equal(b, torch.rand(16, device="tpu").cpu())
    state = torch.tpu.get_rng_state()
    c = torch.randn(8, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(c, torch.randn(8, device="tpu").cpu())
    torch.tpu.manual_seed(5)
    assert torch.tpu.initial_seed() == 5
    torch.tpu.seed()
    assert torch.tpu.initial_seed() != 5


def test_item_tolist_print():
    x = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="tpu")
    assert x[0, 0].item() == 1.5
    assert x.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    r = repr(x)
    assert "device='tpu:0'" in r and "1.5000" in r


def test_numpy_errors_like_cuda():
    x = torch.ones(2, device="tpu")
    with pytest.raises(TypeError, match="cpu"):
        x.numpy()
    np.testing.assert_array_equal(x.cpu().numpy(), np.ones(2, np.float32))


def test_model_to_tpu():
    m = torch.nn.Linear(3, 2)
    m.to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    out = m(torch.randn(4, 3, device="tpu"))
    assert out.device.type == "tpu" and out.shape == (4, 2)


def test_device_mismatch_raises():
    a = torch.ones(3, device="tpu")
    b = torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        a + b
    # 0-dim CPU tensors are allowed, as on CUDA.
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_shape_mismatch_raises_pytorch_error():
    # CPU's text (not the meta kernel's), then the op
    with pytest.raises(RuntimeError, match=r"^The size of tensor a \(3\) must match the size of "
                                           r"tensor b \(4\).*aten\.add\.Tensor"):
        torch.ones(3, device="tpu") + torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        torch.ones(2, 3, device="tpu") @ torch.ones(4, 5, device="tpu")


def test_bad_device_index():
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.ones(2).to(f"tpu:{torch.tpu.device_count() + 3}")


def test_set_device_and_context():
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    assert torch.zeros(1, device="tpu").device.index == 0


_MULTI = """
import torch, torch_tpu
assert torch.tpu.device_count() == 4, torch.tpu.device_count()
x = torch.arange(6.).to("tpu:2")
assert x.device == torch.device("tpu", 2)
y = x.to("tpu:1") * 2
assert y.device.index == 1 and y.cpu().tolist() == [0., 2., 4., 6., 8., 10.]
try:
    x + y
except RuntimeError as e:
    assert "same device" in str(e)
else:
    raise AssertionError("no device mismatch error")
with torch.tpu.device(3):
    assert torch.ones(1, device="tpu").device.index == 3
torch.accelerator.set_device_index(1)
assert torch.tpu.current_device() == 1 and torch.accelerator.current_device_index() == 1

# Autograd on every device: the engine's per-device queues cover tpu:1 and up
# (the device guard reports the runtime's device count), and a backward that
# crosses devices (tpu:3 -> tpu:0) follows the copy back.
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
xb = torch.randn(5, 4)
ref(xb).pow(2).sum().backward()
for d in range(4):
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    m.load_state_dict(ref.state_dict())
    m = m.to(f"tpu:{d}")
    m(xb.to(f"tpu:{d}")).pow(2).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert p.grad.device.index == d, (d, p.grad.device)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)
w = torch.ones(3, device="tpu:3", requires_grad=True)
(w * 2).to("tpu:0").sum().backward()
assert w.grad.device.index == 3 and w.grad.cpu().tolist() == [2.0, 2.0, 2.0]

# As on CUDA, autograd's worker for tpu:N makes N the current device: a backward
# that creates a tensor on "tpu" (no index) creates it on its own device.
class AddOnes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 1

    @staticmethod
    def backward(ctx, g):
        return g + torch.ones(g.shape, device="tpu")

# The data of a result lies on the tensor's device, also for programs that
# read none of their inputs (JAX drops those, and the device they named).
from torch_tpu.runtime.storage import data_of

def placed(t):
    torch.tpu.synchronize()
    return next(iter(data_of(t).array.devices())).id

src = torch.randn(3, 4, device="tpu:2")
made = {
    "randn": src, "zero_": torch.empty(3, device="tpu:2").zero_(),
    "fill_": torch.empty(3, device="tpu:2").fill_(2.5), "ones_like": torch.ones_like(src),
    "full_like": torch.full_like(src, 7), "rand_like": torch.rand_like(src),
    "new_zeros": src.new_zeros(2), "normal_": torch.empty(4, device="tpu:2").normal_(),
    "masked_fill": src.masked_fill(torch.ones_like(src, dtype=torch.bool), 1.0),
    "mul_0": src * 0,
}
with torch_tpu.fused():
    made["fused zero_"] = torch.empty(3, device="tpu:2").zero_()
    made["fused ones_like"] = torch.ones_like(src)
wrong = {k: (t.device, placed(t)) for k, t in made.items()
         if t.device.index != 2 or placed(t) != 2}
assert not wrong, wrong

torch.tpu.set_device(0)
v = torch.zeros(2, device="tpu:2", requires_grad=True)
AddOnes.apply(v).sum().backward()
assert v.grad.device.index == 2 and v.grad.cpu().tolist() == [2.0, 2.0]
assert torch.tpu.current_device() == 0
print("ok")
"""


def test_multiple_devices_subprocess():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "TORCH_TPU_PLATFORM": "cpu"}
    out = subprocess.run([sys.executable, "-c", _MULTI], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_cpu_fallback_warns_and_counts(monkeypatch):
    from torch_tpu.debug import metrics
    from torch_tpu.ops import fallback

    op = torch.ops.aten._cdist_forward.default if False else None  # noqa: F841
    x = torch.randn(5, 3)
    # An op with no lowering and no decomposition: run it through the fallback
    # directly so the test does not depend on which ops are lowered.
    target = torch.ops.aten.special_bessel_j0.default
    fallback._warned.discard(str(target))
    before = metrics.FALLBACKS[str(target)]
    with pytest.warns(UserWarning, match="no tpu lowering"):
        out = fallback.cpu_fallback(target, x.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), target(x))
    assert metrics.FALLBACKS[str(target)] == before + 1
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    with pytest.raises(NotImplementedError, match="special_bessel_j0"):
        fallback.cpu_fallback(target, x.to("tpu"))


def test_float64_follows_platform():
    from torch_tpu.runtime import platform

    x = torch.randn(3, dtype=torch.float64)
    if platform.supports_float64():
        torch.testing.assert_close(x.to("tpu").cpu(), x)
    else:
        with pytest.raises(TypeError, match="float64"):
            x.to("tpu")


def test_float64_refused_on_tpu_platform(monkeypatch):
    from torch_tpu.runtime import platform, storage

    monkeypatch.setattr(platform, "supports_float64", lambda: False)
    with pytest.raises(TypeError, match="no 64-bit floating point"):
        storage.jax_dtype(torch.float64)


def test_save_load_roundtrip_keeps_sharing():
    import io

    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    buf = io.BytesIO()
    torch.save({"x": x, "row": x[1]}, buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["x"].device.type == "cpu"
    torch.testing.assert_close(on_cpu["x"], x.cpu())
    buf.seek(0)
    back = torch.load(buf)
    assert back["x"].device == torch.device("tpu", 0)
    torch.testing.assert_close(back["row"].cpu(), torch.tensor([3.0, 4.0, 5.0]))
    back["row"].add_(10)  # the two tensors still share one storage
    assert back["x"][1, 0].item() == 13.0
    m = torch.nn.Linear(3, 2).to("tpu")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    m2 = torch.nn.Linear(3, 2).to("tpu")
    m2.load_state_dict(torch.load(buf))
    torch.testing.assert_close(m2.weight.cpu(), m.weight.cpu())


def test_legacy_save_load_keeps_sharing():
    """torch.save's legacy format reads and writes storages through a tensor PyTorch
    makes at the storage's address (it failed: 'tpu tensor has no device data')."""
    import io

    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    buf = io.BytesIO()
    torch.save({"x": x, "col": x[:, 1:]}, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    back = torch.load(buf)
    assert back["x"].device == torch.device("tpu", 0)
    assert back["col"].tolist() == [[1.0, 2.0], [4.0, 5.0]]
    back["col"].add_(10)  # one storage, as saved
    assert back["x"].tolist() == [[0.0, 11.0, 12.0], [3.0, 14.0, 15.0]]
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["x"].tolist() == x.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64,
                                   torch.complex64, torch.bool])
def test_pickle_round_trip(dtype):
    """pickle (multiprocessing queues, copy by pickling) of tpu tensors and
    parameters: values, dtype, device and requires_grad as on CPU."""
    import pickle

    x = (torch.arange(6) % 3).to(dtype).reshape(2, 3)
    t = x.to("tpu")
    got, view = pickle.loads(pickle.dumps((t, t.t())))
    assert (got.device, got.dtype) == (t.device, dtype)
    assert torch.equal(got.cpu(), x) and torch.equal(view.cpu(), x.t())
    if dtype.is_floating_point:
        p = pickle.loads(pickle.dumps(torch.nn.Parameter(t)))
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad
        assert torch.equal(p.detach().cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("n", [5, 4096])
def test_copy_to_tpu_does_not_alias_the_cpu_tensor(dtype, n):
    """A later in-place change of the CPU source must not show on the copy."""
    x = torch.zeros(n, dtype=dtype)
    t = x.to("tpu")
    x.add_(1)
    assert t.cpu().eq(0).all()
    y = torch.zeros(n, dtype=dtype)
    u = torch.empty(n, dtype=dtype, device="tpu")
    u.copy_(y)
    y.add_(1)
    assert u.cpu().eq(0).all()


def test_stream_events():
    s = torch.tpu.current_stream()
    x = torch.ones(4, device="tpu") * 2
    ev = s.record_event()
    assert isinstance(ev, torch.tpu.Event)
    torch.tpu.default_stream().wait_event(ev)
    ev.synchronize()
    assert ev.query()
    assert x.sum().item() == 8


def test_more_than_64_dims_round_trip():
    # numpy, which carries host transfers, stops at 64 dims; XLA does not.
    x = torch.randn((1,) * 63 + (2, 3))
    t = x.to("tpu")
    assert t.dim() == 65
    assert torch.equal(t.cpu(), x)
    assert torch.equal((t * 2).cpu(), x * 2)


_EMPTY_DTYPES = [torch.float32, torch.bfloat16, torch.complex64, torch.bool, torch.int8,
                 torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", _EMPTY_DTYPES)
def test_empty_of_a_new_shape_waits_for_no_compile(dtype, monkeypatch):
    """A new shape's zeros are copied from the host while its program compiles
    in the background; once compiled, it is used. Without compile threads
    the program compiles on first use. The memory is zeros on the device
    asked for, either way."""
    from torch_tpu.ops import core
    from torch_tpu.runtime import async_compile, opt_level, platform, programs, storage

    last = torch.tpu.device_count() - 1
    as_number = torch.complex64 if dtype.is_complex else torch.float32

    def make(shape, index):
        t = torch.empty(shape, dtype=dtype, device=f"tpu:{index}")
        assert t.device == torch.device("tpu", index)
        assert storage.data_of(t).array.devices() == {platform.jax_device(index)}
        assert not t.cpu().to(as_number).any()

    def cached(key):
        return programs.peek(key) is not None

    shape = (3, 7919 + _EMPTY_DTYPES.index(dtype))
    for index in {0, last}:
        key = (programs.ProgramKind.ZEROS, shape, dtype, index, opt_level.level())
        make(shape, index)
        assert not cached(key)
        compiling = core._zeros_compiling[key]
        make(shape, index)  # still compiling, or just done: a copy either way
        compiling.result(timeout=120)
        make(shape, index)
        assert cached(key) and key not in core._zeros_compiling
        make(shape, index)

    monkeypatch.setattr(async_compile, "ENABLED", False)
    shape = (5, 7919 + _EMPTY_DTYPES.index(dtype))
    make(shape, 0)
    assert cached((programs.ProgramKind.ZEROS, shape, dtype, 0, opt_level.level()))


def test_zeros_programs_are_counted_as_every_program(monkeypatch):
    """A zeros program (compiled on the compile threads, or at once without
    them) is one memory-tier miss with its seconds and a compile event, like
    every program the disk tier sees: the counters agree (cache.stats()'s
    misses, compile_seconds_by_source, metrics' compiles), and readers of
    statistics wait for it (settle)."""
    import torch_tpu.cache as cache
    from torch_tpu import debug
    from torch_tpu.runtime import async_compile

    def sources(s):
        return sum(v["count"] for v in s["compile_seconds_by_source"].values())

    for i, enabled in enumerate((True, False)):
        monkeypatch.setattr(async_compile, "ENABLED", enabled)
        s0 = cache.stats()
        with debug.capture() as cap:
            torch.empty((3, 5003 + i), device="tpu")
        s1 = cache.stats()
        assert cap["compiles"]["per_op"] == {"zeros": 1}, cap["compiles"]
        assert [e.name for e in cap.compiles] == ["zeros"]
        assert s1["memory"]["misses"] - s0["memory"]["misses"] == 1
        assert sources(s1) - sources(s0) == 1
        assert s1["compile_seconds"] > s0["compile_seconds"]


def test_zeros_programs_are_bounded_by_the_program_cache(monkeypatch):
    """Zeros programs of many shapes (shape churn) live in the one program
    cache and leave it with its LRU bound; finished background compiles of
    shapes never asked for again do not pile up either."""
    from torch_tpu.ops import core
    from torch_tpu.runtime import async_compile, opt_level, programs

    shapes = [(2, 6007 + i) for i in range(6)]
    for shape in shapes:
        torch.empty(shape, device="tpu")  # a copy; the program compiles in the background
    for shape in shapes:
        key = (programs.ProgramKind.ZEROS, shape, torch.float32, 0, opt_level.level())
        pending = core._zeros_compiling.get(key)
        if pending is not None:
            pending.result(timeout=120)
    torch.empty((2, 6100), device="tpu")  # a miss: the finished compiles move to the cache
    keys = [(programs.ProgramKind.ZEROS, s, torch.float32, 0, opt_level.level()) for s in shapes]
    assert not any(k in core._zeros_compiling for k in keys)
    assert all(programs.peek(k) is not None for k in keys)

    monkeypatch.setenv("TORCH_TPU_CACHE_SIZE", "3")
    monkeypatch.setattr(async_compile, "ENABLED", False)
    t = torch.empty((2, 6101), device="tpu")  # compiled and inserted at once
    assert len(programs.CACHE) <= 3
    assert sum(programs.peek(k) is not None for k in keys) <= 3
    monkeypatch.delenv("TORCH_TPU_CACHE_SIZE")
    assert not t.cpu().any()
