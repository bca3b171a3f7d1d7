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

#include "kernels_isa.h"
#include "vmath_avx512.h"

/* GCC 12 reports a[] lanes g >= G as maybe-uninitialized in the unrolled
 * constant-G copies although every loop is bounded by G: a false positive. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CHUNK 16u
#define GMAX 8u /* heads per register pass; larger groups run in passes */

static inline size_t kv_off(const uint32_t *bt, uint32_t pos, uint32_t kvh)
{
    return ((size_t)bt[pos / K_KV_BLOCK] * K_KV_BLOCK + pos % K_KV_BLOCK) * K_N_KV_HEAD * K_HEAD_DIM +
           (size_t)kvh * K_HEAD_DIM;
}

/* s[g][j] = scale * q_g . k_j for j < n, g < G (G <= GMAX); rows at kbase + j*stride. */
static inline __attribute__((always_inline)) void chunk_scores(const float *q, size_t G, const kipp_bf16 *kbase, size_t n, float scale,
                         float s[GMAX][CHUNK])
{
    const size_t stride = K_N_KV_HEAD * K_HEAD_DIM;
    for (size_t j = 0; j < n; j++) {
        const kipp_bf16 *kr = kbase + j * stride;
        __m512 a[GMAX];
#pragma GCC unroll 8
        for (size_t g = 0; g < GMAX; g++) a[g] = _mm512_setzero_ps(); /* all: keeps -Wmaybe-uninitialized quiet */
        for (size_t d = 0; d < K_HEAD_DIM; d += 16) {
            __m512 kv = k_widen16(kr + d);
    #pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
                a[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * K_HEAD_DIM + d), kv, a[g]);
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
    const size_t stride = K_N_KV_HEAD * K_HEAD_DIM;
    for (size_t d = 0; d < K_HEAD_DIM; d += 16) {
        __m512 a[GMAX];
        for (size_t g = G; g < GMAX; g++) a[g] = _mm512_setzero_ps(); /* unused lanes, for -Wmaybe-uninitialized */
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
            a[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * K_HEAD_DIM + d), _mm512_set1_ps(corr[g]));
        for (size_t j = 0; j < n; j++) {
            __m512 vv = k_widen16(vbase + j * stride + d);
    #pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(e[g][j]), vv, a[g]);
        }
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) _mm512_storeu_ps(acc + g * K_HEAD_DIM + d, a[g]);
    }
}

/* K/V rows sit 2 KB apart (8 KV heads interleaved), which defeats the
 * stream prefetchers, so the kernel prefetches itself, PF_AHEAD positions
 * (16 KB of K+V) ahead, one position's K and V rows (8 lines) per position
 * consumed. A steady trickle keeps the miss buffers busy while the chunk
 * computes; the old burst of a whole chunk's 128 lines before each chunk
 * stalled on the miss buffers and then left memory idle during the compute. */
#define PF_AHEAD 32u

static inline void prefetch_pos(const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
                                const uint32_t *bt, uint32_t pos)
{
    size_t off = kv_off(bt, pos, kvh);
    for (size_t b = 0; b < K_HEAD_DIM * 2; b += 64) {
        _mm_prefetch((const char *)(kc + off) + b, _MM_HINT_T0);
        _mm_prefetch((const char *)(vc + off) + b, _MM_HINT_T0);
    }
}

/* Online-softmax update of G heads' state with the n <= CHUNK positions at p
 * (inside one page). */
static inline __attribute__((always_inline)) void chunk_step(const float *q, size_t G, const kipp_bf16 *kc,
                                                             const kipp_bf16 *vc, uint32_t kvh,
                                                             const uint32_t *bt, uint32_t p, uint32_t n,
                                                             float scale, float *m, float *l, float *acc)
{
    float s[GMAX][CHUNK], corr[GMAX];
    size_t off = kv_off(bt, p, kvh);
    chunk_scores(q, G, kc + off, n, scale, s);
#pragma GCC unroll 8
    for (size_t g = 0; g < G; g++) corr[g] = chunk_softmax(s[g], n, &m[g], &l[g]);
    chunk_values(acc, G, vc + off, n, s, corr);
}

static inline __attribute__((always_inline)) void flash_pass(const float *q, size_t G, const kipp_bf16 *kc, const kipp_bf16 *vc,
                       uint32_t kvh, const uint32_t *bt, uint32_t p0, uint32_t p1, float scale,
                       float *m, float *l, float *acc)
{
    for (size_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        for (size_t i = 0; i < K_HEAD_DIM; i++) acc[g * K_HEAD_DIM + i] = 0.0f;
    }
    uint32_t pf = p0; /* next position to prefetch: the first PF_AHEAD at once, then one per position */
    for (; pf < p1 && pf < p0 + PF_AHEAD; pf++) prefetch_pos(kc, vc, kvh, bt, pf);
    for (uint32_t p = p0; p < p1;) {
        uint32_t in_page = K_KV_BLOCK - p % K_KV_BLOCK, n = p1 - p;
        n = n < in_page ? n : in_page;
        n = n < CHUNK ? n : CHUNK;
        for (uint32_t i = 0; i < n && pf < p1; i++, pf++) prefetch_pos(kc, vc, kvh, bt, pf);
        chunk_step(q, G, kc, vc, kvh, bt, p, n, scale, m, l, acc);
        p += n;
    }
}

