"""Connectionist temporal classification (CTC) loss: `_ctc_loss` and its
backward as one scan over time each, the eager kernels that keep the
lengths as data, and the Meta kernel PyTorch lacks for the backward.
"""

from __future__ import annotations

import functools
import sys

import jax.numpy as jnp
import torch
from jax import lax

from ..registry import lower
from ._common import meta_list
from ..reductions import type_name
from .. import core

aten = torch.ops.aten


# --------------------------------------------------------------------------
# connectionist temporal classification (CTC) loss
#
# `ctc_loss` is CompositeImplicitAutograd: it calls `_ctc_loss` (IntList or
# Tensor lengths) for the per-sample negative log-likelihood and `log_alpha`,
# then applies zero_infinity and the reduction with ordinary ops. The backward
# `_ctc_loss_backward` is PyTorch's formula, eq. (16) of Graves et al.:
# grad = (exp(log_probs) - exp(log(sum alpha*beta) + nll - log_probs)) * g,
# which is the true gradient only for normalized log_probs; we reproduce it
# (and its NaNs for impossible alignments without zero_infinity) as CPU does.
# Both recursions run over the extended label sequence (blank, l1, blank, l2,
# ..., blank) as one lax.scan over time in log space.


def _ctc_neg_inf(dtype):
    return jnp.array(-jnp.inf, dtype)


