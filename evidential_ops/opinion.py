"""Public opinion API: per-query strength and uncertainty over a whole gallery (SPEC §1, §3).

Opinions are inference-time quantities: they are computed without gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import backends, checks
from .config import NORMALIZE_EPS
from .evidence import belief as _belief
from .results import Opinion


def opinion(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    normalize: bool = False,
    backend: str = "auto",
    check_finite: bool = True,
) -> Opinion:
    """Opinions of the N_q queries x over the gallery y (rows) and of y over x (columns).

    S_i = Σ_j α_ij with α = g(x_i·y_j/τ) + 1, uncertainty u_i = N_g / S_i (SPEC §1); columns
    likewise with N_q. x: (N_q, D), y: (N_g, D); N_q >= 1 and N_g >= 2 may differ. Never stores
    N_q × N_g on a fused backend.
    """
    tau = checks.tau_value(tau)
    evidence = checks.evidence_kind(evidence)
    normalize = checks.flag(normalize, "normalize")
    check_finite = checks.flag(check_finite, "check_finite")
    x, y = checks.embedding_pair(x, y, check_finite, square=False)
    impl = backends.resolve(backend, x.device)
    with torch.no_grad():
        if normalize:
            work = checks.output_dtype(x.dtype)
            x = F.normalize(x.to(work), dim=1, eps=NORMALIZE_EPS)
            y = F.normalize(y.to(work), dim=1, eps=NORMALIZE_EPS)
        return impl.opinion(x, y, evidence, tau)


def opinion_from_similarity(
    s: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    backend: str = "auto",
    check_finite: bool = True,
) -> Opinion:
    """`opinion` for a given (N_q, N_g) similarity matrix (N_q >= 1, N_g >= 2)."""
    tau = checks.tau_value(tau)
    evidence = checks.evidence_kind(evidence)
    check_finite = checks.flag(check_finite, "check_finite")
    s = checks.similarity_matrix(s, check_finite, square=False)
    impl = backends.resolve(backend, s.device)
    with torch.no_grad():
        return impl.opinion_from_similarity(s, evidence, tau)


def belief(s: Tensor, log_strength: Tensor, *, evidence: str = "exp", tau: float = 0.05, dim: int = 1) -> Tensor:
    """Belief b = e / S of selected results (e.g. each query's top-k), SPEC §1.

    s: (N_q, M) similarities of the results; log_strength: the queries' `row_log_strength`
    (N_q,) for dim=1, or the `col_log_strength` (M,) of column queries for dim=0.
    """
    tau = checks.tau_value(tau)
    evidence = checks.evidence_kind(evidence)
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    s = checks.float_matrix(s, "s", True, min_rows=1)
    if not isinstance(log_strength, Tensor) or not log_strength.is_floating_point():
        got = log_strength.dtype if isinstance(log_strength, Tensor) else type(log_strength).__name__
        raise TypeError(f"log_strength must be a floating torch.Tensor, got {got}")
    if log_strength.device != s.device:
        raise ValueError(f"log_strength is on {log_strength.device} but s is on {s.device}")
    if log_strength.dim() != 1 or log_strength.shape[0] != s.shape[1 - dim]:
        raise ValueError(
            f"log_strength must have shape ({s.shape[1 - dim]},) for s of shape {tuple(s.shape)} and "
            f"dim={dim}, got {tuple(log_strength.shape)}"
        )
    checks.require_finite(log_strength, "log_strength")
    return _belief(s, log_strength, evidence=evidence, tau=tau, dim=dim)
