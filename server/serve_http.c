/*
 * serve_http.c - the HTTP layer over libmicrohttpd:
 * body/header/idle limits, routing, JSON responses and SSE streams. One MHD
 * thread per connection, so a handler may block while its job runs; while it
 * waits it polls the socket for a hang-up and cancels the job at once.
 * Talks to the engine only through serve_prepare (tokenizer, under the
 * tokenizer lock), token texts when rendering (read-only) and the scheduler;
 * never to a session.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/api_embed.h"
#include "server/responses.h"
#include "server/serve_http.h"

typedef struct {
    serve_buf body;
    int too_big;
    int hdr_too_big;          /* request line + headers above --max-header: 431 */
    int untimed;              /* the idle timeout is off while a completion runs */
    int counted;              /* in h->inflight until on_done */
    int status;               /* the status queued (access log) */
    int api;                  /* SERVE_API_*: the shape of this request's replies and errors (route) */
    double t0;                /* arrival, monotonic seconds */
    char method[16], path[160];
    serve_job *job;           /* a reference for the access log, or NULL */
} conn_state;

/* The handler thread's current request: thread-per-connection, so a thread
 * serves one request at a time and every response it queues is this one's. */
static _Thread_local conn_state *cur;

typedef struct {
    serve_http *h;
    serve_job *job;
    serve_stream_state st;
    serve_anth_stream ast;    /* the stream's cursor when the job's api is SERVE_API_ANTHROPIC */
    serve_buf out;
    size_t off;
    int fd;
} stream_ctx;

static int client_gone(int fd)
{
    struct pollfd p = {fd, POLLRDHUP, 0};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Queue r with the headers every response carries (CORS; Connection: close
 * while draining, so clients reconnect to another replica) and note the status. */
static enum MHD_Result queue(serve_http *h, struct MHD_Connection *c, int status, struct MHD_Response *r)
{
    if (h->cors_origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", h->cors_origin);
        if (strcmp(h->cors_origin, "*")) MHD_add_response_header(r, "Vary", "Origin");
    }
    if (__atomic_load_n(&h->draining, __ATOMIC_ACQUIRE)) MHD_add_response_header(r, "Connection", "close");
    if (cur) cur->status = status;
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_text(serve_http *h, struct MHD_Connection *c, int status, const char *type, char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text ? text : (char *)"", MHD_RESPMEM_MUST_FREE);
    if (!text) r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    return queue(h, c, status, r);
}

static enum MHD_Result send_json(serve_http *h, struct MHD_Connection *c, int status, char *json)
{
    return send_text(h, c, status, "application/json", json);
}

static enum MHD_Result send_error(serve_http *h, struct MHD_Connection *c, int chat, const serve_error *e)
{
    if (chat >= 0) {
        pthread_mutex_lock(serve_sched_mutex(h->sched));
        serve_metrics_request(chat, e->status);
        pthread_mutex_unlock(serve_sched_mutex(h->sched));
    }
    return send_json(h, c, e->status, cur && cur->api == SERVE_API_ANTHROPIC ? serve_anthropic_error_json(e) : serve_error_json(e));
}

/* ---- streaming ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *s = cls;
    (void)pos;
    if (s->off == s->out.n) {
        s->out.n = s->off = 0;
        int anth = s->job->req.api == SERVE_API_ANTHROPIC;
        if (anth ? s->ast.done_sent : s->st.done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_t *mu = serve_sched_mutex(s->h->sched);
        pthread_mutex_lock(mu);
        for (;;) {
            int done;
            double t0 = serve_now();
            if (anth) done = serve_anthropic_events(&s->h->info, s->job, &s->ast, &s->out);
            else if (s->job->req.api == SERVE_API_RESPONSES)
                done = s->st.done_sent = serve_responses_chunks(&s->h->info, s->job, &s->out);
            else
                done = serve_render_chunks(&s->h->info, s->job, &s->st, &s->out);
            serve_metrics_on_render(serve_now() - t0, s->out.n);
            if (s->out.n || done) break;
            if (client_gone(s->fd)) {
                serve_sched_cancel(s->h->sched, s->job);
                pthread_mutex_unlock(mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            serve_sched_wait(s->h->sched, 50);
        }
        pthread_mutex_unlock(mu);
        if (!s->out.n) return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = s->out.n - s->off < max ? s->out.n - s->off : max;
    memcpy(buf, s->out.p + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream_ctx *s = cls;
    pthread_mutex_lock(serve_sched_mutex(s->h->sched));
    if (!s->job->done) serve_sched_cancel(s->h->sched, s->job); /* closed before the end: free its choices */
    serve_job_unref(s->job);
    pthread_mutex_unlock(serve_sched_mutex(s->h->sched));
    serve_buf_free(&s->out);
    free(s);
}

