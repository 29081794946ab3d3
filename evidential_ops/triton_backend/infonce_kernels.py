"""Triton kernels of the InfoNCE ops (SPEC §2 "InfoNCE"); launched by infonce_launch.py.

Both kernels are row-parallel over a "query" matrix q against "candidates" c: the rows of s use
(q, c) = (x, y) and the columns (y, x), so one kernel serves each direction, with no atomics and
a fixed order of every sum (deterministic). A tile of q·cᵀ comes from `tl.dot` (float32, float64
for float64 inputs) and is never stored; the logits' exponentials are in that precision, their
sums float64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _s_tile
from .special import rounded_product_f32


@triton.jit
def _logits(s, inv_tau, F64: tl.constexpr):
    """v = s/τ of a tile, rounded once: compiled, a plain float32 product would be contracted
    (FP fusion) into some of its later uses, e.g. v − shift of one `_merge` as fma(s, 1/τ, −shift)
    but not the other's, and ℓ = ln(1 + e^{LSE_N − LSE_P}), tiny on a confident line, would carry the
    product's rounding (~|v|·2⁻²⁴). mul.rn is never fused; under the interpreter a plain product.
    1/τ arrives in float64 (a Python float becomes a float32 argument unless typed): float64
    inputs' logits keep its digits (τ = 0.07), float32 ones round it once."""
    if F64:
        return s * inv_tau
    else:
        return rounded_product_f32(s, tl.cast(inv_tau, tl.float32))


@triton.jit
def _masks(rows, cols, rmask, cmask, g_ptr, HAS_GROUP: tl.constexpr, DROP_SELF: tl.constexpr):
    """(candidate, positive) masks of a tile: D(i) and P(i) ⊆ D(i) of SPEC §2 "InfoNCE"."""
    candidate = rmask[:, None] & cmask[None, :]
    if DROP_SELF:
        candidate = candidate & (rows[:, None] != cols[None, :])
    if HAS_GROUP:
        g_rows = tl.load(g_ptr + rows, mask=rmask, other=0)
        g_cols = tl.load(g_ptr + cols, mask=cmask, other=-1)
        positive = candidate & (g_rows[:, None] == g_cols[None, :])
    else:
        positive = candidate & (rows[:, None] == cols[None, :])
    return candidate, positive


@triton.jit
def _merge(m, total, v, mask, CT: tl.constexpr):
    """Online log-sum-exp: merge the masked logits v (BLOCK_M, BLOCK_N) into the rows' running
    maximum m (CT) and float64 Σ e^{v − m}."""
    block_max = tl.max(tl.where(mask, v, -float("inf")), axis=1)
    new_m = tl.maximum(m, block_max)
    shift = tl.where(new_m == -float("inf"), 0.0, new_m)  # an empty line stays (−inf, 0)
    terms = tl.where(mask, tl.exp(v - shift[:, None]), 0.0).to(tl.float64)
    total = total * tl.exp((m - shift).to(tl.float64)) + tl.sum(terms, axis=1)
    return new_m, total


