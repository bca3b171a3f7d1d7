/*
 * kipp.h - the public Kipp engine API (seed 000, "Public engine and session model").
 *
 * Narrow and opaque, after antirez/ds4 ds4.h: every call that can fail returns
 * 0 or a negative KIPP_E* code and writes one sentence naming the bad value and
 * the expectation into (err, errlen) when err is non-NULL. Every create has a
 * destroy, and every destroy accepts NULL. Nothing here calls exit().
 *
 * Threading: a model and its sessions are used by one thread at a time.
 */
#ifndef KIPP_H
#define KIPP_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"
#include "base/log.h" /* kipp_log_set_sink: where the library's notes go */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error codes: KIPP_OK, KIPP_E* and kipp_strerror (base/errors.h) ---- */

/* ---- model ---- */
typedef struct kipp_model kipp_model;
typedef struct kipp_session kipp_session;

/**
 * One LoRA adapter to merge at open: a llama.cpp-layout adapter
 * GGUF (general.type "adapter", adapter.type "lora", .lora_a/.lora_b pairs;
 * tools/convert_lora_to_gguf.py writes one from a PEFT directory) and the
 * factor its delta is multiplied by (1 = as trained, 0 = the file unchanged).
 */
typedef struct {
    const char *path; /* adapter GGUF; read at open, not kept */
    float scale;      /* finite; delta = scale * alpha / r * B.A */
} kipp_lora_spec;

/**
 * Parse a --lora argument "PATH[:SCALE]" into *out (out->path points into arg).
 * The text after the last ':' is the scale when it parses as a finite number,
 * else the whole argument is the path and the scale is 1. KIPP_EINVAL (empty
 * path, empty or non-finite scale after ':'), with a sentence in err.
 */
int kipp_lora_parse_arg(const char *arg, kipp_lora_spec *out, char *path_buf, size_t path_cap,
                        char *err, size_t errlen);

/**
 * The compute backends of this build, the names kipp_model_open takes (besides
 * "none"), joined by sep into buf[len], NUL-terminated and truncated to fit:
 * "ref, cpu" with sep ", ", then "cuda" in the `make cuda` builds. Help texts
 * and errors list the backends through this, never by hand. Returns buf.
 */
const char *kipp_backend_names(char *buf, size_t len, const char *sep);

/**
 * RoPE scaling (docs/FORMAT.md "RoPE scaling"): YaRN as Hugging Face
 * transformers' _compute_yarn_parameters computes it. A model's session
 * limit with YaRN is floor(original_context x factor) tokens.
 */
typedef struct {
    int yarn;                  /* 1: YaRN; 0: none (the other fields are ignored) */
    double factor;             /* context multiplier, 1 < factor <= KIPP_ROPE_MAX_FACTOR */
    uint32_t original_context; /* original_max_position_embeddings, tokens; 0 in an override = the
                                  registry card's (Qwen3 hybrid 4B+: 32768), else the file's context_length */
    double beta_fast;          /* 0 = 32 (transformers' default) */
    double beta_slow;          /* 0 = 1 */
} kipp_rope_scaling;

#define KIPP_ROPE_MAX_FACTOR 64.0          /* largest YaRN factor accepted */
#define KIPP_ROPE_MAX_CONTEXT (1u << 20)   /* largest scaled context, tokens (the cpu RoPE table is 512 B each) */

/**
 * Parse a --rope-scaling value: "none", "yarn:F" or "yarn:F:ORIG" (F the
 * factor, ORIG original_max_position_embeddings in tokens). Range checks
 * that need the model (ORIG x F) happen at kipp_model_open. Errors:
 * KIPP_EINVAL naming the value and the expected form or range.
 */
int kipp_rope_scaling_parse(const char *s, kipp_rope_scaling *out, char *err, size_t errlen);

/** Options for kipp_model_open; zero-initialise for defaults. */
typedef struct {
    /* Worker threads for the backend; 0 = one per physical core. Backend "ref"
     * evaluates on one thread whatever this says: there it only sizes the LoRA
     * merge's workers, and it stays accepted because front ends pass one
     * --threads to every backend (kipp-serve, kipp-bench-spec; the kipp CLI
     * refuses --threads other than 1 with ref itself). */
    int n_threads;
    /* LoRA adapters merged into the weights at open, before the backend packs
     * them: [n_lora] specs, in order (their deltas add up). NULL/0 = none. */
    const kipp_lora_spec *lora;
    uint32_t n_lora;
    /* Layer streaming (seed 002 "Layer streaming"): KIPP_STREAM_AUTO
     * streams when the file's weights exceed 0.75 x available RAM (MemAvailable,
     * capped by the memory cgroup's limit minus usage, v2 or v1), as `kipp plan`
     * says; ON and OFF force it. AUTO defers to the environment variable
     * KIPP_STREAM=auto|on|off when set. A streamed cpu model keeps no packed
     * copy: each projection is read through the mapping per token. Backend ref
     * always reads its weights that way, one thread, no prefetch: an explicit
     * ON or no_prefetch is refused, while AUTO and the environment (process-wide
     * defaults) change nothing for it. */
    int stream;      /* KIPP_STREAM_*; backend ref refuses ON (KIPP_EINVAL): it has no streamed mode */
    int no_prefetch; /* streamed: 1 = no prefetch thread (also KIPP_PREFETCH=0); ref refuses 1 */
    /* --rope-scaling: 1 = use `rope` instead of the file's qwen3.rope.scaling.* keys
     * (rope.yarn 0 turns scaling off); 0 = the file's. Bad values: KIPP_EINVAL. */
    int rope_override;
    kipp_rope_scaling rope;
    /* --kv-type: the KV cache's element type, KIPP_KV_BF16 (0, the default) or KIPP_KV_Q8_0
     * (per 32 values int8 and an fp16 scale, 34/64 of BF16's bytes; backends cpu and ref;
     * cuda refuses it with KIPP_ENOTSUP). Another value: KIPP_EINVAL. */
    int kv_type;
} kipp_model_options;

#define KIPP_KV_BF16 0
#define KIPP_KV_Q8_0 1
#define KIPP_KV_TYPE_COUNT 2

/** The name of KV type t ("bf16", "q8_0"); "?" when out of range. */
const char *kipp_kv_type_name(int t);

/**
 * Parse a --kv-type value ("bf16" or "q8_0") into *out. Errors: KIPP_EINVAL
 * naming the value and the choices.
 */
int kipp_kv_type_parse(const char *s, int *out, char *err, size_t errlen);

/**
 * KV bytes per cached token of a model shape (all layers, K and V) in KV type
 * t: n_layer x 2 x n_kv_head x head_dim x 2 for bf16, x 34/32 for q8_0. 0 when
 * t is out of range.
 */
uint64_t kipp_kv_type_bytes(uint32_t n_layer, uint32_t n_kv_head, uint32_t head_dim, int t);

#define KIPP_STREAM_AUTO 0
#define KIPP_STREAM_ON 1
#define KIPP_STREAM_OFF 2

/**
 * Open a Kipp GGUF artifact (docs/FORMAT.md) read-only via mmap, validate it
 * against the compiled-in registry, bind the weights, and create the named
 * backend ("ref" = scalar FP32 oracle, "cpu" = fast CPU backend, NULL = "cpu").
 * Backend "none" opens without a backend: info, tensor table, tokenizer and
 * chat work, sessions are refused (KIPP_EBACKEND); `kipp inspect` and
 * `kipp tokenize` use it on files they only read. opts may be NULL. On success *out owns the mapping; release with
 * kipp_model_close. opts->lora adapters are validated against the model and
 * merged into private copies of their target tensors before the backend sees
 * the weights (engine/lora.c). Errors: KIPP_EIO, KIPP_EFORMAT (with the
 * loader's reason, or the adapter's: naming the tensor and the expectation),
 * KIPP_EBACKEND (unknown backend name), KIPP_EINVAL (a bad scale, or one
 * that makes a merged weight Inf, NaN or too large for its tensor's format:
 * naming the tensor, the scale and the format's range),
 * KIPP_ENUMERIC (non-finite adapter values), KIPP_ENOMEM (also: the merged
 * copies do not fit the available RAM, with the numbers).
 */
int kipp_model_open(const char *path, const char *backend, const kipp_model_options *opts,
                    kipp_model **out, char *err, size_t errlen);

/**
 * kipp_model_open with a shared, content-addressed KV pool of pool_mib MiB
 * (seed 000 "Cross-session prefix sharing"; 0 = one full context of KV, the
 * seed's default). The backend model owns one KV slab of
 * floor(pool_mib MiB / (32 * kv_bytes_per_token)) blocks of 32 positions;
 * every session of the model maps its block table onto it, draws private
 * blocks from it as it grows, publishes its full blocks at reset/destroy
 * ("publish-at-finish"), and can adopt a published prefix with
 * kipp_session_match_prefix. Results equal unpooled evaluation bitwise.
 * Memory is committed as blocks are first written. Errors: those of
 * kipp_model_open; KIPP_ERANGE when pool_mib holds less than one block or more
 * than 2^32-2 blocks; KIPP_ENOTSUP for backend "none" or a backend without a
 * pool; KIPP_ENOMEM.
 */
