// Per-line finalisation over the arrays of the op layer: every backend's loop over lines (CPU
// parallel_for, one GPU thread per line) calls these, so the statistics layout and the
// structure-of-arrays form of LineGradient are indexed in one place.
//
// Layout (evidential_ops/ops.py documents it for Python): one direction's statistics are a
// contiguous float64 (kNumLineStats, n) array, stats[k·n + i] = LineStat k of line i. The
// gradient constants of a direction are a (kNumGradientFields, n) array in LineGradient's member
// order.
#pragma once

#include <cstdint>

#include "line_terms.h"

namespace evidential_ops {
namespace EO_ISA {

// One direction's lines: statistics, target scales and candidate count.
struct LineArrays {
  const double* stats;         // (kNumLineStats, n), stride n
  std::int64_t n;              // lines in this direction (the stride)
  const double* scale;         // target scale c of line i at scale[i + scale_offset]; nullptr: c = 1
  std::int64_t scale_offset;   // rows of a strip read c at their global index; columns at 0
  double candidates;           // N of every line's Dirichlet
};

EO_HOST_DEVICE LineInput line_input(const LineArrays& lines, std::int64_t i) {
  LineInput in;
  for (int k = 0; k < kNumLineStats; ++k) in.stats[k] = lines.stats[k * lines.n + i];
  in.target_scale = lines.scale != nullptr ? lines.scale[i + lines.scale_offset] : 1.0;
  in.n = lines.candidates;
  return in;
}

// Σ_term weight·term of line i (SPEC §2). Disabled terms contribute nothing (not even 0·NaN).
EO_HOST_DEVICE double line_loss(const LineArrays& lines, std::int64_t i, const double weight[kNumTerms],
                                const bool enabled[kNumTerms]) {
  const LineTerms terms = line_terms(line_input(lines, i), enabled);
  double total = 0.0;
  for (int k = 0; k < kNumTerms; ++k) {
    if (enabled[k]) total += weight[k] * terms.value[k];
  }
  return total;
}

constexpr int kNumGradientFields = 9;  // LineGradient's members, in order
static_assert(sizeof(LineGradient) == kNumGradientFields * sizeof(double),
              "LineGradient must be kNumGradientFields doubles: the SoA below mirrors it");

// LineGradient of every line of a direction as kNumGradientFields arrays of n: the tile loops
// read one field for a run of consecutive columns.
struct LineGradientArrays {
  const double* inv_strength;
  const double* all;
  const double* off;
  const double* square;
  const double* fisher;
  const double* kl_v;
  const double* logdet_ratio;
  const double* logdet_remainder;
  const double* target;
};

EO_HOST_DEVICE LineGradientArrays gradient_arrays(const double* base, std::int64_t n) {
  return LineGradientArrays{base,         base + n,     base + 2 * n, base + 3 * n, base + 4 * n,
                            base + 5 * n, base + 6 * n, base + 7 * n, base + 8 * n};
}

EO_HOST_DEVICE LineGradient load_line_gradient(const LineGradientArrays& a, std::int64_t i) {
  LineGradient g;
  g.inv_strength = a.inv_strength[i];
  g.all = a.all[i];
  g.off = a.off[i];
  g.square = a.square[i];
  g.fisher = a.fisher[i];
  g.kl_v = a.kl_v[i];
  g.logdet_ratio = a.logdet_ratio[i];
  g.logdet_remainder = a.logdet_remainder[i];
  g.target = a.target[i];
  return g;
}

// The constants of line i (upstream gradient u of its loss) into the (kNumGradientFields, n)
// array at base. A disabled term counts as weight 0 whatever its weight says: its statistics
// were not accumulated.
EO_HOST_DEVICE void store_line_gradient(const LineArrays& lines, std::int64_t i, const double weight[kNumTerms],
                                        const bool enabled[kNumTerms], double upstream, double* base) {
  double effective[kNumTerms];
  for (int k = 0; k < kNumTerms; ++k) effective[k] = enabled[k] ? weight[k] : 0.0;
  const LineGradient g = line_gradient(line_input(lines, i), effective, upstream);
  const std::int64_t n = lines.n;
  base[i] = g.inv_strength;
  base[n + i] = g.all;
  base[2 * n + i] = g.off;
  base[3 * n + i] = g.square;
  base[4 * n + i] = g.fisher;
  base[5 * n + i] = g.kl_v;
  base[6 * n + i] = g.logdet_ratio;
  base[7 * n + i] = g.logdet_remainder;
  base[8 * n + i] = g.target;
}

}  // namespace EO_ISA
}  // namespace evidential_ops
