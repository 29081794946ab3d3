#!/usr/bin/env python3
"""Would Triton's input_precision="tf32x3" keep float32 ("ieee") accuracy for s = x·yᵀ? (no GPU)

    python bench/tf32x3_error.py --out bench/results/tf32x3_error.md

tf32x3 splits each float32 operand into a TF32 head, hi = cvt.rna.tf32(a), and a tail lo = a − hi
(exact in float32; a tensor core reads a float32 register as TF32 by dropping its 13 low mantissa
bits), and forms hi·hi' + hi·lo' + lo·hi' on tensor cores, dropping lo·lo'. Triton 3.4-3.6
(lib/Dialect/TritonGPU/Transforms/F32DotTC.cpp) rewrites each tl.dot of a BLOCK_K step into three
TF32 dots into a fresh zero accumulator, small products first (lo·hi', hi·lo', NaNs zeroed, then
hi·hi'), and adds that to the loop's accumulator with a float32 add. Triton's interpreter ignores
input_precision (its products are float32), so the error is taken here from an emulation, each
product exact (11-bit significands), with two models of how a tensor-core instruction (k = 8
products) adds into its float32 accumulator:
- "RN": the nine terms summed exactly, then rounded to nearest: the best a tensor core could do;
- "RZ": the same sum truncated toward zero, as measured on V100, T4 and A100 tensor cores (Fasi,
  Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 7:e330, 2021:
  products exact, additions aligned to the largest exponent and truncated); Hopper's wgmma is
  assumed to do the same until a GPU says otherwise.

Against float32 FFMA in order (the ieee tiles' product: each step fma(a, b, acc), rounded to
nearest), and plain TF32 (the heads alone, for scale). Cases: unit vectors in the hard regime
(positives at cosine ≈ 0.99, where s/τ at τ = 0.05 magnifies an error of s 20×) and random pairs,
D = 203 and 1024, BLOCK_K = 16 (the default stats tile) and 32 (the gradient tiles). Prints the
maximum and RMS |Δs| in units of 2^-24 and writes the table to --out.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

TC_K = 8           # products a TF32 tensor-core instruction adds (wgmma m64nNk8)
BLOCK_KS = (16, 32)  # D steps of the default stats (m64n32k16) and gradient (m64n32k32) tiles
ULP = 2.0**-24


def round_tf32(a: np.ndarray) -> np.ndarray:
    """float32 → TF32 (10 stored mantissa bits), to nearest, ties away from zero (cvt.rna.tf32.f32)."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return rounded.view(np.float32)


