# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""06 · Debugging: metrics, the compile log, program dumps, per-layer parity vs CPU, common errors."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="06 · Debugging")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 06 · Debugging

    `torch_tpu.debug` answers the questions you have when a model is slow or
    wrong on the device:

    | question | tool |
    |:---|:---|
    | what ran, how often, what compiled, what moved? | `metrics()`, `metrics_report()`, `capture()` |
    | what was compiled, when, how long did it take? | `compile_log()`, `TORCH_TPU_LOG=compile` |
    | why did it compile again? | `explain_recompiles()` |
    | what exactly did XLA get? | `TORCH_TPU_DUMP_DIR=dir` / `dump_to(dir)`, `hlo(...)` |
    | what ran on the CPU instead? | `fallback_report()`, `TORCH_TPU_CPU_FALLBACK=0` |
    | which layer diverges from the CPU? | `parity(model, *inputs)` |
    """)
    return


@app.cell
def _():
    import io
    import logging
    import os
    import tempfile

    import matplotlib.pyplot as plt
    import torch

    import torch_tpu
    import torch_tpu.debug as dbg

    from hlo_view import readable_hlo, side_by_side  # guide/notebooks/hlo_view.py

    return (
        dbg,
        io,
        logging,
        os,
        plt,
        readable_hlo,
        side_by_side,
        tempfile,
        torch,
        torch_tpu,
    )


@app.cell(hide_code=True)
def _(mo, torch, torch_tpu):
    mo.md(f"""
    **This run:** {torch.tpu.device_count()} `tpu` device(s), kind
    **{torch.tpu.get_device_properties().device_kind}**, platform
    **{torch_tpu.runtime.platform.platform()}**.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. Metrics of a training step

    A small CNN, one SGD step, captured. `capture(sync=True)` also times each op
    including its device execution (it waits after every op, so use it to
    profile, not in production).
    """)
    return


@app.cell
def _(torch):
    def make_cnn():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))

    images = torch.randn(8, 3, 16, 16)
    labels = torch.randint(0, 10, (8,))
    return images, labels, make_cnn


@app.cell
def _(dbg, images, labels, make_cnn, torch):
    cnn = make_cnn().to("tpu")
    _opt = torch.optim.SGD(cnn.parameters(), lr=0.1, momentum=0.9)
    _x, _y = images.to("tpu"), labels.to("tpu")

    def cnn_step():
        loss = torch.nn.functional.cross_entropy(cnn(_x), _y)
        _opt.zero_grad()
        loss.backward()
        _opt.step()
        return loss

    cnn_step()                                   # compile outside the capture (step 1:
    cnn_step()                                   # forward/backward; step 2: momentum update)
    with dbg.capture(sync=True) as step_capture:
        cnn_step().item()
    print(step_capture.report())
    return cnn, cnn_step, step_capture


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. The compile log

    Every program the process produced is an event: name, cache-key hash, tier
    (`compile` or `disk`), seconds, program size. `TORCH_TPU_LOG=compile`
    (or `torch_tpu.debug.set_log("compile")`) prints them as they happen
    through Python's `logging` logger `torch_tpu.compile`, on stderr. Here a
    new batch size makes the step recompile — the log shows which ops. The
    cell sends the logger to a buffer of its own instead of stderr, so each
    line appears once, below:
    """)
    return


@app.cell
def _(cnn, dbg, io, logging, torch):
    _stream = io.StringIO()
    _handler = logging.StreamHandler(_stream)
    _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    _logger = logging.getLogger("torch_tpu.compile")
    _saved = _logger.level, _logger.propagate
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)     # what set_log("compile") does, minus its stderr handler
    _logger.propagate = False
    try:
        with dbg.capture() as _cap:      # _cap.compiles: the compile events of the block
            _out = cnn(torch.randn(5, 3, 16, 16, device="tpu"))   # batch 5: new shapes
            _out.sum().item()
    finally:
        _logger.removeHandler(_handler)
        _logger.setLevel(_saved[0])
        _logger.propagate = _saved[1]
    recompile_events = _cap.compiles
    compile_log_text = _stream.getvalue()
    print(f"{len(recompile_events)} programs compiled for batch 5; the first lines of the log:\n")
    print("\n".join(compile_log_text.splitlines()[:8]))
    return compile_log_text, recompile_events


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Dumping programs

    `TORCH_TPU_DUMP_DIR=dir` (or the `dump_to(dir)` context manager) writes
    every program compiled in its scope, with readable names: op or graph name,
    key hash, stage.
    """)
    return


@app.cell
def _(dbg, os, tempfile, torch):
    # A temporary directory, removed when the block ends: the files are read
    # into `dumped` (name -> text) first.
    with tempfile.TemporaryDirectory(prefix="torch_tpu_dump_") as _dump_dir:
        with dbg.dump_to(_dump_dir):
            _a = torch.randn(7, 9, device="tpu")
            torch.nn.functional.softplus(_a @ _a.T).cpu()
        dumped = {}
        for _f in sorted(os.listdir(_dump_dir)):
            with open(os.path.join(_dump_dir, _f)) as _fh:
                dumped[_f] = _fh.read()
    for _f, _text in dumped.items():
        print(f"{_f:<70} {len(_text.encode()):>7} bytes")
    return (dumped,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Each program is there three times: `stablehlo.mlir` (what the lowering
    produced), `hlo.txt` (the same program as HLO) and `optimized.hlo.txt`
    (after XLA's passes: what ran). The softplus of the block, as lowered and
    as it ran — `exp`, `log1p`, the threshold and the `select` fused into one
    kernel:
    """)
    return


