"""ResNet (He et al. 2016, "Deep Residual Learning for Image Recognition") in plain PyTorch.

ResNet-18/34 stack BasicBlocks (two 3x3 convolutions), ResNet-50/101/152
Bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4), each convolution
followed by BatchNorm; the stride of a down-sampling Bottleneck sits on its
3x3 convolution (the "v1.5" variant torchvision and MLPerf use). A projection
shortcut (1x1 convolution + BatchNorm) joins blocks whose shape changes.

Module names are torchvision's (conv1, bn1, layer1.0.conv1, layer1.0.downsample.0,
fc), so `load_pretrained(path)` reads a torchvision/timm ResNet state dict
(.pth or .safetensors) from a local file as is.

The "cifar" stem (a single 3x3 stride-1 convolution, no max pool) keeps the
tiny configuration's 32x32 images from shrinking to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class ResNetConfig:
    block: str = "basic"                 # "basic" or "bottleneck"
    layers: tuple = (1, 1, 1, 1)
    widths: tuple = (16, 32, 64, 128)    # output channels of each stage's 3x3 conv
    num_classes: int = 10
    image_size: int = 32
    stem: str = "cifar"                  # "imagenet": 7x7/2 conv + 3x3/2 max pool
    zero_init_residual: bool = False


CONFIGS = {
    "tiny": ResNetConfig(),
    "resnet18": ResNetConfig("basic", (2, 2, 2, 2), (64, 128, 256, 512), 1000, 224, "imagenet"),
    "resnet34": ResNetConfig("basic", (3, 4, 6, 3), (64, 128, 256, 512), 1000, 224, "imagenet"),
    "resnet50": ResNetConfig("bottleneck", (3, 4, 6, 3), (64, 128, 256, 512), 1000, 224,
                             "imagenet"),
    "resnet101": ResNetConfig("bottleneck", (3, 4, 23, 3), (64, 128, 256, 512), 1000, 224,
                              "imagenet"),
}


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.cfg = cfg
        block = {"basic": BasicBlock, "bottleneck": Bottleneck}[cfg.block]
        c0 = cfg.widths[0]
        if cfg.stem == "imagenet":
            self.conv1 = nn.Conv2d(3, c0, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(3, c0, 3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(c0)
        self.relu = nn.ReLU(inplace=True)
        cin = c0
        for i, (n, w) in enumerate(zip(cfg.layers, cfg.widths)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                s = stride if j == 0 else 1
                down = None
                if s != 1 or cin != w * block.expansion:
                    down = nn.Sequential(conv1x1(cin, w * block.expansion, s),
                                         nn.BatchNorm2d(w * block.expansion))
                blocks.append(block(cin, w, s, down))
                cin = w * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, cfg.num_classes)
        self._init()

    def _init(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.cfg.zero_init_residual:
            for m in self.modules():
                last = getattr(m, "bn3", None) if isinstance(m, Bottleneck) else (
                    getattr(m, "bn2", None) if isinstance(m, BasicBlock) else None)
                if last is not None:
                    nn.init.zeros_(last.weight)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def load_pretrained(model: ResNet, path, *, strict: bool = True) -> None:
    """Load a torchvision/timm-format ResNet state dict (.pth/.pt or .safetensors).

    Checkpoints wrapped as {"state_dict": ...} or {"model": ...} and keys
    prefixed by "module." (DataParallel) or "model." are accepted; shapes are
    checked before anything is copied.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        from examples.common.safetensors_io import load_file

        sd = load_file(path)
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("state_dict", "model"):
            if isinstance(sd, dict) and isinstance(sd.get(key), dict):
                sd = sd[key]
    fixed = {}
    for k, v in sd.items():
        for prefix in ("module.", "model."):
            if k.startswith(prefix):
                k = k[len(prefix):]
        fixed[k] = v
    own = model.state_dict()
    bad = [k for k, v in fixed.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise ValueError(f"shape mismatch for {bad[:5]} (wrong config? e.g. num_classes)")
    if not strict:
        fixed = {k: v for k, v in fixed.items() if k in own}
    missing, unexpected = model.load_state_dict(fixed, strict=False)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if strict and (missing or unexpected):
        raise KeyError(f"missing {missing[:5]}, unexpected {unexpected[:5]}")


class SyntheticImages:
    """Class-conditional images: a fixed smooth random pattern per class plus noise.

    Deterministic from `seed` (CPU generator), so every device sees the same data.
    """

    def __init__(self, num_classes: int, image_size: int, seed: int = 0, noise: float = 0.5):
        g = torch.Generator().manual_seed(1000 + num_classes)
        low = torch.randn(num_classes, 3, 4, 4, generator=g)
        self.prototypes = nn.functional.interpolate(low, size=(image_size, image_size),
                                                    mode="bilinear", align_corners=False)
        self.num_classes, self.noise = num_classes, noise
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, batch_size: int):
        y = torch.randint(0, self.num_classes, (batch_size,), generator=self.gen)
        x = self.prototypes[y] + self.noise * torch.randn(
            (batch_size,) + tuple(self.prototypes.shape[1:]), generator=self.gen)
        return x, y
