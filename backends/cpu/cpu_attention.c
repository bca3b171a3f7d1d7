/*
 * cpu_attention.c - causal GQA attention over the paged BF16 or q8_0 KV for one round
 * (seed 000 step 5; seed 002 item 6: threaded over (token, head)).
 *
 * Every query's attention is the same two walks however the round is shaped:
 * one online-softmax walk per lane (the even and the odd pages of [0, pos],
 * kernels.h "Lanes") in aligned K_ATTN_CHUNK chunks, folded by k_attn_merge.
 * So a token's output is bitwise the same in decode, in a prefill tile, in a
 * batch with other sessions or on a reused prefix (row invariance). Nothing
 * else is split: a split chosen per round would round differently.
 *
 * Prefill rounds run (query tile, KV head) units: a tile is up to
 * tile_tokens consecutive tokens of one item, and its T * group query vectors
 * walk the shared prefix together (chunk-major: each K/V chunk is read once
 * for all of them), then the chunks near the diagonal are walked by the
 * tokens that see them. Rounds of independent rows (decode) run (row, lane,
 * KV-head range) units through k_flash_rows_bf16, one call per page of the
 * lane, then merge after a barrier. Two workers on one row read alternate
 * whole pages in address order, which reads faster than splitting the heads
 * (each worker 1 KB of every 2 KB row; docs/PERFORMANCE.md has the figures). Units are claimed
 * from an atomic counter because causal rows have unequal lengths.
 */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "base/errbuf.h"

/* Layer bases of the K and V stores of the session behind round row `row`. */
static void row_kv(const cpu_round *r, uint32_t row, uint32_t layer, const uint8_t **kc,
                   const uint8_t **vc, const uint32_t **bt)
{
    const kipp_eval_item *it = &r->items[r->m->row_item[row]];
    const cpu_session *s = it->session;
    *kc = kipp_kv_layer_k(&s->kv, layer);
    *vc = kipp_kv_layer_v(&s->kv, layer);
    *bt = it->block_table;
}

/* out = acc / l for n query heads (out may alias acc), and the same segment
 * of the O projection's input in the activation format it reads. */
static void finish(const cpu_round *r, uint32_t layer, const float *acc, const float *l, size_t n, size_t off)
{
    const cpu_model *m = r->m;
    float *out = m->att + off;
    for (size_t g = 0; g < n; g++) {
        float inv = 1.0f / l[g]; /* l >= 1: the max score contributes exp(0) */
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) out[g * KIPP_HEAD_DIM + i] = acc[g * KIPP_HEAD_DIM + i] * inv;
    }
    kipp_cpu_act(m, &m->lw[layer].o, out, off, n * KIPP_HEAD_DIM);
}

/* Per-lane state of n query vectors inside a worker's tile buffer. */
typedef struct {
    float *m, *l, *acc; /* [n], [n], [n][128] */
} lane_state;

/* Walk [p0, p1) (inside one page) for the n query vectors at offset o of the tile state. */
static void walk(const cpu_round *r, const float *q, size_t n, const uint8_t *kc, const uint8_t *vc, uint32_t kvh,
                 const uint32_t *bt, uint32_t p0, uint32_t p1, const lane_state *st, size_t o)
{
    const lane_state *ls = &st[k_attn_lane(p0)];
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    if (r->m->kv_q8)
        r->m->k->flash_gqa_q8_0(q + o * KIPP_HEAD_DIM, n, kc, vc, kvh, bt, p0, p1, scale, ls->m + o, ls->l + o,
                                ls->acc + o * KIPP_HEAD_DIM);
    else
        r->m->flash_gqa(q + o * KIPP_HEAD_DIM, n, (const kipp_bf16 *)kc, (const kipp_bf16 *)vc, kvh, bt, p0, p1, scale,
                        ls->m + o, ls->l + o, ls->acc + o * KIPP_HEAD_DIM);
}

