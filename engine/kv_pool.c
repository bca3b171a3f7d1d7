/*
 * kv_pool.c - block states, the chain-hash index, reference counts and LRU
 * eviction of the KV pool (kv_pool.h; seed 000 "Cross-session prefix
 * sharing"). Single-threaded like the rest of a model.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/errbuf.h"
#include "engine/kv_pool.h"
#include "kernels/qwen3_shape.h"

struct kipp_kv_pool {
    uint32_t n;            /* blocks */
    uint8_t *state;        /* [n] KIPP_BLOCK_* */
    uint32_t *refs;        /* [n] sessions mapping a published block */
    uint64_t *hash;        /* [n] chain hash of a published block */
    uint32_t *parent;      /* [n] parent of a published block, KIPP_POOL_NONE for a chain's first */
    uint32_t *n_child;     /* [n] published blocks naming this one as parent */
    uint32_t *ids;         /* [n][32] token ids of a published block */
    uint32_t *next;        /* [n] free list link (FREE) or hash bucket chain link (PUBLISHED) */
    uint32_t *lru_prev;    /* [n] LRU links of unreferenced published blocks; head = least recent */
    uint32_t *lru_next;    /* [n] */
    uint32_t *bucket;      /* [n_bucket] first published block of each hash bucket */
    uint32_t n_bucket;     /* power of two >= n */
    uint32_t free_head, lru_head, lru_tail;
    uint32_t n_free, n_private, n_published, n_lru; /* n_lru = unreferenced published */
    uint64_t hits, misses, evictions;
    kipp_kv_event_fn listener; /* block events go here when set (kipp_model_set_kv_listener) */
    void *listener_ctx;
    void (*reuse)(void *ctx, uint32_t b); /* kipp_kv_pool_set_reuse_hook */
    void *reuse_ctx;
};

/* Tell the listener that block b was stored (became findable) or removed
 * (no longer findable); b's hash, parent and ids are still in place. */
static void notify(const kipp_kv_pool *p, kipp_kv_event_kind kind, uint32_t b)
{
    if (!p->listener) return;
    uint32_t par = p->parent[b];
    kipp_kv_event ev = {.kind = kind,
                        .hash = p->hash[b],
                        .has_parent = par != KIPP_POOL_NONE,
                        .parent_hash = par != KIPP_POOL_NONE ? p->hash[par] : 0,
                        .token_ids = kind == KIPP_KV_EVENT_STORED ? p->ids + (size_t)b * KIPP_KV_BLOCK : NULL,
                        .block_tokens = KIPP_KV_BLOCK};
    p->listener(p->listener_ctx, &ev);
}

uint64_t kipp_kv_pool_root(int kv_type)
{
    const char *name = kipp_kv_type_name(kv_type);
    return kv_type == KIPP_KV_BF16 ? KIPP_POOL_ROOT_HASH : XXH3_64bits_withSeed(name, strlen(name), KIPP_POOL_ROOT_HASH);
}

uint64_t kipp_kv_pool_hash(uint64_t parent_hash, const uint32_t *ids)
{
    return XXH3_64bits_withSeed(ids, KIPP_KV_BLOCK * sizeof *ids, parent_hash);
}

kipp_kv_pool *kipp_kv_pool_create(uint32_t n_blocks)
{
    if (n_blocks == 0 || n_blocks == KIPP_POOL_NONE) return NULL;
    kipp_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_blocks;
    p->n_bucket = 1;
    while (p->n_bucket < n_blocks) p->n_bucket <<= 1;
    p->state = calloc(n_blocks, 1);
    p->refs = calloc(n_blocks, sizeof *p->refs);
    p->hash = calloc(n_blocks, sizeof *p->hash);
    p->parent = malloc(n_blocks * sizeof *p->parent);
    p->n_child = calloc(n_blocks, sizeof *p->n_child);
    p->ids = malloc((size_t)n_blocks * KIPP_KV_BLOCK * sizeof *p->ids);
    p->next = malloc(n_blocks * sizeof *p->next);
    p->lru_prev = malloc(n_blocks * sizeof *p->lru_prev);
    p->lru_next = malloc(n_blocks * sizeof *p->lru_next);
    p->bucket = malloc(p->n_bucket * sizeof *p->bucket);
    if (!p->state || !p->refs || !p->hash || !p->parent || !p->n_child || !p->ids || !p->next || !p->lru_prev ||
        !p->lru_next || !p->bucket) {
        kipp_kv_pool_destroy(p);
        return NULL;
    }
    for (uint32_t b = 0; b < n_blocks; b++) p->next[b] = b + 1 < n_blocks ? b + 1 : KIPP_POOL_NONE;
    for (uint32_t i = 0; i < p->n_bucket; i++) p->bucket[i] = KIPP_POOL_NONE;
    p->free_head = 0;
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = KIPP_POOL_NONE;
    return p;
}

