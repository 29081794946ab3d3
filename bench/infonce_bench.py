"""Fused InfoNCE against plain PyTorch and its torch.compile: time and peak extra memory (CPU).

    python bench/infonce_bench.py --k 4096 --d 512 --rounds 5 --out bench/results/infonce_cpu.md

One forward + backward of the symmetric InfoNCE (SPEC §2 "InfoNCE", default positives, both
directions averaged) from float32 unit embeddings x, y (K, D), τ = 0.05:
- fused: `evidential_ops.infonce_loss(..., backend="cpu")` (s never stored);
- plain: open_clip ClipLoss's way, logits = x·yᵀ/τ, ½(CE(logits) + CE(logitsᵀ));
- compiled: torch.compile of plain (Inductor, compiled and warmed up before timing);
- floor: the three K×K×D float32 GEMMs every one of them needs at least (s = x·yᵀ, G·y, Gᵀ·x;
  `evidential_ops.benchmark.floor_step`), no element work: the fused op needs four (its backward
  recomputes s).
Times: all three interleaved in one process, the fastest of `rounds` per implementation (the
machine is shared: compare ratios within a run). Memory: one fresh process per implementation
(`--memory IMPL`), after a warm-up at the same shape: peak resident set (VmHWM, reset through
/proc/self/clear_refs) minus the resident set before the step, glibc's mmap threshold pinned at
64 KiB so freed K×K buffers leave RSS (as bench/memory_probe.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evidential_ops as eo  # noqa: E402
from evidential_ops.benchmark import floor_step, interleaved_minima  # noqa: E402

TAU = 0.05
IMPLEMENTATIONS = ("fused", "plain", "compiled", "floor")


def plain_infonce(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """½(CE(s/τ) + CE(sᵀ/τ)), labels on the diagonal: open_clip's ClipLoss."""
    logits = x @ y.T / TAU
    labels = torch.arange(x.shape[0])
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def fused_infonce(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return eo.infonce_loss(x, y, tau=TAU, reduction="mean_of_directions", backend="cpu", check_finite=False)


def step_function(impl: str):
    """forward + backward of one implementation: (x, y) -> None."""
    if impl == "floor":
        return floor_step()
    loss_fn = {"fused": fused_infonce, "plain": plain_infonce,
               "compiled": torch.compile(plain_infonce, dynamic=False)}[impl]

    def step(x, y):
        x = x.detach().requires_grad_()
        y = y.detach().requires_grad_()
        loss_fn(x, y).backward()

    return step


def inputs(k: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(k, d, generator=gen), dim=1)
    y = F.normalize(x + 0.5 * torch.randn(k, d, generator=gen) / d**0.5, dim=1)
    return x, y


def status_kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(impl: str, k: int, d: int) -> dict:
    """Peak extra MiB of one step in this process (see the module docstring)."""
    step = step_function(impl)
    x, y = inputs(k, d)
    step(x, y)  # warm-up at the measured shape (torch.compile specialises on it)
    before = status_kib("VmRSS")
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError as error:
        return {"impl": impl, "unavailable": f"cannot reset the peak RSS: {error}"}
    step(x, y)
    return {"impl": impl, "extra_peak_mib": round(max(status_kib("VmHWM") - before, 0) / 1024, 1)}


def memory_in_fresh_process(impl: str, k: int, d: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, __file__, "--memory", impl, "--k", str(k), "--d", str(d)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_all(k: int, d: int, rounds: int) -> dict[str, float]:
    """Fastest seconds of `rounds` steps per implementation, interleaved (compiled in the warm-up)."""
    x, y = inputs(k, d)
    return interleaved_minima({impl: step_function(impl) for impl in IMPLEMENTATIONS}, x, y, rounds)


def cpu_name() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def report(k: int, d: int, rounds: int, times: dict, memory: dict) -> str:
    ms = {impl: 1e3 * t for impl, t in times.items()}
    lines = [
        "# Fused InfoNCE on the CPU (bench/infonce_bench.py)",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} logical cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), CPU ISA of the kernels: {eo.cpu_isa()}. "
        f"K = {k}, D = {d}, float32, τ = {TAU}, forward + backward, fastest of {rounds} interleaved rounds.",
        "",
        "| implementation | ms | fused speed-up | ÷ floor | extra peak MiB |",
        "|---|---|---|---|---|",
    ]
    for impl in IMPLEMENTATIONS:
        mem = memory[impl].get("extra_peak_mib", memory[impl].get("unavailable"))
        lines.append(f"| {impl} | {ms[impl]:.1f} | {ms[impl] / ms['fused']:.2f}× | {ms[impl] / ms['floor']:.2f} | {mem} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory", choices=IMPLEMENTATIONS, help="measure one implementation's memory, print JSON")
    parser.add_argument("--out", type=pathlib.Path, help="write the markdown table here")
    args = parser.parse_args(argv)
    if args.memory:
        print(json.dumps(measure_memory(args.memory, args.k, args.d)))
        return 0
    times = time_all(args.k, args.d, args.rounds)
    memory = {impl: memory_in_fresh_process(impl, args.k, args.d) for impl in IMPLEMENTATIONS}
    text = report(args.k, args.d, args.rounds, times, memory)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
