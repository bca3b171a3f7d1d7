/*
 * cpu_forward.c - the Qwen3 forward pass of one round (seed 000, the nine
 * per-layer steps; HF Qwen3DecoderLayer), run by every pool worker.
 *
 * Decode rounds (one row) use the matvec kernel, wider rounds the tiled
 * matmul (seed 002 items 4-5). Each projection is split by output rows across
 * workers inside the kernel; row-local steps (norms, RoPE, KV write, residual)
 * are split by token rows, and fused where the same worker owns the row, so a
 * layer needs eight barriers.
 */
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "base/errbuf.h"

/* y[n][rows] = x[n][cols] W^T for this worker's share of W's rows, through
 * the row of W's format: matvec for one row (decode, bandwidth-bound), the
 * tiled matmul for more (prefill); each reads its activation format (the same
 * for decode and prefill, so a row's arithmetic does not depend on the path),
 * x itself when that is F32, else the copy kipp_cpu_act left in xa, then the
 * format's outlier_fix adds the Q8 blocks' FP32 outliers. */
static void linear(const cpu_model *m, const k_weight *w, const float *x, float *y, uint32_t n,
                   int ith, int nth)
{
    const k_fmt_kernels *k = &m->k->fmt[w->fmt];
    const k_fmt_info *fi = k_fmt_get(w->fmt);
    const void *in = fi->act == K_ACT_F32 ? (const void *)x : m->xa;
    if (m->st) { /* file layout, streamed; the slices apply outlier_fix themselves */
        kipp_cpu_stream_linear(m, w, 0, w->rows, in, y, w->rows, n, ith, nth, ith);
        return;
    }
    if (n == 1)
        k->matvec(w->data, in, y, w->rows, w->cols, ith, nth);
    else
        k->matmul(w->data, in, y, w->rows, w->cols, n, 0, ith, nth);
    if (fi->outlier_fix) fi->outlier_fix(w->data, in, y, w->rows, w->cols, n, ith, nth);
}

static void my_rows(size_t n, int ith, int nth, size_t *r0, size_t *r1)
{
    k_split_rows(n, ith, nth, 1, r0, r1);
}

/* RMSNorm of x into xn row i, and the activation copy that `next` (the
 * projection reading xn: QKV or Gate|Up) wants. */
static void norm_row(const cpu_round *r, const kipp_tensor_view *w, const k_weight *next, const float *x, size_t i)
{
    const cpu_model *m = r->m;
    size_t D = m->d.d_model;
    m->k->rmsnorm_f32(x, w->data, m->xn + i * D, 1, D, m->d.rms_eps);
    kipp_cpu_act(m, next, m->xn + i * D, i * D, D);
}

/* Embedding gather plus layer 0's attention norm (steps before layer 0's step 2). */
static void embed_rows(cpu_round *r, int ith, int nth)
{
    cpu_model *m = r->m;
    size_t D = m->d.d_model, r0, r1;
    my_rows(r->n_rows, ith, nth, &r0, &r1);
    for (size_t i = r0; i < r1; i++) {
        m->k->embed_bf16(m->w.token_embd.data, m->row_tok[i], m->x + i * D, D);
        norm_row(r, &m->w.layers[0].attn_norm, &m->lw[0].qkv, m->x + i * D, i);
    }
}

/* Steps 3-4 plus the paged KV write: per-head Q/K RMSNorm, RoPE, page K and V. */
static void qk_rows(cpu_round *r, uint32_t l, int ith, int nth)
{
    cpu_model *m = r->m;
    const kipp_qwen3_layer *L = &m->w.layers[l];
    size_t KV = KIPP_N_KV_HEAD * KIPP_HEAD_DIM, r0, r1;
    my_rows(r->n_rows, ith, nth, &r0, &r1);
    for (size_t i = r0; i < r1; i++) {
        const kipp_eval_item *it = &r->items[m->row_item[i]];
        const cpu_session *s = it->session;
        float *q = m->qkv + i * m->QKV, *k = q + m->A, *v = k + KV;
        const float *cs = m->rope + (size_t)m->row_pos[i] * KIPP_HEAD_DIM;
        m->k->rmsnorm_f32(q, L->q_norm.data, q, m->d.n_q_head, KIPP_HEAD_DIM, m->d.rms_eps);
        m->k->rmsnorm_f32(k, L->k_norm.data, k, KIPP_N_KV_HEAD, KIPP_HEAD_DIM, m->d.rms_eps);
        m->k->rope_f32(q, m->d.n_q_head, cs);
        m->k->rope_f32(k, KIPP_N_KV_HEAD, cs);
        if (m->kv_q8)
            m->k->kv_write_q8_0(kipp_kv_layer_k(&s->kv, l), kipp_kv_layer_v(&s->kv, l), it->block_table,
                                m->row_pos[i], k, v);
        else
            m->k->kv_write_bf16((kipp_bf16 *)kipp_kv_layer_k(&s->kv, l), (kipp_bf16 *)kipp_kv_layer_v(&s->kv, l),
                                it->block_table, m->row_pos[i], k, v);
    }
}

