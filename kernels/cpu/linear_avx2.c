/* linear_avx2.c - kernels/cpu/linear_simd.h (bf16 matvec, FP32-FMA matmul) compiled for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/linear_simd.h"
