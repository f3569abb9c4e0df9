"""Decode tokens/s of greedy generation on tpu: eager vs compiled, side by side.

For each model it runs generation with a static KV cache eagerly and with the
forward under `torch.compile(backend="tpu")`, in one process: a first run
(which compiles) and then `--repeats` timed runs; it prints the median decode
rate (new tokens after the first one, per second; prefill and the first
decoding step excluded), the median time of one decoding step's forward
(waited for), the first run's time, and the programs made:
graph programs (prefill + decode) and eager-op programs, in the first run and
in the timed runs (0 there: nothing compiles per token once warm).

Models: the llama and qwen examples' own code (`examples/common/generation.py`,
tiny configs by default) and tiny random-weight Hugging Face Llama / Qwen2
through `generate(cache_implementation="static")` (hf-llama, hf-qwen2). For
those, "eager" passes `disable_compile=True` (on a `tpu` model with a static
cache, transformers otherwise compiles the decoding step by itself, through
torch.compile's default backend, which is "tpu" for tpu inputs) and
"compiled" is `model.forward = torch.compile(model.forward, backend="tpu")`
(also with `disable_compile=True`: one compile, not two nested). The rate
covers generate()'s whole loop: its eager ops around the model (masks,
stopping criteria, the growing input_ids) are part of every token.

    python benchmarks/generate.py [--models llama,qwen,hf-llama] [--tokens 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch_tpu  # noqa: E402,F401

PROMPT = [5, 9, 2, 7, 1, 3, 8, 4]


class _Timed:
    """Wraps a forward: the median time of the decoding steps' calls, each
    waited for (generate() reads every token on the host anyway)."""

    def __init__(self, fn):
        self.fn = fn
        self.times = []

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        torch.tpu.synchronize()
        self.times.append(time.perf_counter() - t0)
        return out

    def step_ms(self):
        steps = self.times[2:]  # after the prompt and the first decoding step
        self.times = []
        return 1e3 * statistics.median(steps) if steps else float("nan")


def _programs():
    """(graph programs, eager-op programs) made so far in this process."""
    from torch_tpu.compile import graph_cache
    from torch_tpu.runtime import executor

    s = graph_cache.cache_stats()
    graphs = s["lowered"] + s["disk_loads"]
    return graphs, executor.STATS.misses - graphs


# -- the examples' own generation ----------------------------------------------


def _example_runner(name, config, tokens, compiled):
    import importlib

    from examples.common.generation import generate
    from examples.common.lm import build_model

    family = importlib.import_module(f"examples.{name}.family").FAMILY
    model = build_model(family, config, device="tpu").eval()
    fwd = _Timed(torch.compile(model, backend="tpu") if compiled else model)

    class _Fwd:  # generate() calls model(...) and model.new_cache(...)
        def __call__(self, *a, **k):
            return fwd(*a, **k)

        new_cache = model.new_cache

    prompt = torch.tensor([PROMPT], device="tpu")

    def run():
        timings = {}
        out = generate(_Fwd(), prompt, tokens, timings=timings)
        out.cpu()
        return timings["decode_tokens"] / timings["decode_s"], fwd.step_ms()

    return run


# -- Hugging Face generate() with a static cache ---------------------------------


class _Clock:
    """A generate() streamer: the time of each emission (prompt, then each token).
    generate() reads every new token on the host before emitting it."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def _hf_runner(kind, tokens, compiled):
    import transformers

    config, cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                   "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    torch.manual_seed(0)
    cfg = config(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=len(PROMPT) + tokens + 8)
    model = copy.deepcopy(cls(cfg).eval()).to("tpu")
    fwd = _Timed(torch.compile(model.forward, backend="tpu") if compiled else model.forward)
    model.forward = fwd
    ids = torch.tensor([PROMPT], device="tpu")

    def run():
        clock = _Clock()
        model.generate(ids, max_new_tokens=tokens, do_sample=False,
                       cache_implementation="static", streamer=clock, disable_compile=True)
        t = clock.times  # t[1]: first new token; t[2:]: one decoding step each
        return (len(t) - 2) / (t[-1] - t[1]), fwd.step_ms()

    return run


def _runner(name, config, tokens, compiled):
    if name.startswith("hf-"):
        return _hf_runner(name[3:], tokens, compiled)
    return _example_runner(name, config, tokens, compiled)


def _measure(name, config, tokens, repeats, compiled):
    torch._dynamo.reset()
    p0 = _programs()
    t0 = time.perf_counter()
    run = _runner(name, config, tokens, compiled)
    run()
    first = time.perf_counter() - t0
    p1 = _programs()
    runs = [run() for _ in range(repeats)]
    p2 = _programs()
    return {"rate": statistics.median(r for r, _ in runs),
            "step_ms": statistics.median(ms for _, ms in runs), "first": first,
            "made": (p1[0] - p0[0], p1[1] - p0[1]), "timed": (p2[0] - p1[0], p2[1] - p1[1])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama,qwen,hf-llama",
                   help="comma-separated: llama, qwen (the examples), hf-llama, hf-qwen2")
    p.add_argument("--config", default="tiny", help="the examples' configuration")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generation")
    p.add_argument("--repeats", type=int, default=5, help="timed generations (median)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    load = os.getloadavg()
    print(f"device: {torch.tpu.get_device_name()}   tokens={args.tokens} "
          f"repeats={args.repeats} (median decode tokens/s)   "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'model':<10}{'eager tok/s':>12}{'compiled tok/s':>16}{'speed-up':>10}"
          f"{'fwd ms eager':>14}{'fwd ms comp':>13}{'first eager s':>15}{'first comp s':>14}"
          f"  programs made: compiled (graphs/eager ops), then in timed runs; eager (ops)")
    for name in args.models.split(","):
        e = _measure(name, args.config, args.tokens, args.repeats, False)
        c = _measure(name, args.config, args.tokens, args.repeats, True)
        print(f"{name:<10}{e['rate']:>12.1f}{c['rate']:>16.1f}{c['rate'] / e['rate']:>9.1f}x"
              f"{e['step_ms']:>14.2f}{c['step_ms']:>13.2f}{e['first']:>15.2f}{c['first']:>14.2f}  "
              f"{c['made'][0]}/{c['made'][1]}, timed {c['timed'][0]}/{c['timed'][1]}; "
              f"eager {e['made'][1]}, timed {e['timed'][1]}", flush=True)


if __name__ == "__main__":
    main()
