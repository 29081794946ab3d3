// Evaluates the float32 functions of csrc/kernels/special_functions_f32.h and elementary_f32.h on
// float32 arguments read from a file, for bench/float32_special_sweep.py (which compares them
// with mpmath). Built by CMakeLists.txt once per instruction-set variant, with the extension's
// flags, like the kernel tests: the vector code of each variant may round differently.
//
//   float32_special_values_<isa> --list                  the function names of each domain
//   float32_special_values_<isa> DOMAIN IN OUT           DOMAIN: alpha, log_alpha, tanh, exp, log, log1p
//
// IN holds n float32 arguments (raw, native byte order); OUT receives, per function of the
// domain (in --list order), n results of the scalar code then n results of an `omp simd` loop
// (the form the tile kernels use): 2·F·n raw float32 values.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/element_terms.h"
#include "kernels/special_functions_f32.h"

#ifndef EO_ISA
#error "EO_ISA must name the variant (generic, avx2, avx512)"
#endif
#define EO_NOINLINE __attribute__((noinline))

namespace kn = evidential_ops::EO_ISA;

namespace {

struct Function {
  const char* name;
  float (*scalar)(float);
  void (*simd)(const float* x, float* y, long n);
};

#define EO_FUNCTION(name, expr)                                      \
  EO_NOINLINE float name(float x) { return expr; }                   \
  EO_NOINLINE void name##_simd(const float* xs, float* ys, long n) { \
    _Pragma("omp simd") for (long i = 0; i < n; ++i) {               \
      const float x = xs[i];                                         \
      ys[i] = expr;                                                  \
    }                                                                \
  }

// Domain "alpha": x = α >= 1.
EO_FUNCTION(f_digamma, kn::polygammas(x).digamma)
EO_FUNCTION(f_lgamma, kn::polygammas(x).lgamma)
EO_FUNCTION(f_x_trigamma, kn::polygammas(x).x_trigamma)
EO_FUNCTION(f_x2_tetragamma, kn::polygammas(x).x2_tetragamma)
EO_FUNCTION(f_kl_h, kn::kl_h(x, kn::polygammas(x)))
EO_FUNCTION(f_kl_h_plus_one, kn::kl_h_plus_one(x, kn::polygammas(x)))
EO_FUNCTION(f_x_kl_v, kn::x_kl_v(x, kn::polygammas(x)))
EO_FUNCTION(f_log_trigamma, kn::log_trigamma(x, kn::polygammas(x)))
EO_FUNCTION(f_remainder, kn::fisher_remainder(x, kn::polygammas(x)).r)
EO_FUNCTION(f_x_remainder_prime, kn::fisher_remainder(x, kn::polygammas(x)).x_r_prime)
EO_FUNCTION(f_fisher_slope, kn::fisher_slope(x, kn::polygammas(x)))
EO_FUNCTION(f_ratio, kn::tetragamma_trigamma_ratio(kn::polygammas(x)))

// Domain "log_alpha": x = ln α >= ln 8 (α possibly beyond FLT_MAX).
EO_FUNCTION(l_digamma, kn::polygammas_of_log(x).digamma)
EO_FUNCTION(l_x_trigamma, kn::polygammas_of_log(x).x_trigamma)
EO_FUNCTION(l_x2_tetragamma, kn::polygammas_of_log(x).x2_tetragamma)
EO_FUNCTION(l_kl_h, kn::kl_h(x, kn::polygammas_of_log(x)))
EO_FUNCTION(l_kl_h_plus_one, kn::kl_h_plus_one(x, kn::polygammas_of_log(x)))
EO_FUNCTION(l_x_kl_v, kn::x_kl_v(x, kn::polygammas_of_log(x)))
EO_FUNCTION(l_log_trigamma, kn::log_trigamma(x, kn::polygammas_of_log(x)))
EO_FUNCTION(l_remainder, kn::fisher_remainder(x, kn::polygammas_of_log(x)).r)
EO_FUNCTION(l_x_remainder_prime, kn::fisher_remainder(x, kn::polygammas_of_log(x)).x_r_prime)
EO_FUNCTION(l_fisher_slope, kn::fisher_slope(x, kn::polygammas_of_log(x)))
EO_FUNCTION(l_ratio, kn::tetragamma_trigamma_ratio(kn::polygammas_of_log(x)))

// Domain "tanh": x = t ∈ [−1, 1], the functions at α = 1 + e^t (exp_tanh evidence).
EO_FUNCTION(t_kl_h_plus_one, (kn::element_forward_f32_of_tanh<true, false, false>(x).kl_h_plus_one))
EO_FUNCTION(t_x_kl_v, (kn::element_backward_f32_of_tanh<true, false, false>(x).kl_v))
EO_FUNCTION(t_x_trigamma, (kn::element_forward_f32_of_tanh<false, true, false>(x).x_trigamma))
EO_FUNCTION(t_log_trigamma, (kn::element_forward_f32_of_tanh<false, false, true>(x).log_trigamma))
EO_FUNCTION(t_remainder, (kn::element_forward_f32_of_tanh<false, false, true>(x).remainder))
EO_FUNCTION(t_x_remainder_prime, (kn::element_backward_f32_of_tanh<false, false, true>(x).logdet_r_prime))
EO_FUNCTION(t_fisher_slope, (kn::element_backward_f32_of_tanh<false, true, false>(x).fisher_slope))
EO_FUNCTION(t_ratio, (kn::element_backward_f32_of_tanh<false, false, true>(x).logdet_ratio))

