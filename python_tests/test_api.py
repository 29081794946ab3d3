"""The public API on every available backend: reductions, directions, options, dtypes, opinions.

Backends are compared with the float64 reference evaluated on the same inputs (SPEC §5).
"""

from __future__ import annotations

import ctypes
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import evidential_ops as eo
from conftest import hard_pairs, random_pairs

ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}


def test_available_backends_lists_reference_first():
    names = eo.available_backends()
    assert names[0] == "reference"
    assert set(names) <= {"reference", "cpu", "triton", "cuda"}
    assert "extension not loaded" not in eo.build_info()


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the ELF loader's symbol lookup")
def test_extension_throws_with_torchs_cpp_runtime():
    """A ValueError from a C++ op crosses from the extension into torch's dispatcher as a C++
    exception: both must throw and catch with one libstdc++. Linked statically (a compiler whose
    library folder holds libstdc++.a beside a dangling libstdc++.so: setup._runtime_link_args), the
    extension had its own copy, and the first ValueError of any op killed the process with SIGSEGV
    (an H200 machine, torch 2.11). The loader
    resolves __cxa_throw from the extension itself when that copy is there, else from libstdc++.so."""
    _C = pytest.importorskip("evidential_ops._C")
    extension = ctypes.CDLL(_C.__file__)
    address = ctypes.cast(extension["__cxa_throw"], ctypes.c_void_p).value
    info = _DlInfo()
    assert ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)) != 0
    defined_in = os.path.realpath(info.dli_fname.decode())
    assert defined_in != os.path.realpath(_C.__file__), (
        "the extension carries its own C++ runtime (libstdc++.a was linked): rebuild it so that "
        "libstdc++.so.6 is linked (setup.py passes -l:libstdc++.so.6)")


@pytest.mark.parametrize("direction", ["rows", "cols", "both"])
def test_reductions_are_consistent(gen, direction):
    x, y = random_pairs(9, 16, generator=gen)
    kwargs = dict(weights=ALL_WEIGHTS, direction=direction, backend="reference")
    rows, cols = eo.evidential_loss(x, y, reduction="none", **kwargs)
    assert rows.shape == ((9,) if direction != "cols" else (0,))
    assert cols.shape == ((9,) if direction != "rows" else (0,))
    mean = eo.evidential_loss(x, y, reduction="mean", **kwargs)
    total = eo.evidential_loss(x, y, reduction="sum", **kwargs)
    expected_mean = sum(part.mean() for part in (rows, cols) if part.numel())
    torch.testing.assert_close(mean, expected_mean)
    torch.testing.assert_close(total, rows.sum() + cols.sum())
    assert mean.dtype == torch.float32 and mean.dim() == 0


def test_columns_are_rows_of_the_transpose(gen):
    x, y = random_pairs(7, 5, generator=gen)
    rows, cols = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none")
    rows_t, cols_t = eo.evidential_loss(y, x, weights=ALL_WEIGHTS, reduction="none")
    torch.testing.assert_close(cols, rows_t)
    torch.testing.assert_close(rows, cols_t)


def test_weights_combine_terms_linearly(gen):
    x, y = random_pairs(8, 6, generator=gen)
    per_term = {t: eo.evidential_loss(x, y, weights={t: 1.0}, reduction="sum") for t in eo.TERMS}
    combined = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="sum")
    torch.testing.assert_close(combined, sum(w * per_term[t] for t, w in ALL_WEIGHTS.items()))


def test_default_weights_are_tcl_with_lambda_0_1(gen):
    x, y = random_pairs(8, 6, generator=gen)
    torch.testing.assert_close(
        eo.evidential_loss(x, y), eo.evidential_loss(x, y, weights={"risk": 1.0, "kl": 0.1})
    )


def test_from_similarity_equals_from_embeddings(gen):
    x, y = random_pairs(10, 12, generator=gen, dtype=torch.float64)
    a = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none")
    b = eo.evidential_loss_from_similarity(x @ y.T, weights=ALL_WEIGHTS, reduction="none")
    torch.testing.assert_close(a, b)


