"""The fused C++ CPU backend against the float64 reference (issue "Fused CPU kernels").

Tolerances are SPEC §5's: from a similarity matrix, float32 losses within 1e-5 relative (1e-4 for
fmse/logdet) and gradients within 1e-4 (max-abs relative); from embeddings the float32 tile GEMM
adds 8·√D·2⁻²⁴/τ; float16/bfloat16 inputs within 1e-2. Near-zero terms get an absolute floor of
1e-10, kl/logdet are relative to max(|ref|, 1e-3).
"""

from __future__ import annotations

import math

import pytest
import torch

import evidential_ops as eo
from conftest import hard_pairs, random_pairs
from evidential_ops import cpu_backend

pytestmark = pytest.mark.skipif("cpu" not in eo.available_backends(), reason="C++ extension not built")

ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}
LOSS_RTOL = {"risk": 1e-5, "kl": 1e-5, "mse": 1e-5, "fmse": 1e-4, "logdet": 1e-4}
GRAD_RTOL = 1e-4


def available_isas() -> list[str]:
    current = cpu_backend.cpu_isa()
    isas = []
    for isa in ("generic", "avx2", "avx512"):
        try:
            cpu_backend.cpu_isa(isa)
            isas.append(isa)
        except ValueError:
            pass
    cpu_backend.cpu_isa(current)
    return isas


ISAS = available_isas()


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs the test once per instruction-set variant of the tile kernels this CPU can run."""
    previous = cpu_backend.cpu_isa()
    cpu_backend.cpu_isa(request.param)
    yield request.param
    cpu_backend.cpu_isa(previous)


def gemm_allowance(d: int, tau: float) -> float:
    return 8 * math.sqrt(d) * 2.0**-24 / tau


def rel_error(got: torch.Tensor, ref: torch.Tensor, term: str) -> float:
    got, ref = got.double(), ref.double()
    if term in ("kl", "logdet") or term == "all":
        return float(((got - ref).abs() / ref.abs().clamp_min(1e-3)).max())
    return float(((got - ref).abs() / (ref.abs() + 1e-10 / LOSS_RTOL[term])).max())


def grad_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def run(fn, inputs, upstream):
    """Per-line losses and the gradient of Σ upstream·losses w.r.t. each input."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    rows, cols = fn(*leaves)
    total = sum((part * w.to(part.dtype)).sum() for part, w in zip((rows, cols), upstream) if part.numel())
    grads = torch.autograd.grad(total, leaves)
    return rows.detach(), cols.detach(), grads


def compare_backends(inputs, kwargs, upstream, *, from_similarity: bool, loss_tol: float, grad_tol: float, terms):
    fused_fn = eo.evidential_loss_from_similarity if from_similarity else eo.evidential_loss
    ref_fn = eo.reference.evidential_loss_from_similarity if from_similarity else eo.reference.evidential_loss
    rows, cols, grads = run(lambda *t: fused_fn(*t, backend="cpu", reduction="none", **kwargs), inputs, upstream)
    ref_rows, ref_cols, ref_grads = run(lambda *t: ref_fn(*t, reduction="none", **kwargs), inputs, upstream)
    term = terms if isinstance(terms, str) else "all"
    for got, ref in ((rows, ref_rows), (cols, ref_cols)):
        assert got.shape == ref.shape
        if got.numel():
            assert torch.isfinite(got).all()
            assert rel_error(got, ref, term) <= loss_tol, (term, rel_error(got, ref, term))
    for got, ref, leaf in zip(grads, ref_grads, inputs):
        assert got.dtype == leaf.dtype and torch.isfinite(got).all()
        assert grad_error(got, ref) <= grad_tol, grad_error(got, ref)


# ---------------------------------------------------------------- accuracy, every term and option


