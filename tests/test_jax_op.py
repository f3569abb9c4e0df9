"""torch_tpu.jax_op: JAX functions as PyTorch ops (eager, autograd, torch.compile)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu
import torch_tpu.debug as dbg


def _np(t):
    return t.detach().cpu().numpy()


@torch_tpu.jax_op
def sin_mul(x, y):
    return jnp.sin(x) * y + x ** 2


def _ref_sin_mul(x, y):
    return jnp.sin(x) * y + x ** 2


def test_forward_matches_jax():
    x = torch.randn(3, 4, device="tpu")
    y = torch.randn(3, 4, device="tpu")
    out = sin_mul(x, y)
    assert isinstance(out, torch.Tensor) and out.device.type == "tpu"
    assert out.shape == (3, 4) and out.dtype == torch.float32
    np.testing.assert_allclose(_np(out), np.asarray(_ref_sin_mul(_np(x), _np(y))),
                               rtol=1e-6, atol=1e-6)


def test_gradient_matches_jax_grad():
    x = torch.randn(5, device="tpu", requires_grad=True)
    y = torch.randn(5, device="tpu", requires_grad=True)
    sin_mul(x, y).sum().backward()
    gx, gy = jax.grad(lambda a, b: _ref_sin_mul(a, b).sum(), argnums=(0, 1))(_np(x), _np(y))
    np.testing.assert_allclose(_np(x.grad), np.asarray(gx), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_np(y.grad), np.asarray(gy), rtol=1e-5, atol=1e-6)


def test_gradcheck_float64():
    x = torch.randn(4, dtype=torch.float64, device="tpu", requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: sin_mul(a, b), (x, y))


def test_structured_outputs_and_registered_op():
    @torch_tpu.jax_op(name="stats")
    def stats(x):
        return {"mean": x.mean(0), "max": x.max(0)}

    @torch_tpu.jax_op
    def two(x):
        return x + 1, (x * 2).astype(jnp.int32)

    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    d = stats(x)
    assert set(d) == {"mean", "max"}
    torch.testing.assert_close(d["mean"].cpu(), torch.arange(12.0).reshape(3, 4).mean(0))
    a, b = two(x)
    assert b.dtype == torch.int32
    torch.testing.assert_close(b.cpu(), (torch.arange(12.0).reshape(3, 4) * 2).int())
    assert hasattr(torch.ops.torch_tpu_jax, stats.name)
    out = torch.ops.torch_tpu_jax.stats([x])
    assert isinstance(out, list) and len(out) == 2


def test_cpu_tensors_run_through_jax_on_host():
    x = torch.randn(6, dtype=torch.float32)
    y = torch.randn(6, dtype=torch.float32)
    out = sin_mul(x, y)
    assert out.device.type == "cpu"
    np.testing.assert_allclose(out.numpy(), np.asarray(_ref_sin_mul(x.numpy(), y.numpy())),
                               rtol=1e-6, atol=1e-6)


def test_integer_input_gets_no_gradient():
    @torch_tpu.jax_op
    def scale_rows(x, idx):
        return x * idx[:, None].astype(x.dtype)

    x = torch.randn(3, 2, device="tpu", requires_grad=True)
    idx = torch.tensor([1, 2, 3], device="tpu")
    scale_rows(x, idx).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([[1.0, 1], [2, 2], [3, 3]]))


def test_partial_for_static_config_and_metrics():
    op = torch_tpu.jax_op(functools.partial(jnp.sum, axis=1))
    x = torch.ones(4, 3, device="tpu")
    with dbg.capture() as cap:
        out = op(x)
        out = op(x)
    torch.testing.assert_close(out.cpu(), torch.full((4,), 3.0))
    assert cap.metrics["ops"][f"torch_tpu_jax.{op.name}.default"] == 2


def test_bad_arguments():
    with pytest.raises(TypeError, match="tensors only"):
        sin_mul(torch.ones(2, device="tpu"), 3.0)
    with pytest.raises(TypeError):
        torch_tpu.jax_op(42)


def test_works_under_torch_compile_with_backward():
    def f(x, y):
        return (sin_mul(x, y) * 2).sum()

    x = torch.randn(3, 4, device="tpu", requires_grad=True)
    y = torch.randn(3, 4, device="tpu")
    cf = torch.compile(f, backend="tpu", fullgraph=True)
    loss = cf(x, y)
    loss.backward()
    ref = jax.grad(lambda a: 2 * _ref_sin_mul(a, _np(y)).sum())(_np(x))
    np.testing.assert_allclose(float(loss.detach()), float(f(x, y).detach()), rtol=1e-5)
    np.testing.assert_allclose(_np(x.grad), np.asarray(ref), rtol=1e-5, atol=1e-5)
    # The op is lowered inside the graph's program (no separate eager executable).
    fw = [e for e in dbg.compile_log(kind="graph") if e.name == "graph_forward"][-1]
    assert "sine" in fw.program.optimized


def test_pallas_kernel_interpret_mode():
    pl = pytest.importorskip("jax.experimental.pallas")

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    def fused(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=jax.default_backend() != "tpu")(x, y)

    op = torch_tpu.jax_op(fused, vjp=False)
    x = torch.randn(8, 128, device="tpu")
    y = torch.randn(8, 128, device="tpu")
    torch.testing.assert_close(op(x, y).cpu(), x.cpu() * 2 + y.cpu())
