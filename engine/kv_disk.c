/*
 * kv_disk.c - the disk tier's directory, index, write queue and I/O thread
 * (kv_disk.h; issue 54).
 *
 * Write-through at publish, not spill at eviction: a block is written while
 * it is still in RAM, so a process killed with -9 (or one that exits with
 * its pool full of blocks never evicted) has already left its blocks for the
 * next one, and eviction, which runs on the scheduler thread at allocation,
 * never waits for a write. The cost is writing blocks that are never read
 * again; the LRU budget bounds it.
 *
 * Crash safety: a file is written as NAME.tmp (0600, O_EXCL after removing a
 * stale one: the directory lock says no live process owns it), fsynced, then
 * renamed to NAME.kvb and the directory fsynced (the rename survives a power
 * cut once counted as written), so a reader sees a whole file or none; a kill leaves at
 * most a .tmp, removed at the next start. Every read is verified in full
 * (kv_disk_file.c) before the block is published, so even a file changed
 * behind our back can only be rejected, never used.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "base/errbuf.h"
#include "base/log.h"
#include "engine/kv_disk.h"
#include "engine/kv_pool.h"
#include "kernels/qwen3_shape.h"

#define QCAP 1024u       /* queued writes; more are dropped (counted) */
#define NBUCKET 4096u    /* index hash buckets */
#define NONE UINT32_MAX

typedef struct {
    uint32_t block, n_ids;
    int has_parent, cancelled;
    uint64_t hash, parent_hash;
    uint32_t *ids; /* [n_ids], owned */
} job;

typedef struct {
    uint64_t hash, bytes, stamp; /* stamp: LRU order (ns; file mtime at startup) */
    uint64_t parent;             /* the parent block's chain hash, when has_parent */
    uint32_t next;               /* bucket chain, or free list */
    uint32_t n_child;            /* indexed blocks naming this one as parent: the LRU removes leaves only */
    uint32_t depth;              /* blocks of the prefix up to this one (n_ids / 32): startup events go parents first */
    uint8_t used, has_parent;
} entry;

/* What the index keeps of a block file besides its hash, size and stamp. */
typedef struct {
    int has_parent;
    uint64_t parent;
    uint32_t depth;
} link_info;

