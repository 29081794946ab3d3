// exp and log in double precision, written so that compilers vectorise them.
//
// libm's exp/log are opaque calls that GCC only vectorises under -ffast-math (which would
// change results: never used here). These are branch-free (selects only) and use the classic "add 1.5·2^52" trick to
// move between integers and doubles, so they vectorise with SSE2, AVX2 and AVX-512 alike.
// Accuracy: < 1 ulp over their domain (checked against tabulated mpmath values in csrc/tests).
#pragma once

#include "platform.h"

namespace evidential_ops {
namespace EO_ISA {

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 split so that n·kLn2Hi is exact
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kLog2e = 1.44269504088896338700e+00;
constexpr double kRoundMagic = 6755399441055744.0;  // 1.5·2^52: x + magic rounds x to an integer
constexpr double kMaxExpArg = 709.0;                // exp(709) ≈ 8.2e307 < DBL_MAX; n ≤ 1023
constexpr double kMinExpArg = -708.0;               // below this exp underflows to the subnormals

// exp(x). Returns +inf above 709 (the kernels turn that into an error naming τ) and 0 below -708.
EO_HOST_DEVICE double exp_d(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  const double xc = min_of(max_of(x, kMinExpArg), kMaxExpArg);
  const double shifted = xc * kLog2e + kRoundMagic;
  const double n = shifted - kRoundMagic;  // round(x / ln 2), exact
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2/2
  // Taylor to r^13: truncation < 2e-17 relative for |r| <= 0.347.
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // The low mantissa bits of `shifted` hold n; shifting them into the exponent field builds 2^n.
  const std::uint64_t scale_bits = (bits_of(shifted) << 52) + (std::uint64_t(1023) << 52);
  const double result = p * double_of(scale_bits);
  const double huge = x > kMaxExpArg ? __builtin_inf() : result;
  return x < kMinExpArg ? 0.0 : huge;
#endif
}

// ln(x) for finite, normal x > 0 (subnormals, 0, Inf and NaN are not handled).
EO_HOST_DEVICE double log_d(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  const std::uint64_t bits = bits_of(x);
  // exponent as a double without an int->double conversion: OR the biased exponent into the
  // mantissa of 2^52 and subtract 2^52.
  const double biased = double_of((bits >> 52) | 0x4330000000000000ULL) - 4503599627370496.0;
  double mantissa = double_of((bits & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL);  // [1, 2)
  const bool high = mantissa > 1.4142135623730951;
  mantissa = high ? mantissa * 0.5 : mantissa;  // now in [0.707, 1.414]
  const double k = biased - 1023.0 + (high ? 1.0 : 0.0);
  const double f = mantissa - 1.0;
  // ln(1+f) = f − f²/2 + s·(f²/2 + R(s²)), s = f/(2+f): minimax R of degree 14 (fdlibm's).
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double w = z * z;
  const double t1 = w * (3.999999999940941908e-01 + w * (2.222219843214978396e-01 + w * 1.531383769920937332e-01));
  const double t2 = z * (6.666666666666735130e-01 +
                         w * (2.857142874366239149e-01 + w * (1.818357216161805012e-01 + w * 1.479819860511658591e-01)));
  const double r = t1 + t2;
  const double half_f_sq = 0.5 * f * f;
  return k * kLn2Hi - ((half_f_sq - (s * (half_f_sq + r) + k * kLn2Lo)) - f);
#endif
}

// ln(1 + y) for y >= 0, accurate for tiny y too: the rounding of 1 + y is corrected.
EO_HOST_DEVICE double log1p_d(double y) {
  const double u = 1.0 + y;
  const double correction = ((u - 1.0) - y) / u;
  return select(u == 1.0, y, log_d(u) - correction);
}

}  // namespace EO_ISA
}  // namespace evidential_ops
