# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""10 · Custom ops: a JAX function as a PyTorch operator, with its gradient, eager and compiled."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="10 · Custom ops from JAX")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 10 · Custom ops from JAX

    Sometimes PyTorch has no op for what you need, or you want a hand-written
    kernel — on a TPU, a **Pallas** kernel. `torch_tpu.jax_op(fn)` turns a JAX
    function into a real PyTorch operator (`torch.ops.torch_tpu_jax.<name>`):

    * on `tpu` tensors it runs as one cached, compiled executable, like any
      ATen op (it shows in metrics, the compile log and profiler traces);
    * under `torch.compile(backend="tpu")` dynamo sees one opaque op (its
      output shapes come from `jax.eval_shape`) and the backend inlines the JAX
      function into the graph's program;
    * autograd works: the backward is `jax.vjp` of the function, itself a
      compiled operator (pass `vjp=False` to skip it);
    * it also runs on CPU tensors (JAX on the host), handy for checking.

    The function must be pure and traceable by `jax.jit`; non-tensor settings
    go in with `functools.partial` before wrapping.
    """)
    return


@app.cell
def _():
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    import torch_tpu
    import torch_tpu.debug as dbg

    return dbg, functools, jax, jnp, np, torch, torch_tpu


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
    ## 1. A JAX function as an operator

    A fused "RMS-normalize, then gate with SiLU" that PyTorch has no single op
    for, written once in `jax.numpy`:
    """)
    return


@app.cell
def _(jax, jnp, torch_tpu):
    def rms_gate_jax(x, gate, weight):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (normed * weight * jax.nn.silu(gate)).astype(x.dtype)

    rms_gate = torch_tpu.jax_op(rms_gate_jax)
    print(f"operator: torch.ops.torch_tpu_jax.{rms_gate.name} (defined on first call)")
    return rms_gate, rms_gate_jax


@app.cell
def _(mo):
    rows = mo.ui.slider(2, 64, step=2, value=8, label="rows")
    features = mo.ui.slider(8, 512, step=8, value=64, label="features")
    mo.hstack([rows, features], justify="start")
    return features, rows


@app.cell
def _(dbg, features, jnp, np, rms_gate, rms_gate_jax, rows, torch):
    torch.manual_seed(0)
    x = torch.randn(rows.value, features.value, device="tpu", requires_grad=True)
    gate = torch.randn(rows.value, features.value, device="tpu", requires_grad=True)
    weight = torch.randn(features.value, device="tpu", requires_grad=True)
    with dbg.capture() as op_capture:
        y = rms_gate(x, gate, weight)
        y.cpu()
    _ref = rms_gate_jax(*(jnp.asarray(t.detach().cpu().numpy()) for t in (x, gate, weight)))
    forward_error = float(np.abs(np.asarray(_ref) - y.detach().cpu().numpy()).max())
    print("y:", tuple(y.shape), y.dtype, y.device, "| grad_fn:", type(y.grad_fn).__name__)
    print(f"max |torch op - plain JAX| = {forward_error:.1e}")
    print("ops executed:", op_capture["ops"])
    return forward_error, gate, op_capture, weight, x, y


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Its gradient, from `jax.vjp`

    `y.sum().backward()` calls the operator's backward — the VJP of the JAX
    function, compiled once — and the gradients land in `.grad` like any other.
    Checked here against `jax.grad` of the same function and against the same
    computation written in plain PyTorch on the CPU:
    """)
    return


@app.cell
def _(gate, jax, jnp, np, rms_gate_jax, torch, weight, x, y):
    for _t in (x, gate, weight):
        _t.grad = None
    (y * y).sum().backward()
    _args = [jnp.asarray(t.detach().cpu().numpy()) for t in (x, gate, weight)]
    _jax_grads = jax.grad(lambda a, b, c: jnp.sum(rms_gate_jax(a, b, c) ** 2), argnums=(0, 1, 2))(*_args)
    grad_vs_jax = max(float(np.abs(np.asarray(g) - t.grad.cpu().numpy()).max())
                      for g, t in zip(_jax_grads, (x, gate, weight)))

    _xc, _gc, _wc = (t.detach().cpu().requires_grad_() for t in (x, gate, weight))
    _yc = _xc * torch.rsqrt(_xc.pow(2).mean(-1, keepdim=True) + 1e-6) * _wc * torch.nn.functional.silu(_gc)
    (_yc * _yc).sum().backward()
    grad_vs_torch = max((a.grad - t.grad.cpu()).abs().max().item()
                        for a, t in zip((_xc, _gc, _wc), (x, gate, weight)))
    print(f"gradients vs jax.grad:            max difference {grad_vs_jax:.1e}")
    print(f"gradients vs PyTorch on the CPU:  max difference {grad_vs_torch:.1e}")
    return grad_vs_jax, grad_vs_torch


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Inside `torch.compile`

    In a compiled function the custom op is one node of the graph; the backend
    lowers it through the same lowering-table entry, so the JAX code ends up
    inside the graph's single XLA program, fused with its neighbours:
    """)
    return


