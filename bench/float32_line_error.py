#!/usr/bin/env python3
"""What float32 element math costs the per-line loss terms, against SPEC §5's tolerances.

    python bench/float32_line_error.py     # writes bench/results/float32_line_error.{md,json}

The float32 special functions (csrc/kernels/special_functions_f32.h, through the sweep's C++
driver, generic build) replace the float64 ones in the per-element statistics of every row of a
K×K similarity matrix; everything else stays float64, as line_terms.h has it. Two separate error
sources are measured, each as |Δterm| / max(|term|, floor) with SPEC §5's floors (1e-3 for kl and
logdet; an absolute 1e-10 for risk, mse, fmse):
- "special": Σ (h(α) + 1), Σ α(α+1)ψ1(α), Σ ln ψ1(α), Σ r(α) from the float32 functions at the same
  α, summed in float64 ("f64 sums") or in float32 (numpy's pairwise float32 sum: "f32 sums"); the
  row "kl, Σ h statistic" shows what accumulating float32 h itself would cost instead of h + 1;
- "α rounding": the float64 terms (evidential_ops.reference) at α rounded to float32, against α
  in float64, with x = s/τ formed in float64 ("x f64") or as a float32 product ("x f32"). exp
  evidence beyond FLT_MAX keeps α in float64 (the log-space entry, polygammas_of_log).
The reference is the float64 reference backend on the same float32 similarities.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import float32_special_sweep as sweep  # noqa: E402
from evidential_ops.reference import special, terms  # noqa: E402

RESULTS = os.path.join(HERE, "results", "float32_line_error")
TOLERANCE = {"risk": 1e-5, "kl": 1e-5, "mse": 1e-5, "fmse": 1e-4, "logdet": 1e-4}  # SPEC §5, float32
RELATIVE_FLOOR = {"kl": 1e-3, "logdet": 1e-3}  # relative to max(|ref|, floor)
ABSOLUTE_FLOOR = 1e-10  # risk, mse, fmse: near-zero terms
LOG_FLT_MAX = 88.72


def similarities(k: int, d: int, positive_cosine: float | None, seed: int, shift: float = 0.0) -> np.ndarray:
    g = np.random.default_rng(seed)
    x = g.standard_normal((k, d))
    y = g.standard_normal((k, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    if positive_cosine is not None:  # y_i = c·x_i + sqrt(1 − c²)·(unit vector orthogonal to x_i)
        noise = y - (y * x).sum(1, keepdims=True) * x
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        y = positive_cosine * x + math.sqrt(1 - positive_cosine**2) * noise
    return np.clip(x @ y.T + shift, -1.0, 1.0).astype(np.float32)


def evidence(s: np.ndarray, tau: float, kind: str, x_in_float32: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(α64, α32 as float64 values, ln α as float32 where α exceeds float32, else nan)."""
    x64 = s.astype(np.float64) / tau
    x32 = (s * np.float32(1.0 / tau)).astype(np.float64) if x_in_float32 else x64
    if kind == "exp":
        alpha64 = np.exp(x64) + 1.0
        with np.errstate(over="ignore"):
            e32 = np.exp(x32).astype(np.float32)
        alpha32 = (e32 + np.float32(1.0)).astype(np.float64)
        beyond = x32 > LOG_FLT_MAX
        alpha32 = np.where(beyond, np.exp(x32) + 1.0, alpha32)
        log_alpha = np.where(beyond, x32, np.nan).astype(np.float32)
    elif kind == "relu":
        alpha64 = np.maximum(x64, 0.0) + 1.0
        alpha32 = (np.maximum(x32, 0.0).astype(np.float32) + np.float32(1.0)).astype(np.float64)
        log_alpha = np.full(s.shape, np.nan, dtype=np.float32)
    else:  # exp_tanh
        alpha64 = np.exp(np.tanh(x64)) + 1.0
        alpha32 = (np.exp(np.tanh(x32).astype(np.float32)).astype(np.float32) + np.float32(1.0)).astype(np.float64)
        log_alpha = np.full(s.shape, np.nan, dtype=np.float32)
    return alpha64, alpha32, log_alpha


