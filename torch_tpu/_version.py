"""The package version, in a module of its own so that any layer may read it,
and the torch releases this version supports."""

from __future__ import annotations

import os
import re
import sys

__version__ = "0.1.0"

# pyproject's `dependencies` says the same (tests/test_packaging.py checks);
# CI tests 2.13 (the default run) and 2.14 (a bounded tier, .ci/run).
TORCH_RANGE = "torch>=2.13,<2.15"
_TORCH_LOW, _TORCH_END = (tuple(map(int, v)) for v in re.findall(r"(\d+)\.(\d+)", TORCH_RANGE))


def torch_release(version: str) -> tuple[int, ...]:
    """(2, 14, 1) of '2.14.1+cu130' (a version's leading numbers)."""
    return tuple(int(p) for p in re.findall(r"\d+", re.split(r"[^\d.]", version)[0]))


def reinstall_command() -> str:
    """The command that rebuilds torch_tpu's native extension against the torch
    now installed (the build backend compiles against the installed torch;
    --no-deps keeps pip from changing that torch)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = root if os.path.isfile(os.path.join(root, "setup.py")) else "<torch_tpu's source directory>"
    editable = "-e " if source == root else "--force-reinstall "
    return f"{sys.executable} -m pip install --no-deps {editable}{source}"


def unsupported_torch(version: str) -> str | None:
    """Why torch `version` cannot run torch_tpu (one message naming the
    supported range), or None where it is in the range."""
    if _TORCH_LOW <= torch_release(version)[:2] < _TORCH_END:
        return None
    return (f"torch_tpu {__version__} supports {TORCH_RANGE} (2.13 and 2.14); this environment has "
            f"torch {version}. Install a supported torch (pip install '{TORCH_RANGE}'), then "
            f"rebuild torch_tpu for it: {reinstall_command()}")
