// What one element α_ij contributes: to its row's and its column's statistics (forward), and
// α·∂L/∂α from both lines' constants (backward). The same value serves the row and the column:
// one evaluation of the special functions per element, not two.
#pragma once

#include <type_traits>

#include "evidence.h"
#include "line_terms.h"
#include "special_functions_f32.h"

namespace evidential_ops {
namespace EO_ISA {

// Calls fn(std::bool_constant<kl>{}, std::bool_constant<fmse>{}, std::bool_constant<logdet>{})
// for run-time term flags (any struct with bool kl, fmse, logdet): the element code below is
// instantiated per combination of terms, so a term that is off costs nothing in the loops.
template <typename Flags, typename Fn>
inline void with_term_flags(const Flags& f, Fn&& fn) {
  switch ((f.kl ? 1 : 0) | (f.fmse ? 2 : 0) | (f.logdet ? 4 : 0)) {
    case 0: return fn(std::false_type{}, std::false_type{}, std::false_type{});
    case 1: return fn(std::true_type{}, std::false_type{}, std::false_type{});
    case 2: return fn(std::false_type{}, std::true_type{}, std::false_type{});
    case 3: return fn(std::true_type{}, std::true_type{}, std::false_type{});
    case 4: return fn(std::false_type{}, std::false_type{}, std::true_type{});
    case 5: return fn(std::true_type{}, std::false_type{}, std::true_type{});
    case 6: return fn(std::false_type{}, std::true_type{}, std::true_type{});
    default: return fn(std::true_type{}, std::true_type{}, std::true_type{});
  }
}

// Contributions of α to the statistics of line_terms.h (rest and α² need no special function).
struct ElementForward {
  double kl_h;          // h(α)
  double fisher;        // α(α + 1)ψ1(α)
  double log_trigamma;  // ln ψ1(α)
  double remainder;     // r(α)
};

template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementForward element_forward(double alpha) {
  ElementForward out = {0.0, 0.0, 0.0, 0.0};
  if constexpr (kKl || kFmse || kLogdet) {
    const Polygammas g = polygammas(alpha);
    if constexpr (kKl) out.kl_h = kl_h(alpha, g);
    // (α + 1)·(αψ1(α)): αψ1 → 1, while α(α + 1) alone overflows for huge evidence.
    if constexpr (kFmse) out.fisher = (alpha + 1.0) * g.x_trigamma;
    if constexpr (kLogdet) {
      out.log_trigamma = log_trigamma(alpha, g);
      out.remainder = fisher_remainder(alpha, g).r;
    }
  }
  return out;
}

// The per-element factors of LineGradient's coefficients.
struct ElementBackward {
  double kl_v;            // α·v(α)
  double fisher_slope;    // f'(α) = (2α + 1)ψ1(α) + α(α + 1)ψ2(α)
  double logdet_ratio;    // αψ2(α)/ψ1(α)
  double logdet_r_prime;  // α·r'(α)
};

template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementBackward element_backward(double alpha) {
  ElementBackward out = {0.0, 0.0, 0.0, 0.0};
  if constexpr (kKl || kFmse || kLogdet) {
    const Polygammas g = polygammas(alpha);
    if constexpr (kKl) out.kl_v = alpha * kl_v(alpha, g);
    // (2α + 1)ψ1 + α(α + 1)ψ2 from the scaled αψ1 and α²ψ2 (ψ2 underflows beyond α ≈ 1e154)
    if constexpr (kFmse) {
      out.fisher_slope = 2.0 * g.x_trigamma + g.trigamma + g.x2_tetragamma + alpha * g.tetragamma;
    }
    if constexpr (kLogdet) {
      out.logdet_ratio = g.x2_tetragamma / g.x_trigamma;
      out.logdet_r_prime = fisher_remainder(alpha, g).x_r_prime;
    }
  }
  return out;
}

// The same per-element functions in float32 (SPEC §2 "Float32 element math"), for α <= FLT_MAX:
// the special functions of special_functions_f32.h at full float32 SIMD width. Callers widen
// them into the double ElementForward/ElementBackward with `widen` before accumulating: the line
// sums and everything per line stay float64.
struct ElementForwardF32 {
  float kl_h_plus_one;  // h(α) + 1 (accurate relative to itself near α = 1; see the SPEC)
  float x_trigamma;     // αψ1(α)
  float log_trigamma;   // ln ψ1(α)
  float remainder;      // r(α)
};

// Evidence maps whose α is 1 + e^t with t = tanh x ∈ [−1, 1] given by the map (EvidenceValueOf::tanh):
// exp_tanh. Element code takes element_*_f32_of_tanh(t) for them: one polynomial in t per function,
// no ln α, no series, no 1/α and no select between forms (a NaN t is NaN throughout).
EO_HOST_DEVICE constexpr bool has_tanh_functions(EvidenceKind kind) { return kind == EvidenceKind::kExpTanh; }

// g = polygammas(alpha), or polygammas_of_class<k>(alpha) for an alpha of class k (same values).
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementForwardF32 element_forward_f32(float alpha, const PolygammasF32& g) {
  ElementForwardF32 out = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kKl || kFmse || kLogdet) {
    if constexpr (kKl) out.kl_h_plus_one = kl_h_plus_one(alpha, g);
    if constexpr (kFmse) out.x_trigamma = g.x_trigamma;
    if constexpr (kLogdet) {
      out.log_trigamma = log_trigamma(alpha, g);
      out.remainder = fisher_remainder(alpha, g).r;
    }
  }
  return out;
}

template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementForwardF32 element_forward_f32(float alpha) {
  if constexpr (kKl || kFmse || kLogdet) {
    return element_forward_f32<kKl, kFmse, kLogdet>(alpha, polygammas(alpha));
  } else {
    return ElementForwardF32{0.0f, 0.0f, 0.0f, 0.0f};
  }
}

// The same at an α beyond FLT_MAX given ln α (evidence.h rare_evidence): the series of
// polygammas_of_log, whose scaled functions are exact there (αψ1 = 1 in float).
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementForwardF32 element_forward_f32_of_log(float log_alpha) {
  if constexpr (kKl || kFmse || kLogdet) {
    return element_forward_f32<kKl, kFmse, kLogdet>(log_alpha, polygammas_of_log(log_alpha));
  } else {
    return ElementForwardF32{0.0f, 0.0f, 0.0f, 0.0f};
  }
}

// The same at α = 1 + e^t for exp_tanh evidence, from t = tanh x (evidence.h EvidenceValueOf::tanh):
// one polynomial in t per function, no logarithm (special_functions_f32.h "of_tanh").
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementForwardF32 element_forward_f32_of_tanh(float t) {
  ElementForwardF32 out = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kKl) out.kl_h_plus_one = kl_h_plus_one_tanh_fit(t);
  if constexpr (kFmse) out.x_trigamma = x_trigamma_tanh_fit(t);
  if constexpr (kLogdet) {
    out.log_trigamma = log_trigamma_of_tanh(t);
    out.remainder = remainder_tanh_fit(t);
  }
  return out;
}

