# /// script
# [tool.marimo.runtime]
# reactive_tests = false
# ///
"""05 · The compile cache: memory and disk tiers, cold vs warm start of a new process, stats, clearing."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="05 · The compile cache")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 05 · The compile cache

    Every executable — an eager op's or a `torch.compile` graph's — goes through
    one cache with two tiers:

    | tier | lives | holds | on a miss |
    |:---|:---|:---|:---|
    | **memory** | this process | loaded executables (LRU, `TORCH_TPU_CACHE_SIZE` entries) | ask the disk tier |
    | **disk** | `~/.cache/torch_tpu` (`TORCH_TPU_CACHE_DIR`) | serialized executables, checksummed | XLA compiles, the result is written |

    The disk tier is JAX's persistent compilation cache machinery (its key
    covers the program text, compile options, devices, backend, jaxlib version
    and XLA flags) on top of torch_tpu's own store: checksummed entries, atomic
    writes, a size cap (`TORCH_TPU_CACHE_MAX_BYTES`), and degradation to
    memory-only if the directory is unwritable. A second process therefore
    skips XLA compilation entirely.

    This notebook uses a temporary cache directory so that what it shows does
    not depend on what your own cache already holds (and so that it never
    clears your cache).
    """)
    return


@app.cell
def _():
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    import textwrap
    import time

    import matplotlib.pyplot as plt
    import torch

    import torch_tpu
    import torch_tpu.cache

    return json, os, plt, shutil, subprocess, sys, tempfile, textwrap, time, torch, torch_tpu


@app.cell(hide_code=True)
def _(mo, torch, torch_tpu):
    mo.md(f"""
    **This run:** {torch.tpu.device_count()} `tpu` device(s), kind
    **{torch.tpu.get_device_properties().device_kind}**, platform
    **{torch_tpu.runtime.platform.platform()}**. Your cache directory is
    `{torch_tpu.cache.cache_dir()}`.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. The tiers in one process

    One small function (matmul, GELU, sum: three ops), called four times with
    a fresh cache directory: the first call compiles (and writes the disk
    tier); then the memory tier is dropped with `torch_tpu.cache.clear(disk=False)`,
    so the next call is served by the disk tier (loading a serialized
    executable instead of compiling); after that it is a memory hit. The disk
    tier finds each op's executable through the *eager index*, by the op's
    cache key (op, shapes, dtypes, device, settings), so the op's program is
    not even traced and lowered again (`stats()["eager_index"]`).
    """)
    return


@app.cell
def _(mo):
    tier_size = mo.ui.slider(64, 1024, step=64, value=384, label="matrix size")
    tier_size
    return (tier_size,)


@app.cell
def _(tempfile, tier_size, time, torch, torch_tpu):
    user_cache_dir = torch_tpu.cache.cache_dir()
    guide_cache = tempfile.mkdtemp(prefix="torch_tpu_guide_cache_")  # removed in section 3
    torch_tpu.cache.set_dir(guide_cache)
    torch_tpu.cache.reset_stats()

    _x = torch.randn(tier_size.value, tier_size.value, device="tpu")

    def one_call():
        torch.tpu.synchronize()
        t0 = time.perf_counter()
        torch.nn.functional.gelu(_x @ _x.T).sum().item()
        return time.perf_counter() - t0

    tier_times = {}
    tier_times["1st call: compile"] = one_call()
    tier_times["2nd call: memory hit"] = one_call()
    torch_tpu.cache.clear(memory=True, disk=False)     # forget the loaded executables
    tier_times["3rd call: disk hit"] = one_call()
    tier_times["4th call: memory hit"] = one_call()
    tier_stats = torch_tpu.cache.stats()
    for _k, _v in tier_times.items():
        print(f"{_k:<22} {_v * 1e3:9.2f} ms")
    print()
    print("memory:", tier_stats["memory"]["hits"], "hits,", tier_stats["memory"]["misses"], "misses")
    print("disk:  ", tier_stats["disk"]["hits"], "hits,", tier_stats["disk"]["misses"], "misses,",
          tier_stats["disk"]["writes"], "writes")
    print("eager index:", tier_stats["eager_index"]["hits"], "programs found by their key,",
          tier_stats["eager_index"]["writes"], "indexed")
    print("seconds producing executables:",
          {k: round(v["seconds"], 3) for k, v in tier_stats["compile_seconds_by_source"].items()})
    return guide_cache, one_call, tier_stats, tier_times, user_cache_dir


