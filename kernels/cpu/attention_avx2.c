/*
 * attention_avx2.c - flash GQA attention partial over the paged BF16 KV for
 * AVX2 + FMA (kernels.h; Dao et al. 2022 online softmax, split-K as in flash
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
#include "kernels/cpu/vmath_avx2.h"

#include "kernels/cpu/attention_common.h"

/* P positions' scores against all G heads (P * G <= 8 independent FMA chains,
 * enough to cover the FMA latency; one position per step left only G chains
 * and ran latency-bound). s[g][j0 + i] for i < P. */
static inline __attribute__((always_inline)) void scores_step(const float *q, size_t G, size_t P,
                                                              const kipp_bf16 *kr, size_t j0,
                                                              float scale, float s[GMAX][CHUNK])
{
    const size_t stride = KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    __m256 a[8]; /* index & 7: P * G <= 8 always; the mask only tells the compiler */
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += 8) {
#pragma GCC unroll 4
        for (size_t i = 0; i < P; i++) {
            __m256 kv = k_widen8(kr + i * stride + d);
#pragma GCC unroll 8
            for (size_t g = 0; g < G; g++)
                a[(i * G + g) & 7] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * KIPP_HEAD_DIM + d), kv, a[(i * G + g) & 7]);
        }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < P; i++)
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) s[g][j0 + i] = k_hsum8(a[(i * G + g) & 7]) * scale;
}

/* s[g][j] = scale * q_g . k_j for j < n, g < G (G <= GMAX); rows at kbase + j*stride. */
static inline __attribute__((always_inline)) void chunk_scores(const float *q, size_t G, const kipp_bf16 *kbase, size_t n, float scale,
                         float s[GMAX][CHUNK])
{
    const size_t stride = KIPP_N_KV_HEAD * KIPP_HEAD_DIM, P = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    size_t j = 0;
    for (; j + P <= n; j += P) scores_step(q, G, P, kbase + j * stride, j, scale, s);
    for (; j < n; j++) scores_step(q, G, 1, kbase + j * stride, j, scale, s);
}

/* Online-softmax step for one head: turns s[0..n) into weights e (in place),
 * returns the factor that rescales the old l and acc. */
static float chunk_softmax(float *s, size_t n, float *m, float *l)
{
    if (n == CHUNK) { /* full chunk: max, exp and sum in two vectors, no scalar chains */
        __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8), t = _mm256_max_ps(a, b);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float mx = _mm_cvtss_f32(h) > *m ? _mm_cvtss_f32(h) : *m;
        const __m256 vm = _mm256_set1_ps(mx);
        float corr = _mm256_cvtss_f32(k_exp8(_mm256_set1_ps(*m - mx))); /* -inf - mx gives 0 */
        a = k_exp8(_mm256_sub_ps(a, vm));
        b = k_exp8(_mm256_sub_ps(b, vm));
        _mm256_storeu_ps(s, a);
        _mm256_storeu_ps(s + 8, b);
        *l = *l * corr + k_hsum8(_mm256_add_ps(a, b));
        *m = mx;
        return corr;
    }
    float mx = *m;
    for (size_t j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    float corr = expf(*m - mx), sum = 0.0f;
    const __m256 vm = _mm256_set1_ps(mx);
    size_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, k_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
    for (; j < n; j++) s[j] = expf(s[j] - mx);
    for (j = 0; j < n; j++) sum += s[j];
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}

/* acc[g] = acc[g] * corr[g] + sum_j e[g][j] * v_j over S 8-wide slices of
 * the head at once (S * G <= 8 chains, as in chunk_scores). */
static inline __attribute__((always_inline)) void chunk_values(float *acc, size_t G, const kipp_bf16 *vbase, size_t n,
                         float e[GMAX][CHUNK], const float *corr)
{
    const size_t stride = KIPP_N_KV_HEAD * KIPP_HEAD_DIM, S = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += 8 * S) {
        __m256 a[8];
#pragma GCC unroll 8
        for (size_t i = 0; i < 8; i++) a[i] = _mm256_setzero_ps(); /* unused lanes, for -Wmaybe-uninitialized */
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
#pragma GCC unroll 4
            for (size_t t = 0; t < S; t++)
                a[(g * S + t) & 7] = _mm256_mul_ps(_mm256_loadu_ps(acc + g * KIPP_HEAD_DIM + d + 8 * t), _mm256_set1_ps(corr[g]));
        for (size_t j = 0; j < n; j++) {
            __m256 vv[4];
#pragma GCC unroll 4
            for (size_t t = 0; t < S; t++) vv[t] = k_widen8(vbase + j * stride + d + 8 * t);
#pragma GCC unroll 8
            for (size_t g = 0; g < G; g++) {
                __m256 eg = _mm256_set1_ps(e[g][j]);
#pragma GCC unroll 4
                for (size_t t = 0; t < S; t++) a[(g * S + t) & 7] = _mm256_fmadd_ps(eg, vv[t], a[(g * S + t) & 7]);
            }
        }
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
#pragma GCC unroll 4
            for (size_t t = 0; t < S; t++) _mm256_storeu_ps(acc + g * KIPP_HEAD_DIM + d + 8 * t, a[(g * S + t) & 7]);
    }
}

#define ATTN_FN(name) name##_avx2
#include "kernels/cpu/attention_walk.h"
