/* errors.c - error formatting, release-build asserts and error names (base/errbuf.h,
 * base/errors.h; docs/ARCHITECTURE.md "Errors"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/errbuf.h"

int kipp_err(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void kipp_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "kipp: internal invariant failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

const char *kipp_strerror(int code)
{
    switch (code) {
    case KIPP_OK: return "OK";
    case KIPP_EINVAL: return "EINVAL";
    case KIPP_EIO: return "EIO";
    case KIPP_EFORMAT: return "EFORMAT";
    case KIPP_ENOMEM: return "ENOMEM";
    case KIPP_ERANGE: return "ERANGE";
    case KIPP_EBACKEND: return "EBACKEND";
    case KIPP_ENOTSUP: return "ENOTSUP";
    case KIPP_ENUMERIC: return "ENUMERIC";
    default: return "EUNKNOWN";
    }
}
