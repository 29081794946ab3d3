"""UML pipeline (models.uml) against the SPEC §3 reference formulas."""

from __future__ import annotations

import math

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.models import UML
from evidential_ops.models.uml import split_statistics
from evidential_ops.reference import opinion_from_similarity
from evidential_ops.methods import uml_aml_loss, uml_clean_labels, uml_similarities
from evidential_ops.reference.methods import uml_dual_view_loss, uml_evidential_loss, uml_total_loss

_one_thread = pytest.fixture(autouse=True)(single_thread)


LANGS = ("en", "alt")


def _model(**kwargs):
    torch.manual_seed(0)
    bench = tiny_bench(noise_rate=0.4)
    model = UML.default(bench.train.images.shape[-1], len(bench.vocab), len(bench.vocab_alt), embed_dim=16,
                        total_epochs=10, **kwargs)
    return model, bench


def test_view_loss_is_the_reference_evidential_loss():
    model, bench = _model()
    v, s, t = model.embed(tiny_batch(bench, languages=LANGS))
    v, t = v.detach(), t.detach()
    s_vt = v.double() @ t.double().T  # the float64 judge on the same (float32) embeddings
    labels = uml_clean_labels(s_vt)
    labels[0] = not bool(labels[0])  # both kinds of target present
    fused = model.view_loss(v, t, labels)
    # SPEC §5: 1e-4 for fmse/logdet plus the from-embeddings allowance 8·√D·2⁻²⁴/τ.
    allowance = 8 * v.shape[1] ** 0.5 * 2.0**-24 / model.tau
    torch.testing.assert_close(fused.double(), uml_evidential_loss(s_vt, labels), rtol=1e-4 + allowance, atol=1e-6)


def test_clean_labels_from_embeddings_equal_the_matrix_form():
    from evidential_ops.methods import uml_clean_labels_from_embeddings

    model, bench = _model()
    v, s, t = (m.detach() for m in model.embed(tiny_batch(bench, languages=LANGS)))
    for evidence in ("exp", "exp_tanh", "relu"):
        for rows in (1, 3, v.shape[0]):
            got = uml_clean_labels_from_embeddings(v, t, evidence=evidence, tau=0.1, strip_elements=rows * v.shape[0])
            assert torch.equal(got, uml_clean_labels(v @ t.T, evidence=evidence, tau=0.1))


@pytest.mark.parametrize("epoch", [0, 1, 9])
def test_step_loss_is_the_reference_total_loss(epoch):
    model, bench = _model()
    batch = tiny_batch(bench, languages=LANGS)
    out = model.step(batch, epoch)
    v, s, t = model.embed(batch)
    s_vt, s_vs, s_st = (m.double() for m in uml_similarities(v, s, t))
    ref = uml_total_loss(s_vt, s_vs, s_st, epoch=epoch, total_epochs=10)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-6)
    assert out.sigma == max(0.2, 1.0 - 4.0 * epoch / 10)
    torch.testing.assert_close(out.labels_vt, uml_clean_labels(s_vt))
    op = opinion_from_similarity(s_vt, evidence="exp_tanh", tau=0.1)
    torch.testing.assert_close(out.uncertainty_vt.double(), 0.5 * (op.row_uncertainty + op.col_uncertainty),
                               rtol=1e-4, atol=1e-7)


def test_warmup_treats_every_pair_as_clean():
    model, bench = _model(warmup_epochs=2)
    batch = tiny_batch(bench, languages=LANGS)
    out = model.step(batch, 1)
    v, s, t = model.embed(batch)
    s_vt, s_vs, s_st = (m.double() for m in uml_similarities(v, s, t))
    ones = torch.ones(s_vt.shape[0], dtype=torch.bool)
    sigma = out.sigma
    ref = (uml_dual_view_loss(s_vt, s_vs, ones, ones, sigma=sigma)
           + 0.6 * uml_aml_loss(s_vt, s_vs, s_st, ones)).mean()
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-6)
    after = model.step(batch, 2)  # warm-up over: eq. 4's labels again
    ref_after = uml_total_loss(s_vt, s_vs, s_st, epoch=2, total_epochs=10)
    assert after.loss.item() == pytest.approx(ref_after.item(), rel=1e-4, abs=1e-6)


def test_training_step_reports_the_split_and_updates_every_encoder():
    model, bench = _model(warmup_epochs=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = tiny_batch(bench, languages=LANGS)
    before = [p.detach().clone() for p in model.parameters()]
    logs = [model.training_step(batch, 0, opt) for _ in range(6)]
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert {"split_accuracy", "uncertainty_clean", "uncertainty_noisy", "clean_fraction", "sigma"} <= set(logs[0])
    assert all(math.isfinite(v) for v in (logs[-1]["loss"], logs[-1]["split_accuracy"]))
    for name, enc in (("visual", model.visual_encoder), ("english", model.english_encoder),
                      ("other", model.other_encoder)):
        assert any(p.grad is not None and torch.isfinite(p.grad).all() and float(p.grad.abs().max()) > 0
                   for p in enc.parameters()), name
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


def test_losses_is_the_step_loss_without_stepping():
    model, bench = _model(warmup_epochs=1)
    batch = tiny_batch(bench, languages=LANGS)
    before = [p.detach().clone() for p in model.parameters()]
    parts = model.losses(batch, 3)
    assert torch.equal(parts["loss"], model.step(batch, 3).loss) and parts["loss"].requires_grad
    assert set(parts) == {"loss", "sigma", "clean_fraction", "split_accuracy", "uncertainty_clean",
                          "uncertainty_noisy"}  # the tiny data carries the ground truth "noisy"
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
               for k, v in parts.items() if k != "loss")
    assert float(parts["sigma"]) == max(0.2, 1.0 - 4.0 * 3 / 10)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing stepped
    without_truth = {k: v for k, v in batch.items() if k != "noisy"}
    assert set(model.losses(without_truth, 3)) == {"loss", "sigma", "clean_fraction"}


def test_audit_and_evaluate():
    model, bench = _model()
    batches = [tiny_batch(bench, k=16, languages=LANGS, epoch=e) for e in range(2)]
    audit = model.audit(batches)
    assert audit["labels_vt"].shape == audit["uncertainty_vt"].shape == audit["noisy"].shape == (32,)
    metrics = model.evaluate(bench.test)
    assert {"rsum", "english", "uncertainty_v2t_median"} <= set(metrics)


def test_split_statistics_by_hand():
    labels = torch.tensor([True, True, False, False])
    noisy = torch.tensor([False, True, True, False])
    u = torch.tensor([0.1, 0.5, 0.7, 0.3])
    stats = split_statistics(labels, noisy, u)
    assert stats["split_accuracy"] == 0.5
    assert stats["uncertainty_clean"] == pytest.approx(0.2)
    assert stats["uncertainty_noisy"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="same shape"):
        split_statistics(labels, noisy[:3], u)


def test_bad_arguments():
    model, bench = _model()
    with pytest.raises(ValueError, match="total_epochs"):
        _model_total(0)
    with pytest.raises(ValueError, match="captions_alt"):
        model.step(tiny_batch(bench), 0)
    with pytest.raises(ValueError, match="warmup_epochs"):
        _model(warmup_epochs=-1)


def _model_total(total):
    bench = tiny_bench(noise_rate=0.4)
    return UML.default(bench.train.images.shape[-1], len(bench.vocab), len(bench.vocab_alt), embed_dim=8,
                       total_epochs=total)
