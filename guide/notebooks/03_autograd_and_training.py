# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""03 · Autograd and training: an MLP trained eagerly on `tpu`, gradients checked against the CPU."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="03 · Autograd and training")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 03 · Autograd and training

    A `tpu` tensor is a real `torch.Tensor`, so PyTorch's own autograd records
    the graph, computes gradients with the backward ATen ops (each one lowered
    to XLA like any forward op), and optimizers update parameters in place. Your
    training loop is the CUDA one with `"cuda"` replaced by `"tpu"`: no lazy
    tensors, no `mark_step()`.

    This notebook checks gradients against the CPU, then trains a small MLP on
    a synthetic regression task and plots the loss as it trains.
    """)
    return


@app.cell
def _():
    import copy
    import time

    import matplotlib.pyplot as plt
    import torch

    import torch_tpu
    import torch_tpu.debug as dbg

    return copy, dbg, plt, time, torch, torch_tpu


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
    ## 1. Gradients match the CPU

    The same function, the same inputs, once on the CPU and once on `tpu`:
    """)
    return


@app.cell
def _(torch):
    torch.manual_seed(0)
    _x_cpu = torch.randn(16, 8, requires_grad=True)
    _w_cpu = torch.randn(8, 4, requires_grad=True)
    _x_tpu = _x_cpu.detach().to("tpu").requires_grad_()
    _w_tpu = _w_cpu.detach().to("tpu").requires_grad_()

    def objective(x, w):
        h = torch.tanh(x @ w)
        return (torch.log_softmax(h, dim=-1) * h).sum() + (w ** 2).mean()

    objective(_x_cpu, _w_cpu).backward()
    objective(_x_tpu, _w_tpu).backward()
    grad_diffs = {
        "dL/dx": (_x_tpu.grad.cpu() - _x_cpu.grad).abs().max().item(),
        "dL/dw": (_w_tpu.grad.cpu() - _w_cpu.grad).abs().max().item(),
    }
    print("grad_fn of the tpu loss:", objective(_x_tpu, _w_tpu).grad_fn)
    for _k, _v in grad_diffs.items():
        print(f"max |tpu - cpu| of {_k}: {_v:.2e}")
    return grad_diffs, objective


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Training an MLP

    The task: learn `y = sin(3·x₀) + x₁·x₂` from noisy samples. Change the width,
    the learning rate or the optimizer and the cells below re-train.
    """)
    return


@app.cell
def _(mo):
    width = mo.ui.slider(16, 256, step=16, value=64, label="hidden width")
    lr = mo.ui.dropdown(["0.003", "0.01", "0.03"], value="0.01", label="learning rate")
    optimizer_name = mo.ui.dropdown(["AdamW (fused)", "AdamW (foreach)", "SGD (momentum)"],
                                    value="AdamW (fused)", label="optimizer")
    steps = mo.ui.slider(20, 300, step=20, value=120, label="steps")
    mo.hstack([width, lr, optimizer_name, steps], justify="start")
    return lr, optimizer_name, steps, width


@app.cell
def _(torch):
    def make_data(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(n, 3, generator=g) * 2 - 1
        y = torch.sin(3 * x[:, :1]) + x[:, 1:2] * x[:, 2:3]
        return x, y + 0.02 * torch.randn(n, 1, generator=g)

    def make_mlp(width):
        return torch.nn.Sequential(
            torch.nn.Linear(3, width), torch.nn.GELU(),
            torch.nn.Linear(width, width), torch.nn.GELU(),
            torch.nn.Linear(width, 1))

    train_x, train_y = make_data(512, seed=1)
    test_x, test_y = make_data(256, seed=2)
    return make_data, make_mlp, test_x, test_y, train_x, train_y


@app.cell
def _(dbg, lr, make_mlp, optimizer_name, steps, test_x, test_y, time, torch, train_x, train_y,
      width):
    torch.manual_seed(0)
    model = make_mlp(width.value).to("tpu")
    _params = model.parameters()
    if optimizer_name.value == "AdamW (fused)":    # the whole update: one executable
        optimizer = torch.optim.AdamW(_params, lr=float(lr.value), fused=True)
    elif optimizer_name.value == "AdamW (foreach)":
        optimizer = torch.optim.AdamW(_params, lr=float(lr.value), foreach=True)
    else:
        optimizer = torch.optim.SGD(_params, lr=float(lr.value) * 10, momentum=0.9)
    _xs, _ys = train_x.to("tpu"), train_y.to("tpu")
    _tx, _ty = test_x.to("tpu"), test_y.to("tpu")
    losses, test_losses, step_times, step_compiles = [], [], [], []
    dbg.reset_metrics()
    for _step in range(steps.value):
        _t0 = time.perf_counter()
        with dbg.capture() as _cap:               # _cap.compiles: what this step compiled
            _idx = torch.randint(0, _xs.shape[0], (64,), device="tpu")
            loss = torch.nn.functional.mse_loss(model(_xs[_idx]), _ys[_idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(loss)                       # stays on the device: no sync per step
        step_times.append(time.perf_counter() - _t0)
        step_compiles.append(len(_cap.compiles))
        if _step % 20 == 19 or _step == steps.value - 1:
            with torch.no_grad():
                test_losses.append((_step + 1, torch.nn.functional.mse_loss(model(_tx), _ty)))
    losses = torch.stack(losses).cpu().tolist()  # one transfer for the whole curve
    test_losses = [(s, v.item()) for s, v in test_losses]
    train_metrics = dbg.metrics()
    print(f"first loss {losses[0]:.4f} -> last loss {losses[-1]:.4f}; "
          f"test loss {test_losses[-1][1]:.4f}")
    print(f"step 1 took {step_times[0] * 1e3:.0f} ms (compiling every op's executable); "
          f"median of the rest {sorted(step_times[1:])[len(step_times) // 2] * 1e3:.1f} ms")
    print(f"{train_metrics['ops_total']} op executions, {train_metrics['compiles']['count']} "
          f"executables compiled, {train_metrics['fallbacks_total']} CPU fallbacks")
    print("executables compiled in steps 1, 2, 3, ...:", step_compiles[:8], "...",
          f"(after step 2: {sum(step_compiles[2:])})")
    return losses, model, optimizer, step_compiles, step_times, test_losses, train_metrics


@app.cell
def _(losses, plt, test_losses):
    _fig, _ax = plt.subplots(figsize=(7, 3))
    _ax.plot(range(1, len(losses) + 1), losses, lw=1, label="train (batch of 64)")
    _ax.plot([s for s, _ in test_losses], [v for _, v in test_losses], "o-", label="test")
    _ax.set_yscale("log")
    _ax.set_xlabel("step")
    _ax.set_ylabel("MSE")
    _ax.legend()
    _ax.set_title("MLP trained eagerly on tpu")
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Note the loop never calls `.item()` per step: each step's loss stays on the
    device and the curve is read once at the end, so the host keeps dispatching
    while the device computes (notebook 01, *asynchronous dispatch*).

    ## 3. Step time: the first step compiles

    The first step compiles one executable per distinct (op, shapes, dtypes)
    (SGD's momentum buffers appear in step 2, so it compiles a little there
    too); every later step only runs cached executables. If a step time stays
    high, look for recompiles: `torch_tpu.debug.compile_log()` says which op
    and why (notebook 06).
    """)
    return


