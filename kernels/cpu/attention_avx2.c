/* attention_avx2.c - kernels/cpu/attention_simd.h (flash GQA over the paged BF16 KV) and attention_q8_simd.h (over the q8_0 KV) compiled for the avx2 level. */
#include "kernels/cpu/simd_avx2.h"

#include "kernels/cpu/attention_simd.h"

#include "kernels/cpu/attention_q8_simd.h"
