# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""02 · How an ATen op becomes an XLA program: the lowering table, fallbacks, strict mode."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="02 · Ops and lowering")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 02 · Ops and lowering

    PyTorch turns every tensor operation into calls of **ATen operators**
    (`aten.addmm.default`, `aten.gelu.default`, ...). For a `tpu` tensor the
    dispatcher sends each call to torch_tpu, which:

    1. looks the op up in the **lowering table** — one small JAX function per
       ATen overload, written against the op's schema;
    2. on the first call with these shapes and dtypes, runs the op on `meta`
       tensors (PyTorch's own shape/dtype rules and error checks), traces the
       lowering with `jax.jit`, and compiles the program with XLA;
    3. runs the cached executable (asynchronously).

    An op with no lowering takes PyTorch's own **decomposition** into ops that
    have one, if PyTorch has it; otherwise it runs on the **CPU** — counted,
    with a warning — unless strict mode (`TORCH_TPU_CPU_FALLBACK=0`) makes it
    an error.
    """)
    return


@app.cell
def _():
    import collections
    import inspect
    import os
    import warnings

    import jax
    import jax.numpy as jnp
    import torch

    import torch_tpu
    import torch_tpu.debug as dbg
    from torch_tpu.ops.registry import LOWERINGS, lower

    from hlo_view import fusions_beside_hlo  # guide/notebooks/hlo_view.py

    aten = torch.ops.aten
    return (LOWERINGS, aten, collections, dbg, fusions_beside_hlo, inspect, jax, jnp, lower, os,
            torch, torch_tpu, warnings)


@app.cell(hide_code=True)
def _(jax, mo, torch, torch_tpu):
    mo.md(f"""
    **This run:** {torch.tpu.device_count()} `tpu` device(s), kind
    **{torch.tpu.get_device_properties().device_kind}**, platform
    **{torch_tpu.runtime.platform.platform()}** (jax {jax.__version__}, torch {torch.__version__}).
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. From Python to ATen ops

    `torch_tpu.debug.capture()` records which ATen ops reached the device. Many
    Python-level functions are *composite*: PyTorch rewrites them into other
    ATen ops before the backend sees them (`F.linear` becomes `aten.addmm`,
    `F.silu` stays `aten.silu`, `x.mean()` is `aten.mean`):
    """)
    return


@app.cell
def _(dbg, torch):
    _x = torch.randn(8, 16, device="tpu")
    _w = torch.randn(4, 16, device="tpu")
    _b = torch.randn(4, device="tpu")
    with dbg.capture() as python_to_aten:
        _h = torch.nn.functional.linear(_x, _w, _b)
        _h = torch.nn.functional.silu(_h)
        _h = _h.mean()
    for _op, _n in python_to_aten["ops"].items():
        print(f"{_op:<28} x{_n}")
    return (python_to_aten,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. The lowering table

    Every lowering is a pure function registered with `@lower(aten.op.overload)`.
    Tensor arguments arrive as JAX arrays (views already resolved), dims and
    flags as Python values; the function returns arrays, and the executor casts
    them to the dtype PyTorch promises. In-place (`add_`) and `out=` forms are
    derived automatically. Pick an op to read its lowering:
    """)
    return


@app.cell
def _(LOWERINGS, collections, mo):
    def _family(module):
        # torch_tpu.ops.<family>[.<part>]: ops/nn/ is a package of parts
        parts = module.split(".")
        return parts[2] if parts[:2] == ["torch_tpu", "ops"] and len(parts) > 2 else parts[-1]

    families = collections.Counter(_family(low.fn.__module__) for low in LOWERINGS.values())
    mo.md("\n".join([
        f"**{len(LOWERINGS)} ATen overloads** have a direct lowering in this build:",
        "",
        "| family (torch_tpu/ops/…) | overloads |",
        "|---|---|",
        *(f"| {fam} | {n} |" for fam, n in families.most_common()),
        "",
        "The full per-op conformance table (PyTorch's OpInfo database run on `tpu`) "
        "is the *Operator coverage* page of the documentation.",
    ]))
    return (families,)


