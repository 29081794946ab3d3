// CPU implementations of the evidential_ops operators (schemas in csrc/ops.cpp).
//
// Shape of every op (README "Backends"): the K×K similarity matrix is visited tile by tile
// (a tile GEMM from x and y, or a block of the given s) and never stored. Tiles are processed in
// rounds in which no two tiles share a row block or a column block (tile (r, c) belongs to round
// (r + c) mod M), so the row statistics, the column statistics, dx and dy are all accumulated
// without atomics, without per-thread partial buffers, and in an order that does not depend on
// the number of threads: results are bitwise reproducible.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "../kernels/line_terms.h"
#include "tile_args.h"
#include "tile_isa.h"

namespace evidential_ops {
namespace cpu {
namespace {

using at::Tensor;
using generic::kNumLineStats;
using generic::kNumTerms;

constexpr int kNumGradientFields = 9;  // LineGradient's members

int evidence_index(const std::string& evidence) {
  static const char* kKinds[] = {"exp", "relu", "softplus", "exp_tanh"};
  for (int i = 0; i < 4; ++i) {
    if (evidence == kKinds[i]) return i;
  }
  TORCH_CHECK_VALUE(false, "evidence must be one of exp, relu, softplus, exp_tanh; got '", evidence, "'");
}

std::int64_t block_size(std::int64_t n) { return n >= 2048 ? 256 : (n >= 512 ? 128 : 64); }

std::int64_t num_blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

// Tiles (r, c) in rounds of pairwise distinct rows and columns; fn(r, c) runs once per tile.
// A round has min(row_blocks, col_blocks) tiles: square problems parallelise over K/block tiles,
// rectangular ones with a short side use accumulate_stats' chunked path instead.
template <typename Fn>
void for_each_tile(std::int64_t row_blocks, std::int64_t col_blocks, const Fn& fn) {
  const std::int64_t rounds = std::max(row_blocks, col_blocks);
  const bool over_rows = row_blocks >= col_blocks;
  for (std::int64_t w = 0; w < rounds; ++w) {
    at::parallel_for(0, over_rows ? row_blocks : col_blocks, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t b = begin; b < end; ++b) {
        const std::int64_t other = ((w - b) % rounds + rounds) % rounds;
        if (other < (over_rows ? col_blocks : row_blocks)) {
          over_rows ? fn(b, other) : fn(other, b);
        }
      }
    });
  }
}

struct TermSelection {
  double weight[kNumTerms];
  bool enabled[kNumTerms];
  TermFlags flags;
};

TermSelection select_terms(const Tensor& weights) {
  TORCH_CHECK_VALUE(weights.dim() == 1 && weights.numel() == kNumTerms && weights.device().is_cpu(),
                    "weights must be a CPU tensor of ", kNumTerms, " entries (risk, kl, mse, fmse, logdet)");
  const Tensor w = weights.to(at::kDouble).contiguous();
  const double* values = w.const_data_ptr<double>();
  TermSelection t{};
  for (int k = 0; k < kNumTerms; ++k) {
    t.weight[k] = values[k];
    t.enabled[k] = values[k] != 0.0;
  }
  t.flags = TermFlags{t.enabled[generic::kKl], t.enabled[generic::kFmse], t.enabled[generic::kLogdet]};
  return t;
}

// Tiles, losses and opinions are float64 for float64 inputs and float32 otherwise (SPEC §5).
at::ScalarType compute_type(at::ScalarType input) { return input == at::kDouble ? at::kDouble : at::kFloat; }

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
      at::mm_out(out, x_.narrow(0, r0, nr), y_.narrow(0, c0, nc).t());
    } else {
      out.copy_(s_.narrow(0, r0, nr).narrow(1, c0, nc));
    }
    ref.ld = nc;
    ref.data = out.const_data_ptr();
    return ref;
  }

 private:
  Tensor x_, y_, s_;
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
    lines.resize(8 * bn);
  }
};

