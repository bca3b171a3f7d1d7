/*
 * generate.h - pieces shared by `kipp generate`, `kipp chat` and `kipp logits`
 * (cli/gen_args.c, cli/cmd_generate.c, cli/cmd_chat.c). CLI-internal: only
 * kipp.h below it.
 */
#ifndef KIPP_CLI_GENERATE_H
#define KIPP_CLI_GENERATE_H

#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>

#include "engine/kipp.h"

#define CLI_MAX_BIAS 64 /* --logit-bias entries */
#define CLI_MAX_THREADS 1024 /* --threads upper bound; the cpu thread pool's own limit (base/threadpool.c) */
#define CLI_DEFAULT_MAX_TOKENS 128u
#define CLI_MAX_LORA 8 /* --lora entries */
#define CLI_LORA_PATH 4096 /* bytes of one --lora path */
#define CLI_HELP_SHOWN (-1) /* cli_gen_parse printed --help: exit 0 */

/** Options common to the three commands; filled by cli_gen_parse. */
typedef struct {
    const char *model;        /* --model FILE (required) */
    const char *backend;      /* --backend NAME; default "cpu" */
    const char *prompt;       /* --prompt TEXT (generate, logits) */
    const char *out;          /* --out FILE (logits) */
    int chat;                 /* --chat: render the prompt as one user turn */
    int think;                /* 0 with --no-think (hybrid templates), else 1 */
    int threads;              /* --threads N; 0 = one per physical core */
    const char *threads_arg;  /* --threads as written; NULL when not given */
    int show_ids;             /* --show-ids: print generated ids to stderr */
    int no_reuse;             /* --no-cache-reuse (chat): re-prefill every turn; a test oracle */
    const char *system;       /* --system TEXT (chat): the system message; NULL = none */
    const char *kv_cache_dir; /* --kv-cache-dir DIR (chat): the KV disk tier; NULL = off */
    uint64_t kv_cache_disk_mib; /* --kv-cache-disk-mib N (chat); 0 = not given (4096) */
    int spec;                 /* --spec (generate): prompt-lookup speculative decoding, greedy only */
    int no_spec;              /* --no-spec: plain decoding (the default; refused beside --spec or a draft) */
    uint32_t spec_k;          /* --spec-k N: longest draft, 1..16; default 8 */
    int spec_fixed;           /* --spec-fixed: no adaptive gate, always draft up to --spec-k */
    const char *draft_model;  /* --draft-model FILE: draft-model speculative decoding (sets spec) */
    const char *draft_self;   /* --draft-self q8_0|affine4: the converter's quantized twin of --model as draft */
    char draft_path[4096];    /* the --draft-self file's path */
    uint32_t draft_min;       /* --draft-min N: a draft the gate allows is at least N long; 0 = 1 */
    kipp_model *draft;        /* the draft model, opened by cli_gen_open (the caller closes it) */
    uint32_t max_tokens;      /* --max-tokens N: generated tokens per reply; default 128 */
    uint64_t ctx;             /* --ctx N: session capacity (generate, chat); 0 = default */
    int ctx_plan;             /* --ctx 0: the planner's context (kipp_plan_context) */
    const char *ctx_arg;      /* --ctx as written, for messages */
    uint64_t seed;            /* --seed S; default 0 */
    kipp_sample_params sp;    /* --temperature/--top-p/--top-k/--min-p/--repeat-penalty/... */
    kipp_logit_bias bias[CLI_MAX_BIAS]; /* --logit-bias ID=B, repeatable; sp.logit_bias points here */
    const char *bias_arg[CLI_MAX_BIAS]; /* each --logit-bias as written */
    kipp_lora_spec lora[CLI_MAX_LORA];  /* --lora PATH[:SCALE], repeatable; paths in lora_path */
    char lora_path[CLI_MAX_LORA][CLI_LORA_PATH];
    uint32_t n_lora;
    int stream;               /* --stream auto|on|off: KIPP_STREAM_* */
    int no_prefetch;          /* --no-prefetch */
    int rope_override;        /* 1: --rope-scaling given (rope below), else the file's scaling */
    kipp_rope_scaling rope;   /* --rope-scaling */
    int kv_type;              /* --kv-type: KIPP_KV_BF16 (default) or KIPP_KV_Q8_0 */
} cli_gen_opts;

/**
 * Parse argv (argv[0] = command name) into o for command cmd ("generate",
 * "chat", "logits"); unknown, malformed or out-of-range arguments, and options
 * another command uses, print one sentence to stderr naming the flag and the
 * value as written. Returns 0; 2 (the exit status for argument errors); or
 * CLI_HELP_SHOWN after printing --help to stdout (the caller exits 0).
 * --ctx is bounded by the model's context length later, in cli_gen_open.
 */
