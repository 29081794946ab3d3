// CUDA implementations of the evidential_ops operators (schemas in csrc/ops.cpp, argument checks
// in csrc/op_args.h shared with the CPU, kernels in csrc/cuda/*.cu, strips in strip_plan.h).
//
// Shape of every op (README "Backends"): s is visited in pieces sized to a fixed working budget
// (64 MiB by default): row strips in the forward; in the backward row strips too, or near-square
// blocks where that means fewer passes over dy and y (strip_plan.h plan_gradient_blocks). From
// embeddings, a piece is one cuBLAS product x[r]·y[c]ᵀ; the element kernels turn it into line
// statistics (forward) or into ∂L/∂s in place (backward), which two more products turn into
// dx[r] (+)= G·y[c] and dy[c] += Gᵀ·x[r] (half inputs whose float32 dy would exceed the budget: dy
// from a second sweep over the blocks of sᵀ instead, see loss_backward). Extra device memory: the
// workspace and O(K) statistics; never K×K.
//
// Precision. Products of float32 inputs are exact IEEE float32 (cuBLAS with
// CUBLAS_COMPUTE_32F and the default math mode) unless the op's matmul_precision argument is
// "tf32" (CUBLAS_COMPUTE_32F_FAST_TF32): the forward's and the backward's products alike, whatever
// torch's global TF32 switch says. float16/bfloat16 inputs go to the tensor cores with float32
// accumulation (s in float32; in the backward ∂L/∂s is rounded to the input's type, float16 after
// an exact power-of-two scaling chosen on the device). float64 inputs use CUBLAS_COMPUTE_64F.
// Element math: float32 for float32 and half inputs (SPEC §2 "Float32 element math"; the kernels
// choose it from each view's kind, the product's type from embeddings), float64 for float64 inputs;
// line statistics and per-line work in float64.
//
// Synchronisation: none in the hot path, except the τ overflow check (SPEC §1): where Σα could
// overflow double for the given evidence, dtype and τ (always for "exp") and the embeddings' norm
// bound (NormBound, read ahead without a wait) does not rule it out, the forward ops read one flag
// on the host, so that an overflow is the ValueError naming τ that the CPU raises;
// line_losses (the distributed loss's per-step op) always reads one. During CUDA graph capture
// these reads are skipped and an overflowed line's loss is +inf, as it is for relu/softplus with
// an infinite similarity (the host cannot foresee that one; the CPU raises). Weights passed on
// the device (KernelBackend passes them on the CPU) are copied to the host.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>
#include <torch/library.h>

#include <array>
#include <cfloat>
#include <climits>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "../op_args.h"
#include "kernels.h"
#include "strip_plan.h"

namespace evidential_ops {
namespace cuda {
namespace {

using at::Tensor;

// ------------------------------------------------------------------------------ small helpers

ScalarKind scalar_kind(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ScalarKind::kFloat32;
    case at::kDouble: return ScalarKind::kFloat64;
    case at::kHalf: return ScalarKind::kFloat16;
    case at::kBFloat16: return ScalarKind::kBFloat16;
    default: TORCH_CHECK_TYPE(false, "the cuda kernels take float32, float64, float16 or bfloat16, got ", type);
  }
}

bool is_half(at::ScalarType type) { return type == at::kHalf || type == at::kBFloat16; }

// The largest finite value of s in this dtype (the product dtype for embeddings).
double largest_similarity(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return DBL_MAX;
    case at::kHalf: return 65504.0;
    default: return FLT_MAX;  // float32 and bfloat16
  }
}

// Whether Σα of some line of n candidates can overflow double when every |s| <= largest, judged on
// the host from what it knows (evidence, τ): if not, the overflow check needs no device read.
bool overflow_possible_below(int evidence, double largest, double inv_tau, std::int64_t n) {
  if (evidence != 0 && evidence != 1 && evidence != 2) return false;  // exp_tanh: α ≤ e + 1
  const double scaled = largest * inv_tau;  // may be +inf, or NaN for a NaN bound: then possible
  if (!(scaled <= std::numeric_limits<double>::infinity())) return true;
  if (evidence == 0) return scaled + std::log(static_cast<double>(n)) > 709.0;  // exp: α ≤ e^{s/τ} + 1
  return static_cast<double>(n) * (scaled + 2.0) > 1e307;                       // relu, softplus: α ≤ s/τ + 2
}

// The same for any similarity the dtype can hold.
bool overflow_possible(int evidence, at::ScalarType s_type, double inv_tau, std::int64_t n) {
  return overflow_possible_below(evidence, largest_similarity(s_type), inv_tau, n);
}

// The embeddings' norm bound on |s| (SPEC §1 "The overflow check without a wait";
// evidential_ops/triton_backend/norm_bound.py is the triton backend's): every product cuBLAS forms
// obeys |s_ij| <= B = 2·max_i ‖x_i‖·max_j ‖y_j‖ (Cauchy–Schwarz; the 2 covers the operands'
// TF32 rounding, a float32 sum of D terms and the norms' own rounding up to D = 2^20: SPEC §1). Started ahead of the strips, its
// result copied to pinned host memory behind an event, it is read after them waiting for its own
// few kernels only, where the flag's read waits for the whole forward and leaves the GPU idle
// until the host has queued the next work. Where B rules an overflow out (unit-norm embeddings:
// B = 2), the flag is not read.
class NormBound {
 public:
  static constexpr double kProductRoundingFactor = 2.0;
  static constexpr std::int64_t kMaxBoundedD = std::int64_t{1} << 20;  // wider: none (start_norm_bound)

