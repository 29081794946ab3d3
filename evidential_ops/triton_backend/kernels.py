"""The Triton kernels of the op family (README "Backends", csrc/ops.cpp for the ops).

Tile kernels (one evaluation of the special functions per element, s never stored):
- `stats_kernel`: forward. A program owns blocks of BLOCK_M "own" lines (rows of a = x, or
  columns when called transposed with a = y) and sweeps every BLOCK_N tile of the "other" lines:
  the tile of s is a `tl.dot` over D steps (RESIDENT: one product with the row block kept loaded
  across the sweep, so the pipeline prefetches column tiles; or a block of a given s), then
  evidence, element terms and the statistics of csrc/kernels/line_terms.h. Own-line statistics
  are complete in registers at the end of the sweep; the other lines' (columns') statistics are
  summed per program into a float64 partial buffer (G, NS, n_other) that
  `reduce_partials_kernel` adds up in a fixed order: deterministic, no atomics.
- `grad_fused_kernel`: backward (FlashAttention-2 shape), both directions, where D fits one
  register block: a program owns BLOCK_M rows, recomputes each tile of s once, forms ∂L/∂s in
  registers from both lines' constants, then dx += G·y (registers) and dy += Gᵀ·x (added in
  program order, no atomics). Never a K×K buffer.
- `grad_block_kernel`: backward where D is wider: G of a strip of rows, stored (at most
  launch.STRIP_BUDGET_BYTES), for the two products that follow as plain GEMMs.
- `grad_similarity_kernel`: backward of the from-similarity op: ds tile by tile.
Per-line kernels (float64, O(K)): `line_loss_kernel` and `line_gradient_kernel` port
csrc/kernels/line_terms.h (`line_terms`, `line_gradient`).

Numerics (README "Triton backend"): float32, float16 and bfloat16 inputs take the float32 element
math of SPEC §2 "Float32 element math" (special.py's float32 set, the C++ float32 functions' forms
and coefficients): x = s·(1/τ), α and every per-element function in float32, widened to float64
for the sums by conversions and exponent bits, without a float64 product per element. What stays
float64 there: the line sums, each line's target α (from s, once per line after the sweep) and α
of exp evidence beyond FLT_MAX (x > 88.7, exact as e_r·2^n; ln α = x feeds the series). Float64
inputs keep the float64 forms (special.py's float64 set; α beyond float64 carried as a_s·2^k).
Every reduction across tiles is float64, and so is every one within a tile but the other lines'
per-tile partials of bounded float32 values (`_tile_column_sum`: Σ ln ψ1 and Σ r of the logdet,
and exp_tanh's Σα and Σ α(α + 1)ψ1, α < 3.72), taken in float32 over the tile's 64 rows and
widened once per column: SPEC §2 "Float32 element math" measured float32 sums of those statistics
over whole lines within 1.5e-7 of the terms they feed, against 1e-4. Strips of rows then sum to
the square problem's column statistics within those partials' rounding, and the statistics layout
is exactly the C++ one.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..config import EVIDENCE_KINDS

# Imported by name, not as a module alias: Inductor rebuilds a user kernel's source from the
# global names it calls and copies @triton.jit functions, but not a module such as `sp`.
from .special import (
    digamma_difference,
    element_backward_of_tanh_f32,
    element_forward_of_tanh_f32,
    element_polygammas_f32,
    evidence_alpha,
    evidence_f32,
    fisher_remainder,
    fisher_remainder_f32,
    fisher_slope_f32,
    kl_h,
    kl_h_plus_one_f32,
    kl_v,
    alpha_f64_of_f32,
    ldexp_f64,
    log_trigamma,
    log_trigamma_f32,
    plain_argument,
    polygammas,
    polygammas_scaled,
    pow2,
    refined_alpha_f64,
    scaled_argument,
    scaled_product_f32,
    scaled_square_f64,
    split_f64,
    tetragamma_trigamma_ratio_f32,
    trigamma_difference,
    x_kl_v_f32,
)

# Sizes of the LineStat layout (csrc/kernels/line_terms.h: target α, rest, kl h, squares, fisher,
# log-trigamma, remainder; the kernels index it by those literal positions) and of LineGradient.
NUM_LINE_STATS = 7
NUM_GRADIENT_FIELDS = 9

# The EVIDENCE index of exp_tanh, whose α = 1 + e^t has its functions as polynomials in t = tanh x
# (element_terms.h has_tanh_functions): the element code of both directions evaluates those.
EXP_TANH = tl.constexpr(EVIDENCE_KINDS.index("exp_tanh"))


@triton.jit
def _s_tile(a_ptr, b_ptr, rows, cols, rmask, cmask, stride_ai, stride_ak, stride_bj, stride_bk, D,
            FROM_S: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (BLOCK_M, BLOCK_N) tile of s = a·bᵀ in ACC (float32, float64 for float64 inputs), or of a
    given s (element (i, j) at a_ptr + i·stride_ai + j·stride_ak)."""
    rows = rows.to(tl.int64)  # K² elements of a given s exceed int32 offsets from K = 46341
    cols = cols.to(tl.int64)
    if FROM_S:
        s = tl.load(a_ptr + rows[:, None] * stride_ai + cols[None, :] * stride_ak,
                    mask=rmask[:, None] & cmask[None, :], other=0.0)
        return s.to(ACC)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        for k0 in range(0, D, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < D
            a = tl.load(a_ptr + rows[:, None] * stride_ai + ks[None, :] * stride_ak,
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            b = tl.load(b_ptr + cols[:, None] * stride_bj + ks[None, :] * stride_bk,
                        mask=cmask[:, None] & kmask[None, :], other=0.0)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION, out_dtype=ACC)
        return acc


@triton.jit
def _rmw_partial(ptr, cols, cmask, values):
    old = tl.load(ptr + cols, mask=cmask, other=0.0)
    tl.store(ptr + cols, old + values, mask=cmask)


@triton.jit
def _element_stats_f64(s, inv_tau, EVIDENCE: tl.constexpr, MSE: tl.constexpr, KL: tl.constexpr,
                       FMSE: tl.constexpr, LOGDET: tl.constexpr):
    """Per element of a float64 tile, in float64 (SPEC §2 "Stable forms"): (α, (α·2^-511)², h(α),
    α(α + 1)ψ1(α), ln ψ1(α), r(α)), the contributions to the LineStats of line_terms.h (zeros for
    the terms not enabled), α again in the slot `_element_stats_f32` gives its float32 α."""
    a_s, k, _rho = evidence_alpha(s, inv_tau, EVIDENCE, tl.float64)
    scale = pow2(k, a_s)  # 2^k
    alpha64 = a_s * scale
    zero = tl.zeros_like(alpha64)
    sq, kl_h_value, fisher, lt, rr = zero, zero, zero, zero, zero
    if MSE:
        # (α·2^-511)² (line_terms.h kSquareScale), formed without overflow
        scaled = a_s * pow2(k - 511, alpha64)
        sq = scaled * scaled
    if KL or FMSE or LOGDET:
        small, xs, zz, log_z, u = scaled_argument(a_s, k)
        digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma = \
            polygammas_scaled(small, xs, zz, log_z, u)
        if KL:
            kl_h_value = kl_h(xs, small, digamma, lgamma, log_z, u)
        if FMSE:
            # (α + 1)·(αψ1(α)): αψ1 → 1 while α(α + 1) alone overflows
            fisher = (a_s + pow2(-k, a_s)) * x_trigamma * scale
        if LOGDET:
            lt = log_trigamma(small, trigamma, x_trigamma, log_z)
            rr, _xrp = fisher_remainder(a_s, trigamma, tetragamma, u)
    return alpha64, alpha64, sq, kl_h_value, fisher, lt, rr


@triton.jit
def _element_stats_f32(s, inv_tau32, EVIDENCE: tl.constexpr, MSE: tl.constexpr, KL: tl.constexpr,
                       FMSE: tl.constexpr, LOGDET: tl.constexpr):
    """Per element of a float32 tile, with float32 element math (SPEC §2 "Float32 element math"):
    x = s·(1/τ) and α in float32, the special functions of special.py's float32 set, each value
    widened to float64 for the line sums without a float64 product: (α, α in float32, (α·2^-511)²,
    h(α) + 1, α(α + 1)ψ1(α), ln ψ1(α), r(α)) (zeros for the terms not enabled). exp evidence beyond
    FLT_MAX (x > 88.7) keeps α in float64 (e_r·2^n, exact) and enters the series as ln α = x.
    Values that cannot leave float32's range are returned in float32 (ln ψ1, r; α and α(α + 1)ψ1 of
    exp_tanh, α < 3.72), so that a tile's partial sum of them can be taken in float32
    (`_tile_column_sum`); the others are float64."""
    x = s * inv_tau32
    alpha, _rho, e_r, n, beyond, t = evidence_f32(x, EVIDENCE)
    alpha64 = alpha_f64_of_f32(alpha, e_r, n, beyond)
    zero = tl.zeros_like(alpha64)
    sq, kl_h_plus_one, fisher, lt, rr = zero, zero, zero, zero, zero
    if MSE:
        sq = scaled_square_f64(tl.where(beyond, e_r, alpha), tl.where(beyond, n, 0))
    if EVIDENCE == EXP_TANH:
        # α = 1 + e^t, t = tanh x: the functions of t (no ln α, no series); α <= 1 + e, never beyond.
        f_h, f_xt, f_lt, f_r = element_forward_of_tanh_f32(t, KL, FMSE, LOGDET)
        kl_h_plus_one = f_h.to(tl.float64)
        # α(α + 1)ψ1 = α·(αψ1) + αψ1 in float32 (element_terms.h widen_from_float): α < 4, no overflow
        fisher = alpha * f_xt + f_xt
        lt = f_lt
        rr = f_r
    elif KL or FMSE or LOGDET:
        series, s_fit, log_z, inv_z, _digamma, _lgamma, x_trigamma, _x2_tetragamma = \
            element_polygammas_f32(alpha, beyond, x)
        if KL:
            kl_h_plus_one = kl_h_plus_one_f32(alpha, series, s_fit, log_z, inv_z).to(tl.float64)
        if FMSE:
            # (α + 1)·(αψ1(α)) in float32 at 2^-64 of its size, so that it cannot overflow (α <= FLT_MAX
            # here; 2^-64 times α + 1 is exact and normal), then widened and rescaled by the bits. Beyond
            # FLT_MAX it is α + 3/2 + O(1/α): α itself in float64.
            scaled = (alpha * 5.421010862427522e-20 + 5.421010862427522e-20) * x_trigamma
            fisher = tl.where(beyond, alpha64, ldexp_f64(scaled.to(tl.float64), tl.full(x.shape, 64, tl.int32)))
        if LOGDET:
            lt = log_trigamma_f32(alpha, series, s_fit, log_z, inv_z)
            rr, _x_r_prime = fisher_remainder_f32(series, s_fit, inv_z)
    return alpha64, alpha, sq, kl_h_plus_one, fisher, lt, rr


@triton.jit
def _tile_column_sum(tile):
    """Σ over a tile's rows, the other lines' partial of one tile (BLOCK_M elements a column),
    widened to float64 once per column: in the tile's own type, float64, or float32 for the element
    values that `_element_stats_f32` keeps in float32 (bounded: a 64-term float32 sum of them is
    within 2^-18 of their magnitudes' sum, where SPEC §5 allows 1e-4 for the terms they feed)."""
    return tl.sum(tile, 0).to(tl.float64)


@triton.jit
def _row_sum_init(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PER_POSITION: tl.constexpr):
    """An own-line sum of the stats sweep: per tile position (PER_POSITION) or per row."""
    if PER_POSITION:
        return tl.zeros((BLOCK_M, BLOCK_N), tl.float64)
    else:
        return tl.zeros((BLOCK_M,), tl.float64)


@triton.jit
def _row_sum_add(acc, tile, PER_POSITION: tl.constexpr):
    if PER_POSITION:
        return acc + tile
    else:
        return acc + tl.sum(tile, 1)


@triton.jit
def _row_sum_total(acc, PER_POSITION: tl.constexpr):
    if PER_POSITION:
        return tl.sum(acc, 1)
    else:
        return acc


@triton.jit
def stats_kernel(
    a_ptr, b_ptr, stride_ai, stride_ak, stride_bj, stride_bk,
    own_ptr, n_own, other_ptr, n_other, part_ptr, n_programs, blocks_per_program,
    D, t_off, inv_tau: tl.float64,
    EVIDENCE: tl.constexpr, HAS_TARGET: tl.constexpr,
    MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr,
    OWN: tl.constexpr, OTHER: tl.constexpr, FROM_S: tl.constexpr,
    F64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RESIDENT: tl.constexpr = 0,
):
    """Line statistics (float64, csrc/kernels/line_terms.h layout) of the own lines (OWN) and
    per-program partials of the other lines (OTHER). Own line i's target is other line i + t_off.

    own_ptr: (7, n_own) float64, zero-initialised; other_ptr: (7, n_other), only LineStat 0 (the
    target α, a single element) is written there; part_ptr: (num_programs, NS, n_other) float64,
    zero-initialised, NS = launch._Terms.num_partials(): slot 0 rest, then those enabled of
    squares (MSE), kl h (KL), fisher (FMSE), log-trigamma and remainder (LOGDET), in that order
    (`reduce_partials_kernel` maps them back to LineStats).
    """
    pid = tl.program_id(0)
    inv_tau = tl.full([], inv_tau, tl.float64)  # (float arguments: see `line_loss_kernel`)
    inv_tau32 = inv_tau.to(tl.float32)
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    PRECISION: tl.constexpr = "tf32" if TF32 else "ieee"
    NS: tl.constexpr = 1 + MSE + KL + FMSE + 2 * LOGDET
    SLOT_SQ: tl.constexpr = 1
    SLOT_KL: tl.constexpr = 1 + MSE
    SLOT_FI: tl.constexpr = 1 + MSE + KL
    SLOT_LT: tl.constexpr = 1 + MSE + KL + FMSE
    part = part_ptr + pid * NS * n_other
    # The own lines' sums kept per tile position and reduced over the columns once, after the
    # sweep: a reduction along a row of the tile crosses threads (shuffles and float64 adds for
    # every tile), an element-wise add does not. Each position adds its elements in column order,
    # so the result is the same for every launch. A float64 tile of registers per sum: up to four
    # sums (every method's terms; all six, every term at once, would spill), otherwise per tile.
    ROW_SUMS_PER_POSITION: tl.constexpr = NS <= 4
    # Row blocks pid, pid + n_programs, ... (the loop bound is a plain argument: Triton's
    # interpreter, 3.6 at least, cannot take a program id as a range bound)
    for it in range(0, blocks_per_program):
        rb = pid + it * n_programs
        rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n_own
        if RESIDENT:
            # D <= BLOCK_K: the row block is loaded once and each column block is one product, so
            # the column loop is the innermost loop with loads and its b tiles are the ones the
            # pipeline prefetches (the FlashAttention forward's K/V sweep)
            ks = tl.arange(0, BLOCK_K)
            kmask = ks < D
            a_blk = tl.load(a_ptr + rows.to(tl.int64)[:, None] * stride_ai + ks[None, :] * stride_ak,
                            mask=rmask[:, None] & kmask[None, :], other=0.0)
        acc_target = tl.zeros((BLOCK_M,), tl.float64)
        acc_rest = _row_sum_init(BLOCK_M, BLOCK_N, ROW_SUMS_PER_POSITION)
        acc_sq = _row_sum_init(BLOCK_M, BLOCK_N, ROW_SUMS_PER_POSITION)
        acc_kl = _row_sum_init(BLOCK_M, BLOCK_N, ROW_SUMS_PER_POSITION)
        acc_fi = _row_sum_init(BLOCK_M, BLOCK_N, ROW_SUMS_PER_POSITION)
        acc_lt = _row_sum_init(BLOCK_M, BLOCK_N, ROW_SUMS_PER_POSITION)
        acc_rr = _row_sum_init(BLOCK_M, BLOCK_N, ROW_SUMS_PER_POSITION)
        target_s = tl.zeros((BLOCK_M, BLOCK_N), CT)
        for c0 in range(0, n_other, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            cmask = cols < n_other
            if RESIDENT:
                b_blk = tl.load(b_ptr + cols.to(tl.int64)[:, None] * stride_bj + ks[None, :] * stride_bk,
                                mask=cmask[:, None] & kmask[None, :], other=0.0)
                s = tl.dot(a_blk, tl.trans(b_blk), input_precision=PRECISION, out_dtype=CT)
            else:
                s = _s_tile(a_ptr, b_ptr, rows, cols, rmask, cmask, stride_ai, stride_ak, stride_bj, stride_bk, D,
                            FROM_S, PRECISION, CT, BLOCK_M, BLOCK_N, BLOCK_K)
            valid = rmask[:, None] & cmask[None, :]
            if HAS_TARGET:
                on_target = cols[None, :] == rows[:, None] + t_off
            else:
                on_target = cols[None, :] < 0
            off = valid & (~on_target)
            if F64:
                alpha64, alpha32, sq, kl_stat, fisher, lt, rr = _element_stats_f64(s, inv_tau, EVIDENCE, MSE, KL, FMSE, LOGDET)
            else:
                alpha64, alpha32, sq, kl_stat, fisher, lt, rr = _element_stats_f32(s, inv_tau32, EVIDENCE, MSE, KL, FMSE,
                                                                       LOGDET)
            rest_c = tl.where(off, alpha64, 0.0)
            if OWN:
                acc_rest = _row_sum_add(acc_rest, rest_c, ROW_SUMS_PER_POSITION)
            if OTHER:
                if EVIDENCE == EXP_TANH:  # α < 3.72: the tile's partial in float32
                    _rmw_partial(part, cols, cmask, _tile_column_sum(tl.where(off, alpha32, 0.0)))
                else:
                    _rmw_partial(part, cols, cmask, _tile_column_sum(rest_c))
            if HAS_TARGET:
                if F64:
                    target_c = tl.where(valid & on_target, alpha64, 0.0)
                    if OWN:
                        acc_target += tl.sum(target_c, 1)
                    if OTHER:
                        # column j's target row is j − t_off: store it where that row is in this block
                        has_target = (cols - t_off >= rb * BLOCK_M) & (cols - t_off < rb * BLOCK_M + BLOCK_M) & \
                            (cols - t_off < n_own) & cmask
                        tl.store(other_ptr + cols, tl.sum(target_c, 0), mask=has_target)
                else:
                    # One element per row in all, kept by a select. Outside `valid` s is 0 (the
                    # masked loads), and such a target is not stored.
                    target_s = tl.where(on_target, s, target_s)
            if MSE:
                sq_c = tl.where(off, sq, 0.0)
                if OWN:
                    acc_sq = _row_sum_add(acc_sq, sq_c, ROW_SUMS_PER_POSITION)
                if OTHER:
                    _rmw_partial(part + SLOT_SQ * n_other, cols, cmask, tl.sum(sq_c, 0))
            if KL:
                kl_c = tl.where(off, kl_stat, 0.0)
                if OWN:
                    acc_kl = _row_sum_add(acc_kl, kl_c, ROW_SUMS_PER_POSITION)
                if OTHER:
                    col_kl = tl.sum(kl_c, 0)
                    if not F64:
                        # Float32 elements give h + 1 (SPEC §2 "Float32 element math"): −1 per summed
                        # element, in float64. The tile sums the column's valid rows but its target.
                        col_target = cols - t_off
                        col_has_target = HAS_TARGET & (col_target >= rb * BLOCK_M) & \
                            (col_target < rb * BLOCK_M + BLOCK_M) & (col_target < n_own)
                        # (a program's last pass may be past the last row block: no rows there)
                        block_rows = tl.maximum(tl.minimum(n_own - rb * BLOCK_M, BLOCK_M), 0)
                        col_kl -= tl.where(cmask, block_rows - col_has_target.to(tl.int32), 0).to(tl.float64)
                    _rmw_partial(part + SLOT_KL * n_other, cols, cmask, col_kl)
            if FMSE:
                fi_c = tl.where(off, fisher, 0.0)
                if OWN:
                    acc_fi = _row_sum_add(acc_fi, fi_c.to(tl.float64), ROW_SUMS_PER_POSITION)
                if OTHER:
                    _rmw_partial(part + SLOT_FI * n_other, cols, cmask, _tile_column_sum(fi_c))
            if LOGDET:
                lt_c = tl.where(valid, lt, 0.0)
                rr_c = tl.where(valid, rr, 0.0)
                if OWN:
                    acc_lt = _row_sum_add(acc_lt, lt_c.to(tl.float64), ROW_SUMS_PER_POSITION)
                    acc_rr = _row_sum_add(acc_rr, rr_c.to(tl.float64), ROW_SUMS_PER_POSITION)
                if OTHER:
                    _rmw_partial(part + SLOT_LT * n_other, cols, cmask, _tile_column_sum(lt_c))
                    _rmw_partial(part + (SLOT_LT + 1) * n_other, cols, cmask, _tile_column_sum(rr_c))
        if HAS_TARGET and not F64:
            # A line's target α enters its finalisation alone (ψ(S) − ψ(α_y) of the risk, α̃_y of the
            # KL): float64 from s refined to x = s/τ in two floats (refined_alpha_f64: no float64
            # product), once per line after the sweep, where it adds nothing to the registers of the
            # element loop.
            target_col = rows + t_off
            has_target = rmask & (target_col >= 0) & (target_col < n_other)
            acc_target = tl.where(has_target, refined_alpha_f64(tl.sum(target_s, 1), inv_tau, EVIDENCE), 0.0)
            if OTHER:
                tl.store(other_ptr + target_col, acc_target, mask=has_target)
        if OWN:
            tl.store(own_ptr + 1 * n_own + rows, _row_sum_total(acc_rest, ROW_SUMS_PER_POSITION), mask=rmask)
            if HAS_TARGET:
                tl.store(own_ptr + rows, acc_target, mask=rmask)
            if KL:
                row_kl = _row_sum_total(acc_kl, ROW_SUMS_PER_POSITION)
                if not F64:
                    # −1 per summed element of h + 1 (as for the columns above): every column of
                    # the line but its target
                    own_target = rows + t_off
                    row_has_target = HAS_TARGET & (own_target >= 0) & (own_target < n_other)
                    row_kl -= (n_other - row_has_target.to(tl.int32)).to(tl.float64)
                tl.store(own_ptr + 2 * n_own + rows, row_kl, mask=rmask)
            if MSE:
                tl.store(own_ptr + 3 * n_own + rows, _row_sum_total(acc_sq, ROW_SUMS_PER_POSITION), mask=rmask)
            if FMSE:
                tl.store(own_ptr + 4 * n_own + rows, _row_sum_total(acc_fi, ROW_SUMS_PER_POSITION), mask=rmask)
            if LOGDET:
                tl.store(own_ptr + 5 * n_own + rows, _row_sum_total(acc_lt, ROW_SUMS_PER_POSITION), mask=rmask)
                tl.store(own_ptr + 6 * n_own + rows, _row_sum_total(acc_rr, ROW_SUMS_PER_POSITION), mask=rmask)
        # The next row block read-modify-writes the same partials: its loads must see these
        # stores, also where a value is held by several threads and stored by one of them.
        tl.debug_barrier()


@triton.jit
def reduce_partials_kernel(part_ptr, n_partials, stats_ptr, n, stats_stride,
                           MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr,
                           BLOCK: tl.constexpr, CLEAR: tl.constexpr):
    """stats[LineStat of slot, j] = Σ_g part[g, slot, j], g in order: the second, deterministic pass
    of the column statistics (float64). stats_stride: between LineStats in stats (n, or the whole
    statistics' line count where stats_ptr is a strip's first line). CLEAR: each partial read is
    set to 0 again, for the next strip's sweep (launch._strip_statistics: no zeroing launch)."""
    NS: tl.constexpr = 1 + MSE + KL + FMSE + 2 * LOGDET
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < n
    for slot in tl.static_range(NS):
        acc = tl.zeros((BLOCK,), tl.float64)
        for g in range(0, n_partials):
            acc += tl.load(part_ptr + (g * NS + slot) * n + cols, mask=cmask, other=0.0)
            if CLEAR:
                tl.store(part_ptr + (g * NS + slot) * n + cols, tl.zeros((BLOCK,), tl.float64), mask=cmask)
        if slot == 0:
            stat = 1  # rest
        elif MSE and slot == 1:
            stat = 3
        elif KL and slot == 1 + MSE:
            stat = 2
        elif FMSE and slot == 1 + MSE + KL:
            stat = 4
        elif slot == 1 + MSE + KL + FMSE:
            stat = 5
        else:
            stat = 6
        tl.store(stats_ptr + stat * stats_stride + cols, acc, mask=cmask)


# ------------------------------------------------------------------------------------ backward


@triton.jit
def _load_constants(ptr, idx, mask, n):
    """LineGradient fields (line_finalise.h order) of lines idx: float64 vectors."""
    inv_s = tl.load(ptr + idx, mask=mask, other=0.0)
    c_all = tl.load(ptr + 1 * n + idx, mask=mask, other=0.0)
    c_off = tl.load(ptr + 2 * n + idx, mask=mask, other=0.0)
    c_sq = tl.load(ptr + 3 * n + idx, mask=mask, other=0.0)
    c_fi = tl.load(ptr + 4 * n + idx, mask=mask, other=0.0)
    c_kv = tl.load(ptr + 5 * n + idx, mask=mask, other=0.0)
    c_lr = tl.load(ptr + 6 * n + idx, mask=mask, other=0.0)
    c_lrem = tl.load(ptr + 7 * n + idx, mask=mask, other=0.0)
    c_t = tl.load(ptr + 8 * n + idx, mask=mask, other=0.0)
    return inv_s, c_all, c_off, c_sq, c_fi, c_kv, c_lr, c_lrem, c_t


@triton.jit
def _line_constants(ptr, idx, mask, n, EVIDENCE: tl.constexpr, CT: tl.constexpr, SCALED_P: tl.constexpr = 1):
    """The LineGradient constants of lines idx as the element code reads them, formed once per line
    (a program's own lines before its column sweep): 1/S as (inv_m, inv_k) and the others in CT.
    CT = float64: inv_m = 1/S. Float32 element math (SPEC §2 "Float32 element math"): the others
    narrowed to float32 (line_terms.h narrow_line_gradient's rounding); for exp evidence with
    SCALED_P 1/S split into mantissa and exponent (`split_f64`: α beyond FLT_MAX, or 1/S below
    FLT_MIN, keep p = α/S exact), otherwise inv_m = float32 1/S (S = Σα within float32's range:
    the other maps, and exp where no line strength exceeds 2^126) and inv_k = 0."""
    inv_s, c_all, c_off, c_sq, c_fi, c_kv, c_lr, c_lrem, c_t = _load_constants(ptr, idx, mask, n)
    if CT == tl.float64:  # noqa: SIM300  (Triton constexpr dtype)
        inv_m, inv_k = inv_s, tl.zeros(idx.shape, tl.int32)
    elif EVIDENCE == 0 and SCALED_P:
        inv_m, inv_k = split_f64(inv_s)
    else:
        inv_m, inv_k = inv_s.to(tl.float32), tl.zeros(idx.shape, tl.int32)
    return (inv_m, inv_k, c_all.to(CT), c_off.to(CT), c_sq.to(CT), c_fi.to(CT), c_kv.to(CT), c_lr.to(CT),
            c_lrem.to(CT), c_t.to(CT))


@triton.jit
def _line_share(p, off, on_target, f_kv, f_slope, f_ratio, f_xrp, c_all, c_off, c_sq, c_fi, c_kv, c_lr, c_lrem, c_t,
                MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr):
    """One line's share of α·∂L/∂α at an element (element_terms.h `line_share`)."""
    inner = c_off
    if MSE:
        inner = inner + c_sq * p
    if FMSE:
        inner = inner + c_fi * f_slope
    out = p * (c_all + off * inner) + on_target * c_t
    if KL:
        out = out + off * c_kv * f_kv
    if LOGDET:
        out = out + c_lr * f_ratio + c_lrem * f_xrp
    return out


@triton.jit
def _element_backward_f64(s, inv_tau, o_inv_s, t_inv_s, EVIDENCE: tl.constexpr, KL: tl.constexpr,
                          FMSE: tl.constexpr, LOGDET: tl.constexpr):
    """Per element of a float64 tile (SPEC §2 "Stable forms"): ρ = g'(x)/α, the factors of
    element_terms.h ElementBackward (α·v(α), f'(α), αψ2/ψ1, α·r'(α); zeros for the terms not
    enabled) and p = α/S of the own and the other line."""
    a_s, k, rho = evidence_alpha(s, inv_tau, EVIDENCE, tl.float64)
    alpha64 = a_s * pow2(k, a_s)
    f_kv = tl.zeros_like(a_s)
    f_slope = tl.zeros_like(a_s)
    f_ratio = tl.zeros_like(a_s)
    f_xrp = tl.zeros_like(a_s)
    if KL or FMSE or LOGDET:
        small, xs, zz, log_z, u = scaled_argument(a_s, k)
        digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma = \
            polygammas_scaled(small, xs, zz, log_z, u)
        if KL:
            _v, f_kv = kl_v(a_s, trigamma, u)
        if FMSE:
            # f'(α) = (2α + 1)ψ1 + α(α + 1)ψ2 from the scaled αψ1, α²ψ2 (element_terms.h)
            alpha_tetragamma = tl.where(small, xs * tetragamma, x2_tetragamma * u)
            f_slope = 2.0 * x_trigamma + trigamma + x2_tetragamma + alpha_tetragamma
        if LOGDET:
            f_ratio = x2_tetragamma / x_trigamma
            _r, f_xrp = fisher_remainder(a_s, trigamma, tetragamma, u)
    return rho, f_kv, f_slope, f_ratio, f_xrp, alpha64 * o_inv_s[:, None], alpha64 * t_inv_s[None, :]


@triton.jit
def _element_backward_f32(s, inv_tau32, o_inv_m, o_inv_k, t_inv_m, t_inv_k, EVIDENCE: tl.constexpr,
                          KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr, SCALED_P: tl.constexpr = 1):
    """`_element_backward_f64` with float32 element math (SPEC §2 "Float32 element math"): x = s·(1/τ)
    and α in float32, element_terms.h element_backward_f32's factors, and p = α/S in float32 from
    each line's 1/S as `_line_constants` gives it, without a float64 product (exp evidence: α and
    1/S as mantissa and exponent, so that α beyond FLT_MAX, or 1/S below FLT_MIN, keeps p exact)."""
    x = s * inv_tau32
    alpha, rho, e_r, n, beyond, t = evidence_f32(x, EVIDENCE)
    f_kv = tl.zeros_like(alpha)
    f_slope = tl.zeros_like(alpha)
    f_ratio = tl.zeros_like(alpha)
    f_xrp = tl.zeros_like(alpha)
    if EVIDENCE == EXP_TANH:
        f_kv, f_slope, f_ratio, f_xrp = element_backward_of_tanh_f32(t, KL, FMSE, LOGDET)
    elif KL or FMSE or LOGDET:
        series, s_fit, log_z, inv_z, _digamma, _lgamma, x_trigamma, x2_tetragamma = \
            element_polygammas_f32(alpha, beyond, x)
        if KL:
            f_kv = x_kl_v_f32(series, s_fit, inv_z)
        if FMSE:
            f_slope = fisher_slope_f32(alpha, series, s_fit, inv_z)
        if LOGDET:
            f_ratio = tetragamma_trigamma_ratio_f32(x_trigamma, x2_tetragamma)
            _r, f_xrp = fisher_remainder_f32(series, s_fit, inv_z)
    if EVIDENCE == 0 and SCALED_P:
        a_m = tl.where(beyond, e_r, alpha)
        a_k = tl.where(beyond, n, 0)
        p_own = scaled_product_f32(a_m, a_k, o_inv_m[:, None], o_inv_k[:, None])
        p_other = scaled_product_f32(a_m, a_k, t_inv_m[None, :], t_inv_k[None, :])
    else:
        # α <= FLT_MAX and S = Σα within float32's range for these maps (α <= x + 2, or e + 1), and
        # for exp where every line strength is at most 2^126 (then α <= S too): one rounding, the
        # scaled product's bits wherever p is a normal float32
        p_own = alpha * o_inv_m[:, None]
        p_other = alpha * t_inv_m[None, :]
    return rho, f_kv, f_slope, f_ratio, f_xrp, p_own, p_other


@triton.jit
def _gradient_tile(s, rows, cols, valid, cmask, t_off, inv_tau,
                   o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t, other_ptr, n_other,
                   EVIDENCE: tl.constexpr, MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr,
                   LOGDET: tl.constexpr, CT: tl.constexpr, SCALED_P: tl.constexpr = 1):
    """∂L/∂s of a tile (CT; 0 outside `valid`): (α∂L/∂α of the own line + of the other line)·ρ/τ,
    element_terms.h line_share with the factors of `_element_backward_f64` (CT = float64) or
    `_element_backward_f32` (float32 element math, SPEC §2 "Float32 element math"); o_* the own
    lines' `_line_constants` (formed once by a caller that sweeps columns, with the same SCALED_P),
    the other lines' read here for the tile's columns."""
    t_inv_m, t_inv_k, t_all, t_off_c, t_sq, t_fi, t_kv, t_lr, t_lrem, t_t = _line_constants(
        other_ptr, cols, cmask, n_other, EVIDENCE, CT, SCALED_P)
    on_target = (cols[None, :] == rows[:, None] + t_off)
    on = tl.where(on_target, 1.0, 0.0).to(CT)
    off = 1.0 - on
    if CT == tl.float64:  # noqa: SIM300  (Triton constexpr dtype)
        rho, f_kv, f_slope, f_ratio, f_xrp, p_own, p_other = _element_backward_f64(
            s, inv_tau, o_inv_m, t_inv_m, EVIDENCE, KL, FMSE, LOGDET)
    else:
        rho, f_kv, f_slope, f_ratio, f_xrp, p_own, p_other = _element_backward_f32(
            s, inv_tau.to(tl.float32), o_inv_m, o_inv_k, t_inv_m, t_inv_k, EVIDENCE, KL, FMSE, LOGDET, SCALED_P)
    share = _line_share(p_own, off, on, f_kv, f_slope, f_ratio, f_xrp,
                        o_all[:, None], o_off[:, None], o_sq[:, None], o_fi[:, None],
                        o_kv[:, None], o_lr[:, None], o_lrem[:, None], o_t[:, None],
                        MSE, KL, FMSE, LOGDET)
    share += _line_share(p_other, off, on, f_kv, f_slope, f_ratio, f_xrp,
                         t_all[None, :], t_off_c[None, :], t_sq[None, :], t_fi[None, :],
                         t_kv[None, :], t_lr[None, :], t_lrem[None, :], t_t[None, :],
                         MSE, KL, FMSE, LOGDET)
    g = share * rho * inv_tau.to(CT)
    return tl.where(valid, g, 0.0)


@triton.jit
def grad_block_kernel(
    a_ptr, b_ptr, stride_ai, stride_ak, stride_bj, stride_bk,
    g_ptr, stride_gi, stride_gj,
    own_ptr, n_own, other_ptr, n_other, row0, n_rows, col0, n_cols, n_col_programs, col_blocks_per_program,
    D, t_off, inv_tau: tl.float64, scaled_ptr,
    EVIDENCE: tl.constexpr, MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr,
    F64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FROM_S: tl.constexpr = 0,
    SCALED_P: tl.constexpr = 0,
):
    """G = ∂L/∂s of rows [row0, row0 + n_rows) and columns [col0, col0 + n_cols), stored in g's
    dtype (the input dtype: the operand of the two products that follow, as flash attention rounds
    dS) at g's element (i − row0, j − col0): the backward where D is too wide for a register
    accumulator stages G through this block (a strip of rows where it spans every column), and dx,
    dy become plain tensor-core products of it. Program (r, c) owns the BLOCK_M rows of row block r
    and walks column blocks c, c + n_col_programs, ... (col_blocks_per_program of them): its rows'
    line constants are read and narrowed once for the sweep, not once per tile. Lines keep their
    indices in the whole problem (line constants, targets), so a block needs no offsets of its own.
    FROM_S: the block's s is given (a_ptr: element (i − row0, j − col0) at i·stride_ai + j·stride_ak,
    a product already made), and g_ptr may be that same buffer: each program reads a tile before it
    writes it, and no other program touches the tile.

    scaled_ptr: an int32 flag, 1 where some line strength exceeds 2^126 (launch._scaled_p_flag). The
    kernel does its work only where the flag equals SCALED_P: an eager backward launches the variant
    the flag selects (read on the host), a traced or captured one both, and the one that does not
    match exits at once (launch._Backward.scaled_variants). SCALED_P = 0 forms p = α/S as a float32 product
    (what every input whose line strengths stay below 2^126 takes: cosine similarities at τ >= 0.0132
    with K <= 65536), SCALED_P = 1 from mantissas and exponents (`scaled_product_f32`), exact for α
    beyond FLT_MAX and 1/S below FLT_MIN; the other maps and float64 inputs take the product either
    way (their launches: SCALED_P = 0 with a zero flag)."""
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    PRECISION: tl.constexpr = "tf32" if TF32 else "ieee"
    # 1/τ as a float64 scalar under its own name, before the branch: a branch may not rebind an
    # argument to another type, and torch.compile's mutation analysis (identify_mutated_tensors)
    # types a float argument from its value (fp32, or a constexpr in torch 2.11), not from the
    # annotation; where it cannot build the TTIR it takes every tensor argument as written.
    inv_tau64 = tl.full([], inv_tau, tl.float64)
    if tl.load(scaled_ptr) == SCALED_P:
        local = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = row0 + local
        rmask = local < n_rows
        o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t = _line_constants(
            own_ptr, rows, rmask, n_own, EVIDENCE, CT, SCALED_P)
        g_rows = g_ptr + local.to(tl.int64)[:, None] * stride_gi
        # (the loop bound is a plain argument: the interpreter cannot take a program id as one)
        for it in range(0, col_blocks_per_program):
            col_local = (tl.program_id(1) + it * n_col_programs) * BLOCK_N + tl.arange(0, BLOCK_N)
            cols = col0 + col_local
            cmask = col_local < n_cols
            s = _s_tile(a_ptr, b_ptr, local if FROM_S else rows, col_local if FROM_S else cols, rmask, cmask,
                        stride_ai, stride_ak, stride_bj, stride_bk, D, FROM_S, PRECISION, CT, BLOCK_M, BLOCK_N,
                        BLOCK_K)
            valid = rmask[:, None] & cmask[None, :]
            g = _gradient_tile(s, rows, cols, valid, cmask, t_off, inv_tau64,
                               o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t, other_ptr,
                               n_other, EVIDENCE, MSE, KL, FMSE, LOGDET, CT, SCALED_P)
            tl.store(g_rows + col_local.to(tl.int64)[None, :] * stride_gj, g.to(g_ptr.dtype.element_ty),
                     mask=valid)


@triton.jit
def grad_fused_kernel(
    a_ptr, b_ptr, stride_ai, stride_ak, stride_bj, stride_bk,
    da_ptr, stride_dai, stride_dak, db_ptr, stride_dbj, stride_dbk, turn_ptr,
    own_ptr, n_own, other_ptr, n_other,
    D, t_off, inv_tau: tl.float64,
    EVIDENCE: tl.constexpr, MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr,
    F64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Both gradients from one recomputation of each tile (the FlashAttention-2 backward):
    G = ∂L/∂s in registers, then d(a)[own rows] += G·b (a register accumulator, stored once in
    da's dtype) and d(b)[tile's columns] += Gᵀ·a (float32/float64 `db`, zero-initialised, shared
    by every program). D <= BLOCK_D.

    No float atomics: the programs add their Gᵀ·a into a block of db in program order. turn_ptr
    holds one int32 per column block, the number of programs that have added theirs; program p
    waits for turn p, adds, and passes the turn on. Every db element is then the same sum in the
    same order on every run. Programs walk the column blocks in the same order, so program p
    waits only on p − 1, which started before it (blocks are issued in program order): a
    staircase of one tile per program at the start, no deadlock."""
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    PRECISION: tl.constexpr = "tf32" if TF32 else "ieee"
    inv_tau = tl.full([], inv_tau, tl.float64)
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_own
    rows64 = rows.to(tl.int64)
    dks = tl.arange(0, BLOCK_D)
    dmask = dks < D
    a_blk = tl.load(a_ptr + rows64[:, None] * stride_ai + dks[None, :] * stride_ak,
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_D), CT)
    o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t = _line_constants(
        own_ptr, rows, rmask, n_own, EVIDENCE, CT)
    for c0 in range(0, n_other, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        cmask = cols < n_other
        cols64 = cols.to(tl.int64)
        # s read again in BLOCK_K steps rather than as a_blk·b_blkᵀ: holding the column block through
        # the element math spills on sm_90 (aot_check, default tile: 44-436 bytes stored); it is
        # loaded after G instead.
        s = _s_tile(a_ptr, b_ptr, rows, cols, rmask, cmask, stride_ai, stride_ak, stride_bj, stride_bk, D,
                    False, PRECISION, CT, BLOCK_M, BLOCK_N, BLOCK_K)
        valid = rmask[:, None] & cmask[None, :]
        g = _gradient_tile(s, rows, cols, valid, cmask, t_off, inv_tau,
                           o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t, other_ptr, n_other,
                           EVIDENCE, MSE, KL, FMSE, LOGDET, CT)
        # Operand of the two products: the input dtype for 16-bit inputs (as flash attention does
        # for dS), float32/float64 otherwise.
        g_op = g.to(b_ptr.dtype.element_ty)
        bmask = cmask[:, None] & dmask[None, :]
        b_blk = tl.load(b_ptr + cols64[:, None] * stride_bj + dks[None, :] * stride_bk, mask=bmask, other=0.0)
        acc = tl.dot(g_op, b_blk, acc, input_precision=PRECISION, out_dtype=CT)
        # Gᵀ·a as (aᵀ·G)ᵀ: the product's M is then D (64 rows of a wgmma) rather than BLOCK_N
        part = tl.trans(tl.dot(tl.trans(a_blk), g_op, input_precision=PRECISION, out_dtype=CT))
        turn = turn_ptr + c0 // BLOCK_N
        while tl.atomic_add(turn, 0, sem="acquire") != pid:
            pass
        # The acquire is one thread's: the barrier orders every thread's loads after it. The
        # loads skip L1, which another program on this SM may have filled with an older value.
        tl.debug_barrier()
        dptr = db_ptr + cols64[:, None] * stride_dbj + dks[None, :] * stride_dbk
        old = tl.load(dptr, mask=bmask, other=0.0, cache_modifier=".cg")
        tl.store(dptr, old + part.to(CT), mask=bmask)
        tl.debug_barrier()
        tl.atomic_xchg(turn, pid + 1, sem="release")
    tl.store(da_ptr + rows64[:, None] * stride_dai + dks[None, :] * stride_dak, acc.to(da_ptr.dtype.element_ty),
             mask=rmask[:, None] & dmask[None, :])


@triton.jit
def grad_similarity_kernel(
    s_ptr, stride_si, stride_sj, ds_ptr, stride_di, stride_dj,
    row_ptr, n_rows, col_ptr, n_cols, inv_tau: tl.float64,
    EVIDENCE: tl.constexpr, MSE: tl.constexpr, KL: tl.constexpr, FMSE: tl.constexpr, LOGDET: tl.constexpr,
    F64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """ds = ∂L/∂s of a given s, one (BLOCK_M, BLOCK_N) tile per program, in s's dtype."""
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    inv_tau = tl.full([], inv_tau, tl.float64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    cmask = cols < n_cols
    valid = rmask[:, None] & cmask[None, :]
    r64 = rows.to(tl.int64)
    c64 = cols.to(tl.int64)
    s = tl.load(s_ptr + r64[:, None] * stride_si + c64[None, :] * stride_sj, mask=valid, other=0.0).to(CT)
    o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t = _line_constants(
        row_ptr, rows, rmask, n_rows, EVIDENCE, CT)
    g = _gradient_tile(s, rows, cols, valid, cmask, 0, inv_tau,
                       o_inv_m, o_inv_k, o_all, o_off, o_sq, o_fi, o_kv, o_lr, o_lrem, o_t, col_ptr, n_cols,
                       EVIDENCE, MSE, KL, FMSE, LOGDET, CT)
    tl.store(ds_ptr + r64[:, None] * stride_di + c64[None, :] * stride_dj, g.to(ds_ptr.dtype.element_ty),
             mask=valid)


# ------------------------------------------------------------------------- per line (float64)


@triton.jit
def _line_input(stats_ptr, n, idx, mask, scale_ptr, scale_offset, HAS_SCALE: tl.constexpr):
    a = tl.load(stats_ptr + idx, mask=mask, other=1.0)
    rest = tl.load(stats_ptr + 1 * n + idx, mask=mask, other=1.0)
    if HAS_SCALE:
        c = tl.load(scale_ptr + idx + scale_offset, mask=mask, other=1.0)
    else:
        c = tl.full(a.shape, 1.0, tl.float64)
    return a, rest, c


@triton.jit
def _f64_scalars(a, b, c, d, e, f):
    return (tl.full([], a, tl.float64), tl.full([], b, tl.float64), tl.full([], c, tl.float64),
            tl.full([], d, tl.float64), tl.full([], e, tl.float64), tl.full([], f, tl.float64))


@triton.jit
def _weight(weights_ptr, host_value, index: tl.constexpr, W_FROM_PTR: tl.constexpr):
    if W_FROM_PTR:
        return tl.load(weights_ptr + index)
    else:
        return host_value


@triton.jit
def _kl_h_of(x):
    small, xs, zz, log_z, u = plain_argument(x)
    digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma = polygammas_scaled(small, xs, zz, log_z, u)
    return kl_h(xs, small, digamma, lgamma, log_z, u)


@triton.jit
def line_loss_kernel(stats_ptr, n, scale_ptr, scale_offset, candidates: tl.float64, weights_ptr,
                     w0: tl.float64, w1: tl.float64, w2: tl.float64, w3: tl.float64, w4: tl.float64, out_ptr,
                     HAS_SCALE: tl.constexpr, W_FROM_PTR: tl.constexpr, RISK: tl.constexpr, KL: tl.constexpr, MSE: tl.constexpr,
                     FMSE: tl.constexpr, LOGDET: tl.constexpr, BLOCK: tl.constexpr):
    """Σ_term weight·term of each line (line_finalise.h `line_loss`, line_terms.h `line_terms`).

    Float arguments are made float64 tensors first: the interpreter hands them over as Python
    floats, which become float32 constants once they pass through a helper function."""
    candidates, w0, w1, w2, w3, w4 = _f64_scalars(candidates, w0, w1, w2, w3, w4)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    a, rest, c = _line_input(stats_ptr, n, idx, mask, scale_ptr, scale_offset, HAS_SCALE)
    nn = candidates
    strength = a + rest
    q = rest / strength
    p_target = a / strength
    target_error_sq = (c - 1.0 + q) * (c - 1.0 + q)
    total = tl.zeros(a.shape, tl.float64)
    if RISK:
        total += _weight(weights_ptr, w0, 0, W_FROM_PTR) * (c * digamma_difference(a, rest))
    if KL:
        a_tilde = c + (1.0 - c) * a
        s_tilde = rest + a_tilde
        kl_stat = tl.load(stats_ptr + 2 * n + idx, mask=mask, other=0.0)
        digamma_s = polygammas(s_tilde)[0]
        lgamma_n = polygammas(tl.full(a.shape, 1.0, tl.float64) * nn)[3]
        kl = kl_stat + _kl_h_of(a_tilde) - _kl_h_of(s_tilde) + (nn - 1.0) * digamma_s - lgamma_n
        total += _weight(weights_ptr, w1, 1, W_FROM_PTR) * kl
    if MSE:
        t = 6.703903964971299e+153 / strength  # 2^511 / S
        off_sq = (tl.load(stats_ptr + 3 * n + idx, mask=mask, other=0.0) * t) * t
        mse = target_error_sq + off_sq + (q * (1.0 + p_target) - off_sq) / (strength + 1.0)
        total += _weight(weights_ptr, w2, 2, W_FROM_PTR) * mse
    if FMSE:
        trigamma_a = polygammas(a)[1]
        target_part = (target_error_sq + p_target * q / (strength + 1.0)) * trigamma_a
        fisher = tl.load(stats_ptr + 4 * n + idx, mask=mask, other=0.0)
        total += _weight(weights_ptr, w3, 3, W_FROM_PTR) * (fisher / strength / (strength + 1.0) + target_part)
    if LOGDET:
        small, xs, zz, log_z, u = plain_argument(strength)
        digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma = \
            polygammas_scaled(small, xs, zz, log_z, u)
        r, _xrp = fisher_remainder(strength, trigamma, tetragamma, u)
        m = 0.5 * (nn - 1.0) + r - tl.load(stats_ptr + 6 * n + idx, mask=mask, other=0.0)
        logdet = tl.load(stats_ptr + 5 * n + idx, mask=mask, other=0.0) + \
            log_trigamma(small, trigamma, x_trigamma, log_z) + tl.log(m)
        total += _weight(weights_ptr, w4, 4, W_FROM_PTR) * logdet
    tl.store(out_ptr + idx, total, mask=mask)


@triton.jit
def line_gradient_kernel(stats_ptr, n, scale_ptr, scale_offset, candidates: tl.float64, weights_ptr,
                         w0: tl.float64, w1: tl.float64, w2: tl.float64, w3: tl.float64, w4: tl.float64,
                         upstream_ptr, out_ptr,
                         HAS_SCALE: tl.constexpr, W_FROM_PTR: tl.constexpr, RISK: tl.constexpr, KL: tl.constexpr, MSE: tl.constexpr,
                         FMSE: tl.constexpr, LOGDET: tl.constexpr, BLOCK: tl.constexpr):
    """The LineGradient constants of each line (line_terms.h `line_gradient`) into (9, n): what the
    tile kernels combine with each element into α·∂(upstream·L)/∂α. A term that is not enabled, or
    has weight 0, contributes nothing (not even 0·inf)."""
    candidates, w0, w1, w2, w3, w4 = _f64_scalars(candidates, w0, w1, w2, w3, w4)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    a, rest, c = _line_input(stats_ptr, n, idx, mask, scale_ptr, scale_offset, HAS_SCALE)
    nn = candidates
    up = tl.load(upstream_ptr + idx, mask=mask, other=0.0)
    strength = a + rest
    s1 = strength + 1.0
    q = rest / strength
    p_target = a / strength
    zero = tl.zeros(a.shape, tl.float64)
    off = zero
    all_ = zero
    target = zero
    square = zero
    fisher_c = zero
    kl_v_c = zero
    logdet_ratio = zero
    logdet_remainder = zero
    if RISK:
        w = _weight(weights_ptr, w0, 0, W_FROM_PTR)
        wc = w * c
        x_trigamma_s = polygammas(strength)[4]
        off += tl.where(w != 0.0, wc * x_trigamma_s, 0.0)
        target += tl.where(w != 0.0, wc * a * trigamma_difference(a, rest), 0.0)
    if KL:
        w = _weight(weights_ptr, w1, 1, W_FROM_PTR)
        a_tilde = c + (1.0 - c) * a
        s_tilde = rest + a_tilde
        small, xs, zz, log_z, u = plain_argument(s_tilde)
        digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma = \
            polygammas_scaled(small, xs, zz, log_z, u)
        _v, x_v = kl_v(s_tilde, trigamma, u)
        per_p_tilde = x_v + (nn - 1.0) * x_trigamma
        off += tl.where(w != 0.0, w * (strength / s_tilde) * per_p_tilde, 0.0)
        kl_v_c = tl.where(w != 0.0, -w + zero, 0.0)
        small_t, xs_t, zz_t, log_z_t, u_t = plain_argument(a_tilde)
        trigamma_t = polygammas_scaled(small_t, xs_t, zz_t, log_z_t, u_t)[1]
        v_t, _xv_t = kl_v(a_tilde, trigamma_t, u_t)
        target += tl.where(w != 0.0, w * ((a_tilde - c) / s_tilde * per_p_tilde - (a_tilde - c) * v_t), 0.0)
    if MSE:
        w = _weight(weights_ptr, w2, 2, W_FROM_PTR)
        t2 = 6.703903964971299e+153 / strength
        off_sq = (tl.load(stats_ptr + 3 * n + idx, mask=mask, other=0.0) * t2) * t2
        all_sq = p_target * p_target + off_sq
        t = strength / s1
        off += tl.where(w != 0.0, w * (2.0 * c * p_target - all_sq * t * (2.0 * strength + 1.0) / s1 - t / s1), 0.0)
        square = tl.where(w != 0.0, w * 2.0 * t, 0.0)
        bracket = t * (2.0 * q * p_target - 2.0 * off_sq + (off_sq + q * q - 2.0 * q) / s1)
        target += tl.where(w != 0.0, w * (-2.0 * c * p_target * q + p_target * bracket), 0.0)
    if FMSE:
        w = _weight(weights_ptr, w3, 3, W_FROM_PTR)
        fisher = tl.load(stats_ptr + 4 * n + idx, mask=mask, other=0.0)
        miss = c - 1.0 + q
        g = polygammas(a)
        trigamma_a = g[1]
        tetragamma_a = g[2]
        y_value = miss * miss + p_target * q / s1
        fisher_sum_part = -(fisher / strength) * ((2.0 * strength + 1.0) / s1) / s1
        dy_off = 2.0 * miss * p_target - (1.0 - 2.0 * p_target) * p_target / s1 - strength * p_target * q / (s1 * s1)
        off += tl.where(w != 0.0, w * (fisher_sum_part + trigamma_a * dy_off), 0.0)
        fisher_c = tl.where(w != 0.0, w / s1, 0.0)
        dy_target = -2.0 * miss * p_target * q + p_target * q * (1.0 - 2.0 * p_target) / s1 - \
            p_target * p_target * q * strength / (s1 * s1)
        target += tl.where(w != 0.0, w * (p_target * fisher_sum_part + trigamma_a * dy_target +
                                          a * tetragamma_a * y_value), 0.0)
    if LOGDET:
        w = _weight(weights_ptr, w4, 4, W_FROM_PTR)
        small, xs, zz, log_z, u = plain_argument(strength)
        digamma, trigamma, tetragamma, lgamma, x_trigamma, x2_tetragamma = \
            polygammas_scaled(small, xs, zz, log_z, u)
        r, x_r_prime = fisher_remainder(strength, trigamma, tetragamma, u)
        m = 0.5 * (nn - 1.0) + r - tl.load(stats_ptr + 6 * n + idx, mask=mask, other=0.0)
        all_ += tl.where(w != 0.0, w * (x2_tetragamma / x_trigamma + x_r_prime / m), 0.0)
        logdet_ratio = tl.where(w != 0.0, w + zero, 0.0)
        logdet_remainder = tl.where(w != 0.0, -w / m, 0.0)
    tl.store(out_ptr + idx, 1.0 / strength, mask=mask)
    tl.store(out_ptr + 1 * n + idx, up * all_, mask=mask)
    tl.store(out_ptr + 2 * n + idx, up * off, mask=mask)
    tl.store(out_ptr + 3 * n + idx, up * square, mask=mask)
    tl.store(out_ptr + 4 * n + idx, up * fisher_c, mask=mask)
    tl.store(out_ptr + 5 * n + idx, up * kl_v_c, mask=mask)
    tl.store(out_ptr + 6 * n + idx, up * logdet_ratio, mask=mask)
    tl.store(out_ptr + 7 * n + idx, up * logdet_remainder, mask=mask)
    tl.store(out_ptr + 8 * n + idx, up * target, mask=mask)
