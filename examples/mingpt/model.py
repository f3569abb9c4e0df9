"""A minGPT-style GPT (GPT-2 architecture, Radford et al. 2019) in plain PyTorch.

Learned token and position embeddings, pre-LayerNorm blocks of causal
multi-head self-attention (one fused qkv projection) and a 4x GELU MLP (tanh
approximation), a final LayerNorm and an untied linear head. Initialisation
as GPT-2: N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 * n_layer)).

Sampling (`GPT.generate`) re-reads the (cropped) context each step, with
temperature and optional top-k, as minGPT does.

The data is the minGPT "sort" task the example generates itself: a sequence of
digits followed by the same digits sorted; the loss is only on the sorted half.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int = 3
    block_size: int = 11
    n_layer: int = 3
    n_head: int = 3
    n_embd: int = 48
    dropout: float = 0.0          # 0.1 in minGPT; 0 keeps tpu/CPU runs comparable


CONFIGS = {
    "tiny": GPTConfig(),                                           # minGPT's "gpt-nano"
    "gpt-micro": GPTConfig(n_layer=4, n_head=4, n_embd=128),
    "gpt-mini": GPTConfig(n_layer=6, n_head=6, n_embd=192),
    "gpt2": GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                      dropout=0.1),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        n = cfg.block_size
        self.register_buffer("causal", torch.tril(torch.ones(n, n, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        att = att.masked_fill(~self.causal[:t, :t], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            c_proj=nn.Linear(4 * cfg.n_embd, cfg.n_embd),
            dropout=nn.Dropout(cfg.dropout),
        ))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.dropout(m.c_proj(F.gelu(m.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.n_embd),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.register_buffer("pos", torch.arange(cfg.block_size), persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        b, t = idx.shape
        if t > self.cfg.block_size:
            raise ValueError(f"sequence of {t} tokens > block_size {self.cfg.block_size}")
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(self.pos[:t]))
        for block in tr.h:
            x = block(x)
        return self.lm_head(tr.ln_f(x))

    def configure_optimizer(self, lr=5e-4, weight_decay=0.1, betas=(0.9, 0.95)):
        """AdamW with weight decay on the matmul weights only (not biases, norms, embeddings)."""
        decay, no_decay = [], []
        for _mn, m in self.named_modules():
            for pn, p in m.named_parameters(recurse=False):
                (decay if pn == "weight" and isinstance(m, nn.Linear) else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, do_sample=False,
                 top_k: int | None = None):
        for _ in range(max_new_tokens):
            ctx = idx if idx.shape[1] <= self.cfg.block_size else idx[:, -self.cfg.block_size:]
            logits = self(ctx)[:, -1, :] / temperature
            if top_k is not None:
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            if do_sample:
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1)
            else:
                nxt = logits.argmax(-1, keepdim=True)
            idx = torch.cat((idx, nxt), dim=1)
        return idx


def sort_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=-1)


class SortTask:
    """minGPT's sort problem: `length` digits in [0, num_digits), then the same sorted.

    Inputs are the concatenation minus its last token, targets the concatenation
    shifted by one with the unsorted half masked (-1): the model is graded only
    on producing the sorted sequence.
    """

    def __init__(self, length: int = 6, num_digits: int = 3, seed: int = 0):
        self.length, self.num_digits = length, num_digits
        self.gen = torch.Generator().manual_seed(seed)

    @property
    def block_size(self):
        return 2 * self.length - 1

    def problems(self, n: int):
        return torch.randint(0, self.num_digits, (n, self.length), generator=self.gen)

    def __call__(self, batch_size: int):
        inp = self.problems(batch_size)
        sol = torch.sort(inp, dim=1).values
        cat = torch.cat([inp, sol], dim=1)
        x = cat[:, :-1].clone()
        y = cat[:, 1:].clone()
        y[:, : self.length - 1] = -1
        return x, y
