"""The fused InfoNCE op (SPEC §2 "InfoNCE") of every fused backend against the float64 reference.

Parametrised over the same backends as test_fused_backends.py (python_tests/fused_backends.py).
Tolerances from the arithmetic (SPEC §2 "InfoNCE", §5): a loss is LSE_D − LSE_P, whose
sensitivity to the logits sums to at most 2 (two softmaxes), so from float32 embeddings, with a
logit off by at most 8·√D·2⁻²⁴/τ (the float32 tile GEMM, §5), a loss is within
2·8·√D·2⁻²⁴/τ absolute plus 1e-5 relative (float64 line sums, one float32 rounding of the result);
gradients within 1e-4 + 8·√D·2⁻²⁴/τ of the largest entry (max-abs relative), as the evidential
losses. The float32 element math adds its own bound to both (float32_element_error). The reference
sees the same float32 inputs, upcast, with exact float64 products.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import evidential_ops as eo
from conftest import hard_pairs, random_pairs
from fused_backends import fused_cases, run

# The backends whose op family has InfoNCE kernels for their test device (the cuda family has none:
# README Limitations); the others are checked to refuse it by name (test_backends_without_kernels_*).
CASES = [case for case in fused_cases()
         if eo.infonce._has_infonce_kernels(eo.backends.resolve(case.name, case.device), case.device)]
WITHOUT_KERNELS = [case for case in fused_cases() if case not in CASES]
pytestmark = pytest.mark.skipif(not CASES, reason="no fused backend with InfoNCE kernels built")
# Triton's other way to the same function (infonce_launch.py): the cuBLAS strips, which CUDA
# tensors take in eager mode, as well under the interpreter; on a GPU the tile kernels as well,
# which traced graphs and float64 inputs take.
# Under the interpreter the strips also take 16-bit inputs (their G in two parts of the input
# dtype: infonce_strip_grad_kernel's SPLIT).
CASES += [replace(case, variant="strips", dtypes=case.dtypes + (torch.float16, torch.bfloat16))
          if case.device.type == "cpu" else replace(case, variant="tiles")
          for case in CASES if case.name == "triton"]

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4


@pytest.fixture(params=CASES, ids=str)
def fused(request, monkeypatch):
    case = request.param
    if case.name == "triton":
        from evidential_ops.triton_backend import infonce_launch

        if case.variant == "strips":
            # several strips at every size the interpreter is given (16 rows of 64 float32 lines)
            monkeypatch.setattr(infonce_launch, "STRIPS_IN_INTERPRETER", True)
            monkeypatch.setattr(infonce_launch, "STRIP_MIN_ROWS", 1)
            monkeypatch.setattr(infonce_launch, "INFONCE_STRIP_BYTES", 16 * 64 * 4)
        elif case.variant == "tiles":
            monkeypatch.setattr(infonce_launch, "uses_strips", lambda x: False)
    return case


def logit_error(d: int, tau: float, dtype: torch.dtype = torch.float32) -> float:
    """Bound on a logit's error from the tile GEMM in `dtype` (SPEC §5: 8·√D·u/τ, u = 2⁻²⁴ for
    float32)."""
    return 8 * math.sqrt(d) * (torch.finfo(dtype).eps / 2) / tau


def float32_element_error(tau: float) -> tuple[float, float]:
    """(absolute loss bound, relative gradient bound) of the float32 element math (SPEC §2
    "InfoNCE", float32 element math), unit embeddings (|s| <= 1): LSE_D within u·(33 + 1.5·ln 512),
    a gradient entry within u·(|s|/τ + |d|/2 + 4) <= u·(2/τ + 4) relative (|d| <= 2/τ)."""
    u = 2.0**-24
    return u * (33 + 1.5 * math.log(512)), u * (2 / tau + 4)


def compare(fused, x, y, upstream=None, **kwargs):
    """Fused losses and gradients (x, y) against the float64 reference; returns the errors
    (largest loss error over its tolerance, largest gradient error over its tolerance)."""
    k, d = x.shape
    tau = kwargs.get("tau", 0.05)
    tau_value = float(tau) if not isinstance(tau, torch.Tensor) else float(tau.detach())
    if upstream is None:
        gen = torch.Generator().manual_seed(7)
        upstream = (torch.rand(k, generator=gen) + 0.5, torch.rand(k, generator=gen) + 0.5)
    device = fused.device
    kw_device = {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in kwargs.items()}
    rows, cols, grads = run(lambda a, b: eo.infonce_loss(a, b, backend=fused.name, reduction="none", **kw_device),
                            [x.to(device), y.to(device)], [u.to(device) for u in upstream])
    # The reference's own gradients in float64 (half leaves would round them to the half dtype).
    ref_rows, ref_cols, ref_grads = run(lambda a, b: eo.reference.infonce_loss(a, b, reduction="none", **kwargs),
                                        [x.double(), y.double()], upstream)
    # Float64 inputs: the same bound at u = 2⁻⁵³, plus the rounding of LSE_D − LSE_P, each LSE at
    # most max|s|/τ + ln K (ℓ cancels where a row is confident).
    exact = x.dtype == torch.float64
    # Half inputs are widened exactly and multiplied in float32: float32's GEMM bound.
    loss_abs = 2 * logit_error(d, tau_value, torch.float64 if exact else torch.float32)
    loss_rel = 1e-12 if exact else LOSS_RTOL
    if exact:
        loss_abs += 4 * 2.0**-53 * (1 / tau_value + math.log(k))
    grad_tol = 1e-12 if exact else GRAD_RTOL + logit_error(d, tau_value)
    if not exact:
        element_loss, element_grad = float32_element_error(tau_value)
        loss_abs += element_loss
        grad_tol += element_grad
    half = x.dtype in (torch.float16, torch.bfloat16)
    if half:  # the gradients are rounded once to the input dtype, subnormals included
        grad_tol += torch.finfo(x.dtype).eps / 2
    # Float64: each softmax entry p = e^{v − LSE} is off by p·(2u(1/τ + ln K) + logit error), and
    # dx_i = (1/τ)Σ_j G_ij y_j sums four softmaxes (two per direction, each summing to 1) weighted
    # by upstream ≤ 1.5 and |y| ≤ 1: an absolute bound, since a confident row's gradient is far
    # smaller than that rounding of its logits.
    grad_abs = torch.finfo(x.dtype).smallest_normal * torch.finfo(x.dtype).eps / 2 if half else 0.0
    if exact:
        grad_abs = 6 / tau_value * (2 * 2.0**-53 * (1 / tau_value + math.log(k)) + logit_error(d, tau_value, x.dtype))
    worst_loss = 0.0
    for got, ref in ((rows, ref_rows), (cols, ref_cols)):
        assert got.shape == ref.shape
        if got.numel():
            assert got.device.type == device.type and torch.isfinite(got).all()
            err = (got.double().cpu() - ref).abs() / (loss_rel * ref.abs() + loss_abs + 1e-300)
            worst_loss = max(worst_loss, float(err.max()))
    worst_grad = 0.0
    for got, ref, leaf in zip(grads, ref_grads, (x, y)):
        assert got.dtype == leaf.dtype and torch.isfinite(got).all()
        err = float((got.double().cpu() - ref).abs().max())
        worst_grad = max(worst_grad, err / (grad_tol * float(ref.abs().max()) + grad_abs + 1e-300))
    assert worst_loss <= 1.0, f"loss error {worst_loss:.3g}× its tolerance"
    assert worst_grad <= 1.0, f"gradient error {worst_grad:.3g}× its tolerance"
    return worst_loss, worst_grad


def mixed_groups(k: int, generator: torch.Generator, smallest: int = 1) -> torch.Tensor:
    """Ids of groups of sizes smallest..5 in turn, members scattered over the batch."""
    sizes, total = [], 0
    while total < k:
        size = min(smallest + len(sizes) % (6 - smallest), k - total)
        sizes.append(size)
        total += size
    if sizes[-1] < smallest:  # fold a too-small tail into the first group (of the smallest size)
        sizes[0] += sizes.pop()
    ids = torch.repeat_interleave(torch.arange(len(sizes)) * 7 - 40, torch.tensor(sizes))
    return ids[torch.randperm(k, generator=generator)]


# --------------------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("direction", ["rows", "cols", "both"])
def test_forward_and_backward_match_reference(fused, gen, direction):
    x, y = random_pairs(113, 203, generator=gen, positive_cos=0.8)
    compare(fused, x, y, tau=0.05, direction=direction)


@pytest.mark.parametrize("drop_self", [False, True])
def test_group_positives_sizes_one_to_five(fused, gen, drop_self):
    k, d = 113, 203
    x, y = random_pairs(k, d, generator=gen, positive_cos=0.8)
    # drop_self needs another member in every group: sizes 2..5 there, 1..5 otherwise.
    group = mixed_groups(k, gen, smallest=2 if drop_self else 1)
    counts = torch.unique(group, return_counts=True)[1]
    assert counts.min() == (2 if drop_self else 1) and counts.max() == 5
    compare(fused, x, y, tau=0.05, group=group, drop_self=drop_self)


def fume_eq_6_7(z: list[torch.Tensor], tau: float, exclude_self: bool) -> torch.Tensor:
    """L_cl = −(1/N) Σ_j Σ_i ln(Σ_v e^{z_i^v·z_i^j/τ} / Σ_v Σ_t e^{z_t^v·z_i^j/τ}) as printed,
    without (or, exclude_self, with the released code's removal of) the self term v = j, t = i."""
    n, total = z[0].shape[0], 0.0
    for j, anchors in enumerate(z):
        for i in range(n):
            logits = torch.stack([zv @ anchors[i] for zv in z]) / tau  # (M, N): [v, t]
            keep = torch.ones_like(logits, dtype=torch.bool)
            if exclude_self:
                keep[j, i] = False
            numerator = torch.logsumexp(logits[:, i][keep[:, i]], dim=0)
            total = total - (numerator - torch.logsumexp(logits[keep], dim=0))
    return total / n


def test_drop_self_on_one_tower_is_fume_consistency(fused, gen):
    # FUME eq. 6-7: x = y = the anchors of every modality stacked, group = instance.
    n, modalities, d = 37, 3, 64
    z = [torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1) for _ in range(modalities)]
    stacked = torch.cat(z)
    group = torch.arange(n).repeat(modalities)
    for drop_self in (False, True):
        fused_value = eo.infonce_loss(stacked.to(fused.device), stacked.to(fused.device), tau=0.5,
                                      group=group.to(fused.device), drop_self=drop_self, direction="rows",
                                      reduction="sum", backend=fused.name) / n
        expected = fume_eq_6_7([t.double() for t in z], tau=0.5, exclude_self=drop_self)
        # 2·8·√D·2⁻²⁴/τ per line, 111 lines summed, divided by n; plus 1e-5 relative.
        tol = LOSS_RTOL * float(expected.abs()) + modalities * 2 * logit_error(d, 0.5)
        assert abs(float(fused_value) - float(expected)) <= tol


