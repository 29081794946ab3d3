"""The InfoNCE ops of the Triton family (SPEC §2 "InfoNCE"): checks, buffers, launches.

Same arguments, checks and messages as csrc/cpu/infonce_cpu.cpp. Two ways, the same element math
(infonce_kernels.py), fixed tile sizes and every sum in a fixed order (bitwise reproducible):

- tiles: each direction one launch of a row-parallel kernel that forms its tiles of s with tl.dot
  (rows over (x, y), columns over (y, x)), 16-bit inputs widened to float32; float64 inputs, traced
  graphs, and the interpreter unless STRIPS_IN_INTERPRETER;
- strips (CUDA tensors in eager mode, float32 and 16-bit inputs): s from cuBLAS in stored strips of
  a direction's candidates against all its lines, the lines' running log-sum-exps carried from
  strip to strip; the backward forms G over strips of its own lines in place and multiplies it with
  cuBLAS. On the H200 the tiles took 6.3 s at K = 65536, D = 1024 (bf16) against plain PyTorch's
  0.22 s: their FFMA products from widened inputs and, beyond D = 256, a read-modify-write of the
  gradient per tile (bench/results/gpu_h200_second_lease.md); the strips 0.215 s
  (gpu_h200_third_lease.md).

matmul_precision ("ieee" or "tf32") is the float32 strips' product precision; the tiles' products
are IEEE whatever it says.
"""

from __future__ import annotations

import math
import os

import torch
import triton
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from ..checks import require as _require
from ..infonce_lines import NEGATIVES, NUM_LINE_STATS, POSITIVES, candidates_lse, line_losses, negative_share
from . import configs, infonce_kernels
from .launch import (
    _check_embeddings,
    _check_square,
    _check_upstream,
    _accumulate_product,
    _compute_f64,
    _float32_products,
    _inverse_tau,
    _launch,
    _output_dtype,
    _same_device,
    _tf32,
    _type,
    _value,
    aligned_matrix,
    aligned_row_length,
    similarity_product,
    strip_rows,
    triton_cdiv,
)

BLOCK_M = 32
BLOCK_N = 32
BLOCK_K = 32
MAX_BLOCK_D = 256  # wider D is accumulated chunk by chunk in out (ACCUMULATE)
# Strips: device memory for one stored strip of s (float32) and, in the backward, G's two bfloat16
# parts (launch.strip_rows within it), and at least STRIP_MIN_ROWS rows (fewer would leave cuBLAS
# short, flat products and the element kernels few programs a launch). 256 MiB: K = 65536 takes
# strips of 512 rows for bfloat16's backward (8 bytes an element), 1024 otherwise.
INFONCE_STRIP_BYTES = int(float(os.environ.get("EO_TRITON_INFONCE_STRIP_MIB", "256")) * 2**20)
STRIP_MIN_ROWS = 128
STRIP_BLOCK_M, STRIP_BLOCK_N = 32, 32  # the element kernels' tiles over a stored strip (no spills on sm_90)
# The interpreter runs the tile kernels unless a test sets this (it checks the strips on the CPU).
STRIPS_IN_INTERPRETER = False


def strips_take(dtype: torch.dtype) -> bool:
    """Whether inputs of this dtype go through cuBLAS strips on CUDA (float32 and 16-bit; float64
    keeps the tiles): also what keeps the op opaque under torch.compile (registration)."""
    return dtype != torch.float64


def uses_strips(x: Tensor) -> bool:
    """Whether the InfoNCE ops take s from cuBLAS strips for these inputs (module docstring):
    strips_take's dtypes on CUDA, in eager mode and in a CUDA graph's capture. Under
    torch.compile such calls stay opaque ops that run eagerly (registration._cublas_products);
    should one be traced all the same (EO_TRITON_OPAQUE unset, torch.export), it keeps the tiles."""
    if not strips_take(x.dtype):
        return False
    if configs.interpreting():
        return STRIPS_IN_INTERPRETER
    return x.device.type == "cuda" and not (torch.compiler.is_compiling() or is_fake(x))


def _strip_rows(k: int, element_bytes: int) -> int:
    """Rows of a strip of K columns (launch.strip_rows within INFONCE_STRIP_BYTES, at least STRIP_MIN_ROWS)."""
    least = STRIP_MIN_ROWS * aligned_row_length(k, element_bytes) * element_bytes
    return strip_rows(k, k, element_bytes, max(INFONCE_STRIP_BYTES, least))


