/*
 * lora.h - LoRA adapters merged into the weights at open (seed 002
 * "LoRA adapters (merge at load, ABI 3)"). Engine-private: the public entry is
 * kipp_model_options.lora.
 *
 * engine/lora.c reads and validates a llama.cpp-layout adapter GGUF against an
 * open model; engine/lora_merge.c computes W' = W + sum(scale*alpha/r * B.A)
 * row by row into owned 64-byte aligned buffers, keeping each tensor's format
 * (BF16 nearest; Q8_0 / Q4_1 codes moved by delta/step with stochastic
 * rounding and a block refit when a code leaves its range), and rebinds the
 * model's views to them. The file mapping is never written.
 */
#ifndef KIPP_LORA_H
#define KIPP_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/internal.h"

/** One validated target: a .lora_a/.lora_b pair and the model tensor it changes. */
typedef struct {
    uint64_t target;      /* index of the base tensor in the model's GGUF directory */
    int embed;            /* 1: token_embd (lookup orientation, see below) */
    uint32_t rank;        /* r = lora_b dims[0] */
    /* Ordinary target [n_out][n_in]: a is row-major [r][n_in], b is [n_out][r].
     * token_embd [vocab][d]: a is row-major [vocab][r], b is [d][r] (llama.cpp
     * transposes lora_a so the lookup reads one row per token). */
    const void *a, *b;    /* views into the adapter mapping */
    uint32_t a_type, b_type; /* F32, F16 or BF16 (GGUF type ids) */
    float factor;         /* scale * alpha / r (alpha 0: scale, as llama.cpp) */
} kipp_lora_pair;

/** An open adapter file: its mapping, directory and validated pairs. */
typedef struct {
    void *map;            /* read-only mmap of the adapter GGUF */
    size_t map_size;      /* bytes */
    kipp_gguf gguf;       /* views into map */
    float alpha;          /* adapter.lora.alpha (0 when absent) */
    float scale;          /* the caller's scale */
    kipp_lora_pair *pairs; /* [n_pairs], malloc'd */
    uint32_t n_pairs;
} kipp_lora;

/**
 * Map path read-only and validate it as a LoRA adapter for model m
 * (general.type "adapter", adapter.type "lora", general.architecture "qwen3",
 * kipp.checkpoint.id when present equal to m's, every tensor one half of a
 * .lora_a/.lora_b pair whose base is a 2-D tensor of m, shapes as llama.cpp
 * checks them, rank > 0, factor types F32/F16/BF16, finite values). Errors:
 * KIPP_EIO, KIPP_EFORMAT (naming the tensor or key and the expectation),
 * KIPP_ENUMERIC, KIPP_EINVAL (non-finite scale), KIPP_ENOTSUP (an activated
 * LoRA: adapter.alora.*), KIPP_ENOMEM. Release *out
 * with kipp_lora_close.
 */
int kipp_lora_open(const char *path, float scale, const kipp_model *m, kipp_lora **out, char *err,
                   size_t errlen);

/** The checks of kipp_lora_open on an in-memory image buf[size] (kept by *out; tests). */
int kipp_lora_open_image(const void *buf, size_t size, float scale, const kipp_model *m, kipp_lora **out,
                         char *err, size_t errlen);

/** Element i of a factor stored as F32, F16 or BF16 (type: GGUF id), as FP32; p may be unaligned. */
float kipp_lora_factor_at(const void *p, uint32_t type, size_t i);

/** Release an adapter; NULL is accepted. */
void kipp_lora_close(kipp_lora *a);

/** Rounding of a quantized merge: stochastic (unbiased, the default) or nearest (diagnostic). */
typedef enum { KIPP_LORA_STOCHASTIC = 0, KIPP_LORA_NEAREST = 1 } kipp_lora_rounding;

/** One additive term of a target's delta: delta[row][col] += sum_k p[row][k] * q[k][col]. */
typedef struct {
    const float *p;       /* [rows][r] FP32, factor folded in */
    const float *q;       /* [r][cols] FP32 */
    uint32_t r;
} kipp_lora_term;