@app.cell
def _(plt, tier_times):
    _fig, _ax = plt.subplots(figsize=(7, 2.8))
    _bars = _ax.barh(list(tier_times)[::-1], [v * 1e3 for v in tier_times.values()][::-1],
                     color=["tab:green", "tab:blue", "tab:green", "tab:red"])
    _ax.bar_label(_bars, fmt="%.2f ms", fontsize=8)
    _ax.set_xscale("log")
    _ax.set_xlabel("ms (log scale)")
    _ax.set_title("matmul + gelu + sum: the same call through each tier")
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Cold and warm start of a new process

    What matters in practice is the *second run of a script*. Below, the same
    small workload — an MLP training step in eager mode plus a `torch.compile`d
    forward — runs in two fresh Python processes that share a new cache
    directory: the first (cold) compiles everything, the second (warm) loads
    every executable from disk.

    *Executables needed* are the programs a process had to produce (its
    memory-tier misses, `stats()["memory"]["misses"]`); each was either
    compiled or loaded from the disk tier (`stats()["memory"]["disk_loads"]`).
    A warm process's eager programs are read ahead of its ops, in the previous
    run's order, by the eager index's prefetch threads
    (`stats()["eager_index"]["prefetch"]`): those are among the ones loaded
    from disk, counted once.
    """)
    return


@app.cell
def _(textwrap):
    WORKLOAD = textwrap.dedent('''
        import json, time
        t0 = time.perf_counter()
        import torch, torch_tpu, torch_tpu.cache
        t_import = time.perf_counter() - t0
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 10)).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(32, 64, device="tpu")
        y = torch.randint(0, 10, (32,), device="tpu")
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        t_eager = time.perf_counter() - t1
        t2 = time.perf_counter()
        compiled = torch.compile(model, backend="tpu")
        compiled(x).sum().item()
        t_compiled = time.perf_counter() - t2
        s = torch_tpu.cache.stats()
        prefetch = s["eager_index"]["prefetch"]
        print(json.dumps({"import": t_import, "eager_step": t_eager, "compiled_call": t_compiled,
                          # the executables this process needed (memory-tier misses),
                          # and those the disk tier served instead of XLA compiling
                          "executables": s["memory"]["misses"],
                          "from_disk": s["memory"]["disk_loads"],
                          # of those, read ahead of their ops by the prefetch threads
                          "prefetched": prefetch["used"],
                          "prefetched_unused": prefetch["loaded"] - prefetch["used"],
                          "disk_hits": s["disk"]["hits"], "disk_misses": s["disk"]["misses"],
                          "compile_seconds": s["compile_wall_seconds"]}))
    ''')
    return (WORKLOAD,)


@app.cell
def _(WORKLOAD, json, os, subprocess, sys, tempfile):
    process_cache = tempfile.mkdtemp(prefix="torch_tpu_guide_process_cache_")  # removed in section 3

    def run_workload(cache_dir):
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir)
        proc = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold = run_workload(process_cache)
    warm = run_workload(process_cache)
    for _name, _r in (("cold", cold), ("warm", warm)):
        _unused = (f", {_r['prefetched_unused']} more prefetched and not needed"
                   if _r["prefetched_unused"] else "")
        print(f"{_name}: import {_r['import']:.2f} s | eager step {_r['eager_step']:.2f} s | "
              f"compiled call {_r['compiled_call']:.2f} s | {_r['executables']} executables "
              f"needed: {_r['executables'] - _r['from_disk']} compiled, {_r['from_disk']} "
              f"loaded from disk ({_r['prefetched']} of them prefetched{_unused}) | "
              f"{_r['compile_seconds']:.2f} s producing them")
    speedup = (cold["eager_step"] + cold["compiled_call"]) / (warm["eager_step"] + warm["compiled_call"])
    print(f"first eager step + first compiled call: {speedup:.1f}x faster warm")
    return cold, process_cache, run_workload, speedup, warm


@app.cell
def plot_cold_warm(cold, plt, warm):
    _fig, _ax = plt.subplots(figsize=(7, 2.8))
    _parts = [("import", "tab:gray"), ("eager_step", "tab:orange"), ("compiled_call", "tab:blue")]
    for _row, _r in enumerate((warm, cold)):
        _left = 0.0
        for _key, _color in _parts:
            _ax.barh(_row, _r[_key], left=_left, color=_color,
                     label=_key.replace("_", " ") if _row == 0 else None)
            _left += _r[_key]
    _ax.set_yticks([0, 1], ["warm\n(2nd process)", "cold\n(1st process)"])
    _ax.set_xlabel("seconds from process start")
    _ax.legend(loc="lower right", fontsize=8)
    _ax.set_title("a new process: compile everything, or load it from the disk tier")
    _fig.tight_layout()
    _fig
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Statistics and clearing

    `torch_tpu.cache.stats()` has requests, hits and misses per tier, compile
    seconds in total and per entry, and what is on disk; `python -m
    torch_tpu.cache info` shows the disk tier from a shell, and `clear` (or
    `torch_tpu.cache.clear()`) empties it.
    """)
    return


@app.cell
def _(json, tier_stats):
    _shown = {k: v for k, v in tier_stats.items() if k != "per_entry"}
    _shown["per_entry (last 3)"] = tier_stats["per_entry"][-3:]
    print(json.dumps(_shown, indent=1, default=str))
    return


@app.cell
def _(os, process_cache, subprocess, sys):
    def cache_cli(*args):
        return subprocess.run([sys.executable, "-m", "torch_tpu.cache", *args, "--dir", process_cache],
                              capture_output=True, text=True, env=dict(os.environ)).stdout

    info_before = cache_cli("info")
    cleared = cache_cli("clear")
    info_after = cache_cli("info")
    print("$ python -m torch_tpu.cache info\n" + info_before)
    print("$ python -m torch_tpu.cache clear\n" + cleared)
    print("$ python -m torch_tpu.cache info\n" + info_after)
    return cache_cli, cleared, info_after, info_before


