// Schemas of the evidential_ops operator family (SPEC §1-2). Every device registers its kernels
// on these (TORCH_LIBRARY_IMPL(evidential_ops, CPU | CUDA, m) in csrc/cpu/, csrc/cuda/); the
// fakes and autograd formulas are registered once, for every device, by evidential_ops/ops.py,
// which also documents the layout of the statistics.
//
// Shared conventions:
// - x (M, D) are the queries (rows), y (N, D) the candidates (columns) of s = x·yᵀ. The loss ops
//   are square (M = N = K, positives on the diagonal); `line_stats`/`line_losses` and
//   `loss_backward` also take a strip: rows [target_offset, target_offset + M) of an N×N problem,
//   row i's target being column i + target_offset (torch.distributed's global batch).
// - `terms`: bit mask over (risk, kl, mse, fmse, logdet) saying which terms are computed;
//   `weights`: their float64 (5,) weights, on the CPU or on the inputs' device. A tensor, not
//   float[], so that torch.compile does not recompile for every value of an annealed weight.
// - row_stats (NUM_LINE_STATS, M) and col_stats (NUM_LINE_STATS, N): float64 line statistics
//   (csrc/kernels/line_terms.h), all the backward needs: never a K×K buffer.
// - target_scale: (N,) c; the target of row i is c[i + target_offset]·one-hot, of column j c[j].
// - matmul_precision (ops that multiply x by y): "ieee" (exact float32 products of float32
//   inputs) or "tf32" (TF32 tensor cores where the device has them; no effect on the CPU). An op
//   argument, so that the backward's products run at the forward's precision.
#include <torch/library.h>

TORCH_LIBRARY(evidential_ops, m) {
  m.def(
      "line_stats(Tensor x, Tensor y, int target_offset, str evidence, float tau, int terms, bool rows, bool cols, "
      "str matmul_precision='ieee') -> (Tensor row_stats, Tensor col_stats)");
  m.def(
      "line_losses(Tensor row_stats, Tensor col_stats, Tensor? target_scale, int target_offset, Tensor weights, "
      "int terms, bool rows, bool cols) -> (Tensor row_losses, Tensor col_losses)");
  m.def(
      "loss_forward(Tensor x, Tensor y, Tensor? target_scale, str evidence, float tau, Tensor weights, int terms, "
      "bool rows, bool cols, str matmul_precision='ieee') -> (Tensor row_losses, Tensor col_losses, Tensor row_stats, "
      "Tensor col_stats)");
  m.def(
      "loss_backward(Tensor grad_rows, Tensor grad_cols, Tensor x, Tensor y, Tensor? target_scale, Tensor row_stats, "
      "Tensor col_stats, str evidence, float tau, Tensor weights, int terms, bool rows, bool cols, int target_offset, "
      "bool[2] output_mask, str matmul_precision='ieee') -> (Tensor dx, Tensor dy)");
  m.def(
      "loss_forward_from_similarity(Tensor s, Tensor? target_scale, str evidence, float tau, Tensor weights, "
      "int terms, bool rows, bool cols) -> (Tensor row_losses, Tensor col_losses, Tensor row_stats, Tensor col_stats)");
  m.def(
      "loss_backward_from_similarity(Tensor grad_rows, Tensor grad_cols, Tensor s, Tensor? target_scale, "
      "Tensor row_stats, Tensor col_stats, str evidence, float tau, Tensor weights, int terms, bool rows, bool cols)"
      " -> Tensor ds");
  // ln S of every row (M) and column (N) of a rectangular s, no targets (SPEC §1 opinions).
  m.def(
      "opinion(Tensor x, Tensor y, str evidence, float tau, str matmul_precision='ieee') -> (Tensor row_log_strength, "
      "Tensor col_log_strength)");
  m.def(
      "opinion_from_similarity(Tensor s, str evidence, float tau) -> (Tensor row_log_strength, Tensor "
      "col_log_strength)");
  // InfoNCE (SPEC §2 "InfoNCE") of the logits x·yᵀ/τ, square K×K: per line ℓ = LSE over the
  // candidates − LSE over the positives (group: optional int64 (K,) ids; drop_self removes the
  // self term from both). row_stats/col_stats: float64 (2, K), the two log-sum-exps of each line
  // (kInfoNCELineStats, csrc/kernels/infonce_lines.h), all the backward needs.
  m.def(
      "infonce_forward(Tensor x, Tensor y, Tensor? group, float tau, bool drop_self, bool rows, bool cols, "
      "str matmul_precision='ieee') -> (Tensor row_losses, Tensor col_losses, Tensor row_stats, Tensor col_stats)");
  m.def(
      "infonce_backward(Tensor grad_rows, Tensor grad_cols, Tensor x, Tensor y, Tensor? group, Tensor row_stats, "
      "Tensor col_stats, float tau, bool drop_self, bool rows, bool cols, bool[2] output_mask, "
      "str matmul_precision='ieee') -> (Tensor dx, Tensor dy)");
}
