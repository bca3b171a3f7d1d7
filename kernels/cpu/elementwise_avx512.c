/* elementwise_avx512.c - kernels/cpu/elementwise_simd.h compiled for the avx512 level. */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/elementwise_simd.h"
