// InfoNCE tile kernels compiled for AVX2 + FMA, selected at run time with the evidential ones.
#include "tile_isa.h"
#if EO_X86_ISA_VARIANTS
#pragma GCC target("avx2,fma")
#define EO_ISA avx2
#include "infonce_tiles.h"
#endif
