"""Qwen3 (Qwen Team 2025, "Qwen3 Technical Report") dense models in plain PyTorch.

Decoder-only transformer like Llama (pre-norm RMSNorm blocks, rotary
embeddings, grouped-query attention, SwiGLU feed-forward, no biases) with
QK-norm: an RMSNorm over each query and key head (before the rotary
embedding) in every attention layer. The head size is a config value of its
own (128 for all dense Qwen3 sizes, so n_heads * head_dim need not equal the
model width), and the small models tie the input and output embeddings.

`from_pretrained(dir)` loads a Hugging Face `Qwen3ForCausalLM` safetensors
checkpoint from a local directory through the key map `HF_KEYS`.
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
class Qwen3Config:
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32                  # independent of dim / n_heads
    ffn_dim: int = 192
    norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_seq_len: int = 256
    tie_embeddings: bool = True
    init_std: float = 0.02
    bos_id: int | None = None
    eos_id: int | None = None


CONFIGS = {
    "tiny": Qwen3Config(eos_id=ord("\n")),
    "qwen3-0.6b": Qwen3Config(
        vocab_size=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
        ffn_dim=3072, norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=40960,
        tie_embeddings=True, bos_id=151643, eos_id=151645),
    "qwen3-1.7b": Qwen3Config(
        vocab_size=151936, dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
        ffn_dim=6144, norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=40960,
        tie_embeddings=True, bos_id=151643, eos_id=151645),
    "qwen3-8b": Qwen3Config(
        vocab_size=151936, dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
        ffn_dim=12288, norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=40960,
        tie_embeddings=False, bos_id=151643, eos_id=151645),
}


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        hd = cfg.head_dim
        self.head_dim = hd
        self.scale = 1.0 / math.sqrt(hd)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps)   # QK-norm, per head
        self.k_norm = RMSNorm(hd, cfg.norm_eps)

    def forward(self, x, cos, sin, mask, cache=None, layer=0, positions=None):
        b, t, _ = x.shape
        q = self.q_norm(self.wq(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.wk(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer, positions, k, v)
        o = attention(q, k, v, mask, self.scale)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate x) * up x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)   # gate
        self.w2 = nn.Linear(hidden, dim, bias=False)   # down
        self.w3 = nn.Linear(dim, hidden, bias=False)   # up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = MLP(cfg.dim, cfg.ffn_dim)

    def forward(self, x, cos, sin, mask, cache=None, layer=0, positions=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, cache, layer, positions)
        return h + self.feed_forward(self.ffn_norm(h))


class Qwen3(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
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
        """Logits (B, T, V) for tokens (B, T) at `positions` (default 0..T-1); see Llama.forward."""
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
        n_kv = w.shape[0] // self.cfg.head_dim
        return KVCache(self.cfg.n_layers, batch_size, n_kv, max_len, self.cfg.head_dim,
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
    ("model.layers.{i}.self_attn.q_norm.weight", "layers.{i}.attention.q_norm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "layers.{i}.attention.k_norm.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.feed_forward.w1.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.feed_forward.w2.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.feed_forward.w3.weight"),
], ignore_hf=[r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"])


def config_from_hf(hf: dict) -> Qwen3Config:
    if hf.get("model_type", "qwen3") != "qwen3":
        raise ValueError(f"not a Qwen3 config (model_type={hf.get('model_type')!r})")
    if hf.get("attention_bias"):
        raise NotImplementedError("Qwen3 checkpoints with attention_bias=True")
    if hf.get("rope_scaling"):
        raise NotImplementedError(f"rope_scaling {hf['rope_scaling']} (YaRN) is not implemented")
    theta = hf.get("rope_theta")
    if theta is None and isinstance(hf.get("rope_parameters"), dict):
        theta = hf["rope_parameters"].get("rope_theta")
    n_heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    return Qwen3Config(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads", n_heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        ffn_dim=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta if theta is not None else 10000.0),
        max_seq_len=hf.get("max_position_embeddings", 40960),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=hf.get("initializer_range", 0.02), bos_id=hf.get("bos_token_id"),
        eos_id=eos[0] if isinstance(eos, list) else eos)


def config_to_hf(cfg: Qwen3Config, dtype=torch.float32) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
        "initializer_range": cfg.init_std, "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id, "torch_dtype": str(dtype).replace("torch.", ""),
    }


def load_hf_state_dict(model: Qwen3, hf_state: dict, *, strict: bool = True) -> None:
    """Copy a Hugging Face Qwen3 state dict into `model`."""
    sd, unknown = HF_KEYS.to_native(hf_state)
    if unknown and strict:
        raise KeyError(f"keys not in the Qwen3 key map: {unknown[:8]}")
    if model.cfg.tie_embeddings:
        sd.pop("output.weight", None)
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


def from_pretrained(path, *, device="cpu", dtype=None) -> Qwen3:
    """A Qwen3 from a local Hugging Face directory (config.json + *.safetensors)."""
    path = Path(path)
    cfg = config_from_hf(json.loads((path / "config.json").read_text()))
    hf_state = safetensors_io.load_dir(path)
    with torch.device("meta"):
        model = Qwen3(cfg)
    load_hf_state_dict(model, hf_state)
    dtype = dtype or next(iter(hf_state.values())).dtype
    model.to(device=device, dtype=dtype)
    return model


def save_pretrained(model: Qwen3, path, *, max_shard_bytes: int | None = None) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = dict(model.state_dict())
    if model.cfg.tie_embeddings:
        sd.pop("output.weight", None)
    hf, unknown = HF_KEYS.to_hf(sd)
    assert not unknown, unknown
    dtype = next(model.parameters()).dtype
    (path / "config.json").write_text(json.dumps(config_to_hf(model.cfg, dtype), indent=2))
    safetensors_io.save_dir(hf, path, max_shard_bytes=max_shard_bytes)


def config_from_dict(d: dict) -> Qwen3Config:
    names = {f.name for f in dataclasses.fields(Qwen3Config)}
    return Qwen3Config(**{k: v for k, v in d.items() if k in names})