void k_flash_gqa_bf16_avx512(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                           uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                           float scale, float *m, float *l, float *acc)
{
    for (size_t g0 = 0; g0 < group; g0 += GMAX) {
        size_t G = group - g0 < GMAX ? group - g0 : GMAX;
        const float *qg = q + g0 * K_HEAD_DIM;
        float *mg = m + g0, *lg = l + g0, *ag = acc + g0 * K_HEAD_DIM;
        /* constant group sizes let the compiler keep the accumulators in registers */
        switch (G) {
        case 1: flash_pass(qg, 1, kc, vc, kvh, block_table, p0, p1, scale, mg, lg, ag); break;
        case 2: flash_pass(qg, 2, kc, vc, kvh, block_table, p0, p1, scale, mg, lg, ag); break;
        case 4: flash_pass(qg, 4, kc, vc, kvh, block_table, p0, p1, scale, mg, lg, ag); break;
        case 8: flash_pass(qg, 8, kc, vc, kvh, block_table, p0, p1, scale, mg, lg, ag); break;
        default: flash_pass(qg, G, kc, vc, kvh, block_table, p0, p1, scale, mg, lg, ag); break;
        }
    }
}

/* ---- all KV heads, page by page (k_flash_rows_bf16; as attention_avx2.c) ---- */

#define SLICE_BYTES (K_KV_BLOCK * K_HEAD_DIM * 2u) /* 1/8 of a page's K (or V): 8 KB */

/* Positions [a, b) of one page for head group G of KV head kvh, continuing the
 * state, prefetching this head's contiguous eighth of the next page (pk, pv). */
static inline __attribute__((always_inline)) void
seg_pass(const float *q, size_t G, const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
         const uint32_t *bt, uint32_t a, uint32_t b, float scale, float *m, float *l, float *acc,
         const char *pk, const char *pv)
{
    uint32_t n_chunks = (b - a + CHUNK - 1) / CHUNK, c = 0;
    for (uint32_t p = a; p < b; p += CHUNK, c++) {
        uint32_t n = b - p < CHUNK ? b - p : CHUNK;
        if (pk)
            for (size_t o = SLICE_BYTES * c / n_chunks; o < SLICE_BYTES * (c + 1) / n_chunks; o += 64) {
                _mm_prefetch(pk + o, _MM_HINT_T0);
                _mm_prefetch(pv + o, _MM_HINT_T0);
            }
        chunk_step(q, G, kc, vc, kvh, bt, p, n, scale, m, l, acc);
    }
}

static void seg_any(const float *q, size_t G, const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
                    const uint32_t *bt, uint32_t a, uint32_t b, float scale, float *m, float *l,
                    float *acc, const char *pk, const char *pv)
{
    switch (G) {
    case 1: seg_pass(q, 1, kc, vc, kvh, bt, a, b, scale, m, l, acc, pk, pv); break;
    case 2: seg_pass(q, 2, kc, vc, kvh, bt, a, b, scale, m, l, acc, pk, pv); break;
    case 4: seg_pass(q, 4, kc, vc, kvh, bt, a, b, scale, m, l, acc, pk, pv); break;
    case 8: seg_pass(q, 8, kc, vc, kvh, bt, a, b, scale, m, l, acc, pk, pv); break;
    default: seg_pass(q, G, kc, vc, kvh, bt, a, b, scale, m, l, acc, pk, pv); break;
    }
}

/* Page-major walk over all KV heads, so K and V stream as contiguous pages
 * (the AVX2 twin measured 2x over per-head calls on the AVX2 VM; this copy is
 * checked under SIMDe only, the dev machine has no AVX-512). */
void k_flash_rows_bf16_avx512(const float *q, size_t group, const kipp_bf16 *kc,
                              const kipp_bf16 *vc, const uint32_t *block_table, uint32_t p0,
                              uint32_t p1, float scale, float *m, float *l, float *acc)
{
    const size_t H = K_N_KV_HEAD * group, page = (size_t)K_KV_BLOCK * K_N_KV_HEAD * K_HEAD_DIM;
    for (size_t h = 0; h < H; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        for (size_t i = 0; i < K_HEAD_DIM; i++) acc[h * K_HEAD_DIM + i] = 0.0f;
    }
    { /* the first page has no predecessor to prefetch it: fetch it now, whole */
        const char *fk = (const char *)(kc + block_table[p0 / K_KV_BLOCK] * page);
        const char *fv = (const char *)(vc + block_table[p0 / K_KV_BLOCK] * page);
        for (size_t o = 0; o < page * 2; o += 64) {
            _mm_prefetch(fk + o, _MM_HINT_T0);
            _mm_prefetch(fv + o, _MM_HINT_T0);
        }
    }
    for (uint32_t a = p0; a < p1;) {
        uint32_t b = (a / K_KV_BLOCK + 1) * K_KV_BLOCK;
        b = b < p1 ? b : p1;
        const char *nk = NULL, *nv = NULL; /* the next page, when there is one */
        if (b < p1) {
            nk = (const char *)(kc + block_table[b / K_KV_BLOCK] * page);
            nv = (const char *)(vc + block_table[b / K_KV_BLOCK] * page);
        }
        for (uint32_t kvh = 0; kvh < K_N_KV_HEAD; kvh++)
            for (size_t g0 = 0; g0 < group; g0 += GMAX) {
                size_t G = group - g0 < GMAX ? group - g0 : GMAX, h0 = kvh * group + g0;
                int pf = nk && g0 == 0;
                seg_any(q + h0 * K_HEAD_DIM, G, kc, vc, kvh, block_table, a, b, scale, m + h0, l + h0,
                        acc + h0 * K_HEAD_DIM, pf ? nk + kvh * SLICE_BYTES : NULL,
                        pf ? nv + kvh * SLICE_BYTES : NULL);
            }
        a = b;
    }
}
