"""TCL / TcVSE method references (SPEC §3 "TCL") against independent oracles.

Oracles: explicit Python loops over indices with math / mpmath (high precision, so they are
exact where float64 formulas would cancel), finite differences for the detach semantics.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from evidential_ops.methods import (
    evidential_beliefs,
    tcl_consistency_loss,
    tcl_ensemble_similarity,
    tcl_kl_weight,
)
from evidential_ops.reference.methods import tcl_inference, tcl_uncertainty_loss

# ---------------------------------------------------------------------------------------------
# Independent scalar evidence maps (SPEC §1 table), written with math, not torch.


def _evidence_scalar(s: float, kind: str, tau: float) -> float:
    x = s / tau
    if kind == "exp":
        return math.exp(x)
    if kind == "relu":
        return max(x, 0.0)
    if kind == "softplus":
        return math.log1p(math.exp(x)) if x < 30 else x + math.log1p(math.exp(-x))
    if kind == "exp_tanh":
        return math.exp(math.tanh(x))
    raise AssertionError(kind)


def _random_similarity(k: int, n: int, seed: int, dtype=torch.float64, d: int = 16) -> torch.Tensor:
    """Cosine similarities of random unit vectors, with the positives made more similar."""
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(k, d, generator=g, dtype=torch.float64), dim=1)
    y = torch.randn(n, d, generator=g, dtype=torch.float64)
    y[: min(k, n)] += 1.5 * x[: min(k, n)]
    y = torch.nn.functional.normalize(y, dim=1)
    return (x @ y.T).to(dtype)


def _beliefs_oracle(s, kind: str, tau: float, dim: int):
    rows, cols = len(s), len(s[0])
    e = [[_evidence_scalar(s[i][j], kind, tau) for j in range(cols)] for i in range(rows)]
    if dim == 1:
        strength = [sum(e[i][j] + 1.0 for j in range(cols)) for i in range(rows)]
        return [[e[i][j] / strength[i] for j in range(cols)] for i in range(rows)]
    strength = [sum(e[i][j] + 1.0 for i in range(rows)) for j in range(cols)]
    return [[e[i][j] / strength[j] for j in range(cols)] for i in range(rows)]


# ---------------------------------------------------------------------------------------------
# λ schedule


@pytest.mark.parametrize(
    "epoch, bert, expected",
    [
        (0, False, 0.0), (1, False, 0.005), (10, False, 0.05), (199, False, 0.995),
        (200, False, 1.0), (5000, False, 1.0),
        (0, True, 0.0), (10, True, 0.01), (999, True, 0.999), (1000, True, 1.0), (3000, True, 1.0),
    ],
)
def test_kl_weight_schedule(epoch, bert, expected):
    assert tcl_kl_weight(epoch, bert=bert) == pytest.approx(expected, rel=1e-15, abs=0.0)


def test_kl_weight_rejects_bad_arguments():
    with pytest.raises(ValueError, match="epoch"):
        tcl_kl_weight(-1)
    with pytest.raises(TypeError, match="epoch"):
        tcl_kl_weight(1.5)
    with pytest.raises(TypeError, match="epoch"):
        tcl_kl_weight(True)
    with pytest.raises(TypeError, match="bert"):
        tcl_kl_weight(3, bert="yes")


# ---------------------------------------------------------------------------------------------
# Beliefs


@pytest.mark.parametrize("kind, tau", [("exp", 0.05), ("relu", 0.1), ("softplus", 0.05), ("exp_tanh", 0.1)])
@pytest.mark.parametrize("dim", [0, 1])
def test_beliefs_match_loop_oracle(kind, tau, dim):
    s = _random_similarity(5, 9, seed=11)
    got = evidential_beliefs(s, evidence=kind, tau=tau, dim=dim)
    want = torch.tensor(_beliefs_oracle(s.tolist(), kind, tau, dim), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-300)
    # Σ_j b_ij + N/S_i = 1 (SPEC §1)
    n = s.shape[dim]
    lines = s.tolist() if dim == 1 else s.T.tolist()
    strength = torch.tensor(
        [sum(_evidence_scalar(v, kind, tau) + 1.0 for v in line) for line in lines], dtype=torch.float64
    )
    torch.testing.assert_close(got.sum(dim=dim) + n / strength, torch.ones_like(strength), rtol=1e-13, atol=1e-13)


def test_beliefs_do_not_overflow_in_float32_at_small_tau():
    # τ = 0.01: e = exp(100) exceeds float32's range; beliefs must stay finite and exact.
    s64 = _random_similarity(7, 7, seed=3)
    s64[0, 0] = 1.0
    s64[3, 3] = 0.999
    s32 = s64.float()
    for dim in (0, 1):
        got = evidential_beliefs(s32, evidence="exp", tau=0.01, dim=dim)
        assert got.dtype == torch.float32
        assert torch.isfinite(got).all()
        want = torch.tensor(_beliefs_oracle(s32.double().tolist(), "exp", 0.01, dim), dtype=torch.float64)
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=1e-30)


# ---------------------------------------------------------------------------------------------
# Step 1: L_u


def _risk_kl_oracle(alpha_row, target: int):
    """risk = ψ(S) − ψ(α_y) and KL(Dir(α̃) ‖ Dir(1)) by the textbook formula, in mpmath."""
    n = len(alpha_row)
    a = [mpmath.mpf(v) for v in alpha_row]
    risk = mpmath.digamma(sum(a)) - mpmath.digamma(a[target])
    at = [mpmath.mpf(1) if j == target else a[j] for j in range(n)]
    st = sum(at)
    kl = (
        mpmath.loggamma(st) - mpmath.loggamma(n) - sum(mpmath.loggamma(v) for v in at)
        + sum((v - 1) * (mpmath.digamma(v) - mpmath.digamma(st)) for v in at)
    )
    return risk, kl


def _alpha_from_mp(s_list, kind, tau):
    out = []
    for row in s_list:
        r = []
        for v in row:
            x = mpmath.mpf(v) / mpmath.mpf(tau)
            if kind == "exp":
                e = mpmath.exp(x)
            elif kind == "relu":
                e = max(x, mpmath.mpf(0))
            elif kind == "softplus":
                e = mpmath.log1p(mpmath.exp(x))
            else:
                e = mpmath.exp(mpmath.tanh(x))
            r.append(e + 1)
        out.append(r)
    return out


def _uncertainty_loss_oracle(s_a, s_b, kl_weight, kind, tau):
    with mpmath.workdps(50):
        alpha_a = _alpha_from_mp(s_a.tolist(), kind, tau)
        alpha_b = _alpha_from_mp(s_b.tolist(), kind, tau)
        k = len(alpha_a)
        rows, cols = [], []
        for i in range(k):
            risk, kl = _risk_kl_oracle(alpha_a[i], i)
            rows.append(float(risk + kl_weight * kl))
        for j in range(k):
            column = [alpha_b[i][j] for i in range(k)]
            risk, kl = _risk_kl_oracle(column, j)
            cols.append(float(risk + kl_weight * kl))
    return rows, cols


@pytest.mark.parametrize(
    "kind, tau, kl_weight, k",
    [("exp", 0.05, 0.05, 7), ("exp", 0.05, 1.0, 13), ("relu", 0.05, 0.3, 7), ("softplus", 0.1, 0.0, 7)],
)
def test_uncertainty_loss_matches_mpmath(kind, tau, kl_weight, k):
    s_a = _random_similarity(k, k, seed=21)
    s_b = _random_similarity(k, k, seed=22)
    rows, cols = _uncertainty_loss_oracle(s_a, s_b, kl_weight, kind, tau)
    got_rows, got_cols = tcl_uncertainty_loss(s_a, s_b, kl_weight=kl_weight, evidence=kind, tau=tau, reduction="none")
    torch.testing.assert_close(got_rows, torch.tensor(rows, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_cols, torch.tensor(cols, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    total = tcl_uncertainty_loss(s_a, s_b, kl_weight=kl_weight, evidence=kind, tau=tau)
    assert total.dtype == torch.float64 and total.dim() == 0
    assert total.item() == pytest.approx(sum(rows) / k + sum(cols) / k, rel=1e-10)


def test_uncertainty_loss_uses_rows_of_a_and_columns_of_b():
    # Model A only enters through its rows, model B only through its columns: swapping the
    # matrices and transposing must give the same total (rows of X = columns of Xᵀ).
    s_a = _random_similarity(9, 9, seed=5)
    s_b = _random_similarity(9, 9, seed=6)
    lam = tcl_kl_weight(40)
    forward = tcl_uncertainty_loss(s_a, s_b, kl_weight=lam)
    swapped = tcl_uncertainty_loss(s_b.T.contiguous(), s_a.T.contiguous(), kl_weight=lam)
    assert forward.item() == pytest.approx(swapped.item(), rel=1e-14)
    rows, cols = tcl_uncertainty_loss(s_a, s_b, kl_weight=lam, reduction="none")
    rows_only, _ = tcl_uncertainty_loss(s_a, s_a, kl_weight=lam, reduction="none")
    torch.testing.assert_close(rows, rows_only, rtol=0, atol=0)


def test_uncertainty_loss_small_tau_float64_exact_and_float32_refused():
    s_a = _random_similarity(7, 7, seed=8)
    s_b = _random_similarity(7, 7, seed=9)
    s_a[0, 0] = 0.99  # e = exp(99): beyond float32, fine in float64
    rows, cols = _uncertainty_loss_oracle(s_a, s_b, 0.5, "exp", 0.01)
    got_rows, got_cols = tcl_uncertainty_loss(s_a, s_b, kl_weight=0.5, tau=0.01, reduction="none")
    torch.testing.assert_close(got_rows, torch.tensor(rows, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got_cols, torch.tensor(cols, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="tau"):
        tcl_uncertainty_loss(s_a.float(), s_b.float(), kl_weight=0.5, tau=0.01)


def test_uncertainty_loss_float32_close_to_float64():
    s_a = _random_similarity(113, 113, seed=1)
    s_b = _random_similarity(113, 113, seed=2)
    lam = tcl_kl_weight(7)
    ref = tcl_uncertainty_loss(s_a, s_b, kl_weight=lam)
    got = tcl_uncertainty_loss(s_a.float(), s_b.float(), kl_weight=lam)
    assert got.dtype == torch.float32
    # the reference evaluated on the same rounded similarities (SPEC §5)
    ref_same_inputs = tcl_uncertainty_loss(s_a.float().double(), s_b.float().double(), kl_weight=lam)
    assert got.item() == pytest.approx(ref_same_inputs.item(), rel=1e-5)
    assert ref.item() == pytest.approx(ref_same_inputs.item(), rel=1e-4)


def test_uncertainty_loss_gradcheck():
    s_a = _random_similarity(5, 5, seed=31).requires_grad_()
    s_b = _random_similarity(5, 5, seed=32).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: tcl_uncertainty_loss(a, b, kl_weight=0.3, tau=0.1), (s_a, s_b), eps=1e-6, atol=1e-6
    )


# ---------------------------------------------------------------------------------------------
# Step 2: L_c


def _consistency_parts_oracle(s_a, s_b, kind, tau):
    k = len(s_a)
    ra, rb = _beliefs_oracle(s_a, kind, tau, 1), _beliefs_oracle(s_b, kind, tau, 1)
    ca, cb = _beliefs_oracle(s_a, kind, tau, 0), _beliefs_oracle(s_b, kind, tau, 0)
    rows = sum(abs(ra[i][j] - rb[i][j]) for i in range(k) for j in range(k)) / k**2
    cols = sum(abs(ca[i][j] - cb[i][j]) for i in range(k) for j in range(k)) / k**2
    return rows, cols


@pytest.mark.parametrize("kind, tau, k", [("exp", 0.05, 7), ("relu", 0.1, 6), ("exp", 0.05, 23)])
def test_consistency_loss_matches_loop_oracle(kind, tau, k):
    s_a = _random_similarity(k, k, seed=41)
    s_b = _random_similarity(k, k, seed=42)
    rows, cols = _consistency_parts_oracle(s_a.tolist(), s_b.tolist(), kind, tau)
    got = tcl_consistency_loss(s_a, s_b, evidence=kind, tau=tau)
    assert got.item() == pytest.approx(rows + cols, rel=1e-12)


def _central_difference(f, s, h=1e-6):
    grad = torch.zeros_like(s)
    base = s.tolist()
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            plus = [row[:] for row in base]
            minus = [row[:] for row in base]
            plus[i][j] += h
            minus[i][j] -= h
            grad[i, j] = (f(plus) - f(minus)) / (2 * h)
    return grad


def test_consistency_loss_detach_semantics():
    """A receives gradient only from the column term (B owns it), B only from the row term."""
    k, tau = 6, 0.1
    s_a = _random_similarity(k, k, seed=51)
    s_b = _random_similarity(k, k, seed=52)
    a = s_a.clone().requires_grad_()
    b = s_b.clone().requires_grad_()
    tcl_consistency_loss(a, b, tau=tau).backward()
    sb_list, sa_list = s_b.tolist(), s_a.tolist()
    grad_a = _central_difference(lambda m: _consistency_parts_oracle(m, sb_list, "exp", tau)[1], s_a)
    grad_b = _central_difference(lambda m: _consistency_parts_oracle(sa_list, m, "exp", tau)[0], s_b)
    torch.testing.assert_close(a.grad, grad_a, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(b.grad, grad_b, rtol=1e-5, atol=1e-9)
    # The un-detached gradient (both terms) is measurably different, so the check can fail.
    full_a = _central_difference(lambda m: sum(_consistency_parts_oracle(m, sb_list, "exp", tau)), s_a)
    assert (full_a - grad_a).abs().max() > 1e-4


def test_consistency_loss_parameters_of_each_model():
    """Two tiny linear 'models': each one's parameters get exactly the gradient of the
    direction the other model owns (naive e/S beliefs, written here with plain tensor ops)."""
    torch.manual_seed(0)
    tau = 0.1
    x = torch.nn.functional.normalize(torch.randn(7, 5, dtype=torch.float64), dim=1)
    y = torch.nn.functional.normalize(torch.randn(7, 5, dtype=torch.float64), dim=1)
    w_a = torch.eye(5, dtype=torch.float64).requires_grad_()
    w_b = (torch.eye(5, dtype=torch.float64) + 0.1 * torch.randn(5, 5, dtype=torch.float64)).requires_grad_()

    def naive_beliefs(s, dim):
        e = torch.exp(s / tau)
        return e / (e + 1).sum(dim=dim, keepdim=True)

    tcl_consistency_loss((x @ w_a) @ y.T, (x @ w_b) @ y.T, tau=tau).backward()
    got_a, got_b = w_a.grad.clone(), w_b.grad.clone()

    s_a, s_b = (x @ w_a) @ y.T, (x @ w_b) @ y.T
    cols_term = (naive_beliefs(s_a, 0) - naive_beliefs(s_b.detach(), 0)).abs().mean()
    rows_term = (naive_beliefs(s_a.detach(), 1) - naive_beliefs(s_b, 1)).abs().mean()
    want_a, = torch.autograd.grad(cols_term, w_a)
    want_b, = torch.autograd.grad(rows_term, w_b)
    torch.testing.assert_close(got_a, want_a, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(got_b, want_b, rtol=1e-12, atol=1e-15)
    # Without the detaches each model would also get the other direction's gradient.
    s_a, s_b = (x @ w_a) @ y.T, (x @ w_b) @ y.T
    undetached = (naive_beliefs(s_a, 1) - naive_beliefs(s_b, 1)).abs().mean() + (
        naive_beliefs(s_a, 0) - naive_beliefs(s_b, 0)
    ).abs().mean()
    wrong_a, = torch.autograd.grad(undetached, w_a)
    assert (wrong_a - want_a).abs().max() > 1e-6


def test_consistency_loss_float32_small_tau_finite():
    s_a = _random_similarity(9, 9, seed=61)
    s_b = _random_similarity(9, 9, seed=62)
    s_a[2, 2] = 1.0
    a = s_a.float().requires_grad_()
    got = tcl_consistency_loss(a, s_b.float(), tau=0.01)
    got.backward()
    assert torch.isfinite(got) and torch.isfinite(a.grad).all()
    rows, cols = _consistency_parts_oracle(s_a.float().double().tolist(), s_b.float().double().tolist(), "exp", 0.01)
    assert got.item() == pytest.approx(rows + cols, rel=1e-5)


def test_consistency_loss_zero_for_identical_models():
    s = _random_similarity(8, 8, seed=71)
    assert tcl_consistency_loss(s, s.clone()).item() == 0.0


# ---------------------------------------------------------------------------------------------
# Inference


def test_ensemble_and_inference_opinions():
    s_a = _random_similarity(5, 11, seed=81)
    s_b = _random_similarity(5, 11, seed=82)
    ens = tcl_ensemble_similarity(s_a, s_b)
    assert torch.equal(ens, s_a + s_b)
    out = tcl_inference(s_a, s_b, evidence="exp", tau=0.05)
    assert torch.equal(out.similarity, s_a + s_b)
    for s, opinion in ((s_a, out.opinion_a), (s_b, out.opinion_b)):
        lst = s.tolist()
        row_u = [11 / sum(_evidence_scalar(v, "exp", 0.05) + 1 for v in row) for row in lst]
        col_u = [5 / sum(_evidence_scalar(lst[i][j], "exp", 0.05) + 1 for i in range(5)) for j in range(11)]
        torch.testing.assert_close(opinion.row_uncertainty, torch.tensor(row_u, dtype=torch.float64), rtol=1e-12, atol=0)
        torch.testing.assert_close(opinion.col_uncertainty, torch.tensor(col_u, dtype=torch.float64), rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# Validation


def test_tcl_rejects_bad_inputs():
    s = _random_similarity(4, 4, seed=91)
    with pytest.raises(ValueError, match="s_b"):
        tcl_consistency_loss(s, _random_similarity(5, 5, seed=1))
    with pytest.raises(ValueError, match="s_a"):
        tcl_consistency_loss(_random_similarity(4, 5, seed=1), s)
    with pytest.raises(TypeError, match="s_b"):
        tcl_uncertainty_loss(s, s.float(), kl_weight=0.1)
    with pytest.raises(TypeError, match="s_a"):
        tcl_uncertainty_loss(s.half(), s.half(), kl_weight=0.1)
    with pytest.raises(ValueError, match="s_a"):
        tcl_uncertainty_loss(torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64), kl_weight=0.1)
    bad = s.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="s_a"):
        tcl_consistency_loss(bad, s)
    assert torch.isnan(tcl_consistency_loss(bad, s, check_finite=False))
    with pytest.raises(ValueError, match="tau"):
        tcl_consistency_loss(s, s, tau=0.0)
    with pytest.raises(ValueError, match="evidence"):
        tcl_consistency_loss(s, s, evidence="sigmoid")
    with pytest.raises(ValueError, match="kl_weight"):
        tcl_uncertainty_loss(s, s, kl_weight=-0.1)
    with pytest.raises(ValueError, match="reduction"):
        tcl_uncertainty_loss(s, s, kl_weight=0.1, reduction="sum")
    with pytest.raises(ValueError, match="s_b"):
        tcl_ensemble_similarity(s, _random_similarity(4, 3, seed=1))
    with pytest.raises(ValueError, match="dim"):
        evidential_beliefs(s, dim=2)


# ---------------------------------------------------------------------------------------------
# Step 2 from the embeddings, in row strips (no K×K matrix)


@pytest.mark.parametrize("kind,tau", [("exp", 0.05), ("exp", 0.01), ("relu", 0.1), ("softplus", 0.05),
                                      ("exp_tanh", 0.1)])
@pytest.mark.parametrize("rows_per_strip", [1, 7, 113])
def test_strip_consistency_equals_the_matrix_form(kind, tau, rows_per_strip):
    """Value and gradients of all four embeddings (the detach pattern included) equal the K×K
    form's in float64, for strips that do not divide K = 113, in the hard regime. Only the order
    of the sums differs (Higham §4.2: two orders of n terms differ by 2(n − 1)·u·Σ|t|). The value
    sums K² terms of size <= 2/K²: relative 1e-12 covers 2·K²·u. A gradient entry sums K terms
    ∂L/∂s_ij·y_jd with Σ_j |∂L/∂s_ij| <= 2/(K²τ) (|∂L/∂b| = 1/K², Σ_j b_ij <= 1, ∂b/∂s <= b/τ
    twice: the entry and the strength), themselves sums over K: 2·2(K − 1)·u·2/(K²τ)."""
    from conftest import hard_pairs, random_pairs

    from evidential_ops.methods import tcl_consistency_loss_from_embeddings

    g = torch.Generator().manual_seed(7)
    x_a, y_a = hard_pairs(113, 203, generator=g, dtype=torch.float64)
    x_b, y_b = random_pairs(113, 203, generator=g, dtype=torch.float64, positive_cos=0.8)
    leaves = [t.clone().requires_grad_() for t in (x_a, y_a, x_b, y_b)]
    expected = tcl_consistency_loss(leaves[0] @ leaves[1].T, leaves[2] @ leaves[3].T, evidence=kind, tau=tau)
    expected_grads = torch.autograd.grad(expected, leaves)
    leaves = [t.clone().requires_grad_() for t in (x_a, y_a, x_b, y_b)]
    got = tcl_consistency_loss_from_embeddings(*leaves, evidence=kind, tau=tau, strip_elements=113 * rows_per_strip)
    got_grads = torch.autograd.grad(2.5 * got, leaves)
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)
    k, u = 113, 2.0**-53
    for g_got, g_expected in zip(got_grads, expected_grads):
        torch.testing.assert_close(g_got, 2.5 * g_expected, rtol=0, atol=2.5 * 4 * (k - 1) * u * 2 / (k * k * tau))


def test_strip_consistency_float32_and_bad_input():
    from conftest import hard_pairs

    from evidential_ops.methods import tcl_consistency_loss_from_embeddings

    g = torch.Generator().manual_seed(8)
    x_a, y_a = hard_pairs(64, 32, generator=g)
    x_b, y_b = hard_pairs(64, 32, generator=g)
    expected = tcl_consistency_loss(x_a.double() @ y_a.double().T, x_b.double() @ y_b.double().T)
    got = tcl_consistency_loss_from_embeddings(x_a, y_a, x_b, y_b, strip_elements=64 * 5)
    assert got.dtype == torch.float32
    # float32 products (√D·2^-24 relative in s, amplified by 1/τ in the beliefs) and float32 sums.
    assert got.item() == pytest.approx(expected.item(), rel=8 * 32**0.5 * 2.0**-24 / 0.05 + 64 * 2.0**-24)
    with pytest.raises(ValueError, match="same K pairs"):
        tcl_consistency_loss_from_embeddings(x_a, y_a, x_b[:10], y_b[:10])
    with pytest.raises(TypeError, match="x_b"):
        tcl_consistency_loss_from_embeddings(x_a, y_a, x_b.double(), y_b.double())
    with pytest.raises(ValueError, match="strip_elements"):
        tcl_consistency_loss_from_embeddings(x_a, y_a, x_b, y_b, strip_elements=0)
