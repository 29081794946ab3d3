// Holds the float32 special functions (csrc/kernels/special_functions_f32.h, elementary_f32.h) to
// the error bounds the full mpmath sweep measured (bench/results/float32_special_functions.md):
// at a subset of the sweep's points (float32_reference_table.h, mpmath values written by
// bench/float32_special_sweep.py --write-ctest-table), each function evaluated by scalar code and
// in an `omp simd` loop (float32_special_values.cpp), for this build's instruction-set variant.
// Plus the properties the kernels rely on that no finite table shows: finite everywhere on the
// domain, the x → ∞ limits, monotonicity across the branch point 8, that
// polygammas_of_class is polygammas, and that the float32 element functions of element_terms.h are
// these functions.
//
// The table and its bounds are regenerated after a new full sweep with
// `python bench/float32_special_sweep.py --write-ctest-table`.
// Exit status: 0 if every check passed, 1 otherwise; each failure is printed (the first 40).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "float32_reference_table.h"
#include "kernels/element_terms.h"

#ifndef EO_ISA
#error "EO_ISA must name the variant (generic, avx2, avx512)"
#endif
#define EO_TEST_STR_(x) #x
#define EO_TEST_STR(x) EO_TEST_STR_(x)

int run_float32_values(int argc, char** argv);  // float32_special_values.cpp (same variant)

namespace kn = evidential_ops::EO_ISA;
namespace ref = eo_float32_reference;

namespace {

constexpr double kFltMax = std::numeric_limits<float>::max();
constexpr double kFltMin = std::numeric_limits<float>::min();

// The spacing of float32 at v (2^-149 below FLT_MIN), as the sweep measures it.
double ulp_at(double v) {
  const double m = std::fmax(std::fabs(v), kFltMin);
  int e;
  std::frexp(m, &e);  // m in [2^(e−1), 2^e)
  return std::ldexp(1.0, e - 1 - 23);
}

double ulps(float got, double expected) {
  if (std::fabs(expected) >= kFltMax * (1 + 0x1p-24)) {  // beyond float32: must be ±inf
    return std::isinf(got) && (got > 0) == (expected > 0) ? 0.0 : INFINITY;
  }
  if (!std::isfinite(got)) return INFINITY;
  return std::fabs(static_cast<double>(got) - expected) / ulp_at(expected);
}

struct Failures {
  long checks = 0, count = 0;
  void check(bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      ++count;
      if (count <= 40) std::printf("FAIL %s\n", what.c_str());
    }
  }
};

