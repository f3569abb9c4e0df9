"""Counters of transfers, syncs and CPU fallbacks, incremented from any layer.

Counting is a dict increment, cheap enough to stay on in every path. The
producers (ops, torch.tpu.synchronize, debug's timing) call `count`,
`transfer` and `fallback`; torch_tpu.debug.metrics reads and resets these
very objects. Below everything that counts: imports nothing of torch_tpu.
"""

from __future__ import annotations

import collections
import logging

COUNTERS: collections.Counter = collections.Counter()
TRANSFER_BYTES: collections.Counter = collections.Counter()
FALLBACKS: collections.Counter = collections.Counter()
# Host seconds per op, filled only while a timing capture is active
# (torch_tpu.debug.capture(timing=True) or capture(sync=True)).
OP_SECONDS: collections.Counter = collections.Counter()
OP_TIMED: collections.Counter = collections.Counter()
# Persistent (on-disk) compilation cache events reported by JAX.
DISK_CACHE: collections.Counter = collections.Counter()

_fallback_log = logging.getLogger("torch_tpu.fallback")


def count(name: str, n: int = 1) -> None:
    COUNTERS[name] += n


def transfer(kind: str, nbytes: int) -> None:
    COUNTERS[f"transfer.{kind}"] += 1
    TRANSFER_BYTES[kind] += int(nbytes)


def fallback(op_name: str) -> None:
    FALLBACKS[op_name] += 1
    if _fallback_log.isEnabledFor(logging.INFO):
        _fallback_log.info("CPU fallback: %s (call %d); inputs copied to the host and "
                           "results back", op_name, FALLBACKS[op_name])


def reset() -> None:
    """Clear this module's counters (executor.STATS is left alone)."""
    COUNTERS.clear()
    TRANSFER_BYTES.clear()
    FALLBACKS.clear()
    OP_SECONDS.clear()
    OP_TIMED.clear()
    DISK_CACHE.clear()
