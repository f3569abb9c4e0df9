"""`_foreach_*` and fused optimizer lowerings.

Each call is ONE executable over the whole tensor list: a lowering below is
traced once per list signature and applies the elementwise lowering (from
`elementwise`) to every member, so `torch._foreach_add_(params, grads)` with
a hundred parameters is one dispatch, not a hundred. In-place forms
(`_foreach_add_`) derive from the functional overloads as usual.

The fused optimizer steps (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`,
`_fused_adagrad_`, what `torch.optim.*(fused=True)` calls) are lowered
in-place with `mutates=`, one executable per step, and follow PyTorch's CPU
fused kernels: float16/bfloat16 parameters compute in float32, `grad_scale`
unscales the gradients (written back, as on CPU), and `found_inf == 1`
skips the whole step.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .._compat import torch_api
from . import elementwise as ew
from . import registry
from .opmath import opmath_dtype
from .registry import LOWERINGS, out_meta
from ..runtime import executor
from ..runtime.storage import TORCH_TO_JAX, torch_dtype

aten = torch.ops.aten


def _executor_returns_none_for_void_ops() -> bool:
    """Whether the executor returns None for ops whose schema returns `()`.

    `_foreach_add_` and `_fused_adam_` return nothing; a kernel returning
    anything else makes the dispatcher raise. Unless the executor handles
    them (both for lowerings with `mutates=` and for derived in-place forms),
    registering these lowerings would break every optimizer step, so this
    module then registers nothing and the ops keep their previous path
    (decompositions or the CPU): correct, but one dispatch per tensor. That
    is a regression of the product, never a choice, so it is said out loud:
    a warning naming the cause (tests/test_ops_elementwise.py asserts ACTIVE).
    """
    try:
        op = aten._foreach_zero_.default
        spec = torch_api.pytree.tree_flatten(None)[1]
        mut = executor.Runner(op, registry.Lowering(op, None, mutates=("self",)))
        derived = executor.Runner(op, registry.Lowering(aten._foreach_zero.default, None),
                                   aten._foreach_zero.default)
        results = [r._wrap(executor.Entry(None, spec, [None], ()), [], [[]], 0)
                   for r in (mut, derived)]
    except Exception as e:  # reported below, with its cause
        _probe_failed(f"the executor probe raised {type(e).__name__}: {e}")
        return False
    if any(r is not None for r in results):
        _probe_failed(f"the executor returns {results!r} for an op returning ()")
        return False
    return True


def _probe_failed(cause: str) -> None:
    import warnings

    warnings.warn(
        "torch_tpu: the _foreach_* and fused optimizer lowerings are OFF (each "
        "optimizer step runs one op per tensor, through decompositions or the CPU): "
        f"{cause}. See torch_tpu/ops/foreach.py (_executor_returns_none_for_void_ops).",
        RuntimeWarning, stacklevel=2)


ACTIVE = _executor_returns_none_for_void_ops()


def lower(*ops, **kwargs):
    """registry.lower, while the executor can run these ops (see ACTIVE)."""
    if ACTIVE:
        return registry.lower(*ops, **kwargs)
    return lambda fn: fn


def _fn(op):
    return LOWERINGS[op].fn


def _i(x, i):
    """Element i of a 1-D `scalars` tensor (or a Python sequence)."""
    return x[i]


# -- binary: List / Scalar / ScalarList / Tensor ---------------------------------------


def _binary(name, fn, alpha=False):
    packet = getattr(aten, "_foreach_" + name)
    ovs = set(packet.overloads())

    if "List" in ovs:
        if alpha:
            def lst(self, other, *, alpha=1):
                return [fn(x, y, alpha) for x, y in zip(self, other)]
        else:
            def lst(self, other):
                return [fn(x, y) for x, y in zip(self, other)]
        lower(packet.List)(lst)

    if "Scalar" in ovs:
        def scalar(self, scalar):
            return [fn(x, scalar) for x in self]
        lower(packet.Scalar)(scalar)

    if "ScalarList" in ovs:
        def scalar_list(self, scalars):
            return [fn(x, s) for x, s in zip(self, scalars)]
        lower(packet.ScalarList)(scalar_list)

    if "Tensor" in ovs:
        if alpha:
            def tensor(self, other, *, alpha=1):
                return [fn(x, other, alpha) for x in self]
        else:
            def tensor(self, other):
                return [fn(x, other) for x in self]
        lower(packet.Tensor)(tensor)


_binary("add", ew.add, alpha=True)
_binary("sub", ew.sub, alpha=True)
_binary("mul", ew.mul)
_binary("div", ew.div)
_binary("maximum", ew.maximum)
_binary("minimum", ew.minimum)
_binary("clamp_min", ew.clamp_min)
_binary("clamp_max", ew.clamp_max)


@lower(aten._foreach_pow.List)
def _foreach_pow_list(self, exponent):
    return [ew.pow_tensor_tensor(x, e) for x, e in zip(self, exponent)]


@lower(aten._foreach_pow.Scalar)
def _foreach_pow_scalar(self, exponent):
    return [ew.pow_tensor_scalar(x, exponent) for x in self]


@lower(aten._foreach_pow.ScalarList)
def _foreach_pow_scalar_list(self, exponent):
    return [ew.pow_tensor_scalar(x, e) for x, e in zip(self, exponent)]


@lower(aten._foreach_pow.ScalarAndTensor)
def _foreach_pow_scalar_and_tensor(self, exponent):
    return [ew.pow_scalar(self, e) for e in exponent]


# -- ternary: addcmul / addcdiv / lerp ----------------------------------------------


def _pointwise(name, fn):
    packet = getattr(aten, "_foreach_" + name)

    @lower(packet.Scalar)
    def scalar(self, tensor1, tensor2, value=1):
        return [fn(x, a, b, value=value) for x, a, b in zip(self, tensor1, tensor2)]

    @lower(packet.ScalarList)
    def scalar_list(self, tensor1, tensor2, scalars):
        return [fn(x, a, b, value=s) for x, a, b, s in zip(self, tensor1, tensor2, scalars)]

    @lower(packet.Tensor)
    def tensor(self, tensor1, tensor2, scalars):
        # `scalars`: a 1-D tensor with one value per list member.
        return [fn(x, a, b, value=_i(scalars, i))
                for i, (x, a, b) in enumerate(zip(self, tensor1, tensor2))]


_pointwise("addcmul", ew.addcmul)
_pointwise("addcdiv", ew.addcdiv)


@lower(aten._foreach_lerp.List)
def _foreach_lerp_list(self, tensors1, weights):
    return [ew.lerp(x, e, w) for x, e, w in zip(self, tensors1, weights)]


@lower(aten._foreach_lerp.Scalar)
def _foreach_lerp_scalar(self, tensors1, weight):
    return [ew.lerp(x, e, weight) for x, e in zip(self, tensors1)]


@lower(aten._foreach_lerp.ScalarList)
def _foreach_lerp_scalar_list(self, tensors1, weight):
    return [ew.lerp(x, e, w) for x, e, w in zip(self, tensors1, weight)]


# -- unary ----------------------------------------------------------------------

_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc")


def _unary(name):
    fn = _fn(getattr(aten, name).default)

    def lowering(self):
        return [fn(x) for x in self]
    lowering.__name__ = "_foreach_" + name
    lower(getattr(aten, "_foreach_" + name).default)(lowering)


for _name in _UNARY:
    if hasattr(aten, "_foreach_" + _name) and getattr(aten, _name).default in LOWERINGS:
        _unary(_name)


@lower(aten._foreach_zero.default)
def _foreach_zero(self):
    return [jnp.zeros(x.shape, x.dtype) for x in self]


@lower(aten._foreach_copy.default)
def _foreach_copy(self, src, non_blocking=False):
    # The executor casts each value to self[i]'s dtype and broadcasts it to its shape.
    out = []
    for x, s in zip(self, src):
        s = jnp.asarray(s)
        if jnp.issubdtype(s.dtype, jnp.complexfloating) and not jnp.issubdtype(
                x.dtype, jnp.complexfloating):
            s = jnp.real(s)
        out.append(jnp.broadcast_to(s, x.shape))
    return out


# -- reductions -------------------------------------------------------------------


def _acc_dtype(x):
    """The dtype |x| accumulates in: the opmath type of x's real part."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.float32 if x.dtype == jnp.complex64 else jnp.float64
    return opmath_dtype(x.dtype)


