#!/usr/bin/env python3
"""What is live when a training step's device memory peaks, allocation by allocation (GPU machines).

    python bench/memory_peak.py --backends cuda triton --precisions bf16 ieee --k 65536 --d 1024

On the first GPU run (an H200, bench/results/gpu_h200_first_lease.md) a K = 65536, D = 1024 step
took 69-71 MiB beyond its gradients with triton (target < 64; the performance model's buffers add up
to 62) and 85-86 with cuda (model 78-80). This names the allocations behind the difference: one
warm-up step, then one step under the CUDA allocator's history (torch.cuda.memory, Python frames);
from its trace, the blocks the step allocated that were live when its allocated bytes peaked,
grouped by the innermost evidential_ops frame that asked for them (a cuda op's C++ allocations show
the op's Python call), largest first. The peak is measured as bench/device_bench.py measures it:
allocated bytes beyond those before the step, the previous step's gradients released first.
Prints one table per step and writes every group to --out (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from device_bench import PRECISIONS, each_gpu_step, write_gpu_records  # noqa: E402

from evidential_ops.benchmark import LOSS_CASES  # noqa: E402

MIB = 2**20


def call_site(frames: list[dict]) -> str:
    """The innermost frame in the package (file:line function), else the innermost frame at all."""
    for frame in frames:
        if "evidential_ops" in frame.get("filename", ""):
            path = frame["filename"]
            short = path[path.rindex("evidential_ops"):]
            return f"{short}:{frame.get('line', '?')} {frame.get('name', '?')}"
    if frames:
        return f"{os.path.basename(frames[0].get('filename', '?'))}:{frames[0].get('line', '?')} " \
               f"{frames[0].get('name', '?')}"
    return "(no frames)"


def live_at_peak(trace: list[dict]) -> tuple[int, list[dict]]:
    """(peak bytes beyond the start of the trace, the blocks allocated in the trace and live at that
    peak, each {"addr", "size", "site"}), from the allocator's trace of one device: "alloc" adds a
    block's bytes, "free_requested" subtracts them (where torch.cuda.max_memory_allocated's count
    drops; "free_completed", later where other streams used the block, returns it to the cache);
    frees of blocks allocated before the trace count, their blocks unknown."""
    live: dict[int, dict] = {}
    total = peak = 0
    at_peak: list[dict] = []
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = {"addr": event["addr"], "size": event["size"],
                                   "site": call_site(event.get("frames", []))}
            total += event["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif event["action"] == "free_requested":
            live.pop(event["addr"], None)
            total -= event["size"]
    return peak, at_peak


def grouped(blocks: list[dict]) -> list[dict]:
    """Blocks by call site: count, bytes; largest first."""
    groups: dict[str, dict] = {}
    for block in blocks:
        group = groups.setdefault(block["site"], {"site": block["site"], "blocks": 0, "bytes": 0})
        group["blocks"] += 1
        group["bytes"] += block["size"]
    return sorted(groups.values(), key=lambda g: -g["bytes"])


def traced_step(step, inputs, device: torch.device) -> list[dict]:
    """The allocator's trace of one step on `device` (an indexed CUDA device; Python frames)."""
    torch.cuda.synchronize(device)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        step(*inputs)
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return snapshot["device_traces"][device.index]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["cuda", "triton"])
    parser.add_argument("--cases", nargs="+", default=["tcl"], choices=list(LOSS_CASES))
    parser.add_argument("--precisions", nargs="+", default=["bf16", "ieee"], choices=list(PRECISIONS))
    parser.add_argument("--k", type=int, default=65536)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--out", default="memory_peak.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("memory_peak: needs a CUDA device")
        return 1
    device = torch.device("cuda", torch.cuda.current_device())
    records = []
    for precision, case, backend, step, inputs in each_gpu_step(args.precisions, args.cases, args.backends, args.k,
                                                                args.d, device):
        gradients = 2 * args.k * args.d * inputs[0].element_size()
        step(*inputs)  # warm-up: kernels compiled, cuBLAS workspaces allocated
        for t in inputs:  # released before the measured step, as device_bench does
            t.grad = None
        peak, blocks = live_at_peak(traced_step(step, inputs, device))
        groups = grouped(blocks)
        record = {"backend": backend, "case": case, "precision": precision, "k": args.k, "d": args.d,
                  "peak_mib": peak / MIB, "beyond_gradients_mib": (peak - gradients) / MIB, "groups": groups}
        records.append(record)
        print(f"\n{backend} {case} {precision} K={args.k} D={args.d}: peak {peak / MIB:.1f} MiB beyond the "
              f"step's start, {(peak - gradients) / MIB:.1f} beyond the two gradients; live at the peak:")
        for g in groups[:16]:
            print(f"  {g['bytes'] / MIB:9.2f} MiB {g['blocks']:4d} block(s)  {g['site'][:110]}")
        write_gpu_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
