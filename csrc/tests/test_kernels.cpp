// Unit tests of the torch-free kernel math (csrc/kernels/) against float64 values tabulated with
// mpmath (reference_table.h, written by make_reference_table.py), plus the properties the tile
// kernels rely on. Built once per instruction-set variant by CMakeLists.txt, with EO_ISA naming
// the kernels' namespace exactly as in csrc/cpu/tile_kernels_*.cpp, because the vectorised
// variants may round differently (FMA contraction, vector blends).
//
// Every function is evaluated twice: one element at a time through a noinline call (scalar code)
// and inside an `omp simd` loop like the tile kernels (vector code); both must pass.
//
// Exit status: 0 if every check passed, 1 otherwise. Each failure prints the function, its
// arguments, the value computed, the value expected and the tolerance; a summary lists, per
// function, the checks, failures and the worst error as a fraction of its tolerance.
// Options: --all (print every failure, not the first 12 per function), --quiet (no summary).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "kernels/element_terms.h"
#include "kernels/evidence.h"
#include "reference_table.h"

#ifndef EO_ISA
#error "EO_ISA must name the variant (generic, avx2, avx512), as in csrc/cpu/tile_kernels_*.cpp"
#endif
#define EO_TEST_STR_(x) #x
#define EO_TEST_STR(x) EO_TEST_STR_(x)
#define EO_TEST_NOINLINE __attribute__((noinline))

namespace kn = evidential_ops::EO_ISA;
namespace ref = eo_reference;

