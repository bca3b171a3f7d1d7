/* linear_q8_0_avx512.c - kernels/cpu/linear_q8_0_simd.h (q8_0 matvec and matmul) for the avx512 level (BW: vpmaddubsw at 512 bits). */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/linear_q8_0_simd.h"
