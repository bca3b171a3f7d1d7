/* linear_q4_1_avx2.c - kernels/cpu/linear_q4_1_simd.h (q4_1 matvec and matmul) for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/linear_q4_1_simd.h"
