"""Plumbing shared by the methods' `losses` and `training_step`s: device placement, argument
checks and one optimiser update on a loss dict."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from .. import checks


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a parameterless module)."""
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def full_precision(module: nn.Module):
    """A context with autocast off on the module's device type (a no-op when autocast is not on):
    the method terms run in the float32 of the embeddings (`encoders.l2_normalize`), as the
    method references require (`methods`: digamma, exp(s/τ) and SPEC §2's log-space sums are
    unreliable with bfloat16's 8 significant bits), while the encoders before them run under the
    autocast."""
    device_type = module_device(module).type
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def move_batch(batch, device: torch.device) -> dict:
    """A shallow copy of a batch dict with every tensor on `device` (non-blocking copies)."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a dict (see data.collate_pairs), got {type(batch).__name__}")
    return {k: (v.to(device, non_blocking=True) if isinstance(v, Tensor) else v) for k, v in batch.items()}


def check_optimizer(optimizer) -> torch.optim.Optimizer:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return optimizer


def check_epoch(epoch) -> int:
    """A 0-based epoch index (a non-negative int), for the schedules that read it."""
    return checks.integer(epoch, "epoch", minimum=0)


def check_grad_clip(grad_clip) -> float | None:
    """None (no clipping) or a positive max gradient norm."""
    return None if grad_clip is None else checks.positive_number(grad_clip, "grad_clip")


def apply_step(loss: Tensor, optimizer: torch.optim.Optimizer, parameters: Iterable[Tensor],
               grad_clip: float | None) -> float:
    """zero_grad, backward, optional norm clipping, step; returns the loss as a float.

    A non-finite loss is an error rather than a silent update that would poison the weights.
    """
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"the training loss is {value}; stopping before the update")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(list(parameters), grad_clip)
    optimizer.step()
    return value


def loss_values(parts: Mapping[str, Tensor]) -> dict[str, float]:
    """Every entry of a `losses` dict as a Python float, in its order (what a log records)."""
    if not isinstance(parts, Mapping) or "loss" not in parts:
        raise TypeError("parts must be a dict of tensors with a 'loss' entry (a model's losses())")
    return {name: float(value.detach()) if isinstance(value, Tensor) else float(value) for name, value in parts.items()}


def apply_update(parts: Mapping[str, Tensor], optimizer: torch.optim.Optimizer, parameters: Iterable[Tensor],
                 grad_clip: float | None) -> dict[str, float]:
    """One optimiser update on parts["loss"] (`apply_step`); returns every entry as a float.

    The floats are read before the update, so a part that shares memory with a parameter
    still reports the value its loss was computed with.
    """
    values = loss_values(parts)
    values["loss"] = apply_step(parts["loss"], optimizer, parameters, grad_clip)
    return values
