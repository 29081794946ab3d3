"""Uncertainty quality in the pipelines: the InfoNCE baseline, `quality_of`, and checks that can fail."""

from __future__ import annotations

import copy

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.data import concat_splits
from evidential_ops.metrics import auroc, expected_calibration_error, instance_labels, retrieval_metrics, top1_correct
from evidential_ops.methods import duq_similarity_loss
from evidential_ops.models import InfoNCEBaseline
from evidential_ops.pipelines import get_recipe
from evidential_ops.pipelines.analysis import summary_checks
from evidential_ops.pipelines.baseline import infonce_baseline
from evidential_ops.pipelines.quality import PRIMARY_SCORE, evidential_scores, quality_of

_one_thread = pytest.fixture(autouse=True)(single_thread)


def _bench(method: str):
    return tiny_bench(noise_rate=0.4, visual="frames" if method == "duq" else "regions")


def _model(method: str):
    torch.manual_seed(0)
    bench = _bench(method)
    return get_recipe(method).with_overrides(embed_dim=8).build(bench), bench


def test_concat_splits_keeps_the_layout():
    bench = tiny_bench()
    test, ood = bench.test, bench.ood
    both = concat_splits(test, ood)
    n, c = test.n_images, test.captions_per_image
    assert both.n_images == n + ood.n_images and both.n_captions == (n + ood.n_images) * c
    assert torch.equal(both.images[n:], ood.images)
    assert torch.equal(both.tokens(n * c + 3), ood.tokens(3)) and torch.equal(both.tokens(2, "alt"), test.tokens(2, "alt"))
    assert torch.equal(both.labels, torch.cat([test.labels, ood.labels]))
    assert torch.equal(both.caption_source[n * c:], ood.caption_source + n)
    with pytest.raises(TypeError, match="second"):
        concat_splits(test, "ood")


def test_infonce_loss_is_the_symmetric_infonce_of_each_member_and_language():
    model, bench = _model("uml")
    baseline = infonce_baseline("uml", model)
    batch = tiny_batch(bench, languages=("en", "alt"))
    member, alt = baseline.members[0], baseline.alt_text_encoders[0]
    x, y = member(batch)
    y_alt = torch.nn.functional.normalize(alt(batch["captions_alt"], batch["lengths_alt"]), dim=1)
    want = duq_similarity_loss(x @ y.T, logit_scale=20.0) + duq_similarity_loss(x @ y_alt.T, logit_scale=20.0)
    torch.testing.assert_close(baseline.loss(batch), want)
    assert baseline.eval_language == "alt"


@pytest.mark.parametrize("method", ["tcl", "tcvse", "uml", "fume", "duq"])
def test_baseline_starts_from_the_methods_own_untrained_encoders(method):
    model, _ = _model(method)
    before = copy.deepcopy(model.state_dict())
    baseline = infonce_baseline(method, model)
    assert isinstance(baseline, InfoNCEBaseline)
    first = next(iter(baseline.members[0].parameters()))
    # Same initial weights as the method's first encoder, but separate tensors.
    assert any(torch.equal(first, p) and first is not p for p in model.parameters())
    assert (baseline.augment_vocab_size is not None) == (method == "tcvse")
    assert len(baseline.members) == (2 if method in ("tcl", "tcvse") else 1)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    with pytest.raises(ValueError, match="no InfoNCE baseline"):
        infonce_baseline("clip", model)


@pytest.mark.parametrize("method", ["tcl", "uml", "fume", "duq"])
def test_quality_of_reports_every_score_beside_the_free_ones(method):
    model, bench = _model(method)
    metrics, curves = quality_of(method, model, bench, seed=0)
    primary = PRIMARY_SCORE[method]
    assert metrics["primary_score"] == primary
    assert metrics["relevance"] == ("label" if method == "fume" else "instance")
    for direction in ("i2t", "t2i"):
        q = metrics[direction]
        assert primary in q["scores"] and q["baselines"] == ["neg_top1_similarity", "neg_margin"]
        assert all("ood_auroc" in s for s in q["scores"].values())
        assert metrics["ood_queries"][direction] == (bench.ood.n_images if direction == "i2t" else bench.ood.n_captions)
        assert ("ece" in q) == (method != "fume")
        assert set(curves[direction]) == set(q["scores"]) | {"oracle"}
    if method == "duq":
        assert "u_d" in metrics["i2t"]["scores"]
    if method != "fume":  # instance protocol: the report's R@1 is retrieval_metrics' R@1
        sims = model.infer(bench.test).similarity if method != "uml" else model.similarity(bench.test)
        r = retrieval_metrics(sims, bench.test.captions_per_image)
        assert metrics["i2t"]["r1"] == pytest.approx(r["i2t_r1"]) and metrics["t2i"]["r1"] == pytest.approx(r["t2i_r1"])


