/*
 * internal.h - engine-private structures shared by the engine sources and tests.
 * Not part of the public API; the server never includes this.
 */
#ifndef KIPP_INTERNAL_H
#define KIPP_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "engine/backend.h"
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
    const char *quant;             /* kipp.quant.scheme, a scheme of kernels/formats.h (static) */
    const char *quant_head;        /* kipp.quant.head's scheme, "bf16" when absent (static) */
    struct kipp_kv_pool *pool;     /* pooled models: block bookkeeping of the backend's KV slab; else NULL */
    struct kipp_kv_disk *disk;     /* the disk tier under the pool (kipp_model_enable_disk_tier); else NULL */
    int disk_async;                /* 1: prefix matches leave disk reads to kipp_model_disk_load_* (kv_disk_load.c) */
    uint32_t n_sessions;           /* live sessions (a pool can only be enabled at 0) */
    struct kipp_vocab_index *gvi;  /* constrained output's vocabulary index, built on first use (grammar_vocab.c) */
    void **lora_bufs;              /* [lora_tensors] merged tensors (kipp_aligned_alloc), owned; views point here */
    uint32_t n_lora;               /* adapters merged at open */
    uint32_t lora_tensors;         /* tensors replaced by merged copies */
    uint64_t lora_bytes;           /* bytes of lora_bufs */
    double lora_merge_ms;          /* wall time of kipp_lora_apply, ms */
    kipp_rope_scaling rope;        /* RoPE scaling in use, resolved (engine/rope_scaling.c); yarn 0 = none */
};

/**
 * A session: logical timeline + block table; KV bytes live in the backend.
 * Pooled sessions (model->pool != NULL) map logical blocks [0, n_shared) to
 * published pool blocks (immutable, referenced), [n_shared, n_alloc) to
 * private pool blocks, and the rest to KIPP_POOL_NONE.
 */
struct kipp_session {
    kipp_model *model;
    void *bs;                 /* backend session */
    uint32_t capacity;        /* tokens */
    uint32_t n_blocks;        /* ceil(capacity/32) logical blocks (unpooled: physical too) */
    uint32_t length;          /* tokens in cache */
    uint32_t *block_table;    /* [n_blocks] logical -> physical block */
    uint32_t *tokens;         /* pooled: [capacity] ids at positions < length, hashed at publish; else NULL */
    uint32_t n_shared;        /* pooled: leading blocks mapped to published blocks */
    uint32_t n_alloc;         /* pooled: blocks [0, n_alloc) are mapped; n_shared <= n_alloc */
};

/* ---- pooled sessions (engine/session_pool.c) ---- */

/**
 * Give m (with a backend) a KV pool of n_blocks blocks: the bookkeeping here
 * and the slab in the backend. Used by kipp_model_open_pooled and by tests on
 * in-memory models. KIPP_EINVAL when m already has one, KIPP_ENOMEM.
 */
int kipp_model_attach_pool(kipp_model *m, uint32_t n_blocks, char *err, size_t errlen);

/** Pooled part of kipp_session_create: tokens buffer, unmapped table, backend session. */
int kipp_pool_session_create(kipp_session *s, char *err, size_t errlen);
/** Publish s's full blocks and release every block (reset/destroy); length becomes 0. */
void kipp_pool_session_release(kipp_session *s);
/**
 * Make the empty pooled session dst (same model, capacity >= src's length)
 * hold src's tokens and KV, as if it had evaluated them: src's full blocks are
 * published first and then referenced by both; a partial last block is copied
 * into a private block of dst. src may go on appending. Results of evaluating
 * after the fork equal evaluating the whole sequence in dst (the KV is the
 * same bytes). Errors: KIPP_EINVAL (unpooled, another model, dst not empty or
 * too small), KIPP_ENOMEM (no block for the tail's copy; nothing changed).
 */
int kipp_pool_session_fork(kipp_session *dst, kipp_session *src, char *err, size_t errlen);
/** Pooled truncation (see kipp_session_truncate); n <= length checked by the caller. */
int kipp_pool_session_truncate(kipp_session *s, uint32_t n, char *err, size_t errlen);
/**
 * Map private blocks so items[0..n) fit (before the backend runs); on failure
 * nothing stays mapped. n_alloc_before[n] receives each session's n_alloc for
 * kipp_pool_batch_rollback. 0 or KIPP_ENOMEM.
 */
int kipp_pool_batch_map(kipp_model *m, const kipp_batch_item *items, size_t n, uint32_t *n_alloc_before,
                        char *err, size_t errlen);
