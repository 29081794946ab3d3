"""Argument checks and small helpers shared by the method pieces (SPEC §5).

Every error names the argument it is about. Nothing is broadcast: shapes must match exactly.
The method pieces compute in the input dtype, which must be float32 or float64 (float64 is
the judge); half-precision inputs are refused rather than silently upcast, because digamma,
trigamma and the log-space sums of SPEC §2 are meaningless in 8-bit mantissas.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import checks
from ..checks import positive_number, same_kind

METHOD_DTYPES = (torch.float32, torch.float64)


def float_tensor(t, name: str, *, dim: int, check_finite: bool) -> Tensor:
    """A float32/float64 tensor with exactly `dim` dimensions, none of them empty."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in METHOD_DTYPES:
        raise TypeError(
            f"{name} must be float32 or float64 (the method references compute in the input "
            f"dtype), got {t.dtype}; cast it first"
        )
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if any(size == 0 for size in t.shape):
        raise ValueError(f"{name} has an empty dimension: shape {tuple(t.shape)}")
    if check_finite:
        checks.require_finite(t, name)
    return t


def square_matrix(t, name: str, *, check_finite: bool) -> Tensor:
    """(K, K) with K >= 2: a batch similarity (or distance) matrix, positives on the diagonal."""
    t = float_tensor(t, name, dim=2, check_finite=check_finite)
    if t.shape[0] != t.shape[1]:
        raise ValueError(f"{name} must be square (K, K) with positives on the diagonal, got {tuple(t.shape)}")
    if t.shape[0] < 2:
        raise ValueError(f"{name} needs K >= 2 (a Dirichlet over >= 2 candidates), got K = {t.shape[0]}")
    return t


def same_shape(reference: Tensor, other: Tensor, reference_name: str, other_name: str) -> None:
    """Raise unless `other` has exactly `reference`'s shape, dtype and device (no broadcasting);
    the error names both arguments."""
    same_kind(reference, other, reference_name, other_name)
    if other.shape != reference.shape:
        raise ValueError(
            f"{other_name} must have the same shape as {reference_name}: "
            f"{tuple(other.shape)} vs {tuple(reference.shape)} (no broadcasting)"
        )


def binary_labels(labels, k: int, like: Tensor, name: str) -> Tensor:
    """(K,) clean(1)/noisy(0) labels as a bool tensor; bool, integer or floating input of 0/1."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({k},), got {type(labels).__name__}")
    if labels.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},), got {tuple(labels.shape)}")
    if labels.device != like.device:
        raise ValueError(f"{name} is on {labels.device} but the similarities are on {like.device}")
    if labels.dtype == torch.bool:
        return labels.detach()
    if labels.is_complex():
        raise TypeError(f"{name} must be a bool, integer or real tensor of 0/1, got {labels.dtype}")
    labels = labels.detach()
    if not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError(f"{name} must contain only 0 and 1 (clean = 1, noisy = 0)")
    return labels == 1


def class_labels(labels, n: int, num_classes: int, like: Tensor, name: str) -> Tensor:
    """(N,) int64 class indices in [0, num_classes)."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of class indices, got {type(labels).__name__}")
    if labels.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor of class indices, got {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {tuple(labels.shape)}")
    if labels.device != like.device:
        raise ValueError(f"{name} is on {labels.device} but the memberships are on {like.device}")
    labels = labels.long()
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"{name} must lie in [0, {num_classes}), got values outside it")
    return labels


def scale_value(value, name: str, like: Tensor) -> float | Tensor:
    """A positive temperature/scale: a Python real, or a 0-D floating tensor (e.g. a learned
    logit scale, which may carry gradient) on `like`'s device."""
    if isinstance(value, Tensor):
        if value.dim() != 0 or not value.is_floating_point():
            raise TypeError(f"{name} must be a real number or a 0-D floating tensor, got shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        if value.device != like.device:
            raise ValueError(f"{name} is on {value.device} but the similarities are on {like.device}")
        v = float(value.detach())
        if not math.isfinite(v) or v <= 0.0:
            raise ValueError(f"{name} must be finite and > 0, got {v}")
        return value.to(like.dtype)
    return positive_number(value, name)


def row_strips(n: int, strip_elements: int, width: int):
    """Slices of n rows, each of at most strip_elements / width rows (one at least): the strips
    in which the strip forms of the method pieces visit an (n, width) matrix they never store."""
    rows = max(1, strip_elements // width)
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))
