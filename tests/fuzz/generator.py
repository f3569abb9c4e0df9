"""Random short PyTorch programs, as data that prints as runnable code.

A `Program` is a few input tensors (shape, dtype, layout and every value
written out, special values included) and a list of steps, each one line of
Python over the names `x0, x1, ...` (inputs) and `v0, v1, ...` (results).
The same source runs on every device and path, so the printed program is
exactly what ran; the shrinker edits the data (drops lines, shrinks shapes,
replaces values) and prints the result again.

The generator runs each candidate line on CPU copies as it builds, so it
knows every name's shape and dtype and picks operands that fit; a line CPU
rejects is kept now and then (then it ends the program), so error parity is
fuzzed too.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Callable
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64,
          "int32": torch.int32, "bool": torch.bool}
FLOATS = ("float32", "bfloat16")

# Values chosen for what they break: NaN, infinities, signed zero, float32
# subnormals (1e-40, 1e-45), magnitudes near the float32 and bfloat16 limits,
# and integers at int32's edges.
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-40, -1e-40, 1e-45, 1e-38,
                  3e38, -3e38, 1e20, 1e-20, 65504.0, 0.5, -2.5)
SPECIAL_INTS = (0, -1, 2**31 - 1, -(2**31), 255, 256, -129)
ORDINARY = {"float32": 1.0, "bfloat16": 1.0, "int64": 1, "int32": 1, "bool": True}

_NAME = re.compile(r"\b([xv]\d+)\b")
_DEFS = re.compile(r"^((?:v\d+)(?:, v\d+)*) = ")


@dataclasses.dataclass(frozen=True)
class Input:
    """One input tensor: its values written out (row-major), then laid out."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    values: tuple
    layout: str = "contiguous"  # or "transposed" (last two dims), "channels_last" (4-D)

    def source(self) -> str:
        vals = "[" + ", ".join(_lit(v) for v in self.values) + "]"
        if self.dtype == "bfloat16":  # written in float32, rounded once
            expr = f"torch.tensor({vals}, dtype=torch.float32).to(torch.bfloat16)"
        else:
            expr = f"torch.tensor({vals}, dtype=torch.{self.dtype})"
        expr += f".reshape({self.shape!r})"
        if self.layout == "transposed":
            expr += ".transpose(-2, -1).contiguous().transpose(-2, -1)"
        elif self.layout == "channels_last":
            expr += ".contiguous(memory_format=torch.channels_last)"
        return expr

    def make(self) -> torch.Tensor:
        return eval(self.source(), {"torch": torch, "nan": math.nan, "inf": math.inf})  # noqa: S307


def _lit(v: object) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return repr(v)


def defs(line: str) -> tuple[str, ...]:
    """The names a step defines (`v3 = ...`, `v3, v4 = ...`); none for a write."""
    m = _DEFS.match(line)
    return tuple(m.group(1).split(", ")) if m else ()


def uses(line: str) -> set[str]:
    """The names a step reads (or writes through)."""
    m = _DEFS.match(line)
    rest = line[m.end():] if m else line
    return set(_NAME.findall(rest))


