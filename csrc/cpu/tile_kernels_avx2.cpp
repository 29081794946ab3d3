// Tile kernels compiled for AVX2 + FMA, selected at run time on CPUs that have them.
#include "tile_isa.h"
#if EO_X86_ISA_VARIANTS
#pragma GCC target("avx2,fma")
#define EO_ISA avx2
#include "tile_kernels.h"
#endif
