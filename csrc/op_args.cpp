#include "op_args.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

namespace evidential_ops {

int evidence_index(const std::string& evidence) {
  static const char* kKinds[] = {"exp", "relu", "softplus", "exp_tanh"};
  for (int i = 0; i < 4; ++i) {
    if (evidence == kKinds[i]) return i;
  }
  TORCH_CHECK_VALUE(false, "evidence must be one of exp, relu, softplus, exp_tanh; got '", evidence, "'");
}

double checked_inverse_tau(double tau) {
  TORCH_CHECK_VALUE(tau > 0.0 && std::isfinite(tau), "tau must be a finite number > 0, got ", tau);
  const double inverse = 1.0 / tau;
  TORCH_CHECK_VALUE(std::isfinite(inverse), "tau=", tau, " is so small that 1/tau overflows double precision");
  return inverse;
}

TermSelection select_terms(std::int64_t terms) {
  TORCH_CHECK_VALUE(terms > 0 && terms < (std::int64_t{1} << kNumTerms),
                    "terms must be a non-empty bit mask of the ", kNumTerms,
                    " terms (risk=1, kl=2, mse=4, fmse=8, logdet=16), got ", terms);
  TermSelection t{};
  for (int k = 0; k < kNumTerms; ++k) t.enabled[k] = (terms >> k) & 1;
  t.kl = t.enabled[generic::kKl];
  t.fmse = t.enabled[generic::kFmse];
  t.logdet = t.enabled[generic::kLogdet];
  return t;
}

void check_weights(const at::Tensor& weights, const at::Tensor& like) {
  TORCH_CHECK_TYPE(weights.scalar_type() == at::kDouble, "weights must be a float64 tensor, got ",
                   weights.scalar_type());
  TORCH_CHECK_VALUE(weights.dim() == 1 && weights.size(0) == kNumTerms, "weights must have shape (", kNumTerms,
                    ",) (risk, kl, mse, fmse, logdet), got ", weights.sizes());
  TORCH_CHECK_VALUE(weights.device().is_cpu() || weights.device() == like.device(),
                    "weights must be on the CPU or on ", like.device(), ", got ", weights.device());
}

std::array<double, kNumTerms> host_weights(const at::Tensor& weights, const TermSelection& terms) {
  TORCH_CHECK_VALUE(weights.device().is_cpu(), "weights must be a CPU tensor here, got ", weights.device());
  const at::Tensor w = weights.contiguous();
  const double* values = w.const_data_ptr<double>();
  static const char* kNames[] = {"risk", "kl", "mse", "fmse", "logdet"};
  std::array<double, kNumTerms> out{};
  for (int k = 0; k < kNumTerms; ++k) {
    TORCH_CHECK_VALUE(std::isfinite(values[k]), "weights['", kNames[k], "'] must be finite, got ", values[k]);
    TORCH_CHECK_VALUE(terms.enabled[k] || values[k] == 0.0, "weights['", kNames[k], "'] is ", values[k],
                      " but the term is not in the terms mask");
    out[k] = values[k];
  }
  return out;
}

bool tf32_requested(const std::string& matmul_precision) {
  TORCH_CHECK_VALUE(matmul_precision == "ieee" || matmul_precision == "tf32",
                    "matmul_precision must be 'ieee' or 'tf32', got '", matmul_precision, "'");
  return matmul_precision == "tf32";
}

at::ScalarType compute_type(at::ScalarType input) { return input == at::kDouble ? at::kDouble : at::kFloat; }

void check_embeddings(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK_VALUE(x.dim() == 2 && y.dim() == 2 && x.size(1) == y.size(1) && x.size(1) >= 1,
                    "x and y must be 2-D with the same embedding size D >= 1, got ", x.sizes(), " and ", y.sizes());
  TORCH_CHECK_TYPE(x.is_floating_point() && x.scalar_type() == y.scalar_type(),
                   "x and y must have the same floating dtype, got ", x.scalar_type(), " and ", y.scalar_type());
  check_same_device(y, "y", x, "x");
}

void check_similarity(const at::Tensor& s) {
  TORCH_CHECK_VALUE(s.dim() == 2, "s must be 2-D, got ", s.sizes());
  TORCH_CHECK_TYPE(s.is_floating_point(), "s must be a floating tensor, got ", s.scalar_type());
}

void check_square(std::int64_t rows, std::int64_t cols) {
  TORCH_CHECK_VALUE(rows == cols && rows >= 2, "the loss needs a square K×K problem with K >= 2, got ", rows, "×",
                    cols);
}

void check_strip(std::int64_t rows, std::int64_t cols, std::int64_t offset) {
  // offset <= cols - rows, not offset + rows <= cols: a huge offset must not wrap around.
  TORCH_CHECK_VALUE(cols >= 2 && rows >= 1 && offset >= 0 && offset <= cols - rows,
                    "a strip is rows [target_offset, target_offset + M) of an N×N problem (N >= 2): got M = ", rows,
                    ", N = ", cols, ", target_offset = ", offset);
}

void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& like, const char* like_name) {
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " is on ", t.device(), " but ", like_name, " is on ",
                    like.device());
}