  NormBound(const Tensor& x, const Tensor& y) {
    // In the inputs' own dtype (float32 accumulation): a dtype argument would convert a copy of x
    // and y first, 512 MiB at K = 65536, D = 1024 in float64.
    const Tensor product = at::linalg_vector_norm(x, 2, at::IntArrayRef{1}).amax().to(at::kDouble) *
                           at::linalg_vector_norm(y, 2, at::IntArrayRef{1}).amax().to(at::kDouble);
    host_ = at::empty({}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    host_.copy_(product, /*non_blocking=*/true);
    ready_.record(at::cuda::getCurrentCUDAStream());
  }

  bool rules_out_overflow(int evidence, double inv_tau, std::int64_t n) {
    ready_.synchronize();
    return !overflow_possible_below(evidence, kProductRoundingFactor * host_.item<double>(), inv_tau, n);
  }

 private:
  Tensor host_;
  at::cuda::CUDAEvent ready_;
};

bool stream_is_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// isinf(α_target + rest) of any line: a device tensor, read by the caller (only when needed).
Tensor overflow_flag(const Tensor& stats) {
  return at::isinf(stats[generic::kTargetAlpha] + stats[generic::kRest]).any();
}

void check_on_cuda(const Tensor& t, const char* name) {
  // Reached when any argument is a CUDA tensor (the dispatcher picks the CUDA kernel for all).
  TORCH_CHECK_VALUE(t.device().is_cuda(), name, " is on ", t.device(),
                    " but another argument is a CUDA tensor: every tensor argument must be on one device");
}

TermFlags term_flags(const TermSelection& terms) { return TermFlags{terms.kl, terms.fmse, terms.logdet}; }

static_assert(TermWeights::kTerms == kNumTerms, "TermWeights must hold one weight per term");

TermWeights term_weights(const std::array<double, kNumTerms>& weight, const TermSelection& terms) {
  TermWeights w{};
  for (int k = 0; k < kNumTerms; ++k) {
    w.weight[k] = weight[k];
    w.enabled[k] = terms.enabled[k];
  }
  return w;
}

// The weights' values on the host: a CPU tensor is read directly; one on the device is copied
// (a synchronising 40-byte copy: KernelBackend passes them on the CPU).
std::array<double, kNumTerms> weights_on_host(const Tensor& weights, const TermSelection& terms, const Tensor& like) {
  check_weights(weights, like);
  return host_weights(weights.device().is_cpu() ? weights : weights.to(at::kCPU), terms);
}

Tensor scale_vector(const c10::optional<Tensor>& target_scale) {
  if (!target_scale.has_value()) return Tensor();
  return target_scale->to(at::kDouble).contiguous();
}

LineSpec line_spec(const Tensor& stats, const Tensor& scale, std::int64_t scale_offset, std::int64_t candidates) {
  return LineSpec{stats.const_data_ptr<double>(), stats.size(1),
                  scale.defined() ? scale.const_data_ptr<double>() : nullptr, scale_offset,
                  static_cast<double>(candidates)};
}

cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// ------------------------------------------------------------------------------------- cuBLAS

cudaDataType_t blas_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return CUDA_R_32F;
    case at::kDouble: return CUDA_R_64F;
    case at::kHalf: return CUDA_R_16F;
    default: return CUDA_R_16BF;
  }
}

