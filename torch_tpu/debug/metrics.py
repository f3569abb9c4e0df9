"""Counters behind torch_tpu.debug.metrics(): transfers, syncs, fallbacks.

Counting is a dict increment, cheap enough to stay on in every path.
"""

from __future__ import annotations

import collections

COUNTERS: collections.Counter = collections.Counter()
TRANSFER_BYTES: collections.Counter = collections.Counter()
FALLBACKS: collections.Counter = collections.Counter()


def count(name: str, n: int = 1) -> None:
    COUNTERS[name] += n


def transfer(kind: str, nbytes: int) -> None:
    COUNTERS[f"transfer.{kind}"] += 1
    TRANSFER_BYTES[kind] += int(nbytes)


def fallback(op_name: str) -> None:
    FALLBACKS[op_name] += 1


def reset() -> None:
    COUNTERS.clear()
    TRANSFER_BYTES.clear()
    FALLBACKS.clear()
