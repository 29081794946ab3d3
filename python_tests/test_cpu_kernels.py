"""What only the cpu backend has: instruction-set variants and thread-count independence.

Its accuracy, options, autograd and compile behaviour are tested with every other fused backend
in test_fused_backends.py; here the same accuracy checks run once per instruction-set variant.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import evidential_ops as eo
from conftest import hard_pairs, random_pairs, unit_roundoff

pytestmark = pytest.mark.skipif("cpu" not in eo.available_backends(), reason="C++ extension not built")

ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}


def available_isas() -> list[str]:
    if "cpu" not in eo.available_backends():
        return []
    current = eo.cpu_isa()
    isas = []
    for isa in ("generic", "avx2", "avx512"):
        try:
            eo.cpu_isa(isa)
            isas.append(isa)
        except ValueError:
            pass
    eo.cpu_isa(current)
    return isas


ISAS = available_isas()


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs the test once per instruction-set variant of the tile kernels this CPU can run."""
    previous = eo.cpu_isa()
    eo.cpu_isa(request.param)
    yield request.param
    eo.cpu_isa(previous)


def max_rel(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float(((got - ref).abs() / ref.abs().clamp_min(1e-3)).max())


@pytest.mark.parametrize("term", ["risk", "kl", "mse", "fmse", "logdet"])
def test_each_term_hard_regime_per_isa(gen, isa, term):
    x, y = hard_pairs(113, 203, generator=gen, dtype=torch.float64)
    s = (x @ y.T).float().requires_grad_()
    rows, cols = eo.evidential_loss_from_similarity(s, weights={term: 1.0}, backend="cpu", reduction="none")
    (grad,) = torch.autograd.grad(rows.sum() + cols.sum(), s)
    s64 = s.detach().double().requires_grad_()
    ref_rows, ref_cols = eo.reference.evidential_loss_from_similarity(s64, weights={term: 1.0}, reduction="none")
    (ref_grad,) = torch.autograd.grad(ref_rows.sum() + ref_cols.sum(), s64)
    tol = 1e-4 if term in ("fmse", "logdet") else 1e-5
    assert max(max_rel(rows, ref_rows), max_rel(cols, ref_cols)) <= tol
    assert float((grad.double() - ref_grad).abs().max() / ref_grad.abs().max()) <= 1e-4


def test_hard_regime_all_terms_from_embeddings_per_isa(gen, isa):
    k, d = 300, 64  # several 64-wide blocks: multi-round schedule, partial last block
    x, y = hard_pairs(k, d, generator=gen)
    got = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="cpu", reduction="none")
    ref = eo.reference.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none")
    tol = 1e-4 + 8 * math.sqrt(d) * 2.0**-24 / 0.05
    assert max(max_rel(g, r) for g, r in zip(got, ref)) <= tol


def test_isa_variants_agree(gen):
    x, y = hard_pairs(113, 203, generator=gen)
    results = {}
    previous = eo.cpu_isa()
    try:
        for name in ISAS:
            eo.cpu_isa(name)
            results[name] = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", backend="cpu")
    finally:
        eo.cpu_isa(previous)
    base = results[ISAS[0]]
    for rows, cols in results.values():
        torch.testing.assert_close(rows, base[0], rtol=1e-6, atol=0)
        torch.testing.assert_close(cols, base[1], rtol=1e-6, atol=0)


def test_cpu_isa_requests_are_checked():
    with pytest.raises(ValueError, match="isa must be"):
        eo.cpu_isa("sse9")
    with pytest.raises(TypeError, match="request"):
        eo.cpu_isa(3)
    assert eo.cpu_isa() in ISAS
    assert f"cpu_isa={eo.cpu_isa()}" in eo.build_info()


