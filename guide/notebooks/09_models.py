# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""09 · Models: minGPT trains and sorts, Llama and Qwen generate, ResNet/UNet/DLRM step times."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="09 · Models")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 09 · Models

    The repository's `examples/` are plain PyTorch models — nothing in them
    knows about torch_tpu beyond `device="tpu"`. This notebook runs them live in
    their tiny configurations (the real-size ones, e.g. `llama-3.2-1b`, are the
    same code with another `--config`):

    1. **minGPT** learns to sort digits from scratch; loss curve and samples;
    2. **Llama 3** and **Qwen3** generate with a KV cache — token for token the
       same on `tpu` and on the CPU;
    3. **ResNet**, **UNet** (DDPM) and **DLRM** training-step times, `tpu` vs CPU;
    4. a **1B Llama**, measured by `benchmarks/scale.py`: decoding speed, peak
       memory and loading, per path.

    The examples ship no pretrained weights (nothing is downloaded), so the
    language models here are randomly initialized: their text is noise, and
    the point is that the same program produces the same tokens everywhere.
    Each example also has a command line: `python examples/mingpt/train.py
    --device tpu --steps 300`.
    """)
    return


@app.cell
def _():
    import sys
    import time
    from pathlib import Path

    import matplotlib.pyplot as plt
    import torch

    import torch_tpu
    import torch_tpu.debug as dbg
    from torch_tpu.benchmark import benchmark

    REPO = Path(torch_tpu.__file__).resolve().parents[1]
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return REPO, benchmark, dbg, plt, time, torch, torch_tpu


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
    ## 1. minGPT learns to sort

    minGPT's classic demo: given 6 digits from {0, 1, 2}, produce them sorted.
    The model ("gpt-nano": 3 layers, 3 heads, 48 wide) is trained from scratch
    with AdamW on problems generated on the fly, graded only on the sorted half.
    """)
    return


@app.cell
def _(mo):
    gpt_steps = mo.ui.slider(50, 600, step=50, value=250, label="training steps")
    gpt_steps
    return (gpt_steps,)


@app.cell
def _(gpt_steps, time, torch):
    import dataclasses as _dc

    from examples.mingpt.model import CONFIGS as GPT_CONFIGS, GPT, SortTask, sort_loss

    sort_task = SortTask(length=6, num_digits=3, seed=0)
    torch.manual_seed(0)
    gpt = GPT(_dc.replace(GPT_CONFIGS["tiny"], vocab_size=3, block_size=sort_task.block_size)).to("tpu")
    _decay = [p for n, p in gpt.named_parameters() if n.endswith("weight") and p.dim() == 2]
    _rest = [p for n, p in gpt.named_parameters() if not (n.endswith("weight") and p.dim() == 2)]
    _opt = torch.optim.AdamW([{"params": _decay, "weight_decay": 0.1},
                              {"params": _rest, "weight_decay": 0.0}],
                             lr=5e-3, betas=(0.9, 0.95), fused=True)
    gpt_losses = []
    _t0 = time.perf_counter()
    for _step in range(gpt_steps.value):
        _x, _y = sort_task(64)
        _loss = sort_loss(gpt(_x.to("tpu")), _y.to("tpu"))
        _opt.zero_grad(set_to_none=True)
        _loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        _opt.step()
        gpt_losses.append(_loss.detach())
    gpt_losses = torch.stack(gpt_losses).cpu().tolist()
    gpt_train_s = time.perf_counter() - _t0
    _tokens = gpt_steps.value * 64 * sort_task.block_size
    print(f"{gpt_steps.value} steps in {gpt_train_s:.1f} s ({_tokens / gpt_train_s:,.0f} tokens/s, "
          f"first step included); loss {gpt_losses[0]:.3f} -> {gpt_losses[-1]:.3f}")
    return gpt, gpt_losses, gpt_train_s, sort_task


