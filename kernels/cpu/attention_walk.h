/*
 * attention_walk.h - the ISA-independent part of the flash GQA kernels: the
 * prefetching walk over the paged KV (per KV head and page-major over all 8
 * heads) and the constant-group dispatch. Included once by attention_avx2.c and
 * once by attention_avx512.c after each defines its own chunk primitives
 * (kv_off, chunk_scores, chunk_softmax, chunk_values, CHUNK, GMAX) and
 * ATTN_FN(name), which appends the ISA suffix. One copy of the walk, so the two
 * ISAs cannot drift apart; the arithmetic stays in the including file.
 */
#ifndef ATTN_FN
#error "define ATTN_FN(name) and the chunk primitives before including attention_walk.h"
#endif

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

void ATTN_FN(k_flash_gqa_bf16)(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
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

/* Page-major walk: for each page, every KV head in turn, so the page's K and V
 * (64 KB each, contiguous) are consumed together and the next page is
 * prefetched as one sequential stream. Same arithmetic per head as
 * k_flash_gqa_bf16 of the same ISA (chunks never cross a page in either), so the results
 * are bit-identical to calling it per head. */
void ATTN_FN(k_flash_rows_bf16)(const float *q, size_t group, const kipp_bf16 *kc,
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
            _mm_prefetch(fk + o, _MM_HINT_T0);
            _mm_prefetch(fv + o, _MM_HINT_T0);
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
