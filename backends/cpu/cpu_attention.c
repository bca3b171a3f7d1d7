/*
 * cpu_attention.c - causal GQA attention over the paged BF16 KV for one round
 * (seed 000 step 5; seed 002 item 6: threaded over (token, head, chunk)).
 *
 * Prefill rounds run (query tile, KV head) units: the group of query heads
 * sharing a KV head is one k_flash_gqa_bf16 call, so each K/V row is loaded
 * once per tile. Rounds of independent rows (decode) run (row, chunk) units
 * over all 8 KV heads at once with k_flash_rows_bf16, which reads K and V as
 * contiguous 2 KB rows; each row's context is cut into enough chunks to keep
 * every worker busy, and the chunk partials are combined with k_attn_merge
 * (split-K, as in flash decoding). Units are claimed from an atomic counter
 * because causal rows have unequal lengths.
 */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "engine/backend_util.h"

uint32_t kipp_cpu_attn_chunks(const cpu_model *m, uint32_t n_rows, uint32_t max_ctx)
{
    uint32_t pairs = n_rows * KIPP_N_KV_HEAD, want = KIPP_CPU_ATTN_UNITS_PER_THREAD * (uint32_t)m->nth;
    if (pairs == 0 || pairs >= want || m->nth == 1) return 1;
    uint32_t nch = (want + pairs - 1) / pairs;
    uint32_t by_len = max_ctx / KIPP_CPU_ATTN_MIN_CHUNK;
    if (nch > by_len) nch = by_len;
    if (nch * pairs > m->max_units) nch = m->max_units / pairs;
    return nch < 1 ? 1 : nch;
}

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

/* Positions [p0, p1) of chunk c out of nch over a context of ctx positions;
 * chunk bounds fall on 32-position pages so a chunk never splits a page. */
static void chunk_range(uint32_t ctx, uint32_t c, uint32_t nch, uint32_t *p0, uint32_t *p1)
{
    uint32_t len = (ctx + nch - 1) / nch;
    len = (len + KIPP_KV_BLOCK - 1) / KIPP_KV_BLOCK * KIPP_KV_BLOCK;
    *p0 = c * len < ctx ? c * len : ctx;
    *p1 = (c + 1) * len < ctx ? (c + 1) * len : ctx;
}

/* out = acc / l for the group's heads (out may alias acc), and the same
 * segment of the O projection's input in the activation format it reads. */
static void finish(const cpu_round *r, uint32_t layer, const float *acc, const float *l, size_t group, size_t off)
{
    const cpu_model *m = r->m;
    float *out = m->att + off;
    for (size_t g = 0; g < group; g++) {
        float inv = 1.0f / l[g]; /* l >= 1: the max score contributes exp(0) */
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) out[g * KIPP_HEAD_DIM + i] = acc[g * KIPP_HEAD_DIM + i] * inv;
    }
    kipp_cpu_act(m, &m->lw[layer].o, r->n_rows, out, off, group * KIPP_HEAD_DIM);
}

/* Per-worker tile state inside tile_buf. */
typedef struct {
    float *q, *ml, *acc;   /* [tile_q][128], [2][tile_q], [tile_q][128] */
    float *dml, *dacc;     /* diagonal partial of one token: [2][group], [group][128] */
} tile_state;

static tile_state tile_state_of(const cpu_model *m, size_t group, int ith)
{
    size_t Q = m->tile_q, per = Q * (2 * KIPP_HEAD_DIM + 2) + group * (KIPP_HEAD_DIM + 2);
    float *b = m->tile_buf + (size_t)ith * per;
    tile_state t = {b, b + Q * KIPP_HEAD_DIM, b + Q * (KIPP_HEAD_DIM + 2), b + Q * (2 * KIPP_HEAD_DIM + 2), NULL};
    t.dacc = t.dml + 2 * group;
    return t;
}

/* Prefill units (query tile, KV head): the tile's T tokens at positions
 * p0..p0+T-1 all see [0, p0) in full, computed once for T*group queries;
 * each token's causal diagonal [p0, pos] is a small second partial, merged. */
static void attend_tiles(cpu_round *r, uint32_t layer, size_t group, float scale, int ith)
{
    cpu_model *m = r->m;
    tile_state ts = tile_state_of(m, group, ith);
    uint32_t units = r->n_tiles * KIPP_N_KV_HEAD;
    for (uint32_t u; (u = atomic_fetch_add(&r->attn_next, 1)) < units;) {
        uint32_t tile = u / KIPP_N_KV_HEAD, kvh = u % KIPP_N_KV_HEAD, r0 = m->tile_r0[tile], T = m->tile_n[tile];
        uint32_t p0 = m->row_pos[r0];
        size_t head0 = (size_t)kvh * group * KIPP_HEAD_DIM, Q = (size_t)T * group;
        const kipp_bf16 *kc, *vc;
        const uint32_t *bt;
        row_kv(r, r0, layer, &kc, &vc, &bt);
        for (uint32_t t = 0; t < T; t++)
            memcpy(ts.q + t * group * KIPP_HEAD_DIM, m->qkv + (size_t)(r0 + t) * m->QKV + head0, group * KIPP_HEAD_DIM * sizeof(float));
        if (p0 > 0) {
            m->k->flash_gqa_bf16(ts.q, Q, kc, vc, kvh, bt, 0, p0, scale, ts.ml, ts.ml + Q, ts.acc);
        } else { /* no shared prefix: an empty partial (merge weight exp(-inf) = 0) */
            for (size_t i = 0; i < Q; i++) { ts.ml[i] = -INFINITY; ts.ml[Q + i] = 0.0f; }
            memset(ts.acc, 0, Q * KIPP_HEAD_DIM * sizeof(float));
        }
        for (uint32_t t = 0; t < T; t++) {
            float *mt = ts.dml, *lt = ts.dml + group, *at = ts.dacc;
            m->k->flash_gqa_bf16(ts.q + t * group * KIPP_HEAD_DIM, group, kc, vc, kvh, bt, p0, p0 + t + 1, scale, mt, lt, at);
            /* merge the prefix partial (token t's slice) into the diagonal one */
            float pm[64], pl[64];
            for (size_t g = 0; g < group; g++) { pm[g] = ts.ml[t * group + g]; pl[g] = ts.ml[Q + t * group + g]; }
            k_attn_merge(group, mt, lt, at, pm, pl, ts.acc + t * group * KIPP_HEAD_DIM);
            finish(r, layer, at, lt, group, (size_t)(r0 + t) * m->A + head0);
        }
    }
}

