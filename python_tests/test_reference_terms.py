"""The float64 reference against independent oracles (issue "Foundation", item 4).

Oracles: torch.distributions (Dirichlet KL, mean, variance), Monte-Carlo, torch.logdet of the
explicit Fisher matrix, and mpmath at 50 digits evaluating the textbook formulas of SPEC §2
(which need no stability tricks at that precision).
"""

from __future__ import annotations

import math

import mpmath as mp
import pytest
import torch
from torch.distributions import Dirichlet, kl_divergence

from conftest import hard_pairs, random_pairs
from evidential_ops import reference as R
from evidential_ops.config import EVIDENCE_KINDS, TERMS

mp.mp.dps = 50


def moderate_alpha(k: int, gen, high: float = 30.0) -> torch.Tensor:
    """α in [1, high] with a larger diagonal (the positive), float64."""
    a = 1.0 + (high - 1.0) * torch.rand(k, k, dtype=torch.float64, generator=gen) ** 2
    return a + torch.diag(high * torch.rand(k, dtype=torch.float64, generator=gen))


def random_scale(k: int, gen) -> torch.Tensor:
    c = torch.rand(k, dtype=torch.float64, generator=gen)
    c[0], c[-1] = 0.0, 1.0  # both ends of [0, 1]: "noisy" (all-zero target) and plain one-hot
    return c


# ---------------------------------------------------------------- oracles from torch.distributions


def test_kl_matches_torch_distributions(gen):
    k = 9
    alpha = moderate_alpha(k, gen)
    c = random_scale(k, gen)
    kl = R.row_terms(alpha, c, ["kl"])["kl"]
    eye = torch.eye(k, dtype=torch.float64)
    alpha_tilde = c[:, None] * eye + (1 - c[:, None] * eye) * alpha  # SPEC §2.2: t + (1 − t)α
    expected = kl_divergence(Dirichlet(alpha_tilde), Dirichlet(torch.ones_like(alpha_tilde)))
    torch.testing.assert_close(kl, expected, rtol=1e-11, atol=1e-11)


def test_mse_matches_dirichlet_mean_and_variance(gen):
    k = 11
    alpha = moderate_alpha(k, gen)
    c = random_scale(k, gen)
    mse = R.row_terms(alpha, c, ["mse"])["mse"]
    d = Dirichlet(alpha)
    target = c[:, None] * torch.eye(k, dtype=torch.float64)
    # E‖t − p‖² = Σ_j (t_j − E p_j)² + Var p_j  (Sensoy et al.; DUQ eq. 6)
    expected = ((target - d.mean) ** 2 + d.variance).sum(1)
    torch.testing.assert_close(mse, expected, rtol=1e-12, atol=1e-14)


def test_fmse_matches_dirichlet_moments_times_trigamma(gen):
    k = 10
    alpha = moderate_alpha(k, gen)
    c = random_scale(k, gen)
    fmse = R.row_terms(alpha, c, ["fmse"])["fmse"]
    d = Dirichlet(alpha)
    target = c[:, None] * torch.eye(k, dtype=torch.float64)
    trig = torch.tensor([[float(mp.polygamma(1, float(a))) for a in row] for row in alpha], dtype=torch.float64)
    expected = (((target - d.mean) ** 2 + d.variance) * trig).sum(1)
    torch.testing.assert_close(fmse, expected, rtol=1e-12, atol=1e-14)


def test_risk_matches_monte_carlo_expected_cross_entropy(gen):
    """risk = E_{p ~ Dir(α)}[−c·log p_target] (TCL eq. 7), estimated by sampling."""
    k = 6
    alpha = moderate_alpha(k, gen, high=8.0)
    c = random_scale(k, gen)
    risk = R.row_terms(alpha, c, ["risk"])["risk"]
    torch.manual_seed(1234)
    n = 200_000
    samples = Dirichlet(alpha).sample((n,))  # (n, K, K)
    neg_log_target = -c * torch.log(samples.diagonal(dim1=1, dim2=2))  # (n, K)
    mc_mean = neg_log_target.mean(0)
    standard_error = neg_log_target.std(0) / math.sqrt(n)
    assert torch.all((risk - mc_mean).abs() <= 5 * standard_error + 1e-12), (risk, mc_mean, standard_error)


