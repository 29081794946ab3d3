#!/usr/bin/env python3
"""Writes csrc/kernels/special_functions_f32_fits.h: the coefficients of the float32 special
functions of special_functions_f32.h (the per-element functions of SPEC §2 "Stable forms"), and
evidential_ops/triton_backend/special_f32_fits.py: the same coefficients, constants and Horner
steps as Triton device functions, for the Triton kernels' float32 element math (special.py). Both
from one run: the coefficients have one source.

    python3 csrc/kernels/make_special_functions_f32.py          # rewrites the header and the module
    python3 csrc/kernels/make_special_functions_f32.py --check  # fails if either is stale

Two kinds of forms, split at x = 8:
- x >= 8: the asymptotic series in u = 1/x, built here in exact rational arithmetic from the
  Bernoulli numbers (so every coefficient is derived, not copied), truncated once the omitted
  terms at u = 1/8 fall below 2^-30 of the function's size there. The series of the composite
  quantities (ln(xψ1), r, x·r', the Fisher slope) are formal power-series operations on the
  series of xψ1, never a difference of evaluated numbers.
- 1 <= x < 8: one polynomial in s = ln(x/4) ∈ [−1.39, 0.69) (x/4 is exact; centring at 4 halves
  the largest |s|, hence the absolute rounding error of s, which the fit cannot absorb), except
  h + 1 on [1, 2), a polynomial in ln x (exact near x = 1, where the KL needs h + 1 without bias;
  ln x is what the series need anyway). In ln x the singularities of
  ψ, ψ1, ψ2, lnΓ at x = 0, −1, −2, … sit at −∞ and at ln n ± iπ, far from [0, ln 8]: degrees 8–12
  reach 2^-26 on the whole of [1, 8), where polynomials in x need one piece per binade (and SIMD
  code would pick every coefficient per lane among the pieces: more costly than the functions).
  A function with a zero in [1, 8) is fitted as (x − root)·P(s) (or (x − 1)(x − 2)·P(s) for lnΓ),
  so its relative error stays bounded at the zero; the Fisher slope, which grows 6x across [1, 2),
  as f'(1) + (x − 1)·P(s). Degree: the smallest whose fit, with float32-rounded coefficients, is
  within 2^-26 relative on [1, 8) in exact arithmetic (the only argument error left is the rounding
  of the logarithm). Fitting: weighted
  least squares on Chebyshev nodes (relative error), then the coefficients are rounded to float32
  one at a time from the constant term up (the constant as hi + lo), refitting the higher ones
  after each rounding so that they absorb it.

A third form for exp_tanh evidence, whose α = 1 + e^t, t = tanh x ∈ [−1, 1], lies in [1.37, 3.72]:
each function of α as one polynomial in t itself (`*_tanh_fit`), fitted like the others on [−1, 1]
(ln ψ1 as (t − t1)·P(t), t1 = ln(x1 − 1) its zero). The element code has t from the map, so it needs
neither ln α nor a quotient, and x·ψ2/ψ1 is fitted directly instead of divided. As functions of t
their singularities (α = 0, −1, …: t = ln n + iπ) lie at distance π from [−1, 1]: degrees 9–11.

References are mpmath at 50 digits from the textbook definitions (psi, loggamma).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from fractions import Fraction

import mpmath
import numpy as np
from mpmath import mp, mpf

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "special_functions_f32_fits.h")
PY_OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "evidential_ops", "triton_backend",
                      "special_f32_fits.py")

SERIES_FROM = 8  # x >= 8: asymptotic series; below: the polynomials in ln x
LOG_CENTRE = 4  # s = ln(x/4)
FIT_TARGET = 2.0**-26  # relative error of the fit alone (float32 half-ulp is 2^-24 .. 2^-25)
SERIES_TARGET = 2.0**-30  # relative size of the omitted series terms at u = 1/8
NODES = 160  # Chebyshev nodes for the least-squares fit on [1, 8)
CHECK_POINTS = 6000  # points on which the fit's error is measured
mp.dps = 50


def f32(v: float) -> float:
    return float(np.float32(v))


# ------------------------------------------------------------------------ textbook definitions


def x_trigamma(x):
    return x * mp.psi(1, x)


def x2_tetragamma(x):
    return x * x * mp.psi(2, x)


def digamma(x):
    return mp.psi(0, x)


def lgamma(x):
    return mp.loggamma(x)


def kl_h(x):
    return (x - 1) * mp.psi(0, x) - mp.loggamma(x) - x


def kl_h_plus_one(x):
    return (x - 1) * mp.psi(0, x) - mp.loggamma(x) - x + 1


def x_kl_v(x):
    return x * (1 - (x - 1) * mp.psi(1, x))


def log_trigamma(x):
    return mp.log(mp.psi(1, x))


def remainder(x):
    return 1 / mp.psi(1, x) - x + mpf(1) / 2


def x_remainder_prime(x):
    return x * (-mp.psi(2, x) / mp.psi(1, x) ** 2 - 1)


def fisher_slope(x):
    return (2 * x + 1) * mp.psi(1, x) + x * (x + 1) * mp.psi(2, x)


def tetragamma_trigamma_ratio(x):
    return x * mp.psi(2, x) / mp.psi(1, x)


def digamma_root():
    return mp.findroot(lambda t: mp.psi(0, t), mpf("1.46"))


def trigamma_one():
    """x1 with ψ1(x1) = 1, the zero of ln ψ1."""
    return mp.findroot(lambda t: mp.psi(1, t) - 1, mpf("1.43"))


def split(v) -> tuple[float, float]:
    """v = hi + lo, both float32, hi the nearest float32 (x − hi is exact for x within 2× of v)."""
    hi = f32(float(v))
    lo = f32(float(mpf(v) - mpf(hi)))
    return hi, lo


# ------------------------------------------------------------------- asymptotic series in u = 1/x


def bernoulli(n: int) -> Fraction:
    p, q = mpmath.bernfrac(n)
    return Fraction(int(p), int(q))


ORDER = 40  # formal series are carried to u^40; truncation picks far fewer


def series_x_trigamma() -> list[Fraction]:
    """xψ1(x) = 1 + u/2 + Σ B_2k u^2k."""
    c = [Fraction(0)] * (ORDER + 1)
    c[0], c[1] = Fraction(1), Fraction(1, 2)
    for k in range(1, ORDER // 2 + 1):
        c[2 * k] = bernoulli(2 * k)
    return c


def series_x2_tetragamma() -> list[Fraction]:
    """x²ψ2(x) = −1 − u − Σ (2k + 1) B_2k u^2k."""
    c = [Fraction(0)] * (ORDER + 1)
    c[0], c[1] = Fraction(-1), Fraction(-1)
    for k in range(1, ORDER // 2 + 1):
        c[2 * k] = -(2 * k + 1) * bernoulli(2 * k)
    return c


def series_digamma_tail() -> list[Fraction]:
    """D(u) with ψ(x) = ln x − D(u): D = u/2 + Σ B_2k/(2k) u^2k."""
    c = [Fraction(0)] * (ORDER + 1)
    c[1] = Fraction(1, 2)
    for k in range(1, ORDER // 2 + 1):
        c[2 * k] = bernoulli(2 * k) / (2 * k)
    return c


def series_lgamma_tail() -> list[Fraction]:
    """G(u) with lnΓ(x) = x(ln x − 1) − ½ ln x + ½ ln 2π + G(u): G = Σ B_2k/(2k(2k−1)) u^(2k−1)."""
    c = [Fraction(0)] * (ORDER + 1)
    for k in range(1, ORDER // 2 + 1):
        c[2 * k - 1] = bernoulli(2 * k) / (2 * k * (2 * k - 1))
    return c


def series_kl_h_tail() -> list[Fraction]:
    """H(u) with h(x) = −½ ln x − ½ ln 2π − ½ + H(u). From (x − 1)ψ − lnΓ − x with x·u^k = u^(k−1):
    H = u/2 − Σ B_2k/(2k)(u^(2k−1) − u^2k) − Σ B_2k/(2k(2k−1)) u^(2k−1)."""
    c = [Fraction(0)] * (ORDER + 1)
    c[1] = Fraction(1, 2)
    for k in range(1, ORDER // 2 + 1):
        b = bernoulli(2 * k)
        c[2 * k - 1] -= b / (2 * k) + b / (2 * k * (2 * k - 1))
        c[2 * k] += b / (2 * k)
    return c


def series_x_kl_v() -> list[Fraction]:
    """x·v(x) = x − (x − 1)·xψ1(x) = Σ t_k(u^(k−1) − u^k) with xψ1 = Σ t_k u^k, plus x − x."""
    t = series_x_trigamma()
    c = [Fraction(0)] * (ORDER + 1)
    # x − (x − 1)Σ t_k u^k = x − Σ t_k u^(k−1) + Σ t_k u^k; the k = 0 term cancels x exactly.
    for k in range(ORDER + 1):
        if k >= 1:
            c[k - 1] -= t[k]
        c[k] += t[k]
    return c


def series_log(a: list[Fraction]) -> list[Fraction]:
    """ln(a(u)) for a(0) = 1, as a formal power series (L' = a'/a)."""
    assert a[0] == 1
    n = len(a)
    out = [Fraction(0)] * n
    # k·L_k = k·a_k − Σ_{j=1}^{k−1} j·L_j·a_{k−j}
    for k in range(1, n):
        s = k * a[k]
        for j in range(1, k):
            s -= j * out[j] * a[k - j]
        out[k] = s / k
    return out


def series_reciprocal(a: list[Fraction]) -> list[Fraction]:
    n = len(a)
    out = [Fraction(0)] * n
    out[0] = 1 / a[0]
    for k in range(1, n):
        out[k] = -sum(a[j] * out[k - j] for j in range(1, k + 1)) / a[0]
    return out


def series_log_x_trigamma() -> list[Fraction]:
    """L(u) = ln(xψ1(x)), so ln ψ1(x) = L(u) − ln x."""
    return series_log(series_x_trigamma())


def series_remainder() -> list[Fraction]:
    """r = 1/ψ1 − x + ½ = x(1/(xψ1) − 1) + ½: with 1/(xψ1) = Σ q_k u^k (q_0 = 1, q_1 = −½),
    r = Σ_{k>=2} q_k u^(k−1)."""
    q = series_reciprocal(series_x_trigamma())
    assert q[0] == 1 and q[1] == Fraction(-1, 2)
    return [Fraction(0)] + q[2:] + [Fraction(0)]


def series_x_remainder_prime() -> list[Fraction]:
    """x·r'(x) from r = Σ ρ_k u^k: x·d(u^k)/dx = −k u^k."""
    return [-k * c for k, c in enumerate(series_remainder())]


