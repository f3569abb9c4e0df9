"""Classify synthetic images with the ResNet example (eval mode), reporting accuracy and images/s.

    python examples/resnet/infer.py --device tpu --load /tmp/resnet.pt    # after train.py --save
    python examples/resnet/infer.py --config resnet50 --weights resnet50.pth --batch-size 64
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.resnet.model import CONFIGS, ResNet, SyntheticImages, load_pretrained  # noqa: E402


def parser():
    p = cli.make_parser("ResNet inference on synthetic images.", CONFIGS, default_steps=10,
                        default_batch_size=32, training=False)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--load", type=pathlib.Path, default=None, help="own checkpoint (train.py --save)")
    src.add_argument("--weights", type=pathlib.Path, default=None,
                     help="torchvision/timm state dict (.pth or .safetensors)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    cfg = CONFIGS[args.config]
    if args.load is not None:
        ck = torch.load(args.load, map_location="cpu", weights_only=True)
        from examples.resnet.model import ResNetConfig

        cfg = ResNetConfig(**{**ck["config"], "layers": tuple(ck["config"]["layers"]),
                              "widths": tuple(ck["config"]["widths"])})
        model = ResNet(cfg)
        model.load_state_dict(ck["model"])
    else:
        torch.manual_seed(args.seed)
        model = ResNet(cfg)
        if args.weights is not None:
            load_pretrained(model, args.weights)
    model = model.to(device=device, dtype=dtype).eval()
    fwd = cli.maybe_compile(model, args)
    # Validation data: the training distribution under another seed.
    data = SyntheticImages(cfg.num_classes, cfg.image_size, seed=args.seed + 10_000)
    batches = [data(args.batch_size) for _ in range(args.steps)]
    correct = []

    def step(i):
        x, y = batches[i]
        logits = fwd(x.to(device=device, dtype=dtype))
        correct.append((logits.argmax(-1) == y.to(device)).sum())
        return logits

    out, stats = loop.timed_inference(
        name=f"resnet {args.config}", fn=step, steps=args.steps, device=device,
        items_per_step=args.batch_size, unit="images", show_progress=not args.no_progress,
        compiled=args.compile)
    acc = float(torch.stack(correct).sum().cpu()) / (args.steps * args.batch_size)
    print(f"accuracy on synthetic validation images: {acc:.3f}")
    return {"stats": stats, "accuracy": acc, "logits": out.float().cpu(), "model": model}


if __name__ == "__main__":
    main()
