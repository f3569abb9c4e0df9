# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""04 · torch.compile(backend="tpu"): graphs, their HLO, compile vs step time, graph breaks, dynamic shapes."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="04 · torch.compile")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 04 · `torch.compile(backend="tpu")`

    Eager mode runs one executable per op. `torch.compile` captures a whole
    function as a graph instead:

    1. **dynamo** traces the Python function into an FX graph of ATen ops
       (breaking the graph where it cannot trace, e.g. at `.item()`);
    2. **AOTAutograd** splits it into a forward and a backward graph,
       decomposed to PyTorch's core ATen ops;
    3. torch_tpu lowers each graph with the **same lowering table** eager mode
       uses, into **one XLA program** per graph, which XLA optimizes as a whole
       (fusing elementwise ops into their producers, removing intermediates).

    Parameters stay on the device between calls; the executables live in the
    same cache as eager ops (memory, then disk — notebook 05).
    """)
    return


@app.cell
def _():
    import time
    import warnings

    import matplotlib.pyplot as plt
    import torch
    import torch._dynamo

    import torch_tpu
    import torch_tpu.debug as dbg

    from hlo_view import (  # guide/notebooks/hlo_view.py
        fusions_beside_hlo,
        program_box,
        readable_hlo,
        side_by_side,
    )

    return (
        dbg,
        fusions_beside_hlo,
        plt,
        program_box,
        readable_hlo,
        side_by_side,
        time,
        torch,
        torch_tpu,
        warnings,
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
    ## 1. A model, eager and compiled

    A small transformer-style block (attention + MLP + layer norms). Choose its
    width and batch; the cells below time eager and compiled training steps.
    """)
    return


@app.cell
def _(mo):
    dim = mo.ui.slider(32, 256, step=32, value=64, label="width")
    batch = mo.ui.slider(2, 32, step=2, value=8, label="batch")
    mo.hstack([dim, batch], justify="start")
    return batch, dim


