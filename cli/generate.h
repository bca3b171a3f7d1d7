/*
 * generate.h - pieces shared by `kipp generate`, `kipp chat` and `kipp logits`
 * (cli/cmd_generate.c, cli/cmd_chat.c). CLI-internal: only kipp.h below it.
 */
#ifndef KIPP_CLI_GENERATE_H
#define KIPP_CLI_GENERATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kipp.h"

#define CLI_MAX_BIAS 64 /* --logit-bias entries */

/** Options common to the three commands; filled by cli_gen_parse. */
typedef struct {
    const char *model;        /* --model FILE (required) */
    const char *backend;      /* --backend NAME; default "cpu" */
    const char *prompt;       /* --prompt TEXT (generate, logits) */
    const char *out;          /* --out FILE (logits) */
    int chat;                 /* --chat: render the prompt as one user turn */
    int think;                /* 0 with --no-think (hybrid templates), else 1 */
    int threads;              /* --threads N; 0 = one per physical core */
    int show_ids;             /* --show-ids: print generated ids to stderr */
    int no_reuse;             /* --no-cache-reuse (chat): re-prefill every turn; a test oracle */
    uint32_t max_tokens;      /* --max-tokens N: generated tokens per reply; default 128 */
    uint32_t ctx;             /* --ctx N: session capacity for chat; 0 = default */
    uint64_t seed;            /* --seed S; default 0 */
    kipp_sample_params sp;    /* --temperature/--top-p/--top-k/--min-p/--repeat-penalty/... */
    kipp_logit_bias bias[CLI_MAX_BIAS]; /* --logit-bias ID=B, repeatable; sp.logit_bias points here */
} cli_gen_opts;

/**
 * Parse argv (argv[0] = command name) into o for command cmd ("generate",
 * "chat", "logits"); unknown, malformed or out-of-range arguments print one
 * sentence to stderr naming the argument and the expectation. Returns 0, or 2
 * (the exit status for argument errors).
 */
int cli_gen_parse(const char *cmd, int argc, char **argv, cli_gen_opts *o);

/** Open o->model on o->backend; prints the error and returns the exit status (1, or 2 for a bad backend). */
int cli_gen_open(const char *cmd, const cli_gen_opts *o, kipp_model **out);

/** Tokenize text (special tokens matched) into a malloc'd array *ids[*n]; 0 or a KIPP_E* code. */
int cli_gen_tokenize(kipp_model *m, const char *text, uint32_t **ids, size_t *n, char *err, size_t errlen);

/** Seconds on the monotonic clock. */
double cli_now(void);

/** What one streamed reply did, for the timings line. */
typedef struct {
    uint32_t n_generated;     /* tokens sampled and emitted (stop token excluded) */
    uint32_t n_decode_evals;  /* one-token evaluations after the prompt */
    int stopped;              /* 1: a stop token ended the reply */
    int full;                 /* 1: the session reached its capacity */
    double t_start;           /* cli_now() when the prefill started (set by the caller) */
    double t_first;           /* seconds from t_start to the first sampled token (TTFT) */
    double t_decode;          /* seconds spent in decode evaluations */
} cli_reply_stats;

/**
 * Sample from logits (the prompt's final row, from session s of model m), then stream up to o->max_tokens
 * tokens to out through a detokenizer, evaluating each one in s, stopping at
 * the model's stop ids or when the session is full. Generated ids go to
 * ids[*n_ids] (grown with realloc) when ids is non-NULL; their text to *text
 * (malloc'd, NUL-terminated) when text is non-NULL. Returns 0 or a KIPP_E* code
 * with err filled.
 */
int cli_gen_stream(kipp_model *m, kipp_session *s, const cli_gen_opts *o, float *logits, kipp_rng *rng,
                   FILE *out, uint32_t **ids, size_t *n_ids, char **text, cli_reply_stats *st, char *err,
                   size_t errlen);

/** Print the one-line timings summary to stderr. */
void cli_gen_print_timings(const char *cmd, const kipp_model *m, size_t n_prompt, double t_prefill,
                           const cli_reply_stats *st);

#endif
