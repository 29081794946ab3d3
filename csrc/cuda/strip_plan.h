// How the CUDA backend cuts the similarity matrix into row strips that fit a fixed working budget
// (README "Backends"). Torch-free, host-only C++: compiled into every build (module.cpp exposes
// the budget knob, csrc/tests/test_strip_plan.cpp tests the planning on any machine).
//
// A strip is rows [r0, r0 + rows) of s, all N columns. What a strip costs in device memory:
//   tile      rows·N elements of s in the compute dtype (float32, float64), when s is a product
//             computed here (from embeddings); nothing when s is given (from_similarity);
//   half      rows·N halves: ∂L/∂s rounded to the input's half type for the tensor-core GEMMs of
//             the backward from float16/bfloat16 embeddings;
//   row partials (forward) ceil(N/kThreads)·kStatSlots doubles per row: each column block's sum
//             of the row statistics, added up in a fixed order by a second kernel;
//   column partials (forward) row_groups·kStatSlots·N doubles: each row group's sum of the
//             column statistics, likewise (at most half the budget: fewer row groups if need be);
//   scalars   a few bytes (the float16 scale of ∂L/∂s and cuBLAS's alpha/beta).
// Everything is one workspace allocation of at most the budget, except floors whatever the
// budget: a strip is never less than one row (a row of s, O(N)), the column partials never less
// than one row group (kStatSlots·N doubles, 48·N bytes: beyond 64 MiB from N ≈ 1.4 million), and a
// backward block never less than 1 × 1 (plus, for half inputs cut into blocks, a float32 row of dx).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace evidential_ops {
namespace cuda {

constexpr int kThreads = 256;               // columns per block of the element kernels (one thread each on the float64 path)
constexpr int kStatSlots = 6;               // LineStats accumulated per element: all but kTargetAlpha
constexpr std::int64_t kTargetBlocks = 1024;  // a strip's rows are split into groups until a launch has this many blocks
constexpr std::int64_t kMinGroupRows = 8;   // ...but no group has fewer rows than this
constexpr std::int64_t kMaxRowGroups = 65535;  // gridDim.y
constexpr std::int64_t kAlignment = 256;    // of every sub-buffer of the workspace
constexpr std::int64_t kScalarBytes = 256;
constexpr std::int64_t kDefaultWorkspaceMiB = 64;

// The budget in bytes: EO_CUDA_WORKSPACE_MIB (a positive number of MiB) at first use, else 64 MiB;
// evidential_ops.cuda_workspace_bytes() changes it at run time (read at every op call).
inline std::atomic<std::int64_t>& workspace_budget_storage() {
  static std::atomic<std::int64_t> budget([] {
    std::int64_t mib = kDefaultWorkspaceMiB;
    if (const char* env = std::getenv("EO_CUDA_WORKSPACE_MIB")) {
      char* end = nullptr;
      const double value = std::strtod(env, &end);
      if (end != env && *end == '\0' && value > 0.0 && value < 1e9) return static_cast<std::int64_t>(value * 1048576.0);
    }
    return mib * 1048576;
  }());
  return budget;
}

inline std::int64_t workspace_budget() { return workspace_budget_storage().load(std::memory_order_relaxed); }
inline void set_workspace_budget(std::int64_t bytes) { workspace_budget_storage().store(bytes, std::memory_order_relaxed); }

// What a pass needs per strip (see the file comment).
struct StripNeeds {
  std::int64_t tile_element_bytes;  // 4 or 8 when s is computed here, 0 when it is given
  std::int64_t half_element_bytes;  // 2 for the backward from half embeddings, else 0
  bool partials;                    // forward statistics (row and column partial sums)
  bool scalars;                     // backward from float16 embeddings
};

struct StripPlan {
  std::int64_t strip_rows;  // rows of every strip but the last (which may be shorter)
  std::int64_t strips;      // ceil(m / strip_rows)
  std::int64_t col_blocks;  // ceil(n / kThreads): blocks along a row (gridDim.x)
  std::int64_t row_groups;  // row groups of a full strip (gridDim.y): the most any strip may use
  // Byte offsets and sizes of the sub-buffers of the workspace (size 0: not needed).
  std::int64_t tile_offset, tile_bytes;
  std::int64_t half_offset, half_bytes;
  std::int64_t row_partial_offset, row_partial_bytes;
  std::int64_t col_partial_offset, col_partial_bytes;
  std::int64_t scalars_offset, scalars_bytes;
  std::int64_t total_bytes;
};

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline std::int64_t align_up(std::int64_t bytes) { return ceil_div(bytes, kAlignment) * kAlignment; }

// Sub-buffers placed one after another in the workspace, each aligned (size 0: offset 0, no room).
struct WorkspaceLayout {
  std::int64_t offset = 0;
  void place(std::int64_t bytes, std::int64_t& at, std::int64_t& size) {
    size = bytes;
    at = bytes > 0 ? offset : 0;
    offset += align_up(bytes);
  }
  std::int64_t total_bytes() const { return std::max<std::int64_t>(offset, kAlignment); }
};

// Row groups of a launch over `rows` rows of a strip: enough blocks to fill a large GPU, never
// groups of fewer than kMinGroupRows rows. Depends on the sizes only (not on the device), so a
// result does not change from one GPU to another with the same budget.
inline std::int64_t row_groups_for(std::int64_t rows, std::int64_t col_blocks) {
  const std::int64_t wanted = ceil_div(kTargetBlocks, std::max<std::int64_t>(col_blocks, 1));
  const std::int64_t most = std::max<std::int64_t>(1, rows / kMinGroupRows);
  return std::max<std::int64_t>(1, std::min({wanted, most, kMaxRowGroups}));
}

// Strips of an m×n problem under `budget` bytes (m, n >= 1).
inline StripPlan plan_strips(std::int64_t m, std::int64_t n, const StripNeeds& needs, std::int64_t budget) {
  StripPlan p{};
  p.col_blocks = ceil_div(n, kThreads);
  const std::int64_t stat_bytes = kStatSlots * static_cast<std::int64_t>(sizeof(double));
  // Fixed costs first: the column partials of the most row groups any strip can have, which may
  // take at most half the budget (fewer groups: less parallelism, same result up to rounding).
  std::int64_t max_groups = row_groups_for(m, p.col_blocks);
  if (needs.partials) max_groups = std::max<std::int64_t>(1, std::min(max_groups, budget / 2 / (stat_bytes * n)));
  const std::int64_t fixed = (needs.partials ? align_up(max_groups * stat_bytes * n) : 0) +
                             (needs.scalars ? kScalarBytes : 0) + 4 * kAlignment;
  const std::int64_t per_row = n * (needs.tile_element_bytes + needs.half_element_bytes) +
                               (needs.partials ? p.col_blocks * stat_bytes : 0);
  std::int64_t rows = m;
  if (per_row > 0) {
    rows = std::min(m, std::max<std::int64_t>(1, (budget - fixed) / per_row));
    // As few strips as that takes, of equal size (no short last strip): ceil(m / strips) <= rows.
    rows = ceil_div(m, ceil_div(m, rows));
  }
  p.strip_rows = rows;
  p.strips = ceil_div(m, rows);
  p.row_groups = std::min(row_groups_for(rows, p.col_blocks), max_groups);

  WorkspaceLayout layout;
  layout.place(rows * n * needs.tile_element_bytes, p.tile_offset, p.tile_bytes);
  layout.place(rows * n * needs.half_element_bytes, p.half_offset, p.half_bytes);
  layout.place(needs.partials ? p.col_blocks * stat_bytes * rows : 0, p.row_partial_offset, p.row_partial_bytes);
  layout.place(needs.partials ? p.row_groups * stat_bytes * n : 0, p.col_partial_offset, p.col_partial_bytes);
  layout.place(needs.scalars ? kScalarBytes : 0, p.scalars_offset, p.scalars_bytes);
  p.total_bytes = layout.total_bytes();
  return p;
}

// ------------------------------------------------------------------ the backward's 2-D blocks
//
// The backward visits s in blocks of block_rows × block_cols, column blocks inside row blocks:
// per block one product s = x[r]·y[c]ᵀ, its ∂L/∂s, then dx[r] (+)= G·y[c] and dy[c] += Gᵀ·x[r].
// What a full-width strip costs in traffic is the dy accumulator, read and written in full for
// every strip (and y, read again for every strip): K/rows times. Near-square blocks of the same
// workspace make that about K/side times, side = √(budget/element bytes): at K = 16384, D = 1024
// from bfloat16, 6 instead of 25 passes over the 64 MiB float32 dy; at K = 65536 from float32, 16
// instead of 258 over 256 MiB. In exchange dx[r] is summed over the column blocks of its row
// block: read and written once per column block (block_rows × D, as much as L2 holds beside the
// blocks of s and G, so not counted on to stay there). Where dx[r] is the input's half type it is
// summed in a float32 block of the workspace (the accumulator below) and cast once per row block;
// float32 and float64 outputs accumulate in place. A block's width is a multiple of
// kColumnAlignment (the leading dimension of s and G in the products: 16-bit rows 128-byte
// aligned, as the tensor cores' fastest kernels want; a full row of s keeps N). A row of s is cut
// only where it is longer than the side and either alone exceeds the budget or its blocks come in
// fewer row blocks than full-width strips; otherwise full-width strips, exactly plan_strips' (no
// accumulator: dx written once).
constexpr std::int64_t kColumnAlignment = 64;

struct BlockPlan {
  std::int64_t block_rows, row_blocks;  // rows of every row block but the last; ceil(m / block_rows)
  std::int64_t block_cols, col_blocks;  // likewise along the columns (col_blocks 1: full width)
  std::int64_t tile_offset, tile_bytes;
  std::int64_t half_offset, half_bytes;
  std::int64_t accumulator_offset, accumulator_bytes;  // block_rows × d, when col_blocks > 1
  std::int64_t scalars_offset, scalars_bytes;
  std::int64_t total_bytes;
};

// The largest side r >= 1 with r·r·element_bytes + r·row_bytes <= room.
inline std::int64_t square_side(std::int64_t element_bytes, std::int64_t row_bytes, std::int64_t room) {
  if (element_bytes <= 0) return room;
  std::int64_t r = 1;
  while (r < room && (2 * r) * (2 * r) * element_bytes + 2 * r * row_bytes <= room) r *= 2;  // doubling, then halving
  for (std::int64_t step = r / 2; step >= 1; step /= 2) {
    if ((r + step) * (r + step) * element_bytes + (r + step) * row_bytes <= room) r += step;
  }
  return r;
}

// Blocks of an m×n backward (m, n, d >= 1; needs.partials false) under `budget` bytes.
// accumulator_element_bytes: bytes of a float32 element of dx[r]'s accumulator when the rows'
// output must be accumulated off to the side (half outputs), 0 when it accumulates in place.
inline BlockPlan plan_gradient_blocks(std::int64_t m, std::int64_t n, std::int64_t d, const StripNeeds& needs,
                                      std::int64_t accumulator_element_bytes, std::int64_t budget) {
  BlockPlan p{};
  const std::int64_t element = needs.tile_element_bytes + needs.half_element_bytes;
  const std::int64_t fixed = (needs.scalars ? kScalarBytes : 0) + 4 * kAlignment;  // as plan_strips'
  const std::int64_t room = std::max<std::int64_t>(budget - fixed, 0);
  const std::int64_t accumulator_row = d * accumulator_element_bytes;
  // Rows of a block `cols` wide that fit the room, evened out over m.
  const auto rows_for = [&](std::int64_t cols) {
    const std::int64_t per_row = cols * element + (cols < n ? accumulator_row : 0);
    if (per_row <= 0) return m;
    const std::int64_t rows = std::min(m, std::max<std::int64_t>(1, room / per_row));
    return ceil_div(m, ceil_div(m, rows));
  };
  std::int64_t cols = n;
  if (element > 0 && room > 0) {  // (no room at all: one-row strips, plan_strips' floor)
    const std::int64_t side = square_side(element, accumulator_row, room);
    // Blocks as equal as kColumnAlignment allows (the last may be shorter), none wider than the
    // side; below one aligned width of side, unaligned.
    const std::int64_t widest = side >= kColumnAlignment ? side / kColumnAlignment * kColumnAlignment : side;
    const std::int64_t even = ceil_div(n, ceil_div(n, widest));
    const std::int64_t cut =
        side >= kColumnAlignment ? ceil_div(even, kColumnAlignment) * kColumnAlignment : even;
    // Cut where a row of s alone exceeds the room, or where that makes fewer passes over dy and y
    // than full-width strips (not at K = 4096 from bfloat16: 2 × 2 blocks would pass twice, as 2
    // strips do, with twice the launches).
    if (n > side && (n * element > room || ceil_div(m, rows_for(cut)) < ceil_div(m, rows_for(n)))) cols = cut;
  }
  const std::int64_t rows = rows_for(cols);
  p.block_rows = rows;
  p.row_blocks = ceil_div(m, rows);
  p.block_cols = cols;
  p.col_blocks = ceil_div(n, cols);

  WorkspaceLayout layout;
  layout.place(rows * cols * needs.tile_element_bytes, p.tile_offset, p.tile_bytes);
  layout.place(rows * cols * needs.half_element_bytes, p.half_offset, p.half_bytes);
  layout.place(p.col_blocks > 1 ? rows * accumulator_row : 0, p.accumulator_offset, p.accumulator_bytes);
  layout.place(needs.scalars ? kScalarBytes : 0, p.scalars_offset, p.scalars_bytes);
  p.total_bytes = layout.total_bytes();
  return p;
}

}  // namespace cuda
}  // namespace evidential_ops
