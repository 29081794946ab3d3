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
};

struct ForwardTile {
  TileRef s;
  int evidence;  // evidential_ops.config.EVIDENCE_KINDS index
  double inv_tau;
  bool has_targets;  // loss: the diagonal is the target (kept out of the off-target sums)
  TermFlags terms;
  double* row_stats;  // LineStat-major: stats[k * row_stride + i]; nullptr if rows not needed
  std::int64_t row_stride;
  double* col_stats;  // likewise for columns; nullptr if columns not needed
  std::int64_t col_stride;
  double* scratch;  // >= 8·cols doubles, private to the calling thread
};

// Structure-of-arrays of LineGradient (csrc/kernels/line_terms.h), one entry per line.
struct LineGradientArrays {
  const double* inv_strength;
  const double* all;
  const double* off;
  const double* square;
  const double* fisher;
  const double* kl_v;
  const double* logdet_ratio;
  const double* logdet_remainder;
  const double* target;
};

struct BackwardTile {
  TileRef s;
  int evidence;
  double inv_tau;
  TermFlags terms;
  LineGradientArrays rows, cols;  // zero constants for a direction that is not computed
  void* grad;  // ∂L/∂s of the tile, rows×cols, leading dim grad_ld, float or double
  bool grad_is_double;
  std::int64_t grad_ld;
  double* scratch;  // >= 2·cols doubles
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
