// The per-tile loops of the CPU backend, compiled once per instruction set (tile_kernels_*.cpp
// define EO_ISA and the target before including this file). Torch-free: raw pointers only.
//
// Float32 (and half, computed in float32) similarities run the float32 element pipeline of SPEC
// §2 "Float32 element math", per tile row, in three vectorised loops at full float32 width where
// the math is float32:
//   1. the evidence map s -> α, ρ in float32 (x = s·(1/τ) a float32 product), and exp_tanh's
//      t = tanh x;
//   2. the special functions: exp_tanh's as one polynomial in t each (α = 1 + e^t never reaches
//      the series), over the whole row; the other maps' 16 columns at a time: a chunk whose α are all below 8 (or all
//      from 8 on) evaluates only the fit (or only the series), a mixed chunk both (SIMD lanes
//      cannot branch, so grouping is what spares the untaken form). A chunk is 16 consecutive
//      columns of a tile whose first column is a multiple of 16, so which form an element gets
//      depends on its column index alone, never on the tiling or the thread count;
//   3. the float64 line sums (forward), reading the float32 values widened; or (backward) the
//      float gradient coefficient of the two lines (element_gradient_f32, the CUDA kernels'
//      expression) from their constants narrowed to float (the tile's columns once per tile, the
//      row once per row), with a row's target element and any element whose float coefficient is
//      not finite (a line constant beyond FLT_MAX) given the double coefficient of its float α, ρ.
// A row with an α beyond FLT_MAX (exp evidence at s/τ > 88.7, α = +inf in float32) redoes those
// elements with the float64 map and functions and runs loop 3 from double arrays, with every
// other element's value unchanged. Float64 inputs keep the float64 element math throughout.
#pragma once

#include <type_traits>

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
  with_evidence_kind(kind, [&](auto map) { evidence_row<decltype(map)::value>(s, n, inv_tau, alpha, rho); });
}

void evidence_row(const cpu::TileRef& tile, int kind, std::int64_t i, double inv_tau, double* alpha, double* rho) {
  if (tile.is_double) {
    evidence_row(kind, static_cast<const double*>(tile.data) + i * tile.ld, tile.cols, inv_tau, alpha, rho);
  } else {
    evidence_row(kind, static_cast<const float*>(tile.data) + i * tile.ld, tile.cols, inv_tau, alpha, rho);
  }
}

constexpr double kFloatMax = 3.4028234663852886e38;  // FLT_MAX

constexpr std::int64_t kChunk = 16;  // columns per class decision: one AVX-512 float vector
constexpr float kInfF = __builtin_inff();

// Loop 1: α (and ρ when wanted) of one row in float32, and for exp_tanh t = tanh x into `tanh`
// (the variable of its functions; not null for that map); returns whether some α left float32
// (a float max, not a count: a 64-bit counter would halve the loop's vector width).
template <EvidenceKind kKind, bool kRho>
bool evidence_row_f32(const float* s, std::int64_t n, float inv_tau, float* alpha, float* rho, float* tanh) {
  float largest = 0.0f;
#pragma omp simd reduction(max : largest)
  for (std::int64_t j = 0; j < n; ++j) {
    const EvidenceValueF32 v = evidence_value<kKind>(s[j] * inv_tau);
    alpha[j] = v.alpha;
    if constexpr (kRho) rho[j] = v.rho;
    if constexpr (kKind == EvidenceKind::kExpTanh) tanh[j] = v.tanh;
    largest = largest > v.alpha ? largest : v.alpha;
  }
  return largest == kInfF;
}

template <EvidenceKind kKind>
bool evidence_row_f32(const float* s, std::int64_t n, float inv_tau, float* alpha, float* rho, float* tanh) {
  return rho != nullptr ? evidence_row_f32<kKind, true>(s, n, inv_tau, alpha, rho, tanh)
                        : evidence_row_f32<kKind, false>(s, n, inv_tau, alpha, rho, tanh);
}