def float32_elements(driver: str, alpha32: np.ndarray, log_alpha: np.ndarray) -> dict[str, np.ndarray]:
    """h, xψ1, ln ψ1, r of the float32 functions (log-space entry where α exceeds float32)."""
    names = sweep.function_names(driver)
    flat = alpha32.ravel()
    in_float = ~np.isfinite(log_alpha.ravel())
    out = {}
    values = sweep.evaluate(driver, "alpha", np.where(in_float, flat, 1.0).astype(np.float32), len(names["alpha"]))
    logs = sweep.evaluate(driver, "log_alpha", np.where(in_float, 8.0, log_alpha.ravel()).astype(np.float32),
                          len(names["log_alpha"]))
    for fn in ("kl_h", "kl_h_plus_one", "x_trigamma", "log_trigamma", "remainder"):
        a = values[names["alpha"].index(fn), 1].astype(np.float64)  # the simd path, as the kernels
        b = logs[names["log_alpha"].index(fn), 1].astype(np.float64)
        out[fn] = np.where(in_float, a, b).reshape(alpha32.shape)
    return out


def row_sums(values: np.ndarray, off_target_only: bool, float32_sum: bool) -> np.ndarray:
    v = values.copy()
    if off_target_only:
        np.fill_diagonal(v, 0.0)
    if float32_sum:
        return v.astype(np.float32).sum(axis=1, dtype=np.float32).astype(np.float64)
    return v.sum(axis=1)


def relative(delta: np.ndarray, ref: np.ndarray, term: str) -> float:
    if term in RELATIVE_FLOOR:
        scale = np.maximum(np.abs(ref), RELATIVE_FLOOR[term])
        return float(np.max(np.abs(delta) / scale))
    return float(np.max(np.abs(delta) / (np.abs(ref) + ABSOLUTE_FLOOR / TOLERANCE[term])))


def measure(case: dict, driver: str) -> dict:
    s = similarities(case["k"], case["d"], case.get("positive_cosine"), case.get("seed", 0), case.get("shift", 0.0))
    tau, kind = case["tau"], case["evidence"]
    alpha64, alpha32, log_alpha = evidence(s, tau, kind, x_in_float32=False)
    t = lambda a: {k: v.numpy() for k, v in terms.row_terms(torch.from_numpy(a)).items()}  # noqa: E731
    ref = t(alpha64)
    out = {"case": case, "terms": {}}
    # α rounding, x formed in float64 and in float32
    on_alpha32 = t(alpha32)
    _, alpha32_x32, _ = evidence(s, tau, kind, x_in_float32=True)
    on_alpha32_x32 = t(alpha32_x32)
    # float32 special functions at α32, float64 special functions at α32
    f32 = float32_elements(driver, alpha32, log_alpha)
    a = torch.from_numpy(alpha32)
    h64 = special.kl_h(a).numpy()
    lt64 = special.log_trigamma(a).numpy()
    r64 = special.inverse_trigamma_remainder(a).numpy()
    fisher64 = ((a + 1.0) * a * special.trigamma(a)).numpy()
    fisher32 = (alpha32 + 1.0) * f32["x_trigamma"]
    n = alpha32.shape[1]
    strength = alpha32.sum(axis=1)
    r_strength = special.inverse_trigamma_remainder(torch.from_numpy(strength)).numpy()
    for float32_sum in (False, True):
        label = "f32 sums" if float32_sum else "f64 sums"
        # the statistic is Σ (h + 1); the line adds −(N − 1) in float64 (exactly)
        d_kl = row_sums(f32["kl_h_plus_one"], True, float32_sum) - row_sums(h64 + 1.0, True, False)
        d_kl_plain_h = row_sums(f32["kl_h"], True, float32_sum) - row_sums(h64, True, False)
        d_fisher = row_sums(fisher32, True, float32_sum) - row_sums(fisher64, True, False)
        m64 = 0.5 * (n - 1) + r_strength - row_sums(r64, False, False)
        m32 = 0.5 * (n - 1) + r_strength - row_sums(f32["remainder"], False, float32_sum)
        d_logdet = row_sums(f32["log_trigamma"], False, float32_sum) - row_sums(lt64, False, False) + np.log(m32 / m64)
        # fmse = F/(S(S+1)) + target part: ΔF enters divided by S(S+1)
        d_fmse = d_fisher / (strength * (strength + 1.0))
        for term, delta in (("kl", d_kl), ("kl, Σ h statistic", d_kl_plain_h), ("fmse", d_fmse),
                            ("logdet", d_logdet)):
            out["terms"].setdefault(term, {})[f"special, {label}"] = relative(delta, ref[term.split(",")[0]],
                                                                               term.split(",")[0])
    for term in ("risk", "kl", "mse", "fmse", "logdet"):
        out["terms"].setdefault(term, {})["α rounding, x f64"] = relative(on_alpha32[term] - ref[term], ref[term], term)
        out["terms"][term]["α rounding, x f32"] = relative(on_alpha32_x32[term] - ref[term], ref[term], term)
    out["max_alpha"] = float(alpha64.max())
    return out


