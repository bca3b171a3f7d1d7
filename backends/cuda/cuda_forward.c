/*
 * cuda_forward.c - the cuda backend's forward pass and eval (see
 * cuda_backend.c for the design): the decoder layers composed from
 * kernels/cuda/kcuda.h launches, the head over the rows that need logits,
 * rounds of up to CU_ROUND interleaved rows, and decode steps replayed as
 * CUDA graphs per batch size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_util.h"
#include "base/errbuf.h"
#include "kernels/cuda/kcuda.h"

/* ---------------------------------------------------------------- forward */

/* The first failing launch names the step. */
#define CK(call, name)                          \
    do {                                        \
        if (!rc && (rc = (call)) != 0) *what = (name); \
    } while (0)

/* The decoder layers over n rows whose tokens, positions and block tables
 * are in tok_d/pos_d/btoff_d/bt_d; x holds each row's output. Launches only:
 * legal inside stream capture. */
static int forward_layers(cu_model *m, uint32_t n, const char **what)
{
    const kipp_dims *d = &m->d;
    cudaStream_t st = m->st;
    size_t D = d->d_model, F = d->d_ff;
    kc_rows rows = {m->pos_d, m->btoff_d, m->bt_d};
    size_t layer_elems = (size_t)m->kv_blocks * CU_BLOCK_ELEMS;
    int rc = 0;
    CK(kc_embed(m->embd.p, m->embd.dtype, m->tok_d, n, (uint32_t)D, m->x, st), "kc_embed");
    for (uint32_t l = 0; l < d->n_layer && !rc; l++) {
        const cu_layer *L = &m->L[l];
        uint16_t *kc = m->kc + l * layer_elems, *vc = m->vc + l * layer_elems;
        /* One row: Q|K|V land adjacent in q ([A | 1024 | 1024]), so one launch
         * projects them and one RoPE covers the query and key heads. */
        int qkv1 = n == 1 && L->qkv_fused && m->fuse, gu1 = n == 1 && L->gu_fused && m->fuse;
        float *k = qkv1 ? m->q + m->A : m->k, *v = qkv1 ? m->q + m->A + CU_KV_WIDTH : m->v;
        float *up = gu1 ? m->gate + F : m->up;
        /* Layer l > 0 starts from the previous layer's fused residual add + attn_norm. */
        if (l == 0) CK(kc_rmsnorm(L->attn_norm, m->x, m->xn, n, (uint32_t)D, d->rms_eps, st), "kc_rmsnorm (attn_norm)");
        if (qkv1) {
            CK(kc_linear(L->wq.p, L->wq.dtype, L->wq.rows + L->wk.rows + L->wv.rows, L->wq.cols, m->xn, 1, m->q, st),
               "kc_linear (attn_q|k|v)");
        } else {
            CK(kc_linear(L->wq.p, L->wq.dtype, L->wq.rows, L->wq.cols, m->xn, n, m->q, st), "kc_linear (attn_q)");
            CK(kc_linear(L->wk.p, L->wk.dtype, L->wk.rows, L->wk.cols, m->xn, n, k, st), "kc_linear (attn_k)");
            CK(kc_linear(L->wv.p, L->wv.dtype, L->wv.rows, L->wv.cols, m->xn, n, v, st), "kc_linear (attn_v)");
        }
        CK(kc_head_rmsnorm(L->q_norm, m->q, n, d->n_q_head, KIPP_HEAD_DIM, d->rms_eps, st), "kc_head_rmsnorm (q)");
        CK(kc_head_rmsnorm(L->k_norm, k, n, KIPP_N_KV_HEAD, KIPP_HEAD_DIM, d->rms_eps, st), "kc_head_rmsnorm (k)");
        if (qkv1) {
            CK(kc_rope(m->q, m->pos_d, m->rope, 1, d->n_q_head + KIPP_N_KV_HEAD, st), "kc_rope (q|k)");
        } else {
            CK(kc_rope(m->q, m->pos_d, m->rope, n, d->n_q_head, st), "kc_rope (q)");
            CK(kc_rope(k, m->pos_d, m->rope, n, KIPP_N_KV_HEAD, st), "kc_rope (k)");
        }
        CK(kc_kv_write(kc, vc, k, v, rows, n, CU_KV_WIDTH, st), "kc_kv_write");
        CK(kc_attention(m->q, kc, vc, rows, n, d->n_q_head, KIPP_N_KV_HEAD, m->att, st), "kc_attention");
        CK(kc_linear(L->wo.p, L->wo.dtype, L->wo.rows, L->wo.cols, m->att, n, m->tmp, st), "kc_linear (attn_output)");
        CK(kb_add_rmsnorm(m->x, m->tmp, L->ffn_norm, m->xn, n, (uint32_t)D, d->rms_eps, st),
           "kb_add_rmsnorm (attention residual, ffn_norm)");
        if (gu1) {
            CK(kc_linear(L->gate.p, L->gate.dtype, L->gate.rows + L->up.rows, L->gate.cols, m->xn, 1, m->gate, st),
               "kc_linear (ffn_gate|up)");
        } else {
            CK(kc_linear(L->gate.p, L->gate.dtype, L->gate.rows, L->gate.cols, m->xn, n, m->gate, st), "kc_linear (ffn_gate)");
            CK(kc_linear(L->up.p, L->up.dtype, L->up.rows, L->up.cols, m->xn, n, up, st), "kc_linear (ffn_up)");
        }
        CK(kc_swiglu(m->gate, up, m->gate, n * F, st), "kc_swiglu");
        CK(kc_linear(L->down.p, L->down.dtype, L->down.rows, L->down.cols, m->gate, n, m->tmp, st), "kc_linear (ffn_down)");
        if (l + 1 < d->n_layer)
            CK(kb_add_rmsnorm(m->x, m->tmp, m->L[l + 1].attn_norm, m->xn, n, (uint32_t)D, d->rms_eps, st),
               "kb_add_rmsnorm (ffn residual, next attn_norm)");
        else
            CK(kc_add(m->x, m->tmp, n * D, st), "kc_add (ffn residual)"); /* the head norms only its rows */
    }
    return rc;
}

