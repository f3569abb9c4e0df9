"""Shared test setup: the tpu device is registered before any test imports."""

import os

# Tests see the platform's defaults unless a test changes them itself.
os.environ.setdefault("TORCH_TPU_CPU_FALLBACK", "1")

# XLA:CPU's defaults in XLA_FLAGS from the start, as the runtime would add
# them at its first load (in whichever test that is), so the environment
# check below sees no test change them.
from torch_tpu.runtime.xla_flags import add_cpu_defaults  # noqa: E402

add_cpu_defaults()


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


# Variables that libraries set for themselves, once per process, in whichever
# test first reaches them: not that test's doing, so their changes are kept.
ENV_SET_BY_LIBRARIES = frozenset({
    "PYTEST_CURRENT_TEST",                      # pytest, around each test phase
    "TF_CPP_MIN_LOG_LEVEL",                     # jax, at import
    "TORCHINDUCTOR_CACHE_DIR",                  # torch._inductor's cache_dir(), first use
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",  # inductor's C++ wrapper, first load
    "KMP_DUPLICATE_LIB_OK",                     # inductor's C++ builder
    "TORCH_WARM_POOL",                          # inductor's compile worker pool
    "TOKENIZERS_PARALLELISM",                   # transformers' generate
    "CUBLAS_WORKSPACE_CONFIG",                  # torch._inductor.fx_passes, at import
    "MPLCONFIGDIR",                             # matplotlib, at import (no writable home)
})


@pytest.fixture(autouse=True)
def _environment_unchanged():
    """A test leaves os.environ as it found it: a variable set or removed
    without monkeypatch (or by the code under test) would reach every later
    test of the worker and every child process they start. A change left
    behind is undone here and fails the test (at teardown), naming it."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys()
               if before.get(k) != after.get(k) and k not in ENV_SET_BY_LIBRARIES}
    if not changed:
        return
    for k, (old, _) in changed.items():
        if old is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = old
    pytest.fail("the test left os.environ changed (restored now): "
                + ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
                + " (use monkeypatch.setenv/delenv, which restore at the end of the test)",
                pytrace=False)


@pytest.fixture
def no_cpu_fallback(monkeypatch):
    """The CPU fallback off for one test (TORCH_TPU_CPU_FALLBACK=0, which
    torch_tpu.ops.fallback reads at each op): an op without a tpu lowering
    raises NotImplementedError naming it instead of quietly running on the
    CPU, so a lowering that disappears fails the op tests instead of
    comparing the CPU with itself. Also checked: no fallback was counted.
    Op test modules turn it on for all their tests with
    `pytestmark = pytest.mark.usefixtures("no_cpu_fallback")`; an expected
    fallback is an xfail with its reason."""
    from torch_tpu.debug import metrics

    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "0")
    before = dict(metrics.FALLBACKS)
    yield
    moved = {k: v - before.get(k, 0) for k, v in metrics.FALLBACKS.items()
             if v != before.get(k, 0)}
    assert not moved, f"ops ran through the CPU fallback: {moved}"