def test_normalize_equals_normalizing_first(gen):
    x = torch.randn(6, 10, generator=gen, dtype=torch.float64)
    y = torch.randn(6, 10, generator=gen, dtype=torch.float64)
    a = eo.evidential_loss(x, y, normalize=True)
    b = eo.evidential_loss(F.normalize(x, dim=1), F.normalize(y, dim=1))
    torch.testing.assert_close(a, b)


def test_target_scale_zero_removes_target_terms_and_one_is_default(gen):
    x, y = random_pairs(6, 10, generator=gen)
    default = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none")
    ones = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", target_scale=torch.ones(6))
    torch.testing.assert_close(default, ones)
    risk_rows, _ = eo.evidential_loss(x, y, weights={"risk": 1.0}, reduction="none", target_scale=torch.zeros(6))
    assert torch.all(risk_rows == 0)
    as_bool = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, target_scale=torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.bool))
    as_float = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, target_scale=torch.tensor([1.0, 0, 1, 1, 0, 1]))
    torch.testing.assert_close(as_bool, as_float)


def test_target_scale_gets_no_gradient(gen):
    x, y = random_pairs(5, 4, generator=gen)
    c = torch.full((5,), 0.5, requires_grad=True)
    eo.evidential_loss(x.requires_grad_(), y, target_scale=c).backward()
    assert c.grad is None and x.grad is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_within_1e_2_of_float64_reference(gen, dtype):
    x, y = random_pairs(113, 203, generator=gen, positive_cos=0.9)
    x, y = x.to(dtype).requires_grad_(), y.to(dtype).requires_grad_()
    loss = eo.evidential_loss(x, y, weights=ALL_WEIGHTS)
    loss.backward()
    assert loss.dtype == torch.float32
    assert x.grad.dtype == dtype and y.grad.dtype == dtype
    expected = eo.reference.evidential_loss(x.detach(), y.detach(), weights=ALL_WEIGHTS)
    assert abs(loss.double() - expected) <= 1e-2 * abs(expected)


def test_float64_inputs_give_float64_loss(gen):
    x, y = random_pairs(5, 4, generator=gen, dtype=torch.float64)
    assert eo.evidential_loss(x, y).dtype == torch.float64


def test_hard_regime_float32_finite(gen):
    x, y = hard_pairs(64, 32, generator=gen)
    x.requires_grad_()
    loss = eo.evidential_loss(x, y, weights=ALL_WEIGHTS)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


def test_module_matches_function_and_anneals(gen):
    x, y = random_pairs(8, 6, generator=gen)
    module = eo.EvidentialLoss(weights={"risk": 1.0, "kl": 0.0})
    torch.testing.assert_close(module(x, y), eo.evidential_loss(x, y, weights={"risk": 1.0}))
    module.weights = {"risk": 1.0, "kl": 0.5}
    torch.testing.assert_close(module(x, y), eo.evidential_loss(x, y, weights={"risk": 1.0, "kl": 0.5}))
    sim_module = eo.EvidentialLoss(from_similarity=True, reduction="sum")
    torch.testing.assert_close(sim_module(x @ y.T), eo.evidential_loss(x, y, reduction="sum"))
    with pytest.raises(ValueError, match="y is required"):
        module(x)
    assert "tau=0.05" in repr(module)


