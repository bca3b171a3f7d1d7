/*
 * kv_pool.h - the content-addressed KV block pool of a pooled model (seed 000
 * "Cross-session prefix sharing"). Engine-private.
 *
 * The pool owns block *bookkeeping* only; the KV bytes live in the backend
 * model's slab, addressed by the same block indices. Every block is in one
 * state:
 *   FREE       on the free list;
 *   PRIVATE    mapped by exactly one session, mutable (the block being
 *              appended to is always private);
 *   PUBLISHED  complete (32 tokens), immutable, findable by its chain hash,
 *              mapped by refs >= 0 sessions. refs == 0 puts it on the LRU
 *              list, from which allocation may evict it.
 *
 * A published block is keyed by the chain hash XXH3_64(parent hash, 32 token
 * ids) and records its parent block and its ids: a lookup compares the parent
 * block index and the ids, so a hash collision can never alias two different
 * prefixes. A session mapping a published block maps all its ancestors, so an
 * unreferenced block has only unreferenced descendants, and eviction takes
 * leaves only (the least recently used leaf first): a block is never evicted
 * while a published child still names it as parent.
 */
#ifndef KIPP_KV_POOL_H
#define KIPP_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kipp.h"

#define KIPP_POOL_NONE UINT32_MAX /* "no block" in block tables and links */
#define KIPP_POOL_ROOT_HASH 0x4b495050u /* chain hash seed of block 0 ("KIPP") */

enum { KIPP_BLOCK_FREE = 0, KIPP_BLOCK_PRIVATE = 1, KIPP_BLOCK_PUBLISHED = 2 };

typedef struct kipp_kv_pool kipp_kv_pool;

/** A pool of n_blocks blocks, all free. NULL on allocation failure or n_blocks == 0. */
kipp_kv_pool *kipp_kv_pool_create(uint32_t n_blocks);
/** Destroy; NULL accepted. */
void kipp_kv_pool_destroy(kipp_kv_pool *p);

/** The chain hash seed of block 0 for KV type kv_type (kipp.h KIPP_KV_*): KIPP_POOL_ROOT_HASH for
 *  bf16 (the hashes of older pools and disk files), another seed per type, so a block's hash names its
 *  KV type and no block of one type is ever found by a session of another. */
uint64_t kipp_kv_pool_root(int kv_type);

/** Chain hash of a block: XXH3_64 of ids[32] seeded with the parent's hash. */
uint64_t kipp_kv_pool_hash(uint64_t parent_hash, const uint32_t *ids);

/**
 * Take a block for a session's private use: a free one, else evict the least
 * recently used unreferenced published leaf. Returns the block index, or
 * KIPP_POOL_NONE when every block is private or referenced.
 */
uint32_t kipp_kv_pool_alloc(kipp_kv_pool *p);
/** Return a PRIVATE block to the free list. */
void kipp_kv_pool_free(kipp_kv_pool *p, uint32_t b);

/**
 * The published block holding ids[32] after parent (KIPP_POOL_NONE for the
 * first block) with chain hash h, or KIPP_POOL_NONE. Does not take a reference.
 */
uint32_t kipp_kv_pool_find(const kipp_kv_pool *p, uint64_t h, uint32_t parent, const uint32_t *ids);

/** Take a reference on published block b (leaves the LRU list at 0 -> 1). */
void kipp_kv_pool_ref(kipp_kv_pool *p, uint32_t b);
/** Drop a reference on published block b (joins the LRU list, most recent, at 1 -> 0). */
void kipp_kv_pool_unref(kipp_kv_pool *p, uint32_t b);

/**
 * Publish PRIVATE block b holding ids[32] after parent with chain hash h. When
 * an identical block is already published, b is freed and that block is
 * returned instead; otherwise b becomes PUBLISHED, unreferenced, most recent.
 * The returned block is the parent of the next block of the chain.
 */
uint32_t kipp_kv_pool_publish(kipp_kv_pool *p, uint32_t b, uint64_t h, uint32_t parent, const uint32_t *ids);

/** Count hits (blocks adopted) and misses (full blocks looked up but not found). */
void kipp_kv_pool_count(kipp_kv_pool *p, uint32_t hits, uint32_t misses);

/** Blocks an allocation can still obtain: free plus unreferenced published. */
uint32_t kipp_kv_pool_available(const kipp_kv_pool *p);

/** Blocks in the pool. */
uint32_t kipp_kv_pool_total(const kipp_kv_pool *p);

/** Fill the public statistics. */
void kipp_kv_pool_stats(const kipp_kv_pool *p, kipp_pool_stats *out);

/**
 * Report block events (stored / removed / all cleared) to fn(ctx, event), or
 * stop reporting with fn NULL. fn runs synchronously on the thread changing
 * the pool, inside the pool call, and must not call back into the model.
 */
void kipp_kv_pool_set_listener(kipp_kv_pool *p, kipp_kv_event_fn fn, void *ctx);

/**
 * Call fn(ctx, b) before evicted block b is handed out again, and
 * fn(ctx, KIPP_POOL_NONE) before a clear: the disk tier (engine/kv_disk.h)
 * reads published blocks from another thread and must be done with them.
 */
void kipp_kv_pool_set_reuse_hook(kipp_kv_pool *p, void (*fn)(void *ctx, uint32_t b), void *ctx);

/**
 * Free every published block, reporting one "all cleared" event. Refused
 * (KIPP_EINVAL, nothing changes) while any block is private or referenced.
 */
int kipp_kv_pool_clear(kipp_kv_pool *p, char *err, size_t errlen);

/** Test hooks: the state, reference count and parent of block b. */
int kipp_kv_pool_state(const kipp_kv_pool *p, uint32_t b);
uint32_t kipp_kv_pool_refs(const kipp_kv_pool *p, uint32_t b);
uint32_t kipp_kv_pool_parent(const kipp_kv_pool *p, uint32_t b);

#endif
