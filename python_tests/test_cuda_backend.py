"""What only the cuda backend has: the working budget and its strips, TF32, no host
synchronisation, float16 gradient scaling, device memory.

Its accuracy, options, autograd and compile behaviour are tested with every other fused backend in
test_fused_backends.py. The tests here that need a GPU skip without one; the budget knob and the
build report run everywhere (the strip planning itself is tested in C++: csrc/tests/test_strip_plan.cpp).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import evidential_ops as eo
from conftest import hard_pairs, on_exact_grid, random_pairs, unit_roundoff

ALL_WEIGHTS = {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01}
MIB = 1 << 20

needs_extension = pytest.mark.skipif(not eo.extension.loaded(), reason="C++ extension not built")
needs_gpu = pytest.mark.skipif(
    "cuda" not in eo.available_backends() or not torch.cuda.is_available(), reason="needs the cuda backend and a GPU"
)


@pytest.fixture
def budget():
    """Set the CUDA working budget for one test, restoring it afterwards."""
    saved = eo.cuda_workspace_bytes()
    yield eo.cuda_workspace_bytes
    eo.cuda_workspace_bytes(saved)


# ---------------------------------------------------------------- everywhere


@needs_extension
def test_workspace_budget_knob(budget):
    assert budget(12345) == 12345 == budget()
    for bad in (0, -5):
        with pytest.raises(ValueError, match="positive"):
            budget(bad)
    with pytest.raises(TypeError, match="int"):
        budget(1.5)
    assert budget() == 12345


@needs_extension
def test_workspace_budget_from_the_environment():
    code = "import evidential_ops as eo; print(eo.cuda_workspace_bytes())"
    env = dict(os.environ, EO_CUDA_WORKSPACE_MIB="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) == 3 * MIB
    env.pop("EO_CUDA_WORKSPACE_MIB")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) == 64 * MIB


@needs_extension
def test_build_info_names_the_cuda_build():
    info = eo.build_info()
    if "cuda" in eo.available_backends():
        assert "cuda=on;cuda_archs=" in info
        archs = info.split("cuda_archs=")[1].split(";")[0]
        assert archs and all(a[0].isdigit() for a in archs.split(","))
    else:
        assert "cuda=off" in info


def test_auto_prefers_cuda_on_cuda_tensors():
    assert eo.backends._AUTO_ORDER["cuda"][0] == "cuda"
    if "cuda" in eo.available_backends():
        assert eo.backends.resolve("auto", torch.device("cuda")).name == "cuda"


# ---------------------------------------------------------------- on a GPU


def ops():
    return eo.backends.resolve("cuda", torch.device("cuda")).ops


def loss_and_grads(x, y, **kwargs):
    xl, yl = x.clone().requires_grad_(), y.clone().requires_grad_()
    rows, cols = eo.evidential_loss(xl, yl, backend="cuda", reduction="none", **kwargs)
    (rows.sum() + 0.5 * cols.sum()).backward()
    return rows.detach(), cols.detach(), xl.grad, yl.grad


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_strips_do_not_change_the_result(budget, gen, dtype):
    """A budget of a few rows per strip (and of one row: below the floor) gives the same losses and
    gradients as one strip: the rows are cut, the column sums are carried across strips, and the
    backward's 2-D blocks (strip_plan.h plan_gradient_blocks) sum dx[r] over column blocks."""
    k, d = 300, 40
    # On the 2^-8 grid x @ yᵀ is exact whichever cuBLAS algorithm a strip's shape selects.
    x, y = (on_exact_grid(t).cuda() for t in hard_pairs(k, d, generator=gen, dtype=dtype))
    c = torch.rand(k, generator=gen).cuda()
    kwargs = dict(weights=ALL_WEIGHTS, target_scale=c)
    budget(1 << 40)
    whole = loss_and_grads(x, y, **kwargs)
    whole_s = eo.evidential_loss_from_similarity((x.double() @ y.double().T).to(dtype), backend="cuda",
                                                 reduction="none", **kwargs)
    # Reordered sums (and, for half types, a flipped rounding of the output) are all that may differ:
    # a float32 gradient GEMM over K terms summed in two orders differs by ≤ 2K·2^-24·Σ_j|G_ij·y_j|
    # (Higham §3.1), taken here relative to the largest gradient; half types add one rounding of
    # the output on each side (2·2^-11, 2·2^-8); float64 the same reorder at 2^-53 (6.7e-14) moved
    # through the losses' sensitivity to their statistics (bounded per case in test_fused_backends'
    # strip test): 1e-10 leaves it a factor 1500.
    rtol = {torch.float64: 1e-10, torch.float32: 2 * k * 2.0**-24,
            torch.float16: 2 * k * 2.0**-24 + 2 * 2.0**-11, torch.bfloat16: 2 * k * 2.0**-24 + 2 * 2.0**-8}[dtype]
    # A few strips; forward or backward in one-row strips; one row each. The backward cuts the rows
    # of s into 2-D blocks where a row no longer fits a square block and the cut gives fewer row
    # blocks than strips (strip_plan.h plan_gradient_blocks): float64 from 700 000 on down (1 × 2
    # blocks), half types from 200 000 (2 × 3, dx[r] summed in float32), every dtype at 40 000 (2 × 5
    # to 5 × 5 blocks, the last column block narrower); one-row strips at 1. Below K·D·4 bytes
    # (48 000 here) half inputs take dy from the second sweep over the blocks of sᵀ
    # (evidential_cuda.cpp loss_backward).
    for small in (700_000, 200_000, 40_000, 1):
        budget(small)
        strips = loss_and_grads(x, y, **kwargs)
        for got, ref in zip(strips, whole):
            torch.testing.assert_close(got, ref, rtol=rtol, atol=rtol * float(ref.abs().max()))
        strips_s = eo.evidential_loss_from_similarity((x.double() @ y.double().T).to(dtype), backend="cuda",
                                                      reduction="none", **kwargs)
        # From s no product is recomputed: only the float64 statistics' summation order differs
        # (2(K − 1)·2^-53 ≈ 7e-14 relative per statistic), so float32 losses round to the same
        # number or a neighbour, and float64 losses keep ~1e-13 (the terms' sensitivity to their
        # statistics is O(1) to O(10): test_fused_backends' strip test bounds it).
        for got, ref in zip(strips_s, whole_s):
            # its own name: `rtol` is the from-embeddings check's, which the next budget reuses
            rtol_s = 2 * unit_roundoff(got.dtype) if got.dtype != torch.float64 else 1e-12
            torch.testing.assert_close(got, ref, rtol=rtol_s, atol=0)


