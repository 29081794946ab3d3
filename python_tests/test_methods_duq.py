"""DUQ method references (SPEC §3 "DUQ") against independent oracles.

Oracles: torch.nn.functional.cross_entropy for InfoNCE, explicit loops over indices for the
ISUM / distance / re-ranking formulas, torch.distributions for the Gaussian KL and sampling
statistics, gradcheck in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, kl_divergence

from evidential_ops.methods import (
    duq_distance_loss,
    duq_distance_matrix,
    duq_distance_uncertainty_loss,
    duq_gaussian_kl,
    duq_probabilistic_embeddings,
    duq_rerank,
    duq_similarity_loss,
)
from evidential_ops.reference.methods import duq_isum_loss, duq_total_loss


def _similarity(b: int, seed: int, dtype=torch.float64, n: int | None = None) -> torch.Tensor:
    n = b if n is None else n
    g = torch.Generator().manual_seed(seed)
    t = F.normalize(torch.randn(b, 24, generator=g, dtype=torch.float64), dim=1)
    v = torch.randn(n, 24, generator=g, dtype=torch.float64)
    v[: min(b, n)] += 1.2 * t[: min(b, n)]
    return (t @ F.normalize(v, dim=1).T).to(dtype)


def _gaussians(b: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(b, d, generator=g, dtype=torch.float64)
    log_sigma = 0.3 * torch.randn(b, d, generator=g, dtype=torch.float64) - 1.0
    return mu, log_sigma


def _sensoy_mse_rows(alpha: np.ndarray, target: np.ndarray) -> np.ndarray:
    out = []
    for i in range(alpha.shape[0]):
        strength = sum(alpha[i])
        acc = 0.0
        for j in range(alpha.shape[1]):
            p = alpha[i][j] / strength
            acc += (target[i][j] - p) ** 2 + p * (1 - p) / (strength + 1)
        out.append(acc)
    return np.array(out)


# ---------------------------------------------------------------------------------------------
# L_S and ISUM


@pytest.mark.parametrize("b, scale", [(7, 100.0), (113, 14.3)])
def test_similarity_loss_is_symmetric_cross_entropy(b, scale):
    s = _similarity(b, seed=b)
    target = torch.arange(b)
    want = 0.5 * (F.cross_entropy(scale * s, target) + F.cross_entropy(scale * s.T, target))
    assert duq_similarity_loss(s, logit_scale=scale).item() == pytest.approx(want.item(), rel=1e-13)


def test_similarity_loss_learned_scale_gets_gradient():
    s = _similarity(6, seed=1)
    scale = torch.tensor(20.0, dtype=torch.float64, requires_grad=True)
    duq_similarity_loss(s, logit_scale=scale).backward()
    h = 1e-5
    fd = (duq_similarity_loss(s, logit_scale=20.0 + h) - duq_similarity_loss(s, logit_scale=20.0 - h)) / (2 * h)
    assert scale.grad.item() == pytest.approx(fd.item(), rel=1e-7)


@pytest.mark.parametrize("b", [7, 113])
def test_isum_loss_matches_loop(b):
    s = _similarity(b, seed=b + 1)
    alpha = np.maximum(s.numpy(), 0.0) + 1.0
    eye = np.eye(b)
    want = (_sensoy_mse_rows(alpha, eye).sum() + _sensoy_mse_rows(alpha.T, eye).sum()) / b
    assert duq_isum_loss(s).item() == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Probabilistic embeddings and distances


def test_probabilistic_embeddings_formula_and_reproducibility():
    mu, log_sigma = _gaussians(4, 5, seed=2)
    noise = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    z = duq_probabilistic_embeddings(mu, log_sigma, noise=noise)
    assert z.shape == (4, 3, 5)
    for i in range(4):
        for k in range(3):
            for d in range(5):
                want = mu[i, d].item() + math.exp(log_sigma[i, d].item()) * noise[i, k, d].item()
                assert z[i, k, d].item() == pytest.approx(want, rel=1e-15, abs=1e-15)
    a = duq_probabilistic_embeddings(mu, log_sigma, generator=torch.Generator().manual_seed(9))
    b = duq_probabilistic_embeddings(mu, log_sigma, generator=torch.Generator().manual_seed(9))
    c = duq_probabilistic_embeddings(mu, log_sigma, generator=torch.Generator().manual_seed(10))
    assert a.shape == (4, 7, 5) and torch.equal(a, b) and not torch.equal(a, c)


def test_probabilistic_embeddings_statistics():
    mu = torch.tensor([[0.5, -2.0, 0.0]], dtype=torch.float64)
    log_sigma = torch.tensor([[-1.0, 0.0, 0.7]], dtype=torch.float64)
    n = 8000
    z = duq_probabilistic_embeddings(mu, log_sigma, num_samples=n, generator=torch.Generator().manual_seed(4))[0]
    sigma = log_sigma.exp()[0]
    # 5-sigma bands on the sample mean and standard deviation of N(μ, e^{2σ})
    assert ((z.mean(0) - mu[0]).abs() < 5 * sigma / math.sqrt(n)).all()
    assert ((z.std(0) - sigma).abs() < 5 * sigma / math.sqrt(2 * n)).all()
    # and the gradient is the reparameterisation's: d z / d log_sigma = exp(σ)·ε
    ls = log_sigma.clone().requires_grad_()
    noise = torch.randn(1, 2, 3, dtype=torch.float64)
    duq_probabilistic_embeddings(mu, ls, noise=noise).sum().backward()
    torch.testing.assert_close(ls.grad, (sigma * noise.sum(1))[None, 0], rtol=1e-14, atol=0)


def _distance_oracle(zt: np.ndarray, zv: np.ndarray, diagonal_min: bool) -> np.ndarray:
    bt, bv = zt.shape[0], zv.shape[0]
    out = np.zeros((bt, bv))
    for i in range(bt):
        for j in range(bv):
            ds = []
            for m in range(zt.shape[1]):
                for n in range(zv.shape[1]):
                    a, b = zt[i, m], zv[j, n]
                    ds.append(1.0 - float(np.dot(a, b)) / (np.linalg.norm(a) * np.linalg.norm(b)))
            out[i, j] = min(ds) if (diagonal_min and i == j) else max(ds)
    return out


def test_distance_matrix_matches_loop_and_indexes_video_j():
    mu_t, ls_t = _gaussians(6, 8, seed=5)
    mu_v, ls_v = _gaussians(6, 8, seed=6)
    gen = torch.Generator().manual_seed(7)
    zt = duq_probabilistic_embeddings(mu_t, ls_t, num_samples=3, generator=gen)
    zv = duq_probabilistic_embeddings(mu_v, ls_v, num_samples=4, generator=gen)
    got = duq_distance_matrix(zt, zv)
    want = _distance_oracle(zt.numpy(), zv.numpy(), True)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-13, atol=1e-14)
    # The released code's bug (video i for every column) would give a different matrix.
    buggy = np.array([[_distance_oracle(zt[i:i + 1].numpy(), zv[i:i + 1].numpy(), i == j)[0, 0]
                       for j in range(6)] for i in range(6)])
    assert np.abs(buggy - want).max() > 1e-3


def test_distance_matrix_all_max_rectangular():
    gen = torch.Generator().manual_seed(8)
    zt = torch.randn(5, 3, 6, generator=gen, dtype=torch.float64)
    zv = torch.randn(9, 2, 6, generator=gen, dtype=torch.float64)
    got = duq_distance_matrix(zt, zv, diagonal_min=False)
    torch.testing.assert_close(got, torch.from_numpy(_distance_oracle(zt.numpy(), zv.numpy(), False)), rtol=1e-13, atol=1e-14)
    with pytest.raises(ValueError, match="diagonal_min"):
        duq_distance_matrix(zt, zv)


# ---------------------------------------------------------------------------------------------
# L_D, L_D^U, KL


def _distance_loss_oracle(d: np.ndarray, scale: float) -> float:
    b = d.shape[0]
    rows = sum(scale * d[i, i] - math.log(sum(math.exp(scale * d[i, j]) for j in range(b))) for i in range(b)) / b
    cols = sum(scale * d[i, i] - math.log(sum(math.exp(scale * d[j, i]) for j in range(b))) for i in range(b)) / b
    return 0.5 * (rows + cols)


def _example_distances(b: int, seed: int) -> torch.Tensor:
    mu_t, ls_t = _gaussians(b, 8, seed=seed)
    mu_v, ls_v = mu_t + 0.3 * _gaussians(b, 8, seed=seed + 1)[0], ls_t
    gen = torch.Generator().manual_seed(seed + 2)
    zt = duq_probabilistic_embeddings(mu_t, ls_t, num_samples=3, generator=gen)
    zv = duq_probabilistic_embeddings(mu_v, ls_v, num_samples=3, generator=gen)
    return duq_distance_matrix(zt, zv)


@pytest.mark.parametrize("b, scale", [(7, 10.0), (33, 100.0)])
def test_distance_loss_as_printed(b, scale):
    d = _example_distances(b, seed=b)
    got = duq_distance_loss(d, logit_scale=scale)
    assert got.item() == pytest.approx(_distance_loss_oracle(d.numpy(), scale), rel=1e-12)
    assert got.item() <= 0.0
    # Sign of eq. 12: a batch whose positives are nearer than its negatives scores lower.
    good = torch.full((b, b), 1.0, dtype=torch.float64).fill_diagonal_(0.1)
    bad = torch.full((b, b), 0.1, dtype=torch.float64).fill_diagonal_(1.0)
    assert duq_distance_loss(good, logit_scale=scale) < duq_distance_loss(bad, logit_scale=scale)


@pytest.mark.parametrize("b", [2, 7, 113])
def test_distance_uncertainty_loss_matches_loop(b):
    d = torch.rand(b, b, generator=torch.Generator().manual_seed(b), dtype=torch.float64) * 2.0
    d.fill_diagonal_(0.05)
    alpha = np.maximum(d.numpy(), 0.0) + 1.0
    target = 1.0 - np.eye(b)
    want = (_sensoy_mse_rows(alpha, target).sum() + _sensoy_mse_rows(alpha.T, target).sum()) / b
    assert duq_distance_uncertainty_loss(d).item() == pytest.approx(want, rel=1e-13)


def test_gaussian_kl_matches_torch_distributions():
    mu, log_sigma = _gaussians(9, 11, seed=12)
    want = kl_divergence(Normal(mu, log_sigma.exp()), Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum(1).mean()
    assert duq_gaussian_kl(mu, log_sigma).item() == pytest.approx(want.item(), rel=1e-13)
    zero = torch.zeros(3, 4, dtype=torch.float64)
    assert duq_gaussian_kl(zero, zero).item() == 0.0
    # σ = 1e-9: KL = ½(e^{2σ} − 1 − 2σ) ≈ σ² = 1e-18, digits the naive exp(2σ) − 1 − 2σ loses
    tiny = torch.full((1, 1), 1e-9, dtype=torch.float64)
    assert duq_gaussian_kl(torch.zeros(1, 1, dtype=torch.float64), tiny).item() == pytest.approx(1e-18, rel=1e-6, abs=0.0)


# ---------------------------------------------------------------------------------------------
# Total loss and re-ranking


def test_total_loss_from_independent_pieces():
    b = 9
    s = _similarity(b, seed=20)
    mu_t, ls_t = _gaussians(b, 6, seed=21)
    mu_v, ls_v = _gaussians(b, 6, seed=22)
    d = _example_distances(b, seed=23)
    scale, alpha, beta = 50.0, 0.1, 1e-2
    got = duq_total_loss(s, d, mu_t, ls_t, mu_v, ls_v, logit_scale=scale, alpha=alpha, beta=beta)
    target = torch.arange(b)
    l_s = 0.5 * (F.cross_entropy(scale * s, target) + F.cross_entropy(scale * s.T, target)).item()
    a_s = np.maximum(s.numpy(), 0) + 1
    l_su = (_sensoy_mse_rows(a_s, np.eye(b)).sum() + _sensoy_mse_rows(a_s.T, np.eye(b)).sum()) / b
    a_d = np.maximum(d.numpy(), 0) + 1
    l_du = (_sensoy_mse_rows(a_d, 1 - np.eye(b)).sum() + _sensoy_mse_rows(a_d.T, 1 - np.eye(b)).sum()) / b
    l_d = _distance_loss_oracle(d.numpy(), scale)
    std = lambda m: Normal(torch.zeros_like(m), torch.ones_like(m))
    l_kl = (kl_divergence(Normal(mu_t, ls_t.exp()), std(mu_t)).sum(1).mean()
            + kl_divergence(Normal(mu_v, ls_v.exp()), std(mu_v)).sum(1).mean()).item()
    assert got.item() == pytest.approx(l_s + l_su + alpha * (l_d + l_du) + beta * l_kl, rel=1e-12)


def test_total_loss_gradcheck_through_embeddings():
    b, dim = 4, 5
    s0 = _similarity(b, seed=30)
    mu_t, ls_t = _gaussians(b, dim, seed=31)
    mu_v, ls_v = _gaussians(b, dim, seed=32)
    gen = torch.Generator().manual_seed(33)
    noise_t = torch.randn(b, 3, dim, generator=gen, dtype=torch.float64)
    noise_v = torch.randn(b, 3, dim, generator=gen, dtype=torch.float64)

    def total(s, mt, lt, mv, lv):
        zt = duq_probabilistic_embeddings(mt, lt, noise=noise_t)
        zv = duq_probabilistic_embeddings(mv, lv, noise=noise_v)
        d = duq_distance_matrix(zt, zv)
        return duq_total_loss(s, d, mt, lt, mv, lv, logit_scale=5.0, beta=0.1)

    leaves = tuple(x.clone().requires_grad_() for x in (s0, mu_t, ls_t, mu_v, ls_v))
    assert torch.autograd.gradcheck(total, leaves, eps=1e-6, atol=1e-6, fast_mode=True)


def test_total_loss_float32_close_to_float64():
    b = 32
    s = _similarity(b, seed=40, dtype=torch.float32)
    mu_t, ls_t = (x.float() for x in _gaussians(b, 16, seed=41))
    mu_v, ls_v = (x.float() for x in _gaussians(b, 16, seed=42))
    d = _example_distances(b, seed=43).float()
    got = duq_total_loss(s, d, mu_t, ls_t, mu_v, ls_v)
    ref = duq_total_loss(*(x.double() for x in (s, d, mu_t, ls_t, mu_v, ls_v)))
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)


def test_rerank_matches_loop():
    nq, ng = 5, 8
    s = _similarity(nq, seed=50, n=ng)
    d = torch.rand(nq, ng, generator=torch.Generator().manual_seed(51), dtype=torch.float64) * 2
    out = duq_rerank(s, d, gamma1=0.3, gamma2=0.7, reading="printed")
    sl, dl = s.tolist(), d.tolist()
    for i in range(nq):
        u_s = ng / sum(max(x, 0.0) + 1 for x in sl[i])
        u_d = ng / sum(max(x, 0.0) + 1 for x in dl[i])
        assert out.similarity_uncertainty[i].item() == pytest.approx(u_s, rel=1e-14)
        assert out.distance_uncertainty[i].item() == pytest.approx(u_d, rel=1e-14)
        for j in range(ng):
            want = math.exp(-0.3 * u_d) * (1 - dl[i][j]) * math.exp(-0.7 * u_s) * sl[i][j]
            assert out.similarity[i, j].item() == pytest.approx(want, rel=1e-13, abs=1e-15)


def test_rerank_candidate_and_nonnegative_readings_match_loop():
    nq, ng = 5, 8
    s = _similarity(nq, seed=52, n=ng)
    d = torch.rand(nq, ng, generator=torch.Generator().manual_seed(53), dtype=torch.float64) * 2
    sl, dl = s.tolist(), d.tolist()
    u_s = [ng / sum(max(x, 0.0) + 1 for x in row) for row in sl]
    u_d = [ng / sum(max(x, 0.0) + 1 for x in row) for row in dl]
    v_s = [nq / sum(max(sl[i][j], 0.0) + 1 for i in range(nq)) for j in range(ng)]  # each candidate's own
    v_d = [nq / sum(max(dl[i][j], 0.0) + 1 for i in range(nq)) for j in range(ng)]
    cand = duq_rerank(s, d, gamma1=0.3, gamma2=0.7, reading="candidate")
    flat = duq_rerank(s, d, gamma1=0.3, gamma2=0.7, reading="nonnegative")
    assert cand.reading == "candidate"
    for j in range(ng):
        assert cand.candidate_similarity_uncertainty[j].item() == pytest.approx(v_s[j], rel=1e-14)
        assert cand.candidate_distance_uncertainty[j].item() == pytest.approx(v_d[j], rel=1e-14)
    for i in range(nq):
        for j in range(ng):
            shifted = (1 - dl[i][j] / 2) * (1 + sl[i][j]) / 2
            want = math.exp(-0.3 * (u_d[i] + v_d[j])) * math.exp(-0.7 * (u_s[i] + v_s[j])) * shifted
            assert cand.similarity[i, j].item() == pytest.approx(want, rel=1e-13)
            want = math.exp(-0.3 * u_d[i]) * math.exp(-0.7 * u_s[i]) * shifted
            assert flat.similarity[i, j].item() == pytest.approx(want, rel=1e-13)


def test_printed_rerank_cannot_change_a_ranking_and_flips_signs():
    """Eq. 16 as printed ranks like (1 − D)∘s, and two negative factors make a positive score."""
    gen = torch.Generator().manual_seed(54)
    s = torch.rand(6, 9, generator=gen, dtype=torch.float64) * 2 - 1
    d = torch.rand(6, 9, generator=gen, dtype=torch.float64) * 2
    printed = duq_rerank(s, d, gamma1=5.0, gamma2=5.0, reading="printed").similarity
    assert torch.equal(printed.argsort(dim=1), ((1 - d) * s).argsort(dim=1))
    flipped = (s < 0) & (d > 1)
    assert bool(flipped.any()) and bool((printed[flipped] > 0).all())
    # The nonnegative reading keeps every factor >= 0: a worse s or D never raises the score.
    nonnegative = duq_rerank(s, d, reading="nonnegative").similarity
    assert bool((nonnegative >= 0).all())
    assert torch.equal(nonnegative.argsort(dim=1), ((1 - d / 2) * (1 + s)).argsort(dim=1))


def test_candidate_rerank_changes_a_ranking():
    # Query 0 sees candidates 0 and 1 at equal s and D; candidate 1 is similar to every other
    # query too (strong column evidence, low own u_s), so the candidate reading prefers it.
    s = torch.tensor([[0.5, 0.5], [0.0, 0.9], [0.0, 0.9]], dtype=torch.float64)
    d = torch.full((3, 2), 0.5, dtype=torch.float64)
    out = duq_rerank(s, d, gamma1=0.1, gamma2=1.0, reading="candidate")
    assert out.candidate_similarity_uncertainty[1] < out.candidate_similarity_uncertainty[0]
    assert out.similarity[0, 1] > out.similarity[0, 0]
    assert duq_rerank(s, d, reading="printed").similarity[0, 0] == duq_rerank(s, d, reading="printed").similarity[0, 1]


# ---------------------------------------------------------------------------------------------
# Validation


def test_duq_rejects_bad_inputs():
    s = _similarity(5, seed=60)
    mu, ls = _gaussians(5, 4, seed=61)
    with pytest.raises(ValueError, match="logit_scale"):
        duq_similarity_loss(s, logit_scale=0.0)
    with pytest.raises(ValueError, match="logit_scale"):
        duq_distance_loss(s, logit_scale=torch.tensor(-1.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="logit_scale"):
        duq_similarity_loss(s, logit_scale=torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="d"):
        duq_total_loss(s, s[:4, :4], mu, ls, mu, ls)
    with pytest.raises(ValueError, match="mu_video"):
        duq_total_loss(s, s, mu, ls, mu[:3], ls[:3])
    with pytest.raises(TypeError, match="log_sigma_text"):
        duq_total_loss(s, s, mu, ls.float(), mu, ls)
    with pytest.raises(ValueError, match="alpha"):
        duq_total_loss(s, s, mu, ls, mu, ls, alpha=-1)
    with pytest.raises(ValueError, match="log_sigma"):
        duq_gaussian_kl(mu, ls[:, :3])
    with pytest.raises(ValueError, match="noise"):
        duq_probabilistic_embeddings(mu, ls, noise=torch.randn(5, 3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="noise"):
        duq_probabilistic_embeddings(mu, ls, noise=torch.randn(5, 3, 4, dtype=torch.float64),
                                     generator=torch.Generator())
    with pytest.raises(ValueError, match="num_samples"):
        duq_probabilistic_embeddings(mu, ls, num_samples=0)
    with pytest.raises(ValueError, match="z_video"):
        duq_distance_matrix(torch.randn(5, 2, 4, dtype=torch.float64), torch.randn(5, 2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="gamma1"):
        duq_rerank(s, s, gamma1=-0.1)
    with pytest.raises(ValueError, match="d"):
        duq_rerank(s, s[:, :4])
    with pytest.raises(ValueError, match="reading must be one of"):
        duq_rerank(s, s, reading="paper")
    bad = s.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="s"):
        duq_isum_loss(bad)


@pytest.mark.parametrize("diagonal_min,b_v", [(True, 37), (False, 37), (False, 23)])
@pytest.mark.parametrize("strip_elements", [1, 7 * 5 * 37 * 3, 1 << 22])
def test_strip_distance_matrix_equals_the_cosine_tensor_form(diagonal_min, b_v, strip_elements):
    """Same D and the same gradients (float64) as duq_distance_matrix, for strips of 1, 3 and all
    text rows, square and rectangular. A strip's cosines are a product of other shapes, which the
    BLAS may sum in another order (seen on an AMD EPYC: 1 ulp apart; equal on an Intel Xeon): each
    cosine is within γ_D·‖t̂‖‖v̂‖ of the exact one in both (Higham §3.1), so the two D differ by at
    most 2γ_D·max‖t̂‖‖v̂‖ plus a rounding of 1 − cos each (u·|D|). The gradient of D_ij is −v̂ (or
    −t̂) of the attaining pair in both; only the order in which the B_v·K_p' (or B_t·K_p)
    contributions to a sample's gradient are summed differs: 2(n − 1)·u·Σ|t| (Higham §4.2) with
    |t| <= max|∂L/∂D|·‖v̂‖ <= 1 per entry."""
    from evidential_ops.methods.duq_distance_strips import duq_distance_matrix_strips

    g = torch.Generator().manual_seed(5)
    z_text = torch.randn(37, 7, 24, generator=g, dtype=torch.float64)
    z_video = torch.randn(b_v, 5, 24, generator=g, dtype=torch.float64)
    upstream = torch.rand(37, b_v, generator=g, dtype=torch.float64)
    leaves = [z_text.clone().requires_grad_(), z_video.clone().requires_grad_()]
    expected = duq_distance_matrix(*leaves, diagonal_min=diagonal_min)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    leaves = [z_text.clone().requires_grad_(), z_video.clone().requires_grad_()]
    got = duq_distance_matrix_strips(*leaves, diagonal_min=diagonal_min, strip_elements=strip_elements)
    got_grads = torch.autograd.grad(got, leaves, upstream)
    u, d = 2.0**-53, z_text.shape[-1]
    unit = [torch.nn.functional.normalize(z, dim=2).norm(dim=-1).max() for z in (z_text, z_video)]
    norms = unit[0] * unit[1]  # both forms take the cosines of the normalised samples
    cosine_bound = 2 * (d * u / (1 - d * u)) * float(norms)
    torch.testing.assert_close(got, expected, rtol=0, atol=cosine_bound + 2 * u * float(expected.abs().max()))
    n = max(37 * 7, b_v * 5)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=2 * n * 2.0**-53 * n)


def test_strip_distance_matrix_bad_input():
    from evidential_ops.methods.duq_distance_strips import duq_distance_matrix_strips

    z = torch.randn(6, 3, 8)
    with pytest.raises(ValueError, match="diagonal_min"):
        duq_distance_matrix_strips(z, torch.randn(5, 3, 8))
    with pytest.raises(ValueError, match="embedding size"):
        duq_distance_matrix_strips(z, torch.randn(6, 3, 9))
    with pytest.raises(TypeError, match="z_video"):
        duq_distance_matrix_strips(z, z.double())
    with pytest.raises(ValueError, match="strip_elements"):
        duq_distance_matrix_strips(z, z, strip_elements=0)


def _distances(b: int, seed: int) -> torch.Tensor:
    """D in [0, 2] like the max/min rule's, with exact zeros (relu's kink) on a few entries."""
    d = 2.0 * torch.rand(b, b, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    d[::5, ::3] = 0.0
    return d


@pytest.mark.parametrize("b", [2, 7, 113])
@pytest.mark.parametrize("strip_elements", [1, 3 * 113, 1 << 22])
def test_distance_losses_in_strips_equal_the_matrix_forms(b, strip_elements):
    """L_D and L_D^U in row strips of D (methods.duq_distance_losses) against the matrix forms, in
    float64, values and ∂/∂D (and ∂L_D/∂λ for a learned λ), strips of one row, three rows and all.
    Tolerances from the arithmetic, u = 2^-53:
    - L_D: each log-sum-exp sums B exponentials (reordered: 2B·u relative in the sum, so 2B·u
      absolute in its log) and the strip-wise column adds up to B logaddexps of values up to
      |lse|, u·(|lse| + 1) each: E = 4B·u·(max|lse| + 1) per lse, which bounds the value's error;
      ∂L/∂D_ij = (λ/2B)(2δ_ij − σ_row − σ_col) moves by (λ/2B)(σ_row + σ_col)(E + 2u), plus the
      roundings of the last products in each form (4u relative); ∂L/∂λ sums
      B² of D_ij·(∂L/∂D_ij)/λ: 2B²·u·Σ|D·∂L/∂D|/λ plus Σ D_ij·(that bound)/λ.
    - L_D^U: both forms are sums of B terms per line, every term of the elementwise form >= 0 and
      the closed form's S, Σα² float64 sums of B terms >= 1: 8(B + 2)·u·(v + 1) per line v;
      the gradient, c0 + c1·α_j + δ·c_y per line (SPEC in the module docstring), against the
      chain rule through p and S (a sum of B terms for ∂/∂S): 8(B + 2)·u times the sum of the
      absolute values of its pieces."""
    from evidential_ops.methods import duq_distance_loss_strips, duq_distance_uncertainty_loss_strips

    u = 2.0**-53
    d = _distances(b, seed=b)
    lam = torch.tensor(30.0, dtype=torch.float64)
    leaves = [d.clone().requires_grad_(), lam.clone().requires_grad_()]
    want = duq_distance_loss(leaves[0], logit_scale=leaves[1])
    want_d, want_lam = torch.autograd.grad(want, leaves)
    leaves = [d.clone().requires_grad_(), lam.clone().requires_grad_()]
    got = duq_distance_loss_strips(leaves[0], logit_scale=leaves[1], strip_elements=strip_elements)
    got_d, got_lam = torch.autograd.grad(got, leaves)
    got_d_distance = got_d
    z = lam * d
    row_lse, col_lse = torch.logsumexp(z, dim=1), torch.logsumexp(z, dim=0)
    e = 4 * b * u * (float(torch.cat([row_lse, col_lse]).abs().max()) + 1.0)
    assert abs(float(got - want)) <= e
    sigma = torch.exp(z - row_lse[:, None]) + torch.exp(z - col_lse[None, :])
    grad_bound = 30.0 / (2 * b) * (sigma * (e + 2 * u)) + 4 * u * want_d.abs()
    assert ((got_d - want_d).abs() <= grad_bound).all()
    lam_bound = (2 * b * b * u * (d * want_d).abs().sum() + (d * grad_bound).sum()) / 30.0
    assert abs(float(got_lam - want_lam)) <= float(lam_bound)

    leaf = d.clone().requires_grad_()
    want = duq_distance_uncertainty_loss(leaf)
    want_d, = torch.autograd.grad(want, leaf)
    leaf = d.clone().requires_grad_()
    got = duq_distance_uncertainty_loss_strips(leaf, strip_elements=strip_elements)
    got_d, = torch.autograd.grad(got, leaf)
    alpha = torch.relu(d) + 1.0
    pieces, values = torch.zeros_like(d), []
    for a, transpose in ((alpha, False), (alpha.T, True)):
        s = a.sum(dim=1, keepdim=True)
        p2 = (a * a).sum(dim=1, keepdim=True) / s**2
        diag = a.diagonal()[:, None]
        values.append((b - 1) - 2 * (1 - diag / s) + p2 + (1 - p2) / (s + 1))
        piece = (2 * diag / s**2 + 2 * p2 / (s + 1) + (1 + p2) / (s + 1) ** 2 + 2 * a / (s * (s + 1))
                 + 2 * torch.eye(b, dtype=d.dtype) / s)
        pieces += piece.T if transpose else piece
    value_bound = sum(float((8 * (b + 2) * u * (v + 1)).sum()) for v in values) / b
    assert abs(float(got - want)) <= value_bound
    assert ((got_d - want_d).abs() <= 8 * (b + 2) * u * pieces / b).all()

    # Both from one call (the training step's form): the same values, and one ∂(L_D + L_D^U)/∂D
    # that is the sum of the two alone, bitwise (each strip adds the same two parts to zeros in
    # the order autograd adds the two gradients: IEEE sums of the same operands).
    from evidential_ops.methods import duq_distance_losses_strips

    leaves = [d.clone().requires_grad_(), lam.clone().requires_grad_()]
    both = duq_distance_losses_strips(leaves[0], logit_scale=leaves[1], strip_elements=strip_elements)
    both_d, both_lam = torch.autograd.grad(both[0] + both[1], leaves)
    assert float(both[1]) == float(got)
    torch.testing.assert_close(both_d, got_d_distance + got_d, rtol=0, atol=0)
    torch.testing.assert_close(both_lam, got_lam, rtol=0, atol=0)


def test_distance_losses_in_strips_bad_input():
    from evidential_ops.methods import duq_distance_loss_strips, duq_distance_uncertainty_loss_strips

    d = _distances(4, seed=0)
    for fn in (duq_distance_loss_strips, duq_distance_uncertainty_loss_strips):
        with pytest.raises(ValueError, match="square"):
            fn(d[:3])
        with pytest.raises(ValueError, match="strip_elements"):
            fn(d, strip_elements=0)
    with pytest.raises(ValueError, match="logit_scale"):
        duq_distance_loss_strips(d, logit_scale=-1.0)
