"""Sample images from the diffusion UNet (DDPM ancestral sampling, optionally respaced).

    python examples/unet/sample.py --device tpu --load /tmp/unet.pt --steps 25 --out /tmp/samples.png
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import time  # noqa: E402

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.unet.model import CONFIGS, Diffusion, UNet, UNetConfig  # noqa: E402
from examples.unet.train import build  # noqa: E402


def parser():
    p = cli.make_parser("Sample from a DDPM UNet.", CONFIGS, default_steps=20,
                        default_batch_size=4, training=False)
    p.add_argument("--load", type=pathlib.Path, default=None, help="own checkpoint (train.py --save)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="write the samples as a PPM/PGM image grid (no extra dependencies)")
    return p


def save_grid(x, path):
    """Images (B, 3, H, W) in [-1, 1] side by side as a binary PPM file."""
    x = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu()
    grid = torch.cat(list(x), dim=2)                      # (3, H, B*W)
    h, w = grid.shape[1:]
    with open(path, "wb") as f:
        f.write(f"P6 {w} {h} 255\n".encode())
        f.write(grid.permute(1, 2, 0).contiguous().numpy().tobytes())


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    if args.load is not None:
        ck = torch.load(args.load, map_location="cpu", weights_only=True)
        c = ck["config"]
        cfg = UNetConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
        model = UNet(cfg)
        model.load_state_dict(ck["model"])
    else:
        cfg = CONFIGS[args.config]
        model = build(cfg, args.seed)
    model = model.to(device=device, dtype=dtype).eval()
    fwd = cli.maybe_compile(model, args)
    diffusion = Diffusion(cfg.timesteps)
    shape = (args.batch_size, cfg.in_channels, cfg.image_size, cfg.image_size)
    cs0, fb0 = cli.compile_seconds(), cli.fallback_counts()
    bar = lambda it: loop.progress(it, desc="sample", enabled=not args.no_progress)  # noqa: E731
    t0 = time.perf_counter()
    x = diffusion.sample(lambda xt, t: fwd(xt.to(dtype), t), shape, steps=args.steps,
                         device=device, gen=torch.Generator().manual_seed(args.seed), progress=bar)
    x = x.float().cpu()
    elapsed = time.perf_counter() - t0
    n_steps = len(diffusion.schedule(args.steps)[0])
    comp = ""
    if device.type == "tpu" and cs0 is not None:
        comp = f" (compiling {cli.compile_seconds() - cs0:.2f} s of it)"
    fb = {k: v - fb0.get(k, 0) for k, v in cli.fallback_counts().items() if v - fb0.get(k, 0)}
    fbs = f" | cpu fallbacks: {sum(fb.values())} calls of {len(fb)} ops ({', '.join(sorted(fb))})" if fb else ""
    mode = "compiled" if args.compile else "eager"
    print(f"summary: unet {args.config} sample on {device} ({mode}) | {n_steps} denoising steps x "
          f"{args.batch_size} images in {elapsed:.2f} s{comp} | "
          f"{n_steps * args.batch_size / elapsed:,.1f} image-steps/s{fbs}")
    print(f"sample mean {x.mean():.3f}, std {x.std():.3f}, range [{x.min():.2f}, {x.max():.2f}]")
    if args.out is not None:
        save_grid(x, args.out)
        print(f"wrote {args.out}")
    return {"samples": x, "model": model, "elapsed": elapsed}


if __name__ == "__main__":
    main()
