/* linear_affine4_avx2.c - kernels/cpu/linear_affine4_simd.h (affine4 matvec and matmul) for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/linear_affine4_simd.h"
