/*
 * attention_avx512_bf16.c - the BF16-dot flash GQA walks (kernels.h
 * "flash_gqa_dot"), written by hand because vdpbf16ps exists at this level
 * only (docs/ARCHITECTURE.md "ISA dispatch").
 *
 * The walk is attention_simd.h's (aligned K_ATTN_CHUNK chunks, the online
 * softmax updated once per chunk, the state continued across calls), with
 * both products on vdpbf16ps (16 lanes x one pair, twice the FP32 FMA rate):
 * the scores q . k with q rounded to BF16 (K is BF16 already) and the values
 * sum_j e_j v_j with the softmax weights e rounded to BF16 (V is BF16
 * already). l sums the rounded weights, so acc / l stays a convex
 * combination of V rows. Why this is affordable: on the synthetic 0.6B and
 * 1.7B shapes these two roundings moved the final logits' NMSE against the
 * FP32 ref backend by at most 1.5e-6 (2.74e-5 -> 2.89e-5, 3.01e-5 -> 2.86e-5,
 * 2.31e-5 -> 2.47e-5; 24- and 381-token prompts), inside the 5e-5 contract.
 *
 * A chunk of one KV head is loaded once for all the query vectors of a call
 * (chunk_load): K rows copied as they lie (kr[j][c]: position j's 32-dim
 * block c, 16 pairs), V interleaved by position pairs (vp[i][b] lane d =
 * (v_2i[16b+d], v_2i+1[16b+d])), positions past the chunk's end zero. Score
 * (i, j) is one vdpbf16ps chain over row j's four blocks (lane ell holds the
 * pairs 16c + ell) and vf_hsum's tree over the lanes (lane ell + ell + w, w
 * = 8, 4, 2, 1), the decode walk's arithmetic; 16 of them are reduced at once
 * by REDUCE16 (bitwise 16 vf_hsum). The outputs take one vdpbf16ps per 16
 * dims and 2 positions. Every query vector runs the same instruction sequence
 * whatever the group, tile or call split at chunk multiples, so a token's
 * attention is row-invariant (kernels.h): decode, prefill tiles and batches
 * all call these walks.
 */
#include <math.h>

#include "kernels/cpu/simd_avx512.h"

#define CHUNK K_ATTN_CHUNK
#define KV_STRIDE (KIPP_N_KV_HEAD * KIPP_HEAD_DIM) /* elements between positions */
#define TQ 16u                                     /* query vectors per scores / softmax / values phase (softmax16) */
#define AI inline __attribute__((always_inline))
_Static_assert(CHUNK == 16 && VF_LANES == 16, "a chunk's positions are one vector");

static AI __m512bh as_bh(__m512i v)
{
    __m512bh r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* Under SIMDe each vdpbf16ps is a lane loop; out of line it keeps the
 * emulated build's compile time sane (same arithmetic). */
#ifdef KIPP_SIMDE_EMU
static __attribute__((noinline)) __m512 dp(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, as_bh(a), as_bh(b));
}
#else
static AI __m512 dp(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, as_bh(a), as_bh(b)); }
#endif

