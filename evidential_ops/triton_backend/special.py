"""Special functions of SPEC §2 "Stable forms" as Triton device functions, from core `tl` ops.

Two sets, as in csrc/kernels/:
- float64 (the per-line finalisation, and the elements of float64 inputs): a line-for-line port of
  special_functions.h, elementary.h and evidence.h: the same recurrence shift (x -> x + 8 below 8),
  the same asymptotic series, the same cancellation-free helpers (h, v, r, the digamma/trigamma
  differences). Huge evidence is carried as a scaled argument α = a_s·2^k (`scaled_argument`).
- float32 (the elements of float32, float16 and bfloat16 inputs; SPEC §2 "Float32 element math"):
  a mirror of elementary_f32.h, special_functions_f32.h and evidence.h's float32 maps: the same
  forms, the same fits in s = ln(x/4) below 8 and series in u = 1/x from 8 on, the same branch
  point, h + 1 as the KL statistic, and the coefficients of special_f32_fits.py, which
  csrc/kernels/make_special_functions_f32.py writes in the same run as the C++ header; for exp_tanh
  evidence its functions as polynomials in t = tanh x (`element_forward_of_tanh_f32`). Element α
  beyond FLT_MAX (exp evidence with x = s/τ > 88.7) enter as ln α = x (`element_polygammas_f32`).
No libdevice: the Triton interpreter (how CI runs these) cannot execute it, and Triton has no
digamma anyway. The float32 logarithm and exponential are elementary_f32.h's, not tl.log and
tl.exp, whose GPU forms are approximations (ln x near 1, the variable of the KL statistic's fit
there, would lose its relative accuracy). Where elementary_f32.h takes the GPU's approximations in
the CUDA build (the reciprocal, the quotient, exp_f: SPEC §2 "The GPU's approximations"), the
compiled kernels take the same ones and the interpreter the IEEE forms, the CPU's.
"""

from __future__ import annotations

import math
import struct

import triton
import triton.language as tl
from triton import knobs

from .special_f32_fits import (
    DIGAMMA_ROOT_HI,
    DIGAMMA_ROOT_LO,
    FISHER_SLOPE_AT_ONE_HI,
    FISHER_SLOPE_AT_ONE_LO,
    FIT_CENTRE_F32,
    SERIES_FROM_F32,
    TANH_TRIGAMMA_ONE_HI,
    TANH_TRIGAMMA_ONE_LO,
    TRIGAMMA_ONE_HI,
    TRIGAMMA_ONE_LO,
    digamma_fit_f32,
    digamma_tail_series_f32,
    fisher_slope_fit_f32,
    fisher_slope_series_f32,
    fisher_slope_tanh_fit_f32,
    kl_h_plus_one_fit_f32,
    kl_h_plus_one_near_one_fit_f32,
    kl_h_plus_one_tanh_fit_f32,
    kl_h_tail_series_f32,
    lgamma_fit_f32,
    lgamma_tail_series_f32,
    log_trigamma_fit_f32,
    log_trigamma_tanh_fit_f32,
    log_x_trigamma_series_f32,
    remainder_fit_f32,
    remainder_series_f32,
    remainder_tanh_fit_f32,
    tetragamma_trigamma_ratio_tanh_fit_f32,
    x2_tetragamma_fit_f32,
    x2_tetragamma_series_f32,
    x_kl_v_fit_f32,
    x_kl_v_series_f32,
    x_kl_v_tanh_fit_f32,
    x_remainder_prime_fit_f32,
    x_remainder_prime_series_f32,
    x_remainder_prime_tanh_fit_f32,
    x_trigamma_fit_f32,
    x_trigamma_series_f32,
    x_trigamma_tanh_fit_f32,
)


@triton.jit
def pow2(e, like):
    """2^e exactly in float64 (e: int32 tensor, `like`: float64); 0 below the normal range (SPEC §1:
    the scaled α = a_s·2^k of huge exp evidence)."""
    ec = tl.minimum(tl.maximum(e, -1022), 1023)
    bits = (ec + 1023).to(tl.int64) << 52
    v = bits.to(tl.float64, bitcast=True)
    return tl.where(e < -1022, 0.0, v)


@triton.jit
def splat(value, like, dtype: tl.constexpr):
    """A float64 scalar argument as a tensor of `like`'s shape in `dtype` (the interpreter passes
    scalars as Python floats, the compiler as float64 values: both end up exactly here)."""
    return (tl.zeros(like.shape, tl.float64) + value).to(dtype)


@triton.jit
def log1p_(y):
    """ln(1 + y) for y >= 0, accurate for tiny y (the rounding of 1 + y is corrected)."""
    u = 1.0 + y
    correction = ((u - 1.0) - y) / u
    return tl.where(u == 1.0, y, tl.log(u) - correction)


# ----------------------------------------------------------------------------- evidence (SPEC §1)


@triton.jit
def exp_scaled(x64, CT: tl.constexpr):
    """e^x as (e_s, k) with e = e_s·2^k, e_s in CT = float64 and never overflowing (SPEC §1): x is
    reduced as x = n·ln2 + r (Cody-Waite, |r| <= ln2/2), so the only rounding is that of exp(r)
    (tl.exp of a small argument is accurate even where it is the fast hardware approximation).
    k = 0 unless e >= 2^1000."""
    nf = tl.floor(x64 * 1.4426950408889634 + 0.5)
    nf = tl.minimum(tl.maximum(nf, -1100.0), 1100.0)
    r = (x64 - nf * 6.93147180369123816490e-01) - nf * 1.90821492927058770002e-10
    p = tl.exp(r.to(CT))
    n = nf.to(tl.int32)
    k = tl.maximum(n - 1000, 0)
    return p * pow2(n - k, p), k


@triton.jit
def evidence_alpha(sv, inv_tau64, EVIDENCE: tl.constexpr, CT: tl.constexpr):
    """α = g(s/τ) + 1 as (a_s, k, rho): α = a_s·2^k, rho = g'(x)/α (SPEC §1; csrc/kernels/evidence.h)
    in CT = float64: the elements of float64 inputs, and the line targets of float32 ones (whose
    other elements take `evidence_f32`).

    EVIDENCE: 0 exp, 1 relu, 2 softplus, 3 exp_tanh (evidential_ops.config.EVIDENCE_KINDS).
    A NaN similarity stays NaN (a_s and rho), as in the C++ kernels."""
    if EVIDENCE == 0:
        x64 = sv.to(tl.float64) * inv_tau64
        e_s, k = exp_scaled(x64, CT)
        one_s = pow2(-k, e_s)
        a_s = e_s + one_s
        rho = e_s / a_s
        nan = x64 != x64
        a_s = tl.where(nan, sv.to(CT), a_s)
        rho = tl.where(nan, sv.to(CT), rho)
    else:
        x = sv.to(CT) * splat(inv_tau64, sv, CT)
        k = tl.zeros(x.shape, tl.int32)
        if EVIDENCE == 1:
            positive = x > 0.0
            a_s = tl.where(positive, x, 0.0) + 1.0
            rho = tl.where(positive, 1.0 / a_s, 0.0)
        elif EVIDENCE == 2:
            # softplus(x) = max(x, 0) + ln(1 + e^-|x|); g' = sigmoid(x)
            small = tl.exp(-tl.abs(x))
            softplus = tl.where(x > 0.0, x, 0.0) + log1p_(small)
            sigmoid = tl.where(x > 0.0, 1.0, small) / (1.0 + small)
            a_s = softplus + 1.0
            rho = sigmoid / a_s
        else:
            # q = e^{-2|x|}: tanh = ±(1 − q)/(1 + q), 1 − tanh² = 4q/(1 + q)² without cancellation
            q = tl.exp(-2.0 * tl.abs(x))
            inv = 1.0 / (1.0 + q)
            magnitude = (1.0 - q) * inv
            t = tl.where(x < 0.0, -magnitude, magnitude)
            e = tl.exp(t)
            a_s = e + 1.0
            rho = e * (4.0 * q * inv * inv) / a_s
        a_s = tl.where(x == x, a_s, x)
        rho = tl.where(x == x, rho, x)
    return a_s, k, rho


