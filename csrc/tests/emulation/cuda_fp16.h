// float16 for the CPU emulation of csrc/cuda/ (see cuda_runtime.h here): GCC's _Float16 rounds to
// nearest even, as __float2half_rn does.
#pragma once

#include <cstdint>
#include <cstring>

struct __half {
  std::uint16_t bits;
};

inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, sizeof f);
  return static_cast<float>(f);
}

inline __half __float2half_rn(float x) {
  const _Float16 f = static_cast<_Float16>(x);
  __half h;
  std::memcpy(&h.bits, &f, sizeof h.bits);
  return h;
}
