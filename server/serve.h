/*
 * serve.h - kipp-serve's internal types (seed 000 "Server and API surface",
 * phases 5-6). Layers, each in its own files, calling downward only:
 *
 *   serve_http.c     libmicrohttpd: connections, limits, routing, SSE writer
 *   api_parse.c      JSON body -> serve_req (validation; no model needed)
 *   api_prepare.c    serve_req -> prompt token ids (tokenizer / chat renderer)
 *   api_render.c     job results -> OpenAI JSON (responses, chunks, errors)
 *   text_out.c       per-choice text: stop strings, hold-back, reasoning split
 *   api_tools.c      tools, tool_choice, tool messages -> serve_req (validation)
 *   tool_calls.c     <tool_call> blocks in a reply -> calls + remaining content
 *   sched.c          FIFO + continuous batching over kipp_eval_batch
 *   metrics.c        counters and histograms, Prometheus text
 *
 * Only engine/kipp.h is below: the server never sees backend state or KV memory.
 */
#ifndef KIPP_SERVE_H
#define KIPP_SERVE_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kipp.h"

#define SERVE_MAX_N 8          /* choices per request */
#define SERVE_MAX_STOP 4       /* stop strings per request (OpenAI) */
#define SERVE_MAX_STOP_LEN 256 /* bytes per stop string */
#define SERVE_MAX_BIAS 300     /* logit_bias entries (OpenAI allows 300) */
#define SERVE_MAX_MSGS 256     /* chat messages per request */
#define SERVE_CHUNK 32         /* prefill chunk every prefilling choice gets per step while the budget lasts */
#define SERVE_STEP_TOKENS 512  /* default token budget of one step (--step-tokens) */
#define SERVE_RESERVE 16       /* pooled: KV positions a choice reserves beyond its prompt (admission, resumption) */
#define SERVE_MAX_TOOLS 128    /* tools per request (OpenAI allows 128) */
#define SERVE_MAX_PARALLEL 8   /* tool calls one constrained reply may make with parallel_tool_calls */

/** An error for the client: HTTP status and the OpenAI error object's fields. */
typedef struct {
    int status;          /* 400, 404, 413, 429, 500, 503 */
    const char *type;    /* "invalid_request_error", "not_found_error", ... */
    char param[64];      /* offending field ("" = none) */
    char code[48];       /* machine code ("" = null) */
    char message[512];
} serve_error;

