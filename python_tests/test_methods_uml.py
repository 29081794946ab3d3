"""UML method references (SPEC §3 "UML") against independent oracles.

Oracles: loops with mpmath (K = 7) or scipy (K = 113) for the Fisher terms, softmax
distributions built from the raw embeddings with explicit dot products, torch.distributions
and scipy for KL / JS, finite differences (gradcheck) for the gradient.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.spatial.distance
import scipy.special
import torch
from torch.distributions import Categorical, kl_divergence

from evidential_ops.methods import uml_aml_loss, uml_clean_labels, uml_sigma, uml_similarities
from evidential_ops.reference.methods import uml_dual_view_loss, uml_evidential_loss, uml_total_loss

TAU = 0.1


def _triplet(k: int, d: int, seed: int, noisy_fraction: float = 0.3):
    """Unit-norm (v, s, t): s close to v, t a 'translation' of s; a fraction of the t are
    shuffled so that those pairs are noisy correspondences."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(k, d, generator=g, dtype=torch.float64)
    s = v + 0.6 * torch.randn(k, d, generator=g, dtype=torch.float64)
    t = s + 0.6 * torch.randn(k, d, generator=g, dtype=torch.float64)
    n_noisy = int(noisy_fraction * k)
    if n_noisy >= 2:
        idx = torch.randperm(k, generator=g)[:n_noisy]
        t[idx] = t[idx.roll(1)]
    norm = torch.nn.functional.normalize
    return norm(v, dim=1), norm(s, dim=1), norm(t, dim=1)


def _exp_tanh(x: float, tau: float = TAU) -> float:
    return math.exp(math.tanh(x / tau))


def _labels_oracle(s_list, tau=TAU, kind="exp_tanh"):
    k = len(s_list)
    labels = []
    for i in range(k):
        if kind == "exp":
            # compare ln(e_ij + e_ji) in log space, evaluated with numpy's logaddexp
            pair = [np.logaddexp(s_list[i][j] / tau, s_list[j][i] / tau) for j in range(k)]
        else:
            pair = [_exp_tanh(s_list[i][j], tau) + _exp_tanh(s_list[j][i], tau) for j in range(k)]
        best = int(np.argmax(pair))
        assert sum(1 for p in pair if p == pair[best]) == 1, "oracle needs a unique maximum"
        labels.append(best == i)
    return torch.tensor(labels)


# ---------------------------------------------------------------------------------------------
# Labels, schedule


@pytest.mark.parametrize("k", [7, 113])
def test_clean_labels_match_loop_oracle(k):
    v, s, t = _triplet(k, 32, seed=k)
    s_vt, s_vs, _ = uml_similarities(v, s, t)
    for m in (s_vt, s_vs):
        got = uml_clean_labels(m)
        assert got.dtype == torch.bool and got.shape == (k,)
        assert torch.equal(got, _labels_oracle(m.tolist()))
    labels = uml_clean_labels(s_vt)
    assert 0 < int(labels.sum()) < k, "the planted noise should give both kinds of pairs"


def test_clean_labels_exp_evidence_no_overflow_float32():
    v, s, t = _triplet(9, 16, seed=3)
    s_vt = (v @ t.T).float()
    got = uml_clean_labels(s_vt, evidence="exp", tau=0.005)  # e up to exp(200)
    assert torch.equal(got, _labels_oracle(s_vt.double().tolist(), tau=0.005, kind="exp"))


def test_clean_labels_ties_count_as_clean():
    # exp_tanh saturates in float32: tanh(9.5) rounds to 1, so pairs 0 and 1 tie exactly.
    s = torch.tensor([[0.95, 0.96, 0.10], [0.97, 0.95, 0.10], [0.10, 0.10, 0.95]], dtype=torch.float32)
    e = torch.exp(torch.tanh(s / TAU))
    pair = e + e.T
    assert pair[1, 0] == pair[1, 1] and torch.argmax(pair[1]).item() == 0  # argmax would say noisy
    assert uml_clean_labels(s).tolist() == [True, True, True]
    # A strictly larger off-diagonal pair is noisy.
    s64 = torch.tensor([[0.5, 0.1, 0.0], [0.6, 0.0, 0.0], [0.0, 0.1, 0.4]], dtype=torch.float64)
    assert uml_clean_labels(s64).tolist() == [True, False, True]


