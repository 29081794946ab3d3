// exp, log and log1p in float32, written so that compilers vectorise them at full float32 width
// (the float counterparts of elementary.h, same structure: branch-free, selects only).
//
// Accuracy (measured over their whole float32 domain by bench/float32_special_sweep.py, table in
// bench/results/float32_special_functions.md): below 1 ulp. Derived, not copied: Cody-Waite
// reduction with a 9-bit ln 2 so that n·ln2_hi is exact, and Taylor polynomials whose truncation
// is below 2^-27 relative on the reduced interval.
#pragma once

#include "platform.h"

namespace evidential_ops {
namespace EO_ISA {

constexpr float kLn2HiF = 0.693359375f;       // 355/512: n·kLn2HiF is exact for |n| < 2^15
constexpr float kLn2LoF = -2.12194440e-4f;    // ln 2 − kLn2HiF, rounded
constexpr float kLog2eF = 1.44269504f;
constexpr float kRoundMagicF = 12582912.0f;   // 1.5·2^23: x + magic rounds x to an integer
constexpr float kMaxExpArgF = 88.7228394f;    // largest x with exp(x) < FLT_MAX
constexpr float kMinExpArgF = -103.972076f;   // below: exp(x) rounds to 0 (half the least subnormal)
// exp_f's argument clamps, a little beyond those: e_r·2^k there already rounds to 0 (k = −151)
// and overflows to +inf (k = 128).
constexpr float kExpClampLoF = -104.5f;
constexpr float kExpClampHiF = 89.0f;

EO_HOST_DEVICE std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

EO_HOST_DEVICE float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// ---- The GPU's approximate reciprocal and exponential (SPEC §2 "Float32 element math").
// An IEEE float division is a dozen instructions on the GPU with a slow-path branch, and exp_f
// below thirty; the hardware's approximations are one MUFU instruction each: rcp.approx.ftz.f32
// (PTX ISA: at most 1 ulp; results below 2^-126 flushed to 0) and ex2.approx.ftz.f32 (CUDA's
// exp2f, 2 ulp). The GPU element code takes them wherever the last bits of a quotient or of an
// exponential are absorbed by what they feed (each use says why); the CPU keeps the IEEE
// operations and exp_f (its SIMD division is cheap, and its bits stay those the sweeps measured).
// The CPU emulation of the CUDA kernels (csrc/tests/test_cuda_emulated.cpp, built with
// EO_EMULATED_GPU_APPROXIMATIONS) moves the CPU's result by up to kEmulatedApproxUlps ulps, chosen
// by a hash of the arguments: a larger error than the hardware's, so that the emulated tolerances,
// derived with it, cover the GPU's.
constexpr int kEmulatedApproxUlps = 2;

#if !defined(__CUDA_ARCH__) && defined(EO_EMULATED_GPU_APPROXIMATIONS)
// y moved by −kEmulatedApproxUlps..kEmulatedApproxUlps ulps (finite nonzero y only), picked by key.
inline float emulated_approximation(float y, std::uint32_t key) {
  if (!(y != 0.0f) || !(y - y == 0.0f)) return y;
  std::uint32_t h = key * 0x9E3779B1u;
  h ^= h >> 15;
  h *= 0x85EBCA77u;
  h ^= h >> 13;
  const int steps = static_cast<int>(h % (2 * kEmulatedApproxUlps + 1)) - kEmulatedApproxUlps;
  std::uint32_t u = bits_of(y);
  // Away from zero is + on the bits of a positive y and of a negative one alike.
  u = static_cast<std::uint32_t>(static_cast<std::int64_t>(u) + steps);
  const float moved = float_of(u);
  return moved - moved == 0.0f && (moved > 0.0f) == (y > 0.0f) ? moved : y;
}
#endif

// 1/b. The GPU's result is within 1 ulp for |b| <= 2^126, 0 beyond (1/b below 2^-126).
EO_HOST_DEVICE float approx_reciprocal(float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
#elif defined(EO_EMULATED_GPU_APPROXIMATIONS)
  return emulated_approximation(1.0f / b, bits_of(b));
#else
  return 1.0f / b;
#endif
}

// a/b. The GPU's result, a·rcp(b), is within 2 ulp for |b| <= 2^126; beyond it is 0.
EO_HOST_DEVICE float approx_divide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return a * approx_reciprocal(b);
#elif defined(EO_EMULATED_GPU_APPROXIMATIONS)
  return emulated_approximation(a / b, bits_of(a) * 0x2545F491u ^ bits_of(b));
#else
  return a / b;
#endif
}

// e^x = e_r·2^k for x = k·ln 2 + r, |r| <= 0.347, k = round(x/ln 2), for |x| <= 105 (the
// rounding constant needs |x/ln 2| < 2^22; the CPU's exp_f and exp_f_of_moderate share it, so the
// two agree bit for bit where both apply).
struct ExpPartsF32 {
  float e_r;
  std::int32_t k;
};

EO_HOST_DEVICE ExpPartsF32 exp_parts_f(float x) {
  const float n = (x * kLog2eF + kRoundMagicF) - kRoundMagicF;  // round(x / ln 2), exact
  const float r = (x - n * kLn2HiF) - n * kLn2LoF;              // |r| <= 0.347
  // e^r = 1 + r + r²·Σ r^k/(k+2)!, Taylor to r^7: truncation r^8/8! < 5.3e-9 relative.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  return ExpPartsF32{1.0f + (r + r * r * p), static_cast<std::int32_t>(n)};
}

// 2^k for a k whose power is a normal float (−126 <= k <= 127).
EO_HOST_DEVICE float exp2_of_int(std::int32_t k) { return float_of(static_cast<std::uint32_t>(k + 127) << 23); }

// exp(x) for float x: +inf above kMaxExpArgF, 0 below kMinExpArgF, subnormal results in between
// rounded once (2^k is applied as two normal factors, so no intermediate leaves the range). The
// argument is clamped to [kExpClampLoF, kExpClampHiF], where the results are already 0 and +inf
// (e_r·2^k rounds to them), so no select on the result is needed, each of which would cost a SIMD
// loop a compare and a blend (csrc/tests/test_special_functions_f32.cpp checks 0 and +inf at every
// float between the range's ends and the clamps). A NaN argument gives an arbitrary result: callers
// keep NaN themselves. On the GPU: 2^(hi + lo), hi = x·log2 e rounded, lo its rounding error and x
// times log2 e's (|lo| <= 2^-17), as ex2(hi)·(1 + lo·ln 2): within 3 ulp (ex2's 2, the rest below
// ½); +inf from x ≈ 88.72 (as here; an α that comes out infinite is redone in double by the
// kernels), results below 2^-126 flushed to 0 (they enter α = 1 + e, or a subnormal ρ, as nothing;
// exp_tanh's 4q, normal where q is not, comes from exp_and_quadruple_f). x is first raised to
// kMinExpArgF − 64 (whose result is 0 as well), so that −inf, or an x·log2 e below
// −FLT_MAX, leaves lo finite; where ex2 is +inf the FMA is skipped: inf·(lo·ln 2) + inf is NaN for
// lo < 0.
EO_HOST_DEVICE float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  constexpr float kLog2eLoF = 1.92596299e-8f;  // log2 e − kLog2eF
  constexpr float kLn2F = 0.693147182f;
  x = fmaxf(x, kMinExpArgF - 64.0f);
  const float hi = x * kLog2eF;
  const float lo = __fmaf_rn(x, kLog2eF, -hi) + x * kLog2eLoF;
  float p;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(hi));
  return p < __builtin_inff() ? __fmaf_rn(p, lo * kLn2F, p) : p;
