"""Check the global-batch loss where it will run: NCCL on GPUs (gloo on CPU), launched by torchrun.

    torchrun --standalone --nproc-per-node 2 bench/distributed_check.py --device cuda    # 2+ GPUs, NCCL
    torchrun --standalone --nproc-per-node 1 bench/distributed_check.py --device cuda    # 1 GPU: NCCL code path
    torchrun --standalone --nproc-per-node 2 bench/distributed_check.py                  # CPU, gloo

For every backend that runs on the device (`reference`, and the fused `cpu` / `cuda` / `triton`
where built), float64 and float32, the TCL, UML and DUQ keywords (all terms once with target_scale
too), reductions mean and none, uneven K_r: `evidential_ops.distributed.evidential_loss` and the
gradients of x and y against `evidential_ops.evidential_loss` on the concatenated batch, on every
rank (float64 1e-10 relative, float32 docs/SPEC.md §5: loss 1e-4, gradients 1e-4); the bytes of
every collective against `communication_volume`; then forward + backward at K_global = --k-global
distributed against one process. Rank 0 prints the table and writes --out (JSON); the exit status
is 1 when any check fails. A combination the single-process backend refuses (a dtype it does not
take) is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import evidential_ops as eo
import evidential_ops.distributed as eod
from evidential_ops.benchmark import LOSS_CASES, make_inputs

CASES = {name: case.keywords for name, case in LOSS_CASES.items()}
CASES["all+c"] = {"evidence": "exp", "tau": 0.05,
                  "weights": {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}}
TOLERANCE = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-4)}


def sizes_for(k: int, world: int) -> list[int]:
    # Uneven on purpose: rank r gets a share growing with r (every rank >= 1 row).
    weights = [r + 1 for r in range(world)]
    sizes = [max(1, k * w // sum(weights)) for w in weights]
    sizes[-1] += k - sum(sizes)
    return sizes


def rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def accuracy(device, backend: str, dtype, case: str, reduction: str, k: int, d: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = sizes_for(k, world)
    o, m = sum(sizes[:rank]), sizes[rank]
    gen = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(k, d, generator=gen, dtype=torch.float64), dim=1)
    y = F.normalize(x + 0.5 * torch.randn(k, d, generator=gen, dtype=torch.float64), dim=1)
    c = torch.rand(k, generator=gen, dtype=torch.float64) if case == "all+c" else None
    u, v = torch.rand(k, generator=gen, dtype=torch.float64), torch.rand(k, generator=gen, dtype=torch.float64)
    x, y = x.to(device, dtype), y.to(device, dtype)
    c = None if c is None else c.to(device, dtype)
    kw = dict(CASES[case], backend=backend, reduction=reduction)
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    try:
        ref = eo.evidential_loss(xs, ys, target_scale=c, **kw)
    except (TypeError, ValueError, NotImplementedError, RuntimeError) as e:
        return {"skipped": f"{type(e).__name__}: {e}"[:120]}
    xr, yr = x[o: o + m].clone().requires_grad_(), y[o: o + m].clone().requires_grad_()
    with eod.CommunicationCounter() as counter:
        got = eod.evidential_loss(xr, yr, target_scale=None if c is None else c[o: o + m], **kw)
        if reduction == "none":
            (got[0] * u[o: o + m].to(got[0]) + got[1] * v[o: o + m].to(got[1])).sum().backward()
        else:
            got.backward()
    if reduction == "none":
        (ref[0] * u.to(ref[0]) + ref[1] * v.to(ref[1])).sum().backward()
        loss = max(rel(got[0], ref[0][o: o + m]), rel(got[1], ref[1][o: o + m]))
    else:
        ref.backward()
        loss = rel(got, ref)
    out = {"loss": loss, "dx": rel(xr.grad, xs.grad[o: o + m]), "dy": rel(yr.grad, ys.grad[o: o + m])}
    if backend != "reference":
        expected = eod.communication_volume(sizes, d, dtype=dtype, reduction=reduction, target_scale=c is not None)
        out["bytes_ok"] = {k: n for k, n in counter.bytes.items() if n} == {k: n for k, n in expected.items() if n}
    loss_tol, grad_tol = TOLERANCE[dtype]
    out["ok"] = out["loss"] <= loss_tol and out["dx"] <= grad_tol and out["dy"] <= grad_tol and out.get("bytes_ok", True)
    return out


def speed(device, backend: str, k: int, d: int, repeats: int) -> dict:
    """Forward + backward of the TCL loss: one process on the whole batch (run on every rank at
    once: on GPUs each has its own device; on a CPU they share its cores, see distributed_bench.py
    for a fair CPU comparison) against the W ranks on K/W rows each; fastest round, between barriers."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [k // world + (r < k % world) for r in range(world)]
    o, m = sum(sizes[:rank]), sizes[rank]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    x, y = make_inputs(k, d)
    x, y = x.detach().to(device), y.detach().to(device)
    out = {}
    for label, (a, b, fn) in {
        "single": (x, y, lambda a, b: eo.evidential_loss(a, b, backend=backend, **CASES["tcl"])),
        "distributed": (x[o: o + m], y[o: o + m],
                        lambda a, b: eod.evidential_loss(a, b, backend=backend, **CASES["tcl"])),
    }.items():
        a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            sync()
            start = time.perf_counter()
            fn(a, b).backward()
            sync()
            dist.barrier()
            if i:
                times.append(time.perf_counter() - start)
        out[f"{label}_ms"] = 1e3 * min(times)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--k-global", type=int, default=4096, help="K_global of the speed comparison (0: skip it)")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON file (rank 0)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        backends = [b for b in eo.available_backends() if _runs(b, device)]
        results = []
        for backend in backends:
            for dtype in (torch.float64, torch.float32):
                for case in CASES:
                    for reduction in ("mean", "none"):
                        r = accuracy(device, backend, dtype, case, reduction, k=97 * world, d=48)
                        results.append({"backend": backend, "dtype": str(dtype), "case": case,
                                        "reduction": reduction, **r})
        speeds = {b: speed(device, b, args.k_global, args.dim, args.repeats)
                  for b in backends if args.k_global and b != "reference"}
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
        failed = [(r, row) for r, rows in enumerate(gathered) for row in rows if not row.get("ok", True)]
        if rank == 0:
            report = {"world": world, "backend": dist.get_backend(), "device": str(device),
                      "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                      "accuracy_rank0": results, "failed": failed, "speed_tcl": speeds, "k": args.k_global, "d": args.dim}
            for row in results:
                status = "skip" if "skipped" in row else ("ok" if row["ok"] else "FAIL")
                figures = row.get("skipped") or (f"loss {row['loss']:.1e}  dx {row['dx']:.1e}  dy {row['dy']:.1e}"
                                                 + ("" if "bytes_ok" not in row else f"  bytes {row['bytes_ok']}"))
                print(f"[{status}] {row['backend']:9s} {row['dtype']:13s} {row['case']:5s} {row['reduction']:4s} {figures}")
            for b, s in speeds.items():
                print(f"speed tcl K={args.k_global} D={args.dim} {b}: one process {s['single_ms']:.2f} ms, "
                      f"{world} processes {s['distributed_ms']:.2f} ms")
            print(f"{len(failed)} failure(s) over {world} rank(s) ({dist.get_backend()} on {device.type})")
            if args.out:
                pathlib.Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
        return 1 if failed else 0
    finally:
        dist.destroy_process_group()


def _runs(backend: str, device: torch.device) -> bool:
    try:
        eo.backends.resolve(backend, device)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