def test_clean_labels_have_no_gradient():
    v, s, t = _triplet(7, 8, seed=4)
    s_vt = (v @ t.T).requires_grad_()
    labels = uml_clean_labels(s_vt)
    assert not labels.requires_grad


@pytest.mark.parametrize(
    "epoch, total, gamma, lam, expected",
    [(0, 40, 0.2, 4, 1.0), (5, 40, 0.2, 4, 0.5), (8, 40, 0.2, 4, 0.2), (20, 40, 0.2, 4, 0.2),
     (3, 40, 0.25, 3, 0.775), (10, 40, 0.25, 3, 0.25), (1, 10, 0.0, 0.0, 1.0)],
)
def test_sigma_schedule(epoch, total, gamma, lam, expected):
    assert uml_sigma(epoch, total, gamma=gamma, lambda_s=lam) == pytest.approx(expected, rel=1e-15)


def test_sigma_rejects_bad_arguments():
    with pytest.raises(ValueError, match="total_epochs"):
        uml_sigma(1, 0)
    with pytest.raises(ValueError, match="epoch"):
        uml_sigma(-1, 10)
    with pytest.raises(ValueError, match="gamma"):
        uml_sigma(1, 10, gamma=1.5)
    with pytest.raises(ValueError, match="lambda_s"):
        uml_sigma(1, 10, lambda_s=-1)
    with pytest.raises(TypeError, match="epoch"):
        uml_sigma("3", 10)


# ---------------------------------------------------------------------------------------------
# L^e, L_u


def _le_mpmath(alpha_row, target_index, clean, phi):
    """fmse − φ·logdet by the textbook formulas of UML eq. 7-8, in 40-digit arithmetic."""
    a = [mpmath.mpf(x) for x in alpha_row]
    strength = sum(a)
    trig = [mpmath.polygamma(1, x) for x in a]
    fmse = mpmath.mpf(0)
    for j, (x, p1) in enumerate(zip(a, trig)):
        y = mpmath.mpf(1 if (clean and j == target_index) else 0)
        fmse += ((y - x / strength) ** 2 + x * (strength - x) / (strength**2 * (strength + 1))) * p1
    logdet = sum(mpmath.log(p1) for p1 in trig) + mpmath.log(
        1 - mpmath.polygamma(1, strength) * sum(1 / p1 for p1 in trig)
    )
    return fmse - phi * logdet


def _view_loss_oracle_mp(s_list, labels, phi):
    k = len(s_list)
    with mpmath.workdps(40):
        alpha = [[mpmath.exp(mpmath.tanh(mpmath.mpf(x) / TAU)) + 1 for x in row] for row in s_list]
        out = []
        for i in range(k):
            row = _le_mpmath(alpha[i], i, labels[i], phi)
            col = _le_mpmath([alpha[r][i] for r in range(k)], i, labels[i], phi)
            out.append(float(row + col))
    return torch.tensor(out, dtype=torch.float64)


def _view_loss_oracle_np(s: np.ndarray, labels: np.ndarray, phi: float) -> np.ndarray:
    """Same formulas, vectorised with scipy (α ≤ e + 1, so float64 has no cancellation here)."""
    alpha = np.exp(np.tanh(s / TAU)) + 1.0

    def rows(a):
        k = a.shape[0]
        strength = a.sum(axis=1, keepdims=True)
        trig = scipy.special.polygamma(1, a)
        target = np.eye(k) * labels[:, None]
        fmse = (((target - a / strength) ** 2 + a * (strength - a) / (strength**2 * (strength + 1))) * trig).sum(1)
        logdet = np.log(trig).sum(1) + np.log(
            1 - scipy.special.polygamma(1, strength[:, 0]) * (1 / trig).sum(1)
        )
        return fmse - phi * logdet

    return rows(alpha) + rows(alpha.T)