def series_fisher_slope() -> list[Fraction]:
    """f'(x) for f = (x + 1)·xψ1(x) = Σ t_k (u^(k−1) + u^k): d(u^m)/dx = −m u^(m+1)."""
    t = series_x_trigamma()
    c = [Fraction(0)] * (ORDER + 2)
    c[0] += t[0]  # (x + 1)·t_0: derivative t_0
    for k in range(1, ORDER + 1):
        c[k] -= (k - 1) * t[k]  # t_k·u^(k−1)
        c[k + 1] -= k * t[k]  # t_k·u^k
    return c[: ORDER + 1]


def truncate(coefficients: list[Fraction], size_at_8) -> list[Fraction]:
    """Keeps terms up to the last one whose size at u = 1/8 is above SERIES_TARGET·size_at_8,
    after which every term is below it (the series are asymptotic: terms keep shrinking at u = 1/8
    far beyond the degrees kept)."""
    u = Fraction(1, SERIES_FROM)
    limit = abs(size_at_8) * SERIES_TARGET
    last = 0
    for k, c in enumerate(coefficients):
        if c != 0 and abs(float(c * u**k)) > limit:
            last = k
    tail = [abs(float(c * u**k)) for k, c in enumerate(coefficients) if k > last and c != 0]
    assert all(t <= limit for t in tail[:8]), "series terms grow again right after the truncation"
    return coefficients[: last + 1]


