/* attention_avx512.c - kernels/cpu/attention_simd.h (flash GQA over the paged KV) compiled for the avx512 level. */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/attention_simd.h"
