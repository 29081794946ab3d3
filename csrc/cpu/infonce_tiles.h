// The per-tile loops of the CPU InfoNCE op (SPEC §2 "InfoNCE"), compiled once per instruction set
// (infonce_tiles_*.cpp define EO_ISA and the target first). Torch-free: raw pointers only.
//
// Float32 (and half, computed in float32) similarities take the float32 element path of SPEC §2
// "InfoNCE": logits v = s·fl(1/τ) in float32, e^{v − shift} by exp_f at full float32 width, sums
// of those positive terms in float32 over at most 32 terms (a row's lane sums, a column's 16-row
// groups) and in float64 beyond, gradient entries in float32. Float64
// similarities, and float32 tiles whose logits or upstream weights leave the float range the
// path is written for (|v| > 2^100), take the float64 path: v = s·(1/τ) and exp_d in float64.
// The dense loops sum the negatives N(i) = D(i) \ P(i) of a line (the self column and the
// positives masked); the positives, O(K·group size) elements, are visited through the sorted
// member lists of PositiveSets, always in float64, into their own sums: a confident line's ℓ and a
// positive's gradient entry a(p^D − p^P) = −a·p^P·(1 − e^{−ℓ}) are of the size of the negatives'
// share, which a sum or a difference taking the positives in would round away.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "../kernels/elementary_f32.h"
#include "../kernels/infonce_lines.h"
#include "infonce_tile_args.h"

namespace evidential_ops {
namespace EO_ISA {
namespace {

template <typename T>
const T* tile_row(const cpu::TileRef& tile, std::int64_t i) {
  return static_cast<const T*>(tile.data) + i * tile.ld;
}

// Calls visit(j) for every positive j of line `line` with col0 <= j < col0 + n, in ascending j.
template <typename Visit>
void for_each_positive(const cpu::PositiveSets& p, bool drop_self, std::int64_t line, std::int64_t col0,
                       std::int64_t n, const Visit& visit) {
  const std::int64_t* first = p.members + p.begin[line];
  const std::int64_t* last = p.members + p.end[line];
  for (const std::int64_t* it = std::lower_bound(first, last, col0); it != last && *it < col0 + n; ++it) {
    if (!(drop_self && *it == line)) visit(*it);
  }
}

// Pass 1 of a forward tile: the largest s·scale over each row's and each column's candidates (the
// self column masked under mask_self) into row_max (rows) and col_max (cols), in V: the float64
// path takes the logits (scale 1/τ), the float32 path the similarities themselves (scale 1, exact).
template <typename T, typename V>
void candidate_maxima(const cpu::TileRef& tile, bool mask_self, V scale, V* row_max, V* col_max) {
  const V minus_inf = -__builtin_inf();
  for (std::int64_t j = 0; j < tile.cols; ++j) col_max[j] = minus_inf;
  for (std::int64_t i = 0; i < tile.rows; ++i) {
    const T* s = tile_row<T>(tile, i);
    const std::int64_t self = mask_self ? tile.row0 + i - tile.col0 : -1;
    V m = minus_inf;
#pragma omp simd reduction(max : m)
    for (std::int64_t j = 0; j < tile.cols; ++j) {
      const V v = select(j == self, minus_inf, static_cast<V>(s[j]) * scale);
      m = max_of(m, v);
      col_max[j] = max_of(col_max[j], v);
    }
    row_max[i] = m;
  }
}

// Marks a row's negatives among a tile's columns: keep[j] = 0 at the row's self column (when
// masked) and its positives, 1 elsewhere; unmark() restores every 1.
template <typename K>
struct NegativeMarks {
  K* keep;
  const cpu::InfoNCEForwardTile& t;
  std::int64_t line, self;

