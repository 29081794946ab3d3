// InfoNCE tile kernels for the baseline instruction set of the build target.
#define EO_ISA generic
#include "infonce_tiles.h"
