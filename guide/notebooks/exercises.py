"""The checks behind the guide's exercises (imported by the notebooks as `exercises`).

Each notebook ends with exercises a learner answers in the notebook; a check
cell passes the answer to a `check_<name>(answer, ...)` function here, which
returns a `Verdict`: right or wrong, and why. The truth is measured by
running torch_tpu (programs compiled, transfers, fallbacks, roofline bounds,
collectives), not written down, so an exercise cannot drift from what the
code does. A wrong answer gets a hint, the cell or tool to look with, never
the measured answer: that is in `Verdict.answer`, which `show(verdict)`
puts behind a "Show the answer" control, so a learner who guesses still has
to look. `show(verdict)` draws the verdict as a coloured box; an answer
left at its default (None, '' or the starter code) is "not answered yet",
never wrong, so the notebooks run clean in tests and on the docs site.
tests/test_exercises.py feeds every check a right and a wrong answer, and
checks that a wrong verdict's text does not hold the answer.

Counting checks run their code on shapes this process has not used yet
(`_fresh`), so "how many programs compile" is measured the same the first
time and the tenth; a program found in the disk cache still counts (it is a
miss of the memory tier: compiled or loaded).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import sys
import textwrap
import traceback
import warnings

import torch

# --------------------------------------------------------------------------
# verdicts


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A check's answer: `ok` (right or wrong) and `why` (right: the explanation;
    wrong: a hint, where to look); `answered` False: nothing to judge.
    `answer`: the measured answer and its explanation, for a wrong verdict,
    shown only on request (`show`)."""

    ok: bool
    why: str
    answered: bool = True
    answer: str = ""


def wrong(hint: str, answer: str) -> Verdict:
    """A wrong answer: the `hint` says where to look; the measured `answer` waits
    behind "Show the answer"."""
    return Verdict(False, hint, answer=answer)


NOT_ANSWERED = Verdict(False, "Not answered yet.", answered=False)


def unanswered(answer, starter: str | None = None) -> bool:
    """True for an answer left at its default: None, blank text, or the starter code."""
    if answer is None:
        return True
    if isinstance(answer, str):
        return not answer.strip() or (starter is not None and answer.strip() == starter.strip())
    return False


def check(fn, answer, *args, starter: str | None = None, **kwargs) -> Verdict:
    """`fn(answer, ...)` unless the answer is still the default (then NOT_ANSWERED)."""
    if unanswered(answer, starter):
        return NOT_ANSWERED
    return fn(answer, *args, **kwargs)


_COLORS = {"right": "#2e7d32", "wrong": "#c62828", "unanswered": "#757575"}


SHOW_ANSWER = "Show the answer (measured here)"


def show(verdict: Verdict):
    """A verdict as a bordered box: green when right, red when wrong, grey when
    unanswered; a wrong one's measured answer folded under SHOW_ANSWER (a marimo
    accordion: closed until the learner opens it).

    Plain HTML rather than mo.callout, whose content lives in an attribute:
    the static docs page (tools/build_docs.py) keeps an element's children only.
    """
    import marimo as mo

    if not verdict.answered:
        kind, text = "unanswered", verdict.why
    else:
        kind = "right" if verdict.ok else "wrong"
        text = ("**Right.** " if verdict.ok else "**Not yet.** ") + verdict.why
    box = mo.Html(f'<div class="exercise-verdict exercise-{kind}" style="border-left:4px solid '
                  f'{_COLORS[kind]};padding:0.2em 0.8em;margin:0.4em 0">{mo.md(text).text}</div>')
    if verdict.ok or not verdict.answer:
        return box
    return mo.vstack([box, mo.accordion({SHOW_ANSWER: mo.md(verdict.answer)})])


def code(block: str):
    """A block of Python as a marimo Markdown code block (the exact text a check runs)."""
    import marimo as mo

    return mo.md("```python\n" + block.rstrip("\n") + "\n```")


def _number(answer) -> int | None:
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return None
    return int(value) if value == int(value) else None


def _count_verdict(answer, truth: int, what: str, why: str, hint: str) -> Verdict:
    """Right: the count and why. Wrong: whether it is more or fewer, and `hint`."""
    n = _number(answer)
    if n is None:
        return Verdict(False, f"{answer!r} is not a whole number: answer with a count.")
    if n == truth:
        return Verdict(True, f"{what}: {truth}. {why}")
    more = "more" if n > truth else "fewer"
    return wrong(f"You said {n}: {more} than measured here. {hint}", f"{what}: {truth}. {why}")


# --------------------------------------------------------------------------
# running things


_SIZES = itertools.count(1009)


def _fresh() -> int:
    """A size no other code in the guide uses, new at every call."""
    return next(_SIZES)


def _misses(fn) -> int:
    """Executables the memory tier did not have while `fn()` ran (compiled or loaded)."""
    import torch_tpu.debug as dbg

    torch.tpu.synchronize()
    with dbg.capture() as cap:
        fn()
        torch.tpu.synchronize()
    return cap.metrics["cache"]["misses"]


def run_code(code: str, **names) -> tuple[dict, str | None]:
    """Run a learner's code in a namespace of torch, torch_tpu, jax, jnp,
    functools and `names`; (namespace, None) or (namespace, the error it raised)."""
    import jax
    import jax.numpy as jnp

    import torch_tpu

    ns = {"torch": torch, "torch_tpu": torch_tpu, "jax": jax, "jnp": jnp,
          "functools": functools, "__name__": "exercise", **names}
    try:
        exec(compile(textwrap.dedent(code), "<your answer>", "exec"), ns)
    except Exception as e:  # noqa: BLE001 - a learner's code can raise anything
        return ns, _error_text(e)
    return ns, None


