"""DUQ's two losses on the distance matrix D in row strips: no K×K temporary besides D and ∂L/∂D.

`methods.duq.duq_distance_loss` (L_D, eq. 12) and `duq_distance_uncertainty_loss` (L_D^U, eq. 13)
are written on whole matrices: log-softmaxes of λD along both axes, α = relu(D) + 1, p = α/S,
(y − p)², …, each a (B, B) tensor that autograd keeps; with both directions about a dozen (B, B)
float32 tensors, 12 GiB at B = 16384. Here each loss is an autograd function that reads D in row
strips twice: the forward reduces every strip to per-line statistics (float64 where they are sums),
and the backward recomputes a strip's elements and writes its rows of ∂L/∂D, the one (B, B)
tensor D's own gradient needs. Values and gradients are those of the matrix forms up to the
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

__all__ = ["duq_distance_loss_strips", "duq_distance_uncertainty_loss_strips"]

DEFAULT_STRIP_ELEMENTS = 1 << 22  # elements of D per strip (16 MiB in float32, 32 MiB in float64)


def _diagonal_block(n_rows: int, start: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """(strip-local row, global column) indices of the diagonal entries of a strip of rows."""
    local = torch.arange(n_rows, device=like.device)
    return local, local + start


class _DistanceInfoNCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d: Tensor, scale: Tensor, strip_elements: int):
        b = d.shape[0]
        row_lse = d.new_empty(b)
        col_lse = None
        for rows in _common.row_strips(b, strip_elements, b):
            z = scale * d[rows]
            row_lse[rows] = torch.logsumexp(z, dim=1)
            part = torch.logsumexp(z, dim=0)
            col_lse = part if col_lse is None else torch.logaddexp(col_lse, part)
        diagonal = scale * d.diagonal()
        value = 0.5 * ((diagonal - row_lse).mean() + (diagonal - col_lse).mean())
        ctx.save_for_backward(d, scale, row_lse, col_lse)
        ctx.strip_elements = strip_elements
        return value

    @staticmethod
    def backward(ctx, grad_value):
        d, scale, row_lse, col_lse = ctx.saved_tensors
        b = d.shape[0]
        grad_d = torch.empty_like(d) if ctx.needs_input_grad[0] else None
        grad_scale = torch.zeros((), dtype=torch.float64, device=d.device)
        factor = grad_value / (2 * b)
        for rows in _common.row_strips(b, ctx.strip_elements, b):
            z = scale * d[rows]
            g = -(torch.exp(z - row_lse[rows, None]) + torch.exp(z - col_lse[None, :]))
            local, column = _diagonal_block(rows.stop - rows.start, rows.start, d)
            g[local, column] += 2.0
            g = g * factor  # ∂L/∂(λD) of the strip
            if grad_d is not None:
                grad_d[rows] = scale * g
            if ctx.needs_input_grad[1]:
                grad_scale += (d[rows].double() * g.double()).sum()
        return grad_d, (grad_scale.to(scale.dtype) if ctx.needs_input_grad[1] else None), None


def duq_distance_loss_strips(d: Tensor, *, logit_scale=DEFAULT_LOGIT_SCALE, strip_elements: int = DEFAULT_STRIP_ELEMENTS,
                             check_finite: bool = True) -> Tensor:
    """L_D of DUQ eq. 12 (SPEC §3 "DUQ"), the value of `methods.duq_distance_loss`, in row strips
    of D (module docstring): ½(mean_i log softmax_row(λD)_ii + mean_i log softmax_col(λD)_ii).

    Args:
        d: (B, B) distances, positives on the diagonal.
        logit_scale: λ > 0, a real or a 0-D tensor (a learned λ gets its gradient).
        strip_elements: elements of D per strip (at least one row; default 2^22).
    Returns:
        Scalar (<= 0) in d's dtype.
    """
    d = _common.square_matrix(d, "d", check_finite=check_finite)
    scale = _common.scale_value(logit_scale, "logit_scale", d)
    if not isinstance(scale, Tensor):
        scale = torch.tensor(scale, dtype=d.dtype, device=d.device)
    strip_elements = checks.integer(strip_elements, "strip_elements", minimum=1)
    return _DistanceInfoNCE.apply(d, scale, strip_elements)


def _uncertainty_line_stats(d: Tensor, strip_elements: int) -> tuple[Tensor, ...]:
    """Float64 S = Σα, Q = Σα² per row and per column of α = relu(D) + 1, and the diagonal α."""
    b = d.shape[0]
    row_s, row_q = d.new_empty(b, dtype=torch.float64), d.new_empty(b, dtype=torch.float64)
    col_s, col_q = d.new_zeros(b, dtype=torch.float64), d.new_zeros(b, dtype=torch.float64)
    for rows in _common.row_strips(b, strip_elements, b):
        alpha = torch.relu(d[rows]).double() + 1.0
        square = alpha * alpha
        row_s[rows], row_q[rows] = alpha.sum(dim=1), square.sum(dim=1)
        col_s += alpha.sum(dim=0)
        col_q += square.sum(dim=0)
    diagonal = torch.relu(d.diagonal()).double() + 1.0
    return row_s, row_q, col_s, col_q, diagonal


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


class _DistanceUncertainty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d: Tensor, strip_elements: int):
        b = d.shape[0]
        row_s, row_q, col_s, col_q, diagonal = _uncertainty_line_stats(d, strip_elements)
        total = _complement_target_mse(b, row_s, row_q, diagonal).sum() + \
            _complement_target_mse(b, col_s, col_q, diagonal).sum()
        ctx.save_for_backward(d, row_s, row_q, col_s, col_q, diagonal)
        ctx.strip_elements = strip_elements
        return (total / b).to(d.dtype)

    @staticmethod
    def backward(ctx, grad_value):
        d, row_s, row_q, col_s, col_q, diagonal = ctx.saved_tensors
        b = d.shape[0]
        r0, r1, ry = _slope_constants(row_s, row_q, diagonal)
        c0, c1, cy = _slope_constants(col_s, col_q, diagonal)
        factor = grad_value.double() / b
        grad_d = torch.empty_like(d)
        for rows in _common.row_strips(b, ctx.strip_elements, b):
            block = d[rows]
            alpha = torch.relu(block).double() + 1.0
            slope = (r0[rows, None] + c0[None, :]) + (r1[rows, None] + c1[None, :]) * alpha
            local, column = _diagonal_block(rows.stop - rows.start, rows.start, d)
            slope[local, column] += ry[rows] + cy[column]
            grad_d[rows] = torch.where(block > 0, slope * factor, 0.0).to(d.dtype)
        return grad_d, None


def duq_distance_uncertainty_loss_strips(d: Tensor, *, strip_elements: int = DEFAULT_STRIP_ELEMENTS,
                                         check_finite: bool = True) -> Tensor:
    """L_D^U of DUQ eq. 13 (SPEC §3 "DUQ"), the value of `methods.duq_distance_uncertainty_loss`,
    in row strips of D (module docstring): (1/B)(Σ_i mse_i(rows) + Σ_j mse_j(cols)) of the evidence
    relu(D) with target 1 − I.

    Args:
        d: (B, B) distances, positives on the diagonal.
        strip_elements: elements of D per strip (at least one row; default 2^22).
    Returns:
        Scalar in d's dtype.
    """
    d = _common.square_matrix(d, "d", check_finite=check_finite)
    strip_elements = checks.integer(strip_elements, "strip_elements", minimum=1)
    return _DistanceUncertainty.apply(d, strip_elements)
