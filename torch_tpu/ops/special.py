"""Special-function lowerings: Bessel J/Y/K, Airy Ai, orthogonal polynomials.

These follow PyTorch's CPU kernels (ATen/native/Math.h) branch for branch,
so that results agree to rounding: the same domains, the same special cases
(n < 0, |x| == 1, x == 0, ...), the same switch from a recurrence to the
trigonometric closed form of the Chebyshev polynomials, and the same
rational and Chebyshev-series approximations. Their coefficients are the
published ones of Moshier's Cephes library, which PyTorch uses too.
Everything is computed in PyTorch's computation dtype for the inputs
(float32 for float32 and integer inputs, float64 for float64; bfloat16 and
float16, which PyTorch's CPU kernels reject, in float32).

The polynomial degree `n` is a tensor: it is converted like the CPU kernel
does (`static_cast<int64_t>` of the value in the computation dtype; NaN,
+-inf and out-of-range values become INT64_MIN, i.e. "n < 0", as on x86),
and the three-term recurrences run in one `lax.while_loop` up to the largest
degree still active, each element keeping its value once its own degree is
reached or its iterate is NaN (where PyTorch's loop stops).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
import torch

from .._compat.torch_api import ELEMENTWISE_TYPE_PROMOTION_KIND as K
from .elementwise import prep
from .opmath import opmath, upcast
from .registry import lower

aten = torch.ops.aten

_INT64_MIN = -(2 ** 63)


def _c(v, x):
    return jnp.asarray(v, x.dtype)


def _polevl(z, coeffs):
    """sum(c[i] * z**(len-1-i)) by Horner's rule, as the CPU loops (from 0)."""
    acc = jnp.zeros_like(z)
    for c in coeffs:
        acc = acc * z + _c(c, z)
    return acc


def _chbevl(y, coeffs):
    """Clenshaw's recurrence for a Chebyshev series (Cephes chbevl), as the CPU.

    Returns (b0, b2): the series value is 0.5 * (b0 - b2).
    """
    p = jnp.zeros_like(y)
    q = jnp.zeros_like(y)
    b = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p = q
        q = b
        b = y * q - p + _c(c, y)
    return b, p


def _unary(*ops):
    """Register `fn(x)` for `ops`: integer inputs as floats, half-precision
    ones in float32 (PyTorch's CPU kernels reject halves; CUDA's compute them
    in float32)."""
    def deco(fn):
        def lowering(self):
            return fn(prep(self, kind=K.INT_TO_FLOAT))
        lowering.__name__ = fn.__name__
        lower(*ops)(opmath(lowering))
        return fn
    return deco


# -- Bessel functions of the first and second kind --------------------------------

_J0_PP = (7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
          5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
          9.99999999999999997821e-01)
_J0_PQ = (9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
          5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
          1.00000000000000000218e+00)
_J0_QP = (-1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
          -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
          -5.14105326766599330220e+01, -6.05014350600728481186e+00)
_J0_QQ = (6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
          7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
          2.42005740240291393179e+02)
_J0_RP = (-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
          9.70862251047306323952e+15)
_J0_RQ = (4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
          1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
          3.18121955943204943306e+16, 1.71086294081043136091e+18)
_Y0_YP = (1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
          -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
          4.42733268572569800351e+16, -1.84950800436986690637e+16)
_Y0_YQ = (1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
          8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
          2.50596256172653059228e+17)

_J1_PP = (7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
          5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
          1.00000000000000000254e+00)
_J1_PQ = (5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
          5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
          9.99999999999999997461e-01)
_J1_QP = (5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
          3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
          2.11688757100572135698e+02, 2.52070205858023719784e+01)
_J1_QQ = (7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
          9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
          3.36093607810698293419e+02)
_J1_RP = (-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
          3.68295732863852883286e+15)
_J1_RQ = (6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
          2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
          8.95222336184627338078e+16, 5.32278620332680085395e+18)
_Y1_YP = (1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
          -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17)
_Y1_YQ = (5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
          1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
          6.87141087355300489866e+16, 3.97270608116560655612e+18)

_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_TWO_OVER_PI = 0.636619772367581343075535053490057448
_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163


def _j0_large(x, phase_sin):
    """The x > 5 asymptotic form of J0 (phase_sin False) or Y0 (True)."""
    w = _c(25.0, x) / (x * x)
    pp = _polevl(w, _J0_PP) / _polevl(w, _J0_PQ)
    qp = _c(5.0, x) / x * (_polevl(w, _J0_QP) / _polevl(w, _J0_QQ))
    t = x - _c(_PI_4, x)
    if phase_sin:
        v = pp * jnp.sin(t) + qp * jnp.cos(t)
    else:
        v = pp * jnp.cos(t) - qp * jnp.sin(t)
    return v * _c(_SQRT_2_OVER_PI, x) / jnp.sqrt(x)


