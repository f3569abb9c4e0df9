"""Per-device random number state for `tpu` tensors.

Each device has a seed and an offset. A random op takes the key
`fold_in(PRNGKey(seed), offset)` as a runtime input of its executable and
advances the offset, so a seeded program is reproducible and no random op
recompiles when the state changes. The state is 16 bytes (seed, offset),
which is what get_rng_state/set_rng_state exchange, as a uint8 CPU tensor
like torch.cuda's.

Runtime state: the executor, the random lowerings (ops/random.py, dropout,
attention) and compiled graphs draw keys here; `torch.tpu.manual_seed`,
`get_rng_state` and the rest (device/module.py) are PyTorch's face of it.
"""

from __future__ import annotations

import random as _pyrandom
import threading

import jax
import numpy as np
import torch


_DEFAULT_SEED = 67280421310721  # torch's default_rng_seed_val
_lock = threading.Lock()
_state: dict[int, list[int]] = {}  # device index -> [seed, offset, initial_seed]


def _get(index: int) -> list[int]:
    s = _state.get(index)
    if s is None:
        s = _state[index] = [_DEFAULT_SEED, 0, _DEFAULT_SEED]
    return s


def next_key(index: int) -> np.ndarray:
    """The raw key of one random op on tpu:index: uint32[4] (seed, offset).

    It is a runtime input of the op's executable; `jax_key` turns it into a
    JAX PRNG key inside the program.
    """
    with _lock:
        s = _get(index)
        seed_, offset = s[0], s[1]
        s[1] += 1
    return np.array([seed_ >> 32, seed_ & 0xFFFFFFFF, offset >> 32, offset & 0xFFFFFFFF],
                    dtype=np.uint32)


def jax_key(raw):
    """Inside a program: the PRNG key for the raw (seed, offset) words."""
    return jax.random.fold_in(jax.random.fold_in(raw[:2], raw[2]), raw[3])


def manual_seed(seed: int, index: int) -> None:
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    with _lock:
        _state[index] = [seed, 0, seed]


def seed(index: int) -> int:
    s = _pyrandom.getrandbits(63)
    manual_seed(s, index)
    return s


def initial_seed(index: int) -> int:
    return _get(index)[2]


def get_state(index: int) -> torch.Tensor:
    s = _get(index)
    raw = np.array([s[0], s[1]], dtype=np.uint64).view(np.uint8)
    return torch.from_numpy(raw.copy())


def set_state(state: torch.Tensor, index: int) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError("set_rng_state: expected a torch.uint8 tensor of 16 bytes "
                           "(from torch.tpu.get_rng_state())")
    seed_, offset = state.cpu().numpy().view(np.uint64).tolist()
    with _lock:
        s = _get(index)
        s[0], s[1] = int(seed_), int(offset)