EO_FUNCTION(e_exp, kn::exp_f(x))
EO_FUNCTION(e_log, kn::log_f(x))
EO_FUNCTION(e_log1p, kn::log1p_f(x))

#define EO_ENTRY(fn, label) {label, &fn, &fn##_simd}

const std::vector<Function> kAlpha = {
    EO_ENTRY(f_digamma, "digamma"),           EO_ENTRY(f_lgamma, "lgamma"),
    EO_ENTRY(f_x_trigamma, "x_trigamma"),     EO_ENTRY(f_x2_tetragamma, "x2_tetragamma"),
    EO_ENTRY(f_kl_h, "kl_h"),                 EO_ENTRY(f_kl_h_plus_one, "kl_h_plus_one"),
    EO_ENTRY(f_x_kl_v, "x_kl_v"),
    EO_ENTRY(f_log_trigamma, "log_trigamma"), EO_ENTRY(f_remainder, "remainder"),
    EO_ENTRY(f_x_remainder_prime, "x_remainder_prime"), EO_ENTRY(f_fisher_slope, "fisher_slope"),
    EO_ENTRY(f_ratio, "tetragamma_trigamma_ratio"),
};
const std::vector<Function> kLogAlpha = {
    EO_ENTRY(l_digamma, "digamma"),           EO_ENTRY(l_x_trigamma, "x_trigamma"),
    EO_ENTRY(l_x2_tetragamma, "x2_tetragamma"), EO_ENTRY(l_kl_h, "kl_h"),
    EO_ENTRY(l_kl_h_plus_one, "kl_h_plus_one"),
    EO_ENTRY(l_x_kl_v, "x_kl_v"),             EO_ENTRY(l_log_trigamma, "log_trigamma"),
    EO_ENTRY(l_remainder, "remainder"),       EO_ENTRY(l_x_remainder_prime, "x_remainder_prime"),
    EO_ENTRY(l_fisher_slope, "fisher_slope"), EO_ENTRY(l_ratio, "tetragamma_trigamma_ratio"),
};
const std::vector<Function> kTanh = {
    EO_ENTRY(t_kl_h_plus_one, "kl_h_plus_one"), EO_ENTRY(t_x_kl_v, "x_kl_v"),
    EO_ENTRY(t_x_trigamma, "x_trigamma"),       EO_ENTRY(t_log_trigamma, "log_trigamma"),
    EO_ENTRY(t_remainder, "remainder"),         EO_ENTRY(t_x_remainder_prime, "x_remainder_prime"),
    EO_ENTRY(t_fisher_slope, "fisher_slope"),   EO_ENTRY(t_ratio, "tetragamma_trigamma_ratio"),
};
const std::vector<Function> kExp = {EO_ENTRY(e_exp, "exp")};
const std::vector<Function> kLog = {EO_ENTRY(e_log, "log")};
const std::vector<Function> kLog1p = {EO_ENTRY(e_log1p, "log1p")};

struct Domain {
  const char* name;
  const std::vector<Function>* functions;
};
const Domain kDomains[] = {
    {"alpha", &kAlpha}, {"log_alpha", &kLogAlpha}, {"tanh", &kTanh},
    {"exp", &kExp},     {"log", &kLog},            {"log1p", &kLog1p}};

}  // namespace

int run_float32_values(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const Domain& d : kDomains) {
      std::printf("%s", d.name);
      for (const Function& f : *d.functions) std::printf(" %s", f.name);
      std::printf("\n");
    }
    return 0;
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s --list | DOMAIN IN OUT\n", argv[0]);
    return 2;
  }
  const Domain* domain = nullptr;
  for (const Domain& d : kDomains) {
    if (std::strcmp(d.name, argv[1]) == 0) domain = &d;
  }
  if (domain == nullptr) {
    std::fprintf(stderr, "unknown domain %s\n", argv[1]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[2], "rb");
  if (in == nullptr) {
    std::perror(argv[2]);
    return 1;
  }
  std::vector<float> xs;
  float buffer[4096];
  std::size_t got;
  while ((got = std::fread(buffer, sizeof(float), 4096, in)) > 0) xs.insert(xs.end(), buffer, buffer + got);
  std::fclose(in);
  const long n = static_cast<long>(xs.size());
  std::vector<float> out;
  out.reserve(2 * domain->functions->size() * xs.size());
  std::vector<float> ys(xs.size());
  for (const Function& f : *domain->functions) {
    for (long i = 0; i < n; ++i) out.push_back(f.scalar(xs[i]));
    f.simd(xs.data(), ys.data(), n);
    out.insert(out.end(), ys.begin(), ys.end());
  }
  std::FILE* o = std::fopen(argv[3], "wb");
  if (o == nullptr || std::fwrite(out.data(), sizeof(float), out.size(), o) != out.size()) {
    std::perror(argv[3]);
    return 1;
  }
  std::fclose(o);
  return 0;
}
