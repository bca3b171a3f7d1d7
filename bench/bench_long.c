/*
 * bench_long.c - kipp-bench's long-context rows (issue 53 item 3), asked for
 * by name only (never in the default set: at 16,384 positions one rep of the
 * prefill is minutes on 2 cores):
 *   pplong: one prefill of --long-ctx N tokens (default 16,384) from an empty
 *     cache, named "ppN" (pp16384): llama-bench -p N -n 0.
 *   tglong: LONG_STEPS decode steps with N positions already in the cache,
 *     named "tgNk" (tg16k; "tg@N" when N is not a multiple of 1,024):
 *     llama-bench -p 0 -n 32 -d N. The cache is the one pplong's last rep
 *     left (the same N tokens), else filled untimed first.
 * Each row records the bytes and FLOPs of one step split into the layers',
 * the head's and attention's, with the keys of the batched rows
 * (bench_batch.c), plus kv_bytes_per_step and kv_type, so a reader can bound
 * the step by the read bandwidth and the peak of each part's arithmetic and
 * say how much of that bound is attention's (tools/step_limit.py,
 * tools/bench_peers.py --long).
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_model.h"

#define LONG_STEPS 32u      /* decode steps timed after the long fill (tg4k's count) */
#define PPLONG_REPS_MAX 1   /* one rep of pplong is a whole long prefill */
#define TARGET_LONG_PREFILL 0.80
#define TARGET_LONG_DECODE 0.90

/* The step keys of one long row: tokens per step (N for the prefill, 1 for a decode step), the bytes
 * (weights once, the KV of ctx positions: read by decode, written by the prefill) and the FLOPs by part
 * (layers 2 per weight per token, the head 2 per head weight for the one sampled row, attention QK^T and
 * PV over ctx positions per token on average: the causal prefill's quadratic term). */
static void long_keys(json_t *r, const model_cost *c, double tokens, double ctx, double kv_positions, uint32_t n)
{
    double kv = kv_positions * c->kv_bytes_per_pos, w = c->layer_weight_bytes + c->head_bytes;
    json_object_set_new(r, "long_context", json_integer(n));
    /* the model's --kv-type, whose bytes kv_bytes_per_pos counts: tools/bench_peers.py refuses a row whose
     * kv_type is not the one it asked for, and takes the decode limit from kv_bytes_per_step */
    json_object_set_new(r, "kv_type", json_string(c->info.kv_type));
    json_object_set_new(r, "tokens_per_step", json_real(tokens));
    json_object_set_new(r, "sampled_rows_per_step", json_real(1));
    json_object_set_new(r, "bytes_per_step", json_real(w + tokens * 4.0 * c->info.d_model + kv));
    json_object_set_new(r, "weight_bytes_per_step", json_real(w));
    json_object_set_new(r, "kv_bytes_per_step", json_real(kv));
    json_object_set_new(r, "flops_per_step_layers", json_real(tokens * 2 * c->layer_params));
    json_object_set_new(r, "flops_per_step_head", json_real(2 * c->head_params));
    json_object_set_new(r, "flops_per_step_attention", json_real(tokens * ctx * c->attn_flops_per_pos));
}

/* The row names for N positions: "ppN" and "tgNk" ("tg@N" off the 1,024 grid). */
static void long_names(uint32_t n, char *pp, char *tg, size_t len)
{
    snprintf(pp, len, "pp%u", n);
    if (n % 1024 == 0) snprintf(tg, len, "tg%uk", n / 1024);
    else snprintf(tg, len, "tg@%u", n);
}

