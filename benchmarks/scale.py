"""Real-size models on `tpu`: generation, a training step and loading, against pure JAX and torch CPU.

Models are made on the meta device with random bfloat16 weights (no
download): a Llama-3.2-1B shape (16 layers, hidden 2048, intermediate 8192,
32 heads, 8 kv heads, vocab 128256, llama3 RoPE, tied embeddings), a
Qwen3-1.7B shape (28 layers, hidden 2048, intermediate 6144, 16 heads, 8 kv
heads, head_dim 128, q/k norms, vocab 151936), or any transformers config
(`--config file.json` or a JSON string with a "model_type"). `--small`
shrinks the chosen shape (2 layers, hidden 256, vocab 4096) for a quick check.

Every path runs in its own subprocess, so each peak host RSS is its own
(read as VmHWM from /proc/self/status, reset after the model is built: "run
peak" is the measured phase, "process peak" includes building the model).
`tpu` bytes are `tpu_module().memory_allocated` after the load and
`max_memory_allocated` after the run (on XLA:CPU a sampled peak of live
arrays: device memory is host memory there, so the RSS peak is the true one).
For generation, "peak above runtime / (weights + cache)" is issue 34's memory
bound (<= 1.25): the peak RSS less the RSS of the started runtime (torch,
JAX and transformers imported, one op run, before the model is built), over
the weights' and the static KV cache's bytes; "run" includes the warm-up
call (compiling), "timed" only the timed calls.

Generation paths (greedy, `generate(cache_implementation="static")`, the
prompt's time, then `--tokens` new tokens, each read on the host):

  cpu       torch on the CPU (eager, `disable_compile=True`)
  eager     `tpu` strict eager
  fused     `tpu` eager inside `torch_tpu.fused()`
  compiled  `tpu`, `model.forward = torch.compile(model.forward, backend="tpu")`
  jax       the limit: the same decode written in pure JAX from the model's
            math (RMSNorm, RoPE, GQA attention, SwiGLU MLP), the same weights
            converted to jax arrays, one `jax.jit` for the prompt and one for
            a decoding step, the KV cache donated to both

TTFT is the time from the call to the first new token on the host; prefill
tokens/s is prompt length / TTFT; decode tokens/s counts the tokens after the
first one; "compile s" is the first call's time less the median call's.

Training paths (a 0.5B-class Qwen2 shape: 24 layers, hidden 896, vocab
151936; AdamW, bfloat16 weights and state; batch 1 x `--train-seq`):
train-cpu, train-eager, train-fused, train-compiled (`torch_tpu.compile_step`).

Loading paths (from a checkpoint written once by `save_pretrained`, random
weights, to a temporary directory): load-to (`from_pretrained` on the CPU,
then `.to("tpu")`), load-assign (meta -> `to_empty(device="tpu")` ->
`load_state_dict(sd, assign=True)` with `sd` read tensor by tensor from the
safetensors file onto `tpu`), load-pretrained (`from_pretrained(dir,
device_map="tpu")`: transformers needs `accelerate` for any device_map).
"copies" is the peak RSS above the process's RSS before loading, over the
weights' bytes.

    python benchmarks/scale.py [--model llama-1b|qwen3-1.7b] [--config C] [--small]
        [--paths cpu,eager,fused,compiled,jax,train-cpu,...] [--prompt 128]
        [--tokens 16] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

GEN_PATHS = ("cpu", "eager", "fused", "compiled", "jax")
TRAIN_PATHS = ("train-cpu", "train-eager", "train-fused", "train-compiled")
LOAD_PATHS = ("load-to", "load-assign", "load-pretrained")
DEFAULT_PATHS = ("cpu", "eager", "fused", "compiled", "jax", "train-cpu", "train-eager",
                 "train-compiled", "load-to", "load-assign", "load-pretrained")

PRESETS: dict = {
    "llama-1b": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}),
    "qwen3-1.7b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "qwen2-0.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}
SMALL = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64)
TRAIN_MODEL = "qwen2-0.5b"
GB = 1e9


# -- host memory ------------------------------------------------------------------


def _status_kb(field):
    m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(m.group(1)) * 1024 if m else 0


def rss():
    """Resident bytes now."""
    return _status_kb("VmRSS")


def peak_rss():
    """The resident high-water mark since the last `reset_peak_rss`."""
    return _status_kb("VmHWM")


class RssSampler:
    """Samples anonymous and file-backed resident bytes on a thread (every
    `every` s) and keeps each one's largest value: VmHWM does not split the
    peak into memory the process allocated and pages of files it mapped
    (safetensors' mmap), which the kernel can drop."""

    def __init__(self, every=0.02):
        import threading

        self.every, self.anon, self.file = every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.anon = max(self.anon, _status_kb("RssAnon"))
            self.file = max(self.file, _status_kb("RssFile"))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def _minflt():
    """Minor page faults of this process so far (fresh pages it touched)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


_EARLIER_PEAKS: list = []


def process_peak_rss():
    """The process's resident high-water mark (ru_maxrss is reset with VmHWM)."""
    return max([peak_rss(), *_EARLIER_PEAKS])


def reset_peak_rss():
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS."""
    _EARLIER_PEAKS.append(peak_rss())
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


# -- models -----------------------------------------------------------------------


def model_config(model="llama-1b", config=None, small=False, **overrides):
    """A transformers config: a preset's name, or a JSON file / string / dict."""
    import transformers

    if config is not None:
        if isinstance(config, dict):
            d = dict(config)
        elif os.path.exists(config):
            d = json.loads(Path(config).read_text())
        else:
            d = json.loads(config)
    else:
        d = dict(PRESETS[model])
    if small:
        d.update(SMALL)
        d["max_position_embeddings"] = 1024
        rope = dict(d.get("rope_parameters") or {})
        if "original_max_position_embeddings" in rope:
            rope["original_max_position_embeddings"] = 512
            d["rope_parameters"] = rope
    d.update(overrides)
    model_type = d.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **d)


