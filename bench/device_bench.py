"""Forward + backward of the TCL, UML and DUQ losses on one device, every implementation in one run.

    python bench/device_bench.py --device cuda --sizes 4096 16384 65536 --d 1024 \
        --precisions ieee tf32 bf16 --out bench/results
    python bench/device_bench.py --device cpu --sizes 256 --d 64 --repeats 2   # smoke run

Implementations: every fused backend built for the device (cuda, triton, cpu), the eager
reference ("reference": plain PyTorch with the stable forms, materialised K×K), its
torch.compile ("compiled"), and the floor (the three K×K×D products at the same precision).
Precisions: "ieee" = float32 inputs with exact float32 products, "tf32" = float32 inputs with
TF32 products (fused ops get matmul_precision="tf32"), "bf16" = bfloat16 inputs.

Per cell: the median and fastest of `--repeats` timed steps after a warm-up (CUDA events on a
GPU) and, on CUDA, the peak extra device memory of one step beyond the inputs (and the
gradients of the previous step, released before it), also reported beyond the two K×D
gradients the step returns ("beyond grads": what the issues' memory targets bound). A baseline
that runs out of memory is recorded as "oom" and the run goes on. Writes <out>/<device>.json
(every record) and .md (one table per precision); `--append` merges into an existing file, so a
lease's 10-minute calls can each add sizes. Compare ratios within one file only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from evidential_ops import build_info
from evidential_ops.benchmark import (
    BASELINES,
    LOSS_CASES,
    device_name,
    fused_backends,
    make_inputs,
    peak_extra_device_mib,
    step_function,
    timings,
)

PRECISIONS = {"ieee": (torch.float32, "ieee"), "tf32": (torch.float32, "tf32"), "bf16": (torch.bfloat16, "ieee")}


def add_step_arguments(parser) -> None:
    """The options naming one training step of the GPU diagnostics (ncu_step.py, host_profile.py):
    --backend, --case, --k, --d (TCL on triton at K = 16384, D = 1024 by default)."""
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--case", default="tcl", choices=list(LOSS_CASES))
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--d", type=int, default=1024)


def write_gpu_records(path: str, records: list[dict]) -> None:
    """records with the GPU's name and torch's version, as JSON at path: written after every
    measured step, so that a run stopped at its limit keeps what it measured."""
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f,
                  indent=1)


def each_gpu_step(precisions: list[str], cases: list[str], backends: list[str], k: int, d: int, device):
    """(precision, case, backend, step, inputs) for every combination: a step of
    evidential_ops.benchmark.step_function, the (K, D) inputs made once a precision (released,
    with the cache, before the next)."""
    for precision in precisions:
        dtype, matmul = PRECISIONS[precision]
        inputs = list(make_inputs(k, d, dtype=dtype, device=device))
        for case in cases:
            for backend in backends:
                yield precision, case, backend, step_function(backend, LOSS_CASES[case], device=device,
                                                              precision=matmul), inputs
        del inputs
        torch.cuda.empty_cache()


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def measure(impl: str, case: str, k: int, d: int, precision: str, device: torch.device, repeats: int) -> dict:
    dtype, matmul = PRECISIONS[precision]
    record = {"case": case, "k": k, "d": d, "precision": precision, "impl": impl}
    step = step_function(impl, LOSS_CASES[case], device=device, precision=matmul)
    inputs = []
    try:
        inputs = list(make_inputs(k, d, dtype=dtype, device=device))
        start = time.perf_counter()
        seconds = timings(lambda: step(*inputs), repeats=repeats, warmup=1, device=device)
        record.update(median_s=sorted(seconds)[len(seconds) // 2], min_s=min(seconds),
                      wall_s=time.perf_counter() - start)
        if device.type == "cuda":
            for t in inputs:
                t.grad = None
            record["peak_extra_mib"] = peak_extra_device_mib(lambda: step(*inputs), device)
            gradients_mib = sum(t.numel() * t.element_size() for t in inputs) / 2**20
            record["beyond_gradients_mib"] = record["peak_extra_mib"] - gradients_mib
    except Exception as error:  # recorded, and the run goes on
        if is_out_of_memory(error):
            record["status"] = "oom"
        else:
            record["error"] = f"{type(error).__name__}: {error}"[:300]
    finally:
        inputs.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def _milliseconds(record: dict) -> str:
    if "median_s" in record:
        return f"{1e3 * record['median_s']:.2f}"
    return record.get("status", "error" if "error" in record else "")


def markdown(records: list[dict], device: str, info: str) -> str:
    lines = [f"Device: {device}. Build: {info}.", "",
             "Forward + backward, median of the timed steps; ratios are baseline ÷ fused (higher is better) and "
             "fused ÷ floor; memory is the peak extra device memory of one step beyond inputs and gradients.", ""]
    for precision in dict.fromkeys(r["precision"] for r in records):
        rows = [r for r in records if r["precision"] == precision]
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        fused = [i for i in impls if i not in BASELINES]
        has_memory = any("peak_extra_mib" in r for r in rows)
        header = ["loss", "K"] + [f"{i} ms" for i in impls]
        for f in fused:
            header += [f"{f} vs {b}" for b in ("reference", "compiled") if b in impls] + ([f"{f} ÷ floor"] if "floor" in impls else [])
        if has_memory:
            header += [f"{i} MiB (beyond grads)" for i in impls]
        lines += [f"### {precision}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for key in dict.fromkeys((r["case"], r["k"]) for r in rows):
            cell = {r["impl"]: r for r in rows if (r["case"], r["k"]) == key}
            row = [key[0], str(key[1])] + [_milliseconds(cell.get(i, {})) for i in impls]
            for f in fused:
                t = cell.get(f, {}).get("median_s")
                for b in ("reference", "compiled"):
                    if b in impls:
                        tb = cell.get(b, {}).get("median_s")
                        row.append(f"{tb / t:.1f}×" if t and tb else "")
                if "floor" in impls:
                    tf = cell.get("floor", {}).get("median_s")
                    row.append(f"{t / tf:.2f}" if t and tf else "")
            if has_memory:
                row += [f"{cell[i]['peak_extra_mib']:.0f} ({cell[i]['beyond_gradients_mib']:.0f})"
                        if "peak_extra_mib" in cell.get(i, {}) else "" for i in impls]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    errors = [r for r in records if "error" in r]
    if errors:
        lines += ["Errors:", ""] + [f"- {r['impl']} {r['case']} K={r['k']} {r['precision']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--cases", nargs="+", default=list(LOSS_CASES), choices=list(LOSS_CASES))
    parser.add_argument("--precisions", nargs="+", default=["ieee", "tf32", "bf16"], choices=list(PRECISIONS))
    parser.add_argument("--impls", nargs="+", default=None,
                        help="default: every fused backend for the device, then reference, compiled, floor")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-baselines-above", type=int, default=None,
                        help="run only the fused backends and the floor above this K (the K×K baselines need "
                             "~12·K² floats of memory)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).with_name("results"))
    parser.add_argument("--name", default=None, help="file name stem (default: <device type>_<device name>)")
    parser.add_argument("--append", action="store_true",
                        help="merge into an existing <out>/<stem>.json (a measured cell replaces its old record)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    impls = args.impls or fused_backends(device) + ["reference", "compiled", "floor"]
    name = device_name(device)
    stem = args.name or f"{device.type}_{slug(name)}"
    print(f"device: {name}; build: {build_info()}; implementations: {impls}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    earlier = json.loads(path.read_text())["records"] if args.append and path.exists() else []

    def key(r):
        return r["case"], r["k"], r["d"], r["precision"], r["impl"]

    def write(records) -> str:
        # After every cell: a run stopped at a lease's time limit keeps what it measured.
        new = {key(r) for r in records}
        merged = [r for r in earlier if key(r) not in new] + records
        payload = {"device": name, "build_info": build_info(), "torch": torch.__version__, "d": args.d,
                   "repeats": args.repeats, "records": merged}
        path.write_text(json.dumps(payload, indent=1) + "\n")
        table = markdown(merged, name, build_info())
        (args.out / f"{stem}.md").write_text(table)
        return table

    records = []
    table = write(records)
    for k in args.sizes:
        for precision in args.precisions:
            for case in args.cases:
                for impl in impls:
                    if (args.skip_baselines_above is not None and k > args.skip_baselines_above
                            and impl in ("reference", "compiled")):
                        continue
                    record = measure(impl, case, k, args.d, precision, device, args.repeats)
                    record["device"] = name
                    records.append(record)
                    table = write(records)
                    shown = f"{1e3 * record['median_s']:.2f} ms" if "median_s" in record else \
                        record.get("status", record.get("error", ""))
                    memory = f", {record['peak_extra_mib']:.0f} MiB" if "peak_extra_mib" in record else ""
                    print(f"K={k} {precision} {case} {impl}: {shown}{memory}", flush=True)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
