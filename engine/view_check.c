/*
 * view_check.c - the model view a backend receives, checked once by the
 * engine (docs/ARCHITECTURE.md "Ownership": tensor views validated at open).
 *
 * kipp_model_open runs it after LoRA merging, right before
 * ops->model_create, so every backend may rely on a Qwen3 shape with every
 * tensor present, of its slot's shape, the norms and the embedding in BF16
 * and the projections and head in a weight format of kernels/formats.h. A
 * backend then refuses only what it cannot run (a format or an alignment it
 * lacks, KIPP_ENOTSUP), never a malformed view.
 */
#include <stdio.h>

#include "engine/internal.h"
#include "kernels/qwen3_shape.h"

static int check_tensor(const kipp_tensor_view *t, const char *name, uint32_t layer, uint64_t rows, uint64_t cols,
                        int weight, char *err, size_t errlen)
{
    int type_ok = t->dtype == KIPP_DTYPE_BF16 || (weight && kipp_fmt_by_gguf(t->dtype));
    if (t->data && type_ok && t->rows == rows && t->cols == cols) return KIPP_OK;
    char where[24] = "";
    if (layer != UINT32_MAX) snprintf(where, sizeof where, " of layer %u", layer);
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "model view: tensor %s%s is [%llu][%llu] %s (data %s), expected [%llu][%llu] %s", name, where,
                    (unsigned long long)t->rows, (unsigned long long)t->cols, kipp_gguf_type_name(t->dtype),
                    t->data ? "set" : "NULL", (unsigned long long)rows, (unsigned long long)cols,
                    weight ? "in a weight format (BF16, Q8_0 or Q4_1)" : "BF16");
}

int kipp_view_check(const kipp_model_view *v, char *err, size_t errlen)
{
    const kipp_dims *d = &v->dims;
    if (d->head_dim != KIPP_HEAD_DIM || d->n_kv_head != KIPP_N_KV_HEAD || d->n_q_head == 0 ||
        d->n_q_head % KIPP_N_KV_HEAD || d->d_model == 0 || d->d_model % 32 || d->d_ff == 0 || d->d_ff % 32 ||
        d->n_layer == 0 || d->vocab_size == 0 || d->context_length == 0 || !v->w.layers)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "model view: dims d_model %u, n_layer %u, n_q_head %u, n_kv_head %u, head_dim %u, d_ff %u, "
                        "vocab %u, context %u (layers %s) are not a Qwen3 shape; expected 8 KV heads of 128, "
                        "n_q_head a multiple of 8, widths multiples of 32, a context and the layers bound",
                        d->d_model, d->n_layer, d->n_q_head, d->n_kv_head, d->head_dim, d->d_ff, d->vocab_size,
                        d->context_length, v->w.layers ? "set" : "NULL");
    const uint64_t A = (uint64_t)d->n_q_head * KIPP_HEAD_DIM, D = d->d_model, F = d->d_ff,
                   KV = (uint64_t)KIPP_N_KV_HEAD * KIPP_HEAD_DIM, H = KIPP_HEAD_DIM, none = UINT32_MAX;
    int rc = check_tensor(&v->w.token_embd, "token_embd", none, d->vocab_size, D, 0, err, errlen);
    if (!rc) rc = check_tensor(&v->w.output_norm, "output_norm", none, 1, D, 0, err, errlen);
    if (!rc) rc = check_tensor(&v->w.output, "output", none, d->vocab_size, D, 1, err, errlen);
    for (uint32_t l = 0; !rc && l < d->n_layer; l++) {
        const kipp_qwen3_layer *L = &v->w.layers[l];
        const struct {
            const kipp_tensor_view *t;
            const char *name;
            uint64_t rows, cols;
            int weight;
        } slot[] = {
            {&L->attn_norm, "attn_norm", 1, D, 0},  {&L->wq, "attn_q", A, D, 1},
            {&L->wk, "attn_k", KV, D, 1},           {&L->wv, "attn_v", KV, D, 1},
            {&L->q_norm, "attn_q_norm", 1, H, 0},   {&L->k_norm, "attn_k_norm", 1, H, 0},
            {&L->wo, "attn_output", D, A, 1},       {&L->ffn_norm, "ffn_norm", 1, D, 0},
            {&L->w_gate, "ffn_gate", F, D, 1},      {&L->w_up, "ffn_up", F, D, 1},
            {&L->w_down, "ffn_down", D, F, 1},
        };
        for (size_t i = 0; !rc && i < sizeof slot / sizeof slot[0]; i++)
            rc = check_tensor(slot[i].t, slot[i].name, l, slot[i].rows, slot[i].cols, slot[i].weight, err, errlen);
    }
    return rc;
}