bool evidence_row_f32(int kind, const float* s, std::int64_t n, float inv_tau, float* alpha, float* rho,
                      float* tanh) {
  return with_evidence_kind(
      kind, [&](auto map) { return evidence_row_f32<decltype(map)::value>(s, n, inv_tau, alpha, rho, tanh); });
}

// The argument class shared by a chunk's α: 0 (all below 8), kSeriesClass (all from 8 on, NaN
// and +inf included), or -1 (mixed).
int chunk_class(const float* alpha, std::int64_t n) {
  int series = 0;
#pragma omp simd reduction(+ : series)
  for (std::int64_t j = 0; j < n; ++j) series += argument_class(alpha[j]);
  return series == 0 ? 0 : (series == n ? kSeriesClass : -1);
}

template <int kClass>
EO_HOST_DEVICE PolygammasF32 polygammas_for(float a) {
  if constexpr (kClass < 0) {
    return polygammas(a);
  } else {
    return polygammas_of_class<kClass>(a);
  }
}

// Calls fn(class, first column, count) for each chunk of a row: a full chunk whose α share an
// argument class gets that class as a compile-time constant (std::integral_constant), the others
// (mixed, or the row's short tail) -1, which evaluates both forms per lane.
template <typename Fn>
void for_each_chunk(const float* alpha, std::int64_t cols, const Fn& fn) {
  for (std::int64_t c = 0; c < cols; c += kChunk) {
    const std::int64_t n = cols - c < kChunk ? cols - c : kChunk;
    const int cls = chunk_class(alpha + c, n);
    if (n == kChunk && cls == 0) {
      fn(std::integral_constant<int, 0>{}, c, kChunk);
    } else if (n == kChunk && cls == kSeriesClass) {
      fn(std::integral_constant<int, kSeriesClass>{}, c, kChunk);
    } else {
      fn(std::integral_constant<int, -1>{}, c, n);
    }
  }
}

// The functions' variable in loop 2: α of one argument class (0, kSeriesClass, or -1 for both
// forms), or exp_tanh's t (kOfTanh: one polynomial in t per function, for every column).
constexpr int kOfTanh = -2;

// Loop 2's four value columns, in either direction: forward (kl_h_plus_one, x_trigamma,
// log_trigamma, remainder) or backward (kl_v, fisher_slope, logdet_ratio, logdet_r_prime).
struct ValueColumns {
  float kl, fmse, logdet_first, logdet_second;
};

template <bool kBackward, bool kKl, bool kFmse, bool kLogdet, int kClass>
ValueColumns values_of(float v) {
  if constexpr (kBackward) {
    ElementBackwardF32 f;
    if constexpr (kClass == kOfTanh) {
      f = element_backward_f32_of_tanh<kKl, kFmse, kLogdet>(v);
    } else {
      f = element_backward_f32<kKl, kFmse, kLogdet>(v, polygammas_for<kClass>(v));
    }
    return ValueColumns{f.kl_v, f.fisher_slope, f.logdet_ratio, f.logdet_r_prime};
  } else {
    ElementForwardF32 f;
    if constexpr (kClass == kOfTanh) {
      f = element_forward_f32_of_tanh<kKl, kFmse, kLogdet>(v);
    } else {
      f = element_forward_f32<kKl, kFmse, kLogdet>(v, polygammas_for<kClass>(v));
    }
    return ValueColumns{f.kl_h_plus_one, f.x_trigamma, f.log_trigamma, f.remainder};
  }
}

// Loop 2: the value columns of n columns (of one argument class, or of t) into four float
// columns, each `stride` long.
template <bool kBackward, bool kKl, bool kFmse, bool kLogdet, int kClass>
void values_f32(const float* variable, std::int64_t n, float* values, std::int64_t stride) {
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) {
    const ValueColumns f = values_of<kBackward, kKl, kFmse, kLogdet, kClass>(variable[j]);
    if constexpr (kKl) values[j] = f.kl;
    if constexpr (kFmse) values[stride + j] = f.fmse;
    if constexpr (kLogdet) {
      values[2 * stride + j] = f.logdet_first;
      values[3 * stride + j] = f.logdet_second;
    }
  }
}

