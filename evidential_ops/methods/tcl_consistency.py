"""TCL's step-2 belief consistency from the two models' embeddings, without a K×K matrix.

L_c (TCL eq. 12-13, SPEC §3 "TCL and TcVSE") compares every belief of model A with model B's,
row-wise (A detached, gradient into B) and column-wise (B detached, gradient into A). Written on
the K×K similarity matrices (`methods.tcl.tcl_consistency_loss`) it holds four K×K belief
matrices, their differences and autograd's saved tensors: ~10 GiB at K = 16384 in float32.

Here the rows are visited in strips of `strip` rows, each strip's similarities recomputed from the
embeddings (s = x·yᵀ) whenever a pass needs them, so memory is O(strip·K + K·D):
1. the column log-strengths ln S'_j = logsumexp_i ln α_ij of both models (a running log-sum-exp
   over the strips, in strip order: deterministic);
2. per strip: the loss value, and by autograd on the strip alone the gradient of both terms with
   the column log-strengths held fixed (a row's beliefs depend on its own strip only), and
   ∂L/∂ln S'^A_j accumulated over the strips;
3. per strip again: what flows from ∂L/∂ln S'^A through ln S'^A = logsumexp_i ln α^A into A.
The gradients are formed in the forward (the loss has no other use) and kept, O(K·D); backward
scales them by the incoming gradient. GEMMs: 2 (pass 1) + 2 + 4 (pass 2) + 1 + 2 (pass 3), with
no K×K buffer; the elementwise work is PyTorch's, on any device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from ..evidence import belief, log_alpha
from . import _common

__all__ = ["tcl_consistency_loss_from_embeddings", "DEFAULT_STRIP_ELEMENTS"]

# Similarities per strip: 1 Mi (4 MiB per float32 temporary); a strip's autograd graph keeps about
# 35 of them alive (measured, float32, D = 256, one thread: 186 MiB extra peak at K = 4096
# against 1.1 GiB for the K×K form; 294 MiB at K = 16384).
DEFAULT_STRIP_ELEMENTS = 1 << 20


def _terms(s_a: Tensor, s_b: Tensor, col_a: Tensor, col_b: Tensor, evidence: str, tau: float, k: int) -> Tensor:
    """The strip's share of L_c: Σ |b^A − b^B| over its row beliefs (A detached) and over its
    column beliefs given the column log-strengths (B detached), divided by K²."""
    s_a_fixed, s_b_fixed = s_a.detach(), s_b.detach()
    row_a = belief(s_a_fixed, torch.logsumexp(log_alpha(s_a_fixed, evidence, tau), dim=1), evidence=evidence, tau=tau)
    row_b = belief(s_b, torch.logsumexp(log_alpha(s_b, evidence, tau), dim=1), evidence=evidence, tau=tau)
    col_term_a = belief(s_a, col_a, evidence=evidence, tau=tau, dim=0)
    col_term_b = belief(s_b_fixed, col_b, evidence=evidence, tau=tau, dim=0)
    return ((row_a - row_b).abs().sum() + (col_term_a - col_term_b).abs().sum()) / (k * k)


class _Consistency(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_a, y_a, x_b, y_b, evidence: str, tau: float, strip_elements: int):
        k = x_a.shape[0]
        work = torch.promote_types(x_a.dtype, torch.float32)
        leaves = [t.detach().to(work) for t in (x_a, y_a, x_b, y_b)]
        xa, ya, xb, yb = leaves
        # Pass 1: column log-strengths of both models.
        col_a = xa.new_full((k,), -torch.inf)
        col_b = xb.new_full((k,), -torch.inf)
        for rows in _common.row_strips(k, strip_elements, k):
            col_a = torch.logaddexp(col_a, torch.logsumexp(log_alpha(xa[rows] @ ya.T, evidence, tau), dim=0))
            col_b = torch.logaddexp(col_b, torch.logsumexp(log_alpha(xb[rows] @ yb.T, evidence, tau), dim=0))
        # Pass 2: value, strip-local gradients, ∂L/∂ln S'^A.
        grads = [torch.zeros_like(t) for t in leaves]
        col_a_leaf = col_a.clone().requires_grad_()
        total = xa.new_zeros(())
        col_a_grad = torch.zeros_like(col_a)
        for rows in _common.row_strips(k, strip_elements, k):
            with torch.enable_grad():
                parts = [t.detach().requires_grad_() for t in (xa[rows], ya, xb[rows], yb)]
                value = _terms(parts[0] @ parts[1].T, parts[2] @ parts[3].T, col_a_leaf, col_b, evidence, tau, k)
                strip_grads = torch.autograd.grad(value, [*parts, col_a_leaf])
            total = total + value.detach()
            grads[0][rows] += strip_grads[0]
            grads[1] += strip_grads[1]
            grads[2][rows] += strip_grads[2]
            grads[3] += strip_grads[3]
            col_a_grad += strip_grads[4]
        # Pass 3: ∂ln S'^A_j/∂ln α^A_ij = α_ij/S'_j, pushed into A's strip by a linear surrogate.
        for rows in _common.row_strips(k, strip_elements, k):
            with torch.enable_grad():
                parts = [t.detach().requires_grad_() for t in (xa[rows], ya)]
                log_a = log_alpha(parts[0] @ parts[1].T, evidence, tau)
                weight = (col_a_grad.unsqueeze(0) * torch.exp(log_a.detach() - col_a.unsqueeze(0)))
                strip_grads = torch.autograd.grad((weight * log_a).sum(), parts)
            grads[0][rows] += strip_grads[0]
            grads[1] += strip_grads[1]
        ctx.save_for_backward(*grads)
        ctx.dtypes = [t.dtype for t in (x_a, y_a, x_b, y_b)]
        return total.to(x_a.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        grads = [(g * grad_output.to(g.dtype)).to(dtype) for g, dtype in zip(ctx.saved_tensors, ctx.dtypes)]
        return (*grads, None, None, None)


def tcl_consistency_loss_from_embeddings(
    x_a: Tensor,
    y_a: Tensor,
    x_b: Tensor,
    y_b: Tensor,
    *,
    evidence: str = "exp",
    tau: float = 0.05,
    check_finite: bool = True,
    strip_elements: int = DEFAULT_STRIP_ELEMENTS,
) -> Tensor:
    """TCL's belief consistency L_c (eq. 12-13; SPEC §3) of models A (s^A = x_a·y_aᵀ) and B
    (s^B = x_b·y_bᵀ), equal to `tcl_consistency_loss(s_a, s_b)` with the same detach pattern
    (row term: gradient into B only; column term: into A only), in O(strip·K + K·D) memory.

    Args:
        x_a, y_a, x_b, y_b: (K, D_A), (K, D_A), (K, D_B), (K, D_B) embeddings (image i, text i),
            float32/float64 (bf16/fp16 are computed in float32), one device, K >= 2.
        strip_elements: similarities per strip (rows per strip = max(1, strip_elements // K)).
    Returns:
        Scalar in x_a's dtype; no K×K tensor is formed (module docstring).
    """
    x_a, y_a = checks.embedding_pair(x_a, y_a, check_finite)
    x_b, y_b = checks.embedding_pair(x_b, y_b, check_finite)
    checks.same_kind(x_a, x_b, "x_a", "x_b")
    if x_a.shape[0] != x_b.shape[0]:
        raise ValueError(f"models A and B must see the same K pairs, got x_a {tuple(x_a.shape)} and x_b {tuple(x_b.shape)}")
    evidence = checks.evidence_kind(evidence)
    tau = checks.tau_value(tau)
    strip_elements = checks.integer(strip_elements, "strip_elements", minimum=1)
    return _Consistency.apply(x_a, y_a, x_b, y_b, evidence, tau, strip_elements)
