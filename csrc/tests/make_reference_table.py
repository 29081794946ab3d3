#!/usr/bin/env python3
"""Writes csrc/tests/reference_table.h: float64 values of every function of csrc/kernels/,
computed with mpmath from the textbook definitions (never from the kernels' own series).

    python3 csrc/tests/make_reference_table.py          # rewrites the header next to this file
    python3 csrc/tests/make_reference_table.py --check  # fails if the committed header is stale

Every value is evaluated at two working precisions and must round to the same double at both,
so a precision too low for a cancelling definition (r(x) = 1/ψ1(x) − x + ½ at x = 1e43 loses
~2·43 digits; the log-determinant of a row at 1e200 loses ~400) is an error here, not a wrong
table. Rounding to double is done exactly (Python's int/int division rounds correctly, also
into the subnormals); mpmath's own float() truncates. Output is deterministic: fixed argument
lists, values printed with repr (shortest string that round-trips, at most 17 digits).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import mpmath
from mpmath import mp, mpf

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "reference_table.h")
MAX_LINE_N = 6
BASE_DPS = 60
CHECK_EXTRA_DPS = 40


# --------------------------------------------------------------------------- rounding and precision


def to_double(v) -> float:
    """Nearest double (ties to even), subnormals and overflow included."""
    v = mpf(v)
    if mpmath.isnan(v):
        raise ValueError("NaN reference value")
    if mpmath.isinf(v):
        return math.inf if v > 0 else -math.inf
    sign, man, exp, bc = v._mpf_
    if man == 0:
        return -0.0 if sign else 0.0
    if exp + bc < -1080:  # below half the smallest subnormal (and 1 << -exp would not fit in memory)
        return -0.0 if sign else 0.0
    if exp + bc > 1030:
        return -math.inf if sign else math.inf
    try:
        mag = float(man << exp) if exp >= 0 else man / (1 << -exp)
    except OverflowError:
        mag = math.inf
    return -mag if sign else mag


def dps_for(*magnitudes) -> int:
    """Digits for definitions that cancel like 1/x² relative to x (r, v, logdet of huge rows)."""
    top = max([1.0] + [abs(float(m)) for m in magnitudes if math.isfinite(float(m)) and m != 0])
    return BASE_DPS + int(2.3 * math.log10(top)) + 10


def stable(fn, dps: int, *args):
    """fn(*args) at dps and dps + CHECK_EXTRA_DPS digits; both must round to the same doubles.
    Arguments are floats (converted by fn, at the working precision)."""
    with mp.workdps(dps):
        first = fn(*args)
    with mp.workdps(dps + CHECK_EXTRA_DPS):
        second = fn(*args)
    one = [to_double(v) for v in (first if isinstance(first, (list, tuple)) else [first])]
    two = [to_double(v) for v in (second if isinstance(second, (list, tuple)) else [second])]
    for a, b in zip(one, two):
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            raise RuntimeError(f"precision {dps} is not enough: {a!r} vs {b!r}")
    return one if isinstance(first, (list, tuple)) else one[0]


def up(x: float) -> float:
    return math.nextafter(x, math.inf)


def down(x: float) -> float:
    return math.nextafter(x, -math.inf)


# --------------------------------------------------------------------------- textbook definitions


def psi(n, x):
    return mp.psi(n, x)


def h_def(x):
    return (x - 1) * psi(0, x) - mp.loggamma(x) - x


def v_def(x):
    return 1 - (x - 1) * psi(1, x)


def r_def(x):
    return 1 / psi(1, x) - x + mpf(1) / 2


def r_prime_def(x):
    return -psi(2, x) / psi(1, x) ** 2 - 1


# --------------------------------------------------------------------------- argument grids


def psi_root() -> float:
    with mp.workdps(50):
        return to_double(mp.findroot(lambda t: mp.psi(0, t), 1.46))


THRESHOLDS = [8.0, 10.0, 16.0, 20.0, 30.0]  # kShiftFrom, digamma/trigamma_difference, kl_v, r series


def around(x: float) -> list[float]:
    return [down(x), x, up(x)]


def special_grid() -> list[float]:
    root = psi_root()
    xs = [1.0, up(1.0), 1.0 + 1e-10, 1.0001, 1.01, 1.1, 1.25, 1.4, *around(root), 1.5, 1.75, 2.0, 2.5, 3.0,
          math.e, math.pi, 4.0, 5.0, 6.0, 7.0, 7.5, 9.0, 12.0, 15.0, 18.0, 25.0, 31.0, 40.0, 50.0, 64.0, 100.0,
          123.456, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 4.9e8, 1e9, 1e10, 1e12, 1e15, 2.0**53, 1e16, 1e20, 1e30,
          1e43, 1e50, 1e100, 1e150, 1e154, 1e160, 1e200, 1e250, 1e300, 1e305, 1e307, 5e307, 1e308,
          1.7e308]
    for t in THRESHOLDS:
        xs += around(t)
    return sorted(set(xs))


def exp_grid() -> list[float]:
    xs = [0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1e-20, -1e-20, 1e-10, -1e-10, 1e-5, -1e-5]
    half_ln2 = math.log(2) / 2  # where the reduction's integer n changes
    for k in (0, 1, 2, 10, 100, 1000, 2000):
        b = (k + 0.5) * math.log(2)
        if b <= 709:
            xs += [*around(b), *[-v for v in around(b)]]
    xs += [half_ln2, 0.25, 0.5, 1.0, 2.0, math.log(2), 3.0, 10.0, 20.0, 37.0, 50.0, 100.0, 200.0, 354.0,
           500.0, 700.0, 705.5, 708.0, 708.5, 708.9, 709.0, down(709.0)]
    xs += [-v for v in (0.25, 0.5, 1.0, 2.0, 3.0, 10.0, 20.0, 37.0, 50.0, 100.0, 200.0, 354.0, 500.0, 700.0,
                        705.5, 707.0, 707.9, down(708.0), 708.0)]
    xs += [-708.0 + 1417.0 * k / 96 for k in range(97)]
    return sorted(set(xs))


def log_grid() -> list[float]:
    dbl_min = 2.2250738585072014e-308
    xs = [dbl_min, up(dbl_min), 1e-307, 1e-300, 1e-200, 1e-100, 1e-20, 1e-10, 1e-5, 0.1, 0.5, down(1.0), 1.0,
          up(1.0), 1 - 1e-10, 1 + 1e-10, 1 + 1e-5, 1.1, *around(math.sqrt(2)), *around(math.sqrt(2) / 2),
          *around(2.0), 1.5, 1.9, 3.0, math.e, 10.0, 100.0, 1e5, 1e8, 4.9e8, 1e12, 1e16, 1e20, 1e43, 1e100,
          1e200, 1e300, 1.7976931348623157e308]
    xs += [2.0**k for k in range(-1022, 1024, 37)]
    xs += [1.0 + k / 64 for k in range(64)]
    return sorted(set(xs))


def log1p_grid() -> list[float]:
    xs = [0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-100, 1e-20, 1e-17, 2.0**-54, 2.0**-53, up(2.0**-53),
          1.1e-16, 2.0**-52, 3e-16, 1e-15, 1e-12, 1e-10, 1e-8, 1e-5, 1e-3, 0.01, 0.1, 0.25,
          *around(math.sqrt(2) - 1), 0.5, 1.0, 2.0, 10.0, 1e3, 1e8, 4.9e8, 1e12, 1e16, 1e20, 1e43, 1e100,
          1e300, 1.7976931348623157e308]
    return sorted(set(xs))


def shift_grid() -> list[float]:
    return sorted(set([1.0, up(1.0), 1.25, psi_root(), 1.5, 2.0, 2.5, 3.0, math.pi, 4.0, 5.5, 7.0, down(8.0),
                       8.0]))


def difference_grid() -> list[tuple[float, float]]:
    """(a, r) pairs. r >= 1 is what the kernels pass (rest = Σ_{j≠y} α_j >= N − 1 >= 1); r in
    [0, 1) is in the documented domain (r >= 0) though no kernel reaches it."""
    root = psi_root()
    a_values = [1.0, up(1.0), root, 2.0, 5.0, 7.999999999999999, 8.0, 9.5, *around(10.0), 12.0, 16.0,
                *around(20.0), 25.0, 30.0, 100.0, 1e3, 1e5, 1e8, 4.9e8, 1e12, 1e20, 1e43]
    r_values = [0.0, 1.0, 1.5, 2.0, 3.0, 7.0, 10.0, 100.0, 1e4, 1e8, 4.9e8, 1e12, 1e20, 1e43]
    pairs = [(a, r) for a in a_values for r in r_values]
    for a in (1.0, 2.0, 5.0, 9.5, 10.0, 19.0, 20.0, 100.0, 1e8):
        pairs += [(a, r) for r in (1e-12, 1e-6, 0.25)]
    for a in (1e100, 1e154, 1e200, 1e300):
        pairs += [(a, 1.0), (a, a), (a, 3.0 * a)]
    # a·(a + r) beyond DBL_MAX with a moderate a (one distractor with exp evidence near s/τ = 709).
    pairs += [(10.0, 1e300), (25.0, 1e307), (1e5, 1e305), (3.3e8, 1e300), (1e3, 1.5e308)]
    return pairs


EVIDENCE_KINDS = ["exp", "relu", "softplus", "exp_tanh"]


def evidence_grid(kind: str) -> list[float]:
    common = [0.0, 5e-324, 1e-300, -1e-300, 1e-10, -1e-10, 0.1, -0.1, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 5.0,
              -5.0, 10.0, -10.0, 20.0, -20.0]
    extra = {
        "exp": [-1e300, -745.0, -709.0, -708.0, -707.5, -700.0, -100.0, -37.0, 37.0, 100.0, 354.0, 700.0,
                708.9, 709.0],
        "relu": [-1e300, -1e8, 1e8, 4.9e8, 1e43, 1e300],
        "softplus": [-1e300, -800.0, -745.0, -708.0, -700.0, -40.0, -37.0, 37.0, 40.0, 700.0, 708.0, 709.0,
                     710.0, 800.0, 1e10, 1e43, 1e300],
        "exp_tanh": [-1e300, -40.0, -25.0, -19.0, -15.0, -12.0, -1e-8, 1e-8, 12.0, 15.0, 19.0, 25.0, 40.0,
                     1e300],
    }[kind]
    return sorted(set(common + extra))


def evidence_def(kind: str, x: float):
    x = mpf(x)
    if kind == "exp":
        e = mp.exp(x)
        return e + 1, e / (e + 1)
    if kind == "relu":
        # g'(0) = 0: the subgradient torch's relu backward uses and the kernel implements.
        return (x + 1, 1 / (x + 1)) if x > 0 else (mpf(1), mpf(0))
    if kind == "softplus":
        e = mp.log1p(mp.exp(x)) if x < 0 else x + mp.log1p(mp.exp(-x))
        sig = 1 / (1 + mp.exp(-x))
        return e + 1, sig / (e + 1)
    t = mp.tanh(x)
    e = mp.exp(t)
    return e + 1, e * mp.sech(x) ** 2 / (e + 1)


# --------------------------------------------------------------------------- line (row) cases

LINE_ROWS = [  # (α vector, target index)
    ([1.0, 1.0], 0),
    ([2.5, 1.0, 1.4616321449683622], 0),
    ([1.0, 3.0, 1.25], 1),
    ([7.999999999999999, 8.0, 16.0, 30.0], 2),
    ([1e3, 1.0, 2.0, 1.5, 3.0], 0),
    ([1.0, 1e3, 20.0, 10.0, 1.0001], 0),
    ([1e8, 1.0, 1.0, 1.0], 0),
    ([4.9e8, 4.8e8, 1.0, 2.0], 0),
    ([4.8e8, 4.9e8, 1.5, 2.0, 3.0, 1.0], 1),
    ([1e12, 1e5, 20.0, 10.0, 1.2, 1.0], 0),
    ([1e43, 1.0, 1.0], 0),
    ([1.0, 1e43, 1.0], 0),
    ([1e43, 1e43, 2e43, 1.0], 3),
    ([1e20, 5e19, 31.0], 1),
    ([1e200, 1e200, 1.0], 0),  # strength·α overflows double; α² too
    ([5e307, 1.0, 1.0], 0),  # ψ1(S) is subnormal
]
TARGET_SCALES = [0.0, 0.3, 1.0]
TERMS = ["risk", "kl", "mse", "fmse", "logdet"]


def line_terms_def(alpha, y, c):
    """SPEC §2 per-row terms, textbook forms, target vector c·one-hot(y)."""
    n = len(alpha)
    s = mp.fsum(alpha)
    t = [c if j == y else mpf(0) for j in range(n)]
    p = [a / s for a in alpha]
    risk = mp.fsum(t[j] * (psi(0, s) - psi(0, alpha[j])) for j in range(n))
    at = [t[j] + (1 - t[j]) * alpha[j] for j in range(n)]
    st = mp.fsum(at)
    kl = (mp.loggamma(st) - mp.loggamma(n) - mp.fsum(mp.loggamma(a) for a in at)
          + mp.fsum((a - 1) * (psi(0, a) - psi(0, st)) for a in at))
    mse = mp.fsum((t[j] - p[j]) ** 2 + p[j] * (1 - p[j]) / (s + 1) for j in range(n))
    fmse = mp.fsum(((t[j] - p[j]) ** 2 + alpha[j] * (s - alpha[j]) / (s**2 * (s + 1))) * psi(1, alpha[j])
                   for j in range(n))
    logdet = mp.fsum(mp.log(psi(1, a)) for a in alpha) + mp.log(1 - psi(1, s) * mp.fsum(1 / psi(1, a) for a in alpha))
    return [risk, kl, mse, fmse, logdet]


def line_stats_def(alpha, y):
    """The LineStat accumulators of line_terms.h, exact."""
    off = [a for j, a in enumerate(alpha) if j != y]
    return [
        alpha[y],
        mp.fsum(off),
        mp.fsum(h_def(a) for a in off),
        mp.fsum(a * a for a in off) * mp.mpf(2) ** -1022,  # kept scaled by 2^-1022 (line_terms.h)
        mp.fsum(a * (a + 1) * psi(1, a) for a in off),
        mp.fsum(mp.log(psi(1, a)) for a in alpha),
        mp.fsum(r_def(a) for a in alpha),
    ]


def line_gradient_def(alpha, y, c):
    """α_j·∂L_t/∂α_j of every term t (rows) for every j (columns), differentiated by hand from
    line_terms_def's textbook forms; p_j = α_j/S, so α_j·∂p_k/∂α_j = p_j([k=j] − p_k)."""
    n = len(alpha)
    s = mp.fsum(alpha)
    s1 = s + 1
    t = [c if j == y else mpf(0) for j in range(n)]
    p = [a / s for a in alpha]
    p2 = mp.fsum(q * q for q in p)
    psi1 = [psi(1, a) for a in alpha]
    psi2 = [psi(2, a) for a in alpha]
    at = [t[j] + (1 - t[j]) * alpha[j] for j in range(n)]
    st = mp.fsum(at)
    inv_psi1_sum = mp.fsum(1 / q for q in psi1)
    det = 1 - psi(1, s) * inv_psi1_sum
    y_val = [(t[k] - p[k]) ** 2 + p[k] * (1 - p[k]) / s1 for k in range(n)]
    out = [[], [], [], [], []]
    for j in range(n):
        a = alpha[j]
        dp = [p[j] * ((1 if k == j else 0) - p[k]) for k in range(n)]  # α_j·∂p_k/∂α_j
        # risk = c(ψ(S) − ψ(α_y))
        out[0].append(c * a * psi(1, s) - (c * a * psi1[j] if j == y else 0))
        # kl: ∂kl/∂α̃_j = (α̃_j − 1)ψ1(α̃_j) − (S̃ − N)ψ1(S̃), and ∂α̃_j/∂α_j = 1 − t_j
        out[1].append(a * (1 - t[j]) * ((at[j] - 1) * psi(1, at[j]) - (st - n) * psi(1, st)))
        # mse = Σt² − 2·Σ t_k p_k + P2·S/(S+1) + 1/(S+1), P2 = Σ p_k²
        out[2].append(-2 * mp.fsum(t[k] * dp[k] for k in range(n)) + 2 * p[j] * (p[j] - p2) * s / s1
                      + (p2 - 1) * a / s1**2)
        # fmse = Σ Y_k ψ1(α_k), Y_k = (t_k − p_k)² + p_k(1 − p_k)/(S + 1)
        dy = [-2 * (t[k] - p[k]) * dp[k] + (1 - 2 * p[k]) * dp[k] / s1 - p[k] * (1 - p[k]) * a / s1**2
              for k in range(n)]
        out[3].append(mp.fsum(psi1[k] * dy[k] for k in range(n)) + y_val[j] * a * psi2[j])
        # logdet = Σ ln ψ1(α_k) + ln D, D = 1 − ψ1(S)·Σ 1/ψ1(α_k)
        d_det = -a * psi(2, s) * inv_psi1_sum + psi(1, s) * a * psi2[j] / psi1[j] ** 2
        out[4].append(a * psi2[j] / psi1[j] + d_det / det)
    return out


