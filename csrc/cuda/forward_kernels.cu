// Forward statistics of one strip of s (kernels.h: launch_forward_stats). Torch-free.
//
// Two launches per strip:
//   1. forward_stats_kernel: a thread takes columns j (float64 views), or j, j + 32, j + 64 and
//      j + 96 (float32 and half views: kColumnsPerThread), walking the rows of its row group. Per
//      element: evidence α, then what α contributes to the line statistics: element_forward (the
//      CPU kernels' double-precision math) for float64 views, the float32 element math for float32
//      and half views (device_common.cuh: float32 evidence), whose rare elements (targets, α beyond
//      float32) are added after their stage of rows (rare_stage_sums). The columns' sums (float64)
//      stay in registers and end up in col_partial[group]; each row's sum over the block's 256
//      columns is the thread's own columns in order (its rare ones after the others), then the
//      warp's 32 lanes in lane order
//      (staged in shared memory, a few rows at a time), then the block's warps in order, into
//      row_partial[column block]. The target element of a row (column row0 + i + target_offset)
//      is stored, not summed, as α_target of its row and of its column (a unique writer for each).
//   2. reduce_partials, both directions: row i's statistics = Σ over column blocks, in a fixed
//      order (a block per 32 rows and slot, its warps splitting the column blocks); column j's
//      statistics += Σ over row groups, in group order (a block per 256 columns and slot).
#include "device_common.cuh"

