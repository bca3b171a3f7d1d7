/* formats.c - the table of kernels/formats.h and its lookups. */
#include <stdio.h>
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

/** One tensor type the parser reads: a row of either list in formats.h. */
typedef struct {
    uint32_t gguf_type;
    const char *type_name;
    uint32_t block, block_bytes;
} gguf_type_row;

/* Both lists as one, in list order (the weight formats, then the plain types). */
static const gguf_type_row gguf_types[] = {
#define KIPP_FMT_TYPE(ID, gguf, tname, sch, blk, bbytes) {.gguf_type = gguf, .type_name = tname, .block = blk, .block_bytes = bbytes},
#define KIPP_PLAIN_TYPE(ID, gguf, tname, bytes) {.gguf_type = gguf, .type_name = tname, .block = 1, .block_bytes = bytes},
    KIPP_FMT_LIST(KIPP_FMT_TYPE) KIPP_PLAIN_TYPE_LIST(KIPP_PLAIN_TYPE)
#undef KIPP_FMT_TYPE
#undef KIPP_PLAIN_TYPE
};
#define N_GGUF_TYPES (sizeof gguf_types / sizeof gguf_types[0])

static const gguf_type_row *gguf_type_find(uint32_t t)
{
    for (size_t i = 0; i < N_GGUF_TYPES; i++)
        if (gguf_types[i].gguf_type == t) return &gguf_types[i];
    return NULL;
}

const char *kipp_gguf_type_name(uint32_t t)
{
    const gguf_type_row *r = gguf_type_find(t);
    return r ? r->type_name : "unknown";
}

uint32_t kipp_gguf_type_block(uint32_t t, uint32_t *block)
{
    const gguf_type_row *r = gguf_type_find(t);
    *block = r ? r->block : 1;
    return r ? r->block_bytes : 0;
}

const char *kipp_gguf_type_list(char *buf, size_t len)
{
    size_t o = 0, n = 0;
    if (len) buf[0] = '\0';
    /* Selection by id: the k-th smallest each round (a handful of rows). */
    for (uint32_t last = 0, first = 1; n < N_GGUF_TYPES; n++, first = 0) {
        const gguf_type_row *next = NULL;
        for (size_t i = 0; i < N_GGUF_TYPES; i++)
            if ((first || gguf_types[i].gguf_type > last) && (!next || gguf_types[i].gguf_type < next->gguf_type))
                next = &gguf_types[i];
        const char *sep = n == 0 ? "" : n + 1 == N_GGUF_TYPES ? " or " : ", ";
        if (o < len) o += (size_t)snprintf(buf + o, len - o, "%s%s (%u)", sep, next->type_name, next->gguf_type);
        last = next->gguf_type;
    }
    return buf;
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
