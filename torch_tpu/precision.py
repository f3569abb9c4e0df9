"""Matmul precision control and bfloat16 autocast for the `tpu` device.

Matmul precision
----------------

    torch.tpu.set_matmul_precision("highest")      # process-wide
    torch.tpu.get_matmul_precision()               # 'highest'
    with torch.tpu.matmul_precision("high"):       # this thread, this block
        y = a @ b

The three settings are XLA's operand precision of float32 dots and
convolutions (`PrecisionConfig`):

- 'default': fastest. On a TPU, one bfloat16 pass of the MXU (like
  `torch.set_float32_matmul_precision("medium")`); on CPU/GPU XLA uses full
  float32 anyway.
- 'high': three bfloat16 passes (about float32-with-tf32 accuracy).
- 'highest': six passes on TPU: float32 accuracy, like PyTorch on the CPU.

The initial setting follows `torch.get_float32_matmul_precision()` when
the backend loads (at the first use of the device, see torch_tpu/__init__.py;
'highest' unless changed: results match the CPU; 'medium' maps to
'default'); later calls of torch's function are not followed, use these.

It is stored as JAX's `jax_default_matmul_precision` (process-wide by
`set_matmul_precision`, per thread inside `matmul_precision`), which is read
when a program is traced: JAX code without an explicit precision follows it,
and lowerings that choose a precision themselves call `lax_precision()`. The
setting is part of every program's HLO (`operand_precision={highest,highest}`
on each dot), and `cache_token()` belongs in every executable's cache key so
that a program compiled under one setting is not reused under another.
The torch name 'medium' (= 'default') and JAX's 'bfloat16', 'tensorfloat32',
'bfloat16_3x', 'float32' are accepted as aliases.

Autocast
--------

    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = model(x)            # matmuls and convolutions in bfloat16

Ops follow the CUDA autocast policy: matmul-like ops (mm, addmm, bmm,
linear, matmul, convolutions, scaled_dot_product_attention, ...) run in the
autocast dtype; numerically sensitive ops (softmax, log_softmax, norms,
losses, exp/log, ...) run in float32; mixed-input ops (cat, stack,
addcmul, ...) run in the widest input dtype. Only floating tpu tensors
other than float64 are cast. Autocast's weight-cast cache is not used (each
op casts its inputs).
"""

from __future__ import annotations

import contextlib

import jax
import torch

try:  # the State object: reading its value is ~40 ns (cache_token is on the hot path)
    from jax._src.config import default_matmul_precision as JAX_PRECISION_STATE
except Exception:  # pragma: no cover - JAX moved it
    JAX_PRECISION_STATE = None

PRECISIONS = ("default", "high", "highest")

_ALIASES = {
    "default": "default", "medium": "default", "bfloat16": "default", "fastest": "default",
    "high": "high", "tensorfloat32": "high", "bfloat16_3x": "high",
    "highest": "highest", "float32": "highest",
}
# What each setting is handed to JAX as.
_TO_JAX = {"default": "default", "high": "high", "highest": "highest"}


def _normalize(precision) -> str:
    if isinstance(precision, jax.lax.Precision):
        precision = {jax.lax.Precision.DEFAULT: "default", jax.lax.Precision.HIGH: "high",
                     jax.lax.Precision.HIGHEST: "highest"}[precision]
    if not isinstance(precision, str) or precision.lower() not in _ALIASES:
        raise ValueError(
            f"unknown matmul precision {precision!r}; valid: "
            f"{', '.join(repr(p) for p in PRECISIONS)}")
    return _ALIASES[precision.lower()]


def set_matmul_precision(precision: str) -> None:
    """Set the float32 matmul/convolution precision of programs compiled from now on
    ('default', 'high' or 'highest'), for the whole process."""
    p = _normalize(precision)
    jax.config.update("jax_default_matmul_precision", _TO_JAX[p])


def get_matmul_precision() -> str:
    """The precision new programs get in this thread: 'default', 'high' or 'highest'."""
    raw = _raw()
    if raw is None:
        return "default"
    return _ALIASES.get(str(raw).lower(), "default")


@contextlib.contextmanager
def matmul_precision(precision: str):
    """Context manager: programs traced in this thread inside the block use `precision`."""
    p = _normalize(precision)
    with jax.default_matmul_precision(_TO_JAX[p]):
        yield p


_LAX = {"default": jax.lax.Precision.DEFAULT, "high": jax.lax.Precision.HIGH,
        "highest": jax.lax.Precision.HIGHEST}