@triton.jit
def scaled_argument(a_s, k):
    """(small, xs, zz, log_z, u) of α = a_s·2^k for `polygammas_scaled`: small = α < 8 (then
    k = 0), xs = α on the small branch (1 elsewhere), zz = the series argument z scaled by 2^-k
    (z = α + 8 below 8, α above), and ln z, 1/z. One log and one division per element."""
    small = (a_s < 8.0) & (k == 0)
    xs = tl.where(small, a_s, 1.0)
    zz = tl.where(small, xs + 8.0, a_s)
    log_z = tl.log(zz) + tl.where(small, 0.0, k.to(a_s.dtype) * 0.6931471805599453)
    u = (1.0 / zz) * tl.where(small, 1.0, pow2(-k, a_s))
    return small, xs, zz, log_z, u


# ---------------------------------------------------------------- polygammas (special_functions.h)


@triton.jit
def shift_sums(x):
    """(ln P, Σ 1/(x+k), Σ 1/(x+k)², Σ 1/(x+k)³), k < 8, P = Π (x + k), for float64 x in [1, 8]
    (special_functions.h's recurrence shift, SPEC §2 "Stable forms")."""
    # Taylor-mode product (P, P', P'', P''') then its log-derivatives: one division.
    p0 = x
    p1 = tl.full(x.shape, 1.0, x.dtype)
    p2 = tl.zeros(x.shape, x.dtype)
    p3 = tl.zeros(x.shape, x.dtype)
    for k in tl.static_range(1, 8):
        t = x + k
        p3 = p3 * t + 3.0 * p2
        p2 = p2 * t + 2.0 * p1
        p1 = p1 * t + p0
        p0 = p0 * t
    inv = 1.0 / p0
    d1 = p1 * inv
    d2 = p2 * inv
    d3 = p3 * inv
    log_p = tl.log(p0)
    h1 = d1
    h2 = d1 * d1 - d2
    h3 = 0.5 * (d3 - 3.0 * d1 * d2 + 2.0 * d1 * d1 * d1)
    return log_p, h1, h2, h3


@triton.jit
def digamma_series(log_z, u):
    w = u * u
    tail = w * (1.0 / 12 - w * (1.0 / 120 - w * (1.0 / 252 - w * (1.0 / 240 - w * (1.0 / 132 - w * (
        691.0 / 32760 - w / 12))))))
    return log_z - 0.5 * u - tail


@triton.jit
def scaled_trigamma_series(u):
    """z·ψ1(z) = 1 + 1/(2z) + Σ B_2k / z^2k (k <= 9)."""
    w = u * u
    tail = 1.0 / 6 - w * (1.0 / 30 - w * (1.0 / 42 - w * (1.0 / 30 - w * (5.0 / 66 - w * (
        691.0 / 2730 - w * (7.0 / 6 - w * (3617.0 / 510 - w * (43867.0 / 798))))))))
    return 1.0 + 0.5 * u + w * tail


@triton.jit
def scaled_tetragamma_series(u):
    """z²·ψ2(z) = −1 − 1/z − Σ (2k+1) B_2k / z^2k (k <= 9)."""
    w = u * u
    tail = 0.5 - w * (1.0 / 6 - w * (1.0 / 6 - w * (3.0 / 10 - w * (5.0 / 6 - w * (
        691.0 / 210 - w * (35.0 / 2 - w * (3617.0 / 30 - w * (43867.0 / 42))))))))
    return -1.0 - u - w * tail


@triton.jit
def lgamma_series(z, log_z, u):
    w = u * u
    tail = u * (1.0 / 12 - w * (1.0 / 360 - w * (1.0 / 1260 - w * (1.0 / 1680 - w * (1.0 / 1188 - w * (
        691.0 / 360360))))))
    return (z - 0.5) * log_z - z + 0.91893853320467274178 + tail


@triton.jit
def polygammas_scaled(small, xs, zz, log_z, u):
    """ψ, ψ1, ψ2, lnΓ, x·ψ1, x²·ψ2 of α (special_functions.h `polygammas`), from `scaled_argument`
    (zz: the series argument z itself, used only by lnΓ). lnΓ is exact only where z is finite
    (always on the small branch, which is where element code reads it)."""
    log_p, h1, h2, h3 = shift_sums(xs)
    keep = tl.where(small, 1.0, 0.0).to(u.dtype)
    z_trig = scaled_trigamma_series(u)
    z2_tetra = scaled_tetragamma_series(u)
    digamma = digamma_series(log_z, u) - keep * h1
    trigamma = z_trig * u + keep * h2
    tetragamma = z2_tetra * u * u - keep * 2.0 * h3
    x_trigamma = tl.where(small, xs * trigamma, z_trig)
    x2_tetragamma = tl.where(small, xs * xs * tetragamma, z2_tetra)
    lgamma = lgamma_series(zz, log_z, u) - keep * log_p
    return digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma


@triton.jit
def plain_argument(x):
    """`scaled_argument` of an unscaled x >= 1 (line-level quantities): (small, xs, zz, log_z, u)."""
    small = x < 8.0
    xs = tl.where(small, x, 1.0)
    zz = tl.where(small, xs + 8.0, x)
    return small, xs, zz, tl.log(zz), 1.0 / zz


@triton.jit
def polygammas(x):
    small, xs, zz, log_z, u = plain_argument(x)
    return polygammas_scaled(small, xs, zz, log_z, u)


@triton.jit
def log_trigamma(small, trigamma, x_trigamma, log_z):
    """ln ψ1(x): ln(xψ1) − ln x on the series branch (ψ1 alone underflows there)."""
    return tl.log(tl.where(small, trigamma, x_trigamma)) - tl.where(small, 0.0, log_z)


