#!/usr/bin/env python3
"""Sweeps the float32 special functions of csrc/kernels/ against mpmath and tabulates their
error in ulps of the float32 result, per function and interval.

    python bench/float32_special_sweep.py              # full sweep: writes bench/results/float32_special_functions.{md,json}
    python bench/float32_special_sweep.py --reduced    # the CI subset: checks against the committed bounds
    python bench/float32_special_sweep.py --write-ctest-table  # writes csrc/tests/float32_reference_table.h

What is compared with what:
- computed: the exact C++ code of csrc/kernels/special_functions_f32.h and elementary_f32.h, through
  csrc/tests/float32_special_values.cpp built by CMakeLists.txt for every instruction-set variant
  this CPU runs (generic, avx2, avx512; the extension's flags), each function evaluated both by
  scalar code and inside an `omp simd` loop: the reported error is the worst over all of them;
- reference: mpmath from the textbook definitions (psi, loggamma, exp, log, log1p) at 50 digits plus
  2.2·log10(x) + 10 more, so that the definitions that cancel (r, x·r', x·v, h, f' lose up to
  2·log10 x digits) still carry 50; rounded to float64 (2^-29 of a float32 ulp) for the comparison;
- error: |computed − reference| / ulp, ulp the spacing of float32 at the reference (2^-149 below
  FLT_MIN); a reference beyond FLT_MAX must come out as +inf (lnΓ above 4e36).
Points (every one a float32, the full sweep a superset of the reduced one):
- α in [1, 2^24]: every binade, evenly spaced in the float32 bit patterns (8192 per binade below 8,
  where the fits are, 2048 above), plus every float32 within 64 ulps of 1, of the branch points 2, 4,
  8 and of the zeros of ψ (1.4616) and ln ψ1 (1.4263);
- α in (2^24, FLT_MAX]: 256 per binade, plus FLT_MAX and the 64 floats below it;
- ln α in [ln 8, 1000] for the log-space entry (α beyond FLT_MAX), log-spaced;
- t in [−1, 1] for exp_tanh's functions of t (at α = 1 + e^t): evenly spaced in value (2^-15 apart,
  65537 points), plus every float within 64 ulps of ±1 and
  the zero of ln ψ1 (t1 = ln(x1 − 1) ≈ −0.853);
- exp on [−104, 88.73], log on [FLT_MIN, FLT_MAX], log1p on [0, FLT_MAX]: their edges plus even
  spacing (exp) or every binade (log, log1p).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from mpmath import mp, mpf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "ctest")
RESULTS = os.path.join(ROOT, "bench", "results", "float32_special_functions")
CTEST_TABLE = os.path.join(ROOT, "csrc", "tests", "float32_reference_table.h")
VARIANTS = ("generic", "avx2", "avx512")
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
LOG_FLT_MAX = math.log(FLT_MAX)
BASE_DPS = 50

# --------------------------------------------------------------------------------------- points


def f32(v) -> np.float32:
    return np.float32(v)


def floats_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits_of(x) -> int:
    return int(np.float32(x).view(np.uint32))


def around(x: float, n: int) -> list[float]:
    """The n float32 values below x, x's float32, and the n above (x != 0)."""
    b = bits_of(abs(x))
    values = list(floats_from_bits(range(b - n, b + n + 1)))
    return values if x > 0 else [-v for v in values]


def binade_points(lo_exp: int, hi_exp: int, per_binade: int) -> list[float]:
    """per_binade float32 values evenly spaced in bit pattern in each [2^e, 2^(e+1))."""
    out = []
    for e in range(lo_exp, hi_exp):
        b0, b1 = (e + 127) << 23, (e + 128) << 23  # bit patterns of 2^e and 2^(e+1) (+inf for e = 127)
        out += list(floats_from_bits(np.linspace(b0, b1, per_binade, endpoint=False).astype(np.int64)))
    return out


def digamma_root() -> float:
    with mp.workdps(30):
        return float(mp.findroot(lambda t: mp.psi(0, t), 1.46))


def trigamma_one() -> float:
    with mp.workdps(30):
        return float(mp.findroot(lambda t: mp.psi(1, t) - 1, 1.43))


