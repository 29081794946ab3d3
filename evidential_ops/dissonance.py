"""Dissonance of a subjective opinion: conflicting evidence among its candidates (SPEC §1).

Vacuity u = N/S is uncertainty from a lack of evidence. Dissonance is the other kind subjective
logic names: plenty of evidence, but spread over candidates that contradict each other (two
captions of different images both strongly supported). Jøsang, Cho & Chen, "Uncertainty
Characteristics of Subjective Opinions" (FUSION 2018), define it through the relative mass
balance of two belief masses,

    Bal(b_j, b_i) = 1 − |b_j − b_i| / (b_j + b_i)   (0 when b_i·b_j = 0),
    diss = Σ_i b_i · Σ_{j≠i} b_j·Bal(b_j, b_i) / Σ_{j≠i} b_j,

the form evidential graph networks use as well (Zhao et al., "Uncertainty Aware Semi-Supervised
Learning on Graph Data", NeurIPS 2020). A term whose other beliefs are all zero contributes 0.
diss lies in [0, Σ_i b_i] ⊆ [0, 1 − u]: 0 for one supported candidate, Σ_i b_i when the support
is split evenly.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["belief_dissonance"]

# Entries of the (rows, k, k) pairwise tensors formed at a time (8 MiB of float64).
_PAIR_ENTRIES = 1 << 20


def belief_dissonance(beliefs: Tensor, *, max_pair_entries: int = _PAIR_ENTRIES) -> Tensor:
    """Dissonance of each row's beliefs (SPEC §1 "dissonance"; Jøsang et al. 2018).

    beliefs: (N, k) non-negative belief masses b_i of k candidates of each of N opinions (any
    floating dtype; evaluated in float64). Returns (N,) float64. The pairwise balance needs
    O(k²) per row; rows are processed in chunks of at most `max_pair_entries` pairs.
    """
    if not isinstance(beliefs, Tensor) or not beliefs.is_floating_point():
        got = beliefs.dtype if isinstance(beliefs, Tensor) else type(beliefs).__name__
        raise TypeError(f"beliefs must be a floating torch.Tensor, got {got}")
    if beliefs.dim() != 2 or beliefs.shape[1] < 1:
        raise ValueError(f"beliefs must be 2-D (opinions, candidates), got shape {tuple(beliefs.shape)}")
    b = beliefs.detach().to(torch.float64)
    n, k = b.shape
    out = torch.zeros(n, dtype=torch.float64, device=b.device)
    if k == 1 or n == 0:
        return out  # a single candidate cannot conflict with another
    other = ~torch.eye(k, dtype=torch.bool, device=b.device)
    rows = max(1, max_pair_entries // (k * k))
    for r0 in range(0, n, rows):
        chunk = b[r0 : r0 + rows]
        b_i, b_j = chunk.unsqueeze(2), chunk.unsqueeze(1)  # (r, k, 1), (r, 1, k)
        # 1 − |b_j − b_i|/(b_j + b_i) = 2·min(b_i, b_j)/(b_i + b_j): no cancellation for close masses.
        total = b_i + b_j
        both = (b_i > 0) & (b_j > 0) & other
        balance = torch.where(both, 2.0 * torch.minimum(b_i, b_j) / torch.where(both, total, 1.0), 0.0)
        weighted = (balance * b_j).sum(dim=2)  # Σ_{j≠i} b_j·Bal(b_j, b_i)
        others = (b_j * other).sum(dim=2)  # Σ_{j≠i} b_j, summed directly (not Σ b − b_i)
        share = torch.where(others > 0, weighted / torch.where(others > 0, others, 1.0), 0.0)
        out[r0 : r0 + rows] = (chunk * share).sum(dim=1)
    return out