std::string fmt(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Evaluates a domain through the sweep's own driver (so the code under test is exactly the one the
// sweep measured) and compares with the table.
template <std::size_t N, std::size_t F, std::size_t I>
void check_domain(Failures& f, const char* domain, const std::vector<std::string>& names, const float (&x)[N],
                  const double (&reference)[N][F], const double (&lo)[I], const double (&hi)[I],
                  const double (&bound)[F][I]) {
  char in_path[] = "/tmp/eo_f32_in_XXXXXX";
  char out_path[] = "/tmp/eo_f32_out_XXXXXX";
  const int in_fd = mkstemp(in_path), out_fd = mkstemp(out_path);
  if (in_fd < 0 || out_fd < 0) {
    f.check(false, "cannot create temporary files");
    return;
  }
  std::FILE* in = fdopen(in_fd, "wb");
  std::fwrite(x, sizeof(float), N, in);
  std::fclose(in);
  close(out_fd);
  char* argv[] = {const_cast<char*>("values"), const_cast<char*>(domain), in_path, out_path};
  if (run_float32_values(4, argv) != 0) {
    f.check(false, std::string("driver failed on ") + domain);
    return;
  }
  std::vector<float> values(2 * F * N);
  std::FILE* out = std::fopen(out_path, "rb");
  const std::size_t got = std::fread(values.data(), sizeof(float), values.size(), out);
  std::fclose(out);
  std::remove(in_path);
  std::remove(out_path);
  f.check(got == values.size(), std::string("short output from ") + domain);
  if (got != values.size()) return;
  for (std::size_t k = 0; k < F; ++k) {
    double worst = 0.0;
    for (int path = 0; path < 2; ++path) {
      for (std::size_t i = 0; i < N; ++i) {
        std::size_t interval = I;
        for (std::size_t j = 0; j < I; ++j) {
          if (x[i] >= lo[j] && x[i] < hi[j]) interval = j;
        }
        if (interval == I) continue;
        const float v = values[(k * 2 + path) * N + i];
        const double e = ulps(v, reference[i][k]);
        worst = std::fmax(worst, e);
        f.check(e <= bound[k][interval], std::string(domain) + " " + names[k] + (path ? " (simd)" : " (scalar)") +
                                             " at x = " + fmt(x[i]) + ": got " + fmt(v) + ", mpmath " +
                                             fmt(reference[i][k]) + ": " + fmt(e) + " ulps > bound " +
                                             fmt(bound[k][interval]));
      }
    }
    std::printf("  %-10s %-26s worst %.2f ulps\n", domain, names[k].c_str(), worst);
  }
}

// Properties at points no table holds: the whole float32 range of α is finite and ordered.
void check_properties(Failures& f) {
  // Every float32 α from 1 to FLT_MAX in steps of 2^-7 of a binade: finite results, h and ln ψ1
  // decreasing, xψ1 decreasing to 1, x·v decreasing to ½, r positive (or 0 once subnormal results
  // flush), f' increasing to 1. Monotone checks allow the functions' own rounding (2 ulps).
  kn::PolygammasF32 p = kn::polygammas(1.0f);
  float prev_h = kn::kl_h(1.0f, p), prev_lt = kn::log_trigamma(1.0f, p), prev_t1 = p.x_trigamma;
  for (std::uint32_t bits = 0x3F800000u + (1u << 16); bits < 0x7F800000u; bits += 1u << 16) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const kn::PolygammasF32 g = kn::polygammas(x);
    const float h = kn::kl_h(x, g), lt = kn::log_trigamma(x, g), xv = kn::x_kl_v(x, g), fs = kn::fisher_slope(x, g);
    const kn::FisherRemainderF32 fr = kn::fisher_remainder(x, g);
    const bool finite = std::isfinite(h) && std::isfinite(lt) && std::isfinite(xv) && std::isfinite(fs) &&
                        std::isfinite(fr.r) && std::isfinite(fr.x_r_prime) && std::isfinite(g.x_trigamma) &&
                        std::isfinite(g.x2_tetragamma) && std::isfinite(g.digamma);
    f.check(finite, "non-finite result at x = " + fmt(x));
    f.check(h <= prev_h + 2 * ulp_at(h), "h not decreasing at x = " + fmt(x));
    f.check(lt <= prev_lt + 2 * ulp_at(lt), "ln ψ1 not decreasing at x = " + fmt(x));
    f.check(g.x_trigamma <= prev_t1 + 2 * ulp_at(prev_t1) && g.x_trigamma >= 1.0f,
            "xψ1 not decreasing to 1 at x = " + fmt(x));
    f.check(xv >= 0.5f && xv <= 1.0f + 0x1p-23f, "x·v outside [½, 1] at x = " + fmt(x));
    f.check(fr.r >= 0.0f && fr.x_r_prime <= 0.0f, "r < 0 or x·r' > 0 at x = " + fmt(x));
    f.check(fs > 0.0f && fs <= 1.0f, "f' outside (0, 1] at x = " + fmt(x));
    prev_h = h;
    prev_lt = lt;
    prev_t1 = g.x_trigamma;
  }
  // polygammas_of_class<k>(x) is polygammas(x) for every x of class k (here: every point of the
  // sweep's table): bit for bit without FMA contraction; with it (this build targets FMA) the two
  // forms may be fused differently, so there they must agree within 1 ulp.
#if defined(__FMA__)
  const double class_ulps = 1.0;
#else
  const double class_ulps = 0.0;
#endif
  for (const float a : ref::k_alpha_x) {
    const kn::PolygammasF32 g = kn::polygammas(a);
    kn::PolygammasF32 c;
    c = kn::argument_class(a) == kn::kSeriesClass ? kn::polygammas_of_class<kn::kSeriesClass>(a)
                                                  : kn::polygammas_of_class<0>(a);
    const float by_default[] = {g.digamma, g.lgamma, g.x_trigamma, g.x2_tetragamma, kn::kl_h_plus_one(a, g),
                                kn::x_kl_v(a, g), kn::log_trigamma(a, g), kn::fisher_remainder(a, g).r,
                                kn::fisher_remainder(a, g).x_r_prime, kn::fisher_slope(a, g)};
    const float by_class[] = {c.digamma, c.lgamma, c.x_trigamma, c.x2_tetragamma, kn::kl_h_plus_one(a, c),
                              kn::x_kl_v(a, c), kn::log_trigamma(a, c), kn::fisher_remainder(a, c).r,
                              kn::fisher_remainder(a, c).x_r_prime, kn::fisher_slope(a, c)};
    bool same = g.series == c.series;
    for (std::size_t k = 0; k < sizeof by_class / sizeof by_class[0]; ++k) {
      const double apart = by_default[k] == by_class[k] ? 0.0
                                                        : std::fabs(static_cast<double>(by_default[k]) - by_class[k]) /
                                                              ulp_at(by_default[k]);
      same = same && apart <= class_ulps;
    }
    f.check(same, "polygammas_of_class differs from polygammas at x = " + fmt(a));
  }
  // element_terms.h's float32 element functions are these functions, and widen() turns h + 1 into
  // h exactly (in double) and forms α(α + 1)ψ1 as (α + 1)·(αψ1).
  for (const float a : {1.0f, 1.0000001f, 1.4262551f, 2.0f, 3.7f, 7.9999995f, 8.0f, 1234.5f, 4.9e8f, 3.0e38f}) {
    const kn::PolygammasF32 g = kn::polygammas(a);
    const kn::ElementForwardF32 fw = kn::element_forward_f32<true, true, true>(a);
    const kn::ElementBackwardF32 bw = kn::element_backward_f32<true, true, true>(a);
    f.check(fw.kl_h_plus_one == kn::kl_h_plus_one(a, g) && fw.x_trigamma == g.x_trigamma &&
                fw.log_trigamma == kn::log_trigamma(a, g) && fw.remainder == kn::fisher_remainder(a, g).r,
            "element_forward_f32 differs from the functions at α = " + fmt(a));
    f.check(bw.kl_v == kn::x_kl_v(a, g) && bw.fisher_slope == kn::fisher_slope(a, g) &&
                bw.logdet_ratio == kn::tetragamma_trigamma_ratio(g) &&
                bw.logdet_r_prime == kn::fisher_remainder(a, g).x_r_prime,
            "element_backward_f32 differs from the functions at α = " + fmt(a));
    const kn::ElementForward wide = kn::widen(static_cast<double>(a), fw);
    f.check(wide.kl_h == static_cast<double>(fw.kl_h_plus_one) - 1.0 &&
                wide.kl_h + 1.0 == static_cast<double>(fw.kl_h_plus_one) &&
                wide.fisher == (static_cast<double>(a) + 1.0) * static_cast<double>(fw.x_trigamma),
            "widen at α = " + fmt(a));
  }
  // The logarithm's reduction x = m·2^k, m ∈ [0.707, 1.414]: k steps up exactly where the
  // mantissa passes 1.41421354 (the last float below √2), in every binade; ln m, the tail, then
  // matches log_f of m itself (its own k is 0) bit for bit.
  for (int e = -126; e < 128; ++e) {
    for (const float m : {1.0f, 1.41421342f, 1.41421354f, 1.41421366f, 1.99999988f}) {
      const float x = std::ldexp(m, e);
      const kn::LogPartsF32 parts = kn::log_parts_f(x);
      const bool high = m > 1.41421354f;
      const float reduced = high ? 0.5f * m : m;
      f.check(parts.k == static_cast<float>(e + (high ? 1 : 0)) && parts.tail == kn::log_f(reduced),
              "log reduction at x = " + fmt(x));
    }
  }
  // exp_f_of_moderate is exp_f bit for bit on |x| <= 87 (every 2^-10 of a binade there), and
  // exp_f's clamped ends still give exactly 0 and +inf beyond its range.
  for (std::uint32_t bits = 0; bits < 0x42AE0000u; bits += 1u << 13) {  // 0 … 87
    float x;
    std::memcpy(&x, &bits, sizeof x);
    for (const float v : {x, -x}) {
      f.check(kn::exp_f_of_moderate(v) == kn::exp_f(v), "exp_f_of_moderate differs from exp_f at x = " + fmt(v));
    }
  }
  // Every float between the range's ends and the clamps, then the clamps to ±FLT_MAX in steps.
  for (float x = std::nextafter(kn::kMinExpArgF, -INFINITY); x >= kn::kExpClampLoF; x = std::nextafter(x, -INFINITY)) {
    f.check(kn::exp_f(x) == 0.0f, "exp_f not 0 at x = " + fmt(x));
  }
  for (float x = std::nextafter(kn::kMaxExpArgF, INFINITY); x <= kn::kExpClampHiF; x = std::nextafter(x, INFINITY)) {
    f.check(kn::exp_f(x) == INFINITY, "exp_f not +inf at x = " + fmt(x));
  }
  for (const float x : {-200.0f, -3.0e38f, -INFINITY}) f.check(kn::exp_f(x) == 0.0f, "exp_f not 0 at x = " + fmt(x));
  for (const float x : {200.0f, 3.0e38f, INFINITY}) f.check(kn::exp_f(x) == INFINITY, "exp_f not +inf at x = " + fmt(x));
  f.check(kn::exp_f(-103.0f) > 0.0f && kn::exp_f(88.72f) < INFINITY, "exp_f within its range");
  // x → ∞ (and the log-space entry far beyond FLT_MAX): the limits, exactly.
  const kn::PolygammasF32 inf = kn::polygammas(INFINITY);
  f.check(inf.x_trigamma == 1.0f && inf.x2_tetragamma == -1.0f && kn::x_kl_v(INFINITY, inf) == 0.5f &&
              kn::fisher_remainder(INFINITY, inf).r == 0.0f && kn::fisher_slope(INFINITY, inf) == 1.0f,
          "limits at x = +inf");
  const kn::PolygammasF32 far = kn::polygammas_of_log(5000.0f);
  f.check(far.x_trigamma == 1.0f && kn::log_trigamma(0.0f, far) == -5000.0f &&
              kn::kl_h_plus_one(0.0f, far) == -2500.0f - kn::kHalfLog2PiMinusHalfF,
          "log-space limits at ln α = 5000");
}

}  // namespace

