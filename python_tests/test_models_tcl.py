"""TCL / TcVSE pipelines (models.tcl, models.tcvse) against the SPEC §3 reference formulas."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from models_fixtures import single_thread, tiny_batch, tiny_bench

from evidential_ops.metrics import retrieval_metrics
from evidential_ops.models import TCL, TcVSE
from evidential_ops.models.encoders import GRUTextEncoder, MaxPoolEncoder
from evidential_ops.reference import opinion_from_similarity
from evidential_ops.methods import evidential_beliefs, tcl_consistency_loss
from evidential_ops.reference.methods import tcl_uncertainty_loss


_one_thread = pytest.fixture(autouse=True)(single_thread)


def _model(cls=TCL, **kwargs):
    torch.manual_seed(0)
    bench = tiny_bench()
    return cls.default(bench.train.images.shape[-1], len(bench.vocab), embed_dim=16, **kwargs), bench


@pytest.mark.parametrize("epoch", [0, 7])
def test_uncertainty_loss_matches_reference(epoch):
    model, bench = _model()
    batch = tiny_batch(bench)
    fused = model.uncertainty_loss(batch, epoch)
    # Same forward again (BatchNorm in train mode is a function of the batch only).
    x_a, y_a = model.model_a(batch)
    x_b, y_b = model.model_b(batch)
    ref = tcl_uncertainty_loss(x_a.double() @ y_a.double().T, x_b.double() @ y_b.double().T,
                               kl_weight=model.kl_weight(epoch), tau=0.05)
    # SPEC §5: float32 embeddings, float64 reference of their exact products; D = 16, τ = 0.05.
    assert fused.item() == pytest.approx(ref.item(), rel=1e-4)
    assert model.kl_weight(epoch) == min(1.0, 0.005 * epoch)


@pytest.mark.parametrize("epoch", [0, 7])
def test_uncertainty_loss_parts_are_the_risk_and_the_kl(epoch):
    """The parts a log shows (risk, KL at weight 1) are the reference's terms, and asking for
    them leaves L_u bitwise unchanged (they must not alter training)."""
    model, bench = _model()
    batch = tiny_batch(bench)
    plain = model.uncertainty_loss(batch, epoch)
    parts = {}
    assert torch.equal(model.uncertainty_loss(batch, epoch, parts=parts), plain)
    x_a, y_a = model.model_a(batch)
    x_b, y_b = model.model_b(batch)
    s_a, s_b = x_a.double() @ y_a.double().T, x_b.double() @ y_b.double().T
    risk = tcl_uncertainty_loss(s_a, s_b, kl_weight=0.0, tau=0.05).item()
    kl = tcl_uncertainty_loss(s_a, s_b, kl_weight=1.0, tau=0.05).item() - risk
    assert parts["loss_risk"] == pytest.approx(risk, rel=1e-4)
    assert parts["loss_kl"] == pytest.approx(kl, rel=1e-4) and kl > 0  # reported at λ = 0 too
    assert parts["loss_risk"] + model.kl_weight(epoch) * parts["loss_kl"] == pytest.approx(plain.item(), rel=1e-6)


def test_consistency_loss_matches_reference_and_detaches_owner():
    model, bench = _model()
    batch = tiny_batch(bench)
    loss = model.consistency_loss(batch)
    x_a, y_a = model.model_a(batch)
    x_b, y_b = model.model_b(batch)
    s_a, s_b = x_a @ y_a.T, x_b @ y_b.T
    assert loss.item() == pytest.approx(tcl_consistency_loss(s_a.double(), s_b.double()).item(), rel=1e-5)

    params_a = [p for p in model.model_a.parameters() if p.requires_grad]
    params_b = [p for p in model.model_b.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params_a + params_b, allow_unused=True)
    # Owner detached (SPEC §3): A gets gradient only from the column term (B's opinions as the
    # target), B only from the row term (A's opinions as the target).
    cols = (evidential_beliefs(s_a, dim=0) - evidential_beliefs(s_b.detach(), dim=0)).abs().mean()
    rows = (evidential_beliefs(s_a.detach(), dim=1) - evidential_beliefs(s_b, dim=1)).abs().mean()
    want_a = torch.autograd.grad(cols, params_a, allow_unused=True, retain_graph=True)
    want_b = torch.autograd.grad(rows, params_b, allow_unused=True)
    nonzero = 0
    scale = max(float(w.abs().max()) for w in list(want_a) + list(want_b) if w is not None)
    for got, want in zip(grads, list(want_a) + list(want_b)):
        if want is None:
            assert got is None or float(got.abs().max()) == 0.0
            continue
        assert torch.isfinite(got).all()
        # Both float32; the strip-wise form (methods.tcl_consistency) sums in another order: two
        # orders of the K-term sums behind an embedding gradient differ by 2(K − 1)·u·Σ|t| (Higham
        # §4.2), Σ|t| <= K·max|t|. A parameter's gradient mixes every embedding's, so the bound is
        # absolute at the scale of the largest gradient (biases ahead of a normalisation have true
        # gradients of ~1e-7 from cancellation, below that rounding).
        k = s_a.shape[0]
        torch.testing.assert_close(got, want, rtol=0, atol=2 * (k - 1) * 2.0**-24 * k * scale)
        nonzero += int(float(want.abs().max()) > 0)
    assert nonzero > 0


def test_training_step_runs_both_steps_and_lowers_the_loss():
    model, bench = _model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = tiny_batch(bench)
    first = model.training_step(batch, 0, opt)
    assert math.isnan(first["loss_c"]) and first["kl_weight"] == 0.0  # no step 2 in epoch 0
    logs = [model.training_step(batch, 1, opt) for _ in range(8)]
    assert all(math.isfinite(v) for log in logs for v in log.values())
    for log in [first, *logs]:  # the parts a log prints add up to L_u
        assert log["loss_risk"] + log["kl_weight"] * log["loss_kl"] == pytest.approx(log["loss_u"], rel=1e-6)
    assert logs[-1]["loss_u"] < first["loss_u"]
    for p in model.parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all()


def test_losses_is_step_one_without_stepping():
    model, bench = _model()
    batch = tiny_batch(bench)
    before = [p.detach().clone() for p in model.parameters()]
    parts = model.losses(batch, 7)
    assert set(parts) == {"loss", "loss_u", "loss_kl", "loss_risk", "kl_weight"}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in parts.values())
    assert parts["loss"].requires_grad and not any(v.requires_grad for k, v in parts.items() if k != "loss")
    assert torch.equal(parts["loss"], model.uncertainty_loss(batch, 7))
    weight = model.kl_weight(7)
    assert float(parts["kl_weight"]) == weight > 0
    assert float(parts["loss_risk"]) + weight * float(parts["loss_kl"]) == pytest.approx(float(parts["loss_u"]),
                                                                                          rel=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing stepped
    with pytest.raises(ValueError, match="epoch"):
        model.losses(batch, -1)


def test_training_updates_driven_by_hand_are_the_training_step():
    """The 1 + R callables of training_updates, each backpropagated and stepped before the next
    is called, are training_step's updates: the same weights afterwards, bitwise."""
    model, bench = _model(t_max=2)
    assert [model.consistency_rounds(e) for e in (0, 1, 5)] == [0, 2, 2]
    assert len(model.training_updates(tiny_batch(bench), 0)) == 1
    by_hand = copy.deepcopy(model)
    batch = tiny_batch(bench)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    info = model.training_step(batch, 1, optimizer)
    hand_optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.5)
    by_hand.train()
    seen = []
    updates = by_hand.training_updates(batch, 1)
    assert len(updates) == 3
    for update in updates:
        parts = update()
        seen.append(float(parts["loss"].detach()))
        hand_optimizer.zero_grad()
        parts["loss"].backward()
        torch.nn.utils.clip_grad_norm_(list(by_hand.parameters()), by_hand.grad_clip)
        hand_optimizer.step()
    assert seen[0] == info["loss_u"] and sum(seen[1:]) / 2 == info["loss_c"]
    assert seen[1] != seen[2]  # each round's forward saw the previous round's update
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), by_hand.state_dict().values()))


