// The CUDA kernels of csrc/cuda/*.cu, unchanged, run on the CPU under the emulation of
// csrc/tests/emulation/ (blocks one at a time, threads as user-level contexts, real barriers and
// warp shuffles), against a direct evaluation of the same definitions: the float64 element math
// for float64 inputs, and for float32 and half inputs the float32 element math as the kernels
// compose it (device_common.cuh: float32_evidence; the same csrc/kernels/ functions, evaluated here
// element by element). What this pins down without a GPU: the launchers' grids and their choice of
// element math, the kernels' indexing (strips, row groups, column blocks, strides, targets and
// target offsets, directions switched off), the fixed-order reductions, the storage conversions
// (float32/float64/float16/bfloat16, in place), the float16 scaling and the per-line kernels; and
// that every barrier is reached by the whole block or warp. test_float32_accuracy then holds the
// float32 path to the float64 reference in the hard regime, with tolerances derived from the
// arithmetic. What it cannot: the device's own arithmetic (exp/log come from csrc/kernels/'s CPU
// code here, and nvcc contracts multiply-adds into FMAs, which the derived tolerances allow for),
// memory-model races, speed. Those are owed on a GPU (bench/gpu_session_cuda.md).
//
// Exit status: 0 if every check passed, 1 otherwise (each failure is printed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/strip_plan.h"
#include "kernels/element_terms.h"
#include "kernels/evidence.h"
#include "kernels/line_finalise.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ec = evidential_ops::cuda;
namespace kn = evidential_ops::generic;

namespace {

int failures = 0;
long checks = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok && ++failures <= 40) std::printf("FAILED: %s\n", what.c_str());
}

bool close(double got, double want, double rel, double floor) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= rel * std::fabs(want) + floor;
}

// --------------------------------------------------------------------------- dispatch helpers

kn::EvidenceValue evidence_any(int kind, double x) {
  switch (kind) {
    case 0: return kn::evidence_value<kn::EvidenceKind::kExp>(x);
    case 1: return kn::evidence_value<kn::EvidenceKind::kRelu>(x);
    case 2: return kn::evidence_value<kn::EvidenceKind::kSoftplus>(x);
    default: return kn::evidence_value<kn::EvidenceKind::kExpTanh>(x);
  }
}

kn::EvidenceValueF32 evidence_any(int kind, float x) {
  switch (kind) {
    case 0: return kn::evidence_value<kn::EvidenceKind::kExp>(x);
    case 1: return kn::evidence_value<kn::EvidenceKind::kRelu>(x);
    case 2: return kn::evidence_value<kn::EvidenceKind::kSoftplus>(x);
    default: return kn::evidence_value<kn::EvidenceKind::kExpTanh>(x);
  }
}

template <bool A, bool B, bool C>
struct Both {
  static kn::ElementForward f(double a) { return kn::element_forward<A, B, C>(a); }
  static kn::ElementBackward b(double a) { return kn::element_backward<A, B, C>(a); }
  static kn::ElementForwardF32 f(float a) { return kn::element_forward_f32<A, B, C>(a); }
  static kn::ElementBackwardF32 b(float a) { return kn::element_backward_f32<A, B, C>(a); }
};

template <typename T>
auto forward_any(ec::TermFlags t, T a) {
  switch ((t.kl ? 1 : 0) | (t.fmse ? 2 : 0) | (t.logdet ? 4 : 0)) {
    case 0: return Both<false, false, false>::f(a);
    case 1: return Both<true, false, false>::f(a);
    case 2: return Both<false, true, false>::f(a);
    case 3: return Both<true, true, false>::f(a);
    case 4: return Both<false, false, true>::f(a);
    case 5: return Both<true, false, true>::f(a);
    case 6: return Both<false, true, true>::f(a);
    default: return Both<true, true, true>::f(a);
  }
}