// Rectangular problems (a few queries over a large gallery) would run only short-side-many
// tiles per round. From this ratio of long to short blocks on, the long side is cut into a fixed
// number of chunks instead: each chunk owns its long-side lines and sums the short side into a
// partial of its own, and the partials are added in chunk order, so the result still does not
// depend on the number of threads. The partials cost kStatChunks·7·n_short doubles.
constexpr std::int64_t kStatChunks = 32;
constexpr std::int64_t kMaxChunkedShortSide = 4096;

// Accumulates the LineStat statistics of every row and column: stats (2, kNumLineStats, n).
Tensor accumulate_stats(const TileSource& source, int evidence, double tau, bool has_targets, TermFlags flags,
                        bool rows, bool cols) {
  const std::int64_t bm = block_size(source.rows()), bn = block_size(source.cols());
  const std::int64_t n_max = std::max(source.rows(), source.cols());
  Tensor stats = at::zeros({2, kNumLineStats, n_max}, at::TensorOptions().dtype(at::kDouble));
  double* row_stats = rows ? stats[0].data_ptr<double>() : nullptr;
  double* col_stats = cols ? stats[1].data_ptr<double>() : nullptr;
  const TileKernels& kernels = active_tile_kernels();
  const auto run_tile = [&](std::int64_t r, std::int64_t c, double* row_out, std::int64_t row_stride,
                            double* col_out, std::int64_t col_stride) {
    Scratch scratch(bm, bn, source.type(), false);
    const std::int64_t r0 = r * bm, c0 = c * bn;
    ForwardTile t{};
    t.s = source.tile(r0, std::min(bm, source.rows() - r0), c0, std::min(bn, source.cols() - c0), scratch.tile);
    t.evidence = evidence;
    t.inv_tau = 1.0 / tau;
    t.has_targets = has_targets;
    t.terms = flags;
    t.row_stats = row_out;
    t.row_stride = row_stride;
    t.col_stats = col_out;
    t.col_stride = col_stride;
    t.scratch = scratch.lines.data();
    kernels.forward(t);
  };

  const std::int64_t row_blocks = num_blocks(source.rows(), bm), col_blocks = num_blocks(source.cols(), bn);
  const bool rows_short = row_blocks < col_blocks;
  const std::int64_t short_blocks = std::min(row_blocks, col_blocks), long_blocks = std::max(row_blocks, col_blocks);
  const std::int64_t n_short = rows_short ? source.rows() : source.cols();
  if (long_blocks < 2 * short_blocks || n_short > kMaxChunkedShortSide) {
    for_each_tile(row_blocks, col_blocks, [&](std::int64_t r, std::int64_t c) {
      run_tile(r, c, row_stats, n_max, col_stats, n_max);
    });
    return stats;
  }
  double* short_stats = rows_short ? row_stats : col_stats;
  const std::int64_t chunks = std::min(kStatChunks, long_blocks);
  Tensor partial = at::zeros({chunks, kNumLineStats, n_short}, at::TensorOptions().dtype(at::kDouble));
  double* partials = partial.data_ptr<double>();
  at::parallel_for(0, chunks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t chunk = begin; chunk < end; ++chunk) {
      double* mine = short_stats != nullptr ? partials + chunk * kNumLineStats * n_short : nullptr;
      for (std::int64_t b = chunk * long_blocks / chunks; b < (chunk + 1) * long_blocks / chunks; ++b) {
        for (std::int64_t a = 0; a < short_blocks; ++a) {
          if (rows_short) {
            run_tile(a, b, mine, n_short, col_stats, n_max);
          } else {
            run_tile(b, a, row_stats, n_max, mine, n_short);
          }
        }
      }
    }
  });
  if (short_stats != nullptr) {
    at::parallel_for(0, n_short, 256, [&](std::int64_t begin, std::int64_t end) {
      for (int k = 0; k < kNumLineStats; ++k) {
        for (std::int64_t i = begin; i < end; ++i) {
          double sum = 0.0;
          for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partials[(chunk * kNumLineStats + k) * n_short + i];
          short_stats[k * n_max + i] = sum;
        }
      }
    });
  }
  return stats;
}

