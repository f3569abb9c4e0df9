"""Shared test setup: the tpu device is registered before any test imports."""

import os

# Tests see the platform's defaults unless a test changes them itself.
os.environ.setdefault("TORCH_TPU_CPU_FALLBACK", "1")


def _private_cache_dir():
    """Each test process (xdist worker) gets its own, empty persistent cache.

    Executables are still cached for the whole run (in memory, and on disk
    for the process), but no worker loads another process's XLA:CPU
    executables from a shared directory: deserializing those has crashed a
    worker twice (a segfault inside XLA's loader on an entry that passed our
    checksum; upstream jax-ml/jax#28908). Tests of cross-process loading make
    their own directories. TORCH_TPU_CACHE_DIR, when set, is kept.
    """
    if "TORCH_TPU_CACHE_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = tempfile.mkdtemp(prefix=f"torch_tpu-test-cache-{worker}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["TORCH_TPU_CACHE_DIR"] = path


_private_cache_dir()

import torch_tpu  # noqa: E402,F401