def _line_args(own_line, other_line) -> tuple:
    """The kernels' own_* and other_* arguments: a direction not asked for (None) takes the other's
    tensors as placeholders, which the kernel does not read (OWN/OTHER)."""
    return own_line if own_line is not None else other_line, other_line if other_line is not None else own_line


def _strip_line_stats(own: Tensor, other: Tensor, group: Tensor | None, inv_tau: float, drop_self: bool,
                      precision: str) -> Tensor:
    """(2, K) LSEs of own's lines against other's, from strips of other's rows: s = other[strip]·ownᵀ
    (float32 products at `precision`), read by its columns (own's lines: K of them, enough
    programs), each line's running (max, sum) carried from strip to strip in (4, K) float64 and
    finished in the last."""
    k = own.shape[0]
    rows = _strip_rows(k, 4)
    strip = aligned_matrix(rows, k, torch.float32, own.device)
    state = torch.empty((4, k), dtype=torch.float64, device=own.device)
    out = torch.empty((NUM_LINE_STATS, k), dtype=torch.float64, device=own.device)
    with _float32_products(own, precision):
        for j0 in range(0, k, rows):
            n = min(rows, k - j0)
            s = strip[:n]
            similarity_product(other[j0:j0 + n], own, s)
            last = j0 + n >= k
            _launch(infonce_kernels.infonce_stats_kernel, (triton_cdiv(k, STRIP_BLOCK_M),),
                    s, s, 1, s.stride(0), 0, 0, group if group is not None else s, out, state,
                    k, 0, n, j0, k, 0, inv_tau, HAS_GROUP=group is not None, DROP_SELF=drop_self, F64=False,
                    FROM_S=True, LOAD=j0 > 0, FINISH=last, BLOCK_M=STRIP_BLOCK_M, BLOCK_N=STRIP_BLOCK_N,
                    BLOCK_K=16)
    return out


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
            q, c, q.stride(0), q.stride(1), c.stride(0), c.stride(1), group if group is not None else q, out, out,
            k, 0, k, 0, k, d, inv_tau, HAS_GROUP=group is not None, DROP_SELF=drop_self, F64=f64, FROM_S=False,
            LOAD=False, FINISH=True, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out


def _strip_gradient(own: Tensor, other: Tensor, group: Tensor | None, own_line, other_line, inv_tau: float,
                    drop_self: bool, precision: str) -> Tensor:
    """∂L/∂own (K, D) in own's dtype from strips of own's rows: s = own[strip]·otherᵀ (cuBLAS), G
    over it (infonce_strip_grad_kernel; own_line/other_line as _gradient's own/other), then
    d own[strip] = G·other:
    - float32: G in place, one product into the gradient rows (both products at `precision`);
    - bfloat16: G as two bfloat16 parts (SPLIT), both products on the tensor cores added into one
      float32 buffer (launch._accumulate_product), rounded once;
    - float16: G in place and `other` widened once (K·D·4 bytes), one float32 product, rounded once
      (float16 parts would lose G's entries below float16's normal range).
    The strip's s is this direction's product, not the transposed one the forward's statistics of
    these lines came from (_strip_line_stats): the two round differently, within the product's own
    rounding, which the tolerances of SPEC §5 already cover."""
    k, d = own.shape
    split = own.dtype == torch.bfloat16
    rows = _strip_rows(k, 8 if split else 4)
    strip = aligned_matrix(rows, k, torch.float32, own.device)
    parts = [aligned_matrix(rows, k, own.dtype, own.device) for _ in range(2)] if split else [strip, strip]
    times = other.float() if own.dtype == torch.float16 else other
    wide = own.dtype != torch.float32  # a float32 buffer of the strip's gradient rows
    total = torch.empty((rows, d), dtype=torch.float32, device=own.device) if wide else None
    out = torch.empty((k, d), dtype=own.dtype, device=own.device)
    own_args, other_args = _line_args(own_line, other_line)
    # float16's widened product is IEEE whatever `precision` says: its inputs are not float32.
    with _float32_products(own if not wide else times, precision if not wide else "ieee"):
        for i0 in range(0, k, rows):
            n = min(rows, k - i0)
            s = strip[:n]
            similarity_product(own[i0:i0 + n], other, s)
            _launch(infonce_kernels.infonce_strip_grad_kernel,
                    (triton_cdiv(n, STRIP_BLOCK_M), triton_cdiv(k, STRIP_BLOCK_N)),
                    s, s.stride(0), s.stride(1), parts[0], parts[1], parts[0].stride(0),
                    group if group is not None else s, *own_args, *other_args, n, i0, k, inv_tau,
                    HAS_GROUP=group is not None, DROP_SELF=drop_self, OWN=own_line is not None,
                    OTHER=other_line is not None, SPLIT=split, BLOCK_M=STRIP_BLOCK_M, BLOCK_N=STRIP_BLOCK_N)
            if not wide:
                torch.mm(s, other, out=out[i0:i0 + n])
                continue
            acc = total[:n]
            if split:  # hi·other written, lo·other added: both on the tensor cores, float32 results
                similarity_product(parts[0][:n], other.t(), acc)
                _accumulate_product(acc, parts[1][:n], other)
            else:
                torch.mm(s, times, out=acc)
            out[i0:i0 + n] = acc
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


