// Unit tests of the CUDA backend's strip planning (csrc/cuda/strip_plan.h): host-only and
// torch-free, so they run on any machine (ctest), GPU or not. What they pin down: strips cover
// every row exactly once in as few, equal strips as the budget allows, the workspace stays
// within the budget whenever one row fits, the
// sub-buffers are aligned and disjoint and as large as the kernels index them, and the K = 65536
// problem of the issue fits its memory target.
//
// Exit status: 0 if every check passed, 1 otherwise (each failure is printed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/strip_plan.h"

namespace sp = evidential_ops::cuda;

namespace {

int failures = 0;
int checks = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

std::string describe(std::int64_t m, std::int64_t n, const sp::StripNeeds& needs, std::int64_t budget) {
  return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " tile=" + std::to_string(needs.tile_element_bytes) +
         " half=" + std::to_string(needs.half_element_bytes) + " partials=" + std::to_string(needs.partials) +
         " scalars=" + std::to_string(needs.scalars) + " budget=" + std::to_string(budget);
}

// Bytes of the workspace a single-row strip needs: when this exceeds the budget, one row is used anyway.
std::int64_t one_row_bytes(std::int64_t m, std::int64_t n, const sp::StripNeeds& needs) {
  return sp::plan_strips(m, n, needs, 1).total_bytes;
}

// A workspace's sub-buffers (offset, bytes; 0 bytes: not there): aligned, inside it, disjoint.
void check_sub_buffers(const std::vector<std::pair<std::int64_t, std::int64_t>>& buffers, std::int64_t total,
                       const std::string& at) {
  std::vector<std::pair<std::int64_t, std::int64_t>> placed;
  for (const auto& [offset, bytes] : buffers) {
    if (bytes == 0) continue;
    expect(offset % sp::kAlignment == 0, "aligned sub-buffer: " + at);
    expect(offset >= 0 && offset + bytes <= total, "sub-buffer inside the workspace: " + at);
    for (const auto& [o, b] : placed) expect(offset >= o + b || o >= offset + bytes, "disjoint sub-buffers: " + at);
    placed.emplace_back(offset, bytes);
  }
}

void check_plan(std::int64_t m, std::int64_t n, const sp::StripNeeds& needs, std::int64_t budget) {
  const sp::StripPlan p = sp::plan_strips(m, n, needs, budget);
  const std::string at = describe(m, n, needs, budget);
  expect(p.strip_rows >= 1 && p.strip_rows <= m, "strip rows in [1, m]: " + at);
  expect(p.strips == (m + p.strip_rows - 1) / p.strip_rows, "strips = ceil(m / strip_rows): " + at);
  expect((p.strips - 1) * p.strip_rows < m && p.strips * p.strip_rows >= m, "strips cover each row once: " + at);
  expect(m - (p.strips - 1) * p.strip_rows > p.strip_rows - p.strips, "strips of (nearly) equal size: " + at);
  if (one_row_bytes(m, n, needs) <= budget) {
    expect(p.total_bytes <= budget, "workspace within the budget: " + at + " total=" + std::to_string(p.total_bytes));
  }
  if (needs.tile_element_bytes + needs.half_element_bytes == 0 && !needs.partials) {
    expect(p.strips == 1, "nothing per row: a single strip: " + at);
  }
  expect(p.col_blocks == (n + sp::kThreads - 1) / sp::kThreads, "column blocks: " + at);
  expect(p.row_groups >= 1 && p.row_groups <= sp::row_groups_for(p.strip_rows, p.col_blocks),
         "row groups of a full strip: " + at);
  if (needs.partials && p.row_groups < sp::row_groups_for(p.strip_rows, p.col_blocks)) {
    expect(p.row_groups == 1 || p.col_partial_bytes <= budget / 2, "fewer groups only to fit the budget: " + at);
  }
  if (!needs.partials) expect(p.row_groups == sp::row_groups_for(p.strip_rows, p.col_blocks), "groups: " + at);
  // Sizes the kernels index (forward_kernels.cu, evidential_cuda.cpp).
  const std::int64_t stat = sp::kStatSlots * 8;
  expect(p.tile_bytes == p.strip_rows * n * needs.tile_element_bytes, "tile size: " + at);
  expect(p.half_bytes == p.strip_rows * n * needs.half_element_bytes, "half size: " + at);
  expect(p.row_partial_bytes == (needs.partials ? p.col_blocks * stat * p.strip_rows : 0), "row partials: " + at);
  expect(p.col_partial_bytes == (needs.partials ? p.row_groups * stat * n : 0), "column partials: " + at);
  expect(p.scalars_bytes == (needs.scalars ? sp::kScalarBytes : 0), "scalars: " + at);
  check_sub_buffers({{p.tile_offset, p.tile_bytes}, {p.half_offset, p.half_bytes},
                     {p.row_partial_offset, p.row_partial_bytes}, {p.col_partial_offset, p.col_partial_bytes},
                     {p.scalars_offset, p.scalars_bytes}},
                    p.total_bytes, at);
}

void test_row_groups() {
  for (std::int64_t blocks : {1, 3, 64, 256, 1024, 5000}) {
    std::int64_t previous = 0;
    for (std::int64_t rows = 1; rows <= 5000; rows += 7) {
      const std::int64_t g = sp::row_groups_for(rows, blocks);
      expect(g >= 1 && g <= sp::kMaxRowGroups, "row groups in [1, 65535]");
      expect(g == 1 || rows / g >= sp::kMinGroupRows, "groups have >= kMinGroupRows rows");
      expect(g >= previous, "row groups grow with the rows");
      expect(g * blocks <= sp::kTargetBlocks + blocks, "no more blocks than needed");
      previous = g;
    }
  }
}

void test_plans() {
  const sp::StripNeeds forward_f32{4, 0, true, false}, forward_f64{8, 0, true, false};
  const sp::StripNeeds forward_given{0, 0, true, false}, backward_f32{4, 0, false, false};
  const sp::StripNeeds backward_f16{4, 2, false, true}, backward_bf16{4, 2, false, false}, backward_given{0, 0, false, false};
  const std::int64_t mib = 1 << 20;
  for (const sp::StripNeeds& needs :
       {forward_f32, forward_f64, forward_given, backward_f32, backward_f16, backward_bf16, backward_given}) {
    for (std::int64_t m : {1, 2, 7, 113, 300, 1000, 4096, 16384, 65536}) {
      for (std::int64_t n : {2, 70, 113, 256, 3000, 16384, 65536}) {
        for (std::int64_t budget : {std::int64_t{1}, 4096 * std::int64_t{1}, 64 * 1024 * std::int64_t{1}, mib,
                                    64 * mib, 1024 * mib}) {
          check_plan(m, n, needs, budget);
        }
      }
    }
  }
}

// The targets at the default 64 MiB budget, D = 1024: strips that fill the budget, and
// K = 65536 fwd + bwd within 128 MiB of extra device memory beyond inputs and gradients:
// the workspace plus the O(K) statistics, gradient constants, losses and upstream copies.
void test_default_budget() {
  const std::int64_t mib = 1 << 20, budget = 64 * mib;
  const sp::StripNeeds forward{4, 0, true, false}, backward{4, 0, false, false};
  for (std::int64_t k : {4096, 16384, 65536}) {
    const sp::StripPlan f = sp::plan_strips(k, k, forward, budget);
    const sp::StripPlan b = sp::plan_strips(k, k, backward, budget);
    std::printf("K=%-6lld forward: %4lld strips of %5lld rows, %5.1f MiB; backward: %4lld strips of %5lld rows, %5.1f MiB\n",
                static_cast<long long>(k), static_cast<long long>(f.strips), static_cast<long long>(f.strip_rows),
                f.total_bytes / double(mib), static_cast<long long>(b.strips), static_cast<long long>(b.strip_rows),
                b.total_bytes / double(mib));
    expect(f.total_bytes <= budget && b.total_bytes <= budget, "default budget respected at K=" + std::to_string(k));
    // As few strips as the budget allows: one fewer would not fit.
    for (const auto& [plan, needs] : {std::pair{f, forward}, std::pair{b, backward}}) {
      if (plan.strips > 1) {
        const std::int64_t fewer = sp::ceil_div(k, plan.strips - 1);
        expect(sp::plan_strips(fewer, k, needs, budget).strips > 1, "fewest strips at K=" + std::to_string(k));
      }
    }
    // Beyond the workspace: row and column statistics (7 doubles per line), gradient constants
    // (9 per line), losses and double copies of the upstream gradients (1 + 1 per line).
    const std::int64_t per_line = (7 + 9 + 2) * 8;
    const std::int64_t extra = std::max(f.total_bytes, b.total_bytes) + 2 * k * per_line;
    if (k == 65536) expect(extra < 128 * mib, "K=65536 within 128 MiB extra: " + std::to_string(extra / mib) + " MiB");
  }
}

// The backward's 2-D blocks: they cover s exactly once in equal blocks, the workspace keeps to the
// budget whenever a 1×1 block fits, a row of s is cut only when longer than the square side, and
// only when it alone exceeds the budget or the cut makes fewer row blocks than plan_strips' strips
// (uncut, it is planned exactly as plan_strips plans it), and the float32 accumulator of dx[r]
// exists exactly when rows are cut.
void check_blocks(std::int64_t m, std::int64_t n, std::int64_t d, const sp::StripNeeds& needs,
                  std::int64_t accumulator, std::int64_t budget) {
  const sp::BlockPlan p = sp::plan_gradient_blocks(m, n, d, needs, accumulator, budget);
  const std::string at = describe(m, n, needs, budget) + " d=" + std::to_string(d) + " acc=" + std::to_string(accumulator);
  for (const auto& [size, count, extent] : {std::tuple{p.block_rows, p.row_blocks, m}, std::tuple{p.block_cols, p.col_blocks, n}}) {
    expect(size >= 1 && size <= extent, "block size in [1, extent]: " + at);
    expect(count == sp::ceil_div(extent, size), "blocks = ceil(extent / size): " + at);
  }
  expect(m - (p.row_blocks - 1) * p.block_rows > p.block_rows - p.row_blocks, "row blocks of (nearly) equal size: " + at);
  const std::int64_t element = needs.tile_element_bytes + needs.half_element_bytes;
  const std::int64_t one_block = element + d * accumulator + (needs.scalars ? sp::kScalarBytes : 0) + 4 * sp::kAlignment;
  if (one_block <= budget) {
    expect(p.total_bytes <= budget, "blocks within the budget: " + at + " total=" + std::to_string(p.total_bytes));
  }
  const std::int64_t room = budget - (needs.scalars ? sp::kScalarBytes : 0) - 4 * sp::kAlignment;
  const std::int64_t side = element > 0 && room > 0 ? sp::square_side(element, d * accumulator, room) : n;
  if (element > 0 && room > 0) {
    expect(side * side * element + side * d * accumulator <= room, "square side fits: " + at);
    expect((side + 1) * (side + 1) * element + (side + 1) * d * accumulator > room, "square side largest: " + at);
  }
  const sp::StripPlan strips = sp::plan_strips(m, n, needs, budget);
  if (p.col_blocks == 1) {
    expect(p.block_rows == strips.strip_rows, "uncut rows: plan_strips' strips: " + at);
    expect(p.total_bytes == strips.total_bytes, "...with plan_strips' workspace: " + at);
  } else {
    expect(element > 0 && n > side, "rows cut only when longer than the side: " + at);
    // Column blocks: as few as blocks no wider than the side take, each a multiple of
    // kColumnAlignment wide where the side allows one.
    const std::int64_t widest = side >= sp::kColumnAlignment ? side / sp::kColumnAlignment * sp::kColumnAlignment : side;
    expect(p.block_cols <= widest && p.col_blocks == sp::ceil_div(n, widest), "columns cut at the side: " + at);
    expect(side < sp::kColumnAlignment || p.block_cols % sp::kColumnAlignment == 0, "aligned column blocks: " + at);
    expect(n * element > room || p.row_blocks < strips.strips,
           "cut only for a row beyond the room or fewer row blocks than strips: " + at);
  }
  expect(p.tile_bytes == p.block_rows * p.block_cols * needs.tile_element_bytes, "tile size: " + at);
  expect(p.half_bytes == p.block_rows * p.block_cols * needs.half_element_bytes, "half size: " + at);
  expect(p.accumulator_bytes == (p.col_blocks > 1 ? p.block_rows * d * accumulator : 0), "accumulator size: " + at);
  check_sub_buffers({{p.tile_offset, p.tile_bytes}, {p.half_offset, p.half_bytes},
                     {p.accumulator_offset, p.accumulator_bytes}, {p.scalars_offset, p.scalars_bytes}},
                    p.total_bytes, at);
}

void test_blocks() {
  const sp::StripNeeds f32{4, 0, false, false}, f64{8, 0, false, false}, f16{4, 2, false, true}, bf16{4, 2, false, false};
  const std::int64_t mib = 1 << 20;
  for (const auto& [needs, accumulator] : {std::pair{f32, 0}, std::pair{f64, 0}, std::pair{f16, 4}, std::pair{bf16, 4}}) {
    for (std::int64_t m : {1, 7, 113, 3000, 16384, 65536}) {
      for (std::int64_t n : {2, 113, 3000, 16384, 65536}) {
        for (std::int64_t d : {1, 203, 1024}) {
          for (std::int64_t budget : {std::int64_t{1}, 64 * 1024 * std::int64_t{1}, mib, 64 * mib, 1024 * mib}) {
            check_blocks(m, n, d, needs, accumulator, budget);
          }
        }
      }
    }
  }
  // The default budget at D = 1024 (printed for the record): K = 16384 from bfloat16 in 6 row
  // blocks (dy's float32 accumulator read and written 6 times, not 25), K = 65536 from float32 in
  // 16 (16 times over 256 MiB, not 258).
  for (const auto& [k, needs, accumulator] : {std::tuple{16384, bf16, 4}, std::tuple{65536, f32, 0}, std::tuple{16384, f32, 0}}) {
    const sp::BlockPlan p = sp::plan_gradient_blocks(k, k, 1024, needs, accumulator, 64 * mib);
    const sp::StripPlan strips = sp::plan_strips(k, k, needs, 64 * mib);
    std::printf("K=%-6lld backward %s: %lld × %lld blocks of %lld × %lld (row strips: %lld), %.1f MiB\n",
                static_cast<long long>(k), accumulator ? "bf16" : "f32 ", static_cast<long long>(p.row_blocks),
                static_cast<long long>(p.col_blocks), static_cast<long long>(p.block_rows),
                static_cast<long long>(p.block_cols), static_cast<long long>(strips.strips), p.total_bytes / double(mib));
    expect(p.row_blocks * 3 <= strips.strips, "2-D blocks pass over dy at most a third as often at K=" + std::to_string(k));
  }
}

void test_budget_knob() {
  const std::int64_t initial = sp::workspace_budget();
  if (std::getenv("EO_CUDA_WORKSPACE_MIB") == nullptr) {
    expect(initial == sp::kDefaultWorkspaceMiB * (1 << 20), "default budget is 64 MiB");
  }
  sp::set_workspace_budget(12345);
  expect(sp::workspace_budget() == 12345, "budget set and read back");
  sp::set_workspace_budget(initial);
}

}  // namespace

int main() {
  test_row_groups();
  test_plans();
  test_default_budget();
  test_blocks();
  test_budget_knob();
  std::printf("strip plan: %d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
