// The CUDA kernels of csrc/cuda/*.cu, unchanged, run on the CPU under the emulation of
// csrc/tests/emulation/ (blocks one at a time, threads as user-level contexts, real barriers and
// warp shuffles), against a direct evaluation of the same definitions: the float64 element math
// for float64 inputs, and for float32 and half inputs the float32 element math as the kernels
// compose it (device_common.cuh: float32 evidence; the same csrc/kernels/ functions, evaluated here
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
#include <cstring>
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

// The element functions of one term set <A, B, C>: at α (double or float), from exp_tanh's t, and
// beyond FLT_MAX from ln α (element_terms.h).
template <bool A, bool B, bool C>
struct Both {
  static kn::ElementForward f(double a) { return kn::element_forward<A, B, C>(a); }
  static kn::ElementBackward b(double a) { return kn::element_backward<A, B, C>(a); }
  static kn::ElementForwardF32 f(float a) { return kn::element_forward_f32<A, B, C>(a); }
  static kn::ElementBackwardF32 b(float a) { return kn::element_backward_f32<A, B, C>(a); }
  static kn::ElementForwardF32 f_of_tanh(float t) { return kn::element_forward_f32_of_tanh<A, B, C>(t); }
  static kn::ElementBackwardF32 b_of_tanh(float t) { return kn::element_backward_f32_of_tanh<A, B, C>(t); }
  static kn::ElementForwardF32 f_of_log(float l) { return kn::element_forward_f32_of_log<A, B, C>(l); }
  static kn::ElementBackwardF32 b_of_log(float l) { return kn::element_backward_f32_of_log<A, B, C>(l); }
};

// call(Both<kl, fmse, logdet>{}) for run-time term flags (kn::with_term_flags), its result.
template <typename Call>
auto with_flags(ec::TermFlags t, Call call) {
  decltype(call(Both<false, false, false>{})) out{};
  kn::with_term_flags(t, [&](auto kl, auto fmse, auto logdet) {
    out = call(Both<decltype(kl)::value, decltype(fmse)::value, decltype(logdet)::value>{});
  });
  return out;
}

template <typename T>
auto forward_any(ec::TermFlags t, T a) {
  return with_flags(t, [&](auto fns) { return decltype(fns)::f(a); });
}

template <typename T>
auto backward_any(ec::TermFlags t, T a) {
  return with_flags(t, [&](auto fns) { return decltype(fns)::b(a); });
}

kn::ElementForwardF32 forward_of_tanh_any(ec::TermFlags t, float tanh) {
  return with_flags(t, [&](auto fns) { return decltype(fns)::f_of_tanh(tanh); });
}

kn::ElementBackwardF32 backward_of_tanh_any(ec::TermFlags t, float tanh) {
  return with_flags(t, [&](auto fns) { return decltype(fns)::b_of_tanh(tanh); });
}

kn::ElementForwardF32 forward_of_log_any(ec::TermFlags t, float log_alpha) {
  return with_flags(t, [&](auto fns) { return decltype(fns)::f_of_log(log_alpha); });
}

kn::ElementBackwardF32 backward_of_log_any(ec::TermFlags t, float log_alpha) {
  return with_flags(t, [&](auto fns) { return decltype(fns)::b_of_log(log_alpha); });
}

// ---------------------------------------------------------------- the float32 path, element by element

constexpr double kFloatMax = 3.4028234663852886e38;

bool float32_elements(ec::ScalarKind kind) { return kind != ec::ScalarKind::kFloat64; }

// α and ρ of one element as the float32 path forms them (device_common.cuh: float32 evidence): the
// float32 map at x = s·float(1/τ); at a line's target and where that α leaves float32, evidence.h
// rare_evidence (x split into two floats, α in double from float arithmetic).
struct PathEvidence {
  float alpha_f, rho_f;  // the float32 functions' argument, and ρ
  double alpha, rho;     // what the line sums and the double math see
  bool beyond;           // α > FLT_MAX: the functions of ln α, the gradient's shares in double
  bool rare;             // rare_evidence (a target, or the float32 α infinite)
  float tanh = 0.0f;     // exp_tanh: t = tanh x of the float map
  bool of_tanh = false;  // the element functions from t (exp_tanh, not rare)
  float log_alpha = 0.0f;  // beyond FLT_MAX: ln α, the functions' argument
  double at() const { return beyond ? alpha : alpha_f; }  // α of the line sums and of p = α/S
  double rho_at() const { return beyond ? rho : rho_f; }
  // The α at which the element functions are evaluated: 1 + e^t exactly for the functions of t,
  // otherwise at().
  double functions_at() const { return of_tanh ? 1.0 + std::exp(static_cast<double>(tanh)) : at(); }
};