  void set(K value) const {
    if (self >= 0 && self < t.s.cols) keep[self] = value;
    for_each_positive(t.positives, t.drop_self, line, t.s.col0, t.s.cols,
                      [&](std::int64_t j) { keep[j - t.s.col0] = value; });
  }
  void mark() const { set(K(0)); }
  void unmark() const { set(K(1)); }
};

template <typename T>
void forward_tile_impl(const cpu::InfoNCEForwardTile& t) {
  const std::int64_t rows = t.s.rows, cols = t.s.cols, row0 = t.s.row0, col0 = t.s.col0, n = t.n;
  const double inv_tau = t.inv_tau;
  double* col_max = t.scratch;
  double* col_sum = t.scratch + cols;
  double* row_max = t.scratch + 2 * cols;
  double* keep = t.scratch + 2 * cols + rows;
  // The diagonal is masked only where this tile holds it and drop_self asks for it.
  const bool mask_self = t.drop_self && row0 < col0 + cols && col0 < row0 + rows;
  for (std::int64_t j = 0; j < cols; ++j) {
    col_sum[j] = 0.0;
    keep[j] = 1.0;
  }
  // Pass 1: the tile's maximum logit of every row and every column over their candidates (the
  // shift of the negatives' sums: a candidate's maximum bounds theirs).
  candidate_maxima<T>(t.s, mask_self, inv_tau, row_max, col_max);
  // Pass 2: Σ e^{v − max} over each row's negatives (merged into the row's running sum at once)
  // and each column's. A pair is a positive of its row exactly when it is one of its column (the
  // relation is symmetric), so the row's marks serve both.
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* s = tile_row<T>(t.s, i);
    const std::int64_t line = row0 + i;
    const NegativeMarks<double> marks{keep, t, line, mask_self ? line - col0 : -1};
    marks.mark();
    const double m = row_max[i];
    double sum = 0.0;
    if (t.col_acc != nullptr) {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double v = static_cast<double>(s[j]) * inv_tau;
        const bool negative = keep[j] != 0.0;
        sum += select(negative, exp_d(v - m), 0.0);
        col_sum[j] += select(negative, exp_d(v - col_max[j]), 0.0);
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double v = static_cast<double>(s[j]) * inv_tau;
        sum += select(keep[j] != 0.0, exp_d(v - m), 0.0);
      }
    }
    marks.unmark();
    if (t.row_acc != nullptr) {
      merge_log_sum_exp(t.row_acc[kAccNegativeMax * n + line], t.row_acc[kAccNegativeSum * n + line], m, sum);
      for_each_positive(t.positives, t.drop_self, line, col0, cols, [&](std::int64_t j) {
        const double v = static_cast<double>(s[j - col0]) * inv_tau;
        merge_log_sum_exp(t.row_acc[kAccPositiveMax * n + line], t.row_acc[kAccPositiveSum * n + line], v, 1.0);
      });
    }
  }
  if (t.col_acc != nullptr) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t line = col0 + j;
      merge_log_sum_exp(t.col_acc[kAccNegativeMax * n + line], t.col_acc[kAccNegativeSum * n + line], col_max[j],
                        col_sum[j]);
      for_each_positive(t.positives, t.drop_self, line, row0, rows, [&](std::int64_t i) {
        const double v = static_cast<double>(tile_row<T>(t.s, i - row0)[j]) * inv_tau;
        merge_log_sum_exp(t.col_acc[kAccPositiveMax * n + line], t.col_acc[kAccPositiveSum * n + line], v, 1.0);
      });
    }
  }
}

// The float64 gradient entry of a positive (i, j): a_i(p^D − p^P) + b_j(q^D − q^P), already /τ,
// as −a_i·p^P·share_i − b_j·q^P·share_j (kBackNegativeShare): no difference that cancels.
template <bool kRows, bool kCols>
double positive_entry(const cpu::InfoNCEBackwardTile& t, double v, std::int64_t line, std::int64_t col) {
  const std::int64_t n = t.n;
  double value = 0.0;
  if (kRows) {
    value -= t.row_upstream[line] * t.inv_tau * exp_d(v - t.row_lse[kBackPositives * n + line]) *
             t.row_lse[kBackNegativeShare * n + line];
  }
  if (kCols) {
    value -= t.col_upstream[col] * t.inv_tau * exp_d(v - t.col_lse[kBackPositives * n + col]) *
             t.col_lse[kBackNegativeShare * n + col];
  }
  return value;
}

