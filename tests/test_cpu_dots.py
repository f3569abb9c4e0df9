"""Half-precision products `x @ W.T` on XLA:CPU (ops/linalg._against_stored).

Without native bfloat16 dots (hosts without AMX-BF16 or AVX512-BF16, or
TORCH_TPU_CPU_NATIVE_BF16_DOTS=0) they are split along W's stored rows
(runtime/xla_flags.cpu_dot_piece_bytes): XLA:CPU would make a float32
transposed copy of all of W first (1 GB for a Llama LM head). With them
(AMX-BF16 and AVX512-BF16 hosts by default, or =1) a bfloat16 product is one dot reading W as
stored, which XLA:CPU multiplies in bfloat16 without a float32 copy where the
host can. Results are the same as the whole product's either way.

The piece size is read when a program is traced and the in-process program
cache does not key on it, so each case uses shapes no other case here uses.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import debug
from torch_tpu.runtime import platform

pytestmark = pytest.mark.skipif(platform.platform() != "cpu", reason="XLA:CPU's dots only")


@pytest.fixture(autouse=True)
def _pieces_unless_native(monkeypatch):
    """The piece tests test pieces on any host (AMX hosts default to native)."""
    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "0")


def _linear(x, w, piece_mb, monkeypatch):
    """F.linear on tpu with pieces of `piece_mb` MiB: (result, its mm program)."""
    monkeypatch.setenv("TORCH_TPU_CPU_DOT_PIECE_MB", str(piece_mb))
    with debug.Capture() as cap:
        y = F.linear(x.to("tpu"), w.to("tpu")).cpu()
    progs = [e.program for e in cap.compiles if e.name in ("aten.mm.default", "aten.bmm.default")]
    assert len(progs) == 1, [e.name for e in cap.compiles]
    return y, progs[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_weight_split_into_pieces_same_values_less_scratch(dtype, monkeypatch):
    w = torch.randn(4096 + 7, 256, dtype=dtype)  # 4.2 MB of float32: 5 pieces of 1 MiB
    x = torch.randn(6, 256, dtype=dtype)
    whole, p0 = _linear(x, w, 0, monkeypatch)
    x2 = torch.randn(7, 256, dtype=dtype)  # another shape: its own program
    split, p1 = _linear(x2, w, 1, monkeypatch)
    assert p0.optimized.count(" dot(") == 1
    assert p1.optimized.count(" dot(") == 5
    assert p1.memory["temp_size_in_bytes"] < p0.memory["temp_size_in_bytes"] / 3
    # the whole product of the same rows (one more row: its own program)
    whole2, _ = _linear(torch.cat([x2, x2[:1]]), w, 0, monkeypatch)
    torch.testing.assert_close(split, whole2[:-1])
    torch.testing.assert_close(split, F.linear(x2.float(), w.float()).to(dtype))
    torch.testing.assert_close(whole, F.linear(x.float(), w.float()).to(dtype))


def test_row_major_operand_and_one_row_products_are_left_whole(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_DOT_PIECE_MB", "1")
    b = torch.randn(256, 4096 + 11, dtype=torch.bfloat16)  # stored (K, N): read without a copy
    x = torch.randn(6, 256, dtype=torch.bfloat16)
    with debug.Capture() as cap:
        y = (x.to("tpu") @ b.to("tpu")).cpu()
    [prog] = [e.program for e in cap.compiles if e.name == "aten.mm.default"]
    assert prog.optimized.count(" dot(") == 1
    torch.testing.assert_close(y, (x.float() @ b.float()).to(torch.bfloat16))
    w = torch.randn(4096 + 13, 256, dtype=torch.bfloat16)
    x1 = torch.randn(1, 256, dtype=torch.bfloat16)  # a decoding step's one row: fused, no copy
    _, prog1 = _linear(x1, w, 1, monkeypatch)
    assert prog1.optimized.count(" dot(") == 1


def test_compiled_linear_splits_too(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_DOT_PIECE_MB", "1")
    lin = torch.nn.Linear(256, 4096 + 17, bias=True, dtype=torch.bfloat16)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    want = lin(x)
    lt = torch.nn.Linear(256, 4096 + 17, bias=True, dtype=torch.bfloat16).to("tpu")
    lt.load_state_dict(lin.state_dict())
    with debug.Capture() as cap:
        got = torch.compile(lt, backend="tpu")(x.to("tpu")).detach().cpu()
    dots = sum(e.program.optimized.count(" dot(") for e in cap.compiles
               if e.program is not None and e.kind == "graph")
    assert dots == 5, [(e.name, e.kind) for e in cap.compiles]
    torch.testing.assert_close(got, want.detach())


def _native(x, w, on, monkeypatch, op="aten.mm.default"):
    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "1" if on else "0")
    monkeypatch.setenv("TORCH_TPU_CPU_DOT_PIECE_MB", "0")
    with debug.Capture() as cap:
        y = (x.to("tpu") @ w.to("tpu").transpose(-1, -2)).cpu()
    [prog] = [e.program for e in cap.compiles if e.name == op]
    return y, prog


@pytest.mark.parametrize("rows, n, k", [(4, 2048 + 3, 512), (1, 256, 2048 + 5), (1, 2048 + 9, 256)])
def test_native_bf16_dot_reads_the_weight_as_stored(rows, n, k, monkeypatch):
    from torch_tpu.runtime.xla_flags import host_has_amx_bf16

    w = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    want = (x.float() @ w.float().T).to(torch.bfloat16)
    y, prog = _native(x, w, True, monkeypatch)
    torch.testing.assert_close(y, want)
    assert prog.optimized.count(" dot(") + prog.optimized.count("ynn_fusion =") >= 1
    # the same product without (another shape: its own program)
    x2 = torch.cat([x, x[:1]])
    y2, prog2 = _native(x2, w, False, monkeypatch)
    torch.testing.assert_close(y2[:rows], want)
    if host_has_amx_bf16() and (rows > 1 or k >= n):
        # bfloat16 into XNNPACK's fusion: no float32 copy of W
        assert "ynn_fusion" in prog.optimized
        assert prog.memory["temp_size_in_bytes"] < w.numel() * 4 / 3
    if rows == 1 and n > k:  # a tall W's one row: XLA's fused loop, left as it was
        assert prog.optimized.count("concatenate(") == 0


def test_native_bf16_batched_product(monkeypatch):
    q = torch.randn(6, 5, 64, dtype=torch.bfloat16)
    kk = torch.randn(6, 33, 64, dtype=torch.bfloat16)
    y, _ = _native(q, kk, True, monkeypatch, op="aten.bmm.default")
    torch.testing.assert_close(y, (q.float() @ kk.float().transpose(-1, -2)).to(torch.bfloat16))


def test_native_bf16_dots_follow_the_host_and_the_switches(monkeypatch):
    from torch_tpu.runtime import xla_flags

    monkeypatch.delenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS")
    flags = xla_flags.host_cpu_flags()
    assert xla_flags.cpu_native_bf16_dots() == bool({"amx_bf16", "avx512_bf16"} & flags)
    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "1")
    assert xla_flags.cpu_native_bf16_dots()
    monkeypatch.setenv("TORCH_TPU_CPU_XLA_DEFAULTS", "0")
    assert not xla_flags.cpu_native_bf16_dots()
    monkeypatch.delenv("TORCH_TPU_CPU_XLA_DEFAULTS")
    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "sometimes")
    with pytest.raises(ValueError, match="TORCH_TPU_CPU_NATIVE_BF16_DOTS"):
        xla_flags.cpu_native_bf16_dots()


def test_native_bf16_dots_are_in_the_graph_key(monkeypatch):
    from torch_tpu.cache import graphs

    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "1")
    on = graphs.key_for("g")
    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", "0")
    assert graphs.key_for("g") != on


# -- half-precision dots on float32 copies (xla_flags.cpu_half_dots_f32) ------

_OPERAND_TYPE = re.compile(r"stablehlo\.dot_general .*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")

# TORCH_TPU_CPU_HALF_DOTS_F32, TORCH_TPU_CPU_NATIVE_BF16_DOTS, the dots' operand type
_PATHS = {"via_f32": ("1", "0", "f32"), "native": ("0", "0", None),
          "stored_native": ("0", "1", None)}

_OPS = {
    "mm": (lambda x, w: x @ w, ((6, 64), (64, 40)), "aten.mm.default"),
    "bmm": (torch.bmm, ((3, 6, 64), (3, 64, 40)), "aten.bmm.default"),
    "linear": (F.linear, ((6, 64), (40, 64)), "aten.mm.default"),  # x @ W.T, W as stored
    "matmul": (torch.matmul, ((2, 6, 64), (64, 40)), "aten.mm.default"),
}


def _dot_operand_types(prog):
    """The element types of the operands of each dot in `prog`'s StableHLO."""
    return {t for line in prog.stablehlo.splitlines() for pair in _OPERAND_TYPE.findall(line)
            for t in pair}