template <typename T>
auto backward_any(ec::TermFlags t, T a) {
  switch ((t.kl ? 1 : 0) | (t.fmse ? 2 : 0) | (t.logdet ? 4 : 0)) {
    case 0: return Both<false, false, false>::b(a);
    case 1: return Both<true, false, false>::b(a);
    case 2: return Both<false, true, false>::b(a);
    case 3: return Both<true, true, false>::b(a);
    case 4: return Both<false, false, true>::b(a);
    case 5: return Both<true, false, true>::b(a);
    case 6: return Both<false, true, true>::b(a);
    default: return Both<true, true, true>::b(a);
  }
}

// ---------------------------------------------------------------- the float32 path, element by element

constexpr double kFloatMax = 3.4028234663852886e38;

bool float32_elements(ec::ScalarKind kind) { return kind != ec::ScalarKind::kFloat64; }

// α and ρ of one element as the float32 path forms them (device_common.cuh: float32_evidence): the
// float32 map at x = s·float(1/τ), the double map at a line's target and where that α leaves float32.
struct PathEvidence {
  float alpha_f, rho_f;  // the float32 functions' argument, and ρ
  double alpha, rho;     // what the line sums and the double math see
  bool beyond;           // α > FLT_MAX: float64 element math
  double at() const { return beyond ? alpha : alpha_f; }  // the element functions' argument
  double rho_at() const { return beyond ? rho : rho_f; }
};

PathEvidence float32_path(int kind, double s, double inv_tau, bool target) {
  const float sf = static_cast<float>(s);  // a stored float32 or half value: exact
  const kn::EvidenceValueF32 v = evidence_any(kind, sf * static_cast<float>(inv_tau));
  PathEvidence e{v.alpha, v.rho, v.alpha, v.rho, false};
  if (target || !(v.alpha < std::numeric_limits<float>::infinity())) {
    const kn::EvidenceValue d = evidence_any(kind, static_cast<double>(sf) * inv_tau);
    e = PathEvidence{static_cast<float>(d.alpha), static_cast<float>(d.rho), d.alpha, d.rho, !(d.alpha <= kFloatMax)};
  }
  return e;
}

// What one element adds to the statistics: α, (α·kSquareScale)² and the element functions.
struct Contribution {
  double alpha, square;
  kn::ElementForward f;
};

Contribution contribution_f64(ec::TermFlags flags, double alpha) {
  const double scaled = alpha * kn::kSquareScale;
  return Contribution{alpha, scaled * scaled, forward_any(flags, alpha)};
}

// As the float32 path computes it.
Contribution contribution_f32(ec::TermFlags flags, const PathEvidence& e) {
  if (e.beyond) return contribution_f64(flags, e.alpha);
  return Contribution{e.alpha, kn::square_statistic(e.alpha_f),
                      kn::widen_from_float(e.alpha_f, forward_any(flags, e.alpha_f))};
}

// ------------------------------------------------------------------------- s in some storage

// s (m × n) stored in `kind` with the given strides; `values` are what the kernels read (the
// stored numbers, widened to double).
struct Stored {
  std::int64_t m, n, row_stride, col_stride;
  ec::ScalarKind kind;
  std::vector<double> storage;  // raw bytes (double-aligned)
  std::vector<double> values;   // row-major m × n

  const char* bytes() const { return reinterpret_cast<const char*>(storage.data()); }
  char* bytes() { return reinterpret_cast<char*>(storage.data()); }
  std::size_t element_size() const {
    return kind == ec::ScalarKind::kFloat64 ? 8 : kind == ec::ScalarKind::kFloat32 ? 4 : 2;
  }
  ec::SimilarityView view(std::int64_t r0, std::int64_t rows) const {
    return ec::SimilarityView{bytes() + r0 * row_stride * element_size(), kind, row_stride, col_stride, rows, n, r0};
  }
};

double store_one(char* base, ec::ScalarKind kind, std::int64_t at, double v) {
  switch (kind) {
    case ec::ScalarKind::kFloat64: reinterpret_cast<double*>(base)[at] = v; return v;
    case ec::ScalarKind::kFloat32: {
      const float f = static_cast<float>(v);
      reinterpret_cast<float*>(base)[at] = f;
      return f;
    }
    case ec::ScalarKind::kFloat16: {
      const __half h = __float2half_rn(static_cast<float>(v));
      reinterpret_cast<__half*>(base)[at] = h;
      return __half2float(h);
    }
    default: {
      const __nv_bfloat16 b = __float2bfloat16_rn(static_cast<float>(v));
      reinterpret_cast<__nv_bfloat16*>(base)[at] = b;
      return __bfloat162float(b);
    }
  }
}