# ------------------------------------------------------------------------------- fits on [1, 8)


def chebyshev_nodes(n: int) -> np.ndarray:
    k = np.arange(n)
    return np.cos(np.pi * (k + 0.5) / n)[::-1]


class Fit:
    """f(x) = offset + m(x)·P(s) on [1, 8), s = ln(x/4); m and offset as given (m = 1 and offset = 0
    unless a zero or a cancellation calls for them)."""

    variable = "s"

    def __init__(self, name, fn, multiplier=None, offset=None, centre=LOG_CENTRE, end=SERIES_FROM):
        self.name, self.fn, self.multiplier, self.offset = name, fn, multiplier, offset
        self.centre = centre  # the variable is ln(x/centre), on [1, end)
        self.coefficients: list[float] = []  # float32 values, constant term first
        self.low = 0.0  # the constant term is coefficients[0] + low
        self.max_error = 0.0
        self.s_begin = float(mp.log(mpf(1) / centre))
        self.s_end = float(mp.log(mpf(end) / centre))

    def target(self, s_values):
        """P's target g = (f − offset)/m at x = 4e^s, exactly (50 digits)."""
        out = []
        for s in s_values:
            x = self.centre * mp.exp(mpf(float(s)))
            m = self.multiplier(x) if self.multiplier else mpf(1)
            offset = self.offset if self.offset is not None else mpf(0)
            out.append(float((self.fn(x) - offset) / m))
        return np.array(out)

    def points(self):
        """(Chebyshev nodes of the fit, points where its error is measured) in the variable."""
        half, mid = (self.s_end - self.s_begin) / 2, (self.s_end + self.s_begin) / 2
        check = self.s_begin + (np.arange(CHECK_POINTS) + 0.5) * (2 * half / CHECK_POINTS)  # avoids x = 1
        return mid + chebyshev_nodes(NODES) * half, check

    def run(self):
        """The lowest degree whose fit, float32 coefficients, is within FIT_TARGET at every check point."""
        nodes, check = self.points()
        g_nodes, g_check = self.target(nodes), self.target(check)
        for degree in range(3, 24):
            low, coefficients = fit_rounded(nodes, g_nodes, degree)
            exact = [coefficients[0] + low] + coefficients[1:]
            error = np.max(np.abs(np.polynomial.polynomial.polyval(check, exact) / g_check - 1.0))
            if error <= FIT_TARGET:
                self.low, self.coefficients, self.max_error = low, coefficients, error
                return self
        raise RuntimeError(f"{self.name}: no degree below 24 reaches the target on its interval")


