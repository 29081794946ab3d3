#!/usr/bin/env python3
"""Where a fused backend's training step spends its host time (GPU machines).

    python bench/host_profile.py --backend triton --precisions bf16 tf32 --k 16384 --d 1024

On an H200 (bench/results/gpu_h200_fourth_lease.md) the triton TCL step at K = 16384 left the GPU
idle for 15.0 ms of 27.6 (bf16, 414 launches) and 7.2 of 20.2 (tf32, 254 launches): its host
enqueues more slowly than the GPU runs. This profiles the Python side of a few steps (after a
warm-up that compiles every kernel) with cProfile and prints, per precision, the host time of a
step, then the functions that take most of it by their own time and by their cumulative time: how
much is Triton's launcher (JITFunction.run), cuBLAS calls through torch, our own planning and
launching (evidential_ops), and waiting for the device (the forward's overflow-check read).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from device_bench import PRECISIONS, add_step_arguments, each_gpu_step  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser)
    parser.add_argument("--precisions", nargs="+", default=["bf16", "tf32"], choices=list(PRECISIONS))
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after one warm-up)")
    parser.add_argument("--top", type=int, default=25, help="functions listed by each order")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_profile: no CUDA device")
        return 1
    # the step bench/kernel_times.py times (evidential_ops.benchmark.step_function)
    for precision, _, _, step, inputs in each_gpu_step(args.precisions, [args.case], [args.backend], args.k, args.d,
                                                       torch.device("cuda")):
        step(*inputs)
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(args.steps):
            step(*inputs)
        profiler.disable()
        host = (time.perf_counter() - start) / args.steps
        torch.cuda.synchronize()
        device = (time.perf_counter() - start) / args.steps
        print(f"\n== {args.backend} {args.case} {precision} K = {args.k}, D = {args.d}: host {host * 1e3:.2f} ms a "
              f"step under cProfile (until the device is done: {device * 1e3:.2f} ms), {args.steps} steps")
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(args.top)
            lines = text.getvalue().splitlines()
            table = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
            print(f"-- by {order} (per {args.steps} steps)")
            print("\n".join(lines[table:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