int kipp_model_open_pooled(const char *path, const char *backend, const kipp_model_options *opts,
                           uint64_t pool_mib, kipp_model **out, char *err, size_t errlen);

/**
 * Give an open model a KV pool of pool_mib MiB (0 = one full context), as
 * kipp_model_open_pooled does; for callers that size the pool from
 * kipp_model_get_info. Must precede the model's first session. Errors:
 * KIPP_EINVAL (NULL model, sessions already open, a pool already there),
 * KIPP_ERANGE (size, as kipp_model_open_pooled), KIPP_ENOTSUP, KIPP_ENOMEM.
 */
int kipp_model_enable_pool(kipp_model *model, uint64_t pool_mib, char *err, size_t errlen);

/** KV pool statistics (kipp_model_pool_stats); block counts are 32-position blocks. */
typedef struct {
    uint32_t block_tokens;       /* positions per block: 32 */
    uint64_t blocks_total;       /* blocks in the pool */
    uint64_t blocks_free;        /* never used or released */
    uint64_t blocks_private;     /* mapped by one session, mutable (its unpublished tail) */
    uint64_t blocks_published;   /* complete, immutable, findable by content */
    uint64_t blocks_referenced;  /* published and mapped by >= 1 session (never evicted) */
    uint64_t blocks_available;   /* free + unreferenced published: what allocation can still get */
    uint64_t hits;               /* blocks adopted by kipp_session_match_prefix */
    uint64_t misses;             /* full blocks looked up and not found */
    uint64_t evictions;          /* unreferenced published blocks reclaimed (least recently used first) */
} kipp_pool_stats;

/**
 * Fill *out with the pool's statistics. Errors: KIPP_EINVAL for NULL
 * arguments, KIPP_ENOTSUP when the model is not pooled (*out zeroed).
 */
int kipp_model_pool_stats(const kipp_model *model, kipp_pool_stats *out);

/** What happened to a KV pool block (kipp_kv_event). */
typedef enum {
    KIPP_KV_EVENT_STORED = 1,  /* a block was published: findable by its chain hash from now on */
    KIPP_KV_EVENT_REMOVED = 2, /* a published block was evicted: no longer findable */
    KIPP_KV_EVENT_CLEARED = 3, /* every published block was dropped (kipp_model_pool_clear) */
} kipp_kv_event_kind;

/** The tier of a KV event's block (vLLM's "medium"): the RAM pool or the disk tier (kipp_model_enable_disk_tier). */
typedef enum { KIPP_KV_MEDIUM_CPU = 0, KIPP_KV_MEDIUM_DISK = 1 } kipp_kv_medium;

/**
 * One KV pool block event, in the terms a prefix-aware router indexes
 * (vLLM's BlockStored / BlockRemoved / AllBlocksCleared). A block's hash
 * chains through its parent's: XXH3_64 of its token ids (uint32
 * little-endian) seeded with the parent's hash, 0x4b495050 for a first block.
 */
typedef struct {
    kipp_kv_event_kind kind;
    uint64_t hash;             /* STORED, REMOVED: the block's chain hash */
    int has_parent;            /* STORED, REMOVED: 0 for the first block of a prompt */
    uint64_t parent_hash;      /* when has_parent: the chain hash of the block before it */
    const uint32_t *token_ids; /* STORED: [block_tokens] ids, valid only during the call; else NULL */
    uint32_t block_tokens;     /* positions per block: 32 */
    kipp_kv_medium medium;     /* where the block now is (STORED) or was (REMOVED): RAM or the disk tier */
} kipp_kv_event;

/** Receives KV pool events (kipp_model_set_kv_listener). */
typedef void (*kipp_kv_event_fn)(void *ctx, const kipp_kv_event *event);

/**
 * Call fn(ctx, event) for every block stored, evicted or cleared in the
 * model's KV pool from now on (fn NULL stops). fn runs on the thread that is
 * calling into the model (evaluating, destroying a session), inside that call:
 * it must be quick and must not call the model. With a disk tier, its DISK
 * events (a block written, a file removed) come from the tier's I/O thread:
 * fn must then be thread-safe. Errors: KIPP_EINVAL for a NULL
 * model, KIPP_ENOTSUP when the model is not pooled.
 */
int kipp_model_set_kv_listener(kipp_model *model, kipp_kv_event_fn fn, void *ctx);

/**
 * Put a disk tier under the model's KV pool (issue 54): every block the pool
 * publishes is written, off the calling thread, to one file in dir (created
 * 0700; a directory owned by another user or writable by group or world is
 * refused), and kipp_session_match_prefix reads blocks missing in RAM back
 * from there (or, after kipp_model_disk_set_async, kipp_model_disk_load_*
 * does, off the calling thread), verified against the model's identity (XXH3_128 of the whole
 * GGUF file, the backend and its kernel paths), the KV layout, the prompt
 * prefix and a payload checksum. The files are kept within max_mib MiB, least
 * recently used removed first. A later process with the same model finds
 * them. Must follow the pool (kipp_model_enable_pool) and precede the first
 * session. Errors: KIPP_EINVAL (not pooled, sessions open, a tier already
 * there, LoRA adapters merged, or the directory refused, with the reason),
 * KIPP_ENOTSUP (a backend whose KV is not in host memory), KIPP_ERANGE
 * (max_mib below one block file), KIPP_EIO, KIPP_ENOMEM.
 */
int kipp_model_enable_disk_tier(kipp_model *model, const char *dir, uint64_t max_mib, char *err, size_t errlen);

/**
 * Reading a prompt's blocks from the disk tier without stalling the calling
 * thread (issue 54; engine/kv_disk_load.c). kipp_model_disk_set_async(m, 1)
 * makes kipp_session_match_prefix adopt from RAM only; the caller (a
 * scheduler stepping other sequences meanwhile) instead starts a load for a
 * prompt, polls kipp_model_disk_load_ready between steps, then calls
 * kipp_model_disk_load_finish, which publishes the blocks read and verified
 * into the pool, so the prompt's prefix match right after adopts them. All
 * three calls belong to the thread that calls into the model; the reads run
 * on the tier's I/O thread into pool blocks the load holds meanwhile.
 */
typedef struct kipp_disk_load kipp_disk_load;

/** Turn the async reads above on (1) or off (0). Errors: KIPP_EINVAL (NULL), KIPP_ENOTSUP (no disk tier). */
int kipp_model_disk_set_async(kipp_model *model, int on);

/**
 * Start reading the full blocks of tokens[0, n) that the pool lacks and the
 * tier holds, in a row after those the pool has, at most max_blocks of them
 * (pool blocks are reserved for them now: the caller's room). *out is NULL
 * (and 0 returned) when there is nothing to read; misses are then counted.
 * Errors: KIPP_EINVAL, KIPP_ENOMEM (*out NULL).
 */
int kipp_model_disk_load_start(kipp_model *model, const uint32_t *tokens, uint32_t n, uint32_t max_blocks,
                               kipp_disk_load **out, char *err, size_t errlen);

/** 1 when load's reads are over (all read, or stopped at a missing or refused file); any thread's poll. */
int kipp_model_disk_load_ready(kipp_model *model, const kipp_disk_load *load);

/**
 * End load (NULL accepted): publish its verified blocks into the pool, free
 * the rest, count hits and misses, free load. Before it is ready, this
 * cancels it, waiting at most for the one block being read.
 */
void kipp_model_disk_load_finish(kipp_model *model, kipp_disk_load *load);

/** The disk tier's counters (kipp_model_disk_stats); all zero when there is none. */
typedef struct {
    int enabled;           /* 1 when the model has a disk tier */
    uint64_t max_bytes;    /* the budget */
    uint64_t bytes, files; /* block files there now */
    uint64_t hits;         /* blocks a prefix match read from disk and adopted */
    uint64_t misses;       /* full blocks looked up on disk (missing in RAM) and not found */
    uint64_t reads, read_bytes;   /* files read and verified */
    uint64_t writes, write_bytes; /* files written */
    uint64_t rejects;      /* files refused at read: corrupt, truncated, another model, KV layout or prefix */
    uint64_t dropped;      /* writes not done: queue full, or the block reused before its turn */
    uint64_t write_errors; /* writes that failed (disk full, I/O error) */
    uint64_t evictions;    /* files removed to keep within the budget */
    uint64_t tmp_removed;  /* temporary files of an interrupted writer removed at start */
    uint64_t queued;       /* writes waiting now */
} kipp_disk_stats;

/**
 * The disk tier's statistics; callable from any thread. Errors: KIPP_EINVAL
 * for NULL arguments, KIPP_ENOTSUP when there is no tier (*out zeroed).
 */
int kipp_model_disk_stats(const kipp_model *model, kipp_disk_stats *out);

