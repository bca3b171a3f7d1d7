/*
 * attention_q8_simd.h - the flash GQA walks over the q8_0 KV cache
 * (kernels.h "q8_0 KV cache"), included after attention_simd.h by
 * attention_<level>.c: its tile walk (tile_step) with another chunk load.
 *
 * The walks are the bf16 ones with another read of K and V (int8 x fp16
 * scale, exact in FP32): from TILE_MIN query vectors on (a prefill tile)
 * the chunk of one KV head is dequantized into the tile buffer (K
 * transposed, V row-major) for tile_step; below (decode), chunk_step's
 * chains read the int8 rows directly, each KB block widened into its even
 * and odd elements (vf_i8_eo) and scaled. Both paths are attention_simd.h's
 * pair that gives every query vector the same bits ("tile walk"), so splits
 * at chunk multiples and any grouping of the query vectors give the same
 * bits (row invariance), and flash_rows is flash_gqa per KV head by
 * construction. Accuracy vs k_flash_gqa_q8_0_ref: the bf16
 * walk's (another summation order, polynomial exp).
 */
#ifndef K_SFX
#error "include kernels/cpu/attention_simd.h first"
#endif

/* One KV head of a layer's q8_0 cache and where prefetching must stop. */
typedef struct {
    const uint8_t *kc, *vc; /* layer bases, [position (paged)] rows of K_KVQ8_ROW bytes */
    const uint32_t *bt;
    uint32_t kvh, pf_end;
} kvq8_view;

/* Head kvh's 128 int8 of K and V at pos (two lines each) and their scales (one line). */
static AI void q8_prefetch_pos(const kvq8_view *v, uint32_t pos)
{
    size_t off = k_kvq8_off(v->bt, pos), h = (size_t)v->kvh * KIPP_HEAD_DIM, d = K_KVQ8_Q + (size_t)v->kvh * 8;
    k_prefetch(v->kc + off + h);
    k_prefetch(v->kc + off + h + 64);
    k_prefetch(v->kc + off + d);
    k_prefetch(v->vc + off + h);
    k_prefetch(v->vc + off + h + 64);
    k_prefetch(v->vc + off + d);
}

/* The row of head kvh at pos in cache c: its int8 values, and its 4 scales widened into d. */
static AI const int8_t *q8_row(const kvq8_view *v, const uint8_t *c, uint32_t pos, float d[4])
{
    const uint8_t *r = c + k_kvq8_off(v->bt, pos);
    _mm_storeu_ps(d, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(r + K_KVQ8_Q + (size_t)v->kvh * 8)))); /* F16C: exact */
    return (const int8_t *)r + (size_t)v->kvh * KIPP_HEAD_DIM;
}

/* tile_load over q8_0 rows: positions [p, p + n) of one page dequantized into
 * t->kt (transposed, positions >= n zero) and t->v, prefetching [pf, pf + CHUNK). */
static void q8_tile_load(const kvq8_view *v, uint32_t p, uint32_t n, uint32_t pf, tile_chunk *t)
{
    const int8_t *kq[CHUNK], *vq[CHUNK];
    float dk[CHUNK][4], dv[CHUNK][4];
    for (uint32_t j = 0; j < n; j++) {
        kq[j] = q8_row(v, v->kc, p + j, dk[j]);
        vq[j] = q8_row(v, v->vc, p + j, dv[j]);
    }
    for (uint32_t j = 0; j < CHUNK && pf + j < v->pf_end; j++) q8_prefetch_pos(v, pf + j);
    for (uint32_t j0 = 0; j0 < CHUNK; j0 += VF_LANES)
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += VF_LANES) {
            vf r[VF_LANES];
#pragma GCC unroll 16
            for (uint32_t j = 0; j < VF_LANES; j++)
                r[j] = j0 + j < n ? vf_mul(vf_from_i8(kq[j0 + j] + d), vf_set1(dk[j0 + j][d / 32])) : vf_zero();
            vf_transpose(r);
#pragma GCC unroll 16
            for (uint32_t c = 0; c < VF_LANES; c++) vf_store(t->kt[d + c] + j0, r[c]);
        }
    for (uint32_t j = 0; j < n; j++)
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += VF_LANES)
            vf_store(t->v[j] + d, vf_mul(vf_from_i8(vq[j] + d), vf_set1(dv[j][d / 32])));
}

/* ---- fewer than TILE_MIN query vectors (decode): chunk_step's arithmetic over q8_0 rows ---- */