PathEvidence float32_path(int kind, double s, double inv_tau, bool target) {
  const float sf = static_cast<float>(s);  // a stored float32 or half value: exact
  const float inv_tau_f = static_cast<float>(inv_tau);
  const float inv_tau_lo = static_cast<float>(inv_tau - static_cast<double>(inv_tau_f));
  const kn::EvidenceValueF32 v = kn::evidence_value_of_kind(kind, sf * inv_tau_f);
  PathEvidence e{v.alpha, v.rho, v.alpha, v.rho, false, false, v.tanh,
                 kind == static_cast<int>(kn::EvidenceKind::kExpTanh)};
  if (target || !(v.alpha < std::numeric_limits<float>::infinity())) {
    const kn::RareEvidence r =
        kn::rare_evidence_of_kind(kind, v, kn::split_product(sf, inv_tau_f, inv_tau_lo), sf, inv_tau_f);
    e = PathEvidence{r.alpha_f, static_cast<float>(r.rho), r.alpha, r.rho, r.beyond, true};
    e.log_alpha = r.log_alpha;
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
  if (e.beyond) {
    return Contribution{e.alpha, kn::square_statistic_of_double(e.alpha),
                        kn::widen_beyond_float(e.alpha, forward_of_log_any(flags, e.log_alpha))};
  }
  return Contribution{e.alpha, kn::square_statistic(e.alpha_f),
                      kn::widen_from_float(e.alpha_f, e.of_tanh ? forward_of_tanh_any(flags, e.tanh)
                                                                : forward_any(flags, e.alpha_f))};
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
                                 ? contribution_f64(flags, kn::evidence_value_of_kind(evidence, v * inv_tau).alpha)
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
      {20, 300, 100, true, true, true, 5000, "targets in a thread's fourth column (offset 100)"},
      {33, 260, 0, false, true, true, 20000, "opinion"},
      {45, 300, 0, true, true, false, 5000, "rows only"},
      {45, 300, 0, true, false, true, 5000, "columns only"},
      {1, 700, 0, false, true, true, 1 << 30, "a single query"},
      {300, 5, 0, false, true, true, 1 << 30, "a skinny gallery"},
      {40, 2600, 7, true, true, true, 1 << 30, "more column blocks than the row reduction's warps"},
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

// ∂L/∂s in float64 from α, ρ and both lines' constants (the float64 path's expression); the element
// functions at functions_at if given (exp_tanh's functions of t: 1 + e^t), else at α.
double gradient_f64(ec::TermFlags flags, double alpha, double rho, bool on, const kn::LineGradient& row,
                    const kn::LineGradient& col, double inv_tau, double functions_at = 0.0) {
  const double on_target = on ? 1.0 : 0.0;
  const kn::ElementBackward f = backward_any(flags, functions_at > 0.0 ? functions_at : alpha);
  return (kn::line_share(alpha, 1.0 - on_target, on_target, f, row) +
          kn::line_share(alpha, 1.0 - on_target, on_target, f, col)) *
         rho * inv_tau;
}

// ∂L/∂s as the float32 path computes it: in float from the narrowed constants, or in double from the
// same α and ρ where α exceeds FLT_MAX or the float value is not finite; then rounded to float.
float gradient_f32(ec::TermFlags flags, const PathEvidence& e, bool on, const kn::LineGradient& row,
                   const kn::LineGradient& col, double inv_tau, bool* in_double = nullptr) {
  if (in_double != nullptr) *in_double = true;
  if (!e.beyond) {
    const float on_target = on ? 1.0f : 0.0f;
    const kn::ElementBackwardF32 f = e.of_tanh ? backward_of_tanh_any(flags, e.tanh) : backward_any(flags, e.alpha_f);
    const float g = (kn::line_share(e.alpha_f, 1.0f - on_target, on_target, f, kn::narrow_line_gradient(row)) +
                     kn::line_share(e.alpha_f, 1.0f - on_target, on_target, f, kn::narrow_line_gradient(col))) *
                    e.rho_f * static_cast<float>(inv_tau);
    if (std::fabs(g) <= std::numeric_limits<float>::max()) {
      if (in_double != nullptr) *in_double = false;
      return g;
    }
  }
  // The double redo: line_share in double, the element factors the float32 functions' (of ln α
  // beyond FLT_MAX) widened.
  const kn::ElementBackward f = kn::widen(e.beyond ? backward_of_log_any(flags, e.log_alpha) : backward_any(flags, e.alpha_f));
  const double on_target = on ? 1.0 : 0.0;
  return static_cast<float>((kn::line_share(e.at(), 1.0 - on_target, on_target, f, row) +
                             kn::line_share(e.at(), 1.0 - on_target, on_target, f, col)) *
                            e.rho_at() * inv_tau);
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
  const kn::EvidenceValue e = kn::evidence_value_of_kind(evidence, v * inv_tau);
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
      // Blocks of 7 rows × `width` columns (the last of each shorter; width n: full-width strips)
      // with max |∂L/∂s| of the whole matrix. A block of columns [c0, c0 + nc) is a view of them
      // with the column constants and the target offset shifted by c0 (kernels.h BackwardArgs), as
      // loss_backward's 2-D blocks (strip_plan.h plan_gradient_blocks) launch it.
      const std::int64_t width = variant % 2 == 0 ? n : 97;
      unsigned int max_bits = 0;
      for (std::int64_t r0 = 0; r0 < m; r0 += 7) {
        for (std::int64_t c0 = 0; c0 < n; c0 += width) {
          const std::int64_t nr = std::min<std::int64_t>(7, m - r0), nc = std::min(width, n - c0);
          ec::BackwardArgs a{};
          a.s = s.view(r0, nr);
          a.s.data = static_cast<const char*>(a.s.data) + c0 * s.col_stride * s.element_size();
          a.s.cols = nc;
          a.evidence = evidence;
          a.inv_tau = kInverseTau[evidence];
          a.target_offset = offset - c0;
          a.terms = flags;
          a.row_constants = lines.rows.data();
          a.n_rows = m;
          a.col_constants = lines.cols.data() + c0;
          a.n_cols = n;
          a.grad = grad + (r0 * n + c0) * out_size;
          a.grad_kind = out;
          a.grad_ld = n;
          a.max_bits = &max_bits;
          expect(ec::launch_gradient(a, nullptr) == cudaSuccess, "gradient launch");
        }
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

// ∂L/∂s of sᵀ (the column pass of the backward, csrc/cuda/evidential_cuda.cpp): a view with the
// strides swapped, the two directions' line constants swapped and the target offset negated gives
// the transpose of ∂L/∂s bit for bit (each element's coefficient is the sum of its two lines'
// shares, and a + b == b + a), in strips of columns, for every evidence map and output kind.
void test_gradient_transposed(std::mt19937_64& rng) {
  const std::int64_t m = 30, n = 300, offset = 200;
  const ec::TermFlags flags{true, true, true};
  for (int evidence = 0; evidence < 4; ++evidence) {
    for (const ec::ScalarKind out : {ec::ScalarKind::kFloat32, ec::ScalarKind::kBFloat16, ec::ScalarKind::kFloat64}) {
      const ec::ScalarKind in_kind = out == ec::ScalarKind::kFloat64 ? ec::ScalarKind::kFloat64 : ec::ScalarKind::kFloat32;
      const Stored s = make_similarity(m, n, offset, in_kind, evidence % 2 == 1, 0, rng);
      const Stats st =
          reference_stats(s, evidence, kInverseTau[evidence], true, offset, flags, true, true, Elements::kFloat64);
      const Lines lines = gradient_constants(st, m, n, offset, flags, true, true, rng);
      std::vector<double> direct(m * n + 8, 0.0), swapped(m * n + 8, 0.0);
      ec::BackwardArgs a{};
      a.evidence = evidence;
      a.inv_tau = kInverseTau[evidence];
      a.terms = flags;
      a.grad_kind = out;
      a.s = s.view(0, m);
      a.target_offset = offset;
      a.row_constants = lines.rows.data();
      a.n_rows = m;
      a.col_constants = lines.cols.data();
      a.n_cols = n;
      a.grad = direct.data();
      a.grad_ld = n;
      expect(ec::launch_gradient(a, nullptr) == cudaSuccess, "gradient launch");
      const std::size_t out_size = out == ec::ScalarKind::kFloat64 ? 8 : out == ec::ScalarKind::kFloat32 ? 4 : 2;
      for (std::int64_t c0 = 0; c0 < n; c0 += 64) {  // strips of 64 columns, the last shorter
        const std::int64_t nc = std::min<std::int64_t>(64, n - c0);
        ec::BackwardArgs t = a;
        t.s = ec::SimilarityView{s.bytes() + c0 * s.col_stride * s.element_size(), s.kind, s.col_stride, s.row_stride,
                                 nc, m, c0};
        t.target_offset = -offset;
        t.row_constants = lines.cols.data();
        t.n_rows = n;
        t.col_constants = lines.rows.data();
        t.n_cols = m;
        t.grad = reinterpret_cast<char*>(swapped.data()) + c0 * m * out_size;
        t.grad_ld = m;
        expect(ec::launch_gradient(t, nullptr) == cudaSuccess, "transposed gradient launch");
      }
      bool same = true;
      for (std::int64_t i = 0; i < m && same; ++i) {
        for (std::int64_t j = 0; j < n && same; ++j) {
          same = std::memcmp(reinterpret_cast<const char*>(direct.data()) + (i * n + j) * out_size,
                             reinterpret_cast<const char*>(swapped.data()) + (j * m + i) * out_size, out_size) == 0;
          if (!same) {
            expect(false, "transposed dL/ds at (" + std::to_string(i) + ", " + std::to_string(j) + "), evidence " +
                              std::to_string(evidence));
          }
        }
      }
      expect(same, "dL/ds of the transposed view is the transpose, evidence " + std::to_string(evidence));
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

// ------------------------------------------------------------ float32 path against float64

// The float32 path (float32 and half inputs) against the float64 reference in the hard regime:
// near-duplicate positives at τ = 0.05 (α ≈ 4e8), exp evidence leaving float32 (τ = 0.01, values
// around x = 88.72) and double's α² (τ = 0.002), evidence near 1 (α ≈ 1 + 6e-6 and 1 + 1e-3, where a
// line's KL is second order in α − 1), relu α = 1 exactly, every evidence kind, every set of terms,
// forward and backward. Three checks, each able to fail:
//   (a) the kernels against the float64 element math evaluated at the float32 path's own α and ρ,
//       within bounds derived from the float32 arithmetic below (the kernels' only error sources
//       there; the float64 reference's own error, csrc/tests/test_kernels.cpp's tolerances, added);
//   (b) the float32 evidence maps' α and ρ against the double maps', within the bounds derived below
//       (so (a) and (b) together bound the kernels against the float64 reference at its own α);
//   (c) SPEC §5 end to end: the line terms from the kernels' statistics, and ∂L/∂s from the kernels'
//       statistics and gradient, against the float64 reference: float32 tolerances (1e-5, 1e-4 for
//       fmse and logdet, ∂L/∂s 1e-4 of its largest magnitude), also for the bfloat16 and float16
//       cases, since the reference is evaluated on the same rounded similarities.

constexpr double kU = 0x1p-24;  // float32 unit roundoff: a rounding moves a value by at most kU·|value|

// SPEC §2 "Float32 element math": worst ulps of the float32 element functions (every CPU build), plus
// what the GPU's approximations add (emulated here: a quotient within 2.5 ulp, elementary_f32.h):
// - kApproxUlps, to every function: ln x moves by < 0.11 ulp (its quotient enters 0.043 of it), so
//   the fits' variable s by 0.11 ulp of |s| <= 1.39, which moves P(s) by < 0.25 ulp (|P'/P| <= 2
//   with the zeros factored out); u = 1/x within 2.5 ulp moves a series a + c·u + … with |c·u| <=
//   |a|/8 (x >= 8) by < 0.32 ulp, and a series led by ln x by less;
// - kApproxUlpsInU, to r and x·r', whose series are proportional to u: u's own 2.5 ulp (the
//   emulated kEmulatedApproxUlps on top of the IEEE quotient's ½).
constexpr double kApproxUlps = 0.35, kApproxUlpsInU = kn::kEmulatedApproxUlps + 0.5;
constexpr double kUlpsHPlusOne = 2.34 + kApproxUlps, kUlpsXTrigamma = 1.18 + kApproxUlps;
constexpr double kUlpsLogTrigamma = 2.61 + kApproxUlps, kUlpsRemainder = 2.25 + kApproxUlps + kApproxUlpsInU;
constexpr double kUlpsXKlV = 1.75 + kApproxUlps, kUlpsFisherSlope = 2.84 + kApproxUlps;
constexpr double kUlpsRatio = 2.22 + kApproxUlps + kn::kEmulatedApproxUlps,  // its quotient within 2.5 ulp instead of ½
    kUlpsXRPrime = 2.32 + kApproxUlps + kApproxUlpsInU;

// The spacing of floats at |y| (the ulp the SPEC's bounds count), taken at |y|·(1 + 2^-18) so that a
// float result a few ulps above y, in the next binade, is covered; 2^-149 below FLT_MIN.
double ulp32(double y) {
  const double a = std::fabs(y) * (1.0 + 0x1p-18);
  if (a < 0x1p-126) return 0x1p-149;
  int e = 0;
  std::frexp(a, &e);  // a = m·2^e, m ∈ [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

// (b): the float32 map against the double map at one element. x = s·float(1/τ) in float is two
// roundings from s/τ (1/τ narrowed, the product): |Δx| <= (2kU + 2^-52)|x|, the 2^-52 for the double
// map's own x. α = g(x) + 1 moves by at most ρ·|Δx| relatively (ρ = d ln α/dx <= 1 for every kind),
// ρ by at most K·|Δx| (|d ln ρ/dx| <= K: 1 − ρ for exp, 1/α for relu, |1 − σ − ρ| for softplus,
// |sech²x − 2 tanh x − ρ| <= 4 for exp_tanh). The maps' own errors, relative, in units of kU, from
// the operations of evidence.h as this build runs them: the GPU's approximate exponential and
// quotients, emulated (elementary_f32.h: the CPU's result moved by up to 2 ulp, so exp_f within
// 3 ulp <= 6kU and a quotient within 2.5 ulp <= 5kU, each beyond the hardware's 3 and 2 ulp);
// log1p_f 1.17 ulp plus 0.11 from its own quotients (2.58kU); a rounding kU:
//   α: exp e + 1: 6 + 1 = 7; relu x + 1: 1; softplus 2.58·0.41 + 6·0.3 + 2 -> 5 (l/α <= 0.41,
//      small/((1 + small)α) <= 0.3); exp_tanh: t = ±(1 − q)·(1/(1 + q)) within 3 (q's 6, halved by
//      |dt/dq·q| <= ½) + 1 + 1 + 5 + 1 = 11kU absolute, e^t within 11 + 6 = 17kU, (e + 1) ->
//      0.73·17 + 1 -> 14;
//   ρ: exp e/α: 6 + 7 + 5 = 18; relu 1/α: 1 + 5 = 6; softplus σ/α: (6 + 1 + 5) + 5 + 5 = 22;
//      exp_tanh e·4q·inv²/α: 17 + 6 + 2·(1 + 5) + 4 + 14 + 5 = 58.
// Below FLT_MIN a float is subnormal, with an absolute error of up to 2^-150 per rounding (here;
// the GPU flushes such results to 0, an absolute error below 2^-126): ρ there (exp evidence at
// x < −87.3: ρ = e/α; exp_tanh beyond |x| ≈ 44: q = e^{-2|x|} subnormal, times 4e/(α(1 + q)²) <=
// 2.93, and ρ's own rounding) is within 4·2^-150 = 2^-148 plus the emulated ulps of a subnormal
// (two steps of 2^-149 each in e or q, times ≤ 2.93): 2^-148 + 6·2^-148 < 2^-145.
constexpr double kAlphaMapUlps[4] = {7, 1, 5, 14};
constexpr double kRhoMapUlps[4] = {18, 6, 22, 58};
constexpr double kRhoSlope[4] = {1, 1, 1, 4};

struct MapBounds {
  double alpha, rho;
};

MapBounds map_bounds(int kind, double x, const kn::EvidenceValue& d) {
  const double dx = std::fabs(x) * (2 * kU + 0x1p-52);
  const double grow = 1.0 + 4 * dx;  // e^{c·dx} − 1 <= c·dx·(1 + c·dx) for the small c·dx here
  return MapBounds{d.alpha * (dx * grow + kAlphaMapUlps[kind] * kU),
                   d.rho * (kRhoSlope[kind] * dx * grow + kRhoMapUlps[kind] * kU) + 0x1p-145};
}

// (a), forward: what element functions at the path's α the kernels sum, and how far each float32
// value may be from its float64 counterpart at the same α:
//   rest: α itself, exact; squares: square_statistic, one float rounding (kU);
//   kl_h: (h + 1)_f − 1 with h + 1 within kUlpsHPlusOne ulps (the double subtraction exact, or 2^-53);
//   fisher: α·(αψ1) + αψ1 in float, αψ1 within kUlpsXTrigamma ulps (<= 2·1.18 kU relative, αψ1 ∈
//           [1, 1.645]) plus two roundings;
//   ln ψ1, r: within their ulps.
// Elements whose α exceeds FLT_MAX take the same bounds: the float functions of ln α (their ulps, the
// series' limits exact), α² from α's float mantissa (one rounding), α(α + 1)ψ1 as α + 1 (off by
// 1/(2α) relative, nothing). The float64 reference's own error (test_kernels.cpp: 2e-14 relative with the floors of its cancelling forms)
// is added, and the sums, reordered, each within (terms)·2^-53 of Σ|terms|.
struct Accuracy {
  Stats want, tol;
};

Accuracy reference_at_path_alpha(const Stored& s, int evidence, double inv_tau, ec::TermFlags flags) {
  const std::int64_t m = s.m, n = s.n;
  Accuracy out{Stats{std::vector<double>(7 * m, 0.0), std::vector<double>(7 * n, 0.0)},
               Stats{std::vector<double>(7 * m, 0.0), std::vector<double>(7 * n, 0.0)}};
  std::vector<double> row_abs(7 * m, 0.0), col_abs(7 * n, 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const bool target = i == j;
      const PathEvidence e = float32_path(evidence, s.values[i * n + j], inv_tau, target);
      const double at = e.at();
      Contribution c = contribution_f64(flags, at);
      if (e.of_tanh) {
        // The functions at α_t = 1 + e^t; the kernels' fisher statistic is (α_f + 1)·(α_tψ1(α_t)).
        const double at_t = e.functions_at();
        c.f = forward_any(flags, at_t);
        c.f.fisher *= (at + 1.0) / (at_t + 1.0);
        // t itself (nothing else checks it: the kernels and this reference both follow it): within
        // 11kU absolute of tanh of the kernels' own float x = s·float(1/τ) (map_bounds' derivation).
        const float x = static_cast<float>(s.values[i * n + j]) * static_cast<float>(inv_tau);
        expect(std::fabs(e.tanh - std::tanh(static_cast<double>(x))) <= 11 * kU,
               "exp_tanh's t against tanh x at s = " + std::to_string(s.values[i * n + j]));
      }
      const double h = c.f.kl_h, fisher = c.f.fisher, lt = c.f.log_trigamma, r = c.f.remainder;
      double value[7] = {0.0, e.alpha, h, c.square, fisher, lt, r};
      double tol[7] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
      tol[kn::kSquares] = kU * c.square;
      tol[kn::kKlH] = kUlpsHPlusOne * ulp32(h + 1.0) + 0x1p-53 + 2e-14 * (std::fabs(h) + 31.0);
      tol[kn::kFisher] = ((2 * kUlpsXTrigamma + 2) * kU + 2e-14) * fisher;
      tol[kn::kLogTrigamma] = kUlpsLogTrigamma * ulp32(lt) + 2e-14 * (std::fabs(lt) + 1.0);
      tol[kn::kRemainder] = kUlpsRemainder * ulp32(r) + 2e-14 * (std::fabs(r) + (at < 30.0 ? at : 0.0));
      const bool summed[7] = {false, !target, flags.kl && !target, !target, flags.fmse && !target, flags.logdet,
                              flags.logdet};
      for (int k = 1; k < 7; ++k) {
        if (!summed[k]) continue;
        out.want.rows[k * m + i] += value[k];
        out.want.cols[k * n + j] += value[k];
        out.tol.rows[k * m + i] += tol[k];
        out.tol.cols[k * n + j] += tol[k];
        row_abs[k * m + i] += std::fabs(value[k]);
        col_abs[k * n + j] += std::fabs(value[k]);
      }
      if (target) {
        out.want.rows[i] = e.alpha;
        out.want.cols[j] = e.alpha;
      }
    }
  }
  for (int k = 1; k < 7; ++k) {
    for (std::int64_t i = 0; i < m; ++i) out.tol.rows[k * m + i] += 2.0 * n * 0x1p-53 * row_abs[k * m + i];
    for (std::int64_t j = 0; j < n; ++j) out.tol.cols[k * n + j] += 2.0 * m * 0x1p-53 * col_abs[k * n + j];
  }
  return out;
}

// (a), backward. The float coefficient is line_share's terms in float (element_terms.h), each a
// product of narrowed constants (one rounding each, kU), p = (α·2^-64)·float(2^64/S) (two), element
// factors (within their ulps: 2·ulps kU relative) and the roundings of the products and sums on its
// way into the share. The longest path is p·fisher·f': f' 2·2.84, fisher 1, p 2, then fisher·f',
// + square·p, + all, ·p, and four sums with the other terms (8). The shares then pass four more
// roundings: their sum, ·ρ, ·float(1/τ) and 1/τ's own narrowing. To first order (an FMA only removes
// roundings) that is 21.4 kU of the sum of the terms' magnitudes; 22 kU allows the second order.
// Constants below FLT_MIN are off by up to 2^-150 absolute instead (p and p·off by α·2^-214), and so
// are products that land there: in the coefficient (share_floor), and coefficient·ρ, then ·(1/τ),
// where ρ underflows float (exp evidence at x < −87.3, exp_tanh beyond |x| ≈ 44): 2^-150·(1/τ + 1).
constexpr double kLongestPath = 2 * kUlpsFisherSlope + 1 + 2 + 8;
constexpr double kGradientUlps = 22.0;
static_assert(kGradientUlps >= kLongestPath + 4, "the longest path and the final four roundings");
static_assert(2 * kUlpsXKlV + 1 + 1 + 5 < kLongestPath && 2 * kUlpsRatio + 1 + 1 + 4 < kLongestPath &&
                  2 * kUlpsXRPrime + 1 + 1 + 3 < kLongestPath,
              "the kl_v, logdet_ratio and logdet_remainder terms' paths are shorter");

double share_magnitude(double alpha, double on, const kn::ElementBackward& f, const kn::LineGradient& l) {
  const double off = 1.0 - on, p = alpha * std::fabs(l.inv_strength);
  return p * (std::fabs(l.all) + off * (std::fabs(l.off) + std::fabs(l.square) * p + std::fabs(l.fisher * f.fisher_slope))) +
         off * std::fabs(l.kl_v * f.kl_v) + std::fabs(l.logdet_ratio * f.logdet_ratio) +
         std::fabs(l.logdet_remainder * f.logdet_r_prime) + on * std::fabs(l.target);
}

double share_floor(double alpha, const kn::LineGradient& l) {
  const double p_error = alpha * 0x1p-64 * 0x1p-150;  // p = (α·2^-64)·float(2^64/S), p·off alike
  return p_error * (2.0 * (std::fabs(l.all) + 2.0 * std::fabs(l.square) + std::fabs(l.fisher)) + 1.0) + 64.0 * 0x1p-150;
}

// SPEC §5, float32: relative error of a line term (floors as the Python suite applies them).
double term_error(int term, double got, double want) {
  static const double kTol[kn::kNumTerms] = {1e-5, 1e-5, 1e-5, 1e-4, 1e-4};
  if (term == kn::kKl || term == kn::kLogdet) return std::fabs(got - want) / std::max(std::fabs(want), 1e-3);
  return std::fabs(got - want) / (std::fabs(want) + 1e-10 / kTol[term]);
}

struct Worst {
  double ratio = 0.0;
  std::string where;
  void see(double r, const std::string& what) {
    if (r > ratio || std::isnan(r)) {
      ratio = std::isnan(r) ? std::numeric_limits<double>::infinity() : r;
      where = what;
    }
  }
};

struct HardCase {
  const char* name;
  int evidence;
  double tau;
  double positive;        // targets' similarity
  double centre, spread;  // off-target similarities uniform in centre ± spread
  bool edge;              // also hard negatives, and values whose x is within a few floats of 88.72
  ec::ScalarKind kind;
  bool every_flags;       // every set of terms, else none and all
  double huge_upstream;   // > 0: row 0's upstream gradient (line constants beyond FLT_MAX)
};

// Off-target similarities of `edge` cases: every float s whose x = s·float(1/τ) lies within 64
// floats of 88.72284 (kMaxExpArgF, where exp_f leaves float32). x_f equal to it gives α_f = inf
// while α in double may still be below FLT_MAX: the double map without the double functions.
std::vector<float> edge_values(double tau) {
  const float inv_tau = static_cast<float>(1.0 / tau);
  std::vector<float> out;
  float v = 88.7228394f / inv_tau;
  for (int step = 0; step < 64; ++step) v = std::nextafter(v, 0.0f);
  for (int step = 0; step < 128; ++step, v = std::nextafter(v, 2.0f)) {
    if (v <= 1.0f) out.push_back(v);
  }
  return out;
}

Stored hard_similarity(const HardCase& c, std::int64_t k, std::mt19937_64& rng) {
  Stored s{k, k, k, 1, c.kind, {}, std::vector<double>(k * k)};
  s.storage.assign(k * k * static_cast<std::int64_t>(s.element_size()) / 8 + 8, 0.0);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const std::vector<float> edge = c.edge ? edge_values(c.tau) : std::vector<float>();
  std::uniform_int_distribution<std::size_t> pick(0, edge.empty() ? 0 : edge.size() - 1);
  for (std::int64_t i = 0; i < k; ++i) {
    for (std::int64_t j = 0; j < k; ++j) {
      double v = i == j ? c.positive : c.centre + c.spread * u(rng);
      if (c.edge && i != j && (i + 3 * j) % 11 == 0) v = 0.92 + 0.03 * u(rng);  // hard negatives
      if (c.edge && i != j && (2 * i + j) % 7 == 0 && !edge.empty()) v = edge[pick(rng)];
      s.values[i * k + j] = store_one(s.bytes(), c.kind, i * k + j, std::max(-1.0, std::min(1.0, v)));
    }
  }
  return s;
}

Lines constants_for(const Stats& st, std::int64_t k, ec::TermFlags flags, const std::vector<double>& up_rows,
                    const std::vector<double>& up_cols) {
  const ec::TermWeights w = weights_for(flags);
  Lines out{std::vector<double>(kn::kNumGradientFields * k), std::vector<double>(kn::kNumGradientFields * k)};
  const kn::LineArrays rows{st.rows.data(), k, nullptr, 0, static_cast<double>(k)};
  const kn::LineArrays cols{st.cols.data(), k, nullptr, 0, static_cast<double>(k)};
  for (std::int64_t i = 0; i < k; ++i) kn::store_line_gradient(rows, i, w.weight, w.enabled, up_rows[i], out.rows.data());
  for (std::int64_t j = 0; j < k; ++j) kn::store_line_gradient(cols, j, w.weight, w.enabled, up_cols[j], out.cols.data());
  return out;
}

std::vector<float> kernel_gradient(const Stored& s, int evidence, double inv_tau, ec::TermFlags flags, const Lines& lines) {
  std::vector<float> grad(s.m * s.n, std::numeric_limits<float>::quiet_NaN());
  ec::BackwardArgs a{};
  a.s = s.view(0, s.m);
  a.evidence = evidence;
  a.inv_tau = inv_tau;
  a.target_offset = 0;
  a.terms = flags;
  a.row_constants = lines.rows.data();
  a.n_rows = s.m;
  a.col_constants = lines.cols.data();
  a.n_cols = s.n;
  a.grad = grad.data();
  a.grad_kind = ec::ScalarKind::kFloat32;
  a.grad_ld = s.n;
  expect(ec::launch_gradient(a, nullptr) == cudaSuccess, "gradient launch");
  return grad;
}

// Which way the float32 path takes an element (counted, so that the test shows it reached each).
enum Route { kFloatRoute, kTargetRoute, kTargetBeyondRoute, kEdgeRoute, kBeyondRoute, kNonFiniteRoute, kRoutes };

// The edge: the float32 map's α infinite, the refined double one still below FLT_MAX (x just past
// 88.72 with its low part negative), taken beyond FLT_MAX all the same (functions of ln α).
Route route_of(const PathEvidence& e, bool target) {
  if (e.beyond && !target && e.alpha <= kFloatMax) return kEdgeRoute;
  if (e.beyond) return target ? kTargetBeyondRoute : kBeyondRoute;
  return target ? kTargetRoute : kFloatRoute;
}

void test_float32_accuracy(std::mt19937_64& rng) {
  const ec::ScalarKind f32 = ec::ScalarKind::kFloat32;
  const HardCase cases[] = {
      {"exp, τ = 0.05, positives at cosine 0.99", 0, 0.05, 0.99, 0.0, 0.5, false, f32, true, 0.0},
      {"exp, τ = 0.01: positives, hard negatives and x around 88.72", 0, 0.01, 0.99, 0.0, 0.5, true, f32, true, 0.0},
      {"exp, τ = 0.002: α up to 1e215, α² beyond double", 0, 0.002, 0.99, 0.0, 0.3, false, f32, false, 0.0},
      {"exp, τ = 0.05, similarities near −0.6: α ≈ 1 + 6e-6", 0, 0.05, -0.55, -0.6, 0.05, false, f32, false, 0.0},
      {"exp, τ = 0.05, similarities near −0.35: α ≈ 1 + 1e-3", 0, 0.05, -0.3, -0.35, 0.05, false, f32, true, 0.0},
      {"relu, τ = 1, similarities below 0: α = 1 exactly", 1, 1.0, -0.9, -0.95, 0.05, false, f32, false, 0.0},
      {"relu, τ = 0.001: α up to 1000", 1, 0.001, 0.99, 0.0, 0.5, false, f32, false, 0.0},
      {"softplus, τ = 0.05, positives at cosine 0.99", 2, 0.05, 0.99, 0.0, 0.5, false, f32, false, 0.0},
      {"softplus, τ = 0.01", 2, 0.01, 0.99, 0.0, 0.5, true, f32, false, 0.0},
      {"exp_tanh, τ = 0.1 (UML)", 3, 0.1, 0.99, 0.0, 0.5, false, f32, false, 0.0},
      {"exp_tanh, τ = 0.01", 3, 0.01, 0.99, 0.0, 0.5, false, f32, false, 0.0},
      {"exp, τ = 0.05, bfloat16 similarities", 0, 0.05, 0.99, 0.0, 0.5, false, ec::ScalarKind::kBFloat16, false, 0.0},
      {"softplus, τ = 0.05, float16 similarities", 2, 0.05, 0.99, 0.0, 0.5, false, ec::ScalarKind::kFloat16, false, 0.0},
      {"exp, τ = 0.05, a row's upstream 1e38 (line constants beyond FLT_MAX)", 0, 0.05, 0.99, 0.0, 0.5, false, f32,
       false, 1e38},
  };
  const std::int64_t k = 160;  // past 128: rare elements in every column a float32 thread takes
  Worst stats_a, grad_a, grad_a_normal, alpha_b, rho_b, grad_c;
  Worst terms_c[kn::kNumTerms];
  double grad_c_error = 0.0, terms_c_error[kn::kNumTerms] = {0, 0, 0, 0, 0};
  static const char* kStatNames[7] = {"α_target", "rest", "kl_h", "squares", "fisher", "log_trigamma", "remainder"};
  static const char* kTermNames[kn::kNumTerms] = {"risk", "kl", "mse", "fmse", "logdet"};
  static const double kTermTol[kn::kNumTerms] = {1e-5, 1e-5, 1e-5, 1e-4, 1e-4};
  int runs = 0;
  long routes[kRoutes] = {0, 0, 0, 0, 0, 0};
  for (const HardCase& c : cases) {
    const Stored s = hard_similarity(c, k, rng);
    const double inv_tau = 1.0 / c.tau;
    // (b), every element (the α of a target is the double map's: not checked there).
    for (std::int64_t i = 0; i < k; ++i) {
      for (std::int64_t j = 0; j < k; ++j) {
        const double v = s.values[i * k + j];
        const PathEvidence e = float32_path(c.evidence, v, inv_tau, false);
        if (!(e.alpha_f < std::numeric_limits<float>::infinity()) || i == j) continue;
        const kn::EvidenceValue d = kn::evidence_value_of_kind(c.evidence, v * inv_tau);
        const MapBounds b = map_bounds(c.evidence, v * inv_tau, d);
        const std::string at = std::string(c.name) + " s = " + std::to_string(v);
        alpha_b.see(std::fabs(e.alpha_f - d.alpha) / b.alpha, at);
        rho_b.see(std::fabs(e.rho_f - d.rho) / b.rho, at);
      }
    }
    for (const ec::TermFlags& flags : kAllFlags) {
      const bool extreme = !(flags.kl || flags.fmse || flags.logdet) || (flags.kl && flags.fmse && flags.logdet);
      if (!c.every_flags && !extreme) continue;
      ++runs;
      const std::string what = std::string(c.name) + ", flags " + std::to_string(flags.kl) +
                               std::to_string(flags.fmse) + std::to_string(flags.logdet);
      std::int64_t strips = 0;
      const Stats got = kernel_stats(s, c.evidence, inv_tau, true, 0, flags, true, true, 40000, &strips);
      const Accuracy path = reference_at_path_alpha(s, c.evidence, inv_tau, flags);
      const Stats exact = reference_stats(s, c.evidence, inv_tau, true, 0, flags, true, true, Elements::kFloat64);
      // (a), forward: α of every target exactly the double map's, every statistic within its bound.
      for (int dir = 0; dir < 2; ++dir) {
        const std::vector<double>& g = dir == 0 ? got.rows : got.cols;
        const std::vector<double>& w = dir == 0 ? path.want.rows : path.want.cols;
        const std::vector<double>& t = dir == 0 ? path.tol.rows : path.tol.cols;
        for (std::int64_t i = 0; i < k; ++i) {
          expect(g[i] == w[i], what + ": α of target " + std::to_string(i) + " is the double map's");
          for (int st = 1; st < 7; ++st) {
            const double err = std::fabs(g[st * k + i] - w[st * k + i]);
            const std::string at = what + (dir == 0 ? ", row " : ", column ") + std::to_string(i) + " " + kStatNames[st];
            if (!(err <= t[st * k + i])) {
              expect(false, at + ": |" + std::to_string(g[st * k + i]) + " − " + std::to_string(w[st * k + i]) +
                                "| > " + std::to_string(t[st * k + i]));
            }
            stats_a.see(t[st * k + i] > 0 ? err / t[st * k + i] : (err > 0 ? 1e300 : 0.0), at);
          }
        }
      }
      // (c), forward: the line terms against the float64 reference's.
      const bool enabled[kn::kNumTerms] = {true, flags.kl, true, flags.fmse, flags.logdet};
      for (int dir = 0; dir < 2; ++dir) {
        for (std::int64_t i = 0; i < k; ++i) {
          kn::LineInput in_got{}, in_want{};
          for (int st = 0; st < 7; ++st) {
            in_got.stats[st] = (dir == 0 ? got.rows : got.cols)[st * k + i];
            in_want.stats[st] = (dir == 0 ? exact.rows : exact.cols)[st * k + i];
          }
          in_got.target_scale = in_want.target_scale = 1.0;
          in_got.n = in_want.n = static_cast<double>(k);
          const kn::LineTerms tg = kn::line_terms(in_got, enabled), tw = kn::line_terms(in_want, enabled);
          for (int term = 0; term < kn::kNumTerms; ++term) {
            if (!enabled[term]) continue;
            const double e = term_error(term, tg.value[term], tw.value[term]);
            terms_c_error[term] = std::max(terms_c_error[term], e);
            terms_c[term].see(e / kTermTol[term], what + (dir == 0 ? ", row " : ", column ") + std::to_string(i));
            expect(e <= kTermTol[term], what + ": " + kTermNames[term] + " of line " + std::to_string(i) +
                                            " off by " + std::to_string(e) + " (SPEC §5)");
          }
        }
      }
      // Backward: the constants from the kernels' statistics (a) and from the reference's (c).
      std::vector<double> up_rows(k), up_cols(k);
      std::uniform_real_distribution<double> u(0.5, 1.5);
      for (double& x : up_rows) x = u(rng);
      for (double& x : up_cols) x = u(rng);
      if (c.huge_upstream > 0) up_rows[0] = c.huge_upstream;
      const Lines lines = constants_for(got, k, flags, up_rows, up_cols);
      const Lines lines_exact = constants_for(exact, k, flags, up_rows, up_cols);
      const std::vector<float> grad = kernel_gradient(s, c.evidence, inv_tau, flags, lines);
      double largest = 0.0, largest_error = 0.0;
      for (std::int64_t i = 0; i < k; ++i) {
        for (std::int64_t j = 0; j < k; ++j) {
          const bool on = i == j;
          const double v = s.values[i * k + j];
          const PathEvidence e = float32_path(c.evidence, v, inv_tau, on);
          const kn::LineGradient row = line_of(lines.rows, k, i), col = line_of(lines.cols, k, j);
          const double want = gradient_f64(flags, e.at(), e.rho_at(), on, row, col, inv_tau, e.functions_at());
          bool in_double = false;
          gradient_f32(flags, e, on, row, col, inv_tau, &in_double);
          ++routes[in_double && !e.beyond ? kNonFiniteRoute : route_of(e, on)];
          const double got_g = grad[i * k + j];
          const std::string at = what + ", ∂L/∂s(" + std::to_string(i) + ", " + std::to_string(j) + ")";
          const float want_f = static_cast<float>(want);
          // Beyond FLT_MAX (and where the float coefficient is not finite) the kernels' double
          // shares carry the float element factors' ulps only: within the same bound, plus the
          // rounding of the double value to float.
          const kn::ElementBackward f = backward_any(flags, e.functions_at());
          const double magnitude = share_magnitude(e.at(), on ? 1.0 : 0.0, f, row) +
                                   share_magnitude(e.at(), on ? 1.0 : 0.0, f, col);
          const double tol =
              ((kGradientUlps * kU + 1e-13) * magnitude + share_floor(e.at(), row) + share_floor(e.at(), col)) *
                  e.rho_at() * inv_tau +
              0x1p-150 * (inv_tau + 1.0);
          const bool ok = std::isinf(want_f) ? got_g == want_f
                                             : std::fabs(got_g - want) <= tol + std::fabs(want_f - want);
          if (!ok) expect(false, at + ": got " + std::to_string(got_g) + " want " + std::to_string(want) + " ± " + std::to_string(tol));
          if (!std::isinf(want_f)) {
            const double r = tol > 0 ? std::fabs(got_g - want) / (tol + std::fabs(want_f - want)) : (ok ? 0.0 : 1e300);
            grad_a.see(r, at);
            if (std::fabs(want) >= 0x1p-100) grad_a_normal.see(r, at);
          }
          if (c.huge_upstream == 0) {
            const kn::EvidenceValue d = kn::evidence_value_of_kind(c.evidence, v * inv_tau);
            const double ref = gradient_f64(flags, d.alpha, d.rho, on, line_of(lines_exact.rows, k, i),
                                            line_of(lines_exact.cols, k, j), inv_tau);
            largest = std::max(largest, std::fabs(ref));
            largest_error = std::max(largest_error, std::fabs(got_g - ref));
          }
        }
      }
      if (c.huge_upstream == 0) {
        // Relative to the largest |∂L/∂s|, which the float32 output must resolve: a matrix whose
        // gradient is all below float's least subnormal (confident lines at τ = 0.002: ~1e-147) is
        // held to that, 2^-149, instead.
        const double e = largest_error / std::max(largest, 1e4 * 0x1p-149);
        grad_c_error = std::max(grad_c_error, e);
        grad_c.see(e / 1e-4, what);
        expect(e <= 1e-4, what + ": ∂L/∂s off by " + std::to_string(e) + " of its largest magnitude (SPEC §5)");
      }
    }
  }
  expect(runs > 0, "hard-regime runs");
  std::printf("float32 path against float64, hard regime (%d runs, K = %ld), worst error / tolerance:\n", runs,
              static_cast<long>(k));
  std::printf("  (a) statistics vs float64 at the path's α:   %.3g  (%s)\n", stats_a.ratio, stats_a.where.c_str());
  std::printf("  (a) ∂L/∂s vs float64 at the path's α and ρ:   %.3g  (%s)\n", grad_a.ratio, grad_a.where.c_str());
  std::printf("      the same where |∂L/∂s| >= 2^-100:         %.3g  (%s)\n", grad_a_normal.ratio,
              grad_a_normal.where.c_str());
  std::printf("  (b) float32 map's α vs the double map's:      %.3g  (%s)\n", alpha_b.ratio, alpha_b.where.c_str());
  std::printf("  (b) float32 map's ρ vs the double map's:      %.3g  (%s)\n", rho_b.ratio, rho_b.where.c_str());
  for (int term = 0; term < kn::kNumTerms; ++term) {
    std::printf("  (c) %-6s vs float64 reference: %.2e (tolerance %.0e; %s)\n", kTermNames[term], terms_c_error[term],
                kTermTol[term], terms_c[term].where.c_str());
  }
  std::printf("  (c) ∂L/∂s   vs float64 reference: %.2e of its largest magnitude (tolerance 1e-04; %s)\n", grad_c_error,
              grad_c.where.c_str());
  std::printf("  elements of the backward by route: float32 %ld, target %ld, target beyond FLT_MAX %ld, float32 α\n"
              "  infinite but the refined α below FLT_MAX %ld, beyond FLT_MAX %ld, float coefficient not finite %ld\n",
              routes[kFloatRoute], routes[kTargetRoute], routes[kTargetBeyondRoute], routes[kEdgeRoute],
              routes[kBeyondRoute], routes[kNonFiniteRoute]);
  for (int r = 0; r < kRoutes; ++r) expect(routes[r] > 0, "the hard regime reaches route " + std::to_string(r));
  expect(alpha_b.ratio <= 1.0, "float32 evidence maps' α within the derived bound: worst at " + alpha_b.where);
  expect(rho_b.ratio <= 1.0, "float32 evidence maps' ρ within the derived bound: worst at " + rho_b.where);
}

}  // namespace

int main() {
  std::mt19937_64 rng(20261122);
  test_forward(rng);
  test_line_kernels(rng);
  test_gradient(rng);
  test_gradient_transposed(rng);
  test_scale_to_half(rng);
  test_float32_accuracy(rng);
  std::printf("cuda kernels (CPU emulation): %ld checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
