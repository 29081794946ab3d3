"""How good is an uncertainty score? Error detection, selective retrieval, shift detection, calibration.

A retrieval system that returns an uncertainty with each answer promises that a high value flags
an answer not to trust. These functions measure that promise for any per-query score (the
vacuity u = N/S, the dissonance, minus the top result's belief, FUME's decision uncertainty, ...)
or any per-result score taken at each query's returned top-1 result (SPEC §6):

- `auroc`, `aupr`: how well the score separates the queries whose top-1 is wrong from the rest
  (and, with `auroc`, out-of-distribution queries from in-distribution ones);
- `risk_coverage_curve`, `aurc`, `excess_aurc`, `accuracy_at_coverage`: selective retrieval, i.e.
  answer only the most certain queries (Geifman & El-Yaniv 2017; AURC and E-AURC of Geifman,
  Uziel & El-Yaniv 2019, "Bias-reduced uncertainty estimation for deep neural classifiers");
- `expected_calibration_error`: is a belief of 0.8 right 80 % of the time (Naeini et al. 2015,
  Guo et al. 2017);
- `similarity_baselines`: the scores any retrieval system has for free (minus the top-1
  similarity, minus the top-1/top-2 margin), which an uncertainty must beat to add anything;
- `uncertainty_report`: all of the above for a set of scores, baselines included, as a JSON-able
  dict.

Orientation: every score is an *uncertainty*, higher = less confident. Turn a confidence c (a
belief, a similarity) into one with −c. Ties are resolved by their expectation over a random
order (AUROC counts ½ per tie, the risk–coverage curve spreads a tied group's errors evenly), so
a constant score is exactly as good as chance, never luckier.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DEFAULT_COVERAGES",
    "DEFAULT_ECE_BINS",
    "accuracy_at_coverage",
    "aupr",
    "auroc",
    "aurc",
    "expected_calibration_error",
    "excess_aurc",
    "risk_coverage_curve",
    "similarity_baselines",
    "uncertainty_report",
]

DEFAULT_COVERAGES = (0.5, 0.8)  # the "R@1 at 50 % and 80 % coverage"
DEFAULT_ECE_BINS = 15  # Guo et al. 2017


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _vector(a, name: str) -> Tensor:
    """A 1-D, finite, real vector as float64 on the CPU."""
    if isinstance(a, np.ndarray):
        a = torch.from_numpy(np.ascontiguousarray(a))
    if not isinstance(a, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if a.dtype == torch.bool or a.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {a.dtype}")
    if a.dim() != 1:
        raise ValueError(f"{name} must be 1-D (one value per query), got shape {tuple(a.shape)}")
    a = a.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(a).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return a


def _flags(a, name: str, n: int | None = None) -> Tensor:
    """A 1-D bool vector (bool, or integer/float 0/1)."""
    if isinstance(a, np.ndarray):
        a = torch.from_numpy(np.ascontiguousarray(a))
    if not isinstance(a, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if a.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(a.shape)}")
    if a.dtype != torch.bool:
        if a.is_complex() or not bool(((a == 0) | (a == 1)).all()):
            raise ValueError(f"{name} must be bool (or 0/1), got values outside {{0, 1}}")
        a = a != 0
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {n} (one per score)")
    return a.detach().cpu()


def _scores_and_flags(scores, flags, score_name: str, flag_name: str) -> tuple[Tensor, Tensor]:
    s = _vector(scores, score_name)
    if s.numel() == 0:
        raise ValueError(f"{score_name} must hold at least one value")
    return s, _flags(flags, flag_name, s.shape[0])


def _coverage(value, name: str = "coverage") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in (0, 1], got {type(value).__name__}")
    value = float(value)
    if not (0.0 < value <= 1.0):
        raise ValueError(f"{name} must lie in (0, 1], got {value}")
    return value


# ----------------------------------------------------------------------------------------------
# ranking quality of a score
# ----------------------------------------------------------------------------------------------
def _average_ranks(values: Tensor) -> Tensor:
    """1-based ranks with ties sharing their average rank (float64)."""
    ordered = torch.sort(values).values
    low = torch.searchsorted(ordered, values, right=False).to(torch.float64)
    high = torch.searchsorted(ordered, values, right=True).to(torch.float64)
    return (low + high + 1.0) / 2.0


def auroc(scores, positives) -> float:
    """Area under the ROC curve of `scores` for detecting `positives` (SPEC §6).

    AUROC = P(score of a positive > score of a negative) + ½·P(equal), the Mann–Whitney
    statistic; 0.5 is chance, 1 a perfect detector. scores: (N,) real; positives: (N,) bool (a
    wrong top-1, an out-of-distribution query, a noisy pair). NaN when either group is empty.
    """
    s, pos = _scores_and_flags(scores, positives, "scores", "positives")
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(s)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def aupr(scores, positives) -> float:
    """Area under the precision–recall curve of `scores` for detecting `positives`, as average
    precision (SPEC §6): AP = Σ_t (R_t − R_{t−1})·P_t over the distinct score values t taken as
    thresholds from the highest down (a tied group enters at once, as scikit-learn's
    `average_precision_score`). Chance level is the positive rate. scores, positives: (N,).
    NaN when there is no positive.
    """
    s, pos = _scores_and_flags(scores, positives, "scores", "positives")
    n_pos = int(pos.sum())
    if n_pos == 0:
        return float("nan")
    order = torch.argsort(s, descending=True, stable=True)
    s_sorted, pos_sorted = s[order], pos[order].to(torch.float64)
    true_pos = pos_sorted.cumsum(0)
    # The last index of every group of equal scores: where the threshold admits the whole group.
    last = torch.ones_like(s_sorted, dtype=torch.bool)
    last[:-1] = s_sorted[1:] != s_sorted[:-1]
    tp = true_pos[last]
    admitted = torch.arange(1, s.numel() + 1, dtype=torch.float64)[last]
    precision = tp / admitted
    recall = tp / n_pos
    recall_step = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
    return float((recall_step * precision).sum())


# ----------------------------------------------------------------------------------------------
# selective retrieval: risk–coverage
# ----------------------------------------------------------------------------------------------
def risk_coverage_curve(uncertainty, wrong) -> dict:
    """The risk–coverage curve of answering only the most certain queries (SPEC §6).

    Queries are answered in order of increasing uncertainty; after the k most certain ones
    (coverage k/N) the risk is the fraction of them whose top-1 is wrong. Within a group of
    tied uncertainties the order is random, so its errors are spread evenly over the group
    (the expected risk): a constant score gives the flat curve at the overall error rate.

    uncertainty: (N,) real, higher = less confident; wrong: (N,) bool, the top-1 is wrong.
    Returns numpy arrays of length N: "coverage" (k/N, k = 1..N) and "risk" (errors/k).
    """
    u, err = _scores_and_flags(uncertainty, wrong, "uncertainty", "wrong")
    n = u.numel()
    order = torch.argsort(u, stable=True)
    u_sorted, err_sorted = u[order], err[order].to(torch.float64)
    # Group boundaries of equal uncertainty; inside a group, errors accrue at the group's rate.
    new_group = torch.ones(n, dtype=torch.bool)
    new_group[1:] = u_sorted[1:] != u_sorted[:-1]
    group_id = new_group.cumsum(0) - 1
    n_groups = int(group_id[-1]) + 1
    group_size = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_id, torch.ones(n, dtype=torch.float64))
    group_errors = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_id, err_sorted)
    errors_before = torch.cumsum(group_errors, 0) - group_errors
    start = torch.cumsum(group_size, 0) - group_size  # queries answered before the group
    k = torch.arange(1, n + 1, dtype=torch.float64)
    within = k - start[group_id]  # 1..size inside the group
    expected_errors = errors_before[group_id] + within * group_errors[group_id] / group_size[group_id]
    return {"coverage": (k / n).numpy(), "risk": (expected_errors / k).numpy()}


def aurc(uncertainty, wrong) -> float:
    """Area under the risk–coverage curve, AURC = (1/N) Σ_k risk(k) (Geifman et al. 2019;
    SPEC §6). uncertainty: (N,) real, higher = less confident; wrong: (N,) bool. Lower is better;
    its floor for a given error rate is the oracle's (`excess_aurc`), so AURCs of models with
    different accuracies mix accuracy into the comparison."""
    return float(np.mean(risk_coverage_curve(uncertainty, wrong)["risk"]))


def _oracle_aurc(n_wrong: int, n: int) -> float:
    """AURC of the ideal ordering (every correct query before every wrong one)."""
    k = np.arange(1, n + 1, dtype=np.float64)
    return float(np.mean(np.maximum(0.0, k - (n - n_wrong)) / k))


def excess_aurc(uncertainty, wrong) -> float:
    """E-AURC = AURC − AURC of the oracle ordering with the same errors (Geifman et al. 2019;
    SPEC §6): what the score loses against perfect knowledge of which answers are wrong, with
    the model's own accuracy taken out. 0 is perfect. uncertainty: (N,) real, higher = less
    confident; wrong: (N,) bool."""
    _, err = _scores_and_flags(uncertainty, wrong, "uncertainty", "wrong")
    return aurc(uncertainty, wrong) - _oracle_aurc(int(err.sum()), err.numel())


def accuracy_at_coverage(uncertainty, wrong, coverage: float) -> float:
    """Accuracy (in %) over the ⌈coverage·N⌉ most certain queries, e.g. R@1 at 50 % coverage
    when `wrong` marks a wrong top-1 (SPEC §6). uncertainty: (N,) real, higher = less
    confident; wrong: (N,) bool; coverage: a real in (0, 1]. Ties as in `risk_coverage_curve`."""
    c = _coverage(coverage)
    risk = risk_coverage_curve(uncertainty, wrong)["risk"]
    k = max(1, math.ceil(c * risk.size - 1e-9))  # the 1e-9 keeps 0.5·500 from becoming 251
    return 100.0 * (1.0 - float(risk[k - 1]))


# ----------------------------------------------------------------------------------------------
# calibration
# ----------------------------------------------------------------------------------------------
def expected_calibration_error(confidence, correct, n_bins: int = DEFAULT_ECE_BINS) -> float:
    """Expected calibration error of a probability-like confidence (SPEC §6; Guo et al. 2017):
    ECE = Σ_m (|B_m|/N)·|accuracy(B_m) − mean confidence(B_m)| over n_bins equal-width bins
    ((m−1)/M, m/M] of [0, 1] (a confidence of exactly 0 joins the first bin).

    confidence: (N,) in [0, 1], e.g. the belief of each query's top result; correct: (N,) bool.
    """
    conf, ok = _scores_and_flags(confidence, correct, "confidence", "correct")
    if isinstance(n_bins, bool) or not isinstance(n_bins, numbers.Integral) or n_bins < 1:
        raise ValueError(f"n_bins must be an int >= 1, got {n_bins!r}")
    if bool((conf < 0).any()) or bool((conf > 1).any()):
        raise ValueError("confidence must lie in [0, 1] (a belief or a probability)")
    n_bins = int(n_bins)
    # Bin m holds (e_{m−1}, e_m] with the edges e_m = m/M as float64 rounds them: the first edge
    # >= conf, found by comparison, never by ceil(conf·M), whose product rounds (e.g. 0.6·15 = 9 + ulp
    # would put a confidence of exactly 9/15 into bin 10).
    edges = torch.arange(n_bins + 1, dtype=torch.float64) / n_bins
    bins = (torch.searchsorted(edges, conf, right=False) - 1).clamp(0, n_bins - 1)
    # (|B_m|/N)·|acc(B_m) − conf(B_m)| = |Σ_B hits − Σ_B conf| / N: no per-bin count needed.
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, conf)
    hit_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, ok.to(torch.float64))
    return float((hit_sum - conf_sum).abs().sum() / conf.numel())


# ----------------------------------------------------------------------------------------------
# baselines and the report
# ----------------------------------------------------------------------------------------------
def similarity_baselines(sims) -> dict[str, Tensor]:
    """The free confidence scores of a ranking, as uncertainties (SPEC §6), per query row:
    "neg_top1_similarity" = −max_j s_ij and "neg_margin" = −(s_(1) − s_(2)), the gap between the
    two highest scores (0 for a single candidate). sims: (N_q, N_g) the ranking scores (queries
    as rows). Returns (N_q,) float64 tensors."""
    if isinstance(sims, np.ndarray):
        sims = torch.from_numpy(np.ascontiguousarray(sims))
    if not isinstance(sims, Tensor) or not sims.is_floating_point():
        raise TypeError("sims must be a floating-point torch.Tensor or numpy.ndarray (queries × gallery)")
    if sims.dim() != 2 or sims.shape[0] < 1 or sims.shape[1] < 1:
        raise ValueError(f"sims must be a non-empty 2-D matrix (queries × gallery), got shape {tuple(sims.shape)}")
    s = sims.detach().to(torch.float64)
    if not bool(torch.isfinite(s).all()):
        raise ValueError("sims contains NaN or Inf")
    top = torch.topk(s, min(2, s.shape[1]), dim=1).values
    margin = top[:, 0] - top[:, 1] if top.shape[1] == 2 else torch.zeros_like(top[:, 0])
    return {"neg_top1_similarity": -top[:, 0], "neg_margin": -margin}


def _score_quality(u: Tensor, wrong: Tensor, coverages, ood: Tensor | None) -> dict:
    out = {
        "error_auroc": auroc(u, wrong),
        "error_aupr": aupr(u, wrong),
        "aurc": aurc(u, wrong),
        "eaurc": excess_aurc(u, wrong),
    }
    for c in coverages:
        out[f"r1_at_{round(100 * c)}"] = accuracy_at_coverage(u, wrong, c)
    if ood is not None:
        out["ood_auroc"] = auroc(torch.cat([u, ood]), torch.cat([torch.zeros(u.numel(), dtype=torch.bool),
                                                                  torch.ones(ood.numel(), dtype=torch.bool)]))
    return out


def uncertainty_report(
    scores: Mapping[str, Tensor],
    wrong,
    *,
    sims=None,
    confidence=None,
    confidence_name: str = "top_belief",
    ood_scores: Mapping[str, Tensor] | None = None,
    ood_sims=None,
    coverages=DEFAULT_COVERAGES,
    n_bins: int = DEFAULT_ECE_BINS,
) -> dict:
    """Every quality figure of SPEC §6 for a set of per-query uncertainty scores, one direction.

    scores: {name: (N,) uncertainty}, higher = less confident. wrong: (N,) bool, the query's
    top-1 is wrong. sims: optional (N, N_g) ranking scores of the same queries; their
    `similarity_baselines` are added to `scores` (marked in "baselines") so every figure is
    reported beside what the ranking gives for free. confidence: optional (N,) probability-like
    confidence of the top result (a belief, a softmax probability) for the ECE, named
    `confidence_name` in the report. ood_scores / ood_sims: the same scores
    for out-of-distribution queries over the same gallery: adds "ood_auroc" (OOD as positives).
    A ValueError names the argument when ood_sims comes without ood_scores (or without sims),
    or when a user score has the name of a baseline that sims / ood_sims would add.

    Returns {"n_queries", "r1" (%), "error_rate", "oracle": {aurc, r1_at_..}, "scores":
    {name: {error_auroc, error_aupr, aurc, eaurc, r1_at_50, r1_at_80[, ood_auroc]}},
    "baselines": [names], and with a confidence "ece" and "ece_of" (its name)}.
    """
    err = _flags(wrong, "wrong")
    n = err.numel()
    if n == 0:
        raise ValueError("wrong must hold at least one query")
    coverages = tuple(_coverage(c, "coverages") for c in coverages)
    if not isinstance(scores, Mapping) or not scores:
        raise TypeError("scores must be a non-empty dict {name: (N,) tensor}")
    all_scores = {name: _vector(v, f"scores[{name!r}]") for name, v in scores.items()}
    for name, v in all_scores.items():
        if v.numel() != n:
            raise ValueError(f"scores[{name!r}] has {v.numel()} entries, expected {n} (one per query)")
    baselines = []
    if sims is not None:
        for name, v in similarity_baselines(sims).items():
            if name in all_scores:
                raise ValueError(f"scores[{name!r}] has the name of a baseline that sims adds; rename it or "
                                 f"drop sims")
            if v.numel() != n:
                raise ValueError(f"sims has {v.numel()} query rows, expected {n} (one per query)")
            all_scores[name] = v
            baselines.append(name)
    if ood_sims is not None and ood_scores is None:
        raise ValueError("ood_sims needs ood_scores (the same scores for the OOD queries); pass both or neither")
    if ood_sims is not None and sims is None:
        raise ValueError("ood_sims needs sims (its baselines are compared with those of sims)")
    ood = None
    if ood_scores is not None:
        if not isinstance(ood_scores, Mapping):
            raise TypeError("ood_scores must be a dict {name: (N_ood,) tensor}")
        ood = {name: _vector(v, f"ood_scores[{name!r}]") for name, v in ood_scores.items()}
        if ood_sims is not None:
            for name, v in similarity_baselines(ood_sims).items():
                if name in ood:
                    raise ValueError(f"ood_scores[{name!r}] has the name of a baseline that ood_sims adds; "
                                     f"rename it or drop ood_sims")
                ood[name] = v
    n_wrong = int(err.sum())
    report = {
        "n_queries": n,
        # The share right as retrieval_metrics forms R@1 (count / n, then ×100): the same bits,
        # so the report and the retrieval line print the same digits (5.625 is no 5.62 / 5.63).
        "r1": 100.0 * ((n - n_wrong) / n),
        "error_rate": n_wrong / n,
        "oracle": {"aurc": _oracle_aurc(n_wrong, n),
                   **{f"r1_at_{round(100 * c)}": 100.0 * min(1.0, (n - n_wrong) / max(1, math.ceil(c * n - 1e-9)))
                      for c in coverages}},
        "scores": {},
        "baselines": baselines,
    }
    for name, u in all_scores.items():
        report["scores"][name] = _score_quality(u, err, coverages, None if ood is None else ood.get(name))
    if confidence is not None:
        report["ece"] = expected_calibration_error(confidence, ~err, n_bins)
        report["ece_of"] = confidence_name
    return report
