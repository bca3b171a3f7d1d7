/*
 * gguf.h - bounds-checked parser for the GGUF v3 container (docs/FORMAT.md).
 *
 * Implemented from the published GGUF format; no ggml code is vendored.
 * The parser never reads outside [buf, buf+size): every length, count and
 * offset is checked before use, so a malformed file yields an error, never an
 * out-of-bounds read (fuzzed by tests/fuzz_gguf.c). It knows the container
 * only; the Kipp subset rules (keys, tensors, registry) live in engine/model.c.
 */
#ifndef KIPP_GGUF_H
#define KIPP_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h" /* kipp_str */

/* GGUF value types (GGUF spec). */
enum {
    KIPP_GGUF_U8 = 0, KIPP_GGUF_I8 = 1, KIPP_GGUF_U16 = 2, KIPP_GGUF_I16 = 3,
    KIPP_GGUF_U32 = 4, KIPP_GGUF_I32 = 5, KIPP_GGUF_F32 = 6, KIPP_GGUF_BOOL = 7,
    KIPP_GGUF_STRING = 8, KIPP_GGUF_ARRAY = 9, KIPP_GGUF_U64 = 10, KIPP_GGUF_I64 = 11,
    KIPP_GGUF_F64 = 12
};

#define KIPP_GGUF_MAX_STRING (1u << 20)  /* bytes per string */
#define KIPP_GGUF_MAX_ARRAY (1u << 24)   /* elements per array */
#define KIPP_GGUF_MAX_KV 4096u
#define KIPP_GGUF_MAX_TENSORS 65536u
#define KIPP_GGUF_MAX_DIMS 4u

/** One metadata pair. Scalars in the union; arrays described by arr_*. */
typedef struct {
    kipp_str key;
    uint32_t type;              /* KIPP_GGUF_* */
    union {
        uint64_t u;             /* U8..U64 widened */
        int64_t i;              /* I8..I64 widened */
        double f;               /* F32/F64 widened */
        int b;                  /* BOOL */
        kipp_str s;             /* STRING */
    } v;
    uint32_t arr_type;          /* element type when type == ARRAY (no nested arrays) */
    uint64_t arr_n;             /* element count */
    const void *arr_data;       /* numeric arrays: raw little-endian elements in the buffer */
    kipp_str *arr_str;          /* string arrays: [arr_n] views, malloc'd by the parser */
} kipp_gguf_kv;

/** One tensor directory entry. dims are GGUF order (fastest first). */
typedef struct {
    kipp_str name;
    uint32_t n_dims;
    uint64_t dims[KIPP_GGUF_MAX_DIMS];
    uint32_t type;              /* GGUF tensor type (30 = BF16) */
    uint64_t offset;            /* relative to data start, as stored */
    uint64_t nbytes;            /* computed from type and dims */
    const void *data;           /* buf + data_offset + offset, bounds-checked */
} kipp_gguf_tensor;

/** A parsed file. Views point into the caller's buffer, which must outlive it. */
typedef struct {
    uint32_t version;           /* 3 */
    uint32_t alignment;         /* general.alignment, default 32 */
    uint64_t n_kv;
    kipp_gguf_kv *kv;           /* [n_kv], malloc'd */
    uint64_t n_tensors;
    kipp_gguf_tensor *tensors;  /* [n_tensors], malloc'd */
    uint64_t data_offset;       /* bytes from buf start to tensor data */
} kipp_gguf;

/**
 * Parse buf[size]. Checks magic, version 3, counts against the KIPP_GGUF_MAX_*
 * caps, every string/array length against the remaining bytes, known types,
 * tensor type/dims/nbytes overflow, offset alignment and data within size.
 * Errors: KIPP_EFORMAT with a sentence naming the bad field and its value,
 * KIPP_ENOMEM. On error *out is left freed.
 */
int kipp_gguf_parse(const void *buf, size_t size, kipp_gguf *out, char *err, size_t errlen);

/** Free what kipp_gguf_parse allocated; safe on a zeroed or freed struct. */
void kipp_gguf_free(kipp_gguf *g);

/** Find a key (NUL-terminated); NULL when absent. */
const kipp_gguf_kv *kipp_gguf_find(const kipp_gguf *g, const char *key);

/** Compare a kipp_str with a NUL-terminated string. */
int kipp_str_eq(kipp_str a, const char *b);

#endif