/* The 32-bit pair at p in every lane. */
static AI __m512i bcast_pair(const kipp_bf16 *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc + a . (the pair at p in every lane), spelled with the intrinsics
 * (GCC 12 issues a vpbroadcastd and a register vdpbf16ps). An inline-asm
 * vdpbf16ps with an embedded {1to16} broadcast saves that uop but made GCC
 * keep the tile walk's accumulators in memory around each asm statement
 * (a store and a reload per dot), which costs more than the uop saves; the
 * embedded form itself is no faster than the pair when the accumulators stay
 * in registers (docs/PERFORMANCE.md "Kernel design measurements"). */
static AI __m512 dp_bcast(__m512 acc, __m512i a, const kipp_bf16 *p) { return dp(acc, a, bcast_pair(p)); }

/* 16 lanes rounded to BF16 as vcvtneps2bf16 does (k_quant_bf16_ref models it;
 * SIMDe lacks the instruction, so the emulated build takes the model). */
static AI __m256i to_bf16(__m512 x)
{
    __m256i r;
#ifdef KIPP_SIMDE_EMU
    float f[16];
    _mm512_storeu_ps(f, x);
    k_quant_bf16_ref(f, &r, 16);
#else
    __m256bh b = _mm512_cvtneps_pbh(x);
    memcpy(&r, &b, sizeof r);
#endif
    return r;
}

/* One chunk of one KV head, as the dot reads it (8 KB, L1-resident). */
typedef struct {
    __m512i kr[CHUNK][4];      /* [16 positions][4 blocks of 16 pairs] K rows as they lie; j >= n zero */
    __m512i vp[CHUNK / 2][8];  /* [8 position pairs][8 blocks of 16 dims] lane d: (v_2i[d], v_2i+1[d]) */
    vf s[TQ];                  /* one tile block's scores, [query] lanes: positions */
    kipp_bf16 e[TQ][CHUNK];    /* its rounded softmax weights, [query][position] */
    float corr[TQ];            /* exp(m_old - m_new) per query of the block */
} dchunk;

/* Where a walk reads: one KV head of a layer's paged cache. */
typedef struct {
    const kipp_bf16 *kc, *vc; /* layer bases, [position (paged)][8][128] bf16 */
    const uint32_t *bt;       /* block table */
    uint32_t kvh;
} kv_view;

/* Prefetch the rows of heads [kvh0, kvh1) at positions [a, b) of one page
 * of store c (K or V). always_inline: a function of prefetches alone is
 * dropped (simd_avx512.h k_prefetch). */
static AI void prefetch_rows(const kipp_bf16 *c, const uint32_t *bt, uint32_t kvh0, uint32_t kvh1, uint32_t a,
                             uint32_t b)
{
    for (uint32_t j = a; j < b; j++) {
        const char *r = (const char *)(c + k_kv_off(bt, j, kvh0));
        for (size_t o = 0; o < (size_t)(kvh1 - kvh0) * KIPP_HEAD_DIM * 2; o += 64) k_prefetch(r + o);
    }
}

/* Prefetch one KV head's K and V rows at pos. */
static AI void prefetch_pos(const kv_view *v, uint32_t pos)
{
    prefetch_rows(v->kc, v->bt, v->kvh, v->kvh + 1, pos, pos + 1);
    prefetch_rows(v->vc, v->bt, v->kvh, v->kvh + 1, pos, pos + 1);
}

/* Load the chunk's n rows at element offset off into t (layout above) and
 * prefetch the rows [pf, pf_end) of the next chunk. */
static void chunk_load(const kv_view *v, size_t off, uint32_t n, uint32_t pf, uint32_t pf_end, dchunk *t)
{
    for (uint32_t j = pf; j < pf + CHUNK && j < pf_end; j++) prefetch_pos(v, j);
#pragma GCC unroll 16
    for (uint32_t j = 0; j < CHUNK; j++)
#pragma GCC unroll 4
        for (size_t c = 0; c < 4; c++)
            t->kr[j][c] = j < n ? vi_load(v->kc + off + (size_t)j * KV_STRIDE + 32 * c) : _mm512_setzero_si512();
    /* word 2d of block lo = row a's dim d, word 2d + 1 = row b's (d < 16); hi: dims 16..31 */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (uint32_t i = 0; i < CHUNK / 2; i++) {
        const kipp_bf16 *a = v->vc + off + (size_t)(2 * i) * KV_STRIDE, *b = a + KV_STRIDE;
#pragma GCC unroll 4
        for (size_t h = 0; h < 4; h++) {
            __m512i va = 2 * i < n ? vi_load(a + 32 * h) : _mm512_setzero_si512();
            __m512i vb = 2 * i + 1 < n ? vi_load(b + 32 * h) : _mm512_setzero_si512();
            t->vp[i][2 * h] = _mm512_permutex2var_epi16(va, lo, vb);
            t->vp[i][2 * h + 1] = _mm512_permutex2var_epi16(va, hi, vb);
        }
    }
}

/* Lane-wise reduction of 16 vectors: lane i of the result is v[i]'s lanes
 * combined by op in vf_hsum's tree (lane ell with ell + w, w = 8, 4, 2, 1),
 * by shuffles that pair two vectors' halves, so 15 ops reduce all 16. v is
 * overwritten. With add this is bitwise 16 vf_hsum calls. */
#define REDUCE16(v, op)                                                                                         \
    do {                                                                                                        \
        _Pragma("GCC unroll 8") for (int k_ = 0; k_ < 8; k_++)                                                  \
            v[k_] = op(_mm512_shuffle_f32x4(v[2 * k_], v[2 * k_ + 1], 0x44),                                    \
                       _mm512_shuffle_f32x4(v[2 * k_], v[2 * k_ + 1], 0xee));                                   \
        _Pragma("GCC unroll 4") for (int k_ = 0; k_ < 4; k_++)                                                  \
            v[k_] = op(_mm512_shuffle_f32x4(v[2 * k_], v[2 * k_ + 1], 0x88),                                    \
                       _mm512_shuffle_f32x4(v[2 * k_], v[2 * k_ + 1], 0xdd));                                   \
        _Pragma("GCC unroll 2") for (int k_ = 0; k_ < 2; k_++)                                                  \
            v[k_] = op(_mm512_shuffle_ps(v[2 * k_], v[2 * k_ + 1], 0x44),                                       \
                       _mm512_shuffle_ps(v[2 * k_], v[2 * k_ + 1], 0xee));                                      \
        v[0] = op(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xdd));                    \
        /* lane k now holds vector 4(k % 4) + k / 4: back to order */                                           \
        v[0] = _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), v[0]); \
    } while (0)

