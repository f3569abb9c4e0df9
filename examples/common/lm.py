"""Training and generation entry points shared by the Llama and Qwen examples.

Both models have the same interface (``model(tokens, positions, cache,
last_only)``, ``model.new_cache``), the same module names for the tensor
parallel plan, and Hugging Face checkpoint helpers, so one driver serves
both; `examples/llama/train.py` and `examples/qwen/train.py` only name the
model family.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from . import cli, loop
from .checkpoint import load_checkpoint, save_checkpoint
from .data import ByteTokenizer, LMBatches, arithmetic_corpus
from .generation import generate


@dataclass
class LMFamily:
    name: str
    module: ModuleType              # the model module: CONFIGS, model class, HF helpers
    model_cls: type
    # Parameters applied per attention head (Qwen's QK-norm): under tensor
    # parallelism each rank sees only its heads, so their gradients are summed.
    tp_partial_params: tuple = ()

    @property
    def configs(self):
        return self.module.CONFIGS


# -- building -----------------------------------------------------------------------


def build_model(family: LMFamily, config, *, device="cpu", dtype=torch.float32, seed=0):
    """A freshly initialised model: same seed, same weights on every device."""
    cfg = family.configs[config] if isinstance(config, str) else config
    torch.manual_seed(seed)
    model = family.model_cls(cfg)
    return model.to(device=device, dtype=dtype)


def apply_tensor_parallel(model, family: LMFamily, tp_mesh) -> None:
    """Megatron-style plan: q/k/v and the SwiGLU w1/w3 split by output features
    (column parallel), wo and w2 split by input features (row parallel, one
    all-reduce each); norms and embeddings replicated."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    cfg = model.cfg
    tp = tp_mesh.size()
    if cfg.n_heads % tp or cfg.n_kv_heads % tp:
        raise ValueError(f"--tp {tp} must divide n_heads={cfg.n_heads} and "
                         f"n_kv_heads={cfg.n_kv_heads}")
    plan = {
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for layer in model.layers:
        parallelize_module(layer, tp_mesh, plan)


def _param_groups(model, ctx: cli.ParallelContext):
    """The optimizer's parameters: under tensor parallelism, the DTensor
    (sharded) parameters and the plain (replicated) ones in separate groups, so
    the multi-tensor (foreach) update never mixes the two kinds in one call,
    which DTensor rejects."""
    params = list(model.parameters())
    if ctx.tp <= 1:
        return params
    from torch.distributed.tensor import DTensor

    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": g} for g in (sharded, plain) if g]


def sync_tp_partial_grads(model, family: LMFamily, ctx: cli.ParallelContext) -> None:
    if ctx.tp <= 1 or not family.tp_partial_params:
        return
    import torch.distributed as dist

    group = ctx.mesh.get_group("tp")
    for name, p in model.named_parameters():
        if p.grad is not None and name.rsplit(".", 2)[-2] in family.tp_partial_params:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)


# -- training -----------------------------------------------------------------------


def train_parser(family: LMFamily):
    p = cli.make_parser(f"Train the {family.name} example (causal language modelling).",
                        family.configs, default_steps=20, default_batch_size=8,
                        default_lr=3e-3, distributed=True)
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: 64)")
    p.add_argument("--text-file", type=Path, default=None,
                   help="train on this local text file (UTF-8 bytes as tokens) instead of "
                        "the generated arithmetic corpus")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from a Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--resume", type=Path, default=None, help="resume from an own checkpoint file")
    p.add_argument("--save", type=Path, default=None, help="save an own checkpoint file at the end")
    p.add_argument("--save-hf", type=Path, default=None,
                   help="also save a Hugging Face format directory at the end")
    p.add_argument("--grad-clip", type=float, default=1.0,
                   help="clip the gradients' global norm to this value (default: 1.0)")
    return p


