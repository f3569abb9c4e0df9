"""TORCH_TPU_PRECOMPILE: PyTorch's compile artifacts in the cache directory.

The store's rules are checked in-process (fast): trusted round trip, a
group-writable directory refused with one warning, an entry file another
user could change, corrupted, truncated and stale entries ignored with one
warning. The whole path runs in new processes sharing one cache directory
(slow): a cold process, a warm one that neither traces nor runs AOTAutograd
and gets the same results, two cold processes at once, and a warm process
after the artifacts were corrupted.
"""

import enum
import json
import os
import stat
import struct
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
import torch

from torch_tpu.compile.persist import artifacts
from torch_tpu.cache import store as _store


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees the store's one-per-process warnings again."""
    monkeypatch.setattr(_store, "_warned", set())


def _private(path):
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return str(path)


def _cache_warnings(record):
    return [w for w in record if issubclass(w.category, _store.CacheWarning)]


def test_round_trip_in_a_private_directory(tmp_path, fresh_warnings):
    root = _private(tmp_path / "c")
    s = artifacts.ArtifactStore(root)
    assert s.usable and s.writable
    assert s.put("dynamo:k", b"payload")
    assert s.get("dynamo:k") == b"payload"
    assert s.get("dynamo:other") is None
    st = os.stat(s.file_for("dynamo:k"))
    assert not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    # A second store on the same directory (a new process) reads it.
    assert artifacts.ArtifactStore(root).get("dynamo:k") == b"payload"


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_group_writable_directory_is_refused_with_one_warning(tmp_path, fresh_warnings):
    root = _private(tmp_path / "c")
    artifacts.ArtifactStore(root).put("dynamo:k", b"payload")
    os.chmod(root, 0o770)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        s = artifacts.ArtifactStore(root)
        s2 = artifacts.ArtifactStore(root)
    assert not s.usable and not s2.usable
    assert s.problem == "writable by other users"
    assert s.get("dynamo:k") is None
    assert not s.put("dynamo:k2", b"x")
    msgs = [str(w.message) for w in _cache_warnings(record)]
    assert len(msgs) == 1 and "writable by other users" in msgs[0], msgs


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_group_writable_entry_is_ignored(tmp_path, fresh_warnings):
    root = _private(tmp_path / "c")
    s = artifacts.ArtifactStore(root)
    s.put("dynamo:k", b"payload")
    os.chmod(s.file_for("dynamo:k"), 0o660)
    with pytest.warns(_store.CacheWarning, match="writable by other users"):
        assert s.get("dynamo:k") is None


def _rewrite_header(path, **changes):
    blob = open(path, "rb").read()
    start = len(artifacts.MAGIC) + 4
    (hlen,) = struct.unpack(">I", blob[len(artifacts.MAGIC):start])
    header = json.loads(blob[start:start + hlen])
    header.update(changes)
    hbytes = json.dumps(header, sort_keys=True).encode()
    with open(path, "wb") as f:
        f.write(artifacts.MAGIC + struct.pack(">I", len(hbytes)) + hbytes
                + blob[start + hlen:])


@pytest.mark.parametrize("damage, reason", [
    ("flip", "checksum mismatch"),
    ("truncate", "truncated payload"),
    ("cut_header", "truncated header"),
    ("garbage", "not a torch_tpu artifact"),
    ("stale_torch", "stale: written by another torch"),
    ("stale_source", "stale: written by another torch_tpu_source"),
])
def test_bad_entries_are_ignored_with_one_warning(tmp_path, fresh_warnings, damage, reason):
    root = _private(tmp_path / "c")
    s = artifacts.ArtifactStore(root)
    payload = b"x" * 1000
    s.put("dynamo:k", payload)
    path = s.file_for("dynamo:k")
    blob = open(path, "rb").read()
    if damage == "flip":
        blob = blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:]
        open(path, "wb").write(blob)
    elif damage == "truncate":
        open(path, "wb").write(blob[:-100])
    elif damage == "cut_header":
        open(path, "wb").write(blob[:20])
    elif damage == "garbage":
        open(path, "wb").write(b"\x80\x04not ours at all")
    elif damage == "stale_torch":
        _rewrite_header(path, torch="1.0.0")
    else:
        _rewrite_header(path, torch_tpu_source="0" * 64)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert s.get("dynamo:k") is None
        assert s.get("dynamo:k") is None  # removed: a plain miss now
    msgs = [str(w.message) for w in _cache_warnings(record)]
    assert len(msgs) == 1 and reason in msgs[0], msgs
    assert not os.path.exists(path)
    # Rewritten, it is used again.
    s.put("dynamo:k", payload)
    assert s.get("dynamo:k") == payload