// Loop 2 of a row: exp_tanh from t (`tanh` not null), the other maps chunk by chunk from α.
template <bool kBackward, bool kKl, bool kFmse, bool kLogdet>
void values_row_f32(const float* alpha, const float* tanh, std::int64_t cols, float* values) {
  if (tanh != nullptr) return values_f32<kBackward, kKl, kFmse, kLogdet, kOfTanh>(tanh, cols, values, cols);
  for_each_chunk(alpha, cols, [&](auto cls, std::int64_t c, std::int64_t n) {
    values_f32<kBackward, kKl, kFmse, kLogdet, decltype(cls)::value>(alpha + c, n, values + c, cols);
  });
}

// The float64 element values of one element from its float32 ones (α widened).
EO_HOST_DEVICE ElementForward widened_forward(double a, const float* values, std::int64_t stride, std::int64_t j) {
  return widen(a, ElementForwardF32{values[j], values[stride + j], values[2 * stride + j], values[3 * stride + j]});
}

EO_HOST_DEVICE ElementBackward widened_backward(const float* values, std::int64_t stride, std::int64_t j) {
  return widen(ElementBackwardF32{values[j], values[stride + j], values[2 * stride + j], values[3 * stride + j]});
}

// The column accumulators of a tile, held in locals: indexing an array of pointers inside the
// loop makes GCC reload each pointer per element (the stores might alias the array).
struct ColumnAccumulators {
  double *rest, *squares, *kl, *fisher, *log_trig, *remainder;
};

// Accumulates what one element contributes to its row's sums and its column's accumulators
// (Σα² only where the mse term reads it: kWithSquares).
template <bool kKl, bool kFmse, bool kLogdet, bool kWithSquares>
EO_HOST_DEVICE void accumulate_element(double a, bool off, const ElementForward& f, const ColumnAccumulators& col,
                                       std::int64_t j, double& rest, double& squares, double& kl, double& fisher,
                                       double& log_trig, double& remainder) {
  // A select, not a multiplication by a 0/1 mask: 0·∞ would turn an overflowed target
  // into NaN and hide the overflow the forward must report.
  const double c_rest = off ? a : 0.0;
  rest += c_rest;
  col.rest[j] += c_rest;
  if constexpr (kWithSquares) {
    const double scaled = a * kSquareScale;
    const double c_sq = off ? scaled * scaled : 0.0;
    squares += c_sq;
    col.squares[j] += c_sq;
  }
  if constexpr (kKl) {
    const double c_kl = off ? f.kl_h : 0.0;
    kl += c_kl;
    col.kl[j] += c_kl;
  }
  if constexpr (kFmse) {
    const double c_fisher = off ? f.fisher : 0.0;
    fisher += c_fisher;
    col.fisher[j] += c_fisher;
  }
  if constexpr (kLogdet) {
    log_trig += f.log_trigamma;
    remainder += f.remainder;
    col.log_trig[j] += f.log_trigamma;
    col.remainder[j] += f.remainder;
  }
}

