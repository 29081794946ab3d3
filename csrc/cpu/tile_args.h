// Arguments of the per-tile CPU kernels. Plain data, no functions: the same struct layout is
// shared by every instruction-set variant (tile_kernels_*.cpp) and by the torch-facing code.
#pragma once

#include <cstdint>

namespace evidential_ops {
namespace cpu {

// A rows×cols block of the similarity matrix at (row0, col0), row-major with leading dim ld.
struct TileRef {
  const void* data;
  bool is_double;  // else float
  std::int64_t ld;
  std::int64_t rows, cols, row0, col0;
};

struct TermFlags {
  bool kl, fmse, logdet;  // which per-element special functions are needed
  bool squares;           // whether the mse statistic Σα² is (the only term that reads it)
};

struct ForwardTile {
  TileRef s;
  int evidence;  // evidential_ops.config.EVIDENCE_KINDS index
  double inv_tau;
  bool has_targets;  // loss: row i's target, column i + target_offset, is kept out of the off-target sums
  std::int64_t target_offset;
  TermFlags terms;
  double* row_stats;  // LineStat-major: stats[k * row_stride + i]; nullptr if rows not needed
  std::int64_t row_stride;
  double* col_stats;  // likewise for columns; nullptr if columns not needed
  std::int64_t col_stride;
  double* scratch;  // >= 15·cols doubles, private to the calling thread
};

struct BackwardTile {
  TileRef s;
  int evidence;
  double inv_tau;
  std::int64_t target_offset;
  TermFlags terms;
  // The (kNumGradientFields, n) LineGradient arrays of csrc/kernels/line_finalise.h of all rows
  // and all columns; zero constants for a direction that is not computed.
  const double* row_constants;
  std::int64_t n_rows;
  const double* col_constants;
  std::int64_t n_cols;
  void* grad;  // ∂L/∂s of the tile, rows×cols, leading dim grad_ld, float or double
  bool grad_is_double;
  std::int64_t grad_ld;
  double* scratch;  // >= 14·cols doubles
};

using ForwardTileFn = void (*)(const ForwardTile&);
using BackwardTileFn = void (*)(const BackwardTile&);

struct TileKernels {
  const char* isa;
  ForwardTileFn forward;
  BackwardTileFn backward;
};

}  // namespace cpu
}  // namespace evidential_ops