namespace evidential_ops {
namespace cuda {
namespace {

constexpr int kRowChunk = 32;  // rows whose warp sums are staged in shared memory at a time

// On the float32 path a thread takes kColumnsPerThread of its block's kThreads columns, so that
// the warp's reduction of a row's sums and the row loop's own work serve that many elements; the
// thread's own columns are added up first, in column order, a rare element after the others
// (fixed: results stay run-to-run exact).
// Blocks still cover kThreads columns each (the row partials' layout, strip_plan.h), with fewer
// threads. Four columns: with the rare elements out of the row loop (rare_stage_sums) their
// accumulators fit in 128 registers without spills, and the loop issues about 7 instructions per
// element fewer than with two (`python bench/static_profile.py --direction fwd`). The float64 path
// keeps one column per thread.
constexpr int kColumnsPerThread = 4;
__host__ __device__ constexpr int columns_per_thread(bool float32) { return float32 ? kColumnsPerThread : 1; }
__host__ __device__ constexpr int forward_threads(bool float32) { return kThreads / columns_per_thread(float32); }
static_assert(forward_threads(true) % 32 == 0, "whole warps");

// Minimum blocks per multiprocessor of the float32 path: 512 threads (<= 128 registers,
// float32_min_blocks); 384 where the KL joins the Fisher terms (no
// method's set: TCL is the KL alone, UML the Fisher terms alone), which spilled 8 to 28 bytes at
// 128. Left free, ptxas aims lower and spills. The float64 path 1: with none, ptxas held two of
// its logdet instantiations to 80 registers on sm_80 and spilled 12-16 bytes.
__host__ __device__ constexpr int forward_min_blocks(bool float32, bool kl_and_fisher) {
  return float32 ? float32_min_blocks(forward_threads(true), kl_and_fisher) : 1;
}

// Statistic slot k (LineStat k + 1: rest, kl_h, squares, fisher, log_trigamma, remainder) is
// accumulated by a call with these terms.
__host__ __device__ constexpr bool slot_enabled(int k, bool kl, bool fmse, bool logdet) {
  return k == 0 || k == 2 || (k == 1 && kl) || (k == 3 && fmse) || ((k == 4 || k == 5) && logdet);
}

__host__ __device__ constexpr int enabled_slots(bool kl, bool fmse, bool logdet) {
  int n = 0;
  for (int k = 0; k < kStatSlots; ++k) n += slot_enabled(k, kl, fmse, logdet) ? 1 : 0;
  return n;
}

// The slot whose position among the enabled ones is c (the staging buffer holds those only).
__host__ __device__ constexpr int slot_of_compact(int c, bool kl, bool fmse, bool logdet) {
  for (int k = 0; k < kStatSlots; ++k) {
    if (slot_enabled(k, kl, fmse, logdet) && c-- == 0) return k;
  }
  return -1;
}

// A row's sum over a warp's lanes: each lane stores its row sums in shared memory, and after
// kStageRows rows the warp adds them up, one lane per (slot, row), the 32 lanes in order. A warp
// butterfly instead costs five double shuffles (ten SHFL, each at a quarter of the FFMA rate) and
// five DADD per row and slot on every lane; staged, a lane stores once per row and slot and the
// adds are shared out over the lanes: the largest per-element cost of the float32 forward after
// the element functions (`python bench/static_profile.py` before and after). Rows of 33 doubles:
// the lanes of a half-warp then read 16 different banks. kStageRows: the most rows (up to 8) whose
// buffer fits beside the warp sums in the 48 KiB of static shared memory.
constexpr int kStageLanes = 33;
constexpr int kStaticSharedBytes = 48 * 1024;
__host__ __device__ constexpr int stage_rows(int warps, int slots) {
  const int free_bytes = kStaticSharedBytes - kRowChunk * kStatSlots * warps * static_cast<int>(sizeof(double));
  int rows = 8;
  while (rows > 1 && warps * slots * rows * kStageLanes * static_cast<int>(sizeof(double)) > free_bytes) rows /= 2;
  return rows;
}
static_assert(kRowChunk % 8 == 0, "a row chunk holds whole stages");
static_assert(8 * kColumnsPerThread <= 32, "a stage's rare elements are the bits of an unsigned int");

inline int slot_mask(const TermFlags& t) {
  int mask = 0;
  for (int k = 0; k < kStatSlots; ++k) mask |= slot_enabled(k, t.kl, t.fmse, t.logdet) ? (1 << k) : 0;
  return mask;
}

// α of one element, (α·kSquareScale)² and its special functions.
struct ElementStats {
  double alpha;
  double square;
  kn::ElementForward f;
};

// The float32 path's statistics of an α <= FLT_MAX from its float32 functions f, widened.
__device__ __forceinline__ ElementStats element_stats_f32(float alpha_f, double alpha, const kn::ElementForwardF32& f) {
  return ElementStats{alpha, kn::square_statistic(alpha_f), kn::widen_from_float(alpha_f, f)};
}

// A rare element of the float32 path (device_common.cuh: float32 evidence): a line's target, or
// an α beyond float32. α in double from float arithmetic (evidence.h rare_evidence: x = s/τ split
// into two floats); its functions the float32 ones of float(α), or beyond FLT_MAX those of ln α,
// with α² and α(α + 1)ψ1 formed without FP64 multiplies.
template <bool kKl, bool kFmse, bool kLogdet>
__device__ __forceinline__ ElementStats rare_element_stats(int kind, float s, float inv_tau_f, float inv_tau_lo) {
  const kn::RareEvidence r = kn::rare_evidence_of_kind(kind, evidence_of(kind, s * inv_tau_f),
                                                       kn::split_product(s, inv_tau_f, inv_tau_lo), s, inv_tau_f);
  if (r.beyond) {
    return ElementStats{r.alpha, kn::square_statistic_of_double(r.alpha),
                        kn::widen_beyond_float(r.alpha, kn::element_forward_f32_of_log<kKl, kFmse, kLogdet>(r.log_alpha))};
  }
  return element_stats_f32(r.alpha_f, r.alpha, kn::element_forward_f32<kKl, kFmse, kLogdet>(r.alpha_f));
}

// Where a line's target α goes (ForwardArgs' statistics; nullptr: that direction not computed).
struct TargetAlphas {
  double* row_stats;
  std::int64_t row_stride;
  double* col_stats;
  std::int64_t col_stride;
};

// Element (line, j)'s contributions c[k] to the statistic slots; a target's α is stored instead.
template <bool kKl, bool kFmse, bool kLogdet>
__device__ __forceinline__ void add_element(const TargetAlphas& to, std::int64_t line, std::int64_t j, bool target,
                                            double alpha, double square, const kn::ElementForward& f,
                                            double c[kStatSlots]) {
  // Selects, not 0/1 masks: 0·∞ would turn an overflowed target into NaN and hide the overflow
  // the host reports.
  c[0] = target ? 0.0 : alpha;
  c[2] = target ? 0.0 : square;
  if (kKl) c[1] = target ? 0.0 : f.kl_h;
  if (kFmse) c[3] = target ? 0.0 : f.fisher;
  if (kLogdet) {
    c[4] = f.log_trigamma;
    c[5] = f.remainder;
  }
  if (target) {
    if (to.row_stats != nullptr) to.row_stats[kn::kTargetAlpha * to.row_stride + line] = alpha;
    if (to.col_stats != nullptr) to.col_stats[kn::kTargetAlpha * to.col_stride + j] = alpha;
  }
}

// Where a stage of rows starts (its first row), for rare_stage_sums to find its elements again.
struct StageStart {
  std::int64_t line;          // the row's line
  std::int64_t at0;           // element offset of (row, j0)
  std::int64_t target_delta;  // its target column relative to j0 (-1: no column)
  std::int64_t target_step;   // per row: 1 with targets, else 0
};

template <int kColumns>
struct ColumnSums {
  double v[kColumns][kStatSlots];
};

// The float32 path's rare elements of a stage of rows (device_common.cuh: float32 evidence): a
// line's target, or an α beyond float32. The row loop only marks them (bit sr·kColumns + cc of
// `rare`: row sr of the stage, the thread's column cc) and adds nothing for them, so that every
// element it runs takes the common path; here each is evaluated again from s, its α stored if it
// is a target, its contributions added to its row's staged sums (before the warp adds those up)
// and returned for the thread's column sums. One out-of-line call per stage that has any: the row
// loop holds neither their registers nor their code (the whole inline rare path was a fifth of the
// loop's instructions: `python bench/static_profile.py --direction fwd` before and after). Their
// place in the sums is fixed by the stage (after the stage's other rows), so results stay
// run-to-run exact.
template <typename Stored, int kColumns, int kStageRows, bool kKl, bool kFmse, bool kLogdet>
__device__ EO_OUT_OF_LINE ColumnSums<kColumns> rare_stage_sums(const SimilarityView s, int evidence, float inv_tau_f,
                                                               float inv_tau_lo, const TargetAlphas to, unsigned int rare,
                                                               const StageStart stage, std::int64_t j0,
                                                               double (*lane_rows)[kStageLanes], int lane,
                                                               bool want_rows) {
  ColumnSums<kColumns> out;
  for (int cc = 0; cc < kColumns; ++cc) {
    for (int k = 0; k < kStatSlots; ++k) out.v[cc][k] = 0.0;
  }
  for (int bit = 0; bit < kStageRows * kColumns; ++bit) {  // rows in order, a row's columns in order
    if (!((rare >> bit) & 1u)) continue;
    const int sr = bit / kColumns, cc = bit % kColumns;
    const std::int64_t at = stage.at0 + sr * s.row_stride + cc * 32 * s.col_stride;
    const bool target = stage.target_delta + sr * stage.target_step == 32 * cc;
    const ElementStats e = rare_element_stats<kKl, kFmse, kLogdet>(evidence, load_similarity<float, Stored>(s, at),
                                                                   inv_tau_f, inv_tau_lo);
    double c[kStatSlots] = {};
    add_element<kKl, kFmse, kLogdet>(to, stage.line + sr, j0 + 32 * cc, target, e.alpha, e.square, e.f, c);
    int compact = 0;
    for (int k = 0; k < kStatSlots; ++k) {
      if (!slot_enabled(k, kKl, kFmse, kLogdet)) continue;
      out.v[cc][k] += c[k];
      if (want_rows) lane_rows[compact * kStageRows + sr][lane] += c[k];
      ++compact;
    }
  }
  return out;
}

template <bool kFloat32, typename Stored, int kEvidence, bool kKl, bool kFmse, bool kLogdet>
__global__ void __launch_bounds__(forward_threads(kFloat32), forward_min_blocks(kFloat32, kKl && (kFmse || kLogdet)))
    forward_stats_kernel(const ForwardArgs a) {
  constexpr int kColumns = columns_per_thread(kFloat32);
  constexpr int kForwardThreads = forward_threads(kFloat32);
  constexpr int kForwardWarps = kForwardThreads / 32;
  constexpr int kSlots = enabled_slots(kKl, kFmse, kLogdet);
  constexpr int kStageRows = stage_rows(kForwardWarps, kSlots);
  __shared__ double warp_sums[kRowChunk][kStatSlots][kForwardWarps];
  __shared__ double lane_rows[kForwardWarps][kSlots * kStageRows][kStageLanes];  // [slot·rows + row][lane]
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  // Columns j0 + 32c (c < kColumns): a warp's loads of one c are consecutive columns.
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kThreads + warp * 32 * kColumns + lane;
  const bool want_rows = a.row_partial != nullptr;  // uniform over the launch
  const RowRange range = group_rows(a.s.rows);
  const float inv_tau_f = static_cast<float>(a.inv_tau);  // narrowed once (float32 path only)
  const float inv_tau_lo = static_cast<float>(a.inv_tau - static_cast<double>(inv_tau_f));  // rare elements' x
  const bool of_tanh = tanh_evidence<kEvidence>(a.evidence);  // uniform over the launch
  const TargetAlphas targets{a.row_stats, a.row_stride, a.col_stats, a.col_stride};

  // The thread's columns inside the strip: the first `columns` of its kColumns.
  const std::int64_t beyond = a.s.cols - j0;
  const int columns = beyond <= 0 ? 0 : (beyond >= 32 * (kColumns - 1) + 1 ? kColumns : static_cast<int>((beyond + 31) / 32));
  const std::int64_t first_offset = j0 * a.s.col_stride;  // element offset of column j0 in row 0
  const std::int64_t column_step = 32 * a.s.col_stride;
  double column[kColumns][kStatSlots];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
#pragma unroll
    for (int k = 0; k < kStatSlots; ++k) column[c][k] = 0.0;
  }
  // Float32 path: s of the row after the one being evaluated, loaded a row ahead (load_row_values).
  float ahead[kColumns] = {};
  if constexpr (kFloat32) {
    if (range.begin < range.end) {
      load_row_values<Stored, kColumns>(ahead, a.s, range.begin * a.s.row_stride + first_offset, column_step, columns);
    }
  }

