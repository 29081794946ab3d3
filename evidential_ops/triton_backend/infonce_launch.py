"""The InfoNCE ops of the Triton family (SPEC §2 "InfoNCE"): checks, buffers, launches.

Same arguments, checks and messages as csrc/cpu/infonce_cpu.cpp. Each direction is one launch of
a row-parallel kernel (infonce_kernels.py): rows over (x, y), columns over (y, x). Fixed tile
sizes (no autotuning): the launches are bitwise reproducible.
"""

from __future__ import annotations

import math

import torch
import triton
from torch import Tensor

from ..checks import require as _require
from ..infonce_lines import NEGATIVES, NUM_LINE_STATS, POSITIVES, candidates_lse, line_losses, negative_share
from . import infonce_kernels
from .launch import (
    _check_embeddings,
    _check_square,
    _check_upstream,
    _compute_f64,
    _inverse_tau,
    _launch,
    _output_dtype,
    _same_device,
    _type,
    _value,
    triton_cdiv,
)

BLOCK_M = 32
BLOCK_N = 32
BLOCK_K = 32
MAX_BLOCK_D = 256  # wider D is accumulated chunk by chunk in out (ACCUMULATE)


def _check_group(group: Tensor | None, k: int, like: Tensor) -> None:
    if group is None:
        return
    _type(group.dtype == torch.int64, f"group must be an int64 tensor of ids, got {group.dtype}")
    _value(group.dim() == 1 and group.shape[0] == k, f"group must have shape ({k},), got {list(group.shape)}")
    _same_device(group, "group", like, "the inputs")


def _check_stats(stats: Tensor, name: str, k: int, like: Tensor) -> Tensor:
    _type(stats.dtype == torch.float64, f"{name} must be the float64 statistics of the forward, got {stats.dtype}")
    _value(stats.dim() == 2 and tuple(stats.shape) == (NUM_LINE_STATS, k),
           f"{name} must be the ({NUM_LINE_STATS}, {k}) statistics of the forward, got {list(stats.shape)}")
    _same_device(stats, name, like, "the inputs")
    return stats.contiguous()


def _inputs(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, bool]:
    f64 = _compute_f64(x.dtype)
    dtype = torch.float64 if f64 else torch.float32
    return x.to(dtype).contiguous(), y.to(dtype).contiguous(), f64


def _line_stats(q: Tensor, c: Tensor, group: Tensor | None, inv_tau: float, drop_self: bool, f64: bool) -> Tensor:
    k, d = q.shape
    out = torch.empty((NUM_LINE_STATS, k), dtype=torch.float64, device=q.device)
    _launch(infonce_kernels.infonce_stats_kernel, (triton_cdiv(k, BLOCK_M),),
            q, c, q.stride(0), q.stride(1), c.stride(0), c.stride(1), group if group is not None else q, out, k, d,
            inv_tau, HAS_GROUP=group is not None, DROP_SELF=drop_self, F64=f64, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K)
    return out


def _check_line_values(stats: Tensor, tau: float) -> None:
    # (LSE_N, LSE_P): either is −inf for a line without negatives or positives; +inf or NaN only
    # from a logit that is not finite.
    _require(~torch.isnan(stats).any() & ~(stats == math.inf).any(),
             f"tau={tau} or the similarities are too large: a logit s/tau is not finite. The losses expect cosine "
             "similarities (|s| <= 1): for raw features pass normalize=True or L2-normalise x and y; otherwise use "
             "a larger tau.")
    _require(~(stats[POSITIVES] == -math.inf).any(),
             "group: with drop_self=True every line needs another member of its group (a group of one, or no group "
             "ids at all, leaves a line without positives)")


