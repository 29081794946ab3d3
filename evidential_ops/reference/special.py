"""Numerically stable special functions for the float64 reference (SPEC §2, SPEC §2 "Stable forms").

Everything here is written with plain torch ops so that autograd differentiates it and so that
the same code runs in float64 (the judge) and float32 (the plain-PyTorch baseline). Branches are
selected with the "double where" idiom: each branch only ever sees arguments in its own domain,
so the branch that is not taken cannot inject NaN/Inf into the backward pass.

Domain: every function here is only ever called with arguments >= 1 (alpha = evidence + 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Above these arguments the asymptotic series are used; below, recurrence or the direct formula.
# Chosen so that the truncation error of the series is < 1e-12 relative in float64.
_SERIES_FROM = 10.0
_R_SERIES_FROM = 30.0  # the 1/psi1 series has fast-growing coefficients; it needs a larger x

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _split(x: Tensor, threshold: float) -> tuple[Tensor, Tensor, Tensor]:
    """(is_large, x clamped into the large branch, x clamped into the small branch)."""
    large = x >= threshold
    x_large = torch.where(large, x, torch.full_like(x, threshold))
    x_small = torch.where(large, torch.ones_like(x), x)
    return large, x_large, x_small


def _scaled_trigamma_series(u: Tensor) -> Tensor:
    """z·ψ1(z) = 1 + u/2 + u²(1/6 − u²/30 + …) with u = 1/z, for z >= 10 (Bernoulli up to B14).

    Kept scaled: ψ1 itself is u·(this), whose derivative −u²·(…) underflows for z > 1e154.
    """
    u2 = u * u
    tail = 1.0 / 6 + u2 * (
        -1.0 / 30
        + u2 * (1.0 / 42 + u2 * (-1.0 / 30 + u2 * (5.0 / 66 + u2 * (-691.0 / 2730 + u2 * (7.0 / 6)))))
    )
    return 1.0 + u * 0.5 + u2 * tail


def trigamma(x: Tensor) -> Tensor:
    """ψ1(x) for x >= 1, accurate to ~1e-15 relative in float64.

    torch.polygamma(1, ·) truncates its series at x = 6 and is only good to ~1e-8, which is
    not enough for the Fisher terms (SPEC §2.4-2.5). Recurrence ψ1(x) = ψ1(x+10) + Σ_k 1/(x+k)²
    shifts small arguments by a fixed 10 steps (no data-dependent loop), then the
    asymptotic series in 1/x with Bernoulli coefficients up to B14.
    """
    large, _, x_small = _split(x, _SERIES_FROM)
    small = ~large
    steps = int(_SERIES_FROM)
    # Written flat (no z fed back through `where`): a chain of nested selects makes the
    # expression tree torch.compile has to simplify grow with every step.
    shift_sum = sum(1.0 / (x_small + k) ** 2 for k in range(steps))
    z = torch.where(small, x_small + steps, x)
    u = 1.0 / z
    return u * _scaled_trigamma_series(u) + torch.where(small, shift_sum, torch.zeros_like(shift_sum))


def log_trigamma(x: Tensor) -> Tensor:
    """ln ψ1(x) for x >= 1 (UML eq. 8, first sum of the Fisher log-determinant).

    ln(xψ1(x)) − ln x on the series branch: ln ψ1 itself would differentiate through ψ1' ≈ −1/x²,
    which underflows to 0 for x > 1e154 and zeroes the gradient −1/x (the logdet's gradient at a
    near-duplicate positive once α² overflows, s/τ > ~355).
    """
    large, x_large, x_small = _split(x, _SERIES_FROM)
    scaled = torch.log(_scaled_trigamma_series(1.0 / x_large)) - torch.log(x_large)
    return torch.where(large, scaled, torch.log(trigamma(x_small)))


def digamma_difference(a: Tensor, r: Tensor) -> Tensor:
    """ψ(a + r) − ψ(a) for a >= 1, r >= 0, without cancellation (risk term, SPEC §2.1).

    For large a, ψ(x) = ln x − 1/(2x) − Σ B_2k/(2k x^2k) and the difference of each power is
    factored as (1/a − 1/S)·(...) with 1/a − 1/S = r/(aS) formed exactly. This is what keeps
    the risk of a near-duplicate positive (α_y ≈ 5e8, r ≈ K) exact; ψ(S) − ψ(α_y) evaluated
    directly loses every digit in float32 and ~8 in float64.
    """
    large, a_large, a_small = _split(a, _SERIES_FROM)
    s_large = a_large + r
    ia = 1.0 / a_large
    is_ = 1.0 / s_large
    d1 = r / (a_large * s_large)  # 1/a − 1/S
    sum1 = ia + is_
    sum2 = ia * ia + is_ * is_
    d2 = d1 * sum1  # 1/a² − 1/S²
    d4 = d2 * sum2
    d6 = d2 * (ia**4 + (ia * is_) ** 2 + is_**4)
    d8 = d4 * (ia**4 + is_**4)
    series = (
        torch.log1p(r / a_large)
        + 0.5 * d1
        + d2 / 12.0
        - d4 / 120.0
        + d6 / 252.0
        - d8 / 240.0
    )
    direct = torch.digamma(a_small + r) - torch.digamma(a_small)
    return torch.where(large, series, direct)


def kl_h(x: Tensor) -> Tensor:
    """h(x) = (x − 1)ψ(x) − lnΓ(x) − x for x >= 1 (SPEC §2 "Stable forms", KL term).

    KL(Dir(α̃) ‖ Dir(1)) = Σ_j h(α̃_j) − h(S̃) + (N − 1)ψ(S̃) − lnΓ(N). h grows like −½ ln x,
    so the x ln x parts of lnΓ and (x−1)ψ, which cancel catastrophically in the textbook
    formula, never appear. Large-x series (derived from Stirling and the ψ expansion):
    h(x) = −½ ln(2πx) − ½ + 1/(3x) + 1/(12x²) + 1/(90x³) − 1/(120x⁴) − 1/(210x⁵)
           + 1/(252x⁶) + 1/(210x⁷) − 1/(240x⁸) + …
    """
    large, x_large, x_small = _split(x, _SERIES_FROM)
    u = 1.0 / x_large
    poly = u * (
        1.0 / 3
        + u
        * (
            1.0 / 12
            + u
            * (
                1.0 / 90
                + u
                * (
                    -1.0 / 120
                    + u * (-1.0 / 210 + u * (1.0 / 252 + u * (1.0 / 210 + u * (-1.0 / 240))))
                )
            )
        )
    )
    series = -_HALF_LOG_2PI - 0.5 * torch.log(x_large) - 0.5 + poly
    direct = (x_small - 1.0) * torch.digamma(x_small) - torch.lgamma(x_small) - x_small
    return torch.where(large, series, direct)


# r(x) = 1/ψ1(x) − x + ½ = Σ_k c_k / x^k (coefficients derived with sympy from the ψ1 series).
_R_COEFFS = (
    1.0 / 12,
    1.0 / 24,
    -1.0 / 720,
    -11.0 / 480,
    -113.0 / 12096,
    527.0 / 24192,
    79717.0 / 3628800,
    -34253.0 / 1036800,
    -28932091.0 / 479001600,
    8115997.0 / 106444800,
    574468115113.0 / 2615348736000,
    -121081664357.0 / 475517952000,
)


def inverse_trigamma_remainder(x: Tensor) -> Tensor:
    """r(x) = 1/ψ1(x) − x + ½ for x >= 1: small (≤ 0.11), smooth, positive (SPEC §2.5).

    With it, 1 − ψ1(S)·Σ_j 1/ψ1(α_j) = ψ1(S)·((N−1)/2 + r(S) − Σ_j r(α_j)) has no cancellation,
    because Σ_j r(α_j) ≤ 0.11·N stays well below (N−1)/2.
    """
    large, x_large, x_small = _split(x, _R_SERIES_FROM)
    u = 1.0 / x_large
    poly = torch.zeros_like(u)
    for c in reversed(_R_COEFFS):
        poly = (poly + c) * u
    direct = 1.0 / trigamma(x_small) - x_small + 0.5
    return torch.where(large, poly, direct)