  for (std::int64_t chunk = range.begin; chunk < range.end; chunk += kRowChunk) {
    const int n = static_cast<int>(range.end - chunk < kRowChunk ? range.end - chunk : kRowChunk);
    // The row's line, the element offset of (row, j0) and the row's target column relative to j0
    // (line + target_offset − j0, if targets), advanced by a row at a time: additions, not 64-bit
    // multiplies, per row.
    std::int64_t line = a.s.row0 + chunk;
    std::int64_t at0 = chunk * a.s.row_stride + first_offset;
    std::int64_t target_delta = a.has_targets ? line + a.target_offset - j0 : -1;  // -1: no column
    const std::int64_t target_step = a.has_targets ? 1 : 0;
    // Rows in stages of kStageRows: each lane's row sums are staged in shared memory, then the warp
    // adds them up.
    for (int first = 0; first < n; first += kStageRows) {
      const int staged = n - first < kStageRows ? n - first : kStageRows;
      const StageStart stage{line, at0, target_delta, target_step};
      unsigned int rare = 0;          // float32 path: the stage's rare elements (rare_stage_sums)
      unsigned int row_bit = 1;       // bit of (row sr, column 0) in `rare`
      for (int sr = 0; sr < staged;
           ++sr, ++line, at0 += a.s.row_stride, target_delta += target_step, row_bit <<= kColumns) {
        // This row's sums over the thread's columns, in column order (rare ones added after the
        // stage): one warp reduction per row for kColumns elements.
        double row[kStatSlots];
#pragma unroll
        for (int k = 0; k < kStatSlots; ++k) row[k] = 0.0;
        float values[kColumns];  // float32 path: this row's s, loaded a row ago
        if constexpr (kFloat32) {
#pragma unroll
          for (int cc = 0; cc < kColumns; ++cc) values[cc] = ahead[cc];
          if (line + 1 < a.s.row0 + range.end) {  // the thread's next row
            load_row_values<Stored, kColumns>(ahead, a.s, at0 + a.s.row_stride, column_step, columns);
          }
        }
#pragma unroll
        for (int cc = 0; cc < kColumns; ++cc) {
          if (cc >= columns) break;
          const std::int64_t j = j0 + 32 * cc;
          const bool target = target_delta == 32 * cc;
          double c[kStatSlots];
#pragma unroll
          for (int k = 0; k < kStatSlots; ++k) c[k] = 0.0;
          if constexpr (kFloat32) {
            const kn::EvidenceValueF32 v = evidence_of<kEvidence>(a.evidence, values[cc] * inv_tau_f);
            if (target || !(v.alpha < kInfinityF)) {  // NaN too: it comes out NaN either way
              rare |= row_bit << cc;  // added after the stage's rows; adds nothing here
            } else if (of_tanh) {
              // exp_tanh: the functions from t = tanh x (kn::has_tanh_functions)
              const ElementStats e =
                  element_stats_f32(v.alpha, v.alpha, kn::element_forward_f32_of_tanh<kKl, kFmse, kLogdet>(v.tanh));
              add_element<kKl, kFmse, kLogdet>(targets, line, j, false, e.alpha, e.square, e.f, c);
            } else {  // never a target: add_element's selects and stores fold away
              const ElementStats e =
                  element_stats_f32(v.alpha, v.alpha, kn::element_forward_f32<kKl, kFmse, kLogdet>(v.alpha));
              add_element<kKl, kFmse, kLogdet>(targets, line, j, false, e.alpha, e.square, e.f, c);
            }
          } else {
            const double alpha =
                evidence_of(a.evidence, load_similarity<double>(a.s, at0 + cc * column_step) * a.inv_tau).alpha;
            const kn::ElementForward f = kn::element_forward<kKl, kFmse, kLogdet>(alpha);
            const double scaled = alpha * kn::kSquareScale;
            add_element<kKl, kFmse, kLogdet>(targets, line, j, target, alpha, scaled * scaled, f, c);
          }
#pragma unroll
          for (int k = 0; k < kStatSlots; ++k) {
            column[cc][k] += c[k];
            row[k] = cc == 0 ? c[k] : row[k] + c[k];  // the first column's value itself, not 0 + it
          }
        }
        if (want_rows) {
          int compact = 0;  // a constant per unrolled k
#pragma unroll
          for (int k = 0; k < kStatSlots; ++k) {
            if (slot_enabled(k, kKl, kFmse, kLogdet)) lane_rows[warp][compact++ * kStageRows + sr][lane] = row[k];
          }
        }
      }
      if constexpr (kFloat32) {
        if (rare != 0) {
          const ColumnSums<kColumns> r = rare_stage_sums<Stored, kColumns, kStageRows, kKl, kFmse, kLogdet>(
              a.s, a.evidence, inv_tau_f, inv_tau_lo, targets, rare, stage, j0, lane_rows[warp], lane, want_rows);
#pragma unroll
          for (int cc = 0; cc < kColumns; ++cc) {
#pragma unroll
            for (int k = 0; k < kStatSlots; ++k) {
              if (slot_enabled(k, kKl, kFmse, kLogdet)) column[cc][k] += r.v[cc][k];
            }
          }
        }
      }
      if (want_rows) {  // uniform over the block
        __syncwarp();
#pragma unroll  // straight-line code: one or two (slot, row) pairs per lane
        for (int p = lane; p < kSlots * kStageRows; p += 32) {
          if (p % kStageRows >= staged) continue;
          const double* lanes = lane_rows[warp][p];
          double sum = lanes[0];
#pragma unroll
          for (int l = 1; l < 32; ++l) sum += lanes[l];
          warp_sums[first + p % kStageRows][slot_of_compact(p / kStageRows, kKl, kFmse, kLogdet)][warp] = sum;
        }
        __syncwarp();
      }
    }
    if (want_rows) {
      __syncthreads();
      for (int t = threadIdx.x; t < n * kStatSlots; t += kForwardThreads) {
        const int r = t / kStatSlots, k = t % kStatSlots;
        if (slot_enabled(k, kKl, kFmse, kLogdet)) {
          double sum = 0.0;
#pragma unroll
          for (int w = 0; w < kForwardWarps; ++w) sum += warp_sums[r][k][w];
          a.row_partial[(static_cast<std::int64_t>(blockIdx.x) * kStatSlots + k) * a.s.rows + chunk + r] = sum;
        }
      }
      __syncthreads();
    }
  }
  if (a.col_partial != nullptr) {
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      if (c >= columns) break;
#pragma unroll
      for (int k = 0; k < kStatSlots; ++k) {
        if (slot_enabled(k, kKl, kFmse, kLogdet)) {
          a.col_partial[(static_cast<std::int64_t>(blockIdx.y) * kStatSlots + k) * a.s.cols + j0 + 32 * c] =
              column[c][k];
        }
      }
    }
  }
}

// Row i's statistic k = Σ over column blocks of its row partials. A block takes 32 rows and one
// slot (blockIdx.y): warp w adds up the column blocks b ≡ w (mod kReduceWarps) in order, lane l for
// row 32·block + l (a warp's loads are consecutive rows), then warp 0 adds the warps' sums in
// warp order. A fixed order: run-to-run exact. Rows × slots in blocks of 32 rows fill the GPU where
// a thread per row would not: a strip at K = 65536 has about 200 rows (one block of 256 threads
// against 7 blocks per enabled slot here, 21 for TCL, each warp reading an eighth of the column
// blocks; a disabled slot's blocks return at once).
constexpr int kReduceWarps = 8;
constexpr int kReduceThreads = 32 * kReduceWarps;

__device__ void reduce_rows(const ForwardArgs& a, std::int64_t block, std::int64_t col_blocks, int k) {
  __shared__ double warp_sums[kReduceWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t i = block * 32 + lane;
  double sum = 0.0;
  if (i < a.s.rows) {
    for (std::int64_t b = warp; b < col_blocks; b += kReduceWarps) sum += a.row_partial[(b * kStatSlots + k) * a.s.rows + i];
  }
  warp_sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && i < a.s.rows) {
    double total = warp_sums[0][lane];
#pragma unroll
    for (int w = 1; w < kReduceWarps; ++w) total += warp_sums[w][lane];
    a.row_stats[(k + 1) * a.row_stride + a.s.row0 + i] = total;
  }
}

// Column j's statistic k += Σ over row groups of its column partials, in group order; a thread per
// column.
__device__ void reduce_columns(const ForwardArgs& a, std::int64_t block, std::int64_t groups, int k) {
  const std::int64_t j = block * kReduceThreads + threadIdx.x;
  if (j >= a.s.cols) return;
  double sum = 0.0;
  for (std::int64_t g = 0; g < groups; ++g) sum += a.col_partial[(g * kStatSlots + k) * a.s.cols + j];
  a.col_stats[(k + 1) * a.col_stride + j] += sum;
}

// Both directions' partials in one launch (one launch less per strip): blocks [0, row_blocks)
// reduce rows, the next ones columns; a slot per blockIdx.y. Each branch is uniform over a block.
__global__ void __launch_bounds__(kReduceThreads) reduce_partials(const ForwardArgs a, std::int64_t col_blocks,
                                                                   std::int64_t groups, unsigned int row_blocks,
                                                                   int mask) {
  const int k = static_cast<int>(blockIdx.y);
  if (!((mask >> k) & 1)) return;
  if (blockIdx.x < row_blocks) {
    reduce_rows(a, blockIdx.x, col_blocks, k);
  } else {
    reduce_columns(a, blockIdx.x - row_blocks, groups, k);
  }
}

template <bool kFloat32, typename Stored, int kEvidence>
void launch_stats_kernel(const ForwardArgs& a, dim3 grid, cudaStream_t stream) {
  kn::with_term_flags(a.terms, [&](auto kl, auto fmse, auto logdet) {
    EO_LAUNCH(grid, forward_threads(kFloat32), stream,
              forward_stats_kernel<kFloat32, Stored, kEvidence, decltype(kl)::value, decltype(fmse)::value,
                                   decltype(logdet)::value>)(a);
  });
}

}  // namespace