def _j1_large(x, phase_sin):
    r = _c(5.0, x) / x
    w = r * r
    pp = _polevl(w, _J1_PP) / _polevl(w, _J1_PQ)
    qp = _c(5.0, x) / x * (_polevl(w, _J1_QP) / _polevl(w, _J1_QQ))
    t = x - _c(_3PI_4, x)
    if phase_sin:
        v = pp * jnp.sin(t) + qp * jnp.cos(t)
    else:
        v = pp * jnp.cos(t) - qp * jnp.sin(t)
    return v * _c(_SQRT_2_OVER_PI, x) / jnp.sqrt(x)


def _j0(x):
    x = jnp.abs(x)
    small = x <= 5
    xs = jnp.where(small, x, _c(1.0, x))
    z = xs * xs
    mid = ((z - _c(5.78318596294678452118e+00, x)) * (z - _c(3.04712623436620863991e+01, x))
           * _polevl(z, _J0_RP) / _polevl(z, _J0_RQ))
    tiny = _c(1.0, x) - x * x / _c(4.0, x)
    large = _j0_large(jnp.where(small, _c(10.0, x), x), False)
    return jnp.where(small, jnp.where(x < 1e-5, tiny, mid), large)


def _j1_pos(x):
    """J1 for x >= 0 (and NaN)."""
    small = x <= 5
    xs = jnp.where(small, x, _c(1.0, x))
    z = xs * xs
    mid = (_polevl(z, _J1_RP) / _polevl(z, _J1_RQ) * xs
           * (z - _c(1.46819706421238932572e+01, x)) * (z - _c(4.92184563216946036703e+01, x)))
    large = _j1_large(jnp.where(small, _c(10.0, x), x), False)
    return jnp.where(small, mid, large)


def _j1(x):
    return jnp.where(x < 0, -_j1_pos(-x), _j1_pos(x))


def _y0(x):
    small = x <= 5
    xs = jnp.where(small & (x > 0), x, _c(1.0, x))
    z = xs * xs
    mid = (_polevl(z, _Y0_YP) / _polevl(z, _Y0_YQ)
           + _c(_TWO_OVER_PI, x) * jnp.log(xs) * _j0(xs))
    mid = jnp.where(x == 0, _c(-jnp.inf, x), jnp.where(x < 0, _c(jnp.nan, x), mid))
    large = _j0_large(jnp.where(small, _c(10.0, x), x), True)
    return jnp.where(small, mid, large)


def _y1(x):
    small = x <= 5
    xs = jnp.where(small & (x > 0), x, _c(1.0, x))
    z = xs * xs
    mid = xs * (_polevl(z, _Y1_YP) / _polevl(z, _Y1_YQ)) + _c(_TWO_OVER_PI, x) * (
        _j1_pos(xs) * jnp.log(xs) - _c(1.0, x) / xs)
    mid = jnp.where(x == 0, _c(-jnp.inf, x), jnp.where(x < 0, _c(jnp.nan, x), mid))
    large = _j1_large(jnp.where(small, _c(10.0, x), x), True)
    return jnp.where(small, mid, large)


_unary(aten.special_bessel_j0.default)(_j0)
_unary(aten.special_bessel_j1.default)(_j1)
_unary(aten.special_bessel_y0.default)(_y0)
_unary(aten.special_bessel_y1.default)(_y1)


# -- modified Bessel functions of the second kind ------------------------------------

_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
         1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
         -5.35327393233902768720e-01)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
         2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
         -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
         2.44030308206595545468e+00)
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
         -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
         -3.53155960776544875667e-01, 1.52530022733894777053e+00)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
         -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
         1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
         2.72062619048444266945e+00)


def _i0(x):
    return jnp.exp(jnp.abs(x)) * lax.bessel_i0e(x)


def _i1(x):
    return jnp.exp(jnp.abs(x)) * lax.bessel_i1e(x)


