// Entry point of each test_kernels_<isa> binary. Compiled WITHOUT the variant's -m flags: the
// compiler may use AVX instructions anywhere in a translation unit built with -mavx2, so the CPU
// check has to run from code that cannot itself fault with SIGILL on an older CPU. ctest maps
// exit code 77 to "skipped" (SKIP_RETURN_CODE in CMakeLists.txt).
#include <cstdio>

// The variant's entry point (test_kernels.cpp's by default; EO_TEST_ENTRY names another).
#ifndef EO_TEST_ENTRY
#define EO_TEST_ENTRY run_kernel_tests
#endif
int EO_TEST_ENTRY(int argc, char** argv);  // built for the variant's ISA

namespace {

constexpr int kSkip = 77;

#if !defined(EO_TEST_NEEDS)
#define EO_TEST_NEEDS 0
#endif

// 0: baseline, 1: AVX2 + FMA, 2: AVX-512 F + DQ (+ FMA): the same tests as tile_isa.cpp's cpu_supports.
bool cpu_can_run(const char** missing) {
#if EO_TEST_NEEDS != 0 && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init();
#if EO_TEST_NEEDS == 1
  *missing = "avx2+fma";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  *missing = "avx512f+avx512dq+fma";
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#endif
#else
  (void)missing;
  return true;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const char* missing = "";
  if (!cpu_can_run(&missing)) {
    std::printf("SKIPPED: this CPU lacks %s, which this test binary was compiled for\n", missing);
    return kSkip;
  }
  return EO_TEST_ENTRY(argc, argv);
}