@lower(aten._foreach_norm.Scalar, static=("ord",))
def _foreach_norm(self, ord=2, dtype=None):
    """Vector norms of each member. `ord` is static (part of the key): as a
    runtime value the program held all six norms of every member behind a
    switch, which took 1.8 s to compile for the tiny Llama's 21 parameters
    (clip_grad_norm_) against 0.44 s for the order it uses."""
    metas = out_meta()
    absd = []
    for x, _m in zip(self, metas):
        if dtype is not None:
            x = x.astype(TORCH_TO_JAX[dtype]) if not jnp.issubdtype(
                x.dtype, jnp.complexfloating) else x
        a = jnp.abs(x)
        absd.append(a.astype(_acc_dtype(a)).reshape(-1))
    if not absd:
        return []
    if isinstance(ord, (int, float)):
        return _norms(absd, ord)
    p = jnp.asarray(ord, jnp.float32)
    idx = jnp.select([p == jnp.inf, p == -jnp.inf, p == 0, p == 1, p == 2],
                     [0, 1, 2, 3, 4], 5)
    branches = [lambda a, p, o=o: _norms(a, o) for o in (math.inf, -math.inf, 0, 1, 2)]
    branches.append(lambda a, p: _norms(a, p))
    return lax.switch(idx, branches, absd, p)