int blas_int(std::int64_t v, const char* what) {
  TORCH_CHECK_VALUE(v <= INT_MAX, what, " = ", v, " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

// Restores a cuBLAS handle's math and pointer modes (torch's) at the end of the scope; the
// products set both before each call (an ATen matmul in between would reset the math mode).
class BlasModes {
 public:
  explicit BlasModes(cublasHandle_t handle) : handle_(handle) {
    TORCH_CUDABLAS_CHECK(cublasGetMathMode(handle_, &saved_math_));
    TORCH_CUDABLAS_CHECK(cublasGetPointerMode(handle_, &saved_pointers_));
  }
  ~BlasModes() {
    cublasSetMathMode(handle_, saved_math_);
    cublasSetPointerMode(handle_, saved_pointers_);
  }
  BlasModes(const BlasModes&) = delete;
  BlasModes& operator=(const BlasModes&) = delete;

 private:
  cublasHandle_t handle_;
  cublasMath_t saved_math_;
  cublasPointerMode_t saved_pointers_;
};

// The products of one op: x (M, D) and y (N, D) contiguous, of the input dtype.
class Products {
 public:
  // tf32: the op's matmul_precision == "tf32" (float32 inputs only; others ignore it).
  Products(const Tensor& x, const Tensor& y, bool tf32)
      : x_(x), y_(y), input_(x.scalar_type()), d_(x.size(1)), handle_(at::cuda::getCurrentCUDABlasHandle()) {
    if (input_ == at::kDouble) {
      compute_ = CUBLAS_COMPUTE_64F;
    } else if (input_ == at::kFloat) {
      compute_ = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      math_ = tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    } else {
      compute_ = CUBLAS_COMPUTE_32F;  // tensor cores, float32 accumulation, no reduced-precision reductions
      math_ = static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    }
    modes_.emplace(handle_);
  }

  at::ScalarType product_type() const { return input_ == at::kDouble ? at::kDouble : at::kFloat; }

  // out (rows, cols), row-major, ld cols, product_type() = x[r0 : r0 + rows]·y[c0 : c0 + cols]ᵀ.
  void similarity(std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols, void* out) {
    // column-major: outᵀ (cols × rows) = yᶜᵀ · xᶜ, with yᶜ = y[c0 :] as a D × cols column-major matrix
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, cols, rows, d_, one(), row_pointer(y_, c0), blas_type(input_), d_,
         row_pointer(x_, r0), blas_type(input_), d_, zero(), out, blas_type(product_type()), cols, false);
  }

  // dx_rows (rows, D) = alpha · G·y[c0 : c0 + cols] + beta · dx_rows, G (rows, cols) row-major of
  // type g_type; alpha and beta on the host, or on the device (device_scalars).
  void rows_gradient(std::int64_t rows, std::int64_t c0, std::int64_t cols, const void* g, at::ScalarType g_type,
                     void* dx_rows, at::ScalarType dx_type, const void* alpha, const void* beta, bool device_scalars) {
    // column-major: dxᶜ (D × rows) = yᶜ (D × cols) · Gᶜ (cols × rows)
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, d_, rows, cols, alpha, row_pointer(y_, c0), blas_type(input_), d_, g,
         blas_type(g_type), cols, beta, dx_rows, blas_type(dx_type), d_, device_scalars);
  }

  // dy_cols (cols, D) = alpha · Gᵀ·x[r0 : r0 + rows] + beta · dy_cols, G (rows, cols) row-major.
  void cols_gradient(std::int64_t r0, std::int64_t rows, std::int64_t cols, const void* g, at::ScalarType g_type,
                     void* dy_cols, at::ScalarType dy_type, const void* alpha, const void* beta,
                     bool device_scalars) {
    // column-major: dyᶜ (D × cols) += xᶜ (D × rows) · Gᶜᵀ (rows × cols)
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, d_, cols, rows, alpha, row_pointer(x_, r0), blas_type(input_), d_, g,
         blas_type(g_type), cols, beta, dy_cols, blas_type(dy_type), d_, device_scalars);
  }

  // Host scalars of the compute type (pointer mode host).
  const void* one() const { return input_ == at::kDouble ? static_cast<const void*>(&one_d_) : &one_f_; }
  const void* zero() const { return input_ == at::kDouble ? static_cast<const void*>(&zero_d_) : &zero_f_; }

 private:
  static const void* row_pointer(const Tensor& t, std::int64_t row) {
    return static_cast<const char*>(t.const_data_ptr()) + row * t.size(1) * t.element_size();
  }

  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
            const void* alpha, const void* a, cudaDataType_t a_type, std::int64_t lda, const void* b,
            cudaDataType_t b_type, std::int64_t ldb, const void* beta, void* c, cudaDataType_t c_type,
            std::int64_t ldc, bool device_scalars) {
    TORCH_CUDABLAS_CHECK(cublasSetMathMode(handle_, math_));
    TORCH_CUDABLAS_CHECK(
        cublasSetPointerMode(handle_, device_scalars ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST));
    TORCH_CUDABLAS_CHECK(cublasGemmEx(handle_, ta, tb, blas_int(m, "m"), blas_int(n, "n"), blas_int(k, "k"), alpha, a,
                                      a_type, blas_int(lda, "lda"), b, b_type, blas_int(ldb, "ldb"), beta, c, c_type,
                                      blas_int(ldc, "ldc"), compute_, CUBLAS_GEMM_DEFAULT));
  }

  Tensor x_, y_;
  at::ScalarType input_;
  std::int64_t d_;
  cublasHandle_t handle_;
  cublasComputeType_t compute_ = CUBLAS_COMPUTE_32F;
  cublasMath_t math_ = CUBLAS_DEFAULT_MATH;
  c10::optional<BlasModes> modes_;
  float one_f_ = 1.0f, zero_f_ = 0.0f;
  double one_d_ = 1.0, zero_d_ = 0.0;
};

// ------------------------------------------------------------------------------ statistics pass

// Where the values of s come from: products of embeddings (contiguous, input dtype), or a given s.
struct Source {
  Tensor x, y, s;
  bool from_embeddings;
  std::int64_t rows, cols;
  bool tf32;  // products in TF32 (matmul_precision "tf32")