def infonce_forward(x: Tensor, y: Tensor, group: Tensor | None, tau: float, drop_self: bool, rows: bool, cols: bool,
                    matmul_precision: str = "ieee"):
    _tf32(x.dtype, matmul_precision)  # checked: the tiles' products are IEEE whatever it says
    _check_embeddings(x, y)
    _check_square(x.shape[0], y.shape[0])
    _check_group(group, x.shape[0], x)
    inv_tau = _inverse_tau(tau)
    k = x.shape[0]
    zeros = lambda: torch.zeros((NUM_LINE_STATS, k), dtype=torch.float64, device=x.device)
    if uses_strips(x):
        q, c = x.contiguous(), y.contiguous()
        row_stats = _strip_line_stats(q, c, group, inv_tau, drop_self, matmul_precision) if rows else zeros()
        col_stats = _strip_line_stats(c, q, group, inv_tau, drop_self, matmul_precision) if cols else zeros()
    else:
        q, c, f64 = _inputs(x, y)
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
    own_args, other_args = _line_args(own, other)
    _launch(infonce_kernels.infonce_grad_kernel, (triton_cdiv(k, BLOCK_M),),
            q, c, q.stride(0), q.stride(1), c.stride(0), c.stride(1), group if group is not None else q,
            out, out.stride(0), out.stride(1), *own_args, *other_args, k, d, inv_tau,
            HAS_GROUP=group is not None, DROP_SELF=drop_self, OWN=own is not None, OTHER=other is not None,
            F64=f64, ACCUMULATE=accumulate, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_D=block_d)
    return out.to(out_dtype)


def infonce_backward(grad_rows: Tensor, grad_cols: Tensor, x: Tensor, y: Tensor, group: Tensor | None,
                     row_stats: Tensor, col_stats: Tensor, tau: float, drop_self: bool, rows: bool, cols: bool,
                     output_mask: list[bool], matmul_precision: str = "ieee"):
    _tf32(x.dtype, matmul_precision)
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

    def line(stats, upstream):
        # (LSE_D, LSE_P) and 1 − e^{−ℓ} per line, from the negatives' and positives' statistics
        # (infonce_lines.py): the share does not cancel where ℓ is tiny.
        if upstream is None:
            return None
        negatives, positives = stats[NEGATIVES], stats[POSITIVES]
        lse_d = torch.stack([candidates_lse(negatives, positives), positives])
        return lse_d, upstream, negative_share(negatives, positives).contiguous()

    row_line, col_line = line(row_stats, up_rows), line(col_stats, up_cols)
    if uses_strips(x):
        q, c = x.contiguous(), y.contiguous()
        dx = _strip_gradient(q, c, group, row_line, col_line, inv_tau, drop_self, matmul_precision) \
            if need_dx else x.new_empty(0)
        dy = _strip_gradient(c, q, group, col_line, row_line, inv_tau, drop_self, matmul_precision) \
            if need_dy else y.new_empty(0)
        return dx, dy
    q, c, f64 = _inputs(x, y)
    dx = _gradient(q, c, group, row_line, col_line, inv_tau, drop_self, f64, x.dtype) if need_dx else x.new_empty(0)
    dy = _gradient(c, q, group, col_line, row_line, inv_tau, drop_self, f64, y.dtype) if need_dy else y.new_empty(0)
    return dx, dy