/**
 * Drop every published block of the model's KV pool (one KIPP_KV_EVENT_CLEARED
 * event), as when the cache is reset or the replica leaves. Errors: KIPP_EINVAL
 * for a NULL model or while any session maps pool blocks, KIPP_ENOTSUP when
 * the model is not pooled.
 */
int kipp_model_pool_clear(kipp_model *model, char *err, size_t errlen);

/** Close a model opened by kipp_model_open; NULL is accepted. Sessions must be destroyed first. */
void kipp_model_close(kipp_model *model);

/** Facts about an open model; all strings are owned by the model. */
typedef struct {
    const char *checkpoint_id;  /* registry id */
    const char *repository;     /* Hugging Face repository */
    const char *revision;       /* pinned revision */
    const char *backend;        /* backend name */
    const char *quant;          /* kipp.quant.scheme: "bf16", "q8_0" or "affine4_gs32" */
    const char *quant_head;     /* kipp.quant.head: "q8_0" or "affine4_gs32"; "bf16" when absent */
    int has_chat;               /* 1: chat template present (instruct/thinking) */
    const char *variant;        /* kipp.variant: "base", "instruct", "thinking", "embedding" or "reranker" */
    int tied_embeddings;
    uint32_t d_model, n_layer, n_q_head, n_kv_head, head_dim, d_ff;
    uint32_t vocab_size;        /* logits per row: 151936 */
    uint32_t context_length;    /* tokens: the longest session (with YaRN original_context x factor) */
    uint32_t file_context_length; /* kipp.context_length (max_position_embeddings), tokens */
    kipp_rope_scaling rope;     /* the scaling in use (file's or override), defaults resolved */
    uint32_t n_stop;
    uint32_t stop_ids[2];
    uint64_t kv_bytes_per_token; /* KV bytes per cached token (all layers) in the model's KV type */
    const char *kv_type;         /* the KV cache's type: "bf16" or "q8_0" (kipp_model_options.kv_type) */
    uint64_t weight_bytes;       /* bytes of all tensors in the file */
    float rope_theta;            /* RoPE base */
    uint64_t file_bytes;         /* size of the mapped file */
    uint64_t n_tensors;          /* entries of the tensor table (kipp_model_tensor) */
    uint64_t data_offset;        /* file offset of the tensor data section */
    uint32_t kv_pool_blocks;     /* 32-position blocks of the shared KV pool; 0 = not pooled */
    uint32_t n_lora;             /* adapters merged at open (kipp_model_options.lora) */
    uint32_t lora_tensors;       /* weight tensors they changed (each merged once) */
    uint64_t lora_bytes;         /* private RAM the merged tensors still hold, bytes (a backend that repacks
                                  * the projections lets the engine free their merged copies) */
    double lora_merge_ms;        /* wall time of the merge (load + validate + merge), ms */
} kipp_model_info;

/**
 * Fill *info for an open model. Returns 0; KIPP_EINVAL for a NULL model or
 * info (a non-NULL info is then zeroed). Never fails for a valid model, so
 * callers holding one may ignore the result.
 */
int kipp_model_get_info(const kipp_model *model, kipp_model_info *info);

/**
 * Why a model's context is info->context_length tokens, for messages about an
 * over-long --ctx: "the YaRN limit 32768 x 4 of qwen3-8b" or "the context
 * length of qwen3-8b (no RoPE scaling; --rope-scaling yarn:4 would allow
 * 131072)". Writes at most len bytes into buf (NUL-terminated) and returns buf.
 */
const char *kipp_context_limit_note(const kipp_model_info *info, char *buf, size_t len);

/** What a model is for, from its kipp.variant (kipp_model_task). */
enum {
    KIPP_TASK_GENERATE = 0, /* base, instruct, thinking: text generation */
    KIPP_TASK_EMBED = 1,    /* embedding: pooled final-norm hidden state (kipp_batch_item.hidden) */
    KIPP_TASK_RERANK = 2    /* reranker: "yes"/"no" logits at the last position */
};

/**
 * The model's task: KIPP_TASK_GENERATE, KIPP_TASK_EMBED or KIPP_TASK_RERANK,
 * from its registry entry's variant. KIPP_EINVAL (negative) for a NULL model
 * or one without a registry entry. Servers refuse an endpoint of another task.
 */
int kipp_model_task(const kipp_model *model);

/** One row of the file's tensor table; name points into the model's mapping (not NUL-terminated). */
typedef struct {
    const char *name;     /* GGUF tensor name, name_len bytes, as stored: may hold any byte */
    size_t name_len;
    uint32_t type;        /* GGUF tensor type id (30 = BF16, 8 = Q8_0, 0 = F32) */
    const char *type_name;/* "BF16", "Q8_0", "F32", "?" */
    uint32_t n_dims;      /* 1 or 2 */
    uint64_t rows, cols;  /* [rows][cols] row-major; rows == 1 for vectors */
    uint64_t nbytes;      /* bytes of the tensor data */
    uint64_t file_offset; /* absolute offset of the data in the file */
} kipp_tensor_info;

/**
 * Fill *out with tensor i of the file's tensor table (0 <= i < info.n_tensors,
 * file order). Errors: KIPP_EINVAL for a NULL argument, KIPP_ERANGE for i out of range.
 */
int kipp_model_tensor(const kipp_model *model, uint64_t i, kipp_tensor_info *out);

/**
 * Write the backend's kernel report (one line per chosen kernel path, from the
 * backend's optional describe op) into out[outlen], NUL-terminated and
 * truncated to fit; "backend X: no kernel report" when the backend has none.
 * Used by `kipp inspect --kernels`. Errors: KIPP_EINVAL when model, out or
 * outlen is NULL/0 or the model has no backend (opened without one).
 */
int kipp_model_describe(const kipp_model *model, char *out, size_t outlen);

/* ---- tokenizer (engine/tokenizer.c, seed 000 "Tokenizer") ---- */
#define KIPP_TOK_SPECIAL 1  /* match added/special token text; else all text is plain */

/**
 * Encode UTF-8 text (len bytes, may contain NUL) into token ids.
 * Writes at most cap ids to ids and the full count to *n_out; when *n_out > cap
 * the call returns KIPP_ERANGE and the caller retries with a bigger buffer.
 * Invalid UTF-8 follows the reference (docs/TOKENIZER.md).
 */
int kipp_tokenize(const kipp_model *model, const char *text, size_t len, int flags,
                  uint32_t *ids, size_t cap, size_t *n_out, char *err, size_t errlen);

/**
 * Decode ids to bytes. Writes at most cap bytes (no NUL added) and the full
 * length to *n_out; KIPP_ERANGE when it does not fit. Ids >= vocab are KIPP_ERANGE.
 */
int kipp_detokenize(const kipp_model *model, const uint32_t *ids, size_t n, char *out,
                    size_t cap, size_t *n_out, char *err, size_t errlen);

/**
 * 1 when id is an added (control) token of the model's tokenizer: <|im_start|>,
 * <|im_end|>, <think>, <tool_call>, ... (matched whole by KIPP_TOK_SPECIAL and
 * decoded literally); 0 for ordinary and padding ids, ids out of range, or a
 * model without a tokenizer.
 */
int kipp_token_is_added(const kipp_model *model, uint32_t id);

/**
 * Describe the model's tokenizer in one line, written NUL-terminated into
 * out[outlen] and truncated to fit: the pre-tokenizer (the native Qwen2
 * scanner and the Unicode version of its generated tables, or PCRE2 and its
 * Unicode version for any other pattern) and the NFC normaliser (utf8proc and
 * its Unicode version). Used by `kipp inspect`. Errors: KIPP_EINVAL for a NULL
 * model or out, outlen 0, or a model without a tokenizer.
 */
int kipp_tokenizer_describe(const kipp_model *model, char *out, size_t outlen);

/** Streaming detokenizer: emits only complete UTF-8, holding back partial sequences. */
typedef struct kipp_detok_stream kipp_detok_stream;
/** Create a stream for model; NULL on allocation failure. */
kipp_detok_stream *kipp_detok_stream_create(const kipp_model *model);
/** Destroy; NULL accepted. */
void kipp_detok_stream_destroy(kipp_detok_stream *s);
/**
 * Push one token; writes the newly complete bytes to out (at most cap, must be
 * >= 64) and their count to *n_out. KIPP_ERANGE for an id >= vocab.
 */
int kipp_detok_stream_push(kipp_detok_stream *s, uint32_t id, char *out, size_t cap,
                           size_t *n_out, char *err, size_t errlen);
/**
 * Flush held-back bytes at end of stream (invalid tails become U+FFFD). Bytes
 * that did not fit a push's cap stay queued: flush returns KIPP_ERANGE while
 * some remain (call again). docs/TOKENIZER.md, "Decode".
 */
int kipp_detok_stream_flush(kipp_detok_stream *s, char *out, size_t cap, size_t *n_out);

/* ---- chat (engine/chat.c: native Qwen3 ChatML renderer) ---- */
typedef enum { KIPP_ROLE_SYSTEM, KIPP_ROLE_USER, KIPP_ROLE_ASSISTANT, KIPP_ROLE_TOOL } kipp_role;

