#!/usr/bin/env python3
"""Does a bad argument to a C++ op raise a ValueError, or take the process down? (GPU machines.)

    python bench/exception_probe.py            # one line per case, then the native backtrace of a crash

On the first GPU run (an H200, bench/results/gpu_h200_first_lease.md) every cuda-backend test that
expects a ValueError from inside a C++ op (a strip argument out of range, τ too small for raw
features) ended its worker with a segmentation fault, while Python-side checks raised as they
should. The CPU backend's same checks raise on every machine CI has seen, but were not run there;
with a CUDA build of torch (2.14, no GPU) and the extension built against it they raise too.
The second run (bench/results/gpu_h200_second_lease.md) answered it with this probe: the cpu op
crashed too, libtorch's check did not. The machine's CXX had linked libstdc++ statically into
the extension; setup.py now links it shared. The probe stays, as that fix's check on a GPU machine.

Each case runs in its own process, so that the table separates the possible causes:
- ours alone: the cpu op, then the cuda op, each with an argument its C++ check rejects before
  any kernel runs (a strip past the last row), the cuda op once in a fresh process and once after
  cuBLAS and a Triton kernel have run, and with a check after its kernels (τ overflow);
- any C++ exception once CUDA libraries are loaded: libtorch's own check (torch.mm of mismatched
  shapes), and our cpu op's, after cuBLAS and a Triton kernel ran in the same process. A crash
  there as well would point at the unwinder (a C++ throw walks every loaded library's unwind
  tables, and torch's checks also take a backtrace), not at the extension's code.
For the first case that does not end in the expected error, `cuda-gdb -batch` (which debugs host
code too) prints the native backtrace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

# case -> (function run first in the process, the one that must raise, the error it must raise)
CASES = {
    "cpu op": ("", "cpu_strip", "ValueError"),
    "cuda op, fresh process": ("", "cuda_strip", "ValueError"),
    "cuda op after cuBLAS, Triton": ("warm", "cuda_strip", "ValueError"),
    "cuda op overflow": ("", "cuda_overflow", "ValueError"),
    "libtorch check after cuBLAS, Triton": ("warm", "torch_check", "RuntimeError"),
    "cpu op after cuBLAS, Triton": ("warm", "cpu_strip", "ValueError"),
}

# cuda-gdb starts Python, torch and CUDA under the debugger; the lease's stage gives the probe
# about 100 s in all, its six cases first (EO_PROBE_GDB_SECONDS moves it).
GDB_SECONDS = float(os.environ.get("EO_PROBE_GDB_SECONDS", "45"))

SCRIPT = r'''
import sys, torch, evidential_ops as eo
first, call = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(0)
x, y = (torch.nn.functional.normalize(torch.randn(10, 8, generator=g), dim=1) for _ in "xy")
cuda = torch.device("cuda")

def strip(device):  # rows 7..10 of a 10-row problem: one too many (csrc/op_args.cpp check_strip)
    eo.backends.resolve(device.type, device).ops.line_stats(x[:4].to(device), y.to(device), 7, "exp", 0.05, 1,
                                                             True, True)

def cpu_strip():
    strip(torch.device("cpu"))

def cuda_strip():
    strip(cuda)

def cuda_overflow():  # |s| ~ 30/0.05: exp overflows double, found after the kernels ran
    eo.evidential_loss(30 * x.to(cuda), 30 * y.to(cuda), tau=0.05, backend="cuda")

def torch_check():  # libtorch's own TORCH_CHECK on CUDA tensors
    torch.mm(torch.ones(2, 3, device=cuda), torch.ones(2, 3, device=cuda))

def warm():  # cuBLAS, our cuda kernels and, where registered, a Triton kernel
    a = torch.randn(64, 32, device=cuda)
    (a @ a.T).sum().item()
    for backend in ("cuda", "triton"):
        if backend in eo.available_backends():
            eo.evidential_loss(x.to(cuda), y.to(cuda), backend=backend).item()

if first:
    globals()[first]()
print("WARMED", flush=True)
try:
    globals()[call]()
    print("RESULT no error raised")
except Exception as error:
    print("RESULT", type(error).__name__ + ":", str(error).splitlines()[0][:100])
'''


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("exception_probe: no CUDA device here (it probes the cuda ops on a GPU machine)")
        return 2
    crashed = []
    for case, (first, call, expected) in CASES.items():
        run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT, first, call], capture_output=True,
                             text=True, timeout=300)
        result = next((line for line in run.stdout.splitlines() if line.startswith("RESULT")), None)
        warmed = "WARMED" in run.stdout
        shown = result or (run.stderr.strip().splitlines()[-1:] if warmed else "failed before the call: "
                           + " | ".join(run.stderr.strip().splitlines()[-2:]))
        print(f"{case:38s} exit {run.returncode:4d}  {shown}", flush=True)
        if result is None or f"RESULT {expected}:" not in result:
            crashed.append(case)
    gdb = shutil.which("cuda-gdb")
    if crashed and gdb:
        case = crashed[0]
        first, call, _ = CASES[case]
        print(f"\nnative backtrace of '{case}' (cuda-gdb):")
        # Streamed line by line, not captured: the lease's stage may be killed at its cap, and what
        # was printed by then is in the log.
        # Its own process group, killed whole: the debuggee would otherwise hold the pipe open.
        gdb_run = subprocess.Popen([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c", SCRIPT,
                                    first, call], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        timer = threading.Timer(GDB_SECONDS, lambda: os.killpg(gdb_run.pid, signal.SIGKILL))
        timer.start()
        try:
            for line in gdb_run.stdout:
                if line.startswith(("#", "Thread", "Program")):
                    print(line.rstrip()[:400], flush=True)
        finally:
            timer.cancel()
            if gdb_run.wait() == -9:
                print(f"(cuda-gdb stopped after {GDB_SECONDS} s)")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