/** Fill e and return -1 (so callers can `return serve_fail(...)`). */
int serve_fail(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/** One chat message as parsed: text parts already joined with "\n", as the
 * engine joins kipp_chat_message content parts (kipp.h; vLLM does the same). */
typedef struct {
    kipp_role role;
    char *content;            /* malloc'd, may be NULL (assistant); may hold NUL bytes */
    size_t content_len;       /* bytes of content */
    char *reasoning_content;  /* assistant history, malloc'd or NULL */
    size_t reasoning_len;     /* bytes of reasoning_content */
    kipp_tool_call *calls;    /* assistant tool_calls [n_calls]: name and arguments malloc'd (api_tools.c) */
    size_t n_calls;
    char **call_ids;          /* [n_calls] each call's id, malloc'd */
    char *tool_call_id;       /* tool messages: the call answered, malloc'd */
} serve_msg;

/** One function tool of a request (api_tools.c). */
typedef struct {
    char *name;               /* function.name, malloc'd */
    char *parameters;         /* function.parameters as compact JSON (a JSON Schema object), malloc'd; NULL = none */
} serve_tool;

/** tool_choice: auto (default with tools), none, required, or one named function. */
enum { SERVE_TOOL_AUTO = 0, SERVE_TOOL_NONE, SERVE_TOOL_REQUIRED, SERVE_TOOL_NAMED };

/** A parsed, validated request (api_parse.c); owns every pointer. */
typedef struct {
    int chat;                 /* 1: /v1/chat/completions */
    char *model;              /* "model" as sent, or NULL */
    /* prompt: completions: text or ids; chat: messages */
    char *prompt_text;        /* completions string prompt */
    uint32_t *prompt_ids;     /* [n_prompt] after prepare (or as sent) */
    size_t n_prompt;
    int prompt_is_ids;        /* the client sent token ids */
    serve_msg *msgs;          /* [n_msgs] */
    size_t n_msgs;
    int api;                  /* SERVE_API_*: the public API the request came through (its reply and error shapes) */
    int enable_thinking;      /* chat_template_kwargs.enable_thinking; default 1 */
    int64_t thinking_budget;  /* reasoning tokens allowed before "</think>" is forced into the sequence; -1 = unbounded */
    int priority;             /* vLLM's "priority": lower is sooner (admission and preemption order); default 0 */
    int starts_in_reasoning;  /* set by prepare: the rendered prompt ends inside <think> */
    int thinking;             /* set by prepare: split reasoning_content from content */
    size_t truncated_messages; /* set by prepare: oldest messages dropped to fit n_ctx (usage.truncated_messages) */
    /* generation */
    int n;                    /* choices, 1..8 */
    int64_t max_tokens;       /* -1 = until the context is full; prepare cuts it to the room left */
    int64_t max_tokens_asked; /* what the client sent, -1 = none (the default applies) */
    const char *max_tokens_field; /* "max_tokens" or "max_completion_tokens", as sent (static) */
    kipp_sample_params sp;    /* history fields unset */
    kipp_logit_bias *bias;    /* [sp.n_logit_bias], malloc'd */
    uint64_t seed;
    int seed_set;
    char *stop[SERVE_MAX_STOP];
    size_t n_stop;
    int stream, include_usage;
    int logprobs;             /* 0 = off, 1 = on */
    int top_logprobs;         /* alternatives per token: completions 0..5, chat 0..20 */
    int echo;                 /* completions: prompt in text (and its logprobs) */
    /* tools (api_tools.c) */
    serve_tool *tools;        /* [n_tools] */
    size_t n_tools;
    char *tools_json;         /* the tools array as sent, compact JSON (the template dumps each), or NULL */
    int tool_choice;          /* SERVE_TOOL_* */
    size_t tool_named;        /* SERVE_TOOL_NAMED: index into tools */
    int parallel_tool_calls;  /* 1 (default): a reply may make several calls */
    /* constrained output */
    int response_format;      /* SERVE_RF_TEXT (none), SERVE_RF_JSON_OBJECT or SERVE_RF_JSON_SCHEMA */
    char *rf_schema;          /* json_schema: the schema as compact JSON text, malloc'd */
    kipp_grammar *grammar;    /* set by prepare when the reply is constrained (response_format, or tool_choice
                               * required / named); every choice's gen uses it */
} serve_req;

/** The public APIs kipp-serve mirrors; a request's api picks its reply and error shapes. */
enum { SERVE_API_OPENAI = 0, SERVE_API_ANTHROPIC, SERVE_API_RESPONSES };

/** 1 when replies to r are parsed for <tool_call> blocks: tools given and tool_choice not "none". */
int serve_tools_active(const serve_req *r);

enum { SERVE_RF_TEXT = 0, SERVE_RF_JSON_OBJECT, SERVE_RF_JSON_SCHEMA };

/** Zero a request and set the defaults (n 1, thinking on, neutral sampling). */
void serve_req_init(serve_req *r, int chat);
/** Free what r owns; r may be zeroed. */
void serve_req_free(serve_req *r);

/**
 * Parse and validate a JSON body of len bytes (need not be NUL-terminated) for
 * the completions (chat = 0) or chat endpoint into r (initialised here).
 * Returns 0, or -1 with e filled (status 400: the message names the field and
 * the expectation). Needs no model: the fuzz target calls it directly.
 */
int serve_parse(const char *body, size_t len, int chat, serve_req *r, serve_error *e);

/**
 * The tool fields of a chat request body (root): tools, tool_choice and
 * parallel_tool_calls, checked together (a named tool_choice must name one of
 * tools), and the tool messages against the assistant tool_calls they answer.
 * Called by serve_parse after the messages. 0 or -1 with e filled (400).
 */
int serve_parse_tools(serve_req *r, const json_t *root, serve_error *e);
/**
 * The tool fields of message i (m): an assistant's tool_calls, a tool
 * message's tool_call_id; refuses them on other roles. 0 or -1 with e filled.
 */
int serve_parse_msg_tools(serve_msg *d, const json_t *m, size_t i, serve_error *e);
/** Free what serve_parse_tools / serve_parse_msg_tools stored in r. */
void serve_tools_free(serve_req *r);
/**
 * For tool_choice required / named: compile the grammar that makes the reply
 * one (or, with parallel_tool_calls, up to SERVE_MAX_PARALLEL) <tool_call>
 * blocks of the allowed functions, into r->grammar. 0 when nothing is needed
 * or done; -1 with e filled (400 for a parameters schema the grammar refuses,
 * 501 when constrained output is not available).
 */
int serve_tools_grammar(kipp_model *m, serve_req *r, serve_error *e);

/**
 * Turn r's prompt into token ids against the model: tokenize the string prompt
 * (markers allowed: raw completion), check sent ids, or render + tokenize chat
 * fitted to n_ctx (kipp_chat_tokenize_fit: the oldest turns are dropped so that
 * the prompt leaves max_tokens (at most n_ctx / 2), or n_ctx / 4 when not sent, free; the count goes
 * to r->truncated_messages). Checks the prompt against n_ctx (400 naming
 * n_prompt_tokens and n_ctx), bounds logit_bias ids, and clamps max_tokens to
 * the context. Caller holds the tokenizer lock. 0 or -1 with e filled.
 */
int serve_prepare(kipp_model *m, uint32_t n_ctx, serve_req *r, serve_error *e);

/* ---- per-choice text (text_out.c) ---- */

/** One generated token's log-probability record. */
typedef struct {
    uint32_t id;
    float logprob;
    uint32_t top_ids[20];
    float top_lp[20];
    uint8_t n_top;
    uint32_t text_off;        /* byte offset of this token's text in the raw output */
    uint32_t text_len;        /* bytes it contributed (after UTF-8 hold-back: may be 0) */
} serve_lp;

/** Growable byte buffer. */
typedef struct {
    char *p;
    size_t n, cap;
} serve_buf;

int serve_buf_put(serve_buf *b, const char *s, size_t n);
void serve_buf_free(serve_buf *b);

/**
 * The visible parts of a choice's raw text (already cut at a stop string by
 * its kipp_gen): text that could still grow into a think marker held back
 * until final, then split into reasoning and content when thinking. Offsets
 * into raw.
 */
typedef struct {
    size_t reasoning_off, reasoning_len;
    size_t content_off, content_len;
} serve_view;

/**
 * Compute the view of raw[n] for request r, where n is what may be shown:
 * the choice's raw_final, or all of raw once finished. final: the choice is
 * finished, so nothing is held back.
 */
void serve_text_view(const serve_req *r, const char *raw, size_t n, int final, serve_view *v);

/* ---- tool calls in a reply (tool_calls.c) ---- */

/** One parsed call: malloc'd strings. */
typedef struct {
    char *name;               /* a function of the request's tools */
    char *arguments;          /* the arguments object's JSON text, as the model wrote it */
} serve_call;

/** A reply's content split into calls and the text around them. */
typedef struct {
    serve_buf content;        /* text outside the valid blocks (whitespace-only pieces next to a block dropped) */
    serve_call *calls;        /* [n_calls] in order */
    size_t n_calls, cap_calls;
} serve_tool_out;

/**
 * Parse text[n] (a reply's content, thinking already split off) for Qwen3's
 * "<tool_call>" JSON "</tool_call>" blocks. A block is a call when its inner
 * text is one JSON object with exactly "name" (the name of one of tools[n_tools]) and
 * "arguments" (an object); any other block stays content, as does an
 * unterminated one once final. Not final: a tail that could still become a
 * block, a block still open, and a whitespace-only piece that may yet sit
 * next to a block are held back, so the content and calls of any prefix are
 * prefixes of the final ones (streaming shows exactly what the whole reply
 * gives). *out is initialised here; 0, or -1 when out of memory.
 */
int serve_tool_parse(const serve_tool *tools, size_t n_tools, const char *text, size_t n, int final,
                     serve_tool_out *out);
/** Free what serve_tool_parse stored; out may be zeroed. */
void serve_tool_out_free(serve_tool_out *out);

/* ---- jobs and the scheduler (sched.c) ---- */

enum { FIN_NONE = 0, FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR };

/** One choice's published state (read by HTTP threads under sched->mu). */
typedef struct {
    serve_buf raw;            /* the generation's text (kipp_gen_text: cut before a stop string) */
    size_t raw_final;         /* bytes of raw that are final (no stop string can start in them) */
    serve_lp *lp;             /* [n_lp] when logprobs */
    size_t n_lp, cap_lp;
    uint32_t n_gen;           /* generated tokens (stop token excluded) */
    int finish;               /* FIN_* */
    int stop_matched;         /* FIN_STOP by a stop string: 1 + its index in req.stop; 0 = none (a stop id, ...) */
    double t_first, t_last;   /* seconds (monotonic) of first / latest token */
} serve_choice_out;

/** A request in flight; shared by its HTTP thread and the scheduler (refcounted). */
typedef struct serve_job {
    serve_req req;
    uint64_t id;              /* for "cmpl-<id>" */
    int64_t created;          /* unix seconds */
    double t_arrive;          /* monotonic seconds */
    double t_prompt_done;     /* all choices prefilled */
    uint32_t cached_tokens;   /* prompt tokens choice 0 adopted from the KV pool (usage.prompt_tokens_details) */
    serve_choice_out out[SERVE_MAX_N];
    float *prompt_lp;         /* echo logprobs: [n_prompt] (first = NaN), with top alternatives */
    serve_lp *prompt_top;     /* [n_prompt] */
    int done;                 /* every choice finished */
    int cancelled;            /* client gone: the scheduler frees its choices */
    int queued;               /* still in the FIFO */
    char error[256];          /* engine failure ("" = none) */
    int refs;
    struct serve_job *next;   /* FIFO link */
} serve_job;

typedef struct serve_sched serve_sched;

/** Scheduler limits. */
typedef struct {
    int max_choices;          /* active choices per step (batch limit) */
    int max_queue;            /* queued requests before 429 */
    uint32_t n_ctx;           /* per-choice context (tokens) */
    uint64_t kv_budget_blocks;/* unpooled: 32-position KV blocks all live sessions may hold (--kv-mib) */
    uint64_t pool_blocks;     /* pooled model: blocks of its KV pool (--kv-pool-mib); 0 = unpooled */
    int no_spec;              /* --no-spec: greedy choices decode one token per step */
    uint32_t step_tokens;     /* --step-tokens: tokens one step evaluates (decodes first, then prefill chunks) */
} serve_sched_opts;

/** Create and start the scheduler thread over model m; NULL on failure (err filled). */
serve_sched *serve_sched_start(kipp_model *m, const serve_sched_opts *o, char *err, size_t errlen);
/** Stop the thread, cancel everything, free; NULL accepted. */
void serve_sched_stop(serve_sched *s);
/** The lock guarding every serve_job field. */
pthread_mutex_t *serve_sched_mutex(serve_sched *s);
/**
 * Tokenizer lock: hold while tokenizing outside the scheduler (serve_prepare:
 * the encoder's word cache is shared). The scheduler thread owns every other
 * use of the engine; decoding token texts needs no lock (read-only tables).
 */
pthread_mutex_t *serve_tokenizer_mutex(serve_sched *s);
/**
 * Queue job (takes one reference); 0, or -1 with e filled (429 queue full;
 * 400 when its choices alone need more KV blocks than the whole budget or pool).
 * Admission waits while the KV budget is in use by others; on a pooled model
 * it reserves the worst case first (sched.c admit), so a request waits in the
 * FIFO under pool pressure and never exhausts the pool mid-sequence.
 * Call without the sched mutex held.
 */
int serve_sched_submit(serve_sched *s, serve_job *job, serve_error *e);
/**
 * Drain's last step: at the next step boundary the scheduler ends every active
 * choice with FIN_LENGTH (text flushed: what was generated so far) and every
 * queued job with no tokens, so each waiting client gets a complete reply;
 * jobs submitted afterwards end the same way. Call without the sched mutex.
 */
void serve_sched_end_all(serve_sched *s);
/** Active choices plus queued jobs (0 = idle); takes the sched mutex. */
int serve_sched_busy(serve_sched *s);
/** Wait (sched mutex held) up to ms for any change; returns after a broadcast or the timeout. */
void serve_sched_wait(serve_sched *s, int ms);
/** Mark job cancelled (sched mutex held); the scheduler frees its choices on its next step. */
void serve_sched_cancel(serve_sched *s, serve_job *job);
/** New job with one reference, owning req (moved in). */
serve_job *serve_job_new(serve_req *req);
/** Drop a reference (sched mutex held); frees at zero. */
void serve_job_unref(serve_job *job);

/* ---- logprobs (logprobs.c) ---- */

/**
 * Fill rec with token id's log-probability under row[V] (raw logits, FP32)
 * and the n_top most likely tokens with theirs, best first.
 */
void serve_logprob_of(const float *row, uint32_t V, uint32_t id, int n_top, serve_lp *rec);
/** Append rec to o's logprob list (sched mutex held); -1 when out of memory. */
int serve_push_lp(serve_choice_out *o, const serve_lp *rec);

/* ---- metrics (metrics.c) ---- */

/** Histogram with fixed upper bounds (seconds). */
#define SERVE_HIST_BUCKETS 14
typedef struct {
    uint64_t count[SERVE_HIST_BUCKETS + 1]; /* last = +Inf */
    double sum;
    uint64_t n;
} serve_hist;

/** Every exported number; guarded by the sched mutex. */
typedef struct {
    uint64_t requests[2][6];  /* [chat][status class: 2xx,400,404,413,429,5xx] */
    uint64_t prompt_tokens, generated_tokens, cancelled, steps;
    serve_hist ttft, itl;
    int queue_depth, active_choices;
    int running_requests;     /* requests with an active choice (vllm:num_requests_running) */
    uint64_t kv_capacity;     /* blocks the KV pool (pooled) or budget (unpooled) holds */
    const char *model_name;   /* reported model id, the vllm:* gauges' model_name label (static) */
    uint64_t kv_blocks;       /* 32-position KV blocks held by live sessions (pooled: private + referenced) */
    uint64_t prompt_tokens_cached; /* prompt tokens adopted from the KV pool instead of prefilled */
    int pooled;               /* 1: pool holds the scheduler's latest snapshot of the KV pool */
    kipp_pool_stats pool;     /* KV pool counters (kipp_model_pool_stats) */
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_emitted; /* speculative decoding (--spec) */
    uint64_t preemptions;     /* choices whose session was taken to free KV (pooled) */
    uint64_t recomputed_tokens; /* positions evaluated again after a preemption */
    int preempted_choices;    /* choices waiting to resume */
    int preempted_requests;   /* requests whose choices are all preempted (counted as waiting for vllm:*) */
} serve_metrics;

/** The process-wide metrics (guarded by the sched mutex). */
serve_metrics *serve_metrics_get(void);
void serve_hist_add(serve_hist *h, double seconds);
/** Count one finished HTTP request. */
void serve_metrics_request(int chat, int status);
/** Prometheus text exposition of m; malloc'd. */
char *serve_metrics_text(const serve_metrics *m);

/* ---- rendering (api_render.c) ---- */

/** Server-wide facts for rendering. */
typedef struct {
    const char *model_id;     /* reported "model" */
    kipp_model *model;        /* for token texts (kipp_detokenize: read-only, no lock) */
    uint32_t n_ctx;
} serve_info;

/** OpenAI error body for e; malloc'd JSON text. */
char *serve_error_json(const serve_error *e);
/** The non-streamed response for a finished job; malloc'd JSON text. Engine lock held. */
char *serve_render_response(const serve_info *si, const serve_job *job);
/**
 * Append to sse the chunks that job's progress allows since the cursors in st
 * (per-choice emitted offsets), including finish chunks, the usage chunk and
 * "data: [DONE]" once done. Sched mutex held.
 */
typedef struct {
    size_t sent_reasoning[SERVE_MAX_N], sent_content[SERVE_MAX_N], sent_lp[SERVE_MAX_N];
    int role_sent[SERVE_MAX_N], finish_sent[SERVE_MAX_N], echo_sent[SERVE_MAX_N];
    size_t sent_calls[SERVE_MAX_N]; /* tool calls already streamed */
    int done_sent;
} serve_stream_state;
int serve_render_chunks(const serve_info *si, const serve_job *job, serve_stream_state *st, serve_buf *sse);

/** Monotonic seconds. */
double serve_now(void);

#endif
