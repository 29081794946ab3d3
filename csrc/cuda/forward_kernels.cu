// Forward statistics of one strip of s (kernels.h: launch_forward_stats). Torch-free.
//
// Three launches per strip:
//   1. forward_stats_kernel: thread = column j, walking the rows of its row group. Per element:
//      evidence α, then what α contributes to the line statistics: element_forward (the CPU
//      kernels' double-precision math) for float64 views, the float32 element math for float32 and
//      half views (device_common.cuh: float32_evidence). The column's sums (float64) stay in
//      registers and end up in col_partial[group]; each row's sum over the block's 256 columns is a
//      warp butterfly plus a fixed-order sum over the 8 warps, into row_partial[column block]. The
//      target element of a row (column row0 + i + target_offset) is stored, not summed, as
//      α_target of its row and of its column (a unique writer for each).
//   2. reduce_row_partials: row i's statistics = Σ over column blocks, in block order.
//   3. reduce_col_partials: column j's statistics += Σ over row groups, in group order.
#include "device_common.cuh"

namespace evidential_ops {
namespace cuda {
namespace {

constexpr int kRowChunk = 32;  // rows whose warp sums are staged in shared memory at a time

// Statistic slot k (LineStat k + 1: rest, kl_h, squares, fisher, log_trigamma, remainder) is
// accumulated by a call with these terms.
__host__ __device__ constexpr bool slot_enabled(int k, bool kl, bool fmse, bool logdet) {
  return k == 0 || k == 2 || (k == 1 && kl) || (k == 3 && fmse) || ((k == 4 || k == 5) && logdet);
}

inline int slot_mask(const TermFlags& t) {
  int mask = 0;
  for (int k = 0; k < kStatSlots; ++k) mask |= slot_enabled(k, t.kl, t.fmse, t.logdet) ? (1 << k) : 0;
  return mask;
}

// α of one element, (α·kSquareScale)² and its special functions.
struct ElementStats {
  double alpha;
  double square;
  kn::ElementForward f;
};

template <bool kKl, bool kFmse, bool kLogdet>
__device__ __forceinline__ ElementStats element_stats_f64(double alpha) {
  const double scaled = alpha * kn::kSquareScale;
  return ElementStats{alpha, scaled * scaled, kn::element_forward<kKl, kFmse, kLogdet>(alpha)};
}

// The float32 path's elements whose α exceeds FLT_MAX.
template <bool kKl, bool kFmse, bool kLogdet>
__device__ EO_OUT_OF_LINE ElementStats element_stats_beyond_float(double alpha) {
  return element_stats_f64<kKl, kFmse, kLogdet>(alpha);
}

// The float32 path's α of one element (device_common.cuh: float32_evidence) and its statistics.
template <bool kKl, bool kFmse, bool kLogdet>
__device__ __forceinline__ ElementStats element_stats_f32(const ForwardArgs& a, std::int64_t i, std::int64_t j,
                                                          bool target, float inv_tau_f) {
  const float s = load_similarity<float>(a.s, i, j);
  const ElementEvidence e = float32_evidence(evidence_of(a.evidence, s * inv_tau_f), a.evidence, s, a.inv_tau, target);
  if (e.beyond) return element_stats_beyond_float<kKl, kFmse, kLogdet>(e.alpha);
  return ElementStats{e.alpha, kn::square_statistic(e.alpha_f),
                      kn::widen_from_float(e.alpha_f, kn::element_forward_f32<kKl, kFmse, kLogdet>(e.alpha_f))};
}

// Element (line, j)'s contributions c[k] to the statistic slots; a target's α is stored instead.
template <bool kKl, bool kFmse, bool kLogdet>
__device__ __forceinline__ void add_element(const ForwardArgs& a, std::int64_t line, std::int64_t j, bool target,
                                            double alpha, double square, const kn::ElementForward& f,
                                            double c[kStatSlots]) {
  // Selects, not 0/1 masks: 0·∞ would turn an overflowed target into NaN and hide the overflow
  // the host reports.
  c[0] = target ? 0.0 : alpha;
  c[2] = target ? 0.0 : square;
  if (kKl) c[1] = target ? 0.0 : f.kl_h;
  if (kFmse) c[3] = target ? 0.0 : f.fisher;
  if (kLogdet) {
    c[4] = f.log_trigamma;
    c[5] = f.remainder;
  }
  if (target) {
    if (a.row_stats != nullptr) a.row_stats[kn::kTargetAlpha * a.row_stride + line] = alpha;
    if (a.col_stats != nullptr) a.col_stats[kn::kTargetAlpha * a.col_stride + j] = alpha;
  }
}

template <bool kFloat32, bool kKl, bool kFmse, bool kLogdet>
__global__ void __launch_bounds__(kThreads, element_min_blocks(kFloat32)) forward_stats_kernel(const ForwardArgs a) {
  __shared__ double warp_sums[kRowChunk][kStatSlots][kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = j < a.s.cols;
  const bool want_rows = a.row_partial != nullptr;  // uniform over the launch
  const RowRange range = group_rows(a.s.rows);
  const float inv_tau_f = static_cast<float>(a.inv_tau);  // narrowed once (float32 path only)

  double column[kStatSlots];
#pragma unroll
  for (int k = 0; k < kStatSlots; ++k) column[k] = 0.0;

  for (std::int64_t chunk = range.begin; chunk < range.end; chunk += kRowChunk) {
    const int n = static_cast<int>(range.end - chunk < kRowChunk ? range.end - chunk : kRowChunk);
    for (int r = 0; r < n; ++r) {
      const std::int64_t i = chunk + r;
      double c[kStatSlots];
#pragma unroll
      for (int k = 0; k < kStatSlots; ++k) c[k] = 0.0;
      if (active) {
        if constexpr (kFloat32) {
          const std::int64_t line = a.s.row0 + i;
          const bool target = a.has_targets && line + a.target_offset == j;
          const ElementStats e = element_stats_f32<kKl, kFmse, kLogdet>(a, i, j, target, inv_tau_f);
          add_element<kKl, kFmse, kLogdet>(a, line, j, target, e.alpha, e.square, e.f, c);
        } else {
          const double alpha = evidence_of(a.evidence, load_similarity<double>(a.s, i, j) * a.inv_tau).alpha;
          const std::int64_t line = a.s.row0 + i;
          const bool target = a.has_targets && line + a.target_offset == j;
          const kn::ElementForward f = kn::element_forward<kKl, kFmse, kLogdet>(alpha);
          const double scaled = alpha * kn::kSquareScale;
          add_element<kKl, kFmse, kLogdet>(a, line, j, target, alpha, scaled * scaled, f, c);
        }
#pragma unroll
        for (int k = 0; k < kStatSlots; ++k) column[k] += c[k];
      }
      if (want_rows) {
#pragma unroll
        for (int k = 0; k < kStatSlots; ++k) {
          if (slot_enabled(k, kKl, kFmse, kLogdet)) {
            const double v = warp_sum(c[k]);
            if (lane == 0) warp_sums[r][k][warp] = v;
          }
        }
      }
    }
    if (want_rows) {
      __syncthreads();
      for (int t = threadIdx.x; t < n * kStatSlots; t += kThreads) {
        const int r = t / kStatSlots, k = t % kStatSlots;
        if (slot_enabled(k, kKl, kFmse, kLogdet)) {
          double sum = 0.0;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum += warp_sums[r][k][w];
          a.row_partial[(static_cast<std::int64_t>(blockIdx.x) * kStatSlots + k) * a.s.rows + chunk + r] = sum;
        }
      }
      __syncthreads();
    }
  }
  if (active && a.col_partial != nullptr) {
#pragma unroll
    for (int k = 0; k < kStatSlots; ++k) {
      if (slot_enabled(k, kKl, kFmse, kLogdet)) {
        a.col_partial[(static_cast<std::int64_t>(blockIdx.y) * kStatSlots + k) * a.s.cols + j] = column[k];
      }
    }
  }
}

__global__ void reduce_row_partials(const ForwardArgs a, std::int64_t col_blocks, int mask) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.s.rows) return;
  for (int k = 0; k < kStatSlots; ++k) {
    if (!((mask >> k) & 1)) continue;
    double sum = 0.0;
    for (std::int64_t b = 0; b < col_blocks; ++b) sum += a.row_partial[(b * kStatSlots + k) * a.s.rows + i];
    a.row_stats[(k + 1) * a.row_stride + a.s.row0 + i] = sum;
  }
}

__global__ void reduce_col_partials(const ForwardArgs a, std::int64_t groups, int mask) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.s.cols) return;
  for (int k = 0; k < kStatSlots; ++k) {
    if (!((mask >> k) & 1)) continue;
    double sum = 0.0;
    for (std::int64_t g = 0; g < groups; ++g) sum += a.col_partial[(g * kStatSlots + k) * a.s.cols + j];
    a.col_stats[(k + 1) * a.col_stride + j] += sum;
  }
}