def test_evidential_loss_matches_mpmath_clean_and_noisy():
    v, s, t = _triplet(7, 12, seed=5)
    s_vt = v @ t.T
    labels = torch.tensor([True, False, True, True, False, True, False])
    got = uml_evidential_loss(s_vt, labels, phi=0.01)
    want = _view_loss_oracle_mp(s_vt.tolist(), labels.tolist(), 0.01)
    torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-13)
    # 0/1 float labels are the same thing as bools
    torch.testing.assert_close(uml_evidential_loss(s_vt, labels.double(), phi=0.01), got, rtol=0, atol=0)


def test_evidential_loss_k113_matches_scipy():
    v, s, t = _triplet(113, 64, seed=6)
    s_vs = v @ s.T
    labels = uml_clean_labels(s_vs)
    got = uml_evidential_loss(s_vs, labels, phi=0.05)
    want = _view_loss_oracle_np(s_vs.numpy(), labels.numpy().astype(np.float64), 0.05)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-10, atol=1e-12)


def test_noisy_target_is_all_zero():
    # A noisy pair's loss does not depend on which column is "its" positive: permuting the
    # columns of a row whose label is 0 leaves that row's fmse/logdet unchanged.
    v, s, t = _triplet(6, 10, seed=7)
    s_vt = v @ t.T
    labels = torch.zeros(6, dtype=torch.bool)
    base = _view_loss_oracle_np(s_vt.numpy(), np.zeros(6), 0.01)
    got = uml_evidential_loss(s_vt, labels)
    torch.testing.assert_close(got, torch.from_numpy(base), rtol=1e-11, atol=1e-12)
    clean = uml_evidential_loss(s_vt, torch.ones(6, dtype=torch.bool))
    assert (clean - got).abs().min() > 1e-6


def test_dual_view_loss_mixes_views_with_sigma():
    v, s, t = _triplet(9, 12, seed=8)
    s_vt, s_vs, _ = uml_similarities(v, s, t)
    l_vt, l_vs = uml_clean_labels(s_vt), uml_clean_labels(s_vs)
    sigma = uml_sigma(3, 40)
    got = uml_dual_view_loss(s_vt, s_vs, l_vt, l_vs, sigma=sigma)
    want_vs = _view_loss_oracle_np(s_vs.numpy(), l_vs.numpy().astype(float), 0.01)
    want_vt = _view_loss_oracle_np(s_vt.numpy(), l_vt.numpy().astype(float), 0.01)
    torch.testing.assert_close(got, torch.from_numpy(sigma * want_vs + (1 - sigma) * want_vt), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# AML


def _softmax_from_embeddings(query, candidates, i, tau):
    logits = np.array([float(np.dot(query[i], c)) / tau for c in candidates])
    logits -= logits.max()
    p = np.exp(logits)
    return p / p.sum()


def _aml_oracle(v, s, t, labels, aml_tau):
    v, s, t = v.numpy(), s.numpy(), t.numpy()
    k = v.shape[0]
    out = []
    for i in range(k):
        q = {
            "v2t": _softmax_from_embeddings(v, t, i, aml_tau),
            "t2v": _softmax_from_embeddings(t, v, i, aml_tau),
            "v2s": _softmax_from_embeddings(v, s, i, aml_tau),
            "s2v": _softmax_from_embeddings(s, v, i, aml_tau),
            "s2t": _softmax_from_embeddings(s, t, i, aml_tau),
            "t2s": _softmax_from_embeddings(t, s, i, aml_tau),
        }
        # scipy's jensenshannon is the square root of the divergence (natural log by default)
        js = lambda a, b: scipy.spatial.distance.jensenshannon(q[a], q[b]) ** 2
        kl = lambda a, b: float(
            kl_divergence(Categorical(probs=torch.from_numpy(q[a])), Categorical(probs=torch.from_numpy(q[b])))
        )
        consistency = 0.5 * (js("v2t", "v2s") + js("t2v", "s2v"))
        disentangle = 0.5 * (kl("v2s", "s2t") + kl("s2v", "t2s"))
        out.append(consistency if labels[i] else -disentangle)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("k, aml_tau", [(7, 0.1), (31, 0.05)])
def test_aml_loss_matches_embedding_level_oracle(k, aml_tau):
    v, s, t = _triplet(k, 16, seed=k + 100)
    s_vt, s_vs, s_st = uml_similarities(v, s, t)
    labels = uml_clean_labels(s_vt)
    assert labels.any() and not labels.all()
    got = uml_aml_loss(s_vt, s_vs, s_st, labels, aml_tau=aml_tau)
    torch.testing.assert_close(got, _aml_oracle(v, s, t, labels.tolist(), aml_tau), rtol=1e-9, atol=1e-12)


def test_aml_loss_no_nan_when_softmax_underflows():
    # aml_tau so small that some probabilities underflow to 0: 0·ln 0 = 0, finite gradient.
    v, s, t = _triplet(6, 8, seed=9)
    s_vt, s_vs, s_st = (m.clone().requires_grad_() for m in uml_similarities(v, s, t))
    labels = torch.tensor([True, False, True, False, True, False])
    loss = uml_aml_loss(s_vt, s_vs, s_st, labels, aml_tau=1e-3).sum()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(m.grad).all() for m in (s_vt, s_vs, s_st))


