#!/usr/bin/env python3
"""One training step of a fused backend, for Nsight Compute to profile (GPU only).

    ncu --nvtx --nvtx-include "step/" --kernel-name regex:'stats_kernel|grad_block_kernel' \
        --launch-count 4 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        python bench/ncu_step.py --backend triton --case tcl --precision bf16 --k 16384 --d 1024

A warm-up step compiles the kernels; then one step inside the NVTX range "step" (what ncu's
--nvtx-include selects: evidential_ops.benchmark.step_function, forward + backward from
embeddings, the loss case and precision of bench/device_bench.py), synchronised. What it answers
(bench/results/triton_fa_sm90.md "What ≤ 2× the floor needs"): in the tile kernels, whether the
tensor pipe runs while the element math issues (ComputeWorkloadAnalysis pipe utilisation beside
SpeedOfLight's issue activity), and in the strip sweeps, what their warps stall on
(WarpStateStats).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from device_bench import PRECISIONS  # noqa: E402  (the inputs' dtype and the float32 products' precision)

from evidential_ops.benchmark import LOSS_CASES, make_inputs, step_function  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--case", default="tcl", choices=list(LOSS_CASES))
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=1, help="steps before the profiled one (compiling the kernels)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_step: no CUDA device")
        return 1
    dtype, matmul = PRECISIONS[args.precision]
    step = step_function(args.backend, LOSS_CASES[args.case], device="cuda", precision=matmul)
    x, y = make_inputs(args.k, args.d, dtype=dtype, device="cuda")
    for _ in range(args.warmup):
        step(x, y)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("step"):
        step(x, y)
        torch.cuda.synchronize()
    print(f"ncu_step: {args.backend} {args.case} {args.precision} K = {args.k}, D = {args.d}: one step after "
          f"{args.warmup} warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