@triton.jit
def kl_h(x, small, digamma, lgamma, log_z, u):
    """h(x) = (x − 1)ψ(x) − lnΓ(x) − x (SPEC §2 KL), its series above 8 (x only read below 8)."""
    poly = -3617.0 / 8160 + u * 0.0
    poly = poly * u + 3617.0 / 7650
    poly = poly * u + 1.0 / 12
    poly = poly * u - 7.0 / 78
    poly = poly * u - 691.0 / 32760
    poly = poly * u + 691.0 / 30030
    poly = poly * u + 1.0 / 132
    poly = poly * u - 5.0 / 594
    poly = poly * u - 1.0 / 240
    poly = poly * u + 1.0 / 210
    poly = poly * u + 1.0 / 252
    poly = poly * u - 1.0 / 210
    poly = poly * u - 1.0 / 120
    poly = poly * u + 1.0 / 90
    poly = poly * u + 1.0 / 12
    poly = poly * u + 1.0 / 3
    series = -0.91893853320467274178 - 0.5 * log_z - 0.5 + poly * u
    direct = (x - 1.0) * digamma - lgamma - x
    return tl.where(small, direct, series)


@triton.jit
def kl_v(x, trigamma, u):
    """(v(x), x·v(x)) with v(x) = 1 − (x − 1)ψ1(x) ≈ 1/(2x) = −h'(x) (SPEC §2 KL), float64; series
    from 16. x·v is formed from the series before its last 1/x (x itself may overflow)."""
    large = x >= 16.0
    poly = 7.0 / 6 + u * 0.0
    poly = poly * u - 7.0 / 6
    poly = poly * u - 691.0 / 2730
    poly = poly * u + 691.0 / 2730
    poly = poly * u + 5.0 / 66
    poly = poly * u - 5.0 / 66
    poly = poly * u - 1.0 / 30
    poly = poly * u + 1.0 / 30
    poly = poly * u + 1.0 / 42
    poly = poly * u - 1.0 / 42
    poly = poly * u - 1.0 / 30
    poly = poly * u + 1.0 / 30
    poly = poly * u + 1.0 / 6
    poly = poly * u + 1.0 / 3
    poly = poly * u + 1.0 / 2
    direct = 1.0 - (x - 1.0) * trigamma
    return tl.where(large, poly * u, direct), tl.where(large, poly, x * direct)


@triton.jit
def remainder_series(u):
    p = -121081664357.0 / 475517952000 + u * 0.0
    p = p * u + 574468115113.0 / 2615348736000
    p = p * u + 8115997.0 / 106444800
    p = p * u - 28932091.0 / 479001600
    p = p * u - 34253.0 / 1036800
    p = p * u + 79717.0 / 3628800
    p = p * u + 527.0 / 24192
    p = p * u - 113.0 / 12096
    p = p * u - 11.0 / 480
    p = p * u - 1.0 / 720
    p = p * u + 1.0 / 24
    p = p * u + 1.0 / 12
    return p * u


@triton.jit
def remainder_series_x_derivative(u):
    p = 12.0 * 121081664357.0 / 475517952000 + u * 0.0
    p = p * u - 11.0 * 574468115113.0 / 2615348736000
    p = p * u - 10.0 * 8115997.0 / 106444800
    p = p * u + 9.0 * 28932091.0 / 479001600
    p = p * u + 8.0 * 34253.0 / 1036800
    p = p * u - 7.0 * 79717.0 / 3628800
    p = p * u - 6.0 * 527.0 / 24192
    p = p * u + 5.0 * 113.0 / 12096
    p = p * u + 4.0 * 11.0 / 480
    p = p * u + 3.0 * 1.0 / 720
    p = p * u - 2.0 * 1.0 / 24
    p = p * u - 1.0 * 1.0 / 12
    return p * u


@triton.jit
def fisher_remainder(x, trigamma, tetragamma, u):
    """(r(x), x·r'(x)) with r(x) = 1/ψ1(x) − x + ½ (SPEC §2 logdet), float64; series from 30."""
    large = x >= 30.0
    inv_trigamma = 1.0 / trigamma
    r_prime_direct = -tetragamma * inv_trigamma * inv_trigamma - 1.0
    r = tl.where(large, remainder_series(u), inv_trigamma - x + 0.5)
    x_r_prime = tl.where(large, remainder_series_x_derivative(u), x * r_prime_direct)
    return r, x_r_prime


# ------------------------------------------------------------------- differences (line level, f64)


@triton.jit
def digamma_difference_series(a, r):
    s = a + r
    ia = 1.0 / a
    is_ = 1.0 / s
    d1 = (r * is_) * ia
    a2 = ia * ia
    s2 = is_ * is_
    d2 = d1 * (ia + is_)
    d4 = d2 * (a2 + s2)
    d6 = d2 * (a2 * a2 + a2 * s2 + s2 * s2)
    d8 = d4 * (a2 * a2 + s2 * s2)
    d10 = d2 * (a2 * a2 * a2 * a2 + a2 * a2 * a2 * s2 + a2 * a2 * s2 * s2 + a2 * s2 * s2 * s2 + s2 * s2 * s2 * s2)
    d12 = d6 * (a2 * a2 * a2 + s2 * s2 * s2)
    return (log1p_(r * ia) + 0.5 * d1 + d2 / 12.0 - d4 / 120.0 + d6 / 252.0 - d8 / 240.0 + d10 / 132.0
            - 691.0 * d12 / 32760.0)


@triton.jit
def digamma_difference(a, r):
    """ψ(a + r) − ψ(a) for a >= 1, r >= 0 without cancellation (SPEC §2.1)."""
    low = a < 10.0
    shift = tl.zeros(a.shape, a.dtype)
    for k in tl.static_range(10):
        shift += r / ((a + k) * (a + k + r))
    return digamma_difference_series(tl.where(low, a + 10.0, a), r) + tl.where(low, shift, 0.0)


@triton.jit
def trigamma_difference_series(a, r):
    s = a + r
    ia = 1.0 / a
    is_ = 1.0 / s
    d1 = -(r * is_) * ia  # 1/S − 1/a
    g = tl.full(a.shape, 1.0, a.dtype)
    s_pow = tl.full(a.shape, 1.0, a.dtype)
    total = tl.zeros(a.shape, a.dtype)
    # diff_k = S^-k − a^-k = d1·G_k, G_{k+1} = G_k/a + S^-k; weights of ψ1's series
    for k in tl.static_range(1, 14):
        diff = d1 * g
        if k == 1:
            total += diff
        elif k == 2:
            total += 0.5 * diff
        elif k == 3:
            total += diff / 6.0
        elif k == 5:
            total -= diff / 30.0
        elif k == 7:
            total += diff / 42.0
        elif k == 9:
            total -= diff / 30.0
        elif k == 11:
            total += 5.0 * diff / 66.0
        elif k == 13:
            total -= 691.0 * diff / 2730.0
        s_pow = s_pow * is_
        g = g * ia + s_pow
    return total


@triton.jit
def trigamma_difference(a, r):
    """ψ1(a + r) − ψ1(a) for a >= 1, r >= 0 (gradient of the risk at its target)."""
    low = a < 20.0
    shift = tl.zeros(a.shape, a.dtype)
    for k in tl.static_range(20):
        b = a + k
        br = b + r
        shift -= (r / br) * ((2.0 * b + r) / br) / (b * b)
    return trigamma_difference_series(tl.where(low, a + 20.0, a), r) + tl.where(low, shift, 0.0)


