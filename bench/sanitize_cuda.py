"""A small case of every kernel of the cuda backend, for compute-sanitizer (bench/gpu_session_cuda.md).

    compute-sanitizer --tool memcheck  --error-exitcode 1 python bench/sanitize_cuda.py
    compute-sanitizer --tool racecheck --error-exitcode 1 --kernel-name kns=evidential_ops python bench/sanitize_cuda.py
    compute-sanitizer --tool initcheck --error-exitcode 1 python bench/sanitize_cuda.py --quick

initcheck without a kernel filter: a filtered run does not see what the other kernels write (cuBLAS's
products, torch's reductions), and reports every read of it as uninitialised (it did, on an H200).

Runs each op (loss_forward/backward, the from-similarity pair, line_stats/line_losses with a
target_offset strip, opinion, opinion_from_similarity) for each input dtype and each set of
per-element special functions (kl, fmse, logdet), in several strips (a small working budget) and in
one, the float16 gradient scaling included; checks the results are finite and prints one line.
Exit status 0 when everything ran (the sanitizer's own exit code reports what it found).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import evidential_ops as eo

# Every term set of the element kernels' instantiations, (kl, fmse, logdet) on or off, each with
# the evidence maps in turn over the input dtypes (the float32 path's kernels are also instantiated
# per map: a map changes their arithmetic, not their memory accesses).
TERM_SETS = [
    {"risk": 1.0, "mse": 0.5},
    {"risk": 1.0, "kl": 0.1},
    {"fmse": 1.0},
    {"kl": 0.1, "fmse": 1.0},
    {"logdet": -0.01},
    {"kl": 0.1, "logdet": -0.01},
    {"fmse": 1.0, "logdet": -0.01},
    {"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01},
]
EVIDENCE = [("exp", 0.05), ("relu", 1.0), ("softplus", 0.1), ("exp_tanh", 0.1)]


def pairs(k: int, d: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(k, d, generator=g, dtype=torch.float64), dim=1)
    y = F.normalize(x + 0.5 * torch.randn(k, d, generator=g, dtype=torch.float64), dim=1)
    return x.to(dtype).cuda(), y.to(dtype).cuda()


def finite(*tensors):
    for t in tensors:
        assert torch.isfinite(t).all(), t


def run(k: int = 37, d: int = 19, quick: bool = False) -> int:
    """Every case, or (quick) strips of a few rows only and the first and last term sets: the
    memory accesses of every kernel and input dtype, about a fifth of the launches (memcheck and
    racecheck instrument each launch; on an H200 neither finished the whole run in 40 s)."""
    ops = eo.backends.resolve("cuda", torch.device("cuda")).ops
    cases = 0
    budgets = (3000,) if quick else (1 << 40, 3000)  # one strip; strips of a few rows
    term_sets = [(0, TERM_SETS[0]), (len(TERM_SETS) - 1, TERM_SETS[-1])] if quick else list(enumerate(TERM_SETS))
    for budget in budgets:
        eo.cuda_workspace_bytes(budget)
        for dtype_index, dtype in enumerate((torch.float32, torch.float64, torch.float16, torch.bfloat16)):
            for index, weights in term_sets:
                evidence, tau = EVIDENCE[(index + dtype_index) % len(EVIDENCE)]
                x, y = pairs(k, d, dtype, seed=index)
                c = torch.rand(k, generator=torch.Generator().manual_seed(index)).cuda()
                xl, yl = x.clone().requires_grad_(), y.clone().requires_grad_()
                loss = eo.evidential_loss(xl, yl, evidence=evidence, tau=tau, weights=weights, target_scale=c,
                                          backend="cuda")
                loss.backward()
                finite(loss, xl.grad, yl.grad)
                s = (x.double() @ y.double().T).to(dtype).requires_grad_()
                loss_s = eo.evidential_loss_from_similarity(s, evidence=evidence, tau=tau, weights=weights,
                                                            direction=("rows", "cols", "both")[index % 3],
                                                            backend="cuda")
                loss_s.backward()
                finite(loss_s, s.grad)
                cases += 2
            # A strip of rows with a target offset (torch.distributed's layout), and opinions.
            x, y = pairs(k, d, dtype, seed=99)
            config = eo.checks.loss_config(evidence="exp", tau=0.05, weights=TERM_SETS[-1], direction="both",
                                           reduction="none")
            w, mask = eo.ops.weights_tensor(config), eo.ops.terms_mask(config)
            # Column statistics are summed over every strip (as torch.distributed sums them): one
            # strip's alone leaves the columns whose positive lies outside it without one.
            a, b = 5, 23
            strips = [ops.line_stats(x[lo:hi], y, lo, "exp", 0.05, mask, True, True)
                      for lo, hi in ((0, a), (a, b), (b, k))]
            rows, cols = strips[1][0], sum(col for _, col in strips)
            strip_losses, col_losses = ops.line_losses(rows, cols, None, a, w, mask, True, True)
            up = torch.ones(b - a, device="cuda")
            dx, dy = ops.loss_backward(up, torch.ones(k, device="cuda"), x[a:b], y, None, rows, cols, "exp", 0.05, w,
                                       mask, True, True, a, [True, True])
            finite(strip_losses, dx, dy)
            for evidence, tau in EVIDENCE:
                op = eo.opinion(x[:7], y, evidence=evidence, tau=tau, backend="cuda")
                op_s = eo.opinion_from_similarity(x.double() @ y[:5].double().T, evidence=evidence, tau=tau,
                                                  backend="cuda")
                finite(op.row_log_strength, op.col_log_strength, op_s.row_log_strength, op_s.col_log_strength)
            cases += 2 + 2 * len(EVIDENCE)
    torch.cuda.synchronize()
    print(f"sanitize_cuda: {cases} cases ran on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    if "cuda" not in eo.available_backends() or not torch.cuda.is_available():
        print("sanitize_cuda: needs the cuda backend and a GPU")
        sys.exit(1)
    sys.exit(run(quick="--quick" in sys.argv[1:]))
