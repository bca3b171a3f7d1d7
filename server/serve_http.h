/*
 * serve_http.h - the HTTP layer's handle (server/serve_http.c).
 */
#ifndef KIPP_SERVE_HTTP_H
#define KIPP_SERVE_HTTP_H

#include <sys/socket.h>
#include <time.h>

#include "server/serve.h"

/** Server state the HTTP handlers read; filled by serve_main.c. */
typedef struct {
    serve_sched *sched;
    serve_info info;          /* model id, model (tokenizer only), n_ctx */
    const char *names[4];     /* accepted values of "model" */
    int n_names;
    size_t max_body;          /* bytes; larger bodies get 413 */
    time_t started;
    struct MHD_Daemon *daemon;
    unsigned port;            /* bound port (useful with --port 0) */
    unsigned idle_s;          /* --idle-timeout, seconds */
} serve_http;

/**
 * Listen on addr (loopback by default) with at most max_conn connections,
 * idle connections closed after idle_s seconds, and max_header bytes of
 * per-connection memory for the request line and headers (larger header
 * blocks are refused by libmicrohttpd with 431). 0 or -1.
 */
int serve_http_start(serve_http *h, const struct sockaddr *addr, unsigned max_conn, unsigned idle_s, size_t max_header);
/** Stop listening and close every connection; NULL accepted. */
void serve_http_stop(serve_http *h);

#endif