/* Final RMSNorm of the n rows of src into xl, then the head: logits [n][vocab] (n <= CU_HEAD_ROWS). */
static int head_rows(cu_model *m, const float *src, uint32_t n, const char **what)
{
    int rc = 0;
    CK(kc_rmsnorm(m->out_norm, src, m->xl, n, m->d.d_model, m->d.rms_eps, m->st), "kc_rmsnorm (output_norm)");
    CK(kc_linear(m->out.p, m->out.dtype, m->out.rows, m->out.cols, m->xl, n, m->logits, m->st), "kc_linear (output)");
    return rc;
}

/* The block table of an item's positions [0, last_pos] into bt_h at *nbt, as arena blocks. */
static int32_t put_bt(cu_model *m, const kipp_eval_item *it, uint32_t last_pos, size_t *nbt)
{
    const cu_session *s = it->session;
    int32_t off = (int32_t)*nbt;
    for (uint32_t b = 0; b <= last_pos / KIPP_KV_BLOCK; b++) m->bt_h[(*nbt)++] = s->base + it->block_table[b];
    return off;
}

static cudaError_t upload_meta(cu_model *m, uint32_t rows, size_t nbt, uint32_t nl)
{
    /* One copy of the fixed head (8 KiB, rows and nl <= CU_ROUND) and the bt entries in use. */
    (void)rows;
    (void)nl;
    size_t bytes = 4 * CU_ROUND * sizeof(int32_t) + nbt * sizeof(uint32_t);
    return cudaMemcpyAsync(m->meta_d, m->meta_h, bytes, cudaMemcpyHostToDevice, m->st);
}

/* Copy logits rows [0, n) of the device buffer to their host destinations (NULL: not wanted). */
static cudaError_t copy_logits(cu_model *m, float *const *dst, uint32_t n)
{
    size_t V = m->d.vocab_size;
    cudaError_t e = cudaSuccess;
    for (uint32_t j = 0; j < n && !e; j++)
        if (dst[j]) e = cudaMemcpyAsync(dst[j], m->logits + j * V, V * sizeof(float), cudaMemcpyDeviceToHost, m->st);
    return e;
}

/* Capture the decode step of n rows (layers + head over every row) as a graph. */
static int capture_decode(cu_model *m, uint32_t n, const char **what)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamBeginCapture(m->st, cudaStreamCaptureModeThreadLocal);
    if (e) {
        *what = "cudaStreamBeginCapture";
        return (int)e;
    }
    int rc = forward_layers(m, n, what);
    if (!rc) rc = head_rows(m, m->x, n, what);
    e = cudaStreamEndCapture(m->st, &g); /* ends capture mode even after a failed launch */
    if (!rc && e) rc = (int)e, *what = "cudaStreamEndCapture";
    if (!rc) {
        e = cudaGraphInstantiate(&exec, g, 0);
        if (e) rc = (int)e, *what = "cudaGraphInstantiate";
    }
    if (g) cudaGraphDestroy(g);
    if (!rc) m->graph[n] = exec;
    return rc;
}

/* Every item one token: one row each, run as the graph of that batch size. */
static int eval_decode(cu_model *m, kipp_eval_item *items, uint32_t n, char *err, size_t errlen)
{
    size_t nbt = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kipp_eval_item *it = &items[i];
        m->tok_h[i] = it->tokens[0];
        m->pos_h[i] = (int32_t)it->start_position;
        m->btoff_h[i] = put_bt(m, it, it->start_position, &nbt);
        m->ldst[i] = it->logits_count ? it->logits : NULL;
    }
    const char *what = "uploading the batch metadata";
    cudaError_t e = upload_meta(m, n, nbt, 0);
    if (e) return cu_report_cuda(m, e, what, err, errlen);
    int rc = 0;
    /* The first step of a size runs eagerly (module loading, lazy init inside
     * the kernel units happen outside capture); the second captures. */
    if (!m->graphs_off && !m->graph[n] && m->ran[n]) {
        rc = capture_decode(m, n, &what);
        if (rc) { /* graphs off from now on; this step runs eagerly below */
            snprintf(m->graph_note, sizeof m->graph_note, "capture of %u rows failed at %s: %s", n, what,
                     cudaGetErrorName((cudaError_t)rc));
            m->graphs_off = 1;
            cu_destroy_graphs(m);
            (void)cudaGetLastError();
            rc = 0;
        }
    }
    if (!m->graphs_off && m->graph[n]) {
        what = "cudaGraphLaunch (decode)";
        rc = (int)cudaGraphLaunch(m->graph[n], m->st);
    } else {
        rc = forward_layers(m, n, &what);
        if (!rc) rc = head_rows(m, m->x, n, &what);
    }
    if (!rc) what = "copying logits to the host", rc = (int)copy_logits(m, m->ldst, n);
    e = cudaStreamSynchronize(m->st);
    if (!rc && e) rc = (int)e, what = "the decode step";
    if (!rc) m->ran[n] = 1;
    return rc ? cu_report_cuda(m, (cudaError_t)rc, what, err, errlen) : 0;
}

