"""KV cache and token generation for the decoder-only language models (llama, qwen).

The cache is static: one (batch, kv_heads, max_len, head_dim) buffer per layer
and per K/V, written at the current positions with `index_copy_`, and
attention always reads the whole buffer under a mask `key_pos <= query_pos`.
Every decoding step therefore has the same shapes, so on `tpu` each step reuses
the executables compiled for the first one instead of compiling per length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .loop import progress


class KVCache:
    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_len: int,
                 head_dim: int, *, dtype=torch.float32, device="cpu"):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_len = max_len
        self.key_positions = torch.arange(max_len, device=device)

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, Hkv, T, D) at `positions` (T,); return the layer's whole K and V."""
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)
        return self.k[layer], self.v[layer]


def causal_mask(positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """(T, S) bool: query at `positions[i]` may attend to key j (key position <= its own)."""
    keys = cache.key_positions if cache is not None else positions
    return keys[None, :] <= positions[:, None]


def attention(q, k, v, mask, scale: float):
    """Grouped-query attention: q (B, H, T, D); k, v (B, Hkv, S, D); mask (T, S) bool.

    Each group of H/Hkv query heads shares one key/value head. Softmax in float32.
    """
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if h != hkv:
        g = h // hkv
        k = k[:, :, None].expand(b, hkv, g, s, d).reshape(b, h, s, d)
        v = v[:, :, None].expand(b, hkv, g, s, v.shape[-1]).reshape(b, h, s, v.shape[-1])
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """Rotary embedding, Hugging Face layout (the two halves of each head form the pairs).

    x (B, H, T, D); cos, sin (T, D).
    """
    return x * cos + rotate_half(x) * sin


def sample_next(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
                top_k: int | None = None) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V): greedy at temperature 0, else top-k/top-p sampling."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) > top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs, 1)
        return torch.gather(order, -1, choice).squeeze(-1)
    return torch.multinomial(probs, 1).squeeze(-1)


@torch.no_grad()
def generate(model, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int | None = None, eos_id: int | None = None,
             use_cache: bool = True, show_progress: bool = False,
             timings: dict | None = None, max_cache_len: int | None = None) -> torch.Tensor:
    """Continue `prompt` (B, T) by up to `max_new_tokens` tokens; returns (B, T + new).

    With `eos_id`, a sequence that produced it keeps producing it, and the loop
    stops once all have (one device->host read per token for the check).
    With ``use_cache=False`` every step recomputes the whole sequence (the
    reference the cached path is tested against).
    The cache holds ``max_cache_len`` positions (default: the prompt plus
    `max_new_tokens`). Its length is part of every step's shapes, so under
    `torch.compile` one fixed length serves any prompt and number of new
    tokens that fit with the same two programs (prompt, decoding step).
    With a `timings` dict, the device is synchronised after the prompt
    (prefill) and after the first decoding step, and it receives
    ``prefill_s``, ``first_step_s`` (both include compilation on a first call)
    and ``decode_s``/``decode_tokens`` for the remaining steps.
    """
    import time

    from .cli import synchronize

    t0 = time.perf_counter()
    b, t = prompt.shape
    device = prompt.device
    bar = progress(range(max_new_tokens), desc="generate", enabled=show_progress)
    if use_cache:
        need = t + max_new_tokens - 1  # the last token is sampled, never stored
        if max_cache_len is None:
            max_cache_len = t + max_new_tokens
        elif max_cache_len < need:
            raise ValueError(f"generate: max_cache_len={max_cache_len} is shorter than the "
                             f"prompt ({t}) plus max_new_tokens ({max_new_tokens}) minus 1")
        cache = model.new_cache(b, max_cache_len)
        positions = torch.arange(t, device=device)
        logits = model(prompt, positions=positions, cache=cache, last_only=True)[:, -1]
        pos = torch.full((1,), t, dtype=torch.long, device=device)
    else:
        logits = model(prompt, last_only=True)[:, -1]
    if timings is not None:
        synchronize(device)
        t1 = time.perf_counter()
        timings["prefill_s"] = t1 - t0
    seq = prompt
    new = []
    finished = None
    for i in bar:
        nxt = sample_next(logits, temperature=temperature, top_p=top_p, top_k=top_k)
        if eos_id is not None:
            if finished is not None:
                nxt = torch.where(finished, torch.full_like(nxt, eos_id), nxt)
            finished = nxt == eos_id if finished is None else finished | (nxt == eos_id)
        new.append(nxt)
        if i == max_new_tokens - 1 or (eos_id is not None and bool(finished.all())):
            break
        if use_cache:
            logits = model(nxt[:, None], positions=pos, cache=cache, last_only=True)[:, -1]
            pos = pos + 1
        else:
            seq = torch.cat([prompt, torch.stack(new, dim=1)], dim=1)
            logits = model(seq, last_only=True)[:, -1]
        if timings is not None and i == 0:
            synchronize(device)
            t2 = time.perf_counter()
            timings["first_step_s"] = t2 - t1
    if timings is not None:
        synchronize(device)
        timings["decode_s"] = time.perf_counter() - t2 if len(new) > 1 else 0.0
        timings["decode_tokens"] = max(len(new) - 1, 0) * b
    bar.close()
    if not new:
        return prompt
    return torch.cat([prompt, torch.stack(new, dim=1)], dim=1)
