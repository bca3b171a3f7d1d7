/*
 * ref_backend.c - the "ref" backend: the readable scalar FP32 Qwen3 forward
 * (seed 000, "Each layer performs these operations in order", Phase 1 item 5,
 * Phase 2 "KV cache").
 *
 * This is the oracle every other backend is checked against, so it favours
 * clarity over speed: one thread, the scalar k_*_ref kernels only (no SIMD,
 * no dispatch table), and each of the seed's nine per-layer steps is its own
 * named function. Activations are FP32; weights and the KV cache are BF16.
 *
 * Rows are independent everywhere (the ref matmul computes each token row as a
 * matvec, attention is per query token), so logits do not depend on how tokens
 * are grouped into chunks, items or calls: multi-row logits, cached decode and
 * batched evaluation are bitwise-equal to per-position evaluation.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/kv_store.h"
#include "base/errbuf.h"
#include "engine/backend.h"
#include "kernels/cpu/kernels.h"

/* Tokens per forward round. Scratch is sized for this many rows once, at model
 * creation; longer items are processed in rounds of at most this many tokens. */
#define REF_CHUNK 32u
#define REF_KV_WIDTH (KIPP_N_KV_HEAD * KIPP_HEAD_DIM) /* 1024 floats per position */

/** Per-model state: the weight views and activation scratch for one round. */
typedef struct {
    kipp_dims d;
    kipp_qwen3_weights w;   /* views into the engine's mapping; layers owned by the engine */
    uint32_t attn_width;    /* n_q_head * 128: not d_model (seed 000) */
    uint32_t group;         /* query heads per KV head: n_q_head / 8 */
    int kv_q8;              /* 1: q8_0 KV (view.kv_type), k_*_q8_0_ref; 0: BF16 */
    float *x;               /* [REF_CHUNK][d_model] residual stream */
    float *xn;              /* [REF_CHUNK][d_model] normed input of a sublayer */
    float *q;               /* [REF_CHUNK][attn_width] queries */
    float *k;               /* [REF_CHUNK][1024] keys of the round */
    float *v;               /* [REF_CHUNK][1024] values of the round */
    float *att;             /* [REF_CHUNK][attn_width] attention output */
    float *proj;            /* [REF_CHUNK][d_model] o_proj / down_proj output */
    float *gate;            /* [REF_CHUNK][d_ff] gate_proj, then SwiGLU output */
    float *up;              /* [REF_CHUNK][d_ff] up_proj */
    float *fm, *fl;         /* [group] flash-attention running max and sum */
    float *facc;            /* [group][128] flash-attention accumulator */
    kipp_kv_store slab;     /* pooled models: the shared KV slab (zeroed store when not pooled) */
} ref_model;

/** Per-session state: paged KV stores and the RoPE table for every position. */
typedef struct {
    uint32_t n_blocks;      /* logical 32-position blocks */
    uint32_t n_pos;         /* n_blocks * 32 positions */
    kipp_kv_store kv;       /* private: n_blocks physical blocks; pooled: the model's slab */
    int pooled;             /* 1: kv is borrowed from the model, never freed here */
    float *rope;            /* [n_pos][128] f32 cos[64] then sin[64] per position */
} ref_session;

static const kipp_bf16 *bf(const kipp_tensor_view *t) { return (const kipp_bf16 *)t->data; }

/* ---- model ---- */

/* y[n][rows] = x[n][cols] W^T through W's format oracle over the file layout
 * (seed 000 "type-dispatched matvec"; kernels.h k_fmt_info.linear_ref). */
static void linear_ref(const kipp_tensor_view *w, const float *x, float *y, uint32_t n)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)k_fmt_from_gguf(w->dtype));
    fi->linear_ref(w->data, x, y, w->rows, w->cols, n, 0, 1);
}

