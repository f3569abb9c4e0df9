"""grid_sampler_2d/3d, forward and backward.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..opmath import opmath, upcast
from ..registry import lower

aten = torch.ops.aten


# --------------------------------------------------------------------------
# grid sampling


def _gs_unnormalize(coord, size, align_corners, vectorized=False):
    # CPU's 2-D kernel (vectorized) and its 3-D kernel round differently.
    if vectorized:
        sf = (size - 1) / 2 if align_corners else size / 2
        return (coord + 1) * sf if align_corners else (coord + 1) * sf - 0.5
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


_CUBIC_A = -0.75


def _gs_cubic_coeffs(t):
    A = _CUBIC_A

    def cc1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def cc2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return (cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(2.0 - t))


def _gs_cubic_coeffs_grad(t):
    A = _CUBIC_A
    x0, x1, x2, x3 = -1.0 - t, -t, 1.0 - t, 2.0 - t
    return ((-3 * A * x0 - 10 * A) * x0 - 8 * A,
            (-3 * (A + 2) * x1 - 2 * (A + 3)) * x1,
            (3 * (A + 2) * x2 - 2 * (A + 3)) * x2,
            (3 * A * x3 - 10 * A) * x3 + 8 * A)


def _gs_reflect(x, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = jnp.abs(x - lo)
    extra = jnp.fmod(x, span)
    flips = jnp.floor(x / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)


def _gs_clip(x, size):
    return jnp.minimum(jnp.asarray(size - 1, x.dtype), jnp.maximum(x, 0))


def _gs_coordinates(x, size, padding_mode, align_corners):
    """CPU's compute_coordinates: padding mode applied to a source coordinate."""
    if padding_mode == 1:  # border
        x = _gs_clip(x, size)
    elif padding_mode == 2:  # reflection
        if align_corners:
            x = _gs_reflect(x, 0, 2 * (size - 1))
        else:
            x = _gs_reflect(x, -1, 2 * size - 1)
        x = _gs_clip(x, size)
    # safe_downgrade_to_int_range: huge or non-finite coordinates read nothing.
    bad = ~jnp.isfinite(x) | (x > 2.0 ** 31 - 2) | (x < -2.0 ** 31)
    return jnp.where(bad, jnp.asarray(-100.0, x.dtype), x)


def _gs_gather(flat, sp, idxs):
    """Values of `flat` (N, C, prod(sp)) at integer positions `idxs` (each
    (N, P), last spatial dim last), and whether each is in bounds, as
    (N, C, P) values with out-of-bounds ones zero."""
    ok = None
    lin = None
    for i, L in zip(idxs, sp):
        inb = (i >= 0) & (i < L)
        ok = inb if ok is None else ok & inb
        ic = jnp.clip(i, 0, L - 1)
        lin = ic if lin is None else lin * L + ic
    v = jnp.take_along_axis(flat, lin[:, None, :], axis=2)
    return jnp.where(ok[:, None, :], v, jnp.zeros((), v.dtype))


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    # bfloat16: CPU runs its scalar kernel in bfloat16, every operation rounded;
    # the same operations on bfloat16 arrays reproduce it. float16 (like float32)
    # takes CPU's vectorized 2-D kernel, which we follow in float32.
    keep = input.dtype == jnp.bfloat16
    x = input if keep else upcast(input)
    g = grid if keep else upcast(grid)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    nsp = len(sp)
    out_sp = g.shape[1:-1]
    p = int(np.prod(out_sp)) if out_sp else 1
    flat = x.reshape(n, c, -1)
    gf = g.reshape(n, p, nsp)
    # grid's last dim is (x, y[, z]): x indexes the last spatial dim.
    coords = [gf[:, :, nsp - 1 - d] for d in range(nsp)]
    src = [_gs_unnormalize(co, L, align_corners, nsp == 2 and not keep)
           for co, L in zip(coords, sp)]
    if interpolation_mode == 2:  # bicubic (2-D only)
        iy, ix = src
        y0, x0 = jnp.floor(iy), jnp.floor(ix)
        ty, tx = iy - y0, ix - x0
        H, W = sp
        cx, cy = _gs_cubic_coeffs(tx), _gs_cubic_coeffs(ty)
        out = None
        for i in range(4):
            yy = _gs_coordinates(y0 - 1 + i, H, padding_mode, align_corners)
            row = None
            for j in range(4):
                xx = _gs_coordinates(x0 - 1 + j, W, padding_mode, align_corners)
                v = _gs_gather(flat, sp, (yy.astype(jnp.int32), xx.astype(jnp.int32)))
                term = v * cx[j][:, None, :]
                row = term if row is None else row + term
            term = row * cy[i][:, None, :]
            out = term if out is None else out + term
    else:
        src = [_gs_coordinates(s_, L, padding_mode, align_corners) for s_, L in zip(src, sp)]
        if interpolation_mode == 1:  # nearest (round half to even, like nearbyint)
            out = _gs_gather(flat, sp, [jnp.round(s_).astype(jnp.int32) for s_ in src])
        else:  # bilinear / trilinear
            lo = [jnp.floor(s_) for s_ in src]
            w1 = [s_ - f for s_, f in zip(src, lo)]
            w0 = [f + 1 - s_ for s_, f in zip(src, lo)]
            out = None
            for corner in itertools.product((0, 1), repeat=nsp):
                idx = [(f + b).astype(jnp.int32) for f, b in zip(lo, corner)]
                w = None
                for d in reversed(range(nsp)):  # x, y, z
                    wd = w1[d] if corner[d] else w0[d]
                    w = wd if w is None else w * wd
                term = _gs_gather(flat, sp, idx) * w[:, None, :]
                out = term if out is None else out + term
    return out.reshape((n, c) + tuple(out_sp))


