"""runtime/calling.py: the one way the eager executor and the graph lowering call a lowering."""

import jax.numpy as jnp
import pytest
import torch

from torch_tpu.runtime import calling

aten = torch.ops.aten


def test_bind_fills_defaults_and_keyword_only():
    named = calling.bind(aten.sum.dim_IntList, (1, [0]), {})
    assert named == {"self": 1, "dim": [0], "keepdim": False, "dtype": None}
    named = calling.bind(aten.add.Tensor, (1, 2), {"alpha": 3})
    assert named == {"self": 1, "other": 2, "alpha": 3}


def test_split_round_trips_bind_and_fills_missing_defaults():
    named = calling.bind(aten.add.Tensor, (1, 2), {"alpha": 3})
    assert calling.split(aten.add.Tensor, named) == ([1, 2], {"alpha": 3})
    # Schema arguments as well as an op; a missing name takes its default.
    args = aten.add.Tensor._schema.arguments
    assert calling.split(args, {"self": 1, "other": 2}) == ([1, 2], {"alpha": 1})


def test_conform_casts_broadcasts_and_raises_the_callers_error():
    x = calling.conform(jnp.ones((3,), jnp.int32), (2, 3), torch.float32, "aten.f")
    assert x.shape == (2, 3) and x.dtype == jnp.float32
    with pytest.raises(RuntimeError, match=r"internal error in the lowering of aten.f: "
                       r"produced shape \(3,\), PyTorch expects \(2, 4\)"):
        calling.conform(jnp.ones((3,)), (2, 4), torch.float32, "aten.f")

    def mine(name, got, want):
        return NotImplementedError(f"{name} {got} {want}")

    with pytest.raises(NotImplementedError, match=r"aten.g \(3,\) \(4,\)"):
        calling.conform(jnp.ones((3,)), (4,), torch.float32, "aten.g", mine)


def test_functional_of():
    assert calling.functional_of(aten.add_.Tensor) is aten.add.Tensor
    assert calling.functional_of(aten.add.out) is aten.add.Tensor
    assert calling.functional_of(aten.add.Tensor) is None
    from torch_tpu.runtime import executor

    assert executor.functional_of is calling.functional_of