  static Source embeddings(const Tensor& x, const Tensor& y, const std::string& matmul_precision) {
    const bool tf32 = tf32_requested(matmul_precision);
    check_embeddings(x, y);
    check_on_cuda(x, "x");
    scalar_kind(x.scalar_type());
    return Source{x.contiguous(), y.contiguous(), Tensor(), true, x.size(0), y.size(0), tf32};
  }
  static Source similarity(const Tensor& s) {
    check_similarity(s);
    check_on_cuda(s, "s");
    scalar_kind(s.scalar_type());
    return Source{Tensor(), Tensor(), s, false, s.size(0), s.size(1), false};
  }
  const Tensor& like() const { return from_embeddings ? x : s; }
  // dtype of the values the kernels read: the product type, or s's own.
  at::ScalarType value_type() const {
    if (!from_embeddings) return s.scalar_type();
    return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  }
  SimilarityView view_of_given(std::int64_t r0, std::int64_t rows) const {
    const char* base = static_cast<const char*>(s.const_data_ptr()) + r0 * s.stride(0) * s.element_size();
    return SimilarityView{base, scalar_kind(s.scalar_type()), s.stride(0), s.stride(1), rows, cols, r0};
  }
};

struct Targets {
  bool present;
  std::int64_t offset;
};

// LineStat statistics (kNumLineStats, M) and (kNumLineStats, N) in float64 on the device; zeros
// for a direction not asked for. Columns of a strip (line_stats) hold that strip's rows only.
std::pair<Tensor, Tensor> accumulate_stats(const Source& src, int evidence, double inv_tau, Targets targets,
                                           TermFlags flags, bool rows, bool cols) {
  const Tensor& like = src.like();
  const auto options = like.options().dtype(at::kDouble);
  Tensor row_stats = at::zeros({kNumLineStats, src.rows}, options);
  Tensor col_stats = at::zeros({kNumLineStats, src.cols}, options);
  if (!rows && !cols) return {row_stats, col_stats};
  const at::ScalarType value_type = src.value_type();
  const StripNeeds needs{src.from_embeddings ? static_cast<std::int64_t>(c10::elementSize(value_type)) : 0, 0, true,
                         false};
  const StripPlan plan = plan_strips(src.rows, src.cols, needs, workspace_budget());
  Tensor workspace = at::empty({plan.total_bytes}, like.options().dtype(at::kByte));
  char* base = static_cast<char*>(workspace.data_ptr());
  c10::optional<Products> products;
  if (src.from_embeddings) products.emplace(src.x, src.y, src.tf32);
  const cudaStream_t stream = current_stream();
  for (std::int64_t strip = 0; strip < plan.strips; ++strip) {
    const std::int64_t r0 = strip * plan.strip_rows;
    const std::int64_t nr = std::min(plan.strip_rows, src.rows - r0);
    ForwardArgs a{};
    if (src.from_embeddings) {
      void* tile = base + plan.tile_offset;
      products->similarity(r0, nr, 0, src.cols, tile);
      a.s = SimilarityView{tile, scalar_kind(value_type), src.cols, 1, nr, src.cols, r0};
    } else {
      a.s = src.view_of_given(r0, nr);
    }
    a.evidence = evidence;
    a.inv_tau = inv_tau;
    a.has_targets = targets.present;
    a.target_offset = targets.offset;
    a.terms = flags;
    a.row_stats = rows ? row_stats.data_ptr<double>() : nullptr;
    a.row_stride = src.rows;
    a.col_stats = cols ? col_stats.data_ptr<double>() : nullptr;
    a.col_stride = src.cols;
    a.row_partial = reinterpret_cast<double*>(base + plan.row_partial_offset);
    a.col_partial = reinterpret_cast<double*>(base + plan.col_partial_offset);
    a.max_row_groups = plan.row_groups;
    C10_CUDA_CHECK(launch_forward_stats(a, stream));
  }
  return {row_stats, col_stats};
}

// The norm bound of embeddings, started where the overflow check would read the flag: an overflow
// possible for the dtype, the values readable (not under CUDA graph capture). Before the strips.
void start_norm_bound(std::optional<NormBound>& bound, const Source& src, bool any_line, int evidence,
                      double inv_tau, std::int64_t longest) {
  if (src.from_embeddings && any_line && src.x.size(1) <= NormBound::kMaxBoundedD &&
      overflow_possible(evidence, src.value_type(), inv_tau, longest) && !stream_is_capturing()) {
    bound.emplace(src.x, src.y);
  }
}

// The overflow check of the forward ops (SPEC §1): a ValueError naming τ, as on the CPU. One
// device-to-host read when an overflow is possible at all (see overflow_possible) and the
// embeddings' norm bound, where there is one, does not rule it out.
void check_finite_strengths(const Tensor& row_stats, bool rows, const Tensor& col_stats, bool cols, int evidence,
                            at::ScalarType value_type, double inv_tau, double tau, const std::string& evidence_name,
                            std::optional<NormBound>& bound) {
  const std::int64_t longest = std::max(row_stats.size(1), col_stats.size(1));
  if (!(rows || cols) || !overflow_possible(evidence, value_type, inv_tau, longest) || stream_is_capturing()) return;
  if (bound && bound->rules_out_overflow(evidence, inv_tau, longest)) return;
  Tensor flag = rows && cols ? at::logical_or(overflow_flag(row_stats), overflow_flag(col_stats))
                             : overflow_flag(rows ? row_stats : col_stats);
  TORCH_CHECK_VALUE(!flag.item<bool>(), tau_overflow_message(tau, evidence_name));
}

