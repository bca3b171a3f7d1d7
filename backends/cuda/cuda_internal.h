/*
 * cuda_internal.h - what backends/cuda/cuda_backend.c (model, weights, KV
 * arena, sessions) and cuda_forward.c (the forward pass and eval) share: the
 * backend's model and session structs. Not a public header.
 */
#ifndef KIPP_CUDA_INTERNAL_H
#define KIPP_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "engine/backend.h"
#include "kernels/cpu/kernels.h"

#define CU_ROUND 512u                                   /* token rows per forward round */
#define CU_HEAD_ROWS 64u                                /* logits rows per head launch */
#define CU_GRAPH_MAX 64u                                /* decode batches of 1..64 rows run as graphs */
#define CU_KV_WIDTH (KIPP_N_KV_HEAD * KIPP_HEAD_DIM)    /* 1024 */
#define CU_BLOCK_ELEMS ((size_t)KIPP_KV_BLOCK * CU_KV_WIDTH) /* bf16 per layer-block of K (or V) */
#define CU_MIB(b) ((double)(b) / (1024.0 * 1024.0))

/** A weight resident on the device. */
typedef struct {
    const void *p;
    uint32_t dtype, rows, cols;
    size_t bytes;
} cu_w;

typedef struct {
    const uint16_t *attn_norm, *q_norm, *k_norm, *ffn_norm;
    cu_w wq, wk, wv, wo, gate, up, down;
    /* Q|K|V and Gate|Up adjacent in the arena in one dtype: a one-row step
     * runs each group as one matvec (rows are independent, so the results are
     * those of the separate launches) and fewer graph nodes. */
    int qkv_fused, gu_fused;
} cu_layer;

/** A private session's range of arena blocks. */
typedef struct {
    uint32_t start, len;
} cu_range;

typedef struct {
    kipp_dims d;
    uint32_t A;           /* n_q_head * 128 */
    uint32_t max_blocks;  /* ceil(context_length / 32): a session's largest block table */
    int device;
    char dev_name[256];
    int cc_major, cc_minor, n_sm;
    size_t dev_total;
    cudaStream_t st;
    /* weights */
    void *warena;
    size_t wbytes;
    cu_layer *L;
    cu_w embd, out;
    const uint16_t *out_norm;
    float *rope; /* [max_blocks * 32][128] cos/sin, k_rope_table */
    /* activations, CU_ROUND rows each */
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up, *xl, *logits;
    size_t scratch_bytes;
    /* per-row metadata: device, and pinned host staging */
    /* One device block and its pinned mirror, [tok | pos | bt_off | lidx]
     * (CU_ROUND each) then bt (bt_cap): a step uploads it in one copy. */
    void *meta_d, *meta_h;
    uint32_t *tok_d, *bt_d, *tok_h, *bt_h;
    int32_t *pos_d, *btoff_d, *lidx_d, *pos_h, *btoff_h, *lidx_h;
    size_t bt_cap;  /* entries of bt_d / bt_h */
    float **ldst;   /* [CU_ROUND] host destination of each logits row of a round */
    /* KV arena */
    uint16_t *kc, *vc;
    uint32_t kv_blocks;
    int pooled;
    cu_range *ranges;
    size_t n_ranges, cap_ranges;
    /* decode graphs by batch size */
    cudaGraphExec_t graph[CU_GRAPH_MAX + 1];
    uint8_t ran[CU_GRAPH_MAX + 1]; /* batch size ran eagerly once: its kernels are loaded, capture is safe */
    int graphs_off;
    int fuse; /* one-row steps launch Q|K|V and Gate|Up as one matvec each (KIPP_CUDA_FUSE=0: off) */
    char graph_note[256]; /* why graphs were turned off, for describe */
    /* a device error that leaves the context unusable: every later eval reports it */
    char broken[256];
} cu_model;

typedef struct {
    cu_model *m;
    uint32_t n_blocks; /* logical blocks (capacity / 32) */
    uint32_t base;     /* first arena block of a private session; 0 when pooled */
    int pooled;
} cu_session;

/**
 * Turn CUDA error e from step `what` into a sentence in err and a KIPP_* code
 * (KIPP_ENOMEM for allocation failures, else KIPP_EBACKEND); a sticky error
 * is remembered in m->broken so later calls report it. m may be NULL.
 */
int cu_report_cuda(cu_model *m, cudaError_t e, const char *what, char *err, size_t errlen);

/** Destroy m's captured decode graphs (they are recaptured on demand). */
void cu_destroy_graphs(cu_model *m);

/** The ops table's eval (cuda_forward.c): items as kipp_backend_ops.eval. */
int cu_eval(void *bm, kipp_eval_item *items, size_t item_count, char *err, size_t errlen);

#endif
