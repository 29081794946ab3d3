"""Shared fixtures: input generators for the regimes every backend is tested in (docs/SPEC.md §5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def random_pairs(k: int, d: int, *, dtype=torch.float32, generator=None, positive_cos: float | None = None):
    """Unit-norm x, y (K, D). With positive_cos, y_i is tilted towards x_i so x_i·y_i ≈ positive_cos."""
    x = F.normalize(torch.randn(k, d, dtype=torch.float64, generator=generator), dim=1)
    y = F.normalize(torch.randn(k, d, dtype=torch.float64, generator=generator), dim=1)
    if positive_cos is not None:
        # Remove x's component from y, then mix: cos(x, y') = positive_cos exactly before rounding.
        y = F.normalize(y - (y * x).sum(1, keepdim=True) * x, dim=1)
        y = positive_cos * x + (1.0 - positive_cos**2) ** 0.5 * y
    return x.to(dtype), y.to(dtype)


def hard_pairs(k: int, d: int, *, dtype=torch.float32, generator=None, group: int = 4, cos: float = 0.99):
    """The hard regime (SPEC §2 "Stable forms"): positives at cosine ≈ `cos` AND hard negatives.

    Items come in groups of `group` near-duplicates (like the 5 captions of one COCO image in a
    batch), so every row has a positive with e = exp(0.99/τ) ≈ 4e8 at τ = 0.05 and several
    negatives almost as strong. This is where the textbook formulas lose all their digits.
    """
    n_groups = (k + group - 1) // group
    base = F.normalize(torch.randn(n_groups, d, dtype=torch.float64, generator=generator), dim=1)
    centers = base.repeat_interleave(group, dim=0)[:k]
    spread = (1.0 - cos) ** 0.5  # keeps within-group cosines near `cos`
    x = F.normalize(centers + spread * F.normalize(torch.randn(k, d, dtype=torch.float64, generator=generator), dim=1), dim=1)
    y = F.normalize(centers + spread * F.normalize(torch.randn(k, d, dtype=torch.float64, generator=generator), dim=1), dim=1)
    return x.to(dtype), y.to(dtype)


@pytest.fixture
def gen():
    """A fresh, seeded generator per test (fresh inputs, reproducible failures)."""
    return torch.Generator().manual_seed(20261122)


def on_exact_grid(t: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """`t` (entries in [-1, 1]) rounded to multiples of 2^-bits, in t's dtype.

    With bits = 8 every entry is exact in float16, bfloat16 and tf32 as well as float32, every
    product x_k·y_k is a multiple of 2^-16, and every partial sum of a dot product of unit-norm
    rows (|Σ| ≤ ‖x‖‖y‖ < 2) needs at most 18 significant bits: float32 holds them all, so x @ yᵀ
    is exact whatever the GEMM's order, blocking or precision. Tests that compare two ways of
    computing the same result (strips against the square op) use such inputs so that only the
    orders of the float64 statistics' sums and of the gradient GEMMs remain to bound.
    """
    return (t.double() * 2.0**bits).round().div(2.0**bits).to(t.dtype)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p for a floating dtype with a p-bit significand: the relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


def reordered_sum_bound(n: int, dtype: torch.dtype, magnitude: torch.Tensor) -> torch.Tensor:
    """How far two sums of the same n terms, taken in different orders in `dtype`, can differ.

    Each recursive or blocked sum of n terms is within (n − 1)·u·Σ|t| of the exact sum (Higham,
    Accuracy and Stability of Numerical Algorithms, §4.2, to first order), so two orders differ by
    at most 2(n − 1)·u·Σ|t|; `magnitude` is Σ|t| (per sum).
    """
    return 2 * max(n - 1, 1) * unit_roundoff(dtype) * magnitude