def _k(x, order, scaled):
    """K0/K1 (scaled: times exp(x)): Chebyshev series on (0, 2] and (2, inf)."""
    small = x <= 2
    xs = jnp.where(small & (x > 0), x, _c(1.0, x))
    xl = jnp.where(small, _c(4.0, x), x)
    half = _c(0.5, x)
    if order == 0:
        b0, b2 = _chbevl(xs * xs - _c(2.0, x), _K0_A)
        lo = half * (b0 - b2) - jnp.log(half * xs) * _i0(xs)
        c0, c2 = _chbevl(_c(8.0, x) / xl - _c(2.0, x), _K0_B)
    else:
        b0, b2 = _chbevl(xs * xs - _c(2.0, x), _K1_A)
        lo = jnp.log(half * xs) * _i1(xs) + half * (b0 - b2) / xs
        c0, c2 = _chbevl(_c(8.0, x) / xl - _c(2.0, x), _K1_B)
    if scaled:
        lo = lo * jnp.exp(xs)
        hi = half * (c0 - c2) / jnp.sqrt(xl)
    else:
        hi = jnp.exp(-xl) * (half * (c0 - c2)) / jnp.sqrt(xl)
    out = jnp.where(small, lo, hi)
    out = jnp.where(x < 0, _c(jnp.nan, x), out)
    return jnp.where(x == 0, _c(jnp.inf, x), out)


_unary(aten.special_modified_bessel_k0.default)(lambda x: _k(x, 0, False))
_unary(aten.special_modified_bessel_k1.default)(lambda x: _k(x, 1, False))
_unary(aten.special_scaled_modified_bessel_k0.default)(lambda x: _k(x, 0, True))
_unary(aten.special_scaled_modified_bessel_k1.default)(lambda x: _k(x, 1, True))


# -- Airy function Ai -----------------------------------------------------------------

_AI_AN = (3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
          1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
          1.40264691163389668864e+01, 9.99999999999999995305e-01)
_AI_AD = (5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
          1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
          1.40959135607834029598e+01, 1.00000000000000000470e+00)
_AI_AFN = (-1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
           -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
           -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08)
_AI_AFD = (1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
           9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
           4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07)
_AI_AGN = (1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
           9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
           5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
           8.11789239554389293311e-08, 3.41551784765923618484e-10)
_AI_AGD = (9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
           5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
           4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
           4.91834570062930015649e-09)
_ONE_OVER_SQRT_PI = 5.64189583547756286948e-01


def _airy_series(x):
    """Ai(x) by its Maclaurin series, summed until the term is below epsilon.

    Each element stops where PyTorch's loop stops (|m / f| <= eps), so the
    rounding matches; the loop runs until every element has stopped.
    """
    eps = _c(jnp.finfo(x.dtype).eps, x)
    one = _c(1.0, x)
    z = x * x * x

    def cond(s):
        return jnp.any(s[-1])

    def body(s):
        f, g, k, m, n, active = s
        m2 = m * z
        k2 = k + one
        m2 = m2 / k2
        n2 = n * z
        k2 = k2 + one
        n2 = n2 / k2
        m2 = m2 / k2
        f2 = f + m2
        k2 = k2 + one
        n2 = n2 / k2
        g2 = g + n2
        t = jnp.abs(m2 / f2)
        upd = (f2, g2, k2, m2, n2)
        f, g, k, m, n = (jnp.where(active, a, b) for a, b in zip(upd, (f, g, k, m, n)))
        return f, g, k, m, n, active & (t > eps)

    # Only -2.09 <= x < 2.09 (and NaN) uses the series; elsewhere stop at once.
    active = ~((x < -2.09) | (x >= 2.09))
    init = (jnp.ones_like(x), x, jnp.ones_like(x), jnp.ones_like(x), x, active)
    f, g = lax.while_loop(cond, body, init)[:2]
    return _c(0.355028053887817239260, x) * f - _c(0.258819403792806798405, x) * g


def _airy_ai(x):
    neg = x < -2.09
    pos = x >= 2.09
    # x < -2.09: the oscillating asymptotic expansion.
    xn = jnp.where(neg, x, _c(-4.0, x))
    r = _c(-2.0, x) * xn * jnp.sqrt(-xn) / _c(3.0, x)
    zn = _c(1.0, x) / r
    zz = zn * zn
    afn, afd = _polevl(zz, _AI_AFN), _polevl(zz, _AI_AFD)
    agn, agd = _polevl(zz, _AI_AGN), _polevl(zz, _AI_AGD)
    t = r + _c(0.25 * math.pi, x)
    a_neg = _c(_ONE_OVER_SQRT_PI, x) / jnp.sqrt(jnp.sqrt(-xn)) * (
        jnp.sin(t) * (_c(1.0, x) + zz * afn / afd) - jnp.cos(t) * (zn * agn / agd))
    # x >= 2.09: the decaying asymptotic expansion.
    xp = jnp.where(pos, x, _c(4.0, x))
    zeta = _c(2.0, x) * xp * jnp.sqrt(xp) / _c(3.0, x)
    w = _c(1.0, x) / zeta
    a_pos = _c(_ONE_OVER_SQRT_PI, x) * (_polevl(w, _AI_AN) / _polevl(w, _AI_AD)) / (
        _c(2.0, x) * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta))
    out = jnp.where(neg, a_neg, jnp.where(pos, a_pos, _airy_series(x)))
    out = jnp.where(x > 103.892, _c(0.0, x), out)
    return jnp.where(jnp.isinf(x), _c(jnp.nan, x), out)