def _norms(absd, p):
    out = []
    for a in absd:
        if isinstance(p, (int, float)) and p == math.inf:
            out.append(jnp.max(a, initial=0) if a.size == 0 else jnp.max(a))
        elif isinstance(p, (int, float)) and p == -math.inf:
            out.append(jnp.min(a) if a.size else jnp.asarray(jnp.inf, a.dtype))
        elif isinstance(p, (int, float)) and p == 0:
            out.append(jnp.sum(a != 0).astype(a.dtype))
        elif isinstance(p, (int, float)) and p == 1:
            out.append(jnp.sum(a))
        elif isinstance(p, (int, float)) and p == 2:
            out.append(jnp.sqrt(jnp.sum(a * a)))
        else:
            pa = jnp.asarray(p, a.dtype)
            out.append(jnp.sum(a ** pa) ** (1 / pa))
    return out


@lower(aten._foreach_max.default)
def _foreach_max(self):
    return [jnp.max(x) for x in self]


# -- fused optimizers --------------------------------------------------------------


def _one_minus_pow(beta, step):
    """1 - beta ** step, accurate in float32 (log(beta) taken in double)."""
    if beta <= 0:
        return jnp.where(step == 0, jnp.zeros_like(step), jnp.ones_like(step))
    return -jnp.expm1(step * jnp.asarray(math.log(beta), step.dtype))


def _skip(found_inf, new, old):
    """found_inf == 1 skips the step: keep the old value."""
    if found_inf is None:
        return new
    return jnp.where(jnp.asarray(found_inf).reshape(()) == 1, old, new.astype(old.dtype))


