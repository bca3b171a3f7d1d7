/* names.c - kipp_join_names (kernels/names.h). */
#include <stdio.h>

#include "kernels/names.h"

const char *kipp_join_names(char *buf, size_t len, const char *const *names, size_t n, const char *sep)
{
    size_t o = 0;
    if (len) buf[0] = '\0';
    for (size_t i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? sep : "", names[i]);
    return buf;
}