/* s[i] lane j = scale * q_i . k_j over the chunk's 16 positions for NB = 1
 * or 2 query vectors (stride 128), exactly as rows_scores computes them: per
 * (vector, position) one vdpbf16ps chain over the row's four 32-dim blocks,
 * then vf_hsum's tree, here REDUCE16 over 16 (vector, position) chains at
 * once (16 / NB positions of each vector a pass, NB passes). Reading the
 * rows as they lie needs no broadcast per dot and no transpose per chunk.
 * The transposed form (K by pairs, one chain per lane of 16 positions and
 * the tree added vertically) would spend a vpbroadcastd of q on every dot,
 * and is slower (docs/PERFORMANCE.md "Kernel design measurements"). */
static AI void block_scores(const kipp_bf16 *q, size_t NB, const __m512i (*kr)[4], float scale, vf *s)
{
    const size_t P = CHUNK / NB; /* positions of each vector per REDUCE16 */
    __m512i qv[2][4];
#pragma GCC unroll 2
    for (size_t i = 0; i < NB; i++)
#pragma GCC unroll 4
        for (size_t c = 0; c < 4; c++) qv[i][c] = vi_load(q + i * KIPP_HEAD_DIM + 32 * c);
    vf r[2];
#pragma GCC unroll 2
    for (size_t h = 0; h < NB; h++) {
        vf a[16]; /* [vector][P positions] */
#pragma GCC unroll 16
        for (size_t k = 0; k < 16; k++) a[k] = vf_zero();
#pragma GCC unroll 4
        for (size_t c = 0; c < 4; c++)
#pragma GCC unroll 16
            for (size_t j = 0; j < P; j++) {
                __m512i kv = kr[P * h + j][c];
#pragma GCC unroll 2
                for (size_t i = 0; i < NB; i++) a[i * P + j] = dp(a[i * P + j], kv, qv[i][c]);
            }
        REDUCE16(a, vf_add); /* lane k: vf_hsum(a[k]) */
        r[h] = a[0];
    }
    if (NB == 1) {
        s[0] = vf_mul(r[0], vf_set1(scale));
        return;
    }
    s[0] = vf_mul(_mm512_shuffle_f32x4(r[0], r[1], 0x44), vf_set1(scale)); /* lanes 0-7 of each pass */
    s[1] = vf_mul(_mm512_shuffle_f32x4(r[0], r[1], 0xee), vf_set1(scale));
}

/* Online-softmax step of one query vector over the chunk's n positions:
 * e (BF16) = round(exp(s - m_new)), l = l * corr + sum of the rounded e (in
 * vf_hsum's order), m = m_new; returns corr = exp(m_old - m_new). */
static AI float block_softmax(vf s, uint32_t n, float *m, float *l, kipp_bf16 *e)
{
    __mmask16 live = (__mmask16)((1u << n) - 1u); /* n <= 16; positions >= n score -inf: exp gives 0 */
    s = _mm512_mask_mov_ps(vf_set1(-INFINITY), live, s);
    float cm = vf_hmax(s), mx = cm > *m ? cm : *m;
    float cv[16];
    vf_store(cv, vf_exp(vf_set1(*m - mx))); /* -inf - mx gives 0; vf_exp, not a libm call per chunk */
    float corr = cv[0];
    __m256i eb = to_bf16(vf_exp(vf_sub(s, vf_set1(mx))));
    memcpy(e, &eb, sizeof eb);
    *l = *l * corr + vf_hsum(vf_widen(e));
    *m = mx;
    return corr;
}

/* For each chunk c < w in order: acc_i = acc_i * corr_i + sum_j e_i[j] v_j
 * for NB query vectors from e0 (acc stride 128), DB blocks of 16 dims a
 * pass: one vdpbf16ps chain per lane over each chunk's 8 position pairs in
 * order, the accumulators kept in registers across the window's chunks.
 * corr == 1 skips the multiply (exact either way). */
