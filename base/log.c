/* log.c - the process-wide sink of the library's notes (base/log.h). */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static kipp_log_fn sink_fn;
static void *sink_user;

void kipp_log_set_sink(kipp_log_fn fn, void *user)
{
    pthread_mutex_lock(&mu);
    sink_fn = fn, sink_user = user;
    pthread_mutex_unlock(&mu);
}

void kipp_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&mu); /* one line at a time, and never a sink being replaced mid-call */
    if (sink_fn) sink_fn(sink_user, line);
    else fprintf(stderr, "kipp: %s\n", line);
    pthread_mutex_unlock(&mu);
}