template <bool kFloat32, bool kKl, bool kFmse, bool kLogdet>
void launch_stats_kernel(const ForwardArgs& a, dim3 grid, cudaStream_t stream) {
  EO_LAUNCH(grid, kThreads, stream, forward_stats_kernel<kFloat32, kKl, kFmse, kLogdet>)(a);
}

template <bool kFloat32>
void launch_stats_kernel(const ForwardArgs& a, dim3 grid, cudaStream_t stream) {
  switch ((a.terms.kl ? 1 : 0) | (a.terms.fmse ? 2 : 0) | (a.terms.logdet ? 4 : 0)) {
    case 0: launch_stats_kernel<kFloat32, false, false, false>(a, grid, stream); break;
    case 1: launch_stats_kernel<kFloat32, true, false, false>(a, grid, stream); break;
    case 2: launch_stats_kernel<kFloat32, false, true, false>(a, grid, stream); break;
    case 3: launch_stats_kernel<kFloat32, true, true, false>(a, grid, stream); break;
    case 4: launch_stats_kernel<kFloat32, false, false, true>(a, grid, stream); break;
    case 5: launch_stats_kernel<kFloat32, true, false, true>(a, grid, stream); break;
    case 6: launch_stats_kernel<kFloat32, false, true, true>(a, grid, stream); break;
    default: launch_stats_kernel<kFloat32, true, true, true>(a, grid, stream); break;
  }
}

}  // namespace