class TanhFit(Fit):
    """f(α) = m(t)·P(t) at α = 1 + e^t for t ∈ [−1, 1] (exp_tanh evidence: t = tanh x); m as given
    (m = 1 unless a zero calls for one), m a function of t."""

    variable = "t"

    def target(self, s_values):
        out = []
        for t in s_values:
            t = mpf(float(t))
            m = self.multiplier(t) if self.multiplier else mpf(1)
            out.append(float(self.fn(1 + mp.exp(t)) / m))
        return np.array(out)

    def points(self):
        # The checks include both ends: t = ±1 exactly is reached (tanh x rounds to 1 from |x| ≈ 9).
        return chebyshev_nodes(NODES), -1.0 + np.arange(CHECK_POINTS + 1) * (2.0 / CHECK_POINTS)


def fit_rounded(s, g, degree) -> list[float]:
    """Weighted (relative) least squares of degree `degree`, coefficients rounded to float32 one at
    a time from the constant term, each rounding absorbed by refitting the remaining ones."""
    w = 1.0 / np.abs(g)
    vander = np.vander(s, degree + 1, increasing=True)
    fixed: list[float] = []
    residual = g.copy()
    for k in range(degree + 1):
        sol, *_ = np.linalg.lstsq(vander[:, k:] * w[:, None], residual * w, rcond=None)
        c = f32(sol[0])
        low = f32(sol[0] - c) if k == 0 else 0.0  # hi + lo: no power of s absorbs a constant's rounding
        fixed.append(c)
        residual = residual - (c + low) * vander[:, k]
        if k == 0:
            constant_low = low
    return constant_low, fixed


