// Per-line math of the InfoNCE op (SPEC §2 "InfoNCE"), torch-free and shared by every device: the
// running log-sum-exp of a line (online softmax) and the layout of the line statistics.
#pragma once

#include "elementary.h"

namespace evidential_ops {

// The statistics of one direction: (kInfoNCELineStats, n) float64, row-major.
constexpr int kInfoNCELineStats = 2;
constexpr int kInfoNCECandidates = 0;  // LSE over D(i)
constexpr int kInfoNCEPositives = 1;   // LSE over P(i)

// While a forward runs, each line keeps a running maximum and Σ e^{s − max} for D(i) and for P(i):
// (kInfoNCEAccumulators, n) float64, row-major.
constexpr int kInfoNCEAccumulators = 4;
constexpr int kAccCandidateMax = 0, kAccCandidateSum = 1, kAccPositiveMax = 2, kAccPositiveSum = 3;

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
