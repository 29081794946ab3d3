// ψ, ψ1, ψ2, lnΓ and the cancellation-free helpers of SPEC §2 "Stable forms", for arguments x >= 1.
//
// All in double: the CPU kernels evaluate every element in double (cheap next to the tile GEMMs
// and it removes the float32 cancellations of the KL and Fisher terms outright). Small arguments
// are shifted by a fixed 8 steps of the recurrence (no data-dependent loop, so it vectorises);
// the 8 reciprocals are folded into one division through the product P(x) = x(x+1)…(x+7) and its
// derivatives: Σ 1/(x+k)^m are the log-derivatives of P. Large arguments use the asymptotic
// series. Accuracy ~1e-14 relative or better (tests: csrc/tests/test_kernels.cpp).
#pragma once

#include "elementary.h"

namespace evidential_ops {
namespace EO_ISA {

constexpr double kShiftFrom = 8.0;  // below: recurrence x -> x + 8; above: series directly
constexpr double kHalfLog2Pi = 0.91893853320467274178;

// Derivatives of ln P(x), P(x) = Π_{k<8}(x + k): the sums the recurrences subtract.
struct ShiftSums {
  double log_p;  // ln P = Σ ln(x + k)          (lnΓ(x) = lnΓ(x+8) − ln P)
  double h1;     // Σ 1/(x+k)                    (ψ(x)  = ψ(x+8) − h1)
  double h2;     // Σ 1/(x+k)²                   (ψ1(x) = ψ1(x+8) + h2)
  double h3;     // Σ 1/(x+k)³                   (ψ2(x) = ψ2(x+8) − 2·h3)
};

// x must lie in [1, 8]; callers clamp (the large branch never uses these values).
EO_HOST_DEVICE ShiftSums shift_sums(double x) {
  // Taylor-mode product: (P, P', P'', P''') of Π (x + k), then the log-derivatives.
  double p0 = x, p1 = 1.0, p2 = 0.0, p3 = 0.0;
  for (int k = 1; k < 8; ++k) {
    const double t = x + k;
    p3 = p3 * t + 3.0 * p2;
    p2 = p2 * t + 2.0 * p1;
    p1 = p1 * t + p0;
    p0 = p0 * t;
  }
  const double inv = 1.0 / p0;
  const double d1 = p1 * inv, d2 = p2 * inv, d3 = p3 * inv;
  ShiftSums out;
  out.log_p = log_d(p0);
  out.h1 = d1;
  out.h2 = d1 * d1 - d2;                               // −(ln P)''
  out.h3 = 0.5 * (d3 - 3.0 * d1 * d2 + 2.0 * d1 * d1 * d1);  // ½(ln P)'''
  return out;
}

// Asymptotic series at z >= 8, each truncated below 1e-14 relative there.
EO_HOST_DEVICE double digamma_series(double z, double log_z, double u) {
  const double w = u * u;
  const double tail =
      w * (1.0 / 12 - w * (1.0 / 120 - w * (1.0 / 252 - w * (1.0 / 240 - w * (1.0 / 132 - w * (691.0 / 32760 - w / 12))))));
  return log_z - 0.5 * u - tail;
}

// z·ψ1(z) = 1 + 1/(2z) + Σ B_2k / z^2k (k <= 9): the scaled form never underflows.
EO_HOST_DEVICE double scaled_trigamma_series(double u) {
  const double w = u * u;
  const double tail =
      1.0 / 6 -
      w * (1.0 / 30 -
           w * (1.0 / 42 -
                w * (1.0 / 30 - w * (5.0 / 66 - w * (691.0 / 2730 - w * (7.0 / 6 - w * (3617.0 / 510 - w * (43867.0 / 798))))))));
  return 1.0 + 0.5 * u + w * tail;
}

// z²·ψ2(z) = −1 − 1/z − Σ (2k+1) B_2k / z^2k (k <= 9).
EO_HOST_DEVICE double scaled_tetragamma_series(double u) {
  const double w = u * u;
  const double tail =
      0.5 -
      w * (1.0 / 6 -
           w * (1.0 / 6 -
                w * (3.0 / 10 - w * (5.0 / 6 - w * (691.0 / 210 - w * (35.0 / 2 - w * (3617.0 / 30 - w * (43867.0 / 42))))))));
  return -1.0 - u - w * tail;
}

EO_HOST_DEVICE double lgamma_series(double z, double log_z, double u) {
  const double w = u * u;
  const double tail =
      u * (1.0 / 12 - w * (1.0 / 360 - w * (1.0 / 1260 - w * (1.0 / 1680 - w * (1.0 / 1188 - w * (691.0 / 360360))))));
  return (z - 0.5) * log_z - z + kHalfLog2Pi + tail;
}

// ψ, ψ1, ψ2 and lnΓ of one argument. Unused members cost nothing: everything is inlined and
// the compiler drops what the caller does not read.
struct Polygammas {
  double digamma;
  double trigamma;
  double tetragamma;
  double lgamma;
  double x_trigamma;     // x·ψ1(x) ∈ [1, 1.65]: what huge arguments need (ψ1 itself underflows)
  double x2_tetragamma;  // x²·ψ2(x) ∈ [−2.41, −1]
  double log_z;  // ln z and 1/z of the series argument z: ln x and 1/x whenever x >= 8, which
  double inv_z;  // lets the large-x series of h, v and r reuse them instead of a second log/division
};

EO_HOST_DEVICE Polygammas polygammas(double x) {
  const bool small = x < kShiftFrom;
  const double x_small = select(small, x, 1.0);
  const ShiftSums sums = shift_sums(x_small);
  const double z = select(small, x_small + 8.0, x);
  const double u = 1.0 / z;
  const double log_z = log_d(z);
  const double keep = select(small, 1.0, 0.0);
  const double z_trig = scaled_trigamma_series(u);     // z·ψ1(z)
  const double z2_tetra = scaled_tetragamma_series(u);  // z²·ψ2(z)
  Polygammas out;
  out.digamma = digamma_series(z, log_z, u) - keep * sums.h1;
  out.trigamma = z_trig * u + keep * sums.h2;
  out.tetragamma = z2_tetra * u * u - keep * 2.0 * sums.h3;
  // z = x on the series branch; below 8 the plain products cannot under- or overflow.
  out.x_trigamma = select(small, x * out.trigamma, z_trig);
  out.x2_tetragamma = select(small, x * x * out.tetragamma, z2_tetra);
  out.lgamma = lgamma_series(z, log_z, u) - keep * sums.log_p;
  out.log_z = log_z;
  out.inv_z = u;
  return out;
}

// ln ψ1(x) from one log: ln(xψ1) − ln x on the series branch, where ψ1 alone turns subnormal
// for x > 4.5e307.
EO_HOST_DEVICE double log_trigamma(double x, const Polygammas& g) {
  const bool large = x >= kShiftFrom;
  return log_d(select(large, g.x_trigamma, g.trigamma)) - select(large, g.log_z, 0.0);
}

EO_HOST_DEVICE double digamma(double x) { return polygammas(x).digamma; }
EO_HOST_DEVICE double trigamma(double x) { return polygammas(x).trigamma; }
EO_HOST_DEVICE double tetragamma(double x) { return polygammas(x).tetragamma; }
EO_HOST_DEVICE double lgamma_ge1(double x) { return polygammas(x).lgamma; }

// h(x) = (x − 1)ψ(x) − lnΓ(x) − x (KL term, SPEC §2 "Stable forms"): grows like −½ ln x, so the
// x ln x parts that cancel in the textbook KL never appear. g = polygammas(x).
EO_HOST_DEVICE double kl_h(double x, const Polygammas& g) {
  const double u = g.inv_z;  // 1/x on the series branch (x >= 8)
  // −½ ln(2πx) − ½ + Σ c_k/x^k, c_k from Stirling and the ψ series (k = 1…16).
  double poly = -3617.0 / 8160;
  poly = poly * u + 3617.0 / 7650;
  poly = poly * u + 1.0 / 12;
  poly = poly * u - 7.0 / 78;
  poly = poly * u - 691.0 / 32760;
  poly = poly * u + 691.0 / 30030;
  poly = poly * u + 1.0 / 132;
  poly = poly * u - 5.0 / 594;
  poly = poly * u - 1.0 / 240;
  poly = poly * u + 1.0 / 210;
  poly = poly * u + 1.0 / 252;
  poly = poly * u - 1.0 / 210;
  poly = poly * u - 1.0 / 120;
  poly = poly * u + 1.0 / 90;
  poly = poly * u + 1.0 / 12;
  poly = poly * u + 1.0 / 3;
  const double series = -kHalfLog2Pi - 0.5 * g.log_z - 0.5 + poly * u;
  const double direct = (x - 1.0) * g.digamma - g.lgamma - x;
  return select(x >= kShiftFrom, series, direct);
}

EO_HOST_DEVICE double kl_h(double x) { return kl_h(x, polygammas(x)); }

// v(x) = 1 − (x − 1)ψ1(x) ≈ 1/(2x): −h'(x), the per-element part of the KL gradient. Formed from
// its series above 16 because the direct form cancels (and loses everything at x = 1e43).
EO_HOST_DEVICE double kl_v(double x, const Polygammas& g) {
  const bool large = x >= 16.0;
  const double u = g.inv_z;  // 1/x on the series branch
  double poly = 7.0 / 6;
  poly = poly * u - 7.0 / 6;
  poly = poly * u - 691.0 / 2730;
  poly = poly * u + 691.0 / 2730;
  poly = poly * u + 5.0 / 66;
  poly = poly * u - 5.0 / 66;
  poly = poly * u - 1.0 / 30;
  poly = poly * u + 1.0 / 30;
  poly = poly * u + 1.0 / 42;
  poly = poly * u - 1.0 / 42;
  poly = poly * u - 1.0 / 30;
  poly = poly * u + 1.0 / 30;
  poly = poly * u + 1.0 / 6;
  poly = poly * u + 1.0 / 3;
  poly = poly * u + 1.0 / 2;
  const double series = poly * u;
  return select(large, series, 1.0 - (x - 1.0) * g.trigamma);
}

EO_HOST_DEVICE double kl_v(double x) { return kl_v(x, polygammas(x)); }

// r(x) = 1/ψ1(x) − x + ½ (SPEC §2.5) and r'(x) = −ψ2/ψ1² − 1: small, smooth, and the reason
// the Fisher log-determinant has no cancellation. Series above 30 (the direct forms cancel).
constexpr double kRSeriesFrom = 30.0;

// Σ_{k=1..12} c_k u^k (= r) and Σ −k·c_k u^k (= x·r'(x)), c_k the coefficients of r's
// asymptotic series, as literal Horner steps: a constant array would not be visible in device
// code, and the literals fold into the instruction stream on every target.
EO_HOST_DEVICE double remainder_series(double u) {
  double p = -121081664357.0 / 475517952000;
  p = p * u + 574468115113.0 / 2615348736000;
  p = p * u + 8115997.0 / 106444800;
  p = p * u - 28932091.0 / 479001600;
  p = p * u - 34253.0 / 1036800;
  p = p * u + 79717.0 / 3628800;
  p = p * u + 527.0 / 24192;
  p = p * u - 113.0 / 12096;
  p = p * u - 11.0 / 480;
  p = p * u - 1.0 / 720;
  p = p * u + 1.0 / 24;
  p = p * u + 1.0 / 12;
  return p * u;
}

EO_HOST_DEVICE double remainder_series_x_derivative(double u) {
  double p = 12.0 * 121081664357.0 / 475517952000;
  p = p * u - 11.0 * 574468115113.0 / 2615348736000;
  p = p * u - 10.0 * 8115997.0 / 106444800;
  p = p * u + 9.0 * 28932091.0 / 479001600;
  p = p * u + 8.0 * 34253.0 / 1036800;
  p = p * u - 7.0 * 79717.0 / 3628800;
  p = p * u - 6.0 * 527.0 / 24192;
  p = p * u + 5.0 * 113.0 / 12096;
  p = p * u + 4.0 * 11.0 / 480;
  p = p * u + 3.0 * 1.0 / 720;
  p = p * u - 2.0 * 1.0 / 24;
  p = p * u - 1.0 * 1.0 / 12;
  return p * u;
}

struct FisherRemainder {
  double r;          // r(x)
  double r_prime;    // r'(x)
  double x_r_prime;  // x·r'(x), formed before the last 1/x so it cannot underflow
};

EO_HOST_DEVICE FisherRemainder fisher_remainder(double x, const Polygammas& g) {
  const bool large = x >= kRSeriesFrom;
  const double u = g.inv_z;  // 1/x on the series branch
  const double r = remainder_series(u);
  const double dr = remainder_series_x_derivative(u);  // x·r'(x) on the series branch
  const double inv_trigamma = 1.0 / g.trigamma;
  const double r_prime_direct = -g.tetragamma * inv_trigamma * inv_trigamma - 1.0;
  FisherRemainder out;
  out.r = select(large, r, inv_trigamma - x + 0.5);
  out.r_prime = select(large, dr * u, r_prime_direct);
  out.x_r_prime = select(large, dr, x * r_prime_direct);
  return out;
}

// ψ(a + r) − ψ(a) for a >= 1, r >= 0 without cancellation (risk term, SPEC §2.1). For large a
// the series terms are differenced as (1/a − 1/S)(...) with 1/a − 1/S = r/(aS) formed exactly
// (as (r/S)/a: a·S overflows for huge evidence); small a is first shifted by 10, the shift
// adding Σ_k r/((a+k)(a+k+r)), a sum of positive terms.
EO_HOST_DEVICE double digamma_difference_series(double a, double r) {
  const double s = a + r;
  const double ia = 1.0 / a, is = 1.0 / s;
  const double d1 = (r * is) * ia;
  const double a2 = ia * ia, s2 = is * is;
  const double d2 = d1 * (ia + is);
  const double d4 = d2 * (a2 + s2);
  const double d6 = d2 * (a2 * a2 + a2 * s2 + s2 * s2);
  const double d8 = d4 * (a2 * a2 + s2 * s2);
  const double d10 = d2 * (a2 * a2 * a2 * a2 + a2 * a2 * a2 * s2 + a2 * a2 * s2 * s2 + a2 * s2 * s2 * s2 + s2 * s2 * s2 * s2);
  const double d12 = d6 * (a2 * a2 * a2 + s2 * s2 * s2);
  return log1p_d(r * ia) + 0.5 * d1 + d2 / 12.0 - d4 / 120.0 + d6 / 252.0 - d8 / 240.0 + d10 / 132.0 -
         691.0 * d12 / 32760.0;
}

EO_HOST_DEVICE double digamma_difference(double a, double r) {
  if (a >= 10.0) return digamma_difference_series(a, r);
  double shift = 0.0;
  for (int k = 0; k < 10; ++k) shift += r / ((a + k) * (a + k + r));
  return digamma_difference_series(a + 10.0, r) + shift;
}

// ψ1(a + r) − ψ1(a) for a >= 1, r >= 0 (gradient of the risk at its target), same idea: every
// power difference S^-k − a^-k = (1/S − 1/a)·G_k with G_{k+1} = G_k/a + S^-k, no subtraction.
EO_HOST_DEVICE double trigamma_difference_series(double a, double r) {
  const double s = a + r;
  const double ia = 1.0 / a, is = 1.0 / s;
  const double d1 = -(r * is) * ia;  // 1/S − 1/a
  double g = 1.0, s_pow = 1.0;
  double diff[14];
  for (int k = 1; k <= 13; ++k) {  // diff[k] = S^-k − a^-k
    diff[k] = d1 * g;
    s_pow *= is;
    g = g * ia + s_pow;
  }
  return diff[1] + 0.5 * diff[2] + diff[3] / 6.0 - diff[5] / 30.0 + diff[7] / 42.0 - diff[9] / 30.0 +
         5.0 * diff[11] / 66.0 - 691.0 * diff[13] / 2730.0;
}

EO_HOST_DEVICE double trigamma_difference(double a, double r) {
  if (a >= 20.0) return trigamma_difference_series(a, r);
  // 1/(b+r)² − 1/b² = −r(2b + r)/(b²(b+r)²), negative terms only
  double shift = 0.0;
  for (int k = 0; k < 20; ++k) {
    const double b = a + k, br = b + r;
    shift -= (r / br) * ((2.0 * b + r) / br) / (b * b);
  }
  return trigamma_difference_series(a + 20.0, r) + shift;
}

}  // namespace EO_ISA
}  // namespace evidential_ops
