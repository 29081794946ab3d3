// CPU implementation of the InfoNCE ops (schemas in csrc/ops.cpp, SPEC §2 "InfoNCE"; per-line
// math in csrc/kernels/infonce_lines.h, tile loops in infonce_tiles.h).
//
// Forward: s = x·yᵀ is visited in tiles (one GEMM each) that are never stored; every row and
// column keeps a running maximum and Σ e^{s/τ − max} over its negatives and its positives
// (O(K) float64). Backward: each tile is recomputed, turned into (∂L/∂s)/τ from both lines'
// log-sum-exps, and accumulated into dx = G·y, dy = Gᵀ·x. Tiles run in the rounds of
// tile_rounds.h, so results are bitwise reproducible for any thread count.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../kernels/infonce_lines.h"
#include "../op_args.h"
#include "infonce_tile_args.h"
#include "packed_gemm.h"
#include "tile_isa.h"
#include "tile_rounds.h"

namespace evidential_ops {
namespace cpu {
namespace {

using at::Tensor;

// The InfoNCE tile kernels of the instruction set the evidential kernels use (EO_CPU_ISA).
InfoNCETileKernels infonce_kernels() {
  std::string isa;
  try {
    isa = active_tile_kernels().isa;
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
#if EO_X86_ISA_VARIANTS
  if (isa == "avx512") return avx512::infonce_tile_kernels();
  if (isa == "avx2") return avx2::infonce_tile_kernels();
#endif
  return generic::infonce_tile_kernels();
}

// The group ids: absent, or int64 of shape (k,) on like's device (the public API converts any
// integer dtype; a direct op call must pass int64).
void check_group(const c10::optional<Tensor>& group, std::int64_t k, const Tensor& like) {
  if (!group.has_value()) return;
  TORCH_CHECK_TYPE(group->scalar_type() == at::kLong, "group must be an int64 tensor of ids, got ",
                   group->scalar_type());
  TORCH_CHECK_VALUE(group->dim() == 1 && group->size(0) == k, "group must have shape (", k, ",), got ",
                    group->sizes());
  check_same_device(*group, "group", like, "the inputs");
}

// PositiveSets (infonce_tile_args.h) of k lines: members sorted by (group id, index).
struct Positives {
  std::vector<std::int64_t> members, begin, end;
  PositiveSets view() const { return PositiveSets{members.data(), begin.data(), end.data()}; }
};

Positives positive_sets(const c10::optional<Tensor>& group, std::int64_t k) {
  Positives p;
  p.members.resize(k);
  p.begin.resize(k);
  p.end.resize(k);
  std::iota(p.members.begin(), p.members.end(), 0);
  if (!group.has_value()) {
    std::iota(p.begin.begin(), p.begin.end(), 0);
    std::iota(p.end.begin(), p.end.end(), 1);
    return p;
  }
  const Tensor ids_tensor = group->contiguous();
  const std::int64_t* ids = ids_tensor.const_data_ptr<std::int64_t>();
  std::stable_sort(p.members.begin(), p.members.end(), [&](std::int64_t a, std::int64_t b) { return ids[a] < ids[b]; });
  for (std::int64_t first = 0; first < k;) {
    std::int64_t last = first + 1;
    while (last < k && ids[p.members[last]] == ids[p.members[first]]) ++last;
    for (std::int64_t q = first; q < last; ++q) {
      p.begin[p.members[q]] = first;
      p.end[p.members[q]] = last;
    }
    first = last;
  }
  return p;
}

// x and y in the compute dtype (float32 for float32/half inputs, float64 for float64), contiguous.
std::pair<Tensor, Tensor> compute_inputs(const Tensor& x, const Tensor& y) {
  check_embeddings(x, y);
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x must be a CPU tensor for the cpu kernels, got ", x.device());
  const at::ScalarType type = compute_type(x.scalar_type());
  // Detached: the tile GEMMs run on OpenMP workers, which do not inherit the autograd exclusion
  // of the calling thread.
  return {x.detach().to(type).contiguous(), y.detach().to(type).contiguous()};
}

// The tile of s = x·yᵀ at rows [r0, r0 + nr), cols [c0, c0 + nc), written into `buffer`.
TileRef gemm_tile(const Tensor& x, const Tensor& y, const PackedBlocks* packed_y, std::int64_t r0, std::int64_t nr,
                  std::int64_t c0, std::int64_t nc, Tensor& buffer) {
  Tensor out = at::from_blob(buffer.data_ptr(), {nr, nc}, buffer.options());
  const bool done = packed_y != nullptr && packed_y->multiply(c0, nc, x.const_data_ptr<float>() + r0 * x.size(1),
                                                              x.size(1), false, nr, 0.0f, out.data_ptr<float>(), nc);
  if (!done) at::mm_out(out, x.narrow(0, r0, nr), y.narrow(0, c0, nc).t());
  return TileRef{out.const_data_ptr(), x.scalar_type() == at::kDouble, nc, nr, nc, r0, c0};
}

// Visits every tile of the K×K problem in rounds; fn(tile, grad buffer, scratch, r0, nr, c0, nc).
template <typename Fn>
void for_each_gemm_tile(const Tensor& x, const Tensor& y, const PackedBlocks* packed_y, bool with_grad,
                        const Fn& fn) {
  const std::int64_t k = x.size(0), block = block_size(k);
  for_each_tile(num_blocks(k, block), num_blocks(k, block), [&](std::int64_t r, std::int64_t c) {
    const std::int64_t r0 = r * block, c0 = c * block;
    const std::int64_t nr = std::min(block, k - r0), nc = std::min(block, k - c0);
    Tensor buffer = at::empty({block * block}, x.options());
    Tensor grad = with_grad ? at::empty({block * block}, x.options()) : Tensor();
    std::vector<double> scratch(4 * block);
    fn(gemm_tile(x, y, packed_y, r0, nr, c0, nc, buffer), grad, scratch.data(), r0, nr, c0, nc);
  });
}

// A direction's accumulators: (kInfoNCEAccumulators, k), maxima −inf and sums 0.
Tensor empty_accumulators(std::int64_t k) {
  Tensor acc = at::zeros({kInfoNCEAccumulators, k}, at::TensorOptions().dtype(at::kDouble));
  acc[kAccNegativeMax].fill_(-INFINITY);
  acc[kAccPositiveMax].fill_(-INFINITY);
  return acc;
}

// (kInfoNCELineStats, k) log-sum-exps of a direction's accumulators; raises for a line without
// positives (drop_self with a group of one) and for non-finite logits.
Tensor log_sum_exps(const Tensor& acc, double tau) {
  const std::int64_t k = acc.size(1);
  Tensor stats = at::empty({kInfoNCELineStats, k}, acc.options());
  const double* a = acc.const_data_ptr<double>();
  double* out = stats.data_ptr<double>();
  bool no_positive = false, not_finite = false;
  for (std::int64_t i = 0; i < k; ++i) {
    // −inf is a line without negatives (every candidate in its group) or without positives.
    const double negatives = generic::log_sum_exp_value(a[kAccNegativeMax * k + i], a[kAccNegativeSum * k + i]);
    const double positives = generic::log_sum_exp_value(a[kAccPositiveMax * k + i], a[kAccPositiveSum * k + i]);
    no_positive |= positives == -INFINITY;
    not_finite |= std::isnan(negatives) || negatives == INFINITY || std::isnan(positives) || positives == INFINITY;
    out[kInfoNCENegatives * k + i] = negatives;
    out[kInfoNCEPositives * k + i] = positives;
  }
  TORCH_CHECK_VALUE(!not_finite, "tau=", tau, " or the similarities are too large: a logit s/tau is not finite. ",
                    kNormaliseHint);
  TORCH_CHECK_VALUE(!no_positive, "group: with drop_self=True every line needs another member of its group (a group "
                    "of one, or no group ids at all, leaves a line without positives)");
  return stats;
}

// ℓ per line from a direction's statistics (infonce_line_loss), in `type`; zeros for a direction
// not computed.
Tensor line_losses(const Tensor& stats, bool used, at::ScalarType type) {
  const std::int64_t k = stats.size(1);
  Tensor losses = at::zeros({k}, stats.options());
  if (used) {
    const double* lse = stats.const_data_ptr<double>();
    double* out = losses.data_ptr<double>();
    for (std::int64_t i = 0; i < k; ++i) {
      out[i] = infonce_line_loss(lse[kInfoNCENegatives * k + i], lse[kInfoNCEPositives * k + i]);
    }
  }
  return losses.to(type);
}

// The (kInfoNCEBackwardLines, k) lines the backward tiles read (infonce_lines.h), from statistics.
Tensor backward_lines(const Tensor& stats) {
  const std::int64_t k = stats.size(1);
  const Tensor lse = stats.contiguous();
  Tensor lines = at::empty({kInfoNCEBackwardLines, k}, lse.options());
  const double* in = lse.const_data_ptr<double>();
  double* out = lines.data_ptr<double>();
  for (std::int64_t i = 0; i < k; ++i) {
    const double negatives = in[kInfoNCENegatives * k + i], positives = in[kInfoNCEPositives * k + i];
    out[kBackCandidates * k + i] = infonce_candidates_lse(negatives, positives);
    out[kBackPositives * k + i] = positives;
    out[kBackNegativeShare * k + i] = infonce_negative_share(negatives, positives);
  }
  return lines;
}

void check_infonce_stats(const Tensor& stats, const char* name, std::int64_t k, const Tensor& like) {
  TORCH_CHECK_TYPE(stats.scalar_type() == at::kDouble, name, " must be the float64 statistics of the forward, got ",
                   stats.scalar_type());
  TORCH_CHECK_VALUE(stats.dim() == 2 && stats.size(0) == kInfoNCELineStats && stats.size(1) == k, name,
                    " must be the (", kInfoNCELineStats, ", ", k, ") statistics of the forward, got ", stats.sizes());
  check_same_device(stats, name, like, "the inputs");
}

// ---------------------------------------------------------------------------------------------
// Operators

std::tuple<Tensor, Tensor, Tensor, Tensor> infonce_forward(const Tensor& x_in, const Tensor& y_in,
                                                           const c10::optional<Tensor>& group, double tau,
                                                           bool drop_self, bool rows, bool cols,
                                                           const std::string& matmul_precision) {
  tf32_requested(matmul_precision);  // checked and otherwise ignored: CPU products are exact
  auto [x, y] = compute_inputs(x_in, y_in);
  const std::int64_t k = x.size(0);
  check_square(k, y.size(0));
  check_group(group, k, x_in);
  const double inv_tau = checked_inverse_tau(tau);
  const Positives positives = positive_sets(group, k);
  const InfoNCETileKernels tile_kernels = infonce_kernels();
  Tensor row_acc = empty_accumulators(k), col_acc = empty_accumulators(k);
  // y's blocks packed once for the forward's similarity tiles (packed_gemm.h).
  const std::int64_t block = block_size(k);
  const std::unique_ptr<const PackedBlocks> packed_y = packed_if_it_pays(y, block, block, true, k);
  for_each_gemm_tile(x, y, packed_y.get(), false, [&](const TileRef& tile, Tensor&, double* scratch, std::int64_t, std::int64_t,
                                      std::int64_t, std::int64_t) {
    InfoNCEForwardTile t{};
    t.s = tile;
    t.inv_tau = inv_tau;
    t.drop_self = drop_self;
    t.positives = positives.view();
    t.row_acc = rows ? row_acc.data_ptr<double>() : nullptr;
    t.col_acc = cols ? col_acc.data_ptr<double>() : nullptr;
    t.n = k;
    t.scratch = scratch;
    tile_kernels.forward(t);
  });
  const auto stats_options = at::TensorOptions().dtype(at::kDouble);
  Tensor row_stats = rows ? log_sum_exps(row_acc, tau) : at::zeros({kInfoNCELineStats, k}, stats_options);
  Tensor col_stats = cols ? log_sum_exps(col_acc, tau) : at::zeros({kInfoNCELineStats, k}, stats_options);
  const at::ScalarType out_type = compute_type(x_in.scalar_type());
  // ℓ = ln(1 + e^{LSE_N − LSE_P}) in float64, rounded once.
  return {line_losses(row_stats, rows, out_type), line_losses(col_stats, cols, out_type), row_stats, col_stats};
}

std::tuple<Tensor, Tensor> infonce_backward(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& x_in,
                                            const Tensor& y_in, const c10::optional<Tensor>& group,
                                            const Tensor& row_stats, const Tensor& col_stats, double tau,
                                            bool drop_self, bool rows, bool cols, std::array<bool, 2> output_mask,
                                            const std::string& matmul_precision) {
  tf32_requested(matmul_precision);
  auto [x, y] = compute_inputs(x_in, y_in);
  const std::int64_t k = x.size(0);
  check_square(k, y.size(0));
  check_group(group, k, x_in);
  check_infonce_stats(row_stats, "row_stats", k, x_in);
  check_infonce_stats(col_stats, "col_stats", k, x_in);
  check_upstream(grad_rows, "grad_rows", k, rows, x_in);
  check_upstream(grad_cols, "grad_cols", k, cols, x_in);
  const double inv_tau = checked_inverse_tau(tau);
  const bool need_dx = output_mask[0], need_dy = output_mask[1];
  if ((!need_dx && !need_dy) || (!rows && !cols)) {
    return {need_dx ? at::zeros_like(x_in, at::MemoryFormat::Contiguous) : at::empty({0}, x_in.options()),
            need_dy ? at::zeros_like(y_in, at::MemoryFormat::Contiguous) : at::empty({0}, y_in.options())};
  }
  const Positives positives = positive_sets(group, k);
  const InfoNCETileKernels tile_kernels = infonce_kernels();
  const Tensor row_lse = backward_lines(row_stats), col_lse = backward_lines(col_stats);
  const Tensor row_up = rows ? grad_rows.to(at::kDouble).contiguous() : Tensor();
  const Tensor col_up = cols ? grad_cols.to(at::kDouble).contiguous() : Tensor();
  Tensor dx = need_dx ? at::zeros_like(x) : Tensor();
  Tensor dy = need_dy ? at::zeros_like(y) : Tensor();
  // x's blocks packed as the B operand of dy_c += Gᵀ·x_r: one packed copy per pass, as the
  // evidential backward (evidential_cpu.cpp).
  const std::int64_t block = block_size(k), d = x.size(1);
  const std::unique_ptr<const PackedBlocks> packed_x =
      need_dy ? packed_if_it_pays(x, block, block, false, k) : nullptr;
  for_each_gemm_tile(x, y, nullptr, true, [&](const TileRef& tile, Tensor& grad, double* scratch, std::int64_t r0,
                                     std::int64_t nr, std::int64_t c0, std::int64_t nc) {
    InfoNCEBackwardTile t{};
    t.s = tile;
    t.inv_tau = inv_tau;
    t.drop_self = drop_self;
    t.positives = positives.view();
    t.row_lse = row_lse.const_data_ptr<double>();
    t.col_lse = col_lse.const_data_ptr<double>();
    t.row_upstream = rows ? row_up.const_data_ptr<double>() : nullptr;
    t.col_upstream = cols ? col_up.const_data_ptr<double>() : nullptr;
    t.n = k;
    t.grad = grad.data_ptr();
    t.grad_is_double = tile.is_double;
    t.grad_ld = nc;
    t.scratch = scratch;
    tile_kernels.backward(t);
    const Tensor g = at::from_blob(grad.data_ptr(), {nr, nc}, grad.options());
    if (need_dx) {  // dx[r] += G·y[c]
      Tensor dx_block = dx.narrow(0, r0, nr);
      dx_block.addmm_(g, y.narrow(0, c0, nc));
    }
    if (need_dy) {  // dy[c] += Gᵀ·x[r]
      const bool done = packed_x != nullptr && packed_x->multiply(r0, nr, g.const_data_ptr<float>(), nc, true, nc,
                                                                  1.0f, dy.data_ptr<float>() + c0 * d, d);
      if (!done) dy.narrow(0, c0, nc).addmm_(g.t(), x.narrow(0, r0, nr));
    }
  });
  return {need_dx ? dx.to(x_in.scalar_type()) : at::empty({0}, x_in.options()),
          need_dy ? dy.to(y_in.scalar_type()) : at::empty({0}, y_in.options())};
}

}  // namespace
}  // namespace cpu
}  // namespace evidential_ops

TORCH_LIBRARY_IMPL(evidential_ops, CPU, m) {
  using namespace evidential_ops::cpu;
  m.impl("infonce_forward", &infonce_forward);
  m.impl("infonce_backward", &infonce_backward);
}
