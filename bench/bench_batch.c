/*
 * bench_batch.c - kipp-bench's batched rows, through kipp_eval_batch:
 *   batchB (B = 1, 2, 4, 8, 16, 32): B sessions, each prefilled (untimed)
 *     with its own TG_PROMPT pseudo-random tokens, then BATCH_STEPS steps of
 *     one kipp_eval_batch holding one decode token of each, every row with
 *     its logits (every row samples); read probes beside every rep as for
 *     tg128. The shape of llama-batched-bench -npp 16 -ntg 32 -npl B (S_TG).
 *   pp8x128: 8 empty sessions, one kipp_eval_batch holding a 128-token
 *     prompt of each, the last position of each with its logits. The shape
 *     of llama-batched-bench -npp 128 -npl 8 (S_PP).
 * Each row records the bytes and FLOPs of one step, the FLOPs split into the
 * layers', the head's and attention's, so a reader can bound the step by
 * the read bandwidth and by the peak of each part's arithmetic
 * (tools/step_limit.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_model.h"

/* B of each batchB row, in BENCH_NAMES order (bench_model.c). */
static const uint32_t BATCH_SIZES[] = {1, 2, 4, 8, 16, 32};
#define N_BATCH (sizeof BATCH_SIZES / sizeof BATCH_SIZES[0])
#define PP_BATCH_PROMPTS 8u   /* pp8x128: prompts in the one kipp_eval_batch */
#define PP_BATCH_TOKENS 128u  /* pp8x128: tokens of each prompt */

int run_batch_once(const bench_case *bc, double *sec, char *err, size_t errlen)
{
    kipp_batch_item items[BATCH_MAX];
    int rc = 0;
    for (uint32_t j = 0; j < bc->n_seq && !rc; j++) rc = kipp_session_truncate(bc->ss[j], bc->prefix, err, errlen);
    if (rc) return rc;
    double t0 = kipp_timer_now();
    for (uint32_t i = 0; i < bc->steps && !rc; i++) {
        for (uint32_t j = 0; j < bc->n_seq; j++)
            items[j] = (kipp_batch_item){bc->ss[j], bc->ids + (size_t)j * bc->stride + bc->prefix + i * bc->item_tokens,
                                         bc->item_tokens, 1, bc->logits + (size_t)j * bc->vocab, NULL};
        rc = kipp_eval_batch(bc->m, items, bc->n_seq, err, errlen);
    }
    *sec = kipp_timer_now() - t0;
    return rc;
}

/* One step of a batched row: n_seq items of item_tokens tokens each, every
 * item's last position sampled (a logits row), attending ctx positions on
 * average. */
typedef struct {
    double n_seq, item_tokens, ctx;
} step_shape;

/* Bytes one step reads: every weight once (the one-read-per-step model: the
 * rows of a step share each weight read), plus for each token its embedding
 * row and final-norm input, and for each sequence the KV of ctx positions
 * (decode: the cache read; prefill: ctx = the prompt, its KV written once). */
static double step_bytes(const model_cost *c, step_shape sh)
{
    return c->layer_weight_bytes + c->head_bytes + sh.n_seq * sh.item_tokens * 4.0 * c->info.d_model +
           sh.n_seq * sh.ctx * c->kv_bytes_per_pos;
}

/* The keys every batched row adds to result_json's: the step's shape, its
 * bytes (weight_bytes_per_step: all layers plus the head) and its FLOPs by
 * part: layers (2 per weight per token), head (2 per head weight per
 * sampled row: one per item) and attention (QK^T and PV over ctx positions
 * per token). */
static void step_keys(json_t *r, const model_cost *c, step_shape sh, uint32_t steps)
{
    double tokens = sh.n_seq * sh.item_tokens;
    json_object_set_new(r, "steps_per_rep", json_integer(steps));
    json_object_set_new(r, "tokens_per_step", json_real(tokens));
    json_object_set_new(r, "sampled_rows_per_step", json_real(sh.n_seq));
    json_object_set_new(r, "bytes_per_step", json_real(step_bytes(c, sh)));
    json_object_set_new(r, "weight_bytes_per_step", json_real(c->layer_weight_bytes + c->head_bytes));
    json_object_set_new(r, "flops_per_step_layers", json_real(tokens * 2 * c->layer_params));
    json_object_set_new(r, "flops_per_step_head", json_real(sh.n_seq * 2 * c->head_params));
    json_object_set_new(r, "flops_per_step_attention", json_real(tokens * sh.ctx * c->attn_flops_per_pos));
}

/* batchB's read limit beside result_json's keys: B tokens per read of the
 * step's bytes at the row's roofline (the median read probe beside the
 * reps; null without one). */
