// InfoNCE tile kernels compiled for AVX-512 (F + DQ), selected at run time with the evidential ones.
#include "tile_isa.h"
#if EO_X86_ISA_VARIANTS
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#define EO_ISA avx512
#include "infonce_tiles.h"
#endif
