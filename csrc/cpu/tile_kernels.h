// The per-tile loops of the CPU backend, compiled once per instruction set (tile_kernels_*.cpp
// define EO_ISA and the target before including this file). Torch-free: raw pointers only.
//
// Each tile row runs vectorised loops over its columns: the evidence map (s -> α, ρ) into a
// small double buffer, then the special functions and the accumulation (forward) or the
// gradient coefficient (backward). Splitting them keeps the heavy loop free of the evidence kind
// and the input dtype, so it is instantiated only per set of enabled terms.
//
// Float32 (and half) inputs evaluate the per-element special functions in float32 (SPEC §2
// "Float32 element math"), at full float32 SIMD width, in a loop of their own that tabulates the
// element values (widened to double) for the accumulation loop; an α beyond FLT_MAX (exp evidence
// at s/τ > 88.7) gets the float64 functions instead, element by element, so every element's value
// depends on α alone (results do not depend on the tiling, hence not on the thread count).
// Float64 inputs keep the float64 element math. Line sums and per-line work stay float64.
#pragma once

#include "../kernels/element_terms.h"
#include "../kernels/evidence.h"
#include "../kernels/line_finalise.h"
#include "tile_args.h"

namespace evidential_ops {
namespace EO_ISA {
namespace {

template <EvidenceKind kKind, typename T>
void evidence_row(const T* s, std::int64_t n, double inv_tau, double* alpha, double* rho) {
  if (rho == nullptr) {
#pragma omp simd
    for (std::int64_t j = 0; j < n; ++j) alpha[j] = evidence_value<kKind>(static_cast<double>(s[j]) * inv_tau).alpha;
  } else {
#pragma omp simd
    for (std::int64_t j = 0; j < n; ++j) {
      const EvidenceValue v = evidence_value<kKind>(static_cast<double>(s[j]) * inv_tau);
      alpha[j] = v.alpha;
      rho[j] = v.rho;
    }
  }
}

template <typename T>
void evidence_row(int kind, const T* s, std::int64_t n, double inv_tau, double* alpha, double* rho) {
  switch (static_cast<EvidenceKind>(kind)) {
    case EvidenceKind::kExp: return evidence_row<EvidenceKind::kExp>(s, n, inv_tau, alpha, rho);
    case EvidenceKind::kRelu: return evidence_row<EvidenceKind::kRelu>(s, n, inv_tau, alpha, rho);
    case EvidenceKind::kSoftplus: return evidence_row<EvidenceKind::kSoftplus>(s, n, inv_tau, alpha, rho);
    case EvidenceKind::kExpTanh: return evidence_row<EvidenceKind::kExpTanh>(s, n, inv_tau, alpha, rho);
  }
}

void evidence_row(const cpu::TileRef& tile, int kind, std::int64_t i, double inv_tau, double* alpha, double* rho) {
  if (tile.is_double) {
    evidence_row(kind, static_cast<const double*>(tile.data) + i * tile.ld, tile.cols, inv_tau, alpha, rho);
  } else {
    evidence_row(kind, static_cast<const float*>(tile.data) + i * tile.ld, tile.cols, inv_tau, alpha, rho);
  }
}

constexpr double kFloatMax = 3.4028234663852886e38;  // FLT_MAX

// Where a float32 element value cannot be formed: α beyond FLT_MAX (or infinite). A NaN α (NaN
// input with check_finite=False) stays on the float32 path: NaN either way.
EO_HOST_DEVICE bool beyond_float(double alpha) { return alpha > kFloatMax; }

// The forward element values of one tile row from the float32 functions, widened to double:
// `table` receives kl_h, fisher, log_trigamma, remainder (each `n` long) for forward_row;
// `work` is 5·n floats. Three loops, because GCC vectorises a loop that mixes float and double
// arithmetic this long at neither width: narrow α, evaluate at full float32 width, widen.
template <bool kKl, bool kFmse, bool kLogdet>
void tabulate_forward_f32(const double* alpha, std::int64_t n, double* table, float* work) {
  float *alpha_f = work, *v_kl = work + n, *v_fisher = work + 2 * n, *v_lt = work + 3 * n, *v_r = work + 4 * n;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) alpha_f[j] = static_cast<float>(alpha[j]);
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) {
    const ElementForwardF32 f = element_forward_f32<kKl, kFmse, kLogdet>(alpha_f[j]);
    if constexpr (kKl) v_kl[j] = f.kl_h_plus_one;
    if constexpr (kFmse) v_fisher[j] = f.x_trigamma;
    if constexpr (kLogdet) {
      v_lt[j] = f.log_trigamma;
      v_r[j] = f.remainder;
    }
  }
  double *kl = table, *fisher = table + n, *log_trig = table + 2 * n, *remainder = table + 3 * n;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) {
    const ElementForward f = widen(alpha[j], ElementForwardF32{v_kl[j], v_fisher[j], v_lt[j], v_r[j]});
    if constexpr (kKl) kl[j] = f.kl_h;
    if constexpr (kFmse) fisher[j] = f.fisher;
    if constexpr (kLogdet) {
      log_trig[j] = f.log_trigamma;
      remainder[j] = f.remainder;
    }
  }
  for (std::int64_t j = 0; j < n; ++j) {  // rare: exp evidence beyond float32
    if (!beyond_float(alpha[j])) continue;
    const ElementForward f = element_forward<kKl, kFmse, kLogdet>(alpha[j]);
    kl[j] = f.kl_h;
    fisher[j] = f.fisher;
    log_trig[j] = f.log_trigamma;
    remainder[j] = f.remainder;
  }
}