@app.cell
def _(torch):
    class Block(torch.nn.Module):
        def __init__(self, dim, heads=4):
            super().__init__()
            self.heads = heads
            self.norm1 = torch.nn.LayerNorm(dim)
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.proj = torch.nn.Linear(dim, dim)
            self.norm2 = torch.nn.LayerNorm(dim)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                           torch.nn.Linear(4 * dim, dim))

        def attention(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))          # b, heads, t, d/heads
            scores = (q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5
            out = torch.softmax(scores, dim=-1) @ v
            return self.proj(out.transpose(1, 2).reshape(b, t, d))

        def forward(self, x):
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    return (Block,)


@app.cell
def _(Block, batch, dbg, dim, time, torch):
    torch.manual_seed(0)
    block = Block(dim.value).to("tpu")
    block_inputs = torch.randn(batch.value, 16, dim.value, device="tpu")
    compiled_block = torch.compile(block, backend="tpu")

    def train_step(fn, x):
        out = fn(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        return loss

    def timed_steps(fn, n):
        times = []
        for _ in range(n):
            torch.tpu.synchronize()
            t0 = time.perf_counter()
            train_step(fn, block_inputs).item()
            times.append(time.perf_counter() - t0)
        return times

    eager_times = timed_steps(block, 6)
    _captured = torch._dynamo.utils.counters["stats"]["calls_captured"]
    with dbg.capture() as _first:  # the compiled first step's programs
        compiled_times = timed_steps(compiled_block, 1)
    # dynamo traced nothing: its package for Block.forward came from the cache
    block_package_loaded = torch._dynamo.utils.counters["stats"]["calls_captured"] == _captured
    compiled_times += timed_steps(compiled_block, 5)
    eager_loss = train_step(block, block_inputs).item()
    compiled_loss = train_step(compiled_block, block_inputs).item()
    # Where the compiled first step went: making its graph programs (XLA
    # compiling them, or loading them from the disk cache), and the rest:
    # dynamo and AOTAutograd tracing the Python code, then the run.
    first_graphs = [e for e in _first.compiles if e.kind == "graph"]
    first_programs_s = sum(e.seconds for e in first_graphs)
    _from_disk = sum(e.tier == "disk" for e in first_graphs)
    print(f"eager:    first step {eager_times[0] * 1e3:8.1f} ms, then {min(eager_times[1:]) * 1e3:6.2f} ms")
    print(f"compiled: first step {compiled_times[0] * 1e3:8.1f} ms, then {min(compiled_times[1:]) * 1e3:6.2f} ms")
    _rest = "rebuilding the graphs from dynamo's package (loaded from disk: nothing traced)" \
        if block_package_loaded else "tracing (dynamo, AOTAutograd)"
    print(f"          its {len(first_graphs)} graph programs: {first_programs_s * 1e3:.1f} ms "
          f"({_from_disk} loaded from disk, {len(first_graphs) - _from_disk} compiled); the other "
          f"{max(compiled_times[0] - first_programs_s, 0.0) * 1e3:.1f} ms: {_rest}, and the run")
    print(f"loss eager {eager_loss:.6f} vs compiled {compiled_loss:.6f}")
    return (block, block_inputs, block_package_loaded, compiled_block, compiled_loss,
            compiled_times, eager_loss, eager_times, first_graphs, first_programs_s, train_step)


@app.cell
def plot_compile_vs_step(compiled_times, eager_times, plt):
    _fig, _ax = plt.subplots(figsize=(7, 3))
    _labels = ["eager\nfirst step", "eager\nsteady", "compiled\nfirst step", "compiled\nsteady"]
    _vals = [eager_times[0], min(eager_times[1:]), compiled_times[0], min(compiled_times[1:])]
    _bars = _ax.bar(_labels, [v * 1e3 for v in _vals],
                    color=["tab:orange", "tab:green", "tab:red", "tab:blue"])
    _ax.bar_label(_bars, fmt="%.1f ms", fontsize=8)
    _ax.set_yscale("log")
    _ax.set_ylabel("ms per training step")
    _ax.set_title("compile once, then run one program per graph")
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **What a warm cache saves.** Open this notebook again (a new kernel, the
    same cache directory): its graph programs then come from the disk cache in
    milliseconds (the line above says how many were loaded), and dynamo's
    package for `Block.forward` (its guards, its transformed bytecode,
    AOTAutograd's forward and backward graphs) is loaded at the
    `torch.compile(...)` call, so the first compiled step traces nothing: what
    is left is rebuilding the two graphs from the package and the first run,
    a small part of the cold first step, though more than a steady step. The
    line above says which happened in this run. This is PyTorch's caching
    precompile, on by default for `backend="tpu"` (`TORCH_TPU_PRECOMPILE=0`
    turns it off; then every new kernel traces again). It works for classes
    and functions defined in notebook cells as in a script: the package is
    written when the compile ends, and editing a cell the trace went through
    makes its graph unused, not wrong, as does a helper function that is
    different in the new process. The docs' troubleshooting page lists what
    cannot be packaged (a compiled `optimizer.step`, a frame guarded on a
    lambda).
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. One executable per graph

    The compile log shows what the compiled step produced: a forward and a
    backward program, each compiled once, each with XLA's cost analysis.
    """)
    return


@app.cell
def _(dbg):
    graph_events = dbg.compile_log(kind="graph")
    for _e in graph_events:
        _cost = _e.program.cost if _e.program is not None else {}
        print(f"{_e.name:<18} tier={_e.tier:<8} {_e.seconds * 1e3:8.1f} ms  "
              f"{_cost.get('flops', 0) / 1e6:8.2f} MFLOP  {_e.program_bytes:>7} bytes of HLO")
    return (graph_events,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. The forward graph's HLO, before and after XLA's passes

    Left, the program as lowered (every ATen op of the graph is there); right,
    what XLA made of it: elementwise chains fused into `fusion` computations
    that run as single kernels.
    """)
    return


@app.cell
def _(dbg, mo, readable_hlo, side_by_side):
    def count_instructions(text):
        """Instructions of the ENTRY computation (a fusion counts as one)."""
        n, inside = 0, False
        for line in text.splitlines():
            if line.startswith("ENTRY"):
                inside = True
            elif inside and line.startswith("}"):
                break
            elif inside and " = " in line:
                n += 1
        return n

    forward_program = next(p for p in dbg.last_graphs() if "forward" in p.name)
    hlo_before = forward_program.hlo
    hlo_after = forward_program.optimized
    mo.vstack([
        mo.md(f"`{forward_program.name}`: **{count_instructions(hlo_before)}** instructions in "
              f"the entry computation before optimization, **{count_instructions(hlo_after)}** "
              f"after, of which {hlo_after.count(' fusion(')} are fused kernels."),
        side_by_side(("before XLA's passes", readable_hlo(hlo_before, max_lines=70)),
                     ("after (what runs)", readable_hlo(hlo_after, max_lines=70))),
    ])
    return count_instructions, forward_program, hlo_after, hlo_before


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same optimized program as a graph: `torch_tpu.debug.fusions` reads
    each kernel's HLO metadata, where every instruction carries the ATen op of
    the graph it was lowered from, and the shapes between kernels. A box is
    one kernel with the ATen ops XLA put in it; an arrow is an array written
    by one kernel and read by the next, labelled with its size:
    """)
    return


@app.cell
def _(dbg, forward_program, fusions_beside_hlo, mo):
    forward_fusions = dbg.fusions(forward_program)
    mo.vstack([
        fusions_beside_hlo(forward_fusions, max_lines=70),
        mo.accordion({"the same as a table": mo.plain_text(str(forward_fusions))}),
    ])
    return (forward_fusions,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Graph breaks

    Code dynamo cannot put in a graph — here a Python `if` on a tensor's value —
    splits the function into several graphs, with eager execution in between.
    `torch._dynamo.explain` says where and why:
    """)
    return


@app.cell
def _(torch, warnings):
    def with_break(x):
        y = torch.relu(x) * 2
        if y.sum().item() > 0:          # reading a value: the graph must end here
            y = y + 1
        return y.softmax(-1)

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging as _logging
        _log = _logging.getLogger("torch._dynamo")
        _level = _log.level
        _log.setLevel(_logging.ERROR)
        try:
            explanation = torch._dynamo.explain(with_break)(torch.randn(4, 4, device="tpu"))
        finally:
            _log.setLevel(_level)
    print(f"graphs: {explanation.graph_count}, graph breaks: {explanation.graph_break_count}")
    for _r in explanation.break_reasons:
        print("break:", str(_r.reason).splitlines()[0])
    compiled_break = torch.compile(with_break, backend="tpu")
    _x = torch.randn(4, 4, device="tpu")
    break_ok = torch.allclose(compiled_break(_x).cpu(), with_break(_x).cpu(), atol=1e-6)
    print("compiled result equals eager:", break_ok)
    return break_ok, explanation


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. Dynamic shapes

    XLA compiles for static shapes. When a size changes between calls (a new
    sequence length), dynamo retraces with a symbolic size, and torch_tpu's
    default policy, `"bucket"`, rounds the size up to a bucket (the next power
    of two, at least 8), pads the inputs and masks the padding out of every
    reduction, softmax and matmul so results equal the unpadded ones. A sweep
    over many lengths therefore compiles about log₂(N) programs, not N.
    `options={"dynamic": "exact"}` (or `TORCH_TPU_DYNAMIC=exact`) compiles one
    program per shape instead; see `torch_tpu.compile.dynamic`.
    """)
    return


@app.cell
def _(mo):
    max_len = mo.ui.slider(16, 128, step=16, value=64, label="longest sequence")
    max_len
    return (max_len,)


@app.cell
def _(dbg, max_len, torch):
    torch.manual_seed(0)
    _proj = torch.randn(16, 16, device="tpu")

    def attention_scores(x):
        s = (x @ _proj) @ x.transpose(-1, -2) / 4.0
        return torch.softmax(s, dim=-1).sum(dim=-1)

    compiled_scores = torch.compile(attention_scores, backend="tpu")
    lengths = list(range(3, max_len.value + 1, 3))
    programs_after = []
    max_err = 0.0
    _before = len(dbg.compile_log(kind="graph"))
    for _n in lengths:
        _x = torch.randn(2, _n, 16, device="tpu")
        _got = compiled_scores(_x)
        max_err = max(max_err, (_got - attention_scores(_x)).abs().max().item())
        programs_after.append(len(dbg.compile_log(kind="graph")) - _before)
    print(f"{len(lengths)} sequence lengths -> {programs_after[-1]} graph programs compiled; "
          f"largest difference from eager {max_err:.1e}")
    return attention_scores, compiled_scores, lengths, max_err, programs_after


@app.cell
def _(lengths, plt, programs_after):
    _fig, _ax = plt.subplots(figsize=(7, 3))
    _ax.step(lengths, programs_after, where="post", label="graph programs compiled (bucket policy)")
    _ax.plot(lengths, range(1, len(lengths) + 1), "--", color="gray", label="one per shape")
    _ax.set_xlabel("sequence length")
    _ax.set_ylabel("programs compiled so far")
    _ax.legend()
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. Export: a portable StableHLO program

    `torch_tpu.export(model, args, dynamic_shapes=...)` goes through
    `torch.export` and the **same lowering table**, but instead of running
    the program it returns a `jax.export.Exported`: StableHLO plus its calling
    convention. `.serialize()` gives bytes that any JAX process loads with
    `jax.export.deserialize` and runs without PyTorch. A `torch.export.Dim`
    becomes a symbolic size of the program, so one export serves every batch
    size. Parameters are baked in as constants here (`params="arguments"`
    takes them as a dict argument instead). See the Export page of the docs.
    """)
    return


