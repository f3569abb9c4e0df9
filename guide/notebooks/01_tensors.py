# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""01 · Tensors on the `tpu` device: dtypes, transfers, async dispatch, views, the op cache."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="01 · Tensors and the tpu device")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 01 · Tensors and the `tpu` device

    `torch_tpu` gives PyTorch a real device called `tpu`. A `tpu` tensor is an
    ordinary `torch.Tensor` whose data is a JAX array; every ATen operator on it
    runs as a compiled XLA program. On a Cloud TPU the programs run on the TPU;
    on a laptop they run on the CPU through XLA:CPU — the same programs, only
    slower. This notebook shows:

    1. creating tensors, dtypes, printing;
    2. moving data between the host and the device;
    3. asynchronous dispatch: the host queues work and only waits when it reads;
    4. the executable cache: an op's first call compiles, the second one is a hit;
    5. the XLA program (HLO) of one op;
    6. views and in-place ops on top of immutable JAX arrays.

    Installing the package registers the device with PyTorch's backend autoload,
    so `import torch` is enough; `import torch_tpu` gives the extra tools.
    """)
    return


@app.cell
def _():
    import time

    import jax
    import matplotlib.pyplot as plt
    import torch

    import torch_tpu
    import torch_tpu.debug as dbg
    from torch_tpu.runtime.storage import data_of

    from hlo_view import (  # guide/notebooks/hlo_view.py
        kernels_sentence,
        readable_hlo,
        side_by_side,
    )

    return (
        data_of,
        dbg,
        jax,
        kernels_sentence,
        plt,
        readable_hlo,
        side_by_side,
        time,
        torch,
        torch_tpu,
    )


@app.cell(hide_code=True)
def _(jax, mo, torch, torch_tpu):
    _props = torch.tpu.get_device_properties()
    PLATFORM = torch_tpu.runtime.platform.platform()
    mo.md(f"""
    **This run:** `{torch.tpu.device_count()}` `tpu` device(s) of kind
    **{_props.device_kind}** on the **{PLATFORM}** platform
    (torch {torch.__version__}, jax {jax.__version__}, torch_tpu {torch_tpu.__version__}).
    Set `TORCH_TPU_PLATFORM=tpu|gpu|cpu` to choose; on a machine without an
    accelerator the device is the host CPU, and every timing below is a CPU timing.
    """)
    return (PLATFORM,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. Creating tensors

    Factories take `device="tpu"` like `"cuda"`; `tensor.to("tpu")` copies a CPU
    tensor over. Pick a dtype and a shape: the cell below re-runs when you
    change them.
    """)
    return


@app.cell
def _(mo):
    dtype_choice = mo.ui.dropdown(
        ["float32", "bfloat16", "float16", "int32", "int64", "bool", "complex64"],
        value="bfloat16", label="dtype")
    rows = mo.ui.slider(1, 8, value=2, label="rows")
    cols = mo.ui.slider(1, 8, value=3, label="cols")
    mo.hstack([dtype_choice, rows, cols], justify="start")
    return cols, dtype_choice, rows