@app.cell
def _(LOWERINGS, aten, mo):
    _names = [str(op) for op in (aten.gelu.default, aten.addmm.default, aten.softmax.int,
                                 aten._softmax.default, aten.sum.dim_IntList,
                                 aten.native_layer_norm.default, aten.where.self)
              if op in LOWERINGS]
    op_choice = mo.ui.dropdown(_names, value=_names[0], label="op")
    op_choice
    return (op_choice,)


@app.cell
def _(LOWERINGS, inspect, mo, op_choice):
    chosen = next(op for op in LOWERINGS if str(op) == op_choice.value)
    _src = inspect.getsource(LOWERINGS[chosen].fn)
    mo.vstack([
        mo.md(f"`{chosen}` — schema `{chosen._schema}`"),
        mo.plain_text(_src),
    ])
    return (chosen,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. The XLA program of one call

    The executor traces that lowering for concrete shapes and compiles it. The
    compile log keeps each program: here is the StableHLO of `gelu` on a
    `[4, 8]` tensor, exactly as it was compiled for this call:
    """)
    return


@app.cell
def _(dbg, mo, torch):
    dbg.clear_compile_log()
    _y = torch.nn.functional.gelu(torch.randn(4, 8, device="tpu") * 3.0)
    _y.cpu()
    gelu_events = [e for e in dbg.compile_log() if e.name.startswith("aten.gelu")]
    gelu_text = gelu_events[-1].program.stablehlo if gelu_events else dbg.hlo(
        torch.ops.aten.gelu.default, torch.randn(4, 8, device="tpu"))
    mo.plain_text(gelu_text)
    return gelu_events, gelu_text


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Many ops, one program: what XLA fused

    `torch_tpu.fused()` records the ops of a block instead of running each as
    its own program, then runs them as **one** program, which XLA optimizes as
    a whole: elementwise ops are *fused* into the kernel that produces their
    input, so intermediates never go through memory. Every op is traced under
    its ATen name, which XLA keeps in the HLO metadata, so
    `torch_tpu.debug.fusions(program)` can draw the optimized program as its
    kernels, each with the ATen ops it came from, and the bytes that flow
    between kernels. Here a linear layer, a ReLU and a few elementwise ops:
    """)
    return


@app.cell
def _(dbg, fusions_beside_hlo, mo, torch, torch_tpu):
    _x = torch.randn(64, 32, device="tpu")
    _w = torch.randn(32, 16, device="tpu")
    _b = torch.randn(16, device="tpu")
    _x.cpu()  # the inputs' own programs run (and are logged) before the block
    dbg.clear_compile_log()
    with torch_tpu.fused():
        fused_out = (torch.relu(_x @ _w + _b).sin() * 2 + 1).sum(dim=1)
    fused_out.cpu()
    fused_graph = dbg.fusions(dbg.last_programs(1, name="fused eager program")[-1])
    mo.vstack([
        mo.md(f"{len(fused_graph.aten_ops)} ATen ops ran as **{len(fused_graph.kernels)} "
              f"kernels**; {fused_graph.bytes_between_kernels():,} bytes go through memory "
              "between them."),
        fusions_beside_hlo(fused_graph),
        mo.plain_text(str(fused_graph)),
    ])
    return (fused_graph,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. Adding a lowering

    The same mechanism works for any operator. Below, a custom PyTorch operator
    (`guide::scaled_cumsum`, defined with `torch.library.custom_op`, CPU kernel
    only) gets a lowering: four lines of `jax.numpy`. Calling it on `tpu`
    tensors now compiles one executable — no CPU involved.
    """)
    return


@app.cell
def _(dbg, jnp, lower, torch):
    if not hasattr(torch.ops.guide, "scaled_cumsum"):  # define once per process
        @torch.library.custom_op("guide::scaled_cumsum", mutates_args=(), device_types="cpu")
        def _scaled_cumsum(x: torch.Tensor, scale: float) -> torch.Tensor:
            return torch.cumsum(x, 0) * scale

        @_scaled_cumsum.register_fake
        def _(x, scale):
            return torch.empty_like(x)

        @lower(torch.ops.guide.scaled_cumsum.default)
        def _scaled_cumsum_lowering(x, scale):
            return jnp.cumsum(x, axis=0) * scale

    scaled_cumsum = torch.ops.guide.scaled_cumsum
    with dbg.capture() as lowered_run:
        lowered_result = scaled_cumsum(torch.arange(6.0, device="tpu"), 0.5)
        print(lowered_result)
    print("ops:", lowered_run["ops"], "| CPU fallbacks:", lowered_run["fallbacks_total"])
    return lowered_result, lowered_run, scaled_cumsum


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. A CPU fallback, made visible

    An operator the backend cannot lower still works: its inputs are copied to
    the host, it runs on the CPU, and its outputs are copied back. That is slow
    (two transfers and a host round trip per call), so it warns once per op and
    counts every call. Here is an operator with only a CPU kernel and no
    lowering:
    """)
    return