def test_t_max_consistency_updates_happen(monkeypatch):
    model, bench = _model(t_max=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    calls = []
    original = model.consistency_loss
    monkeypatch.setattr(model, "consistency_loss", lambda b: calls.append(1) or original(b))
    model.training_step(tiny_batch(bench), 1, opt)
    assert len(calls) == 3  # a fresh forward per round


def test_inference_opinions_and_beliefs():
    model, bench = _model()
    out = model.infer(bench.test)
    n, c = bench.test.n_images, bench.test.captions_per_image
    assert out.similarity.shape == (n, n * c)
    torch.testing.assert_close(out.similarity, out.similarity_a + out.similarity_b)
    ref = opinion_from_similarity(out.similarity_a.double(), evidence="exp", tau=0.05)
    torch.testing.assert_close(out.image_query_uncertainty.double(), ref.row_uncertainty, rtol=1e-4, atol=1e-9)
    top = out.topk(k=3, direction="cols")
    assert top.indices.shape == (n * c, 3) and top.uncertainty.shape == (n * c,)
    b_ref = evidential_beliefs(out.similarity_b.double(), dim=0).T.gather(1, top.indices)
    torch.testing.assert_close(top.beliefs.double(), b_ref, rtol=1e-4, atol=1e-9)
    metrics = model.evaluate(bench.test)
    assert metrics["rsum"] == pytest.approx(retrieval_metrics(out.similarity, c)["rsum"])
    assert {"model_a", "model_b", "uncertainty_i2t_median", "uncertainty_t2i_median"} <= set(metrics)


def test_tcvse_uses_max_pooling_and_checks_evidence():
    model, _ = _model(TcVSE)
    assert isinstance(model.model_a.image_encoder, MaxPoolEncoder)
    assert isinstance(model.model_a.text_encoder, GRUTextEncoder) and model.model_a.text_encoder.pooling == "max"
    with pytest.raises(ValueError, match="evidence"):
        _model(TcVSE, evidence="softplus")
    relu, bench = _model(TcVSE, evidence="relu")
    assert math.isfinite(relu.uncertainty_loss(tiny_batch(bench), 3).item())


def test_bad_arguments():
    model, bench = _model()
    with pytest.raises(ValueError, match="t_max"):
        _model(t_max=-1)
    with pytest.raises(ValueError, match="evidence"):
        _model(evidence="exp_tanh")
    with pytest.raises(TypeError, match="model_a"):
        TCL(torch.nn.Linear(2, 2), model.model_b)
    with pytest.raises(TypeError, match="optimizer"):
        model.training_step(tiny_batch(bench), 0, optimizer=None)
    with pytest.raises(ValueError, match="captions"):
        model.uncertainty_loss({"images": tiny_batch(bench)["images"]}, 0)
