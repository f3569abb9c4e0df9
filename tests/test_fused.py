"""Fused eager mode (torch_tpu.fused(), TORCH_TPU_EAGER=fused; runtime/fused.py).

Recorded ops must give strict mode's values (bitwise for elementwise chains,
the same training trajectories), run as few cached programs as the trace
allows, raise a recorded op's error at the flush naming the op, and keep
random streams. The views/in-place suite runs under fused mode in
tests/test_views_fused.py.
"""

import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu.runtime import fused, programs

from test_ops_nn import _CNN, _Block, _batch, _lm_loss, _tokens


def _fused_programs():
    return programs.STATS.compiles_per_op["fused eager program"]


def test_elementwise_chain_is_one_program_and_bitwise():
    x = torch.randn(64, 33).to("tpu")
    y = torch.randn(64, 33).to("tpu")

    def chain(a, b):
        c = (a * 1.5 + b).sin()
        c = torch.where(c > 0, c, c * 0.1)
        return (c.exp() - b).tanh().mul_(3).add_(a)

    want = chain(x, y).cpu()
    with torch_tpu.fused():
        out = chain(x, y)
        assert fused.pending() >= 8, "the chain was not recorded"
        flushes = fused.STATS.flushes
        got = out.cpu()  # the read runs the recorded ops
        assert fused.pending() == 0
        assert fused.STATS.flushes == flushes + 1
    assert torch.equal(got, want)


def test_scalar_inputs_keep_their_values():
    """Scalars reach the fused program as cached device values: 0.0 and -0.0,
    1 and True and 1.0 must stay apart."""
    x = torch.ones(3, device="tpu")
    with torch_tpu.fused():
        a, b = x * 0.0, x * -0.0
        c, d = x + 1, x.to(torch.int32) * True
        e = torch.full((2,), 1.0, device="tpu") / 3
    assert not torch.signbit(a.cpu()).any() and torch.signbit(b.cpu()).all()
    assert torch.equal(c.cpu(), torch.full((3,), 2.0))
    assert d.dtype == torch.int32 and torch.equal(d.cpu(), torch.ones(3, dtype=torch.int32))
    assert torch.equal(e.cpu(), torch.full((2,), 1.0) / 3)


def test_flush_points():
    x = torch.randn(8).to("tpu")
    with torch_tpu.fused():
        y = x + 1
        assert fused.pending() == 1
        torch.tpu.synchronize()
        assert fused.pending() == 0
        z = y * 2
        assert fused.pending() == 1
        nz = torch.nonzero(z > 0)  # data-dependent (eager) lowering: runs the trace first
        assert fused.pending() == 0
        w = z - 1
    assert fused.pending() == 0  # leaving the mode
    ref = x.cpu()
    torch.testing.assert_close(w.cpu(), (ref + 1) * 2 - 1, rtol=0, atol=0)
    assert torch.equal(nz.cpu(), torch.nonzero((ref + 1) * 2 > 0))
    assert not fused.enabled()


def test_size_limit_flushes(monkeypatch):
    monkeypatch.setattr(fused, "MAX_OPS", 5)
    x = torch.zeros(4).to("tpu")
    with torch_tpu.fused():
        for _ in range(12):
            x = x + 1
            assert fused.pending() < 5
    assert torch.equal(x.cpu(), torch.full((4,), 12.0))


def test_strict_region_inside_fused():
    x = torch.ones(3).to("tpu")
    with torch_tpu.fused():
        y = x * 2
        assert fused.pending() == 1
        with torch_tpu.fused(False):
            assert fused.pending() == 0 and not fused.enabled()
            z = y + 1
            assert fused.pending() == 0
        assert fused.enabled()
    assert torch.equal(z.cpu(), torch.full((3,), 3.0))


def test_fused_works_as_a_decorator():
    x = torch.arange(4.0).to("tpu")

    @torch_tpu.fused()
    def f(t):
        y = t * 2 + 1
        assert fused.enabled() and fused.pending() == 2
        return y

    for _ in range(2):  # the same object entered again
        out = f(x)
        assert fused.pending() == 0 and not fused.enabled()
        assert torch.equal(out.cpu(), torch.arange(4.0) * 2 + 1)


def test_only_values_still_referenced_are_program_outputs(monkeypatch):
    """A value whose tensors all died before the flush is no output of the
    fused program (the flush counts references to each recorded value); one
    held in any way (a tensor in a list, a local) is, with strict's value."""
    keys = []
    lookup = programs.lookup

    def spy(key):
        keys.append(key)
        return lookup(key)

    monkeypatch.setattr(programs, "lookup", spy)
    x = torch.arange(6.0).to("tpu")
    with torch_tpu.fused():
        a = x + 1           # value 0: kept
        b = a * 2           # value 1: dies
        c = b - 1           # value 2: dies
        kept = [c * 3]      # value 3: held by a list only
        d = c.abs()         # value 4: kept
        del b, c
    assert keys and keys[-1][0] is programs.ProgramKind.FUSED
    assert keys[-1][2] == (0, 3, 4)
    want = torch.arange(6.0) + 1
    assert torch.equal(a.cpu(), want)
    assert torch.equal(kept[0].cpu(), (want * 2 - 1) * 3)
    assert torch.equal(d.cpu(), (want * 2 - 1).abs())