/* Chunks per row for rows-units: enough units to keep every worker busy,
 * none below KIPP_CPU_ATTN_MIN_CHUNK positions, and within the partial slots
 * (max_units holds max_units / 8 all-head partials). */
static uint32_t rows_chunks(const cpu_round *r)
{
    const cpu_model *m = r->m;
    uint32_t max_ctx = 0;
    for (uint32_t i = 0; i < r->n_rows; i++)
        if (m->row_pos[i] + 1 > max_ctx) max_ctx = m->row_pos[i] + 1;
    uint32_t want = KIPP_CPU_ATTN_UNITS_PER_THREAD * (uint32_t)m->nth;
    uint32_t nch = (want + r->n_rows - 1) / r->n_rows, by_len = max_ctx / KIPP_CPU_ATTN_MIN_CHUNK;
    uint32_t cap = m->max_units / KIPP_N_KV_HEAD / r->n_rows;
    if (nch > by_len) nch = by_len;
    if (nch > cap) nch = cap;
    return nch < 1 ? 1 : nch;
}

/* Rounds of independent rows (decode): units (row, chunk) over all 8 KV heads
 * at once through flash_rows_bf16, which streams whole 2 KB K/V rows (one KV
 * head alone reads 256 B of every 2 KB, a third of the DRAM bandwidth). A row
 * in one chunk writes its output directly; otherwise chunk partials go to
 * part_ml/part_acc and a second pass merges them per (row, KV head). */
static void attend_rows(cpu_round *r, uint32_t layer, size_t group, float scale, int ith, int nth)
{
    cpu_model *m = r->m;
    const size_t H = KIPP_N_KV_HEAD * group;
    const uint32_t nch = rows_chunks(r), units = r->n_rows * nch;
    float ml[2 * KIPP_N_KV_HEAD * 64];
    KIPP_ASSERT(group <= 64);
    for (uint32_t u; (u = atomic_fetch_add(&r->attn_next, 1)) < units;) {
        uint32_t row = u / nch, c = u % nch, p0, p1;
        chunk_range(m->row_pos[row] + 1, c, nch, &p0, &p1);
        const kipp_bf16 *kc, *vc;
        const uint32_t *bt;
        row_kv(r, row, layer, &kc, &vc, &bt);
        const float *q = m->qkv + (size_t)row * m->QKV;
        if (nch == 1) {
            float *out = m->att + (size_t)row * m->A;
            m->k->flash_rows_bf16(q, group, kc, vc, bt, p0, p1, scale, ml, ml + H, out);
            finish(r, layer, out, ml + H, H, (size_t)row * m->A);
            continue;
        }
        float *pml = m->part_ml + (size_t)u * 2 * H, *pacc = m->part_acc + (size_t)u * H * KIPP_HEAD_DIM;
        if (p0 >= p1) { /* empty tail chunk: l = 0 marks it for the merge */
            pml[H] = 0.0f;
            continue;
        }
        m->k->flash_rows_bf16(q, group, kc, vc, bt, p0, p1, scale, pml, pml + H, pacc);
    }
    if (nch == 1) return;
    kipp_cpu_pool_barrier(m->pool);
    size_t r0, r1;
    k_split_rows((size_t)r->n_rows * KIPP_N_KV_HEAD, ith, nth, 1, &r0, &r1);
    for (size_t pr = r0; pr < r1; pr++) { /* pair = row * 8 + kvh; chunk 0 is never empty */
        size_t row = pr / KIPP_N_KV_HEAD, kvh = pr % KIPP_N_KV_HEAD, hg = kvh * group;
        float *ml0 = m->part_ml + row * nch * 2 * H, *acc0 = m->part_acc + row * nch * H * KIPP_HEAD_DIM;
        for (uint32_t c = 1; c < nch; c++) {
            const float *mlc = ml0 + (size_t)c * 2 * H, *accc = acc0 + (size_t)c * H * KIPP_HEAD_DIM;
            if (mlc[H] == 0.0f) continue;
            k_attn_merge(group, ml0 + hg, ml0 + H + hg, acc0 + hg * KIPP_HEAD_DIM, mlc + hg,
                         mlc + H + hg, accc + hg * KIPP_HEAD_DIM);
        }
        finish(r, layer, acc0 + hg * KIPP_HEAD_DIM, ml0 + H + hg, group, row * m->A + hg * KIPP_HEAD_DIM);
    }
}

void kipp_cpu_attention(cpu_round *r, uint32_t layer, int ith, int nth)
{
    size_t group = r->m->d.n_q_head / KIPP_N_KV_HEAD;
    float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    if (r->n_tiles > 0)
        attend_tiles(r, layer, group, scale, ith);
    else
        attend_rows(r, layer, group, scale, ith, nth);
}
