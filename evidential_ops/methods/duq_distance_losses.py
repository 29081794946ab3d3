"""DUQ's two losses on the distance matrix D in row strips: no K×K temporary besides D and ∂L/∂D.

`methods.duq.duq_distance_loss` (L_D, eq. 12) and `duq_distance_uncertainty_loss` (L_D^U, eq. 13)
are written on whole matrices: log-softmaxes of λD along both axes, α = relu(D) + 1, p = α/S,
(y − p)², …, each a (B, B) tensor that autograd keeps; with both directions about a dozen (B, B)
float32 tensors, 12 GiB at B = 16384. Here both are one autograd function that reads D in row
strips once each way: the forward reduces every strip to both losses' per-line statistics (float64
where they are sums), and the backward recomputes a strip's elements and writes its rows of ∂L/∂D,
the one (B, B) tensor D's own gradient needs. Values and gradients are those of the matrix forms up to the
order of their sums (python_tests/test_methods_duq.py compares them in float64).

- L_D = ½(mean_i [λD_ii − lse_row_i] + mean_i [λD_ii − lse_col_i]), lse the log-sum-exp of
  λD along the line (the column's combined strip by strip with logaddexp, in strip order);
  ∂L/∂D_ij = (λ/2B)(2δ_ij − softmax_row_ij − softmax_col_ij), ∂L/∂λ = Σ_ij D_ij·∂L/∂D_ij / λ.
- L_D^U = (1/B)(Σ_i v_i(rows) + Σ_j v_j(columns)), per line of α = relu(D) + 1 with target
  y = 1 − one-hot(diagonal): v = Σ_j (y_j − p_j)² + p_j(1 − p_j)/(S + 1)
  = (N − 1) − 2(1 − p_y) + P2 + (1 − P2)/(S + 1), with S = Σα, P2 = Σp², p_y the diagonal's
  share: three float64 sums per line (S, Σα², α_y) and no cancellation beyond that of the
  elementwise form's own terms. Per element ∂v/∂α_j = 2(δ_yj − p_y)/S + 2(p_j − P2)/(S + 1) −
  (1 − P2)/(S + 1)², evaluated in float64 per strip, then times relu'(D) (0 at D <= 0, as
  torch.relu's gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from . import _common
from .duq import DEFAULT_LOGIT_SCALE

__all__ = ["duq_distance_loss_strips", "duq_distance_losses_strips", "duq_distance_uncertainty_loss_strips"]

DEFAULT_STRIP_ELEMENTS = 1 << 22  # elements of D per strip (16 MiB in float32, 32 MiB in float64)


def _complement_target_mse(n: int, s: Tensor, q: Tensor, a_y: Tensor) -> Tensor:
    """v per line (module docstring) from float64 S, Σα², α_y."""
    p2 = q / (s * s)
    return (n - 1) - 2.0 * (1.0 - a_y / s) + p2 + (1.0 - p2) / (s + 1.0)


def _slope_constants(s: Tensor, q: Tensor, a_y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(c0, c1, c_y) per line with ∂v/∂α_j = c0 + c1·α_j + δ_yj·c_y (module docstring)."""
    p2 = q / (s * s)
    c0 = -2.0 * a_y / (s * s) - 2.0 * p2 / (s + 1.0) - (1.0 - p2) / ((s + 1.0) * (s + 1.0))
    c1 = 2.0 / (s * (s + 1.0))
    return c0, c1, 2.0 / s


