"""DLRM (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization
and Recommendation Systems") in plain PyTorch.

- dense features -> bottom MLP (Linear+ReLU) -> a vector of size d;
- each categorical feature -> its own embedding table, a bag of ids summed
  (`nn.EmbeddingBag(mode="sum")`) -> a vector of size d;
- "dot" interaction: the pairwise dot products of those F = 1 + #tables
  vectors (the strictly lower triangle of the F x F Gram matrix), concatenated
  with the bottom-MLP output;
- top MLP (Linear+ReLU, last layer linear) -> one click logit, trained with
  binary cross-entropy.

Synthetic click data (`SyntheticClicks`) mimic Criteo's layout: 13 dense
features (log-transformed heavy-tailed counts), categorical ids drawn from a
power law, clicks drawn from a fixed hidden logistic model so that there is
something to learn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class DLRMConfig:
    num_dense: int = 13
    table_sizes: tuple = (1000,) * 8
    embedding_dim: int = 16
    bottom_mlp: tuple = (64, 16)         # last entry must equal embedding_dim
    top_mlp: tuple = (64, 32, 1)
    bag_size: int = 2                    # ids per categorical feature per sample (multi-hot)


CONFIGS = {
    "tiny": DLRMConfig(),
    # The DLRM paper's Criteo Kaggle setup (d=16, bottom 13-512-256-64-16, top 512-256-1)
    # with its 26 categorical features hashed to 100k rows each.
    "dlrm-kaggle": DLRMConfig(13, (100_000,) * 26, 16, (512, 256, 64, 16), (512, 256, 1), 1),
    # The Criteo Terabyte setup (d=64, bottom 13-512-256-64, top 512-512-256-1), tables
    # hashed to 1M rows each (the reference uses up to 10M).
    "dlrm-terabyte": DLRMConfig(13, (1_000_000,) * 26, 64, (512, 256, 64), (512, 512, 256, 1), 1),
}


def mlp(sizes, last_activation: bool):
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        # The reference initialisation: weights ~ N(0, sqrt(2 / (fan_in + fan_out))),
        # bias ~ N(0, sqrt(1 / fan_out)).
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (sizes[i] + sizes[i + 1])))
        nn.init.normal_(lin.bias, 0.0, math.sqrt(1.0 / sizes[i + 1]))
        layers.append(lin)
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        if cfg.bottom_mlp[-1] != cfg.embedding_dim:
            raise ValueError("the bottom MLP must end at embedding_dim")
        self.cfg = cfg
        d = cfg.embedding_dim
        self.bottom = mlp((cfg.num_dense,) + tuple(cfg.bottom_mlp), last_activation=True)
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(n, d, mode="sum") for n in cfg.table_sizes)
        for e in self.embeddings:
            bound = math.sqrt(1.0 / e.num_embeddings)
            nn.init.uniform_(e.weight, -bound, bound)
        f = 1 + len(cfg.table_sizes)
        li, lj = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp((d + f * (f - 1) // 2,) + tuple(cfg.top_mlp), last_activation=False)

    def interact(self, dense_out, sparse_out):
        """Dot interaction: (B, d) and a list of (B, d) -> (B, d + F(F-1)/2)."""
        t = torch.stack([dense_out] + sparse_out, dim=1)          # (B, F, d)
        gram = torch.bmm(t, t.transpose(1, 2))                    # (B, F, F)
        pairs = gram[:, self.li, self.lj]                         # (B, F(F-1)/2)
        return torch.cat([dense_out, pairs], dim=1)

    def forward(self, dense, sparse):
        """dense (B, num_dense) float; sparse (B, num_tables, bag_size) int64 -> logits (B,)."""
        x = self.bottom(dense)
        emb = [table(sparse[:, i]) for i, table in enumerate(self.embeddings)]
        return self.top(self.interact(x, emb)).squeeze(-1)


def bce_loss(logits, clicks):
    return nn.functional.binary_cross_entropy_with_logits(logits.float(), clicks.float())


class SyntheticClicks:
    """Criteo-shaped batches: (dense, sparse, clicks), all from a CPU generator."""

    def __init__(self, cfg: DLRMConfig, seed: int = 0, zipf: float = 1.5):
        self.cfg, self.zipf = cfg, zipf
        g = torch.Generator().manual_seed(4242)
        self.w_dense = torch.randn(cfg.num_dense, generator=g) / math.sqrt(cfg.num_dense)
        self.freq = torch.rand(len(cfg.table_sizes), generator=g) * 3 + 0.5
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, batch_size: int):
        cfg, g = self.cfg, self.gen
        counts = torch.exp(2.0 * torch.randn(batch_size, cfg.num_dense, generator=g)).floor()
        dense = torch.log1p(counts)
        sizes = torch.tensor(cfg.table_sizes, dtype=torch.float64)
        u = torch.rand(batch_size, len(cfg.table_sizes), cfg.bag_size, generator=g,
                       dtype=torch.float64)
        # Power-law ids: small ids are the popular ones.
        sparse = (sizes[None, :, None] * u.pow(self.zipf)).long()
        sparse = torch.minimum(sparse, (sizes.long() - 1)[None, :, None])
        # Hidden click model: a base rate near Criteo's ~25% CTR, dense weights and a
        # fixed "taste" of each id.
        taste = torch.sin(sparse.double() * self.freq.double()[None, :, None]).sum((1, 2)).float()
        n_ids = len(cfg.table_sizes) * cfg.bag_size
        score = -1.2 + 1.5 * (dense - 1.0) @ self.w_dense + 2.0 * taste / math.sqrt(n_ids)
        p = torch.sigmoid(score)
        clicks = (torch.rand(batch_size, generator=g) < p).float()
        return dense, sparse, clicks