static enum MHD_Result start_stream(serve_http *h, struct MHD_Connection *c, serve_job *job)
{
    stream_ctx *s = calloc(1, sizeof *s);
    struct MHD_Response *r = s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free) : NULL;
    if (!r) {
        free(s);
        pthread_mutex_lock(serve_sched_mutex(h->sched));
        serve_sched_cancel(h->sched, job);
        serve_job_unref(job);
        pthread_mutex_unlock(serve_sched_mutex(h->sched));
        return MHD_NO;
    }
    s->h = h, s->job = job, s->fd = conn_fd(c);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    pthread_mutex_lock(serve_sched_mutex(h->sched));
    serve_metrics_request(job->req.chat, 200);
    pthread_mutex_unlock(serve_sched_mutex(h->sched));
    return queue(h, c, 200, r);
}

/* ---- completions ---- */

/* Wait for a non-streamed job; NULL when the client hung up (job cancelled). */
static char *wait_response(serve_http *h, struct MHD_Connection *c, serve_job *job, int *status)
{
    int fd = conn_fd(c);
    char *out = NULL;
    pthread_mutex_t *mu = serve_sched_mutex(h->sched);
    pthread_mutex_lock(mu);
    while (!job->done && !client_gone(fd)) serve_sched_wait(h->sched, 50);
    if (!job->done) {
        serve_sched_cancel(h->sched, job);
    } else if (job->out[0].finish == FIN_ERROR || job->error[0]) {
        serve_error e;
        serve_fail(&e, 500, "server_error", "", "generation failed: %s", job->error[0] ? job->error : "engine error");
        out = job->req.api == SERVE_API_ANTHROPIC ? serve_anthropic_error_json(&e) : serve_error_json(&e), *status = 500;
    } else {
        out = job->req.api == SERVE_API_ANTHROPIC   ? serve_anthropic_response(&h->info, job)
              : job->req.api == SERVE_API_RESPONSES ? serve_responses_render(&h->info, job)
                                                    : serve_render_response(&h->info, job);
        *status = 200;
    }
    if (out) serve_metrics_request(job->req.chat, *status);
    serve_job_unref(job);
    pthread_mutex_unlock(mu);
    return out;
}