/* Items' rows interleaved into rounds of up to CU_ROUND rows; each round runs
 * the layers over all its rows, then the head over the rows that need logits. */
static int eval_rounds(cu_model *m, kipp_eval_item *items, size_t n_items, char *err, size_t errlen)
{
    size_t D = m->d.d_model, V = m->d.vocab_size;
    size_t cur = 0;
    uint32_t done = 0; /* tokens of items[cur] in earlier rounds */
    while (cur < n_items) {
        uint32_t rows = 0, nl = 0;
        size_t nbt = 0;
        while (cur < n_items && rows < CU_ROUND) {
            const kipp_eval_item *it = &items[cur];
            uint32_t take = it->token_count - done;
            if (take > CU_ROUND - rows) take = CU_ROUND - rows;
            uint32_t p0 = it->start_position + done;
            int32_t off = put_bt(m, it, p0 + take - 1, &nbt);
            uint32_t first_logit = it->token_count - it->logits_count;
            for (uint32_t t = 0; t < take; t++, rows++) {
                m->tok_h[rows] = it->tokens[done + t];
                m->pos_h[rows] = (int32_t)(p0 + t);
                m->btoff_h[rows] = off;
                if (done + t >= first_logit) {
                    m->lidx_h[nl] = (int32_t)rows;
                    m->ldst[nl++] = it->logits + (size_t)(done + t - first_logit) * V;
                }
            }
            done += take;
            if (done == it->token_count) cur++, done = 0;
        }
        const char *what = "uploading the batch metadata";
        int rc = (int)upload_meta(m, rows, nbt, nl);
        if (!rc) rc = forward_layers(m, rows, &what);
        if (!rc && nl) {
            what = "kb_gather_rows";
            rc = kb_gather_rows(m->x, m->lidx_d, nl, (uint32_t)D, m->tmp, m->st);
        }
        for (uint32_t h0 = 0; !rc && h0 < nl; h0 += CU_HEAD_ROWS) {
            uint32_t hn = nl - h0 < CU_HEAD_ROWS ? nl - h0 : CU_HEAD_ROWS;
            rc = head_rows(m, m->tmp + (size_t)h0 * D, hn, &what);
            if (!rc) what = "copying logits to the host", rc = (int)copy_logits(m, m->ldst + h0, hn);
        }
        /* The pinned staging is refilled by the next round: wait for this one. */
        cudaError_t e = cudaStreamSynchronize(m->st);
        if (!rc && e) rc = (int)e, what = "a forward round";
        if (rc) return cu_report_cuda(m, (cudaError_t)rc, what, err, errlen);
    }
    return 0;
}

/* The engine validated the items (engine/session.c, backend.h), block tables
 * included; the assert keeps this backend's own invariant, every row inside
 * the session's KV. */
int cu_eval(void *bm, kipp_eval_item *items, size_t item_count, char *err, size_t errlen)
{
    cu_model *m = bm;
    if (item_count == 0) return 0;
    if (m->broken[0]) {
        if (err) snprintf(err, errlen, "cuda backend: %s; the device context is unusable, reopen the model", m->broken);
        return KIPP_EBACKEND;
    }
    for (size_t i = 0; i < item_count; i++)
        if (items[i].hidden) { /* the final-norm row stays on the device here: not copied out yet */
            if (err) snprintf(err, errlen, "cuda backend: item %zu asks for its hidden state (embeddings), which this "
                              "backend does not return yet; use --backend cpu", i);
            return KIPP_ENOTSUP;
        }
    int decode = item_count <= CU_GRAPH_MAX;
    for (size_t i = 0; i < item_count; i++) {
        const kipp_eval_item *it = &items[i];
        const cu_session *s = it->session;
        KIPP_ASSERT(s && s->m == m && (uint64_t)it->start_position + it->token_count <= (uint64_t)s->n_blocks * KIPP_KV_BLOCK);
        if (it->token_count != 1) decode = 0;
    }
    cudaSetDevice(m->device);
    return decode ? eval_decode(m, items, (uint32_t)item_count, err, errlen)
                  : eval_rounds(m, items, item_count, err, errlen);
}