#else
  const ExpPartsF32 parts = exp_parts_f(min_of(max_of(x, kExpClampLoF), kExpClampHiF));  // k ∈ [−151, 128]
  const std::int32_t half = parts.k >> 1;  // both factors 2^half, 2^(k − half) normal
  const float result = (parts.e_r * exp2_of_int(half)) * exp2_of_int(parts.k - half);
#if defined(EO_EMULATED_GPU_APPROXIMATIONS)
  return emulated_approximation(result, bits_of(x) ^ 0x5bd1e995u);
#else
  return result;
#endif
#endif
}

// (e^x, 4·e^x) for float x <= 0: exp_tanh's q = e^{-2|x|} and the 4q of ρ = e·4q/((1 + q)²α)
// (evidence.h). q is subnormal from |x| = 43.67 while ρ stays normal up to |x| = 44.2, so 4q is
// formed by the exponential itself, never as 4·q: on the GPU ex2.approx.ftz of hi + 2 (exact for
// hi <= −1: 2 is a multiple of hi's ulp and |hi + 2| <= |hi|), normal down to e^x = 2^-128, where
// ex2(hi) flushed everything below 2^-126 to 0 (ρ = 0: a relative error of 1); e^x = that / 4
// (exact where normal; a subnormal q only enters 1 ± q). On the CPU e_r·2^(k + 2), rounded once.
struct ExpAndQuadrupleF32 {
  float e, e4;
};