def test_recording_reuses_each_op_template(monkeypatch):
    """An op's output shapes and rounding barriers come from its program once
    per executor entry (op and input signature), not at every recording."""
    traced = []
    make_jaxpr = jax.make_jaxpr

    def spy(*args, **kwargs):
        traced.append(1)
        return make_jaxpr(*args, **kwargs)

    monkeypatch.setattr(jax, "make_jaxpr", spy)
    x = torch.randn(7, 13).to("tpu")  # shapes no other test records
    outs = []
    for i in range(4):
        with torch_tpu.fused():
            y = torch.atan2(x, x + 0.5)
        outs.append(y.cpu())
        if i == 0:
            first = len(traced)
            assert first >= 1, "the first recording did not make the template"
    assert len(traced) == first
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert torch.equal(outs[0], torch.atan2(x, x + 0.5).cpu())


def test_views_and_inplace_alias():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    x = base.to("tpu")
    with torch_tpu.fused():
        v = x[1:3, ::2]
        v.mul_(10)
        x.t()[0].add_(1)
        row = x[2]
        s = row.sum()
        assert fused.pending() >= 3
    ref = base.clone()
    ref[1:3, ::2].mul_(10)
    ref.t()[0].add_(1)
    assert torch.equal(x.cpu(), ref)
    assert torch.equal(v.cpu(), ref[1:3, ::2])
    assert s.item() == ref[2].sum().item()


def test_random_streams_match_strict():
    def draw():
        torch.tpu.manual_seed(1234)
        a = torch.randn(16, device="tpu")
        b = F.dropout(torch.ones(32, device="tpu"), 0.5)
        c = torch.rand(5, device="tpu") + a[:5]
        return [t.cpu() for t in (a, b, c)]

    strict = draw()
    with torch_tpu.fused():
        got = draw()
    for s, g in zip(strict, got):
        assert torch.equal(s, g)


# --------------------------------------------------------------------------
# training: fused vs strict, 20 steps


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(),
                         nn.Linear(32, 5))


_MODELS = {
    "mlp": (_mlp, _batch((8, 16), 5), F.cross_entropy),
    "cnn": (_CNN, _batch((4, 3, 8, 8), 4), F.cross_entropy),
    "block": (lambda: _Block(explicit=True), _tokens, _lm_loss),
}


def _run(make_model, make_batch, loss_fn, opt_name, mode, steps=20):
    torch.manual_seed(0)
    model = make_model().to("tpu")
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    with torch_tpu.fused(mode == "fused"):
        for step in range(steps):
            x, y = make_batch(step % 2)
            opt.zero_grad()
            loss = loss_fn(model(x.to("tpu")), y.to("tpu"))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    return torch.stack([t.cpu() for t in losses]), [p.detach().cpu() for p in model.parameters()]


# The MLP runs by default; the CNN and the transformer block take 15-30 s
# each on the loaded 2-core host (-m slow).
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("model", ["mlp", pytest.param("cnn", marks=_SLOW),
                                   pytest.param("block", marks=_SLOW)])
def test_training_matches_strict(model, opt):
    recorded = fused.STATS.recorded
    ls, ps = _run(*_MODELS[model], opt, "strict")
    assert fused.STATS.recorded == recorded
    lf, pf = _run(*_MODELS[model], opt, "fused")
    assert fused.STATS.recorded > recorded + 20 * 10, "the steps were not recorded"
    # One program per step instead of one per op; XLA may fuse across ops
    # (reductions reassociate), hence OpInfo's float32 tolerance, not equality.
    torch.testing.assert_close(lf, ls, rtol=1.3e-6, atol=1e-5)
    if opt == "sgd":
        # (Not for AdamW: parameters whose gradient is zero up to rounding, a
        # bias before BatchNorm, take +-lr steps on the sign of the rounding
        # noise; tests/test_ops_nn.py's CPU parity skips them likewise.)
        for f, s in zip(pf, ps):
            torch.testing.assert_close(f, s, rtol=1e-5, atol=1e-5)
    assert ls[-1] < ls[0]


def test_program_count_is_bounded_over_100_steps():
    model = _mlp().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    make = _batch((8, 16), 5)
    batches = [tuple(t.to("tpu") for t in make(i)) for i in range(2)]
    counts = []
    with torch_tpu.fused():
        for step in range(100):
            x, y = batches[step % 2]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if step % 10 == 0:
                loss.item()  # a host read in some steps: a second trace shape
            counts.append(_fused_programs())
    # Warm after a few steps: every later step hits the cache.
    assert counts[-1] == counts[20], f"fused programs kept compiling: {counts[::10]}"
    assert counts[-1] - counts[0] <= 6


# --------------------------------------------------------------------------
# errors


def _checked_op():
    def host(x):
        if (x < 0).any():
            raise ValueError("negative input reached the checked op")
        return x

    @torch_tpu.jax_op(name="fused_checked")
    def checked(x):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    return checked