/* The dequantized even and odd elements of dims [d, d + KB) of a row (one scale: KB divides 32). */
static AI void q8_eo(const int8_t *r, const float *dq, size_t d, vf *e, vf *o)
{
    vf_i8_eo(r + d, e, o);
    vf sc = vf_set1(dq[d / 32]);
    *e = vf_mul(*e, sc);
    *o = vf_mul(*o, sc);
}

/* scores_step over q8_0 rows kq[j0 + i] (scales dk): the same chains, so the same bits as the tile walk's
 * scores of the same dequantized values (attention_simd.h "tile walk"). */
static AI void q8_scores_step(const float qs[GMAX][KIPP_HEAD_DIM], size_t G, size_t P, const int8_t *const *kq,
                              const float (*dk)[4], size_t j0, float scale, float s[GMAX][CHUNK])
{
    vf a[8];
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; i++) a[i] = vf_zero();
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += KB) {
#pragma GCC unroll 4
        for (size_t i = 0; i < P; i++) {
            vf ke, ko;
            q8_eo(kq[j0 + i], dk[j0 + i], d, &ke, &ko);
#pragma GCC unroll 8
            for (size_t g = 0; g < G; g++) {
                a[(i * G + g) & 7] = vf_fma(vf_load(qs[g] + d), ke, a[(i * G + g) & 7]);
                a[(i * G + g) & 7] = vf_fma(vf_load(qs[g] + d + VF_LANES), ko, a[(i * G + g) & 7]);
            }
        }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < P; i++)
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) s[g][j0 + i] = vf_hsum(a[(i * G + g) & 7]) * scale;
}

/* values_pass (split 0, rescale 1) over q8_0 rows vq[j] (scales dv), positions [0, n). */
static AI void q8_values_pass(float *acc, size_t H, size_t SB, const int8_t *const *vq, const float (*dv)[4], size_t n,
                              float e[GMAX][CHUNK], const float *corr, size_t d)
{
    vf a[8];
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; i++) a[i] = vf_zero();
#pragma GCC unroll 4
    for (size_t h = 0; h < H; h++)
#pragma GCC unroll 2
        for (size_t t = 0; t < SB; t++) {
            const float *p = acc + h * KIPP_HEAD_DIM + d + KB * t;
            vf ev = vf_load(p), od = vf_load(p + VF_LANES);
            vf_deint(ev, od, &ev, &od);
            a[(2 * (h * SB + t)) & 7] = vf_mul(ev, vf_set1(corr[h]));
            a[(2 * (h * SB + t) + 1) & 7] = vf_mul(od, vf_set1(corr[h]));
        }
    for (size_t j = 0; j < n; j++) {
        vf ve[2], vo[2];
#pragma GCC unroll 2
        for (size_t t = 0; t < SB; t++) q8_eo(vq[j], dv[j], d + KB * t, &ve[t & 1], &vo[t & 1]);
#pragma GCC unroll 4
        for (size_t h = 0; h < H; h++) {
            vf eg = vf_set1(e[h][j]);
#pragma GCC unroll 2
            for (size_t t = 0; t < SB; t++) {
                a[(2 * (h * SB + t)) & 7] = vf_fma(eg, ve[t & 1], a[(2 * (h * SB + t)) & 7]);
                a[(2 * (h * SB + t) + 1) & 7] = vf_fma(eg, vo[t & 1], a[(2 * (h * SB + t) + 1) & 7]);
            }
        }
    }
#pragma GCC unroll 4
    for (size_t h = 0; h < H; h++)
#pragma GCC unroll 2
        for (size_t t = 0; t < SB; t++) {
            float *p = acc + h * KIPP_HEAD_DIM + d + KB * t;
            vf lo = a[(2 * (h * SB + t)) & 7], hi = a[(2 * (h * SB + t) + 1) & 7];
            vf_inter(lo, hi, &lo, &hi);
            vf_store(p, lo);
            vf_store(p + VF_LANES, hi);
        }
}

/* chunk_step over q8_0 rows: positions [p, p + n) of one page for G <= GMAX query vectors, prefetching
 * [pf, pf_end) as it scores. */
