// MKL's packed GEMM for the CPU tile products (see packed_gemm.h). The functions are declared weak:
// torch's CPU library exports them where it links MKL, and elsewhere they resolve to null and the
// tile GEMMs stay at::mm.
#include "packed_gemm.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>
#include <vector>

// MKL's CBLAS interface (LP64: 32-bit integers), as mkl_cblas.h declares it.
extern "C" {
__attribute__((weak)) std::size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
__attribute__((weak)) void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                                            const float* src, int ld, float* dest);
__attribute__((weak)) void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                                               int lda, const float* b, int ldb, float beta, float* c, int ldc);
}

namespace evidential_ops {
namespace cpu {
namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;

// A 3×2 by 2×4 product through pack and compute against the plain sums (all small integers, so
// exact): symbols of another interface (ILP64 integers) would fail it instead of corrupting tiles.
bool packed_interface_works() {
  const float a[6] = {1, 2, 3, 4, 5, 6};      // 3×2
  const float b[8] = {1, 0, 2, 1, 3, 1, 0, 2};  // 2×4
  std::vector<float> packed((cblas_sgemm_pack_get_size(kBMatrix, 3, 4, 2) + sizeof(float) - 1) / sizeof(float));
  cblas_sgemm_pack(kRowMajor, kBMatrix, kNoTrans, 3, 4, 2, 1.0f, b, 4, packed.data());
  float c[12] = {};
  cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, 3, 4, 2, a, 2, packed.data(), 4, 0.0f, c, 4);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) {
      if (c[i * 4 + j] != a[i * 2] * b[j] + a[i * 2 + 1] * b[4 + j]) return false;
    }
  }
  return true;
}

}  // namespace

bool packed_gemm_available() {
  static const bool available = cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
                                cblas_sgemm_compute != nullptr && packed_interface_works();
  return available;
}

// Below 256-row blocks the BLAS's unpacked small-matrix path is as fast (K = 1024, blocks of 128:
// 2-5% slower packed, one process alternating both, 2 threads).
constexpr std::int64_t kMinPackedRows = 256;

bool packing_pays(std::int64_t other_rows, std::int64_t a_rows) {
  return a_rows >= kMinPackedRows && other_rows >= 2 * a_rows;
}

bool packed_gemm_enabled() {
  if (!packed_gemm_available()) return false;
  const char* flag = std::getenv("EO_CPU_PACKED_GEMM");
  return flag == nullptr || std::strcmp(flag, "0") != 0;
}

std::unique_ptr<const PackedBlocks> packed_if_it_pays(const at::Tensor& m, std::int64_t block, std::int64_t a_rows,
                                                      bool transposed, std::int64_t other_rows) {
  if (m.scalar_type() != at::kFloat || !packed_gemm_enabled() || !packing_pays(other_rows, a_rows)) return nullptr;
  return std::make_unique<const PackedBlocks>(m, block, a_rows, transposed);
}

PackedBlocks::PackedBlocks(const at::Tensor& m, std::int64_t block, std::int64_t a_rows, bool transposed)
    : block_(block), a_rows_(a_rows), d_(m.size(1)), transposed_(transposed) {
  const std::int64_t n = m.size(0);
  const std::int64_t blocks = (n + block - 1) / block;
  rows_.resize(blocks);
  panels_.resize(blocks);
  for (std::int64_t b = 0; b < blocks; ++b) {
    rows_[b] = std::min(block, n - b * block);
    const PanelShape shape = panel_shape(b);
    const std::size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, static_cast<int>(a_rows), shape.n, shape.k);
    panels_[b] = at::empty({static_cast<std::int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
                           at::TensorOptions().dtype(at::kFloat));
  }
  const float* data = m.const_data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const PanelShape shape = panel_shape(b);
      cblas_sgemm_pack(kRowMajor, kBMatrix, transposed_ ? kTrans : kNoTrans, static_cast<int>(a_rows_), shape.n,
                       shape.k, 1.0f, data + b * block_ * d_, static_cast<int>(d_), panels_[b].data_ptr<float>());
    }
  });
}

PackedBlocks::PanelShape PackedBlocks::panel_shape(std::int64_t b) const {
  const int rows = static_cast<int>(rows_[b]), d = static_cast<int>(d_);
  return transposed_ ? PanelShape{rows, d} : PanelShape{d, rows};
}

bool PackedBlocks::multiply(std::int64_t first, std::int64_t count, const float* a, std::int64_t lda,
                            bool a_transposed, std::int64_t a_rows, float beta, float* c, std::int64_t ldc) const {
  // The packed layout is made for products with a_rows_ rows of A (MKL requires the same m).
  const std::int64_t b = first / block_;
  if (a_rows != a_rows_ || first % block_ != 0 || b >= static_cast<std::int64_t>(rows_.size()) || count != rows_[b]) {
    return false;
  }
  const PanelShape shape = panel_shape(b);
  cblas_sgemm_compute(kRowMajor, a_transposed ? kTrans : kNoTrans, kPacked, static_cast<int>(a_rows), shape.n, shape.k,
                      a, static_cast<int>(lda), panels_[b].const_data_ptr<float>(), static_cast<int>(d_), beta, c,
                      static_cast<int>(ldc));
  return true;
}

}  // namespace cpu
}  // namespace evidential_ops