// Random similarities in [-1, 1], near-duplicate positives on the targets (i + offset).
Stored make_similarity(std::int64_t m, std::int64_t n, std::int64_t offset, ec::ScalarKind kind, bool transposed,
                       std::int64_t pad, std::mt19937_64& rng) {
  Stored s{m, n, transposed ? 1 : n + pad, transposed ? m + pad : 1, kind, {}, std::vector<double>(m * n)};
  const std::int64_t span = transposed ? (m + pad) * n : (n + pad) * m;
  s.storage.assign(span * static_cast<std::int64_t>(s.element_size()) / 8 + 8, 0.0);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double v = 0.6 * u(rng);
      if (i + offset == j) v = 0.97 + 0.02 * u(rng);
      s.values[i * n + j] = store_one(s.bytes(), kind, i * s.row_stride + j * s.col_stride, v);
    }
  }
  return s;
}

// ------------------------------------------------------------------------- forward statistics

struct Stats {
  std::vector<double> rows, cols;  // (7, m), (7, n)
};

// How the reference evaluates an element: the float64 element math, or the float32 path as the
// kernels run it for float32 and half inputs.
enum class Elements { kFloat64, kAsKernels };

Elements as_kernels(const Stored& s) { return float32_elements(s.kind) ? Elements::kAsKernels : Elements::kFloat64; }

Stats reference_stats(const Stored& s, int evidence, double inv_tau, bool targets, std::int64_t offset,
                      ec::TermFlags flags, bool rows, bool cols, Elements how) {
  Stats out{std::vector<double>(7 * s.m, 0.0), std::vector<double>(7 * s.n, 0.0)};
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < s.n; ++j) {
      const double v = s.values[i * s.n + j];
      const bool target = targets && i + offset == j;
      const Contribution e = how == Elements::kFloat64
                                 ? contribution_f64(flags, evidence_any(evidence, v * inv_tau).alpha)
                                 : contribution_f32(flags, float32_path(evidence, v, inv_tau, target));
      const double c[7] = {0.0,
                           target ? 0.0 : e.alpha,
                           target || !flags.kl ? 0.0 : e.f.kl_h,
                           target ? 0.0 : e.square,
                           target || !flags.fmse ? 0.0 : e.f.fisher,
                           flags.logdet ? e.f.log_trigamma : 0.0,
                           flags.logdet ? e.f.remainder : 0.0};
      for (int k = 1; k < 7; ++k) {
        if (rows) out.rows[k * s.m + i] += c[k];
        if (cols) out.cols[k * s.n + j] += c[k];
      }
      if (target) {
        if (rows) out.rows[i] = e.alpha;
        if (cols) out.cols[j] = e.alpha;
      }
    }
  }
  return out;
}

Stats kernel_stats(const Stored& s, int evidence, double inv_tau, bool targets, std::int64_t offset,
                   ec::TermFlags flags, bool rows, bool cols, std::int64_t budget, std::int64_t* strips) {
  Stats out{std::vector<double>(7 * s.m, 0.0), std::vector<double>(7 * s.n, 0.0)};
  const ec::StripPlan plan = ec::plan_strips(s.m, s.n, ec::StripNeeds{0, 0, true, false}, budget);
  std::vector<double> workspace(plan.total_bytes / 8 + 1, std::numeric_limits<double>::quiet_NaN());  // poisoned
  char* base = reinterpret_cast<char*>(workspace.data());
  for (std::int64_t strip = 0; strip < plan.strips; ++strip) {
    const std::int64_t r0 = strip * plan.strip_rows, nr = std::min(plan.strip_rows, s.m - r0);
    ec::ForwardArgs a{};
    a.s = s.view(r0, nr);
    a.evidence = evidence;
    a.inv_tau = inv_tau;
    a.has_targets = targets;
    a.target_offset = offset;
    a.terms = flags;
    a.row_stats = rows ? out.rows.data() : nullptr;
    a.row_stride = s.m;
    a.col_stats = cols ? out.cols.data() : nullptr;
    a.col_stride = s.n;
    a.row_partial = reinterpret_cast<double*>(base + plan.row_partial_offset);
    a.col_partial = reinterpret_cast<double*>(base + plan.col_partial_offset);
    a.max_row_groups = plan.row_groups;
    expect(ec::launch_forward_stats(a, nullptr) == cudaSuccess, "forward launch");
  }
  *strips = plan.strips;
  return out;
}