@pytest.mark.parametrize("regime", ["random", "hard"])
@pytest.mark.parametrize("term", list(LOSS_RTOL))
def test_each_term_from_similarity_matches_reference(gen, isa, regime, term):
    k = 113
    x, y = (hard_pairs if regime == "hard" else random_pairs)(k, 203, generator=gen, dtype=torch.float64)
    s = (x @ y.T).float()  # the reference sees the same rounded similarities
    c = torch.rand(k, generator=gen)
    upstream = (torch.rand(k, generator=gen) + 0.5, torch.rand(k, generator=gen) + 0.5)
    kwargs = dict(evidence="exp", tau=0.05, weights={term: 1.0}, target_scale=c)
    compare_backends((s,), kwargs, upstream, from_similarity=True, loss_tol=LOSS_RTOL[term], grad_tol=GRAD_RTOL, terms=term)


@pytest.mark.parametrize("evidence,tau", [("exp", 0.05), ("relu", 1.0), ("relu", 0.1), ("softplus", 0.05), ("exp_tanh", 0.1)])
@pytest.mark.parametrize("direction", ["rows", "cols", "both"])
def test_every_evidence_and_direction_from_embeddings(gen, evidence, tau, direction):
    k, d = 113, 203
    x, y = random_pairs(k, d, generator=gen, positive_cos=0.8)
    c = torch.rand(k, generator=gen)
    upstream = (torch.rand(k, generator=gen), torch.rand(k, generator=gen))
    kwargs = dict(evidence=evidence, tau=tau, weights=ALL_WEIGHTS, direction=direction, target_scale=c)
    tol = 1e-4 + gemm_allowance(d, tau)
    compare_backends((x, y), kwargs, upstream, from_similarity=False, loss_tol=tol, grad_tol=GRAD_RTOL + gemm_allowance(d, tau), terms="all")


@pytest.mark.parametrize("isa_name", ISAS)
def test_hard_regime_all_terms_from_embeddings_per_isa(gen, isa_name):
    previous = cpu_backend.cpu_isa(isa_name)
    try:
        k, d = 300, 64  # several 64-wide blocks: multi-round schedule, partial last block
        x, y = hard_pairs(k, d, generator=gen)
        upstream = (torch.full((k,), 1.0 / k), torch.full((k,), 1.0 / k))
        kwargs = dict(evidence="exp", tau=0.05, weights=ALL_WEIGHTS)
        tol = 1e-4 + gemm_allowance(d, 0.05)
        compare_backends((x, y), kwargs, upstream, from_similarity=False, loss_tol=tol, grad_tol=GRAD_RTOL + gemm_allowance(d, 0.05), terms="all")
    finally:
        cpu_backend.cpu_isa(previous)


