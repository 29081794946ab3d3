#!/usr/bin/env python3
"""Does a bad argument to a C++ op raise a ValueError, or take the process down? (GPU machines.)

    python bench/exception_probe.py            # one line per case, then the native backtrace of a crash

On the first GPU run (an H200, bench/results/gpu_h200_first_lease.md) every cuda-backend test that
expects a ValueError from inside a C++ op (a strip argument out of range, τ too small for raw
features) ended its worker with a segmentation fault, while Python-side checks raised as they
should. The CPU backend's same checks raise on every machine CI has seen, but were not run there.
Each case runs in its own process: the cpu op and the cuda op, each with an argument that its C++
check rejects before any kernel runs (a strip past the last row), and the cuda op with one its
check rejects after the kernels (the τ overflow of raw features). For the first case that does not
end in a ValueError, `cuda-gdb -batch` (which debugs host code too) prints the native backtrace.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

CASES = ("cpu strip", "cuda strip", "cuda overflow")

SCRIPT = r'''
import sys, torch, evidential_ops as eo
case = sys.argv[1]
device = torch.device("cuda" if case.startswith("cuda") else "cpu")
g = torch.Generator().manual_seed(0)
x, y = (torch.nn.functional.normalize(torch.randn(10, 8, generator=g), dim=1).to(device) for _ in "xy")
ops = eo.backends.resolve(device.type, device).ops
try:
    if case.endswith("strip"):
        ops.line_stats(x[:4], y, 7, "exp", 0.05, 1, True, True)   # rows 7..10 of 10: one too many
    else:
        eo.evidential_loss(30 * x, 30 * y, tau=0.05, backend="cuda")  # |s| ~ 30/0.05: exp overflows
    print("RESULT no error raised")
except ValueError as error:
    print("RESULT ValueError:", str(error).splitlines()[0][:100])
except Exception as error:
    print("RESULT", type(error).__name__ + ":", str(error).splitlines()[0][:100])
'''


def main() -> int:
    crashed = []
    for case in CASES:
        run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT, case], capture_output=True,
                             text=True, timeout=300)
        result = next((line for line in run.stdout.splitlines() if line.startswith("RESULT")), None)
        print(f"{case:14s} exit {run.returncode:4d}  {result or run.stderr.strip().splitlines()[-1:]}")
        if result is None or "ValueError" not in result:
            crashed.append(case)
    gdb = shutil.which("cuda-gdb")
    if crashed and gdb:
        case = crashed[0]
        print(f"\nnative backtrace of '{case}' (cuda-gdb):")
        run = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c", SCRIPT, case],
                             capture_output=True, text=True, timeout=600)
        print("\n".join(line for line in run.stdout.splitlines() if line.startswith(("#", "Thread", "Program")))[-6000:])
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
