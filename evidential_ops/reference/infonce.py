"""InfoNCE in plain PyTorch (SPEC §2 "InfoNCE"): the float64 judge of the fused op.

Materialises the K×K logits and masks; every log-sum-exp is torch.logsumexp (shifted by its own
maximum), so τ = 0.01 with near-duplicate positives stays finite in float32 too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..infonce_lines import line_losses


def infonce_masks(k: int, group: Tensor | None, drop_self: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """(candidates, positives): (K, K) bool masks D and P of the rows (SPEC §2 "InfoNCE").

    D[i, j] = j ∈ D(i): every j, or every j ≠ i with drop_self. P[i, j] = j ∈ P(i): g_j = g_i
    (g = arange(K) without `group`), without j = i under drop_self. Both are symmetric, so the
    columns' masks are the same matrices.
    """
    ids = torch.arange(k, device=device) if group is None else group
    positives = ids.view(-1, 1) == ids.view(1, -1)
    candidates = torch.ones(k, k, dtype=torch.bool, device=device)
    if drop_self:
        off_diagonal = ~torch.eye(k, dtype=torch.bool, device=device)
        positives = positives & off_diagonal
        candidates = off_diagonal
    return candidates, positives


def _masked_logsumexp(logits: Tensor, mask: Tensor) -> Tensor:
    """Per row the log-sum-exp over `mask`; −inf for a row with none, whose gradient is 0 (not
    the NaN of a softmax over nothing: such a row is summed over all of it, then replaced)."""
    some = mask.any(dim=1)
    lse = torch.logsumexp(logits.masked_fill(~(mask | ~some[:, None]), float("-inf")), dim=1)
    return torch.where(some, lse, torch.full_like(lse, float("-inf")))


def infonce_line_losses(logits: Tensor, group: Tensor | None = None, drop_self: bool = False) -> tuple[Tensor, Tensor]:
    """Row and column losses (K,), (K,) of given logits s (K, K) = x·yᵀ/τ:
    ℓ_i = LSE_{D(i)}(s_i·) − LSE_{P(i)}(s_i·) = ln(1 + e^{LSE_N − LSE_P}), N(i) = D(i) \\ P(i)
    (infonce_lines.line_losses: no cancellation on a confident line), and the same on sᵀ (SPEC §2
    "InfoNCE").

    A line without positives (drop_self with a group of one) has ℓ = +inf.
    """
    candidates, positives = infonce_masks(logits.shape[0], group, drop_self, logits.device)
    negatives = candidates & ~positives
    rows = line_losses(_masked_logsumexp(logits, negatives), _masked_logsumexp(logits, positives))
    cols = line_losses(_masked_logsumexp(logits.T, negatives), _masked_logsumexp(logits.T, positives))
    return rows, cols


def infonce_loss(
    x: Tensor,
    y: Tensor,
    *,
    tau: float | Tensor = 0.05,
    group: Tensor | None = None,
    drop_self: bool = False,
    direction: str = "both",
    reduction: str = "mean",
    normalize: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """InfoNCE of s = x·yᵀ/τ in float64 (SPEC §2 "InfoNCE"); differentiable in x, y and a tensor τ.

    Args:
        x, y: (K, D) embeddings (any floating dtype; computed in float64).
        tau: τ > 0, a float or a 0-d tensor. group: optional (K,) integer ids of the positives.
        drop_self: remove the self term from candidates and positives (FUME's released code).
        direction: "rows", "cols" or "both". reduction: "mean" (mean(rows) + mean(cols)),
            "mean_of_directions" (half of "mean"), "sum", or "none" → (rows (K,), cols (K,)), a
            direction not asked for empty.
        normalize: L2-normalise x and y first (eps 1e-12).
    Returns:
        A float64 scalar, or the (rows, cols) pair for "none".
    """
    x, y = x.double(), y.double()
    if normalize:
        x = torch.nn.functional.normalize(x, dim=1, eps=1e-12)
        y = torch.nn.functional.normalize(y, dim=1, eps=1e-12)
    inv_tau = 1.0 / (tau.double() if isinstance(tau, Tensor) else float(tau))
    rows, cols = infonce_line_losses((x @ y.T) * inv_tau, group, drop_self)
    use_rows, use_cols = direction in ("rows", "both"), direction in ("cols", "both")
    if reduction == "none":
        return (rows if use_rows else rows[:0]), (cols if use_cols else cols[:0])
    parts = [p for p, used in ((rows, use_rows), (cols, use_cols)) if used]
    values = [p.sum() if reduction == "sum" else p.mean() for p in parts]
    total = values[0] if len(values) == 1 else values[0] + values[1]
    return total / len(values) if reduction == "mean_of_directions" else total
