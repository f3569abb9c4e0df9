"""Every documented environment variable is declared, read somewhere and tested somewhere.

docs/environment.md lists the `TORCH_TPU_*` variables; torch_tpu/runtime/switches.py
declares each once (TABLE), and torch_tpu/ reads them only through it. The
guard tests below check that the table and the docs agree (the same names,
the same defaults), that each declared variable is read where the table says,
that no other `os.environ` read of a `TORCH_TPU_*` name exists in torch_tpu/,
and both directions between the docs and the code: each documented variable
is read by the code (torch_tpu/, tools/, examples/, benchmarks/) and named by
a test (a string or keyword in tests/, not a docstring or comment), and each
variable the code reads is documented.

The other tests show what the variables the rest of the suite did not
exercise do, against their defaults:

- read once at import (FUSED_MAX_OPS, DONATE, INDEX_CHECKS, CACHE_MAX_BYTES)
  or at the first torch.compile (INDUCTOR_REDIRECT, DYNAMO_BOOKKEEPING,
  DECOMP_TABLE): one script run twice in subprocesses, with the variables set
  and with none of them (`switched`), each on its own empty cache directory;
- read at each use (GRAPH_CACHE_SIZE, DYNAMIC, MAX_SPECIALIZATIONS,
  EAGER_PREFETCH, PROFILE_DIR, PARTITIONER, the distributed ones, the docs
  build's): in this process, with monkeypatch. The distributed ones are
  checked where their value is read (a 2-process run is test_distributed's).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest
import torch

import torch_tpu
import torch_tpu.cache as cache
from torch_tpu.runtime import executor, programs, switches

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"TORCH_TPU_[A-Z0-9_]*[A-Z0-9]")

# Names in TORCH_TPU_* spelling that the code holds but that are no
# environment variables: name -> why.
NOT_VARIABLES = {
    "TORCH_TPU_TORCH_VERSION": "a C macro setup.py defines for csrc/fastpath.cpp",
}


# -- the guard ------------------------------------------------------------------------------


def _documented() -> set:
    return set(NAME.findall((ROOT / "docs" / "environment.md").read_text()))


def _docstrings(tree) -> set:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _names_in(path: Path, whole: bool) -> set:
    """TORCH_TPU_* names in `path`'s strings (not docstrings) and keyword
    arguments. whole: only strings that are a name and nothing else (what
    os.environ.get, switch_on, ... are given); else any mention in a string."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if whole:
                if NAME.fullmatch(node.value):
                    out.add(node.value)
            else:
                out.update(NAME.findall(node.value))
        elif isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
            out.add(node.arg)
    return out


@functools.cache
def _read_by_code() -> set:
    out = set()
    for d in ("torch_tpu", "tools", "examples", "benchmarks"):
        for p in (ROOT / d).rglob("*.py"):
            out |= _names_in(p, whole=True)
    if (ROOT / "setup.py").exists():
        out |= _names_in(ROOT / "setup.py", whole=True)
    return out


def test_every_documented_variable_is_read_by_the_code():
    missing = _documented() - _read_by_code()
    assert not missing, f"documented in docs/environment.md but read nowhere: {sorted(missing)}"


def test_every_variable_the_code_reads_is_documented():
    missing = _read_by_code() - _documented() - set(NOT_VARIABLES)
    assert not missing, f"read by the code but not in docs/environment.md: {sorted(missing)}"


def test_every_documented_variable_is_named_by_a_test():
    named = set()
    for p in (ROOT / "tests").rglob("*.py"):
        named |= _names_in(p, whole=False)
    missing = _documented() - named
    assert not missing, f"documented variables no test sets or reads: {sorted(missing)}"


def _documented_defaults() -> dict:
    """name -> the default column, for each row of docs/environment.md's tables."""
    rows = re.findall(r"^\| `(TORCH_TPU_[A-Z0-9_]+)` \| ([^|]*) \|",
                      (ROOT / "docs" / "environment.md").read_text(), re.M)
    return {name: default.strip() for name, default in rows}


