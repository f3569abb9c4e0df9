"""What a loaded executable needs from the process before it may run.

An XLA executable can call out of its own code: a *custom call* jumps to a
kernel registered in the process by name. Registering is not always enough.
jaxlib's CPU LAPACK kernels (``lapack_spotrf_ffi``, ``lapack_sgetrf_ffi``,
...) dispatch through a table of LAPACK function pointers that jaxlib fills
from SciPy only when a linear-algebra op is *lowered*
(`jaxlib.lapack.prepare_lapack_call`). JAX never meets the gap: its own
persistent cache is keyed on the lowered program, so every executable it
loads was lowered in that process first. The index tiers (`eager`,
`graphs`, and the step cache on top of them) exist to skip lowering, so a
warm process ran a stored cholesky through a null function pointer and died
with SIGSEGV. That was the warm-cache crash of every LAPACK-backed op.

The rule that keeps the warm path safe by construction:

- when an index entry is written, the custom-call targets of the optimized
  program are recorded with it (`of`);
- before an indexed executable is loaded, every recorded target is made
  ready (`prepare`): a target with a known setup gets it, a target known to
  need nothing passes, and **any other target makes the entry a miss**, so
  the program is lowered again (which does whatever setup JAX's lowering
  does) instead of running blind. An entry that records no list (written by
  an older format) is a miss too.

Known targets, and why:

- ``lapack_*``: jaxlib's LAPACK table. Set up by lowering (not compiling) a
  tiny `jnp.linalg.cholesky` once per process: the public route through
  `prepare_lapack_call`, which fills the whole table at once.
- ``__*`` (``__onednn$matmul``, ``__cublas$gemm``, ``__cudnn$...``, ...) and
  ``TopK``: XLA's own runtime kernels, linked into the backend itself.
- ``Sharding``, ``SPMDFullToShardShape``, ``SPMDShardToFullShape``: markers
  the SPMD partitioner consumes; nothing is called at run time.

`stats()` counts entries refused for an unknown target (``unknown``), with
the names, so a new kernel family shows up in `torch_tpu.cache.stats()`
instead of as a slower warm start nobody can explain.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

_TARGET = re.compile(r'custom_call_target="([^"]+)"')

# Targets that need nothing from the process (exact names).
_NOTHING = frozenset({"TopK", "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"})

_lock = threading.Lock()
_ready: set[str] = set()           # setups already done in this process
_unknown: dict[str, int] = {}      # target -> entries refused for it


def of(exe: Any) -> list[str] | None:
    """The sorted custom-call targets of loaded executable `exe` (its optimized
    HLO), or None when its program text cannot be read (then it is not indexed)."""
    try:
        text = "".join(m.to_string() for m in exe.hlo_modules())
    except Exception:  # noqa: BLE001 - an executable type without HLO modules
        return None
    return sorted(set(_TARGET.findall(text)))


def _lower_lapack() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.jit(jnp.linalg.cholesky).lower(np.eye(2, dtype=np.float32))


# Setups by target prefix: name -> (prefix, function). Each runs once per process.
_SETUPS: dict[str, tuple[str, Callable[[], None]]] = {
    "lapack": ("lapack_", _lower_lapack),
}


def _setup_for(target: str) -> str | None:
    """The name of `target`'s setup, "" when it needs none, None when unknown."""
    if target in _NOTHING or target.startswith("__"):
        return ""
    for name, (prefix, _) in _SETUPS.items():
        if target.startswith(prefix):
            return name
    return None


def prepare(targets: Any) -> bool:
    """Make the process ready to run a program calling `targets` (a recorded
    list); False when that cannot be established (the caller lowers instead)."""
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        return False
    setups = []
    for target in targets:
        setup = _setup_for(target)
        if setup is None:
            with _lock:
                _unknown[target] = _unknown.get(target, 0) + 1
            return False
        if setup and setup not in _ready:
            setups.append(setup)
    for setup in setups:
        with _lock:
            if setup in _ready:
                continue
            try:
                _SETUPS[setup][1]()
            except Exception:  # noqa: BLE001 - cannot set up: lower instead
                return False
            _ready.add(setup)
    return True


def stats() -> dict:
    with _lock:
        return {"ready": sorted(_ready), "unknown": dict(_unknown)}


def reset_stats() -> None:
    """Forget the refusal counts (setups stay done: they cannot be undone)."""
    with _lock:
        _unknown.clear()
