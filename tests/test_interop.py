"""torch_tpu.to_jax / from_jax: tpu tensors and JAX arrays share buffers (issue 48:
DLPack cannot carry a tpu tensor to JAX, nor a JAX array to a tpu tensor)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import storage

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


def test_to_jax_shares_the_buffer_of_a_whole_tensor():
    t = torch.arange(5.0, device="tpu") * 2
    a = torch_tpu.to_jax(t)
    assert a is storage.data_of(t).array
    np.testing.assert_array_equal(np.asarray(a), np.arange(5.0) * 2)
    t.add_(1)  # a new array for t; the JAX array keeps its values, as JAX's are immutable
    np.testing.assert_array_equal(np.asarray(a), np.arange(5.0) * 2)
    np.testing.assert_array_equal(np.asarray(torch_tpu.to_jax(t)), np.arange(5.0) * 2 + 1)


@pytest.mark.parametrize("view", ["t", "slice", "reshape", "conj"])
def test_to_jax_of_a_view_gives_its_values(view):
    base = torch.arange(12.0, device="tpu").reshape(3, 4)
    cpu = torch.arange(12.0).reshape(3, 4)
    make = {"t": lambda x: x.t(), "slice": lambda x: x[1:, ::2],
            "reshape": lambda x: x.reshape(4, 3),
            "conj": lambda x: (x * (1 + 1j)).conj()}[view]
    a = torch_tpu.to_jax(make(base))
    np.testing.assert_array_equal(np.asarray(a), make(cpu).resolve_conj().numpy())
    assert a.devices() == {storage.data_of(base).array.devices().pop()}


def test_from_jax_wraps_the_array_without_a_copy():
    b = jnp.arange(4, dtype=jnp.bfloat16)
    t = torch_tpu.from_jax(b)
    assert (t.device.type, t.dtype, tuple(t.shape)) == ("tpu", torch.bfloat16, (4,))
    assert storage.data_of(t).array is b
    t.add_(1)  # writes make a new array: the caller's stays as it was
    assert torch.equal(t.cpu(), torch.arange(1, 5, dtype=torch.bfloat16))
    np.testing.assert_array_equal(np.asarray(b, np.float32), np.arange(4.0))
    assert torch.equal((torch_tpu.from_jax(jnp.ones((2, 3), jnp.int32)) * 2).cpu(),
                       torch.full((2, 3), 2, dtype=torch.int32))


def test_round_trip_and_autograd_through_a_wrapped_array():
    x = torch_tpu.from_jax(jnp.linspace(0, 1, 5, dtype=jnp.float32)).requires_grad_()
    (x * x).sum().backward()
    np.testing.assert_allclose(np.asarray(torch_tpu.to_jax(x.grad)),
                               2 * np.linspace(0, 1, 5, dtype=np.float32), rtol=1e-6)


def test_wrong_inputs_raise():
    with pytest.raises(TypeError, match="expected a tpu tensor, got cpu"):
        torch_tpu.to_jax(torch.ones(2))
    with pytest.raises(TypeError, match="expected a jax.Array, got ndarray"):
        torch_tpu.from_jax(np.ones(2))


def test_from_jax_refuses_a_sharded_array(tmp_path):
    """In a process with two XLA devices (the default run has one)."""
    code = (
        "import jax, jax.numpy as jnp, numpy as np, torch, torch_tpu\n"
        "mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ('x',))\n"
        "a = jax.device_put(jnp.ones(4), jax.sharding.NamedSharding(mesh, "
        "jax.sharding.PartitionSpec('x')))\n"
        "try:\n    torch_tpu.from_jax(a)\nexcept ValueError as e:\n    print('refused:', e)\n"
        "t = torch_tpu.from_jax(jax.device_put(jnp.ones(2), jax.devices()[1]))\n"
        "print('device:', t.device)\n")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "TORCH_TPU_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: torch_tpu.from_jax: the array is sharded over 2 devices" in out.stdout
    assert "device: tpu:1" in out.stdout
