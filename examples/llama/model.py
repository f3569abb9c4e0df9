"""Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models") in plain PyTorch.

Decoder-only transformer: pre-norm blocks with RMSNorm, grouped-query
attention with rotary position embeddings (Llama 3 frequency scaling for the
3.1/3.2 models), a SwiGLU feed-forward (w2(silu(w1 x) * w3 x)), no biases,
optionally tied input/output embeddings (Llama 3.2 1B/3B).

Module names follow Meta's reference code (tok_embeddings, layers.N.attention.wq,
feed_forward.w1, ...); `HF_KEYS` maps them to the Hugging Face `transformers`
names so that `from_pretrained(dir)` loads a Hugging Face safetensors
checkpoint from a local directory. Rotary embeddings use the Hugging Face
layout (the two halves of a head are paired), which is the layout of the
Hugging Face checkpoints' q/k projections.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from examples.common import safetensors_io
from examples.common.checkpoint import KeyMap
from examples.common.generation import KVCache, apply_rope, attention, causal_mask
from examples.common.layers import RMSNorm, RotaryEmbedding


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None          # default dim // n_heads
    ffn_dim: int = 192                   # SwiGLU hidden size
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: dict | None = None     # Llama 3 scaling: factor, low/high_freq_factor, ...
    max_seq_len: int = 256
    tie_embeddings: bool = False
    init_std: float = 0.02
    bos_id: int | None = None
    eos_id: int | None = None

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.n_heads


_LLAMA3_SCALING_32 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

CONFIGS = {
    # Byte vocabulary; rope scaling active (original context 64 < max_seq_len).
    "tiny": LlamaConfig(
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        eos_id=ord("\n")),
    "llama-3.2-1b": LlamaConfig(
        vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
        ffn_dim=8192, norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_SCALING_32,
        max_seq_len=131072, tie_embeddings=True, bos_id=128000, eos_id=128001),
    "llama-3.2-3b": LlamaConfig(
        vocab_size=128256, dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128,
        ffn_dim=8192, norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_SCALING_32,
        max_seq_len=131072, tie_embeddings=True, bos_id=128000, eos_id=128001),
    "llama-3.1-8b": LlamaConfig(
        vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
        ffn_dim=14336, norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={**_LLAMA3_SCALING_32, "factor": 8.0}, max_seq_len=131072,
        tie_embeddings=False, bos_id=128000, eos_id=128001),
}


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        hd = cfg.hd
        self.head_dim = hd
        self.scale = 1.0 / math.sqrt(hd)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin, mask, cache=None, layer=0, positions=None):
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer, positions, k, v)
        o = attention(q, k, v, mask, self.scale)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_dim)

    def forward(self, x, cos, sin, mask, cache=None, layer=0, positions=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, cache, layer, positions)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.hd, cfg.rope_theta, cfg.rope_scaling)
        self.apply(self._init)
        self.tie_weights()

    def _init(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)) and m.weight.device.type != "meta":
            nn.init.normal_(m.weight, std=self.cfg.init_std)

    def tie_weights(self):
        if self.cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def _apply(self, fn, recurse=True):
        # Moving to a device whose tensors cannot share the CPU TensorImpl type (tpu,
        # like any PrivateUse1 device) gives each module a new Parameter, which would
        # silently untie the embeddings: tie them again after every conversion.
        super()._apply(fn, recurse)
        self.tie_weights()
        return self

    def forward(self, tokens, positions=None, cache: KVCache | None = None, last_only=False):
        """Logits (B, T, V) for tokens (B, T) at `positions` (default 0..T-1).

        With a `cache`, keys/values are stored at `positions` and attention sees
        every earlier cached position. `last_only` projects only the last
        position to the vocabulary (what generation needs).
        """
        b, t = tokens.shape
        if positions is None:
            positions = torch.arange(t, device=tokens.device)
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope(positions, h.dtype)
        mask = causal_mask(positions, cache)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, cache, i, positions)
        h = self.norm(h)
        if last_only:
            h = h[:, -1:]
        return self.output(h)

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        w = self.layers[0].attention.wk.weight
        n_kv = w.shape[0] // self.cfg.hd
        return KVCache(self.cfg.n_layers, batch_size, n_kv, max_len, self.cfg.hd,
                       dtype=w.dtype, device=w.device)

    def num_params(self, exclude_embeddings=False) -> int:
        seen, n = set(), 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        if exclude_embeddings:
            n -= self.tok_embeddings.weight.numel()
        return n


def lm_loss(logits, targets):
    """Next-token cross entropy; `targets` are the inputs shifted by one (-100 ignored)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=-100)