void kipp_kv_pool_destroy(kipp_kv_pool *p)
{
    if (!p) return;
    free(p->state), free(p->refs), free(p->hash), free(p->parent), free(p->n_child), free(p->ids);
    free(p->next), free(p->lru_prev), free(p->lru_next), free(p->bucket);
    free(p);
}

/* ---- LRU list of unreferenced published blocks ---- */

static void lru_remove(kipp_kv_pool *p, uint32_t b)
{
    uint32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr != KIPP_POOL_NONE) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx != KIPP_POOL_NONE) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->n_lru--;
}

static void lru_push_tail(kipp_kv_pool *p, uint32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = KIPP_POOL_NONE;
    if (p->lru_tail != KIPP_POOL_NONE) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

/* ---- hash index ---- */

static uint32_t *bucket_of(const kipp_kv_pool *p, uint64_t h) { return &p->bucket[h & (p->n_bucket - 1)]; }

static void index_remove(kipp_kv_pool *p, uint32_t b)
{
    uint32_t *link = bucket_of(p, p->hash[b]);
    while (*link != b) {
        KIPP_ASSERT(*link != KIPP_POOL_NONE);
        link = &p->next[*link];
    }
    *link = p->next[b];
}

uint32_t kipp_kv_pool_find(const kipp_kv_pool *p, uint64_t h, uint32_t parent, const uint32_t *ids)
{
    for (uint32_t b = *bucket_of(p, h); b != KIPP_POOL_NONE; b = p->next[b])
        if (p->hash[b] == h && p->parent[b] == parent &&
            !memcmp(p->ids + (size_t)b * KIPP_KV_BLOCK, ids, KIPP_KV_BLOCK * sizeof *ids))
            return b;
    return KIPP_POOL_NONE;
}

/* ---- allocation and eviction ---- */

/* Evict the least recently used unreferenced leaf: unindex it, detach it
 * from its parent, and hand it out as a PRIVATE block. An unreferenced block
 * has only unreferenced descendants, so the LRU list holds a leaf whenever it
 * is not empty. */
static uint32_t evict_one(kipp_kv_pool *p)
{
    uint32_t b = p->lru_head;
    while (b != KIPP_POOL_NONE && p->n_child[b]) b = p->lru_next[b];
    if (b == KIPP_POOL_NONE) return KIPP_POOL_NONE;
    KIPP_ASSERT(p->state[b] == KIPP_BLOCK_PUBLISHED && p->refs[b] == 0);
    lru_remove(p, b);
    index_remove(p, b);
    notify(p, KIPP_KV_EVENT_REMOVED, b);
    if (p->parent[b] != KIPP_POOL_NONE) p->n_child[p->parent[b]]--;
    p->n_published--;
    p->evictions++;
    if (p->reuse) p->reuse(p->reuse_ctx, b);
    return b;
}

uint32_t kipp_kv_pool_alloc(kipp_kv_pool *p)
{
    uint32_t b = p->free_head;
    if (b != KIPP_POOL_NONE) {
        p->free_head = p->next[b];
        p->n_free--;
    } else if ((b = evict_one(p)) == KIPP_POOL_NONE) {
        return KIPP_POOL_NONE;
    }
    p->state[b] = KIPP_BLOCK_PRIVATE;
    p->refs[b] = 0;
    p->n_private++;
    return b;
}

void kipp_kv_pool_free(kipp_kv_pool *p, uint32_t b)
{
    KIPP_ASSERT(b < p->n && p->state[b] == KIPP_BLOCK_PRIVATE);
    p->state[b] = KIPP_BLOCK_FREE;
    p->next[b] = p->free_head;
    p->free_head = b;
    p->n_private--;
    p->n_free++;
}

/* ---- references and publishing ---- */

void kipp_kv_pool_ref(kipp_kv_pool *p, uint32_t b)
{
    KIPP_ASSERT(b < p->n && p->state[b] == KIPP_BLOCK_PUBLISHED);
    if (p->refs[b]++ == 0) lru_remove(p, b);
}

void kipp_kv_pool_unref(kipp_kv_pool *p, uint32_t b)
{
    KIPP_ASSERT(b < p->n && p->state[b] == KIPP_BLOCK_PUBLISHED && p->refs[b] > 0);
    if (--p->refs[b] == 0) lru_push_tail(p, b);
}

uint32_t kipp_kv_pool_publish(kipp_kv_pool *p, uint32_t b, uint64_t h, uint32_t parent, const uint32_t *ids)
{
    KIPP_ASSERT(b < p->n && p->state[b] == KIPP_BLOCK_PRIVATE);
    KIPP_ASSERT(parent == KIPP_POOL_NONE || p->state[parent] == KIPP_BLOCK_PUBLISHED);
    uint32_t dup = kipp_kv_pool_find(p, h, parent, ids);
    if (dup != KIPP_POOL_NONE) { /* same prefix already shared: keep one copy */
        kipp_kv_pool_free(p, b);
        if (p->refs[dup] == 0) lru_remove(p, dup), lru_push_tail(p, dup); /* touch */
        return dup;
    }
    p->state[b] = KIPP_BLOCK_PUBLISHED;
    p->n_private--;
    p->n_published++;
    p->hash[b] = h;
    p->parent[b] = parent;
    p->n_child[b] = 0;
    if (parent != KIPP_POOL_NONE) p->n_child[parent]++;
    memcpy(p->ids + (size_t)b * KIPP_KV_BLOCK, ids, KIPP_KV_BLOCK * sizeof *ids);
    uint32_t *head = bucket_of(p, h);
    p->next[b] = *head;
    *head = b;
    lru_push_tail(p, b);
    notify(p, KIPP_KV_EVENT_STORED, b);
    return b;
}

void kipp_kv_pool_count(kipp_kv_pool *p, uint32_t hits, uint32_t misses)
{
    p->hits += hits;
    p->misses += misses;
}

uint32_t kipp_kv_pool_available(const kipp_kv_pool *p) { return p->n_free + p->n_lru; }

uint32_t kipp_kv_pool_total(const kipp_kv_pool *p) { return p->n; }

void kipp_kv_pool_stats(const kipp_kv_pool *p, kipp_pool_stats *out)
{
    *out = (kipp_pool_stats){.block_tokens = KIPP_KV_BLOCK,
                             .blocks_total = p->n,
                             .blocks_free = p->n_free,
                             .blocks_private = p->n_private,
                             .blocks_published = p->n_published,
                             .blocks_referenced = p->n_published - p->n_lru,
                             .blocks_available = p->n_free + p->n_lru,
                             .hits = p->hits,
                             .misses = p->misses,
                             .evictions = p->evictions};
}

void kipp_kv_pool_set_listener(kipp_kv_pool *p, kipp_kv_event_fn fn, void *ctx)
{
    p->listener = fn;
    p->listener_ctx = ctx;
}

void kipp_kv_pool_set_reuse_hook(kipp_kv_pool *p, void (*fn)(void *ctx, uint32_t b), void *ctx)
{
    p->reuse = fn;
    p->reuse_ctx = ctx;
}

int kipp_kv_pool_clear(kipp_kv_pool *p, char *err, size_t errlen)
{
    if (p->n_private || p->n_lru != p->n_published)
        return kipp_err(err, errlen, KIPP_EINVAL,
                        "the KV pool cannot be cleared while sessions use it: %u blocks private and %u published blocks "
                        "referenced, expected 0 and 0 (destroy the sessions first)", p->n_private, p->n_published - p->n_lru);
    if (p->reuse) p->reuse(p->reuse_ctx, KIPP_POOL_NONE);
    for (uint32_t b = 0; b < p->n; b++) {
        if (p->state[b] != KIPP_BLOCK_PUBLISHED) continue;
        p->state[b] = KIPP_BLOCK_FREE;
        p->next[b] = p->free_head;
        p->free_head = b;
        p->n_child[b] = 0;
    }
    for (uint32_t i = 0; i < p->n_bucket; i++) p->bucket[i] = KIPP_POOL_NONE;
    p->n_free += p->n_published;
    p->n_published = p->n_lru = 0;
    p->lru_head = p->lru_tail = KIPP_POOL_NONE;
    if (p->listener) p->listener(p->listener_ctx, &(kipp_kv_event){.kind = KIPP_KV_EVENT_CLEARED, .block_tokens = KIPP_KV_BLOCK});
    return 0;
}

int kipp_kv_pool_state(const kipp_kv_pool *p, uint32_t b) { return b < p->n ? p->state[b] : -1; }
uint32_t kipp_kv_pool_refs(const kipp_kv_pool *p, uint32_t b) { return b < p->n ? p->refs[b] : 0; }
uint32_t kipp_kv_pool_parent(const kipp_kv_pool *p, uint32_t b) { return b < p->n ? p->parent[b] : KIPP_POOL_NONE; }