cudaError_t launch_forward_stats(const ForwardArgs& a, cudaStream_t stream) {
  if (a.s.rows <= 0 || a.s.cols <= 0) return cudaSuccess;
  ForwardArgs args = a;
  // Partials only where that direction is wanted.
  if (args.row_stats == nullptr) args.row_partial = nullptr;
  if (args.col_stats == nullptr) args.col_partial = nullptr;
  const dim3 grid = element_grid(args.s.rows, args.s.cols, args.max_row_groups);
  if (float32_elements(args.s, args.inv_tau)) {
    launch_stats_kernel<true>(args, grid, stream);
  } else {
    launch_stats_kernel<false>(args, grid, stream);
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const int mask = slot_mask(args.terms);
  constexpr int kReduceThreads = 256;
  if (args.row_partial != nullptr) {
    const auto blocks = static_cast<unsigned int>(ceil_div(args.s.rows, kReduceThreads));
    EO_LAUNCH(blocks, kReduceThreads, stream, reduce_row_partials)(args, grid.x, mask);
    if ((status = cudaGetLastError()) != cudaSuccess) return status;
  }
  if (args.col_partial != nullptr) {
    const auto blocks = static_cast<unsigned int>(ceil_div(args.s.cols, kReduceThreads));
    EO_LAUNCH(blocks, kReduceThreads, stream, reduce_col_partials)(args, grid.y, mask);
    if ((status = cudaGetLastError()) != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace evidential_ops
