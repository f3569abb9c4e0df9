"""bfloat16/float16 autocast for the `tpu` device (the AutocastPrivateUse1
kernels), and the torch.tpu precision/AMP functions.

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

import torch

from ..runtime import precision

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


def _kernel(op, cast_of):
    """`op` behind autocast: its tensor arguments cast by `cast_of(args,
    kwargs)` (a function for each tensor, or None: nothing to cast), then run
    below the autocast key."""
    def kernel(*args, **kwargs):
        f = cast_of(args, kwargs)
        if f is not None:
            args, kwargs = _map(args, f), _map(kwargs, f)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _lower_kernel(op):
    """In the autocast dtype (matmuls, convolutions)."""
    return _kernel(op, lambda args, kwargs: _cast_to(torch.get_autocast_dtype("tpu")))


def _fp32_kernel(op):
    """In float32 where an input is float16/bfloat16 (numerically sensitive ops)."""
    to_fp32 = _cast_to(torch.float32, only_low=True)
    return _kernel(op, lambda args, kwargs: to_fp32)


def _widest(args, kwargs):
    floats = [t.dtype for t in _leaves((args, kwargs), []) if _eligible(t)]
    if not floats:
        return None
    widest = floats[0]
    for d in floats[1:]:
        widest = torch.promote_types(widest, d)
    return _cast_to(widest)


def _promote_kernel(op):
    """In the widest floating input dtype (mixed-input ops)."""
    return _kernel(op, _widest)


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


# (device/module.py's _BACKEND_NAMES lists the same names: asking torch.tpu
# for one before the backend loaded loads it)
_EXPORTS = {"set_matmul_precision": precision.set_matmul_precision,
            "get_matmul_precision": precision.get_matmul_precision,
            "matmul_precision": precision.matmul_precision,
            "get_amp_supported_dtype": get_amp_supported_dtype,
            "is_bf16_supported": is_bf16_supported}


def install() -> None:
    """Add the precision and autocast functions to torch.tpu; register autocast."""
    # the device module (device/module.py), registered at import; getattr: an
    # attribute torch's stubs do not know
    module = getattr(torch, "tpu")  # noqa: B009
    for name, fn in _EXPORTS.items():
        setattr(module, name, fn)
    precision.initialize()
    install_autocast()
