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

std::string checked_choice(const std::string& isa, const char* source) {
  const std::string choice = isa == "best" ? best_isa() : isa;
  if (choice != "generic" && choice != "avx2" && choice != "avx512") {
    throw std::invalid_argument(std::string(source) + " must be 'best', 'generic', 'avx2' or 'avx512', got '" + isa + "'");
  }
  if (!cpu_supports(choice)) {
    throw std::invalid_argument(std::string(source) + ": '" + choice + "' is not built or not supported by this CPU");
  }
  return choice;
}

std::string initial_isa() {
  const char* requested = std::getenv("EO_CPU_ISA");
  // A misspelt variable would otherwise silently benchmark the wrong kernels.
  return requested != nullptr && *requested != '\0' ? checked_choice(requested, "EO_CPU_ISA") : best_isa();
}

// nullptr until the first op or request: EO_CPU_ISA is read then, and a bad value raises on
// every use until it is fixed or a variant is chosen explicitly.
std::atomic<const TileKernels*>& current() {
  static std::atomic<const TileKernels*> kernels{nullptr};
  return kernels;
}

}  // namespace

const TileKernels& active_tile_kernels() {
  const TileKernels* kernels = current().load();
  if (kernels == nullptr) {
    const TileKernels* initial = kernels_for(initial_isa());
    // Another thread may have chosen meanwhile (a request wins over the environment).
    current().compare_exchange_strong(kernels, initial);
    kernels = current().load();
  }
  return *kernels;
}

std::string set_cpu_isa(const std::string& isa) {
  const std::string choice = checked_choice(isa, "isa");
  current().store(kernels_for(choice));
  return choice;
}

std::string cpu_isa(const std::string& request) {
  return request.empty() ? std::string(active_tile_kernels().isa) : set_cpu_isa(request);
}

}  // namespace cpu
}  // namespace evidential_ops