/**
 * One tool call made by an assistant turn. arguments is JSON text and is
 * inserted verbatim, as the template does when `arguments` is a string (the
 * OpenAI API's form). A caller holding a parsed object passes the text that
 * kipp_chat_json_dumps makes of it, which is what the template's `tojson` writes.
 */
typedef struct {
    const char *name;
    const char *arguments;
} kipp_tool_call;

/**
 * One chat message; NULL strings are absent fields. Content is either one
 * string (content, content_len bytes; 0 there means NUL-terminated, strlen)
 * or a list of text parts (content_parts[n_content_parts], the OpenAI API's
 * [{"type": "text", "text": ...}] with the texts only); giving both is
 * KIPP_EINVAL. Text may hold NUL bytes where a length is given
 * (docs/TOKENIZER.md). Parts are joined with "\n" and then rendered exactly as
 * that string would be, which is what OpenAI-compatible servers (vLLM) do for
 * these string-content templates; HF's template alone would render a list as ''.
 * Initialise with designated initializers: fields may be added at the end.
 */
typedef struct {
    kipp_role role;
    const char *content;            /* may be NULL for assistant turns with tool calls */
    const char *reasoning_content;  /* assistant only; NULL = absent */
    const kipp_tool_call *tool_calls; /* [n_tool_calls] */
    size_t n_tool_calls;
    size_t content_len;             /* bytes of content; 0 = strlen(content) */
    size_t reasoning_len;           /* bytes of reasoning_content; 0 = strlen(reasoning_content) */
    const char *const *content_parts; /* [n_content_parts] text parts, each non-NULL; NULL when content is used */
    size_t n_content_parts;
} kipp_chat_message;

/** Rendering options, as chat_template_kwargs. */
typedef struct {
    int add_generation_prompt;  /* 1: end with "<|im_start|>assistant\n" (+ think per kind) */
    int enable_thinking;        /* hybrid only: 0 appends the empty think block; default 1 */
    const char *tools_json;     /* NULL or a JSON array of tool definitions, each dumped as-is */
} kipp_chat_options;

/**
 * Render messages with the checkpoint's Qwen3 chat template, byte-identical to
 * Hugging Face apply_chat_template. *out is malloc'd, NUL-terminated, owned by
 * the caller (free()). Base checkpoints return KIPP_ENOTSUP.
 */
int kipp_chat_render(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                     const kipp_chat_options *opts, char **out, char *err, size_t errlen);
/**
 * kipp_chat_render that also stores the rendered length in bytes in *out_len
 * (when non-NULL): the text holds NUL bytes when a message did, so pass
 * (*out, *out_len) on to kipp_tokenize rather than strlen(*out).
 */
int kipp_chat_render_n(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                       const kipp_chat_options *opts, char **out, size_t *out_len, char *err, size_t errlen);

/**
 * Render msgs as kipp_chat_render does and tokenize the text so that only the
 * template's own markers become control tokens: message text (content,
 * reasoning_content) is plain text, so a typed "<|im_start|>" stays text
 * (engine/chat_tokens.c). Equals kipp_tokenize(render, KIPP_TOK_SPECIAL) when
 * the messages hold no marker text. *ids ([*n_ids], malloc'd) and, when text is
 * non-NULL, *text (the rendered prompt, malloc'd, NUL-terminated) belong to the
 * caller; *text_len (when non-NULL) is its length in bytes, which a NUL in a
 * message makes differ from strlen. Errors: those of kipp_chat_render and
 * kipp_tokenize, KIPP_ENOMEM.
 */
int kipp_chat_tokenize(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                       const kipp_chat_options *opts, uint32_t **ids, size_t *n_ids, char **text, size_t *text_len,
                       char *err, size_t errlen);

/** The answer's reserve when a caller gives none: n_ctx / KIPP_CHAT_FIT_RESERVE_DIV tokens (a quarter). */
#define KIPP_CHAT_FIT_RESERVE_DIV 4
/** A reserve the caller gives counts up to n_ctx / KIPP_CHAT_FIT_RESERVE_MAX_DIV (half the context): a huge
 * max_tokens, often meant as "no limit", must not push every earlier turn out. */
#define KIPP_CHAT_FIT_RESERVE_MAX_DIV 2

/**
 * kipp_chat_tokenize for a context of n_ctx tokens: when the whole conversation
 * plus `reserve` tokens for the answer does not fit, drop the oldest turns and
 * keep the system message (msgs[0] when its role is system) and the newest turns
 * that fit (engine/chat_fit.c). A turn starts at a user message and runs to the
 * next one, so an assistant's tool_calls message and its tool responses always
 * stay together; messages between the system message and the first user message
 * form the oldest turn. reserve < 0 means n_ctx / KIPP_CHAT_FIT_RESERVE_DIV; a
 * reserve above n_ctx / KIPP_CHAT_FIT_RESERVE_MAX_DIV counts as that.
 *
 * The kept conversation is the system message (if any) plus msgs[h + *n_dropped
 * .. n), h = 1 with a system message else 0, with the smallest *n_dropped (a turn
 * boundary) whose ids + reserve <= n_ctx; when even the newest turn alone does
 * not, that minimal conversation is returned and the caller decides (its ids may
 * reach n_ctx: the server answers context_length_exceeded). *ids, *text and
 * *text_len are as kipp_chat_tokenize's, for the kept conversation.
 * Errors: KIPP_EINVAL for n_ctx 0 or a NULL n_dropped/ids/n_ids, those of
 * kipp_chat_tokenize, KIPP_ENOMEM.
 */
int kipp_chat_tokenize_fit(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                           const kipp_chat_options *opts, uint32_t n_ctx, int64_t reserve, size_t *n_dropped,
                           uint32_t **ids, size_t *n_ids, char **text, size_t *text_len, char *err, size_t errlen);

/**
 * Re-write JSON text (len bytes, any JSON value) as Python's
 * json.dumps(value, ensure_ascii=False) writes it, which is what the chat
 * templates' `tojson` produces: separators ", " and ": ", key order kept,
 * non-ASCII raw, floats as Python repr (docs/TOKENIZER.md, "Chat renderer").
 * Use it for tool-call arguments held as an object. *out is malloc'd and
 * NUL-terminated; the caller frees it. Errors: KIPP_EINVAL naming the line and
 * column of invalid JSON, KIPP_ENOMEM.
 */
int kipp_chat_json_dumps(const char *json, size_t len, char **out, char *err, size_t errlen);

/* ---- sessions (engine/session.c) ---- */

/**
 * Create a session with room for capacity tokens (1..context_length). KV
 * storage (rounded up to whole 32-position blocks) is allocated now, once.
 * Errors: KIPP_ERANGE for capacity 0 or above the context length, KIPP_ENOMEM.
 */
int kipp_session_create(kipp_model *model, uint32_t capacity, kipp_session **out,
                        char *err, size_t errlen);
/** Destroy a session; NULL accepted. */
void kipp_session_destroy(kipp_session *s);
/** Logical length: tokens currently in the KV cache. */
uint32_t kipp_session_length(const kipp_session *s);
/** Capacity in tokens, as created. */
uint32_t kipp_session_capacity(const kipp_session *s);
/**
 * Set the length to zero; KV bytes are not cleared. Pooled: first publishes the
 * session's full 32-token blocks to the pool (publish-at-finish) and releases
 * every block; kipp_session_destroy does the same.
 */
void kipp_session_reset(kipp_session *s);
/**
 * Roll back to the first n tokens; KIPP_ERANGE when n > length. Pooled: only
 * the private tail changes: private blocks past the new end return to the
 * pool, shared blocks past it are released (never written), and a shared
 * block that n cuts inside is first copied into a private block
 * (KIPP_ENOMEM when the pool has none left; nothing changes then).
 */
int kipp_session_truncate(kipp_session *s, uint32_t n, char *err, size_t errlen);

/**
 * Adopt the longest published prefix of tokens[n] into the empty pooled
 * session s: whole 32-token blocks whose ids (and every id before them) equal
 * a published block's, up to the session's capacity. The session's length
 * becomes the adopted length, which is returned (a multiple of 32, >= 0);
 * evaluation continues from there, bitwise equal to having evaluated the
 * prefix. Pass n = prompt length - 1 when the last prompt token's logits are
 * needed, so at least one token is left to evaluate. Returns 0 for a session
 * of an unpooled model. Errors (negative): KIPP_EINVAL for NULL s, NULL tokens
 * with n > 0, or a session that is not empty (naming its length).
 */
int kipp_session_match_prefix(kipp_session *s, const uint32_t *tokens, uint32_t n, char *err,
                              size_t errlen);

/**
 * Pool blocks s must still take to hold `length` tokens (0 when they are
 * already mapped, or for an unpooled session). A scheduler sums this over its
 * sessions' worst-case lengths and compares it with blocks_available before
 * admitting work, so evaluation never finds the pool exhausted.
 */
