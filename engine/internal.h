/*
 * internal.h - engine-private structures shared by the engine sources and tests.
 * Not part of the public API; the server never includes this.
 */
#ifndef KIPP_INTERNAL_H
#define KIPP_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/backend_util.h"
#include "engine/gguf.h"
#include "engine/kipp.h"
#include "engine/kipp_checkpoints.h"
#include "engine/tokenizer.h"

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
    uint32_t *tok_added_ids;       /* [n_added] aligned copy of kipp.tokenizer.added_ids */
    const kipp_backend_ops *ops;   /* chosen at open, never changed */
    void *bm;                      /* backend model */
    uint64_t weight_bytes;         /* sum of tensor bytes */
    const char *quant;             /* kipp.quant.scheme: "bf16", "q8_0" or "affine4_gs32" (static) */
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

/**
 * Open path read-only, mmap it (MAP_PRIVATE, PROT_READ), validate it as a Kipp
 * GGUF artifact (docs/FORMAT.md: container, registry match, every metadata key,
 * tensor directory) and bind the weight views and the tokenizer, without a
 * backend (m->ops == NULL). Weights are never copied. Used by kipp_model_open
 * and `kipp inspect`. Errors: KIPP_EIO (open/stat/mmap, naming the path),
 * KIPP_EFORMAT (the loader's reason, naming the bad value and the expectation),
 * KIPP_ENOMEM. Release *out with kipp_model_close.
 */
int kipp_model_load(const char *path, kipp_model **out, char *err, size_t errlen);

/**
 * Everything kipp_model_load checks, on an in-memory image buf[size] (no mmap,
 * no tokenizer, no backend); allocations are released before returning. Used
 * by the fuzz target (tests/fuzz_gguf.c) and the loader tests. Same errors.
 */
int kipp_model_validate_image(const void *buf, size_t size, char *err, size_t errlen);


/**
 * Test hook: replace a session's block table with perm ([n_blocks], a
 * permutation of 0..n_blocks-1). Used by the paged-KV gate. KIPP_EINVAL when
 * perm is not a permutation; only valid while the session is empty.
 */
int kipp_session_set_block_table(kipp_session *s, const uint32_t *perm, char *err,
                                 size_t errlen);



/**
 * Test hooks on the speculative gate (engine/spec.c): the draft length the
 * next kipp_spec_step would ask for (0 = plain step, 1 while probing), and
 * feeding it one step's outcome (drafted tokens, of which accepted matched).
 */
uint32_t kipp_spec_gate_next(kipp_spec *sp);
void kipp_spec_gate_observe(kipp_spec *sp, uint32_t drafted, uint32_t accepted);

#endif