static int pp_long(const options *o, kipp_session *s, const uint32_t *ids, const model_cost *c,
                   const kipp_profile *prof, const bf16_run *act, const char *id, float *logits, json_t *results,
                   char *err, size_t errlen)
{
    uint32_t n = o->long_ctx;
    char name[32], tg[32];
    long_names(n, name, tg, sizeof name);
    kipp_bench_stats st;
    bench_case bc = {.s = s, .ids = ids, .prefix = 0, .n_prompt = n, .steps = 0, .logits = logits};
    bench_meta bm = {.name = name, .tokens = n, .context = (n + 1) / 2.0, .compute_bound = 1,
                     .target = TARGET_LONG_PREFILL};
    bm.flops_per_token = 2 * c->layer_params + c->attn_flops_per_pos * bm.context + 2 * c->head_params / n;
    bm.bytes_per_token = (c->layer_weight_bytes + c->head_bytes) / n;
    int reps = o->reps < PPLONG_REPS_MAX ? o->reps : PPLONG_REPS_MAX;
    if (measure(&bc, 0, reps, NULL, bm.sec, &st, err, errlen)) return -1;
    json_t *r = result_json(id, &bm, &st, prof, act);
    long_keys(r, c, n, bm.context, n, n);
    json_array_append_new(results, r);
    return 0;
}

static int tg_long(const options *o, kipp_session *s, const uint32_t *ids, const model_cost *c,
                   const kipp_profile *prof, const bf16_run *act, const char *id, float *logits, int filled,
                   json_t *results, char *err, size_t errlen)
{
    uint32_t n = o->long_ctx;
    char pp[32], name[32];
    long_names(n, pp, name, sizeof name);
    if (!filled) {
        double t0 = kipp_timer_now();
        if (kipp_session_truncate(s, 0, err, errlen) || kipp_session_eval(s, ids, n, logits, err, errlen)) return -1;
        printf("  (KV filled with %u tokens in %.1f s)\n", n, kipp_timer_now() - t0);
    }
    kipp_bench_stats st;
    bench_case bc = {.s = s, .ids = ids, .prefix = n, .n_prompt = 0, .steps = LONG_STEPS, .logits = logits};
    bench_meta bm = {.name = name, .tokens = LONG_STEPS, .context = n + (LONG_STEPS + 1) / 2.0, .compute_bound = 0,
                     .target = TARGET_LONG_DECODE};
    bm.bytes_per_token = c->layer_weight_bytes + c->head_bytes + 4.0 * c->info.d_model + bm.context * c->kv_bytes_per_pos;
    bm.flops_per_token = 2 * c->layer_params + 2 * c->head_params + c->attn_flops_per_pos * bm.context;
    if (measure_decode(&bc, o, &bm, &st, err, errlen)) return -1;
    json_t *r = result_json(id, &bm, &st, prof, act);
    long_keys(r, c, 1, bm.context, bm.context, n);
    json_array_append_new(results, r);
    return 0;
}

uint32_t long_cap(const options *o)
{
    return wants(o, "pplong") || wants(o, "tglong") ? o->long_ctx + LONG_STEPS + 32 : 0;
}

int long_rows(const options *o, kipp_model *m, const model_cost *c, const kipp_profile *prof, const bf16_run *act,
              const char *id, json_t *results, char *err, size_t errlen)
{
    int pp = wants(o, "pplong"), tg = wants(o, "tglong");
    if (!pp && !tg) return 0;
    uint32_t n = o->long_ctx, cap = long_cap(o);
    if (cap > c->info.context_length) {
        snprintf(err, errlen, "--long-ctx %u needs a context of %u positions (%u decode steps after it); %s has a "
                 "context length of %u", n, n + LONG_STEPS, LONG_STEPS, id, c->info.context_length);
        return -1;
    }
    kipp_session *s = NULL;
    uint32_t *ids = malloc((size_t)cap * sizeof *ids);
    float *logits = malloc((size_t)c->info.vocab_size * sizeof *logits);
    int rc = -1;
    if (!ids || !logits) snprintf(err, errlen, "out of memory for %u token ids", cap);
    else {
        fill_tokens(ids, cap, c->info.vocab_size, 53);
        rc = kipp_session_create(m, cap, &s, err, errlen);
    }
    if (!rc && pp) rc = pp_long(o, s, ids, c, prof, act, id, logits, results, err, errlen);
    if (!rc && tg) rc = tg_long(o, s, ids, c, prof, act, id, logits, pp, results, err, errlen);
    kipp_session_destroy(s);
    free(ids);
    free(logits);
    return rc;
}
