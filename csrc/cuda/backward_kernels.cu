// ∂L/∂s of one strip (kernels.h: launch_gradient, launch_scale_to_half). Torch-free.
//
// gradient_kernel: thread = column j (its LineGradient constants held in registers), walking the
// rows of its row group. Per element: evidence α and ρ = g'(x)/α, the per-element factors of the
// gradient (element_backward), then ∂L/∂s = (row share + column share)·ρ/τ, exactly the CPU
// kernels' double-precision expression, stored in the output's type. Nothing is reduced except,
// for float16 operands, max |∂L/∂s| (an integer atomicMax on float bits: exact in any order).
#include "device_common.cuh"

namespace evidential_ops {
namespace cuda {
namespace {

__device__ __forceinline__ kn::LineGradient zero_line_gradient() {
  kn::LineGradient g;
  g.inv_strength = g.all = g.off = g.square = g.fisher = g.kl_v = g.logdet_ratio = g.logdet_remainder = g.target =
      0.0;
  return g;
}

template <bool kKl, bool kFmse, bool kLogdet>
__global__ void __launch_bounds__(kThreads) gradient_kernel(const BackwardArgs a) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = j < a.s.cols;
  const RowRange range = group_rows(a.s.rows);
  const kn::LineGradientArrays rows = kn::gradient_arrays(a.row_constants, a.n_rows);
  const kn::LineGradient column =
      active ? kn::load_line_gradient(kn::gradient_arrays(a.col_constants, a.n_cols), j) : zero_line_gradient();
  float largest = 0.0f;
  if (active) {
    for (std::int64_t i = range.begin; i < range.end; ++i) {
      const std::int64_t line = a.s.row0 + i;
      const kn::EvidenceValue v = evidence_of(a.evidence, load_similarity(a.s, i, j) * a.inv_tau);
      const double on_target = line + a.target_offset == j ? 1.0 : 0.0;
      const double off = 1.0 - on_target;
      const kn::ElementBackward f = kn::element_backward<kKl, kFmse, kLogdet>(v.alpha);
      const kn::LineGradient row = kn::load_line_gradient(rows, line);
      const double coefficient =
          kn::line_share(v.alpha, off, on_target, f, row) + kn::line_share(v.alpha, off, on_target, f, column);
      const double g = coefficient * v.rho * a.inv_tau;  // ∂L/∂s = (α∂L/∂α)·(g'(x)/α)·(1/τ)
      store_gradient(a.grad, a.grad_kind, i * a.grad_ld + j, g);
      largest = fmaxf(largest, fabsf(static_cast<float>(g)));  // fmaxf drops NaN: NaN propagates anyway
    }
  }
  if (a.max_bits != nullptr) {  // uniform over the launch
    __shared__ float warp_largest[kWarps];
    largest = warp_max(largest);
    if ((threadIdx.x & 31) == 0) warp_largest[threadIdx.x >> 5] = largest;
    __syncthreads();
    if (threadIdx.x == 0) {
      float block = 0.0f;
      for (int w = 0; w < kWarps; ++w) block = fmaxf(block, warp_largest[w]);
      atomicMax(a.max_bits, __float_as_uint(block));  // non-negative floats order like their bits
    }
  }
}

__global__ void scale_to_half_kernel(const float* g, __half* out, std::int64_t count, const unsigned int* max_bits,
                                     float* alphas) {
  const float largest = __uint_as_float(*max_bits);
  int exponent = 0;  // largest = f·2^exponent, f in [0.5, 1)
  int shift = 0;
  if (largest > 0.0f && largest <= 3.4028234663852886e38f) {
    frexpf(largest, &exponent);
    shift = 15 - exponent;  // largest·2^shift in [2^14, 2^15): far from 65504 and from the subnormals
    shift = shift > 126 ? 126 : (shift < -126 ? -126 : shift);
  }
  const float scale = ldexpf(1.0f, shift);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    alphas[0] = ldexpf(1.0f, -shift);
    alphas[1] = 1.0f;
    alphas[2] = 0.0f;
  }
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < count; k += stride) {
    out[k] = __float2half_rn(g[k] * scale);
  }
}

template <bool kKl, bool kFmse, bool kLogdet>
void launch_gradient_kernel(const BackwardArgs& a, dim3 grid, cudaStream_t stream) {
  EO_LAUNCH(grid, kThreads, stream, gradient_kernel<kKl, kFmse, kLogdet>)(a);
}

}  // namespace

cudaError_t launch_gradient(const BackwardArgs& a, cudaStream_t stream) {
  if (a.s.rows <= 0 || a.s.cols <= 0) return cudaSuccess;
  const dim3 grid = element_grid(a.s.rows, a.s.cols);
  switch ((a.terms.kl ? 1 : 0) | (a.terms.fmse ? 2 : 0) | (a.terms.logdet ? 4 : 0)) {
    case 0: launch_gradient_kernel<false, false, false>(a, grid, stream); break;
    case 1: launch_gradient_kernel<true, false, false>(a, grid, stream); break;
    case 2: launch_gradient_kernel<false, true, false>(a, grid, stream); break;
    case 3: launch_gradient_kernel<true, true, false>(a, grid, stream); break;
    case 4: launch_gradient_kernel<false, false, true>(a, grid, stream); break;
    case 5: launch_gradient_kernel<true, false, true>(a, grid, stream); break;
    case 6: launch_gradient_kernel<false, true, true>(a, grid, stream); break;
    default: launch_gradient_kernel<true, true, true>(a, grid, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_scale_to_half(const float* g, void* out, std::int64_t count, const unsigned int* max_bits,
                                 float* alphas, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const std::int64_t blocks = count > 0 ? std::min<std::int64_t>(ceil_div(count, kBlock), 4096) : 1;
  EO_LAUNCH(static_cast<unsigned int>(blocks), kBlock, stream, scale_to_half_kernel)(g, static_cast<__half*>(out), count,
                                                                                    max_bits, alphas);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace evidential_ops