int run_special_functions_f32_tests(int, char**) {
  std::printf("float32 special functions, variant %s\n", EO_TEST_STR(EO_ISA));
  Failures f;
  const std::vector<std::string> alpha = {"digamma", "lgamma", "x_trigamma", "x2_tetragamma", "kl_h",
                                          "kl_h_plus_one", "x_kl_v",
                                          "log_trigamma", "remainder", "x_remainder_prime", "fisher_slope",
                                          "tetragamma_trigamma_ratio"};
  std::vector<std::string> log_alpha = alpha;
  log_alpha.erase(log_alpha.begin() + 1);  // no lnΓ in log space
  check_domain(f, "alpha", alpha, ref::k_alpha_x, ref::k_alpha_reference, ref::k_alpha_interval_lo,
               ref::k_alpha_interval_hi, ref::k_alpha_bound);
  check_domain(f, "log_alpha", log_alpha, ref::k_log_alpha_x, ref::k_log_alpha_reference, ref::k_log_alpha_interval_lo,
               ref::k_log_alpha_interval_hi, ref::k_log_alpha_bound);
  const std::vector<std::string> tanh = {"kl_h_plus_one", "x_kl_v", "x_trigamma", "log_trigamma", "remainder",
                                         "x_remainder_prime", "fisher_slope", "tetragamma_trigamma_ratio"};
  check_domain(f, "tanh", tanh, ref::k_tanh_x, ref::k_tanh_reference, ref::k_tanh_interval_lo,
               ref::k_tanh_interval_hi, ref::k_tanh_bound);
  check_domain(f, "exp", {"exp"}, ref::k_exp_x, ref::k_exp_reference, ref::k_exp_interval_lo, ref::k_exp_interval_hi,
               ref::k_exp_bound);
  check_domain(f, "log", {"log"}, ref::k_log_x, ref::k_log_reference, ref::k_log_interval_lo, ref::k_log_interval_hi,
               ref::k_log_bound);
  check_domain(f, "log1p", {"log1p"}, ref::k_log1p_x, ref::k_log1p_reference, ref::k_log1p_interval_lo,
               ref::k_log1p_interval_hi, ref::k_log1p_bound);
  check_properties(f);
  std::printf("variant %s: %ld checks, %ld failures\n", EO_TEST_STR(EO_ISA), f.checks, f.count);
  return f.count == 0 ? 0 : 1;
}