_unary(aten.special_airy_ai.default)(_airy_ai)


# -- orthogonal polynomials -----------------------------------------------------------


def _degree(n):
    """static_cast<int64_t>(n) of the computation-dtype value, as on x86."""
    if jnp.issubdtype(n.dtype, jnp.integer):
        return n.astype(jnp.int64)
    ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0 ** 63)
    return jnp.where(ok, jnp.trunc(jnp.where(ok, n, 0)).astype(jnp.int64),
                     jnp.asarray(_INT64_MIN, jnp.int64))


def _recurrence(n, q0, step, *, nan_stop=True):
    """q after n - 1 steps of (p, q) <- (q, step(i, p, q)), i = 0, 1, ...

    Per element: stops after its own n - 1 steps, or (nan_stop) as soon as
    q is NaN, like PyTorch's `for (k...; k <= n && !isnan(q); ...)` loops.
    """
    steps = n - 1

    def active_of(i, q):
        a = i < steps
        return a & ~jnp.isnan(q) if nan_stop else a

    def cond(s):
        i, p, q = s
        return jnp.any(active_of(i, q))

    def body(s):
        i, p, q = s
        a = active_of(i, q)
        r = step(i, p, q)
        return i + 1, jnp.where(a, q, p), jnp.where(a, r, q)

    p0 = jnp.ones_like(q0)
    init = (jnp.zeros((), jnp.int64), p0, q0)
    return lax.while_loop(cond, body, init)[2]


def _poly_prep(x, n):
    x, n = prep(x, n, kind=K.INT_TO_FLOAT)
    x, n = upcast(x), upcast(n)  # after prep: type promotion sees the half type
    x, n = jnp.broadcast_arrays(x, n)
    return x, _degree(n)


def _f(v, x):
    """An int64 (or Python int) value in x's dtype."""
    return jnp.asarray(v).astype(x.dtype) if not isinstance(v, (int, float)) else _c(v, x)


def _chebyshev_rec(y, n, q0):
    """The Chebyshev three-term recurrence in y from T/U/V/W's first degree."""
    two_y = y + y
    return _recurrence(n, q0, lambda i, p, q: two_y * q - p)


def _select_degree(n, x, q0, rec):
    one = jnp.ones_like(x)
    return jnp.where(n == 0, one, jnp.where(n == 1, q0, rec))


def _odd(n):
    return (n % 2) != 0


def _chebyshev(kind, x, n, shifted):
    """T, U, V or W of degree n at x (shifted: at 2x - 1), PyTorch's branches."""
    one = jnp.ones_like(x)
    y = x + x - _c(1.0, x) if shifted else x
    np1 = _f(n + 1, x)
    n2p1 = _f(n + n + 1, x)
    sgn = jnp.where(_odd(n), -one, one)
    # The value at the ends of the interval (x == 1 / x == -1, shifted 1 / 0).
    at_top = x == 1
    at_bottom = (x == 0) if shifted else (x == -1)
    top = {"t": one, "u": np1, "v": one, "w": n2p1}[kind]
    bottom = {"t": sgn, "u": sgn * np1, "v": sgn * n2p1, "w": sgn}[kind]
    # Inside the interval, high degrees use the trigonometric form.
    threshold = {"t": 6, "u": 8, "v": 8, "w": 8}[kind]
    if shifted:
        threshold = {"t": 6, "u": 6, "v": 6, "w": 4}[kind]
    inside = jnp.abs(y) < 1
    theta = jnp.arccos(jnp.where(inside, y, _c(0.0, x)))
    nf = _f(n, x)
    if kind == "t":
        trig = jnp.cos(nf * theta)
    elif kind == "u":
        s = jnp.sin(theta)
        trig = jnp.where(s != 0, jnp.sin(np1 * theta) / s,
                         np1 * jnp.cos(np1 * theta) / y)
    elif kind == "v":
        half = theta / _c(2.0, x)
        trig = jnp.where(jnp.sin(half) != 1,
                         jnp.cos((nf + _c(0.5, x)) * theta) / jnp.cos(half), sgn * n2p1)
    else:
        half = theta / _c(2.0, x)
        fallback = sgn if shifted else jnp.where(x > 0, n2p1, sgn)
        trig = jnp.where(jnp.cos(half) != 1,
                         jnp.sin((nf + _c(0.5, x)) * theta) / jnp.sin(half), fallback)
    q0 = {"t": y, "u": y + y, "v": y + y - one, "w": y + y + one}[kind]
    # Elements that take another branch need no recurrence steps.
    use_trig = (n > threshold) & inside
    special = (n < 0) | at_top | at_bottom | use_trig
    rec = _chebyshev_rec(y, jnp.where(special, 0, n), q0)
    out = _select_degree(n, x, q0, rec)
    out = jnp.where(use_trig, trig, out)
    out = jnp.where(at_bottom, bottom, out)
    out = jnp.where(at_top, top, out)
    return jnp.where(n < 0, _c(0.0, x), out)