def test_opinion_rectangular_gallery(gen):
    x, y = random_pairs(7, 12, generator=gen, dtype=torch.float64)
    y = torch.cat([y, F.normalize(torch.randn(4, 12, generator=gen, dtype=torch.float64), dim=1)])
    op = eo.opinion(x, y, evidence="exp", tau=0.1)
    alpha = torch.exp(x @ y.T / 0.1) + 1
    torch.testing.assert_close(op.row_strength, alpha.sum(1))
    torch.testing.assert_close(op.col_strength, alpha.sum(0))
    torch.testing.assert_close(op.row_uncertainty, 11 / alpha.sum(1))
    torch.testing.assert_close(op.col_uncertainty, 7 / alpha.sum(0))
    beliefs = eo.belief(x @ y.T, op.row_log_strength, evidence="exp", tau=0.1)
    # Σ_j b_ij + u_i = 1 (SPEC §1)
    torch.testing.assert_close(beliefs.sum(1) + op.row_uncertainty, torch.ones(7, dtype=torch.float64))
    col_beliefs = eo.belief(x @ y.T, op.col_log_strength, evidence="exp", tau=0.1, dim=0)
    torch.testing.assert_close(col_beliefs.sum(0) + op.col_uncertainty, torch.ones(11, dtype=torch.float64))


@pytest.mark.parametrize("evidence", eo.EVIDENCE_KINDS)
def test_opinion_from_similarity_every_evidence(gen, evidence):
    s = torch.rand(5, 8, generator=gen, dtype=torch.float64) * 2 - 1
    op = eo.opinion_from_similarity(s, evidence=evidence, tau=0.2)
    alpha = eo.reference.evidence(s, evidence, 0.2) + 1
    torch.testing.assert_close(op.row_log_strength, alpha.sum(1).log())
    b = eo.belief(s, op.row_log_strength, evidence=evidence, tau=0.2)
    torch.testing.assert_close(b.sum(1) + op.row_uncertainty, torch.ones(5, dtype=torch.float64))


def test_opinion_does_not_overflow_at_small_tau(gen):
    x, y = random_pairs(6, 8, generator=gen, positive_cos=0.999)
    op = eo.opinion(x, y, tau=0.005)  # e up to e^200: beyond float32, not beyond its log
    assert torch.isfinite(op.row_log_strength).all() and torch.isfinite(op.row_uncertainty).all()
    assert float(op.row_log_strength.max()) > math.log(torch.finfo(torch.float32).max)


def test_benchmarks_and_the_demo_lead_with_the_backend_auto_takes():
    # The demo's speed line and bench/device_bench.py's first column are what backend="auto" runs.
    from evidential_ops import benchmark

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        fused = benchmark.fused_backends(device)
        if fused:
            assert eo.backends.resolve("auto", device).name == fused[0]
        assert sorted(eo.backends.preferred(device)) == sorted(eo.backends.supporting(device))


