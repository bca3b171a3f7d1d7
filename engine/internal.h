/*
 * internal.h - engine-private structures shared by the engine sources and tests.
 * Not part of the public API; the server never includes this.
 */
#ifndef KIPP_INTERNAL_H
#define KIPP_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "gguf.h"
#include "kipp.h"
#include "kipp_checkpoints.h"
#include "tokenizer.h"

/** An open model: one read-only mapping plus everything bound from it. */
struct kipp_model {
    void *map;                     /* mmap of the whole file, PROT_READ */
    size_t map_size;               /* bytes */
    kipp_gguf gguf;                /* parsed directory, views into map */
    const kipp_checkpoint *ckpt;   /* matched registry entry */
    kipp_qwen3_layer *layers;      /* [n_layer] views, owned here */
    kipp_model_view view;          /* what the backend sees */
    kipp_tokenizer *tok;           /* built from the GGUF tokenizer data */
    kipp_str *tok_strs;            /* index arrays backing the tokenizer views */
    const kipp_backend_ops *ops;   /* chosen at open, never changed */
    void *bm;                      /* backend model */
    uint64_t weight_bytes;         /* sum of tensor bytes */
};

/** A session: logical timeline + block table; KV bytes live in the backend. */
struct kipp_session {
    kipp_model *model;
    void *bs;                 /* backend session */
    uint32_t capacity;        /* tokens */
    uint32_t n_blocks;        /* ceil(capacity/32) physical blocks */
    uint32_t length;          /* tokens in cache */
    uint32_t *block_table;    /* [n_blocks] logical -> physical block */
};

/** printf into (err, errlen) when err != NULL; returns code for `return kipp_err(...)`. */
int kipp_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/**
 * Test hook: replace a session's block table with perm ([n_blocks], a
 * permutation of 0..n_blocks-1). Used by the paged-KV gate. KIPP_EINVAL when
 * perm is not a permutation; only valid while the session is empty.
 */
int kipp_session_set_block_table(kipp_session *s, const uint32_t *perm, char *err,
                                 size_t errlen);

/** Release-build assert for internal invariants (ARCHITECTURE.md "Errors"). */
#define KIPP_ASSERT(c) \
    do { if (!(c)) kipp_assert_fail(#c, __FILE__, __LINE__); } while (0)
void kipp_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