static AI void q8_chunk_step(const float *q, size_t G, const kvq8_view *v, uint32_t p, uint32_t n, uint32_t pf,
                             float scale, float *m, float *l, float *acc)
{
    float s[GMAX][CHUNK], corr[GMAX], qs[GMAX][KIPP_HEAD_DIM], dk[CHUNK][4], dv[CHUNK][4];
    const int8_t *kq[CHUNK], *vq[CHUNK];
    const size_t P = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    for (uint32_t j = 0; j < n; j++) {
        kq[j] = q8_row(v, v->kc, p + j, dk[j]);
        vq[j] = q8_row(v, v->vc, p + j, dv[j]);
    }
    q_split(q, G, qs);
    size_t j = 0;
    for (; j + P <= n; j += P) {
#pragma GCC unroll 4
        for (size_t i = 0; i < P; i++)
            if (pf + j + i < v->pf_end) q8_prefetch_pos(v, pf + (uint32_t)(j + i));
        q8_scores_step(qs, G, P, kq, (const float(*)[4])dk, j, scale, s);
    }
    for (; j < n; j++) {
        if (pf + j < v->pf_end) q8_prefetch_pos(v, pf + (uint32_t)j);
        q8_scores_step(qs, G, 1, kq, (const float(*)[4])dk, j, scale, s);
    }
#pragma GCC unroll 8
    for (size_t g = 0; g < G; g++) corr[g] = chunk_softmax(s[g], n, &m[g], &l[g]);
    const size_t SB = G <= 2 ? 2 : 1, HV = G < 4 ? G : 4;
    for (size_t h0 = 0; h0 < G; h0 += HV) {
        size_t H = G - h0 < HV ? G - h0 : HV;
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += KB * SB)
            q8_values_pass(acc + h0 * KIPP_HEAD_DIM, H, SB, vq, (const float(*)[4])dv, n, s + h0, corr + h0, d);
    }
}

/* q8_chunk_step with a constant head count, so the accumulators stay in registers. */
static void q8_step_any(const float *q, size_t G, const kvq8_view *v, uint32_t p, uint32_t n, uint32_t pf, float scale,
                        float *m, float *l, float *acc)
{
    switch (G) {
    case 1: q8_chunk_step(q, 1, v, p, n, pf, scale, m, l, acc); break;
    case 2: q8_chunk_step(q, 2, v, p, n, pf, scale, m, l, acc); break;
    case 4: q8_chunk_step(q, 4, v, p, n, pf, scale, m, l, acc); break;
    case 8: q8_chunk_step(q, 8, v, p, n, pf, scale, m, l, acc); break;
    default: q8_chunk_step(q, G, v, p, n, pf, scale, m, l, acc); break;
    }
}

void K_SFX(k_flash_gqa_q8_0)(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc, uint32_t kvh,
                             const uint32_t *block_table, uint32_t p0, uint32_t p1, float scale, float *m, float *l,
                             float *acc)
{
    kvq8_view v = {kc, vc, block_table, kvh, p1};
    if (group < TILE_MIN) { /* chunk by chunk, GMAX vectors a pass; the first pass prefetches PF_AHEAD on */
        for (uint32_t p = p0; p < p1 && p < p0 + PF_AHEAD; p++) q8_prefetch_pos(&v, p);
        for (uint32_t p = p0; p < p1;) {
            uint32_t n = k_attn_chunk_len(p, p1);
            for (size_t g0 = 0; g0 < group; g0 += GMAX) {
                size_t G = group - g0 < GMAX ? group - g0 : GMAX;
                q8_step_any(q + g0 * KIPP_HEAD_DIM, G, &v, p, n, g0 == 0 ? p + PF_AHEAD : p1, scale, m + g0, l + g0,
                            acc + g0 * KIPP_HEAD_DIM);
            }
            p += n;
        }
        return;
    }
    tile_chunk t;
    for (uint32_t p = p0; p < p0 + k_attn_chunk_len(p0, p1); p++) q8_prefetch_pos(&v, p);
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = k_attn_chunk_len(p, p1);
        q8_tile_load(&v, p, n, p + n, &t);
        tile_step(q, group, &t, n, scale, m, l, acc);
        p += n;
    }
}

/* Per KV head: bitwise k_flash_gqa_q8_0 of each head (pnext unused). */
void K_SFX(k_flash_rows_q8_0)(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc,
                              const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0, uint32_t p1,
                              uint32_t pnext, float scale, float *m, float *l, float *acc)
{
    (void)pnext;
    for (uint32_t h = kvh0; h < kvh1; h++)
        K_SFX(k_flash_gqa_q8_0)(q + h * group * KIPP_HEAD_DIM, group, kc, vc, h, block_table, p0, p1, scale,
                                m + h * group, l + h * group, acc + h * group * KIPP_HEAD_DIM);
}
