/*
 * kv_store.h - the one owner of the paged KV layout of the CPU backends
 * (seed 000 "KV cache": [layer][position][kv_head][head_dim], positions in
 * 32-position blocks resolved through a block table), in one of two types
 * (kipp_model_options.kv_type): BF16 rows of 8 x 128 bf16 (2,048 bytes), or
 * q8_0 rows of K_KVQ8_ROW bytes (int8 values and fp16 scales per 32 values,
 * kernels.h "q8_0 KV cache": 1,088 bytes, 34/64 of BF16).
 *
 * A store is n_blocks physical blocks of K and of V for every layer. The
 * layer stride (n_blocks * 32 rows) and the block stride (32 rows) are
 * computed here only; the kernels receive a layer base and the block table.
 * A private session owns a store; a pooled session borrows its model's shared
 * slab (kipp_model_open_pooled), so the same forward code runs both, and only
 * the block table differs.
 */
#ifndef KIPP_KV_STORE_H
#define KIPP_KV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/qwen3_shape.h"

/** Paged K and V of every layer; allocated by kipp_kv_store_alloc. */
typedef struct {
    uint8_t *k;        /* [n_layer][n_blocks*32] rows of row_bytes */
    uint8_t *v;        /* the same for V */
    uint32_t n_layer;
    uint32_t n_blocks; /* physical 32-position blocks per layer */
    int q8;            /* 1: q8_0 rows (K_KVQ8_ROW bytes), 0: BF16 rows */
} kipp_kv_store;

/** Bytes of one position's row of one layer's K (or V) in a store of this type. */
static inline size_t kipp_kv_row_bytes(int q8)
{
    return q8 ? K_KVQ8_ROW : (size_t)KIPP_N_KV_HEAD * KIPP_HEAD_DIM * sizeof(kipp_bf16);
}

/** Bytes of one block of one layer's K (or V): 32 rows. */
static inline size_t kipp_kv_block_bytes(const kipp_kv_store *st)
{
    return (size_t)KIPP_KV_BLOCK * kipp_kv_row_bytes(st->q8);
}

/** Bytes of one layer's K (or V) in st: the layer stride. */
static inline size_t kipp_kv_layer_bytes(const kipp_kv_store *st)
{
    return (size_t)st->n_blocks * kipp_kv_block_bytes(st);
}

/** Base of layer `layer`'s K in st (what kv_write / flash_gqa take, as bf16 or q8_0 rows). */
static inline uint8_t *kipp_kv_layer_k(const kipp_kv_store *st, uint32_t layer)
{
    return st->k + (size_t)layer * kipp_kv_layer_bytes(st);
}

/** Base of layer `layer`'s V in st. */
static inline uint8_t *kipp_kv_layer_v(const kipp_kv_store *st, uint32_t layer)
{
    return st->v + (size_t)layer * kipp_kv_layer_bytes(st);
}

/**
 * Allocate st for n_layer layers of n_blocks blocks of type q8 (1: q8_0, 0:
 * BF16), 2 MiB aligned and advised for huge pages; zeroed when zero != 0
 * (the ref backend's contract), else left to the OS (pages are committed on
 * first write, so a large pool costs memory only as it fills). 0, or -1 on
 * allocation failure (st zeroed).
 */
int kipp_kv_store_alloc(kipp_kv_store *st, uint32_t n_layer, uint32_t n_blocks, int q8, int zero);

/** Bytes of K plus V of such a store (for error messages and plans). */
static inline size_t kipp_kv_store_bytes(uint32_t n_layer, uint32_t n_blocks, int q8)
{
    return 2 * (size_t)n_layer * n_blocks * KIPP_KV_BLOCK * kipp_kv_row_bytes(q8);
}

/** Release st's memory; a zeroed store is accepted. */
void kipp_kv_store_free(kipp_kv_store *st);

/** Copy physical block src to dst (K and V, every layer); src != dst. */
void kipp_kv_store_copy_block(const kipp_kv_store *st, uint32_t src, uint32_t dst);

/** Segment seg of block b: layer seg/2's K (seg even) or V (odd); its bytes in *bytes (the disk tier's view). */
static inline void *kipp_kv_store_block_seg(const kipp_kv_store *st, uint32_t b, uint32_t seg, size_t *bytes)
{
    *bytes = kipp_kv_block_bytes(st);
    uint8_t *base = seg & 1 ? kipp_kv_layer_v(st, seg / 2) : kipp_kv_layer_k(st, seg / 2);
    return base + (size_t)b * kipp_kv_block_bytes(st);
}

#endif
