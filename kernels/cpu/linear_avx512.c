/* linear_avx512.c - kernels/cpu/linear_simd.h (bf16 matvec, FP32-FMA matmul) compiled for the avx512 level. */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/linear_simd.h"