def test_uml_similarities_layout_and_normalize():
    g = torch.Generator().manual_seed(10)
    v, s, t = (torch.randn(5, 7, generator=g, dtype=torch.float64) for _ in range(3))
    s_vt, s_vs, s_st = uml_similarities(v, s, t, normalize=True)
    for i in range(5):
        for j in range(5):
            cos = lambda a, b: float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
            assert s_vt[i, j].item() == pytest.approx(cos(v[i].numpy(), t[j].numpy()), rel=1e-13)
            assert s_vs[i, j].item() == pytest.approx(cos(v[i].numpy(), s[j].numpy()), rel=1e-13)
            assert s_st[i, j].item() == pytest.approx(cos(s[i].numpy(), t[j].numpy()), rel=1e-13)


# ---------------------------------------------------------------------------------------------
# Total loss


@pytest.mark.parametrize("k, epoch, beta", [(7, 0, 0.6), (40, 6, 0.4)])
def test_total_loss_matches_oracle(k, epoch, beta):
    v, s, t = _triplet(k, 24, seed=k + 200)
    s_vt, s_vs, s_st = uml_similarities(v, s, t)
    got = uml_total_loss(s_vt, s_vs, s_st, epoch=epoch, total_epochs=40, beta=beta)
    l_vt = _labels_oracle(s_vt.tolist())
    l_vs = _labels_oracle(s_vs.tolist())
    sigma = max(0.2, 1 - 4 * epoch / 40)
    lu = sigma * _view_loss_oracle_np(s_vs.numpy(), l_vs.numpy().astype(float), 0.01) + (1 - sigma) * (
        _view_loss_oracle_np(s_vt.numpy(), l_vt.numpy().astype(float), 0.01)
    )
    aml = _aml_oracle(v, s, t, l_vt.tolist(), 0.1).numpy()
    assert got.item() == pytest.approx(float(np.mean(lu + beta * aml)), rel=1e-10)


def test_total_loss_gradcheck():
    v, s, t = _triplet(5, 6, seed=11)
    mats = tuple(m.clone().requires_grad_() for m in uml_similarities(v, s, t))
    assert torch.autograd.gradcheck(
        lambda a, b, c: uml_total_loss(a, b, c, epoch=2, total_epochs=10), mats, eps=1e-6, atol=1e-6,
        fast_mode=True,
    )