@app.cell
def _(dumped, mo, readable_hlo, side_by_side):
    def dumped_stage(op, suffix):
        names = [f for f in dumped if f".{op}." in f and f.endswith(suffix)]
        return (names[-1], dumped[names[-1]]) if names else None

    softplus_lowered = dumped_stage("softplus", ".stablehlo.mlir")
    softplus_optimized = dumped_stage("softplus", ".optimized.hlo.txt")
    if softplus_lowered and softplus_optimized:
        _shown = side_by_side(
            (softplus_lowered[0], readable_hlo(softplus_lowered[1], max_lines=45)),
            (softplus_optimized[0], readable_hlo(softplus_optimized[1], max_lines=45)))
    else:
        _shown = mo.md("*No softplus program was dumped: it came from the in-memory cache "
                       "(the block had run before in this process).*")
    _shown
    return softplus_lowered, softplus_optimized


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Which layer diverges? Per-layer parity with the CPU

    `parity(model, *inputs)` runs deep copies of the model on the CPU and on
    `tpu`, records every submodule's output with forward hooks, and reports the
    largest absolute and relative difference per layer, in call order.

    To have something to find, the model below contains a layer with a
    device-dependent bug: on `tpu` it uses an approximate GELU, on the CPU the
    exact one. `first_divergence()` points at it.
    """)
    return


@app.cell
def _(torch):
    class SuspiciousGELU(torch.nn.Module):
        """A bug planted for the demo: a different GELU on the device."""

        def forward(self, x):
            approximate = "tanh" if x.device.type == "tpu" else "none"
            return torch.nn.functional.gelu(x, approximate=approximate)

    def make_mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 64), torch.nn.LayerNorm(64),
            torch.nn.Linear(64, 64), SuspiciousGELU(),
            torch.nn.Linear(64, 8))

    return SuspiciousGELU, make_mlp


@app.cell
def _(dbg, make_mlp, torch):
    parity_report = dbg.parity(make_mlp(), torch.randn(16, 32))
    first_bad = parity_report.first_divergence(atol=1e-5, rtol=1e-5)
    print(parity_report)
    print()
    print(f"first divergence: layer {first_bad.name!r} ({first_bad.module}), "
          f"max abs diff {first_bad.max_abs:.2e}")
    return first_bad, parity_report


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. Common errors, live

    What you will see when something is off — each is PyTorch's error type
    with a message that says what to do (never a JAX traceback):
    """)
    return