@pytest.mark.parametrize("check_finite", [True, False])
def test_vmap_of_the_reference_backend_equals_a_loop(gen, check_finite):
    """docs/api.md: backend="reference" works inside torch.func, value checks included (they read
    the unwrapped condition of every batch member: bool() of a batched tensor is refused)."""
    xs, ys = (torch.stack([random_pairs(12, 8, generator=gen, dtype=torch.float64)[i] for _ in range(3)])
              for i in (0, 1))

    def loss(x, y):
        return eo.evidential_loss(x, y, backend="reference", weights={"risk": 1.0, "kl": 0.5},
                                  check_finite=check_finite)

    torch.testing.assert_close(torch.func.vmap(loss)(xs, ys), torch.stack([loss(x, y) for x, y in zip(xs, ys)]),
                               rtol=0, atol=0)
    grads = torch.func.vmap(torch.func.grad(loss))(xs, ys)
    torch.testing.assert_close(grads, torch.stack([torch.func.grad(loss)(x, y) for x, y in zip(xs, ys)]),
                               rtol=0, atol=0)
    infonce = torch.func.vmap(lambda x, y: eo.infonce_loss(x, y, backend="reference", check_finite=check_finite))
    torch.testing.assert_close(infonce(xs, ys), torch.stack([eo.infonce_loss(x, y, backend="reference")
                                                            for x, y in zip(xs, ys)]), rtol=0, atol=0)
    if check_finite:
        xs[1, 0, 0] = float("nan")  # one member of the batch
        with pytest.raises(ValueError, match="x contains NaN or Inf"):
            torch.func.vmap(loss)(xs, ys)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_tensor_tau_on_a_bf16_similarity_rounds_the_logits_once(gen, backend):
    """A tensor τ scales s in float32 (losses.scaled_similarity): rounded back to bf16, every
    logit took a second rounding and the gradient left SPEC §5's bf16 allowance (1e-2; 0.12 here,
    the hard regime at τ = 0.02); a float τ's path, which rounds s once, is the measure."""
    x, y = hard_pairs(128, 64, dtype=torch.float64, generator=gen)
    s = (x @ y.T).bfloat16()
    s_ref = s.double().requires_grad_()
    (g_ref,) = torch.autograd.grad(eo.reference.evidential_loss_from_similarity(s_ref, tau=0.02), s_ref)
    errors = []
    for tau in (0.02, torch.tensor(0.02)):  # the float32 reference overflows e^(1/0.01)
        s_in = s.clone().requires_grad_()
        (g,) = torch.autograd.grad(eo.evidential_loss_from_similarity(s_in, tau=tau, backend=backend), s_in)
        assert g.dtype == torch.bfloat16
        errors.append(((g.double() - g_ref).abs().max() / g_ref.abs().max()).item())
    assert errors[1] <= 1e-2, errors
    # No rounding beyond the float τ path's: both form the same logits (1/float32(0.02) is 50, and a
    # bf16 s times 50 is exact in float32) and differ at most in the float32 ∂L/∂s before its one
    # rounding to bf16, which then lands at most one bf16 step apart: 2^-8 of an entry.
    assert errors[1] <= errors[0] + 2.0**-8, errors


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_tensor_tau_that_overflows_float16_inputs_names_tau(backend):
    """SPEC §1: never NaN where a float τ is finite; a ValueError naming τ instead."""
    x = torch.eye(4, 8, dtype=torch.float16)
    y = F.normalize(torch.eye(4, 8) + 0.5 * torch.eye(4, 8).roll(1, 1), dim=1).half()
    assert torch.isfinite(eo.evidential_loss(x, y, evidence="relu", tau=1e-5, backend=backend))
    for keywords in ({"tau": torch.tensor(1e-5)}, {"logit_scale": torch.tensor(12.0)}):
        with pytest.raises(ValueError, match=r"^tau \(a tensor, or logit_scale\): x/tau overflows float16"):
            eo.evidential_loss(x, y, evidence="relu", backend=backend, **keywords)
    with pytest.raises(ValueError, match=r"^tau \(a tensor, or logit_scale\): x/tau overflows float16"):
        eo.infonce_loss(x, y, tau=torch.tensor(1e-5), backend=backend)


def test_criteria_check_what_they_are_given_when_constructed():
    """EvidentialLoss / InfoNCELoss: 'Keywords are validated at construction', a tensor τ's value
    too; options a from-similarity loss cannot use are refused, not ignored; EvidentialClipLoss
    takes the model's logit_scale, never a default τ in its place."""
    for keywords, message in (({"tau": torch.tensor(-1.0)}, "tau must be positive"),
                              ({"logit_scale": torch.tensor(float("nan"))}, "logit_scale"),
                              ({"from_similarity": True, "normalize": True}, "act on embeddings"),
                              ({"from_similarity": True, "matmul_precision": "tf32"}, "act on embeddings")):
        with pytest.raises(ValueError, match=message):
            eo.EvidentialLoss(**keywords)
    with pytest.raises(ValueError, match="tau must be positive"):
        eo.InfoNCELoss(tau=torch.tensor(0.0))
    eo.EvidentialLoss(tau=torch.nn.Parameter(torch.tensor(0.05)))  # a valid learnable τ
    x = F.normalize(torch.randn(6, 4, dtype=torch.float64), dim=1)
    with pytest.raises(ValueError, match="logit_scale is required"):
        eo.EvidentialClipLoss()(x, x, None)
