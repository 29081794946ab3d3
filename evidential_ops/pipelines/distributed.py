"""`torchrun --nproc-per-node N -m evidential_ops train --method tcl|tcvse|duq ...`: data-parallel
training whose evidential term is the loss of the global batch (docs/distributed.md "Pipelines").

Every rank builds the same model (same seed; DDP broadcasts rank 0's weights anyway), reads its
share of each epoch through a `DistributedSampler`, and trains with `model.training_step` after
`models.enable_global_batch` (the global-batch loss + DistributedDataParallel). `--batch-size` is
the global batch K: each rank gets K // N pairs per step. After the model is built, the random
draws of training (TcVSE's augmentation masks, DUQ's ε samples) differ between ranks
(`seed_rank_draws`).

Rank 0 alone evaluates and writes the outputs (checkpoint.pt, metrics.json, plots, with a
"distributed" record), and does so with no collective pending: every rank evaluates the untrained
model (the same numbers) before the first collective, all meet at one barrier after training and
leave the process group (destroying it when this function created it), then the others exit
quietly while rank 0 evaluates. A long evaluation cannot run into the collective timeout (NCCL's
default is 10 minutes), and an error in it cannot leave the other ranks waiting.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from .. import checks
from ..data import CrossModalPairs, collate_pairs
from ..data.types import CrossModalSplit
from ..models.data_parallel import enable_global_batch
from .analysis import baseline_metrics, jsonable
from .recipes import Recipe
from .runner import DataSource, _build, _evaluate, _write_outputs, load_data
from .training import fit, progress_enabled, save_checkpoint

__all__ = ["DISTRIBUTED_METHODS", "EpochSetter", "launched_by_torchrun", "make_distributed_loader",
           "refuse_torchrun", "run_training_distributed", "seed_rank_draws"]

# Methods whose training_step computes its evidential term with models.data_parallel.
DISTRIBUTED_METHODS = ("tcl", "tcvse", "duq")


def launched_by_torchrun() -> bool:
    """True in a process that torchrun started as one of several (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def refuse_torchrun(command: str) -> None:
    """The single-process commands would run N times and write the same files: say so instead."""
    if launched_by_torchrun():
        raise RuntimeError(f"`{command}` runs in one process; under torchrun use `train --method "
                           f"{'|'.join(DISTRIBUTED_METHODS)}` (data-parallel with the global-batch loss)")


class EpochSetter:
    """What `training.fit` calls `set_epoch` on: the dataset's caption draw and the sampler's shuffle."""

    def __init__(self, dataset: CrossModalPairs, sampler: DistributedSampler):
        self.dataset = dataset
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        self.sampler.set_epoch(epoch)


def make_distributed_loader(split: CrossModalSplit, *, batch_size: int, rank: int, world_size: int,
                            languages=("en",), seed: int = 0) -> tuple[EpochSetter, DataLoader]:
    """This rank's loader over `split`: a DistributedSampler (seeded shuffle, the same number of
    batches on every rank) and batch_size // world_size pairs per step, so that the global batch
    is batch_size (rounded down to a multiple of the world size)."""
    batch_size = checks.integer(batch_size, "batch_size", minimum=2)
    dataset = CrossModalPairs(split, languages=languages, mode="images", seed=seed)
    per_rank = min(batch_size // world_size, len(dataset) // world_size)
    if per_rank < 2:
        raise ValueError(f"a global batch of {batch_size} pairs over {world_size} ranks (split {split.name!r}: "
                         f"{len(dataset)} samples) gives {per_rank} per rank; each rank needs at least 2")
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True, collate_fn=collate_pairs)
    return EpochSetter(dataset, sampler), loader


def seed_rank_draws(seed: int, rank: int) -> None:
    """Give every rank its own stream of training's random draws (torch's global generators, CPU
    and accelerators: TcVSE's augmentation masks, DUQ's ε samples, dropout), which would otherwise
    be the same on every rank, over different data.

    Ranks other than 0 are seeded with seed + rank; rank 0 keeps the stream it has, so that its
    draws are those of a single-process run with `seed`. Call it after the model is built, so that
    the initial weights stay identical on every rank.
    """
    if rank != 0:
        torch.manual_seed(seed + rank)


def _local_device(device: str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def run_training_distributed(method: str, recipe: Recipe, source: DataSource, out_dir, *, seed: int = 0,
                             quiet: bool = False, device: str = "cpu", plots: bool = True) -> dict | None:
    """`runner.run_training`, data-parallel on the ranks torchrun started (module docstring).
    plots: rank 0 draws the PNGs (False: metrics.json and the checkpoint only).

    Initialises the default process group if needed (NCCL for a CUDA device, gloo otherwise), and
    then destroys it once training is over, before rank 0 evaluates. Returns the metrics on rank 0,
    None on the others (which return as soon as every rank has finished training).
    """
    if method not in DISTRIBUTED_METHODS:
        raise ValueError(f"data-parallel training supports --method {DISTRIBUTED_METHODS}, got {method!r}")
    device = _local_device(device)
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
        main = rank == 0
        out_dir = Path(os.fspath(out_dir))
        start = time.perf_counter()
        bench = load_data(source)
        model = _build(recipe, bench, seed, device)
        # On every rank, before the first collective (DDP's broadcast): were it rank 0's alone, the
        # others would wait for it inside that collective, under its timeout.
        untrained = baseline_metrics(method, model, bench)
        enable_global_batch(model, device_ids=[device.index] if device.type == "cuda" else None)
        seed_rank_draws(seed, rank)
        epochs, loader = make_distributed_loader(bench.train, batch_size=recipe.batch_size, rank=rank,
                                                 world_size=world, languages=recipe.languages, seed=seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
        train_start = time.perf_counter()
        history = fit(model, epochs, loader, optimizer, epochs=recipe.epochs, progress=main and progress_enabled(quiet),
                      desc=f"{method} train (rank 0 of {world})")
        train_seconds = time.perf_counter() - train_start
        dist.barrier()  # the last collective: every rank has finished training
    finally:
        if started_here:
            dist.destroy_process_group()
    if not main:
        return None
    # Rank 0 alone, no collective pending: however long this takes, or if it raises, no other rank waits.
    per_rank = loader.batch_size
    record = {"world_size": world, "backend": backend, "per_rank_batch": per_rank, "global_batch": per_rank * world}
    payload = {"method": method, "recipe": jsonable(asdict(recipe)), "data": jsonable(dict(source)),
               "seed": seed, "untrained": untrained, "distributed": record}
    save_checkpoint(out_dir / "checkpoint.pt", model=model, optimizer=optimizer,
                    payload={**payload, "history": jsonable(history), "epoch": recipe.epochs})
    metrics, plot_data = _evaluate(method, model, bench, recipe, seed=seed, history=history,
                                   untrained=untrained, source=source)
    metrics.update(seed=seed, data=dict(source), recipe=asdict(recipe), distributed=record)
    metrics["train"] = {"epochs": recipe.epochs, "seconds": train_seconds, "history": history,
                        "batches_per_epoch": len(loader)}
    metrics["total_seconds"] = time.perf_counter() - start
    _write_outputs(out_dir, method, metrics, plot_data, history, plots=plots)
    return metrics
