// Arguments of the per-tile InfoNCE kernels (SPEC §2 "InfoNCE") and their per-ISA table. Plain
// data, shared by every instruction-set build (infonce_tiles_*.cpp) and by infonce_cpu.cpp.
#pragma once

#include <cstdint>

#include "tile_args.h"
#include "tile_isa.h"

namespace evidential_ops {
namespace cpu {

// The positives of every line, O(K): `members` lists the K line indices grouped by group id, each
// group in ascending index order; line i's group is members[begin[i], end[i]). The relation is
// symmetric, so rows and columns share it. Under drop_self a line skips itself in that list.
struct PositiveSets {
  const std::int64_t* members;
  const std::int64_t* begin;
  const std::int64_t* end;
};

struct InfoNCEForwardTile {
  TileRef s;  // x·yᵀ of the tile (unscaled)
  double inv_tau;
  bool drop_self;
  PositiveSets positives;
  // Running (kInfoNCEAccumulators, n) sums of all rows / all columns (infonce_lines.h); nullptr
  // for a direction not computed.
  double* row_acc;
  double* col_acc;
  std::int64_t n;
  double* scratch;  // >= 3·cols + rows doubles, private to the calling thread
};

struct InfoNCEBackwardTile {
  TileRef s;
  double inv_tau;
  bool drop_self;
  PositiveSets positives;
  // (kInfoNCEBackwardLines, n) lines of all rows / columns (infonce_lines.h: LSE_D, LSE_P and
  // 1 − e^{−ℓ}) and the upstream gradient of each line (float64); nullptr upstream for a
  // direction not computed.
  const double* row_lse;
  const double* col_lse;
  const double* row_upstream;
  const double* col_upstream;
  std::int64_t n;
  void* grad;  // (∂L/∂s)/τ of the tile, rows×cols, leading dim grad_ld, float or double
  bool grad_is_double;
  std::int64_t grad_ld;
  double* scratch;  // >= 2·cols doubles
};

struct InfoNCETileKernels {
  const char* isa;
  void (*forward)(const InfoNCEForwardTile&);
  void (*backward)(const InfoNCEBackwardTile&);
};

}  // namespace cpu

// One table per instruction-set build (the same variants as the evidential tile kernels).
namespace generic {
cpu::InfoNCETileKernels infonce_tile_kernels();
}
#if EO_X86_ISA_VARIANTS
namespace avx2 {
cpu::InfoNCETileKernels infonce_tile_kernels();
}
namespace avx512 {
cpu::InfoNCETileKernels infonce_tile_kernels();
}
#endif

}  // namespace evidential_ops
