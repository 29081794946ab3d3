"""Float64 judges of the method losses of SPEC §3 (TCL, UML, DUQ), on materialised K×K terms.

The pipelines (`evidential_ops.models`) compute these losses with the fused op and the method
pieces of `evidential_ops.methods`; the tests compare them with the functions here, which build
the evidential terms from `reference.loss_terms` (SPEC §2) and nothing fused.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from .. import checks
from ..methods import _common
from ..methods.duq import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_LOGIT_SCALE,
    duq_distance_loss,
    duq_distance_uncertainty_loss,
    duq_gaussian_kl,
    duq_similarity_loss,
)
from ..methods.tcl import DEFAULT_TAU as TCL_TAU
from ..methods.tcl import model_pair, tcl_ensemble_similarity
from ..methods.uml import (
    DEFAULT_AML_TAU,
    DEFAULT_BETA as UML_BETA,
    DEFAULT_EVIDENCE as UML_EVIDENCE,
    DEFAULT_GAMMA as UML_GAMMA,
    DEFAULT_LAMBDA_S,
    DEFAULT_PHI,
    DEFAULT_TAU as UML_TAU,
    named_labels,
    uml_aml_loss,
    uml_clean_labels,
    uml_sigma,
)
from ..results import Opinion
from .losses import check_no_overflow, loss_terms, opinion_from_similarity

# ------------------------------------------------------------------------------------------ TCL


def tcl_uncertainty_loss(
    s_a: Tensor,
    s_b: Tensor,
    *,
    kl_weight: float,
    evidence: str = "exp",
    tau: float = TCL_TAU,
    reduction: str = "mean",
    check_finite: bool = True,
):
    """Step-1 uncertainty-aware loss L_u of TCL eq. 8-11 (SPEC §3 "TCL").

    L_u = mean_i[risk_i + λ·kl_i](rows of α_A) + mean_j[risk_j + λ·kl_j](columns of α_B),
    α = g(s/τ) + 1, one-hot targets on the diagonal (risk: SPEC §2.1, kl: SPEC §2.2).
    Model A only learns its row (image-query) direction and model B only its column
    (text-query) direction, as in TCL Algorithm 1.

    Args:
        s_a: (K, K) similarities of model A (image i, text j).
        s_b: (K, K) similarities of model B, same layout.
        kl_weight: λ >= 0, usually `tcl_kl_weight(epoch)`.
        reduction: "mean" (the scalar L_u) or "none" ((K,) row losses of A, (K,) column losses of B).
    Returns:
        Scalar in the input dtype, or the two (K,) tensors.
    Raises:
        ValueError naming tau if the materialised row strengths would overflow the dtype
        (exp evidence at small τ in float32): use float64 or a fused backend then.
    """
    s_a, s_b = model_pair(s_a, s_b, check_finite)
    kl_weight = checks.real_number(kl_weight, "kl_weight", minimum=0.0)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    check_no_overflow(s_a, evidence, tau, s_a.dtype)
    check_no_overflow(s_b, evidence, tau, s_b.dtype)
    rows, _ = loss_terms(s_a, evidence=evidence, tau=tau, direction="rows", terms=("risk", "kl"))
    _, cols = loss_terms(s_b, evidence=evidence, tau=tau, direction="cols", terms=("risk", "kl"))
    row_losses = rows["risk"] + kl_weight * rows["kl"]
    col_losses = cols["risk"] + kl_weight * cols["kl"]
    if reduction == "none":
        return row_losses, col_losses
    return row_losses.mean() + col_losses.mean()


class TCLInference(NamedTuple):
    """What TCL reports at test time (SPEC §3 "TCL", inference).

    similarity: (N_q, N_g) ensemble s_A + s_B, the ranking score.
    opinion_a, opinion_b: per-query strengths and uncertainties N/S of each model, rows
        (image queries over the N_g texts) and columns (text queries over the N_q images).
    """

    similarity: Tensor
    opinion_a: Opinion
    opinion_b: Opinion


def tcl_inference(
    s_a: Tensor, s_b: Tensor, *, evidence: str = "exp", tau: float = TCL_TAU
) -> TCLInference:
    """Ensemble similarity plus each model's opinions over the gallery (SPEC §1, §3 "TCL").

    Per-result beliefs of a model are `evidential_beliefs(s_x, dim=1 or 0)`.

    Args:
        s_a, s_b: (N_q, N_g) similarities of models A and B over the test gallery.
    Returns:
        TCLInference with tensors in the input dtype.
    """
    similarity = tcl_ensemble_similarity(s_a, s_b)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    return TCLInference(
        similarity=similarity,
        opinion_a=opinion_from_similarity(s_a, evidence=evidence, tau=tau, compute_dtype=s_a.dtype),
        opinion_b=opinion_from_similarity(s_b, evidence=evidence, tau=tau, compute_dtype=s_b.dtype),
    )


# ------------------------------------------------------------------------------------------ UML


def uml_evidential_loss(
    s: Tensor,
    labels: Tensor,
    *,
    phi: float = DEFAULT_PHI,
    evidence: str = UML_EVIDENCE,
    tau: float = UML_TAU,
    check_finite: bool = True,
) -> Tensor:
    """Per-pair uncertainty loss of one view, UML eq. 6-10 (SPEC §3 "UML").

    L_u,i = L^e(row i of α) + L^e(column i of α), L^e = fmse − φ·logdet (SPEC §2.4-2.5),
    α = exp(tanh(s/τ)) + 1.
    [choice] (SPEC) target of row i and of column i: t_i = l_i·one-hot(i), so a pair judged
    noisy (l_i = 0) has an all-zero target; the Fisher weighting of eq. 5 enters through
    fmse's ψ1(α) factors, the label only through t_i.

    Args:
        s: (K, K) similarities of the view (s_vt or s_vs).
        labels: (K,) clean labels of the view (bool or 0/1), treated as constants.
    Returns:
        (K,) per-pair losses in s's dtype.
    """
    s = _common.square_matrix(s, "s", check_finite=check_finite)
    clean = _common.binary_labels(labels, s.shape[0], s, "labels")
    phi = checks.real_number(phi, "phi", minimum=0.0)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    check_no_overflow(s, evidence, tau, s.dtype)
    rows, cols = loss_terms(
        s, evidence=evidence, tau=tau, target_scale=clean.to(s.dtype), direction="both",
        terms=("fmse", "logdet"),
    )
    return (rows["fmse"] - phi * rows["logdet"]) + (cols["fmse"] - phi * cols["logdet"])


def uml_dual_view_loss(
    s_vt: Tensor,
    s_vs: Tensor,
    labels_vt: Tensor,
    labels_vs: Tensor,
    *,
    sigma: float,
    phi: float = DEFAULT_PHI,
    evidence: str = UML_EVIDENCE,
    tau: float = UML_TAU,
    check_finite: bool = True,
) -> Tensor:
    """Dual-view uncertainty-aware loss L_u of UML eq. 11 (SPEC §3 "UML"), per triplet.

    L_u,i = σ·L_u^{vs}_i + (1 − σ)·L_u^{vt}_i with L_u^{view} from `uml_evidential_loss`.

    Args:
        s_vt, s_vs: (K, K) vision-non-English and vision-English similarities.
        labels_vt, labels_vs: (K,) clean labels of each view (`uml_clean_labels`).
        sigma: σ(t) in [0, 1], usually `uml_sigma(epoch, total_epochs)`.
    Returns:
        (K,) in the input dtype.
    """
    s_vt = _common.square_matrix(s_vt, "s_vt", check_finite=check_finite)
    s_vs = _common.square_matrix(s_vs, "s_vs", check_finite=check_finite)
    _common.same_shape(s_vt, s_vs, "s_vt", "s_vs")
    sigma = checks.real_number(sigma, "sigma", minimum=0.0, maximum=1.0)
    kwargs = dict(phi=phi, evidence=evidence, tau=tau, check_finite=False)
    loss_vs = uml_evidential_loss(s_vs, named_labels(labels_vs, "labels_vs", s_vs), **kwargs)
    loss_vt = uml_evidential_loss(s_vt, named_labels(labels_vt, "labels_vt", s_vt), **kwargs)
    return sigma * loss_vs + (1.0 - sigma) * loss_vt


def uml_total_loss(
    s_vt: Tensor,
    s_vs: Tensor,
    s_st: Tensor,
    *,
    epoch,
    total_epochs,
    gamma: float = UML_GAMMA,
    lambda_s: float = DEFAULT_LAMBDA_S,
    beta: float = UML_BETA,
    phi: float = DEFAULT_PHI,
    evidence: str = UML_EVIDENCE,
    tau: float = UML_TAU,
    aml_tau: float = DEFAULT_AML_TAU,
    check_finite: bool = True,
) -> Tensor:
    """UML training objective, eq. 20 (SPEC §3 "UML"): mean_i(L_u,i + β·L_aml,i).

    Labels l^{vt}, l^{vs} are recomputed from the current evidence (`uml_clean_labels`, eq. 4,
    no gradient); σ = `uml_sigma(epoch, total_epochs, gamma, lambda_s)`. Defaults are the
    image-text settings (γ 0.2, λ_s 4, β 0.6); VATEX uses 0.25, 3, 0.4.

    Args:
        s_vt, s_vs, s_st: (K, K) similarities (module docstring).
    Returns:
        Scalar in the input dtype.
    """
    s_vt = _common.square_matrix(s_vt, "s_vt", check_finite=check_finite)
    s_vs = _common.square_matrix(s_vs, "s_vs", check_finite=check_finite)
    s_st = _common.square_matrix(s_st, "s_st", check_finite=check_finite)
    _common.same_shape(s_vt, s_vs, "s_vt", "s_vs")
    _common.same_shape(s_vt, s_st, "s_vt", "s_st")
    beta = checks.real_number(beta, "beta", minimum=0.0)
    sigma = uml_sigma(epoch, total_epochs, gamma=gamma, lambda_s=lambda_s)
    labels_vt = uml_clean_labels(s_vt, evidence=evidence, tau=tau, check_finite=False)
    labels_vs = uml_clean_labels(s_vs, evidence=evidence, tau=tau, check_finite=False)
    uncertainty = uml_dual_view_loss(
        s_vt, s_vs, labels_vt, labels_vs, sigma=sigma, phi=phi, evidence=evidence, tau=tau,
        check_finite=False,
    )
    mutual = uml_aml_loss(s_vt, s_vs, s_st, labels_vt, aml_tau=aml_tau, check_finite=False)
    return (uncertainty + beta * mutual).mean()


# ------------------------------------------------------------------------------------------ DUQ


def duq_isum_loss(s: Tensor, *, check_finite: bool = True) -> Tensor:
    """Intra-pair similarity uncertainty loss L_S^U of DUQ eq. 4-7 (SPEC §3 "DUQ").

    Evidence relu(s) (τ = 1), α = e + 1, target I, Sensoy MSE per row and per column
    (SPEC §2.3, `reference.loss_terms`): L_S^U = (1/B)(Σ_i mse_i(rows) + Σ_j mse_j(cols)).

    Args:
        s: (B, B) similarities.
    Returns:
        Scalar in s's dtype.
    """
    s = _common.square_matrix(s, "s", check_finite=check_finite)
    rows, cols = loss_terms(s, evidence="relu", tau=1.0, direction="both", terms=("mse",))
    return (rows["mse"].sum() + cols["mse"].sum()) / s.shape[0]


def duq_total_loss(
    s: Tensor,
    d: Tensor,
    mu_text: Tensor,
    log_sigma_text: Tensor,
    mu_video: Tensor,
    log_sigma_video: Tensor,
    *,
    logit_scale=DEFAULT_LOGIT_SCALE,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    check_finite: bool = True,
) -> Tensor:
    """DUQ training objective, eq. 15 (SPEC §3 "DUQ"):
    L = L_S + L_S^U + α(L_D + L_D^U) + β·L_KL, L_KL = KL_text + KL_video (eq. 14).

    Args:
        s: (B, B) similarities; d: (B, B) distances (`duq_distance_matrix`).
        mu_text, log_sigma_text: (B, D_p); mu_video, log_sigma_video: (B, D_p).
        alpha, beta: >= 0 (paper 0.1 and 1e-4).
    Returns:
        Scalar in the input dtype.
    """
    s = _common.square_matrix(s, "s", check_finite=check_finite)
    d = _common.square_matrix(d, "d", check_finite=check_finite)
    _common.same_shape(s, d, "s", "d")
    for name, t in (("mu_text", mu_text), ("log_sigma_text", log_sigma_text),
                    ("mu_video", mu_video), ("log_sigma_video", log_sigma_video)):
        t = _common.float_tensor(t, name, dim=2, check_finite=check_finite)
        checks.same_kind(s, t, "s", name)
        if t.shape[0] != s.shape[0]:
            raise ValueError(f"{name} must have B = {s.shape[0]} rows (the batch of s), got {tuple(t.shape)}")
    alpha = checks.real_number(alpha, "alpha", minimum=0.0)
    beta = checks.real_number(beta, "beta", minimum=0.0)
    similarity = duq_similarity_loss(s, logit_scale=logit_scale, check_finite=False)
    similarity = similarity + duq_isum_loss(s, check_finite=False)
    distance = duq_distance_loss(d, logit_scale=logit_scale, check_finite=False)
    distance = distance + duq_distance_uncertainty_loss(d, check_finite=False)
    kl = duq_gaussian_kl(mu_text, log_sigma_text, check_finite=False)
    kl = kl + duq_gaussian_kl(mu_video, log_sigma_video, check_finite=False)
    return similarity + alpha * distance + beta * kl
