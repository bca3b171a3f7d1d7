/*
 * attention_common.h - constants and addressing shared by the SIMD flash GQA
 * kernels (attention_avx2.c, attention_avx512.c): chunk and register-pass
 * sizes, and the paged KV offset of (position, KV head):
 * block_table[pos >> 5] * 32 + (pos & 31) rows of [8][128] bf16 (kernels.h).
 */
#ifndef KIPP_ATTENTION_COMMON_H
#define KIPP_ATTENTION_COMMON_H

#include "kernels/cpu/kernels.h"

/* GCC 12 reports a[] lanes g >= G as maybe-uninitialized in the unrolled
 * constant-G copies although every loop is bounded by G: a false positive. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CHUNK 16u
#define GMAX 8u /* heads per register pass; larger groups run in passes */

static inline size_t kv_off(const uint32_t *bt, uint32_t pos, uint32_t kvh)
{
    return ((size_t)bt[pos / KIPP_KV_BLOCK] * KIPP_KV_BLOCK + pos % KIPP_KV_BLOCK) * KIPP_N_KV_HEAD * KIPP_HEAD_DIM +
           (size_t)kvh * KIPP_HEAD_DIM;
}

#endif
