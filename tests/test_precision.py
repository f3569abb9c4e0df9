"""Matmul precision control (torch.tpu.*matmul_precision) and bfloat16 autocast."""

import re
import threading

import jax.numpy as jnp
import pytest
import torch

import torch_tpu
import torch_tpu.debug as dbg
from torch_tpu import precision
from torch_tpu.ops import registry

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def restore_precision():
    before = torch.tpu.get_matmul_precision()
    yield
    torch.tpu.set_matmul_precision(before)


def _dot_precisions(text):
    return re.findall(r"operand_precision=\{(\w+),(\w+)\}", text)


def test_torch_tpu_exposes_precision_api():
    for name in ("set_matmul_precision", "get_matmul_precision", "matmul_precision",
                 "get_amp_supported_dtype", "is_bf16_supported"):
        assert callable(getattr(torch.tpu, name)), name
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]


def test_default_setting_follows_torch_default():
    # torch's default float32 matmul precision is 'highest': results match the CPU.
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.tpu.get_matmul_precision() == "highest"


def test_set_get_and_context_manager():
    torch.tpu.set_matmul_precision("high")
    assert torch.tpu.get_matmul_precision() == "high"
    with torch.tpu.matmul_precision("default") as p:
        assert p == "default"
        assert torch.tpu.get_matmul_precision() == "default"
        with torch.tpu.matmul_precision("highest"):
            assert torch.tpu.get_matmul_precision() == "highest"
        assert torch.tpu.get_matmul_precision() == "default"
    assert torch.tpu.get_matmul_precision() == "high"
    torch.tpu.set_matmul_precision("medium")  # torch's name for the fast setting
    assert torch.tpu.get_matmul_precision() == "default"
    torch.tpu.set_matmul_precision("float32")
    assert torch.tpu.get_matmul_precision() == "highest"


def test_context_manager_is_thread_local():
    seen = {}
    torch.tpu.set_matmul_precision("highest")
    with torch.tpu.matmul_precision("default"):
        t = threading.Thread(target=lambda: seen.setdefault("other", torch.tpu.get_matmul_precision()))
        t.start()
        t.join()
    assert seen["other"] == "highest"


def test_bad_precision_raises_value_error():
    with pytest.raises(ValueError, match="'default', 'high', 'highest'"):
        torch.tpu.set_matmul_precision("ultra")
    with pytest.raises(ValueError, match="'default', 'high', 'highest'"):
        with torch.tpu.matmul_precision(3):
            pass


def test_cache_token_and_lax_precision_change_with_setting():
    import jax

    tokens = set()
    for p in ("default", "high", "highest"):
        with torch.tpu.matmul_precision(p):
            tokens.add(precision.cache_token())
            assert precision.lax_precision() == getattr(jax.lax.Precision, p.upper())
    assert len(tokens) == 3


def test_precision_changes_hlo_precision_config():
    mm = torch_tpu.jax_op(jnp.matmul, name="precision_test_matmul")
    a = torch.randn(8, 8, device="tpu")
    b = torch.randn(8, 8, device="tpu")
    texts = {}
    for p in ("default", "high", "highest"):
        with torch.tpu.matmul_precision(p):
            texts[p] = dbg.hlo(lambda a, b: mm(a, b) + 1, a, b, stage="hlo")
    assert _dot_precisions(texts["highest"]) == [("highest", "highest")]
    assert _dot_precisions(texts["high"]) == [("high", "high")]
    assert _dot_precisions(texts["default"]) in ([], [("default", "default")])
    with torch.tpu.matmul_precision("highest"):
        assert "precision = [HIGHEST, HIGHEST]" in dbg.hlo(mm, a, b)


def test_precision_changes_hlo_of_aten_mm():
    assert aten.mm.default in registry.LOWERINGS
    a = torch.randn(8, 8, device="tpu")
    with torch.tpu.matmul_precision("default"):
        text = dbg.hlo(torch.mm, a, a, stage="hlo")
    assert ("highest", "highest") not in _dot_precisions(text)
    with torch.tpu.matmul_precision("highest"):
        text = dbg.hlo(torch.mm, a, a, stage="hlo")
    assert _dot_precisions(text) == [("highest", "highest")]


def test_eager_executables_are_not_reused_across_precisions():
    mm = torch_tpu.jax_op(jnp.matmul, name="precision_test_eager_matmul")
    a = torch.randn(9, 9, device="tpu")
    progs = []
    for p in ("highest", "default"):
        with torch.tpu.matmul_precision(p):
            # The log is a bounded deque: select new events by sequence number.
            last = max((e.seq for e in dbg.compile_log()), default=-1)
            mm(a, a)
            progs.append([e for e in dbg.compile_log() if e.seq > last])
    assert len(progs[1]) == 1, "a second precision must compile its own program"


# --------------------------------------------------------------------------
# autocast


def test_autocast_linear_bfloat16_matches_cpu_autocast():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = lin(x)
    lin_t = lin.to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        out = lin_t(x.to("tpu"))
    assert ref.dtype == torch.bfloat16
    assert out.dtype == torch.bfloat16
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref, atol=2e-2, rtol=2e-2)
    # Outside the region: float32 again.
    assert lin_t(x.to("tpu")).dtype == torch.float32


def test_autocast_policies():
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        mm = a @ a
        assert mm.dtype == torch.bfloat16
        # float32 policy: softmax of a bfloat16 input runs (and returns) float32
        assert torch.softmax(mm, -1).dtype == torch.float32
        # ops not on a list keep their input dtype
        assert (mm + 1).dtype == torch.bfloat16
        # promote policy: mixed inputs run in the widest dtype
        assert torch.addcmul(a, mm, mm).dtype == torch.float32
        # CPU tensors are not cast by tpu autocast
        c = torch.randn(3, 3)
        assert (c @ c).dtype == torch.float32


def test_autocast_backward_gives_float32_grads():
    lin = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(2, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = lin(x).float().sum()
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32
    torch.testing.assert_close(lin.weight.grad.cpu(), x.cpu().sum(0).expand(4, 8),
                               atol=3e-2, rtol=3e-2)


def test_autocast_float16_and_unsupported_dtype():
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu", dtype=torch.float16):
        assert (a @ a).dtype == torch.float16
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("tpu", dtype=torch.float32):
            assert (a @ a).dtype == torch.float32
