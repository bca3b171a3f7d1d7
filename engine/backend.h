/*
 * backend.h - the backend boundary (seed 000, "Backend boundary").
 *
 * The engine calls a backend only through kipp_backend_ops. A backend owns its
 * prepared weights, scratch, KV bytes and threads; the engine owns logical
 * session state (length, block table) and passes it in each kipp_eval_item.
 * Nothing device-specific crosses this header.
 */
#ifndef KIPP_BACKEND_H
#define KIPP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/formats.h"
#include "kernels/qwen3_shape.h"

/** Tensor element types (GGUF type numbers), from the format table kernels/formats.h. */
#define KIPP_DTYPE_F32 ((uint32_t)KIPP_TTYPE_F32)
#define KIPP_DTYPE_Q4_1 ((uint32_t)KIPP_TTYPE_Q4_1) /* scheme affine4_gs32 */
#define KIPP_DTYPE_Q8_0 ((uint32_t)KIPP_TTYPE_Q8_0) /* scheme q8_0 */
#define KIPP_DTYPE_BF16 ((uint32_t)KIPP_TTYPE_BF16)

/** A validated view into the model mmap: row-major [rows][cols]; vectors have rows == 1. */
typedef struct {
    const void *data; /* points into the read-only mapping, 64-byte aligned */
    uint32_t dtype;   /* KIPP_DTYPE_* */
    uint64_t rows;
    uint64_t cols;
    uint64_t nbytes;
} kipp_tensor_view;

/** One decoder layer's weights; A = n_q_head*128, KV = n_kv_head*128 = 1024. */
typedef struct {
    kipp_tensor_view attn_norm; /* [d_model] bf16 */
    kipp_tensor_view wq;        /* [A][d_model] bf16 */
    kipp_tensor_view wk;        /* [KV][d_model] bf16 */
    kipp_tensor_view wv;        /* [KV][d_model] bf16 */
    kipp_tensor_view q_norm;    /* [128] bf16 */
    kipp_tensor_view k_norm;    /* [128] bf16 */
    kipp_tensor_view wo;        /* [d_model][A] bf16 */
    kipp_tensor_view ffn_norm;  /* [d_model] bf16 */
    kipp_tensor_view w_gate;    /* [d_ff][d_model] bf16 */
    kipp_tensor_view w_up;      /* [d_ff][d_model] bf16 */
    kipp_tensor_view w_down;    /* [d_model][d_ff] bf16 */
} kipp_qwen3_layer;

/** All weights, bound by engine/model.c without copying (seed 000, loader). */
typedef struct {
    kipp_tensor_view token_embd;  /* [vocab][d_model] bf16 */
    kipp_qwen3_layer *layers;     /* [n_layer], owned by the engine */
    kipp_tensor_view output_norm; /* [d_model] bf16 */
    kipp_tensor_view output;      /* [vocab][d_model] bf16; == token_embd when tied */
} kipp_qwen3_weights;

/** Fixed model dimensions, copied from the matched registry entry. */
typedef struct {
    uint32_t d_model, n_layer, n_q_head, n_kv_head, head_dim, d_ff;
    uint32_t vocab_size;     /* 151936 */
    uint32_t context_length; /* tokens: the longest session; with YaRN original_context x factor */
    float rope_theta;
    float rms_eps;           /* 1e-6 */
    int tied_embeddings;
    k_rope_yarn rope_yarn;   /* YaRN scaling; factor 0 = none (then context_length is the file's) */
} kipp_dims;

/** What a backend sees of a model: the validated mapping, dimensions and weights. */
typedef struct {
    const void *map;        /* whole file, read-only */
    size_t map_size;        /* bytes */
    kipp_dims dims;
    kipp_qwen3_weights w;
    const char *checkpoint_id;
    int n_threads;          /* requested workers; 0 = one per physical core */
    int stream;             /* 1: weights exceed the RAM budget (engine/model.c decides): keep no
                               prepared copy, read the projections and head through the mapping
                               per token (seed 002 "Layer streaming"); 0: the backend's normal way */
    int prefetch;           /* with stream: 1 = madvise(MADV_WILLNEED) one layer ahead, 0 = none */
    uint64_t stream_budget; /* with stream: bytes of the file the page cache may keep (0.75 x available
                               RAM at open; UINT64_MAX when unknown): the rest is dropped behind use */
    int kv_type;            /* KV cache type (kipp.h KIPP_KV_BF16 0, KIPP_KV_Q8_0 1; checked by the engine);
                               a backend without the type refuses it in model_create (KIPP_ENOTSUP) */
} kipp_model_view;

