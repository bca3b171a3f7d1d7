/*
 * serve_log.c - kipp-serve's log lines: timestamped messages on stderr
 * (libmicrohttpd's too), the "listening on" line on stdout, once-only notes,
 * and the JSON access log. Every layer of the server logs through here, so
 * none needs the HTTP layer's header to say something.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "server/serve_log.h"

/* "2026-01-02T03:04:05.678Z": UTC with milliseconds, sortable across replicas. */
static void stamp(char *buf, size_t cap)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03dZ", (int)(tv.tv_usec / 1000));
}

/* One whole line per call: formatted first, then written with one fputs, so
 * lines from different threads never interleave. */
static void vline(FILE *f, const char *fmt, va_list ap)
{
    char ts[40], msg[1024];
    stamp(ts, sizeof ts);
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0; /* libmicrohttpd ends its messages with one */
    char line[1100];
    snprintf(line, sizeof line, "%s kipp-serve: %s\n", ts, msg);
    fputs(line, f);
    fflush(f);
}

void serve_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline(stderr, fmt, ap);
    va_end(ap);
}

void serve_log_out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline(stdout, fmt, ap);
    va_end(ap);
}

void serve_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[900];
    vsnprintf(msg, sizeof msg, fmt, ap);
    serve_log("http: %s", msg);
}

#define LOG_ONCE_MAX 256 /* distinct keys remembered; later ones are logged every time rather than lost */

int serve_log_once(const char *key, const char *fmt, ...)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char *seen[LOG_ONCE_MAX];
    static size_t n_seen;
    int first = 1;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_seen && first; i++) first = strcmp(seen[i], key) != 0;
    if (first && n_seen < LOG_ONCE_MAX) seen[n_seen] = strdup(key), n_seen += seen[n_seen] != NULL;
    pthread_mutex_unlock(&mu);
    if (!first) return 0;
    va_list ap;
    va_start(ap, fmt);
    vline(stderr, fmt, ap);
    va_end(ap);
    return 1;
}

void serve_access_log(const serve_access *a)
{
    char ts[40];
    stamp(ts, sizeof ts);
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i}", "ts", ts, "event", "request", "method", a->method ? a->method : "",
                          "path", a->path ? a->path : "", "status", a->status);
    if (a->id[0]) json_object_set_new(o, "id", json_string(a->id));
    if (a->prompt_tokens >= 0) {
        json_object_set_new(o, "prompt_tokens", json_integer(a->prompt_tokens));
        json_object_set_new(o, "completion_tokens", json_integer(a->completion_tokens));
        json_object_set_new(o, "cached_tokens", json_integer(a->cached_tokens));
    }
    json_object_set_new(o, "ttft_ms", a->ttft_s >= 0 ? json_real(a->ttft_s * 1e3) : json_null());
    json_object_set_new(o, "duration_ms", json_real(a->duration_s * 1e3));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (s) {
        size_t n = strlen(s);
        s[n] = '\n'; /* one fwrite of the whole line, so lines never interleave */
        fwrite(s, 1, n + 1, stderr);
        fflush(stderr);
    }
    free(s);
}