void check_finite_strengths(const Tensor& stats, bool rows, bool cols, double tau, const std::string& evidence) {
  // Σα overflowed double: only exp evidence at |s|/τ beyond ~700 can do that. (A NaN strength
  // comes from a NaN input passed with check_finite=False and is left to propagate.)
  for (int d = 0; d < 2; ++d) {
    if ((d == 0 && !rows) || (d == 1 && !cols)) continue;
    const Tensor strength = stats[d][generic::kRest] + stats[d][generic::kTargetAlpha];
    TORCH_CHECK_VALUE(!at::isinf(strength).any().item<bool>(), "tau=", tau, " is too small for evidence='",
                      evidence, "': exp(s/tau) overflows double precision (|s|/tau > 709). Use a larger tau.");
  }
}

generic::LineInput line_input(const double* stats, std::int64_t stride, std::int64_t i, const double* scale,
                              double n) {
  generic::LineInput in;
  for (int k = 0; k < kNumLineStats; ++k) in.stats[k] = stats[k * stride + i];
  in.target_scale = scale != nullptr ? scale[i] : 1.0;
  in.n = n;
  return in;
}

Tensor scale_vector(const c10::optional<Tensor>& target_scale) {
  if (!target_scale.has_value()) return Tensor();
  return target_scale->to(at::kDouble).contiguous();
}

// Σ_term weight·term of every line of one direction.
Tensor finalise_losses(const Tensor& stats, int direction, const TermSelection& terms, const Tensor& scale,
                       std::int64_t n_lines, double n_candidates, at::ScalarType out_type) {
  Tensor losses = at::empty({n_lines}, at::TensorOptions().dtype(at::kDouble));
  const double* st = stats[direction].const_data_ptr<double>();
  const std::int64_t stride = stats.size(2);
  const double* c = scale.defined() ? scale.const_data_ptr<double>() : nullptr;
  double* out = losses.data_ptr<double>();
  at::parallel_for(0, n_lines, 256, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const generic::LineTerms lt = generic::line_terms(line_input(st, stride, i, c, n_candidates), terms.enabled);
      double total = 0.0;
      for (int k = 0; k < kNumTerms; ++k) total += terms.weight[k] * lt.value[k];
      out[i] = total;
    }
  });
  return losses.to(out_type);
}

// LineGradient of every line of one direction as kNumGradientFields × n arrays (zeros if off).
Tensor line_gradients(const Tensor& stats, int direction, bool enabled, const TermSelection& terms, const Tensor& scale,
                      const Tensor& upstream, std::int64_t n_lines, double n_candidates) {
  Tensor g = at::zeros({kNumGradientFields, n_lines}, at::TensorOptions().dtype(at::kDouble));
  if (!enabled) return g;
  const double* st = stats[direction].const_data_ptr<double>();
  const std::int64_t stride = stats.size(2);
  const double* c = scale.defined() ? scale.const_data_ptr<double>() : nullptr;
  const Tensor up = upstream.to(at::kDouble).contiguous();
  const double* u = up.const_data_ptr<double>();
  double* out = g.data_ptr<double>();
  at::parallel_for(0, n_lines, 256, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const generic::LineGradient lg =
          generic::line_gradient(line_input(st, stride, i, c, n_candidates), terms.weight, u[i]);
      const double fields[kNumGradientFields] = {lg.inv_strength, lg.all,          lg.off,
                                                 lg.square,       lg.fisher,       lg.kl_v,
                                                 lg.logdet_ratio, lg.logdet_remainder, lg.target};
      for (int f = 0; f < kNumGradientFields; ++f) out[f * n_lines + i] = fields[f];
    }
  });
  return g;
}

LineGradientArrays gradient_arrays(const Tensor& g) {
  const double* p = g.const_data_ptr<double>();
  const std::int64_t n = g.size(1);
  return LineGradientArrays{p, p + n, p + 2 * n, p + 3 * n, p + 4 * n, p + 5 * n, p + 6 * n, p + 7 * n, p + 8 * n};
}

