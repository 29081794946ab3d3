"""Per-line InfoNCE math on the statistics (SPEC §2 "InfoNCE"), for the reference and the Triton
launches: the Python twin of csrc/kernels/infonce_lines.h.

A direction's statistics are (2, K) float64: per line the log-sum-exp of its negatives
N(i) = D(i) \\ P(i) (−inf for a line without any) and of its positives P(i). With
d = LSE_N − LSE_P, ℓ = LSE_D − LSE_P = ln(1 + e^d): a confident line's ℓ ≈ e^d keeps its relative
digits, which the difference of two log-sum-exps near max|s|/τ would cancel.
"""

from __future__ import annotations

import torch
from torch import Tensor

NUM_LINE_STATS = 2  # kInfoNCELineStats
NEGATIVES, POSITIVES = 0, 1  # kInfoNCENegatives, kInfoNCEPositives
# softplus(d) = d beyond this: ln(1 + e^-d) < 1e-13 there, under float64's 1e-12 relative budget
# at d >= 30 (SPEC §2 "InfoNCE" accuracy); below it ln(1 + e^d) has no overflow.
_SOFTPLUS_LINEAR_ABOVE = 30.0


def line_losses(lse_negatives: Tensor, lse_positives: Tensor) -> Tensor:
    """ℓ = ln(1 + e^{LSE_N − LSE_P}) per line (K,): 0 without negatives, +inf without positives;
    differentiable (the reference's autograd), with no NaN at either end."""
    return torch.nn.functional.softplus(lse_negatives - lse_positives, threshold=_SOFTPLUS_LINEAR_ABOVE)


def candidates_lse(lse_negatives: Tensor, lse_positives: Tensor) -> Tensor:
    """LSE_D = ln(e^{LSE_N} + e^{LSE_P}) per line."""
    return torch.logaddexp(lse_negatives, lse_positives)


def negative_share(lse_negatives: Tensor, lse_positives: Tensor) -> Tensor:
    """1 − e^{−ℓ} = σ(LSE_N − LSE_P) per line: a positive's p^D − p^P = −p^P·share."""
    return torch.sigmoid(lse_negatives - lse_positives)
