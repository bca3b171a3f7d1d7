/*
 * fixture_model.h - a small random-weight Qwen3-shaped model built in memory,
 * for session and backend tests that need no file: it fills a kipp_model_view
 * the way engine/model.c does and creates the named backend on it.
 *
 * Shape: d_model 64, 2 layers, 16 query heads (attention width 2048 != d_model),
 * 8 KV heads of 128, d_ff 96, vocab 512, context 300 (not a multiple of 32).
 */
#ifndef KIPP_TEST_FIXTURE_MODEL_H
#define KIPP_TEST_FIXTURE_MODEL_H

#include <stdlib.h>
#include <string.h>

#include "kernels/common.h"
#include "engine/internal.h"

#define FX_VOCAB 512u
#define FX_CTX 300u

typedef struct {
    struct kipp_model model;  /* what sessions see */
    kipp_bf16 *arena;         /* all weights, bf16 */
} fx_model;

static uint64_t fx_rand_state = 0x1234567u;
static int fx_kv_type = 0; /* the KV type fixtures are created with (kipp.h KIPP_KV_*) */
/* Uniform in [-1, 1) from a 64-bit LCG (Knuth MMIX constants). */
static float fx_uniform(void)
{
    fx_rand_state = fx_rand_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(fx_rand_state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static kipp_tensor_view fx_tensor(kipp_bf16 **cur, uint64_t rows, uint64_t cols, float scale, float offset)
{
    kipp_tensor_view t = {*cur, KIPP_DTYPE_BF16, rows, cols, rows * cols * 2};
    for (uint64_t i = 0; i < rows * cols; i++) (*cur)[i] = kipp_f32_to_bf16(offset + scale * fx_uniform());
    *cur += (rows * cols + 31) & ~(uint64_t)31; /* keep 64-byte alignment */
    return t;
}

/** Build the fixture with backend `backend` ("ref"/"cpu"); NULL on failure (err filled). */
static fx_model *fx_model_create(const char *backend, char *err, size_t errlen)
{
    fx_model *fx = calloc(1, sizeof *fx);
    kipp_dims d = {64, 2, 16, 8, 128, 96, FX_VOCAB, FX_CTX, 1e6f, 1e-6f, 0, {0, 0, 0, 0}};
    uint64_t A = d.n_q_head * 128u, D = d.d_model, F = d.d_ff;
    uint64_t per_layer = 3 * D + 2 * 128 + A * D + 2 * 1024 * D + D * A + 3 * F * D + 11 * 32;
    fx->arena = kipp_aligned_alloc((2 * FX_VOCAB * D + D + 64 + d.n_layer * per_layer) * 2);
    kipp_qwen3_layer *layers = calloc(d.n_layer, sizeof *layers);
    kipp_bf16 *cur = fx->arena;
    fx->model.view.dims = d;
    fx->model.view.checkpoint_id = "fixture";
    fx->model.view.kv_type = fx_kv_type;
    fx->model.view.w.token_embd = fx_tensor(&cur, FX_VOCAB, D, 1.0f, 0.0f);
    for (uint32_t i = 0; i < d.n_layer; i++) {
        kipp_qwen3_layer *L = &layers[i];
        L->attn_norm = fx_tensor(&cur, 1, D, 0.2f, 1.0f);
        L->wq = fx_tensor(&cur, A, D, 0.25f, 0.0f);
        L->wk = fx_tensor(&cur, 1024, D, 0.25f, 0.0f);
        L->wv = fx_tensor(&cur, 1024, D, 0.25f, 0.0f);
        L->q_norm = fx_tensor(&cur, 1, 128, 0.2f, 1.0f);
        L->k_norm = fx_tensor(&cur, 1, 128, 0.2f, 1.0f);
        L->wo = fx_tensor(&cur, D, A, 0.04f, 0.0f);
        L->ffn_norm = fx_tensor(&cur, 1, D, 0.2f, 1.0f);
        L->w_gate = fx_tensor(&cur, F, D, 0.25f, 0.0f);
        L->w_up = fx_tensor(&cur, F, D, 0.25f, 0.0f);
        L->w_down = fx_tensor(&cur, D, F, 0.2f, 0.0f);
    }
    fx->model.view.w.layers = layers;
    fx->model.layers = layers;
    fx->model.view.w.output_norm = fx_tensor(&cur, 1, D, 0.2f, 1.0f);
    fx->model.view.w.output = fx_tensor(&cur, FX_VOCAB, D, 1.0f, 0.0f); /* untied head */
    fx->model.ops = kipp_backend_find(backend);
    if (!fx->model.ops || kipp_view_check(&fx->model.view, err, errlen) ||
        fx->model.ops->model_create(&fx->model.view, &fx->model.bm, err, errlen)) {
        if (!fx->model.ops) kipp_err(err, errlen, KIPP_EBACKEND, "unknown backend '%s'", backend);
        free(layers);
        kipp_aligned_free(fx->arena);
        free(fx);
        return NULL;
    }
    return fx;
}

static void fx_model_destroy(fx_model *fx)
{
    if (!fx) return;
    fx->model.ops->model_destroy(fx->model.bm);
    free(fx->model.layers);
    kipp_aligned_free(fx->arena);
    free(fx);
}

/** Deterministic prompt of n ids below FX_VOCAB. */
static void fx_tokens(uint32_t *ids, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++) ids[i] = (i * 7919u + salt * 104729u + 13u) % FX_VOCAB;
}

#endif
