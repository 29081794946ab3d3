// ∂L/∂s of one strip (kernels.h: launch_gradient, launch_scale_to_half). Torch-free.
//
// gradient_kernel: a thread takes column j (float64 views), or j, j + 32, j + 64 and j + 96
// (float32 and half views: kColumnsPerThread), their LineGradient constants held in registers,
// walking the rows of its row group. Per element: evidence α and ρ = g'(x)/α, the per-element
// factors of the gradient, then ∂L/∂s = (row share + column share)·ρ/τ, stored in the output's
// type. Float64
// views: element_backward and line_share in double, exactly the CPU kernels' expression. Float32
// and half views: the float32 element math, and the line constants narrowed to float once per line
// (the column's in registers, the rows' staged in shared memory a chunk at a time), so no FP64
// multiply remains per element; a line's target, an element whose α exceeds FLT_MAX, or one whose
// float coefficient is not finite (a line constant beyond FLT_MAX) is redone after its chunk of
// rows (rare_chunk_gradients): α in double from float arithmetic, and the line shares in double
// where float cannot hold them. Nothing is reduced except, for
// float16 operands, max |∂L/∂s| (an integer atomicMax on float bits: exact in any order).
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

constexpr int kRowChunk = 32;  // rows whose narrowed constants are staged in shared memory at a time

// On the float32 path a thread takes kColumnsPerThread of its block's kThreads columns (j0 + 32c,
// so a warp's loads of one c are consecutive), the forward's layout: a row's narrowed constants
// (read from shared memory) and the row loop's own offsets and branch then serve that many
// elements (`python bench/static_profile.py --direction bwd`: TCL 118 -> 104.8 instructions per
// element). Blocks still cover kThreads columns each (element_grid), with fewer threads; 512
// resident threads per multiprocessor (float32_min_blocks), 384 for the instantiations
// roomy_gradient names. The float64 path keeps one column per thread and no minimum.
constexpr int kColumnsPerThread = 4;
__host__ __device__ constexpr int gradient_columns(bool float32) { return float32 ? kColumnsPerThread : 1; }
__host__ __device__ constexpr int gradient_threads(bool float32) { return kThreads / gradient_columns(float32); }
__host__ __device__ constexpr int gradient_min_blocks(bool float32, bool roomy) {
  return float32 ? float32_min_blocks(gradient_threads(true), roomy) : 0;
}
// Instantiations given up to 170 registers (384 threads per multiprocessor): the KL with another
// term (no method's set), the Fisher and logdet terms together (UML's set) for the maps other
// than UML's exp_tanh, and the generic ones (any evidence, any stored type), which spilled 8 to 20
// bytes at 128 (ptxas -v).
__host__ __device__ constexpr bool roomy_gradient(int evidence, bool kl, bool fmse, bool logdet) {
  return evidence == kAnyEvidence || (kl && (fmse || logdet)) ||
         (fmse && logdet && evidence != static_cast<int>(kn::EvidenceKind::kExpTanh));
}
static_assert(kThreads / kColumnsPerThread >= kRowChunk, "a thread per row of a chunk stages its constants");

// ∂L/∂s of one element of the float32 path in double, for its rare elements (α beyond FLT_MAX, a
// non-finite float coefficient): the float64 path's line_share on both lines' constants read from
// memory, at α and ρ in double, with the element factors of the float32 functions (of ln α beyond
// FLT_MAX) widened: the double products of line_share and ρ/τ are its only FP64 multiplies. Out of
// line, so that its caller (rare_chunk_gradients) does not hold registers for it.
template <bool kKl, bool kFmse, bool kLogdet>
__device__ EO_OUT_OF_LINE double element_gradient_f64(const double* row_constants, std::int64_t n_rows,
                                                      const double* col_constants, std::int64_t n_cols,
                                                      std::int64_t line, std::int64_t j, const kn::RareEvidence r,
                                                      bool on, double inv_tau) {
  const double on_target = on ? 1.0 : 0.0;
  const double off = 1.0 - on_target;
  const kn::ElementBackward f = kn::widen(r.beyond ? kn::element_backward_f32_of_log<kKl, kFmse, kLogdet>(r.log_alpha)
                                                   : kn::element_backward_f32<kKl, kFmse, kLogdet>(r.alpha_f));
  const kn::LineGradient row = kn::load_line_gradient(kn::gradient_arrays(row_constants, n_rows), line);
  const kn::LineGradient column = kn::load_line_gradient(kn::gradient_arrays(col_constants, n_cols), j);
  const double coefficient =
      kn::line_share(r.alpha, off, on_target, f, row) + kn::line_share(r.alpha, off, on_target, f, column);
  return coefficient * r.rho * inv_tau;
}

