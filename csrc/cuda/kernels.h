// Host interface of the CUDA kernels of csrc/cuda/*.cu (torch-free: CUDA runtime types, raw
// pointers and a stream). The torch-facing launcher is evidential_cuda.cpp: it validates the
// arguments (csrc/op_args.h), plans the strips (strip_plan.h), runs the cuBLAS products, and
// calls these. Every function enqueues work on `stream` and returns cudaGetLastError().
//
// The element kernels give one thread to each column of a strip of s (the float32 path: four
// columns, 32 apart) and let it walk down the rows of its row group (blockIdx.y): the loads of a
// warp are consecutive columns (coalesced), a column's sums stay in registers, and a row's sum is
// the warp's lanes in lane order (staged in shared memory) and then the block's warps in order, so
// every reduction has a fixed order: no atomics on floating-point
// values anywhere, and results do not depend on scheduling. The per-element math is csrc/kernels/'s,
// shared with the CPU: float64 for float64 views, the float32 element math (SPEC §2 "Float32 element
// math") for float32 and half views, chosen by the launchers from the view's kind.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace evidential_ops {
namespace cuda {

// Element type of a similarity view or a gradient buffer.
enum class ScalarKind : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

// rows×cols of s: element (i, j) at data[i·row_stride + j·col_stride] (element units); its row i
// is row row0 + i of the op's rows (whose target column is row0 + i + target_offset).
struct SimilarityView {
  const void* data;
  ScalarKind kind;
  std::int64_t row_stride, col_stride;
  std::int64_t rows, cols;
  std::int64_t row0;
};

// Which per-element special functions a call needs (csrc/kernels/element_terms.h).
struct TermFlags {
  bool kl, fmse, logdet;
};

struct ForwardArgs {
  SimilarityView s;
  int evidence;  // evidential_ops.config.EVIDENCE_KINDS index
  double inv_tau;
  bool has_targets;  // losses: row i's target column i + target_offset is kept out of the sums
  std::int64_t target_offset;
  TermFlags terms;
  // LineStat-major statistics, stats[k·stride + line] (csrc/kernels/line_terms.h); nullptr for a
  // direction not computed. Rows are indexed row0 + i, columns j.
  double* row_stats;
  std::int64_t row_stride;
  double* col_stats;
  std::int64_t col_stride;
  // Workspace (strip_plan.h): (col_blocks, kStatSlots, s.rows) and (row_groups, kStatSlots, s.cols),
  // row_groups = min(row_groups_for(s.rows, col_blocks), max_row_groups) (StripPlan::row_groups).
  double* row_partial;
  double* col_partial;
  std::int64_t max_row_groups;
};

// Adds the strip's contributions to the statistics: row statistics of its rows are written (a row
// lies in one strip), column statistics are added to (every strip adds its rows, in strip order).
cudaError_t launch_forward_stats(const ForwardArgs& args, cudaStream_t stream);

struct BackwardArgs {
  SimilarityView s;
  int evidence;
  double inv_tau;
  std::int64_t target_offset;
  TermFlags terms;
  // The (kNumGradientFields, n) LineGradient arrays of all rows (indexed row0 + i) and columns
  // (csrc/kernels/line_finalise.h); zeros for a direction that is not computed. Column j of the
  // view is read at col_constants[f·n_cols + j]: a view of the op's columns [c0, c0 + cols) passes
  // col_constants + c0 (n_cols stays the arrays' stride) and target_offset − c0.
  const double* row_constants;
  std::int64_t n_rows;
  const double* col_constants;
  std::int64_t n_cols;
  // ∂L/∂s of the strip: element (i, j) at grad[i·grad_ld + j]. It may be s's own buffer (each
  // element is read, then overwritten, by the same thread).
  void* grad;
  ScalarKind grad_kind;
  std::int64_t grad_ld;
  // If not null: receives max |∂L/∂s| of the strip as the bits of a float (atomicMax on the bits
  // of non-negative floats: exact and order-independent). Must be zeroed before the launch.
  unsigned int* max_bits;
};

cudaError_t launch_gradient(const BackwardArgs& args, cudaStream_t stream);

// float16 tensor-core operands for the backward GEMMs: out = half(g·2^e) with 2^e the power of two
// that puts max |g| (from launch_gradient's max_bits) in [2^14, 2^15), so that neither end of
// ∂L/∂s leaves float16's range; alphas[0] = 2^-e, alphas[1] = 1, alphas[2] = 0 for cuBLAS in
// device pointer mode (the scale never reaches the host: no synchronisation).
cudaError_t launch_scale_to_half(const float* g, void* out, std::int64_t count, const unsigned int* max_bits,
                                 float* alphas, cudaStream_t stream);

// One direction's lines for the per-line kernels (mirrors generic::LineArrays).
struct LineSpec {
  const double* stats;        // (kNumLineStats, n)
  std::int64_t n;
  const double* scale;        // target scale of line i at scale[i + scale_offset], or nullptr (c = 1)
  std::int64_t scale_offset;
  double candidates;          // N of every line's Dirichlet
};

struct TermWeights {
  static constexpr int kTerms = 5;  // generic::kNumTerms (checked where TermWeights is filled)
  double weight[kTerms];
  bool enabled[kTerms];
};

// losses[i] = Σ_term weight·term of line i (float64); +inf where the line's strength overflowed
// double (reachable only when the host skipped the overflow check, see evidential_cuda.cpp).
cudaError_t launch_line_losses(const LineSpec& lines, const TermWeights& weights, double* losses,
                               cudaStream_t stream);

// The LineGradient constants of every line, upstream gradient upstream[i], into the
// (kNumGradientFields, n) array `constants`.
cudaError_t launch_line_gradients(const LineSpec& lines, const TermWeights& weights, const double* upstream,
                                  double* constants, cudaStream_t stream);

}  // namespace cuda
}  // namespace evidential_ops