@app.cell
def _(plt, step_times):
    _fig, _ax = plt.subplots(figsize=(7, 2.6))
    _ax.plot(range(1, len(step_times) + 1), [t * 1e3 for t in step_times], lw=1)
    _ax.set_yscale("log")
    _ax.set_xlabel("step")
    _ax.set_ylabel("host ms per step")
    _ax.set_title("step 1 compiles; later steps hit the executable cache")
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. The same training on the CPU

    With the same seed, the same data and the same initial weights, twenty
    steps of SGD on `tpu` and on the CPU give the same losses (to float32
    rounding):
    """)
    return


@app.cell
def _(copy, make_mlp, torch, train_x, train_y):
    def train_steps(device, n=20):
        torch.manual_seed(0)
        net = make_mlp(32)
        net = copy.deepcopy(net).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        xs, ys = train_x[:128].to(device), train_y[:128].to(device)
        out = []
        for _ in range(n):
            loss = torch.nn.functional.mse_loss(net(xs), ys)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.detach())
        return torch.stack(out).cpu()

    parity_cpu = train_steps("cpu")
    parity_tpu = train_steps("tpu")
    parity_rel = ((parity_tpu - parity_cpu).abs() / parity_cpu.abs()).max().item()
    print("cpu:", [round(v, 5) for v in parity_cpu[:5].tolist()], "...")
    print("tpu:", [round(v, 5) for v in parity_tpu[:5].tolist()], "...")
    print(f"largest relative difference over 20 steps: {parity_rel:.2e}")
    return parity_cpu, parity_rel, parity_tpu, train_steps


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (the ops the backward ran, programs compiled per step) and
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
def _(ex, mo):
    mo.vstack([mo.md(r"""
    ### Exercise 1 · what the backward runs

    Which of these ATen ops does `loss.backward()` run on the `tpu` device here?
    """), ex.code(ex.BACKWARD_BLOCK)])
    return


@app.cell
def _(ex, mo):
    backward_answer = mo.ui.dropdown(ex.BACKWARD_OPTIONS, value=None, label="runs in the backward")
    backward_answer
    return (backward_answer,)


@app.cell
def _(backward_answer, ex):
    ex.show(ex.check(ex.check_backward_op, backward_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **`aten.gelu_backward.default`**, next to an `aten.mm` for the gradient of
        `x @ w`. PyTorch's autograd records the forward and calls the backward
        formulas, which are ATen ops like any other: each is lowered to XLA and runs
        as a cached executable on the device. Check with
        `torch_tpu.debug.capture()` around `loss.backward()`.
    """)})
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 2 · the third step

    A small MLP trained with `SGD(momentum=0.9)` on shapes this process has not
    seen: step 1 compiles every op's executable. How many executables does
    **step 3** compile?
    """)
    return


@app.cell
def _(mo):
    step3_answer = mo.ui.number(label="executables compiled by step 3")
    step3_answer
    return (step3_answer,)


@app.cell
def _(ex, step3_answer):
    ex.show(ex.check(ex.check_steady_compiles, step3_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **0.** Step 1 compiles forward, backward and update; step 2 the momentum
        update (the buffers exist from step 2 on, section 3); step 3 repeats step
        2's ops on the same shapes: all cache hits. A step that keeps compiling has
        shapes or settings that change: `torch_tpu.debug.compile_log()` says which.
    """)})
    return


@app.cell
def test_gradients_match_cpu(grad_diffs):
    assert all(v < 1e-4 for v in grad_diffs.values()), grad_diffs
    return


@app.cell
def test_training_converges(losses, test_losses, train_metrics):
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    assert test_losses[-1][1] < test_losses[0][1]
    assert train_metrics["fallbacks_total"] == 0, train_metrics["fallbacks"]
    return


@app.cell
def test_steady_state_has_no_recompiles(step_compiles):
    assert step_compiles[0] > 0
    assert sum(step_compiles[2:]) == 0, step_compiles
    return


@app.cell
def test_training_matches_cpu(parity_rel):
    assert parity_rel < 1e-4
    return


if __name__ == "__main__":
    app.run()
