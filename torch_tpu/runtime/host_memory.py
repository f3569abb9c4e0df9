"""The host's memory and byte-count settings, without JAX.

`host_memory()` bounds what fits on an XLA:CPU device (runtime/oom.py) and
sizes the in-memory program cache (runtime/programs.py); `parse_bytes` reads
the byte counts users give (``TORCH_TPU_MEMORY_LIMIT=16G``,
``TORCH_TPU_CACHE_BYTES=512M``). Apart from both so that the program cache,
which loads at start-up, needs neither the out-of-memory module nor JAX.
"""

from __future__ import annotations

import os
import re

_SUFFIX = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
           "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40,
           "tib": 2**40}


def parse_bytes(text: str, var: str) -> int | None:
    """`text` as a byte count ('512M', '2GiB', '1e9'); None for off/none."""
    s = text.strip().lower()
    if s in ("off", "none", "0"):
        return None
    m = re.fullmatch(r"([0-9.e+]+)\s*([a-z]*)", s)
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"{var}={text!r} is not a byte count (e.g. 1073741824, 512M, 16G, off)")
    return int(float(m.group(1)) * _SUFFIX[m.group(2)])


def host_memory() -> int:
    """Physical memory of the host, or the cgroup's memory limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                v = f.read().strip()
        except OSError:
            continue
        if v.isdigit() and 0 < int(v) < total:
            total = int(v)
    return total