/** Undo kipp_pool_batch_map (the evaluation failed). */
void kipp_pool_batch_rollback(kipp_model *m, const kipp_batch_item *items, size_t n, const uint32_t *n_alloc_before);
/** Record the evaluated ids of items in their sessions' token buffers (before length advances). */
void kipp_pool_batch_commit(const kipp_batch_item *items, size_t n);

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
 * no tokenizer, no backend), then the bound view through kipp_view_check as
 * kipp_model_open does before a backend sees it; allocations are released
 * before returning. Used by the fuzz target (tests/fuzz_gguf.c, so the view
 * check runs under the fuzzer's sanitizers) and the loader tests. Same errors.
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

/**
 * Stop strings over text[n] (engine/gen.c), of which text[from..n) is new:
 * earlier bytes were scanned before, so only matches that end in the new
 * bytes are looked for. Returns the offset of the first match (n when none);
 * *final_len receives the bytes that can no longer change: up to the match,
 * else n less the longest tail that could still grow into a stop string.
 */
size_t kipp_stop_scan(const char *const *stop, size_t n_stop, const char *text, size_t n, size_t from,
                      size_t *final_len);

/**
 * Fold the wall time (seconds) of one verification of `rows` rows into the
 * gate's cost model (engine/spec.c); ignored with fixed_k, with fixed costs
 * unless a draft model's evaluations are priced by it, and for secs <= 0. kipp_spec_step times its own; a batched caller (kipp_gen)
 * passes its step's time.
 */
void kipp_spec_gate_time(kipp_spec *sp, uint32_t rows, double secs);
void kipp_spec_gate_observe(kipp_spec *sp, uint32_t drafted, uint32_t accepted);

/** Seed 002 "Layer streaming": a file whose weights exceed this share of the available RAM is streamed, and
 * the page cache keeps at most this share of it; the planner predicts by the same figure. */
#define KIPP_RESIDENT_SHARE 0.75

/** RAM total and available in bytes from /proc/meminfo, capped by this process's memory cgroup (v2 or v1) limit and
 * memory.max - memory.current (engine/plan_probe.c). KIPP_EIO when /proc/meminfo has no MemTotal. */
int kipp_plan_ram(uint64_t *total, uint64_t *avail, char *err, size_t errlen);

/** Where kipp_plan_ram reads: the meminfo file, this process's cgroup list and the cgroup mount root. */
typedef struct {
    const char *meminfo;     /* "/proc/meminfo" */
    const char *self_cgroup; /* "/proc/self/cgroup": "0::<path>" (v2) or "N:memory:<path>" lines (v1/hybrid) */
    const char *cgroup_root; /* "/sys/fs/cgroup": v2 files at <root><path>, v1 at <root>/memory<path> */
} kipp_ram_paths;

/** kipp_plan_ram over the files `at` names (tests point them at files of their own; the kernel only
 * enforces what these files say). Same results and errors. */
int kipp_plan_ram_at(const kipp_ram_paths *at, uint64_t *total, uint64_t *avail, char *err, size_t errlen);

/** Write o->rationale: the arithmetic of o's predictions on p's machine as one paragraph (engine/plan_out.c);
 * streamed_bytes: the bytes of a decode step read from the file (0 when none). */
void kipp_plan_rationale(const kipp_plan *p, kipp_plan_format *o, double streamed_bytes);

/**
 * Decide layer streaming for m (engine/stream_mode.c): opts->stream (or, when
 * AUTO, the environment's KIPP_STREAM), else streamed when m's weight bytes
 * exceed 0.75 x available RAM (kipp_plan_ram). Fills m->view.stream and
 * m->view.prefetch (opts->no_prefetch, KIPP_PREFETCH=0) and says so on stderr
 * when it streams. KIPP_EINVAL for a bad opts->stream or KIPP_STREAM value.
 */
int kipp_stream_resolve(kipp_model *m, const kipp_model_options *opts, char *err, size_t errlen);

/** Set m's KV type (engine/kv_type.c) before the backend is created; KIPP_EINVAL naming a value out of range. */
int kipp_kv_type_set(kipp_model *m, int kv_type, char *err, size_t errlen);

/**
 * The one check of a model view before a backend sees it (engine/view_check.c):
 * a Qwen3 shape, every tensor present with its slot's shape, norms and
 * embedding BF16, projections and head in a weight format. KIPP_EFORMAT with
 * a sentence naming the tensor, its shape and the expectation.
 */
int kipp_view_check(const kipp_model_view *v, char *err, size_t errlen);

#endif