namespace {

constexpr double kEps = 0x1p-52;  // spacing of doubles at 1: one ulp relative, at most
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kDblMin = std::numeric_limits<double>::min();
constexpr double kDblMax = std::numeric_limits<double>::max();

// ---------------------------------------------------------------------------------------------
// Tolerances. |got − expected| <= rel·|expected| + abs. The table holds the double nearest the
// exact value, so `rel` is the error budget of the kernel alone.
struct Tol {
  double rel;
  double abs;
};

// A result in the subnormal range has an absolute spacing of denorm_min: no relative accuracy is
// possible there, so every comparison allows two of those (values below DBL_MIN only).
constexpr double kSubnormalFloor = 2 * std::numeric_limits<double>::denorm_min();

// exp_d/log_d/log1p_d: the header promises < 1 ulp. Tested as <= 1 ulp of the expected value
// (the table's own rounding is half an ulp of that, so a faithful result always passes and a
// result 2 ulps off never does).
constexpr double kElementaryUlps = 1.0;

// ψ, ψ1, ψ2, lnΓ: special_functions.h promises "~1e-14 relative or better". Tested as 2e-14
// (kSpecialRel): "~" needs a number, and the AVX2/AVX-512 builds contract different products
// into FMAs, which moves a result formed through cancelling intermediates (ψ2 below 8 goes
// through ½(d3 − 3d1d2 + 2d1³), ~50 times its value) by a few ulps of those intermediates.
// Absolute floors only where the header forms a value as a difference of larger parts, and
// there kSpecialRel of the parts' size:
//   ψ(x) for x < 8 is ψ(x + 8) − Σ 1/(x+k), both ≈ 2.25 near the root x0 = 1.4616 where ψ = 0.
//   lnΓ(x) for x < 8 is lnΓ(x + 8) − ln P(x), both ≈ ln 8! = 10.6 at x = 1 and 2 where lnΓ = 0.
constexpr double kSpecialRel = 2e-14;
constexpr Tol kSpecialTol = {kSpecialRel, 0.0};
constexpr Tol kDigammaTol = {kSpecialRel, kSpecialRel * 2.3};
constexpr Tol kLgammaTol = {kSpecialRel, kSpecialRel * 10.6};

// h(x) = (x−1)ψ(x) − lnΓ(x) − x, direct form below 8: parts of size <= 7·ψ(8) + lnΓ(8) + 8 ≈ 31
// against |h| >= 1. Above 8 the series has no cancellation (the floor is then below
// kSpecialRel·|h|, as |h| >= 2.4 there).
constexpr Tol kKlHTol = {kSpecialRel, kSpecialRel * 31.0};

// v(x) = 1 − (x−1)ψ1(x) below 16 subtracts (x−1)ψ1(x) ≈ 1 − 1/(2x) from 1: ψ1's relative error
// becomes an absolute one (up to 2x = 32 times v's own size, the reason the header switches to
// the series at 16). Above 16: series, no floor.
Tol kl_v_tol(double x) { return {kSpecialRel, x < 16.0 ? kSpecialRel : 0.0}; }

// r(x) = 1/ψ1(x) − x + ½ below 30 subtracts numbers of size x (r ≈ 1/(12x)): ψ1's relative error
// times x, absolute. r' = −ψ2/ψ1² − 1 likewise subtracts numbers of size 1 (r' ≈ −1/(12x²)).
// Above 30: series, no floor.
Tol remainder_tol(double x) { return {kSpecialRel, x < 30.0 ? kSpecialRel * x : 0.0}; }
Tol remainder_prime_tol(double x) { return {kSpecialRel, x < 30.0 ? kSpecialRel : 0.0}; }

// ψ(a + r) − ψ(a), ψ1(a + r) − ψ1(a) for a >= 1, r >= 0: the header promises them "without
// cancellation", i.e. the special functions' relative accuracy, with no floor.
constexpr Tol kDifferenceTol = {kSpecialRel, 0.0};

// Evidence: α = g + 1 and ρ = g'/α each come from a few correctly rounded operations on exp_d's
// < 1 ulp result (softplus and exp_tanh add a log1p_d or a second exp_d): 8 ulps relative.
// ρ multiplies each element's gradient (∂L/∂s = α∂L/∂α · ρ/τ) and SPEC §5 judges gradients
// element by element, so ρ is held to the same relative accuracy, with an absolute floor only
// below DBL_MIN (where exp_d returns 0 by design: "0 below -708").
constexpr Tol kEvidenceTol = {8 * kEps, 0.0};
constexpr Tol kRhoTol = {8 * kEps, kDblMin};

// Element factors of element_terms.h: products and quotients of the special functions
// (kSpecialRel). Where they are the cancelling forms above, the same floors scaled alike (α·v:
// α times v's floor). Three more:
//   ln ψ1(α) crosses zero near α = 1.43 (ψ1 = 1): ψ1's relative error is its absolute error.
//   f'(α) = (2α+1)ψ1(α) + α(α+1)ψ2(α) ≈ 1 adds parts ≈ 2 and ≈ −1: 3·kSpecialRel absolute.
//   α·r'(α) is only used as logdet_remainder·α·r' in line_share, next to logdet_ratio·αψ2/ψ1
//   ≈ −w with |logdet_remainder| = w/M <= 4w: an absolute kSpecialRel (times x below 30, as r')
//   is that relative to the element's logdet coefficient.
constexpr Tol kElementTol = {kSpecialRel, 0.0};
constexpr Tol kLogTrigammaTol = {kSpecialRel, kSpecialRel};
constexpr Tol kFisherSlopeTol = {kSpecialRel, 3 * kSpecialRel};
Tol logdet_r_prime_tol(double x) { return {kSpecialRel, x < 30.0 ? kSpecialRel * x : kSpecialRel}; }

// Line terms and gradient coefficients: sums of the parts above. Their error is bounded by the
// parts' relative error times the parts' magnitudes (`scale` below, computed from the kernel's own
// intermediate values), which stays small because the stable forms of line_terms.h never hold
// the huge S·ln S parts of the textbook formulas. Relative 1e-13 (a handful of parts at 2e-14) and an
// absolute floor of 1e-13·scale. SPEC §5 asks float64 backends for much less (floors 1e-12
// absolute, relative to max(|ref|, 1e-3) for kl and logdet).
constexpr double kLineRel = 1e-13;

// Gradient coefficients additionally get an absolute floor of 1e-15 per unit of upstream·Σ weight:
// line_gradient forms its constants from O(1) ratios (p, q, c, S/(S+1)), each rounded at ~1e-16,
// so a coefficient that is a small difference of them (mse or fmse of a confident row, ~1/S) has
// an absolute error of that size however small it is. 1e-15 is a thousand times below the float64
// floor SPEC §5 applies to near-zero terms (1e-12).
constexpr double kGradientFloor = 1e-15;

// ---------------------------------------------------------------------------------------------
std::string fmt(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

double ulp_of(double v) {
  v = std::fabs(v);
  if (!(v >= kDblMin)) return std::numeric_limits<double>::denorm_min();
  if (v == kInf) return kInf;
  return std::ldexp(1.0, std::ilogb(v) - 52);
}

// A non-owning reference to a callable returning the text of a check (its arguments, or why it
// failed): built only when needed, and it keeps Report's methods non-templates, so the hundreds
// of lambdas below do not each instantiate a copy of them.
class Text {
 public:
  template <typename F>
  Text(const F& f) : object_(&f), call_([](const void* o) { return std::string((*static_cast<const F*>(o))()); }) {}
  std::string operator()() const { return call_(object_); }

 private:
  const void* object_;
  std::string (*call_)(const void*);
};

// Tallies checks per function and prints failures. A function's counters are fetched once by
// name (`counter`) and then updated without string work, and the text describing a check is
// only built when it fails or is the worst seen so far: the property checks run millions of
// times per variant.
class Report {
 public:
  struct Counter {
    std::string fn;
    bool property = false;  // a yes/no property: no error ratio to report
    long checks = 0, failures = 0;
    double worst = -1.0;  // largest |err|/tol so far
    std::string worst_args;
    double worst_got = 0.0, worst_expected = 0.0;
  };

  long printed_per_function = 12;  // failures printed per function (the rest are counted); < 0: all

  Counter& counter(const std::string& fn) {
    for (Counter& c : counters_) {
      if (c.fn == fn) return c;
    }
    counters_.emplace_back();
    counters_.back().fn = fn;
    return counters_.back();
  }

  // |got − expected| <= tol.rel·|expected| + tol.abs (+ kSubnormalFloor); an infinite expected
  // value must be matched exactly. `args()` describes the arguments.
  EO_TEST_NOINLINE void near(Counter& c, Text args, double got, double expected, Tol tol) {
    const double err = std::fabs(got - expected);
    const double bound = tol.rel * std::fabs(expected) + tol.abs + kSubnormalFloor;
    bool ok;
    double ratio;
    if (std::isinf(expected)) {
      ok = got == expected;
      ratio = ok ? 0.0 : kInf;
    } else {
      ok = std::isfinite(got) && err <= bound;
      ratio = std::isfinite(got) ? err / bound : kInf;
    }
    ++c.checks;
    if (ratio > c.worst) {
      c.worst = ratio;
      c.worst_args = args();
      c.worst_got = got;
      c.worst_expected = expected;
    }
    if (!ok) {
      fail(c, [&] {
        return args() + "  got " + fmt(got) + "  expected " + fmt(expected) + "  |err| " + fmt(err) + " > tol " +
               fmt(bound) + rel_error(got, expected);
      });
    }
  }

  void near(const std::string& fn, Text args, double got, double expected, Tol tol) {
    near(counter(fn), args, got, expected, tol);
  }

  // Within n ulps of the expected value.
  void ulps(Counter& c, Text args, double got, double expected, double n) {
    near(c, args, got, expected, {0.0, n * ulp_of(expected)});
  }

  // A property: `what()` describes the case and how it failed; only called when !ok.
  void truth(Counter& c, bool ok, Text what) {
    c.property = true;
    ++c.checks;
    if (!ok) fail(c, what);
  }

  void truth(const std::string& fn, bool ok, Text what) { truth(counter(fn), ok, what); }

  long checks() const {
    long n = 0;
    for (const Counter& c : counters_) n += c.checks;
    return n;
  }
  long failures() const {
    long n = 0;
    for (const Counter& c : counters_) n += c.failures;
    return n;
  }

  // One line per function: checks, failures, and the worst |err|/tol seen (1 = at the tolerance).
  void summary() const {
    std::printf("\n%-36s %8s %6s %9s  %s\n", "function", "checks", "fails", "worst/tol", "worst case");
    for (const Counter& c : counters_) {
      if (c.property) {
        std::printf("%-36s %8ld %6ld %9s  (property)\n", c.fn.c_str(), c.checks, c.failures, "-");
      } else {
        std::printf("%-36s %8ld %6ld %9.3g  %s: got %s expected %s\n", c.fn.c_str(), c.checks, c.failures, c.worst,
                    c.worst_args.c_str(), fmt(c.worst_got).c_str(), fmt(c.worst_expected).c_str());
      }
    }
  }

 private:
  static std::string rel_error(double got, double expected) {
    if (expected == 0.0 || !std::isfinite(expected)) return "";
    return "  (rel " + fmt(std::fabs(got - expected) / std::fabs(expected)) + ")";
  }

  EO_TEST_NOINLINE void fail(Counter& c, Text message) {
    ++c.failures;
    if (printed_per_function < 0 || c.failures <= printed_per_function) {
      std::printf("FAIL %s: %s\n", c.fn.c_str(), message().c_str());
    } else if (c.failures == printed_per_function + 1) {
      std::printf("FAIL %s: ... further failures counted, not printed\n", c.fn.c_str());
    }
  }

  std::deque<Counter> counters_;  // deque: counters stay put while new ones are added
};

// ---------------------------------------------------------------------------------------------
// Each kernel function is compiled into this test exactly twice: one out-of-line scalar copy
// (noinline, so it is scalar code) and one `omp simd` loop over an array like the tile kernels'
// (vector code). Every check goes through these two, which also keeps the always_inline special
// functions from being expanded at every call site (that doubled the build time).

struct UnaryFn {
  double (*scalar)(double);
  void (*simd)(const double* x, double* y, std::int64_t n);
};

#define EO_TEST_UNARY(name, expr)                                                 \
  EO_TEST_NOINLINE double name(double x) { return expr; }                         \
  EO_TEST_NOINLINE void name##_simd(const double* xs, double* ys, std::int64_t n) { \
    _Pragma("omp simd") for (std::int64_t i = 0; i < n; ++i) {                     \
      const double x = xs[i];                                                      \
      ys[i] = expr;                                                                \
    }                                                                              \
  }                                                                                \
  constexpr UnaryFn name##_fn = {&name, &name##_simd};

EO_TEST_UNARY(t_exp, kn::exp_d(x))
EO_TEST_UNARY(t_log, kn::log_d(x))
EO_TEST_UNARY(t_log1p, kn::log1p_d(x))
EO_TEST_UNARY(t_digamma, kn::digamma(x))
EO_TEST_UNARY(t_trigamma, kn::trigamma(x))
EO_TEST_UNARY(t_tetragamma, kn::tetragamma(x))
EO_TEST_UNARY(t_lgamma, kn::lgamma_ge1(x))
EO_TEST_UNARY(t_kl_h, kn::kl_h(x))
EO_TEST_UNARY(t_kl_v, kn::kl_v(x))
EO_TEST_UNARY(t_r, kn::fisher_remainder(x, kn::polygammas(x)).r)
EO_TEST_UNARY(t_r_prime, kn::fisher_remainder(x, kn::polygammas(x)).r_prime)

// Everything element_terms.h computes per element.
struct ElementAll {
  kn::ElementForward f;
  kn::ElementBackward b;
};

EO_TEST_NOINLINE ElementAll t_element(double x) {
  return {kn::element_forward<true, true, true>(x), kn::element_backward<true, true, true>(x)};
}

EO_TEST_NOINLINE void t_element_simd(const double* xs, ElementAll* out, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    out[i].f = kn::element_forward<true, true, true>(xs[i]);
    out[i].b = kn::element_backward<true, true, true>(xs[i]);
  }
}

