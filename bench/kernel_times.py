#!/usr/bin/env python3
"""Where one training step's time goes on a GPU: each kernel's device time, the step's, and the host's.

    python bench/kernel_times.py --backends cuda triton --cases tcl --precisions tf32 bf16 ieee \
        --k 16384 --d 1024 --out kernel_times.json

For each (backend, loss case, precision): warm-up steps (compiling the kernels), then the median of
`--repeats` steps timed with CUDA events, and one more step under torch.profiler. From the profile:
every kernel's name, launches and summed device time, and their total. The step's time minus that
total is what the GPU spent waiting (launch gaps, host work between launches, host syncs), which the
performance model (bench/gpu_model.py) charges as its "launch" term; each kernel's time sits beside
the model's term for it. The host's time to return from a step (before the device finishes) says
whether launching itself bounds the step: the triton rows of the first GPU run took 2.2-3.5x the
model's time, and its demo 4.5 ms a step at K = 1024 (bench/results/gpu_h200_first_lease.md).
Prints one table per step (largest kernels first) and writes every number to --out (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from device_bench import PRECISIONS, each_gpu_step, write_gpu_records  # noqa: E402

from evidential_ops.benchmark import LOSS_CASES, timings  # noqa: E402


def enqueue_ms(step, inputs, repeats: int = 3) -> float:
    """Host milliseconds until step() returns, before the device finishes (median of `repeats`):
    near the step's time, the host's launching (Python, Triton's binder, torch ops) is what bounds it."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step(*inputs)
        times.append(1e3 * (time.perf_counter() - start))
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def profile_step(step, inputs) -> tuple[list[dict], float]:
    """Kernels of one step (name, launches, device ms; largest first) and the host ms it took."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        step(*inputs)
        torch.cuda.synchronize()
        host_ms = 1e3 * (time.perf_counter() - start)
    kernels: dict[str, dict] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            entry = kernels.setdefault(event.name, {"name": event.name, "launches": 0, "ms": 0.0})
            entry["launches"] += 1
            entry["ms"] += event.device_time_total / 1e3
    return sorted(kernels.values(), key=lambda k: -k["ms"]), host_ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["cuda", "triton"])
    parser.add_argument("--cases", nargs="+", default=["tcl"], choices=list(LOSS_CASES))
    parser.add_argument("--precisions", nargs="+", default=["tf32", "bf16", "ieee"], choices=list(PRECISIONS))
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="kernel_times.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_times: needs a CUDA device")
        return 1
    device = torch.device("cuda")
    records = []
    for precision, case, backend, step, inputs in each_gpu_step(args.precisions, args.cases, args.backends + ["floor"],
                                                                args.k, args.d, device):
        seconds = timings(lambda: step(*inputs), repeats=args.repeats, warmup=1, device=device)
        step_ms = 1e3 * sorted(seconds)[len(seconds) // 2]
        enqueue = enqueue_ms(step, inputs)
        kernels, host_ms = profile_step(step, inputs)
        kernel_ms = sum(k["ms"] for k in kernels)
        record = {"backend": backend, "case": case, "precision": precision, "k": args.k, "d": args.d,
                  "step_ms": step_ms, "enqueue_ms": enqueue, "profiled_host_ms": host_ms, "kernel_ms": kernel_ms,
                  "launches": sum(k["launches"] for k in kernels), "kernels": kernels}
        records.append(record)
        print(f"\n{backend} {case} {precision} K={args.k} D={args.d}: step {step_ms:.2f} ms (events), "
              f"kernels {kernel_ms:.2f} ms in {record['launches']} launches, GPU idle "
              f"{max(step_ms - kernel_ms, 0.0):.2f} ms; the host returns from the step after {enqueue:.2f} ms "
              f"(profiled step {host_ms:.2f} ms)")
        for k in kernels[:12]:
            print(f"  {k['ms']:9.3f} ms {k['launches']:5d}x  {k['name'][:110]}")
        write_gpu_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
