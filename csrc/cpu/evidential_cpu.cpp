// CPU implementations of the evidential_ops operators (schemas in csrc/ops.cpp; argument checks
// in csrc/op_args.h, shared with every device; per-element and per-line math in csrc/kernels/).
//
// Shape of every op (README "Backends"): the similarity matrix is visited tile by tile (a tile
// GEMM from x and y, or a block of the given s) and never stored. Tiles are processed in rounds
// in which no two tiles share a row block or a column block (tile (r, c) belongs to round
// (r + c) mod M), so the row statistics, the column statistics, dx and dy are all accumulated
// without atomics, without per-thread partial buffers, and in an order that does not depend on
// the number of threads: results are bitwise reproducible.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/line_finalise.h"
#include "../op_args.h"
#include "packed_gemm.h"
#include "tile_args.h"
#include "tile_isa.h"
#include "tile_rounds.h"

namespace evidential_ops {
namespace cpu {
namespace {

using at::Tensor;
using generic::LineArrays;

// The tile kernels of the active instruction set; a bad EO_CPU_ISA is a ValueError naming it.
const TileKernels& kernels() {
  try {
    return active_tile_kernels();
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

TermFlags term_flags(const TermSelection& terms) {
  return TermFlags{terms.kl, terms.fmse, terms.logdet, terms.enabled[generic::kMse]};
}

// Where the values of a tile of s come from: a GEMM of embedding blocks, or a block of s itself.
class TileSource {
 public:
  // From embeddings x (n_rows, D) and y (n_cols, D), already in the compute dtype and contiguous.
  // Inputs are detached: the tile GEMMs run on OpenMP workers, which do not inherit the
  // autograd-exclusion of the calling thread, and a kernel never needs their history.
  TileSource(const Tensor& x, const Tensor& y) : x_(x.detach()), y_(y.detach()), from_embeddings_(true) {
    n_rows_ = x_.size(0);
    n_cols_ = y_.size(0);
    type_ = x_.scalar_type();
  }
  // From a similarity matrix (any float dtype and strides).
  explicit TileSource(const Tensor& s) : s_(s.detach()), from_embeddings_(false) {
    n_rows_ = s_.size(0);
    n_cols_ = s_.size(1);
    type_ = compute_type(s_.scalar_type());
    direct_ = (s_.scalar_type() == at::kFloat || s_.scalar_type() == at::kDouble) && s_.stride(1) == 1;
  }

  // The same source with y's blocks of `col_block` rows packed once for the tile GEMMs of
  // row_block-row blocks of x (packed_gemm.h), where that path is on, the inputs are float32 and
  // x has two such blocks or more.
  TileSource packed(std::int64_t row_block, std::int64_t col_block) const {
    TileSource out = *this;
    if (from_embeddings_) out.packed_y_ = packed_if_it_pays(y_, col_block, row_block, true, n_rows_);
    return out;
  }

  std::int64_t rows() const { return n_rows_; }
  std::int64_t cols() const { return n_cols_; }
  at::ScalarType type() const { return type_; }
  const Tensor& x() const { return x_; }
  const Tensor& y() const { return y_; }

  // The tile at rows [r0, r0 + nr), cols [c0, c0 + nc); `buffer` is a contiguous tensor of at
  // least nr·nc elements of the compute dtype, used when the values have to be materialised.
  TileRef tile(std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, Tensor& buffer) const {
    TileRef ref{};
    ref.is_double = type_ == at::kDouble;
    ref.rows = nr;
    ref.cols = nc;
    ref.row0 = r0;
    ref.col0 = c0;
    if (!from_embeddings_ && direct_) {
      ref.ld = s_.stride(0);
      ref.data = static_cast<const char*>(s_.const_data_ptr()) + (r0 * s_.stride(0) + c0) * s_.element_size();
      return ref;
    }
    Tensor out = at::from_blob(buffer.data_ptr(), {nr, nc}, buffer.options());
    if (from_embeddings_) {
      const bool done = packed_y_ != nullptr &&
                        packed_y_->multiply(c0, nc, x_.const_data_ptr<float>() + r0 * x_.size(1), x_.size(1), false,
                                            nr, 0.0f, out.data_ptr<float>(), nc);
      if (!done) at::mm_out(out, x_.narrow(0, r0, nr), y_.narrow(0, c0, nc).t());
    } else {
      out.copy_(s_.narrow(0, r0, nr).narrow(1, c0, nc));
    }
    ref.ld = nc;
    ref.data = out.const_data_ptr();
    return ref;
  }

 private:
  Tensor x_, y_, s_;
  std::shared_ptr<const PackedBlocks> packed_y_;
  bool from_embeddings_;
  bool direct_ = false;
  std::int64_t n_rows_ = 0, n_cols_ = 0;
  at::ScalarType type_ = at::kFloat;
};

// Per-thread scratch for one tile: the tile buffer, the gradient buffer (backward only) and the
// double rows.
struct Scratch {
  Tensor tile, grad;
  std::vector<double> lines;
  Scratch(std::int64_t bm, std::int64_t bn, at::ScalarType type, bool with_grad) {
    tile = at::empty({bm * bn}, at::TensorOptions().dtype(type));
    if (with_grad) grad = at::empty({bm * bn}, at::TensorOptions().dtype(type));
    lines.resize(15 * bn);  // forward: α, 7 column sinks, 4 tabulated element values, 6 float columns; backward 14
  }
};

// Rectangular problems (a few queries over a large gallery) would run only short-side-many
// tiles per round. From this ratio of long to short blocks on, the long side is cut into a fixed
// number of chunks instead: each chunk owns its long-side lines and sums the short side into a
// partial of its own, and the partials are added in chunk order, so the result still does not
// depend on the number of threads. The partials cost kStatChunks·7·n_short doubles.
constexpr std::int64_t kStatChunks = 32;
constexpr std::int64_t kMaxChunkedShortSide = 4096;

// What one pass needs to know about its targets: none (opinions), or row i's target at column
// i + offset.
struct Targets {
  bool present;
  std::int64_t offset;
};

// The LineStat statistics of every row and column: (kNumLineStats, M) and (kNumLineStats, N),
// float64, zeros for a direction not asked for. Columns of a strip are partial (its rows only).
std::pair<Tensor, Tensor> accumulate_stats(const TileSource& unpacked, int evidence, double inv_tau, Targets targets,
                                           TermFlags flags, bool rows, bool cols) {
  const std::int64_t bm = block_size(unpacked.rows()), bn = block_size(unpacked.cols());
  const TileSource source = unpacked.packed(bm, bn);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  Tensor row_stats = at::zeros({kNumLineStats, source.rows()}, options);
  Tensor col_stats = at::zeros({kNumLineStats, source.cols()}, options);
  double* row_out = rows ? row_stats.data_ptr<double>() : nullptr;
  double* col_out = cols ? col_stats.data_ptr<double>() : nullptr;
  const TileKernels& tile_kernels = kernels();
  const auto run_tile = [&](std::int64_t r, std::int64_t c, double* row_dst, std::int64_t row_stride,
                            double* col_dst, std::int64_t col_stride) {
    Scratch scratch(bm, bn, source.type(), false);
    const std::int64_t r0 = r * bm, c0 = c * bn;
    ForwardTile t{};
    t.s = source.tile(r0, std::min(bm, source.rows() - r0), c0, std::min(bn, source.cols() - c0), scratch.tile);
    t.evidence = evidence;
    t.inv_tau = inv_tau;
    t.has_targets = targets.present;
    t.target_offset = targets.offset;
    t.terms = flags;
    t.row_stats = row_dst;
    t.row_stride = row_stride;
    t.col_stats = col_dst;
    t.col_stride = col_stride;
    t.scratch = scratch.lines.data();
    tile_kernels.forward(t);
  };

  const std::int64_t row_blocks = num_blocks(source.rows(), bm), col_blocks = num_blocks(source.cols(), bn);
  const bool rows_short = row_blocks < col_blocks;
  const std::int64_t short_blocks = std::min(row_blocks, col_blocks), long_blocks = std::max(row_blocks, col_blocks);
  const std::int64_t n_short = rows_short ? source.rows() : source.cols();
  if (long_blocks < 2 * short_blocks || n_short > kMaxChunkedShortSide) {
    for_each_tile(row_blocks, col_blocks, [&](std::int64_t r, std::int64_t c) {
      run_tile(r, c, row_out, source.rows(), col_out, source.cols());
    });
    return {row_stats, col_stats};
  }
  double* short_out = rows_short ? row_out : col_out;
  const std::int64_t chunks = std::min(kStatChunks, long_blocks);
  Tensor partial = at::zeros({chunks, kNumLineStats, n_short}, options);
  double* partials = partial.data_ptr<double>();
  at::parallel_for(0, chunks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t chunk = begin; chunk < end; ++chunk) {
      double* mine = short_out != nullptr ? partials + chunk * kNumLineStats * n_short : nullptr;
      for (std::int64_t b = chunk * long_blocks / chunks; b < (chunk + 1) * long_blocks / chunks; ++b) {
        for (std::int64_t a = 0; a < short_blocks; ++a) {
          if (rows_short) {
            run_tile(a, b, mine, n_short, col_out, source.cols());
          } else {
            run_tile(b, a, row_out, source.rows(), mine, n_short);
          }
        }
      }
    }
  });
  if (short_out != nullptr) {
    at::parallel_for(0, n_short, 256, [&](std::int64_t begin, std::int64_t end) {
      for (int k = 0; k < kNumLineStats; ++k) {
        for (std::int64_t i = begin; i < end; ++i) {
          double sum = 0.0;
          for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partials[(chunk * kNumLineStats + k) * n_short + i];
          short_out[k * n_short + i] = sum;
        }
      }
    });
  }
  return {row_stats, col_stats};
}

// Whether some line's Σα overflowed double: exp evidence at |s|/τ beyond ~709, or an infinite
// similarity passed with check_finite=False (a NaN strength, from a NaN input, is left to propagate).
bool strength_overflowed(const Tensor& stats) {
  return at::isinf(stats[generic::kRest] + stats[generic::kTargetAlpha]).any().item<bool>();
}

void check_finite_strengths(const Tensor& stats, double tau, const std::string& evidence) {
  TORCH_CHECK_VALUE(!strength_overflowed(stats), tau_overflow_message(tau, evidence));
}

const double* scale_data(const Tensor& scale) { return scale.defined() ? scale.const_data_ptr<double>() : nullptr; }

Tensor scale_vector(const c10::optional<Tensor>& target_scale) {
  if (!target_scale.has_value()) return Tensor();
  return target_scale->to(at::kDouble).contiguous();
}

// One direction's lines: M rows reading c at i + offset, or N columns reading c at j; N candidates.
LineArrays line_arrays(const Tensor& stats, const Tensor& scale, std::int64_t scale_offset, std::int64_t candidates) {
  return LineArrays{stats.const_data_ptr<double>(), stats.size(1), scale_data(scale), scale_offset,
                    static_cast<double>(candidates)};
}

// Σ_term weight·term of every line of one direction (float64).
Tensor finalise_losses(const LineArrays& lines, const std::array<double, kNumTerms>& weight,
                       const TermSelection& terms) {
  Tensor losses = at::empty({lines.n}, at::TensorOptions().dtype(at::kDouble));
  double* out = losses.data_ptr<double>();
  at::parallel_for(0, lines.n, 256, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = generic::line_loss(lines, i, weight.data(), terms.enabled);
  });
  return losses;
}

// LineGradient of every line of one direction as a (kNumGradientFields, n) array (zeros if off).
Tensor line_constants(const LineArrays& lines, bool enabled, const std::array<double, kNumTerms>& weight,
                      const TermSelection& terms, const Tensor& upstream) {
  Tensor g = at::zeros({kNumGradientFields, lines.n}, at::TensorOptions().dtype(at::kDouble));
  if (!enabled) return g;
  const Tensor up = upstream.to(at::kDouble).contiguous();
  const double* u = up.const_data_ptr<double>();
  double* out = g.data_ptr<double>();
  at::parallel_for(0, lines.n, 256, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      generic::store_line_gradient(lines, i, weight.data(), terms.enabled, u[i], out);
    }
  });
  return g;
}