@lower(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


def _gs_coordinates_grad(coord, size, padding_mode, align_corners, vectorized=False):
    """Source coordinate and d(coordinate)/d(grid value), with CPU's gradient
    conventions: clipping passes no gradient at or beyond the borders, and a
    reflection flips its sign."""
    sf = (size - 1) / 2 if align_corners else size / 2
    x = _gs_unnormalize(coord, size, align_corners, vectorized)
    m = jnp.full(x.shape, sf, x.dtype)
    if padding_mode == 2:
        if align_corners:
            twice_low, twice_high = 0, 2 * (size - 1)
        else:
            twice_low, twice_high = -1, 2 * size - 1
        if twice_low == twice_high:
            x, m = jnp.zeros_like(x), jnp.zeros_like(m)
        else:
            lo = twice_low / 2
            span = (twice_high - twice_low) / 2
            d = x - lo
            sign = jnp.where(d < 0, -1.0, 1.0).astype(x.dtype)
            d = jnp.abs(d)
            extra = jnp.fmod(d, span)
            even = jnp.fmod(jnp.floor(d / span), 2) == 0
            x = jnp.where(even, extra + lo, span - extra + lo)
            m = m * jnp.where(even, sign, -sign)
    if padding_mode in (1, 2):
        inside = (x > 0) & (x < size - 1)
        m = jnp.where(inside, m, jnp.zeros((), m.dtype))
        x = _gs_clip(x, size)
    bad = ~jnp.isfinite(x) | (x > 2.0 ** 31 - 2) | (x < -2.0 ** 31)
    return jnp.where(bad, jnp.asarray(-100.0, x.dtype), x), m


@lower(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
@opmath("grad_output", "input", "grid")
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                          align_corners, output_mask):
    x, g, go = input, grid, grad_output
    gi = None
    if output_mask[0]:  # linear in the input: the forward's transpose
        _, vjp = jax.vjp(lambda x_: _grid_sample(x_, g, interpolation_mode, padding_mode,
                                                 align_corners), x)
        gi = vjp(go)[0]
    if interpolation_mode == 1:  # nearest: no gradient for the grid
        return gi, jnp.zeros(g.shape, g.dtype)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    nsp = len(sp)
    p = int(np.prod(g.shape[1:-1])) if g.shape[1:-1] else 1
    flat = x.reshape(n, c, -1)
    gf = g.reshape(n, p, nsp)
    gof = go.reshape(n, c, p)
    if interpolation_mode == 2:  # bicubic, CPU's formula (taps carry no gradient)
        H, W = sp
        ix = _gs_unnormalize(gf[:, :, 0], W, align_corners, True)
        iy = _gs_unnormalize(gf[:, :, 1], H, align_corners, True)
        x0, y0 = jnp.floor(ix), jnp.floor(iy)
        cx, cy = _gs_cubic_coeffs(ix - x0), _gs_cubic_coeffs(iy - y0)
        gcx, gcy = _gs_cubic_coeffs_grad(ix - x0), _gs_cubic_coeffs_grad(iy - y0)
        gx = gy = None
        for i in range(4):
            xx = _gs_coordinates(x0 - 1 + i, W, padding_mode, align_corners)
            for j in range(4):
                yy = _gs_coordinates(y0 - 1 + j, H, padding_mode, align_corners)
                vg = _gs_gather(flat, sp, (yy.astype(jnp.int32), xx.astype(jnp.int32))) * gof
                tx_ = vg * gcx[i][:, None, :] * cy[j][:, None, :]
                ty_ = vg * gcy[j][:, None, :] * cx[i][:, None, :]
                gx = -tx_ if gx is None else gx - tx_
                gy = -ty_ if gy is None else gy - ty_
        gx, gy = jnp.sum(gx, axis=1), jnp.sum(gy, axis=1)
        sfx = (W - 1) / 2 if align_corners else W / 2
        sfy = (H - 1) / 2 if align_corners else H / 2
        gg = jnp.stack([gx * sfx, gy * sfy], axis=-1)
        return gi, gg.reshape(g.shape)
    src, mult = [], []
    for d in range(nsp):  # d indexes the spatial dims (z, y, x order)
        s_, m_ = _gs_coordinates_grad(gf[:, :, nsp - 1 - d], sp[d], padding_mode,
                                      align_corners, nsp == 2)
        src.append(s_)
        mult.append(m_)
    lo = [jnp.floor(s_) for s_ in src]
    w1 = [s_ - f for s_, f in zip(src, lo)]
    w0 = [f + 1 - s_ for s_, f in zip(src, lo)]
    acc = [None] * nsp
    for corner in itertools.product((0, 1), repeat=nsp):
        idx = [(f + b).astype(jnp.int32) for f, b in zip(lo, corner)]
        v = _gs_gather(flat, sp, idx) * gof
        for d in range(nsp):
            dw = None
            for e in reversed(range(nsp)):
                if e == d:
                    continue
                we = w1[e] if corner[e] else w0[e]
                dw = we if dw is None else dw * we
            term = v if dw is None else v * dw[:, None, :]
            term = term if corner[d] else -term
            acc[d] = term if acc[d] is None else acc[d] + term
    # grid's last dim holds x (the last spatial dim) first.
    gg = jnp.stack([jnp.sum(acc[d], axis=1) * mult[d] for d in reversed(range(nsp))], axis=-1)
    return gi, gg.reshape(g.shape)