def test_isa_variants_agree(gen):
    x, y = hard_pairs(113, 203, generator=gen)
    results = {}
    previous = cpu_backend.cpu_isa()
    try:
        for isa_name in ISAS:
            cpu_backend.cpu_isa(isa_name)
            results[isa_name] = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, reduction="none", backend="cpu")
    finally:
        cpu_backend.cpu_isa(previous)
    base = results[ISAS[0]]
    for rows, cols in results.values():
        torch.testing.assert_close(rows, base[0], rtol=1e-6, atol=0)
        torch.testing.assert_close(cols, base[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_within_1e_2(gen, dtype):
    k, d = 113, 203
    x, y = random_pairs(k, d, generator=gen, positive_cos=0.9)
    x, y = x.to(dtype), y.to(dtype)
    upstream = (torch.full((k,), 1.0), torch.full((k,), 1.0))
    compare_backends((x, y), dict(weights=ALL_WEIGHTS), upstream, from_similarity=False, loss_tol=1e-2, grad_tol=1e-2, terms="all")
    s = (x.float() @ y.float().T).to(dtype)
    compare_backends((s,), dict(weights=ALL_WEIGHTS), upstream, from_similarity=True, loss_tol=1e-2, grad_tol=1e-2, terms="all")


def test_float64_inputs_run_the_double_path_exactly(gen):
    x, y = hard_pairs(113, 203, generator=gen, dtype=torch.float64)
    upstream = (torch.rand(113, generator=gen, dtype=torch.float64),) * 2
    compare_backends((x, y), dict(weights=ALL_WEIGHTS), upstream, from_similarity=False, loss_tol=1e-9, grad_tol=1e-9, terms="all")


@pytest.mark.parametrize("term", list(LOSS_RTOL))
def test_gradcheck_float64(gen, term):
    x, y = random_pairs(7, 5, generator=gen, dtype=torch.float64, positive_cos=0.7)
    x.requires_grad_()
    y.requires_grad_()
    c = torch.rand(7, generator=gen, dtype=torch.float64)
    fn = lambda x, y: eo.evidential_loss(x, y, tau=0.2, weights={term: 1.0}, target_scale=c, backend="cpu", reduction="sum")
    assert torch.autograd.gradcheck(fn, (x, y), eps=1e-6, atol=1e-6, rtol=1e-5)
    s = (x.detach() @ y.detach().T).requires_grad_()
    fn_s = lambda s: eo.evidential_loss_from_similarity(s, tau=0.2, weights={term: 1.0}, target_scale=c, backend="cpu")
    assert torch.autograd.gradcheck(fn_s, (s,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_target_scale_bool_and_extremes(gen):
    x, y = random_pairs(64, 32, generator=gen)
    labels = torch.rand(64, generator=gen) > 0.4
    for scale in (labels, torch.zeros(64), torch.ones(64)):
        a = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, target_scale=scale, reduction="none", backend="cpu")
        b = eo.reference.evidential_loss(x, y, weights=ALL_WEIGHTS, target_scale=scale, reduction="none")
        for got, ref in zip(a, b):
            assert rel_error(got, ref, "all") <= 1e-4 + gemm_allowance(32, 0.05)


# ---------------------------------------------------------------- numerics at the edges


@pytest.mark.parametrize("tau", [0.02, 0.01])
def test_small_tau_finite_and_correct(gen, tau):
    """e = exp(s/τ) reaches e^100 at τ = 0.01: beyond float32, never a NaN here (SPEC §1)."""
    k, d = 113, 203
    x, y = hard_pairs(k, d, generator=gen)
    upstream = (torch.full((k,), 1.0 / k),) * 2
    tol = 1e-4 + gemm_allowance(d, tau)
    compare_backends((x, y), dict(tau=tau, weights=ALL_WEIGHTS), upstream, from_similarity=False, loss_tol=tol, grad_tol=GRAD_RTOL + gemm_allowance(d, tau), terms="all")
    s = (x.double() @ y.double().T).float()
    compare_backends((s,), dict(tau=tau, weights=ALL_WEIGHTS), upstream, from_similarity=True, loss_tol=1e-4, grad_tol=GRAD_RTOL, terms="all")


def test_overflow_beyond_double_is_an_error_naming_tau():
    s = torch.full((4, 4), 10.0)
    with pytest.raises(ValueError, match="tau=0.01"):
        eo.evidential_loss_from_similarity(s, tau=0.01, backend="cpu")


def test_nan_input_with_check_finite_false_gives_nan_not_a_plausible_loss(gen):
    x, y = random_pairs(40, 8, generator=gen)
    x[3, 2] = float("nan")
    loss = eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="cpu", check_finite=False)
    assert torch.isnan(loss)


# ---------------------------------------------------------------- determinism, threads, autograd plumbing


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


def test_needs_input_grad_is_honoured(gen):
    x, y = random_pairs(70, 16, generator=gen)
    x.requires_grad_()
    eo.evidential_loss(x, y, backend="cpu").backward()
    assert x.grad is not None and y.grad is None
    with torch.no_grad():
        assert eo.evidential_loss(x, y, backend="cpu").requires_grad is False


def test_non_contiguous_inputs(gen):
    x, y = random_pairs(65, 40, generator=gen)
    x_nc = torch.stack([x, x], dim=2).reshape(65, 80)[:, ::2]  # column stride 2, same values
    assert not x_nc.is_contiguous() and torch.equal(x_nc, x)
    y_nc = y.T.contiguous().T
    torch.testing.assert_close(
        eo.evidential_loss(x_nc, y_nc, weights=ALL_WEIGHTS, backend="cpu"),
        eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="cpu"),
    )
    s = x @ y.T
    torch.testing.assert_close(
        eo.evidential_loss_from_similarity(s.T.contiguous().T, backend="cpu", reduction="none"),
        eo.evidential_loss_from_similarity(s, backend="cpu", reduction="none"),
    )


def test_auto_picks_cpu_for_cpu_tensors(gen):
    x, y = random_pairs(16, 8, generator=gen)
    torch.testing.assert_close(eo.evidential_loss(x, y), eo.evidential_loss(x, y, backend="cpu"))
    assert eo.backends.resolve("auto", torch.device("cpu")).name == "cpu"


def test_opcheck(gen):
    x, y = random_pairs(70, 12, generator=gen)
    c = torch.rand(70, generator=gen, dtype=torch.float64)
    w = torch.tensor(list(ALL_WEIGHTS.values()), dtype=torch.float64)
    ops = torch.ops.evidential_ops
    torch.library.opcheck(ops.loss_forward, (x.requires_grad_(), y.requires_grad_(), c, "exp", 0.05, w, True, True))
    s = (x @ y.T).detach().requires_grad_()
    torch.library.opcheck(ops.loss_forward_from_similarity, (s, None, "exp_tanh", 0.1, w, True, False))
    torch.library.opcheck(ops.opinion, (x.detach(), y.detach()[:33], "exp", 0.05))
    torch.library.opcheck(ops.opinion_from_similarity, (s.detach()[:20], "relu", 1.0))
    # Transposed inputs: the fakes must promise the contiguous gradients the kernels return.
    xt, yt = x.detach().T.contiguous().T.requires_grad_(), y.detach().T.contiguous().T.requires_grad_()
    torch.library.opcheck(ops.loss_forward, (xt, yt, None, "softplus", 0.05, w, True, True))
    st = s.detach().T.contiguous().T.requires_grad_()
    torch.library.opcheck(ops.loss_forward_from_similarity, (st, c, "exp", 0.05, w, True, True))


def test_direct_op_calls_check_their_sizes(gen):
    """The ops are reachable without the Python checks (torch.ops.evidential_ops.*): a wrong
    size must be a ValueError, never an out-of-bounds read."""
    x, y = random_pairs(40, 8, generator=gen)
    w = torch.tensor(list(ALL_WEIGHTS.values()), dtype=torch.float64)
    ops = torch.ops.evidential_ops
    rows, cols, stats = ops.loss_forward(x, y, None, "exp", 0.05, w, True, True)
    with pytest.raises(ValueError, match="target_scale"):
        ops.loss_forward(x, y, torch.ones(39, dtype=torch.float64), "exp", 0.05, w, True, True)
    with pytest.raises(ValueError, match="embedding size"):
        ops.loss_forward(x, y[:, :7], None, "exp", 0.05, w, True, True)
    with pytest.raises(ValueError, match="square"):
        ops.loss_forward(x, y[:39], None, "exp", 0.05, w, True, True)
    with pytest.raises(ValueError, match="stats"):
        ops.loss_backward(rows, cols, x, y, None, stats[:, :, :39], "exp", 0.05, w, True, True, [True, True])
    with pytest.raises(ValueError, match="grad_rows"):
        ops.loss_backward(rows[:39], cols, x, y, None, stats, "exp", 0.05, w, True, True, [True, True])
    with pytest.raises(ValueError, match="grad_cols"):
        ops.loss_backward_from_similarity(rows, cols[:1], x @ y.T, None, stats, "exp", 0.05, w, True, True)
    with pytest.raises(TypeError, match="dtype"):
        ops.opinion(x, y.double(), "exp", 0.05)


def test_torch_compile_fullgraph(gen):
    x, y = random_pairs(96, 24, generator=gen)

    def step(x, y):
        return eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="cpu", check_finite=False)

    compiled = torch.compile(step, fullgraph=True)
    xe, ye = x.clone().requires_grad_(), y.clone().requires_grad_()
    xc, yc = x.clone().requires_grad_(), y.clone().requires_grad_()
    eager = step(xe, ye)
    eager.backward()
    result = compiled(xc, yc)
    result.backward()
    torch.testing.assert_close(result, eager)
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(yc.grad, ye.grad)