static void batch_keys(json_t *r, const model_cost *c, step_shape sh)
{
    json_t *roof = json_object_get(r, "roofline");
    double bw = roof && json_is_number(roof) ? json_number_value(roof) : 0, bytes = step_bytes(c, sh);
    json_object_set_new(r, "batch", json_integer((json_int_t)sh.n_seq));
    step_keys(r, c, sh, BATCH_STEPS);
    json_object_set_new(r, "limit_tok_s", bw > 0 ? json_real(sh.n_seq * bw * 1e9 / bytes) : json_null());
    if (bw > 0)
        printf("         one-read-per-step limit %.0f x %.1f GB/s / %.1f MB = %.1f tok/s\n", sh.n_seq, bw, bytes / 1e6,
               sh.n_seq * bw * 1e9 / bytes);
}

/* One batched row called name: sh.n_seq sessions, each with its own ids
 * (seed 100 + j) and its first prefix tokens evaluated (untimed), then
 * steps kipp_eval_batch calls of sh.n_seq items of sh.item_tokens tokens.
 * Decode rows (prefix > 0) are measured against read probes and held to the
 * one-read-per-step limit; the prefill row to the compute peak as pp512. */
static int batched_row(const options *o, kipp_model *m, const model_cost *c, const kipp_profile *prof,
                       const bf16_run *act, const char *id, const char *name, step_shape sh, uint32_t prefix,
                       uint32_t steps, json_t *results, char *err, size_t errlen)
{
    const uint32_t n = (uint32_t)sh.n_seq, item = (uint32_t)sh.item_tokens, V = c->info.vocab_size;
    const uint32_t stride = prefix + steps * item;
    kipp_session *ss[BATCH_MAX] = {0};
    uint32_t *ids = malloc((size_t)n * stride * sizeof *ids);
    float *logits = malloc((size_t)n * V * sizeof *logits);
    int rc = 0;
    if (!ids || !logits) rc = -1, snprintf(err, errlen, "out of memory for %u sequences' ids and logits", n);
    for (uint32_t j = 0; j < n && !rc; j++) {
        fill_tokens(ids + (size_t)j * stride, stride, V, 100 + j);
        rc = kipp_session_create(m, stride + 1, &ss[j], err, errlen);
        if (!rc && prefix) rc = kipp_session_eval(ss[j], ids + (size_t)j * stride, prefix, logits, err, errlen);
    }
    if (!rc) {
        bench_case bc = {.ids = ids, .prefix = prefix, .steps = steps, .logits = logits, .m = m, .ss = ss,
                         .n_seq = n, .stride = stride, .vocab = V, .item_tokens = item};
        double tokens = sh.n_seq * sh.item_tokens;
        bench_meta bm = {.name = name, .tokens = tokens * steps, .context = sh.ctx, .compute_bound = prefix == 0,
                         .target = prefix ? TARGET_BATCH : TARGET_PREFILL};
        bm.bytes_per_token = step_bytes(c, sh) / tokens;
        bm.flops_per_token = 2 * c->layer_params + sh.ctx * c->attn_flops_per_pos + sh.n_seq * 2 * c->head_params / tokens;
        kipp_bench_stats st;
        rc = prefix ? measure_decode(&bc, o, &bm, &st, err, errlen)
                    : measure(&bc, o->warmup, o->reps, NULL, bm.sec, &st, err, errlen);
        if (!rc) {
            json_t *r = result_json(id, &bm, &st, prof, act);
            if (prefix)
                batch_keys(r, c, sh);
            else {
                json_object_set_new(r, "prompts", json_integer(n));
                json_object_set_new(r, "prompt_tokens", json_integer(item));
                step_keys(r, c, sh, steps);
            }
            json_array_append_new(results, r);
        }
    }
    for (uint32_t j = 0; j < n; j++) kipp_session_destroy(ss[j]);
    free(ids);
    free(logits);
    return rc;
}

int batch_rows(const options *o, kipp_model *m, const model_cost *c, const kipp_profile *prof, const bf16_run *act,
               const char *id, json_t *results, char *err, size_t errlen)
{
    int rc = 0;
    char name[16];
    for (size_t b = 0; b < N_BATCH && !rc; b++) {
        snprintf(name, sizeof name, "batch%u", BATCH_SIZES[b]);
        step_shape sh = {.n_seq = BATCH_SIZES[b], .item_tokens = 1, .ctx = TG_PROMPT + (BATCH_STEPS + 1) / 2.0};
        if (wants(o, name)) rc = batched_row(o, m, c, prof, act, id, name, sh, TG_PROMPT, BATCH_STEPS, results, err, errlen);
    }
    snprintf(name, sizeof name, "pp%ux%u", PP_BATCH_PROMPTS, PP_BATCH_TOKENS);
    step_shape sh = {.n_seq = PP_BATCH_PROMPTS, .item_tokens = PP_BATCH_TOKENS, .ctx = (PP_BATCH_TOKENS + 1) / 2.0};
    if (!rc && wants(o, name)) rc = batched_row(o, m, c, prof, act, id, name, sh, 0, 1, results, err, errlen);
    return rc;
}