/** One tensor to merge: its file bytes in, its merged bytes out. */
typedef struct {
    uint32_t dtype;       /* KIPP_DTYPE_BF16, _Q8_0 or _Q4_1 */
    uint64_t rows, cols;  /* [rows][cols] weights; cols % block == 0 */
    const void *src;      /* file bytes (kipp_fmt_file_bytes(rows, cols)), never written */
    void *dst;            /* same size, owned by the caller */
    uint32_t tensor_id;   /* hashed with row and element for the rounding draws */
    const kipp_lora_term *terms; /* [n_terms] */
    uint32_t n_terms;
    const char *label;    /* NULL, or how a refusal names the tensor (its name and the scales) */
} kipp_lora_job;

/** Counters of a merge, summed over its jobs (blocks of 32 weights; BF16 counts elements). */
typedef struct {
    uint64_t copied;      /* units whose delta was exactly 0: bytes copied */
    uint64_t grid;        /* blocks written with their scales kept, codes moved */
    uint64_t refit;       /* blocks where a fresh quantization had the lower error */
} kipp_lora_stats;

/**
 * Merge jobs[0..n) on n_threads worker threads (0 = online CPUs), rows split in
 * chunks across all jobs. seed and the (tensor_id, row, element) triple pick
 * each stochastic draw, so a merge is reproducible. *stats (may be NULL)
 * receives the counters. Errors: KIPP_ENOMEM (thread or scratch), KIPP_EINVAL
 * (a format without a merge rule; a merged weight that is Inf or NaN or beyond
 * what its format holds, naming the job's label, the row, the column and the
 * value: the merged bytes are then not to be used).
 */
int kipp_lora_merge(const kipp_lora_job *jobs, size_t n, int n_threads, uint64_t seed, kipp_lora_rounding rnd,
                    kipp_lora_stats *stats, char *err, size_t errlen);

/** Merge options of kipp_lora_apply (tests override what the open path takes from the system). */
typedef struct {
    int n_threads;               /* 0 = online CPUs */
    uint64_t seed;               /* rounding seed; the open path uses 0 */
    kipp_lora_rounding rounding; /* KIPP_LORA_ROUNDING=nearest selects nearest at open */
    uint64_t mem_available;      /* bytes the merged copies may take; 0 = MemAvailable of /proc/meminfo */
} kipp_lora_apply_opts;

/**
 * Open each of specs[0..n), validate it against m, and merge all of them into
 * m's weights (the deltas of one target add up and it is merged once): owned
 * buffers replace the views in m->view.w / m->layers; with tied embeddings
 * only the input lookup changes (w.output keeps the file's tensor). Records
 * n_lora, lora_tensors, lora_bytes, lora_merge_ms in m. Errors: those of
 * kipp_lora_open and kipp_lora_merge; KIPP_ENOMEM naming the bytes needed and
 * available when the merged copies do not fit.
 */
int kipp_lora_apply(kipp_model *m, const kipp_lora_spec *specs, uint32_t n, const kipp_lora_apply_opts *o,
                    char *err, size_t errlen);

/**
 * kipp_model_open's step: merge opts->lora[0..n_lora) into m with opts->n_threads,
 * seed 0 and the rounding KIPP_LORA_ROUNDING names (nearest; else stochastic).
 * Errors: those of kipp_lora_apply.
 */
int kipp_lora_apply_open(kipp_model *m, const kipp_model_options *opts, char *err, size_t errlen);

/**
 * After a backend with packs_weights has prepared m: free the merged copies it
 * no longer reads (every target but token_embd) and set their views' data to
 * NULL, so m->lora_bytes counts only what stays resident.
 */
void kipp_lora_release_packed(kipp_model *m);

/** Free m's merged tensors (kipp_model_close; the views must be dead). */
void kipp_lora_release(kipp_model *m);

#endif
