#!/usr/bin/env python3
"""Peak memory and time of full training runs at contrastive batch sizes, on the CPU.

    python bench/train_memory.py [--cases tcl:4096,tcl:8192:0,...] [--out bench/results/train_memory_cpu.md]

Each case M:K (or M:K:C) runs `python -m evidential_ops train --method M --batch-size K --n-train
K --epochs 2 --quiet` (with `--encoder-chunk C`; without, the CLI's default, auto) in a fresh
process (one thread: OMP_NUM_THREADS=1, so runs on a shared machine do not fight over cores) and
records its peak resident memory (the child's ru_maxrss), its wall time, and the time of its
second epoch, which is one full training step at batch K (TCL: its 1 + T_max updates).
The same data trained one epoch at batch size 256 gives the process's floor at that K
(interpreter, torch, the data, the models, the evaluation), so the difference is what the large
batch itself adds. A benchmark,
not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from evidential_ops.benchmark import cpu_model  # noqa: E402
DEFAULT_CASES = ("tcl:4096,tcl:8192:0,tcl:8192,tcl:16384,uml:4096,uml:8192:0,uml:8192,uml:16384,"
                 "fume:4096,fume:8192,fume:16384,duq:4096,duq:16384")
FLOOR_BATCH = 256


def run_case(method: str, k: int, batch: int, epochs: int, chunk: str | None = None) -> tuple[float, float, float]:
    """(peak RSS in MiB, seconds, seconds of the last epoch) of one training run on K samples in
    a fresh child process."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "evidential_ops", "train", "--method", method, "--batch-size", str(batch),
                   "--n-train", str(k), "--epochs", str(epochs), "--quiet", "--out", out]
        if chunk is not None:
            command += ["--encoder-chunk", chunk]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        start = time.perf_counter()
        # A wrapper child per run: ru_maxrss of RUSAGE_CHILDREN is the maximum over all children
        # waited for so far, so each run is measured inside a child of its own.
        probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
        done = subprocess.run([sys.executable, "-c", probe, *command], env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        history = json.loads((Path(out) / "metrics.json").read_text())["train"]["history"]
        return int(done.stdout.strip().splitlines()[-1]) / 1024, seconds, history[-1]["seconds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"method:K,... (default: {DEFAULT_CASES})")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args(argv)
    rows = []
    floors = {}  # (method, K): the floor run, which no chunk setting changes (batch FLOOR_BATCH)
    for case in args.cases.split(","):
        method, k, *chunk = case.split(":")
        chunk = chunk[0] if chunk else None
        if (method, k) not in floors:
            floors[method, k] = run_case(method, int(k), FLOOR_BATCH, 1)[0]
        floor_mib = floors[method, k]
        peak_mib, seconds, step = run_case(method, int(k), int(k), 2, chunk)
        rows.append((method, int(k), "auto" if chunk is None else chunk, peak_mib, floor_mib, step, seconds))
        print(f"{method} K={k} chunk {rows[-1][2]}: peak {peak_mib:.0f} MiB (batch {FLOOR_BATCH}: {floor_mib:.0f} "
              f"MiB), step {step:.1f} s, run {seconds:.0f} s", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = [
        "# Full training runs on the CPU: peak memory",
        "",
        f"`python bench/train_memory.py` at commit `{commit}`: `python -m evidential_ops train --method M "
        "--batch-size K --n-train K --epochs 2 --quiet`, default encoders, one thread, each in a fresh process; "
        f"peak RSS of the run, and of one epoch on the same data at batch size {FLOOR_BATCH} (interpreter, torch, "
        f"data, models, evaluation). CPU: {cpu_model()}; load average at the end {os.getloadavg()[0]:.1f}.",
        "",
        "--encoder-chunk: auto chunks the encoders by 1024 samples above batch 2048 (models.chunking), "
        "0 never; step s: the second epoch, one full training step at batch K.",
        "",
        f"| method | K | encoder chunk | peak MiB | batch {FLOOR_BATCH} MiB | batch K adds MiB | step s | run s |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {m} | {k} | {c} | {p:.0f} | {f:.0f} | {p - f:.0f} | {t:.1f} | {s:.0f} |"
              for m, k, c, p, f, t, s in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