@triton.jit
def infonce_stats_kernel(
    q_ptr, c_ptr, stride_qi, stride_qk, stride_cj, stride_ck, g_ptr, out_ptr, state_ptr, M, ROW0, N, COL0, K, D,
    inv_tau: tl.float64,
    HAS_GROUP: tl.constexpr, DROP_SELF: tl.constexpr, F64: tl.constexpr, FROM_S: tl.constexpr,
    LOAD: tl.constexpr, FINISH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Per line of q·cᵀ/τ the log-sum-exp over its negatives (the candidates not among its
    positives: infonce_lines.py), then over its positives (−inf for a line without any).

    The program's lines are M rows of q, lines ROW0.. of the K (their masks, group ids and place
    in out); their candidates N rows of c, lines COL0... FROM_S: q_ptr holds s itself, element
    (i, j) at i·stride_qi + j·stride_qk (c_ptr unused). FINISH: out (2, K) receives the LSEs;
    otherwise state (4, K) float64 the running (max, Σ e^{v − max}) of negatives and positives.
    LOAD: the lines start from state (a stored strip's candidates added to what earlier strips
    left) instead of from no candidates."""
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    local = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = local < M
    rows = ROW0 + local
    if LOAD:
        m_n = tl.load(state_ptr + rows, mask=rmask, other=-float("inf")).to(CT)
        sum_n = tl.load(state_ptr + K + rows, mask=rmask, other=0.0)
        m_p = tl.load(state_ptr + 2 * K + rows, mask=rmask, other=-float("inf")).to(CT)
        sum_p = tl.load(state_ptr + 3 * K + rows, mask=rmask, other=0.0)
    else:
        m_n = tl.full((BLOCK_M,), -float("inf"), CT)
        m_p = tl.full((BLOCK_M,), -float("inf"), CT)
        sum_n = tl.zeros((BLOCK_M,), tl.float64)
        sum_p = tl.zeros((BLOCK_M,), tl.float64)
    for c0 in range(0, N, BLOCK_N):
        near = c0 + tl.arange(0, BLOCK_N)
        cmask = near < N
        s = _s_tile(q_ptr, c_ptr, local, near, rmask, cmask, stride_qi, stride_qk, stride_cj, stride_ck, D,
                    FROM_S, "ieee", CT, BLOCK_M, BLOCK_N, BLOCK_K)
        v = _logits(s, inv_tau, F64)
        candidate, positive = _masks(rows, COL0 + near, rmask, cmask, g_ptr, HAS_GROUP, DROP_SELF)
        m_n, sum_n = _merge(m_n, sum_n, v, candidate & ~positive, CT)
        m_p, sum_p = _merge(m_p, sum_p, v, positive, CT)
    if FINISH:
        lse_n = tl.where(sum_n > 0, m_n.to(tl.float64) + tl.log(tl.where(sum_n > 0, sum_n, 1.0)), -float("inf"))
        lse_p = tl.where(sum_p > 0, m_p.to(tl.float64) + tl.log(tl.where(sum_p > 0, sum_p, 1.0)), -float("inf"))
        tl.store(out_ptr + rows, lse_n, mask=rmask)
        tl.store(out_ptr + K + rows, lse_p, mask=rmask)
    else:
        tl.store(state_ptr + rows, m_n.to(tl.float64), mask=rmask)
        tl.store(state_ptr + K + rows, sum_n, mask=rmask)
        tl.store(state_ptr + 2 * K + rows, m_p.to(tl.float64), mask=rmask)
        tl.store(state_ptr + 3 * K + rows, sum_p, mask=rmask)


@triton.jit
def _softmax_part(v, lse_d, lse_p, miss, weight, candidate, positive, CT: tl.constexpr):
    """weight·∂ℓ/∂v of one direction: p^D off the positives, and on a positive p^D − p^P =
    −p^P·(1 − e^{−ℓ}) with miss = 1 − e^{−ℓ} (float64 per line), which does not cancel."""
    p_d = tl.exp((v.to(tl.float64) - lse_d).to(CT))
    p_p = tl.exp((v.to(tl.float64) - lse_p).to(CT))
    part = tl.where(positive, -p_p * miss.to(CT), tl.where(candidate, p_d, 0.0))
    return part * weight.to(CT)


@triton.jit
def _columns_part(v, lines_ptr, up_ptr, miss_ptr, cols, cmask, K, inv_tau, candidate, positive, CT: tl.constexpr):
    """_softmax_part of the tile's columns' lines: their (LSE_D, LSE_P) at lines_ptr (2, K), upstream
    gradients and 1 − e^{−ℓ}, loaded for the tile's columns."""
    lse_d = tl.load(lines_ptr + cols, mask=cmask, other=0.0)
    lse_p = tl.load(lines_ptr + K + cols, mask=cmask, other=0.0)
    weight = tl.load(up_ptr + cols, mask=cmask, other=0.0) * inv_tau
    miss = tl.load(miss_ptr + cols, mask=cmask, other=0.0)
    return _softmax_part(v, lse_d[None, :], lse_p[None, :], miss[None, :], weight[None, :], candidate, positive, CT)