@app.cell
def _(cols, data_of, dtype_choice, rows, torch):
    dtype = getattr(torch, dtype_choice.value)
    if dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(rows.value, cols.value, device="tpu").to(dtype)
    else:
        t = torch.randint(0, 2, (rows.value, cols.value), device="tpu").to(dtype)
    print(t)                                    # one host copy, then PyTorch's formatter
    print("device:", t.device, "| dtype:", t.dtype, "| shape:", tuple(t.shape))
    print("the JAX array behind it:", data_of(t).array.dtype, data_of(t).array.shape,
          "on", data_of(t).array.devices())
    return dtype, t


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The repr says `device='tpu:0'`; the value behind the tensor is a
    `jax.Array` of the matching dtype on a PJRT device. float64 follows the
    platform: XLA:CPU and GPUs have it, TPUs do not (creating one raises a
    `TypeError` there instead of silently downcasting).

    ## 2. Moving data

    `.to("tpu")`, `.cpu()`, `.item()`, `.tolist()` and `print` copy between the
    host and the device. `.numpy()` on a device tensor raises the same error as
    on CUDA. `torch_tpu.debug.capture()` counts what a block moved:
    """)
    return


@app.cell
def _(dbg, torch):
    with dbg.capture() as transfers:
        host = torch.arange(1024, dtype=torch.float32)      # 4 KiB on the host
        dev = host.to("tpu")                                 # host -> device
        back = (dev * 2).cpu()                               # device -> host
        total = dev.sum().item()                             # a scalar, counted as item()
    try:
        dev.numpy()
        numpy_error = None
    except TypeError as e:
        numpy_error = str(e)
    print("host -> device:", transfers["transfers"]["host_to_device"])
    print("device -> host:", transfers["transfers"]["device_to_host"])
    print("item() calls:  ", transfers["item_calls"])
    print("dev.numpy() ->  TypeError:", numpy_error)
    return back, numpy_error, total, transfers


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Asynchronous dispatch

    Calling an op does not wait for its result. The host looks up (or compiles)
    the op's executable, hands the inputs to the runtime and returns a tensor
    whose value is still being computed. The host only waits when it needs a
    value — `.cpu()`, `.item()`, `print` — or at `torch.tpu.synchronize()`.
    There is no `mark_step()`: the queue of work is the runtime's own.

    Below, a chain of matrix products is dispatched; right after the loop the
    last result is not ready yet, and `synchronize()` waits for it.
    """)
    return


@app.cell
def _(PLATFORM, mo):
    # An accelerator finishes a 512x512 chain before the host is done dispatching it.
    chain_size = mo.ui.slider(128, 8192, step=128, value=512 if PLATFORM == "cpu" else 4096,
                              label="matrix size")
    chain_len = mo.ui.slider(5, 40, step=5, value=20, label="chain length")
    mo.hstack([chain_size, chain_len], justify="start")
    return chain_len, chain_size


@app.cell
def _(chain_len, chain_size, data_of, dbg, time, torch):
    _a = torch.randn(chain_size.value, chain_size.value, device="tpu") / chain_size.value**0.5
    (_a @ _a).cpu()                       # compile the matmul once, outside the timing
    torch.tpu.synchronize()
    _t0 = time.perf_counter()
    _b = _a
    with dbg.capture() as dispatch_metrics:   # what the host did while dispatching
        for _ in range(chain_len.value):
            _b = _b @ _a
    dispatch_s = time.perf_counter() - _t0
    ready_after_dispatch = data_of(_b).array.is_ready()
    torch.tpu.synchronize()
    total_s = time.perf_counter() - _t0
    print(f"dispatching {chain_len.value} matmuls: {dispatch_s * 1e3:8.2f} ms "
          f"(result ready right after? {ready_after_dispatch})")
    print(f"until the device finished:  {total_s * 1e3:8.2f} ms")
    return dispatch_metrics, dispatch_s, ready_after_dispatch, total_s


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. The first call compiles, the second hits the cache

    Each eager op runs as one compiled XLA executable. The executor keys it by the
    op overload, the shapes, dtypes and layouts of the inputs and the static
    arguments; scalar arguments are runtime inputs, so `x + 1` and `x + 2`
    share one executable. On a miss the op is traced, lowered to StableHLO and
    compiled by XLA (or loaded from the persistent disk cache, see notebook 05);
    on a hit only the executable runs.

    Choose an op and a size the process has not seen yet and compare the first
    call with the next ones:
    """)
    return


@app.cell
def _(mo):
    op_choice = mo.ui.dropdown(["matmul", "softmax", "layer_norm", "gelu"], value="matmul",
                               label="op")
    op_size = mo.ui.slider(16, 512, step=16, value=96, label="size")
    mo.hstack([op_choice, op_size], justify="start")
    return op_choice, op_size


@app.cell
def _(dbg, op_choice, op_size, time, torch):
    _fns = {
        "matmul": lambda x: x @ x,
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
        "gelu": lambda x: torch.nn.functional.gelu(x),
    }
    run_op = _fns[op_choice.value]
    op_input = torch.randn(op_size.value, op_size.value + 1 if op_choice.value != "matmul"
                           else op_size.value, device="tpu")
    call_times = []
    call_compiles = []
    call_hits = []
    for _i in range(5):
        torch.tpu.synchronize()
        with dbg.capture() as _cap:
            _t0 = time.perf_counter()
            run_op(op_input).cpu()
            call_times.append(time.perf_counter() - _t0)
        call_compiles.append(_cap["cache"]["misses"])
        call_hits.append(_cap["cache"]["hits"])
    print("call  ms   executables compiled or loaded")
    for _i, (_t, _c) in enumerate(zip(call_times, call_compiles)):
        print(f"{_i + 1:>4}  {_t * 1e3:8.2f}  {_c}")
    return call_compiles, call_hits, call_times, op_input, run_op


@app.cell
def _(call_compiles, call_times, op_choice, plt):
    _fig, _ax = plt.subplots(figsize=(6, 2.6))
    _colors = ["tab:red" if c else "tab:green" for c in call_compiles]
    _ax.bar([str(i + 1) for i in range(len(call_times))], [t * 1e3 for t in call_times],
            color=_colors)
    _ax.set_yscale("log")
    _ax.set_xlabel("call")
    _ax.set_ylabel("ms (log scale)")
    _ax.set_title(f"{op_choice.value}: red = compiled or loaded, green = cache hit")
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The compile log records every program the process produced, with the tier
    that produced it: `compile` (XLA compiled it now) or `disk` (the persistent
    cache had it from an earlier process):
    """)
    return