# ----------------------------------------------------------------------------------- emission


def literal(v: float) -> str:
    """A float32 literal that round-trips (9 significant digits)."""
    if v == 0.0:
        return "0.0f"
    text = f"{v:.9g}"
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


def emit_fit(out, name, doc, fit: Fit):
    c = fit.coefficients
    out.append(f"// {doc}")
    v = fit.variable
    out.append(f"// Degree {len(c) - 1} in {v}; fit error (relative, float32 coefficients, exact arithmetic) "
               f"{fit.max_error:.1e}.")
    out.append(f"EO_HOST_DEVICE float {name}(float {v}) {{")
    out.append(f"  float p = {literal(c[-1])};")
    for k in range(len(c) - 2, 0, -1):
        out.append(f"  p = p * {v} + {literal(c[k])};")
    out.append(f"  return (p * {v} + {literal(fit.low)}) + {literal(c[0])};  // the constant as hi + lo")
    out.append("}")
    out.append("")


def emit_series(out, name, doc, coefficients: list[Fraction]):
    out.append(f"// {doc}")
    out.append(f"// Terms to u^{len(coefficients) - 1}; omitted terms below 2^-30 relative at x = 8.")
    out.append(f"EO_HOST_DEVICE float {name}(float u) {{")
    nonzero = [k for k, c in enumerate(coefficients) if c != 0]
    top = nonzero[-1]
    out.append(f"  float p = {literal(f32(float(coefficients[top])))};")
    for k in range(top - 1, -1, -1):
        c = coefficients[k]
        out.append(f"  p = p * u + {literal(f32(float(c)))};" if c != 0 else "  p = p * u;")
    out.append("  return p;")
    out.append("}")
    out.append("")


# ------------------------------------------------------------------------- the Python module


PY_SUFFIX = "_f32"  # Inductor rebuilds a Triton kernel with every device function in one namespace:
# the suffix keeps these apart from special.py's float64 functions of the same C++ names


def python_constant_name(c_name: str) -> str:
    """kDigammaRootHi -> DIGAMMA_ROOT_HI, kSeriesFromF32 -> SERIES_FROM_F32."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", c_name[1:]).upper()


def python_literal(v: float) -> str:
    """The float32 value itself, exactly, as a Python float (Triton rounds it back to that float32)."""
    return repr(f32(v))


def python_header(constants: list[tuple[str, float]]) -> list[str]:
    out = [
        "# GENERATED by csrc/kernels/make_special_functions_f32.py: do not edit; rerun the script.",
        '"""Coefficients of the float32 special functions as Triton device functions (SPEC §2 "Float32',
        'element math"): the Horner steps, coefficients and constants of',
        "csrc/kernels/special_functions_f32_fits.h, written by the same run of the same script, for",
        "special.py. One polynomial on [1, 8) in s = ln(x/4) (h + 1 on [1, 2): in ln x) and asymptotic",
        "series in u = 1/x for x >= 8; for exp_tanh evidence, polynomials in t at x = 1 + e^t. Each",
        "literal is its float32 coefficient's exact value as a Python float, which Triton rounds back",
        'to that float32."""',
        "",
        "import triton",
        "import triton.language as tl",
        "",
    ]
    for name, value in constants:
        out.append(f"{python_constant_name(name)} = tl.constexpr({python_literal(value)})")
    out += ["", ""]
    return out


def python_docstring(text: str) -> list[str]:
    lines = textwrap.wrap(text, width=100, initial_indent='    """', subsequent_indent="    ")
    lines[-1] += '"""'
    return lines


