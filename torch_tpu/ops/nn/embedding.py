"""Embedding (with renorm and the dense backward) and embedding_bag,
forward and backwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ...runtime import executor
from .. import core
from ..opmath import opmath, upcast
from ..registry import lower
from ._common import meta_list

aten = torch.ops.aten


# --------------------------------------------------------------------------
# embedding


@lower(aten.embedding.default, traced=("padding_idx",))
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0, mode="clip")


@lower(aten.embedding_renorm.default)
@opmath("self")
def embedding_renorm(self, indices, max_norm, norm_type):
    """Rows of `self` named in `indices` rescaled to norm <= max_norm."""
    idx = indices.reshape(-1)
    rows = jnp.take(self, idx, axis=0, mode="clip")
    norms = jnp.linalg.norm(rows, ord=norm_type, axis=-1, keepdims=True)
    scale = jnp.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    return self.at[idx].set(rows * scale)


# padding_idx is a runtime input of the programs that read it (`traced`): a
# program per value would compile once per padding index a model or a test
# uses (PyTorch's embedding_bag tests walk every index of their input).


def _not_padding(indices, padding_idx):
    """Which indices count: all, or those other than a padding_idx >= 0
    (a traced scalar in eager programs, a Python int in compiled graphs)."""
    if padding_idx is None:
        return jnp.ones(indices.shape, jnp.bool_)
    return (padding_idx < 0) | (indices != padding_idx)


@lower(aten.embedding_dense_backward.default, traced=("padding_idx",))
@opmath("grad_output")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    g = grad_output
    d = g.shape[-1]
    idx = indices.reshape(-1)
    g = g.reshape(-1, d)
    g = jnp.where(_not_padding(idx, padding_idx)[:, None], g, jnp.zeros((), g.dtype))
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, d), g.dtype).at[idx].add(g)


def _bags(indices, offsets, include_last_offset, padding_idx, nbags):
    """Bag of each index, whether it counts (in a bag, not padding), counts per bag."""
    n = indices.shape[0]
    pos = jnp.arange(n)
    starts = offsets[:nbags]
    bag = jnp.clip(jnp.searchsorted(starts, pos, side="right") - 1, 0, max(nbags - 1, 0))
    if include_last_offset:
        end = offsets[nbags] if offsets.shape[0] > nbags else n
        inside = pos < end
    else:
        inside = jnp.ones((n,), jnp.bool_)
    valid = inside & (pos >= starts[bag]) if nbags else jnp.zeros((n,), jnp.bool_)
    valid = valid & _not_padding(indices, padding_idx)
    counts = jax.ops.segment_sum(valid.astype(jnp.int64), bag, num_segments=nbags)
    return bag, valid, counts


def _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights,
                        include_last_offset, padding_idx):
    nbags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag, valid, counts = _bags(indices, offsets, include_last_offset, padding_idx, nbags)
    w = upcast(weight)
    rows = jnp.take(w, indices, axis=0, mode="clip")
    metas = meta_list()
    if mode == 2:
        neg = jnp.array(-jnp.inf, rows.dtype)
        vals = jnp.where(valid[:, None], rows, neg)
        out = jax.ops.segment_max(vals, bag, num_segments=nbags)
        out = jnp.where(counts[:, None] > 0, out, 0)
        # First index (in bag order) reaching the maximum, like PyTorch's CPU.
        n = indices.shape[0]
        if n == 0:  # every bag empty: nothing to pick (CPU's indices are 0)
            maxi = jnp.zeros(tuple(metas[3].shape), jnp.int64)
        else:
            hit = valid[:, None] & (vals == out[bag])
            first = jax.ops.segment_min(jnp.where(hit, jnp.arange(n)[:, None], n), bag,
                                        num_segments=nbags)
            maxi = jnp.where(counts[:, None] > 0, indices[jnp.clip(first, 0, n - 1)], 0)
    else:
        if per_sample_weights is not None:
            rows = rows * upcast(per_sample_weights)[:, None]
        out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, num_segments=nbags)
        if mode == 1:
            out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
        maxi = jnp.zeros(tuple(metas[3].shape), jnp.int64)
    bag_size = jnp.zeros(tuple(metas[2].shape), jnp.int64)
    if mode != 0:
        bag_size = bag_size.at[:nbags].set(counts)
    if tuple(metas[1].shape) == (0,):
        # PyTorch's CPU kernel (and its fake kernel) skips offset2bag in some
        # sum-mode calls (2-D inputs): return what its metadata says.
        bag = jnp.zeros((0,), jnp.int64)
    return out, bag, bag_size, maxi


@lower(aten._embedding_bag.default, aten._embedding_bag_forward_only.default,
       traced=("padding_idx",))
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights,
                               include_last_offset, padding_idx)


def _embedding_bag_grad(grad, indices, bag, valid, counts, maximum_indices, num_weights,
                        scale_grad_by_freq, mode, per_sample_weights):
    g = upcast(grad)
    d = g.shape[-1]
    if mode == 2:
        nbags = g.shape[0]
        keep = (counts > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(d), (nbags, d))
        return jnp.zeros((num_weights, d), g.dtype).at[maximum_indices, cols].add(
            jnp.where(keep, g, 0))
    rows = g[bag]
    if mode == 1:
        rows = rows / jnp.maximum(counts[bag], 1)[:, None].astype(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * upcast(per_sample_weights)[:, None]
    rows = jnp.where(valid[:, None], rows, 0)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), rows.dtype).at[indices].add(valid.astype(rows.dtype))
        rows = rows / jnp.maximum(freq[indices], 1)[:, None]
    return jnp.zeros((num_weights, d), rows.dtype).at[indices].add(rows)


@lower(aten._embedding_bag_backward.default, traced=("padding_idx",))
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                            num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
                            padding_idx=-1):
    nbags = grad.shape[0]
    include_last = offsets.shape[0] > nbags
    bag, valid, counts = _bags(indices, offsets, include_last, padding_idx, nbags)
    return _embedding_bag_grad(grad, indices, bag, valid, counts, maximum_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights)


@lower(aten._embedding_bag_dense_backward.default, traced=("padding_idx",))
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                  padding_idx=-1):
    nbags = grad.shape[0]
    valid = _not_padding(indices, padding_idx)
    counts = jax.ops.segment_sum(valid.astype(jnp.int64), offset2bag, num_segments=nbags)
    return _embedding_bag_grad(grad, indices, offset2bag, valid, counts, maximum_indices,
                               num_weights, scale_grad_by_freq, mode, per_sample_weights)


@lower(aten._embedding_bag_per_sample_weights_backward.default, traced=("padding_idx",))
@opmath("weight")
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                               padding_idx=-1):
    nbags = grad.shape[0]
    include_last = offsets.shape[0] > nbags
    bag, valid, _ = _bags(indices, offsets, include_last, padding_idx, nbags)
    rows = jnp.take(weight, indices, axis=0, mode="clip")
    return jnp.where(valid, jnp.sum(upcast(grad)[bag] * rows, axis=-1), 0)


# --------------------------------------------------------------------------
# kernels around the lowerings


def _check_embedding_bag(weight, indices, offsets, *args, **kwargs):
    """CPU's argument checks, in CPU's order (the meta kernel has no weight check)."""
    if indices.dim() not in (1, 2):
        raise RuntimeError(
            f"input has to be a 1D or 2D Tensor, but got Tensor of dimension {indices.dim()}")
    if indices.dim() == 1 and offsets.dim() != 1:
        raise RuntimeError(
            f"offsets has to be a 1D Tensor, but got Tensor of dimension {offsets.dim()}")
    if weight.dim() != 2:
        raise RuntimeError(
            f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")


def _embedding_bag_backward_kernel(grad, indices, offsets, offset2bag, bag_size,
                                   maximum_indices, num_weights, scale_grad_by_freq, mode,
                                   sparse, per_sample_weights=None, padding_idx=-1):
    # The gradient is dense on tpu whether `sparse` is set or not (XLA has no
    # sparse arrays; docs/troubleshooting.md). PyTorch's meta kernel for the
    # sparse form decomposes into a data-dependent masked_select when
    # padding_idx is set, so the dense form is what runs.
    return executor.runner_for(aten._embedding_bag_backward.default)(
        grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
        scale_grad_by_freq, mode, False, per_sample_weights, padding_idx)


def _install_kernels():
    for op in (aten._embedding_bag.default, aten._embedding_bag_forward_only.default):
        core.KERNELS.setdefault(op, core.checked_kernel(op, _check_embedding_bag))
    core.KERNELS.setdefault(aten._embedding_bag_backward.default,
                            _embedding_bag_backward_kernel)


_install_kernels()