def test_total_loss_float32_close_to_float64():
    v, s, t = _triplet(64, 32, seed=12)
    mats = uml_similarities(v, s, t)
    mats32 = tuple(m.float() for m in mats)
    got = uml_total_loss(*mats32, epoch=3, total_epochs=40)
    ref = uml_total_loss(*(m.double() for m in mats32), epoch=3, total_epochs=40)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(ref.item(), rel=1e-4)


# ---------------------------------------------------------------------------------------------
# Validation


def test_uml_rejects_bad_inputs():
    v, s, t = _triplet(5, 6, seed=13)
    s_vt, s_vs, s_st = uml_similarities(v, s, t)
    labels = uml_clean_labels(s_vt)
    with pytest.raises(ValueError, match="labels"):
        uml_evidential_loss(s_vt, labels[:4])
    with pytest.raises(ValueError, match="labels"):
        uml_evidential_loss(s_vt, torch.full((5,), 2.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="labels"):
        uml_evidential_loss(s_vt, [1, 0, 1, 0, 1])
    with pytest.raises(ValueError, match="phi"):
        uml_evidential_loss(s_vt, labels, phi=-1.0)
    with pytest.raises(ValueError, match="sigma"):
        uml_dual_view_loss(s_vt, s_vs, labels, labels, sigma=1.5)
    with pytest.raises(ValueError, match="labels_vs"):
        uml_dual_view_loss(s_vt, s_vs, labels, labels[:3], sigma=0.5)
    with pytest.raises(ValueError, match="aml_tau"):
        uml_aml_loss(s_vt, s_vs, s_st, labels, aml_tau=0)
    with pytest.raises(ValueError, match="s_st"):
        uml_aml_loss(s_vt, s_vs, s_st[:4, :4], labels)
    with pytest.raises(TypeError, match="s_vs"):
        uml_total_loss(s_vt, s_vs.float(), s_st, epoch=1, total_epochs=4)
    with pytest.raises(ValueError, match="beta"):
        uml_total_loss(s_vt, s_vs, s_st, epoch=1, total_epochs=4, beta=-0.1)
    with pytest.raises(ValueError, match="t"):
        uml_similarities(v, s, t[:4])
    with pytest.raises(ValueError, match="s"):
        uml_clean_labels(s_vt[:, :4])


@pytest.mark.parametrize("rows_per_strip", [1, 7, 113])
def test_aml_from_embeddings_equals_the_matrix_form(rows_per_strip):
    """Value and gradients (under a non-uniform upstream) equal `uml_aml_loss` on the three
    matrices in float64 at K = 113, D = 203, for strips that do not divide K. Per element both
    compute the same log-softmaxes of the same products; only GEMM blocking may differ, a few
    ulps of s amplified by 1/aml_tau = 10 through the softmaxes: 1e-12 relative holds it."""
    from conftest import random_pairs

    from evidential_ops.methods import uml_aml_loss_from_embeddings, uml_similarities

    g = torch.Generator().manual_seed(11)
    v, s = random_pairs(113, 203, generator=g, dtype=torch.float64, positive_cos=0.8)
    t, _ = random_pairs(113, 203, generator=g, dtype=torch.float64, positive_cos=0.8)
    labels = torch.rand(113, generator=g) > 0.3
    upstream = torch.rand(113, generator=g, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (v, s, t)]
    expected = uml_aml_loss(*uml_similarities(*leaves), labels)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    leaves = [x.clone().requires_grad_() for x in (v, s, t)]
    got = uml_aml_loss_from_embeddings(*leaves, labels, strip_elements=113 * rows_per_strip)
    got_grads = torch.autograd.grad(got, leaves, upstream)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * float(b.abs().max()))
    with pytest.raises(ValueError, match="t"):
        uml_aml_loss_from_embeddings(v, s, t[:5], labels)
    with pytest.raises(ValueError, match="labels_vt"):
        uml_aml_loss_from_embeddings(v, s, t, labels[:5])