/* Residual add of `tmp`, then RMSNorm with `w` into xn (and next's activation copy), for this worker's rows. */
static void add_norm_rows(cpu_round *r, const kipp_tensor_view *w, const k_weight *next, int ith, int nth)
{
    cpu_model *m = r->m;
    size_t D = m->d.d_model, r0, r1;
    my_rows(r->n_rows, ith, nth, &r0, &r1);
    for (size_t i = r0; i < r1; i++) {
        m->k->add_f32(m->x + i * D, m->tmp + i * D, D);
        norm_row(r, w, next, m->x + i * D, i);
    }
}

/* SwiGLU over this worker's share of all n_rows * d_ff elements into the
 * compact rows of sw, plus the activation copy for the down projection
 * (shares in multiples of 32: whole quantization blocks). */
static void swiglu_share(cpu_round *r, const k_weight *down, int ith, int nth)
{
    cpu_model *m = r->m;
    size_t F = m->d.d_ff, e0, e1;
    k_split_rows((size_t)r->n_rows * F, ith, nth, 32, &e0, &e1);
    while (e0 < e1) {
        size_t row = e0 / F, c0 = e0 % F, c1 = row * F + F < e1 ? F : e1 - row * F;
        float *g = m->gu + row * 2 * F;
        float *out = m->sw + row * F + c0;
        m->k->swiglu_f32(g + c0, g + F + c0, out, c1 - c0);
        kipp_cpu_act(m, down, out, row * F + c0, c1 - c0);
        e0 = row * F + c1;
    }
}

/* One decoder layer. On entry xn/xa hold RMSNorm(x) with this layer's
 * attn_norm; on exit x holds the layer output and, when `next` is given,
 * xn/xa hold RMSNorm(x) with the next layer's attn_norm. */
static void layer(cpu_round *r, uint32_t l, const kipp_tensor_view *next, int ith, int nth)
{
    cpu_model *m = r->m;
    kipp_threadpool *pool = m->pool;
    const cpu_layer *P = &m->lw[l];
    uint32_t n = r->n_rows;
    if (m->st && ith == 0) /* prefetch what runs next: layer l+1, after the last the head (or layer 0 without logits) */
        kipp_cpu_stream_begin(m, l, l + 1 < m->d.n_layer ? l + 1 : r->n_logits ? m->d.n_layer : 0);
    linear(m, &P->qkv, m->xn, m->qkv, n, ith, nth);                   /* step 2 */
    if (ith == 0) atomic_store(&r->attn_next, 0);
    kipp_threadpool_barrier(pool);
    qk_rows(r, l, ith, nth);                                          /* steps 3-4, KV write */
    kipp_threadpool_barrier(pool);
    kipp_cpu_attention(r, l, ith, nth);                               /* step 5 (+ cvt of att) */
    kipp_threadpool_barrier(pool);
    linear(m, &P->o, m->att, m->tmp, n, ith, nth);                    /* step 6 */
    kipp_threadpool_barrier(pool);
    add_norm_rows(r, &m->w.layers[l].ffn_norm, &P->gu, ith, nth);     /* steps 6-7 */
    kipp_threadpool_barrier(pool);
    linear(m, &P->gu, m->xn, m->gu, n, ith, nth);                     /* step 8 */
    kipp_threadpool_barrier(pool);
    swiglu_share(r, &P->down, ith, nth);
    kipp_threadpool_barrier(pool);
    linear(m, &P->down, m->sw, m->tmp, n, ith, nth);
    kipp_threadpool_barrier(pool);
    if (next) {                                                        /* step 9 + next step 1 */
        add_norm_rows(r, next, &m->lw[l + 1].qkv, ith, nth);
        kipp_threadpool_barrier(pool);
    }
}

