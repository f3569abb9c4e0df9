"""Train the DLRM example on synthetic click data.

    python examples/dlrm/train.py --device tpu --steps 20          # tiny: 8 tables x 1000 rows
    python examples/dlrm/train.py --config dlrm-kaggle --batch-size 128 --steps 10
    python examples/dlrm/train.py --save /tmp/dlrm.pt
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.common.checkpoint import save_checkpoint  # noqa: E402
from examples.dlrm.model import CONFIGS, DLRM, SyntheticClicks, bce_loss  # noqa: E402


def parser():
    p = cli.make_parser("Train DLRM on synthetic click data.", CONFIGS, default_steps=20,
                        default_batch_size=128, default_lr=0.2)
    p.add_argument("--save", type=pathlib.Path, default=None, help="own checkpoint file to write")
    return p


def build(config, seed=0):
    torch.manual_seed(seed)
    return DLRM(CONFIGS[config] if isinstance(config, str) else config)


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    cfg = CONFIGS[args.config]
    model = build(cfg, args.seed).to(device=device, dtype=dtype).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = SyntheticClicks(cfg, seed=args.seed)

    def batch_fn(step):
        dense, sparse, clicks = data(args.batch_size)
        return (dense.to(device=device, dtype=dtype), sparse.to(device)), clicks.to(device)

    fwd = cli.maybe_compile(model, args)
    stats = loop.train(
        name=f"dlrm {args.config}", model=model, optimizer=optimizer, batch_fn=batch_fn,
        loss_fn=bce_loss, steps=args.steps, device=device, items_per_step=args.batch_size,
        unit="samples", log_interval=args.log_interval, show_progress=not args.no_progress,
        compiled=args.compile, forward=lambda inputs: fwd(*inputs))
    if args.save is not None:
        save_checkpoint(args.save, model=model, config=cfg, optimizer=optimizer, step=args.steps)
        print(f"saved checkpoint {args.save}")
    return {"stats": stats, "model": model, "losses": stats.losses}


if __name__ == "__main__":
    main()
