/*
 * kv_disk.h - the disk tier under the content-addressed KV pool (issue 54):
 * published blocks are written through to one file each in a directory, by
 * a background I/O thread, and a prefix match reads missing blocks back.
 * Engine-private; the public face is kipp_model_enable_disk_tier and
 * kipp_model_disk_stats (kipp.h).
 *
 * Threads. The scheduler thread (the one calling into the model) enqueues
 * writes and reads (kipp_kv_disk_load_queue; or, without async reads, reads
 * blocks back itself at a prefix match), and cancels writes of blocks the pool
 * is about to reuse. The I/O thread serves queued reads before writes. The I/O thread copies a queued block out of the backend's slab (the
 * block is published, hence immutable, while the copy runs), then hashes,
 * writes, fsyncs and renames the file without holding anything the scheduler
 * waits for, and keeps the directory within its byte budget (LRU). A full
 * queue drops the write (counted) rather than stall the scheduler.
 *
 * File format (little-endian; kv_disk_file.c): a 128-byte header (magic
 * "KIPPKVB1", model identity, KV type, block tokens, segment layout, chain
 * hash, parent hash, prefix length, payload XXH3_64, header XXH3_64), then the
 * prompt's token ids from position 0 to the block's end (so a read checks the
 * whole prefix, not only a 64-bit hash), then the payload: for each layer,
 * that block's K then V (32 rows of 8 x 128 in the KV type each).
 */
#ifndef KIPP_KV_DISK_H
#define KIPP_KV_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kipp.h"

typedef struct kipp_kv_disk kipp_kv_disk;

/**
 * The host address of segment seg (0 .. n_seg-1) of slab block b, its length
 * in *bytes: how the tier reaches the backend's KV bytes (kipp_backend_ops
 * pool_block_seg).
 */
typedef void *(*kipp_kv_seg_fn)(void *backend_model, uint32_t b, uint32_t seg, size_t *bytes);

/** What kipp_kv_disk_open needs. */
typedef struct {
    const char *dir;          /* directory; created 0700 when absent */
    uint64_t max_bytes;       /* LRU budget of the files, bytes (>= one block file) */
    uint8_t model_id[16];     /* model identity (XXH3_128, kv_disk_id.c) */
    uint32_t kv_type;         /* the file header's KV type: KIPP_KV_DISK_BF16 or KIPP_KV_DISK_Q8_0 */
    uint32_t n_seg;           /* segments per block: 2 x n_layer */
    size_t seg_bytes;         /* bytes of one segment */
    uint32_t n_blocks;        /* blocks of the pool's slab */
    kipp_kv_seg_fn seg;       /* slab access */
    void *backend_model;      /* seg's first argument */
} kipp_kv_disk_opts;

/**
 * Open (or create) the directory, refuse one that is not ours (not a
 * directory, foreign owner, group- or world-writable), take its lock file,
 * index the block files there, remove leftover temporary files, and start the
 * I/O thread. KIPP_EINVAL / KIPP_EIO with a message naming the path and what
 * was expected; KIPP_ENOMEM.
 */
int kipp_kv_disk_open(const kipp_kv_disk_opts *o, kipp_kv_disk **out, char *err, size_t errlen);

/** Finish the queued writes, stop the I/O thread, close; NULL accepted. */
void kipp_kv_disk_close(kipp_kv_disk *d);

/**
 * Queue slab block b (just published: chain hash h after parent_hash when
 * has_parent, prefix ids[n_ids], n_ids = 32 x (its logical index + 1)) for
 * writing. Copies ids. Never blocks on I/O; a full queue drops the write.
 */
void kipp_kv_disk_put(kipp_kv_disk *d, uint32_t b, uint64_t h, int has_parent, uint64_t parent_hash, const uint32_t *ids,
                      uint32_t n_ids);

/**
 * The pool is about to reuse slab block b: cancel its queued writes and wait
 * for a copy of it in progress (one block's memcpy). b == KIPP_POOL_NONE:
 * every block is being dropped (kipp_model_pool_clear): wait for the queue to
 * empty instead.
 */
void kipp_kv_disk_on_reuse(void *d, uint32_t b);

/** 1 when a file for chain hash h is indexed (a read may still miss or reject it). */
int kipp_kv_disk_has(kipp_kv_disk *d, uint64_t h);

/**
 * Read the block of chain hash h (prefix ids[n_ids], parent as for put) into
 * slab block b, verifying everything before returning 1. 0: no such file
 * (a miss); -1: the file was rejected (corrupt, truncated, foreign model or KV
 * layout, another prefix) - logged once, counted, removed; b's bytes are then
 * garbage and b must not be published.
 */
int kipp_kv_disk_get(kipp_kv_disk *d, uint64_t h, int has_parent, uint64_t parent_hash, const uint32_t *ids,
                     uint32_t n_ids, uint32_t b);

