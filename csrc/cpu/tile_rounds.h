// How the CPU kernels walk the tiles of s: block sizes and rounds of tiles that share no row
// block and no column block (tile (r, c) belongs to round (r + c) mod M), so row statistics,
// column statistics, dx and dy are accumulated without atomics or per-thread partials, in an
// order that does not depend on the number of threads: results are bitwise reproducible.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace evidential_ops {
namespace cpu {

// Larger tiles run the tile GEMMs closer to a full GEMM's speed (512 against 256 at K = 4096: 5%
// less time on the 2-core VM), but a round has only K/block tiles to share among threads, and
// the block may not depend on the thread count (results would then depend on it): at least 16
// tiles per round from K = 4096 on.
inline std::int64_t block_size(std::int64_t n) {
  return n >= 8192 ? 512 : (n >= 2048 ? 256 : (n >= 512 ? 128 : 64));
}

inline std::int64_t num_blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

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

}  // namespace cpu
}  // namespace evidential_ops
