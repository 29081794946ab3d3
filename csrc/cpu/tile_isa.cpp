#include "tile_isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

namespace evidential_ops {
namespace cpu {
namespace {

bool cpu_supports(const std::string& isa) {
  if (isa == "generic") return true;
#if EO_X86_ISA_VARIANTS
  __builtin_cpu_init();
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx512") return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
#endif
  return false;
}

// One immutable table per variant: switching variant swaps a pointer, so an op that has taken
// the table keeps a consistent set of kernels even if another thread switches meanwhile.
const TileKernels* kernels_for(const std::string& isa) {
#if EO_X86_ISA_VARIANTS
  static const TileKernels kAvx512 = avx512::tile_kernels();
  static const TileKernels kAvx2 = avx2::tile_kernels();
  if (isa == "avx512") return &kAvx512;
  if (isa == "avx2") return &kAvx2;
#endif
  static const TileKernels kGeneric = generic::tile_kernels();
  return &kGeneric;
}

std::string best_isa() {
  for (const char* isa : {"avx512", "avx2"}) {
    if (cpu_supports(isa)) return isa;
  }
  return "generic";
}

std::string initial_isa() {
  const char* requested = std::getenv("EO_CPU_ISA");
  if (requested != nullptr && cpu_supports(requested)) return requested;
  return best_isa();
}

std::atomic<const TileKernels*>& current() {
  static std::atomic<const TileKernels*> kernels{kernels_for(initial_isa())};
  return kernels;
}

}  // namespace

const TileKernels& active_tile_kernels() { return *current().load(); }

std::string set_cpu_isa(const std::string& isa) {
  const std::string choice = isa == "best" ? best_isa() : isa;
  if (choice != "generic" && choice != "avx2" && choice != "avx512") {
    throw std::invalid_argument("isa must be 'best', 'generic', 'avx2' or 'avx512', got '" + isa + "'");
  }
  if (!cpu_supports(choice)) {
    throw std::invalid_argument("isa '" + choice + "' is not built or not supported by this CPU");
  }
  current().store(kernels_for(choice));
  return choice;
}

}  // namespace cpu
}  // namespace evidential_ops