EO_HOST_DEVICE ExpAndQuadrupleF32 exp_and_quadruple_f(float x) {
#if defined(__CUDA_ARCH__)
  constexpr float kLog2eLoF = 1.92596299e-8f;  // log2 e − kLog2eF
  constexpr float kLn2F = 0.693147182f;
  x = fmaxf(x, kMinExpArgF - 64.0f);
  // hi rounded once: contracted into hi + 2 (an FMA) it would round below lo's, counted twice
  const float hi = __fmul_rn(x, kLog2eF);
  const float lo = __fmaf_rn(x, kLog2eF, -hi) + x * kLog2eLoF;
  const bool shift = hi <= -1.0f;
  float p;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(shift ? hi + 2.0f : hi));
  p = __fmaf_rn(p, lo * kLn2F, p);  // x <= 0: p <= 4, never +inf
  return ExpAndQuadrupleF32{shift ? 0.25f * p : p, shift ? p : 4.0f * p};
#else
  const ExpPartsF32 parts = exp_parts_f(min_of(max_of(x, kExpClampLoF), kExpClampHiF));
  const std::int32_t half = parts.k >> 1;
  const float e = (parts.e_r * exp2_of_int(half)) * exp2_of_int(parts.k - half);
  const float e4 = (parts.e_r * exp2_of_int(half)) * exp2_of_int(parts.k + 2 - half);
#if defined(EO_EMULATED_GPU_APPROXIMATIONS)
  const float moved = emulated_approximation(e4, bits_of(x) ^ 0x5bd1e995u);
  return ExpAndQuadrupleF32{0.25f * moved, moved};
#else
  return ExpAndQuadrupleF32{e, e4};
#endif
#endif
}

// exp(x) for |x| <= 87, where e^x is a normal float: exp_f's bits (its clamps and its second
// scaling change nothing there), in a third fewer SIMD instructions. For arguments bounded by
// construction, such as exp_tanh's e^t, t ∈ [−1, 1].
EO_HOST_DEVICE float exp_f_of_moderate(float x) {
#if defined(__CUDA_ARCH__) || defined(EO_EMULATED_GPU_APPROXIMATIONS)
  return exp_f(x);
#else
  const ExpPartsF32 parts = exp_parts_f(x);
  return parts.e_r * exp2_of_int(parts.k);
#endif
}

