// Embedding blocks packed once per pass as the B operand of the tile GEMMs (MKL's packed GEMM:
// cblas_sgemm_pack / cblas_sgemm_compute), where the BLAS that torch links exports it.
//
// A tile GEMM through at::mm copies ("packs") both operands into the BLAS's panel layout on every
// call; each block of x and y enters 2·K/block tile GEMMs per pass, and that copying was a tenth of
// the CPU step at K = 4096, D = 512 (3× what the three-GEMM floor spends on it). Packed once per
// pass, a B operand is not copied again. One copy per pass, the size of one input (the memory aim
// of bench/test_bench_memory.py leaves room for no more): the forward packs y's blocks for the
// similarity tiles x_r·y_cᵀ (13% less time per forward tile, one thread, blocks of 256, D = 512),
// the backward x's for dy_c += Gᵀ·x_r (3%; packing y for its similarity tiles and for dx as well
// would make that 10%, for two more copies). Float32 only, and only where a packed block enters
// two products or more; elsewhere, with EO_CPU_PACKED_GEMM=0, or where the BLAS lacks the
// functions, the tile GEMMs stay at::mm. Results may differ from at::mm's in the last bits (a different kernel may serve a
// product), but not with the number of threads, as at::mm's did not: each tile's product is one call
// on operands that do not depend on it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace evidential_ops {
namespace cpu {

// Whether the BLAS that torch links has the packed GEMM with the interface declared here (LP64,
// checked once per process on a small product against a plain loop).
bool packed_gemm_available();

// Whether the packed path is used for a float32 problem in this process (the BLAS has it and
// EO_CPU_PACKED_GEMM is not 0).
bool packed_gemm_enabled();

// Whether packing a matrix's blocks pays: each packed block must enter at least two products,
// i.e. the other operand has at least two row blocks of exactly `a_rows` rows, and the blocks must
// be large (256 rows or more; smaller products take the BLAS's small-matrix path as fast).
bool packing_pays(std::int64_t other_rows, std::int64_t a_rows);

// The row blocks [b·block, min((b + 1)·block, n)) of a contiguous float32 (n, D) matrix M, each
// packed as the B operand of products C = A·op(M_b) with A of `a_rows` rows: op(M_b) = M_bᵀ
// ("transposed", k = D: the similarity tile x_r·y_cᵀ) or M_b itself (k = the block's rows: dx_r +=
// G·y_c, dy_c += Gᵀ·x_r). Memory: about one copy of M (the BLAS's buffers are larger; glibc maps
// large allocations lazily, so only the pages the panels occupy become resident).
class PackedBlocks {
 public:
  PackedBlocks(const at::Tensor& m, std::int64_t block, std::int64_t a_rows, bool transposed);

  // C = beta·C + op(A)·op(M[first, first + count)), op(A) (a_rows, k): A row-major with leading
  // dimension lda, read transposed if a_transposed; C row-major (a_rows, n) with leading dimension
  // ldc. False (nothing done) unless [first, first + count) is one packed block and A has the
  // a_rows rows it was packed for: the caller then multiplies unpacked.
  bool multiply(std::int64_t first, std::int64_t count, const float* a, std::int64_t lda, bool a_transposed,
                std::int64_t a_rows, float beta, float* c, std::int64_t ldc) const;

 private:
  // Columns n and depth k of op(M_b).
  struct PanelShape {
    int n, k;
  };
  PanelShape panel_shape(std::int64_t b) const;

  std::int64_t block_, a_rows_, d_;
  bool transposed_;
  std::vector<std::int64_t> rows_;  // rows of each block
  std::vector<at::Tensor> panels_;  // one packed buffer per block
};

// PackedBlocks(m, block, a_rows, transposed) where the packed path is on, m is float32 and packing
// pays for products whose A operand runs over `other_rows` rows in blocks of a_rows
// (packing_pays); null otherwise, and the caller's tile GEMMs use at::mm.
std::unique_ptr<const PackedBlocks> packed_if_it_pays(const at::Tensor& m, std::int64_t block, std::int64_t a_rows,
                                                      bool transposed, std::int64_t other_rows);

}  // namespace cpu
}  // namespace evidential_ops
