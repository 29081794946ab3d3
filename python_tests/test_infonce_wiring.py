"""The methods' InfoNCE terms computed by the fused op equal their K×K forms (SPEC §2 "InfoNCE",
§3 "DUQ", "FUME"; models.InfoNCEBaseline)."""

from __future__ import annotations

import math

import torch

import evidential_ops as eo
from conftest import random_pairs
from evidential_ops.methods import duq_similarity_loss, duq_similarity_loss_from_embeddings


def test_duq_similarity_loss_from_embeddings_is_eq_1(gen):
    # float64: the two forms differ only by the order of float64 sums (≤ 1e-12 relative).
    x, y = random_pairs(48, 24, generator=gen, dtype=torch.float64, positive_cos=0.5)
    scale = torch.tensor(20.0, dtype=torch.float64, requires_grad=True)
    fused = duq_similarity_loss_from_embeddings(x, y, logit_scale=scale)
    plain = duq_similarity_loss(x @ y.T, logit_scale=scale)
    assert abs(float(fused) - float(plain)) <= 1e-12 * abs(float(plain))
    g_fused, = torch.autograd.grad(fused, scale)
    g_plain, = torch.autograd.grad(duq_similarity_loss(x @ y.T, logit_scale=scale), scale)
    assert abs(float(g_fused) - float(g_plain)) <= 1e-10 * abs(float(g_plain))


def test_duq_similarity_loss_from_embeddings_float32_within_gemm_bound(gen):
    # The logit error of a float32 GEMM at λ = 100 (τ = 0.01), SPEC §2 "InfoNCE": 2·8·√D·2⁻²⁴/τ.
    x, y = random_pairs(64, 32, generator=gen, positive_cos=0.6)
    fused = duq_similarity_loss_from_embeddings(x, y, logit_scale=100.0)
    exact = duq_similarity_loss(x.double() @ y.double().T, logit_scale=100.0)
    assert abs(float(fused) - float(exact)) <= 1e-5 * float(exact) + 2 * 8 * math.sqrt(32) * 2.0**-24 * 100


def test_infonce_baseline_loss_is_the_symmetric_infonce(gen):
    x, y = random_pairs(32, 16, generator=gen, dtype=torch.float64)
    fused = eo.infonce_loss(x, y, tau=0.05, reduction="mean_of_directions")
    plain = duq_similarity_loss(x @ y.T, logit_scale=1 / 0.05)
    assert abs(float(fused) - float(plain)) <= 1e-12 * float(plain)