@app.cell
def _(call_compiles, dbg):
    recent_events = dbg.compile_log()[-call_compiles[0]:] if call_compiles[0] else []
    if not recent_events:
        print("every call was a cache hit: this op and shape had run before in this process")
    for _e in recent_events:
        print(f"{_e.name:<32} tier={_e.tier:<8} {_e.seconds * 1e3:8.1f} ms  "
              f"{_e.program_bytes:>6} bytes of optimized HLO")
    return (recent_events,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. The HLO of one op

    `torch_tpu.debug.hlo(op, *args, stage=...)` lowers one ATen op through the
    same lowering table the executor uses. `stablehlo` is what the lowering
    produced; `optimized` is the HLO after XLA's passes — the program that runs.
    Here is `aten.addmm` (what `nn.Linear` calls): a dot and a bias add. Whether
    XLA fuses the add into the dot's kernel depends on the backend and the
    host's CPU; the sentence under the programs is read from the optimized HLO
    shown, by `torch_tpu.debug.fusions`.
    """)
    return


@app.cell
def _(dbg, readable_hlo, side_by_side, torch):
    _bias = torch.randn(8, device="tpu")
    _x = torch.randn(4, 16, device="tpu")
    _w = torch.randn(16, 8, device="tpu")
    addmm_stablehlo = dbg.hlo(torch.ops.aten.addmm.default, _bias, _x, _w, stage="stablehlo")
    addmm_optimized = dbg.hlo(torch.ops.aten.addmm.default, _bias, _x, _w, stage="optimized")
    side_by_side(("StableHLO (lowered)", readable_hlo(addmm_stablehlo)),
                 ("Optimized HLO (runs)", readable_hlo(addmm_optimized)))
    return addmm_optimized, addmm_stablehlo


@app.cell(hide_code=True)
def _(addmm_optimized, dbg, kernels_sentence, mo):
    addmm_kernels = dbg.fusions(addmm_optimized)
    addmm_sentence = kernels_sentence(addmm_kernels, "dot_general", "add")
    mo.md(addmm_sentence)
    return addmm_kernels, addmm_sentence


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. Views and in-place ops on immutable arrays

    JAX arrays never change; PyTorch tensors alias. torch_tpu reconciles the two
    with PyTorch's own storage model:

    * each **storage** holds one JAX array in its natural shape (a 4×4 tensor's
      storage is a 4×4 array, not a flat buffer);
    * a **view** (`x[1]`, `x.t()`, `x.view(-1)`, `x.diagonal()`, ...) is a
      PyTorch tensor with its own sizes, strides and offset on the *same*
      storage — no data is copied, and `view._base is x`;
    * reading a view compiles the strided read into the op's program;
    * an **in-place op** computes the new value and *replaces* the storage's
      array with an updated one (a functional scatter into the base), so every
      tensor sharing that storage — the base and all its views — sees the write.
    """)
    return