@app.cell
def _(guide_cache, info_after, process_cache, shutil, torch_tpu, user_cache_dir):
    removed_guide_entries = torch_tpu.cache.clear(memory=False, disk=True)  # the temporary dir
    torch_tpu.cache.set_dir(user_cache_dir)                                # back to yours
    for _tmp in (guide_cache, process_cache):  # the notebook's temporary directories
        shutil.rmtree(_tmp, ignore_errors=True)
    print(f"removed {removed_guide_entries} cached item(s) (programs and packages) and the "
          f"temporary directories {guide_cache}, {process_cache}; disk tier back at "
          f"{torch_tpu.cache.cache_dir()}")
    return (removed_guide_entries,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Exercises

    Answer in the controls below. Each check *measures* the answer by running
    torch_tpu here (the cache's own statistics, in a temporary cache directory)
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
def _(mo):
    mo.md(r"""
    ### Exercise 1 · predict the disk hits

    A fresh cache directory; `x` is a `tpu` matrix of a new shape. The call
    `torch.nn.functional.gelu(x @ x.T).sum().item()` runs once (compiling and
    writing the disk tier), then `torch_tpu.cache.clear(memory=True, disk=False)`
    empties the memory tier, and the call runs again. How many executables does
    the **disk tier** serve on that second call?
    """)
    return


@app.cell
def _(mo):
    disk_answer = mo.ui.number(label="disk hits")
    disk_answer
    return (disk_answer,)


@app.cell
def _(disk_answer, ex):
    ex.show(ex.check(ex.check_disk_hits, disk_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **3**: one per op that runs a program, `mm`, `gelu` and `sum` (`x.T` is a
        view: it runs nothing of its own). Each is found on disk by the op's key
        through the eager index, without tracing it again (section 1). A new
        process with the same cache directory sees the same: that is the warm start
        of section 2.
    """)})
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Exercise 2 · what is in the key

    `x + 1.0` has just run, so its executable is cached. Which change makes the
    next call **compile again** (miss the cache)?
    """)
    return


@app.cell
def _(ex, mo):
    key_answer = mo.ui.dropdown(ex.CACHE_KEY_OPTIONS, value=None, label="the change")
    key_answer
    return (key_answer,)


@app.cell
def _(ex, key_answer):
    ex.show(ex.check(ex.check_cache_key, key_answer.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.accordion({"Solution": mo.md(r"""
        **A new shape (one more row) or a new dtype (bfloat16).** The key holds
        the op, the inputs' shapes, dtypes and layouts and the static arguments.
        Values are the executable's inputs, and so is a Python scalar such as
        `2.0` (notebook 01, section 4): both are cache hits.
    """)})
    return


@app.cell
def test_tiers(tier_stats, tier_times):
    t = list(tier_times.values())
    assert tier_stats["disk"]["hits"] >= 1, tier_stats["disk"]
    assert tier_stats["disk"]["writes"] >= 1
    # the 3rd call's ops (matmul, gelu, sum) come back through the eager index
    assert tier_stats["eager_index"]["hits"] >= 3, tier_stats["eager_index"]
    assert t[1] < t[0] and t[3] < t[0], tier_times
    return


@app.cell
def test_warm_start(cold, warm):
    assert cold["disk_hits"] == 0 and cold["disk_misses"] > 0
    assert warm["disk_hits"] > 0 and warm["disk_misses"] == 0, warm
    # cold: every executable compiled; warm: the same ones, every one from disk
    # (prefetched ones among them), none more than were needed
    assert cold["from_disk"] == 0 and cold["executables"] > 0, cold
    assert warm["executables"] == cold["executables"], (cold, warm)
    assert warm["from_disk"] == warm["executables"], warm
    assert warm["prefetched"] <= warm["from_disk"], warm
    assert warm["disk_hits"] >= warm["from_disk"], warm  # reads: unused prefetches too
    assert warm["eager_step"] + warm["compiled_call"] < cold["eager_step"] + cold["compiled_call"]
    return


@app.cell
def test_cli_clear(cleared, info_after, info_before):
    import re as _re

    assert "entries   : 0" not in info_before
    assert "entries   : 0" in info_after
    # one count: `clear` removed exactly the programs `info` listed
    _entries = int(_re.search(r"entries   : (\d+)", info_before).group(1))
    assert cleared.startswith(f"removed {_entries} cached program(s)"), (info_before, cleared)
    _packages = _re.search(r"packages  : (\d+)", info_before)
    if _packages:
        assert f"{_packages.group(1)} compile package item(s)" in cleared, cleared
    return


@app.cell
def test_temporary_dirs_removed(guide_cache, os, process_cache, removed_guide_entries):
    assert removed_guide_entries > 0
    assert not os.path.exists(guide_cache) and not os.path.exists(process_cache)
    return


if __name__ == "__main__":
    app.run()
