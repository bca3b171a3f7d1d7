/*
 * attention_simd.h - flash GQA attention walks over the paged BF16 KV
 * (kernels.h; Dao et al. 2022 online softmax), written once over
 * simd_<level>.h and compiled per level by attention_<level>.c: the chunk
 * arithmetic, the prefetching walks over the pages (chunk-major for many
 * query vectors of one KV head, page-major over a range of KV heads) and the
 * constant-group dispatch.
 *
 * Positions are taken in aligned chunks: [16c, 16c + 16) cut to [p0, p1)
 * (K_ATTN_CHUNK). The kernels continue the state they are given, so a walk
 * over [0, P) split at multiples of 16 is bitwise the same walk: that is what
 * makes a token's attention independent of the round it is computed in
 * (decode, prefill tile, batch; kernels.h "row invariance"). Per chunk: every K row is widened once and dotted with all `group` query heads
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

#define CHUNK K_ATTN_CHUNK
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

/* Positions in the aligned chunk at p, cut to p1. */
static inline uint32_t chunk_len(uint32_t p, uint32_t p1)
{
    uint32_t n = CHUNK - p % CHUNK;
    return p1 - p < n ? p1 - p : n;
}

/* chunk_step with a constant head count, so the accumulators stay in registers. */
static void step_any(const float *q, size_t G, const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
                     const uint32_t *bt, uint32_t p, uint32_t n, float scale, float *m, float *l, float *acc)
{
    switch (G) {
    case 1: chunk_step(q, 1, kc, vc, kvh, bt, p, n, scale, m, l, acc); break;
    case 2: chunk_step(q, 2, kc, vc, kvh, bt, p, n, scale, m, l, acc); break;
    case 4: chunk_step(q, 4, kc, vc, kvh, bt, p, n, scale, m, l, acc); break;
    case 8: chunk_step(q, 8, kc, vc, kvh, bt, p, n, scale, m, l, acc); break;
    default: chunk_step(q, G, kc, vc, kvh, bt, p, n, scale, m, l, acc); break;
    }
}

/* Chunk-major: each chunk's K and V rows (16 x 256 B each) are loaded from
 * DRAM once and stay in L1 while every pass of GMAX query heads uses them, so
 * a prefill tile of many queries reads its prefix once (issue 16 item 4). */
void K_SFX(k_flash_gqa_bf16)(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                             uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                             float scale, float *m, float *l, float *acc)
{
    uint32_t pf = p0; /* next position to prefetch: the first PF_AHEAD at once, then one per position */
    for (; pf < p1 && pf < p0 + PF_AHEAD; pf++) prefetch_pos(kc, vc, kvh, block_table, pf);
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = chunk_len(p, p1);
        for (uint32_t i = 0; i < n && pf < p1; i++, pf++) prefetch_pos(kc, vc, kvh, block_table, pf);
        for (size_t g0 = 0; g0 < group; g0 += GMAX) {
            size_t G = group - g0 < GMAX ? group - g0 : GMAX;
            step_any(q + g0 * KIPP_HEAD_DIM, G, kc, vc, kvh, block_table, p, n, scale, m + g0, l + g0,
                     acc + g0 * KIPP_HEAD_DIM);
        }
        p += n;
    }
}

/* ---- KV heads [kvh0, kvh1), page by page (k_flash_rows_bf16) ---- */

/* Positions [a, b) of one page for head group G of KV head kvh, continuing the
 * state; while it computes, it prefetches this head's rows of the next page
 * (from position nxt; none when nxt == UINT32_MAX), spread over its chunks. */
static void seg_pass(const float *q, size_t G, const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
                     const uint32_t *bt, uint32_t a, uint32_t b, float scale, float *m, float *l, float *acc,
                     uint32_t nxt, uint32_t nxt_end)
{
    uint32_t n_chunks = 0, c = 0, span = nxt == UINT32_MAX ? 0 : nxt_end - nxt;
    for (uint32_t p = a; p < b; p += chunk_len(p, b)) n_chunks++;
    for (uint32_t p = a; p < b; c++) {
        uint32_t n = chunk_len(p, b);
        for (uint32_t j = span * c / n_chunks; j < span * (c + 1) / n_chunks; j++) prefetch_pos(kc, vc, kvh, bt, nxt + j);
        step_any(q, G, kc, vc, kvh, bt, p, n, scale, m, l, acc);
        p += n;
    }
}

/* Page-major walk: for each page, every KV head of the range in turn, so the
 * page's rows are consumed together and the next page is prefetched as one
 * stream. Same chunks and arithmetic per head as k_flash_gqa_bf16 of the same
 * ISA, so the results are bit-identical to calling it per head. */
void K_SFX(k_flash_rows_bf16)(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                              const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0,
                              uint32_t p1, float scale, float *m, float *l, float *acc)
{
    { /* the first page has no predecessor to prefetch it: fetch it now */
        uint32_t e = (p0 / KIPP_KV_BLOCK + 1) * KIPP_KV_BLOCK;
        for (uint32_t p = p0; p < p1 && p < e; p++)
            for (uint32_t kvh = kvh0; kvh < kvh1; kvh++) prefetch_pos(kc, vc, kvh, block_table, p);
    }
    for (uint32_t a = p0; a < p1;) {
        uint32_t b = (a / KIPP_KV_BLOCK + 1) * KIPP_KV_BLOCK;
        b = b < p1 ? b : p1;
        uint32_t nxt = b < p1 ? b : UINT32_MAX, nxt_end = b + KIPP_KV_BLOCK < p1 ? b + KIPP_KV_BLOCK : p1;
        for (uint32_t kvh = kvh0; kvh < kvh1; kvh++)
            for (size_t g0 = 0; g0 < group; g0 += GMAX) {
                size_t G = group - g0 < GMAX ? group - g0 : GMAX, h0 = kvh * group + g0;
                seg_pass(q + h0 * KIPP_HEAD_DIM, G, kc, vc, kvh, block_table, a, b, scale, m + h0, l + h0,
                         acc + h0 * KIPP_HEAD_DIM, g0 == 0 ? nxt : UINT32_MAX, nxt_end);
            }
        a = b;
    }
}