static AI void block_values(float *acc, size_t NB, const dchunk *t, size_t w, size_t e0)
{
    const size_t DB = NB == 4 ? 4 : 8;
    for (size_t b0 = 0; b0 < 8; b0 += DB) {
        vf a[4][8];
#pragma GCC unroll 4
        for (size_t i = 0; i < NB; i++)
#pragma GCC unroll 8
            for (size_t b = 0; b < DB; b++) a[i][b] = vf_load(acc + i * KIPP_HEAD_DIM + 16 * (b0 + b));
        for (size_t c = 0; c < w; c++) {
            const dchunk *tc = &t[c];
#pragma GCC unroll 4
            for (size_t i = 0; i < NB; i++)
                if (tc->corr[e0 + i] != 1.0f)
#pragma GCC unroll 8
                    for (size_t b = 0; b < DB; b++) a[i][b] = vf_mul(a[i][b], vf_set1(tc->corr[e0 + i]));
#pragma GCC unroll 8
            for (size_t j = 0; j < CHUNK / 2; j++)
#pragma GCC unroll 8
                for (size_t b = 0; b < DB; b++) {
                    __m512i v = tc->vp[j][b0 + b];
                    /* a vpbroadcastd per dot (dp_bcast): broadcasts held in
                     * registers for reuse, GCC hoisted all 32 of a pass and
                     * spilled the accumulators */
#pragma GCC unroll 4
                    for (size_t i = 0; i < NB; i++) a[i][b] = dp_bcast(a[i][b], v, tc->e[e0 + i] + 2 * j);
                }
        }
#pragma GCC unroll 4
        for (size_t i = 0; i < NB; i++)
#pragma GCC unroll 8
            for (size_t b = 0; b < DB; b++) vf_store(acc + i * KIPP_HEAD_DIM + 16 * (b0 + b), a[i][b]);
    }
}

/* block_softmax for nb <= 16 query vectors at once: the maxima, the
 * correction factors and the sums of the rounded weights come out as one
 * vector each (REDUCE16), so the per-vector horizontal steps cost one
 * sixteenth. Bit for bit block_softmax (max is exact in any order; the sum
 * keeps vf_hsum's tree; vf_exp is lane-wise). s[i]: vector i's scores over
 * the chunk's n positions; writes e[i] and corr_out[i] for i < nb only, so
 * the callers' arrays need no padding. */
static void softmax_set(const vf *s, size_t nb, uint32_t n, float *m, float *l, kipp_bf16 (*e)[CHUNK], float *corr_out)
{
    __mmask16 live = (__mmask16)((1u << n) - 1u); /* n <= 16 */
    vf r[16], sv[16];
    for (size_t i = 0; i < 16; i++) {
        sv[i] = i < nb ? _mm512_mask_mov_ps(vf_set1(-INFINITY), live, s[i]) : vf_set1(-INFINITY);
        r[i] = sv[i];
    }
    REDUCE16(r, vf_max);
    float mb[16], lb[16], cb[16]; /* a partial set's state, padded as empty states */
    const int full = nb == 16;
    for (size_t i = 0; i < 16 && !full; i++) {
        mb[i] = i < nb ? m[i] : -INFINITY;
        lb[i] = i < nb ? l[i] : 0.0f;
    }
    vf mo = vf_load(full ? m : mb), lo = vf_load(full ? l : lb);
    vf mx = vf_max(r[0], mo); /* as block_softmax: cm > m ? cm : m */
    vf corr = vf_exp(vf_sub(mo, mx));
    for (size_t i = 0; i < 16; i++) {
        vf mi = _mm512_permutexvar_ps(_mm512_set1_epi32((int)i), mx); /* lane i everywhere */
        __m256i eb = to_bf16(vf_exp(vf_sub(sv[i], mi)));
        if (i < nb) memcpy(e[i], &eb, sizeof eb);
        r[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(eb), 16)); /* vf_widen of eb */
    }
    REDUCE16(r, vf_add);
    vf_store(full ? l : lb, vf_add(vf_mul(lo, corr), r[0]));
    vf_store(full ? m : mb, mx);
    vf_store(full ? corr_out : cb, corr);
    for (size_t i = 0; i < nb && !full; i++) {
        m[i] = mb[i];
        l[i] = lb[i];
        corr_out[i] = cb[i];
    }
}

/* softmax_set over one tile chunk's block of nb <= 16 vectors. */
static void softmax16(dchunk *t, size_t nb, uint32_t n, float *m, float *l)
{
    softmax_set(t->s, nb, n, m, l, t->e, t->corr);
}

/* The window's w chunks for nb <= TQ query vectors (BF16 at q; state at m,
 * l, acc): the scores and softmax of each chunk in order, each phase over
 * all nb vectors so the softmax's dependent chains of different vectors
 * overlap, then the values of all w chunks in one pass per vector block. */