/* After the last layer: residual add and final RMSNorm of the rows that need
 * logits or a hidden state only, compacted into xn rows [0, n_logits +
 * n_hidden): the head reads the first n_logits (and their xa copies); a
 * hidden row is copied out as normed. */
static void final_rows(cpu_round *r, int ith, int nth)
{
    cpu_model *m = r->m;
    size_t D = m->d.d_model, j0, j1;
    my_rows(r->n_logits + r->n_hidden, ith, nth, &j0, &j1);
    for (size_t j = j0; j < j1; j++) {
        float *x = m->x + (size_t)m->lrow[j] * D;
        m->k->add_f32(x, m->tmp + (size_t)m->lrow[j] * D, D);
        m->k->rmsnorm_f32(x, m->w.output_norm.data, m->xn + j * D, 1, D, m->d.rms_eps);
        if (m->lhid[j]) memcpy(m->lhid[j], m->xn + j * D, D * sizeof(float));
        if (j < r->n_logits) kipp_cpu_act(m, &m->head, m->xn + j * D, j * D, D);
    }
}

/* Output head over 151,936 rows. When the logits rows go to several items,
 * each worker runs its share of the vocabulary in blocks through a private
 * staging buffer and scatters, so the head is still read once per round. */
static void head(cpu_round *r, int ith, int nth)
{
    cpu_model *m = r->m;
    size_t V = m->d.vocab_size, D = m->d.d_model, B = KIPP_CPU_HEAD_BLOCK, v0, v1;
    uint32_t nl = r->n_logits;
    if (m->st && ith == 0) kipp_cpu_stream_begin(m, m->d.n_layer, 0); /* the head runs: layer 0 next */
    if (r->head_direct) {
        linear(m, &m->head, m->xn, m->ldst[0], nl, ith, nth);
        return;
    }
    float *stage = m->head_tmp + (size_t)ith * KIPP_CPU_ROUND_TOKENS * B;
    k_split_rows(V, ith, nth, B, &v0, &v1);
    for (size_t vb = v0; vb < v1; vb += B) {
        size_t nb = v1 - vb < B ? v1 - vb : B; /* vocab % 16 == 0, so nb stays whole panels */
        if (m->st) {
            kipp_cpu_stream_linear(m, &m->head, vb, vb + nb, k_fmt_get(m->head.fmt)->act == K_ACT_F32 ? (const void *)m->xn : m->xa,
                                   stage, nb, nl, 0, 1, ith); /* this worker's rows and slice buffers */
            for (uint32_t j = 0; j < nl; j++) memcpy(m->ldst[j] + vb, stage + (size_t)j * nb, nb * sizeof(float));
            continue;
        }
        k_weight blk = m->head; /* rows [vb, vb + nb): whole packed panels (vocab and B are multiples of 16) */
        blk.data = (const char *)m->head.data + k_fmt_get(blk.fmt)->packed_bytes(vb, D);
        blk.rows = nb;
        linear(m, &blk, m->xn, stage, nl, 0, 1);
        for (uint32_t j = 0; j < nl; j++)
            for (size_t i = 0; i < nb; i++) m->ldst[j][vb + i] = stage[j * nb + i];
    }
}

void kipp_cpu_forward_round(void *arg, int ith, int nth)
{
    cpu_round *r = arg;
    cpu_model *m = r->m;
    uint32_t nl = m->d.n_layer;
    embed_rows(r, ith, nth);
    kipp_threadpool_barrier(m->pool);
    for (uint32_t l = 0; l < nl; l++)
        layer(r, l, l + 1 < nl ? &m->w.layers[l + 1].attn_norm : NULL, ith, nth);
    if (r->n_logits + r->n_hidden == 0) return;
    final_rows(r, ith, nth);
    if (r->n_logits == 0) return; /* hidden states only (embeddings): no head */
    kipp_threadpool_barrier(m->pool);
    head(r, ith, nth);
}
