// Tile kernels for the baseline instruction set of the build target (SSE2 on x86-64, NEON on arm64).
#define EO_ISA generic
#include "tile_kernels.h"
