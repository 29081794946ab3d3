// Evidence maps e = g(x), x = s/τ, of SPEC §1, in double and in float: α = e + 1 and ρ = g'(x)/α.
//
// The backward works with α·∂L/∂α (bounded even when α is huge) and multiplies by
// ρ = g'(x)/α ∈ [0, 1] to get ∂L/∂x; for exp evidence ρ = e/(e+1), never e itself, which
// overflows long before the loss does.
#pragma once

#include <type_traits>

#include "elementary.h"
#include "elementary_f32.h"

namespace evidential_ops {
namespace EO_ISA {

// Same order as evidential_ops.config.EVIDENCE_KINDS.
enum class EvidenceKind : int { kExp = 0, kRelu = 1, kSoftplus = 2, kExpTanh = 3 };

// Calls fn(std::integral_constant<EvidenceKind, kind>{}) for a run-time kind (an EVIDENCE_KINDS
// index, checked by the op layer; anything else is taken as the last): code that takes the map as
// a template argument, dispatched once where the kind is known.
template <typename Fn>
EO_HOST_DEVICE decltype(auto) with_evidence_kind(int kind, Fn&& fn) {
  switch (kind) {
    case 0: return fn(std::integral_constant<EvidenceKind, EvidenceKind::kExp>{});
    case 1: return fn(std::integral_constant<EvidenceKind, EvidenceKind::kRelu>{});
    case 2: return fn(std::integral_constant<EvidenceKind, EvidenceKind::kSoftplus>{});
    default: return fn(std::integral_constant<EvidenceKind, EvidenceKind::kExpTanh>{});
  }
}

// α = g(x) + 1 and ρ = g'(x)/α in the precision of x; for exp_tanh also t = tanh x, the variable
// of its α's special functions (special_functions_f32.h, "of_tanh"), 0 for the other maps.
template <typename T>
struct EvidenceValueOf {
  T alpha;
  T rho;
  T tanh;
};
using EvidenceValue = EvidenceValueOf<double>;
// The float32 maps (SPEC §2 "Float32 element math"), for float32 and half inputs, with x = s·(1/τ)
// formed as a float32 product. Beyond x = 88.7 exp evidence leaves float32: α is +inf and ρ its
// limit 1, and the caller redoes such elements with the double map.
using EvidenceValueF32 = EvidenceValueOf<float>;

// The elementary functions of each precision (elementary.h, elementary_f32.h) under one name.
EO_HOST_DEVICE double exp_of(double x) { return exp_d(x); }
EO_HOST_DEVICE float exp_of(float x) { return exp_f(x); }
// The same for |x| <= 87 (the float form skips the range handling there, same bits).
EO_HOST_DEVICE double exp_of_moderate(double x) { return exp_d(x); }
EO_HOST_DEVICE float exp_of_moderate(float x) { return exp_f_of_moderate(x); }
// (e^x, 4e^x) for x <= 0 (exp_tanh's q and 4q): 4e^x from the exponential itself in float
// (elementary_f32.h exp_and_quadruple_f: a subnormal q flushed by the GPU's ex2 would zero ρ).
template <typename T>
struct ExpAndQuadrupleOf {
  T e, e4;
};
EO_HOST_DEVICE ExpAndQuadrupleOf<double> exp_and_quadruple_of(double x) {
  const double e = exp_d(x);
  return ExpAndQuadrupleOf<double>{e, 4.0 * e};
}
EO_HOST_DEVICE ExpAndQuadrupleOf<float> exp_and_quadruple_of(float x) {
  const ExpAndQuadrupleF32 v = exp_and_quadruple_f(x);
  return ExpAndQuadrupleOf<float>{v.e, v.e4};
}
EO_HOST_DEVICE double log1p_of(double y) { return log1p_d(y); }
EO_HOST_DEVICE float log1p_of(float y) { return log1p_f(y); }
// a/b: IEEE in double; in float the GPU's approximate quotient (elementary_f32.h approx_divide):
// every ρ below is a product of a few such values, and its error reaches ∂L/∂s as a relative one.
EO_HOST_DEVICE double quotient_of(double a, double b) { return a / b; }
EO_HOST_DEVICE float quotient_of(float a, float b) { return approx_divide(a, b); }

// One source for both precisions: the same operations in T, so a float64 input keeps float64 math.
template <EvidenceKind kKind, typename T>
EO_HOST_DEVICE EvidenceValueOf<T> evidence_value(T x) {
  constexpr T kOne = 1, kZero = 0;
  EvidenceValueOf<T> out;
  out.tanh = kZero;
  if constexpr (kKind == EvidenceKind::kExp) {
    const T e = exp_of(x);
    out.alpha = e + kOne;
    // e/α = 1 to the precision of either type from α = 2^126 on (the approximate float quotient
    // stops there), and inf/inf would be NaN.
    out.rho = select(out.alpha < static_cast<T>(0x1p126), quotient_of(e, out.alpha), kOne);
  } else if constexpr (kKind == EvidenceKind::kRelu) {
    const bool positive = x > kZero;
    out.alpha = select(positive, x, kZero) + kOne;
    out.rho = select(positive, quotient_of(kOne, out.alpha), kZero);
  } else if constexpr (kKind == EvidenceKind::kSoftplus) {
    // softplus(x) = max(x, 0) + ln(1 + e^-|x|), exact for every x; g' = sigmoid(x).
    const T small = exp_of(-(x < kZero ? -x : x));
    const T softplus = select(x > kZero, x, kZero) + log1p_of(small);
    const T sigmoid = quotient_of(select(x > kZero, kOne, small), kOne + small);
    out.alpha = softplus + kOne;
    out.rho = quotient_of(sigmoid, out.alpha);
  } else {
    // With q = e^{-2|x|} <= 1: tanh = ±(1 − q)/(1 + q) and 1 − tanh² = 4q/(1 + q)², the latter
    // without the cancellation of 1 − t·t (which loses all relative accuracy for |x| > 10).
    // 4q from the exponential itself: q is subnormal from |x| = 43.67, where ρ is still normal.
    const ExpAndQuadrupleOf<T> qq = exp_and_quadruple_of(static_cast<T>(-2) * (x < kZero ? -x : x));
    const T q = qq.e;
    const T inv = quotient_of(kOne, kOne + q);
    const T magnitude = (kOne - q) * inv;
    const T t = select(x < kZero, -magnitude, magnitude);
    out.tanh = t;
    const T e = exp_of_moderate(t);  // t ∈ [−1, 1]
    out.alpha = e + kOne;
    out.rho = quotient_of(e * (qq.e4 * inv * inv), out.alpha);
  }
  // A NaN similarity (only with check_finite=False) stays NaN instead of being clamped to a
  // plausible evidence: garbage in, visible garbage out, as in the reference.
  out.alpha = select(x == x, out.alpha, x);
  out.rho = select(x == x, out.rho, x);
  return out;
}

// The map of a run-time kind at x (with_evidence_kind; a function object rather than a lambda, so
// that nvcc takes it in host and device code alike without --expt-relaxed-constexpr).
template <typename T>
struct EvidenceValueAt {
  T x;
  template <typename Kind>
  EO_HOST_DEVICE EvidenceValueOf<T> operator()(Kind) const {
    return evidence_value<Kind::value>(x);
  }
};

template <typename T>
EO_HOST_DEVICE EvidenceValueOf<T> evidence_value_of_kind(int kind, T x) {
  return with_evidence_kind(kind, EvidenceValueAt<T>{x});
}

// ---- A rare element's α in double without FP64 multiplies (the CUDA float32 path's rare elements:
// a line's target, an α beyond FLT_MAX; SPEC §2 "Float32 element math").

// x = s·(1/τ) as an unevaluated float sum hi + lo: hi = s·ih, the float32 path's own x (ih = 1/τ
// rounded to float), lo = its rounding error (exact by an FMA) plus s·il (il = 1/τ − ih). x then
// carries about 48 bits: an α at a target no longer inherits hi's relative rounding, |x|·2^-24
// (1.2e-5 at x = 99, where a line's risk is a ratio of its target's α to the rest).
struct SplitProductF32 {
  float hi, lo;
};

EO_HOST_DEVICE float fma_exact(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

EO_HOST_DEVICE SplitProductF32 split_product(float s, float inv_tau_hi, float inv_tau_lo) {
  const float hi = s * inv_tau_hi;
  return SplitProductF32{hi, fma_exact(s, inv_tau_hi, -hi) + s * inv_tau_lo};
}

// v·2^k for a normal double v >= 0, k added to its exponent field (no multiply): +inf where the
// exponent would pass 1023, 0 where it would leave the normal range (subnormal results are not
// formed: the callers' are far from them). 0, +inf and NaN come back unchanged.
EO_HOST_DEVICE double scaled_by_power_of_two(double v, std::int64_t k) {
  const std::int64_t old_field = static_cast<std::int64_t>((bits_of(v) >> 52) & 0x7FF);
  const std::int64_t field = old_field + k;
  if (old_field == 0 || old_field == 0x7FF) return v;
  if (field >= 0x7FF) return __builtin_inf();
  return field <= 0 ? 0.0 : double_of(bits_of(v) + (static_cast<std::uint64_t>(k) << 52));
}

// α, ρ of a rare element, in double, from float arithmetic alone.
struct RareEvidence {
  double alpha;     // α (the value the line sums take; a target's is stored as α_target)
  double rho;       // ρ = g'(x)/α
  float alpha_f;    // α rounded to float (+inf beyond FLT_MAX): the float element functions' argument
  float log_alpha;  // ln α where α > FLT_MAX (the functions' argument there, polygammas_of_log)
  bool beyond;      // α > FLT_MAX (or NaN)
};

// The float map v at x.hi (evidence_value), refined to x = hi + lo: α + α'(hi)·lo, α' = g' = ρ·α,
// the product in float and the sum in double. Its error is the float map's (SPEC §2: within 7, 1,
// 5 and 14 units of 2^-24 for exp, relu, softplus and exp_tanh), not |x|·2^-24 more; the dropped
// second-order term is below (lo·α')²/α ≈ 2^-48·x². Beyond FLT_MAX (v.alpha infinite):
// - exp: e^x = e_r·2^n, n = round(hi/ln 2), r = hi − n·ln 2 in float (Cody-Waite, exact for
//   n < 2^15) plus lo, e_r = e^r·(1 + lo)'s float, 2^n put in the exponent field; ρ = 1
//   (e/(e + 1) = 1 in double from e = 2^53 on); ln α = hi + lo rounded (ln(e^x + 1) = x there);
// - relu and softplus (x itself beyond FLT_MAX: |s|/τ > 3.4e38): α = x + 1 = x in double from the
//   product scaled by 2^-64, ρ = 1/α (g' = 1) from its float reciprocal, ln α = ln(x·2^-64) + 64 ln 2.
// exp_tanh's α never leaves [1.37, 3.72]. A NaN x gives NaN throughout.
template <EvidenceKind kKind>
EO_HOST_DEVICE RareEvidence rare_evidence(const EvidenceValueF32& v, SplitProductF32 x, float s, float inv_tau_hi) {
  RareEvidence out;
  out.beyond = !(v.alpha < __builtin_inff());
  if (!out.beyond) {
    out.alpha = static_cast<double>(v.alpha) + static_cast<double>(v.alpha * v.rho * x.lo);
    out.rho = v.rho;
    out.alpha_f = static_cast<float>(out.alpha);
    out.log_alpha = 0.0f;
    return out;
  }
  if constexpr (kKind == EvidenceKind::kExp) {
    const float hi = min_of(x.hi, 1000.0f);  // e^1000 is beyond double: +inf below, from n
    const ExpPartsF32 parts = exp_parts_f(hi);
    const float reduced = parts.e_r + parts.e_r * x.lo;  // e^(r + lo), |lo| <= 2^-14 here
    out.alpha = scaled_by_power_of_two(static_cast<double>(reduced), parts.k) + 1.0;
    out.rho = 1.0;
    out.log_alpha = x.hi + x.lo;
  } else {
    const float scaled = (s * 0x1p-64f) * inv_tau_hi;  // x·2^-64, s·2^-64 exact
    out.alpha = scaled_by_power_of_two(static_cast<double>(scaled), 64) + 1.0;
    out.rho = scaled_by_power_of_two(static_cast<double>(approx_reciprocal(scaled)), -64);
    out.log_alpha = log_f(scaled) + 64.0f * 0.693147182f;
  }
  out.alpha_f = __builtin_inff();
  if (!(x.hi == x.hi)) out.alpha = out.rho = out.log_alpha = x.hi;  // NaN s
  return out;
}

// The same for a run-time kind (with_evidence_kind; a function object, as EvidenceValueAt).
struct RareEvidenceAt {
  EvidenceValueF32 v;
  SplitProductF32 x;
  float s, inv_tau_hi;
  template <typename Kind>
  EO_HOST_DEVICE RareEvidence operator()(Kind) const {
    return rare_evidence<Kind::value>(v, x, s, inv_tau_hi);
  }
};

EO_HOST_DEVICE RareEvidence rare_evidence_of_kind(int kind, const EvidenceValueF32& v, SplitProductF32 x, float s,
                                                  float inv_tau_hi) {
  return with_evidence_kind(kind, RareEvidenceAt{v, x, s, inv_tau_hi});
}

}  // namespace EO_ISA
}  // namespace evidential_ops