void check_square(std::int64_t rows, std::int64_t cols) {
  TORCH_CHECK_VALUE(rows == cols && rows >= 2, "the loss needs a square K×K problem with K >= 2, got ", rows, "×", cols);
}

// The ops are also callable directly (torch.ops.evidential_ops.*): shapes are checked here too,
// in O(1), so that a bad call is an error rather than an out-of-bounds read.
void check_embeddings(const Tensor& x, const Tensor& y) {
  TORCH_CHECK_VALUE(x.dim() == 2 && y.dim() == 2 && x.size(1) == y.size(1) && x.size(1) >= 1,
                    "x and y must be 2-D with the same embedding size D >= 1, got ", x.sizes(), " and ", y.sizes());
  TORCH_CHECK_TYPE(x.is_floating_point() && x.scalar_type() == y.scalar_type(),
                   "x and y must have the same floating dtype, got ", x.scalar_type(), " and ", y.scalar_type());
}

void check_similarity(const Tensor& s) {
  TORCH_CHECK_VALUE(s.dim() == 2, "s must be 2-D, got ", s.sizes());
  TORCH_CHECK_TYPE(s.is_floating_point(), "s must be a floating tensor, got ", s.scalar_type());
}

void check_target_scale(const c10::optional<Tensor>& target_scale, std::int64_t k) {
  TORCH_CHECK_VALUE(!target_scale.has_value() || (target_scale->dim() == 1 && target_scale->size(0) == k),
                    "target_scale must have shape (", k, ",)");
}

void check_backward_inputs(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& stats, std::int64_t k,
                           bool rows, bool cols) {
  TORCH_CHECK_VALUE(stats.scalar_type() == at::kDouble && stats.dim() == 3 && stats.size(0) == 2 &&
                        stats.size(1) == kNumLineStats && stats.size(2) == k && stats.is_contiguous(),
                    "stats must be the contiguous float64 (2, ", kNumLineStats, ", ", k,
                    ") tensor of the forward, got ", stats.sizes());
  TORCH_CHECK_VALUE(!rows || grad_rows.numel() == k, "grad_rows must have ", k, " entries, got ", grad_rows.numel());
  TORCH_CHECK_VALUE(!cols || grad_cols.numel() == k, "grad_cols must have ", k, " entries, got ", grad_cols.numel());
}

std::tuple<Tensor, Tensor, Tensor> forward_impl(const TileSource& source, const c10::optional<Tensor>& target_scale,
                                                const std::string& evidence, double tau, const Tensor& weights,
                                                bool rows, bool cols, at::ScalarType out_type) {
  check_square(source.rows(), source.cols());
  check_target_scale(target_scale, source.rows());
  TORCH_CHECK_VALUE(tau > 0.0, "tau must be > 0, got ", tau);
  const TermSelection terms = select_terms(weights);
  const Tensor stats = accumulate_stats(source, evidence_index(evidence), tau, true, terms.flags, rows, cols);
  check_finite_strengths(stats, rows, cols, tau, evidence);
  const Tensor scale = scale_vector(target_scale);
  const std::int64_t k = source.rows();
  const auto options = at::TensorOptions().dtype(out_type);
  Tensor row_losses = rows ? finalise_losses(stats, 0, terms, scale, k, k, out_type) : at::zeros({k}, options);
  Tensor col_losses = cols ? finalise_losses(stats, 1, terms, scale, k, k, out_type) : at::zeros({k}, options);
  return {row_losses, col_losses, stats};
}

// What both backward ops need before their tiles: checked sizes, the term weights and the
// per-line gradient constants (LineGradient arrays) of each direction.
struct BackwardLines {
  TermSelection terms;
  Tensor rows, cols;
};