struct kipp_kv_disk {
    kipp_kv_disk_opts o;
    char *dir;
    int dirfd, lockfd;
    uint64_t file_bytes_min; /* size of a first block's file (budget check) */
    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t work, done;
    pthread_t thread;
    int stop, running;
    job q[QCAP];
    uint32_t q_head, q_len;
    uint16_t *pending;       /* [n_blocks] queued, not yet copied, writes of each slab block */
    uint32_t busy;           /* slab block the I/O thread is copying, or NONE */
    int active;              /* the I/O thread holds a job */
    entry *ent;
    uint32_t n_ent, cap_ent, free_ent, bucket[NBUCKET];
    kipp_disk_stats st;
    kipp_kv_event_fn listener;
    void *listener_ctx;
    unsigned slow_ms;        /* KIPP_TEST_KV_DISK_SLOW_MS: sleep mid-write (the kill -9 test) */
    unsigned slow_read_ms;   /* KIPP_TEST_KV_DISK_SLOW_READ_MS: sleep before each block read (the stall test), ms < 1000 */
    struct kipp_disk_load *loads, *loads_tail; /* reads queued, served before writes */
    int announced;           /* the blocks found at startup were reported to a listener */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void name_of(uint64_t h, const char *ext, char out[32]) { snprintf(out, 32, "%016llx.%s", (unsigned long long)h, ext); }

/* ---- index (mu held) ---- */

static uint32_t *bucket_of(kipp_kv_disk *d, uint64_t h) { return &d->bucket[h & (NBUCKET - 1)]; }

static uint32_t ix_find(kipp_kv_disk *d, uint64_t h)
{
    for (uint32_t i = *bucket_of(d, h); i != NONE; i = d->ent[i].next)
        if (d->ent[i].hash == h) return i;
    return NONE;
}

/* The entry of i's parent, or NONE. */
static uint32_t ix_parent(kipp_kv_disk *d, uint32_t i) { return d->ent[i].has_parent ? ix_find(d, d->ent[i].parent) : NONE; }

static void ix_remove(kipp_kv_disk *d, uint32_t i)
{
    uint32_t p = ix_parent(d, i);
    if (p != NONE && d->ent[p].n_child) d->ent[p].n_child--;
    uint32_t *link = bucket_of(d, d->ent[i].hash);
    while (*link != i) link = &d->ent[*link].next;
    *link = d->ent[i].next;
    d->st.bytes -= d->ent[i].bytes;
    d->st.files--;
    d->ent[i] = (entry){.next = d->free_ent};
    d->free_ent = i;
}

/* Add or refresh h's entry; 0, or -1 when out of memory. */
static int ix_put(kipp_kv_disk *d, uint64_t h, uint64_t bytes, uint64_t stamp, link_info li)
{
    uint32_t i = ix_find(d, h), kids = 0;
    if (i != NONE) kids = d->ent[i].n_child, ix_remove(d, i);
    if (d->free_ent == NONE) {
        uint32_t cap = d->cap_ent ? 2 * d->cap_ent : 256;
        entry *e = realloc(d->ent, cap * sizeof *e);
        if (!e) return -1;
        for (uint32_t k = cap; k-- > d->cap_ent;) e[k] = (entry){.next = d->free_ent}, d->free_ent = k;
        d->ent = e, d->cap_ent = cap;
    }
    i = d->free_ent;
    d->free_ent = d->ent[i].next;
    d->ent[i] = (entry){.hash = h, .bytes = bytes, .stamp = stamp, .next = *bucket_of(d, h), .used = 1, .n_child = kids,
                        .has_parent = (uint8_t)li.has_parent, .parent = li.parent, .depth = li.depth};
    *bucket_of(d, h) = i;
    uint32_t p = ix_parent(d, i);
    if (p != NONE) d->ent[p].n_child++;
    d->st.bytes += bytes;
    d->st.files++;
    return 0;
}

/* Recount every entry's children (after the startup scan, which meets children before parents). */
static void ix_relink(kipp_kv_disk *d)
{
    for (uint32_t i = 0; i < d->cap_ent; i++) d->ent[i].n_child = 0;
    for (uint32_t i = 0; i < d->cap_ent; i++) {
        uint32_t p = d->ent[i].used ? ix_parent(d, i) : NONE;
        if (p != NONE) d->ent[p].n_child++;
    }
}

/* Remove least recently used files until the budget holds; reports them (mu
 * held). Only leaves go: a block whose child is on disk stays, as a file
 * behind a missing parent is never read (a prefix match stops at the gap),
 * so a chain shrinks from its tail and keeps its useful head. */
static void ix_trim(kipp_kv_disk *d)
{
    while (d->st.bytes > d->o.max_bytes && d->st.files) {
        uint32_t old = NONE;
        for (uint32_t i = 0; i < d->cap_ent; i++)
            if (d->ent[i].used && !d->ent[i].n_child && (old == NONE || d->ent[i].stamp < d->ent[old].stamp)) old = i;
        for (uint32_t i = 0; old == NONE && i < d->cap_ent; i++) /* no leaf: only a hash cycle could do that */
            if (d->ent[i].used) old = i;
        char name[32];
        uint64_t h = d->ent[old].hash;
        name_of(h, "kvb", name);
        unlinkat(d->dirfd, name, 0);
        ix_remove(d, old);
        d->st.evictions++;
        if (d->listener)
            d->listener(d->listener_ctx, &(kipp_kv_event){.kind = KIPP_KV_EVENT_REMOVED, .hash = h,
                                                          .block_tokens = KIPP_KV_BLOCK, .medium = KIPP_KV_MEDIUM_DISK});
    }
}

/* ---- directory ---- */

static int dir_open(kipp_kv_disk *d, char *err, size_t errlen)
{
    const char *p = d->o.dir;
    if (mkdir(p, 0700) && errno != EEXIST)
        return kipp_err(err, errlen, KIPP_EIO, "--kv-cache-dir '%s': cannot create it: %s", p, strerror(errno));
    struct stat sb;
    if (!lstat(p, &sb) && S_ISLNK(sb.st_mode))
        return kipp_err(err, errlen, KIPP_EINVAL, "--kv-cache-dir '%s' is a symlink; expected a real directory (a symlink is "
                        "refused: it could point the cache at another user's files)", p);
    if (!lstat(p, &sb) && !S_ISDIR(sb.st_mode))
        return kipp_err(err, errlen, KIPP_EINVAL, "--kv-cache-dir '%s' exists and is not a directory (%s); expected a "
                        "directory, or a path that does not exist yet", p, S_ISREG(sb.st_mode) ? "a regular file" : "a special file");
    d->dirfd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d->dirfd < 0 || fstat(d->dirfd, &sb))
        return kipp_err(err, errlen, KIPP_EIO, "--kv-cache-dir '%s': cannot open it as a directory: %s", p, strerror(errno));
    if (sb.st_uid != geteuid())
        return kipp_err(err, errlen, KIPP_EINVAL, "--kv-cache-dir '%s' is owned by uid %u, expected this process's uid %u: "
                        "refusing to read KV written by another user", p, (unsigned)sb.st_uid, (unsigned)geteuid());
    if (sb.st_mode & (S_IWGRP | S_IWOTH))
        return kipp_err(err, errlen, KIPP_EINVAL, "--kv-cache-dir '%s' has mode %03o, writable by others; expected no group or "
                        "world write (chmod 700 it)", p, (unsigned)(sb.st_mode & 0777));
    d->lockfd = openat(d->dirfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (d->lockfd < 0)
        return kipp_err(err, errlen, KIPP_EIO, "--kv-cache-dir '%s': cannot create its lock file %s/lock: %s; expected a "
                        "directory this user can write block files into", p, p, strerror(errno));
    if (flock(d->lockfd, LOCK_EX | LOCK_NB))
        return kipp_err(err, errlen, KIPP_EIO, "--kv-cache-dir '%s': cannot lock %s/lock (%s)%s", p, p, strerror(errno),
                        errno == EWOULDBLOCK ? ": another kipp process uses this directory" : "");
    return 0;
}

/* A block file's parent and depth from its header (unchecked: a read checks
 * everything); no parent and depth 0 when it cannot be read. */
static link_info read_link(kipp_kv_disk *d, const char *name)
{
    link_info li = {0};
    uint8_t h[KIPP_KV_FILE_HEAD];
    int fd = openat(d->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return li;
    if (pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h && !memcmp(h, "KIPPKVB1", 8)) {
        uint32_t hp, n_ids;
        memcpy(&hp, h + 44, 4), memcpy(&li.parent, h + 56, 8), memcpy(&n_ids, h + 64, 4);
        li.has_parent = hp != 0, li.depth = n_ids / KIPP_KV_BLOCK;
    }
    close(fd);
    return li;
}

/* Index NAME.kvb files, remove NAME.tmp ones (a killed writer's). */
static int dir_scan(kipp_kv_disk *d)
{
    int fd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dp) return fd >= 0 ? close(fd), -1 : -1;
    struct dirent *e;
    while ((e = readdir(dp))) {
        char *end;
        unsigned long long h = strtoull(e->d_name, &end, 16);
        if (end != e->d_name + 16) continue;
        struct stat sb;
        if (!strcmp(end, ".tmp")) unlinkat(d->dirfd, e->d_name, 0), d->st.tmp_removed++;
        else if (!strcmp(end, ".kvb") && !fstatat(d->dirfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) && S_ISREG(sb.st_mode))
            ix_put(d, h, (uint64_t)sb.st_size, (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec,
                   read_link(d, e->d_name));
    }
    closedir(dp);
    ix_relink(d);
    return 0;
}

/* ---- the I/O thread ---- */

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

/* Write job j's file from payload[] (outside mu). 0, or -1 (errno kept for the log). */
static int write_file(kipp_kv_disk *d, const job *j, const uint8_t *payload, size_t n_payload)
{
    kipp_kv_file_head h = {.kv_type = d->o.kv_type, .block_tokens = KIPP_KV_BLOCK, .n_seg = d->o.n_seg,
                           .seg_bytes = (uint32_t)d->o.seg_bytes, .hash = j->hash, .parent_hash = j->parent_hash,
                           .has_parent = (uint32_t)j->has_parent, .n_ids = j->n_ids,
                           .payload_xxh = XXH3_64bits(payload, n_payload)};
    memcpy(h.model_id, d->o.model_id, 16);
    uint8_t head[KIPP_KV_FILE_HEAD];
    kipp_kv_file_encode(&h, j->ids, head);
    char tmp[32], fin[32];
    name_of(j->hash, "tmp", tmp), name_of(j->hash, "kvb", fin);
    unlinkat(d->dirfd, tmp, 0);
    int fd = openat(d->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int rc = write_all(fd, head, sizeof head) || write_all(fd, j->ids, (size_t)j->n_ids * 4);
    if (!rc && d->slow_ms) nanosleep(&(struct timespec){0, (long)d->slow_ms * 1000000L}, NULL);
    rc = rc || write_all(fd, payload, n_payload) || fsync(fd);
    int e = errno;
    close(fd);
    if (!rc && renameat(d->dirfd, tmp, d->dirfd, fin)) rc = 1, e = errno;
    /* the rename is durable once the directory is: a power cut before this may lose the block (never tear it) */
    if (!rc && fsync(d->dirfd)) rc = 1, e = errno, unlinkat(d->dirfd, fin, 0);
    if (rc) unlinkat(d->dirfd, tmp, 0), errno = e;
    return rc ? -1 : 0;
}

/* Copy job j's block out of the slab while the scheduler cannot reuse it (busy). */
static void copy_block(kipp_kv_disk *d, uint32_t b, uint8_t *buf)
{
    for (uint32_t s = 0; s < d->o.n_seg; s++) {
        size_t n;
        const void *src = d->o.seg(d->o.backend_model, b, s, &n);
        memcpy(buf + (size_t)s * d->o.seg_bytes, src, n);
    }
}

static void finish_write(kipp_kv_disk *d, const job *j, uint64_t bytes, int ok)
{
    pthread_mutex_lock(&d->mu);
    link_info li = {.has_parent = j->has_parent, .parent = j->parent_hash, .depth = j->n_ids / KIPP_KV_BLOCK};
    if (ok && !ix_put(d, j->hash, bytes, now_ns(), li)) {
        d->st.writes++;
        d->st.write_bytes += bytes;
        if (d->listener)
            d->listener(d->listener_ctx, &(kipp_kv_event){.kind = KIPP_KV_EVENT_STORED, .hash = j->hash,
                                                          .has_parent = j->has_parent, .parent_hash = j->parent_hash,
                                                          .token_ids = j->ids + j->n_ids - KIPP_KV_BLOCK,
                                                          .block_tokens = KIPP_KV_BLOCK, .medium = KIPP_KV_MEDIUM_DISK});
        ix_trim(d);
    } else if (!ok && d->st.write_errors++ == 0) {
        kipp_log("kv-cache-dir %s: cannot write a block file (%s); counting further failures in /metrics", d->dir,
                 strerror(errno));
    }
    free(j->ids);
    d->active = 0;
    pthread_cond_broadcast(&d->done);
    pthread_mutex_unlock(&d->mu);
}

/* Serve load l (mu held on entry and exit, released while reading): its
 * blocks in order, until one is missing or rejected or l is cancelled. */
static void run_load(kipp_kv_disk *d, struct kipp_disk_load *l)
{
    l->state = KIPP_LOAD_RUNNING;
    for (uint32_t i = 0; i < l->n && !l->cancelled; i++) {
        pthread_mutex_unlock(&d->mu);
        uint32_t b = l->first + i;
        int got = kipp_kv_disk_get(d, l->hash[i], b > 0, i ? l->hash[i - 1] : l->hash0, l->ids, (b + 1) * KIPP_KV_BLOCK,
                                   l->blocks[i]);
        pthread_mutex_lock(&d->mu);
        if (got != 1) break;
        l->n_ok = i + 1;
    }
    l->state = KIPP_LOAD_DONE;
    pthread_cond_broadcast(&d->done);
}

static void *io_main(void *arg)
{
    kipp_kv_disk *d = arg;
    size_t n_payload = (size_t)d->o.n_seg * d->o.seg_bytes;
    uint8_t *buf = malloc(n_payload);
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->q_len && !d->loads && !d->stop) pthread_cond_wait(&d->work, &d->mu);
        if (d->loads) { /* a request waits on a read; a write waits on nobody */
            struct kipp_disk_load *l = d->loads;
            if (!(d->loads = l->next)) d->loads_tail = NULL;
            l->next = NULL;
            run_load(d, l);
            continue;
        }
        if (!d->q_len) break;
        job j = d->q[d->q_head];
        d->q_head = (d->q_head + 1) % QCAP, d->q_len--;
        if (j.cancelled || !buf) {
            free(j.ids);
            if (!j.cancelled) d->pending[j.block]--, d->st.dropped++; /* cancelled ones were counted at cancel */
            pthread_cond_broadcast(&d->done);
            continue;
        }
        d->busy = j.block, d->active = 1;
        pthread_mutex_unlock(&d->mu);
        copy_block(d, j.block, buf);
        pthread_mutex_lock(&d->mu);
        d->busy = NONE;
        d->pending[j.block]--;
        pthread_cond_broadcast(&d->done);
        pthread_mutex_unlock(&d->mu);
        int ok = !write_file(d, &j, buf, n_payload);
        finish_write(d, &j, kipp_kv_file_size(j.n_ids, d->o.n_seg, d->o.seg_bytes), ok);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    free(buf);
    return NULL;
}

/* ---- open / close ---- */

int kipp_kv_disk_open(const kipp_kv_disk_opts *o, kipp_kv_disk **out, char *err, size_t errlen)
{
    *out = NULL;
    kipp_kv_disk *d = calloc(1, sizeof *d);
    if (!d) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the KV disk tier");
    d->o = *o;
    d->dirfd = d->lockfd = -1;
    d->busy = NONE, d->free_ent = NONE;
    for (uint32_t i = 0; i < NBUCKET; i++) d->bucket[i] = NONE;
    d->dir = strdup(o->dir);
    d->pending = calloc(o->n_blocks, sizeof *d->pending);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work, NULL), pthread_cond_init(&d->done, NULL);
    const char *slow = getenv("KIPP_TEST_KV_DISK_SLOW_MS");
    d->slow_ms = slow ? (unsigned)atoi(slow) : 0;
    slow = getenv("KIPP_TEST_KV_DISK_SLOW_READ_MS");
    d->slow_read_ms = slow ? (unsigned)atoi(slow) : 0;
    d->st.enabled = 1, d->st.max_bytes = o->max_bytes;
    d->file_bytes_min = kipp_kv_file_size(KIPP_KV_BLOCK, o->n_seg, o->seg_bytes);
    int rc = !d->dir || !d->pending ? kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the KV disk tier") : 0;
    if (!rc && o->max_bytes < d->file_bytes_min)
        rc = kipp_err(err, errlen, KIPP_ERANGE, "--kv-cache-disk-mib: %llu bytes hold no block file of %llu bytes; expected "
                      "at least %llu MiB", (unsigned long long)o->max_bytes, (unsigned long long)d->file_bytes_min,
                      (unsigned long long)((d->file_bytes_min + (1 << 20) - 1) >> 20));
    if (!rc) rc = dir_open(d, err, errlen);
    if (!rc && dir_scan(d)) rc = kipp_err(err, errlen, KIPP_EIO, "--kv-cache-dir '%s': cannot list it: %s", o->dir, strerror(errno));
    if (!rc) {
        ix_trim(d);
        if (pthread_create(&d->thread, NULL, io_main, d)) rc = kipp_err(err, errlen, KIPP_ENOMEM, "cannot start the KV disk thread");
        else d->running = 1;
    }
    if (rc) return kipp_kv_disk_close(d), rc;
    *out = d;
    return 0;
}

void kipp_kv_disk_close(kipp_kv_disk *d)
{
    if (!d) return;
    if (d->running) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    for (uint32_t k = 0; k < d->q_len; k++) free(d->q[(d->q_head + k) % QCAP].ids);
    if (d->lockfd >= 0) close(d->lockfd);
    if (d->dirfd >= 0) close(d->dirfd);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->work), pthread_cond_destroy(&d->done);
    free(d->ent), free(d->pending), free(d->dir);
    free(d);
}