def test_hard_regime(fused, gen):
    # Positives at cosine 0.99 and three near-duplicate hard negatives per row, τ = 0.05: the
    # default positives, then the groups themselves as positives.
    k, d = 113, 203
    x, y = hard_pairs(k, d, generator=gen)
    compare(fused, x, y, tau=0.05)
    compare(fused, x, y, tau=0.05, group=torch.arange(k) // 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_hard_regime(fused, gen, dtype):
    # Half embeddings take the float32 path from their exact float32 widening; the reference sees
    # the same half values in float64.
    if dtype not in fused.dtypes:
        pytest.skip(f"{fused.name} is not tested with {dtype} here")
    k, d = 113, 203
    x, y = (t.to(dtype) for t in hard_pairs(k, d, generator=gen))
    compare(fused, x, y, tau=0.05, group=torch.arange(k) // 4)
    pairs = torch.arange(k) // 2
    pairs[-1] = pairs[-2]  # drop_self needs two members in every group: the last one takes three
    compare(fused, x, y, tau=0.05, drop_self=True, group=pairs)


@pytest.mark.parametrize("packed", ["1", "0"])
def test_cpu_packed_tiles_at_a_size_that_packs(fused, gen, monkeypatch, packed):
    # K = 2085: 256-row blocks with a partial last one, the smallest size whose tile GEMMs take
    # the packed operands (forward y, backward x) when the BLAS has them; both paths must hold.
    if fused.name != "cpu":
        pytest.skip("the packed tile GEMMs are the CPU backend's")
    monkeypatch.setenv("EO_CPU_PACKED_GEMM", packed)
    k, d = 2085, 203
    x, y = hard_pairs(k, d, generator=gen)
    compare(fused, x, y, upstream=(torch.full((k,), 1.0 / k), torch.full((k,), 0.5 / k)), tau=0.05,
            group=torch.arange(k) // 4)


def test_cpu_tau_beyond_the_float32_path_takes_float64(fused, gen):
    # 1/τ = 1e40 is not a float: the float32 element path would multiply by +inf (and form a peak's
    # exponent as 0·inf). Such tiles take the float64 element path, whose losses must be those of
    # float64 inputs up to the two GEMMs. Embeddings of norm 1e-15 keep the logits at
    # |s|/τ <= 1e10, finite in float64; they are within Δv = 2γ_D·1e-30/τ of each other and the
    # losses within 2Δv. (The backward's G = (∂L/∂s)/τ, up to 1/τ, is itself beyond float32 here:
    # only the forward is compared.)
    if fused.name != "cpu":
        pytest.skip("the float32 element path is the CPU backend's")
    k, d, tau, norm = 40, 16, 1e-40, 1e-15
    # Positives at cosine 0.3: most rows and columns peak at a negative.
    x, y = (t * norm for t in random_pairs(k, d, generator=gen, positive_cos=0.3))
    with torch.no_grad():
        r32, c32 = eo.infonce_loss(x, y, tau=tau, backend="cpu", reduction="none", direction="both")
        r64, c64 = eo.infonce_loss(x.double(), y.double(), tau=tau, backend="cpu", reduction="none",
                                   direction="both")
    u = 2.0**-24
    delta_v = 2 * (d * u / (1 - d * u)) * norm**2 / tau
    for got, want in ((r32.double(), r64), (c32.double(), c64)):
        assert torch.isfinite(got).all()
        assert float((got - want).abs().max()) <= 2 * delta_v + u * float(want.abs().max())


@pytest.mark.parametrize("tau", [0.01])
def test_small_tau_is_finite_and_correct(fused, gen, tau):
    # e^{0.99/0.01} ≈ 1e43 overflows float32: every backend must stay in log space.
    x, y = hard_pairs(113, 203, generator=gen)
    compare(fused, x, y, tau=tau)


def test_realistic_size_hard_regime(fused, gen):
    k, d = fused.realistic
    x, y = hard_pairs(k, d, generator=gen)
    compare(fused, x, y, upstream=(torch.full((k,), 1.0 / k), torch.full((k,), 1.0 / k)), tau=0.05)


def test_several_blocks_odd_size(fused, gen):
    k = min(fused.max_k, 300)
    x, y = random_pairs(k, 67, generator=gen, positive_cos=0.6)
    compare(fused, x, y, tau=0.1, group=torch.arange(k) % 97)


def test_wide_embeddings(fused, gen):
    # D beyond one register block of the Triton gradient kernel (accumulated chunk by chunk).
    x, y = random_pairs(40, 300, generator=gen, positive_cos=0.7)
    compare(fused, x, y, tau=0.05, group=torch.arange(40) % 17)


@pytest.mark.parametrize("tau", [0.05, 0.07])  # 1/0.07 is no float32: its float32 rounding would cost 2e-8·|v|
def test_float64_inputs_are_exact(fused, gen, tau):
    if torch.float64 not in fused.dtypes:
        pytest.skip(f"{fused.name} is not tested with float64 here")
    x, y = random_pairs(57, 31, generator=gen, dtype=torch.float64, positive_cos=0.9)
    compare(fused, x, y, tau=tau, group=torch.arange(57) % 20)


@pytest.mark.parametrize("drop_self", [False, True])
def test_gradcheck_float64(fused, gen, drop_self):
    if torch.float64 not in fused.dtypes:
        pytest.skip(f"{fused.name} is not tested with float64 here")
    x, y = random_pairs(9, 5, generator=gen, dtype=torch.float64)
    group = torch.tensor([0, 1, 0, 2, 1, 2, 3, 3, 0]).to(fused.device)
    x, y = x.to(fused.device).requires_grad_(), y.to(fused.device).requires_grad_()
    fn = lambda a, b: eo.infonce_loss(a, b, tau=0.3, group=group, drop_self=drop_self, backend=fused.name,
                                      reduction="none")
    assert torch.autograd.gradcheck(fn, (x, y))


@pytest.mark.parametrize("reduction", ["mean", "mean_of_directions", "sum"])
def test_reductions(fused, gen, reduction):
    x, y = random_pairs(64, 32, generator=gen, positive_cos=0.5)
    got = eo.infonce_loss(x.to(fused.device), y.to(fused.device), tau=0.1, reduction=reduction, backend=fused.name)
    ref = eo.reference.infonce_loss(x, y, tau=0.1, reduction=reduction)
    scale = 64 if reduction == "sum" else 1
    assert abs(float(got) - float(ref)) <= LOSS_RTOL * abs(float(ref)) + 2 * scale * 2 * logit_error(32, 0.1)


def test_is_clip_cross_entropy(fused, gen):
    # Default positives and no drop_self: open_clip's ClipLoss, ½(CE(s) + CE(sᵀ)).
    x, y = random_pairs(50, 40, generator=gen, positive_cos=0.7)
    got = eo.infonce_loss(x.to(fused.device), y.to(fused.device), tau=0.07, reduction="mean_of_directions",
                          backend=fused.name)
    logits = x.double() @ y.double().T / 0.07
    labels = torch.arange(50)
    ce = 0.5 * (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels))
    assert abs(float(got) - float(ce)) <= LOSS_RTOL * float(ce) + 2 * logit_error(40, 0.07)


def test_tensor_tau_gradient(fused, gen):
    k, d = 64, 48
    x, y = random_pairs(k, d, generator=gen, positive_cos=0.8)
    grads = {}
    for name, fn, device in (("fused", lambda **kw: eo.infonce_loss(backend=fused.name, **kw), fused.device),
                             ("reference", eo.reference.infonce_loss, torch.device("cpu"))):
        tau = torch.tensor(0.07, device=device, requires_grad=True)
        loss = fn(x=x.to(device), y=y.to(device), tau=tau, group=(torch.arange(k) % 30).to(device))
        grads[name] = float(torch.autograd.grad(loss, tau)[0])
    # SPEC §2 "Learnable temperature": ∂L/∂τ = −(1/τ)⟨x', ∂L/∂x'⟩, each of the K·D products within
    # (GRAD_RTOL + logit error)·max|∂L/∂x'|·max‖x'_i‖ of its share; bounded here by that times K·√D.
    assert abs(grads["fused"] - grads["reference"]) <= (
        (GRAD_RTOL + logit_error(d, 0.07)) * abs(grads["reference"]) * math.sqrt(d)
    )


def test_tensor_tau_gradcheck_float64(fused, gen):
    if torch.float64 not in fused.dtypes:
        pytest.skip(f"{fused.name} is not tested with float64 here")
    x, y = random_pairs(7, 4, generator=gen, dtype=torch.float64)
    tau = torch.tensor(0.2, dtype=torch.float64, device=fused.device, requires_grad=True)
    x, y = x.to(fused.device).requires_grad_(), y.to(fused.device).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, t: eo.infonce_loss(a, b, tau=t, backend=fused.name), (x, y, tau))


def test_criterion_module_matches_function(fused, gen):
    x, y = random_pairs(40, 16, generator=gen)
    group = torch.arange(40) % 13
    module = eo.InfoNCELoss(tau=0.1, drop_self=True, backend=fused.name)
    got = module(x.to(fused.device), y.to(fused.device), group.to(fused.device))
    expected = eo.infonce_loss(x.to(fused.device), y.to(fused.device), tau=0.1, group=group.to(fused.device),
                               drop_self=True, backend=fused.name)
    assert torch.equal(got, expected)


def test_deterministic(fused, gen):
    x, y = random_pairs(300 if fused.max_k >= 300 else fused.max_k, 64, generator=gen)
    x, y = x.to(fused.device), y.to(fused.device)
    group = (torch.arange(x.shape[0]) % 50).to(fused.device)
    first = run(lambda a, b: eo.infonce_loss(a, b, group=group, backend=fused.name, reduction="none"), [x, y],
                [torch.ones(x.shape[0], device=fused.device)] * 2)
    threads = torch.get_num_threads()
    try:
        if fused.name == "cpu":  # the CPU kernels' sums do not depend on the threads (the interpreter's
            # strips take torch's CPU GEMM, whose blocking does: not what this checks)
            torch.set_num_threads(1 if threads > 1 else 2)
        second = run(lambda a, b: eo.infonce_loss(a, b, group=group, backend=fused.name, reduction="none"), [x, y],
                     [torch.ones(x.shape[0], device=fused.device)] * 2)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip((first[0], first[1], *first[2]), (second[0], second[1], *second[2])):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------- bad input


def test_bad_group_is_an_error_naming_group(fused, gen):
    x, y = random_pairs(10, 8, generator=gen)
    x, y = x.to(fused.device), y.to(fused.device)
    call = lambda **kw: eo.infonce_loss(x, y, backend=fused.name, **kw)
    with pytest.raises(ValueError, match="group"):
        call(group=torch.zeros(9, dtype=torch.int64, device=fused.device))
    with pytest.raises(ValueError, match="group"):
        call(group=torch.zeros(10, 1, dtype=torch.int64, device=fused.device))
    with pytest.raises(TypeError, match="group"):
        call(group=torch.zeros(10, device=fused.device))
    with pytest.raises(TypeError, match="group"):
        call(group=torch.zeros(10, dtype=torch.bool, device=fused.device))
    with pytest.raises(TypeError, match="group"):
        call(group=[0] * 10)
    with pytest.raises(ValueError, match="group"):
        call(group=torch.zeros(10, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="group"):
        call(drop_self=True)  # no ids: every line's only positive is itself
    with pytest.raises(ValueError, match="group"):
        call(group=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 5], device=fused.device), drop_self=True)
    # Any integer dtype is accepted and means the same ids.
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    a = call(group=ids.to(device=fused.device, dtype=torch.int16), drop_self=True)
    b = call(group=ids.to(fused.device), drop_self=True)
    assert torch.equal(a, b)