CASES = [
    {"name": "random, τ = 0.05", "k": 113, "d": 203, "tau": 0.05, "evidence": "exp"},
    {"name": "positives at cosine 0.99, τ = 0.05", "k": 113, "d": 203, "tau": 0.05, "evidence": "exp",
     "positive_cosine": 0.99},
    {"name": "positives at cosine 0.99, τ = 0.01 (α beyond FLT_MAX)", "k": 113, "d": 203, "tau": 0.01,
     "evidence": "exp", "positive_cosine": 0.99},
    {"name": "UML exp_tanh, τ = 0.1", "k": 113, "d": 203, "tau": 0.1, "evidence": "exp_tanh"},
    {"name": "exp evidence near 0: similarities shifted by −0.6, τ = 0.05 (α ≈ 1 + 6e-6, KL ≈ 0)", "k": 113,
     "d": 203, "tau": 0.05, "evidence": "exp", "shift": -0.6},
    {"name": "exp evidence small: similarities shifted by −0.35, τ = 0.05 (α ≈ 1 + 1e-3)", "k": 113, "d": 203,
     "tau": 0.05, "evidence": "exp", "shift": -0.35},
    {"name": "exp evidence small: similarities shifted by −0.35, τ = 0.05, K = 2048", "k": 2048, "d": 512,
     "tau": 0.05, "evidence": "exp", "shift": -0.35},
    {"name": "relu, similarities shifted by −0.95, τ = 1 (α = 1 exactly, KL = 0)", "k": 113, "d": 203,
     "tau": 1.0, "evidence": "relu", "shift": -0.95},
    {"name": "random, τ = 0.05, K = 2048", "k": 2048, "d": 512, "tau": 0.05, "evidence": "exp"},
    {"name": "positives at cosine 0.99, τ = 0.05, K = 2048", "k": 2048, "d": 512, "tau": 0.05, "evidence": "exp",
     "positive_cosine": 0.99},
]
SOURCES = ["special, f64 sums", "special, f32 sums", "α rounding, x f64", "α rounding, x f32"]


def markdown(results: list[dict]) -> str:
    lines = ["# Float32 element math: error of the per-line terms", "",
             "Written by `bench/float32_line_error.py` (its docstring says what is measured). Each cell: the",
             "worst row's |Δterm| / max(|term|, floor), SPEC §5's floors; tolerance in the header",
             "(float32, SPEC §5). **Bold**: above the tolerance.", ""]
    for r in results:
        lines += [f"## {r['case']['name']} (K = {r['case']['k']}, max α = {r['max_alpha']:.3g})", "",
                  "| term (tolerance) | " + " | ".join(SOURCES) + " |", "|---|" + "---:|" * len(SOURCES)]
        for term, cells in r["terms"].items():
            row = []
            for src in SOURCES:
                v = cells.get(src)
                tolerance = TOLERANCE[term.split(",")[0]]
                row.append("" if v is None else (f"**{v:.1e}**" if v > tolerance else f"{v:.1e}"))
            lines.append(f"| {term} ({TOLERANCE[term.split(',')[0]]:g}) | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    drivers = sweep.build_drivers()
    driver = drivers.get("generic") or next(iter(drivers.values()))
    results = []
    for case in CASES:
        results.append(measure(case, driver))
        print(case["name"], file=sys.stderr)
    with open(RESULTS + ".json", "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
        fh.write("\n")
    text = markdown(results)
    with open(RESULTS + ".md", "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
