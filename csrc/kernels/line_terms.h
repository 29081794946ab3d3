// Per-line (row or column) finalisation: SPEC §2 terms from O(1) accumulated statistics, and the
// constants of their gradient. Scalar double code, O(K) work in all.
//
// A "line" is one query's Dirichlet over N candidates; its target is the diagonal entry y with
// scale c (target vector c·one-hot(y)). The tile passes accumulate, per line:
//   target_alpha  α_y
//   rest          R  = Σ_{j≠y} α_j            (never recovered as S − α_y: that cancels)
//   kl_h          Σ_{j≠y} h(α_j)              (KL)
//   squares       Σ_{j≠y} (α_j·2^-511)²       (mse; scaled by an exact power of two so that
//                                              it neither overflows nor leaves the normal range)
//   fisher        Σ_{j≠y} α_j(α_j + 1)ψ1(α_j) (fmse)
//   log_trigamma  Σ_j ln ψ1(α_j)              (logdet, every j)
//   remainder     Σ_j r(α_j)                  (logdet, every j)
#pragma once

#include "special_functions.h"

namespace evidential_ops {
namespace EO_ISA {

enum LineStat : int {
  kTargetAlpha = 0,
  kRest,
  kKlH,
  kSquares,
  kFisher,
  kLogTrigamma,
  kRemainder,
  kNumLineStats
};

constexpr double kSquareScale = 0x1p-511;  // (α·kSquareScale)² is normal for 1 <= α < 9e307
constexpr double kSquareUnscale = 0x1p511;

// Σ_{j≠y} p_j² = squares·(2^511/S)², formed so no intermediate overflows.
EO_HOST_DEVICE double off_target_p_squared(double squares, double strength) {
  const double t = kSquareUnscale / strength;
  return (squares * t) * t;
}

// Same order as evidential_ops.config.TERMS.
enum Term : int { kRisk = 0, kKl, kMse, kFmse, kLogdet, kNumTerms };

struct LineInput {
  double stats[kNumLineStats];
  double target_scale;  // c
  double n;             // candidates in the line, N
};

struct LineTerms {
  double value[kNumTerms];
  bool finite;  // false when the strength overflowed double (exp evidence at |s|/τ beyond ~700);
                // a NaN strength (NaN input with check_finite=False) stays "finite" and yields NaN
};

EO_HOST_DEVICE LineTerms line_terms(const LineInput& in, const bool enabled[kNumTerms]) {
  const double a = in.stats[kTargetAlpha], rest = in.stats[kRest], c = in.target_scale, n = in.n;
  const double strength = a + rest;
  LineTerms out;
  for (int t = 0; t < kNumTerms; ++t) out.value[t] = 0.0;
  out.finite = !(strength > 1.7976931348623157e308);
  if (!out.finite) return out;
  const double q = rest / strength;  // 1 − p_target, exactly
  const double p_target = a / strength;
  const double target_error_sq = (c - 1.0 + q) * (c - 1.0 + q);  // (c − p_target)²
  if (enabled[kRisk]) out.value[kRisk] = c * digamma_difference(a, rest);
  if (enabled[kKl]) {
    const double a_tilde = c + (1.0 - c) * a;
    const double s_tilde = rest + a_tilde;
    out.value[kKl] = in.stats[kKlH] + kl_h(a_tilde) - kl_h(s_tilde) + (n - 1.0) * digamma(s_tilde) - lgamma_ge1(n);
  }
  if (enabled[kMse]) {
    const double off_sq = off_target_p_squared(in.stats[kSquares], strength);
    out.value[kMse] = target_error_sq + off_sq + (q * (1.0 + p_target) - off_sq) / (strength + 1.0);
  }
  if (enabled[kFmse]) {
    const double target_part = (target_error_sq + p_target * q / (strength + 1.0)) * trigamma(a);
    out.value[kFmse] = in.stats[kFisher] / strength / (strength + 1.0) + target_part;
  }
  if (enabled[kLogdet]) {
    const Polygammas g = polygammas(strength);
    const FisherRemainder fr = fisher_remainder(strength, g);
    const double m = 0.5 * (n - 1.0) + fr.r - in.stats[kRemainder];
    out.value[kLogdet] = in.stats[kLogTrigamma] + log_trigamma(strength, g) + log_d(m);
  }
  return out;
}

// α_j·∂(g·L_line)/∂α_j for every element j of the line, as
//   p·all + [j≠y]·(p·off + p²·square + p·f'(α)·fisher + αv(α)·kl_v)
//         + (αψ2(α)/ψ1(α))·logdet_ratio + α·r'(α)·logdet_remainder + [j=y]·target
// with p = α_j/S. Every coefficient is bounded even when α is astronomically large.
struct LineGradient {
  double inv_strength;
  double all;
  double off;
  double square;
  double fisher;
  double kl_v;
  double logdet_ratio;
  double logdet_remainder;
  double target;
};

EO_HOST_DEVICE LineGradient line_gradient(const LineInput& in, const double weight[kNumTerms], double upstream) {
  const double a = in.stats[kTargetAlpha], rest = in.stats[kRest], c = in.target_scale, n = in.n;
  const double strength = a + rest;
  const double s1 = strength + 1.0;
  const double q = rest / strength;
  const double p_target = a / strength;
  LineGradient out = {};
  out.inv_strength = 1.0 / strength;
  double off = 0.0, all = 0.0, target = 0.0;

  if (weight[kRisk] != 0.0) {  // risk = c(ψ(S) − ψ(α_y))
    const double w = weight[kRisk] * c;
    off += w * polygammas(strength).x_trigamma;
    target += w * a * trigamma_difference(a, rest);
  }
  if (weight[kKl] != 0.0) {  // ∂kl/∂α̃_j = v(S̃) + (N−1)ψ1(S̃) − v(α̃_j)
    const double w = weight[kKl];
    const double a_tilde = c + (1.0 - c) * a;
    const double s_tilde = rest + a_tilde;
    const Polygammas g = polygammas(s_tilde);
    const double per_p_tilde = s_tilde * kl_v(s_tilde, g) + (n - 1.0) * g.x_trigamma;
    off += w * (strength / s_tilde) * per_p_tilde;
    out.kl_v = -w;
    // target: (1 − c)·α_y·[...] with (1 − c)α_y = α̃_y − c
    target += w * ((a_tilde - c) / s_tilde * per_p_tilde - (a_tilde - c) * kl_v(a_tilde));
  }
  if (weight[kMse] != 0.0) {  // mse = c² − 2cα_y/S + Σα²/(S(S+1)) + 1/(S+1)
    const double w = weight[kMse];
    const double off_sq = off_target_p_squared(in.stats[kSquares], strength);  // Q
    const double all_sq = p_target * p_target + off_sq;                // P2 = Σ_j p_j²
    const double t = strength / s1;
    off += w * (2.0 * c * p_target - all_sq * t * (2.0 * strength + 1.0) / s1 - t / s1);
    out.square = w * 2.0 * t;
    // At the target the O(1) parts cancel analytically; this is the remainder, all O(q).
    const double bracket = t * (2.0 * q * p_target - 2.0 * off_sq + (off_sq + q * q - 2.0 * q) / s1);
    target += w * (-2.0 * c * p_target * q + p_target * bracket);
  }
  if (weight[kFmse] != 0.0) {  // fmse = F/(S(S+1)) + Y·ψ1(α_y), Y = (c − p_y)² + p_y(1 − p_y)/(S+1)
    const double w = weight[kFmse];
    const double fisher = in.stats[kFisher];
    const double miss = c - 1.0 + q;  // c − p_target
    const Polygammas g = polygammas(a);
    const double y_value = miss * miss + p_target * q / s1;
    const double fisher_sum_part = -(fisher / strength) * ((2.0 * strength + 1.0) / s1) / s1;
    // α_j·∂Y/∂α_j = p_j·S·∂Y/∂α_j for j ≠ y
    const double dy_off = 2.0 * miss * p_target - (1.0 - 2.0 * p_target) * p_target / s1 -
                          strength * p_target * q / (s1 * s1);
    off += w * (fisher_sum_part + g.trigamma * dy_off);
    out.fisher = w / s1;
    const double dy_target = -2.0 * miss * p_target * q + p_target * q * (1.0 - 2.0 * p_target) / s1 -
                             p_target * p_target * q * strength / (s1 * s1);
    target += w * (p_target * fisher_sum_part + g.trigamma * dy_target + a * g.tetragamma * y_value);
  }
  if (weight[kLogdet] != 0.0) {  // logdet = Σ ln ψ1(α_j) + ln ψ1(S) + ln M
    const double w = weight[kLogdet];
    const Polygammas g = polygammas(strength);
    const FisherRemainder fr = fisher_remainder(strength, g);
    const double m = 0.5 * (n - 1.0) + fr.r - in.stats[kRemainder];
    all += w * (g.x2_tetragamma / g.x_trigamma + fr.x_r_prime / m);
    out.logdet_ratio = w;
    out.logdet_remainder = -w / m;
  }
  out.all = upstream * all;
  out.off = upstream * off;
  out.square *= upstream;
  out.fisher *= upstream;
  out.kl_v *= upstream;
  out.logdet_ratio *= upstream;
  out.logdet_remainder *= upstream;
  out.target = upstream * target;
  return out;
}

}  // namespace EO_ISA
}  // namespace evidential_ops
