"""The collector pause around compiles (torch_tpu.runtime.gc_pause)."""

import gc

import torch

import torch_tpu  # noqa: F401
from torch_tpu.runtime import gc_pause


def test_pause_nests_and_resumes():
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc_pause.end()  # an unmatched end is ignored
    assert gc.isenabled()


def test_user_disabled_collector_stays_off():
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_opt_out(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COMPILE_GC", "1")
    with gc_pause.paused():
        assert gc.isenabled()


def test_collector_paused_during_compile_and_back_after(monkeypatch):
    seen = []
    from torch_tpu.runtime import executor

    real = executor.jax.jit

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    torch._dynamo.reset()  # clears dynamo's callbacks: the backend re-installs ours
    monkeypatch.setattr(executor.jax, "jit", spy)

    @torch.compile(backend="tpu")
    def f(x):
        return torch.sin(x) * 3 + 1

    x = torch.arange(7.0).to("tpu")
    torch.testing.assert_close(f(x).cpu(), torch.sin(torch.arange(7.0)) * 3 + 1)
    assert seen and not any(seen)
    assert gc.isenabled()
    from torch._dynamo.callback import callback_handler

    assert gc_pause._on_compile_start in callback_handler.start_callbacks