// ln(x) = k·ln 2 + ln(1 + f) of a finite, normal float x > 0: k and the part of ln(1 + f) below
// k·kLn2HiF, which depend on x's exponent and mantissa apart.
struct LogPartsF32 {
  float k;     // the exponent (of the mantissa reduced to [0.707, 1.414])
  float tail;  // ln(1 + f), f the reduced mantissa − 1, as f − (½f² − s(½f² + R))
};

EO_HOST_DEVICE LogPartsF32 log_parts_f(float x) {
  // The mantissa m ∈ [1, 2) is halved (and the exponent raised) where m > 1.41421354, in integer
  // arithmetic: adding kCarry carries into the exponent exactly for those mantissas, and the same
  // offset then rebuilds m or m/2. A select on m here is what GCC if-converts by evaluating the
  // whole logarithm, and every polynomial in it downstream, once per side (twice the work).
  constexpr std::uint32_t kCarry = 0x00800000u - 0x003504F4u;  // mantissa fields >= 0x3504F4 carry
  const std::uint32_t shifted = bits_of(x) + kCarry;
  const float k = static_cast<float>(static_cast<std::int32_t>(shifted >> 23) - 127);
  const float mantissa = float_of((shifted & 0x007FFFFFu) + (0x3F800000u - kCarry));  // [0.707, 1.414]
  const float f = mantissa - 1.0f;  // exact
  // ln(1 + f) = 2 atanh(s), s = f/(2 + f), |s| <= 0.172: 2s + s·R(s²), R = Σ 2s^2j/(2j + 1)
  // (j <= 5; the next term is below 2^-30 relative), arranged as f − (½f² − s(½f² + R)) so that
  // the leading f is exact.
  // s enters only s·(½f² + R), at most 0.043 of the result: the GPU's 2-ulp quotient moves the
  // logarithm by less than 0.1 ulp.
  const float s = approx_divide(f, 2.0f + f);
  const float z = s * s;
  float big_r = 2.0f / 11.0f;
  big_r = big_r * z + 2.0f / 9.0f;
  big_r = big_r * z + 2.0f / 7.0f;
  big_r = big_r * z + 2.0f / 5.0f;
  big_r = big_r * z + 2.0f / 3.0f;
  big_r = big_r * z;
  const float half_f_sq = 0.5f * f * f;
  return LogPartsF32{k, f - (half_f_sq - s * (half_f_sq + big_r))};
}

// k·kLn2HiF is exact (k has at most 8 bits, kLn2HiF 9); the small parts are added first.
EO_HOST_DEVICE float log_from_parts(float k, float tail) { return k * kLn2HiF + (tail + k * kLn2LoF); }

// ln(x) for finite, normal float x > 0 (subnormals, 0, Inf and NaN are not handled).
EO_HOST_DEVICE float log_f(float x) {
  const LogPartsF32 p = log_parts_f(x);
  return log_from_parts(p.k, p.tail);
}

// ln(x) and ln(x·2^-n) for x and x·2^-n finite and normal, n a small integer: the second is
// log_f(x·2^-n) bit for bit (same mantissa, exponent less by n, so the same tail and k − n, exact),
// with the mantissa's part, its division included, evaluated once.
struct LogPairF32 {
  float log_x;
  float log_scaled;  // ln(x·2^-n)
};

EO_HOST_DEVICE LogPairF32 log_f_pair(float x, float n) {
  const LogPartsF32 p = log_parts_f(x);
  return LogPairF32{log_from_parts(p.k, p.tail), log_from_parts(p.k - n, p.tail)};
}

// ln(1 + y) for float y >= 0, accurate for tiny y too: the rounding of 1 + y is corrected.
EO_HOST_DEVICE float log1p_f(float y) {
  const float u = 1.0f + y;
  const float correction = approx_divide((u - 1.0f) - y, u);  // the rounding of 1 + y: tiny next to the result
  return select(u == 1.0f, y, log_f(u) - correction);
}

}  // namespace EO_ISA
}  // namespace evidential_ops
