#!/usr/bin/env python3
"""Time per element of the float64 and the float32 per-element functions (bench/element_cost.cpp),
per instruction-set variant, written to bench/results/float32_element_cost.md.

    python bench/float32_element_cost.py

Each number is the fastest of 400 runs of an `omp simd` loop over 4096 elements (α log-uniform on
[1, 1e9]), one thread. The machine may be shared: the load average at the start is recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import float32_special_sweep as sweep  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
from evidential_ops.benchmark import cpu_model  # noqa: E402

RESULTS = os.path.join(HERE, "results", "float32_element_cost.md")


def main() -> int:
    subprocess.run(["cmake", "-S", sweep.ROOT, "-B", sweep.BUILD], check=True, stdout=subprocess.DEVNULL)
    rows = []
    load = os.getloadavg()[0]
    for isa in sweep.VARIANTS:
        target = f"element_cost_{isa}"
        built = subprocess.run(["cmake", "--build", sweep.BUILD, "--target", target, "-j1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if built.returncode != 0:
            continue
        run = subprocess.run([os.path.join(sweep.BUILD, target)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        if run.returncode != 0:  # 77: this CPU lacks the variant's instructions
            continue
        t = {line.split()[0]: float(line.split()[1]) for line in run.stdout.strip().splitlines()}
        rows.append((isa, t))
    lines = [
        "# Float32 element math: time per element",
        "",
        "Written by `bench/float32_element_cost.py` (`bench/element_cost.cpp`): the per-element special",
        "functions of every term (forward: h, α(α+1)ψ1, ln ψ1, r; backward: α·v, f', αψ2/ψ1, α·r') in an",
        "`omp simd` loop, float64 `element_forward/element_backward` against the float32",
        "`element_forward_f32/element_backward_f32`; fastest of 400 runs over 4096 elements, one thread.",
        f"CPU: {cpu_model()}; load average at the start {load:.1f} (shared machine).",
        "",
        "| variant | forward f64 ns | forward f32 ns | f64/f32 | backward f64 ns | backward f32 ns | f64/f32 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for isa, t in rows:
        lines.append(f"| {isa} | {t['forward_f64']:.2f} | {t['forward_f32']:.2f} | "
                     f"{t['forward_f64'] / t['forward_f32']:.2f} | {t['backward_f64']:.2f} | {t['backward_f32']:.2f} | "
                     f"{t['backward_f64'] / t['backward_f32']:.2f} |")
    lines += [
        "",
        "A SIMD loop evaluates both the fit (α < 8) and the series (α >= 8) for every lane. With the",
        "elements grouped by argument class first (`polygammas_of_class`), each loop evaluates one of",
        "them; a plain counting sort does the grouping:",
        "",
        "| variant | forward f32 by class ns | f64/that | backward f32 by class ns | f64/that | grouping (counting sort) ns |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for isa, t in rows:
        lines.append(f"| {isa} | {t['forward_f32_by_class']:.2f} | {t['forward_f64'] / t['forward_f32_by_class']:.2f} | "
                     f"{t['backward_f32_by_class']:.2f} | {t['backward_f64'] / t['backward_f32_by_class']:.2f} | "
                     f"{t['group_by_class']:.2f} |")
    lines.append("")
    text = "\n".join(lines)
    with open(RESULTS, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
