"""Named example models with synthetic inputs, for benchmarks and tests.

    from examples.registry import get_example, list_examples
    model, inputs, loss_fn = get_example("llama", device="tpu")
    loss = loss_fn(model(*inputs))       # a training step: loss.backward(), optimizer.step()
    logits = model(*inputs)              # inference

- `list_examples()` -> the names: llama, qwen, resnet, dlrm, mingpt, unet.
- `get_example(name, config=None, *, batch_size=None, device="cpu", dtype=torch.float32,
  seed=0, **options)` -> `(model, example_inputs, loss_fn)`: the model (train mode) on
  `device` in `dtype`, a tuple of input tensors on `device`, and `loss_fn(output) -> scalar`
  that closes over the targets (also on `device`). `name` may carry the config as
  ``"llama:llama-3.2-1b"``. The same (name, config, batch_size, seed) gives the same
  weights and inputs on every device.
- `example_info(name, config=None, batch_size=None)` -> dict with ``configs``,
  ``default_config``, ``batch_size``, ``items_per_batch`` and ``unit`` (tokens, images,
  samples) for throughput, and a one-line ``description``.

Options: ``seq_len`` for llama/qwen (default 64 for tiny, 512 otherwise).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

_DESCRIPTIONS = {
    "llama": "Llama 3 decoder (RMSNorm, RoPE with llama3 scaling, GQA, SwiGLU); causal LM loss",
    "qwen": "Qwen3 decoder (QK-norm, GQA, tied embeddings); causal LM loss",
    "resnet": "ResNet (BasicBlock/Bottleneck, BatchNorm) on synthetic images; cross entropy",
    "dlrm": "DLRM (embedding bags, bottom/top MLP, dot interaction) on synthetic clicks; BCE",
    "mingpt": "minGPT (GPT-2 blocks) on the sort task; cross entropy on the sorted half",
    "unet": "DDPM UNet (res blocks, attention, timestep embedding); noise-prediction MSE",
}

_DEFAULT_BATCH = {
    "llama": {"tiny": 8}, "qwen": {"tiny": 8}, "resnet": {"tiny": 16}, "dlrm": {"tiny": 128},
    "mingpt": {"tiny": 64}, "unet": {"tiny": 16},
}
_DEFAULT_BATCH_LARGE = {"llama": 1, "qwen": 1, "resnet": 32, "dlrm": 2048, "mingpt": 8,
                        "unet": 32}


def list_examples() -> list[str]:
    return list(_DESCRIPTIONS)


def _split(name: str, config: str | None):
    if ":" in name:
        name, config = name.split(":", 1)
    if name not in _DESCRIPTIONS:
        raise KeyError(f"unknown example {name!r}; known: {', '.join(_DESCRIPTIONS)}")
    return name, config or "tiny"


def _configs(name: str) -> dict:
    if name == "llama":
        from examples.llama.model import CONFIGS
    elif name == "qwen":
        from examples.qwen.model import CONFIGS
    elif name == "resnet":
        from examples.resnet.model import CONFIGS
    elif name == "dlrm":
        from examples.dlrm.model import CONFIGS
    elif name == "mingpt":
        from examples.mingpt.model import CONFIGS
    else:
        from examples.unet.model import CONFIGS
    return CONFIGS


def _batch(name, config, batch_size):
    if batch_size is not None:
        return batch_size
    return _DEFAULT_BATCH[name].get(config, _DEFAULT_BATCH_LARGE[name])


def _seq_len(config, options):
    return options.get("seq_len", 64 if config == "tiny" else 512)


def example_info(name: str, config: str | None = None, batch_size: int | None = None,
                 **options) -> dict:
    name, config = _split(name, config)
    configs = _configs(name)
    if config not in configs:
        raise KeyError(f"{name} has no config {config!r}; known: {', '.join(configs)}")
    b = _batch(name, config, batch_size)
    if name in ("llama", "qwen"):
        items, unit = b * _seq_len(config, options), "tokens"
    elif name == "mingpt":
        items, unit = b * (2 * options.get("length", 6) - 1), "tokens"
    elif name == "dlrm":
        items, unit = b, "samples"
    else:
        items, unit = b, "images"
    return {"name": name, "config": config, "configs": list(configs), "default_config": "tiny",
            "batch_size": b, "items_per_batch": items, "unit": unit,
            "description": _DESCRIPTIONS[name]}


def get_example(name: str, config: str | None = None, *, batch_size: int | None = None,
                device="cpu", dtype=torch.float32, seed: int = 0, **options):
    """(model, example_inputs, loss_fn) for a named example; see the module docstring."""
    name, config = _split(name, config)
    configs = _configs(name)
    if config not in configs:
        raise KeyError(f"{name} has no config {config!r}; known: {', '.join(configs)}")
    cfg = configs[config]
    b = _batch(name, config, batch_size)
    device = torch.device(device)
    if device.type == "tpu":
        import torch_tpu  # noqa: F401
    torch.manual_seed(seed)
    data_gen = torch.Generator().manual_seed(seed + 1)

    if name in ("llama", "qwen"):
        if name == "llama":
            from examples.llama.model import Llama as cls, lm_loss
        else:
            from examples.qwen.model import Qwen3 as cls, lm_loss
        t = _seq_len(config, options)
        model = cls(cfg)
        tokens = torch.randint(0, cfg.vocab_size, (b, t + 1), generator=data_gen)
        inputs = (tokens[:, :-1],)
        target = tokens[:, 1:]
        loss = lm_loss
    elif name == "resnet":
        from examples.resnet.model import ResNet, SyntheticImages

        model = ResNet(cfg)
        x, target = SyntheticImages(cfg.num_classes, cfg.image_size, seed=seed)(b)
        inputs = (x,)

        def loss(out, y):
            return torch.nn.functional.cross_entropy(out.float(), y)
    elif name == "dlrm":
        from examples.dlrm.model import DLRM, SyntheticClicks, bce_loss

        model = DLRM(cfg)
        dense, sparse, target = SyntheticClicks(cfg, seed=seed)(b)
        inputs = (dense, sparse)
        loss = bce_loss
    elif name == "mingpt":
        from examples.mingpt.model import GPT, SortTask, sort_loss

        length = options.get("length", 6)
        task = SortTask(length, 3, seed=seed)
        model = GPT(dataclasses.replace(cfg, vocab_size=3, block_size=task.block_size))
        x, target = task(b)
        inputs = (x,)
        loss = sort_loss
    else:
        from examples.unet.model import Diffusion, SyntheticShapes, UNet

        model = UNet(cfg)
        x0 = SyntheticShapes(cfg.image_size, seed=seed)(b)
        xt, t, target = Diffusion(cfg.timesteps).training_batch(x0, data_gen)
        inputs = (xt, t)

        def loss(out, noise):
            return torch.nn.functional.mse_loss(out.float(), noise.float())

    model = model.to(device=device, dtype=dtype).train()
    inputs = tuple(i.to(device=device, dtype=dtype) if i.is_floating_point() else i.to(device)
                   for i in inputs)
    target = target.to(device)

    def loss_fn(output):
        return loss(output, target)

    return model, inputs, loss_fn