// Loop 3, forward: one tile row into its row sums and the column accumulators. Element values
// from the float64 functions (kSource 0: α double, computed here), a double table of widened
// values (1: the rows with an α beyond float32), or the float32 pipeline (2: α and values float).
template <bool kKl, bool kFmse, bool kLogdet, bool kWithSquares, int kSource>
void forward_row(const void* alpha_in, const void* values_in, std::int64_t cols, std::int64_t target,
                 double* const col_in[kNumLineStats], double sums[kNumLineStats]) {
  const ColumnAccumulators col{col_in[kRest],   col_in[kSquares],     col_in[kKlH],
                               col_in[kFisher], col_in[kLogTrigamma], col_in[kRemainder]};
  double rest = 0.0, squares = 0.0, kl = 0.0, fisher = 0.0, log_trig = 0.0, remainder = 0.0;
#pragma omp simd reduction(+ : rest, squares, kl, fisher, log_trig, remainder)
  for (std::int64_t j = 0; j < cols; ++j) {
    double a;
    ElementForward f;
    if constexpr (kSource == 2) {
      a = static_cast<const float*>(alpha_in)[j];
      f = widened_forward(a, static_cast<const float*>(values_in), cols, j);
    } else if constexpr (kSource == 1) {
      const double* table = static_cast<const double*>(values_in);
      a = static_cast<const double*>(alpha_in)[j];
      f = ElementForward{table[j], table[cols + j], table[2 * cols + j], table[3 * cols + j]};
    } else {
      a = static_cast<const double*>(alpha_in)[j];
      f = element_forward<kKl, kFmse, kLogdet>(a);
    }
    accumulate_element<kKl, kFmse, kLogdet, kWithSquares>(a, j != target, f, col, j, rest, squares, kl, fisher,
                                                          log_trig, remainder);
  }
  sums[kRest] = rest;
  sums[kSquares] = squares;
  sums[kKlH] = kl;
  sums[kFisher] = fisher;
  sums[kLogTrigamma] = log_trig;
  sums[kRemainder] = remainder;
}

// forward_row with Σα² accumulated or not, as the tile's terms ask (TermFlags::squares).
template <bool kKl, bool kFmse, bool kLogdet, int kSource>
void accumulate_row(bool squares, const void* alpha_in, const void* values_in, std::int64_t cols, std::int64_t target,
                    double* const col_in[kNumLineStats], double sums[kNumLineStats]) {
  if (squares) {
    forward_row<kKl, kFmse, kLogdet, true, kSource>(alpha_in, values_in, cols, target, col_in, sums);
  } else {
    forward_row<kKl, kFmse, kLogdet, false, kSource>(alpha_in, values_in, cols, target, col_in, sums);
  }
}