// (∂L/∂s)/τ of one tile row in float64 (SPEC §2 "InfoNCE" gradient): the candidates' softmax of
// the row and of every column weighted by their upstream gradients, minus the positives' softmax.
template <typename T, bool kRows, bool kCols>
void backward_row(const cpu::InfoNCEBackwardTile& t, std::int64_t i, double* g) {
  const std::int64_t cols = t.s.cols, row0 = t.s.row0, col0 = t.s.col0, n = t.n;
  const T* s = tile_row<T>(t.s, i);
  const std::int64_t line = row0 + i;
  const double inv_tau = t.inv_tau;
  const double a = kRows ? t.row_upstream[line] * inv_tau : 0.0;
  const double row_lse = kRows ? t.row_lse[kBackCandidates * n + line] : 0.0;
  const double* col_lse = t.col_lse + kBackCandidates * n + col0;
  const double* b = kCols ? t.col_upstream + col0 : nullptr;
  const std::int64_t self = t.drop_self ? line - col0 : -1;
#pragma omp simd
  for (std::int64_t j = 0; j < cols; ++j) {
    const double v = static_cast<double>(s[j]) * inv_tau;
    double value = 0.0;
    if (kRows) value += a * exp_d(v - row_lse);
    if (kCols) value += b[j] * inv_tau * exp_d(v - col_lse[j]);
    g[j] = select(j == self, 0.0, value);
  }
  for_each_positive(t.positives, t.drop_self, line, col0, cols, [&](std::int64_t col) {
    const double v = static_cast<double>(s[col - col0]) * inv_tau;
    g[col - col0] = positive_entry<kRows, kCols>(t, v, line, col);
  });
}

template <typename T, bool kRows, bool kCols>
void backward_tile_impl(const cpu::InfoNCEBackwardTile& t) {
  double* g = t.scratch;
  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    backward_row<T, kRows, kCols>(t, i, g);
    if (t.grad_is_double) {
      std::copy(g, g + t.s.cols, static_cast<double*>(t.grad) + i * t.grad_ld);
    } else {
      float* out = static_cast<float*>(t.grad) + i * t.grad_ld;
#pragma omp simd
      for (std::int64_t j = 0; j < t.s.cols; ++j) out[j] = static_cast<float>(g[j]);
    }
  }
}

// ---- The float32 element path (float32 tiles)

// Terms per float32 partial sum: a row's exponentials go to kSumLanes running sums by column
// (each takes at most cols/kSumLanes <= 32 terms of a 512-column tile), a column's to a float
// partial of kColumnGroup rows; both then join float64 sums. The grouping is fixed, not the
// vector width's: the same bound and the same bits for every instruction set.
constexpr std::int64_t kSumLanes = 16;
constexpr std::int64_t kColumnGroup = 16;
// The float32 path serves tiles whose logits and upstream weights stay within 2^100 in magnitude
// (far beyond any logit an exponential can use, and no product of two of them overflows float).
constexpr double kFloatPathLimit = 0x1p100;

// The largest |s| of a float tile (a NaN may or may not be seen: it reaches the sums either way).
float tile_abs_max(const cpu::TileRef& tile) {
  float largest = 0.0f;
  for (std::int64_t i = 0; i < tile.rows; ++i) {
    const float* s = tile_row<float>(tile, i);
#pragma omp simd reduction(max : largest)
    for (std::int64_t j = 0; j < tile.cols; ++j) largest = max_of(largest, s[j] < 0.0f ? -s[j] : s[j]);
  }
  return largest;
}

bool float_logits(const cpu::TileRef& tile, double inv_tau) {
  return inv_tau <= kFloatPathLimit && static_cast<double>(tile_abs_max(tile)) * inv_tau <= kFloatPathLimit;
}

// The float32 sums take a line's negatives only (the positives are visited in float64 for LSE_P):
// a line whose positives dominate has ℓ = ln(1 + ε), ε = e^{LSE_N − LSE_P} ≪ 1 (its loss, and
// through p^D − p^P its positives' gradient, are of the size of ε): a sum that added the
// positives in would round ε to 2^-24 (float32) or 2^-53 (float64) of their sum.

// One chunk of `count` columns from `first` of a tile row: e^{(s − max)/τ} of the columns `keep`
// marks (1: a negative) into the row's lane sums and, with kCols, into the
// columns' float partials.
template <bool kCols>
void exp_sums_of_chunk(const float* s, const float* keep, std::int64_t first, std::int64_t count, float inv_tau,
                       float row_max, const float* col_max, float* col_part, float* lanes) {
#pragma omp simd
  for (std::int64_t l = 0; l < count; ++l) {
    const std::int64_t j = first + l;
    const bool dense = keep[j] != 0.0f;
    lanes[l] += select(dense, exp_f((s[j] - row_max) * inv_tau), 0.0f);
    if constexpr (kCols) col_part[j] += select(dense, exp_f((s[j] - col_max[j]) * inv_tau), 0.0f);
  }
}

