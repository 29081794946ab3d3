// The per-tile loops of the CPU InfoNCE op (SPEC §2 "InfoNCE"), compiled once per instruction set
// (infonce_tiles_*.cpp define EO_ISA and the target first). Torch-free: raw pointers only.
//
// Every element is evaluated in float64: the logit v = s·(1/τ) from the tile's float32 (or
// float64) value, e^{v − m} by the branch-free exp_d, so the loops vectorise. The dense loops
// treat every column as a candidate (the self column masked under drop_self); the positives,
// O(K·group size) elements, are visited through the sorted member lists of PositiveSets.
#pragma once

#include <algorithm>

#include "../kernels/infonce_lines.h"
#include "infonce_tile_args.h"

namespace evidential_ops {
namespace EO_ISA {
namespace {

constexpr double kMinusInf = -__builtin_inf();

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

template <typename T>
void forward_tile_impl(const cpu::InfoNCEForwardTile& t) {
  const std::int64_t rows = t.s.rows, cols = t.s.cols, row0 = t.s.row0, col0 = t.s.col0, n = t.n;
  const double inv_tau = t.inv_tau;
  double* col_max = t.scratch;
  double* col_sum = t.scratch + cols;
  double* row_max = t.scratch + 2 * cols;
  // The diagonal is masked only where this tile holds it and drop_self asks for it.
  const bool mask_self = t.drop_self && row0 < col0 + cols && col0 < row0 + rows;
  for (std::int64_t j = 0; j < cols; ++j) {
    col_max[j] = kMinusInf;
    col_sum[j] = 0.0;
  }
  // Pass 1: the tile's maximum of every row and every column over their candidates.
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* s = tile_row<T>(t.s, i);
    const std::int64_t self = mask_self ? row0 + i - col0 : -1;
    double m = kMinusInf;
#pragma omp simd reduction(max : m)
    for (std::int64_t j = 0; j < cols; ++j) {
      const double v = select(j == self, kMinusInf, static_cast<double>(s[j]) * inv_tau);
      m = max_of(m, v);
      col_max[j] = max_of(col_max[j], v);
    }
    row_max[i] = m;
  }
  // Pass 2: Σ e^{v − max} per row (merged into the row's running sum at once) and per column.
  for (std::int64_t i = 0; i < rows; ++i) {
    const T* s = tile_row<T>(t.s, i);
    const std::int64_t self = mask_self ? row0 + i - col0 : -1;
    const double m = row_max[i];
    double sum = 0.0;
    if (t.col_acc != nullptr) {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double v = static_cast<double>(s[j]) * inv_tau;
        const bool candidate = j != self;
        sum += select(candidate, exp_d(v - m), 0.0);
        col_sum[j] += select(candidate, exp_d(v - col_max[j]), 0.0);
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double v = static_cast<double>(s[j]) * inv_tau;
        sum += select(j != self, exp_d(v - m), 0.0);
      }
    }
    if (t.row_acc != nullptr) {
      const std::int64_t line = row0 + i;
      merge_log_sum_exp(t.row_acc[kAccCandidateMax * n + line], t.row_acc[kAccCandidateSum * n + line], m, sum);
      for_each_positive(t.positives, t.drop_self, line, col0, cols, [&](std::int64_t j) {
        const double v = static_cast<double>(s[j - col0]) * inv_tau;
        merge_log_sum_exp(t.row_acc[kAccPositiveMax * n + line], t.row_acc[kAccPositiveSum * n + line], v, 1.0);
      });
    }
  }
  if (t.col_acc != nullptr) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t line = col0 + j;
      merge_log_sum_exp(t.col_acc[kAccCandidateMax * n + line], t.col_acc[kAccCandidateSum * n + line], col_max[j],
                        col_sum[j]);
      for_each_positive(t.positives, t.drop_self, line, row0, rows, [&](std::int64_t i) {
        const double v = static_cast<double>(tile_row<T>(t.s, i - row0)[j]) * inv_tau;
        merge_log_sum_exp(t.col_acc[kAccPositiveMax * n + line], t.col_acc[kAccPositiveSum * n + line], v, 1.0);
      });
    }
  }
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
  const double row_lse = kRows ? t.row_lse[kInfoNCECandidates * n + line] : 0.0;
  const double* col_lse = t.col_lse + kInfoNCECandidates * n + col0;
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
    double positive = 0.0;
    if (kRows) positive += a * exp_d(v - t.row_lse[kInfoNCEPositives * n + line]);
    if (kCols) positive += t.col_upstream[col] * inv_tau * exp_d(v - t.col_lse[kInfoNCEPositives * n + col]);
    g[col - col0] -= positive;
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

template <typename T>
void backward_tile_typed(const cpu::InfoNCEBackwardTile& t) {
  const bool rows = t.row_upstream != nullptr, cols = t.col_upstream != nullptr;
  if (rows && cols) return backward_tile_impl<T, true, true>(t);
  if (rows) return backward_tile_impl<T, true, false>(t);
  if (cols) return backward_tile_impl<T, false, true>(t);
}

void forward_tile(const cpu::InfoNCEForwardTile& t) {
  t.s.is_double ? forward_tile_impl<double>(t) : forward_tile_impl<float>(t);
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