@pytest.mark.parametrize("path", list(_PATHS))
@pytest.mark.parametrize("op", list(_OPS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_half_dot_path_matches_cpu(path, op, dtype, monkeypatch):
    f32, native, operands = _PATHS[path]
    monkeypatch.setenv("TORCH_TPU_CPU_HALF_DOTS_F32", f32)
    monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", native)
    fn, (xs, ws), name = _OPS[op]
    # shapes no other case uses: the in-process program cache keys on neither switch
    extra = list(_PATHS).index(path) + 3 * (dtype == torch.float16)
    x = torch.randn(*xs[:-2], xs[-2] + extra, xs[-1], dtype=dtype)
    w = torch.randn(*ws, dtype=dtype)
    with debug.Capture() as cap:
        got = fn(x.to("tpu"), w.to("tpu")).cpu()
    [prog] = [e.program for e in cap.compiles if e.name == name]
    types = _dot_operand_types(prog)
    assert types == {operands or {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]}, types
    torch.testing.assert_close(got, fn(x, w))  # CPU's own half kernel, OpInfo's tolerances


def test_half_dots_f32_follow_the_host_and_the_switch(monkeypatch):
    from torch_tpu.runtime import xla_flags

    monkeypatch.delenv("TORCH_TPU_CPU_HALF_DOTS_F32", raising=False)
    flags = xla_flags.host_cpu_flags()
    assert xla_flags.cpu_half_dots_f32("bfloat16") == (not {"amx_bf16", "avx512_bf16"} & flags)
    assert xla_flags.cpu_half_dots_f32("float16") == (not {"amx_fp16", "avx512_fp16"} & flags)
    monkeypatch.setenv("TORCH_TPU_CPU_HALF_DOTS_F32", "1")
    assert xla_flags.cpu_half_dots_f32("bfloat16")
    monkeypatch.setenv("TORCH_TPU_CPU_XLA_DEFAULTS", "0")
    assert not xla_flags.cpu_half_dots_f32("bfloat16")
    monkeypatch.delenv("TORCH_TPU_CPU_XLA_DEFAULTS")
    monkeypatch.setenv("TORCH_TPU_CPU_HALF_DOTS_F32", "often")
    with pytest.raises(ValueError, match="TORCH_TPU_CPU_HALF_DOTS_F32"):
        xla_flags.cpu_half_dots_f32("float16")


def test_half_dots_f32_are_in_the_graph_key(monkeypatch):
    from torch_tpu.cache import graphs

    keys = set()
    for f32, native in (("1", "0"), ("0", "0"), ("0", "1")):
        monkeypatch.setenv("TORCH_TPU_CPU_HALF_DOTS_F32", f32)
        monkeypatch.setenv("TORCH_TPU_CPU_NATIVE_BF16_DOTS", native)
        keys.add(graphs.key_for("g"))
    assert len(keys) == 3
