/* linear_affine4_avx512.c - kernels/cpu/linear_affine4_simd.h (affine4 matvec and matmul) for the avx512 level (BW: vpmaddubsw at 512 bits). */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/linear_affine4_simd.h"
