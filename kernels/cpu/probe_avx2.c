/* probe_avx2.c - kernels/cpu/probe_simd.h (read bandwidth, FP32 FMA peak) compiled for the avx2 level:
 * 12 FMA chains, since the 16 ymm registers must also hold the operands. */
#include "kernels/cpu/simd_avx2.h"

#define K_PROBE_CHAINS 12
#include "kernels/cpu/probe_simd.h"
