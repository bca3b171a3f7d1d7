/*
 * serve.h - kipp-serve's internal types (seed 000 "Server and API surface",
 * phases 5-6). Layers, each in its own files, calling downward only:
 *
 *   serve_http.c     libmicrohttpd: connections, limits, routing, SSE writer
 *   serve_error.c    error helpers: serve_fail, error bodies, UTF-8-safe JSON text
 *   serve_log.c      log lines, once-only notes, the access log (serve_log.h)
 *   api_parse.c      JSON body -> serve_req (validation; no model needed)
 *   api_prepare.c    serve_req -> prompt token ids (tokenizer / chat renderer)
 *   api_render.c     job results -> OpenAI JSON (responses, chunks, errors)
 *   text_out.c       per-choice text: stop strings, hold-back, reasoning split
 *   api_tools.c      tools, tool_choice, tool messages -> serve_req (validation)
 *   tool_calls.c     <tool_call> blocks in a reply -> calls + remaining content
 *   sched.c          priority queue + continuous batching over kipp_eval_batch
 *   sched_budget.c   KV admission arithmetic and its 400s at submission
 *   step_cost.c      the online step-cost fit and each step's prefill share (step_cost.h)
 *   job.c            jobs: creation, references, random public ids (serve_job_set_id)
 *   metrics.c        counters and histograms, Prometheus text
 *   api_embed.c      POST /v1/embeddings: body -> token ids, results -> OpenAI JSON
 *   sched_embed.c    embedding requests and tasks run by the scheduler thread between steps
 *   sched_load.c     a queued request's prompt blocks read from the KV disk tier off the scheduler thread
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
#include "server/step_cost.h"

#define SERVE_MAX_N 8          /* choices per request */
#define SERVE_MAX_STOP 4       /* stop strings per request (OpenAI) */
#define SERVE_MAX_STOP_LEN 256 /* bytes per stop string */
#define SERVE_MAX_BIAS 300     /* logit_bias entries (OpenAI allows 300) */
#define SERVE_MAX_MSGS 256     /* chat messages per request */
#define SERVE_CHUNK 32         /* prefill chunk every prefilling choice gets per step while the budget lasts */
#define SERVE_STEP_TOKENS 2048 /* default token budget of one step (--step-tokens): a burst of short prompts in one pass */
#define SERVE_STEP_AUTO 2.0    /* --step-ms auto: a step with prefill may take this times the predicted cost of a
                                * decode-only step of every resident choice (the steady step they will reach) */
#define SERVE_STEP_MS_MAX 60000 /* --step-ms's upper bound */
#define SERVE_STEP_MS_DEFAULT (-1) /* --step-ms's default: auto (docs/SERVING.md has the A/B that chose it); 0 = off */
#define SERVE_RESERVE 16       /* pooled: KV positions a choice reserves beyond its prompt (admission, resumption) */
#define SERVE_MAX_TOOLS 128    /* tools per request (OpenAI allows 128) */
#define SERVE_MAX_PARALLEL 8   /* tool calls one constrained reply may make with parallel_tool_calls */
#define SERVE_MAX_BATCH 64     /* active choices per step at most (--max-batch's upper bound; the scheduler's arrays) */

/** An error for the client: HTTP status and the OpenAI error object's fields. */
typedef struct {
    int status;          /* 400, 404, 413, 429, 500, 503 */
    const char *type;    /* "invalid_request_error", "not_found_error", ... */
    char param[64];      /* offending field ("" = none) */
    char code[48];       /* machine code ("" = null) */
    char message[512];
} serve_error;

/* ---- errors (serve_error.c) ---- */