uint32_t kipp_session_pool_need(const kipp_session *s, uint32_t length);

/**
 * Append n tokens (n >= 1) and write the FP32 logits of the final position to
 * logits ([vocab_size] floats) unless logits is NULL. Nothing is appended on
 * error: KIPP_ERANGE when length+n > capacity or an id >= vocab_size,
 * KIPP_ENUMERIC when the logits are not finite, KIPP_ENOMEM when a pooled
 * session needs more blocks than the pool has free or evictable.
 */
int kipp_session_eval(kipp_session *s, const uint32_t *tokens, uint32_t n, float *logits,
                      char *err, size_t errlen);

/**
 * As kipp_session_eval, writing the logits of the last logits_count positions
 * (1 <= logits_count <= n) to logits, [logits_count][vocab_size] floats, row
 * order = position order. Rows equal per-position evaluation.
 */
int kipp_session_eval_n(kipp_session *s, const uint32_t *tokens, uint32_t n,
                        uint32_t logits_count, float *logits, char *err, size_t errlen);

/** Tokenize text (flags as kipp_tokenize) and append it as kipp_session_eval does. */
int kipp_session_eval_text(kipp_session *s, const char *text, size_t len, int flags,
                           float *logits, char *err, size_t errlen);

/** One item of a batched evaluation. */
typedef struct {
    kipp_session *session;   /* distinct sessions within one batch */
    const uint32_t *tokens;  /* [token_count] */
    uint32_t token_count;    /* >= 1 */
    uint32_t logits_count;   /* 0..token_count; rows for the last positions */
    float *logits;           /* [logits_count][vocab_size] or NULL when logits_count == 0 */
    float *hidden;           /* NULL, or [d_model] floats: the final-RMSNormed hidden state of the
                              * item's last position (HF's last_hidden_state row, the embedding
                              * before pooling); with logits_count == 0 the output head is skipped */
} kipp_batch_item;

/**
 * Evaluate several sessions in one backend call, so weights are read once per
 * step. All items are validated before any is evaluated; on error nothing is
 * appended. Results equal isolated evaluation within the backend's tolerance
 * (bitwise on "ref").
 */
int kipp_eval_batch(kipp_model *model, kipp_batch_item *items, size_t n, char *err,
                    size_t errlen);

/* ---- embeddings (engine/embed.c) ---- */

/** The token every embedding input ends with and is pooled at: <|endoftext|>. */
#define KIPP_EMBED_EOT 151643u

/**
 * Token ids of one embedding input, as the Qwen3-Embedding model card builds
 * them: with instruct (NUL-terminated, may be NULL) the text becomes
 * "Instruct: {instruct}\nQuery:{text}" (get_detailed_instruct); text is
 * tokenized as plain text (no special-token matching) and KIPP_EMBED_EOT is
 * appended. *ids is malloc'd ([*n]; the caller frees it). Errors as kipp_tokenize.
 */
int kipp_embed_tokenize(const kipp_model *model, const char *instruct, const char *text, size_t len,
                        uint32_t **ids, uint32_t *n, char *err, size_t errlen);

/**
 * Embed n inputs of token ids (ids[i], lens[i] >= 1 tokens, each within the
 * context length) in one kipp_eval_batch without logits: each row of out
 * ([n][dims] floats) is the final-norm hidden state of the input's last token
 * (last-token pooling), truncated to its first dims values (1..d_model,
 * Matryoshka) and L2-normalized. Token ids are used as given (no EOT added).
 * Each input runs on a fresh session, destroyed before returning. Errors:
 * KIPP_ERANGE (dims, an input longer than the context, an id >= vocab),
 * KIPP_EINVAL, KIPP_ENOMEM (also a full KV pool), KIPP_ENUMERIC.
 */
int kipp_embed(kipp_model *model, const uint32_t *const *ids, const uint32_t *lens, size_t n, uint32_t dims,
               float *out, char *err, size_t errlen);

/* ---- reranking (engine/rerank.c; issue 56, Qwen3-Reranker) ---- */

/** The model card's default instruction, used when a request gives none. */
#define KIPP_RERANK_DEFAULT_INSTRUCTION "Given a web search query, retrieve relevant passages that answer the query"

/** kipp_rerank_prepare's KIPP_ERANGE message starts with this when the query and instruction leave no room for
 * any document (else a document's prompt is too long and the message names it). */
#define KIPP_RERANK_QUERY_TOO_LONG "the query and instruction alone"

/** One query scored against n_docs documents; strings are bytes (may hold NUL), not copied. */
typedef struct {
    const char *query;           /* the query text, query_len bytes */
    size_t query_len;
    const char *instruction;     /* NULL: KIPP_RERANK_DEFAULT_INSTRUCTION */
    size_t instruction_len;
    const char *const *docs;     /* [n_docs] document texts */
    const size_t *doc_lens;      /* [n_docs] their bytes */
    size_t n_docs;               /* >= 1 */
    uint32_t max_tokens;         /* longest prompt accepted (prefix + body + suffix); 0 = the context length */
} kipp_rerank_request;

/** What a rerank evaluated; prefix = the tokens every prompt shares (system, instruction, query). */
typedef struct {
    uint64_t prompt_tokens;      /* sum of the documents' full prompt lengths */
    uint32_t prefix_tokens;      /* shared leading tokens of all prompts (0 with one document) */
    uint32_t prefix_cached;      /* of them adopted from the KV pool (an earlier call's prefix) */
    uint64_t prefix_evaluated;   /* prefix positions this call evaluated: prefix_tokens - prefix_cached when
                                  * shared (pooled), n_docs x prefix_tokens when each prompt is evaluated whole */
    uint64_t prefix_reused;      /* document positions forked from the shared prefix instead of evaluated */
    uint64_t tokens_evaluated;   /* positions evaluated in all */
    uint32_t eval_calls;         /* kipp_eval_batch calls */
} kipp_rerank_stats;

/** A tokenized rerank (kipp_rerank_prepare): every prompt's ids; owned by the caller. */
typedef struct kipp_rerank kipp_rerank;

/**
 * Build the Qwen3-Reranker prompt of every document and tokenize it, as the
 * model card's transformers code does: tokens(prefix) + tokens(body) +
 * tokens(suffix) with prefix "<|im_start|>system\nJudge whether the Document
 * meets the requirements based on the Query and the Instruct provided. Note
 * that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n",
 * body "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" and
 * suffix "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
 * (docs/SERVING.md cites the card and vLLM PR #19260). The body is plain text:
 * marker text typed in a query or document stays text. Errors: KIPP_EINVAL
 * (NULL arguments, n_docs 0), KIPP_ERANGE (a prompt longer than max_tokens:
 * naming the document, its token count and the limit), KIPP_EFORMAT ("yes" or
 * "no" is not one token of this vocabulary), KIPP_ENOMEM.
 */
int kipp_rerank_prepare(const kipp_model *model, const kipp_rerank_request *rq, kipp_rerank **out, char *err,
                        size_t errlen);
/** Prompt i's ids ([*n], owned by r), or NULL for i out of range. */
const uint32_t *kipp_rerank_ids(const kipp_rerank *r, size_t i, uint32_t *n);
/** Documents of r. */
size_t kipp_rerank_count(const kipp_rerank *r);
/** Sum of the prompts' lengths (usage's prompt_tokens). */
uint64_t kipp_rerank_prompt_tokens(const kipp_rerank *r);
/** Free; NULL accepted. */
void kipp_rerank_free(kipp_rerank *r);

/**
 * Score every document of r: P(yes) = exp(l_yes) / (exp(l_yes) + exp(l_no)),
 * the softmax over the "yes" and "no" logits at each prompt's last position,
 * into scores[n_docs]. On a pooled model the prompts' shared prefix is
 * evaluated once (after adopting what the KV pool already holds of it) and
 * forked into each document's session, so N documents prefill the query once;
 * documents are evaluated together in kipp_eval_batch calls of at most
 * batch_tokens tokens (0 = 4096; always at least one document). Unpooled, each
 * prompt is evaluated whole. st (may be NULL) receives the counts. Uses the
 * model like any evaluation (one thread at a time). Errors: those of
 * kipp_session_create and kipp_eval_batch (KIPP_ENOMEM when the pool cannot
 * hold a batch), KIPP_EINVAL for NULL arguments.
 */
int kipp_rerank_score(kipp_model *model, const kipp_rerank *r, uint32_t batch_tokens, float *scores,
                      kipp_rerank_stats *st, char *err, size_t errlen);

/* ---- sampling (engine/sampler.c) ---- */

/** xoshiro256** state; seed with kipp_rng_seed. */
typedef struct { uint64_t s[4]; } kipp_rng;
/** Seed deterministically (splitmix64 expansion of seed); a NULL rng is left alone (there is nothing to seed). */
void kipp_rng_seed(kipp_rng *rng, uint64_t seed);

/** One additive logit bias. */
typedef struct { uint32_t token; float bias; } kipp_logit_bias;

