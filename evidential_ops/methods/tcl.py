"""TCL / TcVSE method pieces (SPEC §3 "TCL"; TCL paper §III, TcVSE paper §2).

Two query models: A (image/visual query, owns the row direction v2t) and B (text query, owns
the column direction t2v). Each gives its own (K, K) similarity matrix, s_A[i, j] and s_B[i, j]
both being the similarity of image i and text j; "columns" is the same matrix read by columns.
The K×K evidential terms are the fused op's (`evidential_ops.evidential_loss`); their float64
judge `evidential_ops.reference.methods.tcl_uncertainty_loss` lives with the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from ..evidence import belief, log_alpha
from . import _common

KL_RATE = 0.005  # TCL eq. 10: λ = min(1, 0.005·n_e)
KL_RATE_BERT = 0.001  # SPEC §3 / released code, for BERT-style text encoders
DEFAULT_TAU = 0.05


def tcl_kl_weight(epoch: int, *, bert: bool = False) -> float:
    """KL annealing weight λ of TCL eq. 10 (SPEC §3 "TCL", step 1).

    λ = min(1, 0.005·epoch), or min(1, 0.001·epoch) with bert=True (BERT-style text encoder).
    `epoch` is 0-based as in the released code (SPEC §3), so the first epoch has λ = 0.

    Args:
        epoch: int >= 0.
        bert: bool.
    Returns:
        λ, a Python float in [0, 1].
    """
    epoch = checks.integer(epoch, "epoch", minimum=0)
    bert = checks.flag(bert, "bert")
    rate = KL_RATE_BERT if bert else KL_RATE
    return min(1.0, rate * epoch)


def evidential_beliefs(s: Tensor, *, evidence: str = "exp", tau: float = DEFAULT_TAU, dim: int = 1) -> Tensor:
    """Belief masses b = e / S of every entry of s (SPEC §1; TCL eq. 4).

    dim=1: each row i is a query over the columns, b_ij = e_ij / S_i with S_i = Σ_j α_ij.
    dim=0: each column j is a query over the rows, b_ij = e_ij / S'_j with S'_j = Σ_i α_ij.
    Formed as exp(ln e − ln S) with ln S a log-sum-exp of ln α, so exp evidence at small τ
    (e = e^100 at τ = 0.01 overflows float32) still gives finite, exact beliefs.

    Args:
        s: (N_q, N_g) similarities, float32 or float64.
    Returns:
        (N_q, N_g) beliefs in s's dtype; each row (dim=1) or column (dim=0) sums to 1 − N/S.
    """
    s = _common.float_tensor(s, "s", dim=2, check_finite=False)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 (columns) or 1 (rows), got {dim!r}")
    log_strength = torch.logsumexp(log_alpha(s, evidence, tau), dim=dim)
    return belief(s, log_strength, evidence=evidence, tau=tau, dim=dim)


def model_pair(s_a, s_b, check_finite: bool) -> tuple[Tensor, Tensor]:
    """The (K, K) similarity matrices of TCL's models A and B, checked: each square with K >= 2,
    float32/float64, finite when `check_finite`, and both of the same shape, dtype and device
    (a ValueError/TypeError naming s_a or s_b otherwise). Returns (s_a, s_b) unchanged."""
    s_a = _common.square_matrix(s_a, "s_a", check_finite=check_finite)
    s_b = _common.square_matrix(s_b, "s_b", check_finite=check_finite)
    _common.same_shape(s_a, s_b, "s_a", "s_b")
    return s_a, s_b


def tcl_consistency_loss(
    s_a: Tensor,
    s_b: Tensor,
    *,
    evidence: str = "exp",
    tau: float = DEFAULT_TAU,
    check_finite: bool = True,
) -> Tensor:
    """Step-2 belief consistency loss L_c of TCL eq. 12-13 (SPEC §3 "TCL", Algorithm 1).

    L_c = (1/K²) Σ_ij |b^A_ij − b^B_ij| over row beliefs (b_ij = e_ij / S_i, row strengths),
          with model A detached: the v2t direction is owned by A and pulls B towards it,
        + (1/K²) Σ_ij |b^A_ij − b^B_ij| over column beliefs (b_ij = e_ij / S'_j, column
          strengths), with model B detached: the t2v direction is owned by B and pulls A.
    So s_a receives gradient only from the column term and s_b only from the row term.
    Beliefs are formed in log space (see `evidential_beliefs`): no overflow for any τ > 0.

    Args:
        s_a, s_b: (K, K) similarities of models A and B (image i, text j), same dtype.
    Returns:
        Scalar in the input dtype.
    """
    s_a, s_b = model_pair(s_a, s_b, check_finite)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    rows_a = evidential_beliefs(s_a.detach(), evidence=evidence, tau=tau, dim=1)
    rows_b = evidential_beliefs(s_b, evidence=evidence, tau=tau, dim=1)
    cols_a = evidential_beliefs(s_a, evidence=evidence, tau=tau, dim=0)
    cols_b = evidential_beliefs(s_b.detach(), evidence=evidence, tau=tau, dim=0)
    return (rows_a - rows_b).abs().mean() + (cols_a - cols_b).abs().mean()


def tcl_ensemble_similarity(s_a: Tensor, s_b: Tensor) -> Tensor:
    """Inference similarity of the TCL ensemble, s_A + s_B (SPEC §3 "TCL"; TCL §IV-B "TCL_i&t").

    The paper averages the two; the sum ranks identically and is what SPEC fixes.

    Args:
        s_a, s_b: (N_q, N_g) similarities of the two models over the same queries and gallery.
    Returns:
        (N_q, N_g) in the input dtype.
    """
    s_a = _common.float_tensor(s_a, "s_a", dim=2, check_finite=False)
    s_b = _common.float_tensor(s_b, "s_b", dim=2, check_finite=False)
    _common.same_shape(s_a, s_b, "s_a", "s_b")
    return s_a + s_b
