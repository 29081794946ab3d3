"""Extra peak memory of one forward + backward, measured in a fresh process.

    MALLOC_MMAP_THRESHOLD_=65536 python bench/memory_probe.py --impl cpu --k 4096 --d 512

Method: build the inputs, reset the kernel's peak-RSS mark (`echo 5 > /proc/self/clear_refs`,
Linux >= 4.0), run forward + backward once, and report VmHWM (peak resident set) minus the
resident set just before the step. glibc's mmap threshold is pinned at 64 KiB (the variable
above; bench/test_bench_memory.py sets it) so every tensor of that size is mapped on allocation
and unmapped on free: the peak then counts exactly the memory live at the worst moment,
including the gradients dx, dy (2·K·D floats) and MKL's GEMM workspace. A warm-up step on a
small problem first loads every library and code path, so only the step itself is measured.
Prints one JSON line (with "unavailable" instead of a figure where the reset is forbidden).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


from evidential_ops.benchmark import LOSS_CASES, make_inputs, step_function


def status_kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", required=True)
    parser.add_argument("--case", default="tcl", choices=list(LOSS_CASES))
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--d", type=int, default=512)
    args = parser.parse_args(argv)
    step = step_function(args.impl, LOSS_CASES[args.case])
    step(*make_inputs(256, args.d))  # warm-up: load libraries, JIT nothing big
    x, y = make_inputs(args.k, args.d)
    before = status_kib("VmRSS")
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError as error:  # some sandboxes forbid it; without the reset VmHWM means nothing
        print(json.dumps({"impl": args.impl, "unavailable": f"cannot reset the peak RSS: {error}"}))
        return 0
    step(x, y)
    peak = status_kib("VmHWM")
    extra_mib = max(peak - before, 0) / 1024
    print(json.dumps({
        "impl": args.impl, "case": args.case, "k": args.k, "d": args.d, "extra_peak_mib": round(extra_mib, 2),
        "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