// Tensors that must live on the CPU with the inputs (a meta or CUDA tensor here would be read as
// host memory).
void check_on_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor for the cpu kernels, got ", t.device());
}

struct LossOptions {
  int evidence;
  double inv_tau;
  TermSelection terms;
  std::array<double, kNumTerms> weight;
};

LossOptions loss_options(const std::string& evidence, double tau, const Tensor& weights, std::int64_t terms,
                         const Tensor& like) {
  const int kind = evidence_index(evidence);
  const double inv_tau = checked_inverse_tau(tau);
  const TermSelection selection = select_terms(terms);
  check_weights(weights, like);
  check_on_cpu(weights, "weights");
  return LossOptions{kind, inv_tau, selection, host_weights(weights, selection)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> forward_impl(const TileSource& source,
                                                        const c10::optional<Tensor>& target_scale,
                                                        const std::string& evidence, double tau, const Tensor& weights,
                                                        std::int64_t terms, bool rows, bool cols, const Tensor& like) {
  check_square(source.rows(), source.cols());
  check_target_scale(target_scale, source.rows(), like);
  const LossOptions o = loss_options(evidence, tau, weights, terms, like);
  auto [row_stats, col_stats] =
      accumulate_stats(source, o.evidence, o.inv_tau, Targets{true, 0}, term_flags(o.terms), rows, cols);
  if (rows) check_finite_strengths(row_stats, tau, evidence);
  if (cols) check_finite_strengths(col_stats, tau, evidence);
  const Tensor scale = scale_vector(target_scale);
  const std::int64_t k = source.rows();
  const at::ScalarType out_type = compute_type(like.scalar_type());
  const auto options = at::TensorOptions().dtype(out_type);
  Tensor row_losses = rows ? finalise_losses(line_arrays(row_stats, scale, 0, k), o.weight, o.terms).to(out_type)
                           : at::zeros({k}, options);
  Tensor col_losses = cols ? finalise_losses(line_arrays(col_stats, scale, 0, k), o.weight, o.terms).to(out_type)
                           : at::zeros({k}, options);
  return {row_losses, col_losses, row_stats, col_stats};
}

// Runs the backward tile kernel over every tile; `consume(r0, nr, c0, nc, grad_tile)` then uses
// ∂L/∂s of the tile (accumulates dx/dy, or stores ds). Rounds make consume's writes exclusive.
template <typename Consume>
void for_each_gradient_tile(const TileSource& source, const LossOptions& o, std::int64_t target_offset,
                            const Tensor& row_g, const Tensor& col_g, const Consume& consume) {
  const std::int64_t bm = block_size(source.rows()), bn = block_size(source.cols());
  const TileKernels& tile_kernels = kernels();
  for_each_tile(num_blocks(source.rows(), bm), num_blocks(source.cols(), bn), [&](std::int64_t r, std::int64_t c) {
    Scratch scratch(bm, bn, source.type(), true);
    const std::int64_t r0 = r * bm, c0 = c * bn;
    const std::int64_t nr = std::min(bm, source.rows() - r0), nc = std::min(bn, source.cols() - c0);
    BackwardTile t{};
    t.s = source.tile(r0, nr, c0, nc, scratch.tile);
    t.evidence = o.evidence;
    t.inv_tau = o.inv_tau;
    t.target_offset = target_offset;
    t.terms = term_flags(o.terms);
    t.row_constants = row_g.const_data_ptr<double>();
    t.n_rows = source.rows();
    t.col_constants = col_g.const_data_ptr<double>();
    t.n_cols = source.cols();
    t.grad = scratch.grad.data_ptr();
    t.grad_is_double = source.type() == at::kDouble;
    t.grad_ld = nc;
    t.scratch = scratch.lines.data();
    tile_kernels.backward(t);
    consume(r0, nr, c0, nc, at::from_blob(scratch.grad.data_ptr(), {nr, nc}, scratch.grad.options()));
  });
}

// What a backward op needs before its tiles: the options and the per-line gradient constants of
// each direction. Rows [offset, offset + M) of an N×N problem (square: offset 0, M = N).
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
  return {o, line_constants(line_arrays(row_lines, scale, target_offset, n), rows, o.weight, o.terms, grad_rows),
          line_constants(line_arrays(col_lines, scale, 0, n), cols, o.weight, o.terms, grad_cols)};
}

TileSource embeddings_source(const Tensor& x, const Tensor& y) {
  check_embeddings(x, y);
  const at::ScalarType type = compute_type(x.scalar_type());
  return TileSource(x.to(type).contiguous(), y.to(type).contiguous());
}

// ---------------------------------------------------------------------------------------------
// Operators

// matmul_precision is checked and otherwise ignored here: CPU products are exact float32 (or
// float64) whatever it says.
std::tuple<Tensor, Tensor> line_stats(const Tensor& x, const Tensor& y, std::int64_t target_offset,
                                      const std::string& evidence, double tau, std::int64_t terms, bool rows,
                                      bool cols, const std::string& matmul_precision) {
  tf32_requested(matmul_precision);
  const TileSource source = embeddings_source(x, y);
  check_strip(source.rows(), source.cols(), target_offset);
  // In the order of every other op (evidence, then τ, then terms): the same error for the same call.
  const int kind = evidence_index(evidence);
  const double inv_tau = checked_inverse_tau(tau);
  const TermSelection selection = select_terms(terms);
  auto [row_stats, col_stats] =
      accumulate_stats(source, kind, inv_tau, Targets{true, target_offset}, term_flags(selection), rows, cols);
  // Columns of a strip are partial: only the caller's sum over every strip can overflow-check them.
  if (rows) check_finite_strengths(row_stats, tau, evidence);
  return {row_stats, col_stats};
}

std::tuple<Tensor, Tensor> line_losses(const Tensor& row_stats, const Tensor& col_stats,
                                       const c10::optional<Tensor>& target_scale, std::int64_t target_offset,
                                       const Tensor& weights, std::int64_t terms, bool rows, bool cols) {
  check_on_cpu(row_stats, "row_stats");
  const std::int64_t m = row_stats.dim() == 2 ? row_stats.size(1) : -1;
  const std::int64_t n = col_stats.dim() == 2 ? col_stats.size(1) : -1;
  check_line_stats(row_stats, "row_stats", m, row_stats);
  check_line_stats(col_stats, "col_stats", n, row_stats);
  check_strip(m, n, target_offset);
  check_target_scale(target_scale, n, row_stats);
  const TermSelection selection = select_terms(terms);
  check_weights(weights, row_stats);
  const std::array<double, kNumTerms> weight = host_weights(weights, selection);
  TORCH_CHECK_VALUE(!(rows && strength_overflowed(row_stats)) && !(cols && strength_overflowed(col_stats)),
                    kStrengthOverflowMessage);
  const Tensor scale = scale_vector(target_scale);
  const Tensor row_lines = row_stats.contiguous(), col_lines = col_stats.contiguous();
  const auto options = at::TensorOptions().dtype(at::kDouble);
  return {rows ? finalise_losses(line_arrays(row_lines, scale, target_offset, n), weight, selection)
               : at::zeros({m}, options),
          cols ? finalise_losses(line_arrays(col_lines, scale, 0, n), weight, selection) : at::zeros({n}, options)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> loss_forward(const Tensor& x, const Tensor& y,
                                                        const c10::optional<Tensor>& target_scale,
                                                        const std::string& evidence, double tau, const Tensor& weights,
                                                        std::int64_t terms, bool rows, bool cols,
                                                        const std::string& matmul_precision) {
  tf32_requested(matmul_precision);
  const TileSource source = embeddings_source(x, y);
  return forward_impl(source, target_scale, evidence, tau, weights, terms, rows, cols, x);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> loss_forward_from_similarity(
    const Tensor& s, const c10::optional<Tensor>& target_scale, const std::string& evidence, double tau,
    const Tensor& weights, std::int64_t terms, bool rows, bool cols) {
  check_similarity(s);
  return forward_impl(TileSource(s), target_scale, evidence, tau, weights, terms, rows, cols, s);
}

std::tuple<Tensor, Tensor> loss_backward(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& x,
                                         const Tensor& y, const c10::optional<Tensor>& target_scale,
                                         const Tensor& row_stats, const Tensor& col_stats,
                                         const std::string& evidence, double tau, const Tensor& weights,
                                         std::int64_t terms, bool rows, bool cols, std::int64_t target_offset,
                                         std::array<bool, 2> output_mask, const std::string& matmul_precision) {
  tf32_requested(matmul_precision);
  const TileSource source = embeddings_source(x, y);
  const BackwardLines lines = backward_lines(source.rows(), source.cols(), target_offset, grad_rows, grad_cols,
                                             target_scale, row_stats, col_stats, evidence, tau, weights, terms, rows,
                                             cols, x);
  const bool need_dx = output_mask[0];
  const bool need_dy = output_mask[1];
  if (!need_dx && !need_dy) return {at::empty({0}, x.options()), at::empty({0}, y.options())};
  Tensor dx = need_dx ? at::zeros_like(source.x()) : Tensor();
  Tensor dy = need_dy ? at::zeros_like(source.y()) : Tensor();
  // x's blocks packed as the B operand of dy_c += Gᵀ·x_r (packed_gemm.h). One packed copy per pass
  // at most: the backward's peak holds dx, dy and that copy (3·K·D floats, 24 MiB at K = 4096,
  // D = 512, within the 32 MiB of bench/test_bench_memory.py); packing y for the similarity tiles
  // and for dx as well would save 10% per backward tile instead of 3% (packed_gemm.h), for 16 MiB
  // more.
  const std::int64_t bm = block_size(source.rows()), bn = block_size(source.cols());
  const std::unique_ptr<const PackedBlocks> packed_x =
      need_dy ? packed_if_it_pays(source.x(), bm, bn, false, source.cols()) : nullptr;
  const std::int64_t d = source.x().size(1);
  for_each_gradient_tile(source, lines.options, target_offset, lines.rows, lines.cols,
                         [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, const Tensor& g) {
                           if (need_dx) {  // dx[r] += G·y[c]
                             dx.narrow(0, r0, nr).addmm_(g, source.y().narrow(0, c0, nc));
                           }
                           if (need_dy) {  // dy[c] += Gᵀ·x[r]
                             const bool done = packed_x != nullptr &&
                                               packed_x->multiply(r0, nr, g.const_data_ptr<float>(), nc, true, nc,
                                                                  1.0f, dy.data_ptr<float>() + c0 * d, d);
                             if (!done) dy.narrow(0, c0, nc).addmm_(g.t(), source.x().narrow(0, r0, nr));
                           }
                         });
  return {need_dx ? dx.to(x.scalar_type()) : at::empty({0}, x.options()),
          need_dy ? dy.to(y.scalar_type()) : at::empty({0}, y.options())};
}

Tensor loss_backward_from_similarity(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& s,
                                     const c10::optional<Tensor>& target_scale, const Tensor& row_stats,
                                     const Tensor& col_stats, const std::string& evidence, double tau,
                                     const Tensor& weights, std::int64_t terms, bool rows, bool cols) {
  check_similarity(s);
  const TileSource source(s);
  check_square(source.rows(), source.cols());
  const BackwardLines lines = backward_lines(source.rows(), source.cols(), 0, grad_rows, grad_cols, target_scale,
                                             row_stats, col_stats, evidence, tau, weights, terms, rows, cols, s);
  Tensor ds = at::empty({source.rows(), source.cols()}, s.options());
  for_each_gradient_tile(source, lines.options, 0, lines.rows, lines.cols,
                         [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, const Tensor& g) {
                           ds.narrow(0, r0, nr).narrow(1, c0, nc).copy_(g);
                         });
  return ds;
}

std::tuple<Tensor, Tensor> opinion_impl(const TileSource& source, const std::string& evidence, double tau,
                                        at::ScalarType out_type) {
  TORCH_CHECK_VALUE(source.rows() >= 1 && source.cols() >= 1, "opinions need at least one query and candidate");
  const int kind = evidence_index(evidence);
  const double inv_tau = checked_inverse_tau(tau);
  auto [row_stats, col_stats] =
      accumulate_stats(source, kind, inv_tau, Targets{false, 0}, TermFlags{false, false, false, false}, true, true);
  check_finite_strengths(row_stats, tau, evidence);
  check_finite_strengths(col_stats, tau, evidence);
  // No targets: rest is the whole sum S.
  return {row_stats[generic::kRest].log().to(out_type), col_stats[generic::kRest].log().to(out_type)};
}

std::tuple<Tensor, Tensor> opinion(const Tensor& x, const Tensor& y, const std::string& evidence, double tau,
                                   const std::string& matmul_precision) {
  tf32_requested(matmul_precision);
  return opinion_impl(embeddings_source(x, y), evidence, tau, compute_type(x.scalar_type()));
}

std::tuple<Tensor, Tensor> opinion_from_similarity(const Tensor& s, const std::string& evidence, double tau) {
  check_similarity(s);
  return opinion_impl(TileSource(s), evidence, tau, compute_type(s.scalar_type()));
}

}  // namespace
}  // namespace cpu
}  // namespace evidential_ops

TORCH_LIBRARY_IMPL(evidential_ops, CPU, m) {
  using namespace evidential_ops::cpu;
  m.impl("line_stats", &line_stats);
  m.impl("line_losses", &line_losses);
  m.impl("loss_forward", &loss_forward);
  m.impl("loss_forward_from_similarity", &loss_forward_from_similarity);
  m.impl("loss_backward", &loss_backward);
  m.impl("loss_backward_from_similarity", &loss_backward_from_similarity);
  m.impl("opinion", &opinion);
  m.impl("opinion_from_similarity", &opinion_from_similarity);
}