def test_error_is_raised_at_flush_naming_the_op():
    checked = _checked_op()
    good = torch.ones(4).to("tpu")
    bad = torch.tensor([1.0, -1.0, 2.0, 3.0]).to("tpu")
    (checked(good) * 2 + 1).cpu()  # every op's executable exists: no compile below
    with torch_tpu.fused():
        a = good + 1
        y = checked(bad) * 2 + 1  # recorded: nothing fails yet
        assert fused.pending() == 4
        with pytest.raises(RuntimeError, match=r"(?s)torch_tpu_jax\.fused_checked.*negative input"):
            y.cpu()
        # Every value of the failed trace raises the same error when read.
        with pytest.raises(RuntimeError, match=r"fused_checked"):
            a.cpu()
        # The mode goes on with a fresh trace.
        z = good * 3
        assert torch.equal(z.cpu(), torch.full((4,), 3.0))


# --------------------------------------------------------------------------
# the environment variable, and the fused program through the disk cache


# Three SGD steps of a Linear layer: run in a process with TORCH_TPU_EAGER=fused
# and, for the reference, here in strict mode.
_TRAIN = textwrap.dedent("""
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(16, 8).to("tpu")
    for _ in range(3):
        opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
""")

_SCRIPT = textwrap.dedent("""
    import torch, torch_tpu
    from torch_tpu.runtime import fused, programs
    assert fused.enabled()
""") + _TRAIN + textwrap.dedent("""
    print("LOSS", repr(loss.item()))
    print("RECORDED", fused.STATS.recorded)
    print("DISK", programs.STATS.disk_loads)
""")


def _env_run(cache):
    env = dict(os.environ, TORCH_TPU_EAGER="fused", TORCH_TPU_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def test_env_var_turns_fused_on_cold_and_warm_cache(tmp_path):
    cold = _env_run(tmp_path)
    warm = _env_run(tmp_path)
    assert int(cold["RECORDED"]) > 0
    assert cold["LOSS"] == warm["LOSS"]
    assert int(warm["DISK"]) > 0  # the second process loaded, not compiled
    want = _strict_loss()
    assert float(cold["LOSS"]) == want


def _strict_loss():
    ns = {"torch": torch}
    exec(_TRAIN, ns)
    return ns["loss"].item()


def test_env_var_values(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_EAGER", "lazy")
    with pytest.warns(UserWarning, match="TORCH_TPU_EAGER='lazy' is not a mode"):
        fused._from_env()
    assert not fused.enabled()
    monkeypatch.setenv("TORCH_TPU_EAGER", "fused")
    base = torch.ones(2, device="tpu")
    try:
        fused._from_env()
        assert fused.enabled()
        x = base * 2
        assert fused.pending() == 1
    finally:
        fused.set_default(False)  # flushes
    assert not fused.enabled() and fused.pending() == 0
    assert torch.equal(x.cpu(), torch.full((2,), 2.0))


def test_backward_pass_starts_its_own_program():
    """The forward pass runs while the backward pass is recorded: the first
    op of a backward pass flushes the ops recorded outside one; the backward
    pass and the optimizer step are one program (its donations need the
    forward program's reads done, not the backward's)."""
    torch.manual_seed(0)
    m = nn.Linear(8, 8).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, 8, device="tpu")
    with torch_tpu.fused():
        loss = m(x).square().mean()
        assert fused.pending() > 0
        flushes = fused.STATS.flushes
        loss.backward()
        assert fused.STATS.flushes == flushes + 1  # the forward pass, at the backward's start
        assert fused.pending() > 0  # the backward pass, recorded
        opt.step()
        assert fused.STATS.flushes == flushes + 2 and fused.pending() == 0
    torch.manual_seed(0)
    ref = nn.Linear(8, 8)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(x.cpu()).square().mean().backward()
    ref_opt.step()
    assert torch.allclose(m.weight.detach().cpu(), ref.weight.detach(), atol=1e-6)


def test_ops_first_seen_in_fused_mode_compile_only_the_fused_program():
    """A cold fused step compiles the fused program, not each op's own one
    too (fused.LazyExecutable); a later strict call of such an op compiles
    it then and gives the fused values."""
    x = torch.randn(3, 11, 17).to("tpu")  # shapes no other test uses
    counts = programs.STATS.compiles_per_op
    before = counts["aten.atan2.default"]
    fused_before = _fused_programs()
    with torch_tpu.fused():
        y = torch.atan2(x, x.abs() + 0.5)
    got = y.cpu()
    assert _fused_programs() == fused_before + 1
    assert counts["aten.atan2.default"] == before  # lowered, not compiled
    want = torch.atan2(x, x.abs() + 0.5)  # strict: compiled now
    assert counts["aten.atan2.default"] == before + 1
    assert torch.equal(got, want.cpu())
    assert torch.equal(torch.atan2(x, x.abs() + 0.5).cpu(), got)  # and hit from then on
    assert counts["aten.atan2.default"] == before + 1
