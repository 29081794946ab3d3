// Argument checks and decoding shared by every device's implementation of the op family
// (csrc/ops.cpp): a CPU or CUDA launcher calls these first, so a bad direct call of
// torch.ops.evidential_ops.* is the same ValueError/TypeError on every device and never an
// out-of-bounds read. O(1) work: nothing here reads tensor values, except `host_weights`, which
// reads the 5 weights of a CPU tensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <array>
#include <cstdint>
#include <string>

#include "kernels/line_finalise.h"

namespace evidential_ops {

constexpr int kNumLineStats = generic::kNumLineStats;
constexpr int kNumTerms = generic::kNumTerms;
constexpr int kNumGradientFields = generic::kNumGradientFields;

// Index of an evidence kind in evidential_ops.config.EVIDENCE_KINDS (and EvidenceKind).
int evidence_index(const std::string& evidence);

// 1/τ, after checking τ > 0 and that 1/τ is finite (τ = 1e-320 would make it inf and every
// evidence NaN).
double checked_inverse_tau(double tau);

// Which terms a call computes: the `terms` bit mask (bit k = TERMS[k]: risk, kl, mse, fmse,
// logdet) of the op schemas, and which per-element special functions that needs.
struct TermSelection {
  bool enabled[kNumTerms];
  bool kl, fmse, logdet;
};
TermSelection select_terms(std::int64_t terms);

// The weights tensor: float64, (kNumTerms,), on the CPU or on `like`'s device.
void check_weights(const at::Tensor& weights, const at::Tensor& like);

// The values of a CPU weights tensor, checked finite and zero for every term not in the mask.
std::array<double, kNumTerms> host_weights(const at::Tensor& weights, const TermSelection& terms);

// The matmul_precision argument: "ieee" (false) or "tf32" (true); ValueError otherwise.
bool tf32_requested(const std::string& matmul_precision);

// Losses and tiles are float64 for float64 inputs and float32 otherwise (SPEC §5).
at::ScalarType compute_type(at::ScalarType input);

// x (M, D), y (N, D): 2-D, same floating dtype and device, D >= 1.
void check_embeddings(const at::Tensor& x, const at::Tensor& y);
// s (M, N): 2-D floating.
void check_similarity(const at::Tensor& s);
// A square K×K loss problem, K >= 2.
void check_square(std::int64_t rows, std::int64_t cols);
// Rows [offset, offset + M) of a square N×N problem: 0 <= offset, offset + M <= N, N >= 2.
void check_strip(std::int64_t rows, std::int64_t cols, std::int64_t offset);
// `t` is on the device of `like` (`name` and `like_name` for the message).
void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& like, const char* like_name);
// target_scale: absent, or floating/bool of shape (n,) on like's device.
void check_target_scale(const c10::optional<at::Tensor>& target_scale, std::int64_t n, const at::Tensor& like);
// One direction's line statistics: float64 (kNumLineStats, n) on like's device (any strides; the
// kernels read a contiguous copy).
void check_line_stats(const at::Tensor& stats, const char* name, std::int64_t n, const at::Tensor& like);
// The upstream gradient of one direction's losses: n entries on like's device (when `used`).
void check_upstream(const at::Tensor& grad, const char* name, std::int64_t n, bool used, const at::Tensor& like);

// The ValueError message of a line strength Σα beyond double precision (SPEC §1), naming τ; and
// the message of line_losses, which sees statistics only (no τ, no evidence).
std::string tau_overflow_message(double tau, const std::string& evidence);
// What to do about an overflowing line strength: the usual cause is unnormalised features.
inline constexpr const char* kNormaliseHint =
    "The losses expect cosine similarities (|s| <= 1): for raw features pass normalize=True or L2-normalise x "
    "and y; otherwise use a larger tau.";
inline constexpr const char* kStrengthOverflowMessage =
    "a line strength overflowed double precision (exp evidence: |s|/tau > 709; any evidence: an infinite "
    "similarity). The losses expect cosine similarities (|s| <= 1): for raw features pass normalize=True or "
    "L2-normalise x and y; otherwise use a larger tau.";

// Every backward op's line inputs: rows [target_offset, target_offset + M) of an N×N problem, the
// forward's statistics of both directions and the upstream gradients of the directions used.
void check_backward_lines(std::int64_t m, std::int64_t n, std::int64_t target_offset,
                          const c10::optional<at::Tensor>& target_scale, const at::Tensor& row_stats,
                          const at::Tensor& col_stats, const at::Tensor& grad_rows, const at::Tensor& grad_cols,
                          bool rows, bool cols, const at::Tensor& like);

}  // namespace evidential_ops
