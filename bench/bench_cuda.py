"""GPU benchmark of the cuda backend: forward + backward of the TCL, UML and DUQ losses.

    python bench/bench_cuda.py                                  # K = 4096, 16384, 65536; D = 1024
    python bench/bench_cuda.py --sizes 4096 --repeats 3         # a quick look
    python bench/bench_cuda.py --precision tf32                 # every implementation in TF32

Implementations, all timed in this one process on the same inputs (float32, unit-norm, positives at
cosine 0.6, evidential_ops.benchmark.make_inputs): `cuda` (this backend), `reference` (the plain
PyTorch loss, eager: materialised K×K), `compiled` (the same under torch.compile), `floor` (the
three K×K×D products any implementation needs: s = x·yᵀ, s·y, sᵀ·x), at the same matmul precision
(torch's TF32 switch is set for the whole run). Times are CUDA-event medians after warm-up; memory
is the peak of torch.cuda.max_memory_allocated during one step minus what was allocated before
it (inputs, their gradients from the warm-up step freed), reported as is and beyond the two K×D
gradients. Where an implementation runs out of device memory the table says OOM.

Writes bench/results/cuda_<device>.json and .md (the device named in both).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import evidential_ops as eo  # noqa: E402
from evidential_ops.benchmark import LOSS_CASES, make_inputs, plain_pytorch_loss  # noqa: E402

MIB = 1 << 20


def step_function(impl: str, case, precision: str):
    if impl == "floor":
        def floor(x, y):
            with torch.no_grad():
                s = x @ y.T
                x.grad = s @ y
                y.grad = s.T @ x
        return floor
    if impl in ("reference", "compiled"):
        fn = plain_pytorch_loss if impl == "reference" else torch.compile(plain_pytorch_loss, dynamic=False)

        def plain(x, y):
            x.grad = y.grad = None
            fn(x, y, case).backward()
        return plain

    def fused(x, y):
        x.grad = y.grad = None
        eo.evidential_loss(x, y, backend=impl, check_finite=False, matmul_precision=precision,
                           **case.keywords).backward()
    return fused


def time_ms(fn, x, y, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn(x, y)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x, y)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_extra_mib(fn, x, y) -> float:
    x.grad = y.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(x, y)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MIB


def measure(impl, case, k, d, precision, repeats, warmup):
    record = {"case": case.name, "k": k, "d": d, "impl": impl, "precision": precision}
    try:
        x, y = (t.detach().cuda().requires_grad_() for t in make_inputs(k, d))
        fn = step_function(impl, case, precision)
        record["ms"] = time_ms(fn, x, y, repeats if impl != "reference" or k <= 4096 else max(1, repeats // 2),
                               warmup)
        record["peak_extra_mib"] = peak_extra_mib(fn, x, y)
        record["beyond_gradients_mib"] = record["peak_extra_mib"] - 2 * k * d * 4 / MIB
    except torch.cuda.OutOfMemoryError:
        record["oom"] = True
    finally:
        x = y = fn = None
        torch.cuda.empty_cache()
    return record


def table(records) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in records))
    by_key: dict = {}
    for r in records:
        by_key.setdefault((r["case"], r["k"]), {})[r["impl"]] = r
    header = ["loss", "K"] + [f"{i} ms" for i in impls]
    if "cuda" in impls:
        header += [f"cuda vs {b}" for b in ("reference", "compiled") if b in impls]
        header += ["cuda ÷ floor"] if "floor" in impls else []
    header += [f"{i} MiB" for i in impls] + (["cuda MiB beyond dx, dy"] if "cuda" in impls else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def ms(r):
        return "OOM" if r is None or r.get("oom") else f"{r['ms']:.2f}"

    for (case, k), got in by_key.items():
        row = [case, str(k)] + [ms(got.get(i)) for i in impls]
        cuda = got.get("cuda")
        ok = cuda is not None and not cuda.get("oom")
        if "cuda" in impls:
            for b in ("reference", "compiled"):
                if b in impls:
                    other = got.get(b)
                    row.append(f"{other['ms'] / cuda['ms']:.1f}×" if ok and other and not other.get("oom") else "")
            if "floor" in impls:
                floor = got.get("floor")
                row.append(f"{cuda['ms'] / floor['ms']:.2f}" if ok and floor and not floor.get("oom") else "")
        row += ["OOM" if got.get(i, {}).get("oom") else f"{got[i]['peak_extra_mib']:.0f}" if i in got else ""
                for i in impls]
        if "cuda" in impls:
            row.append(f"{cuda['beyond_gradients_mib']:.0f}" if ok else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--cases", nargs="+", default=list(LOSS_CASES), choices=list(LOSS_CASES))
    parser.add_argument("--impls", nargs="+", default=["cuda", "floor", "reference", "compiled"])
    parser.add_argument("--precision", choices=["ieee", "tf32"], default="ieee")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-reference-k", type=int, default=16384,
                        help="largest K given to reference/compiled (K×K buffers; beyond: not run)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).with_name("results"))
    parser.add_argument("--append", action="store_true",
                        help="merge into the results file of this device and precision (runs split by size)")
    args = parser.parse_args(argv)
    if "cuda" not in eo.available_backends() or not torch.cuda.is_available():
        print("bench_cuda: needs the cuda backend and a GPU")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    device = torch.cuda.get_device_name()
    records = []
    for k in args.sizes:
        for name in args.cases:
            for impl in args.impls:
                if impl in ("reference", "compiled") and k > args.max_reference_k:
                    continue
                r = measure(impl, LOSS_CASES[name], k, args.d, args.precision, args.repeats, args.warmup)
                records.append(r)
                print(json.dumps(r), flush=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_").lower()
    suffix = "" if args.precision == "ieee" else "_tf32"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cuda_{slug}{suffix}.json"
    if args.append and path.exists():
        fresh = {(r["case"], r["k"], r["impl"]) for r in records}
        old = [r for r in json.loads(path.read_text())["records"] if (r["case"], r["k"], r["impl"]) not in fresh]
        records = sorted(old + records, key=lambda r: (r["k"], r["case"]))
    meta = {"device": device, "torch": torch.__version__, "build_info": eo.build_info(), "d": args.d,
            "precision": args.precision, "workspace_bytes": eo.cuda_workspace_bytes()}
    path.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    md = (f"# cuda backend on {device}\n\nForward + backward, float32 inputs, D = {args.d}, matmul precision "
          f"{args.precision}; torch {torch.__version__}; {eo.build_info()}; CUDA-event medians of {args.repeats}.\n"
          f"MiB: peak device memory of one step beyond what was allocated before it (the inputs).\n\n"
          + table(records) + "\n")
    (args.out / f"cuda_{slug}{suffix}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
