/*
 * attention_simd.h - flash GQA attention partials over the paged BF16 KV
 * (kernels.h; Dao et al. 2022 online softmax, split-K as in flash decoding),
 * written once over simd_<level>.h and compiled per level by
 * attention_<level>.c: the chunk arithmetic, the prefetching walk over the
 * pages (per KV head, and page-major over all 8 heads) and the constant-group
 * dispatch.
 *
 * Positions are taken in chunks of up to 16 inside one 32-position page. Per
 * chunk: every K row is widened once and dotted with all `group` query heads
 * (group accumulators in registers), the online-softmax state is updated once
 * per chunk with a vector exp, and every V row is widened once and FMA'd into
 * all group accumulators. So the heads of a group share each K/V load.
 *
 * Accuracy vs k_flash_gqa_bf16_ref: same products, another summation order
 * and a polynomial exp (~2 ulp), and the max is taken per chunk instead of
 * per position (mathematically identical): NMSE ~1e-12 on acc/l.
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif

#include <math.h>

/* GCC 12 reports a[] lanes g >= G as maybe-uninitialized in the unrolled
 * constant-G copies although every loop is bounded by G: a false positive. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CHUNK 16u
#define GMAX 8u /* heads per register pass; larger groups run in passes */
#define KV_STRIDE (KIPP_N_KV_HEAD * KIPP_HEAD_DIM) /* elements between positions */

/* Element offset of (position, KV head) in a layer's paged cache. */
static inline size_t kv_off(const uint32_t *bt, uint32_t pos, uint32_t kvh)
{
    return ((size_t)bt[pos / KIPP_KV_BLOCK] * KIPP_KV_BLOCK + pos % KIPP_KV_BLOCK) * KV_STRIDE +
           (size_t)kvh * KIPP_HEAD_DIM;
}

/* P positions' scores against all G heads (P * G <= 8 independent FMA chains,
 * enough to cover the FMA latency; one position per step left only G chains
 * and ran latency-bound). s[g][j0 + i] for i < P. */
static inline __attribute__((always_inline)) void scores_step(const float *q, size_t G, size_t P,
                                                              const kipp_bf16 *kr, size_t j0,
                                                              float scale, float s[GMAX][CHUNK])
{
    vf a[8]; /* index & 7: P * G <= 8 always; the mask only tells the compiler */
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; i++) a[i] = vf_zero();
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += KV_W) {
#pragma GCC unroll 4
        for (size_t i = 0; i < P; i++) {
            vf kv = vf_widen(kr + i * KV_STRIDE + d);
#pragma GCC unroll 8
            for (size_t g = 0; g < G; g++)
                a[(i * G + g) & 7] = vf_fma(vf_load(q + g * KIPP_HEAD_DIM + d), kv, a[(i * G + g) & 7]);
        }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < P; i++)
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) s[g][j0 + i] = vf_hsum(a[(i * G + g) & 7]) * scale;
}

/* s[g][j] = scale * q_g . k_j for j < n, g < G (G <= GMAX); rows at kbase + j*stride. */
static inline __attribute__((always_inline)) void chunk_scores(const float *q, size_t G, const kipp_bf16 *kbase,
                                                               size_t n, float scale, float s[GMAX][CHUNK])
{
    const size_t P = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    size_t j = 0;
    for (; j + P <= n; j += P) scores_step(q, G, P, kbase + j * KV_STRIDE, j, scale, s);
    for (; j < n; j++) scores_step(q, G, 1, kbase + j * KV_STRIDE, j, scale, s);
}

/* Online-softmax step for one head: turns s[0..n) into weights e (in place;
 * s[n..CHUNK) become 0), returns the factor that rescales the old l and acc.
 * Short chunks are padded with -inf, whose exp is exactly 0 (vf_exp). */
static float chunk_softmax(float *s, size_t n, float *m, float *l)
{
    for (size_t j = n; j < CHUNK; j++) s[j] = -INFINITY;
    vf mx_v = vf_load(s);
    for (size_t j = KV_W; j < CHUNK; j += KV_W) mx_v = vf_max(mx_v, vf_load(s + j));
    float mx = vf_hmax(mx_v) > *m ? vf_hmax(mx_v) : *m;
    const vf vm = vf_set1(mx);
    float corr = expf(*m - mx); /* -inf - mx gives 0 */
    vf sum = vf_zero();
    for (size_t j = 0; j < CHUNK; j += KV_W) {
        vf e = vf_exp(vf_sub(vf_load(s + j), vm));
        vf_store(s + j, e);
        sum = vf_add(sum, e);
    }
    *l = *l * corr + vf_hsum(sum);
    *m = mx;
    return corr;
}

/* acc[g] = acc[g] * corr[g] + sum_j e[g][j] * v_j over S KV_W-wide slices of
 * the head at once (S * G <= 8 chains, as in chunk_scores). */