void compare_stats(const std::vector<double>& got, const std::vector<double>& want, std::int64_t n,
                   const std::string& what) {
  for (int k = 0; k < 7; ++k) {
    double scale = 0.0;
    for (std::int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(want[k * n + i]));
    for (std::int64_t i = 0; i < n; ++i) {
      const double g = got[k * n + i], w = want[k * n + i];
      if (!close(g, w, 1e-12, 1e-13 * scale)) {
        expect(false, what + " stat " + std::to_string(k) + " line " + std::to_string(i) + ": got " +
                          std::to_string(g) + " want " + std::to_string(w));
        return;
      }
    }
  }
  expect(true, what);
}

const ec::TermFlags kAllFlags[8] = {{false, false, false}, {true, false, false}, {false, true, false},
                                    {true, true, false},   {false, false, true}, {true, false, true},
                                    {false, true, true},   {true, true, true}};
const ec::ScalarKind kKinds[4] = {ec::ScalarKind::kFloat32, ec::ScalarKind::kFloat64, ec::ScalarKind::kFloat16,
                                  ec::ScalarKind::kBFloat16};
const double kInverseTau[4] = {20.0, 1.0, 20.0, 10.0};  // exp τ = 0.05, relu τ = 1, softplus 0.05, exp_tanh 0.1

void test_forward(std::mt19937_64& rng) {
  struct Shape {
    std::int64_t m, n, offset;
    bool targets, rows, cols;
    std::int64_t budget;
    const char* name;
  };
  // Every set of special functions on the first two shapes; the others with none and with all.
  const Shape shapes[] = {
      {45, 300, 0, true, true, true, 1 << 30, "loss, one strip"},
      {45, 300, 0, true, true, true, 5000, "loss, strips"},
      {20, 300, 200, true, true, true, 1, "line_stats strip at offset 200, one-row strips"},
      {33, 260, 0, false, true, true, 20000, "opinion"},
      {45, 300, 0, true, true, false, 5000, "rows only"},
      {45, 300, 0, true, false, true, 5000, "columns only"},
      {1, 700, 0, false, true, true, 1 << 30, "a single query"},
      {300, 5, 0, false, true, true, 1 << 30, "a skinny gallery"},
  };
  int variant = 0;
  for (const Shape& shape : shapes) {
    for (const ec::TermFlags& flags : kAllFlags) {
      const bool extreme = !(flags.kl || flags.fmse || flags.logdet) || (flags.kl && flags.fmse && flags.logdet);
      if (&shape - shapes >= 2 && !extreme) continue;
      const int kind_index = variant % 4, evidence = (variant / 4) % 4;
      ++variant;
      const Stored s = make_similarity(shape.m, shape.n, shape.offset, kKinds[kind_index], variant % 3 == 0,
                                       variant % 2, rng);
      std::int64_t strips = 0;
      const Stats got = kernel_stats(s, evidence, kInverseTau[evidence], shape.targets, shape.offset, flags,
                                     shape.rows, shape.cols, shape.budget, &strips);
      const Stats want = reference_stats(s, evidence, kInverseTau[evidence], shape.targets, shape.offset, flags,
                                         shape.rows, shape.cols, as_kernels(s));
      const std::string what = std::string(shape.name) + " (" + std::to_string(strips) + " strips, kind " +
                               std::to_string(kind_index) + ", evidence " + std::to_string(evidence) + ", flags " +
                               std::to_string(flags.kl) + std::to_string(flags.fmse) + std::to_string(flags.logdet) +
                               ")";
      compare_stats(got.rows, want.rows, s.m, what + " rows");
      compare_stats(got.cols, want.cols, s.n, what + " columns");
    }
  }
}