/* ---- the scheduler thread's calls ---- */

void kipp_kv_disk_put(kipp_kv_disk *d, uint32_t b, uint64_t h, int has_parent, uint64_t parent_hash, const uint32_t *ids,
                      uint32_t n_ids)
{
    uint32_t *copy = malloc((size_t)n_ids * sizeof *copy);
    pthread_mutex_lock(&d->mu);
    if (!copy || d->q_len == QCAP || d->pending[b] == UINT16_MAX) {
        d->st.dropped++;
        free(copy);
    } else {
        memcpy(copy, ids, (size_t)n_ids * sizeof *copy);
        d->q[(d->q_head + d->q_len++) % QCAP] = (job){.block = b, .n_ids = n_ids, .has_parent = has_parent, .hash = h,
                                                      .parent_hash = parent_hash, .ids = copy};
        d->pending[b]++;
        pthread_cond_signal(&d->work);
    }
    pthread_mutex_unlock(&d->mu);
}

void kipp_kv_disk_on_reuse(void *ctx, uint32_t b)
{
    kipp_kv_disk *d = ctx;
    pthread_mutex_lock(&d->mu);
    if (b == KIPP_POOL_NONE) {
        while (d->q_len || d->active) pthread_cond_wait(&d->done, &d->mu);
    } else {
        for (uint32_t k = 0; d->pending[b] && k < d->q_len; k++) {
            job *j = &d->q[(d->q_head + k) % QCAP];
            if (j->block == b && !j->cancelled) j->cancelled = 1, d->pending[b]--, d->st.dropped++;
        }
        while (d->busy == b) pthread_cond_wait(&d->done, &d->mu);
    }
    pthread_mutex_unlock(&d->mu);
}