/* One (tile, KV head) unit: the tile's T tokens at positions p0..p0+T-1.
 * b: the worker's tile state (KIPP_CPU_TILE_STATE floats per vector), token
 * t's group vectors at t * group. Chunks below A = p0 rounded down to a chunk
 * are seen whole by every token: one walk for all T * group vectors, page by
 * page into each page's lane. From A on, chunk [c, c + 16) is seen whole by
 * the tokens t >= c + 15 - p0 (a suffix of the tile: one walk), and partly,
 * up to its own position, by a token inside it. */
static void tile_unit(const cpu_round *r, uint32_t layer, uint32_t tile, uint32_t kvh, float *b)
{
    const cpu_model *m = r->m;
    const size_t group = m->d.n_q_head / KIPP_N_KV_HEAD, HD = KIPP_HEAD_DIM, Qmax = m->tile_q;
    uint32_t r0 = m->tile_r0[tile], T = m->tile_n[tile], p0 = m->row_pos[r0], pend = p0 + T;
    size_t head0 = (size_t)kvh * group * HD, Q = (size_t)T * group;
    float *q = b;
    lane_state st[K_ATTN_LANES];
    for (uint32_t i = 0; i < K_ATTN_LANES; i++) {
        float *base = b + Qmax * HD + i * Qmax * (HD + 2);
        st[i] = (lane_state){base, base + Qmax, base + 2 * Qmax};
        k_attn_init(Q, st[i].m, st[i].l, st[i].acc);
    }
    const uint8_t *kc, *vc;
    const uint32_t *bt;
    row_kv(r, r0, layer, &kc, &vc, &bt);
    for (uint32_t t = 0; t < T; t++)
        memcpy(q + t * group * HD, m->qkv + (size_t)(r0 + t) * m->QKV + head0, group * HD * sizeof(float));
    uint32_t A = p0 / K_ATTN_CHUNK * K_ATTN_CHUNK;
    for (uint32_t a = 0; a < A; a += KIPP_KV_BLOCK) {
        uint32_t e = a + KIPP_KV_BLOCK < A ? a + KIPP_KV_BLOCK : A;
        if (e < A && !m->kv_q8) /* the q8_0 walk prefetches its own next chunk only */
            k_kv_prefetch((const kipp_bf16 *)kc, (const kipp_bf16 *)vc, kvh, bt, e, e + K_ATTN_CHUNK < A ? e + K_ATTN_CHUNK : A);
        walk(r, q, Q, kc, vc, kvh, bt, a, e, st, 0);
    }
    for (uint32_t c = A; c < pend; c += K_ATTN_CHUNK) {
        uint32_t ce = c + K_ATTN_CHUNK, tf = ce - 1 < p0 ? 0 : ce - 1 - p0; /* first token seeing it whole */
        for (uint32_t t = 0; t < tf && t < T; t++) {
            uint32_t pos = p0 + t;
            if (pos < c) continue; /* before the chunk: sees none of it */
            walk(r, q, group, kc, vc, kvh, bt, c, pos + 1, st, (size_t)t * group);
        }
        if (tf < T) walk(r, q, (T - tf) * group, kc, vc, kvh, bt, c, ce, st, (size_t)tf * group);
    }
    for (uint32_t i = 1; i < K_ATTN_LANES; i++) k_attn_merge(Q, st[0].m, st[0].l, st[0].acc, st[i].m, st[i].l, st[i].acc);
    for (uint32_t t = 0; t < T; t++)
        finish(r, layer, st[0].acc + (size_t)t * group * HD, st[0].l + (size_t)t * group, group,
               (size_t)(r0 + t) * m->A + head0);
}

static void attend_tiles(cpu_round *r, uint32_t layer, int ith)
{
    cpu_model *m = r->m;
    float *b = m->tile_buf + (size_t)ith * m->tile_q * KIPP_CPU_TILE_STATE;
    uint32_t units = r->n_tiles * KIPP_N_KV_HEAD;
    for (uint32_t u; (u = atomic_fetch_add(&r->attn_next, 1)) < units;)
        tile_unit(r, layer, u / KIPP_N_KV_HEAD, u % KIPP_N_KV_HEAD, b);
}