def _ctc_lse3(a, b, c):
    """log(e^a + e^b + e^c) the way PyTorch's CPU kernel writes it."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, jnp.zeros((), m.dtype), m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _ctc_check(log_probs, targets, blank):
    if log_probs.dtype not in (jnp.float32, jnp.float64):
        raise NotImplementedError(
            f'"ctc_loss_cpu" not implemented for \'{type_name(log_probs.dtype)}\'')
    if not 0 <= blank < log_probs.shape[2]:
        raise RuntimeError("blank must be in label range")


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank, L):
    """Extended labels (N, L), their validity/skip masks and the emissions (T, N, L)."""
    T, N, C = log_probs.shape
    S = (L - 1) // 2
    il = jnp.asarray(input_lengths, jnp.int32).reshape(N)
    tl = jnp.asarray(target_lengths, jnp.int32).reshape(N)
    tg = targets.astype(jnp.int32)
    k = jnp.arange(S, dtype=jnp.int32)
    if S == 0:
        padded = jnp.zeros((N, 0), jnp.int32)
    elif tg.ndim == 1:
        offsets = jnp.cumsum(tl) - tl
        idx = jnp.clip(offsets[:, None] + k[None, :], 0, max(tg.shape[0] - 1, 0))
        padded = tg[idx] if tg.shape[0] else jnp.zeros((N, S), jnp.int32)
    else:
        padded = tg[:, :S]
    padded = jnp.where(k[None, :] < tl[:, None], padded, blank)
    padded = jnp.clip(padded, 0, C - 1)
    ext = jnp.full((N, L), blank, jnp.int32)
    if S:
        ext = ext.at[:, 1::2].set(padded)
    s = jnp.arange(L, dtype=jnp.int32)
    valid = s[None, :] < (2 * tl + 1)[:, None]                        # (N, L)
    prev2 = jnp.concatenate([jnp.full((N, 2), -1, jnp.int32), ext[:, :-2]], axis=1)[:, :L]
    skip = (s[None, :] > 1) & (ext != prev2)                            # s-2 -> s allowed
    emit = jnp.take_along_axis(
        log_probs, jnp.broadcast_to(ext[None], (T, N, L)), axis=2)       # (T, N, L)
    return il, tl, ext, valid, skip, emit


def _ctc_shift(x, k, fill):
    """x[..., s - k] along the last axis, `fill` where s < k."""
    if k >= x.shape[-1]:
        return jnp.full_like(x, fill)
    pad = jnp.full(x.shape[:-1] + (k,), fill, x.dtype)
    return jnp.concatenate([pad, x[..., :-k]], axis=-1)


def _ctc_alpha(emit, il, tl, valid, skip):
    T, N, L = emit.shape
    dt = emit.dtype
    ninf = _ctc_neg_inf(dt)
    s = jnp.arange(L)
    a0 = jnp.where((s[None, :] == 0) | ((s[None, :] == 1) & (tl[:, None] > 0)), emit[0], ninf)
    a0 = jnp.where(valid, a0, ninf)

    def step(a, e):
        la2 = _ctc_shift(a, 1, ninf)
        la3 = jnp.where(skip, _ctc_shift(a, 2, ninf), ninf)
        new = jnp.where(valid, _ctc_lse3(a, la2, la3) + e, ninf)
        return new, new

    if T > 1:
        _, rest = lax.scan(step, a0, emit[1:])
        alpha = jnp.concatenate([a0[None], rest], axis=0)               # (T, N, L)
    else:
        alpha = a0[None]
    t = jnp.arange(T)
    live = (t[:, None] < il[None, :])[:, :, None]
    return jnp.where(live, alpha, ninf)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, L=None):
    if L is None:
        L = tuple(meta_list()[1].shape)[2]
    T, N, _ = log_probs.shape
    lp = log_probs
    dt = lp.dtype
    ninf = _ctc_neg_inf(dt)
    if T == 0:
        il = jnp.asarray(input_lengths, jnp.int32).reshape(N)
        tl = jnp.asarray(target_lengths, jnp.int32).reshape(N)
        nll = jnp.where(tl == 0, jnp.zeros((), dt), jnp.array(jnp.inf, dt))
        return nll, jnp.full((N, 0, L), ninf, dt)
    il, tl, ext, valid, skip, emit = _ctc_setup(lp, targets, input_lengths, target_lengths,
                                                blank, L)
    alpha = _ctc_alpha(emit, il, tl, valid, skip)                       # (T, N, L)
    last = alpha[jnp.clip(il - 1, 0, T - 1), jnp.arange(N)]              # (N, L)
    l1 = jnp.take_along_axis(last, (2 * tl)[:, None], axis=1)[:, 0]
    l2 = jnp.take_along_axis(last, jnp.maximum(2 * tl - 1, 0)[:, None], axis=1)[:, 0]
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == -jnp.inf, jnp.zeros((), dt), m)
    ll = jnp.where(tl == 0, last[:, 0], jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    ll = jnp.where(il == 0, jnp.where(tl == 0, jnp.zeros((), dt), ninf), ll)
    return -ll, jnp.swapaxes(alpha, 0, 1)


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha,
                  blank, zero_infinity):
    T, N, C = log_probs.shape
    L = log_alpha.shape[2]
    lp = log_probs
    dt = lp.dtype
    if T == 0:
        return jnp.zeros_like(lp)
    ninf = _ctc_neg_inf(dt)
    il, tl, ext, valid, skip, emit = _ctc_setup(lp, targets, input_lengths, target_lengths,
                                                blank, L)
    s = jnp.arange(L)
    t_idx = jnp.arange(T)
    live = (t_idx[:, None] < il[None, :])[:, :, None]                   # (T, N, 1)
    alpha = jnp.where(live & valid[None], jnp.swapaxes(log_alpha, 0, 1).astype(dt), ninf)
    # the s -> s+2 transition into s+2 is allowed when skip[s+2]
    skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((N, min(2, L)), bool)], axis=1)[:, :L]
    end = (s[None, :] == 2 * tl[:, None]) | ((s[None, :] == 2 * tl[:, None] - 1)
                                              & (tl[:, None] > 0))

    def unshift(x, k):
        if k >= L:
            return jnp.full_like(x, ninf)
        pad = jnp.full(x.shape[:-1] + (k,), ninf, x.dtype)
        return jnp.concatenate([x[..., k:], pad], axis=-1)

    def step(b_next, xs):
        t, e = xs
        lb2 = unshift(b_next, 1)
        lb3 = jnp.where(skip_next, unshift(b_next, 2), ninf)
        rec = _ctc_lse3(b_next, lb2, lb3) + e
        init = jnp.where(end, e, ninf)
        b = jnp.where((t == il - 1)[:, None], init,
                      jnp.where((t < il - 1)[:, None], rec, ninf))
        b = jnp.where(valid, b, ninf)
        return b, b

    b_last = jnp.full((N, L), ninf, dt)
    _, beta = lax.scan(step, b_last, (t_idx, emit), reverse=True)       # (T, N, L)
    ab = alpha + beta
    # log-sum over the extended positions carrying each label, accumulated
    # pairwise in descending s as PyTorch's CPU kernel does (same rounding)
    ab_s = jnp.moveaxis(ab, 2, 0)                                       # (L, T, N)
    nn_ = jnp.arange(N)

    def acc(lcab, xs):
        cls, v = xs                                                     # (N,), (T, N)
        cur = lcab[:, nn_, cls]
        m = jnp.maximum(cur, v)
        m = jnp.where(m == -jnp.inf, jnp.zeros((), dt), m)
        new = jnp.where(cur == -jnp.inf, v, jnp.log(jnp.exp(cur - m) + jnp.exp(v - m)) + m)
        return lcab.at[:, nn_, cls].set(new), None

    lcab, _ = lax.scan(acc, jnp.full((T, N, C), ninf, dt), (ext.T, ab_s), reverse=True)
    g = grad.astype(dt).reshape(N)
    nllv = nll.astype(dt).reshape(N)
    res = (jnp.exp(lp) - jnp.exp(lcab + nllv[None, :, None] - lp)) * g[None, :, None]
    res = jnp.where(live, res, jnp.zeros((), dt))
    if zero_infinity:
        res = jnp.where((nllv == jnp.inf)[None, :, None], jnp.zeros((), dt), res)
    return res


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _ctc_check(log_probs, targets, blank)
    return _ctc_forward(log_probs, targets, list(input_lengths), list(target_lengths), blank)


@lower(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                       neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    _ctc_check(log_probs, targets, blank)
    return _ctc_backward(grad, log_probs, targets, list(input_lengths), list(target_lengths),
                         neg_log_likelihood, log_alpha, blank, zero_infinity)


def _ctc_host_lengths(input_lengths, target_lengths):
    """The Tensor overloads read the lengths to the host, as PyTorch's CPU/CUDA kernels do."""
    for name, v in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    return ([int(v) for v in input_lengths.detach().to("cpu", torch.long).reshape(-1).tolist()],
            [int(v) for v in target_lengths.detach().to("cpu", torch.long).reshape(-1).tolist()])