@app.cell
def _(dbg, gate, rms_gate, torch, weight, x):
    def block(x, gate, weight):
        return torch.tanh(rms_gate(x * 2.0, gate, weight)) + 1.0

    compiled_fn = torch.compile(block, backend="tpu")
    _n0 = len(dbg.compile_log(kind="graph"))
    with torch.no_grad():
        compiled_out = compiled_fn(x, gate, weight)
        eager_out = block(x, gate, weight)
    compiled_error = (compiled_out - eager_out).abs().max().item()
    _events = dbg.compile_log(kind="graph")[_n0:]
    compiled_hlo = _events[-1].program.stablehlo if _events and _events[-1].program else ""
    print(f"{len(_events)} graph program(s) compiled; compiled vs eager: {compiled_error:.1e}")
    print("the JAX function's rsqrt inside the graph program:", "rsqrt" in compiled_hlo)
    return compiled_error, compiled_fn, compiled_hlo


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Settings with `functools.partial`, and a Pallas kernel on TPU

    Non-tensor arguments are bound before wrapping; each distinct function is
    a distinct operator. On a TPU the same wrapper takes a Pallas kernel
    (`jax.experimental.pallas.pallas_call`) — the JAX function simply calls it.
    """)
    return


@app.cell
def _(functools, jnp, torch, torch_tpu):
    def leaky(x, slope):
        return jnp.where(x > 0, x, slope * x)

    leaky_01 = torch_tpu.jax_op(functools.partial(leaky, slope=0.1), name="leaky_01")
    _v = torch.tensor([-2.0, -0.5, 0.0, 3.0], device="tpu")
    leaky_out = leaky_01(_v).cpu()
    print("leaky_01", _v.cpu().tolist(), "->", leaky_out.tolist())
    print("it also runs on CPU tensors:", leaky_01(torch.tensor([-1.0, 1.0])).tolist())
    return leaky_01, leaky_out


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (the operator's values, gradient and programs on `tpu`) and
    says whether yours is right. A wrong answer gets a hint: where to look, with
    which cell or tool; the measured answer waits under *Show the answer*, and
    the written solution is folded away under each exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 1 · your own operator

    Write `softsign(x) = x / (1 + |x|)` in `jax.numpy` and make it a PyTorch
    operator `op` with `torch_tpu.jax_op` (section 1). The check runs it on a
    `tpu` tensor, backward included, and compares value and gradient with
    `torch.nn.functional.softsign` on the CPU. `torch`, `torch_tpu`, `jax`,
    `jnp` and `functools` are defined.
    """)
    return


@app.cell
def _(ex, mo):
    op_code = mo.ui.code_editor(value=ex.CUSTOM_OP_STARTER, label="your code")
    op_code
    return (op_code,)


@app.cell
def _(ex, op_code):
    ex.show(ex.check(ex.check_custom_op, op_code.value, starter=ex.CUSTOM_OP_STARTER))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        ```python
        def softsign_jax(x):
            return x / (1 + jnp.abs(x))

        op = torch_tpu.jax_op(softsign_jax)
        ```
        The gradient comes for free: `jax_op` registers a backward computed with
        `jax.vjp` of the same function (section 2).
    """)})
    return


@app.cell(hide_code=True)
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 2 · programs of a custom op

    `op` is a `jax_op` (here `tanh(x) / 2`, forward only). With `n` a size this
    process has not used, how many **executables** do these three calls compile?
    """), ex.code(ex.SHAPES_BLOCK)])
    return


@app.cell
def _(mo):
    op_programs_answer = mo.ui.number(label="executables compiled")
    op_programs_answer
    return (op_programs_answer,)


@app.cell
def _(ex, op_programs_answer):
    ex.show(ex.check(ex.check_op_programs, op_programs_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **2.** A `jax_op` is cached like any ATen op: one executable per distinct
        input shape and dtype. The second call repeats the first one's shape (a
        cache hit); `(4, n)` is new.
    """)})
    return


@app.cell
def test_forward_matches_jax(forward_error, op_capture):
    assert forward_error < 1e-5
    assert sum(op_capture["ops"].values()) >= 1
    assert any("torch_tpu_jax" in k or "rms_gate" in k for k in op_capture["ops"]), op_capture["ops"]
    return


@app.cell
def test_gradients(grad_vs_jax, grad_vs_torch):
    assert grad_vs_jax < 1e-4
    assert grad_vs_torch < 1e-3
    return


@app.cell
def test_compiled(compiled_error, compiled_hlo):
    assert compiled_error < 1e-5
    assert "rsqrt" in compiled_hlo
    return


@app.cell
def test_partial(leaky_out, torch):
    assert torch.allclose(leaky_out, torch.tensor([-0.2, -0.05, 0.0, 3.0]))
    return


if __name__ == "__main__":
    app.run()
