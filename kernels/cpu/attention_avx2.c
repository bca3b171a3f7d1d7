/* attention_avx2.c - kernels/cpu/attention_simd.h (flash GQA over the paged KV) compiled for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/attention_simd.h"