static void ref_model_destroy(void *bm)
{
    ref_model *m = bm;
    if (!m) return;
    float *bufs[] = {m->x, m->xn, m->q, m->k, m->v, m->att, m->proj, m->gate, m->up, m->fm, m->fl, m->facc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kipp_aligned_free(bufs[i]);
    kipp_kv_store_free(&m->slab);
    free(m);
}

static float *scratch(size_t rows, size_t cols, int *fail)
{
    float *p = kipp_aligned_alloc(rows * cols * sizeof(float));
    if (!p) *fail = 1;
    return p;
}

static int ref_model_create(const kipp_model_view *mv, void **backend_model, char *err, size_t errlen)
{
    *backend_model = NULL; /* mv passed kipp_view_check (engine/view_check.c): every format is one ref runs */
    ref_model *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->d = mv->dims;
    m->w = mv->w;
    m->attn_width = m->d.n_q_head * KIPP_HEAD_DIM;
    m->group = m->d.n_q_head / KIPP_N_KV_HEAD;
    m->kv_q8 = mv->kv_type == 1; /* KIPP_KV_Q8_0 */
    int fail = 0;
    m->x = scratch(REF_CHUNK, m->d.d_model, &fail);
    m->xn = scratch(REF_CHUNK, m->d.d_model, &fail);
    m->q = scratch(REF_CHUNK, m->attn_width, &fail);
    m->k = scratch(REF_CHUNK, REF_KV_WIDTH, &fail);
    m->v = scratch(REF_CHUNK, REF_KV_WIDTH, &fail);
    m->att = scratch(REF_CHUNK, m->attn_width, &fail);
    m->proj = scratch(REF_CHUNK, m->d.d_model, &fail);
    m->gate = scratch(REF_CHUNK, m->d.d_ff, &fail);
    m->up = scratch(REF_CHUNK, m->d.d_ff, &fail);
    m->fm = scratch(m->group, 1, &fail);
    m->fl = scratch(m->group, 1, &fail);
    m->facc = scratch(m->group, KIPP_HEAD_DIM, &fail);
    if (fail) goto oom;
    *backend_model = m;
    return 0;
oom:
    ref_model_destroy(m);
    if (err) snprintf(err, errlen, "ref backend: out of memory allocating activation scratch");
    return KIPP_ENOMEM;
}

/* ---- session: KV stores allocated once, zeroed; RoPE table for its positions ---- */

static void ref_session_destroy(void *bs)
{
    ref_session *s = bs;
    if (!s) return;
    if (!s->pooled) kipp_kv_store_free(&s->kv);
    kipp_aligned_free(s->rope);
    free(s);
}

/* A session of n_blocks logical blocks; its KV is a new zeroed store, or the
 * model's slab when slab != NULL. The RoPE table costs 512 bytes per position
 * next to the KV's n_layer*4096, so a per-session table of exactly the
 * session's positions stays bounded by its KV. */
static int session_new(ref_model *m, uint32_t n_blocks, const kipp_kv_store *slab, void **backend_session,
                       char *err, size_t errlen)
{
    *backend_session = NULL;
    /* the engine sized it from a validated capacity (1..context) */
    KIPP_ASSERT(n_blocks >= 1 && (uint64_t)n_blocks * KIPP_KV_BLOCK <= m->d.context_length + (uint64_t)KIPP_KV_BLOCK - 1);
    ref_session *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->n_blocks = n_blocks;
    s->n_pos = n_blocks * KIPP_KV_BLOCK;
    s->pooled = slab != NULL;
    if (slab) s->kv = *slab;
    else if (kipp_kv_store_alloc(&s->kv, m->d.n_layer, n_blocks, m->kv_q8, 1)) goto oom;
    s->rope = kipp_aligned_alloc((size_t)s->n_pos * KIPP_HEAD_DIM * sizeof(float));
    if (!s->rope) goto oom;
    k_rope_table_yarn(s->rope, s->n_pos, m->d.rope_theta, &m->d.rope_yarn);
    *backend_session = s;
    return 0;
oom:
    ref_session_destroy(s);
    if (err) snprintf(err, errlen, "ref backend: out of memory allocating KV for %u blocks", n_blocks);
    return KIPP_ENOMEM;
}

static int ref_session_create(void *bm, uint32_t n_blocks, void **backend_session, char *err, size_t errlen)
{
    return session_new(bm, n_blocks, NULL, backend_session, err, errlen);
}

/* ---- pooled KV: one zeroed slab per model (seed 000 "Cross-session prefix sharing") ---- */

static int ref_pool_create(void *bm, uint32_t n_blocks, char *err, size_t errlen)
{
    ref_model *m = bm;
    KIPP_ASSERT(!m->slab.k && n_blocks >= 1); /* one pool of >= 1 block: engine/session_pool.c */
    if (kipp_kv_store_alloc(&m->slab, m->d.n_layer, n_blocks, m->kv_q8, 1)) {
        if (err) snprintf(err, errlen, "ref backend: out of memory allocating a KV pool of %u blocks", n_blocks);
        return KIPP_ENOMEM;
    }
    return 0;
}

static int ref_session_create_pooled(void *bm, uint32_t n_blocks, void **backend_session, char *err, size_t errlen)
{
    ref_model *m = bm;
    KIPP_ASSERT(m->slab.k); /* the engine asks for pooled sessions of a pooled model only */
    return session_new(m, n_blocks, &m->slab, backend_session, err, errlen);
}

static void *ref_pool_block_seg(void *bm, uint32_t b, uint32_t seg, size_t *bytes)
{
    ref_model *m = bm;
    KIPP_ASSERT(b < m->slab.n_blocks && seg < 2 * m->slab.n_layer);
    return kipp_kv_store_block_seg(&m->slab, b, seg, bytes);
}

static void ref_pool_copy_block(void *bm, uint32_t src, uint32_t dst)
{
    ref_model *m = bm;
    if (src < m->slab.n_blocks && dst < m->slab.n_blocks && src != dst) kipp_kv_store_copy_block(&m->slab, src, dst);
}

/* ---- the forward: the seed's nine steps, one function each ---- */

/** One round: n <= REF_CHUNK consecutive tokens of one item at positions pos0.. */
typedef struct {
    ref_model *m;
    ref_session *s;
    const uint32_t *block_table; /* [n_blocks] logical -> physical block */
    uint32_t pos0;               /* position of the round's first token */
    uint32_t n;                  /* tokens in the round */
} ref_round;

/* Steps 1 and 7: RMSNorm the residual stream x into xn with weight w [d_model]. */
static void step_rmsnorm(const ref_round *r, const kipp_tensor_view *w)
{
    ref_model *m = r->m;
    k_rmsnorm_f32_ref(m->x, bf(w), m->xn, r->n, m->d.d_model, m->d.rms_eps);
}

/* Step 2: project Q [n][A], K [n][1024] and V [n][1024] from xn. */
static void step_qkv_projection(const ref_round *r, const kipp_qwen3_layer *L)
{
    ref_model *m = r->m;
    linear_ref(&L->wq, m->xn, m->q, r->n);
    linear_ref(&L->wk, m->xn, m->k, r->n);
    linear_ref(&L->wv, m->xn, m->v, r->n);
}

/* Step 3: per-head RMSNorm of every 128-wide Q and K head (V is not normed). */
static void step_qk_norm(const ref_round *r, const kipp_qwen3_layer *L)
{
    ref_model *m = r->m;
    k_rmsnorm_f32_ref(m->q, bf(&L->q_norm), m->q, (size_t)r->n * m->d.n_q_head, KIPP_HEAD_DIM, m->d.rms_eps);
    k_rmsnorm_f32_ref(m->k, bf(&L->k_norm), m->k, (size_t)r->n * KIPP_N_KV_HEAD, KIPP_HEAD_DIM, m->d.rms_eps);
}

/* Step 4: RoPE on Q and K with each token's absolute position (theta from the registry). */
static void step_rope(const ref_round *r)
{
    ref_model *m = r->m;
    for (uint32_t t = 0; t < r->n; t++) {
        const float *cs = r->s->rope + (size_t)(r->pos0 + t) * KIPP_HEAD_DIM;
        k_rope_f32_ref(m->q + (size_t)t * m->attn_width, m->d.n_q_head, cs);
        k_rope_f32_ref(m->k + (size_t)t * REF_KV_WIDTH, KIPP_N_KV_HEAD, cs);
    }
}

/* Step 5: causal grouped-query attention. The round's K/V go into the paged
 * cache first (rounded to BF16, or quantized to q8_0), and every query then reads K/V back from the
 * cache, so the current token sees the same cached values a later decode step
 * will: cached and uncached evaluation are one code path. Query heads
 * [kvh*group, (kvh+1)*group) share KV head kvh (HF repeat_kv). */
static void step_attention(const ref_round *r, uint32_t layer)
{
    ref_model *m = r->m;
    uint8_t *kc = kipp_kv_layer_k(&r->s->kv, layer), *vc = kipp_kv_layer_v(&r->s->kv, layer);
    for (uint32_t t = 0; t < r->n; t++) {
        const float *k = m->k + (size_t)t * REF_KV_WIDTH, *v = m->v + (size_t)t * REF_KV_WIDTH;
        if (m->kv_q8) k_kv_write_q8_0_ref(kc, vc, r->block_table, r->pos0 + t, k, v);
        else k_kv_write_bf16_ref((kipp_bf16 *)kc, (kipp_bf16 *)vc, r->block_table, r->pos0 + t, k, v);
    }
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    for (uint32_t t = 0; t < r->n; t++) {
        for (uint32_t kvh = 0; kvh < KIPP_N_KV_HEAD; kvh++) {
            size_t off = (size_t)t * m->attn_width + (size_t)kvh * m->group * KIPP_HEAD_DIM;
            k_attn_init(m->group, m->fm, m->fl, m->facc); /* one walk from position 0 */
            if (m->kv_q8)
                k_flash_gqa_q8_0_ref(m->q + off, m->group, kc, vc, kvh, r->block_table, 0, r->pos0 + t + 1, scale,
                                     m->fm, m->fl, m->facc);
            else
                k_flash_gqa_bf16_ref(m->q + off, m->group, (const kipp_bf16 *)kc, (const kipp_bf16 *)vc, kvh,
                                     r->block_table, 0, r->pos0 + t + 1, scale, m->fm, m->fl, m->facc);
            for (uint32_t g = 0; g < m->group; g++)
                for (uint32_t i = 0; i < KIPP_HEAD_DIM; i++)
                    m->att[off + g * KIPP_HEAD_DIM + i] = m->facc[g * KIPP_HEAD_DIM + i] / m->fl[g];
        }
    }
}

/* Step 6: attention output projection [n][A] -> [n][d_model], then the residual add. */
static void step_output_projection(const ref_round *r, const kipp_qwen3_layer *L)
{
    ref_model *m = r->m;
    linear_ref(&L->wo, m->att, m->proj, r->n);
    k_add_f32_ref(m->x, m->proj, (size_t)r->n * m->d.d_model);
}

/* Step 8: the SwiGLU MLP, down_proj(silu(gate_proj(xn)) * up_proj(xn)) -> proj. */
static void step_swiglu_mlp(const ref_round *r, const kipp_qwen3_layer *L)
{
    ref_model *m = r->m;
    size_t F = m->d.d_ff;
    linear_ref(&L->w_gate, m->xn, m->gate, r->n);
    linear_ref(&L->w_up, m->xn, m->up, r->n);
    k_swiglu_f32_ref(m->gate, m->up, m->gate, (size_t)r->n * F);
    linear_ref(&L->w_down, m->gate, m->proj, r->n);
}

/* Step 9: the feed-forward residual add. */
static void step_ffn_residual(const ref_round *r)
{
    k_add_f32_ref(r->m->x, r->m->proj, (size_t)r->n * r->m->d.d_model);
}

static void decoder_layer(const ref_round *r, uint32_t layer)
{
    const kipp_qwen3_layer *L = &r->m->w.layers[layer];
    step_rmsnorm(r, &L->attn_norm);   /* 1 */
    step_qkv_projection(r, L);        /* 2 */
    step_qk_norm(r, L);               /* 3 */
    step_rope(r);                     /* 4 */
    step_attention(r, layer);         /* 5 */
    step_output_projection(r, L);     /* 6 */
    step_rmsnorm(r, &L->ffn_norm);    /* 7 */
    step_swiglu_mlp(r, L);            /* 8 */
    step_ffn_residual(r);             /* 9 */
}

/* Final RMSNorm of round row t into hidden (when given), then the head
 * (token_embd when tied; the view already points output at it) -> [vocab]
 * FP32 logits when logits is given. */
static void head_row(const ref_round *r, uint32_t t, float *logits, float *hidden)
{
    ref_model *m = r->m;
    size_t D = m->d.d_model;
    k_rmsnorm_f32_ref(m->x + t * D, bf(&m->w.output_norm), m->xn + t * D, 1, D, m->d.rms_eps);
    if (hidden) memcpy(hidden, m->xn + t * D, D * sizeof *hidden);
    if (logits) linear_ref(&m->w.output, m->xn + t * D, logits, 1);
}

/* Evaluate one item in rounds of REF_CHUNK tokens; logits for its last logits_count tokens,
 * and the final-norm row of its last token into it->hidden when given. */
static void eval_item(ref_model *m, const kipp_eval_item *it)
{
    uint32_t first_logit = it->token_count - it->logits_count; /* item index of the first logits row */
    for (uint32_t r0 = 0; r0 < it->token_count; r0 += REF_CHUNK) {
        ref_round r = {m, it->session, it->block_table, it->start_position + r0,
                       it->token_count - r0 < REF_CHUNK ? it->token_count - r0 : REF_CHUNK};
        for (uint32_t t = 0; t < r.n; t++)
            k_embed_bf16_ref(bf(&m->w.token_embd), it->tokens[r0 + t], m->x + (size_t)t * m->d.d_model,
                             m->d.d_model);
        for (uint32_t layer = 0; layer < m->d.n_layer; layer++) decoder_layer(&r, layer);
        for (uint32_t t = 0; t < r.n; t++) {
            int last = r0 + t + 1 == it->token_count;
            float *hidden = last ? it->hidden : NULL;
            if (r0 + t >= first_logit || hidden)
                head_row(&r, t, r0 + t >= first_logit ? it->logits + (size_t)(r0 + t - first_logit) * m->d.vocab_size : NULL,
                         hidden);
        }
    }
}

/* The engine validated the items (engine/session.c, backend.h); the assert
 * keeps this backend's own invariant, every row inside the session's KV. */
static int ref_eval(void *bm, kipp_eval_item *items, size_t item_count, char *err, size_t errlen)
{
    ref_model *m = bm;
    (void)err, (void)errlen;
    for (size_t i = 0; i < item_count; i++) {
        const ref_session *s = items[i].session;
        KIPP_ASSERT(s && (uint64_t)items[i].start_position + items[i].token_count <= s->n_pos);
    }
    for (size_t i = 0; i < item_count; i++) eval_item(m, &items[i]);
    return 0;
}

/* No describe hook: the ref backend has exactly one path, the scalar kernels. */
const kipp_backend_ops ref_backend_ops = {
    .name = "ref",
    .model_create = ref_model_create,
    .model_destroy = ref_model_destroy,
    .session_create = ref_session_create,
    .session_destroy = ref_session_destroy,
    .eval = ref_eval,
    .pool_create = ref_pool_create,
    .session_create_pooled = ref_session_create_pooled,
    .pool_copy_block = ref_pool_copy_block,
    .pool_block_seg = ref_pool_block_seg,
};
