"""The CLI's training loop: seeded data loading, epochs of `model.training_step`, progress bars,
a per-step logging hook, checkpoints that resume exactly. Any method model of
`evidential_ops.models` fits (they share the `training_step(batch, epoch, optimizer) -> dict of
floats` convention, built on their `losses(batch, epoch)`)."""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .. import checks
from ..data import CrossModalPairs, collate_pairs
from ..data.types import CrossModalSplit

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "TrainingDiverged", "epoch_line", "epoch_lines_enabled", "fit",
           "load_checkpoint", "loss_parts_text", "make_loader", "print_line", "progress_enabled", "restore_rng_state",
           "rng_state", "save_checkpoint"]

CHECKPOINT_FORMAT = 1


class CheckpointError(ValueError):
    """A file that is not a checkpoint `save_checkpoint` wrote."""


class TrainingDiverged(ValueError):
    """Training left the finite numbers on finite data (a learning rate too large)."""


def _non_finite_parameters(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]


def _finite_batch(batch) -> bool:
    """Whether every floating tensor of a batch (a dict, list or tuple of them) is finite."""
    if isinstance(batch, torch.Tensor):
        return not batch.is_floating_point() or bool(torch.isfinite(batch).all())
    if isinstance(batch, dict):
        return all(_finite_batch(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return all(_finite_batch(v) for v in batch)
    return True


def _diverged(model: nn.Module, batch, epoch: int, index: int, lr: float) -> TrainingDiverged | None:
    """The error to raise after a step whose loss was NaN/Inf or whose model outputs were refused
    as such: a divergence where parameters are no longer finite, or where the batch is finite but
    what the model made of it is not; None where the batch itself holds NaN or Inf (the data's
    fault). Read only after such a step: no host sync in a healthy one."""
    bad = _non_finite_parameters(model)
    if not bad and not _finite_batch(batch):
        return None
    what = (f"{len(bad)} parameter tensors hold NaN or Inf ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"
            if bad else "the model's outputs on a finite batch overflowed to NaN or Inf")
    return TrainingDiverged(f"training diverged at epoch {epoch + 1}, batch {index + 1}: {what}, at learning rate "
                            f"{lr:g}; train again with a smaller one")


def progress_enabled(quiet: bool) -> bool:
    """Bars only for a person watching: off with --quiet or when stdout is not a terminal
    (CI logs, pipes), where carriage-return redraws turn into pages of noise."""
    return not quiet and sys.stdout.isatty()


def epoch_lines_enabled(quiet: bool) -> bool:
    """Where bars are off because stdout is not a terminal (logs, nohup, CI), one plain line per
    epoch instead, so a long run is never silent; --quiet silences both."""
    return not quiet and not sys.stdout.isatty()


def print_line(line: str) -> None:
    """print, flushed at once: a log file or pipe then shows each epoch as it ends."""
    print(line, flush=True)


def _finite(record: dict, key: str) -> bool:
    return key in record and math.isfinite(float(record[key]))


def loss_parts_text(record: dict) -> str:
    """The parts of an epoch's loss, when the model reports them, as " = risk R + λ L × KL K
    + consistency C" (TCL, TcVSE: the fields of `TCL.training_step`); "" otherwise.

    λ is annealed upward (TCL eq. 10), so the loss can rise over epochs while the risk falls:
    printing λ and the parts lets a reader see that instead of suspecting divergence.
    """
    if not all(_finite(record, key) for key in ("kl_weight", "loss_risk", "loss_kl")):
        return ""
    text = (f" = risk {record['loss_risk']:.4f} + λ {record['kl_weight']:g} × KL {record['loss_kl']:.4f}")
    if _finite(record, "loss_c"):  # the consistency step starts in the second epoch
        text += f" + consistency {record['loss_c']:.4f}"
    return text


def epoch_line(desc: str, epochs: int, record: dict) -> str:
    """One progress line of an epoch's record (`fit`): "<desc> epoch e/E: loss L[ = parts], S s",
    e 1-based, the parts as `loss_parts_text` writes them."""
    return (f"{desc} epoch {record['epoch'] + 1}/{epochs}: loss {record['loss']:.4f}{loss_parts_text(record)}, "
            f"{record['seconds']:.1f} s")


def make_loader(split: CrossModalSplit, *, batch_size: int, languages=("en",), seed: int = 0,
                shuffle: bool = True) -> tuple[CrossModalPairs, DataLoader]:
    """A `CrossModalPairs` (mode="images": a sample never appears twice in a batch, so the
    diagonal positives of SPEC §2 are the only positives) and its seeded DataLoader.

    The batch size is capped at the split size; the last incomplete batch is dropped (every
    method needs K >= 2 and a K×K matrix per batch).
    """
    batch_size = checks.integer(batch_size, "batch_size", minimum=2)
    dataset = CrossModalPairs(split, languages=languages, mode="images", seed=seed)
    batch_size = min(batch_size, len(dataset))
    if batch_size < 2:
        raise ValueError(f"split {split.name!r} has {len(dataset)} samples; training needs at least 2")
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=True,
                        collate_fn=collate_pairs, generator=generator)
    return dataset, loader


def _mean_logs(logs: list[dict]) -> dict:
    """Per-key mean of the finite values over an epoch (NaN where a key never had one)."""
    out = {}
    for key in logs[0]:
        values = [float(log[key]) for log in logs if math.isfinite(float(log[key]))]
        out[key] = sum(values) / len(values) if values else float("nan")
    return out


def _learning_rate(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of the optimiser's first parameter group (a float, also when a
    scheduler or a capturable optimiser keeps it as a tensor)."""
    return float(optimizer.param_groups[0]["lr"])


def fit(model: nn.Module, dataset: CrossModalPairs, loader: DataLoader, optimizer: torch.optim.Optimizer, *,
        epochs: int, start_epoch: int = 0, progress: bool = False, desc: str = "train",
        on_epoch_end: Callable[[int, dict], None] | None = None,
        log_epoch: Callable[[str], None] | None = None,
        log_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Run epochs start_epoch … epochs − 1 of `model.training_step` over the loader.

    Returns one dict per epoch: the batch-mean of every value training_step reports, plus
    "epoch" and "seconds". `on_epoch_end(epoch, record)` is called after each epoch (e.g. to
    write a checkpoint); `log_epoch(line)`, when given, receives one progress line per epoch,
    `epoch_line`: "<desc> epoch e/E: loss L, S s" (e 1-based), with the loss's parts and λ
    between the loss and the seconds for TCL and TcVSE.

    log_step: called after every batch with a new dict {"step", "epoch", the floats
    training_step reported (loss and its parts), "lr"}, for a metrics logger (wandb,
    TensorBoard: docs/training.md). step counts the batches trained from epoch 0 on, this one
    included (epoch·len(loader) + i + 1, so a resumed run goes on counting where it stopped);
    epoch is 0-based; lr is the first parameter group's learning rate for this update.

    Raises TrainingDiverged, naming the step and the learning rate, when a step's loss is NaN/Inf
    or refuses the model's outputs as such (checks.NonFiniteError) while the batch is finite, or
    its parameters are not.
    """
    epochs = checks.integer(epochs, "epochs", minimum=1)
    start_epoch = checks.integer(start_epoch, "start_epoch", minimum=0)
    if log_step is not None and not callable(log_step):
        raise TypeError(f"log_step must be callable (it receives one dict per step), got {type(log_step).__name__}")
    history = []
    total = (epochs - start_epoch) * len(loader)
    with tqdm(total=total, desc=desc, disable=not progress, unit="batch", dynamic_ncols=True) as bar:
        for epoch in range(start_epoch, epochs):
            dataset.set_epoch(epoch)
            start = time.perf_counter()
            logs = []
            for index, batch in enumerate(loader):
                lr = _learning_rate(optimizer)
                try:
                    logs.append(model.training_step(batch, epoch, optimizer))
                except checks.NonFiniteError as error:  # the loss refused the model's outputs
                    diverged = _diverged(model, batch, epoch, index, lr)
                    if diverged is None:
                        raise
                    raise diverged from error
                if not math.isfinite(float(logs[-1]["loss"])):
                    diverged = _diverged(model, batch, epoch, index, lr)
                    if diverged is not None:
                        raise diverged
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{logs[-1]['loss']:.4f}")
                if log_step is not None:
                    log_step({"step": epoch * len(loader) + index + 1, "epoch": epoch, **logs[-1], "lr": lr})
            if not logs:
                raise ValueError("the training loader produced no batch (split smaller than the batch size?)")
            record = {"epoch": epoch, **_mean_logs(logs), "seconds": time.perf_counter() - start}
            history.append(record)
            if log_epoch is not None:
                log_epoch(epoch_line(desc, epochs, record))
            if on_epoch_end is not None:
                on_epoch_end(epoch, record)
    return history


def rng_state(loader: DataLoader | None = None) -> dict:
    """Every random state training draws from, for a checkpoint that resumes exactly.

    torch's CPU generator (TcVSE's augmentation, DUQ's ε, dropout), each initialised CUDA
    device's, numpy's and Python's global generators (the package's own draws use seeded local
    generators; user encoders may not), and the loader's shuffling generator when it has one.
    Plain containers and tensors only, so `load_checkpoint` reads it with weights_only.
    """
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if loader is not None and loader.generator is not None:
        state["loader"] = loader.generator.get_state()
    return state


def restore_rng_state(state: dict, loader: DataLoader | None = None) -> None:
    """Put back the random states `rng_state` captured (the loader's into `loader`'s generator).

    CUDA states are restored where CUDA is available and skipped otherwise (a run resumed on the
    CPU draws nothing from them). ValueError when `state` lacks a part or the loader shuffles
    without a generator of its own while the state holds one.
    """
    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= set(state):
        raise ValueError("state must be a dict written by rng_state (with torch, numpy and python entries)")
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(int(v) for v in python_state["internal"].tolist()),
                     python_state["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "loader" in state and loader is not None:
        if loader.generator is None:
            raise ValueError("the state holds a loader generator but the loader has none to restore it into")
        loader.generator.set_state(state["loader"])


def save_checkpoint(path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None, payload: dict) -> Path:
    """Write model (and optimiser) state plus a JSON-able payload (method, recipe, data source,
    history…) atomically: a crash mid-write never leaves a truncated checkpoint behind."""
    path = Path(os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"format": CHECKPOINT_FORMAT, "model_state": model.state_dict(),
             "optimizer_state": optimizer.state_dict() if optimizer is not None else None, **payload}
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path) -> dict:
    """Read a checkpoint written by `save_checkpoint` (tensors on the CPU): FileNotFoundError for a
    missing file, CheckpointError (a ValueError) for a file that is not such a checkpoint."""
    path = Path(os.fspath(path))
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    # weights_only: the payload is plain containers and numbers, so no pickle code ever runs.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as error:  # not a torch.save file, or truncated: any of the unpickler's errors
        raise CheckpointError(f"{path} is not an evidential_ops checkpoint (torch.load cannot read it: "
                              f"{type(error).__name__})") from error
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not an evidential_ops checkpoint (format {CHECKPOINT_FORMAT})")
    return state