/* chat: 1 chat, 0 completions (metrics), -1 /v1/messages/count_tokens (prompt only). */
static enum MHD_Result completion(serve_http *h, struct MHD_Connection *c, conn_state *cs, int chat)
{
    serve_error e;
    serve_req r;
    if (cs->too_big) {
        serve_fail(&e, 413, "invalid_request_error", "", "request body is larger than the %zu-byte limit (--max-body)", h->max_body);
        return send_error(h, c, chat, &e);
    }
    const char *b = cs->body.p ? cs->body.p : "";
    int bad = cs->api == SERVE_API_ANTHROPIC   ? serve_parse_anthropic(b, cs->body.n, chat < 0, &r, &e)
              : cs->api == SERVE_API_RESPONSES ? serve_responses_parse(b, cs->body.n, &r, &e)
                                               : serve_parse(b, cs->body.n, chat, &r, &e);
    if (bad) return send_error(h, c, chat, &e);
    serve_log_ignored(&r);
    if (!serve_model_known(h, r.model)) {
        serve_fail(&e, 404, "invalid_request_error", "model", "model '%.100s' is not served here, expected '%s' (GET /v1/models)",
                   r.model, h->info.model_id);
        snprintf(e.code, sizeof e.code, "model_not_found");
        serve_req_free(&r);
        return send_error(h, c, chat, &e);
    }
    pthread_mutex_lock(serve_tokenizer_mutex(h->sched));
    int rc = serve_prepare(h->info.model, h->info.n_ctx, &r, &e);
    pthread_mutex_unlock(serve_tokenizer_mutex(h->sched));
    if (!rc && chat < 0) { /* count_tokens: the prompt /v1/messages would prefill */
        char *json = serve_anthropic_count_json(&r);
        serve_req_free(&r);
        if (json) return send_json(h, c, 200, json);
        serve_fail(&e, 503, "server_error", "", "out of memory");
        return send_error(h, c, chat, &e);
    }
    serve_job *job = rc ? NULL : serve_job_new(&r);
    if (rc || !job) {
        if (!rc) serve_fail(&e, 503, "server_error", "", "out of memory");
        serve_req_free(&r);
        return send_error(h, c, chat, &e);
    }
    cs->job = job, job->refs++; /* the access log's reference; not shared yet */
    if (serve_sched_submit(h->sched, job, &e)) {
        pthread_mutex_lock(serve_sched_mutex(h->sched));
        serve_job_unref(job);
        pthread_mutex_unlock(serve_sched_mutex(h->sched));
        return send_error(h, c, chat, &e);
    }
    if (job->req.stream) return start_stream(h, c, job);
    int status = 0;
    char *body = wait_response(h, c, job, &status);
    return body ? send_json(h, c, status, body) : MHD_NO; /* MHD_NO: close the dead connection */
}

/* ---- roles and embeddings ---- */

static const char *task_role(int task) { return task == KIPP_TASK_EMBED ? "an embedding" : task == KIPP_TASK_RERANK ? "a reranker" : "a generation"; }

/* 1: /v1/rerank (also /rerank, as vLLM and llama-server serve it), 2: /v1/score (also /score), else 0. */
static int is_rerank(const char *url)
{
    return !strcmp(url, "/v1/rerank") || !strcmp(url, "/rerank") ? 1 : !strcmp(url, "/v1/score") || !strcmp(url, "/score") ? 2 : 0;
}

/* The 400 for an endpoint the served model's role does not take (docs/SERVING.md "Roles"); 0 when it does. */
static int role_refuses_why(const serve_http *h, const char *url, int gen, serve_error *e)
{
    kipp_model_info info;
    kipp_model_get_info(h->info.model, &info);
    int emb = !strcmp(url, "/v1/embeddings"), rr = is_rerank(url);
    if (gen && h->task != KIPP_TASK_GENERATE)
        return serve_fail(e, 400, "invalid_request_error", "model", "model '%s' is %s model (kipp.variant %s) and does not "
                          "generate text; it serves %s", h->info.model_id, task_role(h->task), info.variant,
                          h->task == KIPP_TASK_EMBED ? "POST /v1/embeddings" : "POST /v1/rerank and POST /v1/score");
    if (emb && (h->task == KIPP_TASK_RERANK || (h->task == KIPP_TASK_GENERATE && !h->embeddings)))
        return serve_fail(e, 400, "invalid_request_error", "model", "model '%s' is %s model (kipp.variant %s); "
                          "/v1/embeddings needs an embedding model%s", h->info.model_id, task_role(h->task), info.variant,
                          h->task == KIPP_TASK_GENERATE ? ", or kipp-serve started with --embeddings to pool a generation "
                          "model's last hidden state" : "");
    if (rr && h->task != KIPP_TASK_RERANK)
        return serve_fail(e, 400, "invalid_request_error", "model", "model '%s' is %s model (kipp.variant %s); %s needs a "
                          "reranker model (Qwen3-Reranker)", h->info.model_id, task_role(h->task), info.variant,
                          rr == 2 ? "/v1/score" : "/v1/rerank");
    return 0;
}