template <kn::EvidenceKind kKind>
EO_TEST_NOINLINE kn::EvidenceValue t_evidence(double x) {
  return kn::evidence_value<kKind>(x);
}

template <kn::EvidenceKind kKind>
EO_TEST_NOINLINE void t_evidence_simd(const double* xs, kn::EvidenceValue* out, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) out[i] = kn::evidence_value<kKind>(xs[i]);
}

EO_TEST_NOINLINE double t_digamma_difference(double a, double r) { return kn::digamma_difference(a, r); }
EO_TEST_NOINLINE double t_trigamma_difference(double a, double r) { return kn::trigamma_difference(a, r); }

EO_TEST_NOINLINE void t_digamma_difference_simd(const double* a, const double* r, double* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = kn::digamma_difference(a[i], r[i]);
}

EO_TEST_NOINLINE void t_trigamma_difference_simd(const double* a, const double* r, double* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = kn::trigamma_difference(a[i], r[i]);
}

EO_TEST_NOINLINE kn::LineTerms t_line_terms(const kn::LineInput& in, const bool enabled[kn::kNumTerms]) {
  return kn::line_terms(in, enabled);
}

EO_TEST_NOINLINE kn::LineGradient t_line_gradient(const kn::LineInput& in, const double weight[kn::kNumTerms],
                                                  double upstream) {
  return kn::line_gradient(in, weight, upstream);
}