// Accumulates one tile row into its row sums and the column accumulators. kTabulated: the element
// values come from tabulate_forward_f32's `table`; otherwise they are computed here in float64.
template <bool kKl, bool kFmse, bool kLogdet, bool kTabulated>
void forward_row(const double* alpha, const double* table, std::int64_t cols, std::int64_t target,
                 double* const col[kNumLineStats], double sums[kNumLineStats]) {
  double *col_rest = col[kRest], *col_sq = col[kSquares], *col_kl = col[kKlH], *col_fisher = col[kFisher];
  double *col_lt = col[kLogTrigamma], *col_rr = col[kRemainder];
  double rest = 0.0, squares = 0.0, kl = 0.0, fisher = 0.0, log_trig = 0.0, remainder = 0.0;
#pragma omp simd reduction(+ : rest, squares, kl, fisher, log_trig, remainder)
  for (std::int64_t j = 0; j < cols; ++j) {
    const double a = alpha[j];
    // A select, not a multiplication by a 0/1 mask: 0·∞ would turn an overflowed target
    // into NaN and hide the overflow the forward must report.
    const bool off = j != target;
    ElementForward f;
    if constexpr (kTabulated) {
      f = ElementForward{table[j], table[cols + j], table[2 * cols + j], table[3 * cols + j]};
    } else {
      f = element_forward<kKl, kFmse, kLogdet>(a);
    }
    const double scaled = a * kSquareScale;
    const double c_rest = off ? a : 0.0, c_sq = off ? scaled * scaled : 0.0;
    rest += c_rest;
    squares += c_sq;
    col_rest[j] += c_rest;
    col_sq[j] += c_sq;
    if constexpr (kKl) {
      const double c_kl = off ? f.kl_h : 0.0;
      kl += c_kl;
      col_kl[j] += c_kl;
    }
    if constexpr (kFmse) {
      const double c_fisher = off ? f.fisher : 0.0;
      fisher += c_fisher;
      col_fisher[j] += c_fisher;
    }
    if constexpr (kLogdet) {
      log_trig += f.log_trigamma;
      remainder += f.remainder;
      col_lt[j] += f.log_trigamma;
      col_rr[j] += f.remainder;
    }
  }
  sums[kRest] = rest;
  sums[kSquares] = squares;
  sums[kKlH] = kl;
  sums[kFisher] = fisher;
  sums[kLogTrigamma] = log_trig;
  sums[kRemainder] = remainder;
}