def _register_chebyshev(kind, shifted, packet):
    def lowering(x, n):
        x, n = _poly_prep(x, n)
        return _chebyshev(kind, x, n, shifted)
    lowering.__name__ = packet._qualified_op_name.split("::")[-1]
    lower(packet.default, packet.x_scalar, packet.n_scalar)(lowering)


for _kind in "tuvw":
    _register_chebyshev(_kind, False, getattr(aten, f"special_chebyshev_polynomial_{_kind}"))
    _register_chebyshev(_kind, True, getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}"))


def _hermite_limit(x):
    return 128 if x.dtype == jnp.float32 else 512


@lower(aten.special_hermite_polynomial_h.default, aten.special_hermite_polynomial_h.x_scalar,
       aten.special_hermite_polynomial_h.n_scalar)
def special_hermite_polynomial_h(x, n):
    x, n = _poly_prep(x, n)
    q0 = x + x
    over = n > _hermite_limit(x)
    # H_{k+1} = 2x H_k - 2k H_{k-1}; PyTorch's loop variable is 2k (from 2).
    rec = _recurrence(jnp.where(over, 0, n), q0,
                      lambda i, p, q: q0 * q - _f(2 * i + 2, x) * p, nan_stop=False)
    out = jnp.where(over, _c(jnp.nan, x), _select_degree(n, x, q0, rec))
    return jnp.where(n < 0, _c(0.0, x), out)


@lower(aten.special_hermite_polynomial_he.default, aten.special_hermite_polynomial_he.x_scalar,
       aten.special_hermite_polynomial_he.n_scalar)
def special_hermite_polynomial_he(x, n):
    x, n = _poly_prep(x, n)
    over = n > _hermite_limit(x)
    rec = _recurrence(jnp.where(over, 0, n), x, lambda i, p, q: x * q - _f(i + 1, x) * p,
                      nan_stop=False)
    out = jnp.where(over, _c(jnp.nan, x), _select_degree(n, x, x, rec))
    return jnp.where(n < 0, _c(0.0, x), out)


@lower(aten.special_laguerre_polynomial_l.default, aten.special_laguerre_polynomial_l.x_scalar,
       aten.special_laguerre_polynomial_l.n_scalar)
def special_laguerre_polynomial_l(x, n):
    x, n = _poly_prep(x, n)
    one = _c(1.0, x)
    q0 = one - x

    def step(i, p, q):
        k = i + 1
        return ((_f(k + k, x) + q0) * q - _f(k, x) * p) / _f(k + 1, x)

    zero_x = jnp.abs(x) == 0
    rec = _recurrence(jnp.where(zero_x | (n < 0), 0, n), q0, step)
    out = _select_degree(n, x, q0, rec)
    out = jnp.where(zero_x, one, out)
    return jnp.where(n < 0, _c(0.0, x), out)


@lower(aten.special_legendre_polynomial_p.default, aten.special_legendre_polynomial_p.x_scalar,
       aten.special_legendre_polynomial_p.n_scalar)
def special_legendre_polynomial_p(x, n):
    x, n = _poly_prep(x, n)
    one = jnp.ones_like(x)

    def step(i, p, q):
        k = i + 1
        return (_f(k + k + 1, x) * x * q - _f(k, x) * p) / _f(k + 1, x)

    ends = jnp.abs(x) == 1
    rec = _recurrence(jnp.where(ends | (n < 0), 0, n), x, step)
    out = _select_degree(n, x, x, rec)
    out = jnp.where(ends, jnp.where((x > 0) | ~_odd(n), one, -one), out)
    return jnp.where(n < 0, _c(0.0, x), out)