def infonce_forward(x: Tensor, y: Tensor, group: Tensor | None, tau: float, drop_self: bool, rows: bool, cols: bool):
    _check_embeddings(x, y)
    _check_square(x.shape[0], y.shape[0])
    _check_group(group, x.shape[0], x)
    inv_tau = _inverse_tau(tau)
    q, c, f64 = _inputs(x, y)
    k = q.shape[0]
    zeros = lambda: torch.zeros((NUM_LINE_STATS, k), dtype=torch.float64, device=x.device)
    row_stats = _line_stats(q, c, group, inv_tau, drop_self, f64) if rows else zeros()
    col_stats = _line_stats(c, q, group, inv_tau, drop_self, f64) if cols else zeros()
    for stats, used in ((row_stats, rows), (col_stats, cols)):
        if used:
            _check_line_values(stats, tau)
    out_dtype = _output_dtype(x.dtype)

    def losses(stats, used):
        if not used:
            return torch.zeros(k, dtype=out_dtype, device=x.device)
        return line_losses(stats[NEGATIVES], stats[POSITIVES]).to(out_dtype)

    return losses(row_stats, rows), losses(col_stats, cols), row_stats, col_stats


def _gradient(q: Tensor, c: Tensor, group, own, other, inv_tau: float, drop_self: bool, f64: bool,
              out_dtype: torch.dtype) -> Tensor:
    """(∂L/∂q) of s = q·cᵀ/τ; own/other = (stats, upstream, 1 − e^{−ℓ}) of q's and c's lines, or None."""
    k, d = q.shape
    block_d = max(16, triton.next_power_of_2(d)) if d <= MAX_BLOCK_D else MAX_BLOCK_D
    accumulate = d > MAX_BLOCK_D
    out = (torch.zeros_like(q) if accumulate else torch.empty_like(q))
    placeholder = own if own is not None else other
    own_args = own if own is not None else placeholder
    other_args = other if other is not None else placeholder
    _launch(infonce_kernels.infonce_grad_kernel, (triton_cdiv(k, BLOCK_M),),
            q, c, q.stride(0), q.stride(1), c.stride(0), c.stride(1), group if group is not None else q,
            out, out.stride(0), out.stride(1), *own_args, *other_args, k, d, inv_tau,
            HAS_GROUP=group is not None, DROP_SELF=drop_self, OWN=own is not None, OTHER=other is not None,
            F64=f64, ACCUMULATE=accumulate, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_D=block_d)
    return out.to(out_dtype)


def infonce_backward(grad_rows: Tensor, grad_cols: Tensor, x: Tensor, y: Tensor, group: Tensor | None,
                     row_stats: Tensor, col_stats: Tensor, tau: float, drop_self: bool, rows: bool, cols: bool,
                     output_mask: list[bool]):
    _check_embeddings(x, y)
    k = x.shape[0]
    _check_square(k, y.shape[0])
    _check_group(group, k, x)
    row_stats = _check_stats(row_stats, "row_stats", k, x)
    col_stats = _check_stats(col_stats, "col_stats", k, x)
    up_rows = _check_upstream(grad_rows, "grad_rows", k, rows, x)
    up_cols = _check_upstream(grad_cols, "grad_cols", k, cols, x)
    inv_tau = _inverse_tau(tau)
    need_dx, need_dy = bool(output_mask[0]), bool(output_mask[1])
    if not (rows or cols):
        return (torch.zeros_like(x) if need_dx else x.new_empty(0)), (torch.zeros_like(y) if need_dy else y.new_empty(0))
    q, c, f64 = _inputs(x, y)

    def line(stats, upstream):
        # (LSE_D, LSE_P) and 1 − e^{−ℓ} per line, from the negatives' and positives' statistics
        # (infonce_lines.py): the share does not cancel where ℓ is tiny.
        if upstream is None:
            return None
        negatives, positives = stats[NEGATIVES], stats[POSITIVES]
        lse_d = torch.stack([candidates_lse(negatives, positives), positives])
        return lse_d, upstream, negative_share(negatives, positives).contiguous()

    row_line, col_line = line(row_stats, up_rows), line(col_stats, up_cols)
    dx = _gradient(q, c, group, row_line, col_line, inv_tau, drop_self, f64, x.dtype) if need_dx else x.new_empty(0)
    dy = _gradient(c, q, group, col_line, row_line, inv_tau, drop_self, f64, y.dtype) if need_dy else y.new_empty(0)
    return dx, dy