@app.cell
def _(dbg, torch, warnings):
    if not hasattr(torch.ops.guide, "cpu_only_cumprod"):  # define once per process
        @torch.library.custom_op("guide::cpu_only_cumprod", mutates_args=(), device_types="cpu")
        def _cpu_only_cumprod(x: torch.Tensor) -> torch.Tensor:
            return torch.cumprod(x, 0)

    cpu_only_cumprod = torch.ops.guide.cpu_only_cumprod

    with warnings.catch_warnings(record=True) as _caught:
        warnings.simplefilter("always")
        with dbg.capture() as fallback_run:
            fallback_result = cpu_only_cumprod(torch.arange(1.0, 6.0, device="tpu"))
            fallback_result.cpu()
    fallback_warnings = [str(w.message) for w in _caught]
    print(fallback_result)
    print("warning:", fallback_warnings[0] if fallback_warnings else "(warned earlier in this process)")
    print()
    print(dbg.metrics_report(fallback_run.metrics))
    return cpu_only_cumprod, fallback_result, fallback_run, fallback_warnings


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    `torch_tpu.debug.fallback_report()` lists every op that fell back since the
    last `reset_metrics()`, and the ops that ran through PyTorch decompositions
    (those stay on the device):
    """)
    return


@app.cell
def _(dbg):
    print(dbg.fallback_report())
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 7. Strict mode

    `TORCH_TPU_CPU_FALLBACK=0` turns every CPU fallback into a
    `NotImplementedError` naming the op — use it in CI to be sure a model runs
    entirely on the device. It is read at each fallback, so it can be flipped at
    run time:
    """)
    return


@app.cell
def _(cpu_only_cumprod, os, torch):
    _old = os.environ.get("TORCH_TPU_CPU_FALLBACK")
    os.environ["TORCH_TPU_CPU_FALLBACK"] = "0"
    try:
        cpu_only_cumprod(torch.ones(3, device="tpu"))
        strict_error = None
    except NotImplementedError as e:
        strict_error = str(e)
    finally:  # the setting as it was
        if _old is None:
            os.environ.pop("TORCH_TPU_CPU_FALLBACK", None)
        else:
            os.environ["TORCH_TPU_CPU_FALLBACK"] = _old
    print("NotImplementedError:", strict_error)
    return (strict_error,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 8. Errors are PyTorch's

    Because every new op first runs on `meta` tensors, bad input raises the
    error PyTorch would raise on the CPU, before anything is traced — never a
    JAX traceback:
    """)
    return


@app.cell
def _(torch):
    def error_of(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - we show whatever PyTorch raises
            return f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return None

    shape_error_tpu = error_of(lambda: torch.ones(2, 3, device="tpu") @ torch.ones(2, 3, device="tpu"))
    shape_error_cpu = error_of(lambda: torch.ones(2, 3) @ torch.ones(2, 3))
    device_error = error_of(lambda: torch.ones(2, device="tpu") + torch.ones(2))
    print("tpu:", shape_error_tpu)
    print("cpu:", shape_error_cpu)
    print("mixing devices:", device_error)
    return device_error, shape_error_cpu, shape_error_tpu


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (programs counted by `debug.capture()`, fallbacks from its
    report) and says whether yours is right. A wrong answer gets a hint: where
    to look, with which cell or tool; the measured answer waits under *Show the
    answer*, and the written solution is folded away under each exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 1 · programs of a loop

    `x` and `w` are `tpu` tensors of shapes this process has not used yet. In
    strict eager mode, how many **executables** does this loop compile?
    """), ex.code(ex.LOOP_BLOCK)])
    return


