"""Checkpoints: the examples' own format (torch.save) and Hugging Face key mapping.

Own format: one file written with `torch.save` holding the model config, the
model and optimizer state dicts, the step and the RNG state. Tensors are
saved from whatever device they live on (torch_tpu supports torch.save of
tpu tensors) and loaded onto the CPU first (`map_location="cpu"`), then moved
where the model is.

Hugging Face mapping: `KeyMap` renames keys between Hugging Face names and the
examples' module names, in both directions, and reports keys it does not know.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch


def save_checkpoint(path, *, model, config, optimizer=None, step: int = 0, extra=None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    obj = {
        "format": "torch_tpu.examples/1",
        "config": cfg,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "step": step,
        "rng": torch.get_rng_state(),
        "extra": extra or {},
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def load_checkpoint(path, *, model=None, optimizer=None, map_location="cpu") -> dict:
    """Load a checkpoint file; fills `model` / `optimizer` when given. Returns the dict."""
    obj = torch.load(path, map_location=map_location, weights_only=True)
    if obj.get("format") != "torch_tpu.examples/1":
        raise ValueError(f"{path}: not a torch_tpu examples checkpoint")
    if model is not None:
        model.load_state_dict(obj["model"])
    if optimizer is not None and obj.get("optimizer") is not None:
        optimizer.load_state_dict(obj["optimizer"])
    return obj


class KeyMap:
    """A two-way mapping between two key naming schemes, written as templates.

    ``KeyMap([("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attention.wq.weight"),
    ...])``: `{i}` stands for a layer number. `to_native` maps Hugging Face
    keys to this example's module names, `to_hf` the other way.
    """

    def __init__(self, pairs, ignore_hf=()):
        self.pairs = list(pairs)
        self._fwd = [(self._regex(a), b) for a, b in self.pairs]
        self._bwd = [(self._regex(b), a) for a, b in self.pairs]
        self._ignore = [re.compile(p + r"\Z") for p in ignore_hf]

    @staticmethod
    def _regex(template: str):
        return re.compile(re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)") + r"\Z")

    @staticmethod
    def _apply(rules, key):
        for pat, target in rules:
            m = pat.match(key)
            if m:
                return target.format(**m.groupdict())
        return None

    def to_native(self, state_dict: dict) -> tuple[dict, list]:
        """(renamed dict, keys no rule matched); ignored keys are dropped."""
        out, unmatched = {}, []
        for k, v in state_dict.items():
            if any(p.match(k) for p in self._ignore):
                continue
            nk = self._apply(self._fwd, k)
            if nk is None:
                unmatched.append(k)
            else:
                out[nk] = v
        return out, unmatched

    def to_hf(self, state_dict: dict) -> tuple[dict, list]:
        out, unmatched = {}, []
        for k, v in state_dict.items():
            nk = self._apply(self._bwd, k)
            if nk is None:
                unmatched.append(k)
            else:
                out[nk] = v
        return out, unmatched