/** Count blocks looked up on disk at a prefix match: adopted and not found. */
void kipp_kv_disk_count(kipp_kv_disk *d, uint32_t hits, uint32_t misses);

/**
 * Report DISK-medium events (written, LRU-removed) to fn; fn may run on the
 * I/O thread. The first listener also gets, at once, a STORED event for every
 * block file found at startup, parents first.
 */
void kipp_kv_disk_set_listener(kipp_kv_disk *d, kipp_kv_event_fn fn, void *ctx);

/** Thread-safe statistics. */
void kipp_kv_disk_stats(kipp_kv_disk *d, kipp_disk_stats *out);

/**
 * A read of a prompt's blocks from disk off the scheduler thread
 * (kv_disk_load.c: kipp_model_disk_load_start). The scheduler thread fills
 * everything above `state` and owns it; the I/O thread reads blocks[i] (slab
 * blocks the load holds PRIVATE, which nothing else touches) and sets the
 * fields from `state` on, under the tier's mutex.
 */
struct kipp_disk_load {
    uint32_t first, n;        /* logical blocks [first, first + n) are read */
    uint32_t max;             /* full blocks of the prompt looked up (hits + misses) */
    uint32_t *blocks;         /* [n] slab blocks reserved for them */
    uint64_t *hash;           /* [n] their chain hashes */
    uint64_t hash0;           /* chain hash of block first - 1 (the root seed when first == 0) */
    uint32_t *ram;            /* [first] the RAM blocks before them, referenced while the load lives */
    uint32_t *ids;            /* [(first + n) x 32] the prompt's ids */
    int state;                /* KIPP_LOAD_QUEUED, _RUNNING, _DONE */
    int cancelled;            /* the scheduler gave up on it: the I/O thread stops at the next block */
    uint32_t n_ok;            /* blocks read and verified, a prefix of blocks[] */
    struct kipp_disk_load *next; /* the tier's read queue */
};

enum { KIPP_LOAD_QUEUED = 0, KIPP_LOAD_RUNNING = 1, KIPP_LOAD_DONE = 2 };

/** Queue load l for the I/O thread (reads go before queued writes). */
void kipp_kv_disk_load_queue(kipp_kv_disk *d, struct kipp_disk_load *l);

/** 1 when the I/O thread is done with l (all read, or stopped at a miss or a reject). */
int kipp_kv_disk_load_ready(kipp_kv_disk *d, const struct kipp_disk_load *l);

/**
 * Make the I/O thread let go of l: take it off the queue when it has not
 * started, else stop it at the next block and wait for the block in
 * progress (one file's read). No-op when it is done.
 */
void kipp_kv_disk_load_cancel(kipp_kv_disk *d, struct kipp_disk_load *l);

/* ---- kv_disk_file.c: one block file ---- */

/** The fixed header of a block file; 128 bytes on disk. */
typedef struct {
    uint8_t model_id[16];
    uint32_t kv_type;         /* KIPP_KV_DISK_BF16 or KIPP_KV_DISK_Q8_0: a file of the other type is refused */
    uint32_t block_tokens;    /* 32 */
    uint32_t n_seg;
    uint32_t seg_bytes;
    uint64_t hash, parent_hash;
    uint32_t has_parent;
    uint32_t n_ids;           /* prefix token ids that follow the header */
    uint64_t payload_xxh;     /* XXH3_64 of the payload */
} kipp_kv_file_head;

#define KIPP_KV_DISK_BF16 1u
#define KIPP_KV_DISK_Q8_0 2u /* q8_0 KV rows (backends/cpu/kv_store.h) */
/** The file header's KV type of kipp.h's KV type t (KIPP_KV_BF16 -> KIPP_KV_DISK_BF16, ...). */
#define KIPP_KV_DISK_TYPE(t) ((uint32_t)(t) + 1u)
#define KIPP_KV_FILE_HEAD 128u

/** Bytes of a file holding n_ids ids and n_seg x seg_bytes payload. */
uint64_t kipp_kv_file_size(uint32_t n_ids, uint32_t n_seg, size_t seg_bytes);

/** Encode h into out[KIPP_KV_FILE_HEAD], header checksum over it and ids[h->n_ids]. */
void kipp_kv_file_encode(const kipp_kv_file_head *h, const uint32_t *ids, uint8_t out[KIPP_KV_FILE_HEAD]);

/**
 * Check a file's header bytes raw[KIPP_KV_FILE_HEAD] and its ids against the
 * expected header want (payload_xxh ignored) and ids; on success *payload_xxh
 * is the stored payload checksum. 0, or -1 with why[] saying what differs.
 */
int kipp_kv_file_check(const uint8_t raw[KIPP_KV_FILE_HEAD], const uint32_t *file_ids, const kipp_kv_file_head *want,
                       const uint32_t *ids, uint64_t *payload_xxh, char *why, size_t whylen);

#endif
