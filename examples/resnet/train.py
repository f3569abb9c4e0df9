"""Train the ResNet example on synthetic class-conditional images.

    python examples/resnet/train.py --device tpu --steps 20           # tiny (32x32, 10 classes)
    python examples/resnet/train.py --config resnet50 --batch-size 32 --steps 10
    python examples/resnet/train.py --init-from resnet50.pth --config resnet50   # torchvision weights
    python examples/resnet/train.py --save /tmp/resnet.pt
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.common.checkpoint import save_checkpoint  # noqa: E402
from examples.resnet.model import CONFIGS, ResNet, SyntheticImages, load_pretrained  # noqa: E402


def parser():
    p = cli.make_parser("Train ResNet on synthetic images.", CONFIGS, default_steps=20,
                        default_batch_size=16, default_lr=0.05)
    p.add_argument("--init-from", type=pathlib.Path, default=None,
                   help="torchvision/timm state dict (.pth or .safetensors) to start from")
    p.add_argument("--save", type=pathlib.Path, default=None, help="own checkpoint file to write")
    p.add_argument("--weight-decay", type=float, default=1e-4,
                   help="SGD weight decay (default: 1e-4)")
    return p


def build(config, seed=0):
    torch.manual_seed(seed)
    return ResNet(CONFIGS[config] if isinstance(config, str) else config)


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    cfg = CONFIGS[args.config]
    model = build(cfg, args.seed)
    if args.init_from is not None:
        load_pretrained(model, args.init_from)
    model = model.to(device=device, dtype=dtype).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                                weight_decay=args.weight_decay)
    data = SyntheticImages(cfg.num_classes, cfg.image_size, seed=args.seed)

    def batch_fn(step):
        x, y = data(args.batch_size)
        return (x.to(device=device, dtype=dtype),), y.to(device)

    fwd = cli.maybe_compile(model, args)
    stats = loop.train(
        name=f"resnet {args.config}", model=model, optimizer=optimizer, batch_fn=batch_fn,
        loss_fn=lambda out, y: F.cross_entropy(out.float(), y), steps=args.steps,
        device=device, items_per_step=args.batch_size, unit="images",
        log_interval=args.log_interval, show_progress=not args.no_progress,
        compiled=args.compile, forward=lambda inputs: fwd(*inputs))
    if args.save is not None:
        save_checkpoint(args.save, model=model, config=cfg, optimizer=optimizer, step=args.steps)
        print(f"saved checkpoint {args.save}")
    return {"stats": stats, "model": model, "losses": stats.losses}


if __name__ == "__main__":
    main()
