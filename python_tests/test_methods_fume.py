"""FUME method references (SPEC §3 "FUME") against independent oracles.

Oracles: hand-computed small cases, explicit loops over samples/classes/modalities with math,
scipy.special.entr for the entropy, the released code's vectorised consistency loss (for the
exclude_self variant), finite differences where gradients matter.
"""

from __future__ import annotations

import math

import pytest
import scipy.special
import torch

from evidential_ops.methods import (
    fume_consistency_loss,
    fume_credibility,
    fume_cross_modal_uncertainty,
    fume_decision_uncertainty,
    fume_fml_loss,
    fume_loss,
    fume_membership,
    fume_membership_matrix,
    fume_training_credibility,
)


def _unit_rows(n: int, d: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1).to(dtype)


def _labels(n: int, c: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, c, (n,), generator=g)


# ---------------------------------------------------------------------------------------------
# W and memberships


@pytest.mark.parametrize("c", [2, 7, 20])
def test_membership_matrix_is_fixed_orthogonal(c):
    w = fume_membership_matrix(c, seed=3)
    assert w.shape == (c, c) and w.dtype == torch.float64 and not w.requires_grad
    torch.testing.assert_close(w @ w.T, torch.eye(c, dtype=torch.float64), rtol=0, atol=1e-14)
    torch.testing.assert_close(w.T @ w, torch.eye(c, dtype=torch.float64), rtol=0, atol=1e-14)
    torch.testing.assert_close(w.norm(dim=1), torch.ones(c, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.equal(w, fume_membership_matrix(c, seed=3))
    assert not torch.allclose(w, fume_membership_matrix(c, seed=4))
    assert torch.equal(fume_membership_matrix(c, seed=3, dtype=torch.float32), w.float())


def test_membership_matrix_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_classes"):
        fume_membership_matrix(1)
    with pytest.raises(TypeError, match="num_classes"):
        fume_membership_matrix(3.0)
    with pytest.raises(ValueError, match="seed"):
        fume_membership_matrix(3, seed=-1)
    with pytest.raises(TypeError, match="dtype"):
        fume_membership_matrix(3, dtype=torch.float16)


def test_membership_matches_loop_and_normalize_option():
    c, n = 7, 9
    w = fume_membership_matrix(c, seed=0)
    z = _unit_rows(n, c, seed=1)
    got = fume_membership(z, w)
    zl, wl = z.tolist(), w.tolist()
    want = [[max(0.0, sum(zl[i][l] * wl[l][k] for l in range(c))) for k in range(c)] for i in range(n)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-14, atol=1e-15)
    assert float(got.min()) >= 0.0 and float(got.max()) <= 1.0 + 1e-15
    raw = 3.0 * z
    torch.testing.assert_close(fume_membership(raw, w, normalize=True), got, rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="weight"):
        fume_membership(z, w[:5])
    with pytest.raises(TypeError, match="weight"):
        fume_membership(z, w.float())


# ---------------------------------------------------------------------------------------------
# Credibilities


def test_training_credibility_hand_computed():
    m = torch.tensor([[0.9, 0.3, 0.1], [0.9, 0.3, 0.1], [0.2, 0.2, 0.7]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 1])
    want = torch.tensor(
        [
            [0.8, 0.2, 0.1],  # label 0: (0.9+1-0.3)/2, (0.3+1-0.9)/2, (0.1+1-0.9)/2
            [0.8, 0.2, 0.4],  # label 1: (0.9+1-0.3)/2, (0.3+1-0.9)/2, (0.1+1-0.3)/2
            [0.5, 0.25, 0.75],  # label 1: (0.2+1-0.2)/2, (0.2+1-0.7)/2, (0.7+1-0.2)/2
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(fume_training_credibility(m, labels), want, rtol=0, atol=1e-15)
    # inference credibility of the same rows (eq. 2): against the best other class
    want_c = torch.tensor(
        [[0.8, 0.2, 0.1], [0.8, 0.2, 0.1], [0.25, 0.25, 0.75]], dtype=torch.float64
    )
    torch.testing.assert_close(fume_credibility(m), want_c, rtol=0, atol=1e-15)


def test_credibilities_match_loops():
    n, c = 11, 6
    m = fume_membership(_unit_rows(n, c, seed=2), fume_membership_matrix(c, seed=1))
    labels = _labels(n, c, seed=3)
    ml, ll = m.tolist(), labels.tolist()
    r_want, c_want = [], []
    for i in range(n):
        lab = ll[i]
        r_row, c_row = [], []
        for k in range(c):
            best_other = max(ml[i][q] for q in range(c) if q != k)
            c_row.append((ml[i][k] + 1 - best_other) / 2)
            r_row.append((ml[i][k] + 1 - (best_other if k == lab else ml[i][lab])) / 2)
        r_want.append(r_row)
        c_want.append(c_row)
    r_want, c_want = (torch.tensor(w, dtype=torch.float64) for w in (r_want, c_want))
    torch.testing.assert_close(fume_training_credibility(m, labels), r_want, rtol=0, atol=1e-15)
    torch.testing.assert_close(fume_credibility(m), c_want, rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# L_fml


def _fml_oracle(memberships, labels):
    total = 0.0
    for m in memberships:
        ml = m.tolist()
        n, c = len(ml), len(ml[0])
        acc = 0.0
        for i in range(n):
            lab = int(labels[i])
            sq = 0.0
            for k in range(c):
                other = max(ml[i][q] for q in range(c) if q != k) if k == lab else ml[i][lab]
                r = (ml[i][k] + 1 - other) / 2
                sq += (r - (1.0 if k == lab else 0.0)) ** 2
            acc += math.sqrt(sq)
        total += acc / n
    return total


@pytest.mark.parametrize("n_modalities, n, c", [(2, 7, 5), (3, 13, 10)])
def test_fml_loss_matches_loop(n_modalities, n, c):
    w = fume_membership_matrix(c, seed=5)
    ms = [fume_membership(_unit_rows(n, c, seed=10 + j), w) for j in range(n_modalities)]
    labels = _labels(n, c, seed=6)
    got = fume_fml_loss(ms, labels)
    assert got.item() == pytest.approx(_fml_oracle(ms, labels), rel=1e-13)


def test_fml_loss_gradient_finite_at_perfect_prediction():
    # m = one-hot(label) gives r = y exactly: ‖r − y‖ = 0, where sqrt-of-sum would give NaN.
    labels = torch.tensor([2, 0, 1])
    m = torch.nn.functional.one_hot(labels, 3).double().requires_grad_()
    loss = fume_fml_loss([m, m], labels)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.isfinite(m.grad).all()


# ---------------------------------------------------------------------------------------------
# L_cl


def _cl_oracle(features, tau, exclude_self):
    zs = [f.tolist() for f in features]
    n_mod, n = len(zs), len(zs[0])
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))
    total = 0.0
    for j in range(n_mod):
        for i in range(n):
            num = den = 0.0
            for v in range(n_mod):
                for t in range(n):
                    if exclude_self and v == j and t == i:
                        continue
                    term = math.exp(dot(zs[v][t], zs[j][i]) / tau)
                    den += term
                    if t == i:
                        num += term
            total += math.log(num / den)
    return -total / n


@pytest.mark.parametrize("exclude_self", [False, True])
@pytest.mark.parametrize("n_modalities, n, tau", [(2, 7, 1.0), (3, 9, 0.5), (2, 16, 0.2)])
def test_consistency_loss_matches_loop(exclude_self, n_modalities, n, tau):
    feats = [_unit_rows(n, 5, seed=20 + j) for j in range(n_modalities)]
    got = fume_consistency_loss(feats, tau=tau, exclude_self=exclude_self)
    assert got.item() == pytest.approx(_cl_oracle(feats, tau, exclude_self), rel=1e-12)


def test_consistency_loss_exclude_self_equals_released_code_for_two_modalities():
    """The released `consistency_Learning` (2 modalities, self term dropped; its loss1 + loss2
    over the 2N anchors is the paper's (1/N)Σ_j Σ_i normalisation)."""
    n, tau = 10, 1.0
    fea = [_unit_rows(n, 8, seed=31), _unit_rows(n, 8, seed=32)]
    all_fea = torch.cat(fea)
    sim = torch.exp(all_fea @ all_fea.T / tau)
    sim = sim - torch.diag(torch.diag(sim))
    sim_sum1 = sum(sim[:, v * n:(v + 1) * n] for v in range(2))
    diag1 = torch.cat([torch.diag(sim_sum1[v * n:(v + 1) * n]) for v in range(2)])
    loss1 = -(diag1 / sim.sum(1)).log().mean()
    sim_sum2 = sum(sim[v * n:(v + 1) * n] for v in range(2))
    diag2 = torch.cat([torch.diag(sim_sum2[:, v * n:(v + 1) * n]) for v in range(2)])
    loss2 = -(diag2 / sim.sum(1)).log().mean()
    released = (loss1 + loss2).item()
    assert fume_consistency_loss(fea, tau=tau, exclude_self=True).item() == pytest.approx(released, rel=1e-13)
    assert fume_consistency_loss(fea, tau=tau, exclude_self=False).item() != pytest.approx(released, rel=1e-6)


def test_fume_loss_composition_and_gradcheck():
    n, c = 6, 5
    w = fume_membership_matrix(c, seed=8)
    labels = _labels(n, c, seed=9)
    feats = [_unit_rows(n, c, seed=40 + j) for j in range(2)]
    got = fume_loss(feats, labels, w, alpha=0.5, exclude_self=True)
    want = _fml_oracle([fume_membership(f, w) for f in feats], labels) + 0.5 * _cl_oracle(feats, 1.0, True)
    assert got.item() == pytest.approx(want, rel=1e-13)
    leaves = tuple(f.clone().requires_grad_() for f in feats)
    assert torch.autograd.gradcheck(
        lambda a, b: fume_loss([a, b], labels, w, alpha=0.5), leaves, eps=1e-6, atol=1e-6
    )


def test_fume_loss_float32_close_to_float64():
    n, c = 64, 10
    w = fume_membership_matrix(c, seed=2)
    labels = _labels(n, c, seed=3)
    feats = [_unit_rows(n, c, seed=50 + j, dtype=torch.float32) for j in range(2)]
    got = fume_loss(feats, labels, w.float(), alpha=1.0)
    ref = fume_loss([f.double() for f in feats], labels, w.float().double(), alpha=1.0)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Decision and cross-modal uncertainty


def test_decision_uncertainty_hand_values():
    c = torch.tensor(
        [[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0]], dtype=torch.float64
    )
    got = fume_decision_uncertainty(c)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 0.25], dtype=torch.float64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decision_uncertainty_matches_scipy_entr(dtype):
    g = torch.Generator().manual_seed(60)
    c = torch.rand(17, 7, generator=g, dtype=torch.float64)
    c[0, 0], c[1, 3], c[2, :] = 0.0, 1.0, 1.0
    c = c.to(dtype)
    cn = c.double().numpy()
    want = (scipy.special.entr(cn) + scipy.special.entr(1 - cn)).sum(1) / (7 * math.log(2))
    got = fume_decision_uncertainty(c)
    assert got.dtype == dtype
    rtol, atol = (1e-6, 1e-7) if dtype == torch.float32 else (1e-14, 1e-15)
    torch.testing.assert_close(got.double(), torch.from_numpy(want), rtol=rtol, atol=atol)


def test_decision_uncertainty_gradient_interior_and_boundaries():
    c = torch.tensor([[0.3, 0.0, 1.0, 0.8]], dtype=torch.float64, requires_grad=True)
    fume_decision_uncertainty(c).sum().backward()
    assert torch.isfinite(c.grad).all()
    # interior: dH2/dc = ln((1 − c)/c), over C ln 2
    for k in (0, 3):
        x = c[0, k].item()
        assert c.grad[0, k].item() == pytest.approx(math.log((1 - x) / x) / (4 * math.log(2)), rel=1e-12)
    # [choice] zero slope at the ends
    assert c.grad[0, 1].item() == 0.0 and c.grad[0, 2].item() == 0.0


def test_uncertainty_pipeline_no_nan_when_z_is_a_class_direction():
    # z equal to a column of W makes the memberships one-hot: credibilities hit 0 and 1.
    c = 5
    w = fume_membership_matrix(c, seed=11)
    z = torch.stack([w[:, 2], w[:, 0], torch.nn.functional.normalize(torch.ones(c, dtype=torch.float64), dim=0)])
    z.requires_grad_()
    cred = fume_credibility(fume_membership(z, w))
    u = fume_decision_uncertainty(cred)
    u.sum().backward()
    assert torch.isfinite(u).all() and torch.isfinite(z.grad).all()
    assert u[0].item() == pytest.approx(0.0, abs=1e-12)


def test_decision_uncertainty_range_checks():
    slightly = torch.tensor([[1.0 + 2e-16, 0.5]], dtype=torch.float64)
    assert fume_decision_uncertainty(slightly).item() == pytest.approx(0.5, rel=1e-15)
    with pytest.raises(ValueError, match="c must lie"):
        fume_decision_uncertainty(torch.tensor([[1.5, 0.5]], dtype=torch.float64))
    with pytest.raises(ValueError, match="c must lie"):
        fume_decision_uncertainty(torch.tensor([[-0.1, 0.5]], dtype=torch.float64))


def test_cross_modal_uncertainty():
    u1 = torch.tensor([0.2, 0.0, 1.0, 0.7], dtype=torch.float64)
    u2 = torch.tensor([0.5, 0.3, 0.1, 1.0], dtype=torch.float64)
    got = fume_cross_modal_uncertainty(u1, u2)
    torch.testing.assert_close(got, torch.tensor([0.6, 0.3, 1.0, 1.0], dtype=torch.float64), rtol=0, atol=1e-15)
    assert bool((got >= torch.maximum(u1, u2)).all())
    g = torch.Generator().manual_seed(70)
    uq = torch.rand(4, generator=g, dtype=torch.float64)
    ug = torch.rand(6, generator=g, dtype=torch.float64)
    pair = fume_cross_modal_uncertainty(uq, ug, pairwise=True)
    want = [[1 - (1 - uq[i].item()) * (1 - ug[j].item()) for j in range(6)] for i in range(4)]
    torch.testing.assert_close(pair, torch.tensor(want, dtype=torch.float64), rtol=1e-15, atol=1e-15)
    with pytest.raises(ValueError, match="u2"):
        fume_cross_modal_uncertainty(uq, ug)


# ---------------------------------------------------------------------------------------------
# Validation


def test_fume_rejects_bad_inputs():
    n, c = 5, 4
    w = fume_membership_matrix(c)
    feats = [_unit_rows(n, c, seed=1), _unit_rows(n, c, seed=2)]
    labels = _labels(n, c, seed=3)
    with pytest.raises(ValueError, match="labels"):
        fume_loss(feats, torch.tensor([0, 1, 2, 3, 4]), w, alpha=1.0)
    with pytest.raises(TypeError, match="labels"):
        fume_loss(feats, labels.double(), w, alpha=1.0)
    with pytest.raises(ValueError, match="labels"):
        fume_fml_loss([fume_membership(feats[0], w)], labels[:3])
    with pytest.raises(ValueError, match="features"):
        fume_consistency_loss(feats[:1])
    with pytest.raises(TypeError, match="features"):
        fume_consistency_loss(feats[0])
    with pytest.raises(ValueError, match=r"features\[1\]"):
        fume_consistency_loss([feats[0], feats[1][:3]])
    with pytest.raises(TypeError, match=r"features\[1\]"):
        fume_consistency_loss([feats[0], feats[1].float()])
    with pytest.raises(ValueError, match="tau"):
        fume_consistency_loss(feats, tau=-1.0)
    with pytest.raises(TypeError, match="exclude_self"):
        fume_consistency_loss(feats, exclude_self=1)
    with pytest.raises(ValueError, match="alpha"):
        fume_loss(feats, labels, w, alpha=-1.0)
    bad = feats[0].clone()
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"features\[0\]"):
        fume_loss([bad, feats[1]], labels, w, alpha=1.0)
