// Per-line math of the InfoNCE op (SPEC §2 "InfoNCE"), torch-free and shared by every device: the
// running log-sum-exp of a line (online softmax) and the layout of the line statistics.
#pragma once

#include <cmath>

#include "elementary.h"

namespace evidential_ops {

// The statistics of one direction: (kInfoNCELineStats, n) float64, row-major. The negatives
// N(i) = D(i) \ P(i) are kept apart from the positives: ℓ = ln(1 + e^{LSE_N − LSE_P}) keeps the
// relative digits of a confident line's ℓ ≈ e^{LSE_N − LSE_P}, which LSE_D − LSE_P, a difference
// of two numbers near max|s|/τ, cancels (SPEC §2 "InfoNCE").
constexpr int kInfoNCELineStats = 2;
constexpr int kInfoNCENegatives = 0;  // LSE over N(i) (−inf for a line without negatives)
constexpr int kInfoNCEPositives = 1;  // LSE over P(i)

// While a forward runs, each line keeps a running maximum and Σ e^{s − max} for N(i) and for P(i):
// (kInfoNCEAccumulators, n) float64, row-major.
constexpr int kInfoNCEAccumulators = 4;
constexpr int kAccNegativeMax = 0, kAccNegativeSum = 1, kAccPositiveMax = 2, kAccPositiveSum = 3;

// What the backward reads of a line, derived once from its statistics (infonce_backward_lines):
// (kInfoNCEBackwardLines, n) float64, row-major.
constexpr int kInfoNCEBackwardLines = 3;
constexpr int kBackCandidates = 0;     // LSE_D = ln(e^{LSE_N} + e^{LSE_P})
constexpr int kBackPositives = 1;      // LSE_P
constexpr int kBackNegativeShare = 2;  // 1 − e^{−ℓ} = σ(LSE_N − LSE_P): a positive's p^D − p^P = −p^P·share

// ℓ = LSE_D − LSE_P = ln(1 + e^{d}), d = LSE_N − LSE_P (−inf without negatives: ℓ = 0; +inf
// without positives: ℓ = +inf), with no cancellation at either end.
inline double infonce_line_loss(double lse_negatives, double lse_positives) {
  const double d = lse_negatives - lse_positives;
  return d > 0.0 ? d + std::log1p(std::exp(-d)) : std::log1p(std::exp(d));
}

// LSE_D = ln(e^{LSE_N} + e^{LSE_P}), the larger plus ln(1 + e^{−|difference|}).
inline double infonce_candidates_lse(double lse_negatives, double lse_positives) {
  const double d = lse_negatives - lse_positives;
  return d > 0.0 ? lse_negatives + std::log1p(std::exp(-d)) : lse_positives + std::log1p(std::exp(d));
}

// 1 − e^{−ℓ} = e^{LSE_N}/(e^{LSE_N} + e^{LSE_P}) = σ(LSE_N − LSE_P).
inline double infonce_negative_share(double lse_negatives, double lse_positives) {
  return 1.0 / (1.0 + std::exp(lse_positives - lse_negatives));
}

namespace EO_ISA {

// Merge a block (its maximum and Σ e^{s − block_max}) into a line's running (max, sum). An empty
// block or line has max −inf and sum 0; merging two empty ones stays empty (no −inf − −inf).
EO_HOST_DEVICE void merge_log_sum_exp(double& max, double& sum, double block_max, double block_sum) {
  const double m = max_of(max, block_max);
  const bool empty = m == -__builtin_inf();
  const double rescaled = sum * exp_d(select(empty, 0.0, max - m)) + block_sum * exp_d(select(empty, 0.0, block_max - m));
  max = m;
  sum = select(empty, 0.0, rescaled);
}

// ln Σ e^{s} of a line from its running (max, sum); −inf for an empty line.
EO_HOST_DEVICE double log_sum_exp_value(double max, double sum) {
  return sum > 0.0 ? max + log_d(sum) : -__builtin_inf();
}

}  // namespace EO_ISA
}  // namespace evidential_ops
