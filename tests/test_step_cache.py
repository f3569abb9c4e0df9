"""compile_step's traced graphs in the cache directory (torch_tpu.compile.persist.steps).

In-process (fast): the key follows the code and values the step reads (a
closure constant, a global, a helper function's body, a hyperparameter,
shapes) and not the parameters' values; the JSON form of a traced graph
rebuilds the same graph; small captured constants travel with it, a
large one keeps the graph from being stored. New processes on one cache directory: a cold process traces and
writes, a warm one rebuilds the graph without tracing (counted by
``step.traces``/``step.loads``, not by timing) and gets the same losses;
a changed function body, hyperparameter or batch shape traces again; a
corrupted entry and a group-writable directory are ignored with one warning.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu.compile.persist import steps

# -- in-process ------------------------------------------------------------------


def _key_of(step_fn, model, opt, x, y):
    s = torch_tpu.compile_step(step_fn, modules=model, optimizers=opt)
    params, buffers, states = s._state()
    flat, spec = torch.utils._pytree.tree_flatten(((x, y), {}))
    local = s._key(params, buffers, states, flat, spec)
    real = [*params, *buffers, *(t[3] for t in states), *flat]
    return steps.step_key(s.fn, s.modules, s.optimizers, s.options, real, local)


def _setup(lr=0.1, batch=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return model, opt, torch.randn(batch, 8), torch.randn(batch, 2)


def _make_step(model, opt, scale):
    def step(x, y):
        loss = F.mse_loss(model(x), y) * scale
        loss.backward()
        opt.step()
        return loss
    return step


SHIFT = 0.0


def _helper(t):
    return t + SHIFT


def _step_with_helper(model, opt):
    def step(x, y):
        loss = F.mse_loss(_helper(model(x)), y)
        loss.backward()
        opt.step()
        return loss
    return step


def test_key_follows_code_values_and_shapes(monkeypatch):
    model, opt, x, y = _setup()
    base = _key_of(_make_step(model, opt, 1.0), model, opt, x, y)
    # The same code and values in other objects: the same key (parameter
    # values are inputs, not part of it).
    m2, o2, x2, y2 = _setup()
    with torch.no_grad():
        m2[0].weight.add_(1.0)
    assert _key_of(_make_step(m2, o2, 1.0), m2, o2, x2, y2) == base
    # A closure constant, a hyperparameter, a shape.
    assert _key_of(_make_step(model, opt, 2.0), model, opt, x, y) != base
    m3, o3, x3, y3 = _setup(lr=0.2)
    assert _key_of(_make_step(m3, o3, 1.0), m3, o3, x3, y3) != base
    m4, o4, x4, y4 = _setup(batch=6)
    assert _key_of(_make_step(m4, o4, 1.0), m4, o4, x4, y4) != base
    # A global a helper reads, and the helper's body.
    k0 = _key_of(_step_with_helper(model, opt), model, opt, x, y)
    monkeypatch.setattr(sys.modules[__name__], "SHIFT", 1.0)
    k1 = _key_of(_step_with_helper(model, opt), model, opt, x, y)
    assert k1 != k0
    monkeypatch.setattr(sys.modules[__name__], "_helper", lambda t: t * 2)
    assert _key_of(_step_with_helper(model, opt), model, opt, x, y) not in (k0, k1)


def test_key_follows_module_attributes():
    model, opt, x, y = _setup()
    base = _key_of(_make_step(model, opt, 1.0), model, opt, x, y)
    model[1].inplace = True
    assert _key_of(_make_step(model, opt, 1.0), model, opt, x, y) != base


def test_json_form_rebuilds_the_same_graph(cache_dir):
    # cache_dir: a private, empty disk tier, so the step is traced here (counted below)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(4, 8).to("tpu"), torch.randn(4, 2).to("tpu")
    s = torch_tpu.compile_step(_make_step(model, opt, 1.0), modules=model, optimizers=opt)
    s(x, y)
    s(x, y)
    assert s.traces == 2 and len(s.graphs) == 2
    for graph, layout, arg_pos, n_grads in s.graphs.values():
        entry = json.loads(json.dumps(steps.encode(graph.gm, layout, arg_pos, n_grads)))
        gm, layout2, arg_pos2, n_grads2 = steps.decode(entry)
        assert gm.code == graph.gm.code
        assert (layout2["new_states"], arg_pos2, n_grads2) == \
            (layout["new_states"], arg_pos, n_grads)
        assert layout2["out"][0] == layout["out"][0]
        for a, b in zip(gm.graph.nodes, graph.gm.graph.nodes):
            va, vb = a.meta.get("val"), b.meta.get("val")
            if isinstance(vb, torch.Tensor):
                assert (va.shape, va.stride(), va.dtype, va.device) == \
                    (vb.shape, vb.stride(), vb.dtype, vb.device)


def test_captured_constants_small_stored_large_refused():
    def gm_with(const):
        g = torch.fx.Graph()
        a = g.placeholder("a")
        c = g.get_attr("_tensor_constant0")
        g.output((g.call_function(torch.ops.aten.add.Tensor, (a, c)),))
        return torch.fx.GraphModule({"_tensor_constant0": const}, g)

    layout = {"out": (1, torch.utils._pytree.tree_flatten((0,))[1]), "new_states": []}
    small = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    entry = json.loads(json.dumps(steps.encode(gm_with(small), layout, [0], 0)))
    gm, *_ = steps.decode(entry)
    back = gm._tensor_constant0
    assert back.dtype == torch.bfloat16 and torch.equal(back, small)
    with pytest.raises(steps.Unkeyable, match="elements"):
        steps.encode(gm_with(torch.zeros(steps._MAX_CONST + 1)), layout, [0], 0)


# -- new processes ---------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch_tpu
    import torch.nn.functional as F

    torch.manual_seed(0)
    BATCH = int(os.environ.get("T_BATCH", "8"))
    LR = float(os.environ.get("T_LR", "0.1"))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 16, generator=g).to("tpu")
    y = torch.randn(BATCH, 4, generator=g).to("tpu")

    @torch_tpu.compile_step
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y) * SCALE
        loss.backward()
        opt.step()
        return loss

    losses = [step(x, y).item() for _ in range(3)]
    w = model[0].weight.cpu().flatten()[:8].tolist()
    print(json.dumps({"traces": step.traces, "loads": step.loads, "losses": losses, "w": w}))
""")


