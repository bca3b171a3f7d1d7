/*
 * session_pool.c - pooled models and sessions (seed 000 "Cross-session
 * prefix sharing"): kipp_model_open_pooled, prefix adoption,
 * publish-at-finish, truncation of the private tail, and the block mapping
 * around each batched evaluation.
 *
 * The invariants every function here keeps (tests/test_kv_pool_stress.c checks them
 * against a model of the expected state):
 *   - logical blocks [0, n_shared) map published blocks, one reference each;
 *     they are complete and never written again;
 *   - blocks [n_shared, n_alloc) are the session's PRIVATE blocks, and the
 *     block being appended to is always among them;
 *   - n_shared * 32 <= length <= n_alloc * 32, and the rest of the table is
 *     KIPP_POOL_NONE.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/kv_disk.h"
#include "engine/kv_pool.h"

static const uint32_t BLOCK = KIPP_KV_BLOCK;

static uint32_t blocks_for(uint32_t tokens) { return (tokens + BLOCK - 1) / BLOCK; }

/* ---- model ---- */

int kipp_model_open_pooled(const char *path, const char *backend, const kipp_model_options *opts, uint64_t pool_mib,
                           kipp_model **out, char *err, size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_open_pooled: out must be non-NULL");
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, backend, opts, &m, err, errlen);
    if (!rc) rc = kipp_model_enable_pool(m, pool_mib, err, errlen);
    if (rc) {
        kipp_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

int kipp_model_enable_pool(kipp_model *m, uint64_t pool_mib, char *err, size_t errlen)
{
    if (!m) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_enable_pool: model is NULL");
    if (!m->ops || !m->ops->pool_create || !m->ops->session_create_pooled || !m->ops->pool_copy_block)
        return kipp_err(err, errlen, KIPP_ENOTSUP, "backend \"%s\" has no KV pool; use \"cpu\" or \"ref\"",
                        m->ops ? m->ops->name : "none");
    if (m->n_sessions)
        return kipp_err(err, errlen, KIPP_EINVAL, "a KV pool must be enabled before the first session; %u sessions are open",
                        m->n_sessions);
    uint64_t block_bytes = kipp_kv_type_bytes(m->ckpt->n_layer, m->ckpt->n_kv_head, m->ckpt->head_dim, m->view.kv_type) * BLOCK;
    uint64_t n = pool_mib ? (pool_mib > (UINT64_MAX >> 20) ? UINT64_MAX : (pool_mib << 20) / block_bytes)
                          : blocks_for(m->view.dims.context_length);
    if (n == 0 || n >= KIPP_POOL_NONE)
        return kipp_err(err, errlen, KIPP_ERANGE,
                        "a KV pool of %llu MiB holds %llu blocks of 32 positions (%llu bytes each); expected 1..%u blocks",
                        (unsigned long long)pool_mib, (unsigned long long)n, (unsigned long long)block_bytes, KIPP_POOL_NONE - 1);
    return kipp_model_attach_pool(m, (uint32_t)n, err, errlen);
}

int kipp_model_attach_pool(kipp_model *m, uint32_t n_blocks, char *err, size_t errlen)
{
    if (m->pool) return kipp_err(err, errlen, KIPP_EINVAL, "the model already has a KV pool");
    m->pool = kipp_kv_pool_create(n_blocks);
    if (!m->pool) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the bookkeeping of a %u-block KV pool", n_blocks);
    int rc = m->ops->pool_create(m->bm, n_blocks, err, errlen);
    if (rc) {
        kipp_kv_pool_destroy(m->pool);
        m->pool = NULL;
    }
    return rc;
}

int kipp_model_pool_stats(const kipp_model *m, kipp_pool_stats *out)
{
    if (!m || !out) return KIPP_EINVAL;
    memset(out, 0, sizeof *out);
    if (!m->pool) return KIPP_ENOTSUP;
    kipp_kv_pool_stats(m->pool, out);
    return 0;
}

int kipp_model_set_kv_listener(kipp_model *m, kipp_kv_event_fn fn, void *ctx)
{
    if (!m) return KIPP_EINVAL;
    if (!m->pool) return KIPP_ENOTSUP;
    kipp_kv_pool_set_listener(m->pool, fn, ctx);
    if (m->disk) kipp_kv_disk_set_listener(m->disk, fn, ctx);
    return 0;
}

int kipp_model_pool_clear(kipp_model *m, char *err, size_t errlen)
{
    if (!m) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_pool_clear: model is NULL");
    if (!m->pool) return kipp_err(err, errlen, KIPP_ENOTSUP, "kipp_model_pool_clear: the model has no KV pool");
    return kipp_kv_pool_clear(m->pool, err, errlen);
}

/* ---- session lifetime ---- */

int kipp_pool_session_create(kipp_session *s, char *err, size_t errlen)
{
    s->tokens = malloc((size_t)s->capacity * sizeof *s->tokens);
    if (!s->tokens) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a %u-token history", s->capacity);
    for (uint32_t b = 0; b < s->n_blocks; b++) s->block_table[b] = KIPP_POOL_NONE;
    return s->model->ops->session_create_pooled(s->model->bm, s->n_blocks, &s->bs, err, errlen);
}

/* Unmap logical blocks [from, n_alloc): drop shared references, free private blocks. */
static void unmap_from(kipp_session *s, uint32_t from)
{
    kipp_kv_pool *p = s->model->pool;
    for (uint32_t b = from; b < s->n_alloc; b++) {
        if (b < s->n_shared) kipp_kv_pool_unref(p, s->block_table[b]);
        else kipp_kv_pool_free(p, s->block_table[b]);
        s->block_table[b] = KIPP_POOL_NONE;
    }
    if (s->n_shared > from) s->n_shared = from;
    if (s->n_alloc > from) s->n_alloc = from;
}

/* Publish s's full private blocks; s keeps mapping them (now shared). */
static void publish_full(kipp_session *s)
{
    kipp_kv_pool *p = s->model->pool;
    uint32_t full = s->length / BLOCK, parent = KIPP_POOL_NONE;
    uint64_t h = kipp_kv_pool_root(s->model->view.kv_type), ph;
    for (uint32_t b = 0; b < full; b++) {
        const uint32_t *ids = s->tokens + (size_t)b * BLOCK;
        ph = h;
        h = kipp_kv_pool_hash(h, ids);
        if (b < s->n_shared) {
            parent = s->block_table[b];
            continue;
        }
        /* Publishing turns the private block into a shared one mapped by this
         * session: take the reference the session holds (unmap_from drops it). A block
         * new to the pool is written through to the disk tier (engine/kv_disk.c). */
        parent = kipp_kv_pool_publish(p, s->block_table[b], h, parent, ids);
        if (s->model->disk && parent == s->block_table[b] && !kipp_kv_disk_has(s->model->disk, h))
            kipp_kv_disk_put(s->model->disk, parent, h, b > 0, ph, s->tokens, (b + 1) * BLOCK);
        kipp_kv_pool_ref(p, parent);
        s->block_table[b] = parent;
        s->n_shared = b + 1;
    }
}

void kipp_pool_session_release(kipp_session *s)
{
    publish_full(s);
    unmap_from(s, 0);
    s->length = 0;
}

int kipp_pool_session_fork(kipp_session *dst, kipp_session *src, char *err, size_t errlen)
{
    kipp_kv_pool *p = src->model->pool;
    if (!p || dst->model != src->model || dst->length || dst->capacity < src->length)
        return kipp_err(err, errlen, KIPP_EINVAL, "session fork: expected an empty pooled session of the same model with room "
                        "for %u tokens (has %u of capacity %u)", src->length, dst->length, dst->capacity);
    uint32_t full = src->length / BLOCK, tail = src->length % BLOCK ? 1 : 0;
    uint32_t nb = KIPP_POOL_NONE;
    if (tail && (nb = kipp_kv_pool_alloc(p)) == KIPP_POOL_NONE)
        return kipp_err(err, errlen, KIPP_ENOMEM, "session fork: the KV pool has no block left for a copy of the %u-token tail",
                        src->length % BLOCK);
    publish_full(src);
    for (uint32_t b = 0; b < full; b++) {
        kipp_kv_pool_ref(p, src->block_table[b]);
        dst->block_table[b] = src->block_table[b];
    }
    if (tail) {
        src->model->ops->pool_copy_block(src->model->bm, src->block_table[full], nb);
        dst->block_table[full] = nb;
    }
    dst->n_shared = full;
    dst->n_alloc = full + tail;
    dst->length = src->length;
    memcpy(dst->tokens, src->tokens, (size_t)src->length * sizeof *src->tokens);
    return 0;
}

/* ---- prefix adoption ---- */

/* Blocks [b, max) of tokens are not in RAM: read those on disk back (until
 * the first one that is not there, fails its checks, or finds no pool block),
 * publish each and map it as a shared block. h: the chain hash of block
 * b - 1 (the root seed for b == 0), parent its pool block. Returns the new b. */
static uint32_t adopt_from_disk(kipp_session *s, const uint32_t *tokens, uint32_t b, uint32_t max, uint64_t h,
                                uint32_t parent)
{
    kipp_model *m = s->model;
    uint32_t first = b;
    for (; b < max; b++) {
        const uint32_t *ids = tokens + (size_t)b * BLOCK;
        uint64_t hb = kipp_kv_pool_hash(h, ids);
        if (!kipp_kv_disk_has(m->disk, hb)) break;
        uint32_t nb = kipp_kv_pool_alloc(m->pool);
        if (nb == KIPP_POOL_NONE) break;
        if (kipp_kv_disk_get(m->disk, hb, b > 0, h, tokens, (b + 1) * BLOCK, nb) != 1) {
            kipp_kv_pool_free(m->pool, nb);
            break;
        }
        parent = kipp_kv_pool_publish(m->pool, nb, hb, parent, ids);
        kipp_kv_pool_ref(m->pool, parent);
        s->block_table[b] = parent;
        h = hb;
    }
    kipp_kv_disk_count(m->disk, b - first, max - b);
    return b;
}

int kipp_session_match_prefix(kipp_session *s, const uint32_t *tokens, uint32_t n, char *err, size_t errlen)
{
    if (!s || (!tokens && n)) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_match_prefix: NULL session or tokens");
    kipp_kv_pool *p = s->model->pool;
    if (!p) return 0;
    if (s->length)
        return kipp_err(err, errlen, KIPP_EINVAL,
                        "kipp_session_match_prefix needs an empty session; this one holds %u tokens (reset it first)", s->length);
    uint32_t max = (n < s->capacity ? n : s->capacity) / BLOCK, parent = KIPP_POOL_NONE, b = 0;
    uint64_t h = kipp_kv_pool_root(s->model->view.kv_type); /* chain hash of block b - 1 */
    for (; b < max; b++) {
        const uint32_t *ids = tokens + (size_t)b * BLOCK;
        uint64_t hb = kipp_kv_pool_hash(h, ids);
        uint32_t hit = kipp_kv_pool_find(p, hb, parent, ids);
        if (hit == KIPP_POOL_NONE) break;
        kipp_kv_pool_ref(p, hit);
        s->block_table[b] = parent = hit;
        h = hb;
    }
    kipp_kv_pool_count(p, b, max - b);
    if (s->model->disk && !s->model->disk_async && b < max) b = adopt_from_disk(s, tokens, b, max, h, parent);
    s->n_shared = s->n_alloc = b;
    s->length = b * BLOCK;
    memcpy(s->tokens, tokens, (size_t)s->length * sizeof *tokens);
    return (int)s->length;
}

uint32_t kipp_session_pool_need(const kipp_session *s, uint32_t length)
{
    if (!s || !s->model->pool) return 0;
    uint32_t want = blocks_for(length < s->capacity ? length : s->capacity);
    return want > s->n_alloc ? want - s->n_alloc : 0;
}

/* ---- truncation: only the private tail changes ---- */

int kipp_pool_session_truncate(kipp_session *s, uint32_t n, char *err, size_t errlen)
{
    kipp_kv_pool *p = s->model->pool;
    uint32_t keep = blocks_for(n), cut = n / BLOCK;
    if (n % BLOCK && cut < s->n_shared) {
        /* n ends inside a shared block: the next append would write into it,
         * so its first n % 32 positions move to a private copy first. */
        uint32_t nb = kipp_kv_pool_alloc(p);
        if (nb == KIPP_POOL_NONE) {
            kipp_pool_stats st;
            kipp_kv_pool_stats(p, &st);
            return kipp_err(err, errlen, KIPP_ENOMEM,
                            "truncating to %u tokens cuts shared block %u, and the KV pool has no block left for its private copy "
                            "(%llu of %llu blocks private or referenced)", n, cut,
                            (unsigned long long)(st.blocks_total - st.blocks_available), (unsigned long long)st.blocks_total);
        }
        s->model->ops->pool_copy_block(s->model->bm, s->block_table[cut], nb);
        unmap_from(s, cut + 1);
        kipp_kv_pool_unref(p, s->block_table[cut]);
        s->block_table[cut] = nb;
        s->n_shared = cut; /* block cut is now private: n_alloc stays cut + 1 */
    } else {
        unmap_from(s, keep);
    }
    s->length = n;
    return 0;
}

/* ---- mapping around an evaluation ---- */

int kipp_pool_batch_map(kipp_model *m, const kipp_batch_item *items, size_t n, uint32_t *n_alloc_before, char *err,
                        size_t errlen)
{
    for (size_t i = 0; i < n; i++) n_alloc_before[i] = items[i].session->n_alloc;
    for (size_t i = 0; i < n; i++) {
        kipp_session *s = items[i].session;
        uint32_t want = blocks_for(s->length + items[i].token_count);
        while (s->n_alloc < want) {
            uint32_t b = kipp_kv_pool_alloc(m->pool);
            if (b == KIPP_POOL_NONE) {
                uint32_t need = want - s->n_alloc;
                kipp_pool_batch_rollback(m, items, i + 1, n_alloc_before);
                kipp_pool_stats st;
                kipp_kv_pool_stats(m->pool, &st);
                return kipp_err(err, errlen, KIPP_ENOMEM,
                                "KV pool exhausted: item %zu needs %u more block(s) of 32 positions and none is free or evictable "
                                "(%llu private and %llu referenced of %llu blocks)", i, need, (unsigned long long)st.blocks_private,
                                (unsigned long long)st.blocks_referenced, (unsigned long long)st.blocks_total);
            }
            s->block_table[s->n_alloc++] = b;
        }
    }
    return 0;
}

void kipp_pool_batch_rollback(kipp_model *m, const kipp_batch_item *items, size_t n, const uint32_t *n_alloc_before)
{
    (void)m;
    for (size_t i = 0; i < n; i++) unmap_from(items[i].session, n_alloc_before[i]);
}

void kipp_pool_batch_commit(const kipp_batch_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kipp_session *s = items[i].session;
        memcpy(s->tokens + s->length, items[i].tokens, (size_t)items[i].token_count * sizeof *s->tokens);
    }
}