@dataclasses.dataclass(frozen=True)
class Program:
    inputs: tuple[Input, ...]
    steps: tuple[str, ...]

    def results(self) -> tuple[str, ...]:
        return tuple(n for s in self.steps for n in defs(s))

    def function_source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {s}" for s in self.steps] or ["    pass"]
        res = self.results()
        ret = "(" + "".join(f"{n}, " for n in res) + ")"
        return f"def program({args}):\n" + "\n".join(body) + f"\n    return {ret}\n"

    def function(self) -> Callable:
        """A fresh function object (dynamo and the caches see new code each time)."""
        import linecache

        src = self.function_source()
        filename = f"<fuzz program {abs(hash(src)):x}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        scope: dict[str, Any] = {"torch": torch, "nan": math.nan, "inf": math.inf,
                                 "__name__": "fuzz_program"}
        exec(compile(src, filename, "exec"), scope)  # noqa: S102
        return scope["program"]

    def make_inputs(self) -> list[torch.Tensor]:
        return [i.make() for i in self.inputs]

    def source(self, paths: tuple[str, ...] = ("eager", "fused", "compiled")) -> str:
        """A runnable reproducer: the program on CPU and on tpu, results printed."""
        lines = ["import torch", "import torch_tpu", "from torch import nan, inf", "",
                 self.function_source(), "def inputs(device):"]
        lines += [f"    {i.name} = {i.source()}" for i in self.inputs]
        names = ", ".join(i.name for i in self.inputs)
        lines += [f"    return [t.to(device) for t in ({names}{',' if len(self.inputs) == 1 else ''})]",
                  "", "", "def show(label, fn, device):",
                  "    args = inputs(device)",
                  "    try:",
                  "        out = fn(*args)",
                  "        print(label, [o.cpu() for o in out], 'inputs after:', [a.cpu() for a in args])",
                  "    except Exception as e:",
                  "        print(label, 'raises', type(e).__name__, str(e).splitlines()[0][:200])",
                  "", "", "show('cpu', program, 'cpu')"]
        if "eager" in paths:
            lines.append("show('tpu eager', program, 'tpu')")
        if "fused" in paths:
            lines += ["", "def fused(*args):", "    with torch_tpu.fused():",
                      "        out = program(*args)", "    return out", "",
                      "show('tpu fused', fused, 'tpu')"]
        if "compiled" in paths:
            lines.append("show('tpu compiled', torch.compile(program, backend='tpu', "
                         "dynamic=False), 'tpu')")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# inputs


def _value(rng: random.Random, dtype: str, special: float) -> bool | int | float:
    if dtype == "bool":
        return rng.random() < 0.5
    if dtype in FLOATS:
        if rng.random() < special:
            return rng.choice(SPECIAL_FLOATS)
        return round(rng.gauss(0, 3), 2)
    if rng.random() < special / 2:
        v = rng.choice(SPECIAL_INTS)
        return v if dtype == "int64" or -(2**31) <= v < 2**31 else 0
    return rng.randint(-5, 5)


def _shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 4))
    sizes = (0, 1, 1, 2, 3, 3, 4)
    shape = tuple(rng.choice(sizes[1:]) if rng.random() < 0.9 else 0 for _ in range(rank))
    while math.prod(shape) > 24:
        shape = shape[1:]
    return shape


def gen_input(rng: random.Random, name: str, shape: tuple[int, ...] | None = None,
              dtype: str | None = None) -> Input:
    shape = _shape(rng) if shape is None else shape
    dtype = rng.choice(("float32", "float32", "float32", "bfloat16", "int64", "int32", "bool")) \
        if dtype is None else dtype
    special = rng.choice((0.0, 0.15, 0.4))
    values = tuple(_value(rng, dtype, special) for _ in range(math.prod(shape)))
    layout = "contiguous"
    if len(shape) == 4 and rng.random() < 0.4:
        layout = "channels_last"
    elif len(shape) >= 2 and rng.random() < 0.2:
        layout = "transposed"
    return Input(name, shape, dtype, values, layout)


# --------------------------------------------------------------------------
# steps: each maker returns one line (or None when nothing fits)


UNARY = ["-{a}", "{a}.abs()", "{a}.exp()", "{a}.log()", "{a}.sqrt()", "{a}.sin()",
         "{a}.tanh()", "{a}.sigmoid()", "{a}.reciprocal()", "{a}.floor()", "{a}.round()",
         "{a}.sign()", "torch.relu({a})", "{a}.square()", "{a}.rsqrt()", "{a}.expm1()",
         "{a}.trunc()", "{a}.isnan()", "{a}.isinf()", "{a}.signbit()", "{a}.logical_not()",
         "~{a}", "{a}.clamp(min=-1.5, max=2)", "torch.nan_to_num({a})", "{a}.float()",
         "{a}.int()", "{a}.long()", "{a}.bool()", "{a}.to(torch.bfloat16)",
         "{a}.to(torch.uint8)", "{a}.clone()", "{a}.contiguous()", "{a}.flip(0)"]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / {b}", "{a} ** {b}",
          "torch.maximum({a}, {b})", "torch.minimum({a}, {b})", "{a} == {b}", "{a} < {b}",
          "{a} >= {b}", "{a} != {b}", "{a} & {b}", "{a} | {b}", "{a} ^ {b}",
          "torch.atan2({a}, {b})", "torch.where({a} > 0, {a}, {b})", "torch.where({c}, {a}, {b})"]