int kipp_kv_disk_has(kipp_kv_disk *d, uint64_t h)
{
    pthread_mutex_lock(&d->mu);
    int has = ix_find(d, h) != NONE;
    pthread_mutex_unlock(&d->mu);
    return has;
}

void kipp_kv_disk_load_queue(kipp_kv_disk *d, struct kipp_disk_load *l)
{
    pthread_mutex_lock(&d->mu);
    l->state = KIPP_LOAD_QUEUED, l->next = NULL;
    if (d->loads_tail) d->loads_tail->next = l;
    else d->loads = l;
    d->loads_tail = l;
    pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->mu);
}

int kipp_kv_disk_load_ready(kipp_kv_disk *d, const struct kipp_disk_load *l)
{
    pthread_mutex_lock(&d->mu);
    int ready = l->state == KIPP_LOAD_DONE;
    pthread_mutex_unlock(&d->mu);
    return ready;
}

void kipp_kv_disk_load_cancel(kipp_kv_disk *d, struct kipp_disk_load *l)
{
    pthread_mutex_lock(&d->mu);
    l->cancelled = 1;
    if (l->state == KIPP_LOAD_QUEUED) {
        struct kipp_disk_load **p = &d->loads, *prev = NULL;
        while (*p != l) prev = *p, p = &(*p)->next;
        *p = l->next;
        if (d->loads_tail == l) d->loads_tail = prev;
        l->next = NULL, l->state = KIPP_LOAD_DONE;
    }
    while (l->state != KIPP_LOAD_DONE) pthread_cond_wait(&d->done, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void kipp_kv_disk_count(kipp_kv_disk *d, uint32_t hits, uint32_t misses)
{
    pthread_mutex_lock(&d->mu);
    d->st.hits += hits, d->st.misses += misses;
    pthread_mutex_unlock(&d->mu);
}

static int by_depth(const void *a, const void *b, void *ent)
{
    uint32_t x = ((const entry *)ent)[*(const uint32_t *)a].depth, y = ((const entry *)ent)[*(const uint32_t *)b].depth;
    return (x > y) - (x < y);
}

/* Report every indexed block as STORED on DISK, parents before children
 * (mu held): a router that subscribes learns what a restarted server holds
 * before its first request. A file whose ids cannot be read is left out
 * (a read would reject it). */
static void announce(kipp_kv_disk *d)
{
    uint32_t *order = malloc((d->st.files ? d->st.files : 1) * sizeof *order), n = 0;
    if (!order) return;
    for (uint32_t i = 0; i < d->cap_ent && n < d->st.files; i++)
        if (d->ent[i].used && d->ent[i].depth) order[n++] = i;
    qsort_r(order, n, sizeof *order, by_depth, d->ent);
    for (uint32_t k = 0; k < n; k++) {
        const entry *e = &d->ent[order[k]];
        char name[32];
        uint32_t ids[KIPP_KV_BLOCK];
        name_of(e->hash, "kvb", name);
        int fd = openat(d->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        off_t off = KIPP_KV_FILE_HEAD + (off_t)(e->depth - 1) * KIPP_KV_BLOCK * 4;
        int ok = fd >= 0 && pread(fd, ids, sizeof ids, off) == (ssize_t)sizeof ids;
        if (fd >= 0) close(fd);
        if (ok)
            d->listener(d->listener_ctx, &(kipp_kv_event){.kind = KIPP_KV_EVENT_STORED, .hash = e->hash,
                                                          .has_parent = e->has_parent, .parent_hash = e->parent,
                                                          .token_ids = ids, .block_tokens = KIPP_KV_BLOCK,
                                                          .medium = KIPP_KV_MEDIUM_DISK});
    }
    free(order);
}

void kipp_kv_disk_set_listener(kipp_kv_disk *d, kipp_kv_event_fn fn, void *ctx)
{
    pthread_mutex_lock(&d->mu);
    d->listener = fn, d->listener_ctx = ctx;
    if (fn && !d->announced) d->announced = 1, announce(d);
    pthread_mutex_unlock(&d->mu);
}

void kipp_kv_disk_stats(kipp_kv_disk *d, kipp_disk_stats *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->queued = d->q_len;
    pthread_mutex_unlock(&d->mu);
}

/* ---- reading a block back ---- */

/* Reject h's file: one log line, counted, removed from the index and the directory. */
static int reject(kipp_kv_disk *d, uint64_t h, const char *why)
{
    char name[32];
    name_of(h, "kvb", name);
    kipp_log("kv-cache-dir %s: skipping %s: %s", d->dir, name, why);
    pthread_mutex_lock(&d->mu);
    d->st.rejects++;
    uint32_t i = ix_find(d, h);
    if (i != NONE) ix_remove(d, i), unlinkat(d->dirfd, name, 0);
    pthread_mutex_unlock(&d->mu);
    return -1;
}

/* Read n bytes at off; 0 or -1 (short: truncated under us). */
static int read_at(int fd, void *p, size_t n, off_t off)
{
    char *c = p;
    while (n) {
        ssize_t r = pread(fd, c, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r, n -= (size_t)r, off += r;
    }
    return 0;
}

/* Read the payload straight into slab block b; its XXH3_64. 0, or -1. */
static int read_payload(kipp_kv_disk *d, int fd, off_t off, uint32_t b, uint64_t *sum)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t s = 0; s < d->o.n_seg; s++) {
        size_t n;
        void *dst = d->o.seg(d->o.backend_model, b, s, &n);
        if (n != d->o.seg_bytes || read_at(fd, dst, n, off)) return -1;
        XXH3_64bits_update(&st, dst, n);
        off += (off_t)n;
    }
    *sum = XXH3_64bits_digest(&st);
    return 0;
}

int kipp_kv_disk_get(kipp_kv_disk *d, uint64_t h, int has_parent, uint64_t parent_hash, const uint32_t *ids,
                     uint32_t n_ids, uint32_t b)
{
    char name[32], why[160];
    name_of(h, "kvb", name);
    if (d->slow_read_ms) nanosleep(&(struct timespec){0, (long)d->slow_read_ms * 1000000L}, NULL);
    int fd = openat(d->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0; /* trimmed since the lookup: a miss */
    kipp_kv_file_head want = {.kv_type = d->o.kv_type, .block_tokens = KIPP_KV_BLOCK, .n_seg = d->o.n_seg,
                              .seg_bytes = (uint32_t)d->o.seg_bytes, .hash = h, .parent_hash = parent_hash,
                              .has_parent = (uint32_t)has_parent, .n_ids = n_ids};
    memcpy(want.model_id, d->o.model_id, 16);
    uint64_t size = kipp_kv_file_size(n_ids, d->o.n_seg, d->o.seg_bytes), stored = 0, sum = 0;
    struct stat sb;
    uint8_t head[KIPP_KV_FILE_HEAD];
    uint32_t *file_ids = malloc((size_t)n_ids * 4);
    int rc = 0;
    if (!file_ids) rc = -2;
    else if (fstat(fd, &sb) || !S_ISREG(sb.st_mode))
        rc = -1, snprintf(why, sizeof why, "not a readable regular file");
    else if ((uint64_t)sb.st_size != size)
        rc = -1, snprintf(why, sizeof why, "%lld bytes, expected %llu (truncated or another layout)", (long long)sb.st_size,
                          (unsigned long long)size);
    else if (read_at(fd, head, sizeof head, 0) || read_at(fd, file_ids, (size_t)n_ids * 4, KIPP_KV_FILE_HEAD))
        rc = -1, snprintf(why, sizeof why, "short read (truncated)");
    else if (kipp_kv_file_check(head, file_ids, &want, ids, &stored, why, sizeof why))
        rc = -1;
    else if (read_payload(d, fd, (off_t)(KIPP_KV_FILE_HEAD + (uint64_t)n_ids * 4), b, &sum) || sum != stored)
        rc = -1, snprintf(why, sizeof why, "payload checksum mismatch (corrupt)");
    if (!rc) futimens(fd, NULL); /* the LRU order survives a restart */
    close(fd);
    free(file_ids);
    if (rc == -2) return 0;
    if (rc) return reject(d, h, why);
    pthread_mutex_lock(&d->mu);
    uint32_t i = ix_find(d, h);
    if (i != NONE) d->ent[i].stamp = now_ns();
    d->st.reads++;
    d->st.read_bytes += size;
    pthread_mutex_unlock(&d->mu);
    return 1;
}
