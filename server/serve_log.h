/*
 * serve_log.h - kipp-serve's logging (server/serve_log.c): timestamped lines,
 * once-only notes and the JSON access log. It depends on nothing else of the
 * server, so any layer (HTTP, API, scheduler, KV events) may log.
 */
#ifndef KIPP_SERVE_LOG_H
#define KIPP_SERVE_LOG_H

#include <stdarg.h>
#include <stdint.h>

/** One stderr line "2026-01-02T03:04:05.678Z kipp-serve: <message>" (UTC, milliseconds). */
void serve_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** The same for stdout (the "listening on" line), flushed. */
void serve_log_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/**
 * Log once per process for each distinct key (thread-safe), as vLLM logs an
 * ignored request field once: 1 when this call logged, 0 when key was seen.
 * Past 256 distinct keys every call logs (nothing is silently dropped).
 */
int serve_log_once(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** libmicrohttpd's MHD_OPTION_EXTERNAL_LOGGER: its messages as timestamped lines. */
void serve_mhd_log(void *cls, const char *fmt, va_list ap);

/** What the access log records of one request. */
typedef struct {
    char id[48];              /* the id the client received (serve_job.pub_id), "" = no job */
    const char *method, *path;
    int status;
    long long prompt_tokens, completion_tokens, cached_tokens; /* -1 = not a completion */
    double ttft_s, duration_s;/* ttft -1 = no token */
} serve_access;

/** Write a's JSON line to stderr: {"ts", "id", "method", "path", "status", ...}. */
void serve_access_log(const serve_access *a);

#endif