// A rare element of the float32 path: a line's target or an α beyond float32 (`refined`: α and ρ
// from evidence.h rare_evidence, x = s/τ split into two floats; device_common.cuh: float32
// evidence), or one whose float gradient came out non-finite (a line constant beyond FLT_MAX; α
// and ρ the float map's). For a refined α within float32, the float gradient as the loop forms it
// (the lines' constants narrowed again, the same values) at float(α); in double where α exceeds
// FLT_MAX or that gradient is not finite (element_gradient_f64, at float(α) and float(ρ) within
// FLT_MAX). The loop's own non-finite float gradient is not formed again: the same inputs would give
// it again. Called from rare_chunk_gradients, out of the row loop; out of line itself too (inlined
// there, ptxas spilled 4-8 bytes in three instantiations). (The arguments' members by value: a
// reference to the kernel's parameters would copy them all to a stack frame.)
template <bool kKl, bool kFmse, bool kLogdet>
__device__ EO_OUT_OF_LINE float rare_element_gradient(int evidence, double inv_tau, const double* row_constants,
                                                      std::int64_t n_rows, const double* col_constants,
                                                      std::int64_t n_cols, std::int64_t line, std::int64_t j,
                                                      float s, bool on, bool refined, float inv_tau_f,
                                                      float inv_tau_lo) {
  const kn::EvidenceValueF32 v = evidence_of(evidence, s * inv_tau_f);
  kn::RareEvidence r{v.alpha, v.rho, v.alpha, 0.0f, false};
  if (refined) {
    r = kn::rare_evidence_of_kind(evidence, v, kn::split_product(s, inv_tau_f, inv_tau_lo), s, inv_tau_f);
    if (!r.beyond) {
      const float rho_f = static_cast<float>(r.rho);
      const float g = kn::element_gradient_f32<kKl, kFmse, kLogdet>(
          r.alpha_f, rho_f, on, inv_tau_f, kn::element_backward_f32<kKl, kFmse, kLogdet>(r.alpha_f),
          kn::narrow_line_gradient(kn::load_line_gradient(kn::gradient_arrays(row_constants, n_rows), line)),
          kn::narrow_line_gradient(kn::load_line_gradient(kn::gradient_arrays(col_constants, n_cols), j)));
      if (fabsf(g) <= kFloatMaxF) return g;
      r.alpha = r.alpha_f;  // the double redo at the float values, as the loop's elements
      r.rho = rho_f;
    }
  }
  return static_cast<float>(element_gradient_f64<kKl, kFmse, kLogdet>(row_constants, n_rows, col_constants, n_cols,
                                                                      line, j, r, on, inv_tau));
}

// The float32 path's rare elements of a chunk of rows of column j (bit r of `rare`: row chunk + r),
// which the row loop marks and does not store: each redone by rare_element_gradient and stored.
// Returns their largest |∂L/∂s|. One out-of-line call per chunk that has any (a line's target
// comes once per row): the row loop then holds neither the call's arguments nor its moves (the
// per-element call was a tenth of the loop's instructions: `python bench/static_profile.py
// --direction bwd` before and after). s is read again here, so an in-place ∂L/∂s (grad = s's
// buffer) must not have been written at these elements: the loop skips their stores.
template <typename SStored, typename GStored, bool kKl, bool kFmse, bool kLogdet>
__device__ EO_OUT_OF_LINE float rare_chunk_gradients(const SimilarityView s, int evidence, double inv_tau,
                                                     const double* row_constants, std::int64_t n_rows,
                                                     const double* col_constants, std::int64_t n_cols, void* grad,
                                                     ScalarKind grad_kind, std::int64_t grad_ld, std::int64_t chunk,
                                                     std::int64_t j, std::int64_t target_delta, unsigned int rare,
                                                     float inv_tau_f, float inv_tau_lo) {
  float largest = 0.0f;
  for (int r = 0; r < 32; ++r) {
    if (!((rare >> r) & 1u)) continue;
    const std::int64_t i = chunk + r;
    const float value = load_similarity<float, SStored>(s, i * s.row_stride + j * s.col_stride);
    const bool on = target_delta + r == 0;
    // The row loop's test, made again here rather than inside rare_element_gradient (which then
    // evaluates the float map a second time where it is false): moved there, ptxas spilled 8-32
    // bytes in twelve of the sm_80 gradient kernels.
    const bool refined = on || !(evidence_of(evidence, value * inv_tau_f).alpha < kInfinityF);
    const float g = rare_element_gradient<kKl, kFmse, kLogdet>(evidence, inv_tau, row_constants, n_rows,
                                                               col_constants, n_cols, s.row0 + i, j, value, on,
                                                               refined, inv_tau_f, inv_tau_lo);
    store_gradient<GStored>(grad, grad_kind, i * grad_ld + j, g);
    largest = fmaxf(largest, fabsf(g));
  }
  return largest;
}

