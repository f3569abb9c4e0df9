"""tools/op_coverage.py: the coverage page from harness result files."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tool():
    spec = importlib.util.spec_from_file_location(
        "op_coverage", os.path.join(ROOT, "tools", "op_coverage.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path, fallback, records):
    with open(path, "w") as f:
        json.dump({"cpu_fallback": fallback, "max_samples": 12, "records": records}, f)


def _rec(op, dtype, kind, outcome, cause=None, native=()):
    return {"nodeid": f"x::{op}-{dtype}-{kind}", "op": op, "dtype": dtype, "kind": kind,
            "outcome": outcome, "cause": cause, "decomposed": [], "fallback": [],
            "native": list(native)}


_BAD = "mismatch (forward sample 3): Tensor-likes are not close!"


def _native_records():
    """A native run: one pass, one documented failure, one op without a lowering."""
    return [
        _rec("add", "float32", "forward", "passed", native=["aten.add.Tensor"]),
        _rec("matrix_exp", "bfloat16", "forward", "xfailed", _BAD),
        _rec("sparse.mm.reduce", "float32", "forward", "xfailed",
             "no lowering: aten._sparse_mm_reduce_impl.default"),
    ]


def test_page_counts_and_documented_reasons(tmp_path):
    native, fb, out = tmp_path / "r.json", tmp_path / "rf.json", tmp_path / "ops.md"
    _write(native, False, _native_records())
    _write(fb, True, [
        _rec("add", "float32", "forward", "passed"),
        _rec("matrix_exp", "bfloat16", "forward", "xfailed", _BAD),
        _rec("sparse.mm.reduce", "float32", "forward", "passed"),
    ])
    _tool().main(["--from", str(native), "--fallback-results", str(fb), "-o", str(out)])
    page = out.read_text()
    assert "| `add` | native | ✅ |" in page
    assert "With the CPU fallback on: 2 of 3 tests" in page
    assert "The others: `matrix_exp` bfloat16 forward" in page
    # A hand-written expected-failure reason is shown under its failure; a
    # recorded cause ("no lowering: ...") is not repeated as a reason.
    assert "*Expected failure:* CPU's bfloat16 matrix_exp is wrong" in page
    assert page.count("*Expected failure:*") == 1
    assert "- `aten._sparse_mm_reduce_impl.default`: 1" in page


def test_fallback_run_reruns_only_the_native_failures(tmp_path):
    """`--with-fallback-run` re-runs the failing tests only; native passes count as
    fallback passes (they never reached the fallback)."""
    tool = _tool()
    native, out = tmp_path / "r.json", tmp_path / "ops.md"
    _write(native, False, _native_records())
    calls = []

    def fake_run(all_dtypes, fallback, extra, workers=2, files=(), nodeids=None):
        calls.append((fallback, nodeids))
        path = tmp_path / "rf.json"
        _write(path, True, [
            _rec("matrix_exp", "bfloat16", "forward", "xfailed", _BAD),
            _rec("sparse.mm.reduce", "float32", "forward", "passed"),
        ])
        return str(path)

    tool.run_pytest = fake_run
    tool.main(["--from", str(native), "--with-fallback-run", "-o", str(out)])
    assert calls == [(True, ["x::matrix_exp-bfloat16-forward",
                             "x::sparse.mm.reduce-float32-forward"])]
    page = out.read_text()
    assert "With the CPU fallback on: 2 of 3 tests" in page
    assert "The others: `matrix_exp` bfloat16 forward" in page

    # Nothing failed natively: no fallback run, every test counts as passing.
    calls.clear()
    _write(native, False, [_rec("add", "float32", "forward", "passed")])
    tool.main(["--from", str(native), "--with-fallback-run", "-o", str(out)])
    assert calls == []
    assert "With the CPU fallback on: 1 of 1 tests" in out.read_text()
