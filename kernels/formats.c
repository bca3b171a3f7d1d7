/* formats.c - the table of kernels/formats.h and its lookups. */
#include <string.h>

#include "kernels/formats.h"

const kipp_fmt_facts kipp_fmts[KIPP_FMT_COUNT] = {
#define KIPP_FMT_ROW(ID, gguf, tname, sch, blk, bbytes) \
    {.gguf_type = gguf, .type_name = tname, .scheme = sch, .block = blk, .block_bytes = bbytes},
    KIPP_FMT_LIST(KIPP_FMT_ROW)
#undef KIPP_FMT_ROW
};

const kipp_fmt_facts *kipp_fmt_by_gguf(uint32_t t)
{
    for (size_t i = 0; i < KIPP_FMT_COUNT; i++)
        if (kipp_fmts[i].gguf_type == t) return &kipp_fmts[i];
    return NULL;
}

const kipp_fmt_facts *kipp_fmt_by_scheme(const char *s, size_t len)
{
    for (size_t i = 0; i < KIPP_FMT_COUNT; i++)
        if (strlen(kipp_fmts[i].scheme) == len && memcmp(kipp_fmts[i].scheme, s, len) == 0) return &kipp_fmts[i];
    return NULL;
}

size_t kipp_fmt_file_bytes(const kipp_fmt_facts *f, size_t rows_, size_t cols)
{
    return rows_ * (cols / f->block) * f->block_bytes;
}

const char *kipp_gguf_type_name(uint32_t t)
{
    const kipp_fmt_facts *f = kipp_fmt_by_gguf(t);
    return f ? f->type_name : t == KIPP_TTYPE_F32 ? "F32" : t == KIPP_TTYPE_F16 ? "F16" : "unknown";
}

int kipp_quantizable(const char *name)
{
    static const char *const names[] = {
#define KIPP_Q_NAME(n) #n,
        KIPP_QUANTIZABLE_LIST(KIPP_Q_NAME)
#undef KIPP_Q_NAME
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(names[i], name) == 0) return 1;
    return 0;
}