static void tile_window(const kipp_bf16 (*q)[KIPP_HEAD_DIM], size_t nb, dchunk *t, size_t w, const uint32_t *n,
                        float scale, float *m, float *l, float *acc)
{
    size_t i;
    for (size_t c = 0; c < w; c++) {
        for (i = 0; i + 2 <= nb; i += 2) block_scores(q[i], 2, (const __m512i(*)[4])t[c].kr, scale, t[c].s + i);
        if (i < nb) block_scores(q[i], 1, (const __m512i(*)[4])t[c].kr, scale, t[c].s + i);
    }
    for (size_t c = 0; c < w; c++) softmax16(&t[c], nb, n[c], m, l); /* back to back: their reductions overlap */
    for (i = 0; i + 4 <= nb; i += 4) block_values(acc + i * KIPP_HEAD_DIM, 4, t, w, i);
    if (i + 2 <= nb) {
        block_values(acc + i * KIPP_HEAD_DIM, 2, t, w, i);
        i += 2;
    }
    if (i < nb) block_values(acc + i * KIPP_HEAD_DIM, 1, t, w, i);
}

/* ---- few query vectors (decode): the same arithmetic read from the rows as they lie ----
 * Copying and interleaving a chunk costs more than a decode row's two or
 * four query vectors use it for, so below ROW_MAX vectors the walk reads the
 * K and V rows in place. Score (i, j) is block_scores' chain over the
 * row's four 32-dim blocks and vf_hsum's tree over the lanes, bit for bit.
 * The values interleave each row pair as chunk_load does and run
 * block_values' chains. */
#define ROW_MAX 8u

/* s[i] lane j = scale * q_i . k_j for NB <= 2 query vectors over the chunk's n rows at kb; lanes >= n are 0. */
static AI void rows_scores(const kipp_bf16 *q, size_t NB, const kipp_bf16 *kb, uint32_t n, float scale, vf *s)
{
    float sc[2][CHUNK] = {{0}};
    for (uint32_t j = 0; j < n; j++) {
        vf a[2] = {vf_zero(), vf_zero()};
#pragma GCC unroll 4
        for (size_t c = 0; c < 4; c++) {
            __m512i k = vi_load(kb + (size_t)j * KV_STRIDE + 32 * c);
#pragma GCC unroll 2
            for (size_t i = 0; i < NB; i++) a[i] = dp(a[i], k, vi_load(q + i * KIPP_HEAD_DIM + 32 * c));
        }
#pragma GCC unroll 2
        for (size_t i = 0; i < NB; i++) sc[i][j] = vf_hsum(a[i]);
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < NB; i++) s[i] = vf_mul(vf_load(sc[i]), vf_set1(scale));
}

/* block_values for NB <= 2 query vectors with the row pairs interleaved on the fly from vb. */
static AI void rows_values(float *acc, size_t NB, const kipp_bf16 *vb, uint32_t n, const kipp_bf16 (*w)[CHUNK],
                           const float *corr, const kipp_bf16 *pk, uint32_t npk)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    vf a[2][8];
#pragma GCC unroll 2
    for (size_t i = 0; i < NB; i++)
#pragma GCC unroll 8
        for (size_t b = 0; b < 8; b++) {
            a[i][b] = vf_load(acc + i * KIPP_HEAD_DIM + 16 * b);
            if (corr[i] != 1.0f) a[i][b] = vf_mul(a[i][b], vf_set1(corr[i]));
        }
    for (uint32_t j = 0; 2 * j < n; j++) {
        const kipp_bf16 *ra = vb + (size_t)(2 * j) * KV_STRIDE, *rb = ra + KV_STRIDE;
        int has_b = 2 * j + 1 < n;
        if (pk) /* the next chunk's K rows 2j, 2j + 1 of this head: 8 lines a pair, spread under the arithmetic */
            for (uint32_t t = 2 * j; t < 2 * j + 2 && t < npk; t++)
                for (size_t o = 0; o < KIPP_HEAD_DIM; o += 32) k_prefetch(pk + (size_t)t * KV_STRIDE + o);
        __m512i e[2];
#pragma GCC unroll 2
        for (size_t i = 0; i < NB; i++) e[i] = bcast_pair(w[i] + 2 * j);
#pragma GCC unroll 4
        for (size_t h = 0; h < 4; h++) {
            __m512i va = vi_load(ra + 32 * h), vbb = has_b ? vi_load(rb + 32 * h) : _mm512_setzero_si512();
            __m512i pl = _mm512_permutex2var_epi16(va, lo, vbb), ph = _mm512_permutex2var_epi16(va, hi, vbb);
#pragma GCC unroll 2
            for (size_t i = 0; i < NB; i++) {
                a[i][2 * h] = dp(a[i][2 * h], pl, e[i]);
                a[i][2 * h + 1] = dp(a[i][2 * h + 1], ph, e[i]);
            }
        }
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < NB; i++)
#pragma GCC unroll 8
        for (size_t b = 0; b < 8; b++) vf_store(acc + i * KIPP_HEAD_DIM + 16 * b, a[i][b]);
}