def test_top_belief_is_the_owners_belief_of_the_returned_top1():
    # Row 0: the ensemble ranking returns candidate 1, the owner model's own best is candidate 0.
    owner = torch.tensor([[0.9, 0.8, 0.1], [0.2, 0.7, 0.6]], dtype=torch.float64)
    ranking = torch.tensor([[0.5, 1.0, 0.0], [0.0, 1.0, 0.5]], dtype=torch.float64)
    tau = 0.05
    scores, belief = evidential_scores(owner, ranking, "exp", tau)
    strength = (torch.exp(owner / tau) + 1.0).sum(dim=1)
    want = torch.exp(owner[[0, 1], [1, 1]] / tau) / strength
    torch.testing.assert_close(belief, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(scores["neg_top_belief"], -want, rtol=1e-12, atol=0)
    # Not the owner's own top belief, which describes an answer that was never returned.
    assert float(belief[0]) < 0.5 * float(torch.exp(owner[0, 0] / tau) / strength[0])
    torch.testing.assert_close(scores["u"], 3.0 / strength.to(scores["u"].dtype))


def test_tcl_top_belief_and_ece_describe_the_ensembles_answer():
    model, bench = _model("tcl")
    metrics, _ = quality_of("tcl", model, bench, seed=0)
    out = model.infer(bench.test)
    c = bench.test.captions_per_image
    image_labels, text_labels = instance_labels(bench.test.n_images, c)
    for direction, owner, ranking, labels in (
            ("i2t", out.similarity_a, out.similarity, (image_labels, text_labels)),
            ("t2i", out.similarity_b.T, out.similarity.T, (text_labels, image_labels))):
        _, belief = evidential_scores(owner, ranking, out.evidence, out.tau)
        right = top1_correct(ranking, *labels)
        assert metrics[direction]["ece"] == pytest.approx(expected_calibration_error(belief, right), abs=1e-6)


def test_tcvse_baseline_augments_at_the_models_rates(monkeypatch):
    torch.manual_seed(0)
    bench = _bench("tcvse")
    model = get_recipe("tcvse").with_overrides(embed_dim=8).with_model_options(region_drop=0.5,
                                                                                 word_rate=0.3).build(bench)
    baseline = infonce_baseline("tcvse", model)
    assert (baseline.augment_region_drop, baseline.augment_word_rate) == (0.5, 0.3)
    seen = {}

    def spy(batch, **kwargs):
        seen.update(kwargs)
        return batch

    monkeypatch.setattr("evidential_ops.models.infonce.augment_batch", spy)
    baseline.training_step(tiny_batch(bench), 0, torch.optim.SGD(baseline.parameters(), lr=0.0))
    assert seen["region_drop"] == 0.5 and seen["word_rate"] == 0.3
    assert infonce_baseline("tcvse", get_recipe("tcvse").with_overrides(embed_dim=8).with_model_options(
        augment=False).build(bench)).augment_vocab_size is None


def test_infonce_by_class_also_reports_the_class_summed_softmax():
    model, bench = _model("fume")
    baseline = infonce_baseline("fume", model)
    metrics, _ = quality_of("infonce", baseline, bench, seed=0, relevance="label")
    for direction in ("i2t", "t2i"):
        scores = metrics[direction]["scores"]
        assert {"neg_top_probability", "neg_top_class_probability", "neg_top1_similarity"} <= set(scores)
    by_instance, _ = quality_of("infonce", baseline, bench, seed=0)
    assert "neg_top_class_probability" not in by_instance["i2t"]["scores"]


def test_infonce_quality_uses_its_softmax_confidence():
    model, bench = _model("tcl")
    baseline = infonce_baseline("tcl", model)
    metrics, _ = quality_of("infonce", baseline, bench, seed=0)
    q = metrics["i2t"]
    assert q["ece_of"] == "top_softmax_probability" and "neg_top_probability" in q["scores"]
    out = baseline.infer(bench.test)
    probability = out.top_probability("rows")
    assert bool(((probability > 0) & (probability <= 1)).all())
    # Beside FUME the baseline is judged by class, as FUME is: a top-1 of the same class is right.
    by_class, _ = quality_of("infonce", baseline, bench, seed=0, relevance="label")
    assert by_class["relevance"] == "label" and by_class["i2t"]["r1"] >= q["r1"]
    with pytest.raises(ValueError, match="relevance"):
        quality_of("infonce", baseline, bench, relevance="caption")


def _quality(u_auroc: float, free_auroc: float, u_aurc: float, ood: float | None = None) -> dict:
    def score(a, aurc, o):
        out = {"error_auroc": a, "error_aupr": 0.5, "aurc": aurc, "eaurc": 0.1, "r1_at_50": 50.0, "r1_at_80": 50.0}
        if o is not None:
            out["ood_auroc"] = o
        return out

    direction = {"scores": {"u": score(u_auroc, u_aurc, ood), "neg_top1_similarity": score(free_auroc, 0.3, 0.9),
                            "neg_margin": score(0.5, 0.3, 0.5)},
                 "baselines": ["neg_top1_similarity", "neg_margin"]}
    return {"primary_score": "u", "i2t": direction, "t2i": direction}


def _baseline(rsum: float, aurc: float, eaurc: float = 0.05) -> dict:
    direction = {"scores": {"neg_top_probability": {"aurc": aurc, "eaurc": eaurc}}}
    return {"rsum": rsum, "uncertainty_quality": {"i2t": direction, "t2i": direction}}


def _tcl_metrics(rsum: float, quality: dict) -> dict:
    single = {"rsum": rsum - 10}
    corruption = {"0.0": {"uncertainty_i2t_median": 0.3, "uncertainty_t2i_median": 0.3},
                  "0.6": {"uncertainty_i2t_median": 0.5, "uncertainty_t2i_median": 0.5}}
    return {"rsum": rsum, "model_a": single, "model_b": single, "corruption": corruption,
            "uncertainty_quality": quality}


def test_checks_fail_when_the_method_does_not_beat_the_baseline():
    untrained = {"rsum": 5.0}
    losing = summary_checks("tcl", _tcl_metrics(470.0, _quality(0.55, 0.70, 0.35, ood=0.74)), untrained,
                            _baseline(488.0, 0.14))
    assert not losing["rsum_vs_infonce"]["pass"]
    assert "does not beat the same-encoder InfoNCE baseline on rSum (470 vs 488)" in losing["rsum_vs_infonce"]["note"]
    for direction in ("i2t", "t2i"):
        assert not losing[f"u_error_auroc_vs_free_scores_{direction}"]["pass"]
        assert not losing[f"u_ood_auroc_vs_neg_top1_similarity_{direction}"]["pass"]
        assert not losing[f"aurc_vs_infonce_{direction}"]["pass"]
        assert not losing[f"eaurc_vs_infonce_{direction}"]["pass"]
        assert losing[f"eaurc_vs_infonce_{direction}"]["value"] == [0.1, 0.05]
    winning = summary_checks("tcl", _tcl_metrics(500.0, _quality(0.80, 0.70, 0.10, ood=0.95)), untrained,
                             _baseline(488.0, 0.14, eaurc=0.2))
    assert all(check["pass"] for check in winning.values()), winning
    # A lower AURC that comes from a more accurate model alone passes the AURC check, not E-AURC's.
    accurate = summary_checks("tcl", _tcl_metrics(500.0, _quality(0.80, 0.70, 0.10, ood=0.95)), untrained,
                              _baseline(488.0, 0.14, eaurc=0.08))
    assert accurate["aurc_vs_infonce_i2t"]["pass"] and not accurate["eaurc_vs_infonce_i2t"]["pass"]
    assert "accuracy taken out" in accurate["eaurc_vs_infonce_i2t"]["note"]
    # Without a baseline the checks against it are absent, not silently passed.
    alone = summary_checks("tcl", _tcl_metrics(500.0, _quality(0.80, 0.70, 0.10)), untrained)
    assert "rsum_vs_infonce" not in alone and "aurc_vs_infonce_i2t" not in alone and "eaurc_vs_infonce_i2t" not in alone


def test_duq_rerank_check_fails_when_eq_16_lowers_r1():
    base = {"rsum": 420.0, "i2t_r1": 54.4, "t2i_r1": 41.6, "rerank_reading": "candidate"}
    lower = summary_checks("duq", {**base, "reranked": {"i2t_r1": 48.0, "t2i_r1": 37.4}}, None)["rerank_r1_vs_plain"]
    assert not lower["pass"] and "candidate" in lower["note"]
    higher = summary_checks("duq", {**base, "reranked": {"i2t_r1": 55.0, "t2i_r1": 41.6}}, None)["rerank_r1_vs_plain"]
    assert higher["pass"]


def test_uml_noisy_check_compares_u_with_the_pair_similarity():
    audit = {"split_accuracy": 0.9, "uncertainty_noisy_mean": 0.70, "uncertainty_clean_mean": 0.68,
             "uncertainty_noisy_median": 0.70, "uncertainty_clean_median": 0.68,
             "uncertainty_auroc_noisy": 0.60, "similarity_auroc_noisy": 0.85}
    checks = summary_checks("uml", {"rsum": 400.0, "audit": audit}, None)
    assert not checks["noisy_auroc_u_vs_pair_similarity"]["pass"]
    assert checks["noisy_auroc_u_vs_pair_similarity"]["value"] == [0.60, 0.85]
    assert auroc(torch.tensor([0.9, 0.8]), torch.tensor([True, False])) == 1.0