# ------------------------------------------------------- float32 element math (SPEC §2 "Float32 element math")


def _float32(value: float) -> float:
    """`value` rounded to float32, as a Python float (exact)."""
    return struct.unpack("f", struct.pack("f", value))[0]


# elementary_f32.h's constants, derived as it derives them (a test compares them with the header).
LN2_HI_F32 = tl.constexpr(355.0 / 512.0)  # 9 bits: n·LN2_HI_F32 is exact for |n| < 2^15
LN2_LO_F32 = tl.constexpr(_float32(math.log(2.0) - 355.0 / 512.0))
LOG2E_F32 = tl.constexpr(_float32(1.0 / math.log(2.0)))
LOG2E_LO_F32 = tl.constexpr(_float32(1.0 / math.log(2.0) - _float32(1.0 / math.log(2.0))))  # log2 e − LOG2E_F32
LN2_F32 = tl.constexpr(_float32(math.log(2.0)))
ROUND_MAGIC_F32 = tl.constexpr(1.5 * 2.0**23)  # x + magic rounds x to an integer
ROUND_MAGIC_BITS = tl.constexpr(0x4B400000)  # its bits: those of x + magic minus these are round(x)
MAX_EXP_ARG_F32 = tl.constexpr(_float32(math.log(3.4028234663852886e38)))  # exp_f: +inf above
MIN_EXP_ARG_F32 = tl.constexpr(_float32(-150.0 * math.log(2.0)))  # below: e^x rounds to 0
SQRT2_F32 = tl.constexpr(_float32(math.sqrt(2.0)))
FLT_MAX_F32 = tl.constexpr(3.4028234663852886e38)
# special_functions_f32.h's ½ ln 2π and ½ ln 2π − ½ (the constant of h + 1's series).
HALF_LOG_2PI_F32 = tl.constexpr(_float32(0.5 * math.log(2.0 * math.pi)))
HALF_LOG_2PI_MINUS_HALF_F32 = tl.constexpr(_float32(0.5 * math.log(2.0 * math.pi) - 0.5))
# Exp evidence's α in float64 beyond FLT_MAX (`evidence_f32`) reduces x up to here: e^x beyond
# DBL_MAX (x > 709.78) must come out as +inf, which e^710 = 1.24·2^1024 does, and n = ⌊x·log2 e⌋
# stays <= 1024 (where e_r <= 1.25), so that e_r·2^n's exponent bits (`alpha_f64_of_f32`) cannot
# carry into the sign.
EXP_DOUBLE_ARG_F32 = tl.constexpr(710.0)