/**
 * One evaluation item (seed 000). The engine is the one place that validates
 * items (engine/session.c), before eval: a session of this model, distinct
 * across the items; start_position equal to the session's logical length and
 * start_position + token_count <= capacity; token ids < vocab; logits rows
 * within token_count with a buffer; block_table entries of the touched pages
 * < the session's (or the pool's) physical blocks. The backend only computes,
 * with at most a KIPP_ASSERT of its own invariants (base/errbuf.h).
 */
typedef struct {
    void *session;               /* backend session from session_create */
    const uint32_t *tokens;      /* [token_count] ids < vocab */
    uint32_t token_count;        /* >= 1 */
    uint32_t start_position;     /* position of tokens[0] */
    const uint32_t *block_table; /* [n_blocks] logical block (pos>>5) -> physical block */
    uint32_t logits_count;       /* rows for the last logits_count tokens (0..token_count) */
    float *logits;               /* [logits_count][vocab] FP32, host memory */
    float *hidden;               /* NULL or [d_model] FP32: final-RMSNormed state of the item's last
                                    token (the row the head would read); no head when logits_count == 0 */
} kipp_eval_item;

/** The ops table a backend fills (seed 000 shape plus error outputs). */
typedef struct {
    const char *name; /* "ref", "cpu", ... */
    /**
     * Prepare weights/scratch/threads for model; *backend_model owned by the backend.
     * The engine has checked the view (kipp_view_check, engine/view_check.c): the
     * backend refuses only what it cannot run (KIPP_ENOTSUP, KIPP_EINVAL).
     */
    int (*model_create)(const kipp_model_view *model, void **backend_model, char *err,
                        size_t errlen);
    void (*model_destroy)(void *backend_model);
    /** Allocate KV for n_blocks physical 32-position blocks ([layer][block*32+i][8][128] K and V in view.kv_type). */
    int (*session_create)(void *backend_model, uint32_t n_blocks, void **backend_session,
                          char *err, size_t errlen);
    void (*session_destroy)(void *backend_session);
    /** Synchronous evaluation of items (distinct sessions). */
    int (*eval)(void *backend_model, kipp_eval_item *items, size_t item_count, char *err,
                size_t errlen);
    /** Optional: one line per chosen kernel path, for `kipp inspect --kernels`; may be NULL. */
    void (*describe)(void *backend_model, char *out, size_t outlen);
    /*
     * Pooled KV (seed 000 "Cross-session prefix sharing"); all three NULL when
     * the backend cannot pool (kipp_model_open_pooled then fails KIPP_ENOTSUP).
     */
    /** Allocate the model's one shared KV slab of n_blocks physical blocks; called at most once. */
    int (*pool_create)(void *backend_model, uint32_t n_blocks, char *err, size_t errlen);
    /**
     * A session of n_blocks logical blocks (its capacity) whose KV lives in the
     * model slab: its items' block_table entries are slab block indices < the
     * slab's n_blocks. The engine maps and unmaps blocks; the backend only computes.
     */
    int (*session_create_pooled)(void *backend_model, uint32_t n_blocks, void **backend_session,
                                 char *err, size_t errlen);
    /** Copy slab block src to dst (K and V of every layer): copy-on-truncate of a shared block. */
    void (*pool_copy_block)(void *backend_model, uint32_t src, uint32_t dst);
    /**
     * Optional (the disk tier, engine/kv_disk.h): the host address of segment
     * seg of slab block b - seg 2l is layer l's K, 2l+1 its V, each 32 rows of
     * 8 x 128 in view.kv_type - and its bytes in *bytes. NULL op: the slab is not host memory.
     */
    void *(*pool_block_seg)(void *backend_model, uint32_t b, uint32_t seg, size_t *bytes);
    /**
     * 1 when model_create copies the seven per-layer projections and the output
     * head into the backend's own layout and never reads those views afterwards
     * (only token_embd and the norms stay read through the view); the engine
     * may then free private copies behind them (LoRA-merged tensors). 0: every
     * view must stay valid for the model's life. A streamed model (view.stream)
     * reads the views per token whatever this says: the engine then keeps them.
     */
    int packs_weights;
} kipp_backend_ops;

/** Backends known to the engine (engine/backends.c); NULL when name is unknown. */
const kipp_backend_ops *kipp_backend_find(const char *name);
/** Why a known backend is absent from this build and how to get it ("cuda" in a CPU build); else NULL. */
const char *kipp_backend_missing(const char *name);

extern const kipp_backend_ops ref_backend_ops;
extern const kipp_backend_ops cpu_backend_ops;

#endif