def test_on_by_default_with_a_disk_tier(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_TPU_PRECOMPILE", raising=False)
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path))
    assert artifacts.enabled()
    for off in ("0", "off", "No"):
        monkeypatch.setenv("TORCH_TPU_PRECOMPILE", off)
        assert not artifacts.enabled()
    monkeypatch.setenv("TORCH_TPU_PRECOMPILE", "1")
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", "")
    assert not artifacts.enabled()  # no disk tier, nowhere to keep them


# -- whole processes ------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, warnings
    # the cache directory is checked at the backend's first use (the first .to("tpu"))
    early = warnings.catch_warnings(record=True)
    early_record = early.__enter__()
    warnings.simplefilter("always")
    import torch, torch_tpu
    import torch.nn.functional as F
    from torch._dynamo.utils import counters
    from torch_tpu.compile.persist import artifacts

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 32).to("tpu")
    y = torch.randn(8, 4).to("tpu")

    def forward_loss(x, y):
        return F.mse_loss(model(x), y)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss_fn = torch.compile(forward_loss, backend="tpu")
        from torch_tpu.compile.persist import _output_code
        paired = len(_output_code._UNBUILT)  # loaded backward graphs, each paired
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = loss_fn(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    print(json.dumps({
        "losses": losses,
        "captured": counters["stats"]["calls_captured"],
        "aot": counters["aot_autograd"]["total"],
        "paired": paired, "unbuilt": len(_output_code._UNBUILT),
        "stats": artifacts.stats(),
        "warnings": [str(w.message) for w in early_record + record
                     if "compile artifact" in str(w.message)
                     or "PyTorch compile" in str(w.message)
                     or "compile cache" in str(w.message)],
    }))
""")


def _run(cache_dir, background=False, code=_CHILD, **more_env):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir, **more_env)
    env.pop("TORCH_TPU_PRECOMPILE", None)  # on by default
    argv = [sys.executable, "-c", code]
    if background:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _entries(cache_dir):
    path = os.path.join(cache_dir, artifacts.SUBDIR)
    return [os.path.join(path, n) for n in os.listdir(path) if n.endswith(artifacts.SUFFIX)]


@pytest.mark.slow
def test_cold_then_warm_process_skips_dynamo_and_aot(tmp_path):
    d = _private(tmp_path / "c")
    # Two cold processes warming the directory at once: both succeed.
    procs = [_run(d, background=True) for _ in range(2)]
    colds = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        colds.append(json.loads(out.strip().splitlines()[-1]))
    for cold in colds:
        assert cold["captured"] > 0 and cold["aot"] > 0
        assert cold["stats"]["hits"] == 0
    assert colds[0]["losses"] == colds[1]["losses"]
    assert _entries(d)

    warm = _run(d)
    assert warm["stats"]["hits"] == 1, warm
    assert warm["captured"] == 0, warm  # dynamo traced nothing
    assert warm["aot"] == 0, warm       # nor did AOTAutograd run
    assert warm["losses"] == colds[0]["losses"]
    assert warm["warnings"] == []
    # The backward graph was rebuilt with the forward, at its first call.
    assert warm["paired"] == 1 and warm["unbuilt"] == 0, warm

    # Corrupted entries: one warning, traced again, the same results.
    for path in _entries(d):
        blob = open(path, "rb").read()
        open(path, "wb").write(blob[:-64] + bytes(64))
    bad = _run(d)
    assert bad["captured"] > 0 and bad["stats"]["hits"] == 0
    assert bad["losses"] == colds[0]["losses"]
    assert len(bad["warnings"]) == 1 and "checksum mismatch" in bad["warnings"][0], bad

    # The directory made group-writable: no tier used (cache.trust), one warning naming why.
    os.chmod(d, 0o770)
    refused = _run(d)
    assert refused["stats"]["enabled"] is False
    assert refused["captured"] > 0 and refused["losses"] == colds[0]["losses"]
    assert len(refused["warnings"]) == 1
    assert "writable by other users" in refused["warnings"][0], refused


def test_clear_removes_the_packages(tmp_path, fresh_warnings):
    root = _private(tmp_path / "c")
    s = artifacts.ArtifactStore(root)
    s.put("dynamo:k", b"payload")
    assert _store.DiskStore(root, shared=None).clear() >= 1
    assert s.get("dynamo:k") is None
    assert os.listdir(os.path.join(root, artifacts.SUBDIR)) == []


def test_a_graph_that_cannot_be_pickled_runs_and_is_not_saved():
    import pickle

    from torch_tpu.compile.persist._output_code import TpuOutputCode

    class Graph:
        gm = staticmethod(lambda: None)  # not picklable
        kind, options, n_user_outputs = "forward", {}, 1

        def __call__(self, inputs):
            return ["ran", *inputs]

    code = TpuOutputCode(Graph(), TpuOutputCode.freeze(Graph.gm))
    assert code([1]) == ["ran", 1]
    with pytest.raises(pickle.PicklingError, match="not serializable"):
        pickle.dumps(code)


# Each fix in artifacts._patch, in one script run cold then warm: guards
# on the user's objects stay live and are packaged (another function or
# module argument, a rebound global: PyTorch's caching precompile dropped
# them, and the first graph ran for all), a global function that is another
# one in the warm process (its graph must not run there), a frame traced
# beside loaded ones in one module (dynamo's global names), `backward()`
# inside a compiled function (JAX's generated code under a graph break), a
# training step whose tensors carry `.grad` (PyTorch's `_Missing`
# placeholder), and `torch._dynamo.explain` (another backend: never handed a
# tpu package).
_SEMANTICS = textwrap.dedent("""
    import json, warnings
    import torch, torch_tpu
    from torch_tpu.compile.persist import artifacts

    def act(x):
        return x.relu()

    def through_global(x):
        return act(x) * 2

    def helper(x):
        return x.sin()

    def through_helper(x):  # compiled with PyTorch's filter that drops guards on globals
        return helper(x) - 1

    def through_arg(x, fn):
        return fn(x) + 1

    import os
    if os.environ.get("VARIANT") == "warm":  # another function by the same name
        def edited(x):
            return x.cos()
    else:
        def edited(x):
            return x.sin()

    def through_edited(x):
        return edited(x) + 3

    def spectrum(a):  # its backward has an effect token (effects.hoist rewrites the graph)
        return torch.linalg.eigvals(a).real

    def through_module(x, mod):
        return mod(x)

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step_with_backward(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss

    def with_break(x):
        y = x.sin()
        print("", end="")
        return y.cos()

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        x = torch.randn(8).to("tpu")
        xc = x.cpu()
        g = torch.compile(through_global, backend="tpu")
        f = torch.compile(through_arg, backend="tpu")
        h = torch.compile(through_module, backend="tpu")
        ok = [torch.allclose(f(x, torch.relu).cpu(), xc.relu() + 1),
              torch.allclose(f(x, torch.tanh).cpu(), xc.tanh() + 1),
              torch.allclose(g(x).cpu(), xc.relu() * 2)]
        def act(x):  # noqa: F811  rebinding the global through_global calls
            return x.tanh()
        ok.append(torch.allclose(g(x).cpu(), xc.tanh() * 2))
        want = xc.cos() if os.environ.get("VARIANT") == "warm" else xc.sin()
        ok.append(torch.allclose(torch.compile(through_edited, backend="tpu")(x).cpu(), want + 3))
        m = torch.randn(4, 4)
        m = m @ m.T + 4 * torch.eye(4)
        mc, mt = m.clone().requires_grad_(), m.to("tpu").requires_grad_()
        spectrum(mc).sum().backward()
        torch.compile(spectrum, backend="tpu")(mt).sum().backward()
        ok.append(torch.allclose(mt.grad.cpu(), mc.grad, atol=1e-3))
        ok.append(torch.allclose(h(x, torch.nn.ReLU()).cpu(), xc.relu()))
        ok.append(torch.allclose(h(x, torch.nn.Tanh()).cpu(), xc.tanh()))
        unsafe = {"guard_filter_fn": torch.compiler.skip_guard_on_globals_unsafe}
        ok.append(torch.allclose(
            torch.compile(through_helper, backend="tpu", options=unsafe)(x).cpu(), xc.sin() - 1))
        s = torch.compile(step_with_backward, backend="tpu")
        xs = torch.randn(8, 16).to("tpu")
        losses = []
        for _ in range(3):
            losses.append(s(xs).item())
            opt.step()
            opt.zero_grad()
        breaks = torch._dynamo.explain(with_break)(x).graph_break_count
    print(json.dumps({"ok": ok, "losses": losses, "breaks": breaks,
                      "stats": artifacts.stats(),
                      "warnings": [str(w.message) for w in record
                                   if "compile artifact" in str(w.message)
                                   or "PyTorch compile" in str(w.message)]}))
""")


@pytest.mark.slow
def test_guards_and_graph_breaks_hold_cold_and_warm(tmp_path):
    d = _private(tmp_path / "c")
    runs = [_run(d, code=_SEMANTICS, VARIANT=variant) for variant in ("cold", "warm")]
    cold, warm = runs
    for r in runs:
        assert r["ok"] == [True] * 9, r
        assert r["breaks"] == 1, r
        assert r["warnings"] == [], r
    assert warm["losses"] == cold["losses"]
    assert cold["stats"]["hits"] == 0
    # All seven loaded, guards on the user's global functions included; in
    # through_edited's package the graph of the other `edited` never runs (its
    # fingerprint differs), and the function is traced again for this one.
    assert warm["stats"]["hits"] == 7, warm
    assert warm["stats"]["rejected"] == 0, warm


# -- identity guards and the backend check, in-process (fast) -------------------------


class Color(enum.Enum):
    RED = 1


def module_level(x):
    return x + 1


def test_identity_guards_are_kept_for_objects_found_by_name():
    import pickle

    import torch.nn.functional as F

    def local(x):
        return x

    named = [module_level, F.relu, torch.relu, torch.nn.Linear, enumerate, Color.RED,
             torch.Tensor.add]
    for value in named:
        ref = artifacts._by_name(value)
        assert ref is not None and pickle.loads(ref) is value, value
    for value in (local, lambda x: x, torch.nn.Linear(2, 2), object(), [1]):
        assert artifacts._by_name(value) is None, value

    # The fingerprint follows the code, not the name.
    def other(x):
        return x + 2

    same = types.FunctionType(module_level.__code__, globals(), "module_level")
    assert artifacts._fingerprint(same) == artifacts._fingerprint(module_level)
    assert artifacts._fingerprint(other) != artifacts._fingerprint(module_level)
    assert artifacts._fingerprint(torch.nn.Linear) != artifacts._fingerprint(torch.nn.Conv1d)


def test_a_guard_state_naming_a_changed_function_is_marked_stale(monkeypatch):
    import pickle

    class State:
        pass

    def load(blob):
        assert blob == b"inner"
        return State()

    ref = artifacts._by_name(module_level)
    good = artifacts._PINNED + pickle.dumps(([(ref, artifacts._fingerprint(module_level))],
                                             [], b"inner"))
    assert not hasattr(artifacts._load_guards_state(load, good), "_torch_tpu_stale")
    bad = artifacts._PINNED + pickle.dumps(([(ref, "another fingerprint")], [], b"inner"))
    assert artifacts._load_guards_state(load, bad)._torch_tpu_stale == "module_level"
    gone = artifacts._PINNED + pickle.dumps(([(b"not a pickle", "x")], [], b"inner"))
    assert hasattr(artifacts._load_guards_state(load, gone), "_torch_tpu_stale")
    # dynamo's own states (no pins) pass through
    assert isinstance(artifacts._load_guards_state(load, b"inner"), State)


def test_packages_are_for_the_tpu_backend_only():
    from types import SimpleNamespace

    from torch_tpu.compile import backend

    def wrapped(inner):  # dynamo's wrappers: CatchErrors -> ConvertFrame -> WrapBackendDebug
        return SimpleNamespace(_torchdynamo_orig_backend=SimpleNamespace(
            _torchdynamo_orig_backend=SimpleNamespace(compiler_fn=inner)))

    def eager(gm, example_inputs):
        return gm

    assert artifacts._tpu_backend(wrapped(backend.tpu_backend))
    assert not artifacts._tpu_backend(wrapped(eager))
    assert not artifacts._tpu_backend(None)


def test_other_backends_compile_as_without_torch_tpu():
    # PyTorch's switch is process-wide; here only tpu compiles are packaged.
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.package import CompilePackage
    from torch._dynamo.precompile_context import PrecompileContext

    def on_eager(x):
        return x.sin() + 1

    def on_tpu(x):
        return x.cos() + 1

    def looked_up():
        return artifacts.STATS.hits + artifacts.STATS.misses

    x = torch.randn(3)
    before = looked_up()
    assert torch.allclose(torch.compile(on_eager, backend="eager")(x), x.sin() + 1)
    assert not dynamo_config.caching_precompile
    assert CompilePackage.source_id_from_fn(on_eager) not in \
        PrecompileContext._dynamo_cache_entries
    assert looked_up() == before  # no package looked for
    assert torch.allclose(torch.compile(on_tpu, backend="tpu")(x.to("tpu")).cpu(), x.cos() + 1)
    assert not dynamo_config.caching_precompile
    assert looked_up() == before + 1  # its package: loaded (a warm cache) or recorded


def test_a_static_graphs_values_travel_as_plain_data():
    from torch._subclasses import FakeTensorMode

    from torch_tpu.compile.persist import _output_code as oc

    mode = FakeTensorMode()
    with mode:
        base = torch.empty(6, 4, device="tpu", requires_grad=True)
        vals = [base, base.t(), base[1:, 2:], torch.empty(0, 3), (torch.empty(2), 3), None,
                torch.tensor(1.5, dtype=torch.bfloat16)]
    for val in vals:
        back = oc._make(oc._describe(val), FakeTensorMode())
        for a, b in zip(val if isinstance(val, tuple) else [val],
                        back if isinstance(back, tuple) else [back]):
            if isinstance(a, torch.Tensor):
                assert (b.shape, b.stride(), b.storage_offset(), b.dtype, b.device,
                        b.requires_grad) == (a.shape, a.stride(), a.storage_offset(), a.dtype,
                                             a.device, a.requires_grad)
            else:
                assert a == b
    # a symbolic size is not plain data: GraphPickler keeps such graphs' values
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env):
        sym = torch.empty(shape_env.create_unbacked_symint(), 2)
    with pytest.raises(TypeError):
        oc._describe(sym)


def test_a_functions_fingerprint_is_the_same_in_another_process():
    # (string hashing differs by process: a set constant's order must not matter)
    code = ("from torch_tpu.compile.persist import artifacts\n"
            "def f(x):\n    return x in {'relu', 'gelu', 'tanh', 'silu'}\n"
            "print(artifacts._fingerprint(f))")
    prints = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONHASHSEED=str(seed)),
                             timeout=300).stdout.strip() for seed in (1, 2, 3)}
    assert len(prints) == 1 and len(prints.pop()) == 64


# -- functions defined in notebook cells (marimo) ---------------------------------------


def _cell_function(pid, source, cell="Abcd"):
    """A function compiled as marimo compiles a cell (its file named by the
    kernel's pid, its source in linecache)."""
    import linecache

    filename = f"/tmp/marimo_{pid}/__marimo__cell_{cell}_.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), scope)
    return scope["f"]


def test_a_cells_package_key_and_source_do_not_depend_on_the_kernel():
    from types import SimpleNamespace

    src = "import torch\n\ndef f(x):\n    return x * 2\n"
    here = _cell_function(os.getpid(), src)
    other = _cell_function(os.getpid() + 1, src)
    # The same cell in another kernel: the same key (the pid is not in it).
    assert artifacts._package_key("id", here.__code__) == \
        artifacts._package_key("id", other.__code__)
    # Another cell of the same code: another key.
    moved = _cell_function(os.getpid(), src, cell="Wxyz")
    assert artifacts._package_key("id", moved.__code__) != \
        artifacts._package_key("id", here.__code__)
    # The traced cell's source is recorded, under the other kernel's name too,
    # and found again in this process's file of that cell.
    cells = sorted(artifacts._cell_sources(SimpleNamespace(traced_code=[other.__code__])))
    assert len(cells) == 1 and cells[0][1] == 3
    assert artifacts._changed_cell(cells) is None
    # The cell edited here (a constant: the bytecode and the key stay the same).
    _cell_function(os.getpid(), src.replace("x * 2", "x * 3"))
    assert artifacts._package_key("id", here.__code__) == \
        artifacts._package_key("id", other.__code__)
    assert "line 3 of marimo:" in artifacts._changed_cell(cells)
    # A module's function is checked by dynamo (its inlined sources), not here.
    assert artifacts._cell_sources(SimpleNamespace(traced_code=[module_level.__code__])) == set()


_NOTEBOOK = '''
import marimo

app = marimo.App()


@app.cell
def _():
    import json
    import os

    import torch
    import torch_tpu
    from torch._dynamo.utils import counters
    from torch_tpu.compile.persist import artifacts

    return artifacts, counters, json, os, torch


@app.cell
def _():
    def helper(x):
        return x.cos() * HELPER

    return (helper,)


@app.cell
def _(artifacts, counters, helper, json, os, torch):
    def step(x):
        return (helper(x).sin() * SCALE + 1).sum()

    compiled = torch.compile(step, backend="tpu")
    x = torch.linspace(-1, 1, 8)
    got = compiled(x.to("tpu")).item()
    with open(os.environ["NOTEBOOK_RESULT"], "w") as out:
        json.dump({"got": got, "want": step(x).item(), "stats": artifacts.stats(),
                   "captured": counters["stats"]["calls_captured"]}, out)
    return


if __name__ == "__main__":
    app.run()
'''


def _run_notebook(tmp_path, cache, scale=2, helper=1):
    """The notebook above run whole by marimo in a new kernel (as `marimo
    edit` runs it: the kernel ends with os._exit, no atexit)."""
    nb = tmp_path / "compiled_in_a_cell.py"
    src = _NOTEBOOK.replace("HELPER", str(helper)).replace("SCALE", str(scale))
    nb.write_text(src)
    result = tmp_path / "result.json"
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache, NOTEBOOK_RESULT=str(result),
               PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("TORCH_TPU_PRECOMPILE", None)
    if result.exists():
        result.unlink()
    out = subprocess.run([sys.executable, "-m", "marimo", "export", "session",
                          "--force-overwrite", str(nb)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0 and result.exists(), out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(result.read_text())


@pytest.mark.slow
def test_a_function_defined_in_a_notebook_cell_starts_warm(tmp_path):
    pytest.importorskip("marimo")
    d = _private(tmp_path / "c")
    cold = _run_notebook(tmp_path, d)
    assert cold["stats"]["hits"] == 0 and cold["captured"] > 0
    assert _entries(d), "the kernel left no package in torch-v1"
    warm = _run_notebook(tmp_path, d)
    assert warm["stats"]["hits"] == 1 and warm["captured"] == 0, warm
    assert warm["got"] == pytest.approx(cold["got"], rel=1e-6)
    # An edited cell never runs the old graph: the package is loaded, its
    # graph is stale (the constant is in the cell's source, not in the key),
    # and the function is traced again.
    for edit in ({"scale": 3}, {"helper": 5}):
        edited = _run_notebook(tmp_path, d, **edit)
        assert edited["stats"]["hits"] == 1 and edited["captured"] > 0, (edit, edited)
        assert edited["got"] == pytest.approx(edited["want"], rel=1e-5), (edit, edited)
        assert edited["got"] != pytest.approx(cold["got"], rel=1e-3), (edit, edited)


def test_a_save_before_a_graph_is_recorded_leaves_the_package_unmarked(monkeypatch):
    # PyTorch's create_cache_entries marks bypassed, on the live package, a
    # code whose graph is not recorded yet, and a marked code records no graph
    # afterwards; save() runs after every compile now, so it puts them back.
    from types import SimpleNamespace

    from torch_tpu._compat import dynamo_api

    code = SimpleNamespace(bypassed=False)
    done = SimpleNamespace(bypassed=True)
    monkeypatch.setattr(dynamo_api.PrecompileContext, "_dynamo_cache_entries",
                        {"k": SimpleNamespace(codes=[code, done])})
    with artifacts._bypass_flags_kept() as marked:
        code.bypassed = True  # what create_cache_entries does
        assert marked() == {id(code)}
    assert code.bypassed is False and done.bypassed is True