// ------------------------------------------------------------------------- per-line kernels

ec::TermWeights weights_for(ec::TermFlags f) {
  ec::TermWeights w{{1.0, f.kl ? 0.1 : 0.0, 0.5, f.fmse ? 0.7 : 0.0, f.logdet ? -0.01 : 0.0},
                    {true, f.kl, true, f.fmse, f.logdet}};
  return w;
}

void test_line_kernels(std::mt19937_64& rng) {
  const std::int64_t m = 50, n = 300, offset = 120;
  for (const ec::TermFlags& flags : kAllFlags) {
    const Stored s = make_similarity(m, n, offset, ec::ScalarKind::kFloat64, false, 0, rng);
    Stats st = reference_stats(s, 0, 20.0, true, offset, flags, true, true, Elements::kFloat64);
    st.rows[kn::kRest * m + 7] = std::numeric_limits<double>::infinity();  // an overflowed line
    std::vector<double> scale(n);
    for (double& c : scale) c = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const ec::TermWeights w = weights_for(flags);
    const ec::LineSpec spec{st.rows.data(), m, scale.data(), offset, static_cast<double>(n)};
    std::vector<double> losses(m, -1.0), upstream(m), constants(kn::kNumGradientFields * m, -1.0);
    for (double& u : upstream) u = std::uniform_real_distribution<double>(0.5, 1.5)(rng);
    expect(ec::launch_line_losses(spec, w, losses.data(), nullptr) == cudaSuccess, "line losses launch");
    expect(ec::launch_line_gradients(spec, w, upstream.data(), constants.data(), nullptr) == cudaSuccess,
           "line gradients launch");
    const kn::LineArrays lines{st.rows.data(), m, scale.data(), offset, static_cast<double>(n)};
    std::vector<double> want_constants(kn::kNumGradientFields * m);
    bool same = true;
    for (std::int64_t i = 0; i < m; ++i) {
      const double want = i == 7 ? std::numeric_limits<double>::infinity() : kn::line_loss(lines, i, w.weight, w.enabled);
      same = same && (losses[i] == want || (std::isnan(want) && std::isnan(losses[i])));
      kn::store_line_gradient(lines, i, w.weight, w.enabled, upstream[i], want_constants.data());
    }
    expect(same, "line losses (overflowed line: +inf)");
    bool same_constants = true;
    for (std::size_t k = 0; k < constants.size(); ++k) {
      same_constants = same_constants && (constants[k] == want_constants[k] ||
                                          (std::isnan(constants[k]) && std::isnan(want_constants[k])));
    }
    expect(same_constants, "line gradient constants");
  }
}

// ------------------------------------------------------------------------- ∂L/∂s

struct Lines {
  std::vector<double> rows, cols;  // (kNumGradientFields, m), (kNumGradientFields, n)
};

Lines gradient_constants(const Stats& st, std::int64_t m, std::int64_t n, std::int64_t offset, ec::TermFlags flags,
                         bool rows, bool cols, std::mt19937_64& rng) {
  const ec::TermWeights w = weights_for(flags);
  Lines out{std::vector<double>(kn::kNumGradientFields * m, 0.0), std::vector<double>(kn::kNumGradientFields * n, 0.0)};
  const kn::LineArrays row_lines{st.rows.data(), m, nullptr, offset, static_cast<double>(n)};
  const kn::LineArrays col_lines{st.cols.data(), n, nullptr, 0, static_cast<double>(n)};
  std::uniform_real_distribution<double> u(0.5, 1.5);
  for (std::int64_t i = 0; rows && i < m; ++i) kn::store_line_gradient(row_lines, i, w.weight, w.enabled, u(rng), out.rows.data());
  for (std::int64_t j = 0; cols && j < n; ++j) kn::store_line_gradient(col_lines, j, w.weight, w.enabled, u(rng), out.cols.data());
  return out;
}