/* One chunk (n rows at element offset off) for NB <= 2 query vectors, read in place. */
static AI void rows_step(const kipp_bf16 *q, size_t NB, const kv_view *v, size_t off, uint32_t n, float scale,
                         dchunk *t, float *m, float *l, float *acc)
{
    vf s[2];
    rows_scores(q, NB, v->kc + off, n, scale, s);
#pragma GCC unroll 2
    for (size_t i = 0; i < NB; i++) t->corr[i] = block_softmax(s[i], n, &m[i], &l[i], t->e[i]);
    rows_values(acc, NB, v->vc + off, n, t->e, t->corr, NULL, 0);
}

/* The chunk for query vectors [0, nq) (nq < ROW_MAX) read in place, in pairs. */
static void rows_queries(const kipp_bf16 (*q)[KIPP_HEAD_DIM], size_t nq, const kv_view *v, size_t off, uint32_t n,
                         float scale, dchunk *t, float *m, float *l, float *acc)
{
    size_t i = 0;
    for (; i + 2 <= nq; i += 2) rows_step(q[i], 2, v, off, n, scale, t, m + i, l + i, acc + i * KIPP_HEAD_DIM);
    if (i < nq) rows_step(q[i], 1, v, off, n, scale, t, m + i, l + i, acc + i * KIPP_HEAD_DIM);
}

/* n query vectors (f32, stride 128) rounded to BF16 (vcvtneps2bf16) into qb. */
static void round_q(const float *q, size_t n, kipp_bf16 (*qb)[KIPP_HEAD_DIM])
{
    for (size_t i = 0; i < n; i++)
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += 16) {
            __m256i r = to_bf16(vf_load(q + i * KIPP_HEAD_DIM + d));
            memcpy(qb[i] + d, &r, sizeof r);
        }
}

/* The walk of nq < ROW_MAX query vectors: the rows read in place, chunk by
 * chunk, the next chunk prefetched. */
static void rows_walk(const float *q, size_t nq, const kv_view *v, uint32_t p0, uint32_t p1, float scale, float *m,
                      float *l, float *acc)
{
    dchunk t;
    kipp_bf16 qb[ROW_MAX][KIPP_HEAD_DIM];
    round_q(q, nq, qb);
    for (uint32_t p = p0; p < p1 && p < p0 + CHUNK; p++) prefetch_pos(v, p);
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = k_attn_chunk_len(p, p1);
        for (uint32_t j = p + n; j < p + 2 * n && j < p1; j++) prefetch_pos(v, j);
        rows_queries((const kipp_bf16(*)[KIPP_HEAD_DIM])qb, nq, v, k_kv_off(v->bt, p, v->kvh), n, scale, &t, m, l, acc);
        p += n;
    }
}

/* The walk of nq >= ROW_MAX query vectors: windows of WCH chunks loaded
 * once (chunk_load), then TQ vectors at a time rounded to BF16 and taken
 * through the window's chunks in order, so a block's 8 KB of state stays in
 * L1 across them (a 128-vector tile's state is 64 KB: streamed once per
 * chunk it spilled to L2). */
#define WCH 2u
static void tile_walk(const float *q, size_t nq, const kv_view *v, uint32_t p0, uint32_t p1, float scale, float *m,
                      float *l, float *acc)
{
    dchunk t[WCH];
    kipp_bf16 qb[TQ][KIPP_HEAD_DIM];
    uint32_t n[WCH];
    for (uint32_t p = p0; p < p1 && p < p0 + CHUNK; p++) prefetch_pos(v, p);
    for (uint32_t p = p0; p < p1;) {
        uint32_t w = 0, e = p;
        for (; w < WCH && e < p1; w++) {
            n[w] = k_attn_chunk_len(e, p1);
            chunk_load(v, k_kv_off(v->bt, e, v->kvh), n[w], e + n[w], p1, &t[w]);
            e += n[w];
        }
        for (size_t i0 = 0; i0 < nq; i0 += TQ) {
            size_t nb = nq - i0 < TQ ? nq - i0 : TQ;
            round_q(q + i0 * KIPP_HEAD_DIM, nb, qb);
            tile_window((const kipp_bf16(*)[KIPP_HEAD_DIM])qb, nb, t, w, n, scale, m + i0, l + i0,
                        acc + i0 * KIPP_HEAD_DIM);
        }
        p = e;
    }
}