// Σ e^{(s_ij − max)/τ} over one row's kept columns (float64, from its lane sums) and, with kCols,
// their terms into the columns' partials.
template <bool kCols>
double exp_sums_of_row(const float* s, const float* keep, std::int64_t cols, float inv_tau, float row_max,
                       const float* col_max, float* col_part) {
  float lanes[kSumLanes] = {};
  std::int64_t c = 0;
  for (; c + kSumLanes <= cols; c += kSumLanes) {
    exp_sums_of_chunk<kCols>(s, keep, c, kSumLanes, inv_tau, row_max, col_max, col_part, lanes);
  }
  if (c < cols) exp_sums_of_chunk<kCols>(s, keep, c, cols - c, inv_tau, row_max, col_max, col_part, lanes);
  double sum = 0.0;
  for (std::int64_t l = 0; l < kSumLanes; ++l) sum += lanes[l];
  return sum;
}

void forward_tile_f32(const cpu::InfoNCEForwardTile& t) {
  const std::int64_t rows = t.s.rows, cols = t.s.cols, row0 = t.s.row0, col0 = t.s.col0, n = t.n;
  const float inv_tau = static_cast<float>(t.inv_tau);
  // Scratch: the columns' float64 sums (cols doubles), then floats: their maximum similarities,
  // their float partials, the row's keep marks (cols each) and the rows' maximum similarities.
  double* col_sum = t.scratch;
  float* col_max = reinterpret_cast<float*>(t.scratch + cols);
  float* col_part = col_max + cols;
  float* keep = col_max + 2 * cols;
  float* row_max = col_max + 3 * cols;
  const bool mask_self = t.drop_self && row0 < col0 + cols && col0 < row0 + rows;
  const bool with_cols = t.col_acc != nullptr;
  for (std::int64_t j = 0; j < cols; ++j) {
    col_part[j] = 0.0f;
    keep[j] = 1.0f;
    col_sum[j] = 0.0;
  }
  // Pass 1: the tile's maximum similarity of every row and every column over their candidates
  // (1/τ > 0: the logits' maxima).
  candidate_maxima<float>(t.s, mask_self, 1.0f, row_max, col_max);
  // Pass 2: the exponential sums, merged into the rows' running sums at once and into the columns'
  // float64 sums every kColumnGroup rows. A line's shift is its maximum logit, in float64.
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* s = tile_row<float>(t.s, i);
    const std::int64_t line = row0 + i;
    const NegativeMarks<float> marks{keep, t, line, mask_self ? line - col0 : -1};
    marks.mark();
    const double dense = with_cols ? exp_sums_of_row<true>(s, keep, cols, inv_tau, row_max[i], col_max, col_part)
                                   : exp_sums_of_row<false>(s, keep, cols, inv_tau, row_max[i], col_max, col_part);
    marks.unmark();
    if (with_cols && ((i + 1) % kColumnGroup == 0 || i + 1 == rows)) {
      for (std::int64_t j = 0; j < cols; ++j) {
        col_sum[j] += col_part[j];
        col_part[j] = 0.0f;
      }
    }
    if (t.row_acc != nullptr) {
      const double m = static_cast<double>(row_max[i]) * t.inv_tau;
      for_each_positive(t.positives, t.drop_self, line, col0, cols, [&](std::int64_t j) {
        const double v = static_cast<double>(s[j - col0]) * t.inv_tau;
        merge_log_sum_exp(t.row_acc[kAccPositiveMax * n + line], t.row_acc[kAccPositiveSum * n + line], v, 1.0);
      });
      merge_log_sum_exp(t.row_acc[kAccNegativeMax * n + line], t.row_acc[kAccNegativeSum * n + line], m, dense);
    }
  }
  if (with_cols) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t line = col0 + j;
      const double m = static_cast<double>(col_max[j]) * t.inv_tau;
      for_each_positive(t.positives, t.drop_self, line, row0, rows, [&](std::int64_t i) {
        const double v = static_cast<double>(tile_row<float>(t.s, i - row0)[j]) * t.inv_tau;
        merge_log_sum_exp(t.col_acc[kAccPositiveMax * n + line], t.col_acc[kAccPositiveSum * n + line], v, 1.0);
      });
      merge_log_sum_exp(t.col_acc[kAccNegativeMax * n + line], t.col_acc[kAccNegativeSum * n + line], m, col_sum[j]);
    }
  }
}

// A log-sum-exp as two floats, hi + lo, within 2^-48 of it relative: v − hi − lo then loses
// nothing to the rounding of the statistic.
struct SplitFloat {
  float hi, lo;
};

SplitFloat split_float(double x) {
  const float hi = static_cast<float>(x);
  return SplitFloat{hi, static_cast<float>(x - hi)};
}

