// Embedding blocks packed once per pass as the B operand of the tile GEMMs (MKL's packed GEMM:
// cblas_sgemm_pack / cblas_sgemm_compute), where the BLAS that torch links exports it.
//
// A tile GEMM through at::mm copies ("packs") both operands into the BLAS's panel layout on every
// call; each block of x and y enters 2·K/block tile GEMMs per pass, and that copying was a tenth of
// the CPU step at K = 4096, D = 512 (3× what the three-GEMM floor spends on it). Packed once per
// pass, the B operands are not copied again: 10% less time per backward tile, 13% per forward tile
// (one thread, blocks of 256, D = 512). The A operand (a block of x, or the gradient tile) is still
// copied per call. Float32 only; elsewhere, with EO_CPU_PACKED_GEMM=0, or where the BLAS lacks the
// functions, the tile GEMMs stay at::mm. Results may differ from at::mm's in the last bits (a
// different kernel may serve a product), never with the number of threads: each tile's product is
// one call whose operands do not depend on it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace evidential_ops {
namespace cpu {

// Whether the BLAS that torch links has the packed GEMM.
bool packed_gemm_available();

// Whether the packed path is used for a float32 problem in this process (the BLAS has it and
// EO_CPU_PACKED_GEMM is not 0).
bool packed_gemm_enabled();

// The row blocks [b·block, min((b + 1)·block, n)) of a contiguous float32 (n, D) matrix M, each
// packed as the B operand of products C = A·op(M_b) with A of `a_rows` rows: op(M_b) = M_bᵀ
// ("transposed", k = D: the similarity tile x_r·y_cᵀ) or M_b itself (k = the block's rows: dx_r +=
// G·y_c, dy_c += Gᵀ·x_r). Only the bytes the packed panels occupy are touched (the BLAS asks for
// more, which stays unmapped).
class PackedBlocks {
 public:
  PackedBlocks(const at::Tensor& m, std::int64_t block, std::int64_t a_rows, bool transposed);

  // C = beta·C + op(A)·op(M_b), op(A) (a_rows, k): A row-major with leading dimension lda, read
  // transposed if a_transposed; C row-major (a_rows, n) with leading dimension ldc. False (nothing
  // done) if A does not have the a_rows rows the block was packed for: the caller multiplies
  // unpacked.
  std::int64_t block() const { return block_; }

  bool multiply(std::int64_t b, const float* a, std::int64_t lda, bool a_transposed, std::int64_t a_rows, float beta,
                float* c, std::int64_t ldc) const;

 private:
  std::int64_t block_, a_rows_, d_;
  bool transposed_;
  std::vector<std::int64_t> rows_;   // rows of each block
  std::vector<at::Tensor> panels_;   // one packed buffer per block
};

}  // namespace cpu
}  // namespace evidential_ops
