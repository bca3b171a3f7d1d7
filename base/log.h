/*
 * log.h - the library's notes to the operator (a slower kernel level, weights
 * streamed from the file): one line each, to a process-wide sink. The default
 * sink writes "kipp: <line>" to stderr; a program with its own log format
 * (kipp-serve's timestamped lines) installs its sink with kipp_log_set_sink,
 * which engine/kipp.h exports. Defined in base/log.c.
 */
#ifndef KIPP_BASE_LOG_H
#define KIPP_BASE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

/** A log sink: receives one line (NUL-terminated, no trailing newline) and its user pointer. */
typedef void (*kipp_log_fn)(void *user, const char *line);

/**
 * Send every later note to fn(user, line); fn NULL restores the default
 * (stderr). Thread-safe; fn may be called from any thread, one line per call.
 */
void kipp_log_set_sink(kipp_log_fn fn, void *user);

/** Format one note (at most 1023 bytes, cut beyond) and hand it to the sink. */
void kipp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif
