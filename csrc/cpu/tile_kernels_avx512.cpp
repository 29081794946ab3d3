// Tile kernels compiled for AVX-512 (F + DQ: 64-bit integer <-> double lanes), selected at run time.
#include "tile_isa.h"
#if EO_X86_ISA_VARIANTS
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#define EO_ISA avx512
#include "tile_kernels.h"
#endif
