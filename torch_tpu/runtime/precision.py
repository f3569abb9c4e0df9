"""The matmul precision of the programs compiled now: runtime state every
executable's cache key carries (`cache_token()`).

    torch.tpu.set_matmul_precision("highest")      # process-wide
    torch.tpu.get_matmul_precision()               # 'highest'
    with torch.tpu.matmul_precision("high"):       # this thread, this block
        y = a @ b

The three settings are XLA's operand precision of float32 dots and
convolutions (`PrecisionConfig`):

- 'default': fastest. On a TPU, one bfloat16 pass of the MXU (like
  `torch.set_float32_matmul_precision("medium")`); on CPU/GPU XLA uses full
  float32 anyway.
- 'high': three bfloat16 passes (about float32-with-tf32 accuracy).
- 'highest': six passes on TPU: float32 accuracy, like PyTorch on the CPU.

The initial setting follows `torch.get_float32_matmul_precision()` when
the backend loads (at the first use of the device, see torch_tpu/__init__.py;
'highest' unless changed: results match the CPU; 'medium' maps to
'default'); later calls of torch's function are not followed, use these.

It is stored as JAX's `jax_default_matmul_precision` (process-wide by
`set_matmul_precision`, per thread inside `matmul_precision`), which is read
when a program is traced: JAX code without an explicit precision follows it,
and lowerings that choose a precision themselves call `lax_precision()`. The
setting is part of every program's HLO (`operand_precision={highest,highest}`
on each dot), and `cache_token()` belongs in every executable's cache key so
that a program compiled under one setting is not reused under another.
The torch name 'medium' (= 'default') and JAX's 'bfloat16', 'tensorfloat32',
'bfloat16_3x', 'float32' are accepted as aliases.

The user-facing module is `torch_tpu.precision` (it re-exports these); the
torch.tpu functions are attached by `device/autocast.install()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import torch

from .._compat import jax_api

# the State object: reading its value is ~40 ns (cache_token is on the hot
# path); None where JAX's changed (then read from jax.config)
JAX_PRECISION_STATE: Any = jax_api.matmul_precision_state()

PRECISIONS = ("default", "high", "highest")

_ALIASES = {
    "default": "default", "medium": "default", "bfloat16": "default", "fastest": "default",
    "high": "high", "tensorfloat32": "high", "bfloat16_3x": "high",
    "highest": "highest", "float32": "highest",
}
# What each setting is handed to JAX as.
_TO_JAX = {"default": "default", "high": "high", "highest": "highest"}


def _normalize(precision: Any) -> str:
    if isinstance(precision, jax.lax.Precision):
        precision = {jax.lax.Precision.DEFAULT: "default", jax.lax.Precision.HIGH: "high",
                     jax.lax.Precision.HIGHEST: "highest"}[precision]
    if not isinstance(precision, str) or precision.lower() not in _ALIASES:
        raise ValueError(
            f"unknown matmul precision {precision!r}; valid: "
            f"{', '.join(repr(p) for p in PRECISIONS)}")
    return _ALIASES[precision.lower()]


def set_matmul_precision(precision: str) -> None:
    """Set the float32 matmul/convolution precision of programs compiled from now on
    ('default', 'high' or 'highest'), for the whole process."""
    p = _normalize(precision)
    jax.config.update("jax_default_matmul_precision", _TO_JAX[p])


def get_matmul_precision() -> str:
    """The precision new programs get in this thread: 'default', 'high' or 'highest'."""
    raw = _raw()
    if raw is None:
        return "default"
    return _ALIASES.get(str(raw).lower(), "default")


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[str]:
    """Context manager: programs traced in this thread inside the block use `precision`."""
    p = _normalize(precision)
    with jax.default_matmul_precision(_TO_JAX[p]):
        yield p


_LAX = {"default": jax.lax.Precision.DEFAULT, "high": jax.lax.Precision.HIGH,
        "highest": jax.lax.Precision.HIGHEST}


def lax_precision() -> jax.lax.Precision:
    """The `jax.lax.Precision` of the current setting, for lowerings that pass
    `precision=` explicitly (call it while tracing, not at import)."""
    return _LAX[get_matmul_precision()]


def from_torch() -> str:
    try:
        return _ALIASES.get(torch.get_float32_matmul_precision(), "highest")
    except Exception:  # pragma: no cover
        return "highest"


def _raw() -> Any:
    if JAX_PRECISION_STATE is not None:
        return JAX_PRECISION_STATE.value
    return getattr(jax.config, "jax_default_matmul_precision", None)


def cache_token() -> Any:
    """A hashable value that changes when the effective precision changes.

    Append it to every executable cache key (eager ops and graphs): programs
    traced under different settings differ in their HLO.
    """
    return _raw()


def initialize() -> None:
    """Take torch's float32 matmul precision as the initial setting, unless
    one was set already (at the backend's load)."""
    if _raw() is None:
        set_matmul_precision(from_torch())