std::vector<double> apply(const UnaryFn& f, const std::vector<double>& xs) {
  std::vector<double> ys(xs.size());
  f.simd(xs.data(), ys.data(), static_cast<std::int64_t>(xs.size()));
  return ys;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// {x, value} pairs of a table; `value` picks the column for tables with several.
template <typename Row, size_t N, typename Get>
std::vector<ref::Unary> column(const Row (&table)[N], const Get& value) {
  std::vector<ref::Unary> out(N);
  for (size_t i = 0; i < N; ++i) out[i] = {table[i].x, value(table[i])};
  return out;
}

template <size_t N>
std::vector<ref::Unary> column(const ref::Unary (&table)[N]) {
  return column(table, [](const ref::Unary& e) { return e.value; });
}

// Checks f against {x, value} rows: the scalar result always, the vector result too when it
// differs in any bit from the scalar one (identical results need no second report line).
template <typename TolFn>
void check_unary(Report& rep, const char* fn, const std::vector<ref::Unary>& table, const UnaryFn& f,
                 const TolFn& tol_of) {
  Report::Counter& c = rep.counter(fn);
  std::vector<double> xs(table.size());
  for (size_t i = 0; i < table.size(); ++i) xs[i] = table[i].x;
  const std::vector<double> vec = apply(f, xs);
  for (size_t i = 0; i < table.size(); ++i) {
    const double x = xs[i], expected = table[i].value;
    const double scalar = f.scalar(x);
    const Tol tol = tol_of(x, expected);
    rep.near(c, [&] { return "x=" + fmt(x); }, scalar, expected, tol);
    if (!same_bits(scalar, vec[i])) rep.near(c, [&] { return "x=" + fmt(x) + " [simd]"; }, vec[i], expected, tol);
  }
}

void check_unary_ulps(Report& rep, const char* fn, const std::vector<ref::Unary>& table, const UnaryFn& f) {
  check_unary(rep, fn, table, f, [](double, double expected) { return Tol{0.0, kElementaryUlps * ulp_of(expected)}; });
}

// ---------------------------------------------------------------------------------------------
// Tabulated values.

void test_elementary(Report& rep) {
  check_unary_ulps(rep, "exp_d", column(ref::kExp), t_exp_fn);
  check_unary_ulps(rep, "log_d", column(ref::kLog), t_log_fn);
  check_unary_ulps(rep, "log1p_d", column(ref::kLog1p), t_log1p_fn);
}

void test_special(Report& rep) {
  const auto fixed = [](Tol t) { return [t](double, double) { return t; }; };
  check_unary(rep, "digamma", column(ref::kDigamma), t_digamma_fn, fixed(kDigammaTol));
  check_unary(rep, "trigamma", column(ref::kTrigamma), t_trigamma_fn, fixed(kSpecialTol));
  check_unary(rep, "tetragamma", column(ref::kTetragamma), t_tetragamma_fn, fixed(kSpecialTol));
  check_unary(rep, "lgamma_ge1", column(ref::kLgamma), t_lgamma_fn, fixed(kLgammaTol));
  check_unary(rep, "kl_h", column(ref::kKlH), t_kl_h_fn, fixed(kKlHTol));
  check_unary(rep, "kl_v", column(ref::kKlV), t_kl_v_fn, [](double x, double) { return kl_v_tol(x); });
  check_unary(rep, "fisher_remainder.r", column(ref::kFisherRemainder, [](const ref::Remainder& e) { return e.r; }),
              t_r_fn, [](double x, double) { return remainder_tol(x); });
  check_unary(rep, "fisher_remainder.r_prime",
              column(ref::kFisherRemainder, [](const ref::Remainder& e) { return e.r_prime; }), t_r_prime_fn,
              [](double x, double) { return remainder_prime_tol(x); });

  // polygammas' series argument: kl_v and fisher_remainder read inv_z as 1/x on their series
  // branches (x >= 16, x >= 30), so from kShiftFrom (<= 16) up it must be 1/x, and log_z ln x.
  rep.truth("polygammas.kShiftFrom <= 16", kn::kShiftFrom <= 16.0, [] {
    return std::string("kl_v's series (x >= 16) reads inv_z as 1/x, true only from kShiftFrom up");
  });
  Report::Counter& log_z = rep.counter("polygammas.log_z");
  Report::Counter& inv_z = rep.counter("polygammas.inv_z");
  for (const ref::Unary& e : ref::kLog) {
    if (e.x < kn::kShiftFrom) continue;
    const kn::Polygammas g = kn::polygammas(e.x);
    const auto args = [&] { return "x=" + fmt(e.x); };
    rep.ulps(log_z, args, g.log_z, e.value, kElementaryUlps);
    rep.ulps(inv_z, args, g.inv_z, 1.0 / e.x, 0.0);
  }

  // shift_sums: the recurrence's sums, from one Taylor-mode product (x in [1, 8]). h2 and h3 are
  // formed from the log-derivatives d_k = P^(k)/P as d1² − d2 and ½(d3 − 3d1d2 + 2d1³), which
  // cancel: their absolute error is kSpecialRel of the parts' magnitudes (recovered from the
  // expected sums: d1 = h1, d2 = h1² − h2, d3 = 2h3 + 3d1d2 − 2d1³).
  for (const ref::Shift& e : ref::kShiftSums) {
    const kn::ShiftSums s = kn::shift_sums(e.x);
    const auto args = [&] { return "x=" + fmt(e.x); };
    const double d1 = e.h1, d2 = e.h1 * e.h1 - e.h2, d3 = 2.0 * e.h3 + 3.0 * d1 * d2 - 2.0 * d1 * d1 * d1;
    const double h2_parts = d1 * d1 + std::fabs(d2);
    const double h3_parts = 0.5 * (std::fabs(d3) + 3.0 * std::fabs(d1 * d2) + 2.0 * std::fabs(d1 * d1 * d1));
    rep.near("shift_sums.log_p", args, s.log_p, e.log_p, kSpecialTol);
    rep.near("shift_sums.h1", args, s.h1, e.h1, kSpecialTol);
    rep.near("shift_sums.h2", args, s.h2, e.h2, {kSpecialTol.rel, kSpecialTol.rel * h2_parts});
    rep.near("shift_sums.h3", args, s.h3, e.h3, {kSpecialTol.rel, kSpecialTol.rel * h3_parts});
  }
}

template <size_t N>
void check_binary(Report& rep, const char* fn, const ref::Binary (&table)[N], double (*scalar)(double, double),
                  void (*simd)(const double*, const double*, double*, std::int64_t)) {
  Report::Counter& c = rep.counter(fn);
  std::vector<double> a(N), r(N), vec(N);
  for (size_t i = 0; i < N; ++i) a[i] = table[i].a, r[i] = table[i].r;
  simd(a.data(), r.data(), vec.data(), static_cast<std::int64_t>(N));
  for (size_t i = 0; i < N; ++i) {
    const double s = scalar(a[i], r[i]);
    const auto args = [&] { return "a=" + fmt(a[i]) + " r=" + fmt(r[i]); };
    rep.near(c, args, s, table[i].value, kDifferenceTol);
    if (!same_bits(s, vec[i])) rep.near(c, [&] { return args() + " [simd]"; }, vec[i], table[i].value, kDifferenceTol);
  }
}

void test_differences(Report& rep) {
  check_binary(rep, "digamma_difference", ref::kDigammaDifference, t_digamma_difference, t_digamma_difference_simd);
  check_binary(rep, "trigamma_difference", ref::kTrigammaDifference, t_trigamma_difference,
               t_trigamma_difference_simd);
}

template <kn::EvidenceKind kKind, size_t N>
void check_evidence(Report& rep, const std::string& name, const ref::Evidence (&table)[N]) {
  Report::Counter& alpha = rep.counter(name + ".alpha");
  Report::Counter& rho = rep.counter(name + ".rho");
  std::vector<double> xs(N);
  for (size_t i = 0; i < N; ++i) xs[i] = table[i].x;
  std::vector<kn::EvidenceValue> vec(N);
  t_evidence_simd<kKind>(xs.data(), vec.data(), static_cast<std::int64_t>(N));
  for (size_t i = 0; i < N; ++i) {
    const kn::EvidenceValue s = t_evidence<kKind>(xs[i]);
    const auto args = [&] { return "x=" + fmt(xs[i]); };
    const auto simd_args = [&] { return "x=" + fmt(xs[i]) + " [simd]"; };
    rep.near(alpha, args, s.alpha, table[i].alpha, kEvidenceTol);
    rep.near(rho, args, s.rho, table[i].rho, kRhoTol);
    if (!same_bits(s.alpha, vec[i].alpha)) rep.near(alpha, simd_args, vec[i].alpha, table[i].alpha, kEvidenceTol);
    if (!same_bits(s.rho, vec[i].rho)) rep.near(rho, simd_args, vec[i].rho, table[i].rho, kRhoTol);
  }
}

void test_evidence(Report& rep) {
  check_evidence<kn::EvidenceKind::kExp>(rep, "evidence<exp>", ref::kEvidenceExp);
  check_evidence<kn::EvidenceKind::kRelu>(rep, "evidence<relu>", ref::kEvidenceRelu);
  check_evidence<kn::EvidenceKind::kSoftplus>(rep, "evidence<softplus>", ref::kEvidenceSoftplus);
  check_evidence<kn::EvidenceKind::kExpTanh>(rep, "evidence<exp_tanh>", ref::kEvidenceExpTanh);
}

// The eight per-element factors, as (name, field of ElementAll, expected field, tolerance).
struct ElementField {
  const char* name;
  double (*got)(const ElementAll&);
  double ref::Element::*expected;
  Tol (*tol)(double x);
};

const ElementField kElementFields[] = {
    {"element_forward.kl_h", [](const ElementAll& e) { return e.f.kl_h; }, &ref::Element::kl_h,
     [](double) { return kKlHTol; }},
    {"element_forward.fisher", [](const ElementAll& e) { return e.f.fisher; }, &ref::Element::fisher,
     [](double) { return kElementTol; }},
    {"element_forward.log_trigamma", [](const ElementAll& e) { return e.f.log_trigamma; },
     &ref::Element::log_trigamma, [](double) { return kLogTrigammaTol; }},
    {"element_forward.remainder", [](const ElementAll& e) { return e.f.remainder; }, &ref::Element::remainder,
     [](double x) { return remainder_tol(x); }},
    {"element_backward.kl_v", [](const ElementAll& e) { return e.b.kl_v; }, &ref::Element::kl_v,
     [](double x) { return Tol{kElementTol.rel, kl_v_tol(x).abs * x}; }},
    {"element_backward.fisher_slope", [](const ElementAll& e) { return e.b.fisher_slope; },
     &ref::Element::fisher_slope, [](double) { return kFisherSlopeTol; }},
    {"element_backward.logdet_ratio", [](const ElementAll& e) { return e.b.logdet_ratio; },
     &ref::Element::logdet_ratio, [](double) { return kElementTol; }},
    {"element_backward.logdet_r_prime", [](const ElementAll& e) { return e.b.logdet_r_prime; },
     &ref::Element::logdet_r_prime, [](double x) { return logdet_r_prime_tol(x); }},
};

void test_elements(Report& rep) {
  constexpr size_t n = std::size(ref::kElement);
  std::vector<double> xs(n);
  for (size_t i = 0; i < n; ++i) xs[i] = ref::kElement[i].x;
  std::vector<ElementAll> vec(n);
  t_element_simd(xs.data(), vec.data(), static_cast<std::int64_t>(n));
  for (const ElementField& field : kElementFields) {
    Report::Counter& c = rep.counter(field.name);
    for (size_t i = 0; i < n; ++i) {
      const double x = xs[i], expected = ref::kElement[i].*field.expected;
      const double s = field.got(t_element(x)), v = field.got(vec[i]);
      rep.near(c, [&] { return "alpha=" + fmt(x); }, s, expected, field.tol(x));
      if (!same_bits(s, v)) rep.near(c, [&] { return "alpha=" + fmt(x) + " [simd]"; }, v, expected, field.tol(x));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Lines: line_terms / line_gradient / line_share exactly as csrc/cpu/tile_kernels.h chains them.

const char* const kTermNames[kn::kNumTerms] = {"risk", "kl", "mse", "fmse", "logdet"};
const char* const kStatNames[kn::kNumLineStats] = {"target_alpha", "rest",         "kl_h",     "squares",
                                                   "fisher",       "log_trigamma", "remainder"};

std::string line_args(const ref::Line& line) {
  std::string s = "alpha=[";
  for (int j = 0; j < line.n; ++j) s += (j ? ", " : "") + fmt(line.alpha[j]);
  return s + "] target=" + std::to_string(line.target) + " c=" + fmt(line.c);
}

kn::LineInput input_from_table(const ref::Line& line) {
  kn::LineInput in;
  for (int k = 0; k < kn::kNumLineStats; ++k) in.stats[k] = line.stats[k];
  in.target_scale = line.c;
  in.n = line.n;
  return in;
}

// Error budget of one accumulated statistic: the sum of |contributions| (its rounding scales with
// that) and the sum of the contributions' own absolute floors (kl_h, ln ψ1 and r have one).
struct StatBudget {
  double magnitude[kn::kNumLineStats];
  double floor[kn::kNumLineStats];
};

// forward_tile_impl's accumulation for one line, off-target mask included.
kn::LineInput accumulate(const ref::Line& line, StatBudget& budget) {
  kn::LineInput in = {};
  budget = {};
  for (int j = 0; j < line.n; ++j) {
    const double a = line.alpha[j];
    const double off = j == line.target ? 0.0 : 1.0;
    const kn::ElementForward f = t_element(a).f;
    const double scaled = a * kn::kSquareScale;  // the squares statistic is kept scaled by 2^-1022
    const double parts[kn::kNumLineStats] = {0.0,            off * a,        off * f.kl_h, off * scaled * scaled,
                                             off * f.fisher, f.log_trigamma, f.remainder};
    const double floors[kn::kNumLineStats] = {0.0, 0.0, off * kKlHTol.abs, 0.0, 0.0, kLogTrigammaTol.abs,
                                              remainder_tol(a).abs};
    for (int k = 1; k < kn::kNumLineStats; ++k) {
      in.stats[k] += parts[k];
      budget.magnitude[k] += std::fabs(parts[k]);
      budget.floor[k] += floors[k];
    }
  }
  in.stats[kn::kTargetAlpha] = line.alpha[line.target];
  budget.magnitude[kn::kTargetAlpha] = std::fabs(line.alpha[line.target]);
  in.target_scale = line.c;
  in.n = line.n;
  return in;
}

// Error budget of each term of line_terms(): `scale`, the magnitudes of the parts it adds up
// (see kLineRel), and `floor`, the absolute floors of the special-function parts it is built from
// (kl: the h's, ψ(S̃) and lnΓ(N); logdet: the ln ψ1's and, divided by M, the r's). All from the
// kernel's own intermediate values.
void term_budget(const kn::LineInput& in, const StatBudget& stats, double scale[kn::kNumTerms],
                 double floor[kn::kNumTerms]) {
  const double a = in.stats[kn::kTargetAlpha], rest = in.stats[kn::kRest], c = in.target_scale, n = in.n;
  const double s = a + rest;
  const double a_tilde = c + (1.0 - c) * a, s_tilde = rest + a_tilde;
  const double q = rest / s, p = a / s;
  const double m = 0.5 * (n - 1.0) + t_r(s) - in.stats[kn::kRemainder];
  scale[kn::kRisk] = std::fabs(c * t_digamma_difference(a, rest));
  scale[kn::kKl] = stats.magnitude[kn::kKlH] + std::fabs(t_kl_h(a_tilde)) + std::fabs(t_kl_h(s_tilde)) +
                   (n - 1.0) * std::fabs(t_digamma(s_tilde)) + t_lgamma(n);
  scale[kn::kMse] = (c - p) * (c - p) + kn::off_target_p_squared(in.stats[kn::kSquares], s) + (q * (1.0 + p)) / (s + 1.0);
  scale[kn::kFmse] = in.stats[kn::kFisher] / s / (s + 1.0) + ((c - p) * (c - p) + p * q / (s + 1.0)) * t_trigamma(a);
  scale[kn::kLogdet] = stats.magnitude[kn::kLogTrigamma] + std::fabs(t_log(t_trigamma(s))) + std::fabs(t_log(m));
  floor[kn::kRisk] = floor[kn::kMse] = floor[kn::kFmse] = 0.0;
  floor[kn::kKl] = stats.floor[kn::kKlH] + 2.0 * kKlHTol.abs + (n - 1.0) * kDigammaTol.abs + kLgammaTol.abs;
  floor[kn::kLogdet] = stats.floor[kn::kLogTrigamma] + kLogTrigammaTol.abs +
                       (stats.floor[kn::kRemainder] + remainder_tol(s).abs) / std::fabs(m);
}

template <bool kKl, bool kFmse, bool kLogdet>
double share(double alpha, double off, double on_target, const kn::LineGradient& line) {
  return kn::line_share(alpha, off, on_target, kn::element_backward<kKl, kFmse, kLogdet>(alpha), line);
}

// The tile kernels instantiate element_backward for the enabled terms only; so does this.
EO_TEST_NOINLINE double share_for(const double weight[kn::kNumTerms], double alpha, double off,
                                  double on_target, const kn::LineGradient& line) {
  const int code = (weight[kn::kKl] != 0.0 ? 1 : 0) | (weight[kn::kFmse] != 0.0 ? 2 : 0) |
                   (weight[kn::kLogdet] != 0.0 ? 4 : 0);
  switch (code) {
    case 0: return share<false, false, false>(alpha, off, on_target, line);
    case 1: return share<true, false, false>(alpha, off, on_target, line);
    case 2: return share<false, true, false>(alpha, off, on_target, line);
    case 3: return share<true, true, false>(alpha, off, on_target, line);
    case 4: return share<false, false, true>(alpha, off, on_target, line);
    case 5: return share<true, false, true>(alpha, off, on_target, line);
    case 6: return share<false, true, true>(alpha, off, on_target, line);
    default: return share<true, true, true>(alpha, off, on_target, line);
  }
}

// Sum of |parts| of line_share(): the scale of its rounding error.
double share_scale(double alpha, double off, double on_target, const kn::ElementBackward& f, const kn::LineGradient& l) {
  const double p = alpha * l.inv_strength;
  return std::fabs(p * l.all) + off * (std::fabs(p * l.off) + std::fabs(l.square * p * p) +
                                       std::fabs(p * l.fisher * f.fisher_slope) + std::fabs(l.kl_v * f.kl_v)) +
         std::fabs(l.logdet_ratio * f.logdet_ratio) + std::fabs(l.logdet_remainder * f.logdet_r_prime) +
         on_target * std::fabs(l.target);
}

void test_lines(Report& rep) {
  const bool all_terms[kn::kNumTerms] = {true, true, true, true, true};
  for (const ref::Line& line : ref::kLines) {
    const auto args = [&] { return line_args(line); };

    // Statistics as the forward tile loop accumulates them. rest, squares: sums of N exact or
    // once-rounded terms (N ulps); the others add up element factors (kLineRel).
    StatBudget budget;
    const kn::LineInput acc = accumulate(line, budget);
    for (int k = 0; k < kn::kNumLineStats; ++k) {
      const double rel = k == kn::kRest || k == kn::kSquares || k == kn::kTargetAlpha ? line.n * kEps : kLineRel;
      rep.near(std::string("line_stats.") + kStatNames[k], args, acc.stats[k], line.stats[k],
               {rel, rel * budget.magnitude[k] + budget.floor[k]});
    }

    // Terms from the exact statistics (line_terms alone) and from the accumulated ones (the chain).
    double scale[kn::kNumTerms], floor[kn::kNumTerms];
    term_budget(acc, budget, scale, floor);
    const kn::LineTerms from_table = t_line_terms(input_from_table(line), all_terms);
    const kn::LineTerms from_acc = t_line_terms(acc, all_terms);
    rep.truth("line_terms.finite", from_table.finite && from_acc.finite,
              [&] { return args() + "  finite flag false for a strength below DBL_MAX"; });
    for (int t = 0; t < kn::kNumTerms; ++t) {
      const std::string fn = std::string("line_terms.") + kTermNames[t];
      const Tol tol = {kLineRel, kLineRel * scale[t] + floor[t]};
      rep.near(fn, [&] { return args() + " [table stats]"; }, from_table.value[t], line.terms[t], tol);
      rep.near(fn, [&] { return args() + " [accumulated]"; }, from_acc.value[t], line.terms[t], tol);
    }

    // α_j·∂(g·L)/∂α_j: one term at a time (upstream g = 1), then all five weighted together.
    const double combo_weight[kn::kNumTerms] = {0.5, 0.25, 1.0, 2.0, 0.75};
    const double combo_upstream = 1.5;
    for (int t = 0; t <= kn::kNumTerms; ++t) {
      double weight[kn::kNumTerms] = {0.0, 0.0, 0.0, 0.0, 0.0};
      double upstream = 1.0;
      if (t < kn::kNumTerms) {
        weight[t] = 1.0;
      } else {
        for (int k = 0; k < kn::kNumTerms; ++k) weight[k] = combo_weight[k];
        upstream = combo_upstream;
      }
      Report::Counter& c = rep.counter(std::string("line_gradient.") + (t < kn::kNumTerms ? kTermNames[t] : "weighted"));
      const kn::LineGradient lg = t_line_gradient(acc, weight, upstream);
      for (int j = 0; j < line.n; ++j) {
        const double a = line.alpha[j];
        const double on_target = j == line.target ? 1.0 : 0.0, off = 1.0 - on_target;
        const double got = share_for(weight, a, off, on_target, lg);
        double expected = 0.0, expected_scale = 0.0, total_weight = 0.0;
        for (int k = 0; k < kn::kNumTerms; ++k) {
          expected += upstream * weight[k] * line.grad[k][j];
          expected_scale += std::fabs(upstream * weight[k] * line.grad[k][j]);
          total_weight += upstream * weight[k];
        }
        const double scale_j = share_scale(a, off, on_target, t_element(a).b, lg);
        rep.near(c, [&] { return args() + " j=" + std::to_string(j); }, got, expected,
                 {kLineRel, kLineRel * (scale_j + expected_scale) + kGradientFloor * total_weight});
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Properties over dense grids.

// n doubles evenly spaced in their bit patterns between lo and hi (0 <= lo < hi): log-uniform
// across binades, so every exponent of the range is visited.
std::vector<double> bit_grid(double lo, double hi, int n) {
  const std::uint64_t a = kn::bits_of(lo), b = kn::bits_of(hi);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) {
    out[i] = kn::double_of(a + static_cast<std::uint64_t>(static_cast<long double>(b - a) * i / (n - 1)));
  }
  out.back() = hi;
  return out;
}

std::vector<double> linear_grid(double lo, double hi, int n) {
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = lo + (hi - lo) * i / (n - 1);
  out.back() = hi;
  return out;
}

// 2·k + 1 consecutive doubles centred on x.
std::vector<double> neighbours(double x, int k) {
  std::vector<double> out;
  double lo = x;
  for (int i = 0; i < k; ++i) lo = std::nextafter(lo, -kInf);
  for (int i = 0; i <= 2 * k; ++i, lo = std::nextafter(lo, kInf)) out.push_back(lo);
  return out;
}

void check_monotone(Report& rep, Report::Counter& c, const std::vector<double>& xs, const UnaryFn& f) {
  const std::vector<double> ys = apply(f, xs);
  double y0 = f.scalar(xs[0]);
  for (size_t i = 0; i + 1 < xs.size(); ++i) {
    const double y1 = f.scalar(xs[i + 1]);
    rep.truth(c, y0 <= y1 && ys[i] <= ys[i + 1], [&] {
      return "x=" + fmt(xs[i]) + " < " + fmt(xs[i + 1]) + " but f = " + fmt(y0) + " then " + fmt(y1) + " (simd " +
             fmt(ys[i]) + " then " + fmt(ys[i + 1]) + ")";
    });
    y0 = y1;
  }
}

void check_finite(Report& rep, const char* fn, const std::vector<double>& xs, const UnaryFn& f) {
  Report::Counter& c = rep.counter(fn);
  const std::vector<double> ys = apply(f, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double y = f.scalar(xs[i]);
    rep.truth(c, std::isfinite(y) && std::isfinite(ys[i]),
              [&] { return "x=" + fmt(xs[i]) + " gives " + fmt(y) + " (simd " + fmt(ys[i]) + ")"; });
  }
}

void test_elementary_properties(Report& rep) {
  // exp_d: monotone on [-708, 709] and across every point where the reduction's integer changes
  // ((k + ½)·ln 2), the only places where two polynomial pieces meet.
  const std::vector<double> exp_dense = linear_grid(-708.0, 709.0, 100001);
  Report::Counter& exp_mono = rep.counter("exp_d monotone");
  check_monotone(rep, exp_mono, exp_dense, t_exp_fn);
  check_finite(rep, "exp_d finite on [-708, 709]", exp_dense, t_exp_fn);
  for (int k = -1022; k <= 1023; ++k) {
    const double b = (k + 0.5) * 0.6931471805599453;
    if (b > -708.0 && b < 709.0) check_monotone(rep, exp_mono, neighbours(b, 8), t_exp_fn);
  }
  // Documented saturation: +inf above 709 (the kernels turn it into an error naming τ), 0 below -708.
  Report::Counter& sat = rep.counter("exp_d saturation");
  for (double x : {std::nextafter(709.0, kInf), 709.5, 710.0, 1e300, kInf}) {
    rep.truth(sat, t_exp(x) == kInf, [&] { return "x=" + fmt(x) + ": want +inf, got " + fmt(t_exp(x)); });
  }
  for (double x : {std::nextafter(-708.0, -kInf), -745.0, -1e300, -kInf}) {
    rep.truth(sat, t_exp(x) == 0.0, [&] { return "x=" + fmt(x) + ": want 0, got " + fmt(t_exp(x)); });
  }
  rep.truth("exp_d exact", t_exp(0.0) == 1.0, [] { return "exp_d(0) = " + fmt(t_exp(0.0)); });

  // log_d: monotone and finite over the normal range, and across the mantissa fold at √2 and the
  // exponent steps at powers of two.
  const std::vector<double> log_dense = bit_grid(kDblMin, kDblMax, 100001);
  Report::Counter& log_mono = rep.counter("log_d monotone");
  check_monotone(rep, log_mono, log_dense, t_log_fn);
  check_finite(rep, "log_d finite on normal x > 0", log_dense, t_log_fn);
  for (int e = -1021; e <= 1023; ++e) {
    check_monotone(rep, log_mono, neighbours(std::ldexp(1.0, e), 4), t_log_fn);
    if (e < 1023) check_monotone(rep, log_mono, neighbours(std::ldexp(1.4142135623730951, e), 4), t_log_fn);
  }
  rep.truth("log_d exact", t_log(1.0) == 0.0, [] { return "log_d(1) = " + fmt(t_log(1.0)); });

  // log1p_d: finite and monotone on y >= 0, including where 1 + y rounds to 1 or to 1 + 2^-52.
  const std::vector<double> log1p_dense = bit_grid(0.0, kDblMax, 100001);
  Report::Counter& log1p_mono = rep.counter("log1p_d monotone");
  check_monotone(rep, log1p_mono, log1p_dense, t_log1p_fn);
  check_finite(rep, "log1p_d finite on y >= 0", log1p_dense, t_log1p_fn);
  check_monotone(rep, log1p_mono, neighbours(0x1p-53, 16), t_log1p_fn);
  check_monotone(rep, log1p_mono, neighbours(0x1p-52, 16), t_log1p_fn);
}

void test_special_properties(Report& rep) {
  // The whole documented domain x >= 1, up to DBL_MAX (exp evidence reaches α = e^709 ≈ 8e307,
  // relu evidence any size).
  const std::vector<double> xs = bit_grid(1.0, kDblMax, 50001);
  check_finite(rep, "digamma finite", xs, t_digamma_fn);
  check_finite(rep, "trigamma finite", xs, t_trigamma_fn);
  check_finite(rep, "tetragamma finite", xs, t_tetragamma_fn);
  check_finite(rep, "kl_h finite", xs, t_kl_h_fn);
  check_finite(rep, "kl_v finite", xs, t_kl_v_fn);
  check_finite(rep, "fisher_remainder.r finite", xs, t_r_fn);
  check_finite(rep, "fisher_remainder.r_prime finite", xs, t_r_prime_fn);
  // lnΓ(x) exceeds DBL_MAX above x ≈ 2.5e305; the kernels only take lgamma_ge1(N), N = candidates.
  check_finite(rep, "lgamma_ge1 finite", bit_grid(1.0, 2e305, 50001), t_lgamma_fn);
  std::vector<ElementAll> vec(xs.size());
  t_element_simd(xs.data(), vec.data(), static_cast<std::int64_t>(xs.size()));
  for (const ElementField& field : kElementFields) {
    Report::Counter& c = rep.counter(std::string(field.name) + " finite");
    for (size_t i = 0; i < xs.size(); ++i) {
      const double s = field.got(t_element(xs[i])), v = field.got(vec[i]);
      rep.truth(c, std::isfinite(s) && std::isfinite(v),
                [&] { return "alpha=" + fmt(xs[i]) + " gives " + fmt(s) + " (simd " + fmt(v) + ")"; });
    }
  }
}

// Far out (x >= 1e10) every function has a two-term asymptotic form whose next term is ~1e-20
// relative: a reference for the whole dense grid up to DBL_MAX, where the tables only have a few
// points and where overflow (α², α·S) and underflow (ψ2 ≈ −1/x² < DBL_MIN beyond 1.5e154; ψ1 ≈
// 1/x subnormal beyond 4.5e307) can break a formula. log_d is within an ulp, so the forms built
// on it are references too.
void test_asymptotic_properties(Report& rep) {
  const std::vector<double> xs = bit_grid(1e10, kDblMax, 50001);
  const auto check = [&rep, &xs](const char* fn, const std::vector<double>& got, Tol tol, auto expected) {
    Report::Counter& c = rep.counter(std::string("asymptotic ") + fn);
    for (size_t i = 0; i < xs.size(); ++i) {
      rep.near(c, [&] { return "x=" + fmt(xs[i]); }, got[i], expected(xs[i]), tol);
    }
  };
  constexpr double kHalfLog2Pi = 0.91893853320467274;
  check("digamma", apply(t_digamma_fn, xs), kSpecialTol, [](double x) { return t_log(x) - 0.5 / x; });
  check("trigamma", apply(t_trigamma_fn, xs), kSpecialTol, [](double x) { return 1.0 / x + 0.5 / x / x; });
  check("kl_h", apply(t_kl_h_fn, xs), kKlHTol,
        [](double x) { return -0.5 * t_log(x) - kHalfLog2Pi - 0.5 + 1.0 / (3.0 * x); });
  std::vector<ElementAll> vec(xs.size());
  t_element_simd(xs.data(), vec.data(), static_cast<std::int64_t>(xs.size()));
  const auto field = [&vec](double (*get)(const ElementAll&)) {
    std::vector<double> out(vec.size());
    for (size_t i = 0; i < vec.size(); ++i) out[i] = get(vec[i]);
    return out;
  };
  // ln ψ1(x) = −ln x + 1/(2x) + O(x⁻²); x(x+1)ψ1 = (x + 1)(1 + 1/(2x)) + O(1/x); x·v = ½ + 1/(3x);
  // f'(x) = 1 + O(x⁻²); xψ2/ψ1 = −1 − 1/(2x) + O(x⁻²); x·r' = −1/(12x) − 1/(12x²) + O(x⁻³).
  check("element_forward.log_trigamma", field(kElementFields[2].got), kLogTrigammaTol,
        [](double x) { return -t_log(x) + 0.5 / x; });
  check("element_forward.fisher", field(kElementFields[1].got), kElementTol,
        [](double x) { return (x + 1.0) * (1.0 + 0.5 / x); });
  check("element_backward.kl_v", field(kElementFields[4].got), kElementTol,
        [](double x) { return 0.5 + 1.0 / (3.0 * x); });
  check("element_backward.fisher_slope", field(kElementFields[5].got), kFisherSlopeTol, [](double) { return 1.0; });
  check("element_backward.logdet_ratio", field(kElementFields[6].got), kElementTol,
        [](double x) { return -1.0 - 0.5 / x; });
  check("element_backward.logdet_r_prime", field(kElementFields[7].got), logdet_r_prime_tol(1e10),
        [](double x) { return -1.0 / (12.0 * x) - 1.0 / (12.0 * x) / x; });
}

void test_difference_properties(Report& rep) {
  // Finite everywhere, and equal to the direct difference wherever the direct difference is itself
  // accurate: its error is ~tol·(|f(a)| + |f(a + r)|), so compare only where that sum is at most
  // 100 times the value (cancellation factor <= 100), allowing exactly that error.
  const std::vector<double> as = bit_grid(1.0, 1e300, 301);
  std::vector<double> rs = bit_grid(1e-12, 1e300, 301);
  rs.insert(rs.begin(), 0.0);
  Report::Counter& dd_finite = rep.counter("digamma_difference finite");
  Report::Counter& td_finite = rep.counter("trigamma_difference finite");
  Report::Counter& dd_direct = rep.counter("digamma_difference = direct");
  Report::Counter& td_direct = rep.counter("trigamma_difference = direct");
  for (double a : as) {
    for (double r : rs) {
      const auto args = [&] { return "a=" + fmt(a) + " r=" + fmt(r); };
      const double dd = t_digamma_difference(a, r), td = t_trigamma_difference(a, r);
      rep.truth(dd_finite, std::isfinite(dd), [&] { return args() + " gives " + fmt(dd); });
      rep.truth(td_finite, std::isfinite(td), [&] { return args() + " gives " + fmt(td); });
      const double s = a + r;
      const double pa = t_digamma(a), ps = t_digamma(s);
      const double direct = ps - pa, mag = std::fabs(pa) + std::fabs(ps);
      if (mag <= 100.0 * std::fabs(direct)) {
        rep.near(dd_direct, args, dd, direct, {kDifferenceTol.rel, kDigammaTol.rel * mag + kDigammaTol.abs});
      }
      const double ta = t_trigamma(a), ts = t_trigamma(s);
      const double tdirect = ts - ta, tmag = std::fabs(ta) + std::fabs(ts);
      if (tmag <= 100.0 * std::fabs(tdirect)) {
        rep.near(td_direct, args, td, tdirect, {kDifferenceTol.rel, kSpecialTol.rel * tmag});
      }
    }
  }
}

template <kn::EvidenceKind kKind>
void check_evidence_domain(Report& rep, const char* fn, const std::vector<double>& xs) {
  Report::Counter& c = rep.counter(fn);
  std::vector<kn::EvidenceValue> vec(xs.size());
  t_evidence_simd<kKind>(xs.data(), vec.data(), static_cast<std::int64_t>(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const kn::EvidenceValue s = t_evidence<kKind>(xs[i]);
    bool ok = true;
    for (const kn::EvidenceValue& v : {s, vec[i]}) {
      ok = ok && std::isfinite(v.alpha) && v.alpha >= 1.0 && v.rho >= 0.0 && v.rho <= 1.0;  // NaN fails too
    }
    rep.truth(c, ok, [&] {
      return "x=" + fmt(xs[i]) + ": alpha = " + fmt(s.alpha) + ", rho = " + fmt(s.rho) + " (simd " + fmt(vec[i].alpha) +
             ", " + fmt(vec[i].rho) + "), want finite alpha >= 1 and rho in [0, 1]";
    });
  }
}

void test_evidence_properties(Report& rep) {
  // x = s/τ can be any real; exp evidence is finite up to 709 (above, α = +inf is the error path).
  std::vector<double> all = {0.0};
  for (double x : bit_grid(std::numeric_limits<double>::denorm_min(), kDblMax, 20001)) {
    all.push_back(x);
    all.push_back(-x);
  }
  std::vector<double> up_to_709;
  for (double x : all) {
    if (x <= 709.0) up_to_709.push_back(x);
  }
  check_evidence_domain<kn::EvidenceKind::kExp>(rep, "evidence<exp> domain", up_to_709);
  check_evidence_domain<kn::EvidenceKind::kRelu>(rep, "evidence<relu> domain", all);
  check_evidence_domain<kn::EvidenceKind::kSoftplus>(rep, "evidence<softplus> domain", all);
  check_evidence_domain<kn::EvidenceKind::kExpTanh>(rep, "evidence<exp_tanh> domain", all);
}

// Deterministic pseudo-random rows (xorshift) of α spread log-uniformly up to 1e2 … 1e300:
// whenever line_terms says a line is finite (strength < 1.7e308), every term and every gradient
// coefficient must be finite.
void test_line_properties(Report& rep) {
  std::uint64_t state = 0x9E3779B97F4A7C15ULL;
  const auto next = [&state]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<double>(state >> 11) * 0x1p-53;  // [0, 1)
  };
  const bool all_terms[kn::kNumTerms] = {true, true, true, true, true};
  const double weight[kn::kNumTerms] = {1.0, 1.0, 1.0, 1.0, 1.0};
  const double top_exponent[] = {2.0, 9.0, 45.0, 160.0, 300.0};
  Report::Counter& c = rep.counter("line_terms/line_gradient finite");
  for (int trial = 0; trial < 5000; ++trial) {
    ref::Line line = {};
    line.n = 2 + static_cast<int>(next() * (ref::kMaxLineN - 1));
    line.target = static_cast<int>(next() * line.n);
    line.c = trial % 3 == 0 ? 0.0 : trial % 3 == 1 ? 0.3 : 1.0;
    const double top = top_exponent[trial % 5];
    for (int j = 0; j < line.n; ++j) line.alpha[j] = std::pow(10.0, top * next());
    StatBudget budget;
    const kn::LineInput in = accumulate(line, budget);
    const kn::LineTerms terms = t_line_terms(in, all_terms);
    if (!terms.finite) continue;
    const kn::LineGradient lg = t_line_gradient(in, weight, 1.0);
    bool ok = true;
    double grads[ref::kMaxLineN];
    for (int t = 0; t < kn::kNumTerms; ++t) ok = ok && std::isfinite(terms.value[t]);
    for (int j = 0; j < line.n; ++j) {
      const double on_target = j == line.target ? 1.0 : 0.0;
      grads[j] = share_for(weight, line.alpha[j], 1.0 - on_target, on_target, lg);
      ok = ok && std::isfinite(grads[j]);
    }
    rep.truth(c, ok, [&] {
      std::string bad = line_args(line) + ": not finite:";
      for (int t = 0; t < kn::kNumTerms; ++t) {
        if (!std::isfinite(terms.value[t])) bad += std::string(" ") + kTermNames[t] + "=" + fmt(terms.value[t]);
      }
      for (int j = 0; j < line.n; ++j) {
        if (!std::isfinite(grads[j])) bad += " grad[" + std::to_string(j) + "]=" + fmt(grads[j]);
      }
      return bad;
    });
  }
}

}  // namespace

int run_kernel_tests(int argc, char** argv) {
  // --quiet: no per-function summary; --all: print every failure, not the first 12 per function.
  bool quiet = false, all = false;
  for (int i = 1; i < argc; ++i) {
    quiet = quiet || std::strcmp(argv[i], "--quiet") == 0;
    all = all || std::strcmp(argv[i], "--all") == 0;
  }
  const auto start = std::chrono::steady_clock::now();
  std::printf("csrc/kernels/ unit tests, variant %s\n", EO_TEST_STR(EO_ISA));
  Report rep;
  if (all) rep.printed_per_function = -1;
  test_elementary(rep);
  test_special(rep);
  test_differences(rep);
  test_evidence(rep);
  test_elements(rep);
  test_lines(rep);
  test_elementary_properties(rep);
  test_special_properties(rep);
  test_asymptotic_properties(rep);
  test_difference_properties(rep);
  test_evidence_properties(rep);
  test_line_properties(rep);
  if (!quiet) rep.summary();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\nvariant %s: %ld checks, %ld failures, %.2f s\n", EO_TEST_STR(EO_ISA), rep.checks(), rep.failures(),
              seconds);
  return rep.failures() == 0 ? 0 : 1;
}