static void walk(const float *q, size_t nq, const kv_view *v, uint32_t p0, uint32_t p1, float scale, float *m,
                 float *l, float *acc)
{
    if (nq < ROW_MAX)
        rows_walk(q, nq, v, p0, p1, scale, m, l, acc);
    else
        tile_walk(q, nq, v, p0, p1, scale, m, l, acc);
}

void k_flash_gqa_dot_avx512_bf16(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                                uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1, float scale,
                                float *m, float *l, float *acc)
{
    kv_view v = {kc, vc, block_table, kvh};
    walk(q, group, &v, p0, p1, scale, m, l, acc);
}

/* ---- decode over every KV head at once: position-major ----
 * Walked head by head, a decode row reads 256 B of each 2 KB position row
 * at a 2 KB stride, and perf put its stalls on those K loads. Here the
 * scores of all the heads' vectors take each position's K row whole (one
 * sequential stream), HV vectors per REDUCE16. The arithmetic per vector is
 * rows_step's: the same vdpbf16ps chain per (vector, position), REDUCE16 in
 * place of HV vf_hsum calls (bitwise, see REDUCE16), block_softmax, and
 * rows_values over the head's V rows. */
#define HV 16u                                  /* query vectors per REDUCE16 */
#define HEADS_MAX (KIPP_N_KV_HEAD * ROW_MAX)    /* vectors of a row: 8 heads x group < ROW_MAX */

/* s[i] lane j = scale * q_i . k_j for ns <= HV vectors i0 + i over the
 * chunk's n rows, vector i0 + i reading head (i0 + i) / G of the rows at kb
 * (a position's heads side by side); lanes >= n are 0 (as rows_scores).
 * When pv is given, position j's V row (pv_bytes of it) is prefetched
 * beside its scores, so the V stream runs under the arithmetic. Inlined
 * with G and ns constant (scores_set), a head's K block is loaded once for
 * its G vectors and no vector is tested. */
static AI void heads_scores(const kipp_bf16 (*qb)[KIPP_HEAD_DIM], size_t ns, const kipp_bf16 *kb, size_t i0,
                            size_t G, uint32_t n, float scale, vf *s, const kipp_bf16 *pv, size_t pv_bytes)
{
    vf r[CHUNK];
    for (uint32_t j = 0; j < CHUNK; j++) {
        vf a[HV];
#pragma GCC unroll 16
        for (size_t i = 0; i < HV; i++) a[i] = vf_zero();
        if (j < n) {
            const kipp_bf16 *row = kb + (size_t)j * KV_STRIDE;
            if (pv)
                for (size_t o = 0; o < pv_bytes; o += 64) k_prefetch((const char *)(pv + (size_t)j * KV_STRIDE) + o);
#pragma GCC unroll 4
            for (size_t c = 0; c < 4; c++)
#pragma GCC unroll 16
                for (size_t i = 0; i < ns; i++)
                    a[i] = dp(a[i], vi_load(row + (i0 + i) / G * KIPP_HEAD_DIM + 32 * c), vi_load(qb[i] + 32 * c));
        }
        REDUCE16(a, vf_add); /* lane i: vf_hsum(a[i]) */
        r[j] = a[0];
    }
    vf_transpose(r);
    for (size_t i = 0; i < ns; i++) s[i] = vf_mul(r[i], vf_set1(scale));
}

/* heads_scores for one set of vectors: a full set of 16 at groups 2 and 4
 * (the 0.6B to 8B shapes: i0 / G whole) compiled with its constants, else
 * the general loop. */
static void scores_set(const kipp_bf16 (*qb)[KIPP_HEAD_DIM], size_t ns, const kipp_bf16 *kb, size_t i0, size_t G,
                       uint32_t n, float scale, vf *s, const kipp_bf16 *pv, size_t pv_bytes)
{
    if (ns == HV && G == 2)
        heads_scores(qb, HV, kb + i0 / 2 * KIPP_HEAD_DIM, 0, 2, n, scale, s, pv, pv_bytes);
    else if (ns == HV && G == 4)
        heads_scores(qb, HV, kb + i0 / 4 * KIPP_HEAD_DIM, 0, 4, n, scale, s, pv, pv_bytes);
    else
        heads_scores(qb, ns, kb, i0, G, n, scale, s, pv, pv_bytes);
}

