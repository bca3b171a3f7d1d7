/*
 * bench_model.h - what kipp-bench's two files share: the options, a model's
 * byte and FLOP counts, one measured case and its roofline facts, and the
 * timing and result writers of bench_model.c that the batched rows of
 * bench_batch.c run through. Internal to kipp-bench (not part of libkipp).
 */
#ifndef KIPP_BENCH_MODEL_H
#define KIPP_BENCH_MODEL_H

#include <stdint.h>

#include "bench/bench_harness.h"
#include "engine/kipp.h"

#define MAX_MODELS 8
#define MAX_LORA 8      /* --lora entries */
#define REPS_MAX 64     /* --reps at most */
#define TG_PROMPT 16u   /* prompt before tg128 and before each batch row's sequences */
#define TARGET_PREFILL 0.80 /* prefill rows: share of the compute peak */
/* Target: 8 sequences decoding together at >= 70% of the
 * one-read-per-step limit (B tokens per read of the weights). */
#define TARGET_BATCH 0.70
#define BATCH_STEPS 32u /* kipp_eval_batch steps timed per rep of a batch row */
#define BATCH_MAX 32u   /* the largest B of the batch rows */

/* Command line of kipp-bench. */
typedef struct {
    const char *models[MAX_MODELS];
    int n_models;
    const char *backend;
    unsigned benches;  /* bit i: BENCH_NAMES[i] (bench_model.c) was asked for */
    int bench_given;   /* --bench named them (else: the default, all of them) */
    int reps, warmup, threads;
    const char *profiles, *out;
    kipp_lora_spec lora[MAX_LORA]; /* --lora PATH[:SCALE], repeatable; paths in lora_path */
    char lora_path[MAX_LORA][4096];
    uint32_t n_lora;
    int rope_override;             /* --rope-scaling given: rope replaces the file's scaling */
    int kv_type;                   /* --kv-type: KIPP_KV_BF16 (default) or KIPP_KV_Q8_0 */
    kipp_rope_scaling rope;
    uint32_t long_ctx;             /* --long-ctx: positions of the pplong/tglong rows (bench_long.c) */
    const char *draft_model;       /* --draft-model FILE: the tg128_draft row (bench_draft.c); NULL = none */
    int draft_max, draft_min;      /* --draft-max/--draft-min: its draft lengths, 1..16; 0 = the defaults */
} options;

/* Bytes and FLOPs of one model, from its dimensions (seed 000 shapes); the
 * byte counts are then replaced by the file's real tensor bytes. */
typedef struct {
    kipp_model_info info;
    double layer_weight_bytes; /* every layer projection + norm, all layers */
    double head_bytes;         /* output head [vocab][d_model] as stored (bf16, or the --quant-head format) */
    double head_params;        /* output head weights vocab x d_model (2 FLOP each per sampled row) */
    double layer_params;       /* projection weights, all layers (2 FLOP each per token) */
    double kv_bytes_per_pos;   /* K+V bytes read per cached position, all layers */
    double attn_flops_per_pos; /* QK^T and PV FLOPs per attended position, all layers */
} model_cost;

/* One measured case: setup (untimed) then the timed part, reps + warmup times. */
typedef struct {
    kipp_session *s;
    const uint32_t *ids;
    uint32_t prefix;  /* tokens already in the cache before the timed part (kept) */
    uint32_t n_prompt; /* tokens evaluated in one call in the timed part (0 = decode) */
    uint32_t steps;   /* decode steps in the timed part */
    float *logits;
    /* Batch rows (n_seq > 0): sessions ss[n_seq] evaluate together, one
     * kipp_eval_batch of n_seq items of item_tokens tokens each per step, the
     * last position of each with a logits row; sequence j reads its ids at
     * ids + j * stride, and its logits row is logits + j * vocab. */
    kipp_model *m;
    kipp_session **ss;
    uint32_t n_seq, stride, vocab, item_tokens;
} bench_case;

/* What the roofline and target of one benchmark are. */
typedef struct {
    const char *name;
    double tokens;          /* tokens per timed run */
    double bytes_per_token; /* decode: bytes read per token */
    double flops_per_token; /* prefill: FLOPs per token */
    double context;         /* mean attended positions */
    int compute_bound;
    double target;
    int probed;                     /* decode: probe[] holds reps + 1 read probes */
    double probe[REPS_MAX + 1];     /* read GB/s probed before rep i (probe[i]) and after the last; 0 = failed */
    double sec[REPS_MAX];           /* seconds of each timed rep, in the order run */
} bench_meta;

/* How a model's bf16 projections ran (bf16_act_of in bench_model.c). */
typedef struct {
    char mode[16]; /* KIPP_BF16_ACT mode: "f32", "mixed", "bf16"; "-" without one */
    int dot;       /* 1 when some projection read BF16 activations through vdpbf16ps */
} bf16_run;

/* Whether --bench asked for the row called name (bench_model.c). */
int wants(const options *o, const char *name);

/* n fixed pseudo-random token ids (LCG) below vocab, from seed (bench_model.c). */
void fill_tokens(uint32_t *ids, size_t n, uint32_t vocab, uint32_t seed);

/* Warm-up, then reps timed runs of bc (bench_model.c); probe non-NULL: read
 * probes around every rep; sec[i] the seconds of rep i. 0, or -1 with err set. */
int measure(const bench_case *bc, int warmup, int reps, double *probe, double *sec, kipp_bench_stats *st,
            char *err, size_t errlen);

/* measure() with a read probe beside every rep, into bm->probe (bench_model.c). */
int measure_decode(const bench_case *bc, const options *o, bench_meta *bm, kipp_bench_stats *st, char *err,
                   size_t errlen);

/* One result object (kipp.bench.v1) of a measured row, printed as it is
 * built (bench_model.c); the caller owns the returned reference. */
json_t *result_json(const char *model_id, const bench_meta *bm, const kipp_bench_stats *st, const kipp_profile *prof,
                    const bf16_run *act);

/* One timed run of a batch row (bench_batch.c): every session back to its
 * prefix (untimed), then bc->steps kipp_eval_batch calls. */
int run_batch_once(const bench_case *bc, double *sec, char *err, size_t errlen);

/* The batchB rows and pp8x128 that --bench asks for, appended to results
 * (bench_batch.c). 0, or -1 with err set. */
int batch_rows(const options *o, kipp_model *m, const model_cost *c, const kipp_profile *prof, const bf16_run *act,
               const char *id, json_t *results, char *err, size_t errlen);

/* The pplong and tglong rows that --bench asks for, on a session of their own
 * of o->long_ctx positions, appended to results (bench_long.c). 0, or -1 with
 * err set (a --long-ctx beyond the model's context among them). */
/* Positions of the long rows' session: --long-ctx + their decode steps + 32; 0 when neither is asked for. */
uint32_t long_cap(const options *o);

int long_rows(const options *o, kipp_model *m, const model_cost *c, const kipp_profile *prof, const bf16_run *act,
              const char *id, json_t *results, char *err, size_t errlen);
/* With --draft-model: the tg128_draft:<draft id> row of model m (model id id), appended to
 * results (bench_draft.c): draft-model speculative greedy decoding against plain greedy,
 * interleaved, each run checked exact. 0, or an error code with err set (naming both files
 * when the draft cannot draft for m). */
int draft_row(const options *o, kipp_model *m, const char *id, json_t *results, char *err, size_t errlen);

#endif