cudaError_t launch_forward_stats(const ForwardArgs& a, cudaStream_t stream) {
  if (a.s.rows <= 0 || a.s.cols <= 0) return cudaSuccess;
  ForwardArgs args = a;
  // Partials only where that direction is wanted.
  if (args.row_stats == nullptr) args.row_partial = nullptr;
  if (args.col_stats == nullptr) args.col_partial = nullptr;
  const dim3 grid = element_grid(args.s.rows, args.s.cols, args.max_row_groups);
  // The float32 path of float32 s (every product of embeddings) with its evidence map and stored
  // type compiled in, so that the element loop holds no run-time switch; half views of a given s
  // and the float64 path switch per element.
  if (float32_elements(args.s, args.inv_tau) && args.s.kind == ScalarKind::kFloat32) {
    kn::with_evidence_kind(args.evidence, [&](auto evidence) {
      launch_stats_kernel<true, float, static_cast<int>(decltype(evidence)::value)>(args, grid, stream);
    });
  } else if (float32_elements(args.s, args.inv_tau)) {
    launch_stats_kernel<true, AnyStored, kAnyEvidence>(args, grid, stream);
  } else {
    launch_stats_kernel<false, AnyStored, kAnyEvidence>(args, grid, stream);
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const int mask = slot_mask(args.terms);
  const unsigned int row_blocks = args.row_partial != nullptr ? static_cast<unsigned int>(ceil_div(args.s.rows, 32)) : 0;
  const unsigned int col_blocks =
      args.col_partial != nullptr ? static_cast<unsigned int>(ceil_div(args.s.cols, kReduceThreads)) : 0;
  if (row_blocks + col_blocks > 0) {
    EO_LAUNCH(dim3(row_blocks + col_blocks, kStatSlots), kReduceThreads, stream, reduce_partials)(
        args, grid.x, grid.y, row_blocks, mask);
    if ((status = cudaGetLastError()) != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace evidential_ops
