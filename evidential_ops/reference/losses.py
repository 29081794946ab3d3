"""The K×K evidential loss family and opinions, materialised in plain PyTorch (SPEC §1-2, §5).

This is the judge every fused backend is tested against (evaluated in float64), and, run in
float32, the plain-PyTorch baseline of the benchmarks. Gradients come from autograd.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks
from ..config import NORMALIZE_EPS, TERMS, LossConfig
from ..results import Opinion
from ..evidence import evidence as evidence_map
from ..evidence import log_alpha, max_log_alpha
from .terms import row_terms



def _compute_dtype(input_dtype: torch.dtype, compute_dtype: torch.dtype | None) -> torch.dtype:
    if compute_dtype is None:
        return torch.float64 if input_dtype == torch.float64 else torch.float32
    if compute_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    return compute_dtype


def check_no_overflow(s: Tensor, evidence: str, tau: float, dtype: torch.dtype) -> None:
    """Raise (naming τ) if S = Σ_j α_ij would overflow `dtype`; the fused kernels work in log
    space and have no such limit, the materialised reference does. No host sync (checks.require)."""
    n = max(s.shape)
    limit = math.log(torch.finfo(dtype).max) - math.log(n) - 1.0
    bound = max_log_alpha(evidence, tau, s.detach().abs().amax().to(torch.float64))
    checks.require(
        bound <= limit,
        f"tau={tau} is too small for evidence={evidence!r} in {dtype}, or the similarities are too large: the "
        f"evidence overflows and the row strengths overflow. The losses expect cosine similarities (|s| <= 1): "
        f"for raw features pass normalize=True or L2-normalise x and y; otherwise use a larger tau, "
        f"compute_dtype=torch.float64, or a fused backend (which works in log space).",
    )


def similarity(x: Tensor, y: Tensor, *, normalize: bool, dtype: torch.dtype) -> Tensor:
    """s = x·yᵀ in `dtype` (upcast first, so float64 products of float32 inputs are exact)."""
    x = x.to(dtype)
    y = y.to(dtype)
    if normalize:
        x = F.normalize(x, dim=1, eps=NORMALIZE_EPS)
        y = F.normalize(y, dim=1, eps=NORMALIZE_EPS)
    return x @ y.T


def loss_terms(
    s: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    target_scale: Tensor | None = None,
    direction: str = "both",
    terms: Iterable[str] = TERMS,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Unweighted terms of SPEC §2 from a similarity matrix, in s's dtype.

    Args:
        s: (K, K) similarities, positives on the diagonal.
    Returns:
        (rows, cols): dicts term -> (K,) tensor; a direction not asked for is an empty dict.
    """
    alpha = evidence_map(s, evidence, tau) + 1.0
    c = None if target_scale is None else target_scale.to(s.dtype)
    rows = row_terms(alpha, c, terms) if direction in ("rows", "both") else {}
    cols = row_terms(alpha.T, c, terms) if direction in ("cols", "both") else {}
    return rows, cols


def weighted_losses(s: Tensor, config: LossConfig, target_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    """Per-row and per-column losses Σ_term weight·term, in s's dtype (empty if not asked for)."""
    weights = config.weight_dict
    rows, cols = loss_terms(
        s,
        evidence=config.evidence,
        tau=config.tau,
        target_scale=target_scale,
        direction=config.direction,
        terms=weights,
    )
    empty = s.new_zeros(0)

    def combine(parts: Mapping[str, Tensor]) -> Tensor:
        if not parts:
            return empty
        return sum(weights[term] * parts[term] for term in weights)

    return combine(rows), combine(cols)


def evidential_loss_from_similarity(
    s: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    weights: Mapping[str, float] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    reduction: str = "mean",
    check_finite: bool = True,
    compute_dtype: torch.dtype | None = torch.float64,
):
    """Reference of `evidential_ops.evidential_loss_from_similarity` (SPEC §2-3).

    s: (K, K). Computed in `compute_dtype` (float64 by default: this is the judge; None means
    float32, or float64 for float64 input). Returns the reduced loss, or (rows (K,), cols (K,))
    for reduction="none", in the compute dtype.
    """
    config = checks.loss_config(
        evidence=evidence, tau=tau, weights=weights, direction=direction,
        reduction=reduction, check_finite=check_finite,
    )
    s = checks.similarity_matrix(s, check_finite)
    c = checks.target_scale_vector(target_scale, s.shape[0], s, check_finite)
    s_c = s.to(_compute_dtype(s.dtype, compute_dtype))
    check_no_overflow(s_c, config.evidence, config.tau, s_c.dtype)
    return config.reduce(*weighted_losses(s_c, config, c))


def evidential_loss(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    weights: Mapping[str, float] | None = None,
    direction: str = "both",
    target_scale: Tensor | None = None,
    normalize: bool = False,
    reduction: str = "mean",
    check_finite: bool = True,
    compute_dtype: torch.dtype | None = torch.float64,
):
    """Reference of `evidential_ops.evidential_loss`: s = x·yᵀ (x, y: (K, D)) then the loss."""
    checks.embedding_pair(x, y, check_finite)
    checks.flag(normalize, "normalize")
    dtype = _compute_dtype(x.dtype, compute_dtype)
    s = similarity(x, y, normalize=normalize, dtype=dtype)
    return evidential_loss_from_similarity(
        s, evidence=evidence, tau=tau, weights=weights, direction=direction,
        target_scale=target_scale, reduction=reduction, check_finite=False, compute_dtype=dtype,
    )


def opinion_from_similarity(
    s: Tensor, *, evidence: str = "exp", tau: float = 0.05, compute_dtype: torch.dtype | None = torch.float64
) -> Opinion:
    """Strengths and uncertainties of every row and column of s (N_q, N_g) (SPEC §1)."""
    s_c = s.to(_compute_dtype(s.dtype, compute_dtype))
    log_a = log_alpha(s_c, evidence, tau)
    return Opinion.from_log_strengths(
        torch.logsumexp(log_a, dim=1), torch.logsumexp(log_a, dim=0)
    )


def opinion(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    normalize: bool = False,
    compute_dtype: torch.dtype | None = torch.float64,
) -> Opinion:
    """Opinions of x (N_q, D) querying y (N_g, D) and of y querying x (SPEC §1)."""
    dtype = _compute_dtype(x.dtype, compute_dtype)
    return opinion_from_similarity(
        similarity(x, y, normalize=normalize, dtype=dtype), evidence=evidence, tau=tau, compute_dtype=dtype
    )