@triton.jit
def inf_f32(like):
    """+inf as a float32 tensor of `like`'s shape, the overflow value of SPEC §2 "Float32 element math"
    (a float constant of inf cannot be written in a kernel that Inductor rebuilds from its source)."""
    return tl.full(like.shape, 0x7F800000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def inf_f64(like):
    """+inf as a float64 tensor of `like`'s shape (α beyond DBL_MAX: SPEC §1's overflow error)."""
    return tl.full(like.shape, 0x7FF0000000000000, tl.int64).to(tl.float64, bitcast=True)


# The GPU's approximations where elementary_f32.h takes them on the GPU (approx_reciprocal,
# approx_divide, exp_f), IEEE forms under the interpreter, as elementary_f32.h on the CPU. triton.jit
# binds a function to the interpreter or the compiler when it is defined, so the choice is made here
# the same way (TRITON_INTERPRET at import, INTERPRETED); the interpreter cannot run inline PTX.
INTERPRETED = bool(knobs.runtime.interpret)

if INTERPRETED:

    @triton.jit
    def approx_reciprocal_f32(b):
        """1/b for float32 b (elementary_f32.h approx_reciprocal): IEEE under the interpreter;
        compiled, rcp.approx.ftz (within 1 ulp for |b| <= 2^126, 0 beyond)."""
        return 1.0 / b

    @triton.jit
    def approx_div_f32(a, b):
        """a/b for float32 a, b (elementary_f32.h approx_divide): IEEE under the interpreter;
        compiled, a·rcp.approx(b) (within 2 ulp for |b| <= 2^126, 0 beyond)."""
        return a / b

    @triton.jit
    def exp_f32(x):
        """exp(x) for float32 x (elementary_f32.h exp_f; below 1 ulp under the interpreter, within 3
        ulp compiled; SPEC §2 "Float32 element math")."""
        e_r, n = exp_reduction_f32(x)
        return exp_from_reduction_f32(x, e_r, n)

    @triton.jit
    def exp_and_quadruple_f32(x):
        """(e^x, 4·e^x) for float32 x <= 0 (exp_tanh's q = e^{-2|x|} and 4q): 4e^x from the same
        reduction with 2^(n + 2), rounded once, so that 4q keeps float32's relative precision where q
        itself is subnormal (ρ = e·4q/((1 + q)²α) is normal down to q = FLT_MIN/2.93); e^x as
        `exp_f32` (compiled: 4e^x from ex2.approx(hi + 2), which flushes only below 2^-126)."""
        e_r, n = exp_reduction_f32(x)
        return exp_from_reduction_f32(x, e_r, n), exp_from_reduction_f32(x, e_r, n + 2)

    @triton.jit
    def rounded_product_f32(a, b):
        """a·b rounded to float32, never contracted into a later addition (the interpreter does not
        contract; compiled: mul.rn, which neither LLVM nor ptxas fuses)."""
        return a * b

    @triton.jit
    def exp2_fraction_f32(f):
        """2^f for float32 f in [0, 1] (`exp_reduction_ex2_f32`'s fraction): correctly rounded here
        (float64 exp2, rounded once), ex2.approx.ftz compiled (within 2 ulp)."""
        return tl.exp2(f.to(tl.float64)).to(tl.float32)

else:

    @triton.jit
    def approx_reciprocal_f32(b):
        """1/b for float32 b (elementary_f32.h approx_reciprocal): rcp.approx.ftz, within 1 ulp for
        |b| <= 2^126, 0 beyond (IEEE under the interpreter)."""
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [b], dtype=tl.float32,
                                         is_pure=True, pack=1)

    @triton.jit
    def approx_div_f32(a, b):
        """a/b for float32 a, b (elementary_f32.h approx_divide): a·rcp.approx(b), within 2 ulp for
        |b| <= 2^126, 0 beyond (IEEE under the interpreter)."""
        return a * approx_reciprocal_f32(b)

    @triton.jit
    def exp_f32(x):
        """exp(x) for float32 x (elementary_f32.h exp_f on the GPU; SPEC §2 "Float32 element math"):
        2^(hi + lo) as ex2.approx(hi)·(1 + lo·ln 2), within 3 ulp; +inf from x ≈ 88.72, results
        below 2^-126 flushed to 0 (the polynomial form under the interpreter)."""
        x = tl.maximum(x, MIN_EXP_ARG_F32 - 64.0)
        hi = x * LOG2E_F32
        lo = tl.fma(x, LOG2E_F32, -hi) + x * LOG2E_LO_F32
        p = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [hi], dtype=tl.float32,
                                      is_pure=True, pack=1)
        return tl.where(p < inf_f32(p), tl.fma(p, lo * LN2_F32, p), p)

    @triton.jit
    def exp_and_quadruple_f32(x):
        """(e^x, 4·e^x) for float32 x <= 0 (exp_tanh's q = e^{-2|x|} and 4q), `exp_f32`'s form with
        one ex2.approx: where hi = x·log2 e <= −1, p = ex2.approx(hi + 2) (hi + 2 exact: 2 is a
        multiple of hi's ulp and |hi + 2| <= |hi|) is 4e^x, normal down to e^x = 2^-128, where ex2(hi)
        flushed everything below 2^-126 (ρ = e·4q/((1 + q)²α) is normal down to q = FLT_MIN/2.93);
        e^x = p/4 (exact where normal; a flushed or rounded subnormal q only enters 1 ± q). For
        hi > −1, p = ex2.approx(hi) as in `exp_f32`, and 4e^x = 4p."""
        x = tl.maximum(x, MIN_EXP_ARG_F32 - 64.0)
        # hi rounded once (mul.rn): contracted into hi + 2 (fma(x, log2 e, 2)) it would be rounded
        # again below lo's, which then counts that part twice (up to 22 units of 2^-23 at hi ≈ −126)
        hi = rounded_product_f32(x, LOG2E_F32)
        lo = tl.fma(x, LOG2E_F32, -hi) + x * LOG2E_LO_F32
        shift = hi <= -1.0
        p = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [tl.where(shift, hi + 2.0, hi)],
                                      dtype=tl.float32, is_pure=True, pack=1)
        p = tl.fma(p, lo * LN2_F32, p)  # x <= 0: p <= 4, never +inf
        return tl.where(shift, p * 0.25, p), tl.where(shift, p, p * 4.0)

    @triton.jit
    def rounded_product_f32(a, b):
        """a·b rounded to float32, never contracted into a later addition: mul.rn.f32, which neither
        LLVM (inline PTX) nor ptxas (.rn) fuses (a plain product under the interpreter)."""
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)

    @triton.jit
    def exp2_fraction_f32(f):
        """2^f for float32 f in [0, 1] (`exp_reduction_ex2_f32`'s fraction): ex2.approx.ftz, within 2
        ulp (correctly rounded under the interpreter)."""
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [f], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def pow2_f32(e):
    """2^e as float32 for int32 e in [−126, 127] (elementary_f32.h float_of((e + 127) << 23); SPEC §2
    "Float32 element math")."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def exp_reduction_f32(x):
    """(e_r, n) with e^xc = e_r·2^n, xc = x clamped to [MIN_EXP_ARG_F32, MAX_EXP_ARG_F32], e_r in
    [0.7, 1.42] float32 and n int32: elementary_f32.h exp_f's reduction (Cody-Waite, 9-bit ln 2) and
    Taylor polynomial (truncation below 5.3e-9 relative), SPEC §2 "Float32 element math"."""
    xc = tl.minimum(tl.maximum(x, MIN_EXP_ARG_F32), MAX_EXP_ARG_F32)
    n = (xc * LOG2E_F32 + ROUND_MAGIC_F32) - ROUND_MAGIC_F32  # round(x / ln 2), exact
    r = (xc - n * LN2_HI_F32) - n * LN2_LO_F32  # |r| <= 0.347
    p = 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    return 1.0 + (r + r * r * p), n.to(tl.int32)


@triton.jit
def exp_from_reduction_f32(x, e_r, n):
    """e^x in float32 from `exp_reduction_f32(x)`: +inf above MAX_EXP_ARG_F32, 0 below
    MIN_EXP_ARG_F32, subnormal results rounded once (2^n applied as two normal factors),
    elementary_f32.h exp_f (SPEC §2 "Float32 element math")."""
    # n >> 1 (floor) where C++ has n / 2 (truncation): both split 2^n into two normal factors, and
    # e_r·2^half is exact either way, so the product rounds once to the same value.
    half = n >> 1
    result = (e_r * pow2_f32(half)) * pow2_f32(n - half)
    result = tl.where(x > MAX_EXP_ARG_F32, inf_f32(x), result)
    return tl.where(x < MIN_EXP_ARG_F32, 0.0, result)


@triton.jit
def exp_reduction_ex2_f32(x):
    """`exp_reduction_f32` in the GPU's form (SPEC §2 "The GPU's approximations"), exp evidence's
    e^x: (e_r, n) with e^xc = e_r·2^n, xc = x clamped to [MIN_EXP_ARG_F32, EXP_DOUBLE_ARG_F32] (α
    beyond FLT_MAX is formed in float64 from e_r and n: `alpha_f64_of_f32`), n = ⌊xc·log2 e⌋
    int32 and e_r = 2^(hi − n)·(1 + lo·ln 2), hi + lo = xc·log2 e to twice float32's precision: one
    ex2.approx (2 ulp) where the Taylor form takes seven FMAs, and n from the rounding's bits
    instead of a conversion. |lo| <= 2^-13.7 (hi <= 1024): e_r lies in [1, 2] up to 2^-14 relative
    and the omitted (lo·ln 2)²/2 is below 2^-29 of it. Under the interpreter 2^f is correctly rounded."""
    xc = tl.minimum(tl.maximum(x, MIN_EXP_ARG_F32), EXP_DOUBLE_ARG_F32)
    # hi rounded once, as lo takes it: a product contracted into hi − n would count its rounding twice
    hi = rounded_product_f32(xc, LOG2E_F32)
    lo = tl.fma(xc, LOG2E_F32, -hi) + xc * LOG2E_LO_F32
    # ⌊hi⌋ as hi − ½ rounded to an integer: the fraction hi − n lies in [0, 1] (1 where a tie rounds
    # hi − ½ down; down to −2^-25 where hi is within 2^-25 below 0), exact but for hi in (−½, 0),
    # where hi + 1 rounds by up to 2^-25 (0.17 units of 2^-23 in e, where e/α <= ½).
    shifted = (hi - 0.5) + ROUND_MAGIC_F32
    p = exp2_fraction_f32(hi - (shifted - ROUND_MAGIC_F32))
    n = shifted.to(tl.int32, bitcast=True) - ROUND_MAGIC_BITS
    return tl.fma(p, lo * LN2_F32, p), n


@triton.jit
def exp_from_reduction_ex2_f32(e_r, n):
    """e_r·2^n in float32 for `exp_reduction_ex2_f32`'s (e_r, n) as one product: 2^n from its bits
    with n clamped to [−127, 128], whose ends are 0 and +inf. With e_r in [1, 2] (up to 2^-14) the
    normal results are those of n in [−126, 127]: +inf where the product exceeds FLT_MAX (from
    x ≈ 88.72), 0 for n <= −127 (results below 2^-126 flushed, as the GPU's exp_f32 flushes them)."""
    power = ((tl.minimum(tl.maximum(n, -127), 128) + 127) << 23).to(tl.float32, bitcast=True)
    return e_r * power


@triton.jit
def _log_mantissa_f32(x):
    """(k, m) with ln x = k·ln 2 + m for finite normal x > 0: elementary_f32.h log_f's reduction
    (mantissa in [0.707, 1.414]) and its series ln(1 + f) = 2 atanh(f/(2 + f)), m = ln(1 + f)."""
    bits = x.to(tl.int32, bitcast=True)
    biased = bits >> 23
    mantissa = ((bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)  # [1, 2)
    high = mantissa > SQRT2_F32
    mantissa = tl.where(high, mantissa * 0.5, mantissa)
    k = (biased - 127 + high.to(tl.int32)).to(tl.float32)
    f = mantissa - 1.0  # exact
    s = approx_div_f32(f, 2.0 + f)
    z = s * s
    big_r = 2.0 / 11.0
    big_r = big_r * z + 2.0 / 9.0
    big_r = big_r * z + 2.0 / 7.0
    big_r = big_r * z + 2.0 / 5.0
    big_r = big_r * z + 2.0 / 3.0
    big_r = big_r * z
    half_f_sq = 0.5 * f * f
    return k, f - (half_f_sq - s * (half_f_sq + big_r))


@triton.jit
def log_f32(x):
    """ln(x) for finite, normal float32 x > 0 (elementary_f32.h log_f; below 1 ulp)."""
    k, m = _log_mantissa_f32(x)
    # k·LN2_HI_F32 is exact (k has at most 8 bits, LN2_HI_F32 9); the small parts are added first.
    return k * LN2_HI_F32 + (m + k * LN2_LO_F32)


@triton.jit
def log_and_quarter_log_f32(x):
    """(ln x, ln(x/4)) for finite float32 x >= 2^-124, the logarithm and the fits' variable s of SPEC
    §2 "Float32 element math": the values of log_f(x) and log_f(x·¼) in elementary_f32.h, bit for bit,
    from one reduction (x and x/4 share their mantissa, so only the exponent k differs: k − 2)."""
    tl.static_assert(FIT_CENTRE_F32 == 4.0, "the fits' variable ln(x/c) is taken as ln x's reduction with k − 2")
    k, m = _log_mantissa_f32(x)
    k4 = k - 2.0
    return k * LN2_HI_F32 + (m + k * LN2_LO_F32), k4 * LN2_HI_F32 + (m + k4 * LN2_LO_F32)


@triton.jit
def log1p_f32(y):
    """ln(1 + y) for float32 y >= 0, the rounding of 1 + y corrected (elementary_f32.h log1p_f; SPEC
    §1's softplus)."""
    u = 1.0 + y
    correction = approx_div_f32((u - 1.0) - y, u)
    return tl.where(u == 1.0, y, log_f32(u) - correction)


@triton.jit
def evidence_f32(x, EVIDENCE: tl.constexpr):
    """The evidence maps of SPEC §1 in float32 at x = s·(1/τ) (a float32 product): (α, ρ, e_r, n,
    beyond, t), α = g(x) + 1 and ρ = g'(x)/α as evidence.h's evidence_value<kKind>(float x), and for
    exp_tanh t = tanh x, the variable of its α's functions (`element_forward_of_tanh_f32`; 0 for the
    other maps).

    exp evidence beyond FLT_MAX (beyond: e^x rounds to +inf, x >= 88.7228) gives α = +inf and ρ = 1,
    as in C++; there
    e^x = e_r·2^n (e_r float32, n int32; n > 1023 where e^x exceeds double too), from the same
    reduction as α itself, which `alpha_f64_of_f32` turns into the float64 α exactly and ln α = x feeds the
    series (`element_polygammas_f32`). Other kinds: beyond is false, e_r and n unused. A NaN x stays
    NaN in α and ρ."""
    t = tl.zeros(x.shape, tl.float32)
    if EVIDENCE == 0:
        e_r, n = exp_reduction_ex2_f32(x)
        e = exp_from_reduction_ex2_f32(e_r, n)
        alpha = e + 1.0
        # e^x rounds to +inf from x = MAX_EXP_ARG_F32 itself (e^x exceeds FLT_MAX from 88.7228391)
        beyond = e == inf_f32(e)
        # e/α = 1 to float32 precision from α = 2^126 on (the approximate quotient stops there), and
        # inf/inf would be NaN
        rho = tl.where(alpha < 8.507059173023462e37, approx_div_f32(e, alpha), 1.0)
    else:
        e_r = x
        n = tl.zeros(x.shape, tl.int32)
        beyond = tl.full(x.shape, 0, tl.int1)
        if EVIDENCE == 1:
            positive = x > 0.0
            alpha = tl.where(positive, x, 0.0) + 1.0
            rho = tl.where(positive, approx_div_f32(1.0, alpha), 0.0)
        elif EVIDENCE == 2:
            # softplus(x) = max(x, 0) + ln(1 + e^-|x|), exact for every x; g' = sigmoid(x)
            small = exp_f32(-tl.abs(x))
            softplus = tl.where(x > 0.0, x, 0.0) + log1p_f32(small)
            sigmoid = approx_div_f32(tl.where(x > 0.0, 1.0, small), 1.0 + small)
            alpha = softplus + 1.0
            rho = approx_div_f32(sigmoid, alpha)
        else:
            # q = e^{-2|x|}: tanh = ±(1 − q)/(1 + q), 1 − tanh² = 4q/(1 + q)² without cancellation
            # 4q formed by the exponential itself (`exp_and_quadruple_f32`): q is subnormal from
            # |x| = 43.67 while ρ stays normal up to 44.2 (x > 0; 43.70 for x < 0), and the GPU's
            # ex2.approx.ftz flushes a subnormal q to 0 (ρ = 0, a relative error of 1)
            q, q4 = exp_and_quadruple_f32(-2.0 * tl.abs(x))
            inv = approx_div_f32(1.0, 1.0 + q)
            magnitude = (1.0 - q) * inv
            t = tl.where(x < 0.0, -magnitude, magnitude)
            e = exp_f32(t)
            alpha = e + 1.0
            rho = approx_div_f32(e * (q4 * inv * inv), alpha)
    alpha = tl.where(x == x, alpha, x)
    rho = tl.where(x == x, rho, x)
    return alpha, rho, e_r, n, beyond, t


@triton.jit
def ldexp_f64(v, n):
    """v·2^n in float64 by the exponent bits, no multiplication (SPEC §2 "Float32 element math": no
    float64 product per element): v > 0 normal with a normal result or one beyond DBL_MAX (then
    +inf); a NaN v stays NaN."""
    bits = v.to(tl.int64, bitcast=True)
    biased = (bits >> 52) & 0x7FF
    n64 = n.to(tl.int64)
    out = (bits + (n64 << 52)).to(tl.float64, bitcast=True)
    out = tl.where(biased + n64 > 2046, inf_f64(v), out)
    return tl.where(v == v, out, v)


@triton.jit
def alpha_f64_of_f32(alpha, e_r, n, beyond):
    """α in float64 from `evidence_f32`'s (α, e_r, n, beyond) without a float64 product (SPEC §2
    "Float32 element math"): α widened, or beyond FLT_MAX e_r·2^n (+inf beyond DBL_MAX; α = e^x + 1
    is e^x there to float64's precision). `ldexp_f64` of one float64 value for both: its exponent
    bits plus n (0 where not beyond), and the overflow test on the bits alone: e_r·2^n <= 2^(x·log2 e)
    up to e_r's error, x <= EXP_DOUBLE_ARG_F32, so the exponent field reaches 2047 at most and cannot
    carry into the sign. A NaN α stays NaN (not beyond: its
    exponent gets 0)."""
    m = tl.where(beyond, n, 0)
    bits = tl.where(beyond, e_r, alpha).to(tl.float64).to(tl.int64, bitcast=True) + (m.to(tl.int64) << 52)
    out = bits.to(tl.float64, bitcast=True)
    # the exponent field alone: the high word of the bits
    return tl.where(beyond & ((bits >> 32).to(tl.int32) >= 0x7FF00000), inf_f64(out), out)


@triton.jit
def refined_alpha_f64(s, inv_tau64, EVIDENCE: tl.constexpr):
    """α in float64 of a line's target at x = s/τ with no float64 product or FMA (csrc/kernels/
    evidence.h rare_evidence, SPEC §2 "Float32 element math"): x = hi + lo as two float32 (hi =
    s·float(1/τ) rounded once, lo its rounding error by an FMA plus s·(1/τ − float(1/τ))), the float32
    map at hi (`evidence_f32`) refined to first order, α + α·ρ·lo (α' = g' = ρ·α: the product in
    float32, the sum in float64), or beyond FLT_MAX (exp evidence) e_r·(1 + lo)·2^n with 2^n in the
    exponent bits (`alpha_f64_of_f32`). Its error is the float32 map's, not hi's |x|·2^-24 more (the
    risk is a ratio of the target's α to the rest of the line). Relu and softplus keep α = +inf where
    x itself leaves float32 (|s|/τ > 3.4e38)."""
    inv_tau_hi = inv_tau64.to(tl.float32)
    inv_tau_lo = (inv_tau64 - inv_tau_hi.to(tl.float64)).to(tl.float32)
    hi = rounded_product_f32(s, inv_tau_hi)
    lo = tl.fma(s, inv_tau_hi, -hi) + s * inv_tau_lo
    alpha, rho, e_r, n, beyond, _t = evidence_f32(hi, EVIDENCE)
    refined = alpha.to(tl.float64) + (alpha * rho * lo).to(tl.float64)
    far = alpha_f64_of_f32(alpha, tl.fma(e_r, lo, e_r), n, beyond)
    return tl.where(beyond, far, refined)


@triton.jit
def scaled_square_f64(a_m, a_k):
    """(α·2^-511)² in float64, the MSE statistic's element (SPEC §2 mse; line_terms.h kSquareScale), of
    α = a_m·2^a_k (a_m float32 >= 0.7, a_k int32 >= 0, a_m >= 1 where a_k = 0): the mantissa squared
    in float32 (one rounding, 2^-24 relative), its exponent set by the bits. NaN stays NaN."""
    bits = a_m.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)  # [1, 2)
    out = ldexp_f64((m * m).to(tl.float64), 2 * (e + a_k) - 1022)
    return tl.where(a_m == a_m, out, a_m.to(tl.float64))


@triton.jit
def split_f64(v):
    """(m, k) with v = m·2^k, m float32 in [0.5, 1] (the float64 mantissa rounded) and k int32, for a
    finite float64 v >= 0 (SPEC §2 "Float32 element math": 1/S of a line, S up to DBL_MAX; 0 gives
    k below −2000, so that a product with it is flushed to 0)."""
    bits = v.to(tl.int64, bitcast=True)
    subnormal = ((bits >> 52) & 0x7FF) == 0
    # A subnormal v is its mantissa bits times 2^-1074: those bits as a double (an exact conversion).
    v = tl.where(subnormal, (bits & 0xFFFFFFFFFFFFF).to(tl.float64), v)
    bits = v.to(tl.int64, bitcast=True)
    k = ((bits >> 52) & 0x7FF).to(tl.int32) - 1022 - tl.where(subnormal, 1074, 0)
    m = ((bits & 0xFFFFFFFFFFFFF) | (1022 << 52)).to(tl.float64, bitcast=True).to(tl.float32)
    return m, k


@triton.jit
def scaled_product_f32(a_m, a_k, b_m, b_k):
    """(a_m·2^a_k)·(b_m·2^b_k) in float32 for a result <= 1 (a probability α/S of SPEC §2): the
    mantissas multiplied (one rounding), the power of two applied as two normal factors. A result
    below 2^-124 is 0: it is below any float32 quantity it is added to."""
    e = a_k + b_k
    ec = tl.minimum(tl.maximum(e, -252), 252)
    half = ec >> 1
    p = ((a_m * b_m) * pow2_f32(half)) * pow2_f32(ec - half)
    return tl.where(e < -252, 0.0, p)


@triton.jit
def _fill_polygammas_f32(x, series, s, log_z, inv_z):
    """ψ, lnΓ, xψ1, x²ψ2 of both branches from the reduction (special_functions_f32.h
    fill_polygammas; x read only on the fitted branch)."""
    x_fit = tl.where(series, 1.0, x)  # keeps the discarded fit lanes finite
    u = inv_z
    z = tl.where(series, x, SERIES_FROM_F32)
    digamma_series = log_z - digamma_tail_series_f32(u)
    # x(ln x − 1) first: it overflows only where lnΓ itself does.
    lgamma_series = z * (log_z - 1.0) - 0.5 * log_z + (HALF_LOG_2PI_F32 + lgamma_tail_series_f32(u))
    digamma_factor = (x_fit - DIGAMMA_ROOT_HI) - DIGAMMA_ROOT_LO
    lgamma_factor = (x_fit - 1.0) * (x_fit - 2.0)
    digamma = tl.where(series, digamma_series, digamma_factor * digamma_fit_f32(s))
    lgamma = tl.where(series, lgamma_series, lgamma_factor * lgamma_fit_f32(s))
    x_trigamma = tl.where(series, x_trigamma_series_f32(u), x_trigamma_fit_f32(s))
    x2_tetragamma = tl.where(series, x2_tetragamma_series_f32(u), x2_tetragamma_fit_f32(s))
    return digamma, lgamma, x_trigamma, x2_tetragamma


@triton.jit
def element_polygammas_f32(x, beyond, log_x):
    """special_functions_f32.h polygammas(x) for float32 x >= 1 (+inf gives the x → ∞ limits of
    every scaled function), or where `beyond`, polygammas_of_log(log_x) for α = e^log_x beyond
    FLT_MAX (x = +inf there): SPEC §2 "Float32 element math". Returns (series, s, log_z, inv_z, ψ,
    lnΓ, xψ1, x²ψ2): the branch (x >= 8: series in u = 1/x), s = ln(x/4) on the fitted branch,
    ln x, 1/x, and the four functions (those a caller does not read cost nothing once compiled).

    Beyond FLT_MAX, u = 1/x is 0 here where polygammas_of_log takes exp(−log_x) (below 2^-128,
    subnormal up to log_x = 104): each series is its u → 0 limit then, which is its float32 value
    for all but the functions that are themselves O(u) (r, x·r'), and those enter the losses only
    beside terms of order one ((N − 1)/2 in the logdet, the logdet ratio in its gradient)."""
    series = x >= SERIES_FROM_F32
    xf = tl.where(x < inf_f32(x), x, FLT_MAX_F32)  # finite_argument: its series limits are exact
    log_z, log_quarter = log_and_quarter_log_f32(xf)  # x/4: exact
    s = tl.where(series, 0.0, log_quarter)
    log_z = tl.where(beyond, log_x, log_z)
    inv_z = approx_div_f32(1.0, x)
    digamma, lgamma, x_trigamma, x2_tetragamma = _fill_polygammas_f32(x, series, s, log_z, inv_z)
    return series, s, log_z, inv_z, digamma, lgamma, x_trigamma, x2_tetragamma


@triton.jit
def polygammas_f32(x):
    """special_functions_f32.h polygammas(x), x >= 1 float32: `element_polygammas_f32` without the
    log-space entry (SPEC §2 "Float32 element math")."""
    return element_polygammas_f32(x, tl.full(x.shape, 0, tl.int1), x)


@triton.jit
def kl_h_plus_one_f32(x, series, s, log_z, inv_z):
    """h(x) + 1, h(x) = (x − 1)ψ(x) − lnΓ(x) − x (SPEC §2 KL; the float32 KL statistic, SPEC §2
    "Float32 element math"): special_functions_f32.h kl_h_plus_one, from `element_polygammas_f32`'s
    reduction. Series: −½ ln x − (½ ln 2π − ½) + H(1/x)."""
    series_value = (kl_h_tail_series_f32(inv_z) - HALF_LOG_2PI_MINUS_HALF_F32) - 0.5 * log_z
    x_fit = tl.where(series, 1.0, x)
    # Below 2 the fit's variable is ln x, exact near 1 (no bias for the KL to add up); above, ln(x/4).
    near_one = kl_h_plus_one_near_one_fit_f32(tl.where(x_fit < 2.0, log_z, 0.0))
    fit = (x_fit - 1.0) * tl.where(x_fit < 2.0, near_one, kl_h_plus_one_fit_f32(s))
    return tl.where(series, series_value, fit)


@triton.jit
def x_kl_v_f32(series, s, inv_z):
    """x·v(x), v(x) = 1 − (x − 1)ψ1(x) = −h'(x) ∈ (½, 1] (SPEC §2 KL gradient), float32:
    special_functions_f32.h x_kl_v."""
    return tl.where(series, x_kl_v_series_f32(inv_z), x_kl_v_fit_f32(s))


@triton.jit
def log_trigamma_f32(x, series, s, log_z, inv_z):
    """ln ψ1(x) (SPEC §2 logdet), float32: (x − x1)·P(s) below 8, L(1/x) − ln x from 8 on
    (special_functions_f32.h log_trigamma)."""
    x_fit = tl.where(series, 1.0, x)
    factor = (x_fit - TRIGAMMA_ONE_HI) - TRIGAMMA_ONE_LO
    series_value = log_x_trigamma_series_f32(inv_z) - log_z
    return tl.where(series, series_value, factor * log_trigamma_fit_f32(s))


@triton.jit
def fisher_remainder_f32(series, s, inv_z):
    """(r(x), x·r'(x)), r(x) = 1/ψ1(x) − x + ½ ∈ (0, 0.108] and x·r' ∈ [−0.112, 0) (SPEC §2 logdet),
    float32: special_functions_f32.h fisher_remainder."""
    r = tl.where(series, remainder_series_f32(inv_z), remainder_fit_f32(s))
    x_r_prime = tl.where(series, x_remainder_prime_series_f32(inv_z), x_remainder_prime_fit_f32(s))
    return r, x_r_prime


@triton.jit
def fisher_slope_f32(x, series, s, inv_z):
    """f'(x) = (2x + 1)ψ1(x) + x(x + 1)ψ2(x) ∈ [0.127, 1), the fmse slope (SPEC §2 fmse), float32:
    special_functions_f32.h fisher_slope."""
    # The fit is of (f'(x) − f'(1))/(x − 1): f' grows from 0.127 to 0.8 across [1, 2).
    x_fit = tl.where(series, 1.0, x)
    fit = ((x_fit - 1.0) * fisher_slope_fit_f32(s) + FISHER_SLOPE_AT_ONE_LO) + FISHER_SLOPE_AT_ONE_HI
    return tl.where(series, fisher_slope_series_f32(inv_z), fit)


@triton.jit
def log_trigamma_of_tanh_f32(t):
    """ln ψ1(1 + e^t) = (t − t1)·P(t), t1 its zero (special_functions_f32.h log_trigamma_of_tanh)."""
    return ((t - TANH_TRIGAMMA_ONE_HI) - TANH_TRIGAMMA_ONE_LO) * log_trigamma_tanh_fit_f32(t)


@triton.jit
def element_forward_of_tanh_f32(t, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr):
    """(h + 1, xψ1, ln ψ1, r) at α = 1 + e^t from exp_tanh's t = tanh x ∈ [−1, 1] (element_terms.h
    element_forward_f32_of_tanh; SPEC §2 "Float32 element math"): one polynomial in t each, no ln α;
    zeros for the terms not enabled."""
    zero = tl.zeros_like(t)
    kl_h_plus_one, x_trigamma, log_trigamma, remainder = zero, zero, zero, zero
    if KL:
        kl_h_plus_one = kl_h_plus_one_tanh_fit_f32(t)
    if FMSE:
        x_trigamma = x_trigamma_tanh_fit_f32(t)
    if LOGDET:
        log_trigamma = log_trigamma_of_tanh_f32(t)
        remainder = remainder_tanh_fit_f32(t)
    return kl_h_plus_one, x_trigamma, log_trigamma, remainder


@triton.jit
def element_backward_of_tanh_f32(t, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr):
    """(x·v, f', xψ2/ψ1, x·r') at α = 1 + e^t (element_terms.h element_backward_f32_of_tanh): the
    ratio fitted, not divided; zeros for the terms not enabled."""
    zero = tl.zeros_like(t)
    kl_v, fisher_slope, ratio, x_r_prime = zero, zero, zero, zero
    if KL:
        kl_v = x_kl_v_tanh_fit_f32(t)
    if FMSE:
        fisher_slope = fisher_slope_tanh_fit_f32(t)
    if LOGDET:
        ratio = tetragamma_trigamma_ratio_tanh_fit_f32(t)
        x_r_prime = x_remainder_prime_tanh_fit_f32(t)
    return kl_v, fisher_slope, ratio, x_r_prime


@triton.jit
def tetragamma_trigamma_ratio_f32(x_trigamma, x2_tetragamma):
    """x·ψ2(x)/ψ1(x) = (x²ψ2)/(xψ1) ∈ [−1.462, −1], the logdet gradient's per-element ratio (SPEC §2
    logdet), float32: special_functions_f32.h tetragamma_trigamma_ratio."""
    return approx_div_f32(x2_tetragamma, x_trigamma)