/* As role_refuses_why, with OpenAI's error code "wrong_model_role" on a refusal. */
static int role_refuses(const serve_http *h, const char *url, int gen, serve_error *e)
{
    if (!role_refuses_why(h, url, gen, e)) return 0;
    snprintf(e->code, sizeof e->code, "wrong_model_role");
    return -1;
}

/* POST /v1/embeddings: parse, run on the scheduler thread (sched_embed.c), wait polling for a hang-up, render. */
static enum MHD_Result embeddings(serve_http *h, struct MHD_Connection *c, conn_state *cs)
{
    serve_error e;
    serve_embed_req r;
    if (cs->too_big) {
        serve_fail(&e, 413, "invalid_request_error", "", "request body is larger than the %zu-byte limit (--max-body)", h->max_body);
        return send_error(h, c, -1, &e);
    }
    if (serve_embed_parse(h, cs->body.p ? cs->body.p : "", cs->body.n, &r, &e)) return send_error(h, c, -1, &e);
    r.out = malloc(r.n * (size_t)r.dims * sizeof *r.out);
    if (!r.out) {
        serve_embed_req_free(&r);
        serve_fail(&e, 503, "server_error", "", "out of memory for %zu embeddings", r.n);
        return send_error(h, c, -1, &e);
    }
    serve_embed_job job = {.ids = (const uint32_t *const *)r.ids, .lens = r.lens, .n = r.n, .dims = r.dims, .out = r.out};
    serve_sched_embed(h->sched, &job);
    int fd = conn_fd(c), gone = 0;
    pthread_mutex_lock(serve_sched_mutex(h->sched));
    while (!job.done) { /* on a hang-up the job is cancelled, but its buffers stay ours until the scheduler lets go */
        if (!gone && client_gone(fd)) gone = job.cancelled = 1;
        serve_sched_wait(h->sched, 50);
    }
    pthread_mutex_unlock(serve_sched_mutex(h->sched));
    char *body = gone || job.rc ? NULL : serve_embed_render(h, &r);
    serve_embed_req_free(&r);
    if (gone) return MHD_NO;
    if (body) return send_json(h, c, 200, body);
    if (job.rc == KIPP_ENOMEM)
        serve_fail(&e, 503, "server_error", "", "no room for the embeddings now (%s); retry", job.error);
    else serve_fail(&e, job.rc == KIPP_EBACKEND ? 503 : 500, "server_error", "", "embedding failed: %s",
                    job.rc ? job.error : "out of memory rendering the response");
    return send_error(h, c, -1, &e);
}

/* ---- other endpoints ---- */

static json_t *model_obj(const serve_http *h, const char *id)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:I, s:{s:I}}", "id", id, "object", "model", "created", (json_int_t)h->started,
                     "owned_by", "kipp", "max_model_len", (json_int_t)h->info.n_ctx, "meta", "n_ctx", (json_int_t)h->info.n_ctx);
}

/* GET /v1/models: the reported name first (the alias when given), then the checkpoint id. */
static enum MHD_Result models(serve_http *h, struct MHD_Connection *c)
{
    json_t *data = json_array();
    json_array_append_new(data, model_obj(h, h->info.model_id));
    if (strcmp(h->canonical, h->info.model_id)) json_array_append_new(data, model_obj(h, h->canonical));
    json_t *o = json_pack("{s:s, s:o}", "object", "list", "data", data);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return send_json(h, c, 200, s);
}

/* GET /v1/models/{id}: any served name (client.models.retrieve), else a JSON 404. */
static enum MHD_Result model_one(serve_http *h, struct MHD_Connection *c, const char *id)
{
    if (serve_model_known(h, id) && *id) {
        json_t *o = model_obj(h, id);
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        return send_json(h, c, 200, s);
    }
    serve_error e;
    serve_fail(&e, 404, "invalid_request_error", "model", "model '%.100s' is not served here, expected '%s' (GET /v1/models)",
               id, h->info.model_id);
    snprintf(e.code, sizeof e.code, "model_not_found");
    return send_error(h, c, -1, &e);
}