BackwardLines backward_lines(const TileSource& source, const Tensor& grad_rows, const Tensor& grad_cols,
                             const c10::optional<Tensor>& target_scale, const Tensor& stats, const Tensor& weights,
                             bool rows, bool cols) {
  check_square(source.rows(), source.cols());
  const std::int64_t k = source.rows();
  check_target_scale(target_scale, k);
  check_backward_inputs(grad_rows, grad_cols, stats, k, rows, cols);
  const TermSelection terms = select_terms(weights);
  const Tensor scale = scale_vector(target_scale);
  return {terms, line_gradients(stats, 0, rows, terms, scale, grad_rows, k, k),
          line_gradients(stats, 1, cols, terms, scale, grad_cols, k, k)};
}

// Runs the backward tile kernel over every tile; `consume(r0, nr, c0, nc, grad_tile)` then uses
// ∂L/∂s of the tile (accumulates dx/dy, or stores ds). Rounds make consume's writes exclusive.
template <typename Consume>
void for_each_gradient_tile(const TileSource& source, const std::string& evidence, double tau, const TermSelection& terms,
                            const Tensor& row_g, const Tensor& col_g, const Consume& consume) {
  const std::int64_t bm = block_size(source.rows()), bn = block_size(source.cols());
  const TileKernels& kernels = active_tile_kernels();
  const int kind = evidence_index(evidence);
  const LineGradientArrays rows = gradient_arrays(row_g), cols = gradient_arrays(col_g);
  for_each_tile(num_blocks(source.rows(), bm), num_blocks(source.cols(), bn), [&](std::int64_t r, std::int64_t c) {
    Scratch scratch(bm, bn, source.type(), true);
    const std::int64_t r0 = r * bm, c0 = c * bn;
    const std::int64_t nr = std::min(bm, source.rows() - r0), nc = std::min(bn, source.cols() - c0);
    BackwardTile t{};
    t.s = source.tile(r0, nr, c0, nc, scratch.tile);
    t.evidence = kind;
    t.inv_tau = 1.0 / tau;
    t.terms = terms.flags;
    t.rows = rows;
    t.cols = cols;
    t.grad = scratch.grad.data_ptr();
    t.grad_is_double = source.type() == at::kDouble;
    t.grad_ld = nc;
    t.scratch = scratch.lines.data();
    kernels.backward(t);
    consume(r0, nr, c0, nc, at::from_blob(scratch.grad.data_ptr(), {nr, nc}, scratch.grad.options()));
  });
}

// ---------------------------------------------------------------------------------------------
// Operators

std::tuple<Tensor, Tensor, Tensor> loss_forward(const Tensor& x, const Tensor& y,
                                                const c10::optional<Tensor>& target_scale, const std::string& evidence,
                                                double tau, const Tensor& weights, bool rows, bool cols) {
  check_embeddings(x, y);
  const at::ScalarType type = compute_type(x.scalar_type());
  TileSource source(x.to(type).contiguous(), y.to(type).contiguous());
  return forward_impl(source, target_scale, evidence, tau, weights, rows, cols, compute_type(x.scalar_type()));
}

std::tuple<Tensor, Tensor, Tensor> loss_forward_from_similarity(const Tensor& s,
                                                                const c10::optional<Tensor>& target_scale,
                                                                const std::string& evidence, double tau,
                                                                const Tensor& weights, bool rows, bool cols) {
  check_similarity(s);
  TileSource source(s);
  return forward_impl(source, target_scale, evidence, tau, weights, rows, cols, compute_type(s.scalar_type()));
}