def test_bad_arguments_as_evidential_loss(fused, gen):
    x, y = random_pairs(10, 8, generator=gen)
    x, y = x.to(fused.device), y.to(fused.device)
    with pytest.raises(ValueError, match="tau"):
        eo.infonce_loss(x, y, tau=0.0, backend=fused.name)
    with pytest.raises(ValueError, match="tau"):
        eo.infonce_loss(x, y, tau=torch.tensor([0.1, 0.2], device=fused.device), backend=fused.name)
    with pytest.raises(ValueError, match="same number of rows"):
        eo.infonce_loss(x, y[:9], backend=fused.name)
    with pytest.raises(TypeError, match="y"):
        eo.infonce_loss(x, y.double(), backend=fused.name)
    with pytest.raises(ValueError, match="x contains NaN"):
        eo.infonce_loss(x.clone().fill_(math.nan), y, backend=fused.name)
    with pytest.raises(ValueError, match="direction"):
        eo.infonce_loss(x, y, direction="up", backend=fused.name)
    with pytest.raises(ValueError, match="reduction"):
        eo.infonce_loss(x, y, reduction="max", backend=fused.name)
    with pytest.raises(TypeError, match="drop_self"):
        eo.infonce_loss(x, y, drop_self=1, backend=fused.name)
    with pytest.raises(ValueError, match="K >= 2"):
        eo.infonce_loss(x[:1], y[:1], backend=fused.name)


