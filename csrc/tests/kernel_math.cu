// Torch-free nvcc check of csrc/kernels/: every evidence kind, per-element term, special function
// and per-line finalisation called from __global__ kernels, so that `nvcc -c` proves the shared
// math builds for the GPU and `-Xptxas -v` reports what it costs in registers and spills
// (csrc/tests/nvcc_check.sh; CI runs it through `make test`). Compiled, not run: the values are
// tested on the CPU by test_kernels.cpp and, through the CUDA backend, by the Python suite.
#include "kernels/element_terms.h"
#include "kernels/evidence.h"
#include "kernels/line_finalise.h"
#include "kernels/special_functions_f32.h"

namespace kn = evidential_ops::generic;

namespace {

template <kn::EvidenceKind kKind>
__global__ void evidence_kernel(const double* x, double* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kn::EvidenceValue v = kn::evidence_value<kKind>(x[i]);
  out[2 * i] = v.alpha;
  out[2 * i + 1] = v.rho;
}

template <bool kKl, bool kFmse, bool kLogdet>
__global__ void element_kernel(const double* alpha, double* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kn::ElementForward f = kn::element_forward<kKl, kFmse, kLogdet>(alpha[i]);
  const kn::ElementBackward b = kn::element_backward<kKl, kFmse, kLogdet>(alpha[i]);
  out[8 * i + 0] = f.kl_h;
  out[8 * i + 1] = f.fisher;
  out[8 * i + 2] = f.log_trigamma;
  out[8 * i + 3] = f.remainder;
  out[8 * i + 4] = b.kl_v;
  out[8 * i + 5] = b.fisher_slope;
  out[8 * i + 6] = b.logdet_ratio;
  out[8 * i + 7] = b.logdet_r_prime;
}

__global__ void special_functions_kernel(const double* a, const double* r, double* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kn::Polygammas g = kn::polygammas(a[i]);
  const kn::FisherRemainder fr = kn::fisher_remainder(a[i], g);
  out[10 * i + 0] = kn::digamma(a[i]) + g.digamma;
  out[10 * i + 1] = kn::trigamma(a[i]) + kn::tetragamma(a[i]);
  out[10 * i + 2] = kn::lgamma_ge1(a[i]);
  out[10 * i + 3] = kn::kl_h(a[i]) + kn::kl_v(a[i]);
  out[10 * i + 4] = kn::log_trigamma(a[i], g);
  out[10 * i + 5] = fr.r + fr.r_prime + fr.x_r_prime;
  out[10 * i + 6] = kn::digamma_difference(a[i], r[i]);
  out[10 * i + 7] = kn::trigamma_difference(a[i], r[i]);
  out[10 * i + 8] = kn::exp_d(-a[i]) + kn::log_d(a[i]) + kn::log1p_d(r[i]);
  out[10 * i + 9] = g.x_trigamma + g.x2_tetragamma + g.lgamma;
}

// The float32 special functions (special_functions_f32.h, elementary_f32.h), every one read, from
// α and from ln α (the log-space entry).
__global__ void special_functions_f32_kernel(const float* a, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kn::PolygammasF32 g = kn::polygammas(a[i]);
  const kn::PolygammasF32 gl = kn::polygammas_of_log(a[i]);
  const kn::FisherRemainderF32 fr = kn::fisher_remainder(a[i], g);
  out[8 * i + 0] = g.digamma + g.lgamma + g.x_trigamma + g.x2_tetragamma;
  out[8 * i + 1] = kn::kl_h(a[i], g) + kn::kl_h_plus_one(a[i], g) + kn::x_kl_v(a[i], g);
  out[8 * i + 2] = kn::log_trigamma(a[i], g) + fr.r + fr.x_r_prime;
  out[8 * i + 3] = kn::fisher_slope(a[i], g) + kn::tetragamma_trigamma_ratio(g);
  out[8 * i + 4] = kn::kl_h(a[i], gl) + kn::log_trigamma(a[i], gl) + kn::x_kl_v(a[i], gl);
  out[8 * i + 5] = kn::fisher_remainder(a[i], gl).r + kn::fisher_slope(a[i], gl) + gl.digamma;
  out[8 * i + 6] = kn::exp_f(-a[i]) + kn::log_f(a[i]) + kn::log1p_f(a[i]);
  out[8 * i + 7] = kn::digamma(a[i]) + kn::lgamma_ge1(a[i]) + kn::kl_h(a[i]);
}

// The float32 element functions of element_terms.h, every term enabled.
__global__ void element_f32_kernel(const float* alpha, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kn::ElementForwardF32 f = kn::element_forward_f32<true, true, true>(alpha[i]);
  const kn::ElementBackwardF32 b = kn::element_backward_f32<true, true, true>(alpha[i]);
  out[8 * i + 0] = f.kl_h_plus_one;
  out[8 * i + 1] = f.x_trigamma;
  out[8 * i + 2] = f.log_trigamma;
  out[8 * i + 3] = f.remainder;
  out[8 * i + 4] = b.kl_v;
  out[8 * i + 5] = b.fisher_slope;
  out[8 * i + 6] = b.logdet_ratio;
  out[8 * i + 7] = b.logdet_r_prime;
  // The same per argument class (grouped elements).
  const kn::ElementForwardF32 f3 =
      kn::element_forward_f32<true, true, true>(alpha[i], kn::polygammas_of_class<kn::kSeriesClass>(alpha[i]));
  const kn::ElementBackwardF32 b0 =
      kn::element_backward_f32<true, true, true>(alpha[i], kn::polygammas_of_class<0>(alpha[i]));
  out[8 * i + 0] += f3.kl_h_plus_one + b0.fisher_slope;
}

// One thread per line: the loss and the gradient constants, every term enabled.
__global__ void line_kernel(const double* stats, const double* scale, std::int64_t n, const double* weight,
                            const double* upstream, double* losses, double* constants) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const bool enabled[kn::kNumTerms] = {true, true, true, true, true};
  double w[kn::kNumTerms];
  for (int k = 0; k < kn::kNumTerms; ++k) w[k] = weight[k];
  const kn::LineArrays lines{stats, n, scale, 0, static_cast<double>(n)};
  losses[i] = kn::line_loss(lines, i, w, enabled);
  kn::store_line_gradient(lines, i, w, enabled, upstream[i], constants);
  const kn::LineGradient g = kn::load_line_gradient(kn::gradient_arrays(constants, n), i);
  const kn::ElementBackward f = kn::element_backward<true, true, true>(stats[i]);
  losses[i] += kn::line_share(stats[i], 1.0, 0.0, f, g);
}

}  // namespace