def train_main(family: LMFamily, argv=None):
    args = train_parser(family).parse_args(argv)
    device = cli.setup(args)
    ctx = cli.init_parallel(args)
    dtype = cli.DTYPES[args.dtype]
    mod = family.module
    if args.init_from is not None:
        model = mod.from_pretrained(args.init_from, device="cpu", dtype=torch.float32)
        model = model.to(device=device, dtype=dtype)
        cfg = model.cfg
    else:
        cfg = family.configs[args.config]
        if args.resume is not None:  # the checkpoint says which configuration
            ck = torch.load(args.resume, map_location="cpu", weights_only=True)
            cfg = mod.config_from_dict(ck["config"])
        model = build_model(family, cfg, device=device, dtype=dtype, seed=args.seed)
    if ctx.tp > 1:
        apply_tensor_parallel(model, family, ctx.tp_mesh)
    optimizer = torch.optim.AdamW(_param_groups(model, ctx), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    start_step = 0
    if args.resume is not None:
        start_step = load_checkpoint(args.resume, model=model, optimizer=optimizer)["step"]

    text = args.text_file.read_text() if args.text_file else arithmetic_corpus()
    tokens = ByteTokenizer().encode(text)
    if cfg.vocab_size < 256:
        raise SystemExit(f"config vocab_size {cfg.vocab_size} < 256 byte tokens")
    if args.batch_size % ctx.dp:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by --dp {ctx.dp}")
    # Every rank draws the same global batch and keeps its data-parallel shard,
    # so a dp run sees exactly the batches of the single-process run.
    batches = LMBatches(tokens, args.batch_size, args.seq_len, seed=args.seed + start_step)
    shard = args.batch_size // ctx.dp

    def batch_fn(step):
        x, y = batches()
        lo = ctx.dp_rank * shard
        return (x[lo:lo + shard].to(device),), y[lo:lo + shard].to(device)

    fwd_model = cli.maybe_compile(model, args)

    def after_backward():
        sync_tp_partial_grads(model, family, ctx)
        cli.average_gradients(model, ctx)
        if ctx.tp > 1 and args.grad_clip is not None:
            cli.clip_grad_norm_tp(model, args.grad_clip, ctx)

    stats = loop.train(
        name=f"{family.name} {args.config}", model=model, optimizer=optimizer,
        batch_fn=batch_fn, loss_fn=mod.lm_loss, steps=args.steps, device=device,
        items_per_step=args.batch_size * args.seq_len, unit="tokens",
        log_interval=args.log_interval, show_progress=not args.no_progress and ctx.is_main,
        compiled=args.compile, grad_clip=args.grad_clip if ctx.tp == 1 else None,
        after_backward=after_backward if ctx.enabled else None,
        reduce_loss=(lambda loss: cli.mean_over_dp(loss, ctx)) if ctx.dp > 1 else None,
        forward=lambda inputs: fwd_model(*inputs), verbose=ctx.is_main)
    if ctx.is_main:
        if args.save is not None:
            save_checkpoint(args.save, model=model, config=cfg, optimizer=optimizer,
                            step=start_step + args.steps)
            print(f"saved checkpoint {args.save}")
        if args.save_hf is not None:
            mod.save_pretrained(model, args.save_hf)
            print(f"saved Hugging Face checkpoint {args.save_hf}")
    return {"stats": stats, "model": model, "losses": stats.losses}


# -- generation ---------------------------------------------------------------------


def generate_parser(family: LMFamily):
    p = cli.make_parser(f"Generate text with the {family.name} example (KV-cache decoding).",
                        family.configs, default_steps=32, default_batch_size=1, training=False)
    p.add_argument("--max-new-tokens", dest="steps", type=int, help="alias of --steps")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", type=Path, default=None,
                     help="Hugging Face checkpoint directory (config.json + *.safetensors)")
    src.add_argument("--load", type=Path, default=None, help="own checkpoint file (train.py --save)")
    p.add_argument("--prompt", default="12+34=", help="text prompt")
    p.add_argument("--prompt-ids", default=None, help="comma-separated token ids (no tokenizer)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: keep the smallest set of tokens with this total "
                        "probability (default: 1.0 = all)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely tokens only (default: all)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence per token")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="stop a sequence at the end-of-sequence token")
    p.add_argument("--max-cache-len", type=int, default=None, metavar="N",
                   help="positions in the static KV cache (default: prompt + steps); with "
                        "--compile one length serves every prompt and step count that fits "
                        "with the same compiled programs")
    return p


