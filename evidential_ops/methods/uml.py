"""UML method pieces (SPEC §3 "UML"; UML paper §3.2-3.4, eq. 1-20).

Three views per triplet i: visual v_i, English caption s_i, non-English (machine-translated)
caption t_i. Three K×K similarity matrices are used, always with the first-named view on rows:

    s_vt[i, j] = Sim(v_i, t_j)   rows: v2t queries, columns: t2v queries
    s_vs[i, j] = Sim(v_i, s_j)   rows: v2s queries, columns: s2v queries
    s_st[i, j] = Sim(s_i, t_j)   rows: s2t queries, columns: t2s queries

`uml_similarities` builds them from embeddings. Evidence is exp(tanh(Sim/τ)) with τ = 0.1
(UML eq. 1); the K×K terms fmse and logdet are the fused op's (`evidential_ops.evidential_loss`),
judged by `evidential_ops.reference.methods.uml_total_loss`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks
from ..config import NORMALIZE_EPS
from ..evidence import evidence as evidence_map
from . import _common

# UML eq. 1. Bounded: e ∈ [1/e, e], so α ∈ [1.37, 3.72] and u = N/S ∈ [0.27, 0.73] for any τ
# and any model (SPEC §3 "UML"); evidence="exp" frees it (a recipe option of the pipelines).
DEFAULT_EVIDENCE = "exp_tanh"
DEFAULT_TAU = 0.1  # UML eq. 1
DEFAULT_PHI = 0.01  # UML eq. 6
DEFAULT_GAMMA = 0.2  # UML §4.1, Multi30K / Multi-MSCOCO (VATEX: 0.25)
DEFAULT_LAMBDA_S = 4.0  # UML §4.1, Multi30K / Multi-MSCOCO (VATEX: 3)
DEFAULT_BETA = 0.6  # UML §4.1, image-text (VATEX video: 0.4)
DEFAULT_AML_TAU = 0.1  # SPEC §3 [choice]: the paper does not give the softmax temperature
_LN2 = math.log(2.0)


def triplet_embeddings(v, s, t, *, check_finite: bool) -> tuple[Tensor, Tensor, Tensor]:
    """v, s, t (K, D) of one UML batch, checked: floating, the same shape, K >= 2 (ValueError or
    TypeError naming the argument)."""
    v = _common.float_tensor(v, "v", dim=2, check_finite=check_finite)
    s = _common.float_tensor(s, "s", dim=2, check_finite=check_finite)
    t = _common.float_tensor(t, "t", dim=2, check_finite=check_finite)
    _common.same_shape(v, s, "v", "s")
    _common.same_shape(v, t, "v", "t")
    if v.shape[0] < 2:
        raise ValueError(f"v needs K >= 2 triplets, got K = {v.shape[0]}")
    return v, s, t


def uml_similarities(
    v: Tensor, s: Tensor, t: Tensor, *, normalize: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """The three similarity matrices of a UML batch (UML §3.2.1, eq. 1 "Sim"; §3.3).

    Args:
        v, s, t: (K, D) visual, English and non-English embeddings, triplet i = (v_i, s_i, t_i).
        normalize: L2-normalise the rows first (eps 1e-12), making Sim the cosine similarity;
            otherwise the caller's embeddings are taken as already normalised.
    Returns:
        (s_vt, s_vs, s_st), each (K, K): s_vt[i, j] = <v_i, t_j>, s_vs[i, j] = <v_i, s_j>,
        s_st[i, j] = <s_i, t_j>.
    """
    v, s, t = triplet_embeddings(v, s, t, check_finite=False)
    normalize = checks.flag(normalize, "normalize")
    if normalize:
        v, s, t = (F.normalize(x, dim=1, eps=NORMALIZE_EPS) for x in (v, s, t))
    return v @ t.T, v @ s.T, s @ t.T


def uml_clean_labels(
    s: Tensor, *, evidence: str = DEFAULT_EVIDENCE, tau: float = DEFAULT_TAU, check_finite: bool = True
) -> Tensor:
    """Clean/noisy pair labels of UML eq. 4 (SPEC §3 "UML"), without gradient.

    l_i = 1 iff i = argmax_j (e_ij + e_ji): the pair's combined bidirectional evidence
    (row i = i2j queries, column i = j2i queries) is the largest of its row of e + eᵀ.

    [choice] Ties count as clean: l_i = 1 iff e_ii + e_ii >= max_j (e_ij + e_ji). argmax's
    first-index tie-break would make the label depend on batch order, and ties are real:
    in float32 tanh(s/0.1) rounds to exactly 1 for s > 0.9, so exp_tanh evidence saturates.
    For exp evidence the comparison is made on ln(e_ij + e_ji) = logaddexp(s_ij/τ, s_ji/τ),
    which cannot overflow.

    Args:
        s: (K, K) similarities of one view (s_vt or s_vs), positives on the diagonal.
    Returns:
        (K,) bool tensor, True = clean.
    """
    s = _common.square_matrix(s, "s", check_finite=check_finite)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    with torch.no_grad():
        if evidence == "exp":
            x = s / tau
            pair = torch.logaddexp(x, x.T)
        else:
            e = evidence_map(s, evidence, tau)
            pair = e + e.T
        return pair.diagonal() >= pair.amax(dim=1)


def uml_clean_labels_from_embeddings(
    x: Tensor,
    y: Tensor,
    *,
    evidence: str = DEFAULT_EVIDENCE,
    tau: float = DEFAULT_TAU,
    check_finite: bool = True,
    strip_elements: int = 1 << 20,
) -> Tensor:
    """`uml_clean_labels(x·yᵀ)` (UML eq. 4) without the K×K matrix: row i of e + eᵀ needs row i
    of x·yᵀ and row i of y·xᵀ (column i of x·yᵀ), so strips of `strip_elements // K` pairs at a
    time suffice. The same comparisons; the products may round differently from one K×K GEMM
    (another blocking), so a label can differ from `uml_clean_labels(x·yᵀ)` only at a near-tie.

    Args:
        x, y: (K, D) embeddings of the view (e.g. v and t), pair i = (x_i, y_i).
    Returns:
        (K,) bool tensor, True = clean.
    """
    x, y = checks.embedding_pair(x, y, check_finite)
    evidence = checks.evidence_kind(evidence)
    tau = checks.positive_number(tau, "tau")
    strip_elements = checks.integer(strip_elements, "strip_elements", minimum=1)
    k = x.shape[0]
    labels = []
    with torch.no_grad():
        for rows in _common.row_strips(k, strip_elements, k):
            start = rows.start
            forward, backward = x[rows] @ y.T, y[rows] @ x.T  # s_ij and s_ji for i in the strip
            if evidence == "exp":
                pair = torch.logaddexp(forward / tau, backward / tau)
            else:
                pair = evidence_map(forward, evidence, tau) + evidence_map(backward, evidence, tau)
            own = pair[torch.arange(rows.stop - start), torch.arange(start, rows.stop)]
            labels.append(own >= pair.amax(dim=1))
    return torch.cat(labels)


def uml_sigma(
    epoch, total_epochs, *, gamma: float = DEFAULT_GAMMA, lambda_s: float = DEFAULT_LAMBDA_S
) -> float:
    """Dual-view schedule σ(t) = max(γ, 1 − λ_s·t/E) of UML eq. 11 (SPEC §3 "UML").

    σ weighs the vision-English view, 1 − σ the vision-non-English view; it starts at 1 and
    decays linearly to γ. `epoch` is used as given (the paper counts from 1, a 0-based caller
    gets σ = 1 on its first epoch).

    Args:
        epoch: t >= 0 (int or real).
        total_epochs: E > 0.
        gamma: floor γ in [0, 1]; lambda_s: decay speed λ_s >= 0.
    Returns:
        σ(t), a Python float in [γ, 1].
    """
    epoch = checks.real_number(epoch, "epoch", minimum=0.0)
    total_epochs = checks.positive_number(total_epochs, "total_epochs")
    gamma = checks.real_number(gamma, "gamma", minimum=0.0, maximum=1.0)
    lambda_s = checks.real_number(lambda_s, "lambda_s", minimum=0.0)
    return max(gamma, 1.0 - lambda_s * epoch / total_epochs)


def named_labels(labels, name: str, s: Tensor) -> Tensor:
    """UML's clean(1)/noisy(0) pair labels for the K rows of the (K, K) matrix s as a (K,) bool
    tensor (bool, integer or 0/1 floating input on s's device); errors name the argument `name`."""
    return _common.binary_labels(labels, s.shape[0], s, name)


def _kl_rows(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Σ_j p_j (ln p_j − ln q_j) per row, with 0·ln 0 = 0: where p_j underflows to 0 the term is
    0, and torch.where hands the unselected (possibly −inf − (−inf) = NaN) log-ratio a zero
    gradient, so the backward stays finite too."""
    p = log_p.exp()
    log_ratio = torch.where(p > 0, log_p - log_q, torch.zeros_like(log_p))
    return (p * log_ratio).sum(dim=1)


def _js_rows(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Jensen-Shannon divergence ½KL(p‖m) + ½KL(q‖m), m = (p + q)/2, per row (natural log)."""
    log_m = torch.logaddexp(log_p, log_q) - _LN2
    return 0.5 * (_kl_rows(log_p, log_m) + _kl_rows(log_q, log_m))


def uml_aml_loss(
    s_vt: Tensor,
    s_vs: Tensor,
    s_st: Tensor,
    labels_vt: Tensor,
    *,
    aml_tau: float = DEFAULT_AML_TAU,
    check_finite: bool = True,
) -> Tensor:
    """Adaptive mutual learning loss L_aml of UML eq. 14, 18, 19 (SPEC §3 "UML"), per triplet.

    q^{a2b}_i = softmax_j(Sim(a_i, b_j) / aml_tau), the a-query's distribution over the
    batch's b items (UML §3.3.1: "softmax-normalized similarity"). With the matrices of
    this module: q^{v2t}_i = row i of s_vt, q^{t2v}_i = column i of s_vt, q^{v2s}_i = row i of
    s_vs, q^{s2v}_i = column i of s_vs, q^{s2t}_i = row i of s_st, q^{t2s}_i = column i of s_st.

        L_c,i = ½[JS(q^{v2t}_i ‖ q^{v2s}_i) + JS(q^{t2v}_i ‖ q^{s2v}_i)]   (eq. 14, clean)
        L_n,i = ½[KL(q^{v2s}_i ‖ q^{s2t}_i) + KL(q^{s2v}_i ‖ q^{t2s}_i)]   (eq. 18, noisy)
        L_aml,i = l_i·L_c,i − (1 − l_i)·L_n,i                             (eq. 19)

    [choice] (SPEC) aml_tau defaults to 0.1; the paper gives no temperature. Natural logs.
    Every q carries gradient (the paper's mutual learning detaches nothing).

    Args:
        s_vt, s_vs, s_st: (K, K) similarities as laid out in the module docstring.
        labels_vt: (K,) clean labels of the vision-non-English view, constants.
    Returns:
        (K,) in the input dtype.
    """
    s_vt = _common.square_matrix(s_vt, "s_vt", check_finite=check_finite)
    s_vs = _common.square_matrix(s_vs, "s_vs", check_finite=check_finite)
    s_st = _common.square_matrix(s_st, "s_st", check_finite=check_finite)
    _common.same_shape(s_vt, s_vs, "s_vt", "s_vs")
    _common.same_shape(s_vt, s_st, "s_vt", "s_st")
    clean = named_labels(labels_vt, "labels_vt", s_vt).to(s_vt.dtype)
    aml_tau = checks.positive_number(aml_tau, "aml_tau")

    def rows(m: Tensor) -> Tensor:
        return torch.log_softmax(m / aml_tau, dim=1)

    def cols(m: Tensor) -> Tensor:
        return torch.log_softmax(m.T / aml_tau, dim=1)

    consistency = 0.5 * (_js_rows(rows(s_vt), rows(s_vs)) + _js_rows(cols(s_vt), cols(s_vs)))
    disentangle = 0.5 * (_kl_rows(rows(s_vs), rows(s_st)) + _kl_rows(cols(s_vs), cols(s_st)))
    return clean * consistency - (1.0 - clean) * disentangle
