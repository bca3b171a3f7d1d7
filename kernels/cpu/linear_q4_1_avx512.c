/* linear_q4_1_avx512.c - kernels/cpu/linear_q4_1_simd.h (q4_1 matvec and matmul) for the avx512 level (BW: vpmaddubsw at 512 bits). */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/linear_q4_1_simd.h"