template <bool kKl, bool kFmse, bool kLogdet>
void forward_tile_impl(const cpu::ForwardTile& t) {
  const std::int64_t cols = t.s.cols, col0 = t.s.col0;
  // Scratch (doubles): α, the 7 column sinks, the 4-column double table of rows beyond float32,
  // then for float32 rows α, 4 value columns and exp_tanh's t in float (3·cols doubles): 15·cols.
  double* alpha = t.scratch;
  // Column accumulators: the real ones, or a private sink when columns are not wanted (one
  // loop shape for both cases; the sink costs a few stores).
  double* sink = t.scratch + cols;
  double* table = t.scratch + (1 + kNumLineStats) * cols;
  float* alpha_f = reinterpret_cast<float*>(table + 4 * cols);
  float* values_f = alpha_f + cols;
  float* tanh_f = static_cast<EvidenceKind>(t.evidence) == EvidenceKind::kExpTanh ? values_f + 4 * cols : nullptr;
  double* col[kNumLineStats];
  for (int k = 0; k < kNumLineStats; ++k) {
    col[k] = t.col_stats != nullptr ? t.col_stats + k * t.col_stride + col0 : sink + k * cols;
  }
  constexpr bool kSpecial = kKl || kFmse || kLogdet;
  const bool float32 = !t.s.is_double && t.inv_tau <= kFloatMax;
  const float inv_tau_f = static_cast<float>(t.inv_tau);

  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const std::int64_t gi = t.s.row0 + i;
    // Local column of the target (outside [0, cols) when it lies in another tile, or for opinions).
    const std::int64_t target = t.has_targets ? gi + t.target_offset - col0 : -1;
    double sums[kNumLineStats];
    double target_alpha = 0.0;
    if (float32) {
      const float* s = static_cast<const float*>(t.s.data) + i * t.s.ld;
      const bool beyond = evidence_row_f32(t.evidence, s, cols, inv_tau_f, alpha_f, nullptr, tanh_f);
      if constexpr (kSpecial) values_row_f32<false, kKl, kFmse, kLogdet>(alpha_f, tanh_f, cols, values_f);
      if (!beyond) {
        accumulate_row<kKl, kFmse, kLogdet, 2>(t.terms.squares, alpha_f, values_f, cols, target, col, sums);
      } else {
        for (std::int64_t j = 0; j < cols; ++j) {
          alpha[j] = alpha_f[j];
          const ElementForward f = widened_forward(alpha[j], values_f, cols, j);
          table[j] = f.kl_h;
          table[cols + j] = f.fisher;
          table[2 * cols + j] = f.log_trigamma;
          table[3 * cols + j] = f.remainder;
          if (alpha_f[j] != kInfF) continue;
          alpha[j] = evidence_value_of_kind(t.evidence, static_cast<double>(s[j]) * t.inv_tau).alpha;
          const ElementForward g = element_forward<kKl, kFmse, kLogdet>(alpha[j]);
          table[j] = g.kl_h;
          table[cols + j] = g.fisher;
          table[2 * cols + j] = g.log_trigamma;
          table[3 * cols + j] = g.remainder;
        }
        accumulate_row<kKl, kFmse, kLogdet, 1>(t.terms.squares, alpha, table, cols, target, col, sums);
      }
      // α of the target enters ψ(α_y) and the strength: float64 from the float64 map.
      if (target >= 0 && target < cols) {
        target_alpha = evidence_value_of_kind(t.evidence, static_cast<double>(s[target]) * t.inv_tau).alpha;
      }
    } else {
      evidence_row(t.s, t.evidence, i, t.inv_tau, alpha, nullptr);
      accumulate_row<kKl, kFmse, kLogdet, 0>(t.terms.squares, alpha, nullptr, cols, target, col, sums);
      if (target >= 0 && target < cols) target_alpha = alpha[target];
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
      if (t.row_stats != nullptr) t.row_stats[kTargetAlpha * t.row_stride + gi] = target_alpha;
      if (t.col_stats != nullptr) t.col_stats[kTargetAlpha * t.col_stride + col0 + target] = target_alpha;
    }
  }
}

// ∂L/∂s of one element: α·∂L/∂α from both lines' constants, times ρ = g'(x)/α and 1/τ.
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE double gradient_element(double a, double rho, bool on, const ElementBackward& f,
                                       const LineGradient& row, const LineGradient& column, double inv_tau) {
  const double on_target = on ? 1.0 : 0.0;
  const double off = 1.0 - on_target;
  const double coefficient = line_share<kKl, kFmse, kLogdet>(a, off, on_target, f, row) +
                             line_share<kKl, kFmse, kLogdet>(a, off, on_target, f, column);
  return coefficient * rho * inv_tau;  // ∂L/∂s = (α∂L/∂α)·(g'(x)/α)·(1/τ)
}

// Loop 3, backward, in double: ∂L/∂s of one tile row into `out` (float or double), element values
// from the float64 functions (kSource 0) or a double table (1: the rows with an α beyond float32).
template <bool kKl, bool kFmse, bool kLogdet, int kSource, typename Out>
void backward_row(const double* alpha, const double* rho, const double* table, std::int64_t cols, std::int64_t col0,
                  std::int64_t target, const LineGradient& row, const LineGradientArrays& cols_constants,
                  double inv_tau, Out* out) {
#pragma omp simd
  for (std::int64_t j = 0; j < cols; ++j) {
    ElementBackward f;
    if constexpr (kSource == 1) {
      f = ElementBackward{table[j], table[cols + j], table[2 * cols + j], table[3 * cols + j]};
    } else {
      f = element_backward<kKl, kFmse, kLogdet>(alpha[j]);
    }
    const LineGradient column = load_line_gradient(cols_constants, col0 + j);
    out[j] = static_cast<Out>(
        gradient_element<kKl, kFmse, kLogdet>(alpha[j], rho[j], j == target, f, row, column, inv_tau));
  }
}

