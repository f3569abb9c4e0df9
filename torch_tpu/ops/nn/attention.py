"""The fused scaled-dot-product attention
(`_scaled_dot_product_fused_attention_overrideable`), forward and backward,
with dropout, causal masks and grouped-query heads.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..opmath import is_half, upcast
from ..registry import lower
from ._common import matmul_precision, sum_to
from ...runtime import rng as tpu_random

aten = torch.ops.aten


# --------------------------------------------------------------------------
# attention


def _heads(x):
    return x.shape[-3] if x.ndim >= 3 else 1


def _group(x, grp):
    """(..., Hq, A, B) -> (..., Hk, G, A, B): query head h uses kv head h // G."""
    if grp == 1:
        return x
    return x.reshape(x.shape[:-3] + (x.shape[-3] // grp, grp) + x.shape[-2:])


def _ungroup(x, grp):
    if grp == 1:
        return x
    return x.reshape(x.shape[:-4] + (x.shape[-4] * x.shape[-3],) + x.shape[-2:])


def _kv(x, grp):
    """(..., Hk, S, E) -> (..., Hk, 1, S, E), to pair with grouped queries."""
    return x if grp == 1 else x[..., :, None, :, :]


def _attn_scores(q, k, bias, is_causal, scale, grp):
    """Masked, scaled scores q k^T in float32, shape (..., Hq, L, S)."""
    L, S = q.shape[-2], k.shape[-2]
    s = jnp.einsum("...le,...se->...ls", _group(upcast(q), grp), _kv(upcast(k), grp),
                   precision=matmul_precision(q, k))
    s = _ungroup(s, grp) * scale
    masked = None
    if is_causal:
        masked = ~jnp.tril(jnp.ones((L, S), jnp.bool_))
    if bias is not None:
        if bias.dtype == jnp.bool_:
            masked = ~bias if masked is None else (masked | ~bias)
        else:
            s = s + upcast(bias)
    if masked is not None:
        s = jnp.where(masked, -jnp.inf, s)
    return s


def _attn_setup(q, k, scale):
    E = q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    hq, hk = _heads(q), _heads(k)
    return scale, (hq // hk if hq != hk else 1)


def _attn_keep(key, dropout_p, shape):
    return jax.random.bernoulli(key, 1.0 - dropout_p, shape)


def _attention(q, k, v, bias, dropout_p, is_causal, scale, key):
    """softmax(q k^T * scale + bias) v, with GQA when k has fewer heads.

    Fully masked rows give zeros (PyTorch's CPU kernels and its math path's
    _safe_softmax do the same). Returns (out, logsumexp).
    """
    scale, grp = _attn_setup(q, k, scale)
    s = _attn_scores(q, k, bias, is_causal, scale, grp)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    lse = (jnp.log(denom) + m)[..., 0]
    p = e / jnp.where(denom == 0, 1.0, denom)
    if dropout_p > 0:
        p = jnp.where(_attn_keep(key, dropout_p, p.shape), p / (1.0 - dropout_p), 0.0)
    half_v = is_half(v.dtype)
    # P @ V runs in V's dtype (float32 accumulation) for half types.
    va = v if half_v else upcast(v)
    out = jnp.einsum("...ls,...sd->...ld", _group(p.astype(va.dtype), grp), _kv(va, grp),
                     precision=matmul_precision(v), preferred_element_type=jnp.float32
                     if half_v else None)
    return _ungroup(out, grp), lse


def _attention_backward(g, q, k, v, bias, lse, dropout_p, is_causal, scale, key, out=None):
    """Gradients of _attention from the saved logsumexp (no second softmax).
    With the forward's `out`, the softmax-gradient row term sum(p * dp) is
    taken as rowsum(g * out), as CPU's fused attention backward does."""
    scale, grp = _attn_setup(q, k, scale)
    s = _attn_scores(q, k, bias, is_causal, scale, grp)
    lse = lse.reshape(s.shape[:-1])[..., None]
    p = jnp.where(jnp.isfinite(lse), jnp.exp(s - lse), 0.0)
    ga = upcast(g)
    prec = matmul_precision(q, k, v)
    pd = p
    if dropout_p > 0:
        z = jnp.where(_attn_keep(key, dropout_p, p.shape), 1.0 / (1.0 - dropout_p), 0.0)
        pd = p * z
    gg = _group(ga, grp)
    # With GQA, the G query heads of a kv head sum into its gradients.
    gsum = "...gls,...gld->...sd" if grp > 1 else "...ls,...ld->...sd"
    dv = jnp.einsum(gsum, _group(pd, grp), gg, precision=prec)
    dp = _ungroup(jnp.einsum("...ld,...sd->...ls", gg, _kv(upcast(v), grp), precision=prec), grp)
    if dropout_p > 0:
        dp = dp * z
    if out is not None:
        row = jnp.sum(ga * upcast(out), axis=-1, keepdims=True)
    else:
        row = jnp.sum(p * dp, axis=-1, keepdims=True)
    ds = p * (dp - row)
    dsg = _group(ds, grp)
    dq = _ungroup(jnp.einsum("...ls,...se->...le", dsg, _kv(upcast(k), grp), precision=prec),
                  grp) * scale
    dk = jnp.einsum(gsum.replace("d", "e"), dsg, _group(upcast(q), grp), precision=prec) * scale
    return dq, dk, dv, ds


def _pack_key(rng_key):
    """The raw (seed, offset) uint32[4] key as two int64 scalars."""
    k = rng_key.astype(jnp.uint64)
    seed = lax.bitcast_convert_type((k[0] << 32) | k[1], jnp.int64)
    offset = lax.bitcast_convert_type((k[2] << 32) | k[3], jnp.int64)
    return seed, offset


def _unpack_key(seed, offset):
    s = lax.bitcast_convert_type(seed.astype(jnp.int64), jnp.uint64)
    o = lax.bitcast_convert_type(offset.astype(jnp.int64), jnp.uint64)
    raw = jnp.stack([s >> 32, s & 0xFFFFFFFF, o >> 32, o & 0xFFFFFFFF]).astype(jnp.uint32)
    return tpu_random.jax_key(raw)


@lower(aten._scaled_dot_product_fused_attention_overrideable.default, random=True)
def _sdpa_fused(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, *, scale=None, rng_key):
    out, lse = _attention(query, key, value, attn_bias, dropout_p, is_causal, scale,
                          tpu_random.jax_key(rng_key))
    seed, offset = _pack_key(rng_key)
    if query.ndim == 3:
        lse = lse[None]
    return out, lse, seed, offset


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _sdpa_fused_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out,
                         logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                         philox_seed, philox_offset, *, scale=None):
    rkey = _unpack_key(philox_seed, philox_offset) if dropout_p > 0 else None
    gq, gk, gv, ds = _attention_backward(grad_out, query, key, value, attn_bias, logsumexp,
                                         dropout_p, is_causal, scale, rkey, out)
    gb = None
    if attn_bias is not None:
        if attn_bias.dtype != jnp.bool_ and grad_input_mask[3]:
            gb = sum_to(ds, attn_bias.shape)
        else:
            # PyTorch's meta gives the bias gradient the bias' shape whenever a
            # bias is passed, even when it is not wanted (or is a bool mask).
            gb = jnp.zeros(attn_bias.shape, attn_bias.dtype)
    # The meta kernel returns all three input gradients whatever the mask.
    gq, gk, gv = (g if want else jnp.zeros(g.shape, g.dtype)
                  for g, want in zip((gq, gk, gv), grad_input_mask[:3]))
    return gq, gk, gv, gb
