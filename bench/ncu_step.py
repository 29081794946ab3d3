#!/usr/bin/env python3
"""One forward or one backward of a fused backend's training step, for Nsight Compute (GPU only).

    ncu --profile-from-start off --clock-control none --kernel-name regex:'stats_kernel|grad_block_kernel' \
        --launch-count 4 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        python bench/ncu_step.py --backend triton --case tcl --precision bf16 --part backward

A warm-up step compiles the kernels; then one step (evidential_ops.benchmark's loss case and
precision of bench/device_bench.py, from embeddings), of which only --part runs between
cudaProfilerStart and cudaProfilerStop: what `--profile-from-start off` profiles. The profiler's
start and stop hold for the whole process, where an NVTX push/pop range holds for its own thread
alone: autograd launches a CUDA backward from its device thread, outside any range the main
thread pushes. A forward at D = 1024 launches its statistics kernels first (one per strip at
tf32), so one profiled window cannot reach the backward's kernels within a few launches: one run
a part. What it answers (bench/results/triton_fa_sm90.md "What ≤ 2× the floor needs"): in the
tile kernels, whether the tensor pipe runs while the element math issues (ComputeWorkloadAnalysis
pipe utilisation beside SpeedOfLight's issue activity), and in the strip sweeps, what their warps
stall on (WarpStateStats).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from device_bench import PRECISIONS, add_step_arguments  # noqa: E402  (inputs' dtype, products' precision)

import evidential_ops as eo  # noqa: E402
from evidential_ops.benchmark import LOSS_CASES, make_inputs  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser)
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--part", default="backward", choices=["forward", "backward"],
                        help="what runs inside the profiled window")
    parser.add_argument("--warmup", type=int, default=1, help="steps before the profiled one (compiling the kernels)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_step: no CUDA device")
        return 1
    dtype, matmul = PRECISIONS[args.precision]
    x, y = make_inputs(args.k, args.d, dtype=dtype, device="cuda")

    def forward():
        x.grad = y.grad = None
        return eo.evidential_loss(x, y, backend=args.backend, check_finite=False, matmul_precision=matmul,
                                  **LOSS_CASES[args.case].keywords)

    for _ in range(args.warmup):
        forward().backward()
    torch.cuda.synchronize()
    if args.part == "forward":
        torch.cuda.profiler.start()
        loss = forward()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    else:
        loss = forward()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        loss.backward()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"ncu_step: {args.backend} {args.case} {args.precision} K = {args.k}, D = {args.d}: the {args.part} of "
          f"one step profiled, after {args.warmup} warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