@app.cell
def _(gpt_losses, plt):
    _fig, _ax = plt.subplots(figsize=(7, 2.8))
    _ax.plot(range(1, len(gpt_losses) + 1), gpt_losses, lw=1)
    _ax.set_xlabel("step")
    _ax.set_ylabel("cross entropy")
    _ax.set_title("minGPT on the sort task, trained on tpu")
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(gpt, sort_task, torch):
    gpt.eval()
    _problems = torch.randint(0, 3, (200, 6), generator=torch.Generator().manual_seed(123))
    _out = gpt.generate(_problems.to("tpu"), 6, do_sample=False).cpu()
    _answers = _out[:, 6:]
    _truth = torch.sort(_problems, dim=1).values
    sort_accuracy = (_answers == _truth).all(dim=1).float().mean().item()
    for _i in range(5):
        print(f"{_problems[_i].tolist()} -> {_answers[_i].tolist()} "
              f"{'✓' if torch.equal(_answers[_i], _truth[_i]) else '✗'}")
    print(f"exactly sorted: {sort_accuracy:.0%} of 200 new problems (greedy decoding)")
    return (sort_accuracy,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Llama 3 and Qwen3 generate

    The tiny configurations have the real architectures — RMSNorm, RoPE with
    Llama 3 scaling, grouped-query attention, SwiGLU; Qwen3 adds QK-norm and
    tied embeddings — and a byte vocabulary. Generation uses a KV cache: one
    prefill of the prompt, then one token per step. The same weights run on
    `tpu` and on the CPU with greedy decoding.
    """)
    return


@app.cell
def _(mo):
    new_tokens = mo.ui.slider(8, 64, step=8, value=24, label="new tokens")
    prompt_text = mo.ui.text(value="12+34=", label="prompt")
    mo.hstack([prompt_text, new_tokens], justify="start")
    return new_tokens, prompt_text


@app.cell
def _(new_tokens, prompt_text, torch):
    import copy as _copy

    from examples.common.generation import generate
    from examples.llama.model import CONFIGS as LLAMA_CONFIGS, Llama
    from examples.qwen.model import CONFIGS as QWEN_CONFIGS, Qwen3

    _prompt = torch.tensor([list(prompt_text.value.encode("utf-8")) or [32]])
    generations = {}
    for _name, _cls, _cfg in (("Llama 3 (tiny)", Llama, LLAMA_CONFIGS["tiny"]),
                              ("Qwen3 (tiny)", Qwen3, QWEN_CONFIGS["tiny"])):
        torch.manual_seed(0)
        _model = _cls(_cfg).eval()
        _row = {}
        for _dev in ("tpu", "cpu"):
            _m = _copy.deepcopy(_model).to(_dev)
            _t = {}
            _ids = generate(_m, _prompt.to(_dev), new_tokens.value, timings=_t)
            _row[_dev] = (_ids[0, _prompt.shape[1]:].cpu().tolist(), _t)
        generations[_name] = _row
    for _name, _row in generations.items():
        _toks, _t = _row["tpu"]
        _text = bytes(t for t in _toks if 32 <= t < 127).decode()
        _rate = _t.get("decode_tokens", 0) / _t["decode_s"] if _t.get("decode_s") else float("nan")
        print(f"{_name}: {_toks[:12]}... as text {_text[:24]!r}")
        print(f"   tpu == cpu token for token: {_toks == _row['cpu'][0]}; prefill "
              f"{_t['prefill_s'] * 1e3:.0f} ms (first call compiles), decode {_rate:.0f} tokens/s")
    return generate, generations


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. ResNet, UNet and DLRM: training-step times

    One eager training step (forward, loss, backward, SGD) of each example's
    tiny configuration on its synthetic data, on `tpu` and with plain PyTorch on
    the CPU. `torch_tpu.benchmark` separates the first call (which compiles
    every op's executable) from the steady state.
    """)
    return