def test_unknown_eo_cpu_isa_is_an_error_naming_the_variable():
    """A misspelt EO_CPU_ISA used to be ignored silently (the best variant ran instead)."""
    code = (
        "import torch, evidential_ops as eo\n"
        "x = torch.nn.functional.normalize(torch.randn(8, 4), dim=1)\n"
        "try:\n"
        "    eo.evidential_loss(x, x, backend='cpu')\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
        "print('info:', eo.build_info())\n"  # a diagnostic shows the misconfiguration, not raise
        "eo.cpu_isa('generic')\n"  # an explicit choice still works, and then the op runs
        "print('after request:', float(eo.evidential_loss(x, x, backend='cpu')) > 0)\n"
    )
    env = {**os.environ, "EO_CPU_ISA": "avx1024"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ValueError: EO_CPU_ISA must be 'best', 'generic', 'avx2' or 'avx512', got 'avx1024'" in proc.stdout
    assert "after request: True" in proc.stdout
    assert "cpu_isa=invalid(EO_CPU_ISA=avx1024)" in proc.stdout


def test_bitwise_deterministic_across_runs_and_thread_counts(gen):
    x, y = hard_pairs(300, 96, generator=gen)
    outputs = []
    threads = torch.get_num_threads()
    try:
        for n_threads in (threads, 1, threads):
            torch.set_num_threads(n_threads)
            xx, yy = x.clone().requires_grad_(), y.clone().requires_grad_()
            loss = eo.evidential_loss(xx, yy, weights=ALL_WEIGHTS, backend="cpu")
            loss.backward()
            outputs.append((loss.detach(), xx.grad, yy.grad))
    finally:
        torch.set_num_threads(threads)
    for other in outputs[1:]:
        for a, b in zip(outputs[0], other):
            assert torch.equal(a, b)


@pytest.mark.skipif("cpu_packed_gemm=unavailable" in eo.build_info(), reason="the BLAS has no packed GEMM")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_tile_gemms_match_the_unpacked_ones(gen, monkeypatch, dtype):
    """The tile GEMMs with an operand's blocks packed once per pass (at::mm where a block is
    partial: K = 2085 in 256-row blocks, the smallest size that packs) against at::mm's throughout,
    for the loss, its gradient and a rectangular opinion (2100 queries over 700 candidates: blocks
    of 256 by 128).

    Both are float32 GEMMs of the same operands, so a similarity differs by at most
    Δs = 2γ_D·Σ_k|x_k·y_k|. First order: a line's loss moves by Σ_j |∂L_line/∂s_ij|·Δs_ij (each
    direction's own gradient). ∂L/∂s_ij = G_ij is a function of
    x = s_ij/τ through α = e^x and of its lines' statistics; d ln|α·∂L/∂α|/dx and d ln ρ/dx are at
    most 1 each for exp evidence, and the statistics move relatively by less than the largest
    Δs/τ, so |ΔG_ij| <= 3·(|G^row_ij| + |G^col_ij|)·max Δs/τ; dx, dy move by that through the
    GEMMs with y and x, plus those GEMMs' own reordering (2K·u of |G|·|y|). bfloat16 inputs are
    multiplied in float32 too; each run then rounds its outputs once to the input dtype (u_out).
    """
    k, d, tau = 2085, 203, 0.05
    x, y = hard_pairs(k, d, generator=gen, dtype=dtype)
    queries = random_pairs(2100, d, generator=gen, dtype=dtype)[0]
    candidates = random_pairs(700, d, generator=gen, dtype=dtype)[1]
    runs = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("EO_CPU_PACKED_GEMM", mode)
        assert ("cpu_packed_gemm=on" in eo.build_info()) == (mode == "1")
        xx, yy = x.clone().requires_grad_(), y.clone().requires_grad_()
        rows, cols = eo.evidential_loss(xx, yy, weights=ALL_WEIGHTS, tau=tau, backend="cpu", reduction="none")
        (rows.sum() + cols.sum()).backward()
        op = eo.opinion(queries, candidates, evidence="exp", tau=tau, backend="cpu")
        runs[mode] = (rows.detach().double(), cols.detach().double(), xx.grad.double(), yy.grad.double(),
                      op.row_log_strength.double(), op.col_log_strength.double())
    u, u_out = 2.0**-24, unit_roundoff(dtype)
    gamma = d * u / (1 - d * u)
    # Each direction's ∂L/∂s from the fused op on the materialised s (within 1e-4 of the float64
    # reference's by the suites above, which the factor 2 of the bounds below covers many times).
    s32 = (x.float() @ y.float().T).requires_grad_()
    rows32, cols32 = eo.evidential_loss_from_similarity(s32, weights=ALL_WEIGHTS, tau=tau, backend="cpu",
                                                        reduction="none")
    (g_rows,) = torch.autograd.grad(rows32.sum(), s32, retain_graph=True)
    (g_cols,) = torch.autograd.grad(cols32.sum(), s32)
    g_rows, g_cols = g_rows.double(), g_cols.double()
    delta_s = 2 * gamma * (x.double().abs() @ y.double().abs().T)
    a, b = runs["1"], runs["0"]
    row_bound = (g_rows.abs() * delta_s).sum(1) + u_out * b[0].abs()
    col_bound = (g_cols.abs() * delta_s).sum(0) + u_out * b[1].abs()
    assert float(((a[0] - b[0]).abs() - 2 * row_bound).max()) <= 0
    assert float(((a[1] - b[1]).abs() - 2 * col_bound).max()) <= 0
    g_abs = g_rows.abs() + g_cols.abs()
    g_move = 3 * g_abs * float(delta_s.max()) / tau
    xa, ya = x.double().abs(), y.double().abs()
    dx_bound = (g_move + 2 * (2 * k * u) * g_abs) @ ya + 2 * u_out * b[2].abs()
    dy_bound = (g_move + 2 * (2 * k * u) * g_abs).T @ xa + 2 * u_out * b[3].abs()
    assert float(((a[2] - b[2]).abs() - 2 * dx_bound).max()) <= 0
    assert float(((a[3] - b[3]).abs() - 2 * dy_bound).max()) <= 0
    # Opinions: log Σ_j α_ij moves by at most max_j Δs_ij/τ (each α by a factor e^{Δs/τ}).
    delta_op = 2 * gamma * float((queries.double().abs() @ candidates.double().abs().T).max()) / tau
    for got, want in ((a[4], b[4]), (a[5], b[5])):
        assert float((got - want).abs().max()) <= 2 * delta_op + 4 * u_out * float(want.abs().max())


@pytest.mark.parametrize("n_q,n_g", [(5, 2000), (2000, 5), (130, 130)])
def test_opinion_bitwise_deterministic_across_thread_counts(gen, n_q, n_g):
    x, _ = random_pairs(n_q, 32, generator=gen)
    y, _ = random_pairs(n_g, 32, generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for n_threads in (threads, 1, 3):
            torch.set_num_threads(n_threads)
            op = eo.opinion(x, y, backend="cpu")
            results.append((op.row_log_strength, op.col_log_strength))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_auto_picks_cpu_for_cpu_tensors(gen):
    x, y = random_pairs(16, 8, generator=gen)
    torch.testing.assert_close(eo.evidential_loss(x, y), eo.evidential_loss(x, y, backend="cpu"))
    assert eo.backends.resolve("auto", torch.device("cpu")).name == "cpu"