# In eager mode both overloads run kernels that keep the lengths as data
# inside the executable (the IntList lowering bakes them in, so every new set
# of lengths, i.e. nearly every training batch, would compile a new program;
# it stays in the table for graphs): the executable is keyed on the shapes and
# a padded number of extended states, 2 * targets.size(1) + 1 for padded
# targets, the next power of two of the longest target for concatenated ones.
# Extra states stay -inf and change no valid value; log_alpha is cut to CPU's
# 2 * max(target_lengths) + 1. PyTorch's checks run on meta tensors first.
_CTC_JAX_OPS: dict = {}


def _ctc_padded_states(targets, L):
    if targets.dim() == 2:
        return 2 * targets.shape[1] + 1
    s = (L - 1) // 2
    p = 1 << max(s - 1, 0).bit_length() if s else 0
    return 2 * max(s, min(p, targets.numel())) + 1


def _ctc_jax_op(kind, L, blank, zero_infinity):
    key = (kind, L, blank, zero_infinity)
    op = _CTC_JAX_OPS.get(key)
    if op is None:
        from ...jax_op import jax_op  # lazy: jax_op imports dynamo (the backend's load must not)

        if kind == "fwd":
            def fn(log_probs, targets, il, tl):
                return _ctc_forward(log_probs, targets, il, tl, blank, L)
        else:
            def fn(grad, log_probs, targets, il, tl, nll):
                _, log_alpha = _ctc_forward(log_probs, targets, il, tl, blank, L)
                return _ctc_backward(grad, log_probs, targets, il, tl, nll, log_alpha, blank,
                                     zero_infinity)
        op = _CTC_JAX_OPS[key] = jax_op(
            fn, name=f"ctc_loss_{kind}_L{L}_b{blank}_z{int(bool(zero_infinity))}", vjp=False)
    return op


