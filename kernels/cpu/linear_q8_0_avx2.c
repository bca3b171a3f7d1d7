/* linear_q8_0_avx2.c - kernels/cpu/linear_q8_0_simd.h (q8_0 matvec and matmul, the Q8 activation quantizer) for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/linear_q8_0_simd.h"
