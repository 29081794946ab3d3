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
    const T q = exp_of(static_cast<T>(-2) * (x < kZero ? -x : x));
    const T inv = quotient_of(kOne, kOne + q);
    const T magnitude = (kOne - q) * inv;
    const T t = select(x < kZero, -magnitude, magnitude);
    out.tanh = t;
    const T e = exp_of_moderate(t);  // t ∈ [−1, 1]
    out.alpha = e + kOne;
    out.rho = quotient_of(e * (static_cast<T>(4) * q * inv * inv), out.alpha);
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

}  // namespace EO_ISA
}  // namespace evidential_ops
