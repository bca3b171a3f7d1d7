/* elementwise_avx2.c - kernels/cpu/elementwise_simd.h compiled for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/elementwise_simd.h"