def line_gradient_numeric(alpha, y, c, j):
    """Central difference of line_terms_def in ln α_j: checks line_gradient_def's algebra. Its
    error, ~step² plus rounding/step, is far below the tolerance the caller applies."""
    step = mpf(10) ** -(mp.dps // 4)
    plus = [a * mp.exp(step) if k == j else a for k, a in enumerate(alpha)]
    minus = [a * mp.exp(-step) if k == j else a for k, a in enumerate(alpha)]
    lp, lm = line_terms_def(plus, y, c), line_terms_def(minus, y, c)
    return [(u - v) / (2 * step) for u, v in zip(lp, lm)]


def line_case(alpha_d, y, c_d):
    n = len(alpha_d)
    dps = dps_for(sum(alpha_d))
    stats = stable(lambda al: line_stats_def([mpf(a) for a in al], y), dps, alpha_d)
    terms = stable(lambda al, c: line_terms_def([mpf(a) for a in al], y, mpf(c)), dps, alpha_d, c_d)
    flat = stable(lambda al, c: [g for term in line_gradient_def([mpf(a) for a in al], y, mpf(c)) for g in term],
                  dps, alpha_d, c_d)
    grads = [flat[t * n:(t + 1) * n] for t in range(len(TERMS))]
    if sum(alpha_d) < 1e50:  # numeric differentiation is cheap at these precisions
        with mp.workdps(2 * dps + 40):
            alpha, c = [mpf(a) for a in alpha_d], mpf(c_d)
            exact = line_gradient_def(alpha, y, c)
            for j in range(n):
                numeric = line_gradient_numeric(alpha, y, c, j)
                for t in range(len(TERMS)):
                    if abs(numeric[t] - exact[t][j]) > mpf(10) ** -(dps // 2) * (1 + abs(exact[t][j])):
                        raise RuntimeError(f"gradient algebra: {alpha_d} y={y} c={c_d} {TERMS[t]} j={j}: "
                                           f"{exact[t][j]} vs numeric {numeric[t]}")
    return stats, terms, grads


# --------------------------------------------------------------------------- output


def lit(v: float) -> str:
    if math.isinf(v):
        return "kInf" if v > 0 else "-kInf"
    s = repr(float(v))
    return s


def pad(values) -> list[float]:
    return list(values) + [0.0] * (MAX_LINE_N - len(values))


def row(*values) -> str:
    return "{" + ", ".join(lit(v) for v in values) + "}"


def emit_array(out, ctype, name, comment, rows):
    out.append(f"// {comment}")
    out.append(f"inline constexpr {ctype} {name}[] = {{")
    for r in rows:
        out.append(f"    {r},")
    out.append("};")
    out.append("")


def generate() -> str:
    out = [
        "// Generated by csrc/tests/make_reference_table.py (mpmath " + mpmath.__version__ + "): do not edit.",
        "// Expected values are the doubles nearest the exact values of the textbook definitions.",
        "#pragma once",
        "",
        "#include <limits>",
        "",
        "namespace eo_reference {",
        "",
        "inline constexpr double kInf = std::numeric_limits<double>::infinity();",
        f"inline constexpr int kMaxLineN = {MAX_LINE_N};",
        "",
        "struct Unary { double x; double value; };",
        "struct Binary { double a; double r; double value; };",
        "struct Shift { double x; double log_p; double h1; double h2; double h3; };",
        "struct Remainder { double x; double r; double r_prime; };",
        "struct Evidence { double x; double alpha; double rho; };",
        "// element_forward (kl_h, fisher, log_trigamma, remainder) and element_backward (kl_v,",
        "// fisher_slope, logdet_ratio, logdet_r_prime) of element_terms.h.",
        "struct Element { double x; double kl_h, fisher, log_trigamma, remainder, kl_v, fisher_slope, logdet_ratio,"
        " logdet_r_prime; };",
        "struct Line {",
        "  int n, target;",
        "  double c;",
        "  double alpha[kMaxLineN];",
        "  double stats[7];            // LineStat order",
        "  double terms[5];            // Term order: risk, kl, mse, fmse, logdet",
        "  double grad[5][kMaxLineN];  // α_j·∂term/∂α_j",
        "};",
        "",
    ]

    def unary(name, comment, grid, fn, dps_of=dps_for):
        rows = [row(x, stable(lambda v: fn(mpf(v)), dps_of(x), x)) for x in grid]
        emit_array(out, "Unary", name, comment, rows)

    sg = special_grid()
    unary("kExp", "exp(x) on [-708, 709]", exp_grid(), mp.exp, lambda x: BASE_DPS)
    unary("kLog", "ln x for normal x > 0", log_grid(), mp.log, lambda x: BASE_DPS)
    unary("kLog1p", "ln(1 + y), y >= 0", log1p_grid(), mp.log1p, lambda x: BASE_DPS)
    unary("kDigamma", "ψ(x), x >= 1", sg, lambda x: psi(0, x))
    unary("kTrigamma", "ψ1(x)", sg, lambda x: psi(1, x))
    unary("kTetragamma", "ψ2(x)", sg, lambda x: psi(2, x))
    unary("kLgamma", "lnΓ(x) (+inf where it exceeds DBL_MAX)", sg, mp.loggamma)
    unary("kKlH", "h(x) = (x − 1)ψ(x) − lnΓ(x) − x", sg, h_def)
    unary("kKlV", "v(x) = 1 − (x − 1)ψ1(x)", sg, v_def)

    rows = [row(x, *stable(lambda v: [r_def(mpf(v)), r_prime_def(mpf(v))], dps_for(x), x)) for x in sg]
    emit_array(out, "Remainder", "kFisherRemainder", "r(x) = 1/ψ1(x) − x + ½, r'(x) = −ψ2/ψ1² − 1", rows)

    def shift_def(x):
        ks = [x + k for k in range(8)]
        return [mp.fsum(mp.log(t) for t in ks), mp.fsum(1 / t for t in ks), mp.fsum(1 / t**2 for t in ks),
                mp.fsum(1 / t**3 for t in ks)]

    rows = [row(x, *stable(lambda v: shift_def(mpf(v)), BASE_DPS, x)) for x in shift_grid()]
    emit_array(out, "Shift", "kShiftSums", "Σ_{k<8} ln(x+k), 1/(x+k), 1/(x+k)², 1/(x+k)³ on [1, 8]", rows)

    def element_def(x):
        p1, p2 = psi(1, x), psi(2, x)
        return [h_def(x), x * (x + 1) * p1, mp.log(p1), r_def(x), x * v_def(x),
                (2 * x + 1) * p1 + x * (x + 1) * p2, x * p2 / p1, x * r_prime_def(x)]

    rows = [row(x, *stable(lambda v: element_def(mpf(v)), dps_for(x), x)) for x in sg]
    emit_array(out, "Element", "kElement", "per-element forward/backward factors (element_terms.h)", rows)

    pairs = difference_grid()
    rows = [row(a, r, stable(lambda u, v: psi(0, mpf(u) + mpf(v)) - psi(0, mpf(u)), dps_for(a, r), a, r))
            for a, r in pairs]
    emit_array(out, "Binary", "kDigammaDifference", "ψ(a + r) − ψ(a)", rows)
    rows = [row(a, r, stable(lambda u, v: psi(1, mpf(u) + mpf(v)) - psi(1, mpf(u)), dps_for(a, r), a, r))
            for a, r in pairs]
    emit_array(out, "Binary", "kTrigammaDifference", "ψ1(a + r) − ψ1(a)", rows)

    for kind in EVIDENCE_KINDS:
        rows = [row(x, *stable(lambda k, v: list(evidence_def(k, v)), BASE_DPS, kind, x)) for x in evidence_grid(kind)]
        name = "kEvidence" + "".join(p.capitalize() for p in kind.split("_"))
        emit_array(out, "Evidence", name, f"{kind} evidence: α = g(x) + 1, ρ = g'(x)/α", rows)

    out.append("// SPEC §2 terms of one line (textbook formulas), their LineStat inputs and α_j·∂term/∂α_j.")
    out.append("inline constexpr Line kLines[] = {")
    for alpha_d, y in LINE_ROWS:
        for c_d in TARGET_SCALES:
            stats, terms, grads = line_case(alpha_d, y, c_d)
            grad_rows = ", ".join(row(*pad(g)) for g in grads)
            out.append(f"    {{{len(alpha_d)}, {y}, {lit(c_d)}, {row(*pad(alpha_d))},")
            out.append(f"     {row(*stats)},")
            out.append(f"     {row(*terms)},")
            out.append(f"     {{{grad_rows}}}}},")
    out.append("};")
    out.append("")
    out.append("}  // namespace eo_reference")
    out.append("")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the existing header instead of writing")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    text = generate()
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.out} is stale: rerun {os.path.relpath(__file__)}", file=sys.stderr)
                return 1
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
