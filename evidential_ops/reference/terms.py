"""Per-row evidential loss terms of SPEC §2, on a materialised α matrix.

Row i of α (K × K) is one query's Dirichlet; its target is c_i·one-hot(i), i.e. the diagonal.
The column direction is the same function applied to αᵀ. Every term is written in a form that
stays exact when the positive's evidence dwarfs the rest of the row (SPEC §2 "Stable forms"): the
off-diagonal mass `rest = Σ_{j≠i} α_ij` is summed directly and never recovered as S − α_ii.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from ..config import TERMS
from . import special


def _off_diagonal_sum(values: Tensor, diagonal: Tensor) -> Tensor:
    return values.masked_fill(diagonal, 0.0).sum(dim=1)


def row_terms(
    alpha: Tensor, target_scale: Tensor | None = None, terms: Iterable[str] = TERMS
) -> dict[str, Tensor]:
    """Each requested term of SPEC §2 for every row of α.

    Args:
        alpha: (K, K) Dirichlet parameters, α >= 1; the target of row i is column i.
        target_scale: (K,) c_i in [0, 1]; target vector t_i = c_i·one-hot(i). Default ones.
        terms: subset of ("risk", "kl", "mse", "fmse", "logdet").

    Returns:
        {term: (K,) tensor} in α's dtype:
        risk   = c(ψ(S) − ψ(α_ii))                                  (TCL eq. 7)
        kl     = KL(Dir(α̃_i) ‖ Dir(1)), α̃_ii = c + (1 − c)α_ii       (TCL eq. 9)
        mse    = Σ_j (t_j − p_j)² + p_j(1 − p_j)/(S + 1), p = α/S    (DUQ eq. 6)
        fmse   = Σ_j [(t_j − p_j)² + p_j(1 − p_j)/(S + 1)]·ψ1(α_j)   (UML eq. 7)
        logdet = ln det(diag ψ1(α) − ψ1(S)·11ᵀ)                      (UML eq. 8)
    """
    wanted = set(terms)
    unknown = wanted.difference(TERMS)
    if unknown:
        raise ValueError(f"terms: unknown {sorted(unknown)}; known terms are {TERMS}")
    k, n = alpha.shape
    if k != n:
        raise ValueError(f"alpha must be square (targets on the diagonal), got {tuple(alpha.shape)}")
    if target_scale is None:
        target_scale = torch.ones(k, dtype=alpha.dtype, device=alpha.device)
    c = target_scale.to(alpha.dtype)
    diagonal = torch.eye(k, dtype=torch.bool, device=alpha.device)
    alpha_target = alpha.diagonal()
    rest = _off_diagonal_sum(alpha, diagonal)
    strength = alpha_target + rest
    out: dict[str, Tensor] = {}

    if "risk" in wanted:
        out["risk"] = c * special.digamma_difference(alpha_target, rest)

    if "kl" in wanted:
        alpha_target_tilde = c + (1.0 - c) * alpha_target
        strength_tilde = rest + alpha_target_tilde
        out["kl"] = (
            _off_diagonal_sum(special.kl_h(alpha), diagonal)
            + special.kl_h(alpha_target_tilde)
            - special.kl_h(strength_tilde)
            + (n - 1) * torch.digamma(strength_tilde)
            - math.lgamma(n)
        )

    if "mse" in wanted or "fmse" in wanted:
        # q = 1 − p_target, exactly; (c − p_target) = (c − 1) + q keeps a confident row's error.
        q = rest / strength
        p_target = alpha_target / strength
        target_error_sq = (c - 1.0 + q) ** 2

    if "mse" in wanted:
        p = alpha / strength[:, None]
        off_p_sq = _off_diagonal_sum(p * p, diagonal)
        one_minus_p_sq = q * (1.0 + p_target) - off_p_sq  # 1 − Σ_j p_j², without cancellation
        out["mse"] = target_error_sq + off_p_sq + one_minus_p_sq / (strength + 1.0)

    if "fmse" in wanted:
        trig = special.trigamma(alpha)
        # Off-target entries collapse to α_j(α_j + 1)ψ1(α_j) / (S(S + 1)); the product is formed
        # as (α + 1)·(αψ1(α)) because αψ1(α) → 1 while α(α + 1) overflows for huge evidence.
        fisher_off = _off_diagonal_sum((alpha + 1.0) * (alpha * trig), diagonal)
        target_part = (target_error_sq + p_target * q / (strength + 1.0)) * trig.diagonal()
        out["fmse"] = fisher_off / strength / (strength + 1.0) + target_part

    if "logdet" in wanted:
        remainder = (
            0.5 * (n - 1)
            + special.inverse_trigamma_remainder(strength)
            - special.inverse_trigamma_remainder(alpha).sum(dim=1)
        )
        out["logdet"] = (
            special.log_trigamma(alpha).sum(dim=1)
            + special.log_trigamma(strength)
            + torch.log(remainder)
        )

    return out
