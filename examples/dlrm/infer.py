"""Score synthetic click data with the DLRM example: log loss, accuracy and samples/s.

    python examples/dlrm/infer.py --device tpu --load /tmp/dlrm.pt     # after train.py --save
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from examples.common import cli, loop  # noqa: E402
from examples.dlrm.model import CONFIGS, DLRM, DLRMConfig, SyntheticClicks  # noqa: E402


def parser():
    p = cli.make_parser("DLRM inference on synthetic click data.", CONFIGS, default_steps=10,
                        default_batch_size=256, training=False)
    p.add_argument("--load", type=pathlib.Path, default=None, help="own checkpoint (train.py --save)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    device = cli.setup(args)
    dtype = cli.DTYPES[args.dtype]
    cfg = CONFIGS[args.config]
    if args.load is not None:
        ck = torch.load(args.load, map_location="cpu", weights_only=True)
        c = ck["config"]
        cfg = DLRMConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
        model = DLRM(cfg)
        model.load_state_dict(ck["model"])
    else:
        torch.manual_seed(args.seed)
        model = DLRM(cfg)
    model = model.to(device=device, dtype=dtype).eval()
    fwd = cli.maybe_compile(model, args)
    data = SyntheticClicks(cfg, seed=args.seed + 10_000)
    batches = [data(args.batch_size) for _ in range(args.steps)]
    losses, hits = [], []

    def step(i):
        dense, sparse, clicks = batches[i]
        logits = fwd(dense.to(device=device, dtype=dtype), sparse.to(device))
        clicks = clicks.to(device)
        losses.append(torch.nn.functional.binary_cross_entropy_with_logits(
            logits.float(), clicks, reduction="sum"))
        hits.append(((logits > 0).float() == clicks).sum())
        return logits

    out, stats = loop.timed_inference(
        name=f"dlrm {args.config}", fn=step, steps=args.steps, device=device,
        items_per_step=args.batch_size, unit="samples", show_progress=not args.no_progress,
        compiled=args.compile)
    n = args.steps * args.batch_size
    logloss = float(torch.stack(losses).sum().cpu()) / n
    acc = float(torch.stack(hits).sum().cpu()) / n
    print(f"validation log loss {logloss:.4f}, accuracy {acc:.3f}")
    return {"stats": stats, "logloss": logloss, "accuracy": acc, "logits": out.float().cpu(),
            "model": model}


if __name__ == "__main__":
    main()