def lax_precision():
    """The `jax.lax.Precision` of the current setting, for lowerings that pass
    `precision=` explicitly (call it while tracing, not at import)."""
    return _LAX[get_matmul_precision()]


def _from_torch() -> str:
    try:
        return _ALIASES.get(torch.get_float32_matmul_precision(), "highest")
    except Exception:  # pragma: no cover
        return "highest"


def _raw():
    if JAX_PRECISION_STATE is not None:
        return JAX_PRECISION_STATE.value
    return jax.config.jax_default_matmul_precision


def cache_token():
    """A hashable value that changes when the effective precision changes.

    Append it to every executable cache key (eager ops and graphs): programs
    traced under different settings differ in their HLO.
    """
    return _raw()


# --------------------------------------------------------------------------
# autocast

_AC = torch._C.DispatchKey.AutocastPrivateUse1
_EXCLUDE = torch._C.DispatchKeySet(_AC)

# CUDA's autocast lists (aten/src/ATen/autocast_mode.cpp), by op name.
LOWER_PRECISION_OPS = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
)
FP32_OPS = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    # "fp32_set_opt_dtype" ops: computed in float32 when given a lower-precision input.
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "sum",
    "norm", "cross_entropy_loss",
)
PROMOTE_OPS = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
    "tensordot", "scatter_add",
)

_LOW = (torch.float16, torch.bfloat16)


def _eligible(t):
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == "tpu"
            and t.dtype is not torch.float64)


def _map(tree, f):
    if isinstance(tree, torch.Tensor):
        return f(tree)
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(x, f) for x in tree)
    if isinstance(tree, dict):
        return {k: _map(v, f) for k, v in tree.items()}
    return tree


def _leaves(tree, out):
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, (list, tuple)):
        for x in tree:
            _leaves(x, out)
    elif isinstance(tree, dict):
        for x in tree.values():
            _leaves(x, out)
    return out


def _cast_to(dtype, only_low=False):
    def f(t):
        if _eligible(t) and t.dtype is not dtype and (not only_low or t.dtype in _LOW):
            return t.to(dtype)
        return t
    return f


def _lower_kernel(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("tpu")
        f = _cast_to(dtype)
        args, kwargs = _map(args, f), _map(kwargs, f)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _fp32_kernel(op):
    f = _cast_to(torch.float32, only_low=True)

    def kernel(*args, **kwargs):
        args, kwargs = _map(args, f), _map(kwargs, f)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _promote_kernel(op):
    def kernel(*args, **kwargs):
        floats = [t.dtype for t in _leaves((args, kwargs), []) if _eligible(t)]
        if floats:
            widest = floats[0]
            for d in floats[1:]:
                widest = torch.promote_types(widest, d)
            f = _cast_to(widest)
            args, kwargs = _map(args, f), _map(kwargs, f)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _overloads(name):
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    out = []
    for ov in packet.overloads():
        op = getattr(packet, ov)
        schema = op._schema
        if any(a.is_out for a in schema.arguments) or schema.name.endswith("_"):
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            continue
        out.append(op)
    return out


_libs: list = []
_AUTOCAST_OPS: dict = {}


def install_autocast() -> None:
    """Register the AutocastPrivateUse1 kernels (once)."""
    if _libs:
        return
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _libs.append(fb)
    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    for names, make, policy in ((LOWER_PRECISION_OPS, _lower_kernel, "lower"),
                                (FP32_OPS, _fp32_kernel, "fp32"),
                                (PROMOTE_OPS, _promote_kernel, "promote")):
        for name in names:
            for op in _overloads(name):
                if op in _AUTOCAST_OPS:
                    continue
                try:
                    lib.impl(op, make(op), "AutocastPrivateUse1")
                except RuntimeError:
                    continue  # already registered by someone else
                _AUTOCAST_OPS[op] = policy


def get_amp_supported_dtype():
    """The dtypes torch.autocast("tpu", dtype=...) accepts."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("tpu")


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("tpu")


# --------------------------------------------------------------------------
# torch.tpu surface


_EXPORTS = ("set_matmul_precision", "get_matmul_precision", "matmul_precision",
            "get_amp_supported_dtype", "is_bf16_supported")


def install() -> None:
    """Add the precision and autocast functions to torch.tpu; register autocast."""
    # the device module (device/module.py), registered at import; getattr: an
    # attribute torch's stubs do not know
    module = getattr(torch, "tpu")  # noqa: B009
    g = globals()
    for name in _EXPORTS:
        setattr(module, name, g[name])
    if jax.config.jax_default_matmul_precision is None:
        set_matmul_precision(_from_torch())
    install_autocast()


install()