def split_tf32(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a ≈ hi + lo, both TF32 (a − hi is exact in float32)."""
    hi = round_tf32(a)
    return hi, round_tf32((a - hi).astype(np.float32))


def to_float32(v: np.ndarray, mode: str) -> np.ndarray:
    """float64 values to float32, to nearest ("RN") or toward zero ("RZ")."""
    nearest = v.astype(np.float32)
    if mode == "RN":
        return nearest
    away = np.abs(nearest.astype(np.float64)) > np.abs(v)
    return np.where(away, np.nextafter(nearest, np.float32(0)), nearest)


def tensor_core_sum(acc: np.ndarray, terms: np.ndarray, mode: str) -> np.ndarray:
    """acc (float32, pairs) + Σ terms over the last axis (exact float64 products), one instruction."""
    return to_float32(acc.astype(np.float64) + terms.sum(axis=-1), mode)


def tf32_operand(a: np.ndarray) -> np.ndarray:
    """A float32 register read as TF32 by a tensor core: its 13 low mantissa bits dropped."""
    return (np.asarray(a, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def tf32x3_dot(x: np.ndarray, y: np.ndarray, mode: str, block_k: int) -> np.ndarray:
    """Row-wise x·y (pairs, D) as Triton's tf32x3 tl.dot per `block_k` step, tensor-core
    accumulation `mode`, the steps added into a float32 accumulator (rounded to nearest)."""
    xh, yh = round_tf32(x), round_tf32(y)
    xl, yl = tf32_operand(x - xh), tf32_operand(y - yh)
    wide = lambda a: a.astype(np.float64)  # noqa: E731
    groups = (wide(xl) * wide(yh), wide(xh) * wide(yl), wide(xh) * wide(yh))  # the three dots, in order
    acc = np.zeros(x.shape[0], dtype=np.float32)
    d = x.shape[1]
    for t0 in range(0, d, block_k):
        step = np.zeros(x.shape[0], dtype=np.float32)
        for products in groups:
            for k0 in range(t0, min(t0 + block_k, d), TC_K):
                step = tensor_core_sum(step, products[:, k0:k0 + TC_K], mode)
        acc = (wide(acc) + wide(step)).astype(np.float32)
    return acc


def fma_dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise x·y as float32 FFMA in order (each product exact in float64, one rounding a step)."""
    acc = np.zeros(x.shape[0], dtype=np.float32)
    for k in range(x.shape[1]):
        acc = (acc.astype(np.float64) + x[:, k].astype(np.float64) * y[:, k].astype(np.float64)).astype(np.float32)
    return acc


def pairs(n: int, d: int, cosine: float | None, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n unit-vector pairs (float32): at `cosine` (the hard regime's positives), or independent."""
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    z = rng.standard_normal((n, d))
    if cosine is None:
        y = z
    else:
        z -= (z * x).sum(axis=1, keepdims=True) * x
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        y = cosine * x + math.sqrt(1 - cosine**2) * z
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return x.astype(np.float32), y.astype(np.float32)


def errors(n: int, d: int, cosine: float | None, seed: int) -> dict:
    """{method: (max, RMS) |Δs| in units of 2^-24} over n pairs."""
    rng = np.random.default_rng(seed)
    x, y = pairs(n, d, cosine, rng)
    exact = (x.astype(np.float64) * y.astype(np.float64)).sum(axis=1)
    results = {"ieee FFMA": fma_dot(x, y), "TF32": tf32_dot(x, y)}
    for k in BLOCK_KS:
        for mode in ("RN", "RZ"):
            results[f"tf32x3 {mode} k{k}"] = tf32x3_dot(x, y, mode, k)
    out = {}
    for name, s in results.items():
        err = np.abs(s.astype(np.float64) - exact) / ULP
        out[name] = (float(err.max()), float(np.sqrt((err**2).mean())))
    return out


def tf32_dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Plain TF32 products (the heads alone) summed exactly, then rounded: for scale."""
    xh, yh = round_tf32(x), round_tf32(y)
    return (xh.astype(np.float64) * yh.astype(np.float64)).sum(axis=1).astype(np.float32)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    methods = ["ieee FFMA"] + [f"tf32x3 {m} k{k}" for k in BLOCK_KS for m in ("RN", "RZ")] + ["TF32"]
    lines = ["| case | D | " + " | ".join(f"{m} max / RMS" for m in methods) + " | worst tf32x3 max ÷ ieee max |",
             "|---|---:|" + "---|" * len(methods) + "---:|"]
    for label, cosine in (("hard positives (cos 0.99)", 0.99), ("random pairs", None)):
        for d in (203, 1024):
            e = errors(args.pairs, d, cosine, args.seed)
            cells = " | ".join(f"{e[m][0]:.1f} / {e[m][1]:.1f}" for m in methods)
            worst = max(e[m][0] for m in methods if m.startswith("tf32x3"))
            lines.append(f"| {label} | {d} | {cells} | {worst / e['ieee FFMA'][0]:.2f} |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# tf32x3 against IEEE float32 products of s = x·yᵀ (emulated, no GPU)\n\n"
                    f"`python bench/tf32x3_error.py --pairs {args.pairs} --seed {args.seed}`: |Δs| against the exact dot "
                    "product of the float32 inputs, in units of 2^-24, over each case's pairs (see the script's "
                    "docstring for the two accumulation models).\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
