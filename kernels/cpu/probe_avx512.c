/* probe_avx512.c - kernels/cpu/probe_simd.h (read bandwidth, FP32 FMA peak) compiled for the avx512
 * level with 30 FMA chains (the BF16 and int8 dot peaks are in probe_avx512_bf16.c). */
#include "kernels/cpu/simd_avx512.h"

#define K_PROBE_CHAINS 30
#include "kernels/cpu/probe_simd.h"