def test_the_switch_table_and_the_docs_agree():
    doc, table = _documented_defaults(), switches.TABLE
    assert sorted(doc) == sorted(_documented()), "a variable named outside the tables' rows"
    assert not doc.keys() - table.keys(), f"documented, not declared: {sorted(doc.keys() - table.keys())}"
    assert not table.keys() - doc.keys(), f"declared, not documented: {sorted(table.keys() - doc.keys())}"
    differ = {n: (table[n].default, doc[n]) for n in doc if table[n].default != doc[n]}
    assert not differ, f"defaults (table, docs) that differ: {differ}"


def test_each_declared_variable_is_read_where_the_table_says():
    for row in switches.TABLE.values():
        assert row.kind in switches.KINDS and row.doc and "\n" not in row.doc, row
        assert row.where, row
        for path in row.where:
            assert row.name in _names_in(ROOT / path, whole=True), (row.name, path)
    assert not _read_by_code() - switches.TABLE.keys() - set(NOT_VARIABLES)


def test_an_undeclared_name_or_the_wrong_reader_raises(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_NOT_DECLARED", "1")
    for read in (switches.switch_on, switches.switch_set, switches.switch_auto,
                 switches.switch_value, switches.switch_raw):
        with pytest.raises(KeyError, match="TORCH_TPU_NOT_DECLARED is not declared"):
            read("TORCH_TPU_NOT_DECLARED")
    with pytest.raises(TypeError, match="TORCH_TPU_FUSED_MAX_OPS is a 'int' variable"):
        switches.switch_on("TORCH_TPU_FUSED_MAX_OPS")
    with pytest.raises(TypeError, match="TORCH_TPU_DONATE is a 'on' variable"):
        switches.switch_set("TORCH_TPU_DONATE")


def test_switch_value_is_the_declared_default_when_unset(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_FUSED_MAX_OPS", raising=False)
    monkeypatch.delenv("TORCH_TPU_PLATFORM", raising=False)
    monkeypatch.delenv("TORCH_TPU_CACHE_DIR", raising=False)
    assert switches.switch_value("TORCH_TPU_FUSED_MAX_OPS") == "2000"
    assert switches.switch_value("TORCH_TPU_PLATFORM") == ""      # best present: computed
    assert switches.switch_value("TORCH_TPU_CACHE_DIR") == ""     # a path: computed
    assert switches.switch_raw("TORCH_TPU_CACHE_DIR") is None
    monkeypatch.setenv("TORCH_TPU_FUSED_MAX_OPS", " 7 ")
    assert switches.switch_value("TORCH_TPU_FUSED_MAX_OPS") == "7"
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", "")
    assert switches.switch_raw("TORCH_TPU_CACHE_DIR") == ""       # "": the disk tier off


# Uses of os.environ in torch_tpu/ that are not a read of a constant name:
# (file, function) -> why. A TORCH_TPU_* name is never read this way.
ENVIRON_USES = {
    ("torch_tpu/distributed/launch.py", "set_tpu_launch_env"):
        "checks and sets the launcher's own variables (TPU_*, CUDA_VISIBLE_DEVICES, XLA_FLAGS)",
}
# TORCH_TPU_* variables torch_tpu/ sets (for itself or a child process): (file, name) -> why.
ENVIRON_WRITES = {
    ("torch_tpu/debug/__init__.py", "TORCH_TPU_DUMP_DIR"): "debug.dump_to sets it for its block",
}


def _environ_uses(path: Path):
    """(function, how, key) for each use of os.environ / os.getenv in `path`:
    how is read, write or other; key the constant name, else None."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}

    def function_of(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return None

    def key(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    for node in ast.walk(tree):
        is_environ = (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id == "environ")
        is_getenv = isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb")
        if not (is_environ or is_getenv):
            continue
        up, how, k = parents.get(node), "other", None
        if is_getenv and isinstance(up, ast.Call) and up.args:
            how, k = "read", key(up.args[0])
        elif isinstance(up, ast.Attribute) and isinstance(parents.get(up), ast.Call):
            call = parents[up]
            if up.attr in ("get", "setdefault", "pop") and call.args:
                how, k = ("write" if up.attr == "pop" else "read"), key(call.args[0])
        elif isinstance(up, ast.Subscript) and up.value is node:
            how, k = ("read" if isinstance(up.ctx, ast.Load) else "write"), key(up.slice)
        elif isinstance(up, ast.Compare) and node in up.comparators:
            how, k = "read", key(up.left)
        yield function_of(node), how, k


def test_no_other_read_of_a_torch_tpu_variable():
    bad = []
    for p in sorted((ROOT / "torch_tpu").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel == "torch_tpu/runtime/switches.py":
            continue
        for func, how, k in _environ_uses(p):
            if k is None:
                ok = (rel, func) in ENVIRON_USES
            elif how == "write":
                ok = not NAME.fullmatch(k) or (rel, k) in ENVIRON_WRITES
            else:
                ok = not k.startswith("TORCH_TPU_")
            if not ok:
                bad.append(f"{rel}:{func}: {how} of {k or 'a computed name'}")
    assert not bad, "read TORCH_TPU_* variables through torch_tpu.runtime.switches: " + "; ".join(bad)


def test_the_read_scan_sees_reads(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""
        import os
        from os import environ
        def f(name):
            a = os.environ.get("TORCH_TPU_A", "1")
            b = os.getenv("TORCH_TPU_B")
            c = environ["TORCH_TPU_C"]
            d = "TORCH_TPU_D" in os.environ
            os.environ["TORCH_TPU_E"] = "1"
            return os.environ.get(name), dict(os.environ)
    """))
    assert sorted(_environ_uses(src), key=str) == sorted([
        ("f", "read", "TORCH_TPU_A"), ("f", "read", "TORCH_TPU_B"), ("f", "read", "TORCH_TPU_C"),
        ("f", "read", "TORCH_TPU_D"), ("f", "write", "TORCH_TPU_E"), ("f", "read", None),
        ("f", "other", None)], key=str)