@app.cell
def _(data_of, dbg, torch):
    grid = torch.zeros(4, 4, device="tpu")
    grid_cpu = torch.zeros(4, 4)
    array_before = data_of(grid).array
    row_view = grid[1]
    col_view = grid.t()[2]                 # a column, through a transpose
    print("row_view._base is grid:", row_view._base is grid,
          "| same storage:", data_of(row_view) is data_of(grid))
    print("row strides", row_view.stride(), "offset", row_view.storage_offset(),
          "| col strides", col_view.stride(), "offset", col_view.storage_offset())
    dbg.clear_compile_log()
    for g in (grid, grid_cpu):
        g[1].fill_(1.0)
        g.t()[2].add_(10.0)
        g.view(-1)[::5].mul_(-1)           # the diagonal, through a flat view
    print(grid)
    print("same values as on the CPU:", torch.equal(grid.cpu(), grid_cpu))
    print("the storage's array was replaced:", data_of(grid).array is not array_before,
          "| version counter:", grid._version)
    view_write_events = dbg.compile_log()
    return col_view, grid, grid_cpu, row_view, view_write_events


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The program that ran `g.t()[2].add_(10)`: it reads the column out of the 4×4
    array, adds, and scatters the result back into a new 4×4 array — the new
    value of the storage.
    """)
    return


@app.cell
def _(mo, readable_hlo, view_write_events):
    _add = [e for e in view_write_events if e.name.startswith("aten.add_")]
    view_write_hlo = _add[-1].program.stablehlo if _add else ""
    mo.plain_text(readable_hlo(view_write_hlo, max_lines=60) if view_write_hlo else
                  "(the in-place add came from the cache: no program was compiled in this run)")
    return (view_write_hlo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (transfers counted by `debug.capture()`, the tensor itself)
    and says whether yours is right. A wrong answer gets a hint: where to look,
    with which cell or tool; the measured answer waits under *Show the answer*,
    and the written solution is folded away under each exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 1 · wait for the device

    How many times does this block make the host **wait for a value from the device**
    (copies to the host, plus scalar reads such as `.item()`)? `n` is some size.
    """), ex.code(ex.TRANSFERS_BLOCK)])
    return


@app.cell
def _(mo):
    reads_answer = mo.ui.number(label="reads of a device value")
    reads_answer
    return (reads_answer,)


@app.cell
def _(ex, reads_answer):
    ex.show(ex.check(ex.check_transfers, reads_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **3.** `if y.sum() > 0:` calls `bool()` on a device tensor: a scalar read
        (an implicit `.item()`); then `.item()`; then `.cpu()`. The arithmetic only
        queues programs (section 3), and `back.to("tpu")` copies the other way.
        Count it yourself: run the block inside `with torch_tpu.debug.capture() as c:`
        and read `c["transfers"]` and `c["item_calls"]`.
    """)})
    return


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 2 · device and dtype

    On which device, and with which dtype, is the result of this expression?
    """), ex.code(ex.DEVICE_DTYPE_EXPR)])
    return


@app.cell
def _(ex, mo):
    device_dtype_answer = mo.ui.dropdown(ex.DEVICE_DTYPE_OPTIONS, value=None, label="device, dtype")
    device_dtype_answer
    return (device_dtype_answer,)