@app.cell
def _(benchmark, dbg, torch):
    from examples.registry import example_info, get_example

    def step_fn(name, device):
        model, inputs, loss_fn = get_example(name, device=device, seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            loss = loss_fn(model(*inputs))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        return step

    step_table = {}
    for _name in ("resnet", "unet", "dlrm"):
        _info = example_info(_name)
        with dbg.capture() as _cap:
            _res = {"tpu": benchmark(step_fn(_name, "tpu"), warmup=2, iters=3, flops=None,
                                     name=f"{_name} tpu")}
        _res["cpu"] = benchmark(step_fn(_name, "cpu"), warmup=2, iters=3, flops=None,
                                name=f"{_name} cpu")
        step_table[_name] = (_info, _res, _cap["fallbacks"])
    return example_info, get_example, step_fn, step_table


@app.cell
def table_model_steps(mo, step_table):
    _lines = ["| model | batch | tpu first step | tpu step (median) | cpu step (median) | "
              "tpu items/s | ops run on the CPU |", "|---|---|---|---|---|---|---|"]
    for _name, (_info, _res, _fallbacks) in step_table.items():
        _t, _c = _res["tpu"], _res["cpu"]
        _fb = ", ".join(f"`{k}`" for k in _fallbacks) or "none"
        _lines.append(
            f"| {_name} | {_info['batch_size']} {_info['unit']} | {_t.first_call_seconds:.2f} s "
            f"(compiling {_t.first_call_compile_seconds:.2f} s of it) | {_t.median * 1e3:.1f} ms | "
            f"{_c.median * 1e3:.1f} ms | {_info['items_per_batch'] / _t.median:,.0f} | {_fb} |")
    _lines += ["", "Ops in the last column have no lowering yet and ran through the CPU "
               "fallback (notebook 02); everything else ran as compiled XLA executables."]
    mo.md("\n".join(_lines))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Real size: a 1B Llama, measured

    The tiny models above fit a notebook's time budget; a Llama-3.2-1B-shaped
    model (1.24 B parameters, 2.47 GB in bfloat16) does not: on a 2-core CPU
    each path takes minutes. `benchmarks/scale.py` measures it with random
    weights made on the `meta` device, each path in its own process, and
    writes JSON. This section plots the committed run
    (`benchmarks/results/llama-1b.json`; docs/benchmarks.md has the tables)
    or yours: `python benchmarks/scale.py --json my.json`, then its path below.

    What to look for: decoding reads every weight once per token, so its
    speed is how fast the host streams 2.5 GB through bfloat16 dots. On a CPU
    with AMX-BF16 (the committed run), XLA:CPU multiplies bfloat16 natively
    when a dot reads the weight as stored, which torch_tpu's matrix products
    arrange: compiled decoding is within a few percent of the pure-JAX limit
    and faster than eager, whose op-by-op dispatch adds up over 16 layers. On
    a CPU without bfloat16 arithmetic the same products run on float32
    copies, several times slower (docs/benchmarks.md has both). Peak memory
    while generating stays within 1.25x the weights plus the KV cache above
    the runtime's own on every path, and loading holds one allocated copy of
    the weights (the rest of the peak is the checkpoint's file pages, which
    the kernel can drop).
    """)
    return


@app.cell
def _(REPO, mo):
    scale_file = mo.ui.text(value=str(REPO / "benchmarks" / "results" / "llama-1b.json"),
                            label="benchmark JSON", full_width=True)
    scale_file
    return (scale_file,)


@app.cell
def _(scale_file):
    import json as _json
    from pathlib import Path as _Path

    _raw = _json.loads(_Path(scale_file.value).read_text())
    if "runs" in _raw:  # the committed file: several runs, each with its machine and load
        scale_runs = _raw["runs"]
    else:  # scale.py's own --json output: one run
        _load = _raw.get("load_start", [])
        scale_runs = [{"what": "your run", "date": "", "machine": "this machine",
                       "load": f"load average {_load[0]:.1f} at start" if _load else "",
                       "results": _raw["results"]}]
    scale_gen = next((r for r in scale_runs if "eager" in r["results"]), None)
    scale_load = next((r for r in scale_runs if "load-assign" in r["results"]), None)
    return scale_gen, scale_load, scale_runs


@app.cell
def _(mo, plt, scale_gen, scale_load):
    _GEN = [("cpu", "torch CPU"), ("eager", "tpu eager"), ("fused", "tpu fused"),
            ("compiled", "tpu compiled"), ("jax", "pure JAX")]
    _fig, _axes = plt.subplots(1, 3, figsize=(12, 3.4))
    _captions = []
    if scale_gen is not None:
        _res = scale_gen["results"]
        _rows = [(label, _res[k]) for k, label in _GEN if "decode_tps" in _res.get(k, {})]
        _names = [n for n, _ in _rows]
        _axes[0].barh(_names, [r["decode_tps"] for _, r in _rows], color="tab:blue")
        _axes[0].set_xlabel("decode tokens/s (higher is better)")
        _axes[0].invert_yaxis()
        _axes[1].barh(_names, [r["run_peak_rss_gb"] for _, r in _rows], color="tab:orange")
        _w = _rows[0][1]["weights_gb"]
        _axes[1].axvline(_w, color="k", lw=1, ls="--", label=f"weights {_w:.2f} GB")
        _axes[1].set_xlabel("peak host RSS while generating, GB")
        _axes[1].invert_yaxis()
        _axes[1].legend(loc="lower right", fontsize=8)
        _captions.append(f"generation: {scale_gen['date']} at {scale_gen.get('commit', '?')}, "
                         f"{scale_gen['machine']}, {scale_gen['load']}")
    if scale_load is not None:
        _res = scale_load["results"]
        _paths = [(k, label) for k, label in (("load-to", "from_pretrained\n+ .to(tpu)"),
                                               ("load-assign", "meta, to_empty,\nload(assign)"),
                                               ("load-pretrained", "device_map=tpu"))
                  if "copies_at_peak" in _res.get(k, {})]
        _alloc = [_res[k]["anon_copies_at_peak"] for k, _ in _paths]
        _other = [_res[k]["copies_at_peak"] - a for (k, _), a in zip(_paths, _alloc)]
        _labels = [label for _, label in _paths]
        _axes[2].bar(_labels, _alloc, color="tab:green", label="allocated")
        _axes[2].bar(_labels, _other, bottom=_alloc, color="tab:gray", alpha=0.5,
                     label="checkpoint file pages")
        _axes[2].set_ylabel("copies of the weights at peak")
        _axes[2].set_ylim(0, 1.35 * max(a + o for a, o in zip(_alloc, _other)))
        _axes[2].legend(fontsize=8)
        _axes[2].tick_params(axis="x", labelsize=8)
        _captions.append(f"loading: {scale_load['date']} at {scale_load.get('commit', '?')}, "
                         f"{scale_load['load']}")
    _fig.suptitle("Llama-3.2-1B shape, bfloat16, random weights")
    _fig.tight_layout()
    mo.vstack([_fig, mo.md("Measured: " + "; ".join(_captions) + ".")])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (the model built and counted, programs counted by
    `debug.capture()`) and says whether yours is right. A wrong answer gets a
    hint: where to look, with which cell or tool; the measured answer waits
    under *Show the answer*, and the written solution is folded away under each
    exercise.
    """)
    return


