/*
 * serve_http.h - the HTTP layer's handle (server/serve_http.c) and the
 * operational helpers beside it (server/serve_ops.c): API-key checks,
 * /tokenize and /detokenize. Logging is server/serve_log.h.
 */
#ifndef KIPP_SERVE_HTTP_H
#define KIPP_SERVE_HTTP_H

#include <stdarg.h>
#include <sys/socket.h>
#include <time.h>

#include "server/serve.h"
#include "server/serve_log.h"

struct MHD_Connection;

/** Server state the HTTP handlers read; filled by serve_main.c. */
typedef struct {
    serve_sched *sched;
    serve_info info;          /* reported model id (the alias when given), model (tokenizer only), n_ctx */
    const char *canonical;    /* the checkpoint id (also listed and accepted when an alias is reported) */
    const char *names[4];     /* accepted values of "model" */
    int n_names;
    size_t max_body;          /* bytes; larger bodies get 413 */
    size_t max_header;        /* bytes of request line + headers; larger get 431 (JSON) */
    time_t started;
    struct MHD_Daemon *daemon;
    unsigned port;            /* bound port (useful with --port 0) */
    unsigned idle_s;          /* --idle-timeout, seconds */
    const char *api_key;      /* --api-key: required on the API endpoints; NULL = open */
    int protect_ops;          /* --api-key-ops: /health and /metrics need the key too */
    const char *cors_origin;  /* --cors-origin: Access-Control-Allow-Origin value; NULL = no CORS */
    int access_log;           /* 1: one JSON line per request on stderr */
    int draining;             /* set by serve_main on SIGTERM/SIGINT (atomic): new work gets 503 */
    int inflight;             /* completion requests between arrival and their last byte (atomic) */
    int task;                 /* kipp_model_task of the served model: which endpoints it takes */
    int embeddings;           /* --embeddings: /v1/embeddings also on a generation model */
} serve_http;

/**
 * Listen on addr (loopback by default) with at most max_conn connections,
 * idle connections closed after idle_s seconds. Header blocks larger than
 * h->max_header get a JSON 431. 0, or -1 (libmicrohttpd has logged why,
 * through serve_log).
 */
int serve_http_start(serve_http *h, const struct sockaddr *addr, unsigned max_conn, unsigned idle_s);
/** Stop listening and close every connection; NULL accepted. */
void serve_http_stop(serve_http *h);

/* ---- serve_ops.c ---- */

/** Log, once per process each, the accepted-but-ignored fields r carried (serve_req.ignored), as vLLM warns. */
void serve_log_ignored(const serve_req *r);
/**
 * 1 when the request may proceed: no key is configured, the path is /health
 * or /metrics and they are open, or the request carries the key as
 * "Authorization: Bearer KEY" or "X-Api-Key: KEY" (compared in constant time).
 */
int serve_auth_ok(const serve_http *h, struct MHD_Connection *c, const char *url);

/**
 * POST /tokenize (vLLM's shape): body {"prompt": str | [ids]} or {"messages": [...],
 * "chat_template_kwargs"?}, optional "model", "add_special_tokens",
 * "add_generation_prompt" (must be true: the chat renderer always adds it).
 * Tokenizes exactly as the completion endpoints do. *json: malloc'd
 * {"count", "max_model_len", "tokens"}; returns 0, or -1 with e filled.
 */
int serve_tokenize(serve_http *h, const char *body, size_t len, char **json, serve_error *e);
/** POST /detokenize: {"tokens": [ids], "model"?} -> {"prompt": text}; 0 or -1 with e filled. */
int serve_detokenize(serve_http *h, const char *body, size_t len, char **json, serve_error *e);
/**
 * POST /v1/rerank (score_api 0) or /v1/score (1), server/api_rerank.c: parse,
 * check the model's role (a reranker) and the prompts' lengths (400s), score
 * on the scheduler thread, render. *json: malloc'd response; 0, or -1 with e.
 */
int serve_rerank(serve_http *h, const char *body, size_t len, int score_api, char **json, serve_error *e);
/** 1 when name is a served model name (NULL: none sent, accepted). */
int serve_model_known(const serve_http *h, const char *name);

#endif
