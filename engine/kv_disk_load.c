/*
 * kv_disk_load.c - reading a prompt's blocks from the disk tier off the
 * scheduler thread (kipp.h kipp_model_disk_load_*; issue 54).
 *
 * The synchronous path (kipp_session_match_prefix reading files itself)
 * stalls every other sequence's next step for as long as the reads take:
 * 128 blocks of the 0.6B read and verified in about 0.4 s. A server instead
 * starts a load when a request reaches the head of its queue: on the
 * scheduler thread, it references the request's prefix blocks already in
 * RAM (so no eviction takes them), reserves one slab block per block on disk
 * (PRIVATE, so nothing else writes or evicts them), and hands the list to
 * the tier's I/O thread, which reads and verifies each file straight into
 * its slab block. The scheduler keeps stepping the running sequences and
 * polls; when the load is done, kipp_model_disk_load_finish publishes the
 * verified blocks (bookkeeping only, no copy), and the request's prefix match
 * adopts them from RAM like any published block.
 */
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"
#include "engine/internal.h"
#include "engine/kv_disk.h"
#include "engine/kv_pool.h"

static const uint32_t BLOCK = KIPP_KV_BLOCK;

int kipp_model_disk_set_async(kipp_model *m, int on)
{
    if (!m) return KIPP_EINVAL;
    if (!m->disk) return KIPP_ENOTSUP;
    m->disk_async = on != 0;
    return 0;
}

static void load_free(kipp_disk_load *l)
{
    if (!l) return;
    free(l->blocks), free(l->hash), free(l->ram), free(l->ids);
    free(l);
}

/* The blocks of tokens[0, max x 32) the pool holds, as a match would adopt
 * them, into ram[] (referenced); returns how many; *h: the chain hash of the
 * last one (the root seed when none). */
static uint32_t ref_ram_prefix(kipp_kv_pool *p, const uint32_t *tokens, uint32_t max, uint32_t *ram, uint64_t *h)
{
    uint32_t b = 0, parent = KIPP_POOL_NONE;
    *h = KIPP_POOL_ROOT_HASH;
    for (; b < max; b++) {
        uint64_t hb = kipp_kv_pool_hash(*h, tokens + (size_t)b * BLOCK);
        uint32_t hit = kipp_kv_pool_find(p, hb, parent, tokens + (size_t)b * BLOCK);
        if (hit == KIPP_POOL_NONE) break;
        kipp_kv_pool_ref(p, hit);
        ram[b] = parent = hit;
        *h = hb;
    }
    return b;
}

/* Blocks [first, max) that are on disk, in a row, at most room of them: their hashes into hash[]. */
static uint32_t on_disk(kipp_kv_disk *d, const uint32_t *tokens, uint32_t first, uint32_t max, uint32_t room, uint64_t h,
                        uint64_t *hash)
{
    uint32_t n = 0;
    for (uint32_t b = first; b < max && n < room; b++, n++) {
        h = kipp_kv_pool_hash(h, tokens + (size_t)b * BLOCK);
        if (!kipp_kv_disk_has(d, h)) break;
        hash[n] = h;
    }
    return n;
}

int kipp_model_disk_load_start(kipp_model *m, const uint32_t *tokens, uint32_t n, uint32_t max_blocks,
                               kipp_disk_load **out, char *err, size_t errlen)
{
    if (!m || !out || (!tokens && n)) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_disk_load_start: NULL argument");
    *out = NULL;
    if (!m->disk || !m->pool) return 0;
    uint32_t max = n / BLOCK;
    kipp_disk_load *l = calloc(1, sizeof *l);
    if (l) l->ram = malloc((max ? max : 1) * sizeof *l->ram), l->hash = malloc((max ? max : 1) * sizeof *l->hash);
    if (!l || !l->ram || !l->hash) return load_free(l), kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a disk read");
    l->max = max;
    l->first = ref_ram_prefix(m->pool, tokens, max, l->ram, &l->hash0);
    l->n = on_disk(m->disk, tokens, l->first, max, max_blocks, l->hash0, l->hash);
    l->blocks = malloc((l->n ? l->n : 1) * sizeof *l->blocks);
    l->ids = malloc(((size_t)l->first + l->n) * BLOCK * sizeof *l->ids + 1);
    if (!l->blocks || !l->ids) {
        l->n = 0;
        kipp_model_disk_load_finish(m, l);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a disk read");
    }
    for (uint32_t i = 0; i < l->n; i++)
        if ((l->blocks[i] = kipp_kv_pool_alloc(m->pool)) == KIPP_POOL_NONE) l->n = i;
    if (!l->n) { /* nothing to read: a RAM hit or a miss, which the prefix match handles and counts */
        kipp_model_disk_load_finish(m, l);
        return 0;
    }
    memcpy(l->ids, tokens, ((size_t)l->first + l->n) * BLOCK * sizeof *l->ids);
    kipp_kv_disk_load_queue(m->disk, l);
    *out = l;
    return 0;
}

int kipp_model_disk_load_ready(kipp_model *m, const kipp_disk_load *l)
{
    return !m || !l || !m->disk || kipp_kv_disk_load_ready(m->disk, l);
}

void kipp_model_disk_load_finish(kipp_model *m, kipp_disk_load *l)
{
    if (!m || !l) return;
    if (l->n) kipp_kv_disk_load_cancel(m->disk, l); /* waits for a block in progress; no-op when done */
    uint32_t parent = l->first ? l->ram[l->first - 1] : KIPP_POOL_NONE;
    for (uint32_t i = 0; i < l->n; i++) {
        const uint32_t *ids = l->ids + (size_t)(l->first + i) * BLOCK;
        if (i < l->n_ok) parent = kipp_kv_pool_publish(m->pool, l->blocks[i], l->hash[i], parent, ids);
        else kipp_kv_pool_free(m->pool, l->blocks[i]);
    }
    for (uint32_t b = 0; b < l->first; b++) kipp_kv_pool_unref(m->pool, l->ram[b]);
    kipp_kv_disk_count(m->disk, l->n_ok, l->max - l->first - l->n_ok);
    load_free(l);
}