template <bool kKl, bool kFmse, bool kLogdet>
void forward_tile_impl(const cpu::ForwardTile& t) {
  const std::int64_t cols = t.s.cols, col0 = t.s.col0;
  double* alpha = t.scratch;
  // Column accumulators: the real ones, or a private sink when columns are not wanted (one
  // loop shape for both cases; the sink costs a few stores).
  double* sink = t.scratch + cols;
  double* table = t.scratch + (1 + kNumLineStats) * cols;  // 4·cols: tabulated element values
  float* work = reinterpret_cast<float*>(table + 4 * cols);  // 5·cols floats (3·cols doubles)
  double* col[kNumLineStats];
  for (int k = 0; k < kNumLineStats; ++k) {
    col[k] = t.col_stats != nullptr ? t.col_stats + k * t.col_stride + col0 : sink + k * cols;
  }
  constexpr bool kSpecial = kKl || kFmse || kLogdet;
  const bool float32_elements = kSpecial && !t.s.is_double;

  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const std::int64_t gi = t.s.row0 + i;
    evidence_row(t.s, t.evidence, i, t.inv_tau, alpha, nullptr);
    // Local column of the target (outside [0, cols) when it lies in another tile, or for opinions).
    const std::int64_t target = t.has_targets ? gi + t.target_offset - col0 : -1;
    double sums[kNumLineStats];
    if (float32_elements) {
      tabulate_forward_f32<kKl, kFmse, kLogdet>(alpha, cols, table, work);
      forward_row<kKl, kFmse, kLogdet, true>(alpha, table, cols, target, col, sums);
    } else {
      forward_row<kKl, kFmse, kLogdet, false>(alpha, table, cols, target, col, sums);
    }
    if (t.row_stats != nullptr) {
      double* r = t.row_stats + gi;
      const std::int64_t st = t.row_stride;
      r[kRest * st] += sums[kRest];
      r[kSquares * st] += sums[kSquares];
      if constexpr (kKl) r[kKlH * st] += sums[kKlH];
      if constexpr (kFmse) r[kFisher * st] += sums[kFisher];
      if constexpr (kLogdet) {
        r[kLogTrigamma * st] += sums[kLogTrigamma];
        r[kRemainder * st] += sums[kRemainder];
      }
    }
    if (target >= 0 && target < cols) {  // α of the target is the target of row gi and of its column
      if (t.row_stats != nullptr) t.row_stats[kTargetAlpha * t.row_stride + gi] = alpha[target];
      if (t.col_stats != nullptr) t.col_stats[kTargetAlpha * t.col_stride + col0 + target] = alpha[target];
    }
  }
}

// The backward element factors of one tile row from the float32 functions (widened), as
// tabulate_forward_f32: kl_v, fisher_slope, logdet_ratio, logdet_r_prime, each `n` long.
template <bool kKl, bool kFmse, bool kLogdet>
void tabulate_backward_f32(const double* alpha, std::int64_t n, double* table, float* work) {
  float *alpha_f = work, *v_kl = work + n, *v_slope = work + 2 * n, *v_ratio = work + 3 * n, *v_rp = work + 4 * n;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) alpha_f[j] = static_cast<float>(alpha[j]);
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) {
    const ElementBackwardF32 f = element_backward_f32<kKl, kFmse, kLogdet>(alpha_f[j]);
    if constexpr (kKl) v_kl[j] = f.kl_v;
    if constexpr (kFmse) v_slope[j] = f.fisher_slope;
    if constexpr (kLogdet) {
      v_ratio[j] = f.logdet_ratio;
      v_rp[j] = f.logdet_r_prime;
    }
  }
  double *kl_v = table, *slope = table + n, *ratio = table + 2 * n, *r_prime = table + 3 * n;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) {
    if constexpr (kKl) kl_v[j] = v_kl[j];
    if constexpr (kFmse) slope[j] = v_slope[j];
    if constexpr (kLogdet) {
      ratio[j] = v_ratio[j];
      r_prime[j] = v_rp[j];
    }
  }
  for (std::int64_t j = 0; j < n; ++j) {
    if (!beyond_float(alpha[j])) continue;
    const ElementBackward f = element_backward<kKl, kFmse, kLogdet>(alpha[j]);
    kl_v[j] = f.kl_v;
    slope[j] = f.fisher_slope;
    ratio[j] = f.logdet_ratio;
    r_prime[j] = f.logdet_r_prime;
  }
}

template <bool kKl, bool kFmse, bool kLogdet, bool kTabulated>
void backward_row(const double* alpha, double* rho, const double* table, std::int64_t cols, std::int64_t col0,
                  std::int64_t target, const LineGradient& row, const LineGradientArrays& cols_constants,
                  double inv_tau) {
#pragma omp simd
  for (std::int64_t j = 0; j < cols; ++j) {
    const double a = alpha[j];
    const double on_target = j == target ? 1.0 : 0.0;
    const double off = 1.0 - on_target;
    ElementBackward f;
    if constexpr (kTabulated) {
      f = ElementBackward{table[j], table[cols + j], table[2 * cols + j], table[3 * cols + j]};
    } else {
      f = element_backward<kKl, kFmse, kLogdet>(a);
    }
    const LineGradient column = load_line_gradient(cols_constants, col0 + j);
    const double coefficient = line_share(a, off, on_target, f, row) + line_share(a, off, on_target, f, column);
    rho[j] = coefficient * rho[j] * inv_tau;  // ∂L/∂s = (α∂L/∂α)·(g'(x)/α)·(1/τ)
  }
}

