// bfloat16 for the CPU emulation of csrc/cuda/ (see cuda_runtime.h here): the upper half of a
// float, rounded to nearest even like __float2bfloat16_rn.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  std::uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{static_cast<std::uint16_t>(u >> 16)};
}