/* k_flash_rows_dot for group < ROW_MAX over [p0, p1): each chunk's K rows
 * for the scores, its V rows prefetched meanwhile, then the next chunk's K
 * prefetched under the values (into L1: a chunk of all 8 heads is 32 KB of
 * K and 32 KB of V, read once). The prefetches are spread, one position's
 * V row per score position and 8 lines of the next K per value pair: issued
 * as 512-line bursts they fill the miss buffers and stall the core, so the
 * stream and the arithmetic run one after the other. The softmax of each set
 * of 16 vectors is one softmax_set (bitwise block_softmax). The last chunk's
 * values prefetch the first chunk at pnext the same way: a decode lane walks
 * one 32-position page a call, so without it every other chunk's K would
 * arrive as a burst with nothing under it (docs/PERFORMANCE.md "Kernel design
 * measurements"). */
static void heads_walk(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc, const uint32_t *bt,
                       uint32_t kvh0, uint32_t kvh1, uint32_t p0, uint32_t p1, uint32_t pnext, float scale, float *m,
                       float *l, float *acc)
{
    if (p0 >= p1) return; /* nothing to walk (and nothing to prefetch) */
    const size_t nv = (kvh1 - kvh0) * group, v0 = kvh0 * group;
    kipp_bf16 qb[HEADS_MAX][KIPP_HEAD_DIM], e[HEADS_MAX][CHUNK];
    float corr[HEADS_MAX];
    round_q(q + v0 * KIPP_HEAD_DIM, nv, qb);
    prefetch_rows(kc, bt, kvh0, kvh1, p0, p0 + k_attn_chunk_len(p0, p1)); /* nothing to spread it under */
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = k_attn_chunk_len(p, p1), pe = p + n;
        const size_t off = k_kv_off(bt, p, kvh0); /* a position's heads lie side by side */
        for (size_t i0 = 0; i0 < nv; i0 += HV) {
            size_t ns = nv - i0 < HV ? nv - i0 : HV;
            vf s[HV];
            scores_set((const kipp_bf16(*)[KIPP_HEAD_DIM])qb + i0, ns, kc + off, i0, group, n, scale, s,
                       i0 == 0 ? vc + off : NULL, (kvh1 - kvh0) * KIPP_HEAD_DIM * 2); /* its V, under the scores */
            softmax_set(s, ns, n, m + v0 + i0, l + v0 + i0, e + i0, corr + i0);
        }
        /* the next scores' K, under the values: this walk's next chunk, else the one at pnext */
        const uint32_t pn = pe < p1 ? pe : pnext;
        const uint32_t nn = pe < p1                   ? k_attn_chunk_len(pe, p1)
                            : pnext != K_ATTN_NO_NEXT ? k_attn_chunk_len(pnext, K_ATTN_NO_NEXT)
                                                      : 0;
        const kipp_bf16 *kn = nn ? kc + k_kv_off(bt, pn, kvh0) : NULL;
        for (size_t h0 = 0; h0 < nv; h0 += group) { /* rows_queries' pairs within each head */
            size_t i = h0;
            const kipp_bf16 *vh = vc + off + h0 / group * KIPP_HEAD_DIM; /* this head's V rows */
            const kipp_bf16 *pk = kn ? kn + h0 / group * KIPP_HEAD_DIM : NULL;
            for (; i + 2 <= h0 + group; i += 2, pk = NULL)
                rows_values(acc + (v0 + i) * KIPP_HEAD_DIM, 2, vh, n, (const kipp_bf16(*)[CHUNK])e + i, corr + i, pk,
                            nn);
            if (i < h0 + group)
                rows_values(acc + (v0 + i) * KIPP_HEAD_DIM, 1, vh, n, (const kipp_bf16(*)[CHUNK])e + i, corr + i, pk,
                            nn);
        }
        p = pe;
    }
}

/* By definition k_flash_gqa_dot per KV head. Below ROW_MAX vectors a head,
 * heads_walk; else chunk by chunk with the heads inner, so the 2 KB rows of
 * all heads are read close together. */
void k_flash_rows_dot_avx512_bf16(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                                 const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0,
                                 uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc)
{
    if (group < ROW_MAX) {
        heads_walk(q, group, kc, vc, block_table, kvh0, kvh1, p0, p1, pnext, scale, m, l, acc);
        return;
    }
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = k_attn_chunk_len(p, p1);
        for (uint32_t h = kvh0; h < kvh1; h++) {
            kv_view v = {kc, vc, block_table, h};
            size_t o = (size_t)h * group;
            walk(q + o * KIPP_HEAD_DIM, group, &v, p, p + n, scale, m + o, l + o, acc + o * KIPP_HEAD_DIM);
        }
        p += n;
    }
}
