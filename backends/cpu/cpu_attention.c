/*
 * cpu_attention.c - causal GQA attention over the paged BF16 KV for one round
 * (seed 000 step 5; seed 002 item 6: threaded over (token, head)).
 *
 * Every query's attention is ONE online-softmax walk over positions [0, pos]
 * in aligned K_ATTN_CHUNK chunks (kernels.h), however the round is shaped, so
 * a token's output is bitwise the same in decode, in a prefill tile, in a
 * batch with other sessions or on a reused prefix (issue 16 item 6). There is
 * no split-K: merging partials would round differently from the walk.
 *
 * Prefill rounds run (query tile, KV head) units: a tile is up to
 * tile_tokens consecutive tokens of one item, and its T * group query vectors
 * walk the shared prefix together (chunk-major: each K/V chunk is read once
 * for all of them), then the chunks near the diagonal are walked by the
 * tokens that see them. Rounds of independent rows (decode) run (row, KV-head
 * range) units through k_flash_rows_bf16, which reads the heads' K/V rows
 * page by page. Units are claimed from an atomic counter because causal rows
 * have unequal lengths.
 */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "engine/backend_util.h"

/* Layer bases of the K and V stores of the session behind round row `row`. */
static void row_kv(const cpu_round *r, uint32_t row, uint32_t layer, const kipp_bf16 **kc,
                   const kipp_bf16 **vc, const uint32_t **bt)
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

/* One (tile, KV head) unit: the tile's T tokens at positions p0..p0+T-1.
 * q/m/l/acc: the worker's tile state, token t's group vectors at t * group.
 * Chunks below A = p0 rounded down to a chunk are seen whole by every token:
 * one walk for all T * group vectors. From A on, chunk [c, c + 16) is seen
 * whole by the tokens t >= c + 15 - p0 (a suffix of the tile: one walk), and
 * partly, up to its own position, by a token inside it. */
static void tile_unit(const cpu_round *r, uint32_t layer, uint32_t tile, uint32_t kvh, float *q, float *ml, float *acc)
{
    const cpu_model *m = r->m;
    const size_t group = m->d.n_q_head / KIPP_N_KV_HEAD, HD = KIPP_HEAD_DIM;
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    uint32_t r0 = m->tile_r0[tile], T = m->tile_n[tile], p0 = m->row_pos[r0], pend = p0 + T;
    size_t head0 = (size_t)kvh * group * HD, Q = (size_t)T * group;
    float *mm = ml, *ll = ml + Q;
    const kipp_bf16 *kc, *vc;
    const uint32_t *bt;
    row_kv(r, r0, layer, &kc, &vc, &bt);
    for (uint32_t t = 0; t < T; t++)
        memcpy(q + t * group * HD, m->qkv + (size_t)(r0 + t) * m->QKV + head0, group * HD * sizeof(float));
    k_attn_init(Q, mm, ll, acc);
    uint32_t A = p0 / K_ATTN_CHUNK * K_ATTN_CHUNK;
    if (A > 0) m->k->flash_gqa_bf16(q, Q, kc, vc, kvh, bt, 0, A, scale, mm, ll, acc);
    for (uint32_t c = A; c < pend; c += K_ATTN_CHUNK) {
        uint32_t ce = c + K_ATTN_CHUNK, tf = ce - 1 < p0 ? 0 : ce - 1 - p0; /* first token seeing it whole */
        for (uint32_t t = 0; t < tf && t < T; t++) {
            uint32_t pos = p0 + t;
            if (pos < c) continue; /* before the chunk: sees none of it */
            size_t o = (size_t)t * group;
            m->k->flash_gqa_bf16(q + o * HD, group, kc, vc, kvh, bt, c, pos + 1, scale, mm + o, ll + o, acc + o * HD);
        }
        if (tf < T) {
            size_t o = (size_t)tf * group;
            m->k->flash_gqa_bf16(q + o * HD, (T - tf) * group, kc, vc, kvh, bt, c, ce, scale, mm + o, ll + o, acc + o * HD);
        }
    }
    for (uint32_t t = 0; t < T; t++)
        finish(r, layer, acc + (size_t)t * group * HD, ll + (size_t)t * group, group, (size_t)(r0 + t) * m->A + head0);
}

static void attend_tiles(cpu_round *r, uint32_t layer, int ith)
{
    cpu_model *m = r->m;
    size_t Qmax = m->tile_q, per = Qmax * (2 * KIPP_HEAD_DIM + 2);
    float *b = m->tile_buf + (size_t)ith * per;
    uint32_t units = r->n_tiles * KIPP_N_KV_HEAD;
    for (uint32_t u; (u = atomic_fetch_add(&r->attn_next, 1)) < units;)
        tile_unit(r, layer, u / KIPP_N_KV_HEAD, u % KIPP_N_KV_HEAD, b, b + Qmax * KIPP_HEAD_DIM,
                  b + Qmax * (KIPP_HEAD_DIM + 2));
}

/* Rounds of independent rows (decode): units (row, range of KV heads), the
 * ranges as wide as the worker count allows (a range reads its heads' slice
 * of every K/V row; all 8 heads read whole 2 KB rows). */
static void attend_rows(cpu_round *r, uint32_t layer)
{
    cpu_model *m = r->m;
    const size_t group = m->d.n_q_head / KIPP_N_KV_HEAD, H = KIPP_N_KV_HEAD * group;
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    uint32_t split = 1;
    while (split < KIPP_N_KV_HEAD && r->n_rows * split < (uint32_t)m->nth) split *= 2;
    const uint32_t units = r->n_rows * split, width = KIPP_N_KV_HEAD / split;
    float ml[2 * KIPP_N_KV_HEAD * 64];
    KIPP_ASSERT(group <= 64);
    for (uint32_t u; (u = atomic_fetch_add(&r->attn_next, 1)) < units;) {
        uint32_t row = u / split, h0 = (u % split) * width;
        const kipp_bf16 *kc, *vc;
        const uint32_t *bt;
        row_kv(r, row, layer, &kc, &vc, &bt);
        size_t g0 = (size_t)h0 * group, n = (size_t)width * group, off = (size_t)row * m->A;
        float *acc = m->att + off; /* the walk accumulates in place; finish divides by l */
        k_attn_init(n, ml + g0, ml + H + g0, acc + g0 * KIPP_HEAD_DIM);
        m->k->flash_rows_bf16(m->qkv + (size_t)row * m->QKV, group, kc, vc, bt, h0, h0 + width, 0,
                              m->row_pos[row] + 1, scale, ml, ml + H, acc);
        finish(r, layer, acc + g0 * KIPP_HEAD_DIM, ml + H + g0, n, off + g0 * KIPP_HEAD_DIM);
    }
}

void kipp_cpu_attention(cpu_round *r, uint32_t layer, int ith, int nth)
{
    (void)nth;
    if (r->n_tiles > 0)
        attend_tiles(r, layer, ith);
    else
        attend_rows(r, layer);
}