/**
 * Sampling parameters. kipp_sample_params_default() gives greedy-equivalent
 * neutral values (temperature 0 = argmax). repetition_penalty (CTRL) looks at
 * the distinct tokens among the last penalty_window entries of history, prompt
 * included (llama.cpp penalty_last_n); frequency/presence (OpenAI) count every
 * generated token: history after its first n_prompt_history entries.
 */
typedef struct {
    float temperature;        /* 0 = greedy argmax; > 0 scales logits */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off; [0,1]; 0 = greedy (argmax) */
    float min_p;              /* 0 = off; [0,1] */
    float repetition_penalty; /* 1 = off; > 0 */
    float frequency_penalty;  /* 0 = off; [-2,2] */
    float presence_penalty;   /* 0 = off; [-2,2] */
    uint32_t penalty_window;  /* tokens of history considered; default 64 */
    const uint32_t *history;  /* [history_len] prompt then generated tokens, oldest first */
    size_t history_len;
    size_t n_prompt_history;  /* leading history entries that are prompt, not output; 0 = all output */
    const kipp_logit_bias *logit_bias; /* [n_logit_bias] */
    size_t n_logit_bias;
    const uint64_t *allowed;  /* NULL, or a bitset over the vocabulary (bit id%64 of word id/64): tokens outside it
                               * are never chosen, as if their logits were -Inf before every stage (a grammar's
                               * mask); at least one must be set */
} kipp_sample_params;

/** Neutral parameters: temperature 0, top_k 0, top_p 1, min_p 0, penalties off, window 64. */
kipp_sample_params kipp_sample_params_default(void);

/**
 * One numeric sampling field of kipp_sample_params and its accepted range:
 * the single table the sampler checks, the CLI parses ("--" flag) and
 * kipp-serve parses (JSON "name"), so a field added here appears in all three.
 */
typedef struct {
    const char *name;         /* API field, e.g. "top_p" */
    const char *flag;         /* CLI flag, e.g. "--top-p" (llama.cpp's "--repeat-penalty" for repetition_penalty) */
    const char *metavar;      /* CLI value placeholder, e.g. "P" */
    size_t offset;            /* offsetof(kipp_sample_params, member): a float, or an int when is_int */
    int is_int;               /* 1: the member is an int and only integers are accepted */
    double lo, hi;            /* inclusive bounds; hi FLT_MAX means "finite" */
    const char *expect;       /* what an error says is expected, e.g. "a number in [0, 1] (0 = greedy)" */
    const char *dflt;         /* the neutral default as help text, e.g. "1 (off)" */
} kipp_sample_field;

/** The table (static storage, kipp_sample_params order); *n receives its length. */
const kipp_sample_field *kipp_sample_fields(size_t *n);
/** The row named name (API name, or CLI flag when it starts with "--"); NULL when none. */
const kipp_sample_field *kipp_sample_field_find(const char *name);
/** Store x (already in the row's range) into p's member; is_int rows truncate. */
void kipp_sample_field_set(kipp_sample_params *p, const kipp_sample_field *f, double x);
/** The member's value in p as a double. */
double kipp_sample_field_get(const kipp_sample_params *p, const kipp_sample_field *f);

/**
 * Sample one token from logits[n_vocab] (not modified). Deterministic for a
 * given rng state. Errors: KIPP_EINVAL for out-of-range parameters (named),
 * KIPP_ENUMERIC when logits hold NaN or Inf, KIPP_ERANGE for a bias token id
 * >= n_vocab.
 */
int kipp_sample_ex(const float *logits, size_t n_vocab, const kipp_sample_params *p,
                   kipp_rng *rng, uint32_t *token, char *err, size_t errlen);

/**
 * The distribution kipp_sample_ex draws from for these logits and p, into
 * probs[n_vocab]: after bias, penalties, mask, temperature, top_k, top_p and
 * min_p, renormalised over the survivors (0 elsewhere); one-hot at the argmax
 * when p is greedy. Speculative sampling with a draft model (engine/spec_draft.c)
 * compares the target's and the draft's. Errors: as kipp_sample_ex.
 */
int kipp_sample_probs(const float *logits, size_t n_vocab, const kipp_sample_params *p, float *probs, char *err,
                      size_t errlen);

/** One uniform draw in [0, 1) (53 bits) from rng, advancing it; 0 for a NULL rng. */
double kipp_rng_uniform(kipp_rng *rng);


/* ---- speculative decoding (engine/spec.c; seed 000 "Greedy self-speculative decoding") ---- */

/** Longest draft one verification step may carry (tokens). */
#define KIPP_SPEC_K_MAX 16u

/** Prompt-lookup drafter + adaptive gate; one per generated sequence. */
typedef struct kipp_spec kipp_spec;

/**
 * Options for kipp_spec_create; zero-initialise for defaults. The gate keeps a
 * decayed estimate a of the chance that a draft token is accepted, and drafts
 * the k in 0..k_max that maximises expected tokens per step over cost,
 * (1 - a^(k+1)) / (1 - a) / cost(k): a low-acceptance stream is driven to
 * k = 0 (plain decoding, with a rare 1-token probe). cost(k), in decode steps,
 * is learned from the wall time of the drafter's own verifications, with
 * 1 + row_cost * k for row counts not yet timed.
 */
typedef struct {
    uint32_t k_max;        /* longest draft, 1..16 tokens; 0 = 8 */
    uint32_t ngram_min;    /* shortest suffix matched, 1..ngram_max tokens; 0 = 1 */
    uint32_t ngram_max;    /* longest suffix matched, ngram_min..8 tokens; 0 = 3 */
    int fixed_k;           /* 1: no gate, always draft up to k_max (tests, cost model) */
    float row_cost;        /* gate's prior cost of one draft row in decode steps, [0, 1]; 0 = 0.15 */
    const uint32_t *stop_ids; /* [n_stop] tokens that end a reply (kipp_model_info.stop_ids); copied */
    uint32_t n_stop;       /* 0..2 */
    const float *costs;    /* NULL, or [k_max+1] fixed verify costs of k drafts in decode steps (costs[0] = 1,
                            * all > 0; copied): replaces the online timing, so the gate is deterministic
                            * (kipp-bench-spec passes its measured cost model) */
    kipp_model *draft_model; /* NULL: prompt lookup; else the draft model that proposes tokens (not owned; it
                              * outlives the drafter, shares the target's tokenizer: kipp_draft_check), greedily
                              * or, for a non-deterministic sampler, by sampling (speculative sampling) */
    uint32_t draft_min;    /* draft model: a draft the gate allows is at least this long, 0..k_max; 0 = 1 */
    float draft_cost;      /* draft model: the gate's prior cost of one draft evaluation in target decode steps,
                            * (0, 1]; 0 = the ratio of the bytes a decode step of each reads; learned online */
} kipp_spec_options;

/** Counters of one kipp_spec since create or reset. */
typedef struct {
    uint64_t steps;        /* verification forwards (kipp_spec_step calls that evaluated) */
    uint64_t drafted;      /* draft tokens verified */
    uint64_t accepted;     /* draft tokens that matched the sampled token */
    uint64_t emitted;      /* tokens emitted (accepted drafts + one sampled per step) */
    uint32_t k_now;        /* the gate's current draft length; 0 = drafting paused */
} kipp_spec_stats;

/**
 * Create a drafter for sessions of model (sizes its [k_max+1][vocab] FP32
 * logits buffer); the model must stay open while the drafter is used. opts may
 * be NULL. Errors: KIPP_EINVAL naming the option out of range (k_max above 16,
 * ngram sizes, row_cost, n_stop above 2), KIPP_ENOMEM. kipp_spec_step,
 * kipp_spec_propose and kipp_spec_accept refuse (KIPP_EINVAL, naming both
 * vocabulary sizes) a session of another model whose vocabulary size or
 * tokenizer differs from model's.
 */
int kipp_spec_create(const kipp_model *model, const kipp_spec_options *opts, kipp_spec **out, char *err,
                     size_t errlen);
/** Destroy; NULL accepted. */
void kipp_spec_destroy(kipp_spec *sp);
/** Zero the counters and the gate's estimate; the reference text is kept. */
void kipp_spec_reset(kipp_spec *sp);

/**
 * Give the drafter a reference token sequence (ids[n], copied; n = 0 clears
 * it) searched after the context: text the reply is expected to copy, as
 * OpenAI's "predicted outputs". Errors: KIPP_EINVAL, KIPP_ENOMEM.
 */
int kipp_spec_set_reference(kipp_spec *sp, const uint32_t *ids, size_t n, char *err, size_t errlen);

/**
 * The prompt-lookup drafter alone: find the most recent earlier occurrence of
 * ctx's longest suffix n-gram (ngram_max down to ngram_min tokens) in ctx,
 * else in the reference, and copy up to k (<= 16) of the tokens that followed
 * it into draft; a copy that runs past the end of ctx continues from its own
 * output, so a repeating cycle drafts in full. When no suffix matches, the
 * last token is taken for a substitution (an edit of copied text): the n-gram
 * before it is matched and the copy resumes after its counterpart's follower.
 * *n_draft = 0 when nothing matches, and also for a NULL sp, ctx or draft
 * (n_draft NULL: nothing is written).
 */
