// Time per element of the per-element special functions of csrc/kernels/element_terms.h: the
// float64 element_forward/element_backward against their float32 forms element_forward_f32/
// element_backward_f32 (every term enabled), each inside an `omp simd` loop like the tile kernels,
// for this build's instruction-set variant; and the float32 forms again with the elements grouped
// by argument class (polygammas_of_class), with the cost of that grouping done by a counting sort. Run by bench/float32_element_cost.py, which writes
// bench/results/float32_element_cost.md. Arguments: none. Output: one line per loop,
// "name ns_per_element".
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/element_terms.h"

#ifndef EO_ISA
#error "EO_ISA must name the variant (generic, avx2, avx512)"
#endif
#define EO_NOINLINE __attribute__((noinline))

namespace kn = evidential_ops::EO_ISA;

namespace {

// The four outputs are summed into one so that none of them is dead code.
EO_NOINLINE void forward_f64(const double* a, double* out, long n) {
#pragma omp simd
  for (long j = 0; j < n; ++j) {
    const kn::ElementForward f = kn::element_forward<true, true, true>(a[j]);
    out[j] = f.kl_h + f.fisher + f.log_trigamma + f.remainder;
  }
}

EO_NOINLINE void forward_f32(const float* a, float* out, long n) {
#pragma omp simd
  for (long j = 0; j < n; ++j) {
    const kn::ElementForwardF32 f = kn::element_forward_f32<true, true, true>(a[j]);
    out[j] = f.kl_h_plus_one + f.x_trigamma + f.log_trigamma + f.remainder;
  }
}

EO_NOINLINE void backward_f64(const double* a, double* out, long n) {
#pragma omp simd
  for (long j = 0; j < n; ++j) {
    const kn::ElementBackward f = kn::element_backward<true, true, true>(a[j]);
    out[j] = f.kl_v + f.fisher_slope + f.logdet_ratio + f.logdet_r_prime;
  }
}

EO_NOINLINE void backward_f32(const float* a, float* out, long n) {
#pragma omp simd
  for (long j = 0; j < n; ++j) {
    const kn::ElementBackwardF32 f = kn::element_backward_f32<true, true, true>(a[j]);
    out[j] = f.kl_v + f.fisher_slope + f.logdet_ratio + f.logdet_r_prime;
  }
}

// The same float32 functions with every lane of a loop in one argument class (the fit or the
// series known at compile time: one branch evaluated, not both). `a`
// holds the α grouped by class, class k at [begin[k], begin[k + 1]).
template <int kClass>
void forward_f32_class(const float* a, float* out, const long* begin) {
#pragma omp simd
  for (long j = begin[kClass]; j < begin[kClass + 1]; ++j) {
    const kn::ElementForwardF32 f =
        kn::element_forward_f32<true, true, true>(a[j], kn::polygammas_of_class<kClass>(a[j]));
    out[j] = f.kl_h_plus_one + f.x_trigamma + f.log_trigamma + f.remainder;
  }
}

template <int kClass>
void backward_f32_class(const float* a, float* out, const long* begin) {
#pragma omp simd
  for (long j = begin[kClass]; j < begin[kClass + 1]; ++j) {
    const kn::ElementBackwardF32 f =
        kn::element_backward_f32<true, true, true>(a[j], kn::polygammas_of_class<kClass>(a[j]));
    out[j] = f.kl_v + f.fisher_slope + f.logdet_ratio + f.logdet_r_prime;
  }
}

EO_NOINLINE void forward_f32_by_class(const float* a, float* out, const long* begin) {
  forward_f32_class<0>(a, out, begin);
  forward_f32_class<kn::kSeriesClass>(a, out, begin);
}

EO_NOINLINE void backward_f32_by_class(const float* a, float* out, const long* begin) {
  backward_f32_class<0>(a, out, begin);
  backward_f32_class<kn::kSeriesClass>(a, out, begin);
}

// What grouping costs when done plainly: a counting sort of the α by class (scalar code).
EO_NOINLINE void group_by_class(const float* a, float* grouped, int* order, long* begin, long n) {
  long count[kn::kArgumentClasses] = {};
  for (long j = 0; j < n; ++j) ++count[kn::argument_class(a[j])];
  begin[0] = 0;
  for (int k = 0; k < kn::kArgumentClasses; ++k) begin[k + 1] = begin[k] + count[k];
  long next[kn::kArgumentClasses];
  for (int k = 0; k < kn::kArgumentClasses; ++k) next[k] = begin[k];
  for (long j = 0; j < n; ++j) {
    const long m = next[kn::argument_class(a[j])]++;
    grouped[m] = a[j];
    order[m] = static_cast<int>(j);
  }
}

// Fastest of `rounds` runs (the machine is shared: the minimum is the least disturbed one).
template <typename F>
double ns_per_element(F run, long n, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = dt < best ? dt : best;
  }
  return best / static_cast<double>(n) * 1e9;
}

}  // namespace

int run_element_cost(int, char**) {
  // α log-uniform on [1, 1e9]: the fitted branch (α < 8) and the series branch, as in a row with
  // moderate negatives and near-duplicate positives (SIMD evaluates both branches anyway).
  const long n = 4096;
  std::vector<double> a64(n), o64(n);
  std::vector<float> a32(n), o32(n);
  for (long j = 0; j < n; ++j) {
    a32[j] = static_cast<float>(std::exp(9.0 * std::log(10.0) * ((j * 2654435761u) % n) / n));
    a64[j] = a32[j];
  }
  const int rounds = 400;
  std::printf("forward_f64 %.3f\n", ns_per_element([&] { forward_f64(a64.data(), o64.data(), n); }, n, rounds));
  std::printf("forward_f32 %.3f\n", ns_per_element([&] { forward_f32(a32.data(), o32.data(), n); }, n, rounds));
  std::printf("backward_f64 %.3f\n", ns_per_element([&] { backward_f64(a64.data(), o64.data(), n); }, n, rounds));
  std::printf("backward_f32 %.3f\n", ns_per_element([&] { backward_f32(a32.data(), o32.data(), n); }, n, rounds));
  std::vector<float> grouped(n);
  std::vector<int> order(n);
  long begin[kn::kArgumentClasses + 1];
  std::printf("group_by_class %.3f\n", ns_per_element([&] {
    group_by_class(a32.data(), grouped.data(), order.data(), begin, n);
  }, n, rounds));
  std::printf("forward_f32_by_class %.3f\n",
              ns_per_element([&] { forward_f32_by_class(grouped.data(), o32.data(), begin); }, n, rounds));
  std::printf("backward_f32_by_class %.3f\n",
              ns_per_element([&] { backward_f32_by_class(grouped.data(), o32.data(), begin); }, n, rounds));
  return 0;
}
