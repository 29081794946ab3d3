"""Dissonance and top belief of `eo.opinion` (SPEC §1) on every backend, against direct formulas."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import random_pairs

import evidential_ops as eo
from evidential_ops.dissonance import belief_dissonance
from evidential_ops.opinion import _tiled_topk


def dissonance_by_the_definition(b: list[float]) -> float:
    """Jøsang et al. 2018, written as the paper does: Σ_i b_i Σ_{j≠i} b_j Bal(b_j, b_i) / Σ_{j≠i} b_j."""
    total = 0.0
    for i, bi in enumerate(b):
        weighted = others = 0.0
        for j, bj in enumerate(b):
            if j == i:
                continue
            balance = 1.0 - abs(bj - bi) / (bj + bi) if bi * bj != 0 else 0.0
            weighted += bj * balance
            others += bj
        total += bi * weighted / others if others > 0 else 0.0
    return total


def dense_extras(s: torch.Tensor, evidence: str, tau: float, k: int):
    """The K×K way: every belief of every row in float64, then the top-k and the definition."""
    s = s.double()
    log_alpha = eo.reference.log_alpha(s, evidence, tau)
    log_strength = torch.logsumexp(log_alpha, dim=1, keepdim=True)
    if evidence == "exp":
        beliefs = torch.exp(s / tau - log_strength)
    else:
        beliefs = eo.reference.evidence(s, evidence, tau) / log_strength.exp()
    top = torch.topk(beliefs, min(k, s.shape[1]), dim=1).values
    bi, bj = top.unsqueeze(2), top.unsqueeze(1)
    balance = torch.where((bi * bj) > 0, 1.0 - (bj - bi).abs() / (bj + bi), torch.zeros(()).double())
    off = 1.0 - torch.eye(top.shape[1], dtype=torch.float64)
    weighted, others = (balance * bj * off).sum(2), (bj * off).sum(2)
    diss = (top * torch.where(others > 0, weighted / others, torch.zeros(()).double())).sum(1)
    return diss, top[:, 0]


def test_dissonance_by_hand():
    # Two equal masses balance completely: each term is b_i·1 -> 0.5 + 0.5.
    assert belief_dissonance(torch.tensor([[0.5, 0.5]])).item() == pytest.approx(1.0)
    # One candidate, or all mass on one: no conflict.
    assert belief_dissonance(torch.tensor([[0.7]])).item() == 0.0
    assert belief_dissonance(torch.tensor([[0.8, 0.0, 0.0]])).item() == 0.0
    # b = (0.6, 0.2): Bal = 1 − 0.4/0.8 = 1/2, so 0.6·(0.2·½/0.2) + 0.2·(0.6·½/0.6) = 0.3 + 0.1.
    assert belief_dissonance(torch.tensor([[0.6, 0.2]])).item() == pytest.approx(0.4)
    # u = 0.1 left over, masses (0.3, 0.3, 0.3): fully balanced, diss = Σ b = 0.9.
    assert belief_dissonance(torch.tensor([[0.3, 0.3, 0.3]])).item() == pytest.approx(0.9)


def test_dissonance_matches_the_definition_on_small_inputs():
    gen = torch.Generator().manual_seed(3)
    for k in (2, 3, 5, 8):
        b = torch.rand(6, k, generator=gen, dtype=torch.float64)
        b[0, 0] = 0.0  # zero masses: Bal = 0 with them
        b[1] = 0.0
        b = b / (b.sum(1, keepdim=True) + 1.0)  # leave some vacuity
        got = belief_dissonance(b, max_pair_entries=3 * k * k)  # several chunks
        for r in range(6):
            assert got[r].item() == pytest.approx(dissonance_by_the_definition(b[r].tolist()), rel=1e-13, abs=1e-300)


@pytest.mark.parametrize("backend", eo.available_backends())
@pytest.mark.parametrize("evidence", eo.EVIDENCE_KINDS)
def test_extras_match_the_kxk_computation(backend, evidence, gen):
    x, _ = random_pairs(150, 32, generator=gen, dtype=torch.float64)
    y, _ = random_pairs(230, 32, generator=gen, dtype=torch.float64)
    tau = 0.5 if evidence == "relu" else 0.1
    s = x @ y.T
    for op in (eo.opinion(x, y, evidence=evidence, tau=tau, backend=backend, top_k=7),
               eo.opinion_from_similarity(s, evidence=evidence, tau=tau, backend=backend, top_k=7)):
        diss, top = dense_extras(s, evidence, tau, 7)
        torch.testing.assert_close(op.row_dissonance, diss, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(op.row_top_belief, top, rtol=1e-9, atol=1e-12)
        diss, top = dense_extras(s.T, evidence, tau, 7)
        torch.testing.assert_close(op.col_dissonance, diss, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(op.col_top_belief, top, rtol=1e-9, atol=1e-12)
        assert op.top_k == 7


@pytest.mark.parametrize("backend", eo.available_backends())
def test_extras_float32_and_tile_budget(backend, gen):
    x, _ = random_pairs(300, 48, generator=gen)
    y, _ = random_pairs(500, 48, generator=gen)
    whole = eo.opinion(x, y, backend=backend)  # default: k = 10, one tile
    # 2 KiB of float32 scores: 512 entries, fewer than one row of 500 + a split row -> 2-D tiles.
    tiny = eo.opinion(x, y, backend=backend, tile_mib=2 / 1024)
    diss, top = dense_extras(x.double() @ y.double().T, "exp", 0.05, 10)
    for op in (whole, tiny):
        assert op.row_dissonance.dtype == torch.float32 and op.row_dissonance.shape == (300,)
        assert op.col_top_belief.shape == (500,)
        # float32 scores: s/τ is off by ~√D·2⁻²⁴/τ, and beliefs by that relative amount.
        torch.testing.assert_close(op.row_dissonance.double(), diss, rtol=2e-4, atol=1e-6)
        torch.testing.assert_close(op.row_top_belief.double(), top, rtol=2e-4, atol=1e-6)
    torch.testing.assert_close(whole.col_dissonance, tiny.col_dissonance, rtol=1e-5, atol=1e-6)


def test_tiles_never_exceed_the_budget():
    s = torch.randn(37, 53, dtype=torch.float64)
    seen = []

    def tile(r0, r1, c0, c1):
        seen.append((r1 - r0) * (c1 - c0))
        return s[r0:r1, c0:c1]

    for budget in (1, 10, 53, 100, 10_000):
        seen.clear()
        rows, cols = _tiled_topk(tile, 37, 53, 4, 6, budget)
        assert max(seen) <= max(budget, 1)
        torch.testing.assert_close(rows, torch.topk(s, 4, dim=1).values)
        torch.testing.assert_close(cols, torch.topk(s.T, 6, dim=1).values)


@pytest.mark.parametrize("backend", eo.available_backends())
def test_top_belief_exact_where_evidence_overflows_float32(backend, gen):
    x, y = random_pairs(20, 16, generator=gen, positive_cos=0.999)
    op = eo.opinion(x, y, tau=0.005, backend=backend)  # e up to e^200: no float32 holds it
    diss, top = dense_extras(x.double() @ y.double().T, "exp", 0.005, 10)
    assert torch.isfinite(op.row_top_belief).all() and torch.isfinite(op.row_dissonance).all()
    assert float((x.double() @ y.double().T).max()) / 0.005 > math.log(torch.finfo(torch.float32).max)
    # 1/τ = 200 multiplies the float32 dot product's error (~√D·2⁻²⁴) in the exponent.
    torch.testing.assert_close(op.row_top_belief.double(), top, rtol=5e-4, atol=1e-30)
    torch.testing.assert_close(op.row_dissonance.double(), diss, rtol=5e-4, atol=1e-6)


@pytest.mark.parametrize("backend", eo.available_backends())
def test_extras_edge_cases(backend, gen):
    x, _ = random_pairs(1, 8, generator=gen)
    y, _ = random_pairs(5, 8, generator=gen)
    op = eo.opinion(x, y, backend=backend, top_k=50)  # k capped at 5 candidates (rows), 1 (columns)
    diss, top = dense_extras(x.double() @ y.double().T, "exp", 0.05, 5)
    torch.testing.assert_close(op.row_dissonance.double(), diss, rtol=1e-4, atol=1e-7)
    assert op.col_dissonance.tolist() == [0.0] * 5  # a single candidate cannot conflict
    torch.testing.assert_close(op.col_top_belief.double(), 1.0 - op.col_uncertainty.double(), rtol=1e-5, atol=1e-7)
    plain = eo.opinion(x, y, backend=backend, top_k=None)
    assert plain.row_dissonance is None and plain.col_top_belief is None and plain.top_k is None
    torch.testing.assert_close(plain.row_uncertainty, op.row_uncertainty)


def test_extras_validation(gen):
    x, y = random_pairs(4, 8, generator=gen)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        eo.opinion(x, y, top_k=0)
    with pytest.raises(TypeError, match="top_k must be an int"):
        eo.opinion(x, y, top_k=2.5)
    with pytest.raises(ValueError, match="tile_mib must be > 0"):
        eo.opinion_from_similarity(x @ y.T, tile_mib=0)
    with pytest.raises(TypeError, match="beliefs must be a floating"):
        belief_dissonance(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="beliefs must be 2-D"):
        belief_dissonance(torch.ones(3))