int cli_gen_parse(const char *cmd, int argc, char **argv, cli_gen_opts *o);

/**
 * Open o->model on o->backend, and o->draft_model (or --draft-self's file) into
 * o->draft when given, refused unless it shares the model's tokenizer (the
 * message names both files and the difference), and check what needs the model (--logit-bias ids
 * below the vocabulary, --ctx within the context length); prints the error and
 * returns the exit status (1, or 2 for a bad backend or argument).
 */
int cli_gen_open(const char *cmd, cli_gen_opts *o, kipp_model **out);

/**
 * The session capacity --ctx asks for: o->ctx, 0 for the command's default, or
 * with --ctx 0 the planner's context for this machine (kipp_plan_context; a
 * stderr line says what it picked). Returns 0, or 1 after printing the error.
 */
int cli_gen_ctx(const char *cmd, kipp_model *m, const cli_gen_opts *o, uint64_t *ctx);

/**
 * Tokenize text[len] (special tokens matched; NUL bytes are text) into a
 * malloc'd array *ids[*n]; 0 or a KIPP_E* code.
 */
int cli_gen_tokenize(kipp_model *m, const char *text, size_t len, uint32_t **ids, size_t *n, char *err,
                     size_t errlen);

/** Seconds on the monotonic clock. */
double cli_now(void);

/**
 * Set (to 1) by `kipp chat`'s SIGINT handler; cli_gen_stream stops the reply at
 * the next token when it is set and marks the reply interrupted. The caller clears it.
 */
extern volatile sig_atomic_t cli_interrupted;

/** What one streamed reply did, for the timings line. */
typedef struct {
    uint32_t n_generated;     /* tokens sampled and emitted (stop token excluded) */
    uint32_t n_decode_evals;  /* decode evaluations after the prompt */
    int prefilled;            /* 1: the whole prompt was evaluated (the reply has started) */
    int stopped;              /* 1: a stop token ended the reply */
    int full;                 /* 1: the session reached its capacity */
    int interrupted;          /* 1: Ctrl-C stopped the reply (cli_interrupted) */
    double t_start;           /* cli_now() when the prefill started (set by the caller) */
    double t_prefill;         /* seconds spent evaluating the prompt */
    double t_first;           /* seconds from t_start to the first sampled token (TTFT) */
    double t_decode;          /* seconds spent in decode evaluations */
    uint32_t n_decode_tokens; /* tokens those evaluations produced (> n_decode_evals with --spec) */
    int spec_on;              /* 1: the reply decoded speculatively; spec_stats holds the drafter's counters */
    kipp_spec_stats spec_stats;
} cli_reply_stats;

/**
 * Generate one reply in session s, a batch of one through kipp_gen: evaluate
 * what s does not hold yet of prompt[n_prompt] (s holds a prefix of it: a
 * chat's earlier turns), then decode up to o->max_tokens tokens (sampling,
 * --spec, stop ids) and stream their text to out, stopping at a stop id, when
 * the session is full, or at Ctrl-C once the prompt is evaluated. *rng is
 * continued and updated. Generated ids go to ids[*n_ids] (grown with realloc)
 * when ids is non-NULL; their text to *text[*text_len] (malloc'd,
 * NUL-terminated, may hold NUL bytes) when text is non-NULL. Returns 0 or a
 * KIPP_E* code with err filled.
 */
int cli_gen_stream(kipp_model *m, kipp_session *s, const cli_gen_opts *o, const uint32_t *prompt, size_t n_prompt,
                   kipp_rng *rng, FILE *out, uint32_t **ids, size_t *n_ids, char **text, size_t *text_len,
                   cli_reply_stats *st, char *err, size_t errlen);

/**
 * Print the one-line timings summary (with the sampling seed) to stderr, and a
 * note when the reply stopped because the session's context was full.
 */
void cli_gen_print_timings(const char *cmd, const kipp_model *m, kipp_session *s, const cli_gen_opts *o,
                           size_t n_prompt, const cli_reply_stats *st);

/** A clause to append to an error message: a corrupt-weights hint for KIPP_ENUMERIC, else "". */
const char *cli_gen_hint(int rc);

/** Print "kipp CMD: err" (or rc's kipp_strerror when err is empty) plus cli_gen_hint(rc) to stderr. */
void cli_gen_report(const char *cmd, int rc, const char *err);

#endif
