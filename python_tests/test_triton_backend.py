"""Triton-specific tests (the shared suite, test_fused_backends.py, covers the op contract).

They need the triton backend: on a GPU, or in Triton's interpreter on CPU tensors with
TRITON_INTERPRET=1 set before the import (`make triton-test`). Elsewhere they are skipped.
"""

from __future__ import annotations

import math

import pytest
import torch

import evidential_ops as eo
from conftest import hard_pairs, random_pairs

pytestmark = pytest.mark.skipif("triton" not in eo.available_backends(),
                                reason=f"triton backend not available: {eo.triton_backend.UNAVAILABLE}")

ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------------------- special functions


triton = pytest.importorskip("triton")
tl = triton.language
from evidential_ops.triton_backend import special as sp  # noqa: E402


@triton.jit
def _special_kernel(x_ptr, r_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """(11, BLOCK): ψ, ψ1, ψ2, lnΓ, h, v, r, x·r', ln ψ1, ψ(x+r) − ψ(x), ψ1(x+r) − ψ1(x)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=2.0)
    r = tl.load(r_ptr + i, mask=m, other=2.0)
    small, xs, zz, log_z, u = sp.plain_argument(x)
    dg, tg, ttg, lg, xtg, x2ttg = sp.polygammas_scaled(small, xs, zz, log_z, u)
    v, _xv = sp.kl_v(x, tg, u)
    rr, xrp = sp.fisher_remainder(x, tg, ttg, u)
    tl.store(o_ptr + i, dg, mask=m)
    tl.store(o_ptr + BLOCK + i, tg, mask=m)
    tl.store(o_ptr + 2 * BLOCK + i, ttg, mask=m)
    tl.store(o_ptr + 3 * BLOCK + i, lg, mask=m)
    tl.store(o_ptr + 4 * BLOCK + i, sp.kl_h(xs, small, dg, lg, log_z, u), mask=m)
    tl.store(o_ptr + 5 * BLOCK + i, v, mask=m)
    tl.store(o_ptr + 6 * BLOCK + i, rr, mask=m)
    tl.store(o_ptr + 7 * BLOCK + i, xrp, mask=m)
    tl.store(o_ptr + 8 * BLOCK + i, sp.log_trigamma(small, tg, xtg, log_z), mask=m)
    tl.store(o_ptr + 9 * BLOCK + i, sp.digamma_difference(x, r), mask=m)
    tl.store(o_ptr + 10 * BLOCK + i, sp.trigamma_difference(x, r), mask=m)


def _special_values(xs: torch.Tensor, rs: torch.Tensor) -> torch.Tensor:
    block = triton.next_power_of_2(max(16, xs.numel()))
    out = torch.zeros(11 * block, dtype=xs.dtype, device=xs.device)
    _special_kernel[(1,)](xs, rs, out, xs.numel(), block)
    return out.view(11, block)[:, : xs.numel()].cpu()


def _mp_reference(x: float, r: float) -> list[float]:
    import mpmath

    with mpmath.workdps(60):
        x, r = mpmath.mpf(x), mpmath.mpf(r)
        t1, t2 = mpmath.psi(1, x), mpmath.psi(2, x)
        return [float(v) for v in (
            mpmath.digamma(x), t1, t2, mpmath.loggamma(x), (x - 1) * mpmath.digamma(x) - mpmath.loggamma(x) - x,
            1 - (x - 1) * t1, 1 / t1 - x + mpmath.mpf(1) / 2, x * (-t2 / t1**2 - 1), mpmath.log(t1),
            mpmath.digamma(x + r) - mpmath.digamma(x), mpmath.psi(1, x + r) - t1)]


XS = [1.0, 1.3, 2.0, 5.5, 7.99, 8.0, 9.5, 15.9, 16.0, 29.0, 31.0, 100.0, 1e4, 4.9e8]
RS = [0.0, 0.5, 3.0, 1e-3, 100.0, 7.0, 1e5, 2.0, 1e-8, 50.0, 1e3, 1e6, 1.0, 3e8]
NAMES = ("digamma", "trigamma", "tetragamma", "lgamma", "kl_h", "kl_v", "r", "x_r_prime", "log_trigamma",
         "digamma_difference", "trigamma_difference")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 2e-13), (torch.float32, 3e-6)])
def test_triton_special_functions_against_mpmath(dtype, tol):
    """The tl ports of csrc/kernels/special_functions.h against 60-digit mpmath: relative error, or
    absolute where the value is near 0 (lnΓ(2) = 0); the differences are float64-only (line level)."""
    xs = torch.tensor(XS, dtype=dtype, device=device())
    rs = torch.tensor(RS, dtype=dtype, device=device())
    got = _special_values(xs, rs)
    names = NAMES if dtype == torch.float64 else NAMES[:9]
    for j, name in enumerate(names):
        for i, (x, r) in enumerate(zip(xs.tolist(), rs.tolist())):
            ref = _mp_reference(x, r)[j]
            # Relative error; absolute where a value is near 0 (lnΓ(2) = 0) and for r and x·r', which
            # are small corrections summed against (N − 1)/2 (their direct forms below the series
            # threshold cancel: ~1e-12 relative in float64 at 8, 1e-5 in float32).
            absolute = name == "lgamma" or name in ("r", "x_r_prime")
            error = abs(float(got[j, i]) - ref) / max(abs(ref), 1.0 if absolute else 1e-300)
            if dtype == torch.float32 and name in ("tetragamma", "x_r_prime", "r") and x >= 1e4:
                continue  # below float32's resolution of the asymptotic correction
            assert error <= (tol * 4 if absolute and dtype == torch.float64 else tol), (name, x, r, float(got[j, i]),
                                                                                       ref, error)


# ---------------------------------------------------------------- K = 130: partial tiles, 3 blocks


@pytest.mark.parametrize("evidence,tau", [("exp", 0.05), ("relu", 0.1), ("softplus", 0.05), ("exp_tanh", 0.1)])
def test_triton_k130_hard_regime_every_term_forward_and_backward(gen, evidence, tau):
    k, d = 130, 203
    x, y = hard_pairs(k, d, generator=gen)
    c = torch.rand(k, generator=gen)
    kwargs = dict(evidence=evidence, tau=tau, weights=ALL_WEIGHTS, target_scale=c, reduction="sum")
    xt, yt = x.clone().to(device()).requires_grad_(), y.clone().to(device()).requires_grad_()
    loss = eo.evidential_loss(xt, yt, backend="triton", **{**kwargs, "target_scale": c.to(device())})
    loss.backward()
    xr, yr = x.detach().double().requires_grad_(), y.detach().double().requires_grad_()
    ref = eo.reference.evidential_loss(xr, yr, **{**kwargs, "target_scale": c.double()})
    ref.backward()
    allowance = 8 * math.sqrt(d) * 2.0**-24 / tau
    assert abs(float(loss) - float(ref)) / abs(float(ref)) <= 1e-4 + allowance
    for got, want in ((xt.grad, xr.grad), (yt.grad, yr.grad)):
        assert float((got.double().cpu() - want).abs().max() / want.abs().max()) <= 1e-4 + allowance


# ----------------------------------------------------------------------------- code paths


def test_triton_results_are_bitwise_deterministic(gen):
    x, y = hard_pairs(113, 64, generator=gen)
    x, y = x.to(device()), y.to(device())
    runs = []
    for _ in range(2):
        xt, yt = x.clone().requires_grad_(), y.clone().requires_grad_()
        loss = eo.evidential_loss(xt, yt, weights=ALL_WEIGHTS, backend="triton")
        loss.backward()
        runs.append((loss.detach(), xt.grad, yt.grad))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_triton_two_pass_forward_matches_the_column_partials(gen, monkeypatch):
    """Both directions in one pass (column partials + second pass) or, when the partials would not
    fit (or leave SMs idle), as two passes: the same statistics."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(100, 40, generator=gen)
    x, y = x.to(device()), y.to(device())
    ops = eo.backends.resolve("triton", x.device).ops
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=ALL_WEIGHTS, direction="both", reduction="none")
    w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
    one = ops.loss_forward(x, y, None, "exp", 0.05, w, mask, True, True)
    monkeypatch.setattr(launch, "_sm_count", lambda device: 10**6)
    two = ops.loss_forward(x, y, None, "exp", 0.05, w, mask, True, True)
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_triton_backward_accumulating_over_embedding_chunks(gen):
    """D beyond what the grad kernel keeps in registers: dx, dy are accumulated chunk by chunk."""
    from evidential_ops.triton_backend import configs

    d = 2 * (configs.INTERPRETER_MAX_REGISTER_D if configs.interpreting() else configs.MAX_REGISTER_D) + 3
    x, y = random_pairs(40, d, generator=gen, positive_cos=0.8)
    xt, yt = x.clone().to(device()).requires_grad_(), y.clone().to(device()).requires_grad_()
    eo.evidential_loss(xt, yt, weights=ALL_WEIGHTS, tau=0.1, backend="triton").backward()
    xr, yr = x.detach().double().requires_grad_(), y.detach().double().requires_grad_()
    eo.reference.evidential_loss(xr, yr, weights=ALL_WEIGHTS, tau=0.1).backward()
    for got, want in ((xt.grad, xr.grad), (yt.grad, yr.grad)):
        assert float((got.double().cpu() - want).abs().max() / want.abs().max()) <= 2e-4