// The narrowed LineGradientF32 of the tile's columns, one float array per member (`lines`: 9·cols
// floats), so that loop 3 loads them as vectors.
constexpr int kNarrowedFields = 9;

void narrow_columns(const LineGradientArrays& constants, std::int64_t col0, std::int64_t cols, float* lines) {
  for (std::int64_t j = 0; j < cols; ++j) {
    const LineGradientF32 g = narrow_line_gradient(load_line_gradient(constants, col0 + j));
    const float fields[kNarrowedFields] = {g.scaled_inv_strength, g.all,  g.scaled_off,   g.square,          g.fisher,
                                           g.kl_v,                g.logdet_ratio, g.logdet_remainder, g.target};
    for (int k = 0; k < kNarrowedFields; ++k) lines[k * cols + j] = fields[k];
  }
}

EO_HOST_DEVICE LineGradientF32 narrowed_column(const float* lines, std::int64_t cols, std::int64_t j) {
  return LineGradientF32{lines[j],            lines[cols + j],     lines[2 * cols + j],
                         lines[3 * cols + j], lines[4 * cols + j], lines[5 * cols + j],
                         lines[6 * cols + j], lines[7 * cols + j], lines[8 * cols + j]};
}

// Loop 3, backward, of a float32 row (every α within float32): ∂L/∂s in float from the float
// coefficient (element_gradient_f32) of the row's and the columns' narrowed constants, every
// element taken as off its line's target; returns whether some result is not finite. The caller
// redoes those and the target in double.
template <bool kKl, bool kFmse, bool kLogdet>
bool backward_row_f32(const float* alpha, const float* rho, const float* values, std::int64_t cols,
                      const LineGradientF32& row, const float* column_lines, float inv_tau, float* out) {
  float not_finite = 0.0f;  // a float max, as in loop 1: a counter would halve the vector width
#pragma omp simd reduction(max : not_finite)
  for (std::int64_t j = 0; j < cols; ++j) {
    const ElementBackwardF32 f{values[j], values[cols + j], values[2 * cols + j], values[3 * cols + j]};
    const float g = element_gradient_f32<kKl, kFmse, kLogdet>(alpha[j], rho[j], false, inv_tau, f, row,
                                                              narrowed_column(column_lines, cols, j));
    out[j] = g;
    const float flag = g - g == 0.0f ? 0.0f : 1.0f;  // inf − inf and NaN − NaN are NaN
    not_finite = not_finite > flag ? not_finite : flag;
  }
  return not_finite != 0.0f;
}

