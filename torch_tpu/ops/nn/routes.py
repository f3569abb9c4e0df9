"""Routes: PrivateUse1 kernels for two ops whose PyTorch path misses the
lowerings (see the package docstring): `scaled_dot_product_attention` to the
fused attention overload, `native_batch_norm` to the
`_native_batch_norm_legit` overloads.
"""

from __future__ import annotations

import torch

from .normalization import native_batch_norm_route

aten = torch.ops.aten


# --------------------------------------------------------------------------
# routes: kernels outside the lowering table


def _sdpa_fusable(q, k, v, attn_mask, enable_gqa):
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        return False
    if q.is_nested or k.is_nested or v.is_nested:
        return False
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        return False
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        return False
    if q.shape[-1] != k.shape[-1]:
        return False
    hq, hk = q.shape[-3], k.shape[-3]
    if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
        return False
    if attn_mask is not None and attn_mask.dim() > 4:
        return False
    return True


def _sdpa_check(q, k, v, attn_mask):
    """The argument checks of PyTorch's scaled_dot_product_attention."""
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{q.dtype} key.dtype: {k.dtype} and value.dtype: {v.dtype} instead.")
    if not (q.device == k.device == v.device):
        raise RuntimeError(
            "Expected query, key, and value to have the same device type, but got "
            f"query.device: {q.device} key.device: {k.device} and value.device: {v.device} "
            "instead.")
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got "
            f"query.dim: {q.dim()} key.dim: {k.dim()} and value.dim: {v.dim()} instead.")
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
            f"attn_mask.dtype: {attn_mask.dtype} and  query.dtype: {q.dtype} instead.")


def _sdpa_route(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    _sdpa_check(query, key, value, attn_mask)
    if not _sdpa_fusable(query, key, value, attn_mask, enable_gqa):
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
            enable_gqa=enable_gqa)[0]
    if is_causal and attn_mask is not None:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
            "is_causal=True")
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]


_route_libs = []


def _install_routes():
    if _route_libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    _route_libs.append(lib)
    lib.impl("scaled_dot_product_attention", _sdpa_route, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", _sdpa_route, "PrivateUse1")
    lib.impl("native_batch_norm", native_batch_norm_route, "PrivateUse1")


_install_routes()