def alpha_points(reduced: bool) -> np.ndarray:
    # The reduced grid takes every k-th point of the full grid's regular parts and the nearest
    # neighbours of its edges: a subset, so its maxima can never exceed the full sweep's.
    step = 128 if reduced else 1
    near = 4 if reduced else 64
    pts = binade_points(0, 3, 8192)[::step] + binade_points(3, 24, 2048)[::step * 2]
    pts += binade_points(24, 128, 256)[:: step // 8 if reduced else 1]
    pts += around(1.0, near)[near:]
    for x in (2.0, 4.0, 8.0, digamma_root(), trigamma_one()):
        pts += around(x, near)
    pts += [2.0**24, 2.0**126, 2.0**127]
    b = bits_of(FLT_MAX)
    pts += list(floats_from_bits(range(b - near, b + 1)))
    return np.unique(np.asarray(pts, dtype=np.float32))


def log_alpha_points(reduced: bool) -> np.ndarray:
    full = np.geomspace(math.log(8.0), 1000.0, 2001).astype(np.float32)
    pts = list(full[:: 40 if reduced else 1]) + around(math.log(8.0), 2)[2:] + around(LOG_FLT_MAX, 2)
    return np.unique(np.asarray([p for p in pts if p >= f32(math.log(8.0))], dtype=np.float32))


def tanh_trigamma_one() -> float:
    with mp.workdps(30):
        return float(mp.log(mp.findroot(lambda t: mp.psi(1, t) - 1, 1.43) - 1))


def tanh_points(reduced: bool) -> np.ndarray:
    step = 2.0**-9 if reduced else 2.0**-15
    near = 4 if reduced else 64
    pts = list(np.arange(-1.0, 1.0 + step / 2, step))
    for x in (-1.0, 1.0, tanh_trigamma_one()):
        pts += around(x, near)
    return np.unique(np.asarray([p for p in pts if -1.0 <= p <= 1.0], dtype=np.float32))


def exp_points(reduced: bool) -> np.ndarray:
    full = np.linspace(-103.97, 88.72, 200001).astype(np.float32)
    pts = list(full[:: 100 if reduced else 1])
    near = 2 if reduced else 16
    for x in (88.7228394, -103.972076, math.log(FLT_MIN)):
        pts += around(x, near)
    pts += [0.0] + [s * 2.0**-k for k in (10, 24, 40, 100, 126, 149) for s in (1, -1)]
    for k in (0, 1, 2, 10, 100, 127):
        pts += around((k + 0.5) * math.log(2), near) + around(-(k + 0.5) * math.log(2), near)
    pts = [p for p in pts if -103.972076 <= p <= 88.7228394]
    return np.unique(np.asarray(pts, dtype=np.float32))


def log_points(reduced: bool) -> np.ndarray:
    pts = binade_points(-126, 128, 16 if reduced else 512) + binade_points(-1, 1, 128 if reduced else 16384)
    pts += around(1.0, 4 if reduced else 64) + around(math.sqrt(2), 4 if reduced else 64)
    pts += [FLT_MIN, FLT_MAX]
    return np.unique(np.asarray([p for p in pts if p >= FLT_MIN], dtype=np.float32))


def log1p_points(reduced: bool) -> np.ndarray:
    pts = binade_points(-126, 128, 8 if reduced else 256) + list(np.linspace(0, 1, 201 if reduced else 20001))
    pts += [0.0, 2.0**-24, 2.0**-23, math.sqrt(2) - 1]
    return np.unique(np.asarray(pts, dtype=np.float32))


# ----------------------------------------------------------------------------------- references


def dps_for(x: float) -> int:
    return BASE_DPS + max(0, int(2.2 * math.log10(max(x, 1.0)))) + 10


def alpha_reference(x: float) -> list[float]:
    """Textbook definitions at x (order: the driver's 'alpha' list)."""
    with mp.workdps(dps_for(x)):
        return [float(v) for v in alpha_definitions(mpf(x))]


def alpha_definitions(a):
    p0, p1, p2, lg = mp.psi(0, a), mp.psi(1, a), mp.psi(2, a), mp.loggamma(a)
    return [
        p0,  # digamma
        lg,  # lgamma
        a * p1,  # x_trigamma
        a * a * p2,  # x2_tetragamma
        (a - 1) * p0 - lg - a,  # kl_h
        (a - 1) * p0 - lg - a + 1,  # kl_h_plus_one
        a * (1 - (a - 1) * p1),  # x_kl_v
        mp.log(p1),  # log_trigamma
        1 / p1 - a + mpf(1) / 2,  # remainder
        a * (-p2 / p1**2 - 1),  # x_remainder_prime
        (2 * a + 1) * p1 + a * (a + 1) * p2,  # fisher_slope
        a * p2 / p1,  # tetragamma_trigamma_ratio
    ]


def log_alpha_reference(log_x: float) -> list[float]:
    """The 'log_alpha' list at α = e^log_x (exactly, from the float32 log_x)."""
    with mp.workdps(BASE_DPS + 10):
        a_estimate = mp.exp(mpf(log_x))
    with mp.workdps(BASE_DPS + int(2.2 * float(mp.log10(a_estimate))) + 10):
        v = alpha_definitions(mp.exp(mpf(log_x)))
        return [float(t) for i, t in enumerate(v) if i != 1]  # no lgamma in log space


def tanh_reference(t: float) -> list[float]:
    """The 'tanh' list at α = 1 + e^t (exactly, from the float32 t)."""
    with mp.workdps(BASE_DPS + 10):
        v = alpha_definitions(1 + mp.exp(mpf(t)))
        # the driver's order: kl_h_plus_one, x_kl_v, x_trigamma, log_trigamma, remainder,
        # x_remainder_prime, fisher_slope, tetragamma_trigamma_ratio
        return [float(v[i]) for i in (5, 6, 2, 7, 8, 9, 10, 11)]


def exp_reference(x: float) -> list[float]:
    with mp.workdps(BASE_DPS):
        return [float(mp.exp(mpf(x)))]


def log_reference(x: float) -> list[float]:
    with mp.workdps(BASE_DPS):
        return [float(mp.log(mpf(x)))]


def log1p_reference(x: float) -> list[float]:
    with mp.workdps(BASE_DPS):
        return [float(mp.log1p(mpf(x)))]


DOMAINS = {
    # domain: (points, reference, intervals as (label, lo, hi) with lo <= x < hi)
    "alpha": (alpha_points, alpha_reference, [
        ("[1, 2)", 1.0, 2.0), ("[2, 4)", 2.0, 4.0), ("[4, 8)", 4.0, 8.0), ("[8, 2^12)", 8.0, 2.0**12),
        ("[2^12, 2^24]", 2.0**12, 2.0**24 * (1 + 2**-23)), ("(2^24, FLT_MAX]", 2.0**24 * (1 + 2**-23), math.inf)]),
    "log_alpha": (log_alpha_points, log_alpha_reference, [
        ("ln α in [ln 8, ln FLT_MAX]", 0.0, float(f32(LOG_FLT_MAX)) * (1 + 2**-23)),
        ("ln α in (ln FLT_MAX, 1000]", float(f32(LOG_FLT_MAX)) * (1 + 2**-23), math.inf)]),
    "tanh": (tanh_points, tanh_reference, [("t in [−1, 0)", -1.0, 0.0), ("t in [0, 1]", 0.0, math.inf)]),
    "exp": (exp_points, exp_reference, [
        ("x in [−104, ln FLT_MIN) (subnormal e^x)", -math.inf, math.log(FLT_MIN)),
        ("x in [ln FLT_MIN, 88.72]", math.log(FLT_MIN), math.inf)]),
    "log": (log_points, log_reference, [("x in [FLT_MIN, 1)", 0.0, 1.0), ("x in [1, FLT_MAX]", 1.0, math.inf)]),
    "log1p": (log1p_points, log1p_reference, [("y in [0, 1]", 0.0, 1.0 + 2**-23), ("y in (1, FLT_MAX]", 1.0 + 2**-23, math.inf)]),
}


def references(domain: str, xs: np.ndarray, workers: int) -> np.ndarray:
    fn = DOMAINS[domain][1]
    args = [float(x) for x in xs]
    if workers > 1 and len(args) > 200:
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(fn, args, chunksize=64))
    else:
        rows = [fn(x) for x in args]
    return np.asarray(rows, dtype=np.float64).reshape(len(args), -1)


