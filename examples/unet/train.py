"""Train the diffusion UNet with the DDPM objective on synthetic shape images.

    python examples/unet/train.py --device tpu --steps 20 --save /tmp/unet.pt
    python examples/unet/sample.py --device tpu --load /tmp/unet.pt --steps 25
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.common.checkpoint import save_checkpoint  # noqa: E402
from examples.unet.model import CONFIGS, Diffusion, SyntheticShapes, UNet  # noqa: E402


def parser():
    p = cli.make_parser("Train a DDPM UNet on synthetic shapes.", CONFIGS, default_steps=20,
                        default_batch_size=16, default_lr=2e-3)
    p.add_argument("--save", type=pathlib.Path, default=None, help="own checkpoint file to write")
    return p


def build(config, seed=0):
    torch.manual_seed(seed)
    return UNet(CONFIGS[config] if isinstance(config, str) else config)


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    cfg = CONFIGS[args.config]
    model = build(cfg, args.seed).to(device=device, dtype=dtype).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    diffusion = Diffusion(cfg.timesteps)
    images = SyntheticShapes(cfg.image_size, seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)

    def batch_fn(step):
        xt, t, noise = diffusion.training_batch(images(args.batch_size), gen)
        return (xt.to(device=device, dtype=dtype), t.to(device)), noise.to(device)

    fwd = cli.maybe_compile(model, args)
    stats = loop.train(
        name=f"unet {args.config}", model=model, optimizer=optimizer, batch_fn=batch_fn,
        loss_fn=diffusion.loss, steps=args.steps, device=device, items_per_step=args.batch_size,
        unit="images", log_interval=args.log_interval, show_progress=not args.no_progress,
        compiled=args.compile, grad_clip=1.0, forward=lambda inputs: fwd(*inputs))
    if args.save is not None:
        save_checkpoint(args.save, model=model, config=cfg, optimizer=optimizer, step=args.steps)
        print(f"saved checkpoint {args.save}")
    return {"stats": stats, "model": model, "losses": stats.losses}


if __name__ == "__main__":
    main()