void check_target_scale(const c10::optional<at::Tensor>& target_scale, std::int64_t n, const at::Tensor& like) {
  if (!target_scale.has_value()) return;
  const at::Tensor& c = *target_scale;
  TORCH_CHECK_TYPE(c.is_floating_point() || c.scalar_type() == at::kBool,
                   "target_scale must be a floating or bool tensor, got ", c.scalar_type());
  TORCH_CHECK_VALUE(c.dim() == 1 && c.size(0) == n, "target_scale must have shape (", n, ",), got ", c.sizes());
  check_same_device(c, "target_scale", like, "the inputs");
}

void check_line_stats(const at::Tensor& stats, const char* name, std::int64_t n, const at::Tensor& like) {
  TORCH_CHECK_TYPE(stats.scalar_type() == at::kDouble, name, " must be the float64 statistics of the forward, got ",
                   stats.scalar_type());
  TORCH_CHECK_VALUE(stats.dim() == 2 && stats.size(0) == kNumLineStats && stats.size(1) == n, name,
                    " must be the (", kNumLineStats, ", ", n, ") statistics of the forward, got ", stats.sizes());
  check_same_device(stats, name, like, "the inputs");
}

void check_upstream(const at::Tensor& grad, const char* name, std::int64_t n, bool used, const at::Tensor& like) {
  if (!used) return;
  TORCH_CHECK_VALUE(grad.numel() == n, name, " must have ", n, " entries, got ", grad.numel());
  TORCH_CHECK_TYPE(grad.is_floating_point(), name, " must be floating, got ", grad.scalar_type());
  check_same_device(grad, name, like, "the inputs");
}

void check_backward_lines(std::int64_t m, std::int64_t n, std::int64_t target_offset,
                          const c10::optional<at::Tensor>& target_scale, const at::Tensor& row_stats,
                          const at::Tensor& col_stats, const at::Tensor& grad_rows, const at::Tensor& grad_cols,
                          bool rows, bool cols, const at::Tensor& like) {
  check_strip(m, n, target_offset);
  check_target_scale(target_scale, n, like);
  check_line_stats(row_stats, "row_stats", m, like);
  check_line_stats(col_stats, "col_stats", n, like);
  check_upstream(grad_rows, "grad_rows", m, rows, like);
  check_upstream(grad_cols, "grad_cols", n, cols, like);
}

std::string tau_overflow_message(double tau, const std::string& evidence) {
  std::ostringstream message;
  // Overflow at a sane tau almost always means raw features: |s| far beyond the cosine range.
  message << "tau=" << tau << " is too small for evidence='" << evidence
          << "' or the similarities are too large: the line strength Σα overflows double precision (exp evidence: "
             "|s|/tau > 709, i.e. |s| > "
          << 709.0 * tau << "; any evidence: an infinite similarity). " << kNormaliseHint;
  return message.str();
}

}  // namespace evidential_ops
