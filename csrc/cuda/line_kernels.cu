// Per-line kernels (kernels.h: launch_line_losses, launch_line_gradients): one thread per row or
// column, the CPU's per-line finalisation (csrc/kernels/line_finalise.h) in double. Torch-free.
#include "device_common.cuh"

namespace evidential_ops {
namespace cuda {
namespace {

constexpr int kLineThreads = 128;

__device__ __forceinline__ kn::LineArrays line_arrays(const LineSpec& s) {
  return kn::LineArrays{s.stats, s.n, s.scale, s.scale_offset, s.candidates};
}

__global__ void __launch_bounds__(kLineThreads) line_losses_kernel(const LineSpec spec, const TermWeights w,
                                                                   double* losses) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kLineThreads + threadIdx.x;
  if (i >= spec.n) return;
  const double strength = spec.stats[kn::kTargetAlpha * spec.n + i] + spec.stats[kn::kRest * spec.n + i];
  // line_terms() returns zeros for an overflowed strength (the CPU raises before it is reached);
  // here an overflow the host did not check for shows as +inf instead of a plausible loss.
  losses[i] = strength > 1.7976931348623157e308 ? __longlong_as_double(0x7ff0000000000000LL)
                                                : kn::line_loss(line_arrays(spec), i, w.weight, w.enabled);
}

__global__ void __launch_bounds__(kLineThreads) line_gradients_kernel(const LineSpec spec, const TermWeights w,
                                                                      const double* upstream, double* constants) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kLineThreads + threadIdx.x;
  if (i >= spec.n) return;
  kn::store_line_gradient(line_arrays(spec), i, w.weight, w.enabled, upstream[i], constants);
}

unsigned int line_blocks(std::int64_t n) { return static_cast<unsigned int>(ceil_div(n, kLineThreads)); }

}  // namespace

cudaError_t launch_line_losses(const LineSpec& lines, const TermWeights& weights, double* losses,
                               cudaStream_t stream) {
  if (lines.n <= 0) return cudaSuccess;
  EO_LAUNCH(line_blocks(lines.n), kLineThreads, stream, line_losses_kernel)(lines, weights, losses);
  return cudaGetLastError();
}

cudaError_t launch_line_gradients(const LineSpec& lines, const TermWeights& weights, const double* upstream,
                                  double* constants, cudaStream_t stream) {
  if (lines.n <= 0) return cudaSuccess;
  EO_LAUNCH(line_blocks(lines.n), kLineThreads, stream, line_gradients_kernel)(lines, weights, upstream, constants);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace evidential_ops
