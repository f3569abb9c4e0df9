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


import pytest  # noqa: E402


@pytest.fixture
def cache_dir(tmp_path):
    """A private, empty disk tier for one test (the previous one restored after)."""
    import torch_tpu.cache as cache
    from torch_tpu.cache import store as store_mod

    s = cache.disk_store()
    old_root, old_max = s.root, s.max_bytes
    store_mod._warned.clear()
    cache.set_dir(str(tmp_path / "cache"))
    yield tmp_path / "cache"
    s.max_bytes = old_max
    s.set_dir(old_root)
    store_mod._warned.clear()
