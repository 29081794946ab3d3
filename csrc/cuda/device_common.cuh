// Device helpers shared by the element kernels of csrc/cuda/*.cu (torch-free).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

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

constexpr int kWarps = kThreads / 32;

// s(i, j) of a view, in double (float16/bfloat16 -> float -> double is exact, as on the CPU,
// which widens half inputs to float32 first). The kind is the same for the whole launch: the
// switch is a uniform branch.
__device__ __forceinline__ double load_similarity(const SimilarityView& s, std::int64_t i, std::int64_t j) {
  const std::int64_t at = i * s.row_stride + j * s.col_stride;
  switch (s.kind) {
    case ScalarKind::kFloat32:
      return static_cast<double>(static_cast<const float*>(s.data)[at]);
    case ScalarKind::kFloat64:
      return static_cast<const double*>(s.data)[at];
    case ScalarKind::kFloat16:
      return static_cast<double>(__half2float(static_cast<const __half*>(s.data)[at]));
    default:
      return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(s.data)[at]));
  }
}

// ∂L/∂s into a buffer of the given kind: double -> float (-> half), the CPU kernels' roundings.
__device__ __forceinline__ void store_gradient(void* out, ScalarKind kind, std::int64_t at, double g) {
  switch (kind) {
    case ScalarKind::kFloat64:
      static_cast<double*>(out)[at] = g;
      break;
    case ScalarKind::kFloat32:
      static_cast<float*>(out)[at] = static_cast<float>(g);
      break;
    case ScalarKind::kFloat16:
      static_cast<__half*>(out)[at] = __float2half_rn(static_cast<float>(g));
      break;
    default:
      static_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(static_cast<float>(g));
      break;
  }
}

// The evidence map of a run-time kind (uniform over a launch).
__device__ __forceinline__ kn::EvidenceValue evidence_of(int kind, double x) {
  switch (kind) {
    case 0:
      return kn::evidence_value<kn::EvidenceKind::kExp>(x);
    case 1:
      return kn::evidence_value<kn::EvidenceKind::kRelu>(x);
    case 2:
      return kn::evidence_value<kn::EvidenceKind::kSoftplus>(x);
    default:
      return kn::evidence_value<kn::EvidenceKind::kExpTanh>(x);
  }
}

// Sum over the 32 lanes of a warp by a fixed butterfly; lane 0's result is the one used, and it
// is the same on every run.
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

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
