"""The uncertainty-quality metrics (SPEC §6) against cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evidential_ops import metrics
from evidential_ops.metrics import (
    accuracy_at_coverage,
    aupr,
    auroc,
    aurc,
    excess_aurc,
    expected_calibration_error,
    instance_labels,
    retrieval_metrics,
    risk_coverage_curve,
    similarity_baselines,
    top1_correct,
    uncertainty_report,
)

T = torch.tensor
B = lambda *v: torch.tensor(v, dtype=torch.bool)


def test_auroc_by_hand():
    # Positives 0.9, 0.3; negatives 0.8, 0.1: the pairs (0.9>0.8, 0.9>0.1, 0.3<0.8, 0.3>0.1) give 3/4.
    assert auroc(T([0.9, 0.8, 0.3, 0.1]), B(True, False, True, False)) == pytest.approx(0.75)
    # A tie counts one half: (0.5 = 0.5) -> 1/2, (0.5 > 0.2) -> 1, over 2 pairs.
    assert auroc(T([0.5, 0.5, 0.2]), B(True, False, False)) == pytest.approx(0.75)
    assert auroc(T([1.0, 2.0]), B(False, True)) == 1.0
    assert auroc(T([1.0, 1.0, 1.0]), B(True, False, False)) == 0.5  # a constant score is chance
    assert np.isnan(auroc(T([1.0, 2.0]), B(True, True)))


def test_aupr_by_hand():
    # Thresholds from the top: 0.9 (P 1, R 1/2), 0.8 (P 1/2, R 1/2), 0.3 (P 2/3, R 1), 0.1 (P 1/2, R 1):
    # AP = 1/2·1 + 0 + 1/2·2/3 + 0 = 5/6.
    assert aupr(T([0.9, 0.8, 0.3, 0.1]), B(True, False, True, False)) == pytest.approx(5 / 6)
    # A tied pair enters at once: threshold 0.5 admits both (P 1/2, R 1) -> AP = 1/2.
    assert aupr(T([0.5, 0.5, 0.2]), B(True, False, False)) == pytest.approx(0.5)
    assert aupr(T([3.0, 2.0, 1.0]), B(True, True, False)) == pytest.approx(1.0)
    assert np.isnan(aupr(T([1.0, 2.0]), B(False, False)))


def test_risk_coverage_by_hand():
    u, wrong = T([0.4, 0.1, 0.3, 0.2]), B(True, False, False, True)
    # Most certain first: 0.1 (right), 0.2 (wrong), 0.3 (right), 0.4 (wrong).
    curve = risk_coverage_curve(u, wrong)
    np.testing.assert_allclose(curve["coverage"], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(curve["risk"], [0.0, 1 / 2, 1 / 3, 2 / 4])
    assert aurc(u, wrong) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    # The oracle answers the two right queries first: risks 0, 0, 1/3, 1/2.
    assert excess_aurc(u, wrong) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4 - (0 + 0 + 1 / 3 + 1 / 2) / 4)
    assert accuracy_at_coverage(u, wrong, 0.5) == pytest.approx(50.0)
    assert accuracy_at_coverage(u, wrong, 0.75) == pytest.approx(100 * 2 / 3)
    assert accuracy_at_coverage(u, wrong, 0.6) == pytest.approx(100 * 2 / 3)  # ⌈0.6·4⌉ = 3 queries
    assert accuracy_at_coverage(u, wrong, 1.0) == pytest.approx(50.0)


def test_risk_coverage_spreads_tied_errors_evenly():
    # 0.1 and 0.1 tie, one of them wrong: after one query the expected errors are 1/2.
    curve = risk_coverage_curve(T([0.1, 0.1, 0.3]), B(True, False, False))
    np.testing.assert_allclose(curve["risk"], [1 / 2, 1 / 2, 1 / 3])
    # A constant score is the flat curve at the error rate; its excess over the oracle is positive.
    wrong = B(True, False, False, False, True)
    np.testing.assert_allclose(risk_coverage_curve(torch.zeros(5), wrong)["risk"], [0.4] * 5)
    assert excess_aurc(torch.zeros(5), wrong) > 0
    # A perfect score reaches the oracle: E-AURC 0.
    assert excess_aurc(wrong.double(), wrong) == pytest.approx(0.0, abs=1e-15)


def test_expected_calibration_error_by_hand():
    conf = T([0.95, 0.92, 0.55, 0.52, 0.15])
    correct = B(True, False, True, True, False)
    # Bins of width 0.1: (0.9, 1] holds 0.95 ✓ and 0.92 ✗ (acc 1/2, conf 0.935); (0.5, 0.6] holds
    # 0.55 ✓, 0.52 ✓ (acc 1, conf 0.535); (0.1, 0.2] holds 0.15 ✗.
    want = 2 / 5 * abs(0.5 - 0.935) + 2 / 5 * abs(1 - 0.535) + 1 / 5 * 0.15
    assert expected_calibration_error(conf, correct, n_bins=10) == pytest.approx(want)
    # A single bin: |accuracy − mean confidence| = |3/5 − 3.09/5|.
    assert expected_calibration_error(conf, correct, n_bins=1) == pytest.approx(0.018, rel=1e-6)
    assert expected_calibration_error(T([0.0, 1.0]), B(False, True)) == 0.0  # 0 joins the first bin


def test_expected_calibration_error_bins_a_confidence_on_an_edge_by_comparison():
    # 0.28 is the edge 7/25 as float64 rounds both, but 0.28·25 rounds to 7 + ulp: ceil() put it
    # into (0.28, 0.32]. It belongs to (0.24, 0.28] with 0.27: one bin, |1 − 0.55| / 2.
    assert 0.28 == 7 / 25 and 0.28 * 25 > 7
    conf = T([0.28, 0.27], dtype=torch.float64)  # float32 0.28 lies above the edge: not this case
    assert expected_calibration_error(conf, B(True, False), n_bins=25) == pytest.approx(0.225)
    # Every edge m/M lands in the bin it closes, for every M up to 40.
    for n_bins in range(1, 41):
        edges = T([m / n_bins for m in range(1, n_bins + 1)], dtype=torch.float64)
        below = (edges - 0.5 / n_bins).clamp(min=0.0)  # the same bin's midpoint
        conf, hits = torch.stack([edges, below], 1).flatten(), torch.tensor([True, False] * n_bins)
        want = float((1.0 - edges - below).abs().sum()) / conf.numel()
        assert expected_calibration_error(conf, hits, n_bins=n_bins) == pytest.approx(want), n_bins


def test_similarity_baselines_by_hand():
    base = similarity_baselines(T([[0.9, 0.1, 0.5], [0.2, 0.2, -1.0]]))
    torch.testing.assert_close(base["neg_top1_similarity"], T([-0.9, -0.2], dtype=torch.float64))
    torch.testing.assert_close(base["neg_margin"], T([-0.4, 0.0], dtype=torch.float64))
    assert similarity_baselines(T([[0.3]]))["neg_margin"].tolist() == [0.0]


def test_top1_correct_by_hand_and_against_recall():
    # 2 images × 4 captions, 2 per image (captions 0, 1 -> image 0; 2, 3 -> image 1).
    s = T([[0.9, 0.1, 0.8, 0.0],
           [0.5, 0.5, 0.5, 0.4]])
    i2t = top1_correct(s, *instance_labels(2, 2))
    t2i = top1_correct(s.T, *reversed(instance_labels(2, 2)))
    # Image 1's best own caption (0.5) ties with image 0's captions: pessimistic -> wrong.
    assert i2t.tolist() == [True, False]
    assert top1_correct(s, *instance_labels(2, 2), ties="optimistic").tolist() == [True, True]
    # Caption 0: 0.9 vs 0.5 ✓; caption 1: 0.1 vs 0.5 ✗; caption 2: 0.5 vs 0.8 ✗; caption 3: 0.4 vs 0 ✓.
    assert t2i.tolist() == [True, False, False, True]
    r = retrieval_metrics(s, 2)
    assert 100 * i2t.double().mean().item() == pytest.approx(r["i2t_r1"])
    assert 100 * t2i.double().mean().item() == pytest.approx(r["t2i_r1"])
    # Label-based: query of class 1 whose top result (class 0) is wrong.
    assert top1_correct(T([[0.9, 0.2]]), T([1]), T([0, 1])).tolist() == [False]


def test_top1_correct_matches_recall_at_1_on_random_scores():
    gen = torch.Generator().manual_seed(5)
    s = torch.rand(40, 200, generator=gen)
    s[3, 17] = s[3, 15]  # a tie with the query's own caption
    r = retrieval_metrics(s, 5)
    i2t = top1_correct(s, *instance_labels(40, 5), chunk_size=7)
    t2i = top1_correct(s.T, *reversed(instance_labels(40, 5)), chunk_size=7)
    assert 100 * i2t.double().mean().item() == pytest.approx(r["i2t_r1"])
    assert 100 * t2i.double().mean().item() == pytest.approx(r["t2i_r1"])


def test_uncertainty_report_assembles_every_figure():
    wrong = B(True, False, False, True)
    u = T([0.4, 0.1, 0.3, 0.2])
    sims = T([[0.5, 0.4], [0.9, 0.1], [0.7, 0.6], [0.6, 0.3]])
    report = uncertainty_report({"u": u}, wrong, sims=sims, confidence=T([0.3, 0.9, 0.6, 0.5]),
                                ood_scores={"u": T([0.35, 0.05])}, ood_sims=T([[0.2, 0.1], [0.3, 0.0]]))
    assert report["n_queries"] == 4 and report["r1"] == 50.0 and report["error_rate"] == 0.5
    assert report["baselines"] == ["neg_top1_similarity", "neg_margin"]
    assert set(report["scores"]) == {"u", "neg_top1_similarity", "neg_margin"}
    q = report["scores"]["u"]
    assert q["error_auroc"] == auroc(u, wrong) and q["aurc"] == aurc(u, wrong)
    assert q["r1_at_50"] == accuracy_at_coverage(u, wrong, 0.5)
    # OOD 0.35 beats the in-distribution 0.1, 0.2, 0.3 but not 0.4; 0.05 beats none: 3/8.
    assert q["ood_auroc"] == pytest.approx(3 / 8)
    # −top-1 similarity: in-distribution −0.5, −0.9, −0.7, −0.6; OOD −0.2, −0.3 beat all: 1.
    assert report["scores"]["neg_top1_similarity"]["ood_auroc"] == 1.0
    assert report["oracle"]["r1_at_50"] == 100.0 and report["oracle"]["r1_at_80"] == 50.0
    assert report["ece"] == expected_calibration_error(T([0.3, 0.9, 0.6, 0.5]), ~wrong)
    assert report["ece_of"] == "top_belief"


def test_metrics_module_exports_the_quality_metrics():
    for name in ("auroc", "aupr", "risk_coverage_curve", "aurc", "excess_aurc", "accuracy_at_coverage",
                 "expected_calibration_error", "similarity_baselines", "uncertainty_report", "top1_correct"):
        assert name in metrics.__all__ and callable(getattr(metrics, name))


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="positives has 2 entries"):
        auroc(T([0.1, 0.2, 0.3]), B(True, False))
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        auroc([0.1, 0.2], B(True, False))
    with pytest.raises(ValueError, match="scores contains NaN"):
        aupr(T([0.1, float("nan")]), B(True, False))
    with pytest.raises(ValueError, match="wrong must be bool"):
        aurc(T([0.1, 0.2]), T([0.5, 1.0]))
    with pytest.raises(ValueError, match="coverage must lie in"):
        accuracy_at_coverage(T([0.1, 0.2]), B(True, False), 0.0)
    with pytest.raises(ValueError, match="confidence must lie in"):
        expected_calibration_error(T([1.5]), B(True))
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error(T([0.5]), B(True), n_bins=0)
    with pytest.raises(ValueError, match="scores\\['u'\\] has 1 entries"):
        uncertainty_report({"u": T([0.1])}, B(True, False))
    with pytest.raises(ValueError, match="sims has 1 query rows"):
        uncertainty_report({"u": T([0.1, 0.2])}, B(True, False), sims=T([[0.1, 0.2]]))
    with pytest.raises(ValueError, match="uncertainty must be 1-D"):
        aurc(T([[0.1, 0.2]]), B(True, False))


def test_uncertainty_report_refuses_what_it_would_silently_drop_or_overwrite():
    u, wrong, sims = T([0.1, 0.2]), B(True, False), T([[0.3, 0.1], [0.2, 0.4]])
    # ood_sims without ood_scores was ignored; without sims its baselines have nothing to match.
    with pytest.raises(ValueError, match="ood_sims needs ood_scores"):
        uncertainty_report({"u": u}, wrong, sims=sims, ood_sims=sims)
    with pytest.raises(ValueError, match="ood_sims needs sims"):
        uncertainty_report({"u": u}, wrong, ood_scores={"u": u}, ood_sims=sims)
    # A user score named like a baseline was overwritten by the baseline.
    with pytest.raises(ValueError, match="scores\\['neg_margin'\\] has the name of a baseline"):
        uncertainty_report({"neg_margin": u}, wrong, sims=sims)
    with pytest.raises(ValueError, match="ood_scores\\['neg_top1_similarity'\\] has the name of a baseline"):
        uncertainty_report({"u": u}, wrong, sims=sims, ood_scores={"u": u, "neg_top1_similarity": u}, ood_sims=sims)
    # Without sims a score may carry any name.
    assert uncertainty_report({"neg_margin": u}, wrong)["scores"]["neg_margin"]["error_auroc"] == 0.0


def test_report_r1_has_the_retrieval_line_bits():
    """The report's R@1 is printed beside retrieval_metrics' as "the same figure": 9 right of 160
    is 5.625, which 100·(1 − 151/160) rounds to 5.625000000000002 (printed 5.63, the retrieval
    line 5.62)."""
    n = 160
    sims = torch.eye(n) * 0.5
    sims[torch.arange(9), torch.arange(9)] = 1.0  # 9 images rank their own caption first
    sims[torch.arange(9, n), (torch.arange(9, n) + 1) % n] = 0.8  # the rest second
    i2t, _ = metrics.retrieval_ranks(sims, 1)
    report = uncertainty_report({"u": torch.rand(n, generator=torch.Generator().manual_seed(0))}, i2t > 1)
    assert report["r1"] == metrics.retrieval_metrics(sims, 1)["i2t_r1"] == 5.625