// ∂L/∂s in float64 from α, ρ and both lines' constants (the float64 path's expression).
double gradient_f64(ec::TermFlags flags, double alpha, double rho, bool on, const kn::LineGradient& row,
                    const kn::LineGradient& col, double inv_tau) {
  const double on_target = on ? 1.0 : 0.0;
  const kn::ElementBackward f = backward_any(flags, alpha);
  return (kn::line_share(alpha, 1.0 - on_target, on_target, f, row) +
          kn::line_share(alpha, 1.0 - on_target, on_target, f, col)) *
         rho * inv_tau;
}

// ∂L/∂s as the float32 path computes it: in float from the narrowed constants, or in double from the
// same α and ρ where α exceeds FLT_MAX or the float value is not finite; then rounded to float.
float gradient_f32(ec::TermFlags flags, const PathEvidence& e, bool on, const kn::LineGradient& row,
                   const kn::LineGradient& col, double inv_tau) {
  if (!e.beyond) {
    const float on_target = on ? 1.0f : 0.0f;
    const kn::ElementBackwardF32 f = backward_any(flags, e.alpha_f);
    const float g = (kn::line_share(e.alpha_f, 1.0f - on_target, on_target, f, kn::narrow_line_gradient(row)) +
                     kn::line_share(e.alpha_f, 1.0f - on_target, on_target, f, kn::narrow_line_gradient(col))) *
                    e.rho_f * static_cast<float>(inv_tau);
    if (std::fabs(g) <= std::numeric_limits<float>::max()) return g;
  }
  return static_cast<float>(gradient_f64(flags, e.at(), e.rho_at(), on, row, col, inv_tau));
}

kn::LineGradient line_of(const std::vector<double>& constants, std::int64_t n, std::int64_t i) {
  return kn::load_line_gradient(kn::gradient_arrays(constants.data(), n), i);
}

double reference_gradient(const Stored& s, std::int64_t i, std::int64_t j, int evidence, double inv_tau,
                          std::int64_t offset, ec::TermFlags flags, const Lines& lines, Elements how) {
  const double v = s.values[i * s.n + j];
  const bool on = i + offset == j;
  const kn::LineGradient row = line_of(lines.rows, s.m, i), col = line_of(lines.cols, s.n, j);
  if (how == Elements::kAsKernels) return gradient_f32(flags, float32_path(evidence, v, inv_tau, on), on, row, col, inv_tau);
  const kn::EvidenceValue e = evidence_any(evidence, v * inv_tau);
  return gradient_f64(flags, e.alpha, e.rho, on, row, col, inv_tau);
}