def _fill_random_(p, gen, block=1 << 20):
    """Normal(0, 0.02) values: a tensor up to `block` elements is drawn whole;
    a larger one repeats one drawn block of odd length (rows differ, and a
    1B-parameter model fills in seconds instead of a quarter minute)."""
    n = p.numel()
    if n <= block:
        p.normal_(0.0, 0.02, generator=gen)
        return
    import torch

    chunk = torch.empty(block + 7, dtype=p.dtype).normal_(0.0, 0.02, generator=gen)
    flat = p.view(-1)
    for off in range(0, n, chunk.numel()):
        m = min(chunk.numel(), n - off)
        flat[off:off + m].copy_(chunk[:m])


def _fresh_rotary(model):
    """Non-persistent RoPE buffers are garbage after `to_empty`: rebuild them
    from the config on the CPU, as `from_pretrained` does."""
    for name, mod in list(model.named_modules()):
        if hasattr(mod, "inv_freq") and hasattr(mod, "original_inv_freq"):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, type(mod)(mod.config))


def random_model(cfg, dtype=None, seed=0):
    """meta -> to_empty(cpu) -> random weights; norms 1, biases 0."""
    import torch
    import transformers

    dtype = dtype or torch.bfloat16
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty makes a new parameter per module: tie them again
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                _fill_random_(p, gen)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()
    _fresh_rotary(model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def kv_cache_bytes(cfg, cache_len, batch=1, itemsize=2):
    """The static KV cache's bytes: keys and values of every layer."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * kv * cache_len * hd * itemsize


def _memory_ratio(out, base, cfg, cache_len, wbytes):
    """Issue 34's memory bound: the run's peak RSS above the started runtime
    (torch, JAX, the model's code; measured before the model is built) over
    the weights plus the KV cache. Decoding's activations are a few MB."""
    cache = kv_cache_bytes(cfg, cache_len)
    held = wbytes + cache
    out["runtime_rss_gb"] = base / GB
    out["kv_cache_gb"] = cache / GB
    out["peak_over_model"] = (out["run_peak_rss_gb"] * GB - base) / held
    out["timed_peak_over_model"] = (out["timed_peak_rss_gb"] * GB - base) / held


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- the pure-JAX decode (the limit) ------------------------------------------------


def _to_jax(t):
    import jax.numpy as jnp
    import ml_dtypes
    import torch

    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return jnp.array(t.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return jnp.array(t.numpy())


def jax_params(model, free=False):
    """The model's weights as a pytree of jax arrays (copies); with `free`,
    each torch weight is dropped once converted, so the host holds about one
    copy at a time."""
    inner = model.model
    rot = inner.rotary_emb

    def take(mod, attr):
        w = getattr(mod, attr, None)
        if w is None:
            return None
        out = _to_jax(w)
        if free:
            setattr(mod, attr, None)
        return out

    tied = model.lm_head.weight is inner.embed_tokens.weight
    p = {"inv_freq": _to_jax(rot.inv_freq.float()), "scaling": float(rot.attention_scaling),
         "lm_head": None if tied else take(model.lm_head, "weight"),
         "embed": take(inner.embed_tokens, "weight"), "norm": take(inner.norm, "weight"),
         "layers": []}
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        d = {"ln1": take(layer.input_layernorm, "weight"),
             "ln2": take(layer.post_attention_layernorm, "weight")}
        for k in ("q", "k", "v", "o"):
            proj = getattr(a, f"{k}_proj")
            d[k], d[k + "b"] = take(proj, "weight"), take(proj, "bias")
        d["qn"] = take(a.q_norm, "weight") if hasattr(a, "q_norm") else None
        d["kn"] = take(a.k_norm, "weight") if hasattr(a, "k_norm") else None
        for k in ("gate", "up", "down"):
            d[k] = take(getattr(m, f"{k}_proj"), "weight")
        p["layers"].append(d)
    return p


def jax_decoder(cfg):
    """(prefill, step, new_cache) for `cfg`'s decoder in pure JAX, written from
    the model's math as transformers computes it in the weights' dtype.

    prefill(params, cache, ids[B, P]) and step(params, cache, tok[B, 1], pos)
    return (next token [B], last logits [B, V], cache); both are `jax.jit`
    with the cache donated (updated in place)."""
    import jax
    import jax.numpy as jnp

    eps = cfg.rms_norm_eps
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh

    def rms(x, w):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
        return w * xf.astype(x.dtype)

    # The limit uses the bfloat16 dot forms XLA:CPU computes fastest on this
    # host, as torch_tpu's lowering does (ops/linalg._against_stored): on an
    # AMX-BF16 host, a dot reading W as stored (XNNPACK multiplies bfloat16),
    # one row as two where W is wider than tall (a taller W: XLA's fused loop).
    from torch_tpu.runtime.xla_flags import cpu_native_bf16_dots

    native = jax.default_backend() == "cpu" and cpu_native_bf16_dots()

    def linear(x, w, b=None):
        if not (native and x.dtype == jnp.bfloat16):
            y = jnp.einsum("...i,oi->...o", x, w)
        else:
            x2 = x.reshape(-1, x.shape[-1])
            one = x2.shape[0] == 1
            if one and w.shape[0] > w.shape[1]:
                y2 = jnp.matmul(x2, w.T, preferred_element_type=jnp.float32)
            else:
                xp = jnp.concatenate([x2, jnp.zeros_like(x2)]) if one else x2
                y2 = jax.lax.dot_general(xp, w, (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)[: x2.shape[0]]
            y = y2.astype(x.dtype).reshape(*x.shape[:-1], w.shape[0])
        return y if b is None else y + b

    def rope(x, cos, sin):  # x [B, H, T, hd]; cos/sin [B, 1, T, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin

    def attend(q, k, v, mask):  # q [B, nh, T, hd], k/v [B, nkv, S, hd], mask [T, S]
        b, _, t, _ = q.shape
        qg = q.reshape(b, nkv, nh // nkv, t, hd)
        s = jnp.einsum("bkgtd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
        s = jnp.where(mask, s * hd ** -0.5, -jnp.inf)
        pr = jax.nn.softmax(s, axis=-1).astype(q.dtype)
        o = jnp.einsum("bkgts,bksd->bkgtd", pr, v)
        return o.reshape(b, nh, t, hd).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)

    def forward(params, cache, ids, pos, mask):
        """ids [B, T] at positions pos..pos+T-1; keys/values written into the
        cache there; mask [T, S] over the keys attended to."""
        x = params["embed"][ids]
        b, t = ids.shape
        positions = pos + jnp.arange(t)
        freqs = positions[:, None].astype(jnp.float32) * params["inv_freq"][None, :]
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        cos = (jnp.cos(emb) * params["scaling"]).astype(x.dtype)[None, None]
        sin = (jnp.sin(emb) * params["scaling"]).astype(x.dtype)[None, None]
        new_cache = []
        for lp, (kc, vc) in zip(params["layers"], cache):
            h = rms(x, lp["ln1"])
            q = linear(h, lp["q"], lp["qb"]).reshape(b, t, nh, hd)
            k = linear(h, lp["k"], lp["kb"]).reshape(b, t, nkv, hd)
            v = linear(h, lp["v"], lp["vb"]).reshape(b, t, nkv, hd)
            if lp["qn"] is not None:
                q, k = rms(q, lp["qn"]), rms(k, lp["kn"])
            q, k, v = (z.transpose(0, 2, 1, 3) for z in (q, k, v))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc = jax.lax.dynamic_update_slice(kc, k.astype(kc.dtype), (0, 0, pos, 0))
            vc = jax.lax.dynamic_update_slice(vc, v.astype(vc.dtype), (0, 0, pos, 0))
            new_cache.append((kc, vc))
            x = x + linear(attend(q, kc[:, :, : mask.shape[1]], vc[:, :, : mask.shape[1]], mask),
                           lp["o"], lp["ob"] if "ob" in lp else None)
            h = rms(x, lp["ln2"])
            x = x + linear(jax.nn.silu(linear(h, lp["gate"])) * linear(h, lp["up"]), lp["down"])
        x = rms(x[:, -1], params["norm"])
        head = params["lm_head"] if params["lm_head"] is not None else params["embed"]
        logits = linear(x, head)
        return jnp.argmax(logits, axis=-1), logits, new_cache

    def prefill(params, cache, ids):
        t = ids.shape[1]
        mask = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        return forward(params, cache, ids, 0, mask)

    def step(params, cache, tok, pos):
        size = cache[0][0].shape[2]
        mask = (jnp.arange(size) <= pos)[None, :]
        return forward(params, cache, tok, pos, mask)

    def new_cache(batch, size, dtype):
        shape = (batch, nkv, size, hd)
        return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
                for _ in range(cfg.num_hidden_layers)]

    return (jax.jit(prefill, donate_argnums=(1,)), jax.jit(step, donate_argnums=(1,)),
            new_cache)


def check_jax(cfg=None, prompt=12, seed=0):
    """Max |logits| difference of the JAX decoder against the torch model
    (float32, a small config): the prompt less one token through prefill,
    then one decoding step, against the torch forward of the whole prompt."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    cfg = cfg or model_config(small=True)
    model = random_model(cfg, dtype=torch.float32, seed=seed)
    with torch.no_grad():
        for p in model.parameters():  # norms away from 1, so their weights count
            if p.dim() == 1:
                p.add_(torch.rand(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    ids = torch.randint(0, cfg.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits[0].float().numpy()
    prefill, step, new_cache = jax_decoder(cfg)
    params = jax_params(model)
    cache = new_cache(1, prompt + 4, jnp.float32)
    _, l1, cache = prefill(params, cache, jnp.asarray(ids[:, :-1].numpy()))
    _, l2, cache = step(params, cache, jnp.asarray(ids[:, -1:].numpy()), prompt - 1)
    d1 = float(np.abs(np.asarray(l1[0]) - ref[-2]).max())
    d2 = float(np.abs(np.asarray(l2[0]) - ref[-1]).max())
    return max(d1, d2), float(np.abs(ref).max())


# -- the paths (each in its own process) ---------------------------------------------


def _programs():
    import torch_tpu.compile
    from torch_tpu.runtime import executor

    s = torch_tpu.compile.cache_stats()
    graphs = s["lowered"] + s["disk_loads"]
    return {"graphs": graphs, "eager_ops": executor.STATS.misses - graphs,
            "graph_runs": s["runs"], "donating_calls": s["donating_calls"],
            "eager_fallbacks": s["eager_fallbacks"]}


def tpu_module():
    """`torch.tpu` (registered by torch_tpu; no stubs know it)."""
    import torch

    return torch.tpu  # type: ignore[attr-defined]


def _tpu_bytes(peak=False):
    if peak:
        return tpu_module().max_memory_allocated()
    return tpu_module().memory_allocated()


def _summarize_calls(calls, prompt):
    """calls: [(t_start, emission times)], the first one the warm-up."""
    def one(t0, t):
        ttft = t[1] - t0
        return {"total": t[-1] - t0, "ttft": ttft, "prefill_tps": prompt / ttft,
                "decode_tps": (len(t) - 2) / (t[-1] - t[1])}

    first, timed = one(*calls[0]), [one(*c) for c in calls[1:]]
    med = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
    return {"ttft_s": med["ttft"], "prefill_tps": med["prefill_tps"],
            "decode_tps": med["decode_tps"], "call_s": med["total"], "first_call_s": first["total"],
            "compile_s": max(0.0, first["total"] - med["total"]),
            "ttft_first_s": first["ttft"]}


def run_generate(path, cfg, prompt, tokens, repeats, cache_len):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from generate import _Clock  # a streamer: the time of each emission

    tpu = path != "cpu"
    if tpu:
        import torch_tpu

        (torch.ones(2, device="tpu") + 1).cpu()  # the runtime started before the baseline
    import transformers  # noqa: F401  (the model's code too)

    base = rss()
    model = random_model(cfg)
    wbytes = weight_bytes(model)
    if tpu:
        model = model.to("tpu")
    out: dict = {"weights_gb": wbytes / GB, "load_rss_gb": (peak_rss() - base) / GB}
    if tpu:
        out["tpu_after_load_gb"] = _tpu_bytes() / GB
        tpu_module().reset_peak_memory_stats()
    device = "tpu" if tpu else "cpu"
    if path == "compiled":
        model.forward = torch.compile(model.forward, backend="tpu")
    ids = torch.randint(0, cfg.vocab_size, (1, prompt),
                        generator=torch.Generator().manual_seed(3)).to(device)
    kw = dict(max_new_tokens=tokens, do_sample=False, cache_implementation="static",
              max_cache_len=cache_len, disable_compile=True)
    reset_peak_rss()
    run_base = rss()
    calls, programs = [], []
    for _ in range(repeats + 1):
        clock = _Clock()
        with torch.no_grad(), (torch_tpu.fused() if path == "fused" else _nullcontext()):
            t0 = time.perf_counter()
            seq = model.generate(ids, streamer=clock, **kw)
        calls.append((t0, clock.times))
        if tpu:
            programs.append(_programs())
        if len(calls) == 1:  # the warm-up: its peak includes compiling
            out["warmup_peak_rss_gb"] = peak_rss() / GB
            reset_peak_rss()
            faults = _minflt()
    out.update(_summarize_calls(calls, prompt))
    out["minor_faults_per_call"] = (_minflt() - faults) / repeats
    out["run_peak_rss_gb"] = max(peak_rss() / GB, out["warmup_peak_rss_gb"])
    out["timed_peak_rss_gb"] = peak_rss() / GB
    out["run_rss_rise_gb"] = (peak_rss() - run_base) / GB
    _memory_ratio(out, base, cfg, cache_len, wbytes)
    out["tokens"] = seq[0, prompt:].tolist()
    if tpu:
        out["tpu_peak_gb"] = _tpu_bytes(peak=True) / GB
        out["programs_first"] = programs[0]
        out["programs_timed"] = {k: programs[-1][k] - programs[0][k] for k in programs[0]}
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_jax(cfg, prompt, tokens, repeats, cache_len):
    # XLA:CPU's options as torch_tpu sets them (TORCH_TPU_CPU_XLA_DEFAULTS):
    # the limit compiles with the same flags as the paths it bounds
    from torch_tpu.runtime.xla_flags import add_cpu_defaults

    add_cpu_defaults()
    import jax
    import jax.numpy as jnp
    import torch
    import transformers  # noqa: F401  (as the other paths: imported before the baseline)

    (jnp.ones(2) + 1).block_until_ready()  # the runtime started before the baseline
    base = rss()
    model = random_model(cfg)
    wbytes = weight_bytes(model)
    params = jax_params(model, free=True)
    del model
    prefill, step, new_cache = jax_decoder(cfg)
    ids = jnp.asarray(torch.randint(0, cfg.vocab_size, (1, prompt),
                                    generator=torch.Generator().manual_seed(3)).numpy())
    out: dict = {"weights_gb": wbytes / GB, "load_rss_gb": (peak_rss() - base) / GB}
    reset_peak_rss()
    run_base = rss()
    cache = new_cache(1, cache_len, jnp.bfloat16)
    calls, peak_dev, warm_peak = [], 0, 0
    for _ in range(repeats + 1):
        toks, times = [], []
        cache = [(jnp.zeros_like(k), jnp.zeros_like(v)) for k, v in cache]  # the cache generate() makes
        t0 = time.perf_counter()
        tok, _, cache = prefill(params, cache, ids)
        for i in range(tokens):
            toks.append(int(tok[0]))  # the host reads each token, as generate() does
            times.append(time.perf_counter())
            if i == tokens - 1:
                break
            tok, _, cache = step(params, cache, tok[:, None], prompt + i)
        peak_dev = max(peak_dev, sum(a.nbytes for a in jax.live_arrays()))
        calls.append((t0, [t0, *times]))
        if len(calls) == 1:  # the warm-up: its peak includes compiling
            warm_peak = peak_rss()
            reset_peak_rss()
            faults = _minflt()
    out.update(_summarize_calls(calls, prompt))
    out["minor_faults_per_call"] = (_minflt() - faults) / repeats
    out["run_peak_rss_gb"] = max(peak_rss(), warm_peak) / GB
    out["timed_peak_rss_gb"] = peak_rss() / GB
    out["run_rss_rise_gb"] = (max(peak_rss(), warm_peak) - run_base) / GB
    _memory_ratio(out, base, cfg, cache_len, wbytes)
    out["tpu_after_load_gb"] = sum(a.nbytes for a in jax.tree_util.tree_leaves(params)
                                   if hasattr(a, "nbytes")) / GB
    out["tpu_peak_gb"] = peak_dev / GB
    out["tokens"] = toks
    return out


def run_train(path, cfg, seq, repeats):
    import torch

    tpu = path != "train-cpu"
    if tpu:
        import torch_tpu
    base = rss()
    model = random_model(cfg)
    wbytes = weight_bytes(model)
    device = "tpu" if tpu else "cpu"
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (1, seq),
                        generator=torch.Generator().manual_seed(4)).to(device)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    fn = torch_tpu.compile_step(step, modules=model, optimizers=opt) \
        if path == "train-compiled" else step
    out: dict = {"weights_gb": wbytes / GB, "load_rss_gb": (peak_rss() - base) / GB}
    if tpu:
        out["tpu_after_load_gb"] = _tpu_bytes() / GB
        tpu_module().reset_peak_memory_stats()
    reset_peak_rss()
    run_base = rss()
    times, losses = [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        with (torch_tpu.fused() if path == "train-fused" else _nullcontext()):
            loss = fn()
        losses.append(float(loss))  # read on the host: the step is done
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[1:])
    out.update({"step_s": med, "first_step_s": times[0], "compile_s": max(0.0, times[0] - med),
                "tokens_per_s": seq / med, "losses": losses,
                "run_peak_rss_gb": peak_rss() / GB, "run_rss_rise_gb": (peak_rss() - run_base) / GB})
    if tpu:
        out["tpu_peak_gb"] = _tpu_bytes(peak=True) / GB
    return out


def save_checkpoint(cfg, directory):
    model = random_model(cfg)
    model.save_pretrained(directory)
    return {"weights_gb": weight_bytes(model) / GB}


def run_load(path, cfg, directory):
    import glob

    import torch
    import torch_tpu  # noqa: F401
    import transformers

    cls = transformers.AutoModelForCausalLM
    # Start the runtime and import the model's code before the baseline, so
    # the rise is the weights' (and the loader's) alone.
    (torch.ones(2, device="tpu") + 1).cpu()
    with torch.device("meta"):
        cls.from_config(cfg)
    base, base_anon = rss(), _status_kb("RssAnon")
    reset_peak_rss()
    sampler = RssSampler().__enter__()
    t0 = time.perf_counter()
    if path == "load-to":
        model = cls.from_pretrained(directory, dtype=torch.bfloat16)
        torch.nn.Module.to(model, "tpu")  # in place, as model.to("tpu")
    elif path == "load-assign":
        from safetensors import safe_open

        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.to_empty(device="tpu")
        after_empty = tpu_module().memory_allocated()
        sd = {}
        for f in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
            with safe_open(f, framework="pt") as fh:
                for k in fh.keys():
                    sd[k] = fh.get_tensor(k).to("tpu")
        model.load_state_dict(sd, assign=True, strict=False)
        del sd
        model.tie_weights()
        _fresh_rotary(model)
        model.to("tpu")
    else:
        import importlib.util

        if importlib.util.find_spec("accelerate") is None:
            return {"skipped": "transformers needs `accelerate` for any device_map "
                               "(not installed: pip install accelerate)"}
        model = cls.from_pretrained(directory, dtype=torch.bfloat16, device_map="tpu")
    tpu_module().synchronize()
    secs = time.perf_counter() - t0
    sampler.__exit__()
    wbytes = weight_bytes(model)
    # Does the loaded model compute? One short forward (not in the peak).
    out = {"load_s": secs, "weights_gb": wbytes / GB, "rss_before_gb": base / GB,
           "peak_rise_gb": (peak_rss() - base) / GB, "copies_at_peak": (peak_rss() - base) / wbytes,
           "rss_after_gb": rss() / GB, "held_after_copies": (rss() - base) / wbytes,
           "tpu_gb": tpu_module().memory_allocated() / GB,
           "tpu_copies": tpu_module().memory_allocated() / wbytes,
           "devices": sorted({str(p.device) for p in model.parameters()}),
           "tied": model.lm_head.weight is model.model.embed_tokens.weight,
           "anon_copies_at_peak": (sampler.anon - base_anon) / wbytes,
           "file_pages_peak_gb": sampler.file / GB}
    if path == "load-assign":
        out["tpu_after_to_empty_gb"] = after_empty / GB
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]], device="tpu")).logits
    out["finite"] = bool(torch.isfinite(logits.float()).all())
    return out


def worker(args):
    warnings.simplefilter("ignore")
    cfg_train = model_config(TRAIN_MODEL, small=args.small)
    cfg = model_config(args.model, args.config, args.small)
    t0 = time.perf_counter()
    path = args.worker
    if path in GEN_PATHS[:-1]:
        out = run_generate(path, cfg, args.prompt, args.tokens, args.repeats, args.cache_len)
    elif path == "jax":
        out = run_jax(cfg, args.prompt, args.tokens, args.repeats, args.cache_len)
    elif path in TRAIN_PATHS:
        out = run_train(path, cfg_train, args.train_seq, args.repeats)
    elif path == "save":
        out = save_checkpoint(cfg, args.ckpt)
    elif path in LOAD_PATHS:
        out = run_load(path, cfg, args.ckpt)
    else:
        raise SystemExit(f"unknown path {path!r}")
    if "torch_tpu" in sys.modules:
        out["torch_tpu"] = os.path.dirname(os.path.dirname(sys.modules["torch_tpu"].__file__ or ""))
    out["process_peak_rss_gb"] = process_peak_rss() / GB
    out["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(out))


# -- the driver ---------------------------------------------------------------------


def _spawn(path, args, ckpt, tmp):
    out = os.path.join(tmp, f"{path}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--out", out,
           "--model", args.model, "--prompt", str(args.prompt), "--tokens", str(args.tokens),
           "--repeats", str(args.repeats), "--cache-len", str(args.cache_len),
           "--train-seq", str(args.train_seq), "--ckpt", ckpt]
    if args.config:
        cmd += ["--config", args.config]
    if args.small:
        cmd.append("--small")
    t0 = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {path} ...", file=sys.stderr, flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    if r.returncode < 0:
        return {"error": f"killed by signal {-r.returncode} (9: the OOM killer, say)"}
    if r.returncode != 0 or not os.path.exists(out):
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {r.returncode}: " + " | ".join(tail)}
    res = json.loads(Path(out).read_text())
    print(f"    {path}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return res


def _f(v, fmt=".2f"):
    return "-" if v is None else format(v, fmt)


def _rows(res, paths, row):
    """One table row per path; a failed or skipped path says why."""
    out = []
    for p in paths:
        r = res[p]
        why = r.get("error") or r.get("skipped")
        out.append(f"| {p} | {why} |" if why else row(p, r))
    return out + [""]


def _gen_row(jax_tps, cpu_tps):
    def row(p, r):
        pt = r.get("programs_timed")
        timed = "-" if pt is None else (f"{pt['graphs']} + {pt['eager_ops']}, "
                                        f"{pt['graph_runs']} ({pt['donating_calls']})")
        return (f"| {p} | {_f(r['ttft_s'])} | {_f(r['prefill_tps'], '.1f')} "
                f"| {_f(r['decode_tps'])} "
                f"| {_f(r['decode_tps'] / jax_tps if jax_tps else None)}x "
                f"| {_f(r['decode_tps'] / cpu_tps if cpu_tps else None)}x "
                f"| {_f(r['first_call_s'], '.1f')} | {_f(r['compile_s'], '.1f')} "
                f"| {_f(r['run_peak_rss_gb'], '.1f')} / {_f(r['process_peak_rss_gb'], '.1f')} "
                f"| {_f(r.get('peak_over_model'))} / {_f(r.get('timed_peak_over_model'))} "
                f"| {_f(r.get('tpu_after_load_gb'))} / {_f(r.get('tpu_peak_gb'))} | {timed} |")
    return row


def _train_row(cpu_s):
    def row(p, r):
        return (f"| {p} | {_f(r['step_s'])} | {_f(r['tokens_per_s'], '.1f')} "
                f"| {_f(cpu_s / r['step_s'] if cpu_s else None)}x "
                f"| {_f(r['first_step_s'], '.1f')} | {_f(r['compile_s'], '.1f')} "
                f"| {_f(r['run_peak_rss_gb'], '.1f')} / {_f(r['process_peak_rss_gb'], '.1f')} "
                f"| {_f(r.get('tpu_after_load_gb'))} / {_f(r.get('tpu_peak_gb'))} |")
    return row


def _load_row(p, r):
    return (f"| {p} | {_f(r['load_s'], '.1f')} | {_f(r['weights_gb'])} "
            f"| {_f(r['peak_rise_gb'])} | {_f(r['copies_at_peak'])} "
            f"| {_f(r.get('anon_copies_at_peak'))} | {_f(r.get('file_pages_peak_gb'))} "
            f"| {_f(r['held_after_copies'])} | {_f(r['tpu_gb'])} ({_f(r['tpu_copies'])}) |")


def table(res, header):
    """The results as markdown tables (generation, training, loading)."""
    lines = [header, ""]
    gen = [p for p in GEN_PATHS if p in res]
    if gen:
        lines += ["| path | TTFT s | prefill tok/s | decode tok/s | decode vs JAX | decode vs CPU "
                  "| first call s | compile s | peak RSS GB (run / process) "
                  "| peak above runtime / (weights + cache) (run / timed calls) "
                  "| tpu GB (load / peak) "
                  "| timed calls: programs made (graphs + ops), graph runs (donating) |",
                  "|" + "---|" * 12]
        lines += _rows(res, gen, _gen_row(res.get("jax", {}).get("decode_tps"),
                                          res.get("cpu", {}).get("decode_tps")))
    train = [p for p in TRAIN_PATHS if p in res]
    if train:
        lines += ["| training path | step s | tokens/s | vs CPU | first step s | compile s "
                  "| peak RSS GB (run / process) | tpu GB (load / peak) |", "|" + "---|" * 8]
        lines += _rows(res, train, _train_row(res.get("train-cpu", {}).get("step_s")))
    load = [p for p in LOAD_PATHS if p in res]
    if load:
        lines += ["| loading path | s | weights GB | peak RSS rise GB | copies at peak "
                  "| of it allocated (copies) | mapped file pages GB | held after (copies) "
                  "| tpu GB (copies) |", "|" + "---|" * 9]
        lines += _rows(res, load, _load_row)
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-1b", choices=[k for k in PRESETS if k != TRAIN_MODEL])
    p.add_argument("--config", default=None, help="a transformers config: JSON file or string "
                                                  "(with model_type); replaces --model")
    p.add_argument("--small", action="store_true", help="2 layers, hidden 256: a quick check")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                   help=f"comma-separated, of {', '.join(GEN_PATHS + TRAIN_PATHS + LOAD_PATHS)}")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=16, help="new tokens per generation")
    p.add_argument("--cache-len", type=int, default=256, help="static KV cache length")
    p.add_argument("--train-seq", type=int, default=128, help="training sequence (batch 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up (median)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per path")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return None
    paths = [x for x in args.paths.split(",") if x]
    unknown = set(paths) - set(GEN_PATHS + TRAIN_PATHS + LOAD_PATHS)
    if unknown:
        p.error(f"unknown paths: {', '.join(sorted(unknown))}")
    if args.prompt + args.tokens > args.cache_len:
        p.error("--cache-len must hold the prompt and the new tokens")
    tmp = tempfile.mkdtemp(prefix="scale_bench_")
    ckpt = os.path.join(tmp, "ckpt")
    res: dict = {}
    load = os.getloadavg()
    try:
        if any(x in LOAD_PATHS for x in paths):
            res["save"] = _spawn("save", args, ckpt, tmp)
        for path in paths:
            res[path] = _spawn(path, args, ckpt, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    end = os.getloadavg()
    name = "config " + args.config if args.config else args.model
    where = {r["torch_tpu"] for r in res.values() if "torch_tpu" in r}
    for w in sorted(where):
        rev = subprocess.run(["git", "-C", w, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", w, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        print(f"torch_tpu from {w} at {rev or '?'}{' with local changes' if dirty else ''}")
    header = (f"{name}{' (--small)' if args.small else ''}: prompt {args.prompt}, "
              f"{args.tokens} new tokens, cache {args.cache_len}, training seq {args.train_seq} "
              f"({TRAIN_MODEL}), median of {args.repeats} after a warm-up; {os.cpu_count()} cores, "
              f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start, "
              f"{end[0]:.2f} {end[1]:.2f} {end[2]:.2f} at end; {time.strftime('%Y-%m-%d')}")
    print(table(res, header))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "load_start": load, "load_end": end, "results": res}, indent=1))
    return res


if __name__ == "__main__":
    main()
