/*
 * backend_util.h - the error and assert helpers a backend may use, next to
 * the boundary it implements (engine/backend.h). Backends include this (and
 * engine/threadpool.h, the worker pool), never engine/internal.h
 * (docs/ARCHITECTURE.md "Who may call whom"); the functions live in engine/util.c. Error codes are the public KIPP_E* of engine/kipp.h.
 */
#ifndef KIPP_BACKEND_UTIL_H
#define KIPP_BACKEND_UTIL_H

#include <stddef.h>

#include "engine/kipp.h"

/** printf into (err, errlen) when err != NULL; returns code for `return kipp_err(...)`. */
int kipp_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** Release-build assert for internal invariants (docs/ARCHITECTURE.md "Errors"). */
#define KIPP_ASSERT(c) \
    do { if (!(c)) kipp_assert_fail(#c, __FILE__, __LINE__); } while (0)
void kipp_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