// Host-side instantiation of every kernel, so nvcc compiles each one.
void instantiate_kernel_math_checks(const double* in, const double* in2, double* out, int n, const float* in_f32,
                                    float* out_f32) {
  evidence_kernel<kn::EvidenceKind::kExp><<<1, 32>>>(in, out, n);
  evidence_kernel<kn::EvidenceKind::kRelu><<<1, 32>>>(in, out, n);
  evidence_kernel<kn::EvidenceKind::kSoftplus><<<1, 32>>>(in, out, n);
  evidence_kernel<kn::EvidenceKind::kExpTanh><<<1, 32>>>(in, out, n);
  element_kernel<false, false, false><<<1, 32>>>(in, out, n);
  element_kernel<true, false, false><<<1, 32>>>(in, out, n);
  element_kernel<false, true, false><<<1, 32>>>(in, out, n);
  element_kernel<false, false, true><<<1, 32>>>(in, out, n);
  element_kernel<true, true, true><<<1, 32>>>(in, out, n);
  special_functions_kernel<<<1, 32>>>(in, in2, out, n);
  special_functions_f32_kernel<<<1, 32>>>(in_f32, out_f32, n);
  element_f32_kernel<<<1, 32>>>(in_f32, out_f32, n);
  line_kernel<<<1, 32>>>(in, in2, n, in2, in2, out, out + n);
}
