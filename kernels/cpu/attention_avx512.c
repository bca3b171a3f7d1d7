/*
 * attention_avx512.c - flash GQA attention partial over the paged BF16 KV for
 * AVX-512 (kernels.h; Dao et al. 2022 online softmax, split-K as in flash
 * decoding).
 *
 * Positions are taken in chunks of up to 16 inside one 32-position page. Per
 * chunk: every K row is widened once and dotted with all `group` query heads
 * (group accumulators in registers), the online-softmax state is updated once
 * per chunk with a vector exp, and every V row is widened once and FMA'd into
 * all group accumulators. So the heads of a group share each K/V load.
 *
 * Accuracy vs k_flash_gqa_bf16_ref: same products, different summation order
 * and a polynomial exp (~2 ulp), and the max is taken per chunk instead of
 * per position (mathematically identical): NMSE ~1e-12 on acc/l.
 */
#include <math.h>

#include "kernels/cpu/kernels_isa.h"
#include "kernels/cpu/vmath_avx512.h"

#include "kernels/cpu/attention_common.h"

/* s[g][j] = scale * q_g . k_j for j < n, g < G (G <= GMAX); rows at kbase + j*stride. */
static inline __attribute__((always_inline)) void chunk_scores(const float *q, size_t G, const kipp_bf16 *kbase, size_t n, float scale,
                         float s[GMAX][CHUNK])
{
    const size_t stride = KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    for (size_t j = 0; j < n; j++) {
        const kipp_bf16 *kr = kbase + j * stride;
        __m512 a[GMAX];
#pragma GCC unroll 8
        for (size_t g = 0; g < GMAX; g++) a[g] = _mm512_setzero_ps(); /* all: keeps -Wmaybe-uninitialized quiet */
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += 16) {
            __m512 kv = k_widen16(kr + d);
    #pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
                a[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * KIPP_HEAD_DIM + d), kv, a[g]);
        }
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) s[g][j] = _mm512_reduce_add_ps(a[g]) * scale;
    }
}

/* Online-softmax step for one head: turns s[0..n) into weights e (in place),
 * returns the factor that rescales the old l and acc. */
static float chunk_softmax(float *s, size_t n, float *m, float *l)
{
    float mx = *m;
    for (size_t j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    float corr = expf(*m - mx), sum = 0.0f;
    __mmask16 live = (__mmask16)((1u << n) - 1u); /* n <= 16 */
    __m512 e = k_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s), _mm512_set1_ps(mx)));
    _mm512_mask_storeu_ps(s, live, e);
    size_t j;
    for (j = 0; j < n; j++) sum += s[j];
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}

/* acc[g] = acc[g] * corr[g] + sum_j e[g][j] * v_j over 16-wide slices of the head. */
static inline __attribute__((always_inline)) void chunk_values(float *acc, size_t G, const kipp_bf16 *vbase, size_t n,
                         float e[GMAX][CHUNK], const float *corr)
{
    const size_t stride = KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += 16) {
        __m512 a[GMAX];
        for (size_t g = G; g < GMAX; g++) a[g] = _mm512_setzero_ps(); /* unused lanes, for -Wmaybe-uninitialized */
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
            a[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * KIPP_HEAD_DIM + d), _mm512_set1_ps(corr[g]));
        for (size_t j = 0; j < n; j++) {
            __m512 vv = k_widen16(vbase + j * stride + d);
    #pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(e[g][j]), vv, a[g]);
        }
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) _mm512_storeu_ps(acc + g * KIPP_HEAD_DIM + d, a[g]);
    }
}

#define ATTN_FN(name) name##_avx512
#include "kernels/cpu/attention_walk.h"