SCALARS = ["0", "1", "-2", "2.5", "0.0", "-0.0", "True", "1e-40", "nan", "inf", "3e38"]
SCALAR_BINARY = ["{a} + {s}", "{a} * {s}", "{a} / {s}", "{a} - {s}", "{s} / {a}",
                 "{a} ** 2", "{a} ** 0.5", "{a} ** -1", "{a} // 2", "{a} % 3", "{a} > {s}",
                 "torch.where({a} > 0, {a}, {s})", "{a}.masked_fill({c}, {s})"]
REDUCE = ["sum", "mean", "amax", "amin", "prod", "argmax", "argmin", "any", "all", "logsumexp",
          "var"]
INPLACE = ["add_({b})", "mul_({b})", "copy_({b})", "sub_({s})", "mul_({s})", "fill_({s})",
           "masked_fill_({c}, {s})", "clamp_(min=0)", "neg_()", "div_({s})"]


def _int_ok(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point


class _Gen:
    """Builds one program, running each line on CPU copies to learn its operands."""

    def __init__(self, rng: random.Random, inputs: list[Input]):
        self.rng = rng
        self.inputs = inputs
        self.steps: list[str] = []
        self.env: dict[str, torch.Tensor] = {}
        self.counter = 0
        self._rerun()

    def _rerun(self) -> None:
        env: dict[str, object] = {i.name: i.make() for i in self.inputs}
        env.update(torch=torch, nan=math.nan, inf=math.inf)
        for s in self.steps:
            exec(s, env)  # noqa: S102
        self.env = {k: v for k, v in env.items() if isinstance(v, torch.Tensor)}

    def try_line(self, line: str) -> bool | None:
        """True: kept; False: CPU rejected it and it was dropped; None: kept, raises."""
        env = dict(self.env, torch=torch, nan=math.nan, inf=math.inf)
        try:
            exec(line, env)  # noqa: S102
        except Exception:  # noqa: BLE001 - CPU's verdict on a random line
            self._rerun()
            if self.rng.random() < 0.04:
                self.steps.append(line)
                return None
            return False
        self.steps.append(line)
        self.env = {k: v for k, v in env.items() if isinstance(v, torch.Tensor)}
        return True

    # -- helpers --------------------------------------------------------

    def new(self) -> str:
        name = f"v{self.counter}"
        self.counter += 1
        return name

    def pick(self, pred: Callable[[torch.Tensor], bool]) -> str | None:
        names = [n for n, t in self.env.items() if pred(t)]
        return self.rng.choice(names) if names else None

    def any(self) -> str:
        """Any name (there is always an input)."""
        return self.rng.choice(list(self.env))

    def dim(self, t: torch.Tensor) -> int | None:
        if t.dim() == 0:
            return None
        d = self.rng.randrange(t.dim())
        return d - t.dim() if self.rng.random() < 0.3 else d

    def same_shape(self, a: str) -> str | None:
        """Another name broadcastable with `a` (often the same shape)."""
        ta = self.env[a]

        def fits(t: torch.Tensor) -> bool:
            try:
                torch.broadcast_shapes(t.shape, ta.shape)
            except RuntimeError:
                return False
            return True
        return self.pick(fits)

    def mask(self, a: str) -> str:
        """A bool operand the shape of `a`: a bool name if one fits, else a comparison."""
        ta = self.env[a]
        m = self.pick(lambda t: t.dtype == torch.bool and t.shape == ta.shape)
        if m is not None and self.rng.random() < 0.5:
            return m
        return f"({a} > 0)" if ta.dtype != torch.bool else a

    def view(self, a: str) -> str | None:
        """A view expression of `a` (every kind of view the issue names)."""
        t, r = self.env[a], self.rng
        if t.dim() == 0:
            return r.choice([f"{a}.view(1)", f"{a}.unsqueeze(0)", f"{a}.expand(2)",
                             f"{a}.reshape(())"])
        d = self.dim(t)
        assert d is not None  # t.dim() > 0
        n = t.shape[d]
        options = [f"{a}.unsqueeze({r.randrange(-t.dim() - 1, t.dim() + 1)})",
                   f"{a}.reshape(-1)", f"{a}.view({t.numel()})" if t.is_contiguous() else
                   f"{a}.reshape({t.numel()})", f"{a}.flatten()"]
        if n > 0:
            lo = r.randrange(n)
            options += [f"{a}.select({d}, {lo})", f"{a}.narrow({d}, {lo}, {r.randint(0, n - lo)})",
                        f"{a}[{':, ' * (d % t.dim())}{lo}:]",
                        f"{a}[{':, ' * (d % t.dim())}::2]"]
        if t.dim() >= 2:
            perm = list(range(t.dim()))
            r.shuffle(perm)
            options += [f"{a}.transpose(0, 1)", f"{a}.mT", f"{a}.permute{tuple(perm)}",
                        f"{a}.diagonal()", f"{a}.diagonal(0, -2, -1)"]
        if 1 in t.shape:
            shape = tuple(3 if s == 1 else s for s in t.shape)
            options.append(f"{a}.expand{shape}")
        options.append(f"{a}.expand(2, *{a}.shape)")
        return r.choice(options)

    # -- the step kinds --------------------------------------------------

    def unary(self) -> str:
        a = self.any()
        return f"{self.new()} = " + self.rng.choice(UNARY).format(a=a)

    def binary(self) -> str:
        a = self.any()
        b = self.same_shape(a) or a
        return f"{self.new()} = " + self.rng.choice(BINARY).format(a=a, b=b, c=self.mask(a))

    def scalar(self) -> str:
        a = self.any()
        ta = self.env[a]
        line = self.rng.choice(SCALAR_BINARY)
        if _int_ok(ta.dtype) and ("//" in line or "%" in line or "** -1" in line):
            line = "{a} * 3"  # integer division by zero is a documented difference
        return f"{self.new()} = " + line.format(a=a, s=self.rng.choice(SCALARS), c=self.mask(a))

    def reduce(self) -> str:
        a = self.any()
        t = self.env[a]
        op = self.rng.choice(REDUCE)
        d = self.dim(t)
        if d is None or self.rng.random() < 0.25:
            return f"{self.new()} = {a}.{op}()"
        keep = self.rng.random() < 0.5
        if op in ("any", "all", "argmax", "argmin") and self.rng.random() < 0.5:
            return f"{self.new()} = {a}.{op}({d}, keepdim={keep})"
        extra = ""
        if op == "sum" and self.rng.random() < 0.2:
            extra = ", dtype=torch.float32"
        return f"{self.new()} = {a}.{op}(dim={d}, keepdim={keep}{extra})"

    def view_step(self) -> str | None:
        a = self.any()
        return f"{self.new()} = {self.view(a)}"

    def inplace(self) -> str:
        """An in-place write into a name or through a view of it."""
        a = self.any()
        target = a if self.rng.random() < 0.5 else self.view(a)
        b = self.same_shape(a) or a
        op = self.rng.choice(INPLACE).format(b=b, s=self.rng.choice(SCALARS), c=self.mask(a))
        if op.startswith("masked_fill_"):
            return f"{a}.{op}"
        return f"{target}.{op}"

    def index_write(self) -> str:
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return self.inplace()
        t, r = self.env[a], self.rng
        n = t.shape[0]
        idx = [r.randrange(n) for _ in range(r.randint(0, 3))] if n else []
        itensor = f"torch.tensor({idx}, dtype=torch.long, device={a}.device)"
        s = r.choice(SCALARS)
        return r.choice([
            f"{a}[{itensor}] = {s}",
            f"{a}[{self.mask(a)}] = {s}",
            f"{a}[{a} != {a}] = 0",
            f"{a}[...] = {self.same_shape(a) or s}",
            f"{a}.index_fill_(0, {itensor}, {s})",
            f"{a}.index_add_(0, {itensor}, {a}[:{len(idx)}].clone())" if len(idx) <= n else
            f"{a}.index_fill_(0, {itensor}, {s})",
            f"{a}.index_put_(({itensor},), torch.tensor({s}, dtype={a}.dtype, device={a}.device), "
            f"accumulate={r.random() < 0.5})",
        ])

    def index_read(self) -> str:
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return self.unary()
        t, r = self.env[a], self.rng
        n = t.shape[0]
        idx = [r.randrange(n) for _ in range(r.randint(0, 4))] if n else []
        itensor = f"torch.tensor({idx}, dtype=torch.long, device={a}.device)"
        return f"{self.new()} = " + r.choice([
            f"{a}[{itensor}]", f"{a}[{self.mask(a)}]", f"{a}.index_select(0, {itensor})",
            f"{a}[{idx[0] if idx else 0}]", f"{a}[None, ..., :1]"])

    def join(self) -> str:
        a = self.any()
        t = self.env[a]
        b = self.pick(lambda u: u.shape == t.shape) or a
        if self.rng.random() < 0.5 or t.dim() == 0:
            return f"{self.new()} = torch.stack([{a}, {b}], {self.rng.randrange(t.dim() + 1)})"
        return f"{self.new()} = torch.cat([{a}, {b}, {a}[:1]], {self.dim(t)})"

    def matmul(self) -> str:
        a = self.pick(lambda t: t.dim() >= 1)
        if a is None:
            return self.binary()
        t = self.env[a]
        if t.dim() == 1:
            b = self.pick(lambda u: u.dim() == 1 and u.shape == t.shape) or a
            return f"{self.new()} = {a} @ {b}"
        m = self.pick(lambda u: u.dim() >= 1 and u.shape[0] == t.shape[-1])
        return f"{self.new()} = " + (f"{a} @ {m}" if m and self.rng.random() < 0.5
                                     else f"{a} @ {a}.mT")

    def softmax(self) -> str:
        a = self.any()
        d = self.dim(self.env[a]) or 0
        fn = self.rng.choice(("softmax", "log_softmax"))
        return f"{self.new()} = torch.{fn}({a}, {d})"

    def cumsum(self) -> str:
        a = self.any()
        d = self.dim(self.env[a]) or 0
        return f"{self.new()} = {a}.cumsum({d})"

    def sort(self) -> str:
        a = self.any()
        t = self.env[a]
        d = self.dim(t) or 0
        if self.rng.random() < 0.5:
            desc = self.rng.random() < 0.5
            return (f"{self.new()}, {self.new()} = torch.sort({a}, dim={d}, descending={desc}, "
                    "stable=True)")
        k = self.rng.randint(0, t.shape[d]) if t.dim() else 1
        # topk's indices are unspecified among ties: its values are compared
        return f"{self.new()} = torch.topk({a}, {k}, dim={d}).values"

    def where(self) -> str:
        a = self.any()
        b = self.same_shape(a) or a
        return f"{self.new()} = torch.where({self.mask(a)}, {a}, {b})"

    def factory(self) -> str:
        """A tensor made inside the program (constants folded by fused and compiled code)."""
        a, r = self.any(), self.rng
        t, s = self.env[a], r.choice(SCALARS)
        dt = r.choice(list(DTYPES))
        return f"{self.new()} = " + r.choice([
            f"torch.zeros((), dtype=torch.{dt}, device={a}.device)",
            f"torch.full_like({a}, {s})", f"torch.ones_like({a}, dtype=torch.{dt})",
            f"torch.tensor({s}, device={a}.device)",
            f"torch.arange({t.shape[-1] if t.dim() else 3}, device={a}.device)",
        ])

    KINDS = ("unary", "binary", "scalar", "reduce", "view_step", "view_step", "inplace",
             "inplace", "index_write", "index_read", "join", "matmul", "softmax", "cumsum",
             "sort", "where", "factory")

    def step(self) -> bool:
        """Add one line; False when the program should end (a line that raises)."""
        for _ in range(20):
            line = getattr(self, self.rng.choice(self.KINDS))()
            if line is None:
                continue
            kept = self.try_line(line)
            if kept is None:
                return False
            if kept:
                return True
        return True


def generate(seed: int) -> Program:
    """The program of one seed (the same program for the same seed, always)."""
    rng = random.Random(seed)
    n_inputs = rng.choice((1, 2, 2, 3))
    inputs: list[Input] = []
    for k in range(n_inputs):
        if inputs and rng.random() < 0.5:  # often the same shape as an earlier input
            inputs.append(gen_input(rng, f"x{k}", shape=rng.choice(inputs).shape))
        else:
            inputs.append(gen_input(rng, f"x{k}"))
    g = _Gen(rng, inputs)
    for _ in range(rng.randint(1, 7)):
        if not g.step():
            break
    return Program(tuple(inputs), tuple(g.steps))