@app.cell
def _(program_box, torch, torch_tpu):
    import re

    import numpy as np

    torch.manual_seed(0)
    small = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(),
                                torch.nn.Linear(8, 2)).eval()
    exported = torch_tpu.export(small, (torch.randn(2, 4),),
                                dynamic_shapes=({0: torch.export.Dim("batch", max=1024)},))
    # One program, two batch sizes; compared with PyTorch on the CPU.
    export_err = 0.0
    for _b in (3, 17):
        _x = torch.randn(_b, 4)
        _got = torch.from_numpy(np.array(exported.call(_x.numpy())))  # a writable copy
        export_err = max(export_err, (_got - small(_x).detach()).abs().max().item())
    # The StableHLO text, without its source-location annotations (long
    # lines, the baked weights among them, cut at 150 characters).
    _loc = re.compile(r" loc\((?:[^()]|\([^()]*\))*\)")
    _lines = [_loc.sub("", _l) for _l in exported.mlir_module().splitlines()
              if not _l.startswith("#loc")]
    stablehlo = "\n".join(_l if len(_l) <= 150 else _l[:150] + " ..." for _l in _lines)
    # the summary first; the program in a box that scrolls (not the page)
    program_box("the exported StableHLO", stablehlo,
                summary=f"inputs {exported.in_avals} -> outputs {exported.out_avals}; "
                        f"{len(exported.mlir_module_serialized)} bytes of StableHLO; "
                        f"batch 3 and 17 match PyTorch to {export_err:.1e}")
    return export_err, exported, stablehlo


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (graph programs from the compile log, breaks from
    `torch._dynamo.explain`) and says whether yours is right. A wrong answer
    gets a hint: where to look, with which cell or tool; the measured answer
    waits under *Show the answer*, and the written solution is folded away under
    each exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 1 · compile once for every length

    `fn` (below) runs attention-like scores over a sequence; `proj` is a
    `tpu` tensor of a feature size this process has not used. Edit the code so
    that `compiled`, after a first call at length 3, compiles **one** graph
    program for all the lengths 5, 6, …, 12, with `fn`'s values. The check
    calls it at length 3, then 5..12, and counts the graph programs in the
    compile log (section 5 explains what it will see).
    """), ex.code(ex.COMPILE_ONCE_FN)])
    return


@app.cell
def _(ex, mo):
    compile_once_code = mo.ui.code_editor(value=ex.COMPILE_ONCE_STARTER, label="your code")
    compile_once_code
    return (compile_once_code,)


@app.cell
def _(compile_once_code, ex):
    ex.show(ex.check(ex.check_compile_once, compile_once_code.value, starter=ex.COMPILE_ONCE_STARTER))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        ```python
        compiled = torch.compile(fn, backend="tpu", dynamic=True, options={"buckets": [16]})
        ```
        `dynamic=True` makes the length symbolic from the first call (without it,
        dynamo compiles length 3 as a static graph and retraces at the next length);
        torch_tpu pads a size to a bucket once it has seen it change, and one
        bucket of 16 covers 5..12 (the default buckets 8 and 16 would need two
        programs); `options={"buckets": [12]}` works as well.
    """)})
    return


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 2 · predict the graph breaks

    How many **graph breaks** does dynamo make in this function?
    """), ex.code(ex.BREAKS_FN)])
    return


@app.cell
def _(mo):
    breaks_answer = mo.ui.number(label="graph breaks")
    breaks_answer
    return (breaks_answer,)


@app.cell
def _(breaks_answer, ex):
    ex.show(ex.check(ex.check_graph_breaks, breaks_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **2** (three graphs). `y.sum().item()` and `float(y.abs().max())` both read a
        tensor's value on the host, which a graph cannot do: each ends the graph,
        runs eagerly, and dynamo starts a new graph after it (section 4). Keeping
        the condition on the device (`torch.where`) and the scale a tensor removes
        both breaks.
    """)})
    return