@app.cell
def _():
    import exercises as ex  # guide/notebooks/exercises.py: the checks

    return (ex,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 1 · count the parameters

    How many parameters does section 1's minGPT have (the `tiny` config:
    3 layers, 3 heads, width 48; vocabulary 3, block size 11)?
    """)
    return


@app.cell
def _(mo):
    params_answer = mo.ui.number(label="parameters")
    params_answer
    return (params_answer,)


@app.cell
def _(ex, params_answer):
    ex.show(ex.check(ex.check_gpt_params, params_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **85,728**: `sum(p.numel() for p in gpt.parameters())`. By hand, per block
        (d = 48): attention `4d² + 4d` (qkv and projection with biases), MLP
        `8d² + 5d`, two LayerNorms `4d`: 28,272; three blocks 84,816; token and
        position embeddings 3·48 + 11·48; the final LayerNorm 96 and the head 144.
    """)})
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 2 · cache or recompute

    The tiny Llama generates 3 new tokens from a new prompt, once with the KV
    cache and once recomputing the whole sequence each token
    (`generate(..., use_cache=False)`). Which path **compiles fewer
    executables**? (The check measures both: tens of seconds on a CPU.)
    """)
    return


@app.cell
def _(ex, mo):
    path_answer = mo.ui.dropdown(ex.FASTER_OPTIONS, value=None, label="compiles fewer")
    path_answer
    return (path_answer,)


@app.cell
def _(ex, path_answer):
    ex.show(ex.check(ex.check_fewer_programs, path_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **With the KV cache.** Without it each new token runs the model on a
        sequence one longer than the last: new shapes, so every op compiles again.
        With it every decoding step has the same shapes (one token against a cache
        of fixed length), so the first step's programs serve all the others, and on
        a TPU each step also does far less work.
    """)})
    return


@app.cell
def test_mingpt_learns(gpt_losses, sort_accuracy):
    assert gpt_losses[-1] < 0.5 * gpt_losses[0], (gpt_losses[0], gpt_losses[-1])
    assert sort_accuracy > 0.0
    return


@app.cell
def test_generation_matches_cpu(generations, new_tokens):
    for _name, _row in generations.items():
        assert len(_row["tpu"][0]) == new_tokens.value, _name
        assert _row["tpu"][0] == _row["cpu"][0], _name
    return


@app.cell
def test_scale_results(scale_gen, scale_load):
    assert scale_gen is not None and scale_load is not None
    for _k in ("cpu", "eager", "fused", "compiled", "jax"):
        assert scale_gen["results"][_k]["decode_tps"] > 0, _k
    assert 0.9 < scale_load["results"]["load-assign"]["anon_copies_at_peak"] < 1.5
    return


@app.cell
def test_step_times(step_table):
    for _name, (_info, _res, _fallbacks) in step_table.items():
        assert _res["tpu"].median > 0 and _res["tpu"].recompiles == 0, _name
        # the table's compile seconds are wall time within the first step
        assert _res["tpu"].first_call_compile_seconds <= _res["tpu"].first_call_seconds, _name
    return


if __name__ == "__main__":
    app.run()
