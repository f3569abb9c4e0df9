"""Shared test setup: the tpu device is registered before any test imports."""

import os

# Tests see the platform's defaults unless a test changes them itself.
os.environ.setdefault("TORCH_TPU_CPU_FALLBACK", "1")

import torch  # noqa: E402

import torch_tpu  # noqa: E402,F401
