// Which instruction-set variants of the tile kernels exist, and choosing one at run time.
#pragma once

#include <string>

#include "tile_args.h"

// The AVX2/AVX-512 variants need GCC's `#pragma GCC target` on x86-64; elsewhere only the
// baseline variant is built (and is still vectorised for the target's own SIMD width).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EO_X86_ISA_VARIANTS 1
#else
#define EO_X86_ISA_VARIANTS 0
#endif

namespace evidential_ops {
namespace generic {
cpu::TileKernels tile_kernels();
}
#if EO_X86_ISA_VARIANTS
namespace avx2 {
cpu::TileKernels tile_kernels();
}
namespace avx512 {
cpu::TileKernels tile_kernels();
}
#endif

namespace cpu {

// The variant in use: the best the CPU supports, or EO_CPU_ISA=generic|avx2|avx512|best if set
// (std::invalid_argument for any other value, or a variant this CPU cannot run). The table is
// immutable and outlives the program: an op takes it once and uses it throughout.
const TileKernels& active_tile_kernels();

// Switch variant ("best" = the default choice); returns the name now active. Raises for a
// variant that was not built or that this CPU cannot run.
std::string set_cpu_isa(const std::string& isa);

// "" reports the active variant, anything else is set_cpu_isa (evidential_ops._C.cpu_isa).
std::string cpu_isa(const std::string& request);

}  // namespace cpu
}  // namespace evidential_ops
