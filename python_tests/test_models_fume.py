"""FUME pipeline (models.fume) against the SPEC §3 reference formulas."""

from __future__ import annotations

import math

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.metrics import map_at_all
from evidential_ops.models import FUME
from evidential_ops.methods import (
    fume_credibility,
    fume_cross_modal_uncertainty,
    fume_decision_uncertainty,
    fume_loss,
    fume_membership,
    fume_membership_matrix,
)


_one_thread = pytest.fixture(autouse=True)(single_thread)


def _model(**kwargs):
    torch.manual_seed(0)
    bench = tiny_bench()
    n_classes = int(bench.train.labels.max()) + 1
    return FUME.default(bench.train.images.shape[-1], len(bench.vocab), n_classes, hidden_dim=32, **kwargs), bench


@pytest.mark.parametrize("exclude_self", [False, True])
def test_loss_is_the_reference_fume_loss(exclude_self):
    model, bench = _model(alpha=0.5, exclude_self=exclude_self)
    batch = tiny_batch(bench)
    loss = model.loss(batch)
    x, y = model.model(batch)
    w = fume_membership_matrix(model.num_classes, dtype=torch.float64)
    ref = fume_loss([x.double(), y.double()], batch["labels"], w, alpha=0.5, exclude_self=exclude_self)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_losses_is_the_loss_without_stepping():
    model, bench = _model()
    batch = tiny_batch(bench)
    before = [p.detach().clone() for p in model.parameters()]
    parts = model.losses(batch, 0)
    assert list(parts) == ["loss"] and torch.equal(parts["loss"], model.loss(batch))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="epoch"):
        model.losses(batch, -1)


def test_membership_matrix_is_fixed_and_the_loss_decreases():
    model, bench = _model()
    w0 = model.weight.clone()
    assert not model.weight.requires_grad and "weight" not in dict(model.named_parameters())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = tiny_batch(bench)
    losses = [model.training_step(batch, 0, opt)["loss"] for _ in range(10)]
    assert losses[-1] < losses[0] and all(math.isfinite(v) for v in losses)
    assert torch.equal(model.weight, w0)
    for p in model.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


def test_inference_uncertainties_and_threshold_retrieval():
    model, bench = _model()
    out = model.infer(bench.test)
    c = bench.test.captions_per_image
    u_ref = fume_decision_uncertainty(fume_credibility(fume_membership(out.image_features.double(),
                                                                       model.weight.double())))
    torch.testing.assert_close(out.image_uncertainty.double(), u_ref, rtol=1e-5, atol=1e-6)
    pair = out.pair_uncertainty(c)
    torch.testing.assert_close(pair, fume_cross_modal_uncertainty(out.image_uncertainty.repeat_interleave(c),
                                                                  out.text_uncertainty))
    metrics = model.evaluate(bench.test, threshold=0.5)
    assert metrics["map_i2t"] == pytest.approx(map_at_all(out.similarity, out.image_labels, out.text_labels))
    for key in ("map", "map_filtered", "map_filtered_zero", "deletion_rate_i2t", "rsum"):
        assert key in metrics
    curves = model.deletion_curves(bench.test, rates=[0.0, 0.5])
    assert curves["u"]["map"][0] == pytest.approx(metrics["map_i2t"])


def test_bad_arguments():
    model, bench = _model()
    with pytest.raises(ValueError, match="C = "):
        model.decision_uncertainty(torch.randn(3, model.num_classes + 1))
    with pytest.raises(ValueError, match="num_classes"):
        _model_classes(1)
    with pytest.raises(ValueError, match="labels"):
        model.loss({k: v for k, v in tiny_batch(bench).items() if k != "labels"})


def _model_classes(n):
    bench = tiny_bench()
    return FUME.default(bench.train.images.shape[-1], len(bench.vocab), n)