// Whether a backward tile's upstream weights (times 1/τ) stay within the float path's range.
template <bool kRows, bool kCols>
bool float_weights(const cpu::InfoNCEBackwardTile& t) {
  double largest = 0.0;
  if (kRows) {
    for (std::int64_t i = 0; i < t.s.rows; ++i) largest = max_of(largest, std::fabs(t.row_upstream[t.s.row0 + i]));
  }
  if (kCols) {
    for (std::int64_t j = 0; j < t.s.cols; ++j) largest = max_of(largest, std::fabs(t.col_upstream[t.s.col0 + j]));
  }
  return largest * t.inv_tau <= kFloatPathLimit;
}

template <bool kRows, bool kCols>
void backward_tile_f32(const cpu::InfoNCEBackwardTile& t) {
  const std::int64_t cols = t.s.cols, row0 = t.s.row0, col0 = t.s.col0, n = t.n;
  const float inv_tau = static_cast<float>(t.inv_tau);
  // Scratch: per column of the tile b_j/τ and LSE_D split in two floats.
  float* col_weight = reinterpret_cast<float*>(t.scratch);
  float* col_hi = col_weight + cols;
  float* col_lo = col_hi + cols;
  for (std::int64_t j = 0; j < cols; ++j) {
    const std::int64_t col = col0 + j;
    const SplitFloat lse = split_float(kCols ? t.col_lse[kBackCandidates * n + col] : 0.0);
    col_weight[j] = kCols ? static_cast<float>(t.col_upstream[col] * t.inv_tau) : 0.0f;
    col_hi[j] = lse.hi;
    col_lo[j] = lse.lo;
  }
  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const float* s = tile_row<float>(t.s, i);
    float* g = static_cast<float*>(t.grad) + i * t.grad_ld;
    const std::int64_t line = row0 + i;
    const std::int64_t self = t.drop_self ? line - col0 : -1;
    const float a = kRows ? static_cast<float>(t.row_upstream[line] * t.inv_tau) : 0.0f;
    const SplitFloat lse = split_float(kRows ? t.row_lse[kBackCandidates * n + line] : 0.0);
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = s[j] * inv_tau;
      float value = 0.0f;
      if (kRows) value += a * exp_f((v - lse.hi) - lse.lo);
      if (kCols) value += col_weight[j] * exp_f((v - col_hi[j]) - col_lo[j]);
      g[j] = select(j == self, 0.0f, value);
    }
    for_each_positive(t.positives, t.drop_self, line, col0, cols, [&](std::int64_t col) {
      const double v = static_cast<double>(s[col - col0]) * t.inv_tau;
      g[col - col0] = static_cast<float>(positive_entry<kRows, kCols>(t, v, line, col));
    });
  }
}

template <typename T, bool kRows, bool kCols>
void backward_tile_of(const cpu::InfoNCEBackwardTile& t) {
  if constexpr (std::is_same<T, float>::value) {
    if (float_logits(t.s, t.inv_tau) && float_weights<kRows, kCols>(t)) return backward_tile_f32<kRows, kCols>(t);
  }
  backward_tile_impl<T, kRows, kCols>(t);
}

template <typename T>
void backward_tile_typed(const cpu::InfoNCEBackwardTile& t) {
  const bool rows = t.row_upstream != nullptr, cols = t.col_upstream != nullptr;
  if (rows && cols) return backward_tile_of<T, true, true>(t);
  if (rows) return backward_tile_of<T, true, false>(t);
  if (cols) return backward_tile_of<T, false, true>(t);
}

void forward_tile(const cpu::InfoNCEForwardTile& t) {
  if (t.s.is_double) return forward_tile_impl<double>(t);
  if (float_logits(t.s, t.inv_tau)) return forward_tile_f32(t);
  forward_tile_impl<float>(t);
}

void backward_tile(const cpu::InfoNCEBackwardTile& t) {
  t.s.is_double ? backward_tile_typed<double>(t) : backward_tile_typed<float>(t);
}

}  // namespace

cpu::InfoNCETileKernels infonce_tile_kernels() {
#define EO_STRINGIFY_(x) #x
#define EO_STRINGIFY(x) EO_STRINGIFY_(x)
  return cpu::InfoNCETileKernels{EO_STRINGIFY(EO_ISA), &forward_tile, &backward_tile};
#undef EO_STRINGIFY
#undef EO_STRINGIFY_
}

}  // namespace EO_ISA
}  // namespace evidential_ops