// ElementForward from the float32 values at α (double, the value the line sums take): h as
// (h + 1) − 1 in double, exact, so h keeps the accuracy of h + 1; α(α + 1)ψ1 as (α + 1)·(αψ1).
EO_HOST_DEVICE ElementForward widen(double alpha, const ElementForwardF32& f) {
  ElementForward out;
  out.kl_h = static_cast<double>(f.kl_h_plus_one) - 1.0;
  out.fisher = (alpha + 1.0) * static_cast<double>(f.x_trigamma);
  out.log_trigamma = f.log_trigamma;
  out.remainder = f.remainder;
  return out;
}

// The same from the float α, with no FP64 multiply (the GPU's float32 path, where FP64 multiplies
// are the scarce unit): α(α + 1)ψ1 as α·(αψ1) + αψ1 in float, two roundings (one where contracted
// to an FMA). It cannot overflow: αψ1 = 1 + 1/(2α) + … rounds to 1 long before α reaches FLT_MAX.
EO_HOST_DEVICE ElementForward widen_from_float(float alpha, const ElementForwardF32& f) {
  ElementForward out;
  out.kl_h = static_cast<double>(f.kl_h_plus_one) - 1.0;
  out.fisher = static_cast<double>(alpha * f.x_trigamma + f.x_trigamma);
  out.log_trigamma = f.log_trigamma;
  out.remainder = f.remainder;
  return out;
}