def emit_python_fit(out, name, doc, fit: Fit):
    c = fit.coefficients
    out.append("@triton.jit")
    v = fit.variable
    out.append(f"def {name}{PY_SUFFIX}({v}):")
    out += python_docstring(f"{doc} Degree {len(c) - 1} in {v}; fit error (relative, float32 coefficients, exact "
                            f"arithmetic) {fit.max_error:.1e}. special_functions_f32_fits.h `{name}` (SPEC §2 "
                            '"Float32 element math").')
    out.append(f"    p = {python_literal(c[-1])}")
    for k in range(len(c) - 2, 0, -1):
        out.append(f"    p = p * {v} + {python_literal(c[k])}")
    out.append(f"    return (p * {v} + {python_literal(fit.low)}) + {python_literal(c[0])}  # the constant as hi + lo")
    out += ["", ""]


def emit_python_series(out, name, doc, coefficients: list[Fraction]):
    out.append("@triton.jit")
    out.append(f"def {name}{PY_SUFFIX}(u):")
    out += python_docstring(f"{doc} Terms to u^{len(coefficients) - 1}; omitted terms below 2^-30 relative at "
                            f"x = 8. special_functions_f32_fits.h `{name}` (SPEC §2 \"Float32 element math\").")
    nonzero = [k for k, c in enumerate(coefficients) if c != 0]
    top = nonzero[-1]
    out.append(f"    p = {python_literal(float(coefficients[top]))}")
    for k in range(top - 1, -1, -1):
        c = coefficients[k]
        out.append(f"    p = p * u + {python_literal(float(c))}" if c != 0 else "    p = p * u")
    out.append("    return p")
    out += ["", ""]


