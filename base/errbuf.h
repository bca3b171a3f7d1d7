/*
 * errbuf.h - filling the (err, errlen) sentence buffer every fallible call
 * takes, and the release-build assert (docs/ARCHITECTURE.md "Errors"). For the
 * library's own layers (base, kernels, backends, engine), not for clients:
 * engine/kipp.h does not include it. Defined in base/errors.c.
 */
#ifndef KIPP_BASE_ERRBUF_H
#define KIPP_BASE_ERRBUF_H

#include <stddef.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/** printf into (err, errlen) when err != NULL; returns code for `return kipp_err(...)`. */
int kipp_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** Release-build assert for internal invariants (docs/ARCHITECTURE.md "Errors"). */
#define KIPP_ASSERT(c) \
    do { if (!(c)) kipp_assert_fail(#c, __FILE__, __LINE__); } while (0)
void kipp_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif

#endif