// The same for a double α beyond FLT_MAX (the float functions of ln α): α(α + 1)ψ1 as α + 1,
// αψ1 = 1 + 1/(2α) + … being 1 in float from α = 2^25 on; still no FP64 multiply.
EO_HOST_DEVICE ElementForward widen_beyond_float(double alpha, const ElementForwardF32& f) {
  ElementForward out;
  out.kl_h = static_cast<double>(f.kl_h_plus_one) - 1.0;
  out.fisher = alpha + 1.0;
  out.log_trigamma = f.log_trigamma;
  out.remainder = f.remainder;
  return out;
}

// (α·kSquareScale)² of the mse statistic from a float α >= 1, with no FP64 multiply: α² spans 256
// binades, more than float's 254 normal ones, so α >= 2^62 is scaled by 2^-66 before squaring, and
// the remaining power of two (2^-1022, or 2^(132 − 1022) after that scaling) is subtracted from the
// double's exponent field, exact because every result is normal (>= 2^-1022, and >= 2^-898). One
// float rounding: relative error <= 2^-24. +inf and NaN come back unchanged.
EO_HOST_DEVICE double square_statistic(float alpha) {
  const bool big = alpha >= 0x1p62f;
  const float t = select(big, alpha * 0x1p-66f, alpha);
  const double square = static_cast<double>(t * t);
  const std::uint64_t shift = select(big, std::uint64_t{1022 - 132}, std::uint64_t{1022});
  return select(square < __builtin_inf(), double_of(bits_of(square) - (shift << 52)), square);
}

// The same for a double α beyond FLT_MAX, with no FP64 multiply: α = m·2^E, m ∈ [1, 2) rounded to
// float (α from rare_evidence has a float's mantissa: exact) and squared in float, one rounding;
// 2^(2E − 1022) put in the exponent field (normal: E >= 128). +inf where the double product
// overflows (α >= 2^1023), NaN and +inf unchanged.
EO_HOST_DEVICE double square_statistic_of_double(double alpha) {
  if (!(alpha < __builtin_inf())) return alpha;
  const std::int64_t exponent = static_cast<std::int64_t>((bits_of(alpha) >> 52) & 0x7FF) - 1023;
  const float mantissa = static_cast<float>(double_of((bits_of(alpha) & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL));
  return scaled_by_power_of_two(static_cast<double>(mantissa * mantissa), 2 * exponent - 1022);
}

struct ElementBackwardF32 {
  float kl_v;            // α·v(α)
  float fisher_slope;    // f'(α)
  float logdet_ratio;    // αψ2(α)/ψ1(α)
  float logdet_r_prime;  // α·r'(α)
};

template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementBackwardF32 element_backward_f32(float alpha, const PolygammasF32& g) {
  ElementBackwardF32 out = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kKl || kFmse || kLogdet) {
    if constexpr (kKl) out.kl_v = x_kl_v(alpha, g);
    if constexpr (kFmse) out.fisher_slope = fisher_slope(alpha, g);
    if constexpr (kLogdet) {
      out.logdet_ratio = tetragamma_trigamma_ratio(g);
      out.logdet_r_prime = fisher_remainder(alpha, g).x_r_prime;
    }
  }
  return out;
}