/** Fill e and return -1 (so callers can `return serve_fail(...)`). */
int serve_fail(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/** OpenAI error body for e; malloc'd JSON text. */
char *serve_error_json(const serve_error *e);
/** A new JSON string of the bytes p[n], invalid UTF-8 replaced by U+FFFD (client or model bytes may be cut mid-character). */
json_t *serve_json_text(const char *p, size_t n);
/** What a message calls v's JSON type: "an object", "a string", "a boolean", ... ("missing" for NULL). */
const char *serve_json_type(const json_t *v);
/** malloc'd copy of s[n] with a NUL after it (s may hold NULs); NULL when out of memory. */
char *serve_dupn(const char *s, size_t n);

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
    int thinking_budget_set;  /* a budget field was sent (thinking_token_budget / thinking_budget_tokens) */
    int effort_off;           /* reasoning_effort "none" / "minimal": thinking off (api_compat.c) */
    uint32_t min_tokens;      /* vLLM min_tokens: stop ids and strings are not honoured before this many tokens */
    int include_stop;         /* vLLM include_stop_str_in_output: a matched stop string stays in the text */
    const char *guided;       /* "guided_json" / "guided_choice" when one set rf_schema (static), else NULL */
    uint32_t ignored;         /* accepted-but-ignored fields seen, one bit each (serve_ignored_name), for the log */
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
    void *api_ctx;            /* what the request's API keeps beside it (SERVE_API_RESPONSES: a serve_resp, responses.h) */
    void (*api_ctx_free)(void *); /* frees api_ctx; called by serve_req_free */
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
 * The fields of api_compat.c for top-level key k (value v, not null):
 * reasoning controls, vLLM extensions, OpenAI fields without behaviour here.
 * Returns 1 when k is one of them (then *rc is 0, or -1 with e filled: 400
 * naming the field), 0 when it is not.
 */
int serve_parse_compat(serve_req *r, const char *k, const json_t *v, int *rc, serve_error *e);
/** The same for key k of assistant message i (null refusal, audio, function_call, annotations). */
int serve_parse_compat_msg(serve_req *r, const char *k, const json_t *v, size_t i, int *rc, serve_error *e);
/** Checks across those fields once the whole body (root) is parsed; 0 or -1 with e filled. */
int serve_parse_compat_done(serve_req *r, const json_t *root, serve_error *e);
/** Name of bit `bit` of serve_req.ignored ("store", "messages[].refusal", ...), NULL past the last. */
const char *serve_ignored_name(unsigned bit);

/**
 * logit_bias ({"token id": bias in [-100, 100]}, at most SERVE_MAX_BIAS) into
 * r->bias and r->sp; shared by the endpoints that accept it (the Anthropic and
 * Responses parsers as a Kipp extension). 0 or -1 with e filled (400).
 */
int serve_parse_bias(serve_req *r, const json_t *v, serve_error *e);

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
 * finished, so nothing is held back. The reasoning/content half of
 * serve_reply_split (its state machine is documented there); the content
 * span still holds any tool-call blocks.
 */
void serve_text_view(const serve_req *r, const char *raw, size_t n, int final, serve_view *v);

/* ---- tool calls in a reply (tool_calls.c) ---- */

/** One parsed call: malloc'd strings. */
typedef struct {
    char *name;               /* a function of the request's tools */
    char *arguments;          /* the arguments object's JSON text, as the model wrote it */
    size_t at;                /* byte offset of its "<tool_call>" in the parsed text: names the call in ids and streams */
} serve_call;

/**
 * The call being written in the block still open at the end of a not-final
 * text, once its head is read: "<tool_call>" {"name": "<an offered tool>",
 * "arguments": then the arguments' first bytes, as far as they are a valid
 * JSON prefix of one object (never past its closing brace). When the block
 * closes as a call, that call's arguments start with these bytes.
 */
typedef struct {
    const char *name;         /* the tool's name (tools[t].name, not owned), NULL: no call in progress */
    const char *args;         /* into the parsed text */
    size_t args_len;
    size_t at;                /* as serve_call.at */
} serve_call_part;

/** A reply's content split into calls and the text around them. */
typedef struct {
    serve_buf content;        /* text outside the valid blocks (whitespace-only pieces next to a block dropped) */
    serve_call *calls;        /* [n_calls] in order */
    size_t n_calls, cap_calls;
    serve_call_part part;     /* not final: the call in progress after them, if any (streams its arguments) */
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
 * gives). The open block's call so far, when its head is read, goes to
 * out->part (see serve_call_part). *out is initialised here; 0, or -1 when
 * out of memory.
 */
int serve_tool_parse(const serve_tool *tools, size_t n_tools, const char *text, size_t n, int final,
                     serve_tool_out *out);
/** Free what serve_tool_parse stored; out may be zeroed. */
void serve_tool_out_free(serve_tool_out *out);

/* ---- the reply split shared by every API (text_out.c) ---- */

/**
 * What one choice shows, in the three parts every API renders (OpenAI
 * reasoning_content / content / tool_calls, Responses reasoning / message /
 * function_call items, Anthropic thinking / text / tool_use blocks). One
 * tag-driven state machine makes it from the raw text:
 *   REASONING  from the reply's start when the prompt opened "<think>"
 *              (r->starts_in_reasoning; a "<think>" the model repeats there is
 *              the marker), or after a leading "<think>"; ends at "</think>"
 *              (dropped, with the newlines after it) or, with tools active, at
 *              "<tool_call>" (kept: a call made while thinking ends the
 *              thinking and is parsed as a call). Cut off before either
 *              (finish "length"), all of it is reasoning and content is empty.
 *   CONTENT    the rest, with "<tool_call>" JSON "</tool_call>" blocks of the
 *              request's tools taken out as calls (serve_tool_parse). A
 *              "</think>" or "<think>" there is content text: never dropped,
 *              never an error.
 * Not final, tails that could still become a marker are held back, so the
 * parts of any prefix are prefixes of the final parts: streamed deltas add up
 * to the non-streamed reply. Without thinking (r->thinking 0) or on
 * completions, everything is content.
 */
typedef struct {
    serve_view view;          /* reasoning span, and the content span before tool calls are taken out (offsets into raw) */
    const char *reasoning;    /* raw + view.reasoning_off */
    size_t reasoning_len;
    const char *content;      /* the content shown: into raw, or into calls.content when tools are active */
    size_t content_len;
    serve_tool_out calls;     /* the calls, in order (none without active tools) */
} serve_reply;

/**
 * Split raw[n] (a choice's text: raw_final bytes while streaming, all once
 * finished; final as for serve_text_view) for request r into *out
 * (initialised here; free with serve_reply_free; it points into raw, which
 * must outlive it). 0, or -1 when out of memory parsing calls (then out holds
 * the text with no calls taken out).
 */
int serve_reply_split(const serve_req *r, const char *raw, size_t n, int final, serve_reply *out);
/** Free what serve_reply_split stored; out may be zeroed. */
void serve_reply_free(serve_reply *out);

/* ---- jobs and the scheduler (sched.c) ---- */

enum { FIN_NONE = 0, FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR };

/** One choice's published state (read by HTTP threads under sched->mu). */
typedef struct {
    serve_buf raw;            /* the generation's text (kipp_gen_text: cut before a stop string) */
    size_t raw_final;         /* bytes of raw that are final (no stop string can start in them) */
    serve_lp *lp;             /* [n_lp] when logprobs */
    size_t n_lp, cap_lp;
    uint32_t n_gen;           /* generated tokens (stop token excluded) */
    uint32_t *tok_off;        /* [n_tok] with thinking on: each generated token's first byte in raw (serve_reasoning_tokens) */
    size_t n_tok, cap_tok;
    int finish;               /* FIN_* */
    int stop_matched;         /* FIN_STOP by a stop string: 1 + its index in req.stop; 0 = none (a stop id, ...) */
    double t_first, t_last;   /* seconds (monotonic) of first / latest token */
} serve_choice_out;

/**
 * Reasoning tokens of finished choice o of request r, as the state machine
 * splits its raw text (no re-tokenizing): the generated tokens that start
 * inside the REASONING state, its markers included: a leading "<think>", the
 * text, and the "</think>" that ends it (not the newlines after it); up to a
 * "<tool_call>" that ends it; all of them when the reply was cut off inside
 * it. 0 without thinking, or when the reply did not open reasoning.
 */
uint64_t serve_reasoning_tokens(const serve_req *r, const serve_choice_out *o);

/** A request in flight; shared by its HTTP thread and the scheduler (refcounted). */
typedef struct serve_job {
    serve_req req;
    uint64_t id;              /* internal, sequential per process (the default seed salt) */
    char pub_id[48];          /* the id the client sees: an API prefix and 24 random base62 characters (serve_job_set_id) */
    int64_t created;          /* unix seconds */
    double t_arrive;          /* monotonic seconds */
    double t_admit;           /* monotonic seconds it left the queue (0 = not yet) */
    double t_prompt_done;     /* all choices prefilled */
    uint32_t cached_tokens;   /* prompt tokens choice 0 adopted from the KV pool (usage.prompt_tokens_details) */
    serve_choice_out out[SERVE_MAX_N];
    float *prompt_lp;         /* echo logprobs: [n_prompt] (first = NaN), with top alternatives */
    serve_lp *prompt_top;     /* [n_prompt] */
    int done;                 /* every choice finished */
    int cancelled;            /* client gone: the scheduler frees its choices */
    int queued;               /* still in the FIFO */
    kipp_disk_load *kv_load;  /* its prompt's blocks being read from the KV disk tier (sched_load.c); scheduler only */
    int kv_load_tried;        /* that read was started (or found nothing to read) */
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
    kipp_model *draft;        /* --draft-model: drafts for every choice's speculative steps (greedy: exact; sampled:
                               * speculative sampling), its own session per choice; NULL = prompt lookup */
    uint32_t draft_max, draft_min; /* --draft-max/--draft-min with a draft model (kipp_spec_options k_max, draft_min);
                                    * 0 = the defaults */
    uint32_t step_tokens;     /* --step-tokens: tokens one step evaluates (decodes first, then prefill chunks) */
    double step_ms;           /* --step-ms: time target of a step that prefills beside decodes, in ms; 0 = none
                               * (the token budget alone); < 0 = auto (SERVE_STEP_AUTO x a steady decode step) */
} serve_sched_opts;

/** Positions per KV block (kipp_model_info.kv_pool_blocks counts these). */
#define SERVE_KV_BLOCK 32
/** KV blocks of 32 positions that cap positions take. */
uint64_t serve_blocks_of(uint32_t cap);
/** KV blocks a job's sessions hold at worst: n choices of prompt + max_tokens positions. */
uint64_t serve_job_blocks(const serve_job *j);
/**
 * Unpooled: the 400 (code kv_budget_exceeded) for job j, whose worst case
 * exceeds budget blocks, naming the generation budget as the client set it
 * and the one change that fits (max_tokens, else n, else the prompt); -1.
 */
int serve_budget_fail(const serve_sched_opts *o, const serve_job *j, uint64_t budget, serve_error *e);
/**
 * Pooled admission rule at submission: one choice alone must fit the pool
 * with its worst case, all n with their admission reservation (prompt +
 * SERVE_RESERVE); 0 (an unsent max_tokens cut to the pool), or -1 with the 400.
 */
int serve_pool_check(const serve_sched_opts *o, serve_job *j, serve_error *e);
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
/**
 * Work that is not a generation (rerank, score) run on the scheduler thread,
 * which owns the engine: fn(model, ctx) runs between two steps, alone, without
 * the sched mutex; its result goes to rc.
 */
typedef struct serve_task {
    int (*fn)(kipp_model *m, void *ctx);
    void *ctx;
    int rc;
    int done;                 /* set (sched mutex held) once fn returned */
    struct serve_task *next;
} serve_task;
/**
 * Queue t (FIFO, before the next step) and wait until it has run; returns
 * t->rc. Call without the sched mutex held. While the server is stopping the
 * task is not run and -1 is returned.
 */
int serve_sched_run(serve_sched *s, serve_task *t);
/** Active choices plus queued jobs (0 = idle); takes the sched mutex. */
int serve_sched_busy(serve_sched *s);
/** Wait (sched mutex held) up to ms for any change; returns after a broadcast or the timeout. */
void serve_sched_wait(serve_sched *s, int ms);
/** Mark job cancelled (sched mutex held); the scheduler frees its choices on its next step. */
void serve_sched_cancel(serve_sched *s, serve_job *job);
/** New job with one reference, owning req (moved in); its pub_id is "chatcmpl-..." (chat) or "cmpl-...". */
serve_job *serve_job_new(serve_req *req);
/**
 * Set job's public id to prefix (at most 16 bytes: "chatcmpl-", "cmpl-",
 * "msg_", "resp_", ...) followed by 24 base62 characters from getrandom()
 * (about 143 bits), so ids are unique across processes and restarts.
 * Call before the job is shared.
 */
void serve_job_set_id(serve_job *job, const char *prefix);
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
/** Append a generated token's first byte offset to o->tok_off (sched mutex held); -1 when out of memory. */
int serve_push_tok(serve_choice_out *o, uint32_t off);

/* ---- metrics (metrics.c) ---- */

/** Histogram with fixed upper bounds (seconds). */
#define SERVE_HIST_BUCKETS 14
typedef struct {
    uint64_t count[SERVE_HIST_BUCKETS + 1]; /* last = +Inf */
    double sum;
    uint64_t n;
} serve_hist;

/* A scheduler step's phases (kipp_step_seconds{phase}): plan (under the lock), engine (kipp_eval_batch),
 * sample (kipp_gen_advance: sampling, detokenizing, stop strings), lock (waiting for the lock the HTTP
 * threads hold while they render chunks), publish (text, logprobs, finishes, under the lock). */
enum { SERVE_PH_PLAN = 0, SERVE_PH_ENGINE, SERVE_PH_SAMPLE, SERVE_PH_LOCK, SERVE_PH_PUBLISH, SERVE_STEP_PHASES };
#define SERVE_STEP_BUCKETS 16
#define SERVE_ITER_BUCKETS 13
typedef struct {
    uint64_t count[SERVE_STEP_BUCKETS + 1];
    double sum;
    uint64_t n;
} serve_step_hist;

/* vLLM's histograms, each with vLLM's bucket upper bounds (vllm/v1/metrics/loggers.py). */
enum { SERVE_VH_TTFT = 0, SERVE_VH_ITL, SERVE_VH_E2E, SERVE_VH_QUEUE, SERVE_VH_PREFILL, SERVE_VH_DECODE, SERVE_VH_INFERENCE,
       SERVE_VH_COUNT };
#define SERVE_VHIST_MAX 22 /* the most bounds one of them has (time_to_first_token_seconds) */
typedef struct {
    uint64_t count[SERVE_VHIST_MAX + 1]; /* per bucket (not cumulative); [n_bounds] = +Inf */
    double sum;
    uint64_t n;
} serve_vhist;

/** Every exported number; guarded by the sched mutex, written only through the serve_metrics_on_* events. */
typedef struct {
    uint64_t requests[2][6];  /* [chat][status class: 2xx,400,404,413,429,5xx] */
    uint64_t prompt_tokens, generated_tokens, cancelled, steps;
    serve_hist ttft, itl;
    serve_vhist vh[SERVE_VH_COUNT]; /* vLLM's histograms (per choice, as vLLM counts each of n's child requests) */
    uint64_t success[3];      /* choices finished, by vLLM's finished_reason: stop, length, abort */
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
    serve_step_hist phase[SERVE_STEP_PHASES]; /* seconds per step phase (SERVE_PH_*) */
    serve_step_hist step;     /* seconds per whole step */
    uint64_t iter_tokens[SERVE_ITER_BUCKETS + 1]; /* tokens per step (vllm:iteration_tokens_total) */
    double iter_sum;
    uint64_t capped_steps;    /* steps whose prefill share the time target cut */
    uint64_t kind_steps[3];   /* steps that decoded only, prefilled only, did both (SERVE_STEP_*) */
    uint64_t burst_steps;     /* mixed steps whose prompts were a burst (no time target) */
    double render_s;          /* seconds HTTP threads spent rendering stream events under the sched mutex */
    uint64_t renders;         /* renders that produced bytes */
    double target_s;          /* the latest step's time target (0 = none applied) */
    double cost[4];           /* the step-cost fit: base, per decode token, per prefill token, per 1024 attention pairs */
    uint64_t rerank[6];       /* /v1/rerank and /v1/score (SERVE_RR_*): requests, documents, prompt tokens, prefix tokens
                               * evaluated, prefix positions forked instead of evaluated, positions evaluated */
} serve_metrics;

enum { SERVE_RR_REQUESTS = 0, SERVE_RR_DOCUMENTS, SERVE_RR_PROMPT, SERVE_RR_PREFIX_EVAL, SERVE_RR_PREFIX_REUSED,
       SERVE_RR_EVALUATED };
/** A rerank or score request finished: the sums of its kipp_rerank_stats and its documents. */
void serve_metrics_on_rerank(uint64_t docs, const kipp_rerank_stats *st);

/** The process-wide metrics, for /metrics to export (guarded by the sched mutex); nothing reads them as state. */
serve_metrics *serve_metrics_get(void);
/** Count one finished HTTP request. */
void serve_metrics_request(int chat, int status);
/** Prometheus text exposition of m; malloc'd. */
char *serve_metrics_text(const serve_metrics *m);

/*
 * Events the scheduler reports (sched mutex held for every one). The
 * scheduler keeps its own state; these only feed /metrics.
 */
/** Before any thread starts: the reported model id, the vllm:* model_name label (static string). */
void serve_metrics_set_model(const char *model_name);
/** The KV cache's type name ("bf16", "q8_0"; static) and bytes per token, for /metrics' kipp_kv_bytes_per_token. */
void serve_metrics_set_kv(const char *kv_type, uint64_t bytes_per_token);
/** The model whose KV disk tier /metrics exports (kipp_model_disk_stats, thread-safe); NULL = none. Before any thread reads it. */
void serve_metrics_set_disk(const kipp_model *m);
/** At scheduler start: the KV blocks the pool (pooled) or the budget (unpooled) holds. */
void serve_metrics_on_start(uint64_t kv_capacity);
/** The queue and batch gauges changed: queued requests, active choices. */
void serve_metrics_on_queue(int queued, int active);
/** The request gauges of one scheduler pass: requests with a resident choice, requests all of whose
 * choices are preempted, and preempted choices. */
void serve_metrics_on_running(int requests, int preempted_requests, int preempted_choices);
/** A request was admitted: n_prompt prompt tokens, cached of them adopted from the KV pool. */
void serve_metrics_on_admit(uint64_t n_prompt, uint64_t cached);
/** KV blocks held by live sessions now (unpooled: the budget in use). */
void serve_metrics_on_kv(uint64_t blocks);
/** The scheduler's snapshot of the KV pool (pooled models). */
void serve_metrics_on_pool(const kipp_pool_stats *st);
/**
 * One scheduler step (one kipp_eval_batch): seconds per phase (SERVE_PH_*),
 * what it evaluated (decode and prefill tokens), its time target (0 = none),
 * capped 1 when that target cut its prefill share, burst 1 when it decoded
 * beside a burst of prompts (serve_step_burst), and the cost fit after it
 * (4 coefficients, step_cost.h).
 */
void serve_metrics_on_step(const double phase[SERVE_STEP_PHASES], const serve_step_load *load, double target_s, int capped,
                           int burst, const double cost[4]);
/** An HTTP thread rendered a stream's new events (SSE encoding, under the sched mutex): seconds, bytes (0 = nothing new). */
void serve_metrics_on_render(double seconds, size_t bytes);
/** A choice's session was preempted to free KV blocks. */
void serve_metrics_on_preempt(void);
/** A client went away before its request finished. */
void serve_metrics_on_cancel(void);
/** A speculative step verified drafted tokens, accepted and emitted of them. */
void serve_metrics_on_spec(uint64_t drafted, uint64_t accepted, uint64_t emitted);
/**
 * A choice's step ended: first 1 = it sampled its first token (seconds =
 * arrival to now, TTFT), 0 = a later one (seconds since its previous output,
 * inter-token latency), -1 = nothing sampled (seconds unused); n_tokens
 * generated, n_refill positions re-evaluated after a preemption.
 */
void serve_metrics_on_token(int first, double seconds, uint32_t n_tokens, uint32_t n_refill);
/**
 * A choice ended (why: FIN_*; FIN_ERROR is not counted as a success).
 * Monotonic seconds: t_arrive, t_admit (0 = never admitted), t_first and
 * t_last (its first and latest token, 0 = none), now.
 */
void serve_metrics_on_finish(int why, double t_arrive, double t_admit, double t_first, double t_last, double now);

/* ---- rendering (api_render.c) ---- */

/** Server-wide facts for rendering. */
typedef struct {
    const char *model_id;     /* reported "model" */
    kipp_model *model;        /* for token texts (kipp_detokenize: read-only, no lock) */
    uint32_t n_ctx;
} serve_info;

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
    size_t sent_calls[SERVE_MAX_N]; /* parsed calls already streamed whole */
    size_t stream_calls[SERVE_MAX_N]; /* tool_calls indexes used in the stream (one per head sent) */
    int part_open[SERVE_MAX_N];     /* a call's head is sent and its arguments are streaming */
    size_t part_at[SERVE_MAX_N], part_sent[SERVE_MAX_N], part_index[SERVE_MAX_N]; /* its serve_call.at, bytes sent, index */
    int done_sent;
} serve_stream_state;
int serve_render_chunks(const serve_info *si, const serve_job *job, serve_stream_state *st, serve_buf *sse);