def _run(tmp_path, cache, scale="1.0", **env_extra):
    script = tmp_path / f"train_{scale.replace('.', '_')}.py"
    script.write_text(_SCRIPT.replace("SCALE", scale))
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache), TORCH_TPU_STEP_CACHE="1",
               **env_extra)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _cold(tmp_path):
    cache = tmp_path / "cache"
    cold, _ = _run(tmp_path, cache)
    # Momentum buffers appear after the first step: two signatures, two graphs.
    assert (cold["traces"], cold["loads"]) == (2, 0), cold
    entries = [f for f in os.listdir(cache / "torch-v1") if f.endswith(".tpk")]
    assert len(entries) == 2, entries
    return cache, cold


def test_warm_process_skips_the_trace(tmp_path):
    cache, cold = _cold(tmp_path)
    warm, err = _run(tmp_path, cache)
    assert (warm["traces"], warm["loads"]) == (0, 2), warm
    assert warm["losses"] == pytest.approx(cold["losses"], rel=1e-6)
    assert warm["w"] == pytest.approx(cold["w"], rel=1e-6)
    assert "CacheWarning" not in err, err[-2000:]
    # And eager CPU agrees.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    ref = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        ref.append(loss.item())
    assert warm["losses"] == pytest.approx(ref, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_changed_body_hyperparameter_or_shape_traces_again(tmp_path):
    cache, cold = _cold(tmp_path)
    body, _ = _run(tmp_path, cache, scale="2.0")
    assert body["traces"] == 2 and body["loads"] == 0, body
    assert body["losses"][0] == pytest.approx(2 * cold["losses"][0], rel=1e-5)
    lr, _ = _run(tmp_path, cache, T_LR="0.05")
    assert lr["traces"] == 2 and lr["loads"] == 0, lr
    shape, _ = _run(tmp_path, cache, T_BATCH="6")
    assert shape["traces"] == 2 and shape["loads"] == 0, shape


@pytest.mark.slow
def test_corrupted_entry_warns_and_traces(tmp_path):
    cache, cold = _cold(tmp_path)
    for f in os.listdir(cache / "torch-v1"):
        p = cache / "torch-v1" / f
        blob = bytearray(p.read_bytes())
        blob[-20] ^= 0xFF
        p.write_bytes(bytes(blob))
    warm, err = _run(tmp_path, cache)
    assert (warm["traces"], warm["loads"]) == (2, 0), warm
    assert err.count("ignored the PyTorch compile artifact") == 1, err[-2000:]
    assert warm["losses"] == pytest.approx(cold["losses"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_group_writable_directory_warns_and_traces(tmp_path):
    cache, cold = _cold(tmp_path)
    os.chmod(cache, 0o770)
    warm, err = _run(tmp_path, cache)
    assert (warm["traces"], warm["loads"]) == (2, 0), warm
    # every tier refused at the backend's first use (cache.trust), one warning naming why
    assert "compile cache: cannot use" in err and "writable by other users" in err, err[-2000:]
    assert err.count("writable by other users") == 1, err[-2000:]
    assert warm["losses"] == pytest.approx(cold["losses"], rel=1e-6)


def test_unusable_entry_warns_and_traces(tmp_path, monkeypatch):
    """An entry that passes the store's checks but cannot be rebuilt here (an
    op this torch lacks) is ignored with one warning, removed, and traced."""
    import torch_tpu.cache as cache
    from torch_tpu.compile.persist import artifacts
    from torch_tpu.cache import store as _store

    monkeypatch.setattr(_store, "_warned", set())
    steps.save()   # earlier tests' steps, into their directory
    old = cache.cache_dir()
    cache.set_dir(str(tmp_path / "c"))
    try:
        model, opt, x, y = _setup()
        model.to("tpu")
        x, y = x.to("tpu"), y.to("tpu")
        s1 = torch_tpu.compile_step(_make_step(model, opt, 1.0), modules=model, optimizers=opt)
        ref = s1(x, y).item()
        assert steps.save() == 1
        # A second step object on an identical model: the same key.
        model2, opt2, _, _ = _setup()
        model2.to("tpu")
        s2 = torch_tpu.compile_step(_make_step(model2, opt2, 1.0), modules=model2,
                                    optimizers=opt2)
        params, buffers, states = s2._state()
        flat, spec = torch.utils._pytree.tree_flatten(((x, y), {}))
        skey = steps.step_key(s2.fn, s2.modules, s2.optimizers, s2.options,
                              [*params, *buffers, *flat],
                              s2._key(params, buffers, states, flat, spec))
        store = artifacts.artifact_store()
        entry = json.loads(store.get(skey))
        # Rewritten through the store (a valid checksum) with an unknown op.
        entry["nodes"][-2]["target"] = "op:aten::no_such_op.default"
        assert store.put(skey, json.dumps(entry).encode())
        with pytest.warns(_store.CacheWarning, match="ignored a stored compile_step"):
            got = s2(x, y).item()
        assert (s2.traces, s2.loads) == (1, 0)
        assert got == pytest.approx(ref, rel=1e-6)
        assert store.get(skey) is None   # removed; written again at exit
    finally:
        cache.set_dir(old)


@pytest.mark.slow
def test_two_cold_processes_at_once_then_warm(tmp_path):
    """Two processes filling one directory at once both succeed (entries are
    replaced atomically); a third one rebuilds both graphs."""
    script = tmp_path / "train_1_0.py"
    script.write_text(_SCRIPT.replace("SCALE", "1.0"))
    cache = tmp_path / "cache"
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache), TORCH_TPU_STEP_CACHE="1")
    procs = [subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "CacheWarning" not in err, err[-2000:]
    runs = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    warm, _ = _run(tmp_path, cache)
    assert (warm["traces"], warm["loads"]) == (0, 2), warm
    assert runs[0]["losses"] == runs[1]["losses"] == pytest.approx(warm["losses"], rel=1e-6)
