"""The differential fuzzer (tests/fuzz): a seeded bounded run, its known classes, and its parts.

The bounded run (seeds 0..BOUNDED_COUNT-1 on strict eager and fused, every
COMPILED_EVERY-th one also through `torch.compile`) must find no difference
outside the known classes of tests/fuzz/known.py; each known class's
reproducer is an expected failure with its reason until it is fixed, then
the test fails until the entry is removed. The comparator and the shrinker
are tested on planted differences, so the run cannot pass because they
miss one.
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch

from tests.fuzz import generator, known, runner, shrink
from tests.fuzz.generator import Input, Program

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

BOUNDED_SEED, BOUNDED_COUNT, COMPILED_EVERY = 0, 150, 3
SLOW_SEED, SLOW_COUNT, SLOW_COMPILED_EVERY = 100_000, 1000, 2


def _report(new) -> str:
    return "\n\n".join(f"seed {f.seed}: {f.shrunk_mismatch}\n{f.shrunk.source((f.mismatch.path,))}"
                       for f in new)


def _fuzz(seed, count, every):
    rep = runner.fuzz(seed, count, runner.PATHS, every)
    new = known.triage(rep, budget=60)
    print(f"programs per path {rep.runs}; {known.summary(rep)}; seconds "
          + ", ".join(f"{p} {s:.1f}" for p, s in rep.seconds.items()))
    return rep, new


def test_bounded_run_finds_no_new_class():
    rep, new = _fuzz(BOUNDED_SEED, BOUNDED_COUNT, COMPILED_EVERY)
    assert rep.runs == {"eager": BOUNDED_COUNT, "fused": BOUNDED_COUNT,
                        "compiled": -(-BOUNDED_COUNT // COMPILED_EVERY)}
    assert not new, f"{len(new)} difference(s) of no known class:\n\n{_report(new)}"


@pytest.mark.slow
def test_long_run_finds_no_new_class():
    rep, new = _fuzz(SLOW_SEED, SLOW_COUNT, SLOW_COMPILED_EVERY)
    assert not new, f"{len(new)} difference(s) of no known class:\n\n{_report(new)}"


@pytest.mark.parametrize("key", sorted(known.KNOWN))
def test_known_class_still_differs(key):
    """Strict: a known class whose reproducer now agrees with CPU must be removed."""
    k = known.KNOWN[key]
    m = runner.check(k.reproducer, k.path)
    if m is not None and known.classify(k.reproducer, m) == key:
        pytest.xfail(f"{k.reason} (issue {k.issue})")
    if m is None:
        pytest.fail(f"fixed: the reproducer of {key!r} agrees with CPU on the {k.path} path; "
                    "remove its entry from tests/fuzz/known.py")
    pytest.fail(f"the reproducer of {key!r} now differs in another way: {m}")


# --------------------------------------------------------------------------
# the generator


FAMILIES = {
    "elementwise unary": r"\.(exp|abs|sqrt|sigmoid|floor|log|sin|tanh|reciprocal|round|sign|"
                         r"square|rsqrt|expm1|trunc|isnan|isinf|signbit)\(\)|torch\.relu\(", "binary": r" [-+*/] x\d| [-+*/] v\d",
    "python scalar": r" [-+*/] (2\.5|-?0\.0|nan|inf|1e-40|True)\b",
    "reduction with dim": r"\.(sum|mean|amax|amin|prod|argmax)\(dim=", "keepdim": r"keepdim=True",
    "view": r"\.(view|reshape|transpose|permute|select|expand|unsqueeze|narrow|diagonal)\(",
    "slice": r"\[\d+:\]|\[::2\]", "in-place": r"\.(add_|mul_|copy_|fill_|masked_fill_)\(",
    "index write": r"\]\s=\s|index_(fill|add|put)_", "integer index": r"\[torch\.tensor\(\[",
    "boolean index": r"\[\(\w+ > 0\)\]", "cat/stack": r"torch\.(cat|stack)\(", "matmul": r" @ ",
    "softmax": r"torch\.(log_)?softmax\(", "where": r"torch\.where\(", "cumsum": r"\.cumsum\(",
    "sort/topk": r"torch\.(sort|topk)\(", "factory": r"torch\.(zeros|full_like|ones_like|arange)\(",
    "cast": r"\.(int|long|float|bool)\(\)|\.to\(torch\.",
}


def test_generator_covers_every_family():
    """The bounded run's programs exercise each family the fuzzer claims (and
    the inputs every dtype, layout, a 0-size and a 0-dim shape, special values)."""
    import re

    progs = [generator.generate(s) for s in range(BOUNDED_COUNT)]
    text = "\n".join(s for p in progs for s in p.steps)
    missing = [f for f, rx in FAMILIES.items() if not re.search(rx, text)]
    assert not missing, f"no program of the bounded run has: {missing}"
    inputs = [i for p in progs for i in p.inputs]
    assert {i.dtype for i in inputs} == set(generator.DTYPES)
    assert {i.layout for i in inputs} == {"contiguous", "transposed", "channels_last"}
    assert any(0 in i.shape for i in inputs) and any(i.shape == () for i in inputs)
    values = [v for i in inputs if i.dtype == "float32" for v in i.values]
    assert any(math.isnan(v) for v in values) and any(v == 1e-40 for v in values)
    assert any(v == 0 and math.copysign(1, v) < 0 for v in values)
    assert generator.generate(7) == generator.generate(7)  # a seed is a program


def test_reproducer_is_runnable_code():
    prog = Program((Input("x0", (2,), "float32", (math.nan, -0.0)),), ("v0 = x0 * 2",))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(prog.source(("eager",)), {"__name__": "repro"})  # noqa: S102
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("cpu [tensor([nan, -0.])]") and lines[1].startswith("tpu eager [")


# --------------------------------------------------------------------------
# the comparator, on planted differences


def _run(**values):
    return runner.Run(values=dict(values), layouts={k: "" for k in values})


def _kind(actual: runner.Run, expected: runner.Run, prog=None):
    prog = prog or Program((), tuple(f"{n} = x" for n in expected.values))
    m = runner.compare(prog, expected, actual, "eager")
    return None if m is None else m.kind


_E = torch.tensor([1.0, 2.0, 3.0])


@pytest.mark.parametrize("expected,planted,kind", [
    (_E, torch.tensor([1.0, 2.0, 3.5]), "value"),                       # one element changed
    (torch.tensor([1.0, math.nan]), torch.tensor([1.0, 0.0]), "nan"),    # a NaN turned into 0
    (_E, torch.tensor([1.0, 2.0, math.inf]), "value"),                   # finite turned infinite
    (_E, _E.double(), "dtype"),
    (_E, _E[:2], "shape"),
], ids=["changed", "nan-to-0", "inf", "dtype", "shape"])
def test_comparator_catches_a_planted_difference(expected, planted, kind):
    assert _kind(_run(v0=planted), _run(v0=expected)) == kind
    assert _kind(_run(v0=expected.clone()), _run(v0=expected)) is None  # the control


def test_comparator_exact_rules():
    """Subnormals flushed, the sign of a zero, integers off by one, bfloat16
    NaN, a channels_last result returned row-major: each is a difference."""
    cases = [
        (torch.tensor([1e-40, 1.0]), torch.tensor([0.0, 1.0]), "subnormal"),
        (torch.tensor([-0.0]), torch.tensor([0.0]), "signed-zero"),
        (torch.tensor([2**40], dtype=torch.int64), torch.tensor([2**40 + 1]), "value"),
        (torch.tensor([True]), torch.tensor([False]), "value"),
        (torch.tensor([math.nan], dtype=torch.bfloat16), torch.tensor([0.0], dtype=torch.bfloat16), "nan"),
    ]
    for expected, actual, kind in cases:
        assert _kind(_run(v0=actual), _run(v0=expected)) == kind, (expected, actual)
    e = _run(v0=torch.zeros(1, 2, 2, 2))
    e.layouts["v0"] = "channels_last"
    assert _kind(_run(v0=torch.zeros(1, 2, 2, 2)), e) == "layout"


def test_comparator_tolerance_scales_with_the_operands():
    """A sum's rounding is relative to its operands: 1e8 + 1 - 1e8 may come
    back as 0 instead of 1 (float32 order), which is no difference; but the
    same error on a result of operands near 1 is one."""
    big = Program((Input("x0", (3,), "float32", (1e8, 1.0, -1e8)),), ("v0 = x0.sum()",))
    e = runner.Run(values={"v0": torch.tensor(1.0), "x0": torch.tensor([1e8, 1.0, -1e8])},
                   layouts={"v0": "", "x0": ""})
    a = runner.Run(values={"v0": torch.tensor(0.0), "x0": torch.tensor([1e8, 1.0, -1e8])},
                   layouts={"v0": "", "x0": ""})
    assert runner.compare(big, e, a, "eager") is None
    small = Program((Input("x0", (3,), "float32", (1.0, 1.0, -1.0)),), ("v0 = x0.sum()",))
    e.values["x0"] = a.values["x0"] = torch.tensor([1.0, 1.0, -1.0])
    assert runner.compare(small, e, a, "eager").kind == "value"


def test_comparator_compares_errors():
    ok = _run(v0=torch.ones(1))
    assert _kind(ok, runner.Run(error=RuntimeError("x"))) == "no-error"  # a missing exception
    assert _kind(runner.Run(error=RuntimeError("x")), ok) == "error"
    assert _kind(runner.Run(error=TypeError("x")), runner.Run(error=RuntimeError("x"))) == "error-type"
    assert _kind(runner.Run(error=IndexError("x")), runner.Run(error=IndexError("y"))) is None


# --------------------------------------------------------------------------
# the shrinker


def test_shrinker_reaches_the_minimal_program():
    """An artificial failure, "some result is NaN on CPU", shrinks to one
    step over a 1-element input holding the NaN, whatever surrounded it."""
    prog = Program(
        (Input("x0", (3, 4), "float32", (1.5, math.nan, -0.0, math.inf, 1e-40, 2.0) * 2,
               "transposed"),
         Input("x1", (2,), "int64", (3, 2**40))),
        ("v0 = x0 + 1", "v1 = x1 * 2", "v2 = v0.exp()", "v3 = v2.sum(dim=0)", "x0.mul_(2)",
         "v4 = v1.float()"))

    def fails(p: Program) -> bool:
        run = runner.execute(p, device="cpu")
        return run.error is None and any(
            v.is_floating_point() and bool(v.isnan().any())
            for n, v in run.values.items() if n.startswith("v"))

    assert fails(prog)
    small = shrink.shrink(prog, fails)
    assert small == Program((Input("x0", (1, 1), "float32", (math.nan,)),), ("v0 = x0 + 1",)), small


def test_command_line_runs_and_reports(capsys):
    from tests.fuzz.__main__ import main

    assert main(["--seed", "3", "--count", "2", "--paths", "eager", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "programs run per path: {'eager': 2}" in out
    with pytest.raises(SystemExit):
        main(["--paths", "lazy"])


def test_shrinker_bypasses_a_step_later_ones_read():
    """A step a later one reads is cut by reading its operand instead, when
    the failure stays: `v1 = x0.cumsum(-1); v2 = torch.softmax(v1, 1)` over
    an empty tensor shrinks to `v2 = torch.softmax(x0, 1)`."""
    prog = Program((Input("x0", (1, 0), "int64", ()),),
                   ("v1 = x0.cumsum(-1)", "v2 = torch.softmax(v1.float(), 1)"))

    def fails(p: Program) -> bool:
        return any("softmax" in s for s in p.steps)

    assert shrink.shrink(prog, fails).steps == ("v2 = torch.softmax(x0.float(), 1)",)