std::tuple<Tensor, Tensor> loss_backward(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& x,
                                         const Tensor& y, const c10::optional<Tensor>& target_scale,
                                         const Tensor& stats, const std::string& evidence, double tau,
                                         const Tensor& weights, bool rows, bool cols,
                                         std::array<bool, 2> output_mask) {
  check_embeddings(x, y);
  const at::ScalarType type = compute_type(x.scalar_type());
  TileSource source(x.to(type).contiguous(), y.to(type).contiguous());
  const BackwardLines lines =
      backward_lines(source, grad_rows, grad_cols, target_scale, stats, weights, rows, cols);
  const bool need_dx = output_mask[0];
  const bool need_dy = output_mask[1];
  Tensor dx = need_dx ? at::zeros_like(source.x()) : Tensor();
  Tensor dy = need_dy ? at::zeros_like(source.y()) : Tensor();
  for_each_gradient_tile(source, evidence, tau, lines.terms, lines.rows, lines.cols,
                         [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, const Tensor& g) {
                           if (need_dx) {  // dx[r] += G·y[c]
                             Tensor dx_block = dx.narrow(0, r0, nr);
                             dx_block.addmm_(g, source.y().narrow(0, c0, nc));
                           }
                           if (need_dy) {  // dy[c] += Gᵀ·x[r]
                             Tensor dy_block = dy.narrow(0, c0, nc);
                             dy_block.addmm_(g.t(), source.x().narrow(0, r0, nr));
                           }
                         });
  return {need_dx ? dx.to(x.scalar_type()) : at::empty({0}, x.options()),
          need_dy ? dy.to(y.scalar_type()) : at::empty({0}, y.options())};
}

Tensor loss_backward_from_similarity(const Tensor& grad_rows, const Tensor& grad_cols, const Tensor& s,
                                     const c10::optional<Tensor>& target_scale, const Tensor& stats,
                                     const std::string& evidence, double tau, const Tensor& weights, bool rows,
                                     bool cols) {
  check_similarity(s);
  TileSource source(s);
  const BackwardLines lines =
      backward_lines(source, grad_rows, grad_cols, target_scale, stats, weights, rows, cols);
  const std::int64_t k = source.rows();
  Tensor ds = at::empty({k, k}, s.options());
  for_each_gradient_tile(source, evidence, tau, lines.terms, lines.rows, lines.cols,
                         [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, const Tensor& g) {
                           ds.narrow(0, r0, nr).narrow(1, c0, nc).copy_(g);
                         });
  return ds;
}

std::tuple<Tensor, Tensor> opinion_impl(const TileSource& source, const std::string& evidence, double tau,
                                        at::ScalarType out_type) {
  TORCH_CHECK_VALUE(tau > 0.0, "tau must be > 0, got ", tau);
  const Tensor stats = accumulate_stats(source, evidence_index(evidence), tau, false, TermFlags{false, false, false},
                                        true, true);
  check_finite_strengths(stats, true, true, tau, evidence);
  const Tensor strengths = stats.select(1, generic::kRest);  // no targets: rest is the whole sum
  return {strengths[0].narrow(0, 0, source.rows()).log().to(out_type),
          strengths[1].narrow(0, 0, source.cols()).log().to(out_type)};
}

std::tuple<Tensor, Tensor> opinion(const Tensor& x, const Tensor& y, const std::string& evidence, double tau) {
  check_embeddings(x, y);
  const at::ScalarType type = compute_type(x.scalar_type());
  return opinion_impl(TileSource(x.to(type).contiguous(), y.to(type).contiguous()), evidence, tau,
                      compute_type(x.scalar_type()));
}

std::tuple<Tensor, Tensor> opinion_from_similarity(const Tensor& s, const std::string& evidence, double tau) {
  check_similarity(s);
  return opinion_impl(TileSource(s), evidence, tau, compute_type(s.scalar_type()));
}

}  // namespace

std::string cpu_isa(const std::string& request) {
  if (request.empty()) return active_tile_kernels().isa;
  try {
    return set_cpu_isa(request);
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

}  // namespace cpu
}  // namespace evidential_ops

TORCH_LIBRARY_IMPL(evidential_ops, CPU, m) {
  using namespace evidential_ops::cpu;
  m.impl("loss_forward", &loss_forward);
  m.impl("loss_forward_from_similarity", &loss_forward_from_similarity);
  m.impl("loss_backward", &loss_backward);
  m.impl("loss_backward_from_similarity", &loss_backward_from_similarity);
  m.impl("opinion", &opinion);
  m.impl("opinion_from_similarity", &opinion_from_similarity);
}