@app.cell
def _(device_dtype_answer, ex):
    ex.show(ex.check(ex.check_device_dtype, device_dtype_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **`tpu:0, torch.float32`.** `/` is true division, so integers give
        PyTorch's default float dtype, exactly as on the CPU. The op runs where its
        tensor operand lives; a 0-dim CPU tensor such as `torch.tensor(1.0)` may join
        an op on another device as a scalar (as with CUDA), while a CPU tensor with
        dimensions would be an error.
    """)})
    return


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 3 · write through a view

    After this block, how many elements of `x` are **zero**?
    """), ex.code(ex.VIEW_BLOCK)])
    return


@app.cell
def _(mo):
    zeros_answer = mo.ui.number(label="zeros in x")
    zeros_answer
    return (zeros_answer,)


@app.cell
def _(ex, zeros_answer):
    ex.show(ex.check(ex.check_view_write, zeros_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **3.** `x.t()` is a view (4×3) of `x`'s storage and `x.t()[1]` is its row 1:
        column 1 of `x`, three elements. `mul_` writes through the view (section 6):
        the storage's array is replaced by one with that column zeroed, and `x`,
        sharing the storage, sees it.
    """)})
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the notebook checked

    The cells named `test_*` below run with the notebook (and under `pytest`):
    the claims above are asserted, so a regression fails the guide's tests.
    Next: **02 · ops and lowering** — how an ATen op becomes an XLA program.
    """)
    return


@app.cell
def test_tensors_and_transfers(back, dtype, numpy_error, t, total, transfers, torch):
    assert t.device.type == "tpu" and t.dtype == dtype
    assert torch.equal(back, torch.arange(1024, dtype=torch.float32) * 2)
    assert total == sum(range(1024))
    assert transfers["transfers"]["host_to_device"]["bytes"] >= 4096
    assert transfers["transfers"]["device_to_host"]["count"] >= 1
    assert transfers["item_calls"] == 1
    assert "cpu()" in numpy_error
    return


@app.cell
def test_async_dispatch(chain_len, dispatch_metrics):
    # Counts, not clocks (whether the chain is still running when the loop
    # returns is a race the timings above show, not a claim to test): every
    # matmul was dispatched, and the host never waited for the device while
    # dispatching: no synchronization, no value read back.
    assert dispatch_metrics["ops"].get("aten.mm.default", 0) == chain_len.value
    assert dispatch_metrics["synchronizations"] == 0
    assert dispatch_metrics["item_calls"] == 0
    assert "device_to_host" not in dispatch_metrics["transfers"]
    return


@app.cell
def test_cache(call_compiles, call_hits):
    # Counts, not clocks (that a hit is faster than a compile is what the
    # chart above shows; on a loaded machine a single timing can say otherwise).
    assert all(c == 0 for c in call_compiles[1:]), "later calls must be cache hits"
    assert all(h > 0 for h in call_hits[1:]), "later calls must be cache hits"
    return


@app.cell
def test_hlo(addmm_kernels, addmm_optimized, addmm_sentence, addmm_stablehlo):
    assert "dot_general" in addmm_stablehlo
    assert " dot(" in addmm_optimized or "fusion" in addmm_optimized
    # the sentence names exactly the kernels of the HLO shown, each in it
    _kernels = [_n for _n in addmm_kernels.nodes if _n.is_compute]
    assert _kernels and f"into {len(_kernels)} kernel" in addmm_sentence
    for _n in _kernels:
        assert f"`{_n.name}`" in addmm_sentence and _n.name in addmm_optimized
    _fused = any({"dot_general", "add"} <= set(_n.jax_ops) for _n in _kernels)
    assert ("is fused into" in addmm_sentence) == _fused
    return


@app.cell
def test_views(grid, grid_cpu, row_view, torch, view_write_hlo):
    assert row_view._base is grid
    assert torch.equal(grid.cpu(), grid_cpu)
    assert torch.equal(row_view.cpu(), grid_cpu[1])
    assert grid._version > 0
    if view_write_hlo:
        assert "scatter" in view_write_hlo or "dynamic_update_slice" in view_write_hlo
    return


if __name__ == "__main__":
    app.run()
