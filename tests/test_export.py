"""torch_tpu.export: PyTorch models as serialized StableHLO (jax.export.Exported).

Round trips go through bytes into a fresh interpreter that imports jax and
numpy only (it asserts that torch was never imported) and compare its results
with PyTorch on the CPU: an MLP (parameters baked in, and passed as a dict
argument), a transformer block exported once with a symbolic batch and
sequence length and called at two sizes, and the tiny Llama example. Error
cases: an op with no lowering, data-dependent shapes, random ops, state
mutation, a bad `params`. Slow: every example model (static shapes, then a
symbolic batch where the model allows it), its export size printed.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch_tpu  # noqa: E402
from torch_tpu.exporting import parameter_names, state_arrays  # noqa: E402

pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")

# The consumer: jax and numpy only. 64-bit types on, as in torch_tpu (int64
# token ids and float64 stay what PyTorch gave them).
_CONSUMER = textwrap.dedent("""
    import pickle, sys
    import jax
    import numpy as np
    jax.config.update("jax_enable_x64", True)
    with open(sys.argv[1], "rb") as f:
        jobs = pickle.load(f)
    results = []
    for blob, calls in jobs:
        exp = jax.export.deserialize(bytearray(blob))
        results.append([[np.asarray(y) for y in jax.tree_util.tree_leaves(exp.call(*args))]
                        for args in calls])
    assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
    with open(sys.argv[2], "wb") as f:
        pickle.dump(results, f)