def test_torch_compile_does_not_recompile_for_each_annealed_weight(gen):
    """TCL anneals λ every epoch: a new λ must not cost a new graph (weights reach the op as a
    tensor). At most two frames: dynamo specialises a first value of 0.0."""
    from torch._dynamo.testing import CompileCounter

    x, y = random_pairs(48, 16, generator=gen)
    counter = CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def step(x, y, lam):
        return eo.evidential_loss(x, y, weights={"risk": 1.0, "kl": lam}, backend="cpu", check_finite=False)

    for epoch in range(10):
        lam = min(1.0, 0.005 * epoch)
        torch.testing.assert_close(step(x, y, lam), eo.evidential_loss(x, y, weights={"risk": 1.0, "kl": lam}))
    assert counter.frame_count <= 2


# ---------------------------------------------------------------- opinions


# (1, 3000), (7, 500), (300, 70): the chunked path of skinny problems (rows, then columns short).
@pytest.mark.parametrize("n_q,n_g", [(1, 3000), (7, 500), (300, 70), (113, 113)])
@pytest.mark.parametrize("evidence", eo.EVIDENCE_KINDS)
def test_opinion_matches_reference(gen, n_q, n_g, evidence):
    x, _ = random_pairs(n_q, 48, generator=gen)
    y, _ = random_pairs(n_g, 48, generator=gen)
    tau = 0.05 if evidence != "relu" else 0.5
    got = eo.opinion(x, y, evidence=evidence, tau=tau, backend="cpu")
    ref = eo.reference.opinion(x, y, evidence=evidence, tau=tau)
    for name in ("row_log_strength", "row_uncertainty", "col_log_strength", "col_uncertainty"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a.shape == b.shape
        # Relative error of S and u; for ln S that is its absolute error (ln S ≈ 0 when a
        # line has a single candidate, N_q = 1, where a relative error of ln S means nothing).
        error = (a.double() - b).abs() / (1.0 if "log" in name else b.abs().clamp_min(1e-30))
        assert float(error.max()) <= 1e-5 + gemm_allowance(48, tau), name
    s = x @ y.T
    got_s = eo.opinion_from_similarity(s, evidence=evidence, tau=tau, backend="cpu")
    ref_s = eo.reference.opinion_from_similarity(s, evidence=evidence, tau=tau)
    torch.testing.assert_close(got_s.row_log_strength.double(), ref_s.row_log_strength, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_s.col_log_strength.double(), ref_s.col_log_strength, rtol=1e-6, atol=1e-6)


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


def test_opinion_small_tau_does_not_overflow(gen):
    x, y = random_pairs(20, 16, generator=gen, positive_cos=0.999)
    op = eo.opinion(x, y, tau=0.005, backend="cpu")  # e^200: no float32 holds it, its log does
    ref = eo.reference.opinion(x, y, tau=0.005)
    assert torch.isfinite(op.row_log_strength).all()
    torch.testing.assert_close(op.row_log_strength.double(), ref.row_log_strength, rtol=1e-5, atol=0)