@app.cell
def _(mo, os, torch):
    def error_of(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - shown to the reader
            return type(e).__name__, str(e).splitlines()[0][:160]
        return ("no error", "")

    def strict_fallback():
        if not hasattr(torch.ops.guide06, "cpu_only"):
            @torch.library.custom_op("guide06::cpu_only", mutates_args=(), device_types="cpu")
            def _cpu_only(x: torch.Tensor) -> torch.Tensor:
                return x.clone()
        old = os.environ.get("TORCH_TPU_CPU_FALLBACK")
        os.environ["TORCH_TPU_CPU_FALLBACK"] = "0"
        try:
            torch.ops.guide06.cpu_only(torch.ones(2, device="tpu"))
        finally:  # the setting as it was
            if old is None:
                os.environ.pop("TORCH_TPU_CPU_FALLBACK", None)
            else:
                os.environ["TORCH_TPU_CPU_FALLBACK"] = old

    common_errors = {
        "mixing devices: tpu + cpu tensor": error_of(
            lambda: torch.ones(2, device="tpu") + torch.ones(2)),
        "tensor.numpy() on a device tensor": error_of(
            lambda: torch.ones(2, device="tpu").numpy()),
        "a device index that does not exist": error_of(
            lambda: torch.ones(2).to(f"tpu:{torch.tpu.device_count() + 3}")),
        "shapes that do not match": error_of(
            lambda: torch.ones(2, 3, device="tpu") @ torch.ones(4, 5, device="tpu")),
        "a CPU fallback under strict mode": error_of(strict_fallback),
        "backward through a non-scalar": error_of(
            lambda: torch.ones(3, device="tpu", requires_grad=True).mul(2).backward()),
    }
    mo.md("\n".join(["| what | error | message |", "|---|---|---|"] + [
        f"| {k} | `{t}` | {m.replace('|', '/')} |" for k, (t, m) in common_errors.items()]))
    return common_errors, error_of, strict_fallback


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    And one that is not an error but is the most common performance bug:
    **shapes that change every step** (a last partial batch, variable-length
    sequences in eager mode). Each new shape compiles every op again — watch
    the compile count; pad or bucket the inputs, or use `torch.compile`, whose
    dynamic-shape policy buckets sizes (notebook 04).
    """)
    return


@app.cell
def _(dbg, torch):
    _lin = torch.nn.Linear(16, 16).to("tpu")
    compiles_per_batch = []
    for _b in (8, 8, 8, 9, 10, 11, 8):
        with dbg.capture() as _cap:
            _lin(torch.randn(_b, 16, device="tpu")).relu().sum().item()
        compiles_per_batch.append((_b, _cap["compiles"]["count"]))
    for _b, _c in compiles_per_batch:
        print(f"batch {_b:>2}: {_c} programs compiled")
    return (compiles_per_batch,)


@app.cell
def _(compiles_per_batch, plt):
    _fig, _ax = plt.subplots(figsize=(6, 2.6))
    _bars = _ax.bar([f"{_i + 1}\nbatch {_b}" for _i, (_b, _) in enumerate(compiles_per_batch)],
                    [_c for _, _c in compiles_per_batch], color="tab:red")
    _ax.bar_label(_bars, fontsize=8)
    _ax.set_ylabel("programs compiled")
    _ax.set_xlabel("step")
    _ax.set_title("each new batch size compiles the step again; a seen one compiles nothing",
                  fontsize=9)
    _ax.tick_params(axis="x", labelsize=8)
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. Why did it recompile?

    Every compile event after an op's first says why: the nearest earlier key
    of the same op and the fields that differ — an argument's shape or dtype,
    a value baked into the program (a dim, dropout's `p`), a Python scalar's
    type, the matmul precision or the XLA optimization level; for
    `torch.compile` graphs, dynamo's guard failure and the shape bucket.
    `explain_recompiles()` groups them by op, summary first, with a hint per
    kind of cause. Below, after a first step, a loop changes the batch size
    once and dropout's `p` once; the scale it multiplies by changes every
    step and compiles nothing (a Python number's value is a runtime input).
    `events=` limits the report to the loop's compile events:
    """)
    return