class _DistanceLosses(torch.autograd.Function):
    """(L_D, L_D^U) of D: one strip pass for both forwards, one for both backwards, into one ∂L/∂D."""

    @staticmethod
    def forward(ctx, d: Tensor, scale: Tensor, strip_elements: int):
        ctx.set_materialize_grads(False)  # an unused loss's gradient stays None: its part is skipped
        b = d.shape[0]
        row_lse, col_lse = d.new_empty(b), None
        row_s, row_q = d.new_empty(b, dtype=torch.float64), d.new_empty(b, dtype=torch.float64)
        col_s, col_q = d.new_zeros(b, dtype=torch.float64), d.new_zeros(b, dtype=torch.float64)
        for rows in _common.row_strips(b, strip_elements, b):
            block = d[rows]
            z = scale * block
            row_lse[rows] = torch.logsumexp(z, dim=1)
            part = torch.logsumexp(z, dim=0)
            col_lse = part if col_lse is None else torch.logaddexp(col_lse, part)
            alpha = torch.relu(block).double() + 1.0
            square = alpha * alpha
            row_s[rows], row_q[rows] = alpha.sum(dim=1), square.sum(dim=1)
            col_s += alpha.sum(dim=0)
            col_q += square.sum(dim=0)
        diagonal = scale * d.diagonal()
        distance = 0.5 * ((diagonal - row_lse).mean() + (diagonal - col_lse).mean())
        a_y = torch.relu(d.diagonal()).double() + 1.0
        total = _complement_target_mse(b, row_s, row_q, a_y).sum() + _complement_target_mse(b, col_s, col_q, a_y).sum()
        ctx.save_for_backward(d, scale, row_lse, col_lse, row_s, row_q, col_s, col_q, a_y)
        ctx.strip_elements = strip_elements
        return distance, (total / b).to(d.dtype)

    @staticmethod
    def backward(ctx, grad_distance, grad_uncertainty):
        d, scale, row_lse, col_lse, row_s, row_q, col_s, col_q, a_y = ctx.saved_tensors
        b = d.shape[0]
        want_d, want_scale = ctx.needs_input_grad[0], ctx.needs_input_grad[1] and grad_distance is not None
        grad_d = torch.empty_like(d) if want_d else None
        grad_scale = torch.zeros((), dtype=torch.float64, device=d.device)
        if grad_uncertainty is not None:
            r0, r1, ry = _slope_constants(row_s, row_q, a_y)
            c0, c1, cy = _slope_constants(col_s, col_q, a_y)
            factor_u = grad_uncertainty.double() / b
        for rows in _common.row_strips(b, ctx.strip_elements, b):
            block = d[rows]
            local = torch.arange(rows.stop - rows.start, device=d.device)
            column = local + rows.start  # the strip's diagonal entries: (local, column)
            strip = torch.zeros_like(block)  # the strip's rows of ∂L/∂D, written once
            if grad_distance is not None:
                z = scale * block
                g = -(torch.exp(z - row_lse[rows, None]) + torch.exp(z - col_lse[None, :]))
                g[local, column] += 2.0
                g = g * (grad_distance / (2 * b))  # ∂L_D/∂(λD) of the strip
                strip += scale * g
                if want_scale:
                    grad_scale += (block.double() * g.double()).sum()
            if grad_uncertainty is not None and want_d:
                alpha = torch.relu(block).double() + 1.0
                slope = (r0[rows, None] + c0[None, :]) + (r1[rows, None] + c1[None, :]) * alpha
                slope[local, column] += ry[rows] + cy[column]
                strip += torch.where(block > 0, slope * factor_u, 0.0).to(d.dtype)
            if want_d:
                grad_d[rows] = strip
        return grad_d, (grad_scale.to(scale.dtype) if want_scale else None), None


def duq_distance_losses_strips(d: Tensor, *, logit_scale=DEFAULT_LOGIT_SCALE,
                               strip_elements: int = DEFAULT_STRIP_ELEMENTS,
                               check_finite: bool = True) -> tuple[Tensor, Tensor]:
    """(L_D, L_D^U) of DUQ eq. 12 and 13 (SPEC §3 "DUQ"), the values of `methods.duq_distance_loss`
    and `methods.duq_distance_uncertainty_loss`, from one pass over row strips of D each way
    (module docstring): the forward reads D once for both, the backward writes one ∂L/∂D.

    Args:
        d: (B, B) distances, positives on the diagonal.
        logit_scale: λ > 0 of L_D, a real or a 0-D tensor (a learned λ gets its gradient).
        strip_elements: elements of D per strip (at least one row; default 2^22).
    Returns:
        Two scalars in d's dtype: L_D (<= 0) and L_D^U.
    """
    d = _common.square_matrix(d, "d", check_finite=check_finite)
    scale = _common.scale_value(logit_scale, "logit_scale", d)
    if not isinstance(scale, Tensor):
        scale = torch.tensor(scale, dtype=d.dtype, device=d.device)
    strip_elements = checks.integer(strip_elements, "strip_elements", minimum=1)
    return _DistanceLosses.apply(d, scale, strip_elements)


def duq_distance_loss_strips(d: Tensor, *, logit_scale=DEFAULT_LOGIT_SCALE, strip_elements: int = DEFAULT_STRIP_ELEMENTS,
                             check_finite: bool = True) -> Tensor:
    """L_D of DUQ eq. 12 (SPEC §3 "DUQ") alone: `duq_distance_losses_strips`'s first value
    (its backward skips L_D^U's part). d: (B, B); scalar in d's dtype."""
    return duq_distance_losses_strips(d, logit_scale=logit_scale, strip_elements=strip_elements,
                                      check_finite=check_finite)[0]


def duq_distance_uncertainty_loss_strips(d: Tensor, *, strip_elements: int = DEFAULT_STRIP_ELEMENTS,
                                         check_finite: bool = True) -> Tensor:
    """L_D^U of DUQ eq. 13 (SPEC §3 "DUQ") alone: `duq_distance_losses_strips`'s second value
    (its backward skips L_D's part). d: (B, B); scalar in d's dtype."""
    return duq_distance_losses_strips(d, strip_elements=strip_elements, check_finite=check_finite)[1]