# ---------------------------------------------------------------- log-determinant of the Fisher matrix


def test_logdet_matches_torch_logdet_of_explicit_fisher(gen):
    k = 7
    alpha = moderate_alpha(k, gen)
    logdet = R.row_terms(alpha, None, ["logdet"])["logdet"]
    trig = torch.polygamma(1, alpha)
    fisher = torch.diag_embed(trig) - torch.polygamma(1, alpha.sum(1))[:, None, None]
    torch.testing.assert_close(logdet, torch.logdet(fisher), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("scale", [1e2, 1e4, 1e6, 1e8])
def test_logdet_stable_for_huge_alpha_against_mpmath_determinant(gen, scale):
    """SPEC §2.5: float32 ≤ 1e-4 and the float64 reference much better, for α up to 1e8, where the
    published I-EDL formula returns −inf/NaN (the naive second log cancels)."""
    k = 5
    alpha = 1.0 + scale * torch.rand(k, k, dtype=torch.float64, generator=gen)
    logdet = R.row_terms(alpha, None, ["logdet"])["logdet"]
    for i in range(k):
        a = [mp.mpf(float(v)) for v in alpha[i]]
        trig_s = mp.polygamma(1, sum(a))
        m = mp.matrix(k, k)
        for r in range(k):
            for col in range(k):
                m[r, col] = (mp.polygamma(1, a[r]) if r == col else 0) - trig_s
        expected = mp.log(mp.det(m))
        assert abs(float(logdet[i]) - float(expected)) <= 1e-11 * abs(float(expected))
    logdet32 = R.row_terms(alpha.float(), None, ["logdet"])["logdet"]
    assert torch.isfinite(logdet32).all()
    torch.testing.assert_close(logdet32.double(), logdet, rtol=1e-4, atol=0)


# ---------------------------------------------------------------- mpmath: every term, hard regime


def mp_row_terms(s_row: list[float], target: int, c: float, evidence: str, tau: float) -> dict[str, mp.mpf]:
    """SPEC §2 written literally, at 50 digits (enough to absorb every cancellation)."""
    tau = mp.mpf(tau)
    def g(v):
        x = mp.mpf(v) / tau
        return {"exp": mp.exp(x), "relu": max(x, 0), "softplus": mp.log1p(mp.exp(x)), "exp_tanh": mp.exp(mp.tanh(x))}[evidence]
    alpha = [g(v) + 1 for v in s_row]
    n = len(alpha)
    t = [c if j == target else 0 for j in range(n)]
    strength = mp.fsum(alpha)
    tilde = [t[j] + (1 - t[j]) * alpha[j] for j in range(n)]
    strength_tilde = mp.fsum(tilde)
    p = [a / strength for a in alpha]
    trig = [mp.polygamma(1, a) for a in alpha]
    moment = [(t[j] - p[j]) ** 2 + p[j] * (1 - p[j]) / (strength + 1) for j in range(n)]
    return {
        "risk": c * (mp.digamma(strength) - mp.digamma(alpha[target])),
        "kl": mp.loggamma(strength_tilde) - mp.loggamma(n) - mp.fsum(mp.loggamma(a) for a in tilde)
        + mp.fsum((a - 1) * (mp.digamma(a) - mp.digamma(strength_tilde)) for a in tilde),
        "mse": mp.fsum(moment),
        "fmse": mp.fsum(moment[j] * trig[j] for j in range(n)),
        "logdet": mp.fsum(mp.log(v) for v in trig)
        + mp.log(1 - mp.polygamma(1, strength) * mp.fsum(1 / v for v in trig)),
    }


def assert_matches_mp(value: float, expected, term: str, rtol: float, what: str, floor: float = 1e-12):
    expected = float(expected)
    # SPEC §5: near-zero terms (risk/mse/fmse of a confident row) get an absolute floor;
    # kl/logdet are relative to max(|ref|, 1e-3).
    if term in ("kl", "logdet"):
        bound = rtol * max(abs(expected), 1e-3)
    else:
        bound = rtol * abs(expected) + floor
    assert abs(value - expected) <= bound, f"{what} {term}: {value!r} vs mpmath {expected!r}"


@pytest.mark.parametrize("k,n_checked", [(8, 8), (113, 5), (512, 3)])
def test_every_term_matches_mpmath_in_the_hard_regime(gen, k, n_checked):
    """τ = 0.05, positives and in-group negatives at cosine ≈ 0.99 (e ≈ 4e8): 1e-10 relative."""
    tau = 0.05
    x, y = hard_pairs(k, 64, dtype=torch.float64, generator=gen)
    s = x @ y.T
    c = torch.rand(k, dtype=torch.float64, generator=gen)
    c[::3] = 1.0
    rows, cols = R.loss_terms(s, evidence="exp", tau=tau, target_scale=c)
    picked = torch.randperm(k, generator=gen)[:n_checked].tolist()
    for i in picked:
        expected = mp_row_terms(s[i].tolist(), i, float(c[i]), "exp", tau)
        for term in TERMS:
            assert_matches_mp(float(rows[term][i]), expected[term], term, 1e-10, f"row {i}")
        expected = mp_row_terms(s[:, i].tolist(), i, float(c[i]), "exp", tau)
        for term in TERMS:
            assert_matches_mp(float(cols[term][i]), expected[term], term, 1e-10, f"col {i}")


@pytest.mark.parametrize("evidence,tau", [("exp", 0.01), ("relu", 1.0), ("relu", 0.02), ("softplus", 0.05), ("exp_tanh", 0.1)])
def test_every_evidence_kind_matches_mpmath(gen, evidence, tau):
    k = 13
    x, y = random_pairs(k, 24, dtype=torch.float64, generator=gen, positive_cos=0.9)
    s = x @ y.T
    c = random_scale(k, gen)
    rows, cols = R.loss_terms(s, evidence=evidence, tau=tau, target_scale=c)
    for i in (0, 5, k - 1):
        for direction, values, line in (("row", rows, s[i]), ("col", cols, s[:, i])):
            expected = mp_row_terms(line.tolist(), i, float(c[i]), evidence, tau)
            for term in TERMS:
                assert_matches_mp(float(values[term][i]), expected[term], term, 1e-10, f"{evidence} {direction} {i}")


# ---------------------------------------------------------------- special functions


GRID = [1.0, 1.0001, 1.4616, 2.5, 6.0, 9.999, 10.0, 10.5, 19.9, 29.9, 30.0, 31.0, 100.0, 1e3, 1e5, 1e8, 4.9e8, 1e12, 1e20]


@pytest.mark.parametrize(
    "name,fn,oracle",
    [
        ("trigamma", R.trigamma, lambda v: mp.polygamma(1, v)),
        ("log_trigamma", R.log_trigamma, lambda v: mp.log(mp.polygamma(1, v))),
        ("kl_h", R.kl_h, lambda v: (v - 1) * mp.digamma(v) - mp.loggamma(v) - v),
        ("r", R.inverse_trigamma_remainder, lambda v: 1 / mp.polygamma(1, v) - v + mp.mpf(1) / 2),
    ],
)
def test_special_functions_match_mpmath(name, fn, oracle):
    mp.mp.dps = 80  # r(1e20) ≈ 1e-21 is a difference of two 1e20-sized numbers
    try:
        values = fn(torch.tensor(GRID, dtype=torch.float64)).tolist()
        for v, got in zip(GRID, values):
            expected = float(oracle(mp.mpf(v)))
            assert abs(got - expected) <= 1e-11 * abs(expected), f"{name}({v}) = {got!r}, mpmath {expected!r}"
    finally:
        mp.mp.dps = 50


@pytest.mark.parametrize("r", [1e-3, 1.0, 7.0, 511.0, 1e6])
def test_digamma_difference_matches_mpmath(r):
    a = torch.tensor(GRID, dtype=torch.float64)
    got = R.digamma_difference(a, torch.full_like(a, r)).tolist()
    for v, value in zip(GRID, got):
        expected = float(mp.digamma(mp.mpf(v) + r) - mp.digamma(mp.mpf(v)))
        assert abs(value - expected) <= 1e-11 * abs(expected), (v, r, value, expected)


def test_special_functions_have_finite_gradients_at_branch_points():
    """The unselected branch of each `where` must not leak NaN/Inf into the backward pass."""
    x = torch.tensor(GRID, dtype=torch.float64, requires_grad=True)
    total = (R.trigamma(x) + R.kl_h(x) + R.inverse_trigamma_remainder(x) + R.digamma_difference(x, x)).sum()
    (grad,) = torch.autograd.grad(total, x)
    assert torch.isfinite(grad).all()


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("evidence", EVIDENCE_KINDS)
@pytest.mark.parametrize("term", TERMS)
def test_gradcheck_each_term_float64(gen, evidence, term):
    k, d = 5, 3
    x, y = random_pairs(k, d, dtype=torch.float64, generator=gen, positive_cos=0.8)
    x.requires_grad_()
    y.requires_grad_()
    c = random_scale(k, gen)
    tau = {"exp": 0.3, "relu": 0.2, "softplus": 0.25, "exp_tanh": 0.1}[evidence]

    def loss(x, y):
        return R.evidential_loss(x, y, evidence=evidence, tau=tau, weights={term: 1.0}, target_scale=c, reduction="sum")

    assert torch.autograd.gradcheck(loss, (x, y), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("direction", ["rows", "cols", "both"])
def test_gradcheck_all_terms_normalize_and_directions(gen, direction):
    k, d = 7, 5
    x = torch.randn(k, d, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randn(k, d, dtype=torch.float64, generator=gen, requires_grad=True)
    weights = {"risk": 1.0, "kl": 0.3, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}

    def loss(x, y):
        return R.evidential_loss(x, y, tau=0.2, weights=weights, direction=direction, normalize=True)

    assert torch.autograd.gradcheck(loss, (x, y), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_hard_regime_gradients_are_finite_and_match_float32_reference(gen):
    """The float32 reference (the plain-PyTorch baseline) stays finite and close in the hard regime."""
    x, y = hard_pairs(113, 203, dtype=torch.float32, generator=gen)
    weights = {"risk": 1.0, "kl": 0.1, "mse": 1.0, "fmse": 1.0, "logdet": -0.01}
    grads = []
    for dtype in (torch.float64, torch.float32):
        xx = x.detach().clone().requires_grad_()
        loss = R.evidential_loss(xx, y, weights=weights, compute_dtype=dtype)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(xx.grad).all()
        grads.append(xx.grad.double())
    error = (grads[1] - grads[0]).abs().max() / grads[0].abs().max()
    assert error < 1e-3, error


def test_logdet_gradient_survives_where_alpha_squared_overflows():
    """At s/τ ≈ 500 (τ = 1/500, positives at cosine ≈ 1) α² overflows double. The reference's
    ln ψ1 used to differentiate through ψ1' ≈ −1/α² (underflowed to 0) and returned a logdet
    gradient of 0 at the target; the stable form gives the finite-difference value (about
    −(1/τ)·(1 + 1/(2α)) per entry of the line's ln ψ1(α_y) + ln ψ1(S) terms)."""
    tau = 1.0 / 500
    s = torch.full((4, 4), 0.2, dtype=torch.float64)
    s.fill_diagonal_(0.999)
    s.requires_grad_()
    loss = R.evidential_loss_from_similarity(s, tau=tau, weights={"logdet": 1.0}, reduction="sum")
    (grad,) = torch.autograd.grad(loss, s)
    h = 1e-9
    bumped = s.detach().clone()
    bumped[1, 1] += h
    lowered = s.detach().clone()
    lowered[1, 1] -= h
    fd = (R.evidential_loss_from_similarity(bumped, tau=tau, weights={"logdet": 1.0}, reduction="sum")
          - R.evidential_loss_from_similarity(lowered, tau=tau, weights={"logdet": 1.0}, reduction="sum")) / (2 * h)
    assert float(grad[1, 1]) < -1000
    assert float(grad[1, 1]) == pytest.approx(float(fd), rel=1e-5)