// Σ_term weight·term of every line of one direction (float64), or zeros.
Tensor finalise_losses(const LineSpec& lines, bool enabled, const TermWeights& weights, const Tensor& like) {
  Tensor losses = enabled ? at::empty({lines.n}, like.options().dtype(at::kDouble))
                          : at::zeros({lines.n}, like.options().dtype(at::kDouble));
  if (enabled) C10_CUDA_CHECK(launch_line_losses(lines, weights, losses.data_ptr<double>(), current_stream()));
  return losses;
}

// LineGradient of every line of one direction as (kNumGradientFields, n) (zeros if off).
Tensor line_constants(const LineSpec& lines, bool enabled, const TermWeights& weights, const Tensor& upstream,
                      const Tensor& like) {
  Tensor g = at::zeros({kNumGradientFields, lines.n}, like.options().dtype(at::kDouble));
  if (!enabled) return g;
  const Tensor up = upstream.to(at::kDouble).contiguous();
  C10_CUDA_CHECK(
      launch_line_gradients(lines, weights, up.const_data_ptr<double>(), g.data_ptr<double>(), current_stream()));
  return g;
}

struct LossOptions {
  int evidence;
  double inv_tau;
  TermSelection terms;
  TermWeights weights;
};

LossOptions loss_options(const std::string& evidence, double tau, const Tensor& weights, std::int64_t terms,
                         const Tensor& like) {
  const int kind = evidence_index(evidence);
  const double inv_tau = checked_inverse_tau(tau);
  const TermSelection selection = select_terms(terms);
  return LossOptions{kind, inv_tau, selection, term_weights(weights_on_host(weights, selection, like), selection)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> forward_impl(const Source& src, const c10::optional<Tensor>& target_scale,
                                                        const std::string& evidence, double tau, const Tensor& weights,
                                                        std::int64_t terms, bool rows, bool cols) {
  const Tensor& like = src.like();
  check_square(src.rows, src.cols);
  check_target_scale(target_scale, src.rows, like);
  const LossOptions o = loss_options(evidence, tau, weights, terms, like);
  const c10::cuda::CUDAGuard guard(like.device());
  std::optional<NormBound> bound;
  start_norm_bound(bound, src, rows || cols, o.evidence, o.inv_tau, std::max(src.rows, src.cols));
  auto [row_stats, col_stats] =
      accumulate_stats(src, o.evidence, o.inv_tau, Targets{true, 0}, term_flags(o.terms), rows, cols);
  const Tensor scale = scale_vector(target_scale);
  const std::int64_t k = src.rows;
  const at::ScalarType out_type = compute_type(like.scalar_type());
  Tensor row_losses = finalise_losses(line_spec(row_stats, scale, 0, k), rows, o.weights, like).to(out_type);
  Tensor col_losses = finalise_losses(line_spec(col_stats, scale, 0, k), cols, o.weights, like).to(out_type);
  // After every launch of the forward: a read of the flag then holds none of its kernels back.
  check_finite_strengths(row_stats, rows, col_stats, cols, o.evidence, src.value_type(), o.inv_tau, tau, evidence,
                         bound);
  return {row_losses, col_losses, row_stats, col_stats};
}

// What a backward op needs before its strips: the options and both directions' gradient
// constants. Rows [offset, offset + M) of an N×N problem (square: offset 0, M = N).
struct BackwardLines {
  LossOptions options;
  Tensor rows, cols;
};

BackwardLines backward_lines(std::int64_t m, std::int64_t n, std::int64_t target_offset, const Tensor& grad_rows,
                             const Tensor& grad_cols, const c10::optional<Tensor>& target_scale,
                             const Tensor& row_stats, const Tensor& col_stats, const std::string& evidence, double tau,
                             const Tensor& weights, std::int64_t terms, bool rows, bool cols, const Tensor& like) {
  check_backward_lines(m, n, target_offset, target_scale, row_stats, col_stats, grad_rows, grad_cols, rows, cols, like);
  const LossOptions o = loss_options(evidence, tau, weights, terms, like);
  const Tensor scale = scale_vector(target_scale);
  const Tensor row_lines = row_stats.contiguous(), col_lines = col_stats.contiguous();
  return {o, line_constants(line_spec(row_lines, scale, target_offset, n), rows, o.weights, grad_rows, like),
          line_constants(line_spec(col_lines, scale, 0, n), cols, o.weights, grad_cols, like)};
}

// The gradient launch of a view whose column j is the op's column col0 + j (kernels.h
// BackwardArgs: a block of columns is a view of them with the column constants and the target
// offset shifted by col0).
BackwardArgs gradient_args(const SimilarityView& s, std::int64_t col0, const LossOptions& o,
                           std::int64_t target_offset, const BackwardLines& lines, void* grad, ScalarKind grad_kind,
                           std::int64_t grad_ld, unsigned int* max_bits) {
  BackwardArgs a{};
  a.s = s;
  a.evidence = o.evidence;
  a.inv_tau = o.inv_tau;
  a.target_offset = target_offset - col0;
  a.terms = term_flags(o.terms);
  a.row_constants = lines.rows.const_data_ptr<double>();
  a.n_rows = lines.rows.size(1);
  a.col_constants = lines.cols.const_data_ptr<double>() + col0;
  a.n_cols = lines.cols.size(1);
  a.grad = grad;
  a.grad_kind = grad_kind;
  a.grad_ld = grad_ld;
  a.max_bits = max_bits;
  return a;
}

// --------------------------------------------------------------------------------------- ops

std::tuple<Tensor, Tensor> line_stats(const Tensor& x, const Tensor& y, std::int64_t target_offset,
                                      const std::string& evidence, double tau, std::int64_t terms, bool rows,
                                      bool cols, const std::string& matmul_precision) {
  const Source src = Source::embeddings(x, y, matmul_precision);
  check_strip(src.rows, src.cols, target_offset);
  const TermSelection selection = select_terms(terms);
  const int kind = evidence_index(evidence);
  const double inv_tau = checked_inverse_tau(tau);
  const c10::cuda::CUDAGuard guard(x.device());
  std::optional<NormBound> bound;
  start_norm_bound(bound, src, rows, kind, inv_tau, std::max(src.rows, src.cols));
  auto [row_stats, col_stats] =
      accumulate_stats(src, kind, inv_tau, Targets{true, target_offset}, term_flags(selection), rows, cols);
  // Columns of a strip are partial: only the caller's sum over every strip can overflow-check them.
  check_finite_strengths(row_stats, rows, col_stats, false, kind, src.value_type(), inv_tau, tau, evidence, bound);
  return {row_stats, col_stats};
}

std::tuple<Tensor, Tensor> line_losses(const Tensor& row_stats, const Tensor& col_stats,
                                       const c10::optional<Tensor>& target_scale, std::int64_t target_offset,
                                       const Tensor& weights, std::int64_t terms, bool rows, bool cols) {
  check_on_cuda(row_stats, "row_stats");
  const std::int64_t m = row_stats.dim() == 2 ? row_stats.size(1) : -1;
  const std::int64_t n = col_stats.dim() == 2 ? col_stats.size(1) : -1;
  check_line_stats(row_stats, "row_stats", m, row_stats);
  check_line_stats(col_stats, "col_stats", n, row_stats);
  check_strip(m, n, target_offset);
  check_target_scale(target_scale, n, row_stats);
  const TermSelection selection = select_terms(terms);
  const TermWeights w = term_weights(weights_on_host(weights, selection, row_stats), selection);
  const c10::cuda::CUDAGuard guard(row_stats.device());
  const Tensor row_lines = row_stats.contiguous(), col_lines = col_stats.contiguous();
  // The statistics may come from anywhere (e.g. summed over processes): always checked, one read.
  if ((rows || cols) && !stream_is_capturing()) {
    Tensor flag = rows && cols ? at::logical_or(overflow_flag(row_lines), overflow_flag(col_lines))
                               : overflow_flag(rows ? row_lines : col_lines);
    TORCH_CHECK_VALUE(!flag.item<bool>(), kStrengthOverflowMessage);
  }
  const Tensor scale = scale_vector(target_scale);
  return {finalise_losses(line_spec(row_lines, scale, target_offset, n), rows, w, row_stats),
          finalise_losses(line_spec(col_lines, scale, 0, n), cols, w, row_stats)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> loss_forward(const Tensor& x, const Tensor& y,
                                                        const c10::optional<Tensor>& target_scale,
                                                        const std::string& evidence, double tau, const Tensor& weights,
                                                        std::int64_t terms, bool rows, bool cols,
                                                        const std::string& matmul_precision) {
  return forward_impl(Source::embeddings(x, y, matmul_precision), target_scale, evidence, tau, weights, terms, rows,
                      cols);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> loss_forward_from_similarity(
    const Tensor& s, const c10::optional<Tensor>& target_scale, const std::string& evidence, double tau,
    const Tensor& weights, std::int64_t terms, bool rows, bool cols) {
  return forward_impl(Source::similarity(s), target_scale, evidence, tau, weights, terms, rows, cols);
}

std::tuple<Tensor, Tensor> loss_backward(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& x,
                                         const Tensor& y, const c10::optional<Tensor>& target_scale,
                                         const Tensor& row_stats, const Tensor& col_stats,
                                         const std::string& evidence, double tau, const Tensor& weights,
                                         std::int64_t terms, bool rows, bool cols, std::int64_t target_offset,
                                         std::array<bool, 2> output_mask, const std::string& matmul_precision) {
  const Source src = Source::embeddings(x, y, matmul_precision);
  const c10::cuda::CUDAGuard guard(x.device());
  const BackwardLines lines = backward_lines(src.rows, src.cols, target_offset, grad_rows, grad_cols, target_scale,
                                             row_stats, col_stats, evidence, tau, weights, terms, rows, cols, x);
  const bool need_dx = output_mask[0], need_dy = output_mask[1];
  if (!need_dx && !need_dy) return {at::empty({0}, x.options()), at::empty({0}, y.options())};

  const at::ScalarType input = x.scalar_type();
  const bool half = is_half(input);
  const bool scaled = input == at::kHalf;  // float16 ∂L/∂s needs a scale; bfloat16 has float32's range
  const at::ScalarType product = input == at::kDouble ? at::kDouble : at::kFloat;
  const std::int64_t d = x.size(1);
  const std::int64_t budget = workspace_budget();
  // dx from the GEMMs, summed over the column blocks of its row block. dy: accumulated over the
  // row blocks in the product dtype, which for half inputs is a float32 (N, D) buffer beside the
  // output; where that buffer would exceed the workspace budget (N = 65536, D = 1024: 256 MiB), dy
  // comes instead from a second sweep over the blocks of sᵀ (s recomputed, ∂L/∂sᵀ formed with the
  // two directions' line constants swapped: the same values, gradient_kernel being symmetric in its
  // lines), each row block's dy rows written once in the input dtype: one product and one element
  // pass more, no buffer.
  const bool dy_by_columns = need_dy && half && src.cols * d * 4 > budget;
  // Outputs accumulated over column blocks: dx (and dy_by_columns' dy) in place for float32 and
  // float64, in the workspace's float32 block for half types (strip_plan.h plan_gradient_blocks).
  Tensor dx = need_dx ? at::empty({src.rows, d}, x.options()) : Tensor();
  Tensor dy;
  if (need_dy) dy = dy_by_columns ? at::empty({src.cols, d}, y.options()) : at::zeros({src.cols, d}, x.options().dtype(product));

  const StripNeeds needs{static_cast<std::int64_t>(c10::elementSize(product)), half ? 2 : 0, false, scaled};
  // A float32 sum of half rows over column blocks: dx's (if asked for), and the sᵀ sweep's dy.
  const BlockPlan plan = plan_gradient_blocks(src.rows, src.cols, d, needs, half && need_dx ? 4 : 0, budget);
  const BlockPlan column_plan =
      dy_by_columns ? plan_gradient_blocks(src.cols, src.rows, d, needs, 4, budget) : plan;
  Tensor workspace =
      at::empty({std::max(plan.total_bytes, column_plan.total_bytes)}, x.options().dtype(at::kByte));
  const cudaStream_t stream = current_stream();
  // ∂L/∂s: in place over s (float32/float64, and float32 before the float16 scaling), or straight
  // into bfloat16.
  const bool direct_bf16 = input == at::kBFloat16;
  const ScalarKind grad_kind = direct_bf16 ? ScalarKind::kBFloat16 : scalar_kind(product);
  const at::ScalarType g_type = half ? input : product;

  // One sweep over the blocks of a (rows × cols) product a·bᵀ, column blocks inside row blocks:
  // per block its ∂L/∂s (`sweep_lines`: the row lines' constants first), then
  // rows_out[r] (+)= G·b[c] (input dtype) and, if accumulated, accumulated[c] += Gᵀ·a[r]
  // (product dtype).
  auto sweep = [&](Products& products, const BlockPlan& p, std::int64_t rows, std::int64_t cols,
                   const BackwardLines& sweep_lines, std::int64_t offset, Tensor* rows_out, Tensor* accumulated) {
    char* base = static_cast<char*>(workspace.data_ptr());
    void* tile = base + p.tile_offset;
    void* half_g = half ? base + p.half_offset : nullptr;
    unsigned int* max_bits = scaled ? reinterpret_cast<unsigned int*>(base + p.scalars_offset) : nullptr;
    float* alphas = scaled ? reinterpret_cast<float*>(base + p.scalars_offset + 16) : nullptr;
    // Half rows over several column blocks: summed in the plan's float32 accumulator, cast once
    // per row block.
    const bool off_to_side = p.accumulator_bytes > 0;
    for (std::int64_t rb = 0; rb < p.row_blocks; ++rb) {
      const std::int64_t r0 = rb * p.block_rows;
      const std::int64_t nr = std::min(p.block_rows, rows - r0);
      for (std::int64_t cb = 0; cb < p.col_blocks; ++cb) {
        const std::int64_t c0 = cb * p.block_cols;
        const std::int64_t nc = std::min(p.block_cols, cols - c0);
        products.similarity(r0, nr, c0, nc, tile);
        const SimilarityView view{tile, scalar_kind(product), nc, 1, nr, nc, r0};
        void* grad = direct_bf16 ? half_g : tile;
        if (scaled) C10_CUDA_CHECK(cudaMemsetAsync(max_bits, 0, sizeof(unsigned int), stream));
        C10_CUDA_CHECK(launch_gradient(
            gradient_args(view, c0, sweep_lines.options, offset, sweep_lines, grad, grad_kind, nc, max_bits), stream));
        const void* g = half ? half_g : tile;
        if (scaled) {
          C10_CUDA_CHECK(launch_scale_to_half(static_cast<const float*>(tile), half_g, nr * nc, max_bits, alphas,
                                              stream));
        }
        // Pointer mode device (float16): alpha = 2^-e and beta from the device; host otherwise.
        const void* alpha = scaled ? static_cast<const void*>(alphas) : products.one();
        const void* beta_zero = scaled ? static_cast<const void*>(alphas + 2) : products.zero();
        const void* beta_one = scaled ? static_cast<const void*>(alphas + 1) : products.one();
        if (rows_out != nullptr) {
          void* out_rows = off_to_side ? base + p.accumulator_offset
                                       : static_cast<char*>(rows_out->data_ptr()) + r0 * d * rows_out->element_size();
          products.rows_gradient(nr, c0, nc, g, g_type, out_rows, off_to_side ? product : rows_out->scalar_type(),
                                 alpha, cb == 0 ? beta_zero : beta_one, scaled);
        }
        if (accumulated != nullptr) {
          void* out_cols = static_cast<char*>(accumulated->data_ptr()) + c0 * d * accumulated->element_size();
          products.cols_gradient(r0, nr, nc, g, g_type, out_cols, product, alpha, beta_one, scaled);
        }
      }
      if (rows_out != nullptr && off_to_side) {
        const Tensor sum = at::from_blob(base + p.accumulator_offset, {nr, d}, x.options().dtype(product));
        rows_out->narrow(0, r0, nr).copy_(sum);
      }
    }
  };

  Products products(src.x, src.y, src.tf32);
  if (need_dx || !dy_by_columns) {
    sweep(products, plan, src.rows, src.cols, lines, target_offset, need_dx ? &dx : nullptr,
          need_dy && !dy_by_columns ? &dy : nullptr);
  }
  if (dy_by_columns) {
    // sᵀ = y·xᵀ: its rows are the column lines (row j's target is column j − target_offset).
    Products transposed(src.y, src.x, src.tf32);
    const BackwardLines swapped{lines.options, lines.cols, lines.rows};
    sweep(transposed, column_plan, src.cols, src.rows, swapped, -target_offset, &dy, nullptr);
  }
  if (need_dy && !dy_by_columns) dy = dy.to(y.scalar_type());
  return {need_dx ? dx : at::empty({0}, x.options()), need_dy ? dy : at::empty({0}, y.options())};
}

Tensor loss_backward_from_similarity(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& s,
                                     const c10::optional<Tensor>& target_scale, const Tensor& row_stats,
                                     const Tensor& col_stats, const std::string& evidence, double tau,
                                     const Tensor& weights, std::int64_t terms, bool rows, bool cols) {
  const Source src = Source::similarity(s);
  check_square(src.rows, src.cols);
  const c10::cuda::CUDAGuard guard(s.device());
  const BackwardLines lines = backward_lines(src.rows, src.cols, 0, grad_rows, grad_cols, target_scale, row_stats,
                                             col_stats, evidence, tau, weights, terms, rows, cols, s);
  Tensor ds = at::empty({src.rows, src.cols}, s.options());
  // ds is K×K by definition: one launch over all of s, no workspace.
  C10_CUDA_CHECK(launch_gradient(gradient_args(src.view_of_given(0, src.rows), 0, lines.options, 0, lines, ds.data_ptr(),
                                               scalar_kind(s.scalar_type()), src.cols, nullptr),
                                 current_stream()));
  return ds;
}

std::tuple<Tensor, Tensor> opinion_impl(const Source& src, const std::string& evidence, double tau) {
  TORCH_CHECK_VALUE(src.rows >= 1 && src.cols >= 1, "opinions need at least one query and candidate");
  const int kind = evidence_index(evidence);
  const double inv_tau = checked_inverse_tau(tau);
  const c10::cuda::CUDAGuard guard(src.like().device());
  std::optional<NormBound> bound;
  start_norm_bound(bound, src, true, kind, inv_tau, std::max(src.rows, src.cols));
  auto [row_stats, col_stats] =
      accumulate_stats(src, kind, inv_tau, Targets{false, 0}, TermFlags{false, false, false}, true, true);
  check_finite_strengths(row_stats, true, col_stats, true, kind, src.value_type(), inv_tau, tau, evidence, bound);
  // No targets: rest is the whole sum S.
  const at::ScalarType out_type = compute_type(src.like().scalar_type());
  return {row_stats[generic::kRest].log().to(out_type), col_stats[generic::kRest].log().to(out_type)};
}

std::tuple<Tensor, Tensor> opinion(const Tensor& x, const Tensor& y, const std::string& evidence, double tau,
                                   const std::string& matmul_precision) {
  return opinion_impl(Source::embeddings(x, y, matmul_precision), evidence, tau);
}

std::tuple<Tensor, Tensor> opinion_from_similarity(const Tensor& s, const std::string& evidence, double tau) {
  return opinion_impl(Source::similarity(s), evidence, tau);
}

}  // namespace
}  // namespace cuda
}  // namespace evidential_ops

TORCH_LIBRARY_IMPL(evidential_ops, CUDA, m) {
  using namespace evidential_ops::cuda;
  m.impl("line_stats", &line_stats);
  m.impl("line_losses", &line_losses);
  m.impl("loss_forward", &loss_forward);
  m.impl("loss_forward_from_similarity", &loss_forward_from_similarity);
  m.impl("loss_backward", &loss_backward);
  m.impl("loss_backward_from_similarity", &loss_backward_from_similarity);
  m.impl("opinion", &opinion);
  m.impl("opinion_from_similarity", &opinion_from_similarity);
}
