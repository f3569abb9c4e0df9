"""Sort digits with a trained minGPT: greedy (or sampled) completion, accuracy and tokens/s.

    python examples/mingpt/train.py --steps 300 --save /tmp/mingpt.pt
    python examples/mingpt/sample.py --device tpu --load /tmp/mingpt.pt
    python examples/mingpt/sample.py --load /tmp/mingpt.pt --temperature 1.0 --top-k 2
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.mingpt.model import CONFIGS, GPT, GPTConfig, SortTask  # noqa: E402
from examples.mingpt.train import build  # noqa: E402


def parser():
    p = cli.make_parser("Sample sorted sequences from a minGPT.", CONFIGS, default_steps=4,
                        default_batch_size=32, training=False)
    p.add_argument("--load", type=pathlib.Path, default=None, help="own checkpoint (train.py --save)")
    p.add_argument("--length", type=int, default=6,
                   help="digits per problem (default: 6; with --load, the checkpoint's)")
    p.add_argument("--num-digits", type=int, default=3,
                   help="vocabulary: digits 0..N-1 (default: 3; with --load, the checkpoint's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely tokens only (default: all)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    if args.load is not None:
        ck = torch.load(args.load, map_location="cpu", weights_only=True)
        model = GPT(GPTConfig(**ck["config"]))
        model.load_state_dict(ck["model"])
        length = ck["extra"].get("length", args.length)
    else:
        model = build(args.config, args.seed, args.length, args.num_digits)
        length = args.length
    model = model.to(device=device, dtype=dtype).eval()
    task = SortTask(length, model.cfg.vocab_size, seed=args.seed + 10_000)
    problems = [task.problems(args.batch_size) for _ in range(args.steps)]
    outs = []

    def step(i):
        out = model.generate(problems[i].to(device), length, temperature=args.temperature or 1.0,
                             do_sample=args.temperature > 0, top_k=args.top_k)
        outs.append(out)
        return out

    _, stats = loop.timed_inference(
        name=f"mingpt {args.config} sort", fn=step, steps=args.steps, device=device,
        items_per_step=args.batch_size * length, unit="tokens",
        show_progress=not args.no_progress, compiled=False)
    got = torch.cat([o.cpu() for o in outs])
    inp = torch.cat(problems)
    ok = (got[:, length:] == torch.sort(inp, dim=1).values).all(1)
    for row, good in list(zip(got.tolist(), ok.tolist()))[:4]:
        print(f"{row[:length]} -> {row[length:]} {'ok' if good else 'WRONG'}")
    acc = ok.float().mean().item()
    print(f"sorted correctly: {int(ok.sum())}/{len(ok)} ({acc:.1%})")
    return {"stats": stats, "accuracy": acc, "outputs": got, "model": model}


if __name__ == "__main__":
    main()
