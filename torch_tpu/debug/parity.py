"""Numerical parity: run a module on the CPU and on `tpu`, compare every layer.

    report = torch_tpu.debug.parity(model, x)
    print(report)                      # one row per submodule, in call order
    report.first_divergence(atol=1e-4, rtol=1e-3)

Both runs use deep copies of the module (the original is left as it was), in
eval mode by default so dropout and batch-norm statistics do not differ.
Forward hooks record each submodule's outputs (every tensor in the output
structure); the report gives, per call, the largest absolute difference and
the largest relative difference |tpu - cpu| / max(|cpu|, tiny).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from .._compat.torch_api import pytree


@dataclasses.dataclass
class LayerDiff:
    name: str           # qualified submodule name ('' is the whole model)
    module: str         # class name
    call: int           # the n-th call of this submodule (0-based)
    shapes: list
    max_abs: float
    max_rel: float
    cpu_max: float      # largest |value| on the CPU (scale of the outputs)
    mismatched_shapes: bool = False
    nonfinite: bool = False  # NaN/inf present on one side only

    def ok(self, atol: float, rtol: float) -> bool:
        if self.mismatched_shapes or self.nonfinite:
            return False
        return self.max_abs <= atol + rtol * self.cpu_max


class ParityReport:
    """Per-layer differences between a CPU run and a tpu run."""

    def __init__(self, rows, outputs_cpu, outputs_tpu):
        self.rows = rows
        self.output_cpu = outputs_cpu
        self.output_tpu = outputs_tpu

    @property
    def max_abs(self) -> float:
        return max((r.max_abs for r in self.rows), default=0.0)

    def first_divergence(self, atol: float = 1e-5, rtol: float = 1.3e-6):
        """The first layer (in call order) whose outputs differ beyond tolerance."""
        for r in self.rows:
            if not r.ok(atol, rtol):
                return r
        return None

    def as_dicts(self) -> list:
        return [dataclasses.asdict(r) for r in self.rows]

    def __getitem__(self, name) -> LayerDiff:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __str__(self):
        head = ("layer", "module", "shape", "max abs", "max rel")
        lines = []
        for r in self.rows:
            label = (r.name or "(model)") + (f"#{r.call}" if r.call else "")
            shape = "x".join(str(s) for s in r.shapes[0]) if r.shapes else "-"
            flag = "  SHAPE" if r.mismatched_shapes else ("  NONFINITE" if r.nonfinite else "")
            lines.append((label, r.module, shape, f"{r.max_abs:.3e}", f"{r.max_rel:.3e}{flag}"))
        widths = [max(len(h), *(len(row[i]) for row in lines)) if lines else len(h)
                  for i, h in enumerate(head)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        out += [fmt.format(*row) for row in lines]
        return "\n".join(out)

    __repr__ = __str__


def _to(tree, device):
    return pytree.tree_map(
        lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, tree)


def _record(module, store):
    handles = []
    calls = {}
    for name, sub in module.named_modules():
        def hook(mod, inputs, output, name=name):
            n = calls.get(name, 0)
            calls[name] = n + 1
            tensors = [t.detach() for t in pytree.tree_leaves(output)
                       if isinstance(t, torch.Tensor)]
            store.append((name, type(mod).__name__, n, tensors))
        handles.append(sub.register_forward_hook(hook))
    return handles


def _compare(a_list, b_list):
    """(shapes, max_abs, max_rel, cpu_max, mismatched, nonfinite) over tensor lists."""
    shapes = [list(a.shape) for a in a_list]
    if len(a_list) != len(b_list) or any(a.shape != b.shape for a, b in zip(a_list, b_list)):
        return shapes, math.inf, math.inf, 0.0, True, False
    max_abs = max_rel = cpu_max = 0.0
    nonfinite = False
    for c, t in zip(a_list, b_list):
        if not (c.is_floating_point() or c.is_complex()):
            c = c.to(torch.float64)
        c = c.to(torch.float64) if not c.is_complex() else c.to(torch.complex128)
        t = t.cpu()
        t = t.to(c.dtype)
        if c.numel() == 0:
            continue
        fin_c, fin_t = torch.isfinite(c), torch.isfinite(t)
        if not torch.equal(fin_c, fin_t):
            nonfinite = True
        both = fin_c & fin_t
        d = (c - t).abs()[both]
        if d.numel():
            cabs = c.abs()[both]
            max_abs = max(max_abs, float(d.max()))
            cpu_max = max(cpu_max, float(cabs.max()))
            tiny = torch.finfo(torch.float32).tiny
            max_rel = max(max_rel, float((d / cabs.clamp_min(tiny)).max()))
    return shapes, max_abs, max_rel, cpu_max, False, nonfinite


def parity(module: torch.nn.Module, *inputs, device="tpu", eval: bool = True,
           **kwargs) -> ParityReport:
    """Run `module(*inputs, **kwargs)` on the CPU and on `device`; compare layers.

    `inputs` may live on either device; they are copied to each. Returns a
    ParityReport with one LayerDiff per submodule call, in call order.
    """
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"parity() takes an nn.Module, got {type(module).__name__}")
    results = []
    outputs = []
    for dev in ("cpu", device):
        m = copy.deepcopy(module).to(dev)
        if eval:
            m.eval()
        store = []
        handles = _record(m, store)
        try:
            with torch.no_grad():
                out = m(*_to(inputs, dev), **_to(kwargs, dev))
        finally:
            for h in handles:
                h.remove()
        results.append(store)
        outputs.append(out)
    cpu_rows, dev_rows = results
    by_key = {(name, n): (cls, ts) for name, cls, n, ts in dev_rows}
    rows = []
    for name, cls, n, cts in cpu_rows:
        match = by_key.get((name, n))
        if match is None:
            rows.append(LayerDiff(name, cls, n, [list(t.shape) for t in cts],
                                  math.inf, math.inf, 0.0, mismatched_shapes=True))
            continue
        shapes, ma, mr, cm, mis, nf = _compare(cts, match[1])
        rows.append(LayerDiff(name, cls, n, shapes, ma, mr, cm, mis, nf))
    return ParityReport(rows, outputs[0], outputs[1])