def _error_text(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<your answer>"]
    where = f" (line {frames[-1].lineno})" if frames else ""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"`{type(e).__name__}{where}: {first}`"


# --------------------------------------------------------------------------
# 01 · tensors


TRANSFERS_BLOCK = """\
x = torch.randn(n, 4, device="tpu")     # made on the device
y = (x * 2 + 1).relu()
if y.sum() > 0:
    y = y - y.mean()
total = y.sum().item()
back = y.cpu()
z = back.to("tpu") * 2
"""


def check_transfers(answer) -> Verdict:
    """01: how many times TRANSFERS_BLOCK waits for a value from the device (debug.capture:
    device -> host copies plus item() calls)."""
    import torch_tpu.debug as dbg

    ns: dict = {"torch": torch, "n": _fresh()}
    with dbg.capture() as cap:
        exec(TRANSFERS_BLOCK, ns)
    m = cap.metrics
    d2h = m["transfers"].get("device_to_host", {}).get("count", 0)
    h2d = m["transfers"].get("host_to_device", {}).get("count", 0)
    return _count_verdict(
        answer, d2h + m["item_calls"], "Reads of a device value",
        f"{m['item_calls']} scalar reads (`if y.sum() > 0` calls `bool()` on a tensor, then "
        f"`.item()`) and {d2h} copy to the host (`.cpu()`); the arithmetic only queued "
        f"programs. The other direction: {h2d} host -> device copy (`back.to('tpu')`); "
        "`randn(..., device='tpu')` made its data on the device.",
        "Run the block inside `with torch_tpu.debug.capture() as c:` and read "
        "`c['transfers']` and `c['item_calls']`, as the transfers cell above does; "
        "look for every line that needs a value on the host, not only `.item()`.")


DEVICE_DTYPE_EXPR = 'torch.arange(4, device="tpu") / 2 + torch.tensor(1.0)'
DEVICE_DTYPE_OPTIONS = ["tpu:0, torch.int64", "tpu:0, torch.float32", "cpu, torch.float32",
                        "tpu:0, torch.float64"]


def check_device_dtype(answer) -> Verdict:
    """01: the device and dtype of DEVICE_DTYPE_EXPR (evaluated)."""
    z = eval(DEVICE_DTYPE_EXPR, {"torch": torch})
    truth = f"{z.device}, {z.dtype}"
    why = ("`/` of integers is true division (float32, PyTorch's default float); the op "
           "runs on the device of its tensor operand, and a 0-dim CPU tensor joins a `tpu` op "
           "as a scalar, as it would with CUDA.")
    if str(answer) == truth:
        return Verdict(True, f"`{truth}`. {why}")
    return wrong(f"Not `{answer}`. Evaluate it in a cell and print `z.device, z.dtype`; "
                 "what does `/` give for integer tensors in PyTorch, and which operand decides "
                 "where an op runs when one is a 0-dim CPU tensor?", f"`{truth}`. {why}")


VIEW_BLOCK = """\
x = torch.ones(3, 4, device="tpu")
v = x.t()[1]          # a view: row 1 of the transpose
v.mul_(0)
"""


def check_view_write(answer) -> Verdict:
    """01: how many elements of x are zero after writing through the view (counted)."""
    ns: dict = {"torch": torch}
    exec(VIEW_BLOCK, ns)
    zeros = int((ns["x"] == 0).sum().item())
    return _count_verdict(
        answer, zeros, "Zeros in x",
        "`x.t()[1]` is column 1 of x (3 elements), on x's own storage; the in-place `mul_` "
        "replaced the storage's array, so x sees the write.",
        "Run the block and print `x` (or `x == 0`); which elements of `x` is row 1 of "
        "`x.t()`? The views cell (section on views and in-place ops) shows a write "
        "through a transpose.")


# --------------------------------------------------------------------------
# 02 · ops and lowering


LOOP_BLOCK = """\
for i in range(10):
    y = torch.relu(x @ w + i)
"""


def check_loop_programs(answer) -> Verdict:
    """02: executables the strict-mode loop compiles (memory-tier misses, fresh shapes)."""
    import torch_tpu.debug as dbg

    n = _fresh()
    x = torch.randn(n, 8, device="tpu")
    w = torch.randn(8, 8, device="tpu")
    ns = {"torch": torch, "x": x, "w": w}
    torch.tpu.synchronize()
    with dbg.capture() as cap:
        exec(LOOP_BLOCK, ns)
        torch.tpu.synchronize()
    ops = ", ".join(f"`{k}` x{v}" for k, v in cap.metrics["ops"].items())
    return _count_verdict(
        answer, cap.metrics["cache"]["misses"], "Executables compiled",
        f"The loop ran {ops}. One executable per distinct (op, shapes, dtypes): the first "
        "iteration compiles each op, the other nine hit the cache, and the Python scalar `i` "
        "is a runtime input, not part of the key.",
        "Run the loop inside `torch_tpu.debug.capture()` and read `c['cache']['misses']` "
        "(or `torch_tpu.debug.compile_log()`): one program per distinct op, shapes and "
        "dtypes; is the Python `i` part of that key?")


_FALLBACK_LIB = None


def fallback_ops():
    """guide_ex::{rowscale (lowered), ranks (CPU kernel only), softsign (decomposes)}."""
    global _FALLBACK_LIB
    if _FALLBACK_LIB is None:
        import jax.numpy as jnp

        from torch_tpu.ops.registry import lower

        lib = torch.library.Library("guide_ex", "DEF")
        lib.define("rowscale(Tensor x) -> Tensor")
        lib.define("ranks(Tensor x) -> Tensor")
        lib.define("softsign(Tensor x) -> Tensor")
        lib.impl("rowscale", lambda x: x / x.abs().amax(-1, keepdim=True), "CPU")
        lib.impl("ranks", lambda x: x.argsort(-1).argsort(-1).to(x.dtype), "CPU")
        lib.impl("softsign", lambda x: x / (1 + x.abs()), "CompositeImplicitAutograd")
        lib.impl("rowscale", torch.empty_like, "Meta")
        lib.impl("ranks", torch.empty_like, "Meta")

        @lower(torch.ops.guide_ex.rowscale.default)
        def _rowscale(x):
            return x / jnp.max(jnp.abs(x), axis=-1, keepdims=True)

        _FALLBACK_LIB = lib
    return torch.ops.guide_ex


FALLBACK_BLOCK = """\
ex = torch.ops.guide_ex
x = torch.randn(4, 6, device="tpu")
y = ex.rowscale(x)
y = ex.softsign(y) + torch.cumsum(y, dim=-1)
y = ex.ranks(y) * torch.sigmoid(y)
"""
FALLBACK_OPTIONS = ["guide_ex.rowscale", "guide_ex.softsign", "guide_ex.ranks", "aten.cumsum",
                    "aten.sigmoid"]


def check_fallback_op(answer) -> Verdict:
    """02: the op of FALLBACK_BLOCK that ran on the CPU (debug.capture's fallbacks)."""
    import torch_tpu.debug as dbg

    fallback_ops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dbg.capture() as cap:
            exec(FALLBACK_BLOCK, {"torch": torch})
    fell = sorted({k.rsplit(".", 1)[0] for k in cap.metrics["fallbacks"]})
    why = (f"`torch_tpu.debug.fallback_report()` (or `capture()['fallbacks']`) lists "
           f"{', '.join(f'`{f}`' for f in fell) or 'nothing'}: that op has only a CPU kernel and "
           "no lowering. `rowscale` has a lowering; `softsign` decomposes into ATen ops that "
           "have one, so it stays on the device.")
    if str(answer) in fell:
        return Verdict(True, why)
    return wrong(f"`{answer}` ran on the device. Run the block, then "
                 "`torch_tpu.debug.fallback_report()` (or read `capture()['fallbacks']`): it "
                 "lists the ops that ran on the CPU. An op stays on the device when it has a "
                 "lowering or decomposes into ops that have one.", why)


# --------------------------------------------------------------------------
# 03 · autograd


BACKWARD_BLOCK = """\
x = torch.randn(8, 16, device="tpu")
w = torch.randn(16, 4, device="tpu", requires_grad=True)
loss = torch.nn.functional.gelu(x @ w).sum()
loss.backward()
"""
BACKWARD_OPTIONS = ["aten.tanh_backward.default", "aten.gelu_backward.default",
                    "aten.sigmoid_backward.default", "aten.threshold_backward.default"]


def check_backward_op(answer) -> Verdict:
    """03: which of BACKWARD_OPTIONS the backward of BACKWARD_BLOCK runs on tpu (captured)."""
    import torch_tpu.debug as dbg

    ns: dict = {"torch": torch}
    exec(BACKWARD_BLOCK.replace("loss.backward()\n", ""), ns)
    with dbg.capture() as cap:
        ns["loss"].backward()
    ran = cap.metrics["ops"]
    listed = ", ".join(f"`{k}`" for k in ran)
    where = "and none fell back to the CPU" if not cap.metrics["fallbacks"] else \
        f"(CPU fallbacks: {cap.metrics['fallbacks']})"
    why = (f"The backward ran {listed} on the device {where}: autograd's backward formulas "
           "are ATen ops, lowered to XLA like the forward ones.")
    if str(answer) in ran:
        return Verdict(True, why)
    return wrong(f"`{answer}` did not run. Run the backward inside "
                 "`with torch_tpu.debug.capture() as c:` and read `c['ops']`; each forward op "
                 "has its own backward formula.", why)


def check_steady_compiles(answer) -> Verdict:
    """03: executables compiled by the 3rd step of an SGD-momentum loop (fresh shapes)."""
    n = _fresh()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(),
                                torch.nn.Linear(7, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(n, 5, device="tpu"), torch.randn(n, 1, device="tpu")

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    per_step = [_misses(step) for _ in range(3)]
    return _count_verdict(
        answer, per_step[2], "Executables compiled by step 3",
        f"Steps 1, 2, 3 compiled {per_step[0]}, {per_step[1]}, {per_step[2]}. Step 1 compiles "
        "every op of forward, backward and update; step 2 only the momentum update's ops (the "
        "buffers exist from then on); later steps repeat the same ops on the same shapes, so "
        "every executable is a cache hit.",
        "Count per step: `torch_tpu.debug.capture()` around each of three steps, "
        "`c['cache']['misses']`. Which ops run for the first time after step one (the "
        "optimizer's momentum buffers), and what is left to compile after that?")


# --------------------------------------------------------------------------
# 04 · torch.compile


COMPILE_ONCE_FN = """\
def fn(x):                      # x: (2, length, d)
    s = (x @ proj) @ x.transpose(-1, -2)
    return torch.softmax(s, dim=-1).sum(dim=-1)
"""
COMPILE_ONCE_STARTER = """\
# `fn` and `proj` are defined above. Make `compiled` a compiled version of
# `fn` that, after a first call at length 3, compiles ONE graph program for
# all the lengths 5, 6, ..., 12.
compiled = torch.compile(fn, backend="tpu")
"""


def check_compile_once(code) -> Verdict:
    """04: after a call at length 3, the learner's `compiled` runs lengths 5..12 with one
    graph program (compile log events, disk loads included) and fn's values."""
    import torch_tpu.debug as dbg

    d = _fresh() - 992                       # a new feature size: no cached graph matches
    proj = torch.randn(d, d, device="tpu") / d
    ns: dict = {"torch": torch, "proj": proj, "__name__": "exercise"}
    exec(COMPILE_ONCE_FN, ns)                # a new code object: dynamo starts from scratch
    fn = ns["fn"]
    ns, err = run_code(code, fn=fn, proj=proj)
    if err:
        return Verdict(False, f"Your code raised {err}.")
    compiled = ns.get("compiled")
    if not callable(compiled):
        return Verdict(False, "Define `compiled`: a callable, e.g. `torch.compile(fn, ...)`.")
    proj_cpu = proj.cpu()
    worst = 0.0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(torch.randn(2, 3, d, device="tpu")).cpu()
            before = len(dbg.compile_log(kind="graph"))
            for length in range(5, 13):
                x = torch.randn(2, length, d)
                want = torch.softmax((x @ proj_cpu) @ x.transpose(-1, -2), dim=-1).sum(dim=-1)
                got = compiled(x.to("tpu")).cpu()
                worst = max(worst, (got - want).abs().max().item())
    except Exception as e:  # noqa: BLE001 - the learner's callable
        return Verdict(False, f"Calling `compiled` raised {_error_text(e)}.")
    events = dbg.compile_log(kind="graph")[before:]
    names = ", ".join(e.name for e in events)
    if worst > 1e-4:
        return Verdict(False, f"The results differ from `fn`'s by {worst:.1e}.")
    if len(events) == 1:
        return Verdict(True, f"One graph program ({names}) served all eight lengths, with "
                       "`fn`'s values: the length is symbolic from the first call, and every "
                       "length pads to one bucket (the padding masked out of the softmax).")
    if not events:
        return Verdict(False, "No graph program was compiled for lengths 5..12: `compiled` "
                       "ran eagerly. Use `torch.compile(fn, backend=\"tpu\", ...)`.")
    return Verdict(False, f"{len(events)} graph programs ({names}) for lengths 5..12. Dynamo "
                   "compiles the first length it sees as static and makes the length symbolic "
                   "only when it changes; torch_tpu runs a size exactly until it has seen it "
                   "change, then pads to the default buckets (8, 16, ...), which split 5..12 in "
                   "two. Make the length dynamic from the start and give it one bucket.")


BREAKS_FN = """\
def f(x):
    y = torch.sin(x) * 2
    if y.sum().item() > 0:
        y = y + 1
    scale = float(y.abs().max())
    return torch.cos(y) * scale
"""


def check_graph_breaks(answer) -> Verdict:
    """04: graph breaks dynamo makes in BREAKS_FN (torch._dynamo.explain)."""
    import logging

    import torch._dynamo

    import torch_tpu.compile

    torch_tpu.compile.register()   # dynamo skips torch_tpu's kernels (`.item()` between graphs)
    ns: dict = {"torch": torch, "__name__": "exercise"}
    exec(BREAKS_FN, ns)
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exp = torch._dynamo.explain(ns["f"])(torch.randn(4, 4, device="tpu"))
    finally:
        log.setLevel(level)
    reasons = "; ".join(str(r.reason).splitlines()[0] for r in exp.break_reasons)
    return _count_verdict(
        answer, exp.graph_break_count, "Graph breaks",
        f"`torch._dynamo.explain` reports {exp.graph_count} graphs ({reasons}). Each read of a "
        "tensor's value on the host (`.item()`, `float(tensor)`) ends the graph.",
        "`torch._dynamo.explain(f)(x)` (the graph-break cell above) reports the graphs and "
        "each break's reason; look for every line where `f` needs a tensor's value in Python.")


# --------------------------------------------------------------------------
# 05 · the compile cache


def check_disk_hits(answer) -> Verdict:
    """05: executables the disk tier serves after clear(memory) (a temporary cache directory)."""
    import tempfile

    import torch_tpu.cache as cache

    old = cache.cache_dir()
    with tempfile.TemporaryDirectory(prefix="torch_tpu_exercise_") as tmp:
        cache.set_dir(tmp)
        try:
            x = torch.randn(_fresh(), 24, device="tpu")

            def call():
                torch.nn.functional.gelu(x @ x.T).sum().item()

            call()
            cache.clear(memory=True, disk=False)
            before = cache.stats()["disk"]["hits"]
            call()
            hits = cache.stats()["disk"]["hits"] - before
            cache.clear(memory=False, disk=True)
        finally:
            cache.set_dir(old)  # before the directory goes
    return _count_verdict(
        answer, hits, "Executables loaded from the disk tier",
        "One per op of the call (matmul, gelu, sum; `x.T` is a view and runs nothing of its "
        "own): the memory tier was empty, the disk tier held each op's serialized executable "
        "from the first call, found by the op's key without tracing it again.",
        "Run the call, `torch_tpu.cache.clear(memory=True, disk=False)`, run it again and "
        "compare `torch_tpu.cache.stats()['disk']['hits']` before and after (the stats cell "
        "above); which of the call's ops run a program of their own (is `x.T` one)?")


CACHE_KEY_OPTIONS = ["x + 2.0 instead of x + 1.0", "new random values in x",
                     "x with one more row", "x in bfloat16"]


def check_cache_key(answer) -> Verdict:
    """05: whether the chosen change makes `x + 1.0` compile again (misses measured)."""
    if answer not in CACHE_KEY_OPTIONS:
        return Verdict(False, f"Pick one of: {', '.join(CACHE_KEY_OPTIONS)}.")
    n = _fresh()
    x = torch.randn(n, 5, device="tpu")
    (x + 1.0).cpu()                                  # the executable is in the cache now
    variants = {CACHE_KEY_OPTIONS[0]: (x, 2.0),
                CACHE_KEY_OPTIONS[1]: (torch.randn(n, 5, device="tpu"), 1.0),
                CACHE_KEY_OPTIONS[2]: (torch.randn(n + 1, 5, device="tpu"), 1.0),
                CACHE_KEY_OPTIONS[3]: (x.to(torch.bfloat16), 1.0)}
    results = {}
    for option, (t, s) in variants.items():
        results[option] = _misses(lambda t=t, s=s: (t + s).cpu())
    why = ("The key is the op overload, the inputs' shapes, dtypes and layouts, and the static "
           "arguments; values and Python scalars are runtime inputs. Measured: "
           + ", ".join(f"{o}: {'compiles' if m else 'cache hit'}" for o, m in results.items())
           + ".")
    if results[answer]:
        return Verdict(True, why)
    return wrong(f"'{answer}' is a cache hit: it compiles nothing. Try each change after "
                 "`(x + 1.0)` inside `torch_tpu.debug.capture()` and read "
                 "`c['cache']['misses']`; the key holds what a program is specialised on, "
                 "not the values it runs on.", why)


# --------------------------------------------------------------------------
# 06 · debugging


RECOMPILE_BLOCK = """\
lin = torch.nn.Linear(16, 16).to("tpu")

def step(p, scale):
    h = torch.nn.functional.dropout(lin(torch.randn(n, 16, device="tpu")), p=p)
    return (h * scale).sum().item()

step(0.1, 0.5)       # the first step compiles every op
step(0.3, 0.5)       # dropout's p changes
step(0.3, 2)         # the scale is 2, not 2.0
step(0.3, 1.5)       # and a float again
"""
RECOMPILE_OPTIONS = ["shape", "dtype", "static value", "scalar type",
                     "nothing: it does not compile again"]
RECOMPILE_OP = "aten.mul.Tensor"


def check_recompile_cause(answer) -> Verdict:
    """06: the cause `explain_recompiles()` names for RECOMPILE_OP in RECOMPILE_BLOCK's
    steps after the first (run on a fresh batch size, so the first step compiles)."""
    import torch_tpu.debug as dbg

    ns: dict = {"torch": torch, "n": _fresh()}
    first, rest = RECOMPILE_BLOCK.split("# the first step compiles every op\n")
    exec(first, ns)
    torch.tpu.synchronize()
    with dbg.capture() as cap:
        exec(rest, ns)
    report = dbg.explain_recompiles(events=cap.compiles)
    evs = report.groups.get(RECOMPILE_OP, [])
    causes = list(dict.fromkeys(c for ev in evs for c in ev.reason.causes))
    truth = causes[0] if len(causes) == 1 else (RECOMPILE_OPTIONS[-1] if not causes else None)
    lines = "; ".join(f"`{name}`: {', '.join(str(ev.reason) for ev in group)}"
                      for name, group in report.groups.items())
    why = (f"`explain_recompiles()` of the last three steps: {lines or 'no recompiles'}. "
           "A Python number's *value* is a runtime input of the program (0.5 -> 1.5 compiles "
           "nothing), its *type* is part of the key: `2` is an int, so `h * 2` compiles "
           "again, and `1.5` hits the float program. dropout's `p` is a static value of "
           "`native_dropout`'s program, not of the multiply.")
    if truth is not None and str(answer) == truth:
        return Verdict(True, why)
    return wrong(f"Not `{answer}`. Run the steps inside `torch_tpu.debug.capture() as c` and "
                 "print `torch_tpu.debug.explain_recompiles(events=c.compiles)` (the recompiles "
                 f"cell above): it names a cause per op; read `{RECOMPILE_OP}`'s, and compare "
                 "the arguments of the calls that compiled again.",
                 f"The report names {', '.join(f'`{c}`' for c in causes) or 'nothing'} for "
                 f"`{RECOMPILE_OP}`. {why}")


_PARITY_LIB = None


def parity_ops():
    """guide_ex06::{swish, softclip}: a CPU kernel each and a lowering each; softclip's
    lowering is wrong on purpose (a hard clip where the CPU kernel is a soft one)."""
    global _PARITY_LIB
    if _PARITY_LIB is None:
        import jax
        import jax.numpy as jnp

        from torch_tpu.ops.registry import lower

        lib = torch.library.Library("guide_ex06", "DEF")
        lib.define("swish(Tensor x) -> Tensor")
        lib.define("softclip(Tensor x) -> Tensor")
        lib.impl("swish", lambda x: x * torch.sigmoid(x), "CPU")
        lib.impl("softclip", lambda x: 2 * torch.tanh(x / 2), "CPU")
        lib.impl("swish", torch.empty_like, "Meta")
        lib.impl("softclip", torch.empty_like, "Meta")

        @lower(torch.ops.guide_ex06.swish.default)
        def _swish(x):
            return x * jax.nn.sigmoid(x)

        @lower(torch.ops.guide_ex06.softclip.default)
        def _softclip(x):  # the planted bug: 2 * tanh(x / 2) on the CPU
            return jnp.clip(x, -2.0, 2.0)

        _PARITY_LIB = lib
    return torch.ops.guide_ex06


class CustomOp(torch.nn.Module):
    """A layer that calls one op of guide_ex06 (see parity_ops)."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, x):
        return getattr(parity_ops(), self.op)(x)

    def extra_repr(self) -> str:
        return f"guide_ex06.{self.op}"


PARITY_BLOCK = """\
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(collections.OrderedDict([
        ("embed", torch.nn.Linear(16, 32)),
        ("act", ex.CustomOp("swish")),       # torch.ops.guide_ex06.swish
        ("proj", torch.nn.Linear(32, 32)),
        ("clip", ex.CustomOp("softclip")),   # torch.ops.guide_ex06.softclip
        ("norm", torch.nn.LayerNorm(32)),
        ("head", torch.nn.Linear(32, 4)),
    ]))

x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
"""
PARITY_OPTIONS = ["embed", "act", "proj", "clip", "norm", "head"]


def check_parity_layer(answer) -> Verdict:
    """06: the first layer of PARITY_BLOCK's model whose tpu output differs from the CPU's
    (debug.parity, first_divergence)."""
    import collections

    import torch_tpu.debug as dbg

    parity_ops()
    ns: dict = {"torch": torch, "collections": collections, "ex": sys.modules[__name__]}
    exec(PARITY_BLOCK, ns)
    report = dbg.parity(ns["make_model"](), ns["x"])
    first = report.first_divergence(atol=1e-4, rtol=1e-3)
    truth = first.name if first is not None else None
    diffs = ", ".join(f"`{r.name}` {r.max_abs:.1e}" for r in report.rows if r.name)
    why = (f"`torch_tpu.debug.parity(make_model(), x)` measured the largest difference per "
           f"layer: {diffs}. Every layer after the first bad one differs too (it gets a "
           "different input), so the culprit is the *first* divergence, not the output where "
           "you notice it: `first_divergence()` names it. Here `softclip`'s lowering is a hard "
           "clip, where its CPU kernel is `2 * tanh(x / 2)`.")
    if truth is not None and str(answer) == truth:
        return Verdict(True, why)
    return wrong(f"Not `{answer}`. Run `torch_tpu.debug.parity(make_model(), x)` (the parity "
                 "cell above) and read the difference per layer, or "
                 "`report.first_divergence()`: the layer where you notice a difference is not "
                 "always the one that makes it.",
                 f"The first layer that diverges is `{truth}`. {why}")


# --------------------------------------------------------------------------
# 07 · performance


MATMUL_DTYPES = ["float32", "bfloat16"]


def _matmul_roofline(n: int, dtype: str, device: str):
    import torch_tpu.debug as dbg
    from torch_tpu.debug.roofline import reference_peaks

    a = torch.zeros(n, n, device="tpu", dtype=getattr(torch, dtype))
    prog = dbg.lower(lambda p, q: p @ q, a, a)
    ref = reference_peaks(device)
    return dbg.roofline(prog, repeats=0, host=ref, device=device)


def _cpu_dtype_note(dtype: str) -> str:
    from torch_tpu.runtime import platform

    if dtype != "bfloat16" or platform.platform() != "cpu":
        return ""
    return (" The bytes are those of the program compiled here: XLA:CPU computes a bfloat16 "
            "dot in float32, so its converts add bytes, where a TPU's MXU halves them.")


def check_compute_bound(n, dtype, device: str = "v6e") -> Verdict:
    """07: an n x n matmul in `dtype` is compute-bound on `device` (XLA's cost analysis)."""
    size = _number(n)
    if size is None or not 1 <= size <= 8192:
        return Verdict(False, "Give the matrix size n as a whole number from 1 to 8192.")
    if dtype not in MATMUL_DTYPES:
        return Verdict(False, f"Choose the dtype ({', '.join(MATMUL_DTYPES)}).")
    rep = _matmul_roofline(size, dtype, device)
    ref = rep.reference
    per_n = rep.intensity / size  # a square matmul's intensity grows as n
    why = (f"XLA counts {rep.flops:.3g} FLOP and {rep.bytes_accessed:.3g} bytes: intensity "
           f"{rep.intensity:.0f} FLOP/byte against the {ref.name}'s ridge of {ref.ridge:.0f}. "
           "A square matmul does 2n³ FLOPs while it reads and writes about 3n² elements, so "
           "its intensity grows with n." + _cpu_dtype_note(dtype))
    if rep.reference_bound == "compute":
        return Verdict(True, f"Compute-bound on the {ref.name}. {why}")
    return wrong(f"A {size}×{size} {dtype} matmul is not compute-bound on the {ref.name}: its "
                 f"intensity is {rep.intensity:.0f} FLOP/byte. Compare it with the device's "
                 "ridge point (`torch_tpu.debug.roofline(prog, device=...)` prints both, as in "
                 "the roofline section); how do a matmul's FLOPs and bytes grow with n?",
                 f"Compute-bound from about n = {math.ceil(ref.ridge / per_n)} in {dtype} "
                 f"here (the ridge {ref.ridge:.0f} ÷ {per_n:.3f} FLOP/byte per unit of n). "
                 + why)


BOUND_OPTIONS = ["compute", "memory"]


def check_softmax_bound(answer, device: str = "v6e") -> Verdict:
    """07: the roof that bounds softmax over a (2048, 2048) float32 array on `device`."""
    import torch_tpu.debug as dbg
    from torch_tpu.debug.roofline import reference_peaks

    x = torch.zeros(2048, 2048, device="tpu")
    prog = dbg.lower(lambda t: torch.softmax(t, dim=-1), x)
    rep = dbg.roofline(prog, repeats=0, host=reference_peaks(device), device=device)
    truth = rep.reference_bound
    why = (f"{rep.flops:.3g} FLOP over {rep.bytes_accessed:.3g} bytes: {rep.intensity:.2f} "
           f"FLOP/byte, far below the {rep.reference.name}'s ridge ({rep.reference.ridge:.0f}). "
           "Elementwise ops and reductions do a few FLOPs per element they read: memory "
           "bandwidth bounds them on every accelerator.")
    if answer == truth:
        return Verdict(True, f"{truth.capitalize()}-bound. {why}")
    return wrong("Not that roof. Lower it (`torch_tpu.debug.lower`) and pass it to "
                 f"`torch_tpu.debug.roofline(prog, device='{device}')`: compare its FLOP per "
                 "byte with the ridge point. How many FLOPs does softmax do per element it "
                 "reads and writes?", f"It is {truth}-bound. {why}")


PEAK_OPTIONS = ["tpu eager", "tpu fused eager", "tpu compiled"]


def _mlp_step(path: str):
    """One SGD step of a small MLP on `path` (PEAK_OPTIONS), warmed up."""
    import torch_tpu

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    fwd = torch.compile(model, backend="tpu") if path == "tpu compiled" else model
    x = torch.randn(64, 256, device="tpu")
    y = torch.randint(0, 10, (64,), device="tpu")

    def step():
        with torch_tpu.fused(path == "tpu fused eager"):
            loss = torch.nn.functional.cross_entropy(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    for _ in range(2):
        step()
    return step


def step_peak(step) -> int:
    """Bytes that one call of `step` adds at its peak, from a memory history."""
    import torch_tpu.debug as dbg

    torch.tpu.synchronize()
    torch.tpu.memory._record_memory_history()
    try:
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        step()
        torch.tpu.synchronize()
        return dbg.memory_timeline(None).peak - base
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)


@functools.lru_cache(maxsize=1)
def step_peaks() -> dict:
    """07: {path: bytes added at the peak} for one step of the same MLP on each path."""
    return {path: step_peak(_mlp_step(path)) for path in PEAK_OPTIONS}


def check_lowest_peak(answer) -> Verdict:
    """07: the path whose training step peaks lowest above its start."""
    peaks = step_peaks()
    low = min(peaks.values())
    lowest = [p for p, v in peaks.items() if v == low]
    table = ", ".join(f"{p}: {v / 1024:.1f} KiB" for p, v in peaks.items())
    why = (f"Measured above each step's start: {table}. In fused mode the step runs as one "
           "program that donates the old parameters' buffers, so the update writes in place "
           "and the intermediates never leave the program; strict eager and the compiled "
           "forward/backward keep gradients and activations as arrays, and the eager "
           "optimizer's in-place update makes each new parameter while the old one lives.")
    if answer in lowest:
        return Verdict(True, why)
    return wrong("Record one step of each path (the cell above does) and compare their "
                 "`memory_timeline(...).peak`. What happens to a parameter's old value "
                 "when the optimizer updates it in place, on each path?",
                 f"{' and '.join(lowest)}. {why}")


# --------------------------------------------------------------------------
# 08 · distributed


COLLECTIVE_OPTIONS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
DDP_MODEL = "torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))"


@functools.lru_cache(maxsize=1)
def ddp_collectives() -> tuple:
    """(collective, bytes) DDP's backward runs for DDP_MODEL: one step profiled, world size 1.

    gloo on the CPU in this process (the tpu backend needs its own processes):
    DDP's reducer issues the same collectives on every backend.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import profile

    if dist.is_initialized():
        raise RuntimeError("this check starts its own process group: run it where none exists")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = eval(DDP_MODEL, {"torch": torch})
        ddp = DistributedDataParallel(model)
        x = torch.randn(4, 8)
        with profile(record_shapes=True) as prof:
            ddp(x).pow(2).sum().backward()
        size = next(model.parameters()).element_size()
        found = []
        for e in prof.events():
            if e.name.startswith("gloo:"):
                numel = sum(int(torch.Size(s).numel()) for s in e.input_shapes if s)
                found.append((e.name.removeprefix("gloo:"), numel * size))
    finally:
        dist.destroy_process_group()
    return tuple(found)


def check_ddp_collective(answer) -> Verdict:
    """08: the collective DDP runs in backward (profiled)."""
    found = ddp_collectives()
    names = sorted({name for name, _ in found})
    why = (f"Profiled one DDP step: {', '.join(f'`{n}`' for n in names)}. The gradients of the "
           "replicas are summed (and divided by the world size) in place, in buckets, while the "
           "backward still runs: every rank ends with the same averaged gradient.")
    if answer in names:
        return Verdict(True, why)
    return wrong(f"DDP does not run `{answer}` per step. Profile one DDP step "
                 "(`torch.profiler.profile`) and look for the `gloo:` events; what must happen "
                 "to the replicas' gradients so that every rank takes the same step?", why)


def check_ddp_bytes(answer) -> Verdict:
    """08: bytes DDP all-reduces per step for DDP_MODEL (profiled)."""
    found = ddp_collectives()
    total = sum(b for _, b in found)
    model = eval(DDP_MODEL, {"torch": torch})
    numels = " + ".join(str(p.numel()) for p in model.parameters())
    return _count_verdict(
        answer, total, "Bytes all-reduced per step",
        f"{len(found)} all-reduce of every gradient once: {numels} parameters × 4 bytes "
        "(float32), whatever the batch size. Data parallelism's communication grows with the "
        "model, not with the data.",
        "Count what DDP sends: every gradient once, so sum `p.numel()` over "
        "`model.parameters()` and multiply by the bytes per element; does the batch "
        "size enter?")


# --------------------------------------------------------------------------
# 09 · models


def _gpt_for_sort():
    import dataclasses as dc

    from examples.mingpt.model import CONFIGS, GPT, SortTask

    task = SortTask(length=6, num_digits=3, seed=0)
    cfg = dc.replace(CONFIGS["tiny"], vocab_size=3, block_size=task.block_size)
    return GPT(cfg), cfg


def check_gpt_params(answer) -> Verdict:
    """09: parameters of notebook 09's minGPT (counted from the model)."""
    model, cfg = _gpt_for_sort()
    total = sum(p.numel() for p in model.parameters())
    parts: dict = {}
    for name, p in model.named_parameters():
        key = name.split(".")[1] if name.startswith("transformer.") else name.split(".")[0]
        parts[key] = parts.get(key, 0) + p.numel()
    breakdown = ", ".join(f"{k} {v:,}" for k, v in parts.items())
    return _count_verdict(
        answer, total, "Parameters",
        f"By module: {breakdown}. Each block holds about 12·d² weights (attention 4·d², MLP "
        "8·d²), so at this width the embeddings and biases are a visible part.",
        "Build the model (the minGPT cell above) and sum `p.numel()` over "
        "`model.parameters()`, or by module with `model.named_parameters()`: embeddings, "
        "biases and layer norms count too.")


FASTER_OPTIONS = ["with the KV cache", "without the KV cache (recompute the sequence)"]


@functools.lru_cache(maxsize=1)
def generation_programs() -> dict:
    """Executables compiled by 3 new tokens of the tiny Llama, with and without its cache."""
    from examples.common.generation import generate
    from examples.llama.model import CONFIGS, Llama

    torch.manual_seed(0)
    model = Llama(CONFIGS["tiny"]).eval().to("tpu")
    out = {}
    for option, use_cache in zip(FASTER_OPTIONS, (True, False)):
        prompt = torch.randint(32, 127, (1, _fresh() % 50 + 3))  # a new prompt length
        with torch.no_grad():
            out[option] = _misses(lambda p=prompt, u=use_cache: generate(model, p.to("tpu"), 3,
                                                                        use_cache=u))
    return out


def check_fewer_programs(answer) -> Verdict:
    """09: which generation path compiles fewer executables (measured)."""
    counts = generation_programs()
    best = min(counts, key=counts.get)
    why = ("Measured for 3 new tokens from a new prompt: "
           + ", ".join(f"{k}: {v} executables" for k, v in counts.items())
           + ". Without the cache every token runs the model on a longer sequence, a new shape "
           "and so new programs for every op; with it each decoding step has the same shapes "
           "(one token against a cache of fixed length) and reuses the first step's programs.")
    if answer == best:
        return Verdict(True, why)
    return wrong("Count what each path compiles: `torch_tpu.debug.capture()` around "
                 "`generate(model, prompt, 3, use_cache=...)` for both, and read "
                 "`c['cache']['misses']`. Which path gives each decoding step the same shapes "
                 "as the step before?", why)


# --------------------------------------------------------------------------
# 10 · custom ops


CUSTOM_OP_STARTER = """\
# softsign(x) = x / (1 + |x|), written in jax.numpy, as a PyTorch operator:
def softsign_jax(x):
    return x  # TODO

op = torch_tpu.jax_op(softsign_jax)
"""


def check_custom_op(code) -> Verdict:
    """10: the learner's `op` is a jax_op computing softsign, value and gradient, on tpu."""
    import torch_tpu.debug as dbg
    from torch_tpu.jax_op import JaxOp

    ns, err = run_code(code)
    if err:
        return Verdict(False, f"Your code raised {err}.")
    op = ns.get("op")
    if not isinstance(op, JaxOp):
        return Verdict(False, "Define `op = torch_tpu.jax_op(your_jax_function)`.")
    warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel")
    x_cpu = torch.linspace(-4, 4, 9 * 7).reshape(9, 7)
    x = x_cpu.to("tpu").requires_grad_()
    try:
        with dbg.capture() as cap:
            y = op(x)
            (y * y).sum().backward()
            y_cpu, g_cpu = y.detach().cpu(), x.grad.cpu()
    except Exception as e:  # noqa: BLE001 - the learner's operator
        return Verdict(False, f"Calling `op` raised {_error_text(e)}.")
    ref_x = x_cpu.clone().requires_grad_()
    ref = torch.nn.functional.softsign(ref_x)
    (ref * ref).sum().backward()
    if y_cpu.shape != ref.shape or not torch.allclose(y_cpu, ref.detach(), atol=1e-5):
        return Verdict(False, "`op(x)` differs from `torch.nn.functional.softsign(x)` "
                       f"(largest difference {(y_cpu - ref.detach()).abs().max().item():.2g}).")
    if not torch.allclose(g_cpu, ref_x.grad, atol=1e-4):
        return Verdict(False, "The value is right but the gradient is not.")
    mine = [k for k in cap.metrics["ops"] if k.startswith("torch_tpu_jax.")]
    return Verdict(True, f"Value and gradient match PyTorch's softsign; on `tpu` it ran as "
                   f"{', '.join(f'`{k}`' for k in mine)} (forward and its `jax.vjp` backward), "
                   f"{cap.metrics['fallbacks_total']} CPU fallbacks.")


SHAPES_BLOCK = """\
op(torch.randn(8, n, device="tpu"))
op(torch.randn(8, n, device="tpu"))
op(torch.randn(4, n, device="tpu"))
"""


def check_op_programs(answer) -> Verdict:
    """10: executables a jax_op's forward compiles for SHAPES_BLOCK (fresh shapes, no grad)."""
    op = _squash_op()
    n = _fresh()
    xs = [torch.randn(8, n, device="tpu"), torch.randn(8, n, device="tpu"),
          torch.randn(4, n, device="tpu")]
    compiled = _misses(lambda: [op(x) for x in xs])
    return _count_verdict(
        answer, compiled, "Executables compiled",
        "A jax_op is cached like any ATen op: one executable per input shape and dtype. The "
        "second call has the first one's shape (a hit); (4, n) is a new shape.",
        "Run the three calls inside `torch_tpu.debug.capture()` and read "
        "`c['cache']['misses']`: a jax_op is cached like an ATen op; which calls have an "
        "input shape not seen before?")


@functools.lru_cache(maxsize=1)
def _squash_op():
    import jax.numpy as jnp

    import torch_tpu

    return torch_tpu.jax_op(lambda x: jnp.tanh(x) * 0.5, name="guide_ex_squash", vjp=False)