/* GET /v1/responses/{id}: the stored Response (client.responses.retrieve);
 * DELETE: forget it. Unknown, stored with store false, or evicted: a 404 in OpenAI's shape. */
static enum MHD_Result response_one(serve_http *h, struct MHD_Connection *c, const char *id, int del)
{
    json_t *o = del ? (serve_resp_store_delete(id) ? json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1) : NULL)
                    : serve_resp_store_response(id);
    if (o) {
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        return send_json(h, c, 200, s);
    }
    serve_error e;
    serve_fail(&e, 404, "invalid_request_error", "", "Response with id '%.100s' not found: never stored (store: false), "
               "deleted, or evicted (the store keeps the last %d responses, in memory, per process)", id, SERVE_RESP_STORE_MAX);
    return send_error(h, c, -1, &e);
}

static enum MHD_Result metrics(serve_http *h, struct MHD_Connection *c)
{
    pthread_mutex_lock(serve_sched_mutex(h->sched));
    char *s = serve_metrics_text(serve_metrics_get());
    pthread_mutex_unlock(serve_sched_mutex(h->sched));
    return send_text(h, c, 200, "text/plain; version=0.0.4; charset=utf-8", s);
}

static enum MHD_Result tokens(serve_http *h, struct MHD_Connection *c, conn_state *cs, int detok)
{
    serve_error e;
    char *json = NULL;
    const char *b = cs->body.p ? cs->body.p : "";
    if (cs->too_big) serve_fail(&e, 413, "invalid_request_error", "", "request body is larger than the %zu-byte limit (--max-body)", h->max_body);
    if (cs->too_big || (detok ? serve_detokenize(h, b, cs->body.n, &json, &e) : serve_tokenize(h, b, cs->body.n, &json, &e)))
        return send_error(h, c, -1, &e);
    return send_json(h, c, 200, json);
}

/* POST /v1/rerank and /v1/score (server/api_rerank.c); scoring may outlast --idle-timeout, so the timer is off. */
static enum MHD_Result rerank(serve_http *h, struct MHD_Connection *c, conn_state *cs, int score_api)
{
    serve_error e;
    char *json = NULL;
    if (cs->too_big) serve_fail(&e, 413, "invalid_request_error", "", "request body is larger than the %zu-byte limit (--max-body)", h->max_body);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    cs->untimed = 1;
    if (cs->too_big || serve_rerank(h, cs->body.p ? cs->body.p : "", cs->body.n, score_api, &json, &e)) return send_error(h, c, -1, &e);
    return send_json(h, c, 200, json);
}

/* CORS preflight: 204 with what the browser may send; without --cors-origin
 * the Access-Control headers are absent and the browser refuses, as it should. */
static enum MHD_Result preflight(serve_http *h, struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Allow", "GET, HEAD, POST, DELETE, OPTIONS");
    if (h->cors_origin) {
        const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", want ? want : "Authorization, Content-Type, X-Api-Key");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    }
    return queue(h, c, 204, r);
}

static const char *const ENDPOINTS = "POST /v1/completions, POST /v1/chat/completions, POST /v1/responses, "
                                     "GET or DELETE /v1/responses/{id}, POST /v1/messages, POST /v1/messages/count_tokens, "
                                     "GET /v1/models, GET /v1/models/{id}, "
                                     "POST /v1/embeddings, POST /v1/rerank, POST /v1/score, POST /tokenize, POST /detokenize, "
                                     "GET /health, GET /metrics";

/* Which method an endpoint takes: "POST", "GET", "GET or DELETE", or NULL when url is none. */
static const char *endpoint_method(const char *url)
{
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/responses") ||
        !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize") || !strcmp(url, "/v1/messages") ||
        !strcmp(url, "/v1/messages/count_tokens") || !strcmp(url, "/v1/embeddings") || is_rerank(url))
        return "POST";
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/models") || !strcmp(url, "/metrics") || !strncmp(url, "/v1/models/", 11))
        return "GET";
    if (!strncmp(url, "/v1/responses/", 14) && url[14]) return "GET or DELETE";
    return NULL;
}