void kipp_spec_draft(kipp_spec *sp, const uint32_t *ctx, size_t n_ctx, uint32_t k, uint32_t *draft,
                     uint32_t *n_draft);

/**
 * One speculative step. On entry session s holds every token of the sequence
 * except the last, pending (ctx[n_ctx-1] == pending; ctx is prompt + output,
 * the drafter's corpus), and p is what plain decoding would pass to
 * kipp_sample_ex for the next token; p must be deterministic (temperature 0,
 * top_p 0 or top_k 1: kipp_spec_params_ok). The step drafts, evaluates
 * pending + draft in one kipp_session_eval_n (one logits row each), samples
 * row by row with p and the rows' history (p->history + out so far), keeps
 * the longest prefix where the sample equals the draft, and truncates s.
 * It writes 1..max_new tokens to out[] (room for 17) and *n_out; it stops
 * after a stop id. On return s holds pending + out[0..n_out-1): the same
 * timeline, samples and rng use as n_out plain decode steps. Errors: those of
 * kipp_session_eval_n and kipp_sample_ex (nothing emitted, s unchanged);
 * KIPP_ERANGE when s is full (no room for pending); KIPP_EINVAL for
 * max_new 0 or p not deterministic without a draft model (with one, a
 * non-deterministic p is verified by speculative sampling: kipp_spec_propose_ex).
 */
int kipp_spec_step(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx,
                   const kipp_sample_params *p, kipp_rng *rng, uint32_t max_new, uint32_t *out,
                   uint32_t *n_out, char *err, size_t errlen);

/**
 * kipp_spec_step in two halves, for callers that evaluate several sessions in
 * one kipp_eval_batch (the server). propose: the gate's draft after the
 * pending token ctx[n_ctx-1]: writes pending + draft to tokens[*n_tokens]
 * (room for 17, 1 <= *n_tokens); s is not changed. The caller then evaluates
 * exactly those tokens in s with a logits row for each. accept: samples those
 * rows (logits [n_tokens][vocab]) as kipp_spec_step does, truncates s and
 * writes out[*n_out]. Errors: as kipp_spec_step; accept's KIPP_EINVAL when
 * n_tokens is outside 1..k_max+1 or s holds fewer than n_tokens tokens;
 * accept's KIPP_ENOMEM (s unchanged) when the truncation needs a private copy
 * of a shared pool block and the pool has none (kipp_session_truncate): only
 * when the tokens were not the ones propose gave, on an adopted prefix.
 */
int kipp_spec_propose(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx, uint32_t max_new,
                      uint32_t *tokens, uint32_t *n_tokens, char *err, size_t errlen);
int kipp_spec_accept(kipp_spec *sp, kipp_session *s, const uint32_t *tokens, uint32_t n_tokens, const float *logits,
                     const kipp_sample_params *p, kipp_rng *rng, uint32_t max_new, uint32_t *out, uint32_t *n_out,
                     char *err, size_t errlen);

/**
 * kipp_spec_propose with the sampler's parameters and RNG, which a draft model
 * needs: its tokens are the samples of its own rows under p (history p's plus
 * the draft so far), drawn with rng when p is not deterministic (kipp_spec_accept
 * then verifies by rejection: accept draft x with probability min(1, p(x)/q(x)),
 * else sample max(0, p - q) renormalised; Leviathan et al. 2023, Chen et al.
 * 2023). p NULL = greedy on the raw logits; a prompt-lookup drafter ignores
 * both. Errors: as kipp_spec_propose, and the draft session's (evaluation,
 * KIPP_ENOMEM).
 */
int kipp_spec_propose_ex(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx, uint32_t max_new,
                         const kipp_sample_params *p, kipp_rng *rng, uint32_t *tokens, uint32_t *n_tokens, char *err,
                         size_t errlen);

/**
 * Whether draft may draft for target: both generation models (not embedding or
 * reranker files), the same vocabulary size and the same tokenizer
 * (kipp_tokenizer_same). 0, or KIPP_EINVAL with a sentence naming the
 * difference (the two vocabulary sizes, or the first token id whose text
 * differs, or the merges/added tokens), for the caller to prefix with the two
 * file names.
 */
int kipp_draft_check(const kipp_model *target, const kipp_model *draft, char *err, size_t errlen);

/**
 * The file of `--draft-self quant` (quant "q8_0", or "affine4" / "affine4_gs32"): the
 * converter's quantized twin next to model_path, as `make models-test` and the benchmark
 * set name them: X.gguf -> X-<scheme>-head_<scheme>.gguf (the head quantized too, so a
 * draft step reads the fewest bytes), else X-<scheme>.gguf; the first that exists is
 * written to out[outlen]. Kipp does not quantize at load. Errors: KIPP_EINVAL for another
 * quant (naming it and the two expected), a path that does not fit out, or neither file
 * there (naming both and the converter command that makes them).
 */
int kipp_draft_self_path(const char *model_path, const char *quant, char *out, size_t outlen, char *err,
                         size_t errlen);

/** 1 when sampling with p is a deterministic function of the logits (greedy): speculation is exact. */
int kipp_spec_params_ok(const kipp_sample_params *p);

/** Copy the counters into *st. */
void kipp_spec_get_stats(const kipp_spec *sp, kipp_spec_stats *st);

/* ---- one generation step (engine/gen.c) ---- */

/** Most stop strings one generation takes, and the longest (bytes). */
#define KIPP_GEN_MAX_STOP 16u
#define KIPP_GEN_MAX_STOP_LEN 1024u
/** Longest prefill chunk when every prompt position gets a logits row (echo logprobs). */
#define KIPP_GEN_ROWS_CHUNK 32u

/* ---- constrained output (engine/grammar.c) ---- */

/**
 * A compiled output constraint over the model's vocabulary: one JSON document
 * (an instance of a JSON Schema subset, or any JSON object), optionally framed
 * by literal text and repeated, e.g. Qwen3's tool calls:
 * "<tool_call>\n" {"name": ..., "arguments": {...}} "\n</tool_call>".
 * Immutable once made: one grammar may serve any number of gens on any threads.
 */
typedef struct kipp_grammar kipp_grammar;

/** What kipp_grammar_create compiles; zero-initialise, then set what differs. Strings are copied. */
typedef struct {
    const char *schema;    /* JSON Schema text (the subset the README lists), or NULL: any JSON object */
    const char *prefix;    /* literal text before each document, or NULL */
    const char *suffix;    /* literal text after each document, or NULL */
    const char *separator; /* literal text between two documents, or NULL */
    uint32_t max_count;    /* documents at most (parallel tool calls); 0 means 1; at least 1 is required */
} kipp_grammar_spec;

/**
 * Compile spec for model's vocabulary into *out (the caller destroys it).
 * Errors: KIPP_EINVAL with a message fit for an HTTP 400 naming the schema
 * keyword or value refused and what is supported; KIPP_ENOMEM.
 */
int kipp_grammar_create(kipp_model *model, const kipp_grammar_spec *spec, kipp_grammar **out, char *err,
                        size_t errlen);
/** Destroy; NULL accepted. No gen may still use it. */
void kipp_grammar_destroy(kipp_grammar *g);

/** Why a generation ended (kipp_gen_event.finish). */
typedef enum {
    KIPP_FIN_NONE = 0, /* still going */
    KIPP_FIN_STOP,     /* a stop id was sampled (not emitted) or a stop string appeared (text cut before it) */
    KIPP_FIN_LENGTH,   /* max_tokens emitted */
    KIPP_FIN_FULL,     /* the session is full: no room to evaluate the next token */
    KIPP_FIN_CANCELLED /* the caller ended it (kipp_gen_cancel) */
} kipp_finish;

/**
 * One sequence's generation state: sampler parameters, RNG, history (prompt +
 * output, for penalties and the drafter), stop ids and strings, streaming
 * detokenizer and, for deterministic sampling, the speculative drafter. It
 * does not evaluate: the caller asks it for its next batch item
 * (kipp_gen_next), evaluates that item, alone or with other generations' items
 * in one kipp_eval_batch, and hands the rows back (kipp_gen_advance). The CLI
 * runs a batch of one; kipp-serve's scheduler a list of them. The loop, after
 * llama2.c's: next -> kipp_eval_batch -> advance, until the event's finish.
 */
typedef struct kipp_gen kipp_gen;