@app.cell
def _(dbg, torch):
    _lin = torch.nn.Linear(16, 16).to("tpu")

    def _step(batch, p, scale):
        _h = torch.nn.functional.dropout(_lin(torch.randn(batch, 16).to("tpu")), p=p)
        return (_h * scale).sum().item()

    _step(8, 0.1, 0.5)                        # the first step compiles as always
    with dbg.capture() as _cap:
        for _batch, _p, _scale in [(8, 0.1, 0.7), (12, 0.1, 0.9), (12, 0.2, 1.1)]:
            _step(_batch, _p, _scale)
    recompile_report = dbg.explain_recompiles(events=_cap.compiles)
    print(recompile_report)
    return (recompile_report,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Each line is one compile: `#seq (vs #earlier)` and what differs from
    that earlier key. `explain_recompiles("aten.addmm.default")` keeps one op;
    each event's `reason` holds the same, and `TORCH_TPU_LOG=compile` prints
    it as it happens. The [troubleshooting page](../troubleshooting.md#why-did-it-recompile)
    explains the hints.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (the recompile report of `explain_recompiles()`, the
    per-layer differences of `parity()`) and says whether yours is right. A
    wrong answer gets a hint: where to look, with which cell or tool; the
    measured answer waits under *Show the answer*, and the written solution is
    folded away under each exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 1 · why did the multiply compile again?

    `n` is a batch size this process has not used yet. After the first step,
    which cause does `torch_tpu.debug.explain_recompiles()` name for
    **`aten.mul.Tensor`** (the `h * scale`) over the last three steps? To see
    for yourself, run the block in a cell of your own and print
    `explain_recompiles(events=...)` of the events after the first step, as in
    section 6.
    """), ex.code(ex.RECOMPILE_BLOCK)])
    return


@app.cell
def _(ex, mo):
    recompile_answer = mo.ui.dropdown(ex.RECOMPILE_OPTIONS, value=None,
                                      label="cause named for aten.mul.Tensor")
    recompile_answer
    return (recompile_answer,)


@app.cell
def _(ex, recompile_answer):
    ex.show(ex.check(ex.check_recompile_cause, recompile_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **scalar type**: `h * 2` compiles again with
        `arg 1 (other) value runtime float -> runtime int`. A Python number's
        value is a runtime input of the program, so 0.5 and 1.5 share one
        program; its type is part of the key, so `2` (an int) needs another.
        Dropout's new `p` recompiles `aten.native_dropout.default` (a *static
        value*, baked into its program), not the multiply, whose inputs did not
        change. The fix the hint gives: pass one Python type (`2.0`).
    """)})
    return


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 2 · which layer diverges?

    This model calls two custom ops, `torch.ops.guide_ex06.swish` and
    `torch.ops.guide_ex06.softclip`, each with a CPU kernel and a lowering
    for `tpu`. Its output on `tpu` is not the CPU's. Which layer is the
    **first** to diverge? In a cell of your own: `import collections` and
    `import exercises as ex`, run the block, then
    `print(torch_tpu.debug.parity(make_model(), x))` (section 4).
    """), ex.code(ex.PARITY_BLOCK)])
    return


@app.cell
def _(ex, mo):
    ex.parity_ops()  # defines torch.ops.guide_ex06.*
    parity_answer = mo.ui.dropdown(ex.PARITY_OPTIONS, value=None, label="first layer to diverge")
    parity_answer
    return (parity_answer,)


@app.cell
def _(ex, parity_answer):
    ex.show(ex.check(ex.check_parity_layer, parity_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **`clip`**: `parity` shows `embed`, `act` and `proj` equal to the CPU
        (within float rounding) and `clip` off by about 1e-2; `norm` and `head`
        differ too, but only because their input already does. Look for the
        *first* divergence (`report.first_divergence(atol=1e-4, rtol=1e-3)`),
        not the output where you notice it. The bug is in `softclip`'s
        lowering: a hard `jnp.clip(x, -2, 2)` where the CPU kernel computes
        `2 * tanh(x / 2)`.
    """)})
    return


@app.cell
def test_metrics(step_capture):
    m = step_capture.metrics
    assert m["ops_total"] > 10
    assert m["compiles"]["count"] == 0, "the captured step must be all cache hits"
    assert m["fallbacks_total"] == 0
    assert m["execute"]["mode"] == "sync" and m["execute"]["seconds"] > 0
    return


@app.cell
def test_compile_log(compile_log_text, recompile_events):
    assert len(recompile_events) > 0
    assert any(e.name.startswith("aten.") for e in recompile_events)
    assert "aten." in compile_log_text
    return


@app.cell
def test_dump(dumped, softplus_lowered, softplus_optimized):
    assert dumped, "the dump directory must receive files"
    assert any("aten" in f for f in dumped)
    if softplus_lowered and softplus_optimized:
        assert "stablehlo." in softplus_lowered[1] and "log_plus_one" in softplus_lowered[1]
        assert softplus_optimized[1].startswith("HloModule") and "fusion" in softplus_optimized[1]
    return


@app.cell
def test_parity_finds_the_bug(first_bad, parity_report):
    assert first_bad is not None and first_bad.module == "SuspiciousGELU"
    before = [r for r in parity_report.rows if r.name and int(r.name) < int(first_bad.name)]
    assert all(r.max_abs < 1e-4 for r in before)
    return


@app.cell
def test_common_errors(common_errors):
    for what, (etype, msg) in common_errors.items():
        assert etype not in ("no error",) and "jax" not in etype.lower(), (what, etype, msg)
    assert common_errors["a CPU fallback under strict mode"][0] == "NotImplementedError"
    return


@app.cell
def test_recompiles_on_new_shapes(compiles_per_batch):
    counts = dict()
    for b, c in compiles_per_batch:
        counts.setdefault(b, []).append(c)
    assert all(c == 0 for c in counts[8][1:]), "a seen shape must not recompile"
    assert counts[9][0] > 0 and counts[10][0] > 0
    return


@app.cell
def test_explain_recompiles(recompile_report):
    _causes = recompile_report.causes
    assert _causes["shape"] > 0 and _causes["static value"] == 1, _causes
    assert "scalar type" not in _causes, "the scale's value is a runtime input"
    _text = str(recompile_report)
    assert "aten.native_dropout.default" in _text and "(p) value 0.1 -> 0.2" in _text
    assert "arg 0 shape (8, 16) -> (12, 16)" in _text
    return


if __name__ == "__main__":
    app.run()
