"""Fused eager mode gives the fused program the buffers only its trace still
holds (donation, runtime/fused._donatable): an optimizer step updates
parameters and state in place instead of allocating and copying them.

Donation must never be seen: every tensor that still reaches an old value
(a copy sharing its array, a view, an alias, a clone, a value saved for
autograd) reads what strict mode gives, cold and warm (a new process on the
same TORCH_TPU_CACHE_DIR, where the donating program is loaded from disk).
"""

import os
import subprocess
import sys
import textwrap
import warnings

import torch

import torch_tpu
from torch_tpu.runtime import fused


def _adamw_steps(mode, steps=3, keep=None):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    m = m.to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(8, 16).to("tpu")
    losses = []
    for i in range(steps):
        if keep is not None and i == steps - 1:
            keep(m)
        with torch_tpu.fused(mode):
            loss = m(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    return m, opt, losses


def test_optimizer_step_donates_and_matches_strict():
    m_ref, opt_ref, want = _adamw_steps(False)
    before = fused.STATS.donated
    m, opt, got = _adamw_steps(True)
    # From the second step on: each parameter and its exp_avg, exp_avg_sq.
    assert fused.STATS.donated - before >= 3 * 4
    assert got == want
    for p, q in zip(m.parameters(), m_ref.parameters()):
        assert torch.equal(p.cpu(), q.cpu())
        assert torch.equal(opt.state[p]["exp_avg_sq"].cpu(), opt_ref.state[q]["exp_avg_sq"].cpu())
    # A parameter read after the step, and stepped again in strict mode.
    w = m[0].weight
    assert torch.equal((w * 2).cpu(), (m_ref[0].weight * 2).cpu())


def test_tensors_reaching_old_values_keep_them():
    """Before the last step the user keeps: copies sharing the weight's array
    object (`.to(copy=True)`, `new_tensor`), a clone, a view, an alias and a
    value saved by autograd. None of them may lose its value to the
    fused program's donation; the views and aliases see the update."""
    kept = {}

    def keep(m):
        w = m[0].weight
        shared = torch.empty(w.shape, device="tpu")
        shared.copy_(w.detach())
        kept["shared"] = shared
        kept["clone"] = w.detach().clone()
        # Copies that share the weight's array object (arrays are immutable):
        # the old weight buffer is still theirs after the step.
        kept["to_copy"] = w.detach().to("tpu", copy=True)
        with warnings.catch_warnings():  # PyTorch's advice to use clone()
            warnings.simplefilter("ignore", UserWarning)
            kept["new_tensor"] = w.new_tensor(w.detach())
        kept["view"] = w.detach()[1:3, ::2]
        kept["alias"] = w.data
        leaf = torch.ones(w.shape, device="tpu", requires_grad=True)
        kept["leaf"] = leaf
        kept["graph"] = (leaf * w.detach()).sum()  # saves w's storage for backward

    m_ref, _, _ = _adamw_steps(False, keep=keep)
    want = {k: v.detach().cpu() for k, v in kept.items()}
    kept["graph"].backward()
    want["grad"] = kept["leaf"].grad.cpu()
    kept.clear()
    m, _, _ = _adamw_steps(True, keep=keep)
    got = {k: v.detach().cpu() for k, v in kept.items()}
    kept["graph"].backward()
    got["grad"] = kept["leaf"].grad.cpu()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # The view and the alias follow the parameter; the copies do not.
    assert torch.equal(got["alias"], m[0].weight.detach().cpu())
    for k in ("clone", "to_copy", "new_tensor", "shared"):
        assert not torch.equal(got[k], got["alias"]), k


def test_donation_off_by_env(monkeypatch):
    monkeypatch.setattr(fused, "_DONATE", False)
    _, _, want = _adamw_steps(False)
    before = fused.STATS.donated
    _, _, got = _adamw_steps(True)
    assert fused.STATS.donated == before
    assert got == want


def test_no_donation_of_a_buffer_the_user_holds():
    """An input only read (not written) and still held is never donated."""
    x = torch.randn(32, 32, device="tpu")
    before = fused.STATS.donated
    with torch_tpu.fused():
        y = (x * 2 + 1).sin()
    assert fused.STATS.donated == before
    assert torch.equal(y.cpu(), (x * 2 + 1).sin().cpu())
    assert torch.equal(x.cpu(), x.cpu())


_SCRIPT = textwrap.dedent("""
    import torch, torch_tpu
    from torch_tpu.runtime import fused, programs
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    x = torch.randn(16, 8).to("tpu")
    view = m.weight.detach()[0]
    for _ in range(4):
        with torch_tpu.fused(MODE):
            opt.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
    print("LOSS", repr(loss.item()))
    print("W", repr(m.weight.detach().cpu().flatten().tolist()))
    print("VIEW", repr(view.cpu().tolist()))
    print("DONATED", fused.STATS.donated)
    print("DISK", programs.STATS.disk_loads)
""")


def _run(cache, mode):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache))
    env.pop("TORCH_TPU_EAGER", None)
    out = subprocess.run([sys.executable, "-c", _SCRIPT.replace("MODE", mode)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def test_donating_program_cold_and_warm_cache(tmp_path):
    strict = _run(tmp_path / "strict", "False")
    cold = _run(tmp_path / "fused", "True")
    warm = _run(tmp_path / "fused", "True")
    assert int(cold["DONATED"]) > 0 and int(warm["DONATED"]) > 0
    assert int(warm["DISK"]) > 0  # the donating program came from the cache dir
    for k in ("LOSS", "W", "VIEW"):
        assert cold[k] == strict[k] == warm[k], k