def _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, adamw):
    ps, gs, ms, vs, mxs = [], [], [], [], []
    for i, p0 in enumerate(self):
        dt = opmath_dtype(p0.dtype)
        p = p0.astype(dt)
        g = grads[i].astype(dt)
        if grad_scale is not None:
            g = g / jnp.asarray(grad_scale).reshape(()).astype(dt)
            gs.append(_skip(found_inf, g, grads[i]))
        else:
            gs.append(grads[i])
        if maximize:
            g = -g
        lr_ = jnp.asarray(lr).reshape(()).astype(dt)
        if weight_decay != 0:
            if adamw:
                p = p * (1 - lr_ * jnp.asarray(weight_decay, dt))
            else:
                g = g + p * jnp.asarray(weight_decay, dt)
        step = jnp.asarray(state_steps[i]).reshape(()).astype(jnp.float32)
        bc1 = _one_minus_pow(beta1, step).astype(dt)
        bc2_sqrt = jnp.sqrt(_one_minus_pow(beta2, step)).astype(dt)
        step_size = lr_ / bc1
        m = exp_avgs[i].astype(dt)
        w = 1 - beta1
        if abs(w) < 0.5:
            m = m + jnp.asarray(w, dt) * (g - m)
        else:
            m = g + jnp.asarray(w - 1, dt) * (g - m)
        v = exp_avg_sqs[i].astype(dt) * jnp.asarray(beta2, dt) + jnp.asarray(1 - beta2, dt) * g * g
        if amsgrad:
            mx = jnp.maximum(max_exp_avg_sqs[i].astype(dt), v)
            mxs.append(_skip(found_inf, mx, max_exp_avg_sqs[i]))
            denom = jnp.sqrt(mx) / bc2_sqrt + jnp.asarray(eps, dt)
        else:
            denom = jnp.sqrt(v) / bc2_sqrt + jnp.asarray(eps, dt)
        p = p - step_size * m / denom
        ps.append(_skip(found_inf, p, p0))
        ms.append(_skip(found_inf, m, exp_avgs[i]))
        vs.append(_skip(found_inf, v, exp_avg_sqs[i]))
    if not amsgrad:
        mxs = list(max_exp_avg_sqs)
    return ps, gs, ms, vs, mxs


_ADAM_MUTATES = ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")


def _adam_lowerings(name, adamw):
    inplace = getattr(aten, name + "_")
    functional = getattr(aten, name)

    def fused_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
               beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
               found_inf=None):
        outs = _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                     beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                     found_inf, adamw)
        return (), dict(zip(_ADAM_MUTATES, outs))

    def fused(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
              beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
              found_inf=None):
        return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                     beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                     found_inf, adamw)

    fused_.__name__, fused.__name__ = name + "_", name
    lower(inplace.default, inplace.tensor_lr, mutates=_ADAM_MUTATES)(fused_)
    lower(functional.default, functional.tensor_lr)(fused)


_adam_lowerings("_fused_adam", adamw=False)
_adam_lowerings("_fused_adamw", adamw=True)


def _sgd(self, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening, nesterov,
         maximize, is_first_step, grad_scale, found_inf):
    ps, gs, bufs = [], [], []
    for i, p0 in enumerate(self):
        dt = opmath_dtype(p0.dtype)
        p = p0.astype(dt)
        g = grads[i].astype(dt)
        if grad_scale is not None:
            g = g / jnp.asarray(grad_scale).reshape(()).astype(dt)
            gs.append(_skip(found_inf, g, grads[i]))
        else:
            gs.append(grads[i])
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + p * jnp.asarray(weight_decay, dt)
        if momentum != 0:
            if is_first_step:
                buf = g
            else:
                buf = (momentum_buffer_list[i].astype(dt) * jnp.asarray(momentum, dt)
                       + g * jnp.asarray(1 - dampening, dt))
            bufs.append(_skip(found_inf, buf, momentum_buffer_list[i]))
            g = g + buf * jnp.asarray(momentum, dt) if nesterov else buf
        p = p - jnp.asarray(lr).reshape(()).astype(dt) * g
        ps.append(_skip(found_inf, p, p0))
    if momentum == 0:
        bufs = list(momentum_buffer_list)
    return ps, gs, bufs


_SGD_MUTATES = ("self", "grads", "momentum_buffer_list")


