// Portability layer of the torch-free kernel math shared by the CPU and CUDA backends.
//
// Every function in csrc/kernels/ is an inline template written branch-free (selects instead of
// ifs), so that nvcc runs it per thread and GCC/Clang vectorise the CPU tile loops around it.
// EO_ISA names the instruction-set variant a CPU translation unit is compiled for: each variant
// gets its own namespace, so the linker can never merge an AVX-512 copy of an inline function
// into the baseline build (the ODR trap of multi-versioned code).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define EO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EO_HOST_DEVICE inline __attribute__((always_inline))
#endif

#ifndef EO_ISA
#define EO_ISA generic
#endif

namespace evidential_ops {
namespace EO_ISA {

template <typename T>
EO_HOST_DEVICE T select(bool condition, T if_true, T if_false) {
  return condition ? if_true : if_false;
}

template <typename T>
EO_HOST_DEVICE T min_of(T a, T b) {
  return a < b ? a : b;
}

template <typename T>
EO_HOST_DEVICE T max_of(T a, T b) {
  return a > b ? a : b;
}

EO_HOST_DEVICE std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

EO_HOST_DEVICE double double_of(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace EO_ISA
}  // namespace evidential_ops