/** Options for kipp_gen_create; zero-initialise, then set what differs. */
typedef struct {
    kipp_sample_params sp;       /* sampling; its history fields are ignored: the gen passes prompt + output,
                                  * with n_prompt_history = the prompt's length (kipp_sample_params) */
    uint64_t seed;               /* RNG seed (kipp_rng_seed), unless rng is given */
    const kipp_rng *rng;         /* NULL, or the RNG state to continue from (copied): a chat's next turn */
    uint32_t max_tokens;         /* tokens to emit at most; 0 = until the session is full */
    const char *const *stop;     /* [n_stop] stop strings, NUL-terminated, 1..KIPP_GEN_MAX_STOP_LEN bytes; copied */
    size_t n_stop;               /* 0..KIPP_GEN_MAX_STOP */
    int spec;                    /* 1: speculative decoding when sp is deterministic (kipp_spec_params_ok), or
                                  * with spec_opts.draft_model for any sp (speculative sampling) */
    kipp_spec_options spec_opts; /* the drafter's options when speculating; its stop ids are the model's */
    int prompt_rows;             /* 1: a logits row for every prompt position (echo logprobs), chunks of at
                                  * most KIPP_GEN_ROWS_CHUNK tokens; 0: only the prompt's last row */
    const kipp_grammar *grammar; /* NULL, or the constraint the reply follows (not owned; it outlives the
                                  * gen): every token that cannot continue it is masked before sampling,
                                  * and once it is complete only the end-of-turn ids remain (a mask that
                                  * allows nothing, which a compiled grammar never gives, ends it: STOP) */
    const char *grammar_after;   /* NULL: constrained from the first token; else free text until this
                                  * string (e.g. "</think>") has appeared in the reply (text after it in
                                  * the same token that the grammar refuses stays free); copied */
    const char *grammar_open;    /* NULL, or with grammar_after: the one-token marker that opens the free part
                                  * (e.g. "<think>"); the first token is then that marker or one the grammar
                                  * allows, and a reply that does not open with it is constrained throughout */
    uint32_t min_tokens;         /* stop ids are masked and stop strings not matched before this many tokens
                                  * (vLLM's min_tokens); 0 = off. A complete grammar's end-of-turn ids win */
    int keep_stop;               /* 1: a matched stop string stays at the end of the text (vLLM's
                                  * include_stop_str_in_output); 0: the text is cut before it */
    int think_budget_on;         /* 1: reasoning is cut after think_budget tokens (the fields below) */
    uint32_t think_budget;       /* reasoning tokens allowed; 0 = reasoning ends at once */
    const char *think_open;      /* the one-token marker that opens reasoning as the reply's first token
                                  * ("<think>"), or NULL: the prompt opened it, the reply starts inside */
    const char *think_close;     /* reasoning is over once this text appears ("</think>") */
    const char *think_end;       /* the text forced when the budget runs out ("\n</think>\n\n"), tokenized with
                                  * markers, at most 8 tokens; each forced token is emitted and evaluated as a
                                  * sampled one (a grammar that refuses one ends the forcing early).
                                  * Speculation is off with a budget or min_tokens: drafts know neither */
} kipp_gen_options;

/** What one kipp_gen_advance did. Pointers are owned by the gen and valid until its next call. */
typedef struct {
    uint32_t n_prompt;           /* prompt tokens this step evaluated */
    uint32_t n_refill;           /* tokens this step evaluated again after kipp_gen_rebind (no rows for them) */
    uint32_t first_pos;          /* session position of the step's first evaluated token */
    const float *logits;         /* the step's rows, [n_rows][vocab_size]: prefill with prompt_rows, row q
                                  * predicts the token at first_pos + q + 1 */
    uint32_t n_rows;
    uint32_t n_tokens;           /* tokens emitted (stop ids are not): tokens[n_tokens] */
    const uint32_t *tokens;
    const uint32_t *token_row;   /* [n_tokens] the row of logits each token was sampled from */
    const uint32_t *token_bytes; /* [n_tokens] bytes each added to the text (0 while UTF-8 is held back) */
    int finish;                  /* kipp_finish: why the generation ended at this step, else KIPP_FIN_NONE */
} kipp_gen_event;

/**
 * Create a generation over session s (not owned; it must outlive the gen) of
 * prompt[n_prompt] (copied). s already holds the first kipp_session_length(s)
 * prompt tokens (adopted from the KV pool, or a chat's earlier turns), which
 * must be fewer than n_prompt: the last prompt token's row starts the reply.
 * Errors: KIPP_EINVAL naming the bad option (stop strings, max_tokens, a
 * session holding n_prompt or more tokens, a session of another model),
 * KIPP_ENOMEM, and kipp_spec_create's.
 */
int kipp_gen_create(kipp_model *model, kipp_session *s, const uint32_t *prompt, size_t n_prompt,
                    const kipp_gen_options *opts, kipp_gen **out, char *err, size_t errlen);
/** Destroy; NULL accepted. The session is left as it is. */
void kipp_gen_destroy(kipp_gen *g);

/**
 * The generation's next batch item into *it: up to max_prefill prompt tokens
 * (a chunk; rows per kipp_gen_options.prompt_rows), else the pending decode
 * token, plus a prompt-lookup draft with a row each when speculating. The
 * caller evaluates exactly that item (kipp_eval_batch, with *it as given) and
 * then calls kipp_gen_advance. it->token_count is 0 once the generation has
 * finished. Errors: KIPP_EINVAL for NULL arguments or max_prefill 0 while the
 * prompt is unfinished.
 */
int kipp_gen_next(kipp_gen *g, uint32_t max_prefill, kipp_batch_item *it, char *err, size_t errlen);

/**
 * Consume the rows of the item kipp_gen_next gave, evaluated successfully:
 * sample, detokenize, match stop ids and strings, and fill *ev. seconds is the
 * evaluation's wall time (0 when not timed), from which the speculative gate
 * learns what verifying k drafts costs. Errors: kipp_sample_ex's and the
 * detokenizer's (the generation cannot continue), KIPP_EINVAL when no item was
 * pending. An evaluation that failed appends nothing: call kipp_gen_next again
 * or destroy the gen.
 */
int kipp_gen_advance(kipp_gen *g, double seconds, kipp_gen_event *ev, char *err, size_t errlen);

/**
 * The reply text so far (*text, owned by g, valid until its next call) of
 * *len bytes, cut before a matched stop string; the first *final_len bytes can
 * no longer change (no stop string can start in them; all of it once finished).
 */
void kipp_gen_text(const kipp_gen *g, const char **text, size_t *len, size_t *final_len);

/**
 * End the generation now (a client gone, Ctrl-C): the detokenizer's held bytes
 * are flushed into the text, which becomes final; finish is KIPP_FIN_CANCELLED
 * unless it had already ended. Any pending item is dropped.
 */
void kipp_gen_cancel(kipp_gen *g);

/**
 * Move g onto session s (not owned; it must outlive the gen), which holds a
 * prefix of the gen's tokens (prompt, then reply) adopted with
 * kipp_session_match_prefix, or nothing: a scheduler took g's old session to
 * free KV (preemption, as vLLM recomputes). The gen re-evaluates the rest
 * (counted by kipp_gen_prompt_left; events report the positions evaluated
 * before as n_refill, with no rows and nothing sampled; prompt positions
 * never evaluated before still get their rows), then goes on where it
 * stopped: the same
 * tokens, RNG, text and stops as if it had never moved, because the engine's
 * KV is bitwise the same however a position was evaluated. The pending item,
 * if any, is dropped. Errors: KIPP_EINVAL for NULL arguments, a finished gen,
 * a session of another model, a session holding more than the gen's tokens,
 * or too small a capacity.
 */
int kipp_gen_rebind(kipp_gen *g, kipp_session *s, char *err, size_t errlen);

/**
 * The gen's tokens, prompt then reply ([*n], owned by the gen, valid until
 * its next kipp_gen_advance), for kipp_session_match_prefix before
 * kipp_gen_rebind. *n is the most a session may hold when rebound: every
 * token but the pending one while decoding, the prompt but its last token
 * before the first sample (its row starts the reply).
 */
const uint32_t *kipp_gen_tokens(const kipp_gen *g, uint32_t *n);
/**
 * Tokens to evaluate before the next sample: the prompt's rest, plus after
 * kipp_gen_rebind the positions to evaluate again (0 while decoding).
 */
uint32_t kipp_gen_prompt_left(const kipp_gen *g);
/** Tokens emitted so far. */
uint32_t kipp_gen_generated(const kipp_gen *g);
/** kipp_finish of a finished generation, KIPP_FIN_NONE while it goes on. */
int kipp_gen_finished(const kipp_gen *g);
/**
 * Which of kipp_gen_options.stop ended the text: its index (the first in the
 * list among those that matched at the cut), or -1 when none did (a stop id,
 * max_tokens, a full session, a cancel, or still going). NULL gives -1.
 */
int kipp_gen_stop_index(const kipp_gen *g);
/** The drafter (for kipp_spec_get_stats), or NULL when the gen does not speculate. */
const kipp_spec *kipp_gen_spec(const kipp_gen *g);
/** Copy the RNG state into *rng (to continue it in a later generation). */
void kipp_gen_rng(const kipp_gen *g, kipp_rng *rng);

#ifdef __cplusplus
}
#endif

/* The planner (kipp plan, --ctx 0): a separate header to keep this one readable. */
#include "engine/kipp_plan.h"

#endif