@needs_gpu
def test_results_are_deterministic(gen):
    x, y = hard_pairs(500, 64, generator=gen)
    x, y = x.cuda(), y.cuda()
    first = loss_and_grads(x, y, weights=ALL_WEIGHTS)
    for _ in range(3):
        for got, ref in zip(loss_and_grads(x, y, weights=ALL_WEIGHTS), first):
            assert torch.equal(got, ref)


@needs_gpu
def test_matmul_precision_tf32_is_opt_in(gen):
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0")
    k, d = 256, 512
    x, y = hard_pairs(k, d, generator=gen)
    ref_rows, _ = eo.reference.evidential_loss(x.double(), y.double(), reduction="none")
    saved = torch.backends.cuda.matmul.allow_tf32
    errors = {}
    for precision in ("ieee", "tf32"):
        rows, _ = eo.evidential_loss(x.cuda(), y.cuda(), backend="cuda", reduction="none", matmul_precision=precision)
        errors[precision] = float(((rows.cpu().double() - ref_rows) / ref_rows.abs().clamp_min(1e-3)).abs().max())
        assert torch.backends.cuda.matmul.allow_tf32 == saved
    allowance = 1e-4 + 8 * d**0.5 * 2.0**-24 / 0.05
    assert errors["ieee"] <= allowance, errors
    assert errors["tf32"] > 4 * errors["ieee"], errors  # TF32 really was used when asked for


@needs_gpu
def test_overflow_names_tau_from_embeddings(gen):
    x, y = random_pairs(16, 8, generator=gen, positive_cos=0.999)
    with pytest.raises(ValueError, match="tau=0.001"):
        eo.evidential_loss(x.cuda(), y.cuda(), tau=0.001, backend="cuda")
    with pytest.raises(ValueError, match="tau=0.001"):
        eo.opinion(x.cuda(), y.cuda(), tau=0.001, backend="cuda")


@needs_gpu
def test_no_host_synchronisation_inside_cuda_graphs(gen):
    """A host synchronisation is an error while a stream is captured: the forward and backward ops
    capture and replay, giving the eager results (the τ overflow read is skipped under capture)."""
    k, d = 128, 32
    x, y = random_pairs(k, d, generator=gen, positive_cos=0.8)
    x, y = x.cuda(), y.cuda()
    config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=ALL_WEIGHTS, direction="both", reduction="none")
    w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
    up = torch.rand(k, generator=gen).cuda()

    def step():
        rows, cols, rs, cs = ops().loss_forward(x, y, None, "exp", 0.05, w, mask, True, True)
        dx, dy = ops().loss_backward(up, up, x, y, None, rs, cs, "exp", 0.05, w, mask, True, True, 0, [True, True])
        return rows, cols, dx, dy

    eager = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capturing stream (cuBLAS handle, workspace)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, ref in zip(captured, eager):  # cuBLAS may pick another algorithm while capturing
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()))


@needs_gpu
def test_float16_gradients_keep_their_small_entries(gen):
    """With a loss scaled by 1e-4 (as a small loss weight would), ∂L/∂s at K = 2048 lies mostly in
    float16's subnormal range. The backward scales it by a power of two on the device before
    rounding it for the tensor-core products: error ≈ 4e-4 of the largest gradient (the output's own
    float16 rounding), against ≈ 4e-3 without the scaling (modelled in float64 on the CPU)."""
    k, d = 2048, 64
    x, y = random_pairs(k, d, generator=gen, positive_cos=0.7)
    x, y = x.half(), y.half()
    xr, yr = x.double().requires_grad_(), y.double().requires_grad_()
    (1e-4 * eo.reference.evidential_loss(xr, yr, weights={"risk": 1.0, "kl": 0.1})).backward()
    xc, yc = x.cuda().requires_grad_(), y.cuda().requires_grad_()
    (1e-4 * eo.evidential_loss(xc, yc, weights={"risk": 1.0, "kl": 0.1}, backend="cuda")).backward()
    for got, ref in ((xc.grad, xr.grad), (yc.grad, yr.grad)):
        assert got.dtype == torch.float16
        assert float((got.cpu().double() - ref).abs().max() / ref.abs().max()) <= 1.5e-3


@needs_gpu
def test_extra_device_memory_is_the_budget_plus_o_k(budget, gen):
    k, d = 4096, 64
    x, y = random_pairs(k, d, generator=gen)
    x, y = x.cuda().requires_grad_(), y.cuda().requires_grad_()
    budget(4 * MIB)
    eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="cuda", check_finite=False).backward()  # warm-up
    x.grad = y.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    eo.evidential_loss(x, y, weights=ALL_WEIGHTS, backend="cuda", check_finite=False).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    gradients = 2 * k * d * 4
    per_line = (7 + 9 + 4) * 8  # statistics, gradient constants, losses and upstream copies
    assert extra <= 4 * MIB + gradients + 2 * k * per_line + 1 * MIB, extra / MIB