_Static_assert(K_ATTN_LANES == 2, "att and att1 hold the two lanes");

/* Rounds of independent rows (decode): units (row, lane, range of KV heads),
 * the ranges as wide as the worker count allows, each walking its lane's
 * pages (lane, lane + 2, ...: the pages k_attn_lane gives it) into lane_ml
 * and att (lane 0) or att1; after a barrier, units (row, range) merge the
 * lanes and finish. */
static void attend_rows(cpu_round *r, uint32_t layer, int ith, int nth)
{
    cpu_model *m = r->m;
    const size_t group = m->d.n_q_head / KIPP_N_KV_HEAD, H = KIPP_N_KV_HEAD * group, HD = KIPP_HEAD_DIM;
    const float scale = 1.0f / sqrtf((float)HD);
    uint32_t split = 1;
    while (split < KIPP_N_KV_HEAD && r->n_rows * K_ATTN_LANES * split < (uint32_t)m->nth) split *= 2;
    const uint32_t units = r->n_rows * K_ATTN_LANES * split, width = KIPP_N_KV_HEAD / split;
    for (uint32_t u; (u = atomic_fetch_add(&r->attn_next, 1)) < units;) {
        uint32_t row = u / (K_ATTN_LANES * split), lane = u / split % K_ATTN_LANES, h0 = (u % split) * width;
        const uint8_t *kc, *vc;
        const uint32_t *bt;
        row_kv(r, row, layer, &kc, &vc, &bt);
        size_t g0 = (size_t)h0 * group, n = (size_t)width * group;
        float *ml = m->lane_ml + ((size_t)row * K_ATTN_LANES + lane) * 2 * H;
        float *acc = (lane ? m->att1 : m->att) + (size_t)row * m->A; /* finish divides by l in place */
        k_attn_init(n, ml + g0, ml + H + g0, acc + g0 * HD);
        const float *q = m->qkv + (size_t)row * m->QKV;
        uint32_t end = m->row_pos[row] + 1;
        for (uint32_t a = lane * KIPP_KV_BLOCK; a < end; a += K_ATTN_LANES * KIPP_KV_BLOCK) {
            uint32_t an = a + K_ATTN_LANES * KIPP_KV_BLOCK; /* the lane's next page, prefetched under this one */
            uint32_t pe = a + KIPP_KV_BLOCK < end ? a + KIPP_KV_BLOCK : end, next = an < end ? an : K_ATTN_NO_NEXT;
            if (m->kv_q8)
                m->k->flash_rows_q8_0(q, group, kc, vc, bt, h0, h0 + width, a, pe, next, scale, ml, ml + H, acc);
            else
                m->flash_rows(q, group, (const kipp_bf16 *)kc, (const kipp_bf16 *)vc, bt, h0, h0 + width, a, pe, next,
                              scale, ml, ml + H, acc);
        }
    }
    kipp_threadpool_barrier(m->pool);
    for (uint32_t u = (uint32_t)ith; u < r->n_rows * split; u += (uint32_t)nth) {
        uint32_t row = u / split;
        size_t g0 = (size_t)(u % split) * width * group, n = (size_t)width * group, off = (size_t)row * m->A;
        float *ml = m->lane_ml + (size_t)row * K_ATTN_LANES * 2 * H;
        for (uint32_t i = 1; i < K_ATTN_LANES; i++) {
            const float *mi = ml + i * 2 * H;
            k_attn_merge(n, ml + g0, ml + H + g0, m->att + off + g0 * HD, mi + g0, mi + H + g0,
                         m->att1 + off + g0 * HD);
        }
        finish(r, layer, m->att + off + g0 * HD, ml + H + g0, n, off + g0 * HD);
    }
}

void kipp_cpu_attention(cpu_round *r, uint32_t layer, int ith, int nth)
{
    if (r->n_tiles > 0)
        attend_tiles(r, layer, ith);
    else
        attend_rows(r, layer, ith, nth);
}
