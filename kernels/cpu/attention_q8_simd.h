/*
 * attention_q8_simd.h - the flash GQA walks over the q8_0 KV cache
 * (kernels.h "q8_0 KV cache"), included after attention_simd.h by
 * attention_<level>.c: its tile walk (tile_step) with another chunk load.
 *
 * Every walk, a decode row's or a prefill tile's, dequantizes the chunk of
 * one KV head into the tile buffer (K transposed, V row-major; int8 x fp16
 * scale is exact in FP32) and runs tile_step, whose arithmetic per query
 * vector does not depend on how many vectors share the chunk (attention_simd.h
 * "tile walk"). So splits at chunk multiples and any grouping of the query
 * vectors give the same bits (row invariance), and flash_rows is flash_gqa
 * per KV head by construction. Accuracy vs k_flash_gqa_q8_0_ref: the bf16
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
    for (size_t b = 0; b < KIPP_HEAD_DIM / 32; b++) d[b] = k_f16_at(r + K_KVQ8_Q + ((size_t)v->kvh * 4 + b) * 2);
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

void K_SFX(k_flash_gqa_q8_0)(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc, uint32_t kvh,
                             const uint32_t *block_table, uint32_t p0, uint32_t p1, float scale, float *m, float *l,
                             float *acc)
{
    kvq8_view v = {kc, vc, block_table, kvh, p1};
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
