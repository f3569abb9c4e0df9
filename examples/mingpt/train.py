"""Train the minGPT example from scratch on the sort task it generates.

    python examples/mingpt/train.py --device tpu --steps 200 --save /tmp/mingpt.pt
    python examples/mingpt/sample.py --device tpu --load /tmp/mingpt.pt
"""

import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.common.checkpoint import save_checkpoint  # noqa: E402
from examples.mingpt.model import CONFIGS, GPT, SortTask, sort_loss  # noqa: E402


def parser():
    p = cli.make_parser("Train a minGPT on the sort task.", CONFIGS, default_steps=20,
                        default_batch_size=64, default_lr=3e-3)
    p.add_argument("--length", type=int, default=6, help="digits per problem")
    p.add_argument("--num-digits", type=int, default=3, help="vocabulary: digits 0..N-1")
    p.add_argument("--save", type=pathlib.Path, default=None, help="own checkpoint file to write")
    return p


def task_config(config, length=6, num_digits=3):
    """The named architecture with the vocabulary and context of the sort task."""
    base = CONFIGS[config] if isinstance(config, str) else config
    return dataclasses.replace(base, vocab_size=num_digits, block_size=2 * length - 1)


def build(config, seed=0, length=6, num_digits=3):
    torch.manual_seed(seed)
    return GPT(task_config(config, length, num_digits))


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    model = build(args.config, args.seed, args.length, args.num_digits)
    cfg = model.cfg
    model = model.to(device=device, dtype=dtype).train()
    optimizer = model.configure_optimizer(lr=args.lr)
    task = SortTask(args.length, args.num_digits, seed=args.seed)

    def batch_fn(step):
        x, y = task(args.batch_size)
        return (x.to(device),), y.to(device)

    fwd = cli.maybe_compile(model, args)
    stats = loop.train(
        name=f"mingpt {args.config}", model=model, optimizer=optimizer, batch_fn=batch_fn,
        loss_fn=sort_loss, steps=args.steps, device=device,
        items_per_step=args.batch_size * task.block_size, unit="tokens",
        log_interval=args.log_interval, show_progress=not args.no_progress,
        compiled=args.compile, grad_clip=1.0, forward=lambda inputs: fwd(*inputs))
    if args.save is not None:
        save_checkpoint(args.save, model=model, config=cfg, optimizer=optimizer, step=args.steps,
                        extra={"length": args.length, "num_digits": args.num_digits})
        print(f"saved checkpoint {args.save}")
    return {"stats": stats, "model": model, "losses": stats.losses}


if __name__ == "__main__":
    main()