void test_gradient(std::mt19937_64& rng) {
  const std::int64_t m = 30, n = 300, offset = 200;
  int variant = 0;
  for (const ec::TermFlags& flags : kAllFlags) {
    for (int out_kind = 0; out_kind < 5; ++out_kind) {  // 4 = float32 in place over s
      const int evidence = variant % 4;
      const ec::ScalarKind in_kind = out_kind == 4 ? ec::ScalarKind::kFloat32 : kKinds[(variant + 1) % 4];
      const bool transposed = out_kind != 4 && variant % 3 == 1;
      ++variant;
      Stored s = make_similarity(m, n, offset, in_kind, transposed, 0, rng);
      const bool rows = variant % 5 != 0, cols = variant % 7 != 0;
      const Stats st =
          reference_stats(s, evidence, kInverseTau[evidence], true, offset, flags, true, true, Elements::kFloat64);
      const Lines lines = gradient_constants(st, m, n, offset, flags, rows, cols, rng);
      const ec::ScalarKind out = out_kind == 4 ? ec::ScalarKind::kFloat32 : kKinds[out_kind];
      std::vector<double> separate(m * n + 8, std::numeric_limits<double>::quiet_NaN());
      char* grad = out_kind == 4 ? s.bytes() : reinterpret_cast<char*>(separate.data());
      const std::size_t out_size = out == ec::ScalarKind::kFloat64 ? 8 : out == ec::ScalarKind::kFloat32 ? 4 : 2;
      // Strips of 7 rows (the last shorter) with max |∂L/∂s| of the whole matrix.
      unsigned int max_bits = 0;
      for (std::int64_t r0 = 0; r0 < m; r0 += 7) {
        const std::int64_t nr = std::min<std::int64_t>(7, m - r0);
        ec::BackwardArgs a{};
        a.s = s.view(r0, nr);
        a.evidence = evidence;
        a.inv_tau = kInverseTau[evidence];
        a.target_offset = offset;
        a.terms = flags;
        a.row_constants = lines.rows.data();
        a.n_rows = m;
        a.col_constants = lines.cols.data();
        a.n_cols = n;
        a.grad = grad + r0 * n * out_size;
        a.grad_kind = out;
        a.grad_ld = n;
        a.max_bits = &max_bits;
        expect(ec::launch_gradient(a, nullptr) == cudaSuccess, "gradient launch");
      }
      float largest = 0.0f;
      bool exact = true;
      for (std::int64_t i = 0; i < m && exact; ++i) {
        for (std::int64_t j = 0; j < n && exact; ++j) {
          const double g =
              reference_gradient(s, i, j, evidence, kInverseTau[evidence], offset, flags, lines, as_kernels(s));
          largest = std::max(largest, std::fabs(static_cast<float>(g)));
          std::vector<double> one(1);
          const double want = store_one(reinterpret_cast<char*>(one.data()), out, 0, g);
          double got = 0.0;
          const std::int64_t at = i * n + j;
          switch (out) {
            case ec::ScalarKind::kFloat64: got = reinterpret_cast<double*>(grad)[at]; break;
            case ec::ScalarKind::kFloat32: got = reinterpret_cast<float*>(grad)[at]; break;
            case ec::ScalarKind::kFloat16: got = __half2float(reinterpret_cast<__half*>(grad)[at]); break;
            default: got = __bfloat162float(reinterpret_cast<__nv_bfloat16*>(grad)[at]); break;
          }
          if (!(got == want || (std::isnan(got) && std::isnan(want)))) {
            exact = false;
            expect(false, "dL/ds at (" + std::to_string(i) + ", " + std::to_string(j) + ") variant " +
                              std::to_string(variant) + ": got " + std::to_string(got) + " want " + std::to_string(want));
          }
        }
      }
      expect(exact, "dL/ds, every element, variant " + std::to_string(variant));
      expect(__uint_as_float(max_bits) == largest, "max |dL/ds| over the strips, variant " + std::to_string(variant));
    }
  }
}

void test_scale_to_half(std::mt19937_64& rng) {
  for (double magnitude : {1e-12, 3e-7, 1.0, 5e3, 1e30, 0.0}) {
    const std::int64_t count = 1000;
    std::vector<float> g(count);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    float largest = 0.0f;
    for (float& v : g) {
      v = static_cast<float>(magnitude * u(rng) * std::pow(10.0, -6.0 * std::fabs(u(rng))));
      largest = std::max(largest, std::fabs(v));
    }
    unsigned int bits = __float_as_uint(largest);
    std::vector<__half> out(count);
    float alphas[3] = {-1.0f, -1.0f, -1.0f};
    expect(ec::launch_scale_to_half(g.data(), out.data(), count, &bits, alphas, nullptr) == cudaSuccess, "scale launch");
    const float scale = 1.0f / alphas[0];
    expect(alphas[1] == 1.0f && alphas[2] == 0.0f, "alpha constants");
    if (largest > 0.0f) {
      expect(largest * scale >= 16384.0f && largest * scale < 32768.0f,
             "max |g| scaled into [2^14, 2^15) at magnitude " + std::to_string(magnitude));
    } else {
      expect(scale == 1.0f, "no scale for an all-zero strip");
    }
    bool same = true;
    for (std::int64_t k = 0; k < count; ++k) same = same && __half2float(out[k]) == __half2float(__float2half_rn(g[k] * scale));
    expect(same, "g·2^e rounded to float16");
  }
}

}  // namespace

int main() {
  std::mt19937_64 rng(20261122);
  test_forward(rng);
  test_line_kernels(rng);
  test_gradient(rng);
  test_scale_to_half(rng);
  std::printf("cuda kernels (CPU emulation): %ld checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