@app.cell
def test_compiled_first_step_accounted(compiled_times, first_graphs, first_programs_s):
    # the first compiled step makes the forward and backward graph programs
    # (compiled or loaded), and that time is part of the step's
    assert len(first_graphs) >= 2, [e.name for e in first_graphs]
    assert 0 < first_programs_s <= compiled_times[0]
    return


@app.cell
def test_compiled_matches_eager(compiled_loss, eager_loss):
    assert abs(compiled_loss - eager_loss) <= 1e-4 * max(1.0, abs(eager_loss))
    return


@app.cell
def test_one_program_per_graph(graph_events):
    names = [e.name for e in graph_events]
    assert any("forward" in n for n in names) and any("backward" in n for n in names), names
    return


@app.cell
def test_hlo_before_after(count_instructions, hlo_after, hlo_before):
    assert "dot" in hlo_before and "dot" in hlo_after
    assert "fusion" in hlo_after
    assert 0 < count_instructions(hlo_after) < count_instructions(hlo_before)
    return


@app.cell
def test_forward_fusions(forward_fusions):
    _ops = {op.rsplit(".", 1)[0] for op in forward_fusions.aten_ops}
    assert _ops & {"aten.mm", "aten.addmm", "aten.bmm"}, _ops
    assert any(n.is_fusion for n in forward_fusions.kernels)
    assert forward_fusions.to_mermaid().startswith("flowchart")
    return


@app.cell
def test_graph_break(break_ok, explanation):
    assert explanation.graph_break_count >= 1
    assert break_ok
    return


@app.cell
def test_export_round_trip(export_err, exported, stablehlo):
    assert export_err < 1e-5
    assert "batch" in str(exported.in_avals[0].shape)
    assert "stablehlo.dot_general" in stablehlo
    return


@app.cell
def test_dynamic_shapes_bounded(lengths, max_err, programs_after):
    assert max_err < 1e-4
    assert programs_after[-1] < len(lengths) // 2, programs_after
    return


if __name__ == "__main__":
    app.run()
