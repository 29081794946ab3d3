"""Evidence maps e = g(s/τ), Dirichlet parameters α = e + 1 and beliefs b = e/S (SPEC §1).

Elementwise functions used by the pipelines, the public `belief` and the float64 reference alike.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import EVIDENCE_KINDS


def evidence(s: Tensor, kind: str, tau: float) -> Tensor:
    """e = g(s/τ), elementwise, any shape (SPEC §1 table).

    exp: exp(s/τ) (TCL); relu: max(s/τ, 0) (DUQ, TCL option); softplus: ln(1 + exp(s/τ))
    (TCL supplement, I-EDL); exp_tanh: exp(tanh(s/τ)) (UML).
    """
    x = s / tau
    if kind == "exp":
        return torch.exp(x)
    if kind == "relu":
        return torch.relu(x)
    if kind == "softplus":
        # max(x, 0) + log1p(exp(−|x|)) is exact for every x; torch's softplus returns x
        # itself above 20, an error of e^-20 ≈ 2e-9 that the float64 reference cannot afford.
        return torch.relu(x) + torch.log1p(torch.exp(-x.abs()))
    if kind == "exp_tanh":
        return torch.exp(torch.tanh(x))
    raise ValueError(f"evidence must be one of {EVIDENCE_KINDS}, got {kind!r}")


# belief() takes a keyword named `evidence` (the public API's name), which hides the function.
_evidence_map = evidence


def log_alpha(s: Tensor, kind: str, tau: float) -> Tensor:
    """ln α = ln(g(s/τ) + 1) elementwise (SPEC §1; any shape, s's dtype), finite even where α
    itself overflows (exp evidence, small τ)."""
    if kind == "exp":
        x = s / tau
        return torch.relu(x) + torch.log1p(torch.exp(-x.abs()))
    return torch.log1p(evidence(s, kind, tau))


def log_evidence(s: Tensor, kind: str, tau: float) -> Tensor:
    """ln e = ln g(s/τ), elementwise, exact where e itself overflows (SPEC §1; used for beliefs
    b = exp(ln e − ln S) of results whose evidence exceeds the dtype, exp at small τ).

    exp: s/τ; relu: ln(max(s/τ, 0)), −inf where the evidence is 0 (b = 0 there);
    softplus: ln ln(1 + e^x) (x itself below x = −30, where ln(1 + e^x) = e^x to 1e-13);
    exp_tanh: tanh(s/τ).
    """
    x = s / tau
    if kind == "exp":
        return x
    if kind == "relu":
        return torch.log(torch.relu(x))
    if kind == "softplus":
        softplus = torch.relu(x) + torch.log1p(torch.exp(-x.abs()))
        return torch.where(x < -30.0, x, torch.log(softplus))
    if kind == "exp_tanh":
        return torch.tanh(x)
    raise ValueError(f"evidence must be one of {EVIDENCE_KINDS}, got {kind!r}")


def max_log_alpha(kind: str, tau: float, max_abs_similarity: Tensor) -> Tensor:
    """An upper bound of ln α over |s| <= max_abs_similarity (a 0-D tensor), used to detect
    overflow up front; a tensor so that the check needs no host sync (checks.require)."""
    x = max_abs_similarity / tau
    if kind == "exp":
        return x + torch.log1p(torch.exp(-x))
    if kind == "relu":
        return torch.log1p(x)
    if kind == "softplus":
        return torch.log1p(x + torch.log1p(torch.exp(-x)))
    return torch.full_like(x, math.log1p(math.e))


def belief(s: Tensor, log_strength: Tensor, *, evidence: str, tau: float, dim: int = 1) -> Tensor:
    """b = e / S for the entries of s, given the log-strengths of its rows (dim=1) or columns (dim=0).

    s: (N_q, M) similarities of selected results; log_strength: (N_q,) for dim=1, (M,) for dim=0.
    """
    log_s = log_strength.unsqueeze(1) if dim == 1 else log_strength.unsqueeze(0)
    if evidence == "exp":
        return torch.exp(s.to(log_s.dtype) / tau - log_s)
    return _evidence_map(s.to(log_s.dtype), evidence, tau) * torch.exp(-log_s)


def unit_rows(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """x, y (K, D) with unit-norm rows (the `normalize=True` option, SPEC §5), in at least float32:
    normalising bf16 in bf16 would cost 2^-8 before the kernel starts."""
    import torch.nn.functional as F

    from .checks import output_dtype
    from .config import NORMALIZE_EPS

    work = output_dtype(x.dtype)
    return F.normalize(x.to(work), dim=1, eps=NORMALIZE_EPS), F.normalize(y.to(work), dim=1, eps=NORMALIZE_EPS)