template <bool kFloat32, typename SStored, typename GStored, int kEvidence, bool kKl, bool kFmse, bool kLogdet>
__global__ void __launch_bounds__(gradient_threads(kFloat32),
                                  gradient_min_blocks(kFloat32, roomy_gradient(kEvidence, kKl, kFmse, kLogdet)))
    gradient_kernel(const BackwardArgs a) {
  const RowRange range = group_rows(a.s.rows);
  const kn::LineGradientArrays rows = kn::gradient_arrays(a.row_constants, a.n_rows);
  float largest = 0.0f;
  if constexpr (kFloat32) {
    constexpr int kColumns = gradient_columns(true);
    __shared__ kn::LineGradientF32 row_lines[kRowChunk];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kThreads + warp * 32 * kColumns + lane;
    // The thread's columns inside the strip: the first `columns` of its kColumns.
    const std::int64_t beyond = a.s.cols - j0;
    const int columns =
        beyond <= 0 ? 0 : (beyond >= 32 * (kColumns - 1) + 1 ? kColumns : static_cast<int>((beyond + 31) / 32));
    kn::LineGradientF32 column[kColumns];
#pragma unroll
    for (int cc = 0; cc < kColumns; ++cc) {
      column[cc] = kn::narrow_line_gradient(
          cc < columns ? kn::load_line_gradient(kn::gradient_arrays(a.col_constants, a.n_cols), j0 + 32 * cc)
                       : zero_line_gradient());
    }
    const float inv_tau_f = static_cast<float>(a.inv_tau);
    const float inv_tau_lo = static_cast<float>(a.inv_tau - static_cast<double>(inv_tau_f));  // rare elements' x
    const bool of_tanh = tanh_evidence<kEvidence>(a.evidence);  // uniform over the launch
    const std::int64_t s_step = 32 * a.s.col_stride;  // from column cc to cc + 1
    // s of the row after the one being evaluated, loaded a row ahead (load_row_values)
    float ahead[kColumns] = {};
    if (range.begin < range.end) {
      load_row_values<SStored, kColumns>(ahead, a.s, range.begin * a.s.row_stride + j0 * a.s.col_stride, s_step,
                                         columns);
    }
    for (std::int64_t chunk = range.begin; chunk < range.end; chunk += kRowChunk) {
      const int n = static_cast<int>(range.end - chunk < kRowChunk ? range.end - chunk : kRowChunk);
      if (static_cast<int>(threadIdx.x) < n) {
        row_lines[threadIdx.x] = kn::narrow_line_gradient(kn::load_line_gradient(rows, a.s.row0 + chunk + threadIdx.x));
      }
      __syncthreads();
      // Offsets of (chunk, j0) in s and in ∂L/∂s, and (chunk's target column) − j0, advanced by a
      // row at a time: additions, not 64-bit multiplies, per element.
      std::int64_t s_at = chunk * a.s.row_stride + j0 * a.s.col_stride;
      std::int64_t grad_at = chunk * a.grad_ld + j0;
      const std::int64_t chunk_target_delta = a.s.row0 + chunk + a.target_offset - j0;
      std::int64_t target_delta = chunk_target_delta;
      unsigned int rare[kColumns] = {};  // per column: the chunk's rare elements (rare_chunk_gradients)
      unsigned int row_bit = 1;          // bit r
      static_assert(kRowChunk <= 32, "a chunk's rare elements are the bits of an unsigned int");
      for (int r = 0; columns > 0 && r < n;
           ++r, s_at += a.s.row_stride, grad_at += a.grad_ld, ++target_delta, row_bit <<= 1) {
        const kn::LineGradientF32 row = row_lines[r];
        float values[kColumns];  // this row's s, loaded a row ago
#pragma unroll
        for (int cc = 0; cc < kColumns; ++cc) values[cc] = ahead[cc];
        if (chunk + r + 1 < range.end) {  // the thread's next row
          load_row_values<SStored, kColumns>(ahead, a.s, s_at + a.s.row_stride, s_step, columns);
        }
#pragma unroll
        for (int cc = 0; cc < kColumns; ++cc) {
          if (cc >= columns) break;
          const bool on = target_delta == 32 * cc;
          const kn::EvidenceValueF32 v = evidence_of<kEvidence>(a.evidence, values[cc] * inv_tau_f);
          const bool refined = on || !(v.alpha < kInfinityF);  // NaN too: NaN either way
          float g = 0.0f;
          if (!refined) {
            if (of_tanh) {  // exp_tanh: the functions from t = tanh x
              g = kn::element_gradient_f32<kKl, kFmse, kLogdet>(
                  v.alpha, v.rho, on, inv_tau_f, kn::element_backward_f32_of_tanh<kKl, kFmse, kLogdet>(v.tanh), row,
                  column[cc]);
            } else {
              g = kn::element_gradient_f32<kKl, kFmse, kLogdet>(v.alpha, v.rho, on, inv_tau_f,
                                                            kn::element_backward_f32<kKl, kFmse, kLogdet>(v.alpha),
                                                            row, column[cc]);
            }
          }
          if (refined || !(fabsf(g) <= kFloatMaxF)) {
            rare[cc] |= row_bit;  // stored after the chunk's rows
          } else {
            store_gradient<GStored>(a.grad, a.grad_kind, grad_at + 32 * cc, g);
            largest = fmaxf(largest, fabsf(g));  // fmaxf drops NaN: NaN propagates anyway
          }
        }
      }
#pragma unroll
      for (int cc = 0; cc < kColumns; ++cc) {
        if (rare[cc] != 0) {
          largest = fmaxf(largest, rare_chunk_gradients<SStored, GStored, kKl, kFmse, kLogdet>(
                                       a.s, a.evidence, a.inv_tau, a.row_constants, a.n_rows, a.col_constants,
                                       a.n_cols, a.grad, a.grad_kind, a.grad_ld, chunk, j0 + 32 * cc,
                                       chunk_target_delta - 32 * cc, rare[cc], inv_tau_f, inv_tau_lo));
        }
      }
      __syncthreads();
    }
  } else {
    const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const bool active = j < a.s.cols;
    const kn::LineGradient column =
        active ? kn::load_line_gradient(kn::gradient_arrays(a.col_constants, a.n_cols), j) : zero_line_gradient();
    if (active) {
      for (std::int64_t i = range.begin; i < range.end; ++i) {
        const std::int64_t line = a.s.row0 + i;
        const kn::EvidenceValue v = evidence_of(a.evidence, load_similarity<double>(a.s, i * a.s.row_stride + j * a.s.col_stride) * a.inv_tau);
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
  }
  if (a.max_bits != nullptr) {  // uniform over the launch
    constexpr int kGradientWarps = gradient_threads(kFloat32) / 32;
    __shared__ float warp_largest[kGradientWarps];
    largest = warp_max(largest);
    if ((threadIdx.x & 31) == 0) warp_largest[threadIdx.x >> 5] = largest;
    __syncthreads();
    if (threadIdx.x == 0) {
      float block = 0.0f;
      for (int w = 0; w < kGradientWarps; ++w) block = fmaxf(block, warp_largest[w]);
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

template <bool kFloat32, typename SStored, typename GStored, int kEvidence>
void launch_gradient_kernel(const BackwardArgs& a, dim3 grid, cudaStream_t stream) {
  kn::with_term_flags(a.terms, [&](auto kl, auto fmse, auto logdet) {
    EO_LAUNCH(grid, gradient_threads(kFloat32), stream,
              gradient_kernel<kFloat32, SStored, GStored, kEvidence, decltype(kl)::value, decltype(fmse)::value,
                              decltype(logdet)::value>)(a);
  });
}

// The float32 path with s stored as float32 and ∂L/∂s as `GStored`, its evidence map compiled in.
template <typename GStored>
void launch_float32_stored(const BackwardArgs& a, dim3 grid, cudaStream_t stream) {
  kn::with_evidence_kind(a.evidence, [&](auto evidence) {
    launch_gradient_kernel<true, float, GStored, static_cast<int>(decltype(evidence)::value)>(a, grid, stream);
  });
}

}  // namespace

cudaError_t launch_gradient(const BackwardArgs& a, cudaStream_t stream) {
  if (a.s.rows <= 0 || a.s.cols <= 0) return cudaSuccess;
  const dim3 grid = element_grid(a.s.rows, a.s.cols);
  // The pairs of stored types every product of embeddings takes (s float32; ∂L/∂s float32, or
  // bfloat16 for bfloat16 inputs) with the evidence map compiled in, so that the element loop holds
  // no run-time switch; other pairs (a given half s) and the float64 path switch per element.
  const bool float32_s = a.s.kind == ScalarKind::kFloat32;
  if (float32_elements(a.s, a.inv_tau) && float32_s && a.grad_kind == ScalarKind::kFloat32) {
    launch_float32_stored<float>(a, grid, stream);
  } else if (float32_elements(a.s, a.inv_tau) && float32_s && a.grad_kind == ScalarKind::kBFloat16) {
    launch_float32_stored<__nv_bfloat16>(a, grid, stream);
  } else if (float32_elements(a.s, a.inv_tau)) {
    launch_gradient_kernel<true, AnyStored, AnyStored, kAnyEvidence>(a, grid, stream);
  } else {
    launch_gradient_kernel<false, AnyStored, AnyStored, kAnyEvidence>(a, grid, stream);
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