def test_the_guard_sees_the_table():
    doc = _documented()
    assert len(doc) >= 46 and "TORCH_TPU_PLATFORM" in doc and "TORCH_TPU_DOCS_JOBS" in doc
    assert _names_in(Path(__file__), whole=True) >= {"TORCH_TPU_DONATE", "TORCH_TPU_DYNAMIC"}


# -- variables read at import or at the first torch.compile: subprocesses ------------------

SWITCHED = {
    "TORCH_TPU_FUSED_MAX_OPS": "5",
    "TORCH_TPU_DONATE": "0",
    "TORCH_TPU_INDEX_CHECKS": "0",
    "TORCH_TPU_CACHE_MAX_BYTES": "64K",
    "TORCH_TPU_INDUCTOR_REDIRECT": "0",
    "TORCH_TPU_DYNAMO_BOOKKEEPING": "1",
    "TORCH_TPU_DECOMP_TABLE": "full",
    "TORCH_TPU_CPU_XLA_DEFAULTS": "0",
}

SCRIPT = textwrap.dedent("""
    import json, sys, traceback
    import torch
    import torch_tpu
    import torch_tpu.cache as cache
    from torch_tpu.runtime import fused
    from torch_tpu.compile import graph_cache

    out = {}

    def section(fn):
        try:
            out[fn.__name__] = fn()
        except Exception:
            out[fn.__name__] = {"error": traceback.format_exc()[-3000:]}
        return fn

    @section
    def fused_max_ops():
        x = torch.ones(4, device="tpu")
        before = fused.STATS.flushes
        with torch_tpu.fused():
            y = x
            for _ in range(12):
                y = y + 1
            flushes = fused.STATS.flushes - before
            value = y.cpu().tolist()
        return {"max_ops": fused.MAX_OPS, "flushes_before_read": flushes, "value": value}

    @section
    def donate():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        m = m.to("tpu")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x = torch.randn(4, 8).to("tpu")
        before = fused.STATS.donated
        losses = []
        for _ in range(3):
            with torch_tpu.fused():
                loss = m(x).square().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            losses.append(loss.item())
        fused_donated = fused.STATS.donated - before
        # a compiled optimizer step overwrites the parameters (graph donation)
        lin = torch.nn.Linear(4, 4).to("tpu")
        sgd = torch.optim.SGD(lin.parameters(), lr=0.1)
        step = torch.compile(sgd.step, backend="tpu")
        lin(torch.ones(2, 4, device="tpu")).sum().backward()
        calls = graph_cache.GRAPH_STATS.donating_calls
        for _ in range(3):
            step()
        return {"fused_donated": fused_donated, "losses": losses,
                "graph_donating_calls": graph_cache.GRAPH_STATS.donating_calls - calls}

    @section
    def index_checks():
        t = torch.arange(4.0).to("tpu")
        bad = torch.tensor([1, 7]).to("tpu")
        try:
            got = t[bad].cpu()
        except IndexError as e:
            return {"raised": "IndexError", "message": str(e)[:200]}
        return {"raised": None, "first": got[0].item(), "second_nan": bool(got[1].isnan())}

    @section
    def compile_hooks():
        import torch._dynamo.guards as guards
        import torch._dynamo.symbolic_convert as symbolic_convert
        from torch_tpu.compile import backend

        backend.register()
        table = backend.decompositions()
        return {
            "inductor_redirected": bool(getattr(torch._TorchCompileInductorWrapper.__call__,
                                                "_torch_tpu_patch", False)),
            "guard_profile_skipped": bool(getattr(guards.profile_guard_manager,
                                                  "_torch_tpu_patch", False)),
            "funcname_skipped": bool(getattr(symbolic_convert.get_funcname,
                                             "_torch_tpu_patch", False)),
            "decompositions": len(table),
            "composite_decomposed": torch.ops.aten._cast_Byte.default in table,
        }

    @section
    def disk_cap():
        x = torch.linspace(0.0, 1.0, 7).to("tpu")
        for f in (torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.sqrt,
                  torch.log1p, torch.erf, torch.atan, torch.sinh):
            f(x).cpu()
        d = cache.stats()["disk"]
        return {"max_bytes": d["max_bytes"], "bytes": d["bytes"], "evictions": d["evictions"],
                "writes": d["writes"]}

    @section
    def cpu_xla_defaults():
        import os
        import jax
        import jax.numpy as jnp
        from torch_tpu.cache import store

        torch.ones(1, device="tpu").cpu()
        # 4 layers of bfloat16 weights in one program (a decoding step's shape)
        ws = [jnp.ones((256, 1024), jnp.bfloat16) for _ in range(4)]

        def f(ws, x):
            for w in ws:
                x = jnp.tanh(jnp.dot(jnp.dot(x, w), w.T))
            return x

        c = jax.jit(f).lower(ws, jnp.ones((1, 256), jnp.bfloat16)).compile()
        return {"xla_flags": os.environ.get("XLA_FLAGS", ""),
                "key_flags": store.environment()["xla_flags"],
                "scratch_per_weight_byte": c.memory_analysis().temp_size_in_bytes
                / sum(w.nbytes for w in ws)}

    print("RESULT " + json.dumps(out))
""")