/** Monotonic seconds. */
double serve_now(void);

/* ---- embeddings (sched_embed.c; the HTTP side is api_embed.c) ---- */

#define SERVE_EMBED_MAX_INPUTS 2048   /* inputs per /v1/embeddings request (OpenAI's limit) */
#define SERVE_EMBED_IDLE_TOKENS 16384 /* tokens of one embedding group while nothing generates */
/* Most tokens of one embedding group while something generates: a decode waits for the whole group, and the
 * step budget (--step-tokens, 2048 by default) is sized for bursts of prompts that decode themselves. */
#define SERVE_EMBED_BUSY_TOKENS 512

/** One embedding request as the scheduler runs it; fields up to out are the submitter's, set before queuing. */
typedef struct serve_embed_job {
    const uint32_t *const *ids; /* [n] token ids of each input (owned by the submitter) */
    const uint32_t *lens;       /* [n] tokens of each, 1..n_ctx */
    size_t n;                   /* inputs */
    uint32_t dims;              /* values kept per embedding (1..d_model) */
    float *out;                 /* [n][dims] results, unit L2 norm (owned by the submitter) */
    size_t next;                /* inputs done so far (scheduler; read under mu) */
    int done, cancelled, rc;    /* done: the scheduler is finished with it; rc: KIPP_* of a failure */
    char error[256];            /* the engine's message when rc != 0 */
    struct serve_embed_job *next_job;
} serve_embed_job;

