"""Run test cases on N gloo ranks over the loopback, every run bounded in time.

`run_cases(world, names, module)` spawns `world` fresh processes (spawn, never fork: the parent's
OpenMP pool does not survive a fork), joins them into one gloo group through a file store in a
temporary directory (no port to pick) with a short collective timeout, and runs the named cases of
`module.CASES` in order on every rank. Each case's per-rank result (or traceback) comes back as
soon as it is done; when the deadline passes, the processes are killed and what finished is
returned with `timed_out=True`. A case that raises on some ranks only desynchronises the group:
the later cases then fail on the collective timeout instead of hanging the test run.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

COLLECTIVE_TIMEOUT_S = 60


@dataclass
class GroupRun:
    world: int
    results: dict = field(default_factory=dict)  # case -> [per-rank result]
    errors: dict = field(default_factory=dict)   # case -> {rank: traceback}
    timed_out: bool = False
    seconds: float = 0.0

    def __getitem__(self, name: str) -> list:
        if name in self.errors:
            details = "\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(self.errors[name].items()))
            raise AssertionError(f"case {name!r} raised on {self.world} ranks:\n{details}")
        if name not in self.results or any(r is None for r in self.results[name]):
            raise AssertionError(f"case {name!r} did not finish on every rank "
                                 f"(timed out: {self.timed_out}, after {self.seconds:.0f} s)")
        return self.results[name]


def _loopback_env() -> None:
    # gloo binds its pairs to the interface this names; the loopback one keeps tests off the network.
    if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _worker(rank: int, world: int, store: str, module_name: str, names: list[str], out) -> None:
    _loopback_env()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    cases = importlib.import_module(module_name).CASES
    try:
        for name in names:
            try:
                out.put((name, rank, True, cases[name](rank, world)))
            except Exception:
                out.put((name, rank, False, traceback.format_exc()))
    finally:
        out.put((None, rank, True, None))
        dist.destroy_process_group()


def run_cases(world: int, names: list[str], module: str, *, timeout: float) -> GroupRun:
    """Run `module.CASES[name](rank, world)` for each name on `world` gloo ranks; see module doc."""
    _loopback_env()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    run = GroupRun(world)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        procs = [ctx.Process(target=_worker, args=(r, world, store, module, list(names), out), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        finished = 0
        deadline = start + timeout
        while finished < world:
            left = deadline - time.monotonic()
            if left <= 0:
                run.timed_out = True
                break
            try:
                name, rank, ok, value = out.get(timeout=min(left, 2.0))
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break  # every worker died without saying goodbye (a crash): report what came back
                continue
            if name is None:
                finished += 1
            elif ok:
                run.results.setdefault(name, [None] * world)[rank] = value
            else:
                run.errors.setdefault(name, {})[rank] = value
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    run.seconds = time.monotonic() - start
    return run
