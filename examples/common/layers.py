"""Layers shared by the Llama and Qwen examples: RMSNorm and rotary position embeddings."""

from __future__ import annotations

import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32.

    y = weight * (x / sqrt(mean(x^2) + eps)), the normalisation in float32 and
    the result cast back to the input dtype before the scale, as Llama does.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), i < d/2, with Llama 3's frequency-dependent scaling.

    Llama 3.1+ ("rope_type": "llama3") leaves high frequencies (wavelength
    shorter than original_context / high_freq_factor) alone, divides low
    frequencies (wavelength longer than original_context / low_freq_factor)
    by `factor`, and interpolates linearly (in original_context / wavelength)
    between the two in the band between them.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).double() / head_dim))
    if not scaling:
        return inv.float()
    kind = scaling.get("rope_type", scaling.get("type", "llama3"))
    if kind == "default":
        return inv.float()
    if kind != "llama3":
        raise NotImplementedError(f"rope scaling type {kind!r} (only 'llama3' is implemented)")
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    long_wave = wavelen > old_ctx / low      # low frequencies: fully scaled
    short_wave = wavelen < old_ctx / high    # high frequencies: unchanged
    t = (old_ctx / wavelen - low) / (high - low)  # 0 at the long end, 1 at the short end
    between = (1 - t) * inv / factor + t * inv
    out = torch.where(long_wave, inv / factor, torch.where(short_wave, inv, between))
    return out.float()


class RotaryEmbedding(nn.Module):
    """cos/sin of position * inv_freq for the given positions (computed per call, no table)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)

    def reset_parameters(self):
        """Recompute the buffer (after building the model on the meta device)."""
        self.inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(
            self.inv_freq.device if self.inv_freq.device.type != "meta" else "cpu")

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) must not round the frequencies: keep them float32.
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32 and self.inv_freq.device.type != "meta":
            self.inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(
                self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype=torch.float32):
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]   # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)                               # (T, D)
        return emb.cos().to(dtype), emb.sin().to(dtype)