@lower(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, mutates=_SGD_MUTATES)
def _fused_sgd_(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
                nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    outs = _sgd(self, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening,
                nesterov, maximize, is_first_step, grad_scale, found_inf)
    return (), dict(zip(_SGD_MUTATES, outs))


@lower(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def _fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
               nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    return _sgd(self, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening,
                nesterov, maximize, is_first_step, grad_scale, found_inf)


def _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize,
             grad_scale, found_inf):
    ps, gs, ss = [], [], []
    for i, p0 in enumerate(self):
        dt = opmath_dtype(p0.dtype)
        p = p0.astype(dt)
        g = grads[i].astype(dt)
        if grad_scale is not None:
            g = g / jnp.asarray(grad_scale).reshape(()).astype(dt)
            gs.append(_skip(found_inf, g, grads[i]))
        else:
            gs.append(grads[i])
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + p * jnp.asarray(weight_decay, dt)
        step = jnp.asarray(state_steps[i]).reshape(()).astype(dt)
        clr = jnp.asarray(lr).reshape(()).astype(dt) / (1 + (step - 1) * jnp.asarray(lr_decay, dt))
        s = state_sums[i].astype(dt) + g * g
        p = p - clr * g / (jnp.sqrt(s) + jnp.asarray(eps, dt))
        ps.append(_skip(found_inf, p, p0))
        ss.append(_skip(found_inf, s, state_sums[i]))
    return ps, gs, ss


_ADAGRAD_MUTATES = ("self", "grads", "state_sums")


@lower(aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr, mutates=_ADAGRAD_MUTATES)
def _fused_adagrad_(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                    maximize, grad_scale=None, found_inf=None):
    outs = _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps,
                    maximize, grad_scale, found_inf)
    return (), dict(zip(_ADAGRAD_MUTATES, outs))


@lower(aten._fused_adagrad.default, aten._fused_adagrad.tensor_lr)
def _fused_adagrad(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                   maximize, grad_scale=None, found_inf=None):
    return _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps,
                    maximize, grad_scale, found_inf)


# -- in-place forms ------------------------------------------------------------------
# `_foreach_add_` and friends return nothing; they are lowered explicitly with
# `mutates=("self",)` from their functional overloads (the executor's derived
# in-place path returns the written tensors, which an op returning `()` must not).


def _meta_args(x):
    if isinstance(x, dict):
        return {k: _meta_args(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_args(y) for y in x)
    if x is None or isinstance(x, (bool, int, float, complex, str, torch.dtype)):
        return x
    return ew.standin(x)


def _inplace_of(functional_op, functional):
    def lowering(*args, **kwargs):
        # PyTorch's in-place foreach kernels refuse results that cannot be cast
        # back to self's dtype (int list *= 2.5); the meta kernels do not check,
        # so check here, while tracing (nothing has been written yet).
        metas = functional_op(*_meta_args(args), **_meta_args(kwargs))
        for m, x in zip(metas, args[0]):
            want = torch_dtype(x.dtype)
            if not torch.can_cast(m.dtype, want):
                raise RuntimeError(
                    f"{functional_op}: result type {m.dtype} can't be cast to the "
                    f"desired output type {want}")
        return (), {"self": functional(*args, **kwargs)}
    lowering.__name__ = functional.__name__ + "_"
    return lowering


def _register_inplace():
    for op, low in list(LOWERINGS.items()):
        base = op._schema.name.split("::")[1]
        if not base.startswith("_foreach_") or base.endswith("_"):
            continue
        packet = getattr(aten, base + "_", None)
        ov = op._schema.overload_name or "default"
        inplace = getattr(packet, ov, None) if packet is not None else None
        if inplace is None or inplace in LOWERINGS:
            continue
        if [str(a.type) for a in inplace._schema.arguments] != [
                str(a.type) for a in op._schema.arguments]:
            continue
        lower(inplace, mutates=("self",))(_inplace_of(op, low.fn))


if ACTIVE:
    _register_inplace()


# -- meta kernels PyTorch lacks -------------------------------------------------------
# The executor runs every op on meta tensors first (shapes, dtypes, checks).
# PyTorch has no Meta kernel for some fused optimizer steps; they return
# nothing and only need their list lengths to agree.

_META_LIB = torch.library.Library("aten", "IMPL")


def _fused_step_meta(self, grads, *lists, **kwargs):
    for other in (grads,) + tuple(lists):
        if len(other) not in (0, len(self)):
            raise RuntimeError("fused optimizer step: tensor lists must have the same length")
    return None


for _op in (aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr,
            aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr,
            aten._fused_adam_.default, aten._fused_adam_.tensor_lr,
            aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(_op.name(), "Meta"):
        _META_LIB.impl(_op, _fused_step_meta, "Meta")
