"""The global-batch loss on W gloo processes against the single-process fused loss, one run.

    python bench/distributed_bench.py                       # K_global = 4096, D = 512, 2 processes
    python bench/distributed_bench.py --k-global 1024 --world 3 --out /tmp/d

For each loss (evidential_ops.benchmark.LOSS_CASES: TCL, UML, DUQ ISUM; float32, both
directions, mean), forward + backward of the same K_global × D batch:

- single process, fused `cpu` backend, with every core (the machine's torch threads), and with
  one thread (what each of the W processes gets);
- W processes (torch.multiprocessing, spawn; gloo over the loopback, a file store, one thread
  each), each with K_global / W rows, `evidential_ops.distributed.evidential_loss`; a step's time
  is the slowest rank's, after a barrier.

Fastest of --repeats rounds. Also: the accuracy of the distributed loss and gradients against the
single-process ones, and the bytes each rank handed to each kind of collective (measured with
`CommunicationCounter`) next to `communication_volume`'s formula. Writes OUT.json and OUT.md
(default bench/results/distributed_cpu). The VM is shared: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import evidential_ops as eo
import evidential_ops.distributed as eod
from evidential_ops.benchmark import LOSS_CASES, make_inputs

RESULTS = pathlib.Path(__file__).with_name("results")


def _fwd_bwd(fn, x, y):
    x.grad = y.grad = None
    loss = fn(x, y)
    loss.backward()
    return loss


def _fastest(fn, repeats: int, sync=lambda: None) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def single_process(k: int, d: int, cases, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    out = {}
    for name in cases:
        case = LOSS_CASES[name]
        x, y = make_inputs(k, d)
        fn = lambda a, b, kw=case.keywords: eo.evidential_loss(a, b, backend="cpu", **kw)
        _fwd_bwd(fn, x, y)  # warm-up
        seconds = _fastest(lambda fn=fn, x=x, y=y: _fwd_bwd(fn, x, y), repeats)
        loss = _fwd_bwd(fn, x, y)
        out[name] = {"ms": 1e3 * seconds, "loss": float(loss.detach()), "dx": x.grad.clone(), "dy": y.grad.clone()}
    return out


def _rank(rank: int, world: int, store: str, k: int, d: int, cases, repeats: int, queue) -> None:
    if "GLOO_SOCKET_IFNAME" not in os.environ and pathlib.Path("/sys/class/net/lo").exists():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        sizes = [k // world + (r < k % world) for r in range(world)]
        o = sum(sizes[:rank])
        result = {"sizes": sizes}
        for name in cases:
            case = LOSS_CASES[name]
            x_all, y_all = make_inputs(k, d)
            x = x_all.detach()[o: o + sizes[rank]].clone().requires_grad_()
            y = y_all.detach()[o: o + sizes[rank]].clone().requires_grad_()
            fn = lambda a, b, kw=case.keywords: eod.evidential_loss(a, b, backend="cpu", **kw)
            _fwd_bwd(fn, x, y)
            seconds = _fastest(lambda fn=fn, x=x, y=y: _fwd_bwd(fn, x, y), repeats, sync=dist.barrier)
            with eod.CommunicationCounter() as counter:
                loss = _fwd_bwd(fn, x, y)
            # numpy arrays travel by value (a tensor in a queue is a file descriptor of shared memory,
            # gone once this process exits).
            result[name] = {"ms": 1e3 * seconds, "loss": float(loss.detach()), "dx": x.grad.numpy().copy(),
                            "dy": y.grad.numpy().copy(), "bytes": counter.bytes,
                            "formula": eod.communication_volume(sizes, d)}
        queue.put((rank, result))
    finally:
        dist.destroy_process_group()


def distributed(k: int, d: int, world: int, cases, repeats: int, timeout: float) -> list[dict]:
    """Run the W ranks; within `timeout` seconds or they are killed and this raises."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, world, str(pathlib.Path(tmp) / "store"), k, d, cases, repeats,
                                                 queue), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        try:
            results = [None] * world
            for _ in range(world):
                rank, result = queue.get(timeout=max(1.0, deadline - time.monotonic()))
                results[rank] = result
            for p in procs:
                p.join(timeout=60)
                if p.exitcode != 0:
                    raise RuntimeError(f"rank process exited with {p.exitcode}")
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    return results


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def run(k: int, d: int, world: int, cases, repeats: int, timeout: float = 1800) -> dict:
    threads = torch.get_num_threads()
    full = single_process(k, d, cases, repeats, threads)
    one = single_process(k, d, cases, repeats, 1) if threads != 1 else full
    torch.set_num_threads(threads)
    ranks = distributed(k, d, world, cases, repeats, timeout)
    sizes = ranks[0]["sizes"]
    rows = []
    for name in cases:
        ref = full[name]
        dist_ms = max(r[name]["ms"] for r in ranks)  # per rank fastest round, after a barrier
        dx = torch.cat([torch.from_numpy(r[name]["dx"]) for r in ranks])
        dy = torch.cat([torch.from_numpy(r[name]["dy"]) for r in ranks])
        rows.append({
            "case": name, "k_global": k, "d": d, "world": world, "sizes": sizes,
            "single_ms": ref["ms"], "single_threads": threads, "single_1_thread_ms": one[name]["ms"],
            "distributed_ms": dist_ms, "distributed_threads_per_rank": 1,
            "single_over_distributed": ref["ms"] / dist_ms,
            "loss_rel_error": abs(ranks[0][name]["loss"] - ref["loss"]) / abs(ref["loss"]),
            "loss_same_on_every_rank": len({r[name]["loss"] for r in ranks}) == 1,
            "dx_rel_error": rel(dx, ref["dx"]), "dy_rel_error": rel(dy, ref["dy"]),
            "bytes_per_rank": ranks[0][name]["bytes"], "bytes_formula": ranks[0][name]["formula"],
        })
    return {"machine": f"{_cpu_name()}, {os.cpu_count()} cores", "torch": torch.__version__, "dtype": "float32",
            "repeats": repeats, "load_average_1min": os.getloadavg()[0], "rows": rows}


