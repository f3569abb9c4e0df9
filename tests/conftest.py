"""Shared test setup: the tpu device is registered before any test imports."""

import os

# Tests see the platform's defaults unless a test changes them itself.
os.environ.setdefault("TORCH_TPU_CPU_FALLBACK", "1")


def _shared_cache_dir():
    """One persistent cache for the whole run, shared by every xdist worker,
    as users share one across processes (the default ~/.cache/torch_tpu).

    The controller process makes it when it loads this file, before the
    workers start, and they inherit it; so every worker after the first to
    compile a program loads it from disk: the warm path, on every run.
    (Workers had private, empty directories while loading a LAPACK program
    that another process stored crashed the loader; the cause is fixed in
    torch_tpu.cache.needs.) Tests that need an empty or isolated cache make
    their own directory (the `cache_dir` fixture below, or a tmp_path).
    TORCH_TPU_CACHE_DIR, when set, is kept.
    """
    if "TORCH_TPU_CACHE_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="torch_tpu-test-cache-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["TORCH_TPU_CACHE_DIR"] = path


_shared_cache_dir()

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


@pytest.fixture(autouse=True)
def _device_side_checks():
    """Each test starts with no pending device-side check (index bounds) and
    must not leave one unreported: a test whose ops indexed out of range
    without reading a value fails here, not in whichever test reads next."""
    from torch_tpu.runtime import asserts

    asserts.discard()
    yield
    asserts.check()