template <bool kKl, bool kFmse, bool kLogdet>
void backward_tile_impl(const cpu::BackwardTile& t) {
  const std::int64_t cols = t.s.cols, col0 = t.s.col0;
  // Scratch (doubles): α, ρ, the 4-column double table, then α, ρ, 4 value columns, exp_tanh's t
  // and the 9 narrowed column constants in float (16 float columns): 14·cols doubles.
  double* alpha = t.scratch;
  double* rho = t.scratch + cols;
  double* table = t.scratch + 2 * cols;
  float* alpha_f = reinterpret_cast<float*>(table + 4 * cols);
  float* rho_f = alpha_f + cols;
  float* values_f = rho_f + cols;
  float* tanh_f = static_cast<EvidenceKind>(t.evidence) == EvidenceKind::kExpTanh ? values_f + 4 * cols : nullptr;
  float* column_lines = values_f + 5 * cols;
  const LineGradientArrays rows = gradient_arrays(t.row_constants, t.n_rows);
  const LineGradientArrays cols_constants = gradient_arrays(t.col_constants, t.n_cols);
  constexpr bool kSpecial = kKl || kFmse || kLogdet;
  const bool float32 = !t.s.is_double && !t.grad_is_double && t.inv_tau <= kFloatMax;
  const float inv_tau_f = static_cast<float>(t.inv_tau);
  if (float32) narrow_columns(cols_constants, col0, cols, column_lines);
  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const std::int64_t gi = t.s.row0 + i;
    const LineGradient row = load_line_gradient(rows, gi);
    const std::int64_t target = gi + t.target_offset - col0;
    if (float32) {
      const float* s = static_cast<const float*>(t.s.data) + i * t.s.ld;
      float* out = static_cast<float*>(t.grad) + i * t.grad_ld;
      const bool beyond = evidence_row_f32(t.evidence, s, cols, inv_tau_f, alpha_f, rho_f, tanh_f);
      if constexpr (kSpecial) values_row_f32<true, kKl, kFmse, kLogdet>(alpha_f, tanh_f, cols, values_f);
      if (!beyond) {
        const bool redo = backward_row_f32<kKl, kFmse, kLogdet>(alpha_f, rho_f, values_f, cols,
                                                                narrow_line_gradient(row), column_lines, inv_tau_f, out);
        const auto in_double = [&](std::int64_t j) {
          out[j] = static_cast<float>(gradient_element<kKl, kFmse, kLogdet>(
              alpha_f[j], rho_f[j], j == target, widened_backward(values_f, cols, j), row,
              load_line_gradient(cols_constants, col0 + j), t.inv_tau));
        };
        for (std::int64_t j = 0; redo && j < cols; ++j) {
          if (out[j] - out[j] != 0.0f) in_double(j);
        }
        if (target >= 0 && target < cols) in_double(target);
        continue;
      }
      for (std::int64_t j = 0; j < cols; ++j) {
        alpha[j] = alpha_f[j];
        rho[j] = rho_f[j];
        const ElementBackward f = widened_backward(values_f, cols, j);
        table[j] = f.kl_v;
        table[cols + j] = f.fisher_slope;
        table[2 * cols + j] = f.logdet_ratio;
        table[3 * cols + j] = f.logdet_r_prime;
        if (alpha_f[j] != kInfF) continue;
        const EvidenceValue v = evidence_value_of_kind(t.evidence, static_cast<double>(s[j]) * t.inv_tau);
        alpha[j] = v.alpha;
        rho[j] = v.rho;
        const ElementBackward g = element_backward<kKl, kFmse, kLogdet>(v.alpha);
        table[j] = g.kl_v;
        table[cols + j] = g.fisher_slope;
        table[2 * cols + j] = g.logdet_ratio;
        table[3 * cols + j] = g.logdet_r_prime;
      }
      backward_row<kKl, kFmse, kLogdet, 1>(alpha, rho, table, cols, col0, target, row, cols_constants, t.inv_tau,
                                           out);
    } else {
      evidence_row(t.s, t.evidence, i, t.inv_tau, alpha, rho);
      if (t.grad_is_double) {
        backward_row<kKl, kFmse, kLogdet, 0>(alpha, rho, nullptr, cols, col0, target, row, cols_constants,
                                             t.inv_tau, static_cast<double*>(t.grad) + i * t.grad_ld);
      } else {
        backward_row<kKl, kFmse, kLogdet, 0>(alpha, rho, nullptr, cols, col0, target, row, cols_constants,
                                             t.inv_tau, static_cast<float*>(t.grad) + i * t.grad_ld);
      }
    }
  }
}

void forward_tile(const cpu::ForwardTile& t) {
  with_term_flags(t.terms, [&](auto kl, auto fmse, auto logdet) {
    forward_tile_impl<decltype(kl)::value, decltype(fmse)::value, decltype(logdet)::value>(t);
  });
}

void backward_tile(const cpu::BackwardTile& t) {
  with_term_flags(t.terms, [&](auto kl, auto fmse, auto logdet) {
    backward_tile_impl<decltype(kl)::value, decltype(fmse)::value, decltype(logdet)::value>(t);
  });
}

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