template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementBackwardF32 element_backward_f32(float alpha) {
  if constexpr (kKl || kFmse || kLogdet) {
    return element_backward_f32<kKl, kFmse, kLogdet>(alpha, polygammas(alpha));
  } else {
    return ElementBackwardF32{0.0f, 0.0f, 0.0f, 0.0f};
  }
}

// The same beyond FLT_MAX given ln α (see element_forward_f32_of_log).
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementBackwardF32 element_backward_f32_of_log(float log_alpha) {
  if constexpr (kKl || kFmse || kLogdet) {
    return element_backward_f32<kKl, kFmse, kLogdet>(log_alpha, polygammas_of_log(log_alpha));
  } else {
    return ElementBackwardF32{0.0f, 0.0f, 0.0f, 0.0f};
  }
}

// The same at α = 1 + e^t for exp_tanh evidence (see element_forward_f32_of_tanh).
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE ElementBackwardF32 element_backward_f32_of_tanh(float t) {
  ElementBackwardF32 out = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kKl) out.kl_v = x_kl_v_tanh_fit(t);
  if constexpr (kFmse) out.fisher_slope = fisher_slope_tanh_fit(t);
  if constexpr (kLogdet) {
    out.logdet_ratio = tetragamma_trigamma_ratio_tanh_fit(t);
    out.logdet_r_prime = x_remainder_prime_tanh_fit(t);
  }
  return out;
}

EO_HOST_DEVICE ElementBackward widen(const ElementBackwardF32& f) {
  return ElementBackward{f.kl_v, f.fisher_slope, f.logdet_ratio, f.logdet_r_prime};
}

// One line's share of α·∂L/∂α at this element (see LineGradient). The coefficients of a term
// that is off are zero; the flags drop them (and their loads) at compile time.
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE double line_share(double alpha, double off, double on_target, const ElementBackward& f,
                                 const LineGradient& line) {
  const double p = alpha * line.inv_strength;
  double inner = line.off + line.square * p;
  if constexpr (kFmse) inner += line.fisher * f.fisher_slope;
  double share = p * (off * inner) + on_target * line.target;
  if constexpr (kKl) share += off * line.kl_v * f.kl_v;
  if constexpr (kLogdet) share += p * line.all + line.logdet_ratio * f.logdet_ratio + line.logdet_remainder * f.logdet_r_prime;
  return share;
}

EO_HOST_DEVICE double line_share(double alpha, double off, double on_target, const ElementBackward& f,
                                 const LineGradient& line) {
  const double p = alpha * line.inv_strength;
  return p * (line.all + off * (line.off + line.square * p + line.fisher * f.fisher_slope)) +
         off * line.kl_v * f.kl_v + line.logdet_ratio * f.logdet_ratio +
         line.logdet_remainder * f.logdet_r_prime + on_target * line.target;
}

// LineGradient narrowed to float, so that the float32 paths (CUDA, and the CPU's backward) form the
// gradient coefficient with no FP64 multiply per element (SPEC §2 "Float32 element math" derives what it
// costs). Two constants are kept scaled by 2^64/S instead, so that every member stays in float's
// range wherever the per-element products do:
// - 1/S, as 2^64/S: 1/S is subnormal in float from S = 2^126 on (exp evidence beyond x = 87),
//   where p = α/S of an α near FLT_MAX came out up to 2^-22 off, 4e-5 of the largest |∂L/∂s| at
//   τ = 0.01; 2^64/S is normal up to S = 2^190, and beyond, p < 2^-62 is off by less than 2^-86;
// - off, as 2^64·off/S (p·off = (α·2^-64)·(2^64·off/S)): the KL's part of off grows as S/S̃,
//   beyond FLT_MAX where a line's target dominates it (1e158 at τ = 0.002), while p·off does not.
// Another constant beyond FLT_MAX (an upstream gradient near it) becomes ±inf and makes the float
// coefficient non-finite, which the caller redoes in double; one below 2^-126 keeps an absolute
// error of at most 2^-150.
constexpr double kInvStrengthScale = 0x1p64;
constexpr float kInvStrengthUnscale = 0x1p-64f;