def _env(cache_dir: Path, extra: dict) -> dict:
    from torch_tpu.runtime.xla_flags import CPU_DEFAULTS

    env = {k: v for k, v in os.environ.items() if k not in SWITCHED}
    # without the flags this process got from tests/conftest.py: each child adds its own
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f not in CPU_DEFAULTS)
    env.update(TORCH_TPU_CACHE_DIR=str(cache_dir), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("TORCH_TPU_SHARED_CACHE_DIR", None)
    env.pop("TORCH_TPU_EAGER", None)
    env.pop("TORCH_TPU_LAUNCH_BLOCKING", None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def switched(tmp_path_factory):
    """SCRIPT's results with the variables of SWITCHED set ("set") and unset ("default")."""
    tmp = tmp_path_factory.mktemp("env")
    procs = {}
    for name, extra in (("default", {}), ("set", SWITCHED)):
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", SCRIPT], env=_env(tmp / name, extra), cwd=str(tmp),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for name, p in procs.items():
        try:
            o, e = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            raise
        lines = [ln for ln in o.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, (o + e)[-4000:]
        results[name] = json.loads(lines[-1][len("RESULT "):])
    return results


def _section(switched, name):
    got = switched["default"][name], switched["set"][name]
    for r in got:
        assert "error" not in r, r.get("error")
    return got


def test_fused_max_ops_flushes_a_trace_at_that_many_ops(switched):
    default, five = _section(switched, "fused_max_ops")
    assert default["max_ops"] == 2000 and five["max_ops"] == 5
    # 12 recorded adds: nothing runs before the read by default; with 5, two
    # traces of 5 ops ran before it.
    assert default["flushes_before_read"] == 0
    assert five["flushes_before_read"] == 2
    assert five["value"] == default["value"] == [13.0] * 4


def test_donate_0_donates_nothing(switched):
    default, off = _section(switched, "donate")
    assert default["fused_donated"] > 0 and default["graph_donating_calls"] > 0, default
    assert off["fused_donated"] == 0 and off["graph_donating_calls"] == 0, off
    assert off["losses"] == default["losses"]  # the same results, in new buffers


def test_index_checks_0_reads_the_fill_value(switched):
    default, off = _section(switched, "index_checks")
    assert default["raised"] == "IndexError", default
    assert off["raised"] is None and off["first"] == 1.0 and off["second_nan"], off


def test_cpu_xla_defaults_0_keeps_xla_s_own_scheduler(switched):
    default, off = _section(switched, "cpu_xla_defaults")
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    assert flag in default["xla_flags"] and flag in default["key_flags"], default
    assert flag not in off["xla_flags"] and flag not in off["key_flags"], off
    # the memory-minimizing schedule converts each bfloat16 weight to float32
    # just before its dot; XLA's default converts all of them up front
    assert default["scratch_per_weight_byte"] < 1.0, default
    assert off["scratch_per_weight_byte"] >= 1.9, off


def test_user_xla_flags_are_kept(tmp_path):
    env = _env(tmp_path, {})
    env["XLA_FLAGS"] = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    out = subprocess.run(
        [sys.executable, "-c", "import os, torch, torch_tpu; torch.ones(1, device='tpu'); "
                               "print(os.environ['XLA_FLAGS'])"],
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "--xla_cpu_enable_concurrency_optimized_scheduler=true"


def test_inductor_redirect_0_leaves_inductor_alone(switched):
    default, off = _section(switched, "compile_hooks")
    assert default["inductor_redirected"] is True
    assert off["inductor_redirected"] is False


def test_dynamo_bookkeeping_1_keeps_dynamo_functions(switched):
    default, kept = _section(switched, "compile_hooks")
    assert default["guard_profile_skipped"] and default["funcname_skipped"], default
    assert not kept["guard_profile_skipped"] and not kept["funcname_skipped"], kept


def test_decomp_table_full_adds_composite_ops(switched):
    core, full = _section(switched, "compile_hooks")
    assert not core["composite_decomposed"] and full["composite_decomposed"]
    assert full["decompositions"] > core["decompositions"] + 100, (core, full)


def test_cache_max_bytes_caps_the_disk_tier(switched):
    default, capped = _section(switched, "disk_cap")
    assert default["max_bytes"] == 4 << 30 and default["evictions"] == 0, default
    assert capped["max_bytes"] == 64 << 10
    # more was written than the cap holds: the oldest entries went
    assert capped["evictions"] > 0 and capped["bytes"] <= capped["max_bytes"], capped
    assert default["bytes"] > capped["max_bytes"], default


# -- variables read at each use: this process ----------------------------------------------


def _graph_row():
    return cache.stats()["graphs"]


def test_graph_cache_size_caps_compiled_graphs_in_memory(monkeypatch):
    def compiled_shapes(sizes):
        f = torch.compile(lambda t: (t * 3 - 1).relu(), backend="tpu", dynamic=False)
        for n in sizes:
            x = torch.linspace(-1.0, 1.0, n)
            torch.testing.assert_close(f(x.to("tpu")).cpu(), (x * 3 - 1).relu())

    torch._dynamo.reset()
    programs.clear(programs.ProgramKind.GRAPH)
    monkeypatch.setenv("TORCH_TPU_GRAPH_CACHE_SIZE", "2")
    ev = _graph_row()["evictions"]
    compiled_shapes([37, 38, 39, 41])
    row = _graph_row()
    assert row["entries"] == 2 and row["evictions"] - ev == 2, row

    monkeypatch.delenv("TORCH_TPU_GRAPH_CACHE_SIZE")  # the default, 512
    torch._dynamo.reset()
    programs.clear(programs.ProgramKind.GRAPH)
    ev = _graph_row()["evictions"]
    compiled_shapes([43, 44, 45, 46])
    row = _graph_row()
    assert row["entries"] == 4 and row["evictions"] == ev, row
    torch._dynamo.reset()


def _graph_programs():
    return [e["name"] for e in cache.stats()["per_entry"] if e["name"].startswith("graph_")]


def _sweep_dynamic(sizes):
    """Programs a symbolic graph (dynamic=True) builds over `sizes`."""
    f = torch.compile(lambda t: (t * 2 + 1).sum(-1), backend="tpu", dynamic=True)
    before = len(_graph_programs())
    for n in sizes:
        x = torch.linspace(0.0, 1.0, 3 * n).reshape(3, n)
        torch.testing.assert_close(f(x.to("tpu")).cpu(), (x * 2 + 1).sum(-1))
    return _graph_programs()[before:]


def test_dynamic_exact_compiles_one_program_per_shape(monkeypatch):
    torch._dynamo.reset()
    sizes = [17, 18, 19, 20, 21, 22]
    monkeypatch.delenv("TORCH_TPU_DYNAMIC", raising=False)
    bucketed = _sweep_dynamic(sizes)   # the default: padded to the bucket 32
    assert any("bucketed" in n for n in bucketed) and len(bucketed) < len(sizes), bucketed
    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_TPU_DYNAMIC", "exact")
    exact = _sweep_dynamic([s + 100 for s in sizes])
    assert not any("bucketed" in n for n in exact) and len(exact) == len(sizes), exact
    torch._dynamo.reset()


def test_max_specializations_bounds_exact_programs(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DYNAMIC", "exact")
    sizes = [51, 52, 53, 54]

    def warnings_of(sizes):
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _sweep_dynamic(sizes)
        return [str(x.message) for x in w if "input shapes" in str(x.message)]

    assert warnings_of(sizes) == []  # the default: 64 kept
    monkeypatch.setenv("TORCH_TPU_MAX_SPECIALIZATIONS", "2")
    got = warnings_of([s + 10 for s in sizes])
    assert len(got) == 1 and "more than 2 input shapes" in got[0], got
    torch._dynamo.reset()


def test_eager_prefetch_0_loads_nothing_ahead(cache_dir, monkeypatch):
    from torch_tpu.cache import prefetch

    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 13, generator=g).to("tpu")
    b = torch.randn(5, 13, generator=g).to("tpu")

    def run():  # a process's first ops: the memory tier empty
        executor.clear_cache()
        return ((a * 0.625 - b).sigmoid() @ b.t()).amax(0).cpu()

    monkeypatch.delenv("TORCH_TPU_EAGER_PREFETCH", raising=False)
    prefetch.reset()
    cold = run()
    assert prefetch.stats()["recorded"] >= prefetch.HEAD + 2
    prefetch.flush()  # what an exit stores

    monkeypatch.setenv("TORCH_TPU_EAGER_PREFETCH", "0")
    prefetch.reset()  # a new process
    assert torch.equal(run(), cold)
    st = prefetch.stats()
    assert st["enabled"] is False and st["recorded"] == 0 and st["listed"] == 0, st

    monkeypatch.delenv("TORCH_TPU_EAGER_PREFETCH")  # on: the same run prefetches
    prefetch.reset()
    assert torch.equal(run(), cold)
    st = prefetch.stats()
    assert st["enabled"] is True and st["listed"] > 0, st
    prefetch.reset()


def test_profile_dir_is_the_default_trace_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCH_TPU_PROFILE_DIR", raising=False)
    assert torch_tpu.profiler.trace().log_dir == str(tmp_path / "tpu_profile")
    where = tmp_path / "traces"
    monkeypatch.setenv("TORCH_TPU_PROFILE_DIR", str(where))
    x = torch.ones(8, device="tpu")
    with torch_tpu.profiler.trace() as prof:
        (x * 2).sum().cpu()
    assert prof.log_dir == str(where)
    assert prof.files and all(f.startswith(str(where)) for f in prof.files), prof.files
    assert not (tmp_path / "tpu_profile").exists()


def test_partitioner_chooses_how_training_graphs_split(monkeypatch):
    from torch._functorch import partitioners

    from torch_tpu.compile import backend

    monkeypatch.delenv("TORCH_TPU_PARTITIONER", raising=False)
    assert backend._partition_fn({}) is partitioners.default_partition
    monkeypatch.setenv("TORCH_TPU_PARTITIONER", "min_cut")
    assert backend._partition_fn({}) is partitioners.min_cut_rematerialization_partition
    # the graph's own option wins
    assert backend._partition_fn({"partitioner": "default"}) is partitioners.default_partition
    monkeypatch.setenv("TORCH_TPU_PARTITIONER", "sometimes")
    with pytest.raises(ValueError, match="unknown partitioner"):
        backend._partition_fn({})


# -- distributed: where each value is read -------------------------------------------------


def test_coordinator_port_is_process_0s_port(monkeypatch):
    import torch.distributed as dist

    from torch_tpu.distributed import runtime

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    # below Linux's ephemeral range (32768-60999), where a free port comes from
    monkeypatch.setenv("TORCH_TPU_COORDINATOR_PORT", "23456")
    store = dist.HashStore()
    address = runtime._exchange_address(store, 0, 5)
    assert address.endswith(":23456")
    assert store.get(runtime.COORDINATOR_KEY).decode() == address  # what the others read
    monkeypatch.delenv("TORCH_TPU_COORDINATOR_PORT")
    free = runtime._exchange_address(dist.HashStore(), 0, 5)
    assert not free.endswith(":23456") and int(free.rsplit(":", 1)[1]) > 0
    monkeypatch.setenv("TORCH_TPU_COORDINATOR_PORT", "http")
    with pytest.raises(ValueError, match="TORCH_TPU_COORDINATOR_PORT"):
        runtime._exchange_address(dist.HashStore(), 0, 5)


def test_dist_checks_0_turns_the_collective_check_off(monkeypatch):
    from torch_tpu.distributed import programs as pg_programs

    monkeypatch.delenv("TORCH_TPU_DIST_CHECKS", raising=False)
    assert pg_programs.checks_enabled()
    for off in ("0", "false", "off"):
        monkeypatch.setenv("TORCH_TPU_DIST_CHECKS", off)
        assert not pg_programs.checks_enabled(), off
    monkeypatch.setenv("TORCH_TPU_DIST_CHECKS", "1")
    assert pg_programs.checks_enabled()


def test_dist_debug_prints_a_failed_collectives_traceback(monkeypatch, capsys):
    from torch_tpu.distributed import process_group

    work = types.SimpleNamespace(desc="all_reduce #7 (float32[3]) on ranks [0, 1]")

    def failure():
        try:
            raise RuntimeError("INTERNAL: the payload went wrong")
        except RuntimeError as e:
            return process_group._runtime_failure(work, e)

    monkeypatch.delenv("TORCH_TPU_DIST_DEBUG", raising=False)
    exc = failure()
    assert "all_reduce #7" in str(exc) and capsys.readouterr().err == ""
    monkeypatch.setenv("TORCH_TPU_DIST_DEBUG", "1")
    failure()
    err = capsys.readouterr().err
    assert "Traceback" in err and "the payload went wrong" in err and "in failure" in err


# -- the docs build (tools/mkdocs_hooks.py) ------------------------------------------------


@pytest.fixture
def hooks(monkeypatch):
    """tools/mkdocs_hooks.py, with stand-ins for mkdocs (not installed here)
    and for build_docs' notebook runner (records its calls)."""
    for name in ("mkdocs", "mkdocs.exceptions", "mkdocs.structure", "mkdocs.structure.files"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    exc_mod, files_mod = sys.modules["mkdocs.exceptions"], sys.modules["mkdocs.structure.files"]
    if not hasattr(exc_mod, "PluginError"):
        monkeypatch.setattr(exc_mod, "PluginError", RuntimeError, raising=False)
    if not hasattr(files_mod, "File"):
        monkeypatch.setattr(files_mod, "File", object, raising=False)
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("_mkdocs_hooks_under_test",
                                                  ROOT / "tools" / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls = []
    bd = mod.build_docs
    monkeypatch.setattr(bd, "notebooks", lambda: [Path("01_a.py"), Path("02_b.py")])
    monkeypatch.setattr(bd, "snapshot_status", lambda nb: "stale")
    monkeypatch.setattr(bd, "run_all", lambda todo, **kw: calls.append((todo, kw)) or [])
    mod.calls = calls
    for k in ("TORCH_TPU_DOCS_RUN", "TORCH_TPU_DOCS_JOBS", "TORCH_TPU_DOCS_FORCE"):
        monkeypatch.delenv(k, raising=False)
    return mod


def test_docs_run_0_runs_no_notebook(hooks, monkeypatch):
    hooks._run_notebooks()
    assert len(hooks.calls) == 1 and len(hooks.calls[0][0]) == 2  # by default: the stale ones
    monkeypatch.setenv("TORCH_TPU_DOCS_RUN", "0")
    hooks._run_notebooks()
    assert len(hooks.calls) == 1


def test_docs_jobs_is_the_notebooks_run_at_once(hooks, monkeypatch):
    hooks._run_notebooks()
    assert hooks.calls[-1][1]["jobs"] == 2
    monkeypatch.setenv("TORCH_TPU_DOCS_JOBS", "5")
    hooks._run_notebooks()
    assert hooks.calls[-1][1]["jobs"] == 5


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), (" No ", False),
                                       ("FALSE", False), ("1", True), ("", True)])
def test_on_by_default_switches_read_one_spelling(monkeypatch, value, on):
    """Donation in compiled graphs, the inductor redirect and the distributed
    checks read the spelling fused mode reads (runtime.switches): `off` turned
    fused donation off but left compiled graphs donating."""
    from torch_tpu.compile import graph_cache
    from torch_tpu.distributed import programs as dist_programs
    from torch_tpu.runtime import fused

    for name in ("TORCH_TPU_DONATE", "TORCH_TPU_DIST_CHECKS"):
        monkeypatch.setenv(name, value)
    assert graph_cache._donation_enabled() is on
    assert fused.switch_on("TORCH_TPU_DONATE") is on
    assert dist_programs.checks_enabled() is on


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("On", True),
                                       ("0", False), ("", False), ("2", False)])
def test_off_by_default_switches_read_one_spelling(monkeypatch, value, on):
    from torch_tpu.runtime.switches import switch_set

    monkeypatch.setenv("TORCH_TPU_DYNAMO_BOOKKEEPING", value)
    assert switch_set("TORCH_TPU_DYNAMO_BOOKKEEPING") is on
