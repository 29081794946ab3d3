// The per-tile loops of the CPU backend, compiled once per instruction set (tile_kernels_*.cpp
// define EO_ISA and the target before including this file). Torch-free: raw pointers only.
//
// Each tile row runs two vectorised loops over its columns: the evidence map (s -> α, ρ) into a
// small double buffer, then the special functions and the accumulation (forward) or the
// gradient coefficient (backward). Splitting them keeps the heavy loop free of the evidence kind
// and the input dtype, so it is instantiated only per set of enabled terms.
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

template <bool kKl, bool kFmse, bool kLogdet>
void forward_tile_impl(const cpu::ForwardTile& t) {
  const std::int64_t cols = t.s.cols, col0 = t.s.col0;
  double* alpha = t.scratch;
  // Column accumulators: the real ones, or a private sink when columns are not wanted (one
  // loop shape for both cases; the sink costs a few stores).
  double* sink = t.scratch + cols;
  double* col[kNumLineStats];
  for (int k = 0; k < kNumLineStats; ++k) {
    col[k] = t.col_stats != nullptr ? t.col_stats + k * t.col_stride + col0 : sink + k * cols;
  }
  double *col_rest = col[kRest], *col_sq = col[kSquares], *col_kl = col[kKlH], *col_fisher = col[kFisher];
  double *col_lt = col[kLogTrigamma], *col_rr = col[kRemainder];

  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const std::int64_t gi = t.s.row0 + i;
    evidence_row(t.s, t.evidence, i, t.inv_tau, alpha, nullptr);
    // Local column of the target (outside [0, cols) when it lies in another tile, or for opinions).
    const std::int64_t target = t.has_targets ? gi + t.target_offset - col0 : -1;
    double rest = 0.0, squares = 0.0, kl = 0.0, fisher = 0.0, log_trig = 0.0, remainder = 0.0;
#pragma omp simd reduction(+ : rest, squares, kl, fisher, log_trig, remainder)
    for (std::int64_t j = 0; j < cols; ++j) {
      const double a = alpha[j];
      // A select, not a multiplication by a 0/1 mask: 0·∞ would turn an overflowed target
      // into NaN and hide the overflow the forward must report.
      const bool off = j != target;
      const ElementForward f = element_forward<kKl, kFmse, kLogdet>(a);
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
    if (t.row_stats != nullptr) {
      double* r = t.row_stats + gi;
      const std::int64_t st = t.row_stride;
      r[kRest * st] += rest;
      r[kSquares * st] += squares;
      if constexpr (kKl) r[kKlH * st] += kl;
      if constexpr (kFmse) r[kFisher * st] += fisher;
      if constexpr (kLogdet) {
        r[kLogTrigamma * st] += log_trig;
        r[kRemainder * st] += remainder;
      }
    }
    if (target >= 0 && target < cols) {  // α of the target is the target of row gi and of its column
      if (t.row_stats != nullptr) t.row_stats[kTargetAlpha * t.row_stride + gi] = alpha[target];
      if (t.col_stats != nullptr) t.col_stats[kTargetAlpha * t.col_stride + col0 + target] = alpha[target];
    }
  }
}

template <bool kKl, bool kFmse, bool kLogdet>
void backward_tile_impl(const cpu::BackwardTile& t) {
  const std::int64_t cols = t.s.cols, col0 = t.s.col0;
  double* alpha = t.scratch;
  double* rho = t.scratch + cols;  // overwritten in place by ∂L/∂s
  const LineGradientArrays rows = gradient_arrays(t.row_constants, t.n_rows);
  const LineGradientArrays cols_constants = gradient_arrays(t.col_constants, t.n_cols);
  for (std::int64_t i = 0; i < t.s.rows; ++i) {
    const std::int64_t gi = t.s.row0 + i;
    evidence_row(t.s, t.evidence, i, t.inv_tau, alpha, rho);
    const LineGradient row = load_line_gradient(rows, gi);
    const std::int64_t target = gi + t.target_offset - col0;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) {
      const double a = alpha[j];
      const double on_target = j == target ? 1.0 : 0.0;
      const double off = 1.0 - on_target;
      const ElementBackward f = element_backward<kKl, kFmse, kLogdet>(a);
      const LineGradient column = load_line_gradient(cols_constants, col0 + j);
      const double coefficient = line_share(a, off, on_target, f, row) + line_share(a, off, on_target, f, column);
      rho[j] = coefficient * rho[j] * t.inv_tau;  // ∂L/∂s = (α∂L/∂α)·(g'(x)/α)·(1/τ)
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
