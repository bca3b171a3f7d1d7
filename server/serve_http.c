/*
 * serve_http.c - the HTTP layer over libmicrohttpd (issue 9 items 1-3):
 * body/header/idle limits, routing, JSON responses and SSE streams. One MHD
 * thread per connection, so a handler may block while its job runs; while it
 * waits it polls the socket for a hang-up and cancels the job at once.
 * Talks to the engine only through serve_prepare (tokenizer, under the
 * tokenizer lock), token texts when rendering (read-only) and the scheduler;
 * never to a session.
 */
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve_http.h"

typedef struct {
    serve_buf body;
    int too_big;
    int untimed;              /* the idle timeout is off while a completion runs */
} conn_state;

typedef struct {
    serve_http *h;
    serve_job *job;
    serve_stream_state st;
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

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text ? text : (char *)"", MHD_RESPMEM_MUST_FREE);
    if (!text) r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, char *json)
{
    return send_text(c, status, "application/json", json);
}

static enum MHD_Result send_error(serve_http *h, struct MHD_Connection *c, int chat, const serve_error *e)
{
    if (chat >= 0) {
        pthread_mutex_lock(serve_sched_mutex(h->sched));
        serve_metrics_request(chat, e->status);
        pthread_mutex_unlock(serve_sched_mutex(h->sched));
    }
    return send_json(c, e->status, serve_error_json(e));
}

/* ---- streaming ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *s = cls;
    (void)pos;
    if (s->off == s->out.n) {
        s->out.n = s->off = 0;
        if (s->st.done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_t *mu = serve_sched_mutex(s->h->sched);
        pthread_mutex_lock(mu);
        for (;;) {
            serve_render_chunks(&s->h->info, s->job, &s->st, &s->out);
            if (s->out.n || s->st.done_sent) break;
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
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
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
        out = serve_error_json(&e), *status = 500;
    } else {
        out = serve_render_response(&h->info, job), *status = 200;
    }
    if (out) serve_metrics_request(job->req.chat, *status);
    serve_job_unref(job);
    pthread_mutex_unlock(mu);
    return out;
}

static int model_known(const serve_http *h, const char *name)
{
    if (!name) return 1;
    for (int i = 0; i < h->n_names; i++)
        if (!strcmp(name, h->names[i])) return 1;
    return 0;
}

static enum MHD_Result completion(serve_http *h, struct MHD_Connection *c, conn_state *cs, int chat)
{
    serve_error e;
    serve_req r;
    if (cs->too_big) {
        serve_fail(&e, 413, "invalid_request_error", "", "request body is larger than the %zu-byte limit (--max-body)", h->max_body);
        return send_error(h, c, chat, &e);
    }
    if (serve_parse(cs->body.p ? cs->body.p : "", cs->body.n, chat, &r, &e)) return send_error(h, c, chat, &e);
    if (!model_known(h, r.model)) {
        serve_fail(&e, 404, "invalid_request_error", "model", "model '%.100s' is not served here, expected '%s' (GET /v1/models)",
                   r.model, h->info.model_id);
        snprintf(e.code, sizeof e.code, "model_not_found");
        serve_req_free(&r);
        return send_error(h, c, chat, &e);
    }
    pthread_mutex_lock(serve_tokenizer_mutex(h->sched));
    int rc = serve_prepare(h->info.model, h->info.n_ctx, &r, &e);
    pthread_mutex_unlock(serve_tokenizer_mutex(h->sched));
    serve_job *job = rc ? NULL : serve_job_new(&r);
    if (rc || !job) {
        if (!rc) serve_fail(&e, 503, "server_error", "", "out of memory");
        serve_req_free(&r);
        return send_error(h, c, chat, &e);
    }
    if (serve_sched_submit(h->sched, job, &e)) {
        pthread_mutex_lock(serve_sched_mutex(h->sched));
        serve_job_unref(job);
        pthread_mutex_unlock(serve_sched_mutex(h->sched));
        return send_error(h, c, chat, &e);
    }
    if (job->req.stream) return start_stream(h, c, job);
    int status = 0;
    char *body = wait_response(h, c, job, &status);
    return body ? send_json(c, status, body) : MHD_NO; /* MHD_NO: close the dead connection */
}

/* ---- other endpoints ---- */

static enum MHD_Result models(serve_http *h, struct MHD_Connection *c)
{
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:{s:I}}]}", "object", "list", "data", "id", h->info.model_id, "object",
                          "model", "created", (json_int_t)h->started, "owned_by", "kipp", "meta", "n_ctx",
                          (json_int_t)h->info.n_ctx);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return send_json(c, 200, s);
}

static enum MHD_Result metrics(serve_http *h, struct MHD_Connection *c)
{
    pthread_mutex_lock(serve_sched_mutex(h->sched));
    char *s = serve_metrics_text(serve_metrics_get());
    pthread_mutex_unlock(serve_sched_mutex(h->sched));
    return send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", s);
}

static enum MHD_Result route(serve_http *h, struct MHD_Connection *c, const char *url, const char *method, conn_state *cs)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    int chat = !strcmp(url, "/v1/chat/completions"), cmpl = !strcmp(url, "/v1/completions");
    serve_error e;
    if ((chat || cmpl) && post) {
        /* Generation may take longer than --idle-timeout without a byte on the wire:
         * a completion is not idle (hang-ups are polled), so its timer is off until on_done. */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
        cs->untimed = 1;
        return completion(h, c, cs, chat);
    }
    if (get && !strcmp(url, "/health")) return send_json(c, 200, strdup("{\"status\":\"ok\"}"));
    if (get && !strcmp(url, "/v1/models")) return models(h, c);
    if (get && !strcmp(url, "/metrics")) return metrics(h, c);
    int known = chat || cmpl || !strcmp(url, "/health") || !strcmp(url, "/v1/models") || !strcmp(url, "/metrics");
    if (known) {
        serve_fail(&e, 405, "invalid_request_error", "", "method %.16s is not allowed on %.100s, expected %s", method, url,
                   chat || cmpl ? "POST" : "GET");
        return send_error(h, c, -1, &e);
    }
    serve_fail(&e, 404, "not_found_error", "", "no endpoint at %.200s; endpoints: POST /v1/completions, POST "
               "/v1/chat/completions, GET /v1/models, GET /health, GET /metrics", url);
    return send_error(h, c, -1, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    serve_http *h = cls;
    conn_state *cs = *con_cls;
    (void)version;
    if (!cs) {
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cs->too_big || cs->body.n + *upload_size > h->max_body) cs->too_big = 1, serve_buf_free(&cs->body);
        else if (serve_buf_put(&cs->body, upload, *upload_size)) cs->too_big = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    return route(h, c, url, method, cs);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code)
{
    serve_http *h = cls;
    conn_state *cs = *con_cls;
    (void)code;
    if (cs && cs->untimed) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->idle_s); /* restarts the timer */
    if (cs) serve_buf_free(&cs->body), free(cs);
    *con_cls = NULL;
}

int serve_http_start(serve_http *h, const struct sockaddr *addr, unsigned max_conn, unsigned idle_s, size_t max_header)
{
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (addr->sa_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->idle_s = idle_s;
    h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, addr,
                                 MHD_OPTION_CONNECTION_LIMIT, max_conn, MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, max_header, MHD_OPTION_NOTIFY_COMPLETED, on_done, h,
                                 MHD_OPTION_END);
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
