"""DUQ pipeline (models.duq) against the SPEC §3 reference formulas."""

from __future__ import annotations

import math

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.models import DUQ
from evidential_ops.methods import duq_distance_matrix, duq_rerank
from evidential_ops.reference.methods import duq_isum_loss, duq_total_loss


_one_thread = pytest.fixture(autouse=True)(single_thread)


def _model(**kwargs):
    torch.manual_seed(0)
    bench = tiny_bench(visual="frames")
    return DUQ.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, **kwargs), bench


def test_isum_by_the_fused_op_is_the_reference():
    model, bench = _model()
    out = model(tiny_batch(bench))
    want = duq_isum_loss(out.s.detach().double()).item()
    assert model.isum_loss(out.s).item() == pytest.approx(want, rel=1e-5)
    # The training term: the same loss from the embeddings, s never formed.
    assert model.isum_loss_from_embeddings(out.z_text, out.z_video).item() == pytest.approx(want, rel=1e-5)


def test_total_loss_is_the_reference_total_loss():
    model, bench = _model()
    out = model(tiny_batch(bench), generator=torch.Generator().manual_seed(3))
    parts = model.loss_terms(out)
    d = lambda t: t.detach().double()
    ref = duq_total_loss(d(out.s), d(out.d), d(out.mu_text), d(out.log_sigma_text), d(out.mu_video),
                         d(out.log_sigma_video), logit_scale=out.logit_scale.item())
    assert parts["loss"].item() == pytest.approx(ref.item(), rel=1e-5)
    # The distance matrix follows eq. 11: min on the diagonal, max elsewhere, in [0, 2].
    assert float(out.d.detach().min()) >= 0.0 and float(out.d.detach().max()) <= 2.0


def test_losses_of_a_batch_are_the_loss_terms_of_its_forward():
    model, bench = _model()
    batch = tiny_batch(bench)
    parts = model.losses(batch, 0, generator=torch.Generator().manual_seed(3))
    terms = model.loss_terms(model(batch, generator=torch.Generator().manual_seed(3)))
    assert list(parts) == ["loss_s", "loss_s_u", "loss_d", "loss_d_u", "loss_kl", "loss", "logit_scale"]
    assert all(torch.equal(parts[k], terms[k]) for k in terms)
    assert parts["loss"].requires_grad and not parts["loss_s"].requires_grad
    assert torch.equal(parts["logit_scale"], model.logit_scale.detach())


def test_training_step_lowers_the_loss_with_finite_gradients_everywhere():
    model, bench = _model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = tiny_batch(bench)
    logs = [model.training_step(batch, 0, opt, generator=torch.Generator().manual_seed(k)) for k in range(8)]
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert all(math.isfinite(v) for log in logs for v in log.values())
    for name in ("text_mu", "text_log_sigma", "video_mu", "video_log_sigma"):
        grads = [p.grad for p in getattr(model, name).parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), name
    assert model.log_logit_scale.grad is not None


def test_inference_reranks_as_eq_16():
    model, bench = _model()
    out = model.infer(bench.test, seed=5, chunk_size=7)
    n, c = bench.test.n_images, bench.test.captions_per_image
    assert out.similarity.shape == out.distance.shape == (n, n * c)
    t2v = duq_rerank(out.similarity.T.contiguous(), out.distance.T.contiguous())
    torch.testing.assert_close(out.reranked_t2v, t2v.similarity.T)
    torch.testing.assert_close(out.similarity_uncertainty_t2v, t2v.similarity_uncertainty)
    again = model.infer(bench.test, seed=5)
    torch.testing.assert_close(again.distance, out.distance)  # seeded: reproducible
    metrics = model.evaluate(bench.test)
    assert set(metrics["reranked"]) >= {"i2t_r1", "t2i_r1", "rsum"}
    assert set(metrics["rerank_readings"]) == {"printed", "nonnegative", "candidate"}
    assert metrics["rerank_readings"][model.rerank_reading] == metrics["reranked"]


def test_nearest_distance_is_the_min_rule_for_every_pair():
    model, bench = _model()
    nearest = model.nearest_distance(bench.test, seed=5, chunk_size=7)
    farthest = model.infer(bench.test, seed=5).distance
    assert nearest.shape == farthest.shape and bool((nearest <= farthest + 1e-6).all())
    _, _, samples_t, samples_v = model._samples(bench.test, 512, 5)
    for video, text in ((0, 0), (0, 7), (3, 1), (bench.test.n_images - 1, 2)):
        # duq_distance_matrix's diagonal is the min rule of eq. 11 for the pair it is given.
        one = duq_distance_matrix(samples_t[text:text + 1], samples_v[video:video + 1], diagonal_min=True)
        assert float(nearest[video, text]) == pytest.approx(float(one[0, 0]), abs=1e-6)
    metrics = model.evaluate(bench.test)
    assert set(metrics["distance_only_min"]) >= {"i2t_r1", "t2i_r1", "rsum"}


def test_rerank_reading_is_a_model_option():
    model, bench = _model(rerank_reading="printed")
    out = model.infer(bench.test, seed=1)
    printed = duq_rerank(out.similarity.contiguous(), out.distance.contiguous(), reading="printed")
    torch.testing.assert_close(out.reranked_v2t, printed.similarity)
    assert out.rerank_reading == "printed"
    with pytest.raises(ValueError, match="rerank_reading"):
        _model(rerank_reading="paper")


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_samples"):
        _model(num_samples=0)
    with pytest.raises(ValueError, match="logit_scale"):
        _model(logit_scale=500.0)
    model, _ = _model()
    with pytest.raises(TypeError, match="model"):
        DUQ(torch.nn.Linear(2, 2), 4)