/** FIFO of embedding jobs, guarded by the sched mutex. */
typedef struct {
    serve_embed_job *head, *tail;
} serve_embed_queue;

/** Append j (mu held). */
void serve_embed_queue_push(serve_embed_queue *q, serve_embed_job *j);
/**
 * Scheduler thread, mu held: run one group of the head job (kipp_embed on
 * inputs whose tokens stay within max_tokens and KV blocks within max_blocks,
 * at least one input), with mu released during the evaluation; a finished,
 * failed or cancelled job leaves the queue with done = 1. Returns 1 when it
 * did something, 0 when the queue is empty.
 */
int serve_embed_run(serve_embed_queue *q, kipp_model *m, pthread_mutex_t *mu, uint64_t max_tokens, uint64_t max_blocks);
/** Fail every queued job with rc and message (mu held): shutdown. */
void serve_embed_fail_all(serve_embed_queue *q, int rc, const char *why);
/** Queue j on the scheduler (call without the sched mutex); wait for j->done under it (serve_sched_wait). */
void serve_sched_embed(serve_sched *s, serve_embed_job *j);

/* ---- KV disk reads (sched_load.c) ---- */

/**
 * Scheduler thread: 1 while queued job j waits for its prompt's blocks to be
 * read from the model's KV disk tier. The first call starts the read (at
 * most room pool blocks; nothing when the model has no tier, or j needs
 * every prompt row: echo logprobs); once the reads are over it publishes the
 * verified blocks into the pool (kipp_model_disk_load_finish) and returns 0,
 * so j's prefix match adopts them. Meanwhile the scheduler steps the others.
 */
int serve_load_wait(kipp_model *m, serve_job *j, uint32_t room);
/** Scheduler thread: end j's read, if any (j leaves the queue: admitted, cancelled, failed, drained). */
void serve_load_drop(kipp_model *m, serve_job *j);
/** 1 when some job queued from head on has a read in flight: the scheduler polls rather than sleeps. */
int serve_load_pending(const serve_job *head);

#endif