def test_direct_op_calls_check_their_arguments(fused, gen):
    ops = eo.backends.resolve(fused.name, fused.device).ops
    x, y = random_pairs(10, 8, generator=gen)
    x, y = x.to(fused.device), y.to(fused.device)
    with pytest.raises(TypeError, match="group"):
        ops.infonce_forward(x, y, torch.zeros(10, dtype=torch.int32, device=fused.device), 0.1, False, True, True)
    with pytest.raises(ValueError, match="group"):
        ops.infonce_forward(x, y, torch.zeros(3, dtype=torch.int64, device=fused.device), 0.1, False, True, True)
    with pytest.raises(ValueError, match="tau"):
        ops.infonce_forward(x, y, None, -1.0, False, True, True)
    rows, cols, row_stats, col_stats = ops.infonce_forward(x, y, None, 0.1, False, True, True)
    with pytest.raises(ValueError, match="row_stats"):
        ops.infonce_backward(rows, cols, x, y, None, row_stats[:, :5], col_stats, 0.1, False, True, True,
                             [True, True])


class _OpCalls(TorchDispatchMode):
    """Every op that reaches the dispatcher below autograd while active: (name, its arguments by
    schema name, defaults filled in: trailing defaults do not reach the mode)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.__name__, eo.ops.bound_arguments(func, args, kwargs or {})))
        return func(*args, **(kwargs or {}))


def test_matmul_precision_reaches_forward_and_backward(fused, gen):
    """matmul_precision is an op argument, saved for the backward: both ops receive it. "tf32" lets
    the float32 strips' cuBLAS products (CUDA) round or truncate their operands to TF32's 10
    mantissa bits (each within 2⁻¹⁰): for unit rows a logit moves by at most ε = 2⁻⁹/τ, a line's
    loss (its sensitivities to the logits sum to 2) by 2ε. dx_i = Σ_j (G^r_ij + G^c_ij)·y_j with
    G^r_i· = (p^r_i· − e_i)/τ (row i's softmax) and G^c_ij = (p^c_ij − δ_ij)/τ (column j's softmax
    over i, at row i): |Δp_ij| <= 2ε·p_ij, so Σ_j |ΔG_ij| <= 2ε(1 + c_i)/τ with c_i = Σ_j p^c_ij,
    and the product G·y rounds by 2⁻⁹·Σ_j |G_ij| <= 2⁻⁹(2 + c_i + 1)/τ: |Δdx_ik| <= ‖Δdx_i‖ <=
    [2ε(1 + c_i) + 2⁻⁹(3 + c_i)]/τ (dy the same with the roles swapped), c from the float64
    reference. The CPU, the interpreter and the tile kernels ignore it: equal; the strips on CUDA
    differ. Anything else is a ValueError naming it, from the public API and from the ops."""
    x, y = random_pairs(64, 40, generator=gen, positive_cos=0.8)
    tau = 0.1
    results = {}
    for precision in ("ieee", "tf32"):
        xx, yy = x.to(fused.device).requires_grad_(), y.to(fused.device).requires_grad_()
        with _OpCalls() as seen:
            rows, cols = eo.infonce_loss(xx, yy, tau=tau, reduction="none", backend=fused.name,
                                         matmul_precision=precision)
            (rows.sum() + cols.sum()).backward()
        results[precision] = (rows.detach(), cols.detach(), xx.grad, yy.grad)
        ops = [(name, bound["matmul_precision"]) for name, bound in seen.calls if name.startswith("infonce_")]
        assert ops == [("infonce_forward.default", precision), ("infonce_backward.default", precision)]
    eps = 2.0**-9 / tau
    p = torch.softmax((x.double() @ y.double().T) / tau, dim=0)  # column j's softmax over rows i
    c_rows, c_cols = p.sum(1), torch.softmax((x.double() @ y.double().T) / tau, dim=1).sum(0)
    bounds = [2 * eps, 2 * eps] + [(2 * eps * (1 + c) + 2.0**-9 * (3 + c)) / tau for c in (c_rows, c_cols)]
    for i, (a, b, bound) in enumerate(zip(results["ieee"], results["tf32"], bounds)):
        diff = (a - b).abs().double().cpu()
        if fused.device.type == "cpu":
            assert float(diff.max()) == 0.0
        elif i < 2:
            assert float(diff.max()) <= bound
        else:
            assert bool((diff.amax(1) <= bound).all())
    if fused.device.type == "cuda" and fused.variant != "tiles":
        assert float((results["ieee"][2] - results["tf32"][2]).abs().max()) > 0  # the strips took TF32
    with pytest.raises(ValueError, match="matmul_precision"):
        eo.infonce_loss(x.to(fused.device), y.to(fused.device), backend=fused.name, matmul_precision="bf16")
    with pytest.raises(ValueError, match="matmul_precision"):
        eo.InfoNCELoss(matmul_precision="TF32")
    ops = eo.backends.resolve(fused.name, fused.device).ops
    xd, yd = x.to(fused.device), y.to(fused.device)
    with pytest.raises(ValueError, match="matmul_precision"):
        ops.infonce_forward(xd, yd, None, 0.1, False, True, True, "fp16")
    rows, cols, row_stats, col_stats = ops.infonce_forward(xd, yd, None, 0.1, False, True, True, "tf32")
    with pytest.raises(ValueError, match="matmul_precision"):
        ops.infonce_backward(rows, cols, xd, yd, None, row_stats, col_stats, 0.1, False, True, True, [True, True],
                             "fp16")


def test_opcheck(fused, gen):
    x, y = random_pairs(20, 8, generator=gen)
    x, y = x.to(fused.device).requires_grad_(), y.to(fused.device).requires_grad_()
    ops = eo.backends.resolve(fused.name, fused.device).ops
    group = (torch.arange(20) % 6).to(fused.device)
    torch.library.opcheck(ops.infonce_forward, (x, y, group, 0.1, True, True, True))
    rows, cols, row_stats, col_stats = ops.infonce_forward(x.detach(), y.detach(), group, 0.1, True, True, True)
    torch.library.opcheck(ops.infonce_backward, (torch.ones_like(rows), torch.ones_like(cols), x.detach(), y.detach(),
                                                 group, row_stats, col_stats, 0.1, True, True, True, [True, True]))


def test_meta_tensors_through_the_public_api(fused):
    x = torch.empty(12, 8, device="meta")
    loss = eo.infonce_loss(x, x, backend=fused.name, group=torch.zeros(12, dtype=torch.int64, device="meta"))
    assert loss.shape == () and loss.device.type == "meta"


@pytest.mark.parametrize("case", WITHOUT_KERNELS, ids=str)
def test_backends_without_kernels_are_refused_by_name_and_skipped_by_auto(case, gen):
    x, y = random_pairs(10, 8, generator=gen)
    x, y = x.to(case.device), y.to(case.device)
    with pytest.raises(ValueError, match=f"backend='{case.name}' has no InfoNCE kernels"):
        eo.infonce_loss(x, y, backend=case.name)
    auto = eo.infonce_loss(x, y, tau=0.05)
    ref = eo.reference.infonce_loss(x.double().cpu(), y.double().cpu(), tau=0.05)
    # a mean of losses, each within compare()'s float32 bound
    bound = LOSS_RTOL * abs(float(ref)) + 2 * logit_error(8, 0.05) + float32_element_error(0.05)[0]
    assert torch.isfinite(auto) and abs(float(auto) - float(ref)) <= bound


@pytest.mark.parametrize("gap", [0.1, 0.25, 0.35, 0.5])
def test_a_confident_line_keeps_its_relative_digits(fused, gap):
    """ℓ = ln(1 + e^{LSE_N − LSE_P}) (SPEC §2 "InfoNCE"), not LSE_D − LSE_P: where the positive
    dominates by `gap` in cosine, ℓ ≈ e^{−gap/τ} (4.5e-5 down to 1.9e-22 at τ = 0.01, CLIP's final
    temperature), far below the rounding of two log-sum-exps near 1/τ = 100, which the difference
    left at ±1e-14: negative losses and positive gradients of the wrong sign.

    x = y = [[1, 0], [c, √(1 − c²)]], c = 1 − gap: line 0 (row and column) has the logits 1/τ and
    c/τ, both exact in every dtype (1·1 + 0·0 and 1·c + 0·s), so its ℓ = ln(1 + e^{(c − 1)/τ}) is
    exact from the inputs and only the op's own arithmetic is measured: float64 to 1e-12 relative,
    float32 inputs to SPEC's (33 + 3·max|s|/τ)·u. Its gradient against the float64 reference: an
    entry within u·(|s|/τ + |d|/2 + 4) relative (float32 element math, |d| <= 2/τ), and dx_0 =
    G_00·y_0 + G_01·y_1 with G_00 = −G_01 per direction amplifies that by at most (1 + c)/gap."""
    tau, c = 0.01, 1.0 - gap
    for dtype in [t for t in (torch.float64, torch.float32) if t in fused.dtypes]:
        x = torch.tensor([[1.0, 0.0], [c, (1.0 - c * c) ** 0.5]], dtype=dtype)
        c_exact = float(x[1, 0])
        exact = math.log1p(math.exp((c_exact - 1.0) / tau))
        leaves = [x.clone().to(fused.device).requires_grad_(), x.clone().to(fused.device).requires_grad_()]
        rows, cols = eo.infonce_loss(*leaves, tau=tau, backend=fused.name, reduction="none")
        u = torch.finfo(dtype).eps / 2
        rel = 1e-12 if dtype == torch.float64 else (33 + 3 / tau) * u
        for got in (float(rows[0]), float(cols[0])):
            assert got >= 0 and abs(got - exact) <= rel * exact, (dtype, got, exact)
        (rows.sum() + cols.sum()).backward()
        ref = [x.double().clone().requires_grad_(), x.double().clone().requires_grad_()]
        ref_rows, ref_cols = eo.reference.infonce_loss(*ref, tau=tau, reduction="none")
        (ref_rows.sum() + ref_cols.sum()).backward()
        entry = 1e-12 if dtype == torch.float64 else u * (1 / tau + 1 / tau + 4)
        bound = entry * (1 + c) / gap
        for got, want in ((leaves[0].grad[0], ref[0].grad[0]), (leaves[1].grad[0], ref[1].grad[0])):
            got = got.double().cpu()
            assert torch.equal(torch.sign(got), torch.sign(want)), (got, want)
            assert float(((got - want).abs() / want.abs().max()).max()) <= bound, (dtype, got, want)
