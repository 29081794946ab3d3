"""Special functions of SPEC §2 "Stable forms" as Triton device functions, from core `tl` ops.

A line-for-line port of csrc/kernels/special_functions.h, elementary.h and evidence.h: the same
recurrence shift (x -> x + 8 below 8), the same asymptotic series, the same cancellation-free
helpers (h, v, r, the digamma/trigamma differences). No libdevice: the Triton interpreter (how CI
runs these) cannot execute it, and Triton has no digamma anyway.

Every function is generic in the floating dtype of its arguments: float64 for the per-line
finalisation (and float64 inputs), float32 for the per-element work of float32/float16/bfloat16
inputs. The float32 instantiation differs from the float64 one (the C++ one) only where float32
needs it, each marked "float32:" below:
- the recurrence sums Σ 1/(x+k)^m are formed directly from 8 reciprocals instead of as the
  log-derivatives of the product P(x) (whose third derivative cancels ~40× at x = 1, harmless in
  double, 5e-6 in float32);
- the series of v(x) and r(x) start at 8 instead of 16 and 30: their direct forms cancel (r by
  ~10^4 at x = 30, i.e. 1e-3 in float32), and 15/12 series terms at 1/x <= 1/8 are exact to
  1e-12, far below float32's 6e-8.

Huge evidence (exp at small τ: α = e^100 exceeds float32) is handled through a *scaled* argument:
callers pass a_s with α = a_s·2^k, ln α and 1/α (see `scaled_argument`); every function below
reads α itself only where α < 30 (where k = 0), and ln α, 1/α on the series branches.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pow2(e, like):
    """2^e exactly, as the dtype of `like` (e: int32 tensor); 0 below the normal range."""
    if like.dtype == tl.float64:
        ec = tl.minimum(tl.maximum(e, -1022), 1023)
        bits = (ec + 1023).to(tl.int64) << 52
        v = bits.to(tl.float64, bitcast=True)
        return tl.where(e < -1022, 0.0, v)
    else:
        ec = tl.minimum(tl.maximum(e, -126), 127)
        bits = (ec + 127) << 23
        v = bits.to(tl.float32, bitcast=True)
        return tl.where(e < -126, 0.0, v)


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
    """e^x as (e_s, k) with e = e_s·2^k, e_s in CT and never overflowing: x (float64) is reduced
    as x = n·ln2 + r (Cody-Waite, |r| <= ln2/2) in float64, so the only rounding is that of
    exp(r) in CT (tl.exp of a small argument is accurate even where it is the fast hardware
    approximation). k = 0 unless e >= 2^60 (float32) / 2^1000 (float64)."""
    nf = tl.floor(x64 * 1.4426950408889634 + 0.5)
    nf = tl.minimum(tl.maximum(nf, -1100.0), 1100.0)
    r = (x64 - nf * 6.93147180369123816490e-01) - nf * 1.90821492927058770002e-10
    p = tl.exp(r.to(CT))
    n = nf.to(tl.int32)
    if CT == tl.float64:  # noqa: SIM300  (Triton constexpr dtype)
        k = tl.maximum(n - 1000, 0)
    else:
        k = tl.maximum(n - 60, 0)
    return p * pow2(n - k, p), k


@triton.jit
def evidence_alpha(sv, inv_tau64, EVIDENCE: tl.constexpr, CT: tl.constexpr):
    """α = g(s/τ) + 1 as (a_s, k, rho): α = a_s·2^k, rho = g'(x)/α (csrc/kernels/evidence.h).

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
    """(ln P, Σ 1/(x+k), Σ 1/(x+k)², Σ 1/(x+k)³), k < 8, P = Π (x + k), for x in [1, 8]."""
    if x.dtype == tl.float64:
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
    else:
        # float32: the sums directly (no cancellation), P only for its log.
        inv = 1.0 / x
        h1 = inv
        h2 = inv * inv
        h3 = h2 * inv
        p0 = x
        for k in tl.static_range(1, 8):
            t = x + k
            inv = 1.0 / t
            i2 = inv * inv
            h1 += inv
            h2 += i2
            h3 += i2 * inv
            p0 = p0 * t
        log_p = tl.log(p0)
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
    """(v(x), x·v(x)) with v(x) = 1 − (x − 1)ψ1(x) ≈ 1/(2x) = −h'(x); series from 16 (float64) /
    8 (float32). x·v is formed from the series before its last 1/x (x itself may overflow)."""
    if x.dtype == tl.float64:
        large = x >= 16.0
    else:
        large = x >= 8.0
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
    """(r(x), x·r'(x)) with r(x) = 1/ψ1(x) − x + ½; series from 30 (float64) / 8 (float32)."""
    if x.dtype == tl.float64:
        large = x >= 30.0
    else:
        large = x >= 8.0
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