struct LineGradientF32 {
  float scaled_inv_strength;  // 2^64/S
  float all;
  float scaled_off;  // 2^64·off/S
  float square;
  float fisher;
  float kl_v;
  float logdet_ratio;
  float logdet_remainder;
  float target;
};

EO_HOST_DEVICE LineGradientF32 narrow_line_gradient(const LineGradient& g) {
  const double scale = g.inv_strength * kInvStrengthScale;
  return LineGradientF32{static_cast<float>(scale),          static_cast<float>(g.all),
                         static_cast<float>(g.off * scale),  static_cast<float>(g.square),
                         static_cast<float>(g.fisher),       static_cast<float>(g.kl_v),
                         static_cast<float>(g.logdet_ratio), static_cast<float>(g.logdet_remainder),
                         static_cast<float>(g.target)};
}

// line_share in float, from the float32 element factors and a narrowed line: the same terms, with
// p·off formed as (α·2^-64)·(2^64·off/S) (α >= 1, so α·2^-64 is exact).
EO_HOST_DEVICE float line_share(float alpha, float off, float on_target, const ElementBackwardF32& f,
                                const LineGradientF32& line) {
  const float scaled_alpha = alpha * kInvStrengthUnscale;
  const float p = scaled_alpha * line.scaled_inv_strength;
  return p * (line.all + off * (line.square * p + line.fisher * f.fisher_slope)) +
         off * (scaled_alpha * line.scaled_off + line.kl_v * f.kl_v) + line.logdet_ratio * f.logdet_ratio +
         line.logdet_remainder * f.logdet_r_prime + on_target * line.target;
}

// The same with the terms of a call's flags only: a term that is off has zero constants and zero
// factors, so each dropped product is an exact 0 added (the same bits for finite constants), and
// its multiplies and loads leave the element loop.
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE float line_share(float alpha, float off, float on_target, const ElementBackwardF32& f,
                                const LineGradientF32& line) {
  const float scaled_alpha = alpha * kInvStrengthUnscale;
  const float p = scaled_alpha * line.scaled_inv_strength;
  float inner = line.square * p;
  if constexpr (kFmse) inner = inner + line.fisher * f.fisher_slope;
  float off_part = scaled_alpha * line.scaled_off;
  if constexpr (kKl) off_part = off_part + line.kl_v * f.kl_v;
  float share;
  if constexpr (kLogdet) {
    share = p * (line.all + off * inner) + off * off_part + line.logdet_ratio * f.logdet_ratio +
            line.logdet_remainder * f.logdet_r_prime;
  } else {
    share = p * (off * inner) + off * off_part;
  }
  return share + on_target * line.target;
}

// ∂L/∂s of one element of the float32 path from its α_f, ρ_f, its element factors f and both lines'
// narrowed constants (the CUDA kernels' and the CPU tile kernels' loops).
template <bool kKl, bool kFmse, bool kLogdet>
EO_HOST_DEVICE float element_gradient_f32(float alpha_f, float rho_f, bool on, float inv_tau_f,
                                          const ElementBackwardF32& f, const LineGradientF32& row,
                                          const LineGradientF32& column) {
  const float on_target = on ? 1.0f : 0.0f;
  const float off = 1.0f - on_target;
  const float coefficient = line_share<kKl, kFmse, kLogdet>(alpha_f, off, on_target, f, row) +
                            line_share<kKl, kFmse, kLogdet>(alpha_f, off, on_target, f, column);
  return coefficient * rho_f * inv_tau_f;  // ∂L/∂s = (α∂L/∂α)·(g'(x)/α)·(1/τ)
}

}  // namespace EO_ISA
}  // namespace evidential_ops