static enum MHD_Result route(serve_http *h, struct MHD_Connection *c, const char *url, const char *method, conn_state *cs)
{
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    int msgs = !strcmp(url, "/v1/messages"), count = !strcmp(url, "/v1/messages/count_tokens");
    int resp = !strcmp(url, "/v1/responses");
    int chat = !strcmp(url, "/v1/chat/completions") || msgs || resp, cmpl = !strcmp(url, "/v1/completions");
    int draining = __atomic_load_n(&h->draining, __ATOMIC_ACQUIRE);
    const char *want = endpoint_method(url);
    serve_error e;
    cs->api = msgs || count ? SERVE_API_ANTHROPIC : resp ? SERVE_API_RESPONSES : SERVE_API_OPENAI;
    if (cs->hdr_too_big) {
        serve_fail(&e, 431, "invalid_request_error", "", "the request line and headers are larger than the %zu-byte limit "
                   "(--max-header)", h->max_header);
        return send_error(h, c, -1, &e);
    }
    if (!strcmp(method, "OPTIONS")) return preflight(h, c);
    if (!want) {
        serve_fail(&e, 404, "not_found_error", "", "no endpoint at %.200s; endpoints: %s", url, ENDPOINTS);
        return send_error(h, c, -1, &e);
    }
    int del = !strcmp(method, "DELETE");
    if (!strcmp(want, "POST") ? !post : !(get || (del && strchr(want, 'D')))) {
        serve_fail(&e, 405, "invalid_request_error", "", "method %.16s is not allowed on %.100s, expected %s", method, url, want);
        return send_error(h, c, -1, &e);
    }
    if (!serve_auth_ok(h, c, url)) {
        serve_fail(&e, 401, "invalid_request_error", "", "missing or wrong API key: send \"Authorization: Bearer KEY\" or "
                   "\"X-Api-Key: KEY\" with the key kipp-serve was started with (--api-key)");
        snprintf(e.code, sizeof e.code, "invalid_api_key");
        return send_error(h, c, -1, &e);
    }
    if (!strcmp(url, "/health"))
        return draining ? send_json(h, c, 503, strdup("{\"status\":\"draining\"}")) : send_json(h, c, 200, strdup("{\"status\":\"ok\"}"));
    if (!strcmp(url, "/metrics")) return metrics(h, c);
    if (!strcmp(url, "/v1/models")) return models(h, c);
    if (!strncmp(url, "/v1/models/", 11)) return model_one(h, c, url + 11);
    if (!strncmp(url, "/v1/responses/", 14)) return response_one(h, c, url + 14, del);
    if (draining) {
        serve_fail(&e, 503, "server_error", "", "the server is shutting down and takes no new requests; retry on another replica");
        snprintf(e.code, sizeof e.code, "shutting_down");
        return send_error(h, c, chat || cmpl ? chat : -1, &e);
    }
    if (role_refuses(h, url, chat || cmpl || count, &e)) return send_error(h, c, chat || cmpl ? chat : -1, &e);
    if (!strcmp(url, "/v1/embeddings")) {
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u); /* a big batch is not idle: hang-ups are polled */
        cs->untimed = 1;
        return embeddings(h, c, cs);
    }
    if (is_rerank(url)) return rerank(h, c, cs, is_rerank(url) == 2);
    if (!chat && !cmpl && !count) return tokens(h, c, cs, !strcmp(url, "/detokenize"));
    /* Generation may take longer than --idle-timeout without a byte on the wire:
     * a completion is not idle (hang-ups are polled), so its timer is off until on_done. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    cs->untimed = 1;
    return completion(h, c, cs, count ? -1 : chat);
}

static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

/* First call of a request: its state, the in-flight count for drain (taken
 * before the drain check, so serve_main waits for every request it let in),
 * and the header size against --max-header. */
