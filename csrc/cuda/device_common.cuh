// Device helpers shared by the element kernels of csrc/cuda/*.cu (torch-free).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../kernels/element_terms.h"
#include "../kernels/evidence.h"
#include "../kernels/line_finalise.h"
#include "kernels.h"
#include "strip_plan.h"

// A kernel launch, EO_LAUNCH(grid, block, stream, kernel)(arguments...): a macro so that
// csrc/tests/test_cuda_emulated.cpp can run these files on the CPU (csrc/tests/emulation/).
#ifndef EO_LAUNCH
#define EO_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif

namespace evidential_ops {
namespace cuda {

namespace kn = evidential_ops::generic;

// The stored type of s or of ∂L/∂s, fixed at compile time in the float32 path's main
// instantiations (float s; float or __nv_bfloat16 ∂L/∂s), or AnyStored: the view's run-time kind,
// a uniform switch per element (the float64 path, and the float32 path's other combinations).
struct AnyStored {};

// A kernel's evidence map fixed at compile time (its EvidenceKind index), or kAnyEvidence: the
// launch's run-time kind, a uniform switch per element.
constexpr int kAnyEvidence = -1;

template <typename Stored>
__device__ __forceinline__ auto widen_stored(Stored v) {  // float for the half types, else v itself
  if constexpr (std::is_same<Stored, __half>::value) {
    return __half2float(v);
  } else if constexpr (std::is_same<Stored, __nv_bfloat16>::value) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}

// s(i, j) of a view as T: double for the float64 element math, float for the float32 one (float16
// and bfloat16 -> float is exact, as on the CPU, which widens half inputs to float32 first; the
// launchers send float64 views to the double path only). `at` is the element's offset,
// i·row_stride + j·col_stride.
template <typename T, typename Stored = AnyStored>
__device__ __forceinline__ T load_similarity(const SimilarityView& s, std::int64_t at) {
  if constexpr (!std::is_same<Stored, AnyStored>::value) {
    return static_cast<T>(widen_stored(static_cast<const Stored*>(s.data)[at]));
  } else {
    switch (s.kind) {
      case ScalarKind::kFloat32: return load_similarity<T, float>(s, at);
      case ScalarKind::kFloat64: return load_similarity<T, double>(s, at);
      case ScalarKind::kFloat16: return load_similarity<T, __half>(s, at);
      default: return load_similarity<T, __nv_bfloat16>(s, at);
    }
  }
}

// One row's s values at a thread's columns, as float (the float32 element math): the first
// `columns` of kColumns, `step` elements apart from `at`; 0 beyond. The float32 element loops load
// the row after the one they evaluate with this: loaded where it was used, each element's value
// headed its own chain of dependent work and the compiler issued its load right there, so that
// every row waited out kColumns load latencies one after another (`cuobjdump -sass` of the sm_90
// forward_stats_kernel and gradient_kernel: LDG, then its first use, then the next column's LDG
// only after that element's work); a row ahead, the load is in flight during a row's element work.
template <typename Stored, int kColumns>
__device__ __forceinline__ void load_row_values(float (&v)[kColumns], const SimilarityView& s, std::int64_t at,
                                                std::int64_t step, int columns) {
#pragma unroll
  for (int cc = 0; cc < kColumns; ++cc) v[cc] = cc < columns ? load_similarity<float, Stored>(s, at + cc * step) : 0.0f;
}

// ∂L/∂s into a buffer of type Stored, or (AnyStored) of the given kind: double -> float (-> half),
// the CPU kernels' roundings; a float value goes to half directly.
template <typename Stored = AnyStored, typename T>
__device__ __forceinline__ void store_gradient(void* out, ScalarKind kind, std::int64_t at, T g) {
  if constexpr (std::is_same<Stored, double>::value) {
    static_cast<double*>(out)[at] = static_cast<double>(g);
  } else if constexpr (std::is_same<Stored, float>::value) {
    static_cast<float*>(out)[at] = static_cast<float>(g);
  } else if constexpr (std::is_same<Stored, __half>::value) {
    static_cast<__half*>(out)[at] = __float2half_rn(static_cast<float>(g));
  } else if constexpr (std::is_same<Stored, __nv_bfloat16>::value) {
    static_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(static_cast<float>(g));
  } else {
    switch (kind) {
      case ScalarKind::kFloat64: return store_gradient<double>(out, kind, at, g);
      case ScalarKind::kFloat32: return store_gradient<float>(out, kind, at, g);
      case ScalarKind::kFloat16: return store_gradient<__half>(out, kind, at, g);
      default: return store_gradient<__nv_bfloat16>(out, kind, at, g);
    }
  }
}

// The evidence map of kind kEvidence, else (kAnyEvidence) of the run-time kind, in the precision
// of x.
template <int kEvidence = kAnyEvidence, typename T>
__device__ __forceinline__ auto evidence_of(int kind, T x) {
  if constexpr (kEvidence != kAnyEvidence) {
    return kn::evidence_value<static_cast<kn::EvidenceKind>(kEvidence)>(x);
  } else {
    return kn::evidence_value_of_kind(kind, x);
  }
}

// Whether the launch's evidence map gives its α's functions as polynomials in t = tanh x
// (element_terms.h has_tanh_functions): a constant where the kernel's map is fixed, else a uniform
// branch to the element code that evaluates those.
template <int kEvidence = kAnyEvidence>
__device__ __forceinline__ bool tanh_evidence(int kind) {
  return kn::has_tanh_functions(static_cast<kn::EvidenceKind>(kEvidence != kAnyEvidence ? kEvidence : kind));
}

// The float32 element math (SPEC §2 "Float32 element math") for float32, float16 and bfloat16
// views, selected at compile time (the kFloat32 parameter of the element kernels); float64 views
// keep the float64 math. Per element: x = s·(1/τ) as a float32 product, α and ρ from the float32
// map, the float32 element functions, no FP64 multiply or FMA; line sums stay float64.
constexpr float kInfinityF = __builtin_inff();
constexpr float kFloatMaxF = 3.40282347e38f;         // FLT_MAX
constexpr double kFloatMax = 3.4028234663852886e38;  // FLT_MAX, as a double

// The float32 path's rare elements call their double math out of line: the per-element loop then
// holds no registers for it, and its instructions stay out of the loop's code (the CPU emulation
// inlines as it likes).
#ifndef EO_OUT_OF_LINE
#if defined(__CUDACC__)
#define EO_OUT_OF_LINE __noinline__
#else
#define EO_OUT_OF_LINE
#endif
#endif

// Minimum blocks per multiprocessor of a float32 element kernel of `threads` threads a block, for
// its __launch_bounds__: 512 resident threads (at most 128 registers each), 384 for the term sets
// that spilled at 128 (`roomy`: up to 170). Left free, ptxas aims lower and spills.
__host__ __device__ constexpr int float32_min_blocks(int threads, bool roomy) { return (roomy ? 384 : 512) / threads; }

// The launchers' choice: 1/τ beyond FLT_MAX (τ < 2.9e-39) would make x infinite in float.
inline bool float32_elements(const SimilarityView& s, double inv_tau) {
  return s.kind != ScalarKind::kFloat64 && inv_tau <= kFloatMax;
}

// α and ρ of one element on the float32 path ("float32 evidence"): the float32 map at
// x = s·(1/τ), a float32 product, except where its α leaves float32 (exp evidence beyond x = 88.7)
// or at a line's target, whose α enters ψ(α_y) and the strength (the CPU keeps every α in double):
// there α in double from float arithmetic (evidence.h rare_evidence: x split into two floats, the
// float map refined to it, or beyond FLT_MAX e^x = e_r·2^n with 2^n in the exponent field) and,
// beyond FLT_MAX, the float element functions of ln α; no FP64 multiply or FMA but the double line
// shares of an element whose float gradient is not finite. The kernels test for those rare elements
// with the float32 map in the loop and only mark them there; each is handled after its stage
// (forward) or chunk (backward) of rows, in one out-of-line call per stage or chunk that has any
// (forward_kernels.cu rare_stage_sums, backward_kernels.cu rare_chunk_gradients).

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Rows [begin, end) of the strip that row group blockIdx.y walks.
struct RowRange {
  std::int64_t begin, end;
};

__device__ __forceinline__ RowRange group_rows(std::int64_t rows) {
  const std::int64_t per_group = (rows + gridDim.y - 1) / gridDim.y;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * per_group;
  const std::int64_t end = begin + per_group < rows ? begin + per_group : rows;
  return RowRange{begin, end};
}

// Column blocks × row groups of an element launch (at most max_groups groups).
inline dim3 element_grid(std::int64_t rows, std::int64_t cols, std::int64_t max_groups = kMaxRowGroups) {
  const std::int64_t col_blocks = ceil_div(cols, kThreads);
  const std::int64_t groups = std::max<std::int64_t>(1, std::min(row_groups_for(rows, col_blocks), max_groups));
  return dim3(static_cast<unsigned int>(col_blocks), static_cast<unsigned int>(groups));
}

}  // namespace cuda
}  // namespace evidential_ops