def _cpu_name() -> str:
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else (platform.processor() or platform.machine())


def markdown(result: dict) -> str:
    rows = result["rows"]
    w = rows[0]["world"]
    lines = [
        f"Machine: {result['machine']}; torch {result['torch']}; forward + backward, float32, both directions, "
        f"fastest of {result['repeats']} rounds. Single process: the fused `cpu` backend with "
        f"{rows[0]['single_threads']} threads (and 1); distributed: {w} gloo processes on the loopback, "
        f"1 thread each, K_r = {rows[0]['sizes']}. Load average when it finished: "
        f"{result['load_average_1min']:.1f} (a shared VM: compare within one run).",
        "",
        f"| loss | K_global | D | single ms ({rows[0]['single_threads']} thr) | single ms (1 thr) | "
        f"{w} procs ms | single ÷ {w} procs | loss rel. err. | dx rel. err. | dy rel. err. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['k_global']} | {r['d']} | {r['single_ms']:.1f} | {r['single_1_thread_ms']:.1f} "
                     f"| {r['distributed_ms']:.1f} | {r['single_over_distributed']:.2f} | {r['loss_rel_error']:.1e} "
                     f"| {r['dx_rel_error']:.1e} | {r['dy_rel_error']:.1e} |")
    b = rows[0]["bytes_per_rank"]
    f = rows[0]["bytes_formula"]
    lines += ["", "Bytes per rank per step (measured at the dispatcher; formula in parentheses):", "",
              "| all-gather | all-reduce | reduce-scatter |", "|---|---|---|",
              f"| {b.get('all_gather', 0)} ({f['all_gather']}) | {b.get('all_reduce', 0)} ({f['all_reduce']}) | "
              f"{b.get('reduce_scatter', 0)} ({f['reduce_scatter']}) |"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k-global", type=int, default=4096, help="K_global")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--cases", nargs="+", default=list(LOSS_CASES), choices=list(LOSS_CASES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "distributed_cpu"), help="writes OUT.json and OUT.md")
    p.add_argument("--timeout", type=float, default=1800, help="seconds the distributed part may take")
    args = p.parse_args(argv)
    result = run(args.k_global, args.dim, args.world, args.cases, args.repeats, args.timeout)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