class _HFTokenizer:
    def __init__(self, path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))

    def encode(self, text):
        return self.tok.encode(text).ids

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids])


def _tokenizer(cfg, checkpoint):
    if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").exists():
        try:
            return _HFTokenizer(Path(checkpoint) / "tokenizer.json")
        except ImportError:
            return None
    if cfg.vocab_size == 256:
        return ByteTokenizer()
    return None


def generate_main(family: LMFamily, argv=None):
    args = generate_parser(family).parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    mod = family.module
    if args.checkpoint is not None:
        model = mod.from_pretrained(args.checkpoint, device=device, dtype=dtype)
    elif args.load is not None:
        ck = torch.load(args.load, map_location="cpu", weights_only=True)
        model = build_model(family, mod.config_from_dict(ck["config"]), device="cpu")
        model.load_state_dict(ck["model"])
        model = model.to(device=device, dtype=dtype)
    else:
        model = build_model(family, args.config, device=device, dtype=dtype, seed=args.seed)
    model.eval()
    cfg = model.cfg
    tok = _tokenizer(cfg, args.checkpoint)
    if args.prompt_ids is not None:
        ids = [int(s) for s in args.prompt_ids.split(",") if s.strip()]
    elif tok is not None:
        ids = tok.encode(args.prompt)
    else:
        raise SystemExit("no tokenizer for this checkpoint (needs tokenizer.json and the "
                         "`tokenizers` package): pass --prompt-ids")
    prompt = torch.tensor([ids] * args.batch_size, dtype=torch.long).to(device)
    fwd = cli.maybe_compile(model, args)

    class _Fwd:  # generate() needs .new_cache next to the (maybe compiled) forward
        def __call__(self, *a, **k):
            return fwd(*a, **k)

        new_cache = model.new_cache

    cs0, fb0, gp0 = cli.compile_seconds(), cli.fallback_counts(), cli.graph_programs()
    timings = {}
    t0 = time.perf_counter()
    out = generate(_Fwd(), prompt, args.steps, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, eos_id=cfg.eos_id if args.stop_at_eos else None,
                   use_cache=not args.no_cache, show_progress=not args.no_progress,
                   timings=timings, max_cache_len=args.max_cache_len)
    out_cpu = out.cpu()
    elapsed = time.perf_counter() - t0
    n_new = (out_cpu.shape[1] - prompt.shape[1]) * args.batch_size
    cs1, gp1 = cli.compile_seconds(), cli.graph_programs()
    fb = {k: v - fb0.get(k, 0) for k, v in cli.fallback_counts().items() if v - fb0.get(k, 0)}
    for row in out_cpu.tolist():
        text = tok.decode(row) if tok is not None else ",".join(map(str, row))
        print(repr(text))
    # Wall seconds during the generation with a compile in flight.
    comp = (f" (compiling {cs1 - cs0:.2f} s of it)"
            if device.type == "tpu" and cs0 is not None and cs1 is not None else "")
    graphs = gp1 - gp0 if args.compile and gp0 is not None and gp1 is not None else None
    gps = f" | graph programs {graphs}" if graphs is not None else ""
    fbs = (f" | cpu fallbacks: {sum(fb.values())} calls of {len(fb)} ops ({', '.join(sorted(fb))})"
           if fb else "")
    mode = "compiled" if args.compile else "eager"
    decode = (f"{timings['decode_tokens'] / timings['decode_s']:,.1f} tokens/s decode"
              if timings.get("decode_s") else "decode n/a")
    print(f"summary: {family.name} {args.config} generate on {device} ({mode}) | "
          f"{n_new} new tokens in {elapsed:.2f} s{comp} | {decode} | prefill "
          f"{timings.get('prefill_s', 0):.2f} s, first step {timings.get('first_step_s', 0):.2f} s"
          f"{gps}{fbs}", flush=True)
    return {"tokens": out_cpu, "model": model, "elapsed": elapsed, "timings": timings,
            "graph_programs": graphs}
