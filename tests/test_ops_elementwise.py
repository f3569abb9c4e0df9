"""Elementwise lowerings against PyTorch CPU.

Each op runs on CPU and on tpu with the same inputs: every dtype PyTorch's
CPU supports for it (a dtype the CPU rejects is not listed), broadcasting over
non-contiguous (transposed) inputs, and for float32 also strided slices,
Python scalars, 0-dim tensors and empty tensors; every such case compares
values (a CPU error fails it). Invalid inputs (shapes that do not broadcast,
an odd dimension for glu, ...) are the cases of `test_errors_match_cpu`. In-place forms are checked
on views. Run with the CPU fallback disabled, so every op here is lowered.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

# The CPU fallback off (conftest.no_cpu_fallback), for this module's tests only.
pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
I32, I64, BOOL, C64 = torch.int32, torch.int64, torch.bool, torch.complex64
FLOATS = (F32, BF16, F16)
INTS = (I32, I64)
REAL = FLOATS + INTS
ALL = REAL + (BOOL,)


def _gen(shape, dtype, domain, g):
    """A CPU tensor of `shape` with values in `domain` ('any', 'nz', 'pos', ...)."""
    n = math.prod(shape)
    if dtype == BOOL:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if not dtype.is_floating_point:
        if not dtype.is_signed:
            domain = "pos"
        lo, hi = {"any": (-9, 10), "nz": (1, 10), "pos": (1, 10), "shift": (0, 10),
                  "exp": (-2, 5), "unit": (0, 2), "prob": (0, 2), "gt1": (1, 10)}[domain]
        x = torch.randint(lo, hi, shape, generator=g, dtype=dtype)
        if domain == "nz":
            x = x * (torch.randint(0, 2, shape, generator=g, dtype=dtype) * 2 - 1)
        return x
    u = torch.rand(shape, generator=g)
    x = {"any": torch.randn(shape, generator=g) * 3, "nz": torch.randn(shape, generator=g) * 3,
         "pos": u * 4 + 0.1, "unit": u * 1.8 - 0.9, "prob": u * 0.9 + 0.05, "gt1": u * 4 + 1.0,
         "exp": torch.randint(-2, 4, shape, generator=g).float(), "shift": u * 8}[domain]
    if domain == "any" and n >= 8:
        x.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 0.5])
    return x.to(dtype)


class Op:
    def __init__(self, name, fn, n=1, dtypes=FLOATS, domains=("any",), scalars=None,
                 tol=None, layouts=True, same=False):
        self.name, self.fn, self.n, self.dtypes = name, fn, n, dtypes
        self.domains = tuple(domains) + (domains[-1],) * (n - len(domains))
        self.scalars = scalars  # Python values for the non-first args ("scalar" layout)
        self.tol = tol or {}
        self.layouts = layouts
        self.same = same  # all inputs of one shape (backward ops): no broadcasting

    def __repr__(self):
        return self.name


def _shapes(layout, n, same=False):
    if same:
        return {"empty": [(0, 5)] * n, "zerodim": [()] * n}.get(layout, [(5, 3)] + [(3, 5)] * (n - 1))
    if layout == "empty":
        return [(0, 5)] + [(5,)] * (n - 1)
    if layout == "zerodim":
        return [(3, 5)] + [()] * (n - 1) if n > 1 else [()]
    return [(5, 3)] + [(5,), (3, 1)][: n - 1] + [(5,)] * max(0, n - 3)


def _views(layout, n):
    if layout == "bcast_nc":  # transposed first input, broadcast others
        return [lambda t: t.t() if t.dim() == 2 else t] + [lambda t: t] * (n - 1)
    if layout == "slice":
        return [lambda t: t[1:, ::2] if t.dim() == 2 else t[::2]] * n
    return [lambda t: t] * n


def _make_args(op, dtype, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = _shapes(layout, op.n, op.same)
    if layout == "slice":
        # Every operand a strided (non-contiguous) view of a larger base: the
        # first (7, 6)[1:, ::2] -> (6, 3); the others (12, 3)[::2, :] -> (6, 3),
        # and a third one (12, 1)[::2] -> (6, 1), broadcast against them.
        shapes = [(7, 6)] + [(12, 3) if not op.same else (7, 6)] * (op.n - 1)
        if op.n > 2 and not op.same:
            shapes[2:] = [(12, 1)] * (op.n - 2)
    bases = [_gen(s, dtype, d, g) for s, d in zip(shapes, op.domains)]
    views = _views(layout, op.n)
    if layout == "slice" and op.n > 1 and not op.same:
        views = [lambda t: t[1:, ::2]] + [lambda t: t[::2, :]] * (op.n - 1)

    def build(device):
        out = []
        for i, (b, v) in enumerate(zip(bases, views)):
            if layout == "scalar" and i > 0:
                out.append(op.scalars[i - 1])
            else:
                out.append(v(b.to(device)))
        return out
    return build


def _tol(op, dtype):
    t = op.tol.get(dtype) or op.tol.get("all")
    return {} if t is None else dict(rtol=t[0], atol=t[1])


def _check(op, dtype, layout):
    """The values (and dtypes, shapes) of the tpu and the CPU agree. Every case
    here is valid for PyTorch's CPU: a CPU error is a broken case, never a pass
    (the errors are compared by the tests named `..._errors...` below)."""
    build = _make_args(op, dtype, layout)
    expected = op.fn(*build("cpu"))
    got = op.fn(*build("tpu"))
    exp_l = expected if isinstance(expected, (tuple, list)) else [expected]
    got_l = got if isinstance(got, (tuple, list)) else [got]
    for e, r in zip(exp_l, got_l):
        assert r.device.type == "tpu"
        assert r.dtype == e.dtype and r.shape == e.shape
        torch.testing.assert_close(r.cpu(), e, equal_nan=True, **_tol(op, dtype))


def _f(name):
    return getattr(torch, name)


SPECIAL_TOL = {F32: (1e-4, 1e-5), "all": None}
LOOSE = {F32: (1e-4, 1e-4), BF16: (3e-2, 3e-2), F16: (3e-3, 3e-3)}

OPS = [
    # binary arithmetic
    Op("add", torch.add, 2, ALL + (C64,), scalars=(2,)),
    Op("add_alpha", lambda x, y: torch.add(x, y, alpha=3), 2, REAL, scalars=(2,)),
    Op("sub", torch.sub, 2, REAL + (C64,), scalars=(1.5,)),
    Op("sub_alpha", lambda x, y: torch.sub(x, y, alpha=2), 2, REAL, scalars=(2,)),
    Op("rsub", torch.rsub, 2, REAL, scalars=(2,)),
    Op("mul", torch.mul, 2, ALL + (C64,), scalars=(2.5,)),
    Op("div", torch.div, 2, ALL + (C64,), domains=("any", "nz"), scalars=(-3,)),
    Op("div_trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), 2, REAL,
       domains=("any", "nz"), scalars=(-3,)),
    Op("div_floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), 2, REAL,
       domains=("any", "nz"), scalars=(-3,)),
    Op("floor_divide", torch.floor_divide, 2, REAL, domains=("any", "nz"), scalars=(-2.5,)),
    Op("remainder", torch.remainder, 2, REAL, domains=("any", "nz"), scalars=(-3,)),
    Op("remainder_scalar_self", lambda x: torch.remainder(5, x), 1, REAL, domains=("nz",)),
    Op("fmod", torch.fmod, 2, REAL, domains=("any", "nz"), scalars=(2.5,)),
    Op("pow", torch.pow, 2, REAL + (C64,), domains=("pos", "exp"), scalars=(3,),
       tol={C64: (1e-4, 1e-4)}),
    Op("pow_neg_base", torch.pow, 2, REAL, domains=("any", "exp"), scalars=(2,)),
    Op("pow_scalar_base", lambda x: torch.pow(2, x), 1, REAL, domains=("exp",)),
    Op("pow_float_exp", lambda x: torch.pow(x, 0.5), 1, REAL, domains=("pos",)),
    Op("atan2", torch.atan2, 2, REAL),
    Op("hypot", torch.hypot, 2, FLOATS),
    Op("maximum", torch.maximum, 2, ALL),
    Op("minimum", torch.minimum, 2, ALL),
    Op("fmax", torch.fmax, 2, ALL),
    Op("fmin", torch.fmin, 2, ALL),
    Op("copysign", torch.copysign, 2, REAL, scalars=(-1.0,)),
    Op("nextafter", torch.nextafter, 2, (F32, BF16)),
    Op("xlogy", torch.xlogy, 2, REAL, domains=("any", "pos"), scalars=(2.0,)),
    Op("xlog1py", torch.special.xlog1py, 2, REAL, domains=("any", "pos"), scalars=(2.0,)),
    Op("zeta", torch.special.zeta, 2, (F32,), domains=("gt1", "pos"), tol=SPECIAL_TOL),
    Op("igamma", torch.igamma, 2, (F32,), domains=("pos",), tol=SPECIAL_TOL),
    Op("igammac", torch.igammac, 2, (F32,), domains=("pos",), tol=SPECIAL_TOL),
    # (integer logaddexp/logaddexp2/frac: PyTorch's CPU has no kernel to compare with)
    Op("logaddexp", torch.logaddexp, 2, FLOATS),
    Op("logaddexp2", torch.logaddexp2, 2, FLOATS),
    Op("lerp", lambda x, y: torch.lerp(x, y, 0.3), 2, FLOATS + (C64,)),
    Op("lerp_big", lambda x, y: torch.lerp(x, y, 0.8), 2, FLOATS),
    Op("lerp_tensor", torch.lerp, 3, FLOATS, domains=("any", "any", "unit")),
    Op("addcmul", lambda x, y, z: torch.addcmul(x, y, z, value=0.5), 3, REAL),
    Op("addcdiv", lambda x, y, z: torch.addcdiv(x, y, z, value=-2), 3, FLOATS,
       domains=("any", "any", "nz")),
    Op("ldexp", torch.ldexp, 2, (F32, BF16, I32), domains=("any", "exp")),
    Op("heaviside", torch.heaviside, 2, REAL),
    Op("gcd", torch.gcd, 2, INTS),
    Op("lcm", torch.lcm, 2, INTS),
    # bitwise / logical
    Op("bitwise_and", torch.bitwise_and, 2, INTS + (BOOL,), scalars=(6,)),
    Op("bitwise_or", torch.bitwise_or, 2, INTS + (BOOL,), scalars=(6,)),
    Op("bitwise_xor", torch.bitwise_xor, 2, INTS + (BOOL,), scalars=(6,)),
    Op("bitwise_not", torch.bitwise_not, 1, INTS + (BOOL,)),
    Op("lshift", torch.bitwise_left_shift, 2, INTS, domains=("any", "shift"), scalars=(3,)),
    Op("rshift", torch.bitwise_right_shift, 2, INTS, domains=("any", "shift"), scalars=(3,)),
    Op("lshift_op", lambda x, y: x << y, 2, INTS, domains=("any", "shift"), scalars=(40,)),
    Op("rshift_op", lambda x, y: x >> y, 2, INTS, domains=("any", "shift"), scalars=(70,)),
    Op("logical_and", torch.logical_and, 2, ALL),
    Op("logical_or", torch.logical_or, 2, ALL),
    Op("logical_xor", torch.logical_xor, 2, ALL),
    Op("logical_not", torch.logical_not, 1, ALL + (C64,)),
    # comparisons
    *[Op(n, _f(n), 2, ALL, scalars=(0.5,)) for n in ("eq", "ne", "lt", "le", "gt", "ge")],
    Op("eq_complex", torch.eq, 2, (C64,)),
    Op("isnan", torch.isnan, 1, ALL), Op("isinf", torch.isinf, 1, ALL),
    Op("isfinite", torch.isfinite, 1, ALL), Op("isposinf", torch.isposinf, 1, REAL),
    Op("isneginf", torch.isneginf, 1, REAL), Op("signbit", torch.signbit, 1, REAL),
    Op("sign", torch.sign, 1, ALL), Op("sgn", torch.sgn, 1, REAL + (C64,)),
    # unary math
    *[Op(n, _f(n), 1, REAL + (BOOL, C64), tol={C64: (1e-4, 1e-5)})
      for n in ("exp", "expm1", "sin", "cos", "tanh", "sqrt", "log", "sigmoid", "reciprocal")],
    *[Op(n, _f(n), 1, REAL) for n in ("exp2", "log2", "log10", "log1p", "rsqrt", "tan", "sinh",
                                      "cosh", "asinh", "atan", "erf", "erfc", "sinc",
                                      "deg2rad", "rad2deg", "angle")],
    Op("frac", torch.frac, 1, FLOATS),
    *[Op(n, _f(n), 1, REAL, domains=("unit",)) for n in ("asin", "acos", "atanh", "erfinv")],
    Op("acosh", torch.acosh, 1, REAL, domains=("gt1",)),
    Op("lgamma", torch.lgamma, 1, REAL, tol=SPECIAL_TOL),
    Op("digamma", torch.digamma, 1, REAL, tol=LOOSE),
    Op("polygamma1", lambda x: torch.polygamma(1, x), 1, (F32,), domains=("pos",), tol=LOOSE),
    Op("polygamma3", lambda x: torch.polygamma(3, x), 1, (F32,), domains=("pos",), tol=LOOSE),
    Op("mvlgamma", lambda x: torch.mvlgamma(x, 3), 1, (F32,), domains=("gt1",), tol=LOOSE),
    Op("i0", torch.i0, 1, REAL, tol=SPECIAL_TOL),
    Op("i0e", torch.special.i0e, 1, (F32, BF16), tol=SPECIAL_TOL),
    Op("i1", torch.special.i1, 1, (F32,), tol=SPECIAL_TOL),
    Op("i1e", torch.special.i1e, 1, (F32,), tol=SPECIAL_TOL),
    Op("modified_bessel_i0", torch.special.modified_bessel_i0, 1, (F32,), tol=SPECIAL_TOL),
    Op("modified_bessel_i1", torch.special.modified_bessel_i1, 1, (F32,), tol=SPECIAL_TOL),
    Op("spherical_bessel_j0", torch.special.spherical_bessel_j0, 1, (F32,)),
    Op("zeta_negative_q", lambda x, q: torch.special.zeta(x.floor() + 2, q), 2, (F32,),
       tol=SPECIAL_TOL, layouts=False),
    Op("polygamma1_any", lambda x: torch.polygamma(1, x), 1, (F32,), tol=LOOSE),
    Op("ndtri", torch.special.ndtri, 1, (F32,), domains=("prob",), tol=SPECIAL_TOL),
    Op("log_ndtr", torch.special.log_ndtr, 1, (F32,), tol=SPECIAL_TOL),
    Op("erfcx", torch.special.erfcx, 1, (F32,), tol=SPECIAL_TOL),
    Op("entr", torch.special.entr, 1, (F32, BF16)),
    # PyTorch's CPU logit rounds x / (1 - x) to bfloat16/float16 before the log.
    Op("logit", torch.logit, 1, REAL, domains=("prob",), tol={BF16: (2e-2, 1e-2), F16: (2e-3, 2e-3)}),
    Op("logit_eps", lambda x: torch.logit(x, eps=0.1), 1, (F32,)),
    Op("abs", torch.abs, 1, REAL + (C64,)),
    Op("neg", torch.neg, 1, REAL + (C64,)),
    *[Op(n, _f(n), 1, REAL) for n in ("floor", "ceil", "trunc", "round")],
    Op("round_dec", lambda x: torch.round(x, decimals=2), 1, (F32,)),
    Op("round_negdec", lambda x: torch.round(x * 100, decimals=-1), 1, (F32,)),
    Op("nan_to_num", torch.nan_to_num, 1, REAL),
    Op("nan_to_num_args", lambda x: torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0), 1,
       FLOATS),
    Op("clamp", lambda x: torch.clamp(x, -0.5, 1), 1, REAL),
    Op("clamp_min_only", lambda x: torch.clamp(x, min=0), 1, REAL),
    Op("clamp_tensor", lambda x, lo, hi: torch.clamp(x, lo, hi - 1.0), 3, FLOATS),
    Op("clamp_min", torch.clamp_min, 2, REAL, scalars=(0.5,)),
    Op("clamp_max", torch.clamp_max, 2, REAL, scalars=(0.5,)),
    Op("where", lambda x, y: torch.where(x > 0, x, y), 2, ALL, scalars=(2.0,)),
    Op("where_scalar", lambda x: torch.where(x > 0, 1.5, x), 1, REAL),
    Op("conj_physical", torch.conj_physical, 1, (C64, F32)),
    # activations
    Op("relu", torch.relu, 1, REAL),
    Op("threshold", lambda x: F.threshold(x, 0.1, 20), 1, REAL),
    Op("gelu", F.gelu, 1, FLOATS),
    Op("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), 1, FLOATS),
    Op("silu", F.silu, 1, FLOATS), Op("mish", F.mish, 1, FLOATS),
    Op("hardtanh", lambda x: F.hardtanh(x, -2.0, 1.5), 1, REAL),
    Op("relu6", F.relu6, 1, FLOATS),
    Op("hardswish", F.hardswish, 1, FLOATS), Op("hardsigmoid", F.hardsigmoid, 1, FLOATS),
    Op("elu", lambda x: F.elu(x, 0.7), 1, FLOATS), Op("selu", F.selu, 1, FLOATS),
    Op("celu", lambda x: F.celu(x, 1.3), 1, FLOATS),
    Op("leaky_relu", lambda x: F.leaky_relu(x, 0.2), 1, FLOATS),
    Op("softplus", lambda x: F.softplus(x, 2.0, 5.0), 1, FLOATS),
    Op("logsigmoid", F.logsigmoid, 1, FLOATS),
    Op("log_sigmoid_forward", torch.ops.aten.log_sigmoid_forward, 1, (F32,)),
    # glu halves a dimension of even size (odd sizes: test_errors_match_cpu)
    Op("glu", lambda x: F.glu(x[:2], 0), 1, FLOATS, layouts=False),
    Op("glu_last", lambda x: F.glu(x[:, :4], -1), 1, FLOATS, layouts=False),
    Op("hardshrink", lambda x: F.hardshrink(x, 0.7), 1, FLOATS),
    Op("softshrink", lambda x: F.softshrink(x, 0.7), 1, FLOATS),
    Op("prelu_kernel", lambda x, w: torch.ops.aten._prelu_kernel(x, w), 2, FLOATS),
]

A = torch.ops.aten
BACKWARD = [
    Op("threshold_backward", lambda g, x: A.threshold_backward(g, x, 0.1), 2, FLOATS),
    Op("gelu_backward", lambda g, x: A.gelu_backward(g, x), 2, FLOATS),
    Op("gelu_backward_tanh", lambda g, x: A.gelu_backward(g, x, approximate="tanh"), 2, FLOATS),
    Op("silu_backward", A.silu_backward, 2, FLOATS),
    Op("sigmoid_backward", A.sigmoid_backward, 2, FLOATS + (C64,)),
    Op("tanh_backward", A.tanh_backward, 2, FLOATS + (C64,)),
    Op("hardtanh_backward", lambda g, x: A.hardtanh_backward(g, x, -1.0, 1.0), 2, FLOATS),
    Op("hardswish_backward", A.hardswish_backward, 2, FLOATS),
    Op("hardsigmoid_backward", A.hardsigmoid_backward, 2, FLOATS),
    Op("elu_backward", lambda g, x: A.elu_backward(g, 0.7, 1.1, 1.2, False, x), 2, FLOATS),
    Op("elu_backward_res", lambda g, x: A.elu_backward(g, 0.7, 1.1, 1.2, True, x), 2, FLOATS),
    Op("leaky_relu_backward", lambda g, x: A.leaky_relu_backward(g, x, 0.2, False), 2, FLOATS),
    Op("softplus_backward", lambda g, x: A.softplus_backward(g, x, 2.0, 5.0), 2, FLOATS),
    Op("log_sigmoid_backward", lambda g, x: A.log_sigmoid_backward(g, x, torch.exp(-x.abs())),
       2, FLOATS),
    Op("logit_backward", lambda g, x: A.logit_backward(g, x), 2, FLOATS, domains=("any", "prob")),
    Op("logit_backward_eps", lambda g, x: A.logit_backward(g, x, 0.2), 2, (F32,),
       domains=("any", "prob")),
    Op("hardshrink_backward", lambda g, x: A.hardshrink_backward(g, x, 0.7), 2, FLOATS),
    Op("softshrink_backward", lambda g, x: A.softshrink_backward(g, x, 0.7), 2, FLOATS),
    Op("prelu_kernel_backward", A._prelu_kernel_backward, 3, (F32,)),
]
for _op in BACKWARD:
    _op.same = True

MAIN = [pytest.param(op, dt, id=f"{op.name}-{str(dt)[6:]}")
        for op in OPS + BACKWARD for dt in op.dtypes]


@pytest.mark.parametrize("op,dtype", MAIN)
def test_op(op, dtype):
    _check(op, dtype, "bcast_nc")


def _layout_params():
    out = []
    for op in OPS + BACKWARD:
        if not op.layouts:
            continue
        dt = F32 if F32 in op.dtypes else op.dtypes[0]
        layouts = ["slice", "empty", "zerodim"]
        if op.scalars is not None:
            layouts.append("scalar")
        out += [pytest.param(op, dt, lay, id=f"{op.name}-{lay}") for lay in layouts]
    return out


@pytest.mark.parametrize("op,dtype,layout", _layout_params())
def test_layouts(op, dtype, layout):
    _check(op, dtype, layout)


# -- errors: the tpu refuses what the CPU refuses, with the CPU's error ---------------------


def _error_cases():
    g = torch.Generator().manual_seed(9)

    def rand(*shape, dtype=F32):
        x = _gen(shape, dtype, "nz", g)  # the same values on both devices
        return lambda dev: x.clone().to(dev)

    cases = [
        ("glu_odd_dim", lambda x: F.glu(x, 0), [rand(3, 5)]),
        ("glu_odd_last_dim", lambda x: F.glu(x, -1), [rand(4, 5)]),
        ("mul_inplace_self_broadcast", lambda x, y: x.mul_(y), [rand(1, 3), rand(4, 3)]),
        ("sub_bool", torch.sub, [rand(3, dtype=BOOL), rand(3, dtype=BOOL)]),
        ("bitwise_and_float", torch.bitwise_and, [rand(3), rand(3)]),
        ("gcd_float", torch.gcd, [rand(3), rand(3)]),
    ]
    # Operands whose shapes do not broadcast, for every op of two or more inputs.
    for op in OPS + BACKWARD:
        if op.n > 1:
            dt = F32 if F32 in op.dtypes else op.dtypes[0]
            shapes = [(6, 3)] + [(4, 3)] * (op.n - 1)
            cases.append((f"{op.name}_size_mismatch", op.fn,
                          [rand(*s, dtype=dt) for s in shapes]))
    return [pytest.param(fn, makers, id=name) for name, fn, makers in cases]


@pytest.mark.parametrize("fn,makers", _error_cases())
def test_errors_match_cpu(fn, makers):
    """Invalid inputs: the CPU raises, and the tpu raises the same type with the
    CPU's message (the tpu adds the op's name; a kernel name says `_tpu`)."""
    with pytest.raises((RuntimeError, TypeError, NotImplementedError, ValueError)) as cpu:
        fn(*[m("cpu") for m in makers])
    with pytest.raises(cpu.type) as tpu:
        fn(*[m("tpu") for m in makers])
    want = str(cpu.value).splitlines()[0]
    got = str(tpu.value)
    assert got.startswith(want) or got.startswith(want.replace("_cpu", "_tpu")), (want, got)


# -- in-place and out= on views ---------------------------------------------------

INPLACE = {
    "add_": lambda v, y: v.add_(y, alpha=2),
    "sub_scalar": lambda v, y: v.sub_(1.5),
    "mul_": lambda v, y: v.mul_(y),
    "div_floor": lambda v, y: v.div_(y, rounding_mode="floor"),
    "remainder_": lambda v, y: v.remainder_(y),
    "pow_": lambda v, y: v.pow_(2),
    "lerp_": lambda v, y: v.lerp_(y, 0.3),
    "addcmul_": lambda v, y: v.addcmul_(y, y, value=2),
    "addcdiv_": lambda v, y: v.addcdiv_(y, y + 10, value=2),
    "clamp_": lambda v, y: v.clamp_(-0.5, 0.5),
    "clamp_min_": lambda v, y: v.clamp_min_(y),
    "abs_": lambda v, y: v.abs_(),
    "neg_": lambda v, y: v.neg_(),
    "sigmoid_": lambda v, y: v.sigmoid_(),
    "exp_": lambda v, y: v.exp_(),
    "relu_": lambda v, y: F.relu(v, inplace=True),
    "leaky_relu_": lambda v, y: F.leaky_relu(v, 0.1, inplace=True),
    "hardtanh_": lambda v, y: F.hardtanh(v, inplace=True),
    "eq_": lambda v, y: v.eq_(y),  # comparison written back as 1.0 / 0.0
    "copysign_": lambda v, y: v.copysign_(y),
    "nan_to_num_": lambda v, y: v.nan_to_num_(),
    "round_": lambda v, y: v.round_(decimals=1),
    "maximum_out": lambda v, y: torch.maximum(v, y, out=v),
    "add_out_other_view": lambda v, y: torch.add(y, 1.0, out=v[0]),
    "where_out": lambda v, y: torch.where(v > 0, v, y, out=v),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_on_view(name):
    fn = INPLACE[name]
    g = torch.Generator().manual_seed(1)
    base_c = _gen((5, 4), F32, "any", g)
    y_c = _gen((5,), F32, "nz", g)
    results = []
    for dev in ("cpu", "tpu"):
        base, y = base_c.clone().to(dev), y_c.to(dev)
        v = base.t()[1:]  # (3, 5), non-contiguous, offset 1
        out = fn(v, y)
        results.append((base.cpu(), v.cpu(), out.cpu() if out is not None else None))
    for c, t in zip(results[0], results[1]):
        if c is not None:
            torch.testing.assert_close(t, c, equal_nan=True)


def test_inplace_int_ops_on_view():
    x_c = torch.arange(-10, 10).reshape(4, 5)
    for dev in ("cpu", "tpu"):
        x = x_c.clone().to(dev)
        v = x[:, 1::2]
        v.floor_divide_(3)
        x[1:].bitwise_xor_(6)
        x.t()[0].mul_(-7)
        x[2].remainder_(4)
        x[3].clamp_(max=2)
        if dev == "cpu":
            expected = x
    torch.testing.assert_close(x.cpu(), expected)


# -- promotion, scalars and CPU 0-dim tensors -----------------------------------------

PROMOTION = [
    (F32, BF16, torch.add), (I32, I64, torch.add), (BOOL, I32, torch.add),
    (I32, F16, torch.mul), (BF16, F16, torch.sub), (I64, F32, torch.div),
    (I32, I32, torch.div), (BOOL, F32, torch.mul), (I32, F32, torch.lt),
    (torch.uint8, I32, torch.add), (torch.int8, torch.uint8, torch.add),
    (BF16, F32, torch.maximum), (I64, BF16, torch.atan2),
]


@pytest.mark.parametrize("a,b,fn", PROMOTION,
                         ids=lambda v: getattr(v, "__name__", str(v)).replace("torch.", ""))
def test_mixed_dtypes(a, b, fn):
    g = torch.Generator().manual_seed(2)
    x, y = _gen((3, 4), a, "any", g), _gen((4,), b, "nz", g)
    exp = fn(x, y)
    got = fn(x.to("tpu"), y.to("tpu"))
    assert got.dtype == exp.dtype
    torch.testing.assert_close(got.cpu(), exp, equal_nan=True)


SCALAR_CASES = [
    (I32, lambda x: x + 2.5), (I32, lambda x: x * True), (BOOL, lambda x: x + 1),
    (BOOL, lambda x: x + True), (F16, lambda x: x * 1e4), (BF16, lambda x: x / 3),
    (I64, lambda x: x // -3), (I64, lambda x: x % -3), (I32, lambda x: 7 - x),
    (F32, lambda x: x + torch.tensor(2.5, dtype=torch.float64)),  # CPU 0-dim tensor
    (I32, lambda x: x + torch.tensor(2.5)), (I32, lambda x: x * torch.tensor(3)),
    (BF16, lambda x: x + torch.tensor(1.0)), (I32, lambda x: x < torch.tensor(0.5)),
    (F32, lambda x: x == float("nan")), (I64, lambda x: x ** 2), (F32, lambda x: 2 ** x),
    (I64, lambda x: torch.pow(-1, x.abs())), (C64, lambda x: x * 2j),
    (F32, lambda x: x + 1j), (F32, lambda x: torch.clamp(x, min=-1)),
    (I32, lambda x: torch.clamp(x, 0.5, 3.5)), (I32, lambda x: torch.where(x > 0, x, 1.5)),
]


@pytest.mark.parametrize("dtype,fn", SCALAR_CASES, ids=[str(i) for i in range(len(SCALAR_CASES))])
def test_scalars(dtype, fn):
    x = _gen((3, 4), dtype, "any", torch.Generator().manual_seed(3))
    exp = fn(x)
    got = fn(x.to("tpu"))
    assert got.dtype == exp.dtype
    torch.testing.assert_close(got.cpu(), exp, equal_nan=True)


def test_scalar_values_do_not_recompile():
    from torch_tpu.runtime import executor

    x = torch.randn(8).to("tpu")
    (x * 1.0).cpu()
    before = executor.STATS.misses
    for s in (0.5, 2.0, -3.0):
        torch.testing.assert_close((x * s).cpu(), x.cpu() * s)
    assert executor.STATS.misses == before


# -- integer semantics --------------------------------------------------------------


def test_int_floor_and_remainder_signs():
    a = torch.tensor([7, -7, 7, -7, 0, 6, -6])
    b = torch.tensor([2, 2, -2, -2, 3, -3, 4])
    for fn in (torch.floor_divide, torch.remainder, torch.fmod,
               lambda x, y: torch.div(x, y, rounding_mode="trunc"),
               lambda x, y: torch.div(x, y, rounding_mode="floor")):
        torch.testing.assert_close(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b))


def test_int_division_by_zero_is_documented_not_raised():
    # PyTorch CPU raises RuntimeError("ZeroDivisionError"); checking would cost a
    # device-to-host read per op, so the tpu returns fixed values instead.
    a = torch.tensor([7, -7, 0]).to("tpu")
    z = torch.zeros(3, dtype=torch.int64).to("tpu")
    assert (a // z).cpu().tolist() == [-1, -1, -1]
    assert torch.div(a, z, rounding_mode="trunc").cpu().tolist() == [-1, -1, -1]
    assert (a % z).cpu().tolist() == [7, -7, 0]
    assert torch.fmod(a, z).cpu().tolist() == [7, -7, 0]
    # Float division by zero is IEEE, exactly as on CPU.
    f = torch.tensor([1.0, -1.0, 0.0])
    torch.testing.assert_close((f.to("tpu") // 0.0).cpu(), f // 0.0, equal_nan=True)
    torch.testing.assert_close((f.to("tpu") % 0.0).cpu(), f % 0.0, equal_nan=True)


def test_int_pow():
    a = torch.tensor([2, -2, 1, -1, 0, 3, 10])
    e = torch.tensor([-1, -3, -5, -3, 2, 3, 20])
    torch.testing.assert_close((a.to("tpu") ** e.to("tpu")).cpu(), a ** e)  # wraps like CPU
    # A negative Scalar exponent raises as on CPU (the check is in CPU's kernel,
    # not the meta function; the tpu checks the Scalar on the host).
    x = torch.tensor([2, 3, 1, -1], dtype=torch.int32).to("tpu")
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        x ** -3
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        torch.tensor([2, 3], dtype=torch.int32) ** -3  # CPU's own text


def test_bool_arithmetic():
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    for fn in (torch.add, torch.mul, torch.maximum, torch.minimum, torch.bitwise_xor,
               lambda x, y: x + y * 2, lambda x, y: x / y, lambda x, y: x * 1.5):
        exp = fn(a, b)
        got = fn(a.to("tpu"), b.to("tpu"))
        assert got.dtype == exp.dtype
        torch.testing.assert_close(got.cpu(), exp, equal_nan=True)
    with pytest.raises(RuntimeError, match="[Ss]ubtraction"):
        a.to("tpu") - b.to("tpu")


def test_shifts_beyond_width():
    x = torch.tensor([1, -8, 123, -1], dtype=torch.int32)
    s = torch.tensor([0, 31, 32, 40], dtype=torch.int32)
    for fn in (torch.bitwise_left_shift, torch.bitwise_right_shift):
        torch.testing.assert_close(fn(x.to("tpu"), s.to("tpu")).cpu(), fn(x, s))


# -- _foreach_* ----------------------------------------------------------------------

from torch_tpu.ops import foreach as _foreach  # noqa: E402


def test_foreach_lowerings_are_active():
    """The foreach/fused-optimizer lowerings are on: were the probe in
    ops/foreach.py to fail (it warns, naming the cause), the product would run
    these ops through decompositions, and the foreach and optimizer tests below
    would fail on their one-executable-per-call counts, not skip."""
    from torch_tpu.ops.registry import LOWERINGS

    assert _foreach.ACTIVE
    assert torch.ops.aten._foreach_add_.Scalar in LOWERINGS or \
        torch.ops.aten._foreach_add.Scalar in LOWERINGS
    assert torch.ops.aten._fused_adam_.default in LOWERINGS


def test_foreach_probe_failure_warns(monkeypatch):
    """A probe that breaks says so (a warning naming the cause), not silence."""
    from torch_tpu.runtime import executor

    def broken(*a, **k):
        raise AttributeError("no Runner here")

    monkeypatch.setattr(executor, "Runner", broken)
    with pytest.warns(RuntimeWarning, match="lowerings are OFF.*AttributeError: no Runner"):
        assert _foreach._executor_returns_none_for_void_ops() is False


# Lists mix shapes, a 0-dim tensor, an empty one and a non-contiguous view. Each
# foreach call must be one executable over the whole list.


def _list(dtype, seed, domain="any"):
    g = torch.Generator().manual_seed(seed)
    return [_gen((3, 4), dtype, domain, g), _gen((5,), dtype, domain, g),
            _gen((), dtype, domain, g), _gen((0, 2), dtype, domain, g),
            _gen((4, 2), dtype, domain, g)]


def _to_tpu_list(xs):
    out = [x.clone().to("tpu") for x in xs]
    out[-1] = xs[-1].t().contiguous().clone().to("tpu").t()  # non-contiguous member
    return out


FOREACH = {
    "add_list": lambda a, b: torch._foreach_add(a, b, alpha=2),
    "add_scalar": lambda a, b: torch._foreach_add(a, 1.5),
    "add_scalarlist": lambda a, b: torch._foreach_add(a, [1, 2.5, -1, 3, 0.5]),
    "add_tensor": lambda a, b: torch._foreach_add(a, b[2], alpha=-1),
    "sub_list": lambda a, b: torch._foreach_sub(a, b, alpha=0.5),
    "sub_scalar": lambda a, b: torch._foreach_sub(a, 2),
    "mul_list": lambda a, b: torch._foreach_mul(a, b),
    "mul_scalar": lambda a, b: torch._foreach_mul(a, 0.9),
    "mul_tensor": lambda a, b: torch._foreach_mul(a, b[2]),
    "div_list": lambda a, b: torch._foreach_div(a, b),
    "div_scalarlist": lambda a, b: torch._foreach_div(a, [1.0, 2.0, 3.0, 4.0, 5.0]),
    "div_tensor": lambda a, b: torch._foreach_div(a, b[2]),
    "addcmul_scalar": lambda a, b: torch._foreach_addcmul(a, b, b, 0.01),
    "addcmul_scalarlist": lambda a, b: torch._foreach_addcmul(a, b, a, [1, 2, 3, 4, 5]),
    "addcdiv_scalar": lambda a, b: torch._foreach_addcdiv(a, a, b, -0.1),
    "addcdiv_scalarlist": lambda a, b: torch._foreach_addcdiv(a, a, b, [.1, .2, .3, .4, .5]),
    "lerp_scalar": lambda a, b: torch._foreach_lerp(a, b, 0.1),
    "lerp_list": lambda a, b: torch._foreach_lerp(a, b, [x * 0 + 0.7 for x in b]),
    "lerp_scalarlist": lambda a, b: torch._foreach_lerp(a, b, [0.1, 0.9, 0.5, 0.2, 0.6]),
    "maximum_list": lambda a, b: torch._foreach_maximum(a, b),
    "minimum_scalar": lambda a, b: torch._foreach_minimum(a, 0.5),
    "clamp_min_scalar": lambda a, b: torch._foreach_clamp_min(a, -0.5),
    "clamp_max_list": lambda a, b: torch._foreach_clamp_max(a, b),
    "pow_scalar": lambda a, b: torch._foreach_pow(a, 2),
    "pow_list": lambda a, b: torch._foreach_pow([x.abs() for x in a], b),
    "pow_scalar_and_tensor": lambda a, b: torch._foreach_pow(0.9, b),
    "sqrt": lambda a, b: torch._foreach_sqrt([x.abs() for x in a]),
    "neg": lambda a, b: torch._foreach_neg(a),
    "abs": lambda a, b: torch._foreach_abs(a),
    "exp": lambda a, b: torch._foreach_exp(a),
    "reciprocal": lambda a, b: torch._foreach_reciprocal(b),
    "sign": lambda a, b: torch._foreach_sign(a),
    "norm": lambda a, b: torch._foreach_norm(a),
    "norm_inf": lambda a, b: torch._foreach_norm(a[:3] + a[4:], float("inf")),
    "norm_1": lambda a, b: torch._foreach_norm(a, 1),
    "norm_3": lambda a, b: torch._foreach_norm(a, 3),
    "max": lambda a, b: torch._foreach_max(a[:3] + a[4:]),
    # in-place forms: the written lists are compared
    "add_": lambda a, b: torch._foreach_add_(a, b, alpha=0.5),
    "mul_scalar_": lambda a, b: torch._foreach_mul_(a, 0.5),
    "div_scalarlist_": lambda a, b: torch._foreach_div_(a, [1.0, 2.0, 3.0, 4.0, 5.0]),
    "addcdiv_": lambda a, b: torch._foreach_addcdiv_(a, a, b, [.1, .2, .3, .4, .5]),
    "addcmul_": lambda a, b: torch._foreach_addcmul_(a, b, b, 0.01),
    "lerp_": lambda a, b: torch._foreach_lerp_(a, b, 0.1),
    "maximum_": lambda a, b: torch._foreach_maximum_(a, b),
    "sqrt_": lambda a, b: torch._foreach_sqrt_(b),
    "neg_": lambda a, b: torch._foreach_neg_(a),
    "reciprocal_": lambda a, b: torch._foreach_reciprocal_(b),
    "copy_": lambda a, b: torch._foreach_copy_(a, b),
    "zero_": lambda a, b: torch._foreach_zero_(a),
    "clamp_min_": lambda a, b: torch._foreach_clamp_min_(a, 0.0),
}


def _run_foreach(fn, a, b):
    out = fn(a, b)
    return list(out) if out is not None else list(a) + list(b)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(FOREACH))
def test_foreach(name, dtype):
    from torch_tpu.runtime import executor

    fn = FOREACH[name]
    a, b = _list(dtype, 4), _list(dtype, 5, "pos")
    ta, tb = _to_tpu_list(a), _to_tpu_list(b)
    expected = _run_foreach(fn, a, b)
    got = fn(ta, tb)
    got = list(got) if got is not None else list(ta) + list(tb)
    assert len(got) == len(expected)
    for e, r in zip(expected, got):
        assert r.device.type == "tpu" and r.dtype == e.dtype and r.shape == e.shape
        torch.testing.assert_close(r.cpu(), e, equal_nan=True)
    # One executable per call over the whole list (warm cache, then count).
    ta, tb = _to_tpu_list(a), _to_tpu_list(b)
    if any(k in name for k in ("pow_list", "sqrt", "lerp_list")) and not name.endswith("_"):
        return  # the test's own per-tensor preprocessing adds calls
    r0 = executor.STATS.requests
    fn(ta, tb)
    assert executor.STATS.requests - r0 == 1


def test_foreach_int_and_mixed_dtypes():
    a = [torch.arange(6).reshape(2, 3), torch.arange(3, dtype=torch.int32)]
    b = [torch.ones(2, 3, dtype=torch.int64), torch.full((3,), 2, dtype=torch.int32)]
    for fn in (lambda x, y: torch._foreach_add(x, y, alpha=3),
               lambda x, y: torch._foreach_mul(x, 2.5),  # int * float -> float
               lambda x, y: torch._foreach_div(x, y),
               lambda x, y: torch._foreach_maximum(x, y)):
        exp = fn(a, b)
        got = fn([x.to("tpu") for x in a], [y.to("tpu") for y in b])
        for e, r in zip(exp, got):
            assert r.dtype == e.dtype
            torch.testing.assert_close(r.cpu(), e)
    with pytest.raises(RuntimeError):
        torch._foreach_mul_([x.to("tpu") for x in a], 2.5)  # result can't be cast to int


# -- optimizers ----------------------------------------------------------------------
# Parameters updated with synthetic gradients set directly, so only elementwise
# and foreach ops are involved; tpu must match CPU within 1e-5 after a few steps.

OPTIMIZERS = {
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.1, **k),
    "sgd_momentum_wd": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9,
                                                      weight_decay=0.01, dampening=0.1, **k),
    "sgd_nesterov": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                   weight_decay=0.01, **k),
    "sgd_maximize": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.5, maximize=True, **k),
    "adam": lambda p, **k: torch.optim.Adam(p, lr=1e-2, **k),
    "adam_amsgrad_wd": lambda p, **k: torch.optim.Adam(p, lr=1e-2, amsgrad=True,
                                                       weight_decay=0.1, **k),
    "adam_maximize": lambda p, **k: torch.optim.Adam(p, lr=1e-2, maximize=True, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, **k),
    "adamw_amsgrad": lambda p, **k: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01,
                                                  weight_decay=0.1, **k),
}
MODES = {"default": {}, "foreach_false": {"foreach": False}, "fused": {"fused": True}}


def _steps(device, make, mode, n_steps=3):
    g = torch.Generator().manual_seed(7)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for s in shapes]
    opt = make(params, **MODES[mode])
    for _ in range(n_steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        opt.step()
    return params, opt


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_cpu(name, mode):
    make = OPTIMIZERS[name]
    cpu_params, _ = _steps("cpu", make, mode)
    tpu_params, opt = _steps("tpu", make, mode)
    for c, t in zip(cpu_params, tpu_params):
        torch.testing.assert_close(t.detach().cpu(), c.detach(), rtol=1e-5, atol=1e-5)
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                assert v.device.type == "tpu"


@pytest.mark.parametrize("name", ["adamw", "sgd_nesterov"])
def test_fused_optimizer_step_is_one_executable(name):
    from torch_tpu.runtime import executor

    params, opt = _steps("tpu", OPTIMIZERS[name], "fused", n_steps=1)
    r0 = executor.STATS.requests
    opt.step()
    # Adam: `_foreach_add_(state_steps, 1)` and the fused step; SGD: the fused step.
    assert executor.STATS.requests - r0 <= 2
    per_op = executor.STATS.per_op
    assert any(k.startswith("aten._fused_") for k in per_op)


def test_fused_adam_grad_scale_and_found_inf():
    def run(device, found):
        g = torch.Generator().manual_seed(3)
        ps = [torch.randn(3, 2, generator=g).to(device) for _ in range(2)]
        grads = [torch.randn(3, 2, generator=g).to(device) for _ in range(2)]
        m = [torch.zeros(3, 2).to(device) for _ in range(2)]
        v = [torch.zeros(3, 2).to(device) for _ in range(2)]
        steps = [torch.tensor(1.0).to(device) for _ in range(2)]
        torch._fused_adamw_(ps, grads, m, v, [], steps, lr=0.01, beta1=0.9, beta2=0.999,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=torch.tensor(4.0).to(device),
                            found_inf=torch.tensor(found).to(device))
        return ps + grads + m + v
    for found in (0.0, 1.0):
        for c, t in zip(run("cpu", found), run("tpu", found)):
            torch.testing.assert_close(t.cpu(), c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", list(MODES))
def test_small_model_adamw_matches_cpu(mode):
    # Also needs linear / mse_loss lowerings (other families).
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    res = []
    for dev in ("cpu", "tpu"):
        m = __import__("copy").deepcopy(base).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, **MODES[mode])
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(m(x.to(dev)), y.to(dev)).backward()
            opt.step()
        res.append([p.detach().cpu() for p in m.parameters()])
    for c, t in zip(*res):
        torch.testing.assert_close(t, c, rtol=1e-5, atol=1e-5)


def test_logaddexp_complex_matches_cpu():
    # The complex form takes the operand with the larger real part as the max
    # (the real form's |a - b| trick drops the imaginary parts).
    torch.manual_seed(0)
    a = torch.randn(4, 5, dtype=torch.cfloat) * 3
    b = torch.randn(4, 5, dtype=torch.cfloat) * 3
    got = torch.logaddexp(a.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.logaddexp(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["eager", "fused", "compiled"])
def test_logit_with_crossed_eps_bounds_matches_cpu(path, no_cpu_fallback):
    """eps > 0.5: CPU clamps below eps first (to eps), then above 1 - eps; a
    clip to [eps, 1 - eps] gave 1 - eps everywhere (PyTorch 2.14's samples)."""
    x = torch.tensor([-0.5, 0.3, 0.45, 0.55, 0.9, 1.5, float("nan")])
    want = torch.logit(x, eps=0.6)

    def f(t):
        return torch.logit(t, eps=0.6)

    t = x.to("tpu")
    if path == "fused":
        with torch_tpu.fused():
            got = f(t).cpu()
    elif path == "compiled":
        got = torch.compile(f, backend="tpu")(t).cpu()
    else:
        got = f(t).cpu()
    torch.testing.assert_close(got, want, equal_nan=True)