def test_triton_graph_mode_paths_match_eager(gen, monkeypatch):
    """What the ops do inside a torch.compile graph (weights read by the kernels from a device
    tensor, value checks as asynchronous asserts), exercised on real tensors."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(70, 24, generator=gen)
    x, y = x.to(device()), y.to(device())
    ops = eo.backends.resolve("triton", x.device).ops
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=ALL_WEIGHTS, direction="both", reduction="none")
    w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
    c = torch.rand(70, generator=gen).to(x.device)
    eager = ops.loss_forward(x, y, c, "exp", 0.05, w, mask, True, True)
    eager_grads = ops.loss_backward(eager[0], eager[1], x, y, c, eager[2], eager[3], "exp", 0.05, w, mask, True, True,
                                    0, [True, True])
    monkeypatch.setattr(launch, "_tracing", lambda t: True)
    monkeypatch.setattr(eo.checks, "values_unreadable", lambda t: True)
    graph = ops.loss_forward(x, y, c, "exp", 0.05, w, mask, True, True)
    graph_grads = ops.loss_backward(graph[0], graph[1], x, y, c, graph[2], graph[3], "exp", 0.05, w, mask, True, True,
                                    0, [True, True])
    for a, b in zip((*eager, *eager_grads), (*graph, *graph_grads)):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="weights"):
        ops.loss_forward(x, y, c, "exp", 0.05, torch.tensor([1.0, math.nan, 0, 0, 0], dtype=torch.float64), mask,
                         True, True)


def test_triton_tf32_agrees(gen):
    """matmul_precision="tf32" reaches the kernels as the ops' argument, backward included
    (tensor-core products on a GPU: ~3e-4 relative in e; the interpreter computes them in float32)."""
    x, y = random_pairs(50, 32, generator=gen, positive_cos=0.8)
    x, y = x.to(device()), y.to(device())
    ieee = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="triton")
    tf32 = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="triton", matmul_precision="tf32")
    torch.testing.assert_close(tf32, ieee, rtol=5e-3 / 0.05, atol=0)


def test_triton_one_program_over_several_row_blocks_matches(gen, monkeypatch):
    """On a GPU from K of a few thousand a stats program sweeps several row blocks, read-modify-
    writing its column partials between them; the interpreter's default never does. Force it (a
    partial budget of one byte: one program for every row block) and compare bitwise."""
    from evidential_ops.triton_backend import launch

    x, y = hard_pairs(130, 24, generator=gen)
    x, y = x.to(device()), y.to(device())
    expected = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", backend="triton")
    monkeypatch.setattr(launch, "PARTIAL_BUDGET_BYTES", 1)
    several = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", backend="triton")
    for a, b in zip(expected, several):
        assert torch.equal(a, b)