def _ctc_meta_check(log_probs, targets, il, tl, blank, zero_infinity):
    """PyTorch's own checks (and log_alpha's size) from the IntList overload on meta."""
    meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (log_probs, targets)]
    _, la = aten._ctc_loss.default(*meta, il, tl, blank, zero_infinity)
    if not 0 <= blank < log_probs.shape[2]:
        raise RuntimeError("blank must be in label range")
    return la.shape[2]


def _ctc_lengths_on(dev, il, tl, input_lengths, target_lengths):
    if isinstance(input_lengths, torch.Tensor):
        return input_lengths.to(dev), target_lengths.to(dev)
    return (torch.tensor(il, dtype=torch.long, device=dev),
            torch.tensor(tl, dtype=torch.long, device=dev))


def _ctc_prepare(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    """CPU's checks on host lengths; (label states, lengths as device tensors)."""
    if isinstance(input_lengths, torch.Tensor):
        il, tl = _ctc_host_lengths(input_lengths, target_lengths)
    else:
        il, tl = [int(v) for v in input_lengths], [int(v) for v in target_lengths]
    L = _ctc_meta_check(log_probs, targets, il, tl, blank, zero_infinity)
    ilt, tlt = _ctc_lengths_on(log_probs.device, il, tl, input_lengths, target_lengths)
    return L, ilt, tlt


def _ctc_run_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    L, ilt, tlt = _ctc_prepare(log_probs, targets, input_lengths, target_lengths, blank,
                               zero_infinity)
    op = _ctc_jax_op("fwd", _ctc_padded_states(targets, L), blank, False)
    nll, la = op(log_probs, targets, ilt, tlt)
    if la.shape[2] != L:
        la = la[:, :, :L].contiguous()
    return nll, la


def _ctc_run_backward(grad, log_probs, targets, input_lengths, target_lengths,
                      neg_log_likelihood, log_alpha, blank, zero_infinity):
    L, ilt, tlt = _ctc_prepare(log_probs, targets, input_lengths, target_lengths, blank,
                               zero_infinity)
    op = _ctc_jax_op("bwd", _ctc_padded_states(targets, L), blank, zero_infinity)
    return op(grad, log_probs, targets, ilt, tlt, neg_log_likelihood)


def _dynamo_disabled(fn):
    """`torch._dynamo.disable(fn)`, without importing dynamo (seconds) for eager use.

    Dynamo can only be tracing once it has been imported: until then `fn`
    runs as it is, afterwards through its disabled form (made once).
    """
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call


# Eager kernels: when dynamo runs them eagerly (a graph break), their host
# code (lengths to the device) must not be traced as frames.
@_dynamo_disabled
def _ctc_loss_kernel(log_probs, targets, input_lengths, target_lengths, blank=0,
                     zero_infinity=False):
    return _ctc_run_forward(log_probs, targets, input_lengths, target_lengths, blank,
                            zero_infinity)


@_dynamo_disabled
def _ctc_loss_backward_kernel(grad, log_probs, targets, input_lengths, target_lengths,
                              neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    return _ctc_run_backward(grad, log_probs, targets, input_lengths, target_lengths,
                             neg_log_likelihood, log_alpha, blank, zero_infinity)


def _install_ctc_kernels():
    for op in (aten._ctc_loss.default, aten._ctc_loss.Tensor):
        core.KERNELS.setdefault(op, _ctc_loss_kernel)
    for op in (aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor):
        core.KERNELS.setdefault(op, _ctc_loss_backward_kernel)


_install_ctc_kernels()


# PyTorch has no Meta kernel for the CTC backward (the executor runs every op
# on meta tensors first): the gradient has log_probs' shape, contiguous.
_CTC_META_LIB = torch.library.Library("aten", "IMPL")


def _ctc_loss_backward_meta(grad, log_probs, *args, **kwargs):
    return torch.empty(log_probs.shape, dtype=log_probs.dtype, device=log_probs.device)


for _op in (aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(_op.name(), "Meta"):
        _CTC_META_LIB.impl(_op, _ctc_loss_backward_meta, "Meta")