@app.cell
def _(mo):
    programs_answer = mo.ui.number(label="executables compiled")
    programs_answer
    return (programs_answer,)


@app.cell
def _(ex, programs_answer):
    ex.show(ex.check(ex.check_loop_programs, programs_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **3**: `aten.mm`, `aten.add.Tensor` and `aten.relu`, each compiled on the
        first iteration. The other nine iterations have the same ops, shapes and
        dtypes, so they hit the cache; the Python number `i` is a runtime input of
        the add's executable, not part of its key (notebook 01, section 4).
    """)})
    return


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 2 · find the CPU fallback

    One op in this block has no lowering and runs on the **CPU** (inputs copied
    to the host and back). Which? The `guide_ex` ops exist once the dropdown
    below is shown, so you can run the block in a cell of your own: wrap it in
    `with torch_tpu.debug.capture() as c:` and read `c["fallbacks"]`, or print
    `torch_tpu.debug.fallback_report()` afterwards.
    """), ex.code(ex.FALLBACK_BLOCK)])
    return


@app.cell
def _(ex, mo):
    ex.fallback_ops()  # defines torch.ops.guide_ex.*
    fallback_answer = mo.ui.dropdown(ex.FALLBACK_OPTIONS, value=None, label="falls back to the CPU")
    fallback_answer
    return (fallback_answer,)


@app.cell
def _(ex, fallback_answer):
    ex.show(ex.check(ex.check_fallback_op, fallback_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **`guide_ex.ranks`**: it has a CPU kernel only. `guide_ex.rowscale` has a
        lowering (`@lower`, section 5), `guide_ex.softsign` is
        `CompositeImplicitAutograd`: PyTorch decomposes it into `abs`, `add` and
        `div`, which all have lowerings. `cumsum` and `sigmoid` are in the table.
        With `TORCH_TPU_CPU_FALLBACK=0` (section 7) the block would raise at `ranks`.
    """)})
    return


@app.cell
def test_aten_capture(python_to_aten):
    ops = python_to_aten["ops"]
    assert any(k.startswith("aten.addmm") for k in ops), ops
    assert any(k.startswith("aten.silu") for k in ops), ops
    return


@app.cell
def test_lowering_table(LOWERINGS, families):
    assert len(LOWERINGS) > 300
    assert families["elementwise"] > 0 and families["nn"] > 0
    return


@app.cell
def test_gelu_program(gelu_text):
    assert "stablehlo" in gelu_text or "HloModule" in gelu_text
    return


@app.cell
def test_fusion_graph(fused_graph):
    _ops = {op.rsplit(".", 1)[0] for op in fused_graph.aten_ops}
    assert {"aten.mm", "aten.relu", "aten.sin", "aten.sum"} <= _ops, _ops
    # fewer kernels than ops: XLA fused the elementwise ones
    assert 0 < len(fused_graph.kernels) < len(fused_graph.aten_ops)
    assert fused_graph.to_mermaid().startswith("flowchart")
    return


@app.cell
def test_custom_lowering(lowered_result, lowered_run, torch):
    expected = torch.cumsum(torch.arange(6.0), 0) * 0.5
    assert torch.allclose(lowered_result.cpu(), expected)
    assert lowered_run["fallbacks_total"] == 0
    assert lowered_run["ops"].get("guide.scaled_cumsum.default") == 1
    return


@app.cell
def test_fallback_and_strict(fallback_result, fallback_run, strict_error, torch):
    assert torch.equal(fallback_result.cpu(), torch.tensor([1.0, 2.0, 6.0, 24.0, 120.0]))
    assert fallback_run["fallbacks"].get("guide.cpu_only_cumprod.default") == 1
    assert strict_error and "guide.cpu_only_cumprod" in strict_error
    return


@app.cell
def test_errors(device_error, shape_error_cpu, shape_error_tpu):
    assert shape_error_tpu and shape_error_cpu
    assert shape_error_tpu.split(":")[0] == shape_error_cpu.split(":")[0]
    assert device_error and "device" in device_error
    return


if __name__ == "__main__":
    app.run()
