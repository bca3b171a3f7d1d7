/*
 * kv_store.c - allocation and block copy of the paged KV store (kv_store.h).
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/kv_store.h"
#include "base/hugepage.h"

int kipp_kv_store_alloc(kipp_kv_store *st, uint32_t n_layer, uint32_t n_blocks, int q8, int zero)
{
    memset(st, 0, sizeof *st);
    st->n_layer = n_layer;
    st->n_blocks = n_blocks;
    st->q8 = q8 != 0;
    size_t bytes = (size_t)n_layer * kipp_kv_layer_bytes(st);
    st->k = kipp_huge_alloc(bytes);
    st->v = kipp_huge_alloc(bytes);
    if (!st->k || !st->v) {
        kipp_kv_store_free(st);
        return -1;
    }
    if (zero) {
        memset(st->k, 0, bytes);
        memset(st->v, 0, bytes);
    }
    return 0;
}

void kipp_kv_store_free(kipp_kv_store *st)
{
    free(st->k);
    free(st->v);
    memset(st, 0, sizeof *st);
}

void kipp_kv_store_copy_block(const kipp_kv_store *st, uint32_t src, uint32_t dst)
{
    const size_t bb = kipp_kv_block_bytes(st);
    for (uint32_t l = 0; l < st->n_layer; l++) {
        memcpy(kipp_kv_layer_k(st, l) + dst * bb, kipp_kv_layer_k(st, l) + src * bb, bb);
        memcpy(kipp_kv_layer_v(st, l) + dst * bb, kipp_kv_layer_v(st, l) + src * bb, bb);
    }
}