def generate(python: list[str] | None = None) -> str:
    """The C header's text; with `python` a list, the Python module's lines are appended to it."""
    x0 = digamma_root()
    x1 = trigamma_one()
    x0_hi, x0_lo = split(x0)
    x1_hi, x1_lo = split(x1)
    t1 = mp.log(x1 - 1)
    t1_hi, t1_lo = split(t1)
    one, two = mpf(1), mpf(2)
    fits = {
        "x_trigamma_fit": ("x·ψ1(x).", Fit("xψ1", x_trigamma)),
        "x2_tetragamma_fit": ("x²·ψ2(x).", Fit("x²ψ2", x2_tetragamma)),
        "digamma_fit": ("ψ(x) = (x − x0)·P (x0 the root of ψ).", Fit("ψ", digamma, lambda x: x - x0)),
        "lgamma_fit": ("lnΓ(x) = (x − 1)(x − 2)·P.", Fit("lnΓ", lgamma, lambda x: (x - one) * (x - two))),
        "kl_h_plus_one_fit": (
            "h(x) + 1 = (x − 1)ψ(x) − lnΓ(x) − x + 1 = (x − 1)·P(s) (from 2 on; below, kl_h_plus_one_near_one_fit).",
            Fit("h+1", kl_h_plus_one, lambda x: x - one),
        ),
        "kl_h_plus_one_near_one_fit": (
            "h(x) + 1 = (x − 1)·P(ln x) on [1, 2): h(1) = −1, and the KL of a line whose α are all near 1 is"
            " second order in α − 1, so the per-element statistic must be accurate relative to α − 1 and"
            " without a bias that thousands of elements would add up: near 1 its variable is ln x itself"
            " (no rounding there), not ln(x/4) (≈ −1.39, rounded).",
            Fit("h+1 near 1", kl_h_plus_one, lambda x: x - one, centre=1, end=2),
        ),
        "x_kl_v_fit": ("x·v(x) = x(1 − (x − 1)ψ1(x)).", Fit("xv", x_kl_v)),
        "log_trigamma_fit": ("ln ψ1(x) = (x − x1)·P (x1: ψ1(x1) = 1).", Fit("lnψ1", log_trigamma, lambda x: x - x1)),
        "remainder_fit": ("r(x) = 1/ψ1(x) − x + ½.", Fit("r", remainder)),
        "x_remainder_prime_fit": ("x·r'(x) = x(−ψ2/ψ1² − 1).", Fit("xr'", x_remainder_prime)),
        "fisher_slope_fit": (
            "f'(x) = (2x + 1)ψ1(x) + x(x + 1)ψ2(x), f = x(x + 1)ψ1, as f'(1) + (x − 1)·P: 0.127 at x = 1"
            " from parts of 4.9, and 6x larger at x = 2 (a polynomial whose value is a sixth of its"
            " terms' would lose 4 ulps in float32).",
            Fit("f'", fisher_slope, lambda x: x - one, fisher_slope(one)),
        ),
        "kl_h_plus_one_tanh_fit": ("h + 1 at x = 1 + e^t (exp_tanh: h + 1 ∈ [−0.98, −0.29], no zero).",
                                   TanhFit("h+1(t)", kl_h_plus_one)),
        "x_kl_v_tanh_fit": ("x·v(x) at x = 1 + e^t.", TanhFit("xv(t)", x_kl_v)),
        "x_trigamma_tanh_fit": ("x·ψ1(x) at x = 1 + e^t.", TanhFit("xψ1(t)", x_trigamma)),
        "log_trigamma_tanh_fit": ("ln ψ1(x) at x = 1 + e^t, = (t − t1)·P(t) (t1 = ln(x1 − 1): ψ1(1 + e^t1) = 1).",
                                  TanhFit("lnψ1(t)", log_trigamma, lambda t: t - t1)),
        "remainder_tanh_fit": ("r(x) at x = 1 + e^t.", TanhFit("r(t)", remainder)),
        "x_remainder_prime_tanh_fit": ("x·r'(x) at x = 1 + e^t.", TanhFit("xr'(t)", x_remainder_prime)),
        "fisher_slope_tanh_fit": ("f'(x) at x = 1 + e^t (∈ [0.55, 0.95]: no offset needed).",
                                  TanhFit("f'(t)", fisher_slope)),
        "tetragamma_trigamma_ratio_tanh_fit": ("x·ψ2(x)/ψ1(x) at x = 1 + e^t, fitted rather than divided.",
                                               TanhFit("xψ2/ψ1(t)", tetragamma_trigamma_ratio)),
    }
    eight = mpf(SERIES_FROM)
    series = {
        "x_trigamma_series": ("x·ψ1(x) = 1 + u/2 + Σ B_2k u^2k.", series_x_trigamma(), x_trigamma(eight)),
        "x2_tetragamma_series": (
            "x²·ψ2(x) = −1 − u − Σ (2k + 1) B_2k u^2k.", series_x2_tetragamma(), x2_tetragamma(eight)),
        "digamma_tail_series": ("D(u), ψ(x) = ln x − D(u).", series_digamma_tail(), digamma(eight)),
        "lgamma_tail_series": (
            "G(u), lnΓ(x) = x(ln x − 1) − ½ ln x + ½ ln 2π + G(u).", series_lgamma_tail(), lgamma(eight)),
        "kl_h_tail_series": ("H(u), h(x) = −½ ln x − ½ ln 2π − ½ + H(u).", series_kl_h_tail(), kl_h(eight) + 1),
        "x_kl_v_series": ("x·v(x).", series_x_kl_v(), x_kl_v(eight)),
        "log_x_trigamma_series": (
            "L(u) = ln(x·ψ1(x)), ln ψ1(x) = L(u) − ln x.", series_log_x_trigamma(), log_trigamma(eight)),
        "remainder_series": ("r(x) = Σ ρ_k u^k (from 1/(xψ1)).", series_remainder(), remainder(eight)),
        "x_remainder_prime_series": (
            "x·r'(x) = −Σ k·ρ_k u^k.", series_x_remainder_prime(), x_remainder_prime(eight)),
        "fisher_slope_series": ("f'(x) = 1 − (2/3)u² + … (no cancellation).", series_fisher_slope(),
                                fisher_slope(eight)),
    }
    out = [
        "// GENERATED by csrc/kernels/make_special_functions_f32.py: do not edit; rerun the script.",
        "// Coefficients of the float32 special functions (special_functions_f32.h): one polynomial on",
        "// [1, 8) in s = ln(x/4) ∈ [−1.39, 0.69) (h + 1 on [1, 2): in ln x), and asymptotic series in u = 1/x for",
        "// x >= 8; for exp_tanh evidence (x = 1 + e^t, t = tanh ∈ [−1, 1]) one polynomial in t each.",
        "// Literal Horner steps (a constant array would not be visible in device code).",
        "#pragma once",
        "",
        '#include "platform.h"',
        "",
        "namespace evidential_ops {",
        "namespace EO_ISA {",
        "",
        f"constexpr float kSeriesFromF32 = {literal(float(SERIES_FROM))};",
        "// Roots split as hi + lo float32 (x − hi is exact near the root): ψ(x0) = 0 and ψ1(x1) = 1.",
        f"constexpr float kDigammaRootHi = {literal(x0_hi)};",
        f"constexpr float kDigammaRootLo = {literal(x0_lo)};",
        f"constexpr float kTrigammaOneHi = {literal(x1_hi)};",
        f"constexpr float kTrigammaOneLo = {literal(x1_lo)};",
        "// t1 = ln(x1 − 1), the same zero in the variable of the exp_tanh fits (x = 1 + e^t), as hi + lo.",
        f"constexpr float kTanhTrigammaOneHi = {literal(t1_hi)};",
        f"constexpr float kTanhTrigammaOneLo = {literal(t1_lo)};",
        "// f'(1) = 3ψ1(1) + 2ψ2(1) = π²/2 − 4ζ(3), the Fisher slope at x = 1, as hi + lo.",
        f"constexpr float kFisherSlopeAtOneHi = {literal(split(fisher_slope(one))[0])};",
        f"constexpr float kFisherSlopeAtOneLo = {literal(split(fisher_slope(one))[1])};",
        "",
        f"constexpr float kFitCentreF32 = {literal(float(LOG_CENTRE))};  // s = ln(x/4); 1/4 is exact",
        "",
    ]
    if python is not None:
        python += python_header([
            ("kSeriesFromF32", float(SERIES_FROM)), ("kDigammaRootHi", x0_hi), ("kDigammaRootLo", x0_lo),
            ("kTrigammaOneHi", x1_hi), ("kTrigammaOneLo", x1_lo),
            ("kTanhTrigammaOneHi", t1_hi), ("kTanhTrigammaOneLo", t1_lo),
            ("kFisherSlopeAtOneHi", split(fisher_slope(one))[0]), ("kFisherSlopeAtOneLo", split(fisher_slope(one))[1]),
            ("kFitCentreF32", float(LOG_CENTRE))])
    for name, (doc, fit) in fits.items():
        fit.run()
        emit_fit(out, name, doc, fit)
        if python is not None:
            emit_python_fit(python, name, doc, fit)
        print(f"{name}: deg {len(fit.coefficients) - 1} err {fit.max_error:.2e}", file=sys.stderr)
    for name, (doc, coefficients, size) in series.items():
        kept = truncate(coefficients, size)
        emit_series(out, name, doc, kept)
        if python is not None:
            emit_python_series(python, name, doc, kept)
        print(f"{name}: to u^{len(kept) - 1}", file=sys.stderr)
    out += ["}  // namespace EO_ISA", "}  // namespace evidential_ops", ""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed header is stale")
    args = parser.parse_args()
    python: list[str] = []
    text = generate(python)
    python_text = "\n".join(python).rstrip("\n") + "\n"
    if args.check:
        stale = []
        for path, expected in ((OUT, text), (PY_OUT, python_text)):
            with open(path, encoding="utf-8") as fh:
                if fh.read() != expected:
                    stale.append(path)
        for path in stale:
            print(f"{path} is stale: rerun {os.path.basename(__file__)}", file=sys.stderr)
        return 1 if stale else 0
    with open(OUT, "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(PY_OUT, "w", encoding="utf-8") as fh:
        fh.write(python_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