static conn_state *request_begin(serve_http *h, struct MHD_Connection *c, const char *url, const char *method)
{
    conn_state *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->t0 = serve_now();
    snprintf(cs->method, sizeof cs->method, "%s", method);
    snprintf(cs->path, sizeof cs->path, "%s", url);
    if (!strcmp(method, "POST")) cs->counted = 1, __atomic_add_fetch(&h->inflight, 1, __ATOMIC_ACQ_REL);
    size_t bytes = strlen(method) + strlen(url) + 12; /* request line: " HTTP/1.1\r\n" */
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_header_bytes, &bytes);
    cs->hdr_too_big = bytes > h->max_header;
    return cs;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    serve_http *h = cls;
    conn_state *cs = *con_cls;
    (void)version;
    if (!cs) return (*con_cls = request_begin(h, c, url, method)) ? MHD_YES : MHD_NO;
    if (*upload_size) {
        if (cs->too_big || cs->body.n + *upload_size > h->max_body) cs->too_big = 1, serve_buf_free(&cs->body);
        else if (serve_buf_put(&cs->body, upload, *upload_size)) cs->too_big = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    cur = cs;
    enum MHD_Result rc = route(h, c, url, method, cs);
    cur = NULL;
    return rc;
}

/* The access log line of a finished request (its job's numbers read under the sched mutex). */
static void log_request(serve_http *h, conn_state *cs, enum MHD_RequestTerminationCode code)
{
    serve_access a = {.method = cs->method, .path = cs->path, .status = code == MHD_REQUEST_TERMINATED_COMPLETED_OK ? cs->status : 499,
                      .prompt_tokens = -1, .ttft_s = -1, .duration_s = serve_now() - cs->t0};
    if (!cs->status) a.status = 499; /* closed before any response: nginx's "client closed request" */
    pthread_mutex_lock(serve_sched_mutex(h->sched));
    if (cs->job) {
        serve_job *j = cs->job;
        snprintf(a.id, sizeof a.id, "%s", j->pub_id);
        a.prompt_tokens = (long long)j->req.n_prompt, a.cached_tokens = j->cached_tokens;
        a.completion_tokens = 0;
        for (int i = 0; i < j->req.n; i++) a.completion_tokens += j->out[i].n_gen;
        if (j->out[0].t_first > 0) a.ttft_s = j->out[0].t_first - j->t_arrive;
        serve_job_unref(j);
        cs->job = NULL;
    }
    pthread_mutex_unlock(serve_sched_mutex(h->sched));
    if (h->access_log) serve_access_log(&a);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code)
{
    serve_http *h = cls;
    conn_state *cs = *con_cls;
    if (!cs) return;
    if (cs->untimed) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->idle_s); /* restarts the timer */
    log_request(h, cs, code);
    if (cs->counted) __atomic_sub_fetch(&h->inflight, 1, __ATOMIC_ACQ_REL);
    serve_buf_free(&cs->body), free(cs);
    *con_cls = NULL;
}

int serve_http_start(serve_http *h, const struct sockaddr *addr, unsigned max_conn, unsigned idle_s)
{
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    uint16_t port = ntohs(addr->sa_family == AF_INET6 ? ((const struct sockaddr_in6 *)addr)->sin6_port
                                                      : ((const struct sockaddr_in *)addr)->sin_port);
    if (addr->sa_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->idle_s = idle_s;
    /* libmicrohttpd answers header blocks beyond its connection memory with its
     * own HTML 431; give it room well above --max-header so request_begin
     * answers in JSON, and only absurd header blocks reach that fallback. */
    size_t pool = h->max_header * 4 + (256u << 10);
    h->daemon = MHD_start_daemon(flags, port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, serve_mhd_log, NULL,
                                 MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_CONNECTION_LIMIT, max_conn,
                                 MHD_OPTION_CONNECTION_TIMEOUT, idle_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_done, h, MHD_OPTION_END);
    if (!h->daemon) return -1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    return 0;
}

void serve_http_stop(serve_http *h)
{
    if (h && h->daemon) MHD_stop_daemon(h->daemon);
    if (h) h->daemon = NULL;
}
