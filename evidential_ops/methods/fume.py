"""FUME method pieces (SPEC §3 "FUME"; FUME paper §3.2-3.5, eq. 1-10).

Category-labelled multimodal data with C classes. Each modality j gives normalised
representations z^j (N, L), L = C in the paper; paired samples share the index i and the label.
Membership degrees m = ReLU(z W) with a fixed (never trained) orthogonal W.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks
from ..infonce import infonce_loss
from ..config import NORMALIZE_EPS
from . import _common

DEFAULT_TAU = 1.0  # FUME §4.1.2


def fume_membership_matrix(
    num_classes: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    """The fixed orthogonal C×C matrix W of FUME eq. 3 (SPEC §3 "FUME").

    Drawn from the Haar measure: QR of a float64 standard-normal matrix from a private
    generator seeded with `seed`, signs fixed by diag(R) > 0, then cast to `dtype`. The same
    seed gives the same W on every machine, for every dtype up to rounding. W Wᵀ = I, so its
    rows (and columns) have unit norm. It is a constant: requires_grad is False.

    Args:
        num_classes: C >= 2.
        seed: int >= 0.
        dtype: torch.float32 or torch.float64.
    Returns:
        (C, C) tensor W; memberships are ReLU(z W) (`fume_membership`), class k = column k.
    """
    num_classes = checks.integer(num_classes, "num_classes", minimum=2)
    seed = checks.integer(seed, "seed", minimum=0)
    if dtype not in _common.METHOD_DTYPES:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    gaussian = torch.randn(num_classes, num_classes, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    # Multiplying column k of Q by sign(R_kk) makes the factorisation unique, hence W Haar-distributed.
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q.to(dtype=dtype, device=device)


def fume_membership(
    z: Tensor, weight: Tensor, *, normalize: bool = False, check_finite: bool = True
) -> Tensor:
    """Membership degrees m = ReLU(z W) of FUME eq. 3 (SPEC §3 "FUME").

    m_ik = ReLU(<z_i, W[:, k]>) ∈ [0, 1] for unit-norm z and orthogonal W. (The paper writes
    W z for a column vector z with W ∈ R^{K×L}; that is this with W transposed.)

    Args:
        z: (N, L) representations of one modality (normalised unless normalize=True).
        weight: (L, C) fixed matrix, usually `fume_membership_matrix(C)` (L = C).
        normalize: L2-normalise z's rows first (eps 1e-12) and differentiate through it.
    Returns:
        (N, C) memberships in z's dtype.
    """
    z = _common.float_tensor(z, "z", dim=2, check_finite=check_finite)
    weight = _common.float_tensor(weight, "weight", dim=2, check_finite=check_finite)
    checks.same_kind(z, weight, "z", "weight")
    if weight.shape[0] != z.shape[1]:
        raise ValueError(
            f"weight must have shape (L, C) with L = z.shape[1] = {z.shape[1]}, got {tuple(weight.shape)}"
        )
    if weight.shape[1] < 2:
        raise ValueError(f"weight needs C >= 2 classes (columns), got shape {tuple(weight.shape)}")
    if checks.flag(normalize, "normalize"):
        z = F.normalize(z, dim=1, eps=NORMALIZE_EPS)
    return torch.relu(z @ weight)


def _membership_matrix(m, name: str, check_finite: bool) -> Tensor:
    m = _common.float_tensor(m, name, dim=2, check_finite=check_finite)
    if m.shape[1] < 2:
        raise ValueError(f"{name} needs C >= 2 classes (columns), got shape {tuple(m.shape)}")
    return m


def _max_of_others(m: Tensor) -> Tensor:
    """(N, C): entry k is max_{l ≠ k} m_l (the top value, or the runner-up where k is the top)."""
    top = torch.topk(m, 2, dim=1)
    best, runner_up = top.values[:, :1], top.values[:, 1:2]
    is_best = torch.arange(m.shape[1], device=m.device).unsqueeze(0) == top.indices[:, :1]
    return torch.where(is_best, runner_up, best)


def fume_credibility(m: Tensor, *, check_finite: bool = True) -> Tensor:
    """Inference category credibility of FUME eq. 2 (SPEC §3 "FUME"):
    c_k = (m_k + 1 − max_{l≠k} m_l) / 2 (possibility plus necessity, halved).

    Args:
        m: (N, C) memberships.
    Returns:
        (N, C) credibilities, in [0, 1] when m is.
    """
    m = _membership_matrix(m, "m", check_finite)
    return 0.5 * (m + 1.0 - _max_of_others(m))


def fume_training_credibility(m: Tensor, labels: Tensor, *, check_finite: bool = True) -> Tensor:
    """Training credibility r of FUME eq. 5 (SPEC §3 "FUME"), label class l:
    r_l = (m_l + 1 − max_{k≠l} m_k)/2, and r_k = (m_k + 1 − m_l)/2 for k ≠ l (the necessity
    of an unmatched class is measured against the labelled class only).

    Args:
        m: (N, C) memberships; labels: (N,) integer class indices.
    Returns:
        (N, C) in m's dtype.
    """
    m = _membership_matrix(m, "m", check_finite)
    labels = _common.class_labels(labels, m.shape[0], m.shape[1], m, "labels")
    is_label = F.one_hot(labels, m.shape[1]).bool()
    m_label = m.gather(1, labels.unsqueeze(1))
    best_other = m.masked_fill(is_label, float("-inf")).amax(dim=1, keepdim=True)
    necessity = torch.where(is_label, 1.0 - best_other, 1.0 - m_label)
    return 0.5 * (m + necessity)


def _modalities(tensors, name: str, check_finite: bool) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence):
        raise TypeError(f"{name} must be a list or tuple of (N, ·) tensors, one per modality")
    if len(tensors) < 1:
        raise ValueError(f"{name} must hold at least one modality")
    out = [
        _common.float_tensor(t, f"{name}[{j}]", dim=2, check_finite=check_finite)
        for j, t in enumerate(tensors)
    ]
    for j, t in enumerate(out[1:], start=1):
        _common.same_shape(out[0], t, f"{name}[0]", f"{name}[{j}]")
    return out


def fume_fml_loss(memberships: Sequence[Tensor], labels: Tensor, *, check_finite: bool = True) -> Tensor:
    """Fuzzy multimodal learning loss of FUME eq. 4 (SPEC §3 "FUME").

    L_fml = Σ_modalities mean_i ‖r_i − y_i‖₂ with r from eq. 5 and y_i = one-hot(label_i).
    The L2 norm itself, not its square (as in the paper and the released code); its gradient at
    r_i = y_i is taken as 0 (torch.linalg.vector_norm's subgradient), where the released
    code's sqrt(sum(...)) gives NaN.

    Args:
        memberships: M tensors (N, C), one per modality, same shape and dtype.
        labels: (N,) integer class indices shared by the paired samples.
    Returns:
        Scalar in the input dtype.
    """
    ms = _modalities(memberships, "memberships", check_finite)
    if ms[0].shape[1] < 2:
        raise ValueError(f"memberships need C >= 2 classes, got shape {tuple(ms[0].shape)}")
    labels = _common.class_labels(labels, ms[0].shape[0], ms[0].shape[1], ms[0], "labels")
    target = F.one_hot(labels, ms[0].shape[1]).to(ms[0].dtype)
    total = ms[0].new_zeros(())
    for m in ms:
        r = fume_training_credibility(m, labels, check_finite=False)
        total = total + torch.linalg.vector_norm(r - target, dim=1).mean()
    return total


def fume_consistency_loss(
    features: Sequence[Tensor],
    *,
    tau: float = DEFAULT_TAU,
    exclude_self: bool = False,
    check_finite: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Multimodal contrastive consistency loss of FUME eq. 6-7 (SPEC §3 "FUME"):

        P(i | x_i^j) = Σ_v exp(z_i^v·z_i^j/τ) / Σ_v Σ_t exp(z_t^v·z_i^j/τ)
        L_cl = −(1/N) Σ_j Σ_i ln P(i | x_i^j)

    (sum over the M modalities j, mean over the N samples). Computed by the fused InfoNCE op
    (SPEC §2 "InfoNCE"): the row losses of z·zᵀ/τ, z the M·N anchors stacked, each anchor's
    positives the anchors of its instance (group ids), summed and divided by N; no (MN)² logits.
    exclude_self=False keeps the self term v = j, t = i as the paper writes it;
    exclude_self=True drops that single term from numerator and denominator, as the released
    code does (its other same-modality terms t ≠ i stay in the denominator): `drop_self`.

    Args:
        features: M >= 2 tensors (N, L), z^j of each modality, row i = instance i.
        tau: temperature > 0 (1 in the paper).
        backend: the InfoNCE op's backend ("auto", "reference", "cpu", ...).
    Returns:
        Scalar in the input dtype.
    """
    zs = _modalities(features, "features", check_finite)
    if len(zs) < 2:
        raise ValueError(f"features must hold M >= 2 modalities, got {len(zs)}")
    tau = checks.positive_number(tau, "tau")
    exclude_self = checks.flag(exclude_self, "exclude_self")
    n = zs[0].shape[0]
    anchors = torch.cat(zs)  # (M·N, L): modality j's sample i at row j·N + i
    instance = torch.arange(n, device=anchors.device).repeat(len(zs))
    total = infonce_loss(anchors, anchors, tau=tau, group=instance, drop_self=exclude_self, direction="rows",
                         reduction="sum", backend=backend, check_finite=False)
    return (total / n).to(anchors.dtype)


def fume_loss(
    features: Sequence[Tensor],
    labels: Tensor,
    weight: Tensor,
    *,
    alpha: float,
    tau: float = DEFAULT_TAU,
    exclude_self: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """FUME training objective, eq. 8 (SPEC §3 "FUME"): L = L_fml + α·L_cl.

    Memberships are ReLU(z^j W) for each modality (`fume_membership`).

    Args:
        features: M >= 2 tensors (N, L) of normalised representations.
        labels: (N,) integer class indices.
        weight: (L, C) fixed matrix (`fume_membership_matrix`).
        alpha: α >= 0 (paper: 10, 0.05, 0.5, 0.05, 1 depending on the dataset; no default).
    Returns:
        Scalar in the input dtype.
    """
    zs = _modalities(features, "features", check_finite)
    alpha = checks.real_number(alpha, "alpha", minimum=0.0)
    memberships = [fume_membership(z, weight, check_finite=check_finite) for z in zs]
    return fume_fml_loss(memberships, labels, check_finite=False) + alpha * fume_consistency_loss(
        zs, tau=tau, exclude_self=exclude_self, check_finite=False
    )


def fume_decision_uncertainty(c: Tensor, *, check_values: bool = True) -> Tensor:
    """Decision uncertainty of FUME eq. 9 (SPEC §3 "FUME"):
    u = Σ_k H2(c_k) / (C ln 2), H2(c) = −c ln c − (1 − c) ln(1 − c), 0 ln 0 = 0.

    Exactly 0 (no NaN) where c_k ∈ {0, 1}. [choice] The backward there is 0 too: H2's one-sided
    slope is ±∞ at the ends, and an infinite gradient would turn into NaN further back
    (∞ − ∞ in the matmul through W); 0 is the slope of the projected minimum H2 = 0.
    Credibilities outside [0, 1] by rounding only (|excess| <= 16 ulp, e.g. a unit-norm z
    whose membership rounds to 1 + 1e-7) are clamped; larger excursions are an error.

    Args:
        c: (N, C) credibilities in [0, 1] (`fume_credibility`).
        check_values: verify the [0, 1] range (a host sync).
    Returns:
        (N,) uncertainties in [0, 1], in c's dtype.
    """
    check_values = checks.flag(check_values, "check_values")
    c = _membership_matrix(c, "c", check_values)
    if check_values:
        slack = 16 * torch.finfo(c.dtype).eps
        if bool(((c < -slack) | (c > 1.0 + slack)).any()):
            raise ValueError("c must lie in [0, 1] (category credibilities); got values outside it")
    c = c.clamp(0.0, 1.0)
    interior = (c > 0.0) & (c < 1.0)
    c_safe = torch.where(interior, c, torch.full_like(c, 0.5))
    entropy = -(c_safe * torch.log(c_safe) + (1.0 - c_safe) * torch.log1p(-c_safe))
    entropy = torch.where(interior, entropy, torch.zeros_like(entropy))
    return entropy.sum(dim=1) / (c.shape[1] * math.log(2.0))


def fume_cross_modal_uncertainty(u1: Tensor, u2: Tensor, *, pairwise: bool = False) -> Tensor:
    """Cross-modal uncertainty of FUME eq. 10 (SPEC §3 "FUME"): u = 1 − (1 − u1)(1 − u2).

    pairwise=False: elementwise for the i-th sample's two modalities (shapes must match).
    pairwise=True: the uncertainty of every retrieved result, u[i, j] from query i's u1[i]
    and gallery item j's u2[j] (what the threshold filter of FUME Table 1 uses).

    Args:
        u1: (N,) decision uncertainties of modality 1 (queries).
        u2: (N,) (or (N_g,) with pairwise=True) of modality 2.
    Returns:
        (N,), or (N, N_g) with pairwise=True.
    """
    u1 = _common.float_tensor(u1, "u1", dim=1, check_finite=False)
    u2 = _common.float_tensor(u2, "u2", dim=1, check_finite=False)
    checks.same_kind(u1, u2, "u1", "u2")
    if checks.flag(pairwise, "pairwise"):
        return 1.0 - (1.0 - u1).unsqueeze(1) * (1.0 - u2).unsqueeze(0)
    _common.same_shape(u1, u2, "u1", "u2")
    return 1.0 - (1.0 - u1) * (1.0 - u2)