@triton.jit
def infonce_strip_grad_kernel(
    s_ptr, stride_si, stride_sj, hi_ptr, lo_ptr, stride_pi, g_ptr, own_ptr, own_up_ptr, own_miss_ptr, other_ptr,
    other_up_ptr, other_miss_ptr, M, ROW0, K, inv_tau: tl.float64,
    HAS_GROUP: tl.constexpr, DROP_SELF: tl.constexpr, OWN: tl.constexpr, OTHER: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """G = (∂L/∂s)/τ over a stored float32 (M, K) strip of s = q·cᵀ whose rows are lines ROW0.. of
    q: the same element math as infonce_grad_kernel's G (own_*: q's lines, other_*: c's), the
    products G·c left to the caller's GEMMs. Written over s in place (each program reads its tile,
    then writes it), or (SPLIT, bfloat16 inputs) as two bfloat16 parts, hi = G rounded
    and lo = G − hi rounded (rows stride_pi apart), whose two products with c add up to G·c with
    hi + lo within 2^-18 of G, where G rounded once would carry 2^-9."""
    local = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = local < M
    rows = ROW0 + local
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < K
    at = s_ptr + local.to(tl.int64)[:, None] * stride_si + cols.to(tl.int64)[None, :] * stride_sj
    s = tl.load(at, mask=rmask[:, None] & cmask[None, :], other=0.0)
    v = _logits(s, inv_tau, False)
    candidate, positive = _masks(rows, cols, rmask, cmask, g_ptr, HAS_GROUP, DROP_SELF)
    g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if OWN:
        own_d = tl.load(own_ptr + rows, mask=rmask, other=0.0)
        own_p = tl.load(own_ptr + K + rows, mask=rmask, other=0.0)
        own_w = tl.load(own_up_ptr + rows, mask=rmask, other=0.0) * inv_tau
        own_miss = tl.load(own_miss_ptr + rows, mask=rmask, other=0.0)
        g += _softmax_part(v, own_d[:, None], own_p[:, None], own_miss[:, None], own_w[:, None], candidate,
                           positive, tl.float32)
    if OTHER:
        g += _columns_part(v, other_ptr, other_up_ptr, other_miss_ptr, cols, cmask, K, inv_tau, candidate, positive,
                           tl.float32)
    if SPLIT:
        part = local.to(tl.int64)[:, None] * stride_pi + cols.to(tl.int64)[None, :]
        hi = g.to(hi_ptr.dtype.element_ty)
        tl.store(hi_ptr + part, hi, mask=rmask[:, None] & cmask[None, :])
        tl.store(lo_ptr + part, (g - hi.to(tl.float32)).to(lo_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
    else:
        tl.store(at, g, mask=rmask[:, None] & cmask[None, :])


@triton.jit
def infonce_grad_kernel(
    q_ptr, c_ptr, stride_qi, stride_qk, stride_cj, stride_ck, g_ptr, out_ptr, stride_oi, stride_ok,
    own_ptr, own_up_ptr, own_miss_ptr, other_ptr, other_up_ptr, other_miss_ptr, K, D, inv_tau: tl.float64,
    HAS_GROUP: tl.constexpr, DROP_SELF: tl.constexpr, OWN: tl.constexpr, OTHER: tl.constexpr, F64: tl.constexpr,
    ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """d(q)[rows] = Σ_tiles G·c with G = (∂L/∂s)/τ of the tile of s = q·cᵀ/τ: own_* the (2, K)
    log-sum-exps (LSE_D, LSE_P: infonce_launch.infonce_backward's lines), upstream gradients and 1 − e^{−ℓ}
    of q's lines (OWN), other_* those of c's lines
    (OTHER). ACCUMULATE: D beyond BLOCK_D is added chunk by chunk into a zeroed float32/float64
    out (the program owns its rows, so no other program touches them)."""
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < K
    rows64 = rows.to(tl.int64)
    dks = tl.arange(0, BLOCK_D)
    if OWN:
        own_d = tl.load(own_ptr + rows, mask=rmask, other=0.0)
        own_p = tl.load(own_ptr + K + rows, mask=rmask, other=0.0)
        own_w = tl.load(own_up_ptr + rows, mask=rmask, other=0.0) * inv_tau
        own_miss = tl.load(own_miss_ptr + rows, mask=rmask, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_D), CT)
    for c0 in range(0, K, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        cmask = cols < K
        s = _s_tile(q_ptr, c_ptr, rows, cols, rmask, cmask, stride_qi, stride_qk, stride_cj, stride_ck, D,
                    False, "ieee", CT, BLOCK_M, BLOCK_N, BLOCK_K)
        v = _logits(s, inv_tau, F64)
        candidate, positive = _masks(rows, cols, rmask, cmask, g_ptr, HAS_GROUP, DROP_SELF)
        g = tl.zeros((BLOCK_M, BLOCK_N), CT)
        if OWN:
            g += _softmax_part(v, own_d[:, None], own_p[:, None], own_miss[:, None], own_w[:, None], candidate,
                               positive, CT)
        if OTHER:
            g += _columns_part(v, other_ptr, other_up_ptr, other_miss_ptr, cols, cmask, K, inv_tau, candidate,
                               positive, CT)
        g_op = g.to(c_ptr.dtype.element_ty)
        if ACCUMULATE:
            for d0 in range(0, D, BLOCK_D):
                dk = d0 + dks
                dmask = dk < D
                c = tl.load(c_ptr + cols.to(tl.int64)[:, None] * stride_cj + dk[None, :] * stride_ck,
                            mask=cmask[:, None] & dmask[None, :], other=0.0)
                optr = out_ptr + rows64[:, None] * stride_oi + dk[None, :] * stride_ok
                omask = rmask[:, None] & dmask[None, :]
                part = tl.load(optr, mask=omask, other=0.0)
                part = tl.dot(g_op, c, part, input_precision="ieee", out_dtype=CT)
                tl.store(optr, part, mask=omask)
                tl.debug_barrier()  # the next tile reloads this chunk
        else:
            dmask = dks < D
            c = tl.load(c_ptr + cols.to(tl.int64)[:, None] * stride_cj + dks[None, :] * stride_ck,
                        mask=cmask[:, None] & dmask[None, :], other=0.0)
            acc = tl.dot(g_op, c, acc, input_precision="ieee", out_dtype=CT)
    if not ACCUMULATE:
        tl.store(out_ptr + rows64[:, None] * stride_oi + dks[None, :] * stride_ok,
                 acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & (dks < D)[None, :])
