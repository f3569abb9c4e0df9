"""Named benchmark cases for `python -m torch_tpu.benchmark`.

A case is a callable and its arguments, built for a device:

    @torch_tpu.benchmark.register_model("my-mlp", description="...")
    def my_mlp(device="tpu", batch_size=None):
        model = MyMLP().to(device)
        x = torch.randn(batch_size or 32, 128, device=device)
        return BenchmarkCase(model, (x,))          # or just (model, (x,))

Built in: 'matmul', 'mlp', 'mlp-train'. The example models (`examples/<name>`,
e.g. llama, resnet) are found by name when they provide the same protocol:
a function `benchmark_case(device="tpu", batch_size=None)` returning a
BenchmarkCase or `(fn, args)`, defined in `examples/<name>/benchmark.py`,
`examples/<name>/__init__.py` or `examples/<name>.py` and imported as
`examples.<name>[.benchmark]` (looked up from the current directory and from
the repository that holds torch_tpu).

A script path works too (`python -m torch_tpu.benchmark train.py`): if the
script defines `benchmark_case(...)` it is used; else its `main()` is timed;
else the whole script is timed, run again for each iteration.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import runpy
import sys

import torch

EXAMPLES = ("llama", "qwen", "resnet", "dlrm", "mingpt", "unet")


@dataclasses.dataclass
class BenchmarkCase:
    fn: object
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    flops: object = "auto"       # 'auto', a number, or None
    description: str = ""
    name: str = ""


@dataclasses.dataclass
class _Entry:
    name: str
    factory: object
    description: str = ""


_REGISTRY: dict = {}


def register_model(name: str, factory=None, *, description: str = "", replace: bool = False):
    """Register `factory(device="tpu", batch_size=None) -> BenchmarkCase` under `name`.

    Usable as a decorator. The factory may also return (fn, args) or
    (fn, args, kwargs).
    """
    def deco(f):
        if name in _REGISTRY and not replace:
            raise ValueError(f"a benchmark model named {name!r} is already registered")
        doc = description or (f.__doc__ or "").strip().split("\n")[0]
        _REGISTRY[name] = _Entry(name, f, doc)
        return f

    return deco(factory) if factory is not None else deco


def models() -> dict:
    """{name: description} of registered models and available examples."""
    out = {n: e.description for n, e in sorted(_REGISTRY.items())}
    for name in _example_names():
        if name not in out and _find_example(name) is not None:
            out[name] = f"examples/{name}"
    return out


def _example_names():
    names = list(EXAMPLES)
    for root in _repo_roots():
        d = os.path.join(root, "examples")
        if not os.path.isdir(d):
            continue
        for entry in sorted(os.listdir(d)):
            name = entry[:-3] if entry.endswith(".py") else entry
            if name.isidentifier() and not name.startswith("_") and name not in names:
                names.append(name)
    return names


def _as_case(obj, name, description="") -> BenchmarkCase:
    if isinstance(obj, BenchmarkCase):
        case = obj
    elif isinstance(obj, tuple) and obj and callable(obj[0]):
        fn = obj[0]
        args = tuple(obj[1]) if len(obj) > 1 else ()
        kwargs = dict(obj[2]) if len(obj) > 2 else {}
        case = BenchmarkCase(fn, args, kwargs)
    elif callable(obj):
        case = BenchmarkCase(obj)
    else:
        raise TypeError(f"benchmark case {name!r}: the factory returned {type(obj).__name__}; "
                        "expected a BenchmarkCase or (fn, args)")
    case.name = case.name or name
    case.description = case.description or description
    return case


def _repo_roots():
    roots = [os.getcwd()]
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if here not in roots:
        roots.append(here)
    return roots


def _find_example(name):
    """(root, module name) of the examples module defining <name>'s
    benchmark_case, or None."""
    for root in _repo_roots():
        for rel, mod in ((os.path.join("examples", name, "benchmark.py"), f"examples.{name}.benchmark"),
                         (os.path.join("examples", name, "__init__.py"), f"examples.{name}"),
                         (os.path.join("examples", f"{name}.py"), f"examples.{name}")):
            path = os.path.join(root, rel)
            if os.path.isfile(path) and _defines_case(path):
                return root, mod
    return None


def _defines_case(path):
    try:
        with open(path, encoding="utf-8") as f:
            return "def benchmark_case" in f.read()
    except OSError:
        return False


def _import_example(root, module):
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        return importlib.import_module(module)
    finally:
        if added:
            sys.path.remove(root)


def get_case(target: str, device: str = "tpu", batch_size=None, **options) -> BenchmarkCase:
    """The BenchmarkCase for a registered name, an example name or a script path."""
    if target in _REGISTRY:
        e = _REGISTRY[target]
        return _as_case(e.factory(device=device, batch_size=batch_size, **options),
                        target, e.description)
    if target.endswith(".py") or os.path.sep in target:
        return script_case(target, device=device, batch_size=batch_size, **options)
    found = _find_example(target)
    if found is not None:
        mod = _import_example(*found)
        factory = getattr(mod, "benchmark_case", None)
        if factory is None:
            raise ValueError(f"example {target!r} ({found[1]}) defines no "
                             "benchmark_case(device, batch_size) function")
        return _as_case(factory(device=device, batch_size=batch_size, **options), target,
                        f"examples/{target}")
    known = ", ".join(models()) or "(none)"
    raise ValueError(f"unknown benchmark model {target!r}; known: {known}; or pass a path to "
                     "a Python script")


def script_case(path: str, device: str = "tpu", batch_size=None, **options) -> BenchmarkCase:
    """A BenchmarkCase from a user script (see the module docstring)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"benchmark script not found: {path}")
    name = os.path.splitext(os.path.basename(path))[0]
    ns = runpy.run_path(path, run_name="__torch_tpu_benchmark__")
    factory = ns.get("benchmark_case")
    if callable(factory):
        return _as_case(factory(device=device, batch_size=batch_size, **options), name, path)
    main = ns.get("main")
    if callable(main):
        return BenchmarkCase(main, flops=None, name=name, description=f"{path}: main()")

    def run_script():
        return runpy.run_path(path, run_name="__main__")

    run_script.__name__ = name
    return BenchmarkCase(run_script, flops=None, name=name, description=f"{path} (whole script)")


# --------------------------------------------------------------------------
# built-in cases


@register_model("matmul", description="one float32 matmul, 512x512 @ 512x512")
def _matmul(device="tpu", batch_size=None, size=512):
    n = int(batch_size or size)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return BenchmarkCase(torch.matmul, (a, b), flops=2.0 * n ** 3)


def _mlp(device, dims=(256, 512, 512, 10)):
    layers = []
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def _mlp_flops(batch, dims=(256, 512, 512, 10)):
    return float(sum(2 * batch * a * b for a, b in zip(dims, dims[1:])))


@register_model("mlp", description="3-layer MLP forward (batch 64, 256-512-512-10)")
def _mlp_forward(device="tpu", batch_size=None):
    batch = int(batch_size or 64)
    model = _mlp(device).eval()
    x = torch.randn(batch, 256, device=device)

    def forward(x):
        with torch.no_grad():
            return model(x)

    return BenchmarkCase(forward, (x,), flops=_mlp_flops(batch))


@register_model("mlp-train", description="3-layer MLP training step: forward, backward, SGD")
def _mlp_train(device="tpu", batch_size=None):
    batch = int(batch_size or 64)
    model = _mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 256, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return BenchmarkCase(train_step, (x, y), flops=3 * _mlp_flops(batch))
