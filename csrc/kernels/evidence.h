// Evidence maps e = g(x), x = s/τ, of SPEC §1, in double: α = e + 1 and ρ = g'(x)/α.
//
// The backward works with α·∂L/∂α (bounded even when α is huge) and multiplies by
// ρ = g'(x)/α ∈ [0, 1] to get ∂L/∂x; for exp evidence ρ = e/(e+1), never e itself, which
// overflows long before the loss does.
#pragma once

#include "elementary.h"
#include "elementary_f32.h"

namespace evidential_ops {
namespace EO_ISA {

// Same order as evidential_ops.config.EVIDENCE_KINDS.
enum class EvidenceKind : int { kExp = 0, kRelu = 1, kSoftplus = 2, kExpTanh = 3 };

struct EvidenceValue {
  double alpha;  // g(x) + 1
  double rho;    // g'(x) / α
};

template <EvidenceKind kKind>
EO_HOST_DEVICE EvidenceValue evidence_value(double x) {
  EvidenceValue out;
  if constexpr (kKind == EvidenceKind::kExp) {
    const double e = exp_d(x);
    out.alpha = e + 1.0;
    out.rho = e / out.alpha;
  } else if constexpr (kKind == EvidenceKind::kRelu) {
    const bool positive = x > 0.0;
    out.alpha = select(positive, x, 0.0) + 1.0;
    out.rho = select(positive, 1.0 / out.alpha, 0.0);
  } else if constexpr (kKind == EvidenceKind::kSoftplus) {
    // softplus(x) = max(x, 0) + ln(1 + e^-|x|), exact for every x; g' = sigmoid(x).
    const double small = exp_d(-(x < 0.0 ? -x : x));
    const double softplus = select(x > 0.0, x, 0.0) + log1p_d(small);
    const double sigmoid = select(x > 0.0, 1.0, small) / (1.0 + small);
    out.alpha = softplus + 1.0;
    out.rho = sigmoid / out.alpha;
  } else {
    // With q = e^{-2|x|} <= 1: tanh = ±(1 − q)/(1 + q) and 1 − tanh² = 4q/(1 + q)², the latter
    // without the cancellation of 1 − t·t (which loses all relative accuracy for |x| > 10).
    const double q = exp_d(-2.0 * (x < 0.0 ? -x : x));
    const double inv = 1.0 / (1.0 + q);
    const double magnitude = (1.0 - q) * inv;
    const double t = select(x < 0.0, -magnitude, magnitude);
    const double e = exp_d(t);
    out.alpha = e + 1.0;
    out.rho = e * (4.0 * q * inv * inv) / out.alpha;
  }
  // A NaN similarity (only with check_finite=False) stays NaN instead of being clamped to a
  // plausible evidence: garbage in, visible garbage out, as in the reference.
  out.alpha = select(x == x, out.alpha, x);
  out.rho = select(x == x, out.rho, x);
  return out;
}

// The same maps in float32 (SPEC §2 "Float32 element math"), for float32 and half inputs, with
// x = s·(1/τ) formed as a float32 product. Beyond x = 88.7 exp evidence leaves float32: α is
// +inf and ρ its limit 1, and the caller redoes such elements with the double map above.
struct EvidenceValueF32 {
  float alpha;
  float rho;
};

template <EvidenceKind kKind>
EO_HOST_DEVICE EvidenceValueF32 evidence_value(float x) {
  EvidenceValueF32 out;
  if constexpr (kKind == EvidenceKind::kExp) {
    const float e = exp_f(x);
    out.alpha = e + 1.0f;
    out.rho = select(e < __builtin_inff(), e / out.alpha, 1.0f);  // inf/inf would be NaN
  } else if constexpr (kKind == EvidenceKind::kRelu) {
    const bool positive = x > 0.0f;
    out.alpha = select(positive, x, 0.0f) + 1.0f;
    out.rho = select(positive, 1.0f / out.alpha, 0.0f);
  } else if constexpr (kKind == EvidenceKind::kSoftplus) {
    const float small = exp_f(-(x < 0.0f ? -x : x));
    const float softplus = select(x > 0.0f, x, 0.0f) + log1p_f(small);
    const float sigmoid = select(x > 0.0f, 1.0f, small) / (1.0f + small);
    out.alpha = softplus + 1.0f;
    out.rho = sigmoid / out.alpha;
  } else {
    const float q = exp_f(-2.0f * (x < 0.0f ? -x : x));
    const float inv = 1.0f / (1.0f + q);
    const float magnitude = (1.0f - q) * inv;
    const float t = select(x < 0.0f, -magnitude, magnitude);
    const float e = exp_f(t);
    out.alpha = e + 1.0f;
    out.rho = e * (4.0f * q * inv * inv) / out.alpha;
  }
  out.alpha = select(x == x, out.alpha, x);
  out.rho = select(x == x, out.rho, x);
  return out;
}

}  // namespace EO_ISA
}  // namespace evidential_ops
