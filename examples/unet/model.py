"""A diffusion UNet and DDPM (Ho et al. 2020, "Denoising Diffusion Probabilistic Models").

The network predicts the noise added to an image at timestep t:

- sinusoidal timestep embedding -> Linear -> SiLU -> Linear (width 4*ch);
- a 3x3 input convolution, then per resolution level `num_res_blocks`
  residual blocks (GroupNorm, SiLU, 3x3 conv, + projected timestep embedding,
  GroupNorm, SiLU, dropout, 3x3 conv; 1x1 conv shortcut when the width
  changes), self-attention blocks at the resolutions in `attn_resolutions`,
  and a stride-2 convolution between levels;
- a middle of residual block, attention, residual block;
- the mirror path up (one more residual block per level, each fed the
  concatenated skip connection), nearest-neighbour upsampling + 3x3 conv;
- GroupNorm, SiLU, 3x3 output convolution.

`Diffusion` holds the linear beta schedule, the training objective
(MSE between the true and predicted noise at a uniformly drawn t) and the
ancestral sampler, optionally over a subsequence of the timesteps ("respaced",
Nichol & Dhariwal 2021) so a few dozen steps give a sample.

`SyntheticShapes` draws the training images: coloured discs and squares on a
coloured background, generated on the fly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class UNetConfig:
    image_size: int = 16
    in_channels: int = 3
    ch: int = 32
    ch_mult: tuple = (1, 2)
    num_res_blocks: int = 1
    attn_resolutions: tuple = (8,)
    dropout: float = 0.0
    groups: int = 8
    timesteps: int = 100


CONFIGS = {
    "tiny": UNetConfig(),
    # The DDPM CIFAR-10 model (35.7M parameters).
    "ddpm-cifar10": UNetConfig(image_size=32, ch=128, ch_mult=(1, 2, 2, 2), num_res_blocks=2,
                               attn_resolutions=(16,), dropout=0.1, groups=32, timesteps=1000),
}


def timestep_embedding(t, dim: int):
    """Sinusoidal embedding of integer timesteps t (B,) -> (B, dim), as in the Transformer."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device).float() / (half - 1))
    args = t.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb_dim, dropout, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb_proj = nn.Linear(temb_dim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)     # each block starts as the identity
        nn.init.zeros_(self.conv2.bias)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.shortcut(x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the H*W positions of a feature map."""

    def __init__(self, ch, groups):
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        att = torch.softmax(torch.bmm(q.transpose(1, 2), k) / math.sqrt(c), dim=-1)  # (B, HW, HW)
        out = torch.bmm(v, att.transpose(1, 2)).reshape(b, c, h, w)
        return x + self.proj(out)


class Downsample(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UNet(nn.Module):
    def __init__(self, cfg: UNetConfig):
        super().__init__()
        self.cfg = cfg
        ch, g, p = cfg.ch, cfg.groups, cfg.dropout
        temb = 4 * ch
        self.temb = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(cfg.in_channels, ch, 3, padding=1)

        self.down = nn.ModuleList()
        skips = [ch]
        cur, res = ch, cfg.image_size
        for level, mult in enumerate(cfg.ch_mult):
            for _ in range(cfg.num_res_blocks):
                blocks = nn.ModuleList([ResBlock(cur, ch * mult, temb, p, g)])
                cur = ch * mult
                if res in cfg.attn_resolutions:
                    blocks.append(AttnBlock(cur, g))
                self.down.append(blocks)
                skips.append(cur)
            if level != len(cfg.ch_mult) - 1:
                self.down.append(nn.ModuleList([Downsample(cur)]))
                skips.append(cur)
                res //= 2

        self.mid = nn.ModuleList([ResBlock(cur, cur, temb, p, g), AttnBlock(cur, g),
                                  ResBlock(cur, cur, temb, p, g)])

        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(cfg.ch_mult))):
            for _ in range(cfg.num_res_blocks + 1):
                blocks = nn.ModuleList([ResBlock(cur + skips.pop(), ch * mult, temb, p, g)])
                cur = ch * mult
                if res in cfg.attn_resolutions:
                    blocks.append(AttnBlock(cur, g))
                self.up.append(blocks)
            if level != 0:
                self.up.append(nn.ModuleList([Upsample(cur)]))
                res *= 2
        assert not skips

        self.norm_out = nn.GroupNorm(g, cur)
        self.conv_out = nn.Conv2d(cur, cfg.in_channels, 3, padding=1)
        nn.init.zeros_(self.conv_out.weight)
        nn.init.zeros_(self.conv_out.bias)

    @staticmethod
    def _run(blocks, h, temb):
        for m in blocks:
            h = m(h, temb) if isinstance(m, ResBlock) else m(h)
        return h

    def forward(self, x, t):
        """Predicted noise for noisy images x (B, C, H, W) at timesteps t (B,) int64."""
        temb = self.temb(timestep_embedding(t, self.cfg.ch))
        h = self.conv_in(x)
        hs = [h]
        for blocks in self.down:
            h = self._run(blocks, h, temb)
            hs.append(h)
        h = self._run(self.mid, h, temb)
        for blocks in self.up:
            if isinstance(blocks[0], ResBlock):
                h = torch.cat([h, hs.pop()], dim=1)
            h = self._run(blocks, h, temb)
        return self.conv_out(F.silu(self.norm_out(h)))


class Diffusion:
    """The DDPM forward process, loss and ancestral sampler (linear betas)."""

    def __init__(self, timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02):
        scale = 1000.0 / timesteps   # keep the schedule's total noise when T != 1000
        self.T = timesteps
        self.betas = torch.linspace(beta_start * scale, beta_end * scale, timesteps,
                                    dtype=torch.float64)
        self.alphas_cumprod = torch.cumprod(1.0 - self.betas, dim=0)

    def q_sample(self, x0, t, noise):
        """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise."""
        ab = self.alphas_cumprod.to(torch.float32)[t.cpu()].to(x0.device, x0.dtype)
        ab = ab[:, None, None, None]
        return ab.sqrt() * x0 + (1 - ab).sqrt() * noise

    def training_batch(self, x0, gen: torch.Generator):
        """(x_t, t, noise) for clean images x0 (CPU), drawn from `gen`."""
        t = torch.randint(0, self.T, (x0.shape[0],), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        return self.q_sample(x0, t, noise), t, noise

    def loss(self, pred_noise, noise):
        return F.mse_loss(pred_noise.float(), noise.float())

    def schedule(self, steps: int | None = None):
        """(timesteps, betas) of the sampler, respaced to `steps` evenly spaced timesteps."""
        if steps is None or steps >= self.T:
            ts = list(range(self.T))
        else:
            ts = sorted({round(i * (self.T - 1) / (steps - 1)) for i in range(steps)})
        ab = self.alphas_cumprod[ts]
        prev = torch.cat([torch.ones(1, dtype=ab.dtype), ab[:-1]])
        return ts, 1.0 - ab / prev

    @torch.no_grad()
    def sample(self, model, shape, *, steps: int | None = None, device="cpu",
               gen: torch.Generator | None = None, progress=None, clip: bool = True):
        """Ancestral sampling from N(0, I); all noise drawn on the CPU from `gen`.

        Each step predicts x0 from the noise estimate (clipped to [-1, 1] as the
        DDPM reference does) and draws x_{t-1} from the posterior q(x_{t-1} | x_t, x0).
        """
        gen = gen or torch.Generator().manual_seed(0)
        ts, betas = self.schedule(steps)
        alphas = 1.0 - betas
        ab = torch.cumprod(alphas, 0)
        ab_prev = torch.cat([torch.ones(1, dtype=ab.dtype), ab[:-1]])
        x = torch.randn(shape, generator=gen).to(device)
        noises = torch.randn((len(ts),) + tuple(shape), generator=gen)
        it = range(len(ts) - 1, -1, -1)
        for i in (progress(it) if progress else it):
            t = torch.full((shape[0],), ts[i], dtype=torch.long).to(device)
            eps = model(x, t).float()
            x0 = (x - float((1 - ab[i]).sqrt()) * eps) / float(ab[i].sqrt())
            if clip:
                x0 = x0.clamp(-1.0, 1.0)
            c0 = float(ab_prev[i].sqrt() * betas[i] / (1 - ab[i]))
            ct = float(alphas[i].sqrt() * (1 - ab_prev[i]) / (1 - ab[i]))
            x = c0 * x0 + ct * x
            if i > 0:
                sigma = float(((1 - ab_prev[i]) / (1 - ab[i]) * betas[i]).sqrt())
                x = x + sigma * noises[i].to(device)
        return x


class SyntheticShapes:
    """Images in [-1, 1]: a disc or a square of random colour, size and place on a
    random background colour."""

    def __init__(self, image_size: int, seed: int = 0):
        self.size = image_size
        self.gen = torch.Generator().manual_seed(seed)
        c = torch.arange(image_size).float() + 0.5
        self.yy, self.xx = torch.meshgrid(c, c, indexing="ij")

    def __call__(self, batch_size: int):
        g, s = self.gen, self.size
        center = torch.rand(batch_size, 2, generator=g) * s * 0.6 + s * 0.2
        radius = torch.rand(batch_size, generator=g) * s * 0.2 + s * 0.15
        square = torch.rand(batch_size, generator=g) < 0.5
        fg = torch.rand(batch_size, 3, generator=g) * 2 - 1
        bg = torch.rand(batch_size, 3, generator=g) * 2 - 1
        dy = self.yy[None] - center[:, 0, None, None]
        dx = self.xx[None] - center[:, 1, None, None]
        r = radius[:, None, None]
        disc = dx ** 2 + dy ** 2 <= r ** 2
        box = (dx.abs() <= r) & (dy.abs() <= r)
        inside = torch.where(square[:, None, None], box, disc)[:, None]    # (B, 1, H, W)
        return torch.where(inside, fg[:, :, None, None], bg[:, :, None, None])
