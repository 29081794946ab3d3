"""Uncertainty quality of a trained model on its benchmark (SPEC §6), for every method and direction.

For each query direction (i2t: image/video queries over the captions; t2i: caption queries over
the images) this collects the model's per-query uncertainty scores, whether each query's top-1
result is right, and the ranking scores whose free baselines every score is compared with, then
runs `metrics.uncertainty_report`. When the benchmark has an "ood" split its queries are scored
over the *test* gallery (SPEC §6 [choice]) and every score also gets its OOD AUROC.

Scores per method (all read as uncertainties, higher = less confident):
- TCL, TcVSE, UML: "u" = N/S (vacuity), "dissonance" (top-10) of the opinion that owns the
  direction (TCL: model A for i2t, model B for t2i; the ranking is the ensemble s_A + s_B), and
  "neg_top_belief" = −b of that opinion at the result the ranking returns first (for TCL the
  ensemble's top-1, which need not be the owner's own best candidate); ECE of that b.
- DUQ: "u_s" (ISUM opinion, relu evidence, τ = 1), "u_d" (distance evidence relu(D) + 1, as
  eq. 16 defines it: the vacuity of the *mismatch* evidence, so a query far from everything gets
  a low u_d; not an uncertainty in the §6 sense, reported as defined, SPEC §6), "dissonance",
  "neg_top_belief" of the ISUM opinion; ranking = s.
- FUME: "u_query" (the query's decision uncertainty, eq. 9) and "u_pair_top1" (the cross-modal
  uncertainty of the query and its top-1 result, eq. 10); label-based correctness (FUME's
  retrieval is by class); no belief, so no ECE.
- InfoNCE baseline: "neg_top_probability" = −max softmax(s̄/τ), its own confidence; ECE of it;
  judged by the relevance of the method it stands beside (by class for FUME's). By class it also
  gets "neg_top_class_probability" = −Σ softmax over the gallery items of the top-1's class (the
  max softmax of one item is lower the more items share the right class: a structural handicap).
Every method also gets the baselines −s_(1) and −(s_(1) − s_(2)) of its ranking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data import concat_splits
from ..data.types import CrossModalBenchmark, CrossModalSplit
from ..methods import fume_cross_modal_uncertainty
from ..metrics import instance_labels, risk_coverage_curve, similarity_baselines, top1_correct, uncertainty_report
from ..opinion import belief, opinion_from_similarity

__all__ = ["DIRECTIONS", "PRIMARY_SCORE", "QueryScores", "evidential_scores", "quality_of"]

DIRECTIONS = ("i2t", "t2i")
# The uncertainty each method offers its users first; the demo's checks are about it.
PRIMARY_SCORE = {"tcl": "u", "tcvse": "u", "uml": "u", "duq": "u_s", "fume": "u_query",
                 "infonce": "neg_top_probability"}
DISSONANCE_TOP_K = 10


@dataclass(frozen=True)
class QueryScores:
    """One direction's queries over one gallery: ranking (N_q, N_g) with queries as rows,
    scores {name: (N_q,) uncertainty}, confidence (N_q,) probability-like (for the ECE) or None."""

    ranking: Tensor
    scores: dict
    confidence: Tensor | None
    confidence_name: str = "top_belief"


def evidential_scores(owner: Tensor, ranking: Tensor, evidence: str, tau: float,
                      prefix: str = "u") -> tuple[dict, Tensor]:
    """u, dissonance and −top belief of each row's opinion over the columns of `owner` (N_q, N_g),
    with the top belief taken at the result the *ranking* (N_q, N_g) returns first (SPEC §6: a
    per-result score is read at each query's returned top-1). For TCL/TcVSE the ranking is the
    ensemble s_A + s_B while the opinion is the owner model's, whose own best candidate can be
    another one: its belief would then describe an answer that was never returned.
    Returns ({prefix: u, "dissonance", "neg_top_belief"} (N_q,) each, the belief (N_q,))."""
    op = opinion_from_similarity(owner.contiguous(), evidence=evidence, tau=tau, top_k=DISSONANCE_TOP_K)
    returned = ranking.argmax(dim=1, keepdim=True)
    log_strength = op.row_log_strength.to(torch.float64)
    top_belief = belief(owner.gather(1, returned).to(torch.float64), log_strength, evidence=evidence, tau=tau)[:, 0]
    scores = {prefix: op.row_uncertainty, "dissonance": op.row_dissonance, "neg_top_belief": -top_belief}
    return scores, top_belief


class _Outputs:
    """A model's test-time matrices over one split, images × captions, and how to turn a block
    of them (queries, gallery) into `QueryScores`."""

    def __init__(self, method: str, model: nn.Module, split: CrossModalSplit, seed: int, relevance: str):
        self.method, self.relevance = method, relevance
        c = split.captions_per_image
        if relevance == "label":
            self.image_labels, self.text_labels = split.labels, split.labels.repeat_interleave(c)
        else:
            self.image_labels, self.text_labels = instance_labels(split.n_images, c)
        if method in ("tcl", "tcvse"):
            out = model.infer(split)
            self.ranking, self.owner_rows, self.owner_cols = out.similarity, out.similarity_a, out.similarity_b
            self.evidence, self.tau = out.evidence, out.tau
        elif method == "uml":
            self.ranking = self.owner_rows = self.owner_cols = model.similarity(split)
            self.evidence, self.tau = model.evidence, model.tau
        elif method == "duq":
            out = model.infer(split, seed=seed)
            self.ranking = self.owner_rows = self.owner_cols = out.similarity
            self.distance = out.distance
            self.evidence, self.tau = "relu", 1.0
        elif method == "fume":
            out = model.infer(split)
            self.ranking = out.similarity
            self.image_u, self.text_u = out.image_uncertainty, out.text_uncertainty
        elif method == "infonce":
            out = model.infer(split)
            self.ranking, self.mean_similarity, self.temperature = out.similarity, out.mean_similarity, out.temperature
        else:
            raise ValueError(f"method must be one of {tuple(PRIMARY_SCORE)}, got {method!r}")

    def block(self, direction: str, queries: slice, gallery: slice) -> QueryScores:
        """Scores of the queries `queries` (image indices for i2t, caption indices for t2i) over
        the gallery `gallery` (caption indices for i2t, image indices for t2i)."""
        rows_first = direction == "i2t"
        pick = (lambda m: m[queries, gallery]) if rows_first else (lambda m: m[gallery, queries].T)
        ranking = pick(self.ranking)
        if self.method in ("tcl", "tcvse", "uml", "duq"):
            owner = pick(self.owner_rows if rows_first else self.owner_cols)
            scores, confidence = evidential_scores(owner, ranking, self.evidence, self.tau,
                                                   "u_s" if self.method == "duq" else "u")
            if self.method == "duq":
                distance = pick(self.distance)
                scores["u_d"] = distance.shape[1] / (torch.relu(distance) + 1.0).sum(dim=1)
            return QueryScores(ranking, scores, confidence)
        if self.method == "fume":
            query_u = (self.image_u if rows_first else self.text_u)[queries]
            gallery_u = (self.text_u if rows_first else self.image_u)[gallery]
            top1 = ranking.argmax(dim=1)
            return QueryScores(ranking, {"u_query": query_u,
                                         "u_pair_top1": fume_cross_modal_uncertainty(query_u, gallery_u[top1])}, None)
        softmax = torch.softmax(pick(self.mean_similarity).double() / self.temperature, dim=1)
        probability = softmax.amax(dim=1)
        scores = {"neg_top_probability": -probability}
        if self.relevance == "label":
            # By class, every gallery item of the top-1's class is a right answer: the max softmax
            # of one item falls as that class grows, so the class's summed softmax is compared too.
            labels = (self.text_labels if rows_first else self.image_labels)[gallery]
            same_class = labels.unsqueeze(0) == labels[ranking.argmax(dim=1)].unsqueeze(1)
            scores["neg_top_class_probability"] = -(softmax * same_class).sum(dim=1)
        return QueryScores(ranking, scores, probability, "top_softmax_probability")

    def wrong(self, direction: str, queries: slice, gallery: slice, ranking: Tensor) -> Tensor:
        """(N_q,) bool: the query's top-1 is not relevant (instance protocol, or by class)."""
        if direction == "i2t":
            return ~top1_correct(ranking, self.image_labels[queries], self.text_labels[gallery])
        return ~top1_correct(ranking, self.text_labels[queries], self.image_labels[gallery])


@torch.no_grad()
def quality_of(method: str, model: nn.Module, bench: CrossModalBenchmark, *, seed: int = 0,
               relevance: str | None = None, keep_scores: dict | None = None) -> tuple[dict, dict]:
    """(metrics, curves) of SPEC §6 for `model` on bench.test (and bench.ood when present).

    method: one of PRIMARY_SCORE ("infonce" for `models.InfoNCEBaseline`). relevance: what makes
    a top-1 right, "instance" (its own image / one of its captions) or "label" (same class);
    default "label" for FUME (retrieval by class, its Table 1), "instance" otherwise. Returns
    metrics = {"i2t": uncertainty_report, "t2i": ..., "primary_score": name, "relevance": the
    relevance used, "ood_queries": {"i2t": n, "t2i": n} (the OOD queries of each direction, 0
    without an "ood" split)} and curves = {direction: {score: {"coverage", "risk"} numpy arrays,
    "oracle": ...}} for the risk–coverage plot. keep_scores: a dict to fill with each direction's
    raw per-query figures {direction: {"scores": {name: (N_q,)} baselines included, "wrong",
    "baselines", "top1": (N_q,) gallery index returned first, "ood_scores": the same names for the
    OOD queries or None, "ood_top1"}} (calibrated abstention, `pipelines.abstention`).
    """
    test = bench.test
    has_ood = "ood" in bench
    split = concat_splits(test, bench.ood) if has_ood else test
    if relevance is None:
        relevance = "label" if method == "fume" else "instance"
    if relevance not in ("instance", "label"):
        raise ValueError(f"relevance must be 'instance' or 'label', got {relevance!r}")
    outputs = _Outputs(method, model, split, seed, relevance)
    n_img, c = test.n_images, test.captions_per_image
    test_images, test_captions = slice(0, n_img), slice(0, n_img * c)
    ood_images, ood_captions = slice(n_img, split.n_images), slice(n_img * c, split.n_captions)
    metrics = {"primary_score": PRIMARY_SCORE[method], "relevance": relevance, "ood_queries": {"i2t": 0, "t2i": 0}}
    curves = {}
    for direction in DIRECTIONS:
        queries, gallery = (test_images, test_captions) if direction == "i2t" else (test_captions, test_images)
        in_dist = outputs.block(direction, queries, gallery)
        wrong = outputs.wrong(direction, queries, gallery, in_dist.ranking)
        ood = None
        if has_ood:
            ood = outputs.block(direction, ood_images if direction == "i2t" else ood_captions, gallery)
            metrics["ood_queries"][direction] = ood.ranking.shape[0]
        report = uncertainty_report(in_dist.scores, wrong, sims=in_dist.ranking, confidence=in_dist.confidence,
                                    confidence_name=in_dist.confidence_name,
                                    ood_scores=None if ood is None else ood.scores,
                                    ood_sims=None if ood is None else ood.ranking)
        metrics[direction] = report
        all_scores = {**in_dist.scores, **similarity_baselines(in_dist.ranking)}
        curves[direction] = {name: risk_coverage_curve(u, wrong) for name, u in all_scores.items()}
        curves[direction]["oracle"] = risk_coverage_curve(wrong.to(torch.float64), wrong)
        if keep_scores is not None:
            keep_scores[direction] = {"scores": all_scores, "wrong": wrong, "baselines": report["baselines"],
                                      "top1": in_dist.ranking.argmax(dim=1),
                                      "ood_scores": None if ood is None else
                                      {**ood.scores, **similarity_baselines(ood.ranking)},
                                      "ood_top1": None if ood is None else ood.ranking.argmax(dim=1)}
    return metrics, curves