static inline __attribute__((always_inline)) void chunk_values(float *acc, size_t G, const kipp_bf16 *vbase, size_t n,
                                                               float e[GMAX][CHUNK], const float *corr)
{
    const size_t S = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += KV_W * S) {
        vf a[8];
#pragma GCC unroll 8
        for (size_t i = 0; i < 8; i++) a[i] = vf_zero(); /* unused lanes, for -Wmaybe-uninitialized */
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
#pragma GCC unroll 4
            for (size_t t = 0; t < S; t++)
                a[(g * S + t) & 7] = vf_mul(vf_load(acc + g * KIPP_HEAD_DIM + d + KV_W * t), vf_set1(corr[g]));
        for (size_t j = 0; j < n; j++) {
            vf vv[4];
#pragma GCC unroll 4
            for (size_t t = 0; t < S; t++) vv[t] = vf_widen(vbase + j * KV_STRIDE + d + KV_W * t);
#pragma GCC unroll 8
            for (size_t g = 0; g < G; g++) {
                vf eg = vf_set1(e[g][j]);
#pragma GCC unroll 4
                for (size_t t = 0; t < S; t++) a[(g * S + t) & 7] = vf_fma(eg, vv[t], a[(g * S + t) & 7]);
            }
        }
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++)
#pragma GCC unroll 4
            for (size_t t = 0; t < S; t++) vf_store(acc + g * KIPP_HEAD_DIM + d + KV_W * t, a[(g * S + t) & 7]);
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
    for (size_t b = 0; b < KIPP_HEAD_DIM * 2; b += 64) {
        k_prefetch((const char *)(kc + off) + b);
        k_prefetch((const char *)(vc + off) + b);
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
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) acc[g * KIPP_HEAD_DIM + i] = 0.0f;
    }
    uint32_t pf = p0; /* next position to prefetch: the first PF_AHEAD at once, then one per position */
    for (; pf < p1 && pf < p0 + PF_AHEAD; pf++) prefetch_pos(kc, vc, kvh, bt, pf);
    for (uint32_t p = p0; p < p1;) {
        uint32_t in_page = KIPP_KV_BLOCK - p % KIPP_KV_BLOCK, n = p1 - p;
        n = n < in_page ? n : in_page;
        n = n < CHUNK ? n : CHUNK;
        for (uint32_t i = 0; i < n && pf < p1; i++, pf++) prefetch_pos(kc, vc, kvh, bt, pf);
        chunk_step(q, G, kc, vc, kvh, bt, p, n, scale, m, l, acc);
        p += n;
    }
}

void K_SFX(k_flash_gqa_bf16)(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                               uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                           float scale, float *m, float *l, float *acc)
{
    for (size_t g0 = 0; g0 < group; g0 += GMAX) {
        size_t G = group - g0 < GMAX ? group - g0 : GMAX;
        const float *qg = q + g0 * KIPP_HEAD_DIM;
        float *mg = m + g0, *lg = l + g0, *ag = acc + g0 * KIPP_HEAD_DIM;
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

/* ---- all KV heads, page by page (k_flash_rows_bf16) ---- */

#define SLICE_BYTES (KIPP_KV_BLOCK * KIPP_HEAD_DIM * 2u) /* 1/8 of a page's K (or V): 8 KB */

/* Positions [a, b) of one page for head group G of KV head kvh, continuing the
 * state; while it computes, it prefetches the 8 KB at pk and at pv (this
 * head's eighth of the next page, contiguous), spread over its chunks. */
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
                k_prefetch(pk + o);
                k_prefetch(pv + o);
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

/* Page-major walk: for each page, every KV head in turn, so the page's K and V
 * (64 KB each, contiguous) are consumed together and the next page is
 * prefetched as one sequential stream. Same arithmetic per head as
 * k_flash_gqa_bf16 of the same ISA (chunks never cross a page in either), so the results
 * are bit-identical to calling it per head. */
void K_SFX(k_flash_rows_bf16)(const float *q, size_t group, const kipp_bf16 *kc,
                            const kipp_bf16 *vc, const uint32_t *block_table, uint32_t p0,
                            uint32_t p1, float scale, float *m, float *l, float *acc)
{
    const size_t H = KIPP_N_KV_HEAD * group, page = (size_t)KIPP_KV_BLOCK * KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    for (size_t h = 0; h < H; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) acc[h * KIPP_HEAD_DIM + i] = 0.0f;
    }
    { /* the first page has no predecessor to prefetch it: fetch it now, whole */
        const char *fk = (const char *)(kc + block_table[p0 / KIPP_KV_BLOCK] * page);
        const char *fv = (const char *)(vc + block_table[p0 / KIPP_KV_BLOCK] * page);
        for (size_t o = 0; o < page * 2; o += 64) {
            k_prefetch(fk + o);
            k_prefetch(fv + o);
        }
    }
    for (uint32_t a = p0; a < p1;) {
        uint32_t b = (a / KIPP_KV_BLOCK + 1) * KIPP_KV_BLOCK;
        b = b < p1 ? b : p1;
        const char *nk = NULL, *nv = NULL; /* the next page, when there is one */
        if (b < p1) {
            nk = (const char *)(kc + block_table[b / KIPP_KV_BLOCK] * page);
            nv = (const char *)(vc + block_table[b / KIPP_KV_BLOCK] * page);
        }
        for (uint32_t kvh = 0; kvh < KIPP_N_KV_HEAD; kvh++)
            for (size_t g0 = 0; g0 < group; g0 += GMAX) {
                size_t G = group - g0 < GMAX ? group - g0 : GMAX, h0 = kvh * group + g0;
                int pf = nk && g0 == 0;
                seg_any(q + h0 * KIPP_HEAD_DIM, G, kc, vc, kvh, block_table, a, b, scale, m + h0, l + h0,
                        acc + h0 * KIPP_HEAD_DIM, pf ? nk + kvh * SLICE_BYTES : NULL,
                        pf ? nv + kvh * SLICE_BYTES : NULL);
            }
        a = b;
    }
}