template <bool kKl, bool kFmse, bool kLogdet>
void backward_tile_impl(const cpu::BackwardTile& t) {
  const std::int64_t cols = t.s.cols, col0 = t.s.col0;
  double* alpha = t.scratch;
  double* rho = t.scratch + cols;      // overwritten in place by ∂L/∂s
  double* table = t.scratch + 2 * cols;  // 4·cols: tabulated element factors
  float* work = reinterpret_cast<float*>(table + 4 * cols);  // 5·cols floats (3·cols doubles)
  const LineGradientArrays rows = gradient_arrays(t.row_constants, t.n_rows);
  const LineGradientArrays cols_constants = gradient_arrays(t.col_constants, t.n_cols);
  constexpr bool kSpecial = kKl || kFmse || kLogdet;
  const bool float32_elements = kSpecial && !t.s.is_double;
  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const std::int64_t gi = t.s.row0 + i;
    evidence_row(t.s, t.evidence, i, t.inv_tau, alpha, rho);
    const LineGradient row = load_line_gradient(rows, gi);
    const std::int64_t target = gi + t.target_offset - col0;
    if (float32_elements) {
      tabulate_backward_f32<kKl, kFmse, kLogdet>(alpha, cols, table, work);
      backward_row<kKl, kFmse, kLogdet, true>(alpha, rho, table, cols, col0, target, row, cols_constants, t.inv_tau);
    } else {
      backward_row<kKl, kFmse, kLogdet, false>(alpha, rho, table, cols, col0, target, row, cols_constants,
                                               t.inv_tau);
    }
    if (t.grad_is_double) {
      double* out = static_cast<double*>(t.grad) + i * t.grad_ld;
#pragma omp simd
      for (std::int64_t j = 0; j < cols; ++j) out[j] = rho[j];
    } else {
      float* out = static_cast<float*>(t.grad) + i * t.grad_ld;
#pragma omp simd
      for (std::int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(rho[j]);
    }
  }
}

template <template <bool, bool, bool> class Fn, typename Arg>
void with_terms(const cpu::TermFlags& f, const Arg& arg) {
  const int code = (f.kl ? 1 : 0) | (f.fmse ? 2 : 0) | (f.logdet ? 4 : 0);
  switch (code) {
    case 0: return Fn<false, false, false>::run(arg);
    case 1: return Fn<true, false, false>::run(arg);
    case 2: return Fn<false, true, false>::run(arg);
    case 3: return Fn<true, true, false>::run(arg);
    case 4: return Fn<false, false, true>::run(arg);
    case 5: return Fn<true, false, true>::run(arg);
    case 6: return Fn<false, true, true>::run(arg);
    default: return Fn<true, true, true>::run(arg);
  }
}

template <bool kKl, bool kFmse, bool kLogdet>
struct ForwardRunner {
  static void run(const cpu::ForwardTile& t) { forward_tile_impl<kKl, kFmse, kLogdet>(t); }
};

template <bool kKl, bool kFmse, bool kLogdet>
struct BackwardRunner {
  static void run(const cpu::BackwardTile& t) { backward_tile_impl<kKl, kFmse, kLogdet>(t); }
};

void forward_tile(const cpu::ForwardTile& t) { with_terms<ForwardRunner>(t.terms, t); }
void backward_tile(const cpu::BackwardTile& t) { with_terms<BackwardRunner>(t.terms, t); }

}  // namespace

cpu::TileKernels tile_kernels() {
#define EO_STRINGIFY_(x) #x
#define EO_STRINGIFY(x) EO_STRINGIFY_(x)
  return cpu::TileKernels{EO_STRINGIFY(EO_ISA), &forward_tile, &backward_tile};
#undef EO_STRINGIFY
#undef EO_STRINGIFY_
}

}  // namespace EO_ISA
}  // namespace evidential_ops