""")


def _run_without_torch(tmp_path, jobs):
    """[(exported bytes, [call args, ...]), ...] -> per job, per call: the output leaves."""
    src, dst = tmp_path / "jobs.pkl", tmp_path / "results.pkl"
    with open(src, "wb") as f:
        pickle.dump(jobs, f)
    proc = subprocess.run([sys.executable, "-c", _CONSUMER, str(src), str(dst)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(dst, "rb") as f:
        return pickle.load(f)


def _np(t):
    return t.detach().cpu().numpy()


def _leaves(out):
    return [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]


def _close(got, want, rtol=1e-5, atol=1e-5):
    want = _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.dtype == _np(w).dtype
        np.testing.assert_allclose(g, _np(w), rtol=rtol, atol=atol)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 3)
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 0.5]))

    def forward(self, x):
        return self.fc2(self.norm(F.gelu(self.fc1(x)))) * self.scale


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def test_export_is_a_lazy_function():
    assert callable(torch_tpu.export)
    assert torch_tpu.export.__module__ == "torch_tpu.exporting"


def test_mlp_round_trip_baked_and_as_arguments(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 6)
    baked = torch_tpu.export(model, (x,))
    as_args = torch_tpu.export(model, (x,), params="arguments")
    # Baked: the program takes the input only; as arguments: a dict first.
    assert [a.shape for a in baked.in_avals] == [(4, 6)]
    names = parameter_names(as_args)
    assert names == sorted(["fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight",
                            "fc2.bias", "scale"])
    assert len(as_args.in_avals) == len(names) + 1
    # Other weights through the same program: a second model's state.
    torch.manual_seed(1)
    other = MLP().eval()
    with torch.no_grad():
        other.scale.mul_(3)
    results = _run_without_torch(tmp_path, [
        (baked.serialize(), [(_np(x),)]),
        (as_args.serialize(), [(state_arrays(model, as_args), _np(x)),
                               (state_arrays(other, as_args), _np(x))]),
    ])
    with torch.no_grad():
        want, want_other = model(x), other(x)
    _close(results[0][0], want)
    _close(results[1][0], want)
    _close(results[1][1], want_other)
    # The baked program carries the weights' bytes; the other one does not.
    weight = _np(model.fc1.weight).tobytes()
    assert weight in bytes(baked.serialize()) and weight not in bytes(as_args.serialize())


def test_transformer_block_symbolic_batch_and_length(tmp_path):
    torch.manual_seed(0)
    block = Block().eval()
    # batch unbounded, seq bounded; lowered for the CPU and TPU at once (lowering
    # needs no TPU), run on the CPU.
    batch, seq = Dim("batch"), Dim("seq", min=2, max=128)
    exp = torch_tpu.export(block, (torch.randn(2, 8, 32),), dynamic_shapes=({0: batch, 1: seq},),
                           platforms=("cpu", "tpu"))
    assert str(exp.in_avals[0].shape) == "(batch, seq, 32)"
    assert exp.platforms == ("cpu", "tpu")
    assert "seq <= 128" in exp.mlir_module() and "batch <=" not in exp.mlir_module()
    assert "batch" in exp.mlir_module()
    xs = [torch.randn(3, 8, 32), torch.randn(5, 13, 32)]
    [results] = _run_without_torch(tmp_path, [(exp.serialize(), [(_np(x),) for x in xs])])
    with torch.no_grad():
        for got, x in zip(results, xs):
            _close(got, block(x), rtol=1e-4, atol=1e-5)


def test_tiny_llama_round_trip_symbolic_batch_and_length(tmp_path):
    from examples.registry import get_example

    model, (tokens,), _ = get_example("llama", batch_size=2, seq_len=8)
    model.eval()
    # The example's tokens are a slice (stride 9): torch.export would guard on
    # that stride for a symbolic length. A contiguous example has no such guard.
    tokens = tokens.contiguous()
    exp = torch_tpu.export(model, (tokens,), dynamic_shapes=(
        {0: Dim("batch", max=16), 1: Dim("seq", min=2, max=256)},))
    assert str(exp.in_avals[0].shape) == "(batch, seq)"
    other = torch.randint(0, int(tokens.max()) + 1, (3, 5))  # another batch and length
    [results] = _run_without_torch(tmp_path, [(exp.serialize(), [(_np(tokens),),
                                                                  (_np(other),)])])
    with torch.no_grad():
        _close(results[0], model(tokens), rtol=1e-4, atol=1e-5)
        _close(results[1], model(other), rtol=1e-4, atol=1e-5)


def test_structured_inputs_and_outputs():
    # Dict keys out of sorted order (JAX sorts them, torch keeps insertion order),
    # a list, a keyword argument, a non-tensor argument (a constant: passed as None).
    def fn(inputs, pair, scale, *, bias):
        return {"sum": inputs["z"] - inputs["a"] + bias,
                "both": (pair[0] * scale, pair[1] - bias)}

    z, a, p0, p1, bias = (torch.randn(2, 3) for _ in range(5))
    exp = torch_tpu.export(fn, ({"z": z, "a": a}, [p0, p1], 3.0), {"bias": bias})
    got = exp.call({"a": _np(a), "z": _np(z)}, [_np(p0), _np(p1)], None, bias=_np(bias))
    want = fn({"z": z, "a": a}, [p0, p1], 3.0, bias=bias)
    assert set(got) == {"sum", "both"}
    np.testing.assert_allclose(np.asarray(got["sum"]), _np(want["sum"]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got["both"][0]), _np(want["both"][0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got["both"][1]), _np(want["both"][1]), rtol=1e-6)


# -- errors: PyTorch exception types, the op named, never a raw JAX error -------


@torch.library.custom_op("torch_tpu_export_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_op_without_lowering_is_named():
    with pytest.raises(NotImplementedError, match=r"torch_tpu_export_test\.twice"):
        torch_tpu.export(lambda x: _twice(x) + 1, (torch.randn(3),))


@pytest.mark.parametrize("fn, op", [
    (lambda x: torch.nonzero(x), "aten.nonzero"),
    (lambda x: x[x > 0].sum() * torch.ones(2), "aten.index"),
])
def test_data_dependent_shape_is_named(fn, op):
    with pytest.raises(NotImplementedError, match=f"{op}.*data-dependent"):
        torch_tpu.export(fn, (torch.randn(4),))


def test_random_op_is_refused():
    with pytest.raises(NotImplementedError, match=r"aten\.rand"):
        torch_tpu.export(lambda x: torch.rand(3) + x, (torch.randn(3),))


def test_state_mutation_is_refused():
    bn = torch.nn.BatchNorm1d(3)  # training mode: updates its running stats
    with pytest.warns(UserWarning, match="training mode"), \
            pytest.raises(NotImplementedError, match="running_mean"):
        torch_tpu.export(bn, (torch.randn(4, 3),))


def test_bad_params_mode():
    with pytest.raises(ValueError, match="params"):
        torch_tpu.export(lambda x: x, (torch.randn(2),), params="baked")


def test_parameter_names_needs_an_arguments_export():
    exp = torch_tpu.export(lambda x: x + 1, (torch.randn(2),))
    with pytest.raises(ValueError, match="arguments"):
        parameter_names(exp)


# -- every example model (slow) ---------------------------------------------------

EXAMPLES = ["llama", "qwen", "resnet", "dlrm", "mingpt", "unet"]
# A symbolic batch where the model's lowerings allow it (dlrm's embedding_bag
# lowering needs a static number of bags).
SYMBOLIC = {"llama", "qwen", "resnet", "mingpt", "unet"}


LMS = ("llama", "qwen")


def _example(name, batch, seq_len=8):
    from examples.registry import get_example

    opts = {"seq_len": seq_len} if name in LMS else {}
    model, inputs, _ = get_example(name, batch_size=batch, **opts)
    inputs = tuple(i.contiguous() for i in inputs)  # no stride guards (see the llama test)
    with torch.no_grad():  # zero-initialized layers (unet's output conv) would hide errors
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            if p.is_floating_point() and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval(), inputs


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_exports(name, tmp_path):
    import jax

    model, inputs = _example(name, 2)
    jobs, want = [], []
    for params in ("constants", "arguments"):
        exp = torch_tpu.export(model, inputs, params=params)
        blob = exp.serialize()
        print(f"{name} params={params}: {len(blob)} bytes")
        lead = (state_arrays(model, exp),) if params == "arguments" else ()
        jobs.append((blob, [lead + tuple(_np(i) for i in inputs)]))
        with torch.no_grad():
            want.append([model(*inputs)])
    if name in SYMBOLIC:
        # the LMs: a symbolic sequence length too
        batch, seq = Dim("batch", max=64), Dim("seq", min=2, max=256)
        dims = {0: batch, 1: seq} if name in LMS else {0: batch}
        exp = torch_tpu.export(model, inputs, dynamic_shapes=tuple(dims for _ in inputs))
        assert jax.export.is_symbolic_dim(exp.in_avals[0].shape[0])
        _, inputs3 = _example(name, 3, seq_len=5)
        jobs.append((exp.serialize(), [tuple(_np(i) for i in inputs3)]))
        with torch.no_grad():
            want.append([model(*inputs3)])
    results = _run_without_torch(tmp_path, jobs)
    for got_job, want_job in zip(results, want):
        for got, w in zip(got_job, want_job):
            _close(got, w, rtol=1e-4, atol=2e-5)


def test_model_on_tpu_exports_like_on_cpu():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        want = model(x)
    on_tpu = MLP().eval()
    on_tpu.load_state_dict(model.state_dict())
    on_tpu = on_tpu.to("tpu")
    baked = torch_tpu.export(on_tpu, (x.to("tpu"),))
    as_args = torch_tpu.export(on_tpu, (x.to("tpu"),), params="arguments")
    _close([np.asarray(baked.call(_np(x)))], want)
    _close([np.asarray(as_args.call(state_arrays(on_tpu, as_args), _np(x)))], want)
