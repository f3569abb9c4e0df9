"""The guide's exercises: every check passes a right answer and fails a wrong one, with a why.

The checks live in guide/notebooks/exercises.py and measure the truth by
running torch_tpu, so these tests also pin what the guide teaches (3
programs for the loop, 2 graph breaks, one all-reduce of 1284 bytes, ...).
Code-editor exercises run the learner code path: the starter is
"not answered", an edited wrong answer fails, the solution passes. The last
tests read the notebooks: each in scope ends with an Exercises section whose
check cells name check functions that exist.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "guide" / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
sys.path.insert(0, str(ROOT))  # examples/ (09's checks build the examples' models)

import exercises as ex  # noqa: E402

# (check, right answer, wrong answer): args are tuples for multi-input checks
CASES = [
    ("check_transfers", 3, 2),
    ("check_device_dtype", "tpu:0, torch.float32", "tpu:0, torch.int64"),
    ("check_view_write", 3, 4),
    ("check_loop_programs", 3, 30),
    ("check_fallback_op", "guide_ex.ranks", "guide_ex.softsign"),
    ("check_backward_op", "aten.gelu_backward.default", "aten.tanh_backward.default"),
    ("check_steady_compiles", 0, 16),
    ("check_graph_breaks", 2, 1),
    ("check_disk_hits", 3, 0),
    ("check_cache_key", "x with one more row", "x + 2.0 instead of x + 1.0"),
    ("check_compute_bound", (4096, "float32"), (256, "float32")),
    ("check_softmax_bound", "memory", "compute"),
    ("check_lowest_peak", "tpu fused eager", "tpu eager"),
    ("check_recompile_cause", "scalar type", "static value"),
    ("check_parity_layer", "clip", "head"),
    ("check_ddp_collective", "all_reduce", "all_gather"),
    ("check_ddp_bytes", 1284, 321),
    ("check_gpt_params", 85728, 85000),
    ("check_op_programs", 2, 3),
    pytest.param("check_fewer_programs", ex.FASTER_OPTIONS[0], ex.FASTER_OPTIONS[1],
                 marks=pytest.mark.slow),  # two generations compiled: ~a minute on 2 cores
]

COMPILE_ONCE_RIGHT = (
    'compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"buckets": [16]})\n')
CUSTOM_OP_RIGHT = ex.CUSTOM_OP_STARTER.replace("return x  # TODO", "return x / (1 + jnp.abs(x))")


def _call(name, answer):
    args = answer if isinstance(answer, tuple) else (answer,)
    return ex.check(getattr(ex, name), *args)


def _mentions(text, value) -> bool:
    """`value` in `text` as a whole word or number (3 is not in '13' or 'x3')."""
    return re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w])", text) is not None


# What a wrong verdict's hint points at: a tool or API, or a cell of the notebook.
_TOOLS = ("torch_tpu.", "torch._dynamo.explain", "torch.profiler", "model.parameters()",
          " cell")


@pytest.mark.parametrize("name,right,wrong", CASES)
def test_right_passes_wrong_fails(name, right, wrong):
    good = _call(name, right)
    assert good.answered and good.ok, good.why
    bad = _call(name, wrong)
    assert bad.answered and not bad.ok, bad.why
    # A wrong verdict hints where to look and keeps the measured answer for
    # "Show the answer": the right answer is not in the hint, it is in `answer`.
    truth = right[0] if isinstance(right, tuple) else right
    assert any(t in bad.why for t in _TOOLS), bad.why
    assert not _mentions(bad.why, truth), bad.why
    assert bad.answer and bad.answer not in bad.why, bad
    if name != "check_compute_bound":  # its answer is the least compute-bound size
        assert _mentions(bad.answer, truth), bad.answer
    if importlib.util.find_spec("marimo") is not None:  # the answer only in the folded control
        box, folded = ex.show(bad).text.split("<marimo-accordion", 1)
        assert not _mentions(re.sub(r"<[^>]*>", " ", box), truth), box
        assert ex.SHOW_ANSWER in folded


@pytest.mark.parametrize("answer", [None, "", "  "])
def test_default_answers_are_unanswered(answer):
    v = ex.check(ex.check_transfers, answer)
    assert not v.answered and "not answered" in v.why.lower()


def test_not_a_number_is_wrong_with_a_why():
    v = ex.check(ex.check_loop_programs, "three")
    assert v.answered and not v.ok and "whole number" in v.why


def test_compile_once_code_editor():
    starter = ex.check(ex.check_compile_once, ex.COMPILE_ONCE_STARTER,
                       starter=ex.COMPILE_ONCE_STARTER)
    assert not starter.answered
    # the starter, edited but still wrong: dynamo's static first graph, then two buckets
    wrong = ex.check(ex.check_compile_once, 'compiled = torch.compile(fn, backend="tpu")\n',
                     starter=ex.COMPILE_ONCE_STARTER)
    assert wrong.answered and not wrong.ok and "graph programs" in wrong.why, wrong.why
    right = ex.check(ex.check_compile_once, COMPILE_ONCE_RIGHT, starter=ex.COMPILE_ONCE_STARTER)
    assert right.ok, right.why


def test_compile_once_rejects_eager_and_broken_code():
    eager = ex.check_compile_once("compiled = fn\n")
    assert not eager.ok and "eagerly" in eager.why
    broken = ex.check_compile_once("compiled = torch.compile(fn, backend=\n")
    assert not broken.ok and "SyntaxError" in broken.why


def test_custom_op_code_editor():
    assert not ex.check(ex.check_custom_op, ex.CUSTOM_OP_STARTER,
                        starter=ex.CUSTOM_OP_STARTER).answered
    wrong_value = ex.check_custom_op(
        ex.CUSTOM_OP_STARTER.replace("return x  # TODO", "return x / (1 + x * x)"))
    assert not wrong_value.ok and "differs" in wrong_value.why
    not_an_op = ex.check_custom_op("op = torch.nn.functional.softsign\n")
    assert not not_an_op.ok and "jax_op" in not_an_op.why
    right = ex.check_custom_op(CUSTOM_OP_RIGHT)
    assert right.ok and "torch_tpu_jax." in right.why, right.why


def test_show_renders_each_kind():
    pytest.importorskip("marimo")
    for v, kind in ((ex.NOT_ANSWERED, "unanswered"), (ex.Verdict(True, "because"), "right"),
                    (ex.Verdict(False, "because"), "wrong")):
        html = ex.show(v).text
        assert f"exercise-{kind}" in html and "marimo-" not in html
        assert "because" in html or not v.answered
    # a wrong verdict with a measured answer: the hint in the box, the answer folded
    html = ex.show(ex.wrong("look with capture()", "measured: 42")).text
    box, folded = html.split("<marimo-accordion", 1)
    assert "exercise-wrong" in box and "look with capture()" in box and "42" not in box
    assert ex.SHOW_ANSWER in folded and "42" in folded


# --------------------------------------------------------------------------
# the notebooks

IN_SCOPE = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]
_CHECK_REF = re.compile(r"ex\.check\(ex\.(check_\w+)")


def _notebook(prefix):
    (path,) = NOTEBOOKS.glob(f"{prefix}_*.py")
    return path


@pytest.mark.parametrize("prefix", IN_SCOPE)
def test_notebook_ends_with_exercises(prefix):
    text = _notebook(prefix).read_text()
    assert "## Exercises" in text, prefix
    section = text[text.index("## Exercises"):]
    refs = _CHECK_REF.findall(section)
    assert 2 <= len(refs) <= 3, refs
    for name in refs:
        assert callable(getattr(ex, name, None)), f"{prefix}: no exercises.{name}"
    # every exercise has its solution folded away
    assert section.count('mo.accordion({"Solution"') == len(refs)


def test_every_check_is_used_by_a_notebook():
    used = set()
    for prefix in IN_SCOPE:
        used |= set(_CHECK_REF.findall(_notebook(prefix).read_text()))
    defined = {n for n in dir(ex) if n.startswith("check_") and callable(getattr(ex, n))}
    assert defined == used, defined ^ used