# -- Hugging Face checkpoints -------------------------------------------------------

HF_KEYS = KeyMap([
    ("model.embed_tokens.weight", "tok_embeddings.weight"),
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{i}.input_layernorm.weight", "layers.{i}.attention_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.ffn_norm.weight"),
    ("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attention.wq.weight"),
    ("model.layers.{i}.self_attn.k_proj.weight", "layers.{i}.attention.wk.weight"),
    ("model.layers.{i}.self_attn.v_proj.weight", "layers.{i}.attention.wv.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attention.wo.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.feed_forward.w1.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.feed_forward.w2.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.feed_forward.w3.weight"),
], ignore_hf=[r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"])


def config_from_hf(hf: dict) -> LlamaConfig:
    if hf.get("model_type", "llama") != "llama":
        raise ValueError(f"not a Llama config (model_type={hf.get('model_type')!r})")
    n_heads = hf["num_attention_heads"]
    scaling = hf.get("rope_scaling")
    theta = hf.get("rope_theta")
    if theta is None and isinstance(hf.get("rope_parameters"), dict):  # newer transformers
        theta = hf["rope_parameters"].get("rope_theta")
        scaling = scaling or hf["rope_parameters"]
    eos = hf.get("eos_token_id")
    return LlamaConfig(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads", n_heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        ffn_dim=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=float(theta if theta is not None else 10000.0),
        rope_scaling=dict(scaling) if scaling else None,
        max_seq_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=hf.get("initializer_range", 0.02), bos_id=hf.get("bos_token_id"),
        eos_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: LlamaConfig, dtype=torch.float32) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.hd,
        "intermediate_size": cfg.ffn_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "initializer_range": cfg.init_std, "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id, "torch_dtype": str(dtype).replace("torch.", ""),
    }


def load_hf_state_dict(model: Llama, hf_state: dict, *, strict: bool = True) -> None:
    """Copy a Hugging Face Llama state dict into `model` (tied output weight optional)."""
    sd, unknown = HF_KEYS.to_native(hf_state)
    if unknown and strict:
        raise KeyError(f"keys not in the Llama key map: {unknown[:8]}")
    if model.cfg.tie_embeddings:
        sd.pop("output.weight", None)  # tied checkpoints may or may not store lm_head
    expected = set(model.state_dict())
    if model.cfg.tie_embeddings:
        expected.discard("output.weight")
    missing, extra = expected - set(sd), set(sd) - expected
    if strict and (missing or extra):
        raise KeyError(f"checkpoint/model mismatch: missing {sorted(missing)[:8]}, "
                       f"unexpected {sorted(extra)[:8]}")
    meta = next(model.parameters()).device.type == "meta"
    model.load_state_dict(sd, strict=False, assign=meta)
    model.tie_weights()
    if meta:
        model.rope.reset_parameters()


def from_pretrained(path, *, device="cpu", dtype=None) -> Llama:
    """A Llama from a local Hugging Face directory (config.json + *.safetensors).

    The model is built on the meta device (no memory, no init), the tensors are
    memory-mapped and assigned, then moved to `device` / `dtype` (default: the
    checkpoint's dtype).
    """
    path = Path(path)
    cfg = config_from_hf(json.loads((path / "config.json").read_text()))
    hf_state = safetensors_io.load_dir(path)
    with torch.device("meta"):
        model = Llama(cfg)
    load_hf_state_dict(model, hf_state)
    dtype = dtype or next(iter(hf_state.values())).dtype
    model.to(device=device, dtype=dtype)
    return model


def save_pretrained(model: Llama, path, *, max_shard_bytes: int | None = None) -> None:
    """Write `model` as a Hugging Face checkpoint directory (config.json + safetensors)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        sd.pop("output.weight", None)
    hf, unknown = HF_KEYS.to_hf(sd)
    assert not unknown, unknown
    dtype = next(model.parameters()).dtype
    (path / "config.json").write_text(json.dumps(config_to_hf(model.cfg, dtype), indent=2))
    safetensors_io.save_dir(hf, path, max_shard_bytes=max_shard_bytes)


def config_to_dict(cfg: LlamaConfig) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(d: dict) -> LlamaConfig:
    names = {f.name for f in dataclasses.fields(LlamaConfig)}
    return LlamaConfig(**{k: v for k, v in d.items() if k in names})


__all__ = ["LlamaConfig", "CONFIGS", "Llama", "lm_loss", "from_pretrained", "save_pretrained",
           "load_hf_state_dict", "config_from_hf", "config_to_hf", "HF_KEYS"]