# ---------------------------------------------------------------------------------- the drivers


def build_drivers() -> dict[str, str]:
    """Builds float32_special_values_<isa> with CMake (build/ctest, the kernel tests' tree) and
    returns the variants this CPU can run."""
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   stdout=subprocess.DEVNULL)
    drivers = {}
    for isa in VARIANTS:
        target = f"float32_special_values_{isa}"
        built = subprocess.run(["cmake", "--build", BUILD, "--target", target, "-j1"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        if built.returncode != 0:
            if "No rule to make target" in built.stderr or "unknown target" in built.stderr:
                continue  # variant not configured on this machine (not x86-64, or no compiler flags)
            raise RuntimeError(built.stderr)
        path = os.path.join(BUILD, target)
        probe = subprocess.run([path, "--list"], stdout=subprocess.PIPE, text=True)
        if probe.returncode == 0:
            drivers[isa] = path
    return drivers


def function_names(driver: str) -> dict[str, list[str]]:
    out = subprocess.run([driver, "--list"], check=True, stdout=subprocess.PIPE, text=True).stdout
    return {line.split()[0]: line.split()[1:] for line in out.strip().splitlines()}


def evaluate(driver: str, domain: str, xs: np.ndarray, n_functions: int) -> np.ndarray:
    """(function, code path [scalar, simd], point) float32 results."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
        xs.astype(np.float32).tofile(src)
        subprocess.run([driver, domain, src, dst], check=True)
        return np.fromfile(dst, dtype=np.float32).reshape(n_functions, 2, len(xs))


# ------------------------------------------------------------------------------------- the errors


def ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got − ref| in float32 ulps at ref; a ref beyond FLT_MAX must be matched by +-inf."""
    got = got.astype(np.float64)
    overflow = np.abs(ref) >= FLT_MAX * (1 + 2.0**-24)
    magnitude = np.maximum(np.abs(ref), FLT_MIN)
    _, e = np.frexp(magnitude)  # magnitude in [2^(e−1), 2^e)
    ulp = np.ldexp(1.0, e - 1 - 23)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - ref) / ulp
    err = np.where(np.isfinite(got), err, np.inf)
    match_inf = np.isinf(got) & (np.sign(got) == np.sign(ref))
    err = np.where(overflow, np.where(match_inf, 0.0, np.inf), err)
    return err


def sweep(reduced: bool, workers: int, drivers: dict[str, str]) -> dict:
    names = function_names(next(iter(drivers.values())))
    report = {"reduced": reduced, "variants": sorted(drivers), "domains": {}}
    for domain, (points, _, intervals) in DOMAINS.items():
        xs = points(reduced)
        refs = references(domain, xs, workers)
        fns = names[domain]
        results = {isa: evaluate(path, domain, xs, len(fns)) for isa, path in drivers.items()}
        rows = []
        for k, fn in enumerate(fns):
            for label, lo, hi in intervals:
                mask = (xs.astype(np.float64) >= lo) & (xs.astype(np.float64) < hi)
                if not mask.any():
                    continue
                worst = {"max_ulps": -1.0}
                for isa, values in results.items():
                    for path_index, path in enumerate(("scalar", "simd")):
                        err = ulps(values[k, path_index, mask], refs[mask, k])
                        i = int(np.argmax(err))
                        if err[i] > worst["max_ulps"]:
                            worst = {"max_ulps": float(err[i]), "x": float(xs[mask][i]),
                                     "got": float(values[k, path_index, mask][i]), "reference": float(refs[mask, k][i]),
                                     "variant": isa, "code": path}
                rows.append({"function": fn, "interval": label, "points": int(mask.sum()), **worst})
        report["domains"][domain] = rows
        print(f"{domain}: {len(xs)} points", file=sys.stderr)
    return report


# ---------------------------------------------------------------------------------------- output


def markdown(report: dict) -> str:
    lines = [
        "# Float32 special functions: error against mpmath",
        "",
        "Written by `bench/float32_special_sweep.py` (full sweep; its docstring says what is compared with",
        "what). Error in ulps of the float32 result, worst over the instruction-set variants "
        f"{', '.join(report['variants'])}, scalar and `omp simd` code; `x` is the worst point (α, or ln α",
        "for the log-space entry), `got` the float32 result, `reference` mpmath's value (rounded to float64).",
        "",
    ]
    for domain, rows in report["domains"].items():
        lines += [f"## {domain}", "", "| function | interval | points | max ulps | at x | got | reference | where |",
                  "|---|---|---:|---:|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['function']} | {r['interval']} | {r['points']} | {r['max_ulps']:.2f} | {r['x']:.9g} | "
                         f"{r['got']:.9g} | {r['reference']:.12g} | {r['variant']}/{r['code']} |")
        lines.append("")
    worst = max((r for rows in report["domains"].values() for r in rows), key=lambda r: r["max_ulps"])
    lines += [f"Worst of all: {worst['function']} on {worst['interval']}: {worst['max_ulps']:.2f} ulps at x = {worst['x']:.9g}.", ""]
    return "\n".join(lines)


def committed_bounds() -> dict:
    with open(RESULTS + ".json", encoding="utf-8") as fh:
        report = json.load(fh)
    return {(d, r["function"], r["interval"]): r["max_ulps"] for d, rows in report["domains"].items() for r in rows}


def check_against_bounds(report: dict) -> list[str]:
    """The reduced sweep's points are a subset of the full sweep's, so each of its maxima must be at
    most the committed one (rounded up to the 2 decimals the table prints)."""
    bounds = committed_bounds()
    failures = []
    for domain, rows in report["domains"].items():
        for r in rows:
            key = (domain, r["function"], r["interval"])
            bound = math.ceil(bounds[key] * 100) / 100
            if not r["max_ulps"] <= bound:
                failures.append(f"{domain} {r['function']} {r['interval']}: {r['max_ulps']:.3f} ulps > {bound:.2f} at "
                                f"x = {r['x']!r} ({r['variant']}/{r['code']})")
    return failures


def ctest_table(report: dict, workers: int) -> str:
    """csrc/tests/float32_reference_table.h: every 4th point of the reduced grid with its mpmath
    values (float64), and the committed bound of each (function, interval), for the torch- and
    Python-free test csrc/tests/test_special_functions_f32.cpp."""
    bounds = committed_bounds()
    out = ["// GENERATED by bench/float32_special_sweep.py --write-ctest-table: do not edit.",
           "// mpmath values (rounded to double) of the float32 special functions at a subset of the reduced",
           "// sweep's points, and the bounds in float32 ulps measured by the full sweep",
           "// (bench/results/float32_special_functions.json, rounded up to 0.01).",
           "#pragma once", "", "namespace eo_float32_reference {", ""]
    names = report["function_names"]
    for domain, (points, _, intervals) in DOMAINS.items():
        xs = points(True)[::4]
        refs = references(domain, xs, workers)
        fns = names[domain]
        out.append(f"// Domain {domain}: functions {', '.join(fns)} (the driver's order).")
        out.append(f"constexpr int k_{domain}_functions = {len(fns)};")
        out.append(f"constexpr int k_{domain}_points = {len(xs)};")
        out.append(f"constexpr float k_{domain}_x[] = {{")
        out += [f"    {float(x)!r}f," for x in xs]
        out.append("};")
        out.append(f"constexpr double k_{domain}_reference[][{len(fns)}] = {{")
        out += ["    {" + ", ".join(repr(float(v)) for v in row) + "}," for row in refs]
        out.append("};")
        out.append(f"constexpr int k_{domain}_intervals = {len(intervals)};")
        out.append(f"constexpr double k_{domain}_interval_lo[] = {{" +
                   ", ".join("-1e300" if lo == -math.inf else repr(lo) for _, lo, _ in intervals) + "};")
        out.append(f"constexpr double k_{domain}_interval_hi[] = {{" +
                   ", ".join("1e300" if hi == math.inf else repr(hi) for _, _, hi in intervals) + "};")
        out.append("// bound[function][interval] in ulps")
        out.append(f"constexpr double k_{domain}_bound[][{len(intervals)}] = {{")
        for fn in fns:
            row = [math.ceil(bounds.get((domain, fn, label), 0.0) * 100) / 100 for label, _, _ in intervals]
            out.append("    {" + ", ".join(repr(b) for b in row) + "},  // " + fn)
        out.append("};")
        out.append("")
    out += ["}  // namespace eo_float32_reference", ""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reduced", action="store_true", help="CI subset, checked against the committed bounds")
    parser.add_argument("--workers", type=int, default=2, help="processes for the mpmath references")
    parser.add_argument("--write-ctest-table", action="store_true",
                        help=f"only write {os.path.relpath(CTEST_TABLE, ROOT)} from the committed bounds")
    args = parser.parse_args()
    drivers = build_drivers()
    if not drivers:
        print("no driver could be built", file=sys.stderr)
        return 1
    if args.write_ctest_table:
        names = function_names(next(iter(drivers.values())))
        with open(CTEST_TABLE, "w", encoding="utf-8") as fh:
            fh.write(ctest_table({"function_names": names}, args.workers))
        return 0
    report = sweep(args.reduced, args.workers, drivers)
    if args.reduced:
        failures = check_against_bounds(report)
        for f in failures:
            print("FAIL " + f)
        print(f"reduced sweep ({', '.join(report['variants'])}): {len(failures)} bound(s) exceeded")
        return 1 if failures else 0
    with open(RESULTS + ".json", "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
        fh.write("\n")
    with open(RESULTS + ".md", "w", encoding="utf-8") as fh:
        fh.write(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
