/*
 * session.c - sessions, block tables and evaluation (seed 000, "Public engine
 * and session model", "KV cache", "Backend boundary").
 *
 * The engine owns the logical timeline (length, capacity, block table); the
 * backend owns the KV bytes. Every request is validated here, before the
 * backend is called, so a rejected call computes nothing and appends nothing:
 * sessions, counts, capacity, token ids, logits rows and block tables. The
 * backend only computes (engine/backend.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/kv_pool.h"

static const uint32_t BLOCK = KIPP_KV_BLOCK; /* positions per KV page */

int kipp_session_create(kipp_model *model, uint32_t capacity, kipp_session **out, char *err,
                        size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_create: out is NULL, expected a pointer");
    *out = NULL;
    if (!model) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_create: model is NULL, expected an open model");
    if (!model->ops)
        return kipp_err(err, errlen, KIPP_EBACKEND, "kipp_session_create: the model was opened with backend \"none\"; "
                        "open it with \"cpu\" or \"ref\" to evaluate");
    uint32_t ctx = model->view.dims.context_length;
    if (capacity == 0 || capacity > ctx)
        return kipp_err(err, errlen, KIPP_ERANGE,
                        "session capacity %u tokens is out of range, expected 1..%u (the context length of %s)",
                        capacity, ctx, model->view.checkpoint_id ? model->view.checkpoint_id : "this model");
    kipp_session *s = calloc(1, sizeof *s);
    if (!s) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory allocating a session");
    s->model = model;
    s->capacity = capacity;
    s->n_blocks = (capacity + BLOCK - 1) / BLOCK;
    s->block_table = malloc(s->n_blocks * sizeof *s->block_table);
    if (!s->block_table) {
        uint32_t nb = s->n_blocks;
        free(s);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory allocating a %u-entry block table", nb);
    }
    for (uint32_t b = 0; b < s->n_blocks; b++) s->block_table[b] = b; /* identity: contiguous layout */
    int rc = model->pool ? kipp_pool_session_create(s, err, errlen)
                         : model->ops->session_create(model->bm, s->n_blocks, &s->bs, err, errlen);
    if (rc) {
        free(s->tokens);
        free(s->block_table);
        free(s);
        return rc;
    }
    model->n_sessions++;
    *out = s;
    return 0;
}

void kipp_session_destroy(kipp_session *s)
{
    if (!s) return;
    if (s->model->pool) kipp_pool_session_release(s); /* publish-at-finish */
    s->model->ops->session_destroy(s->bs);
    s->model->n_sessions--;
    free(s->tokens);
    free(s->block_table);
    free(s);
}

uint32_t kipp_session_length(const kipp_session *s) { return s ? s->length : 0; }

uint32_t kipp_session_capacity(const kipp_session *s) { return s ? s->capacity : 0; }

void kipp_session_reset(kipp_session *s)
{
    if (s && s->model->pool) kipp_pool_session_release(s); /* publish-at-finish */
    if (s) s->length = 0;
}

int kipp_session_truncate(kipp_session *s, uint32_t n, char *err, size_t errlen)
{
    if (!s) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_truncate: session is NULL");
    if (n > s->length)
        return kipp_err(err, errlen, KIPP_ERANGE,
                        "cannot truncate to %u tokens: the session holds only %u", n, s->length);
    if (s->model->pool) return kipp_pool_session_truncate(s, n, err, errlen);
    s->length = n; /* positions >= n are overwritten by the next append */
    return 0;
}

int kipp_session_set_block_table(kipp_session *s, const uint32_t *perm, char *err, size_t errlen)
{
    if (!s || !perm) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_set_block_table: NULL session or table");
    if (s->length)
        return kipp_err(err, errlen, KIPP_EINVAL,
                        "the block table can only be replaced on an empty session (length is %u)", s->length);
    if (s->model->pool)
        return kipp_err(err, errlen, KIPP_EINVAL, "the block table of a pooled session belongs to the KV pool");
    uint8_t *seen = calloc(s->n_blocks, 1);
    if (!seen) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory checking a block table");
    for (uint32_t b = 0; b < s->n_blocks; b++) {
        if (perm[b] >= s->n_blocks || seen[perm[b]]) {
            uint32_t bad = perm[b];
            free(seen);
            return kipp_err(err, errlen, KIPP_EINVAL,
                            "block table entry %u is %u, expected a permutation of 0..%u", b, bad, s->n_blocks - 1);
        }
        seen[perm[b]] = 1;
    }
    free(seen);
    memcpy(s->block_table, perm, s->n_blocks * sizeof *perm);
    return 0;
}

/* ---- evaluation ---- */

/* Everything a backend may rely on (backend.h), checked before any compute. */
static int check_item(const kipp_model *model, const kipp_batch_item *it, size_t idx, char *err,
                      size_t errlen)
{
    const kipp_session *s = it->session;
    if (!s || s->model != model)
        return kipp_err(err, errlen, KIPP_EINVAL, "item %zu: session is NULL or belongs to another model", idx);
    if (it->token_count == 0 || !it->tokens)
        return kipp_err(err, errlen, KIPP_EINVAL, "item %zu: %u tokens given, expected at least 1", idx,
                        it->token_count);
    if (it->logits_count > it->token_count || (it->logits_count && !it->logits))
        return kipp_err(err, errlen, KIPP_EINVAL,
                        "item %zu: %u logits rows requested for %u tokens, expected 0..%u rows and a buffer",
                        idx, it->logits_count, it->token_count, it->token_count);
    if ((uint64_t)s->length + it->token_count > s->capacity)
        return kipp_err(err, errlen, KIPP_ERANGE,
                        "%u tokens do not fit: the session holds %u of %u (capacity), so at most %u more fit",
                        it->token_count, s->length, s->capacity, s->capacity - s->length);
    uint32_t vocab = model->view.dims.vocab_size;
    for (uint32_t i = 0; i < it->token_count; i++)
        if (it->tokens[i] >= vocab)
            return kipp_err(err, errlen, KIPP_ERANGE, "token %u (index %u) is out of range, expected an id below %u",
                            it->tokens[i], i, vocab);
    return 0;
}

/* The pages an item writes and reads, [0, (length + count - 1) / 32], must map
 * to physical blocks of its KV: the session's own n_blocks, or the pool's.
 * The engine builds every table (identity, kipp_session_set_block_table's
 * permutation, the pool's mapping), so this guards the engine's own state at
 * the boundary, where a bad entry would become a wild write in the backend. */
static int check_blocks(const kipp_model *model, const kipp_batch_item *it, size_t idx, char *err, size_t errlen)
{
    const kipp_session *s = it->session;
    uint32_t limit = model->pool ? kipp_kv_pool_total(model->pool) : s->n_blocks;
    for (uint32_t b = 0; b <= (s->length + it->token_count - 1) / BLOCK; b++)
        if (s->block_table[b] >= limit)
            return kipp_err(err, errlen, KIPP_ERANGE, "item %zu: block_table[%u] = %u, expected < %u physical blocks",
                            idx, b, s->block_table[b], limit);
    return 0;
}

static int check_finite(const float *x, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            *bad = i;
            return 0;
        }
    return 1;
}

int kipp_eval_batch(kipp_model *model, kipp_batch_item *items, size_t n, char *err, size_t errlen)
{
    if (!model || (!items && n)) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_eval_batch: NULL model or items");
    if (n == 0) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_eval_batch: 0 items given, expected at least 1");
    for (size_t i = 0; i < n; i++) {
        int rc = check_item(model, &items[i], i, err, errlen);
        if (rc) return rc;
        for (size_t j = 0; j < i; j++)
            if (items[j].session == items[i].session)
                return kipp_err(err, errlen, KIPP_EINVAL, "items %zu and %zu share a session, expected distinct sessions", j, i);
    }
    kipp_eval_item stack[8], *bi = n <= 8 ? stack : malloc(n * sizeof *bi);
    uint32_t alloc_stack[8], *alloc0 = n <= 8 ? alloc_stack : malloc(n * sizeof *alloc0);
    if (!bi || !alloc0) {
        if (bi != stack) free(bi);
        if (alloc0 != alloc_stack) free(alloc0);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu batch items", n);
    }
    int rc = model->pool ? kipp_pool_batch_map(model, items, n, alloc0, err, errlen) : 0;
    for (size_t i = 0; i < n && !rc; i++)
        if ((rc = check_blocks(model, &items[i], i, err, errlen)) && model->pool) kipp_pool_batch_rollback(model, items, n, alloc0);
    for (size_t i = 0; i < n && !rc; i++) {
        const kipp_session *s = items[i].session;
        bi[i] = (kipp_eval_item){s->bs, items[i].tokens, items[i].token_count, s->length, s->block_table,
                                 items[i].logits_count, items[i].logits, items[i].hidden};
    }
    if (!rc) {
        rc = model->ops->eval(model->bm, bi, n, err, errlen);
        if (rc && model->pool) kipp_pool_batch_rollback(model, items, n, alloc0);
    }
    if (bi != stack) free(bi);
    if (rc) {
        if (alloc0 != alloc_stack) free(alloc0);
        return rc;
    }
    /* NaN/Inf is reported, not sampled; no session advances so a retry sees the old state. */
    uint32_t vocab = model->view.dims.vocab_size;
    for (size_t i = 0; i < n; i++) {
        size_t bad;
        if (items[i].hidden && !check_finite(items[i].hidden, model->view.dims.d_model, &bad)) {
            if (model->pool) kipp_pool_batch_rollback(model, items, n, alloc0);
            if (alloc0 != alloc_stack) free(alloc0);
            return kipp_err(err, errlen, KIPP_ENUMERIC, "item %zu: hidden value %zu is %g, expected a finite value",
                            i, bad, (double)items[i].hidden[bad]);
        }
        if (!check_finite(items[i].logits, (size_t)items[i].logits_count * vocab, &bad)) {
            if (model->pool) kipp_pool_batch_rollback(model, items, n, alloc0);
            if (alloc0 != alloc_stack) free(alloc0);
            return kipp_err(err, errlen, KIPP_ENUMERIC,
                            "item %zu: logit %zu (row %zu, token %zu) is %g, expected a finite value",
                            i, bad, bad / vocab, bad % vocab, (double)items[i].logits[bad]);
        }
    }
    if (alloc0 != alloc_stack) free(alloc0);
    if (model->pool) kipp_pool_batch_commit(items, n);
    for (size_t i = 0; i < n; i++) items[i].session->length += items[i].token_count;
    return 0;
}

int kipp_session_eval_n(kipp_session *s, const uint32_t *tokens, uint32_t n, uint32_t logits_count,
                        float *logits, char *err, size_t errlen)
{
    if (!s) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_eval_n: session is NULL");
    if (logits_count == 0 || logits_count > n)
        return kipp_err(err, errlen, KIPP_EINVAL, "%u logits rows requested for %u tokens, expected 1..%u",
                        logits_count, n, n);
    kipp_batch_item it = {s, tokens, n, logits_count, logits, NULL};
    return kipp_eval_batch(s->model, &it, 1, err, errlen);
}

int kipp_session_eval(kipp_session *s, const uint32_t *tokens, uint32_t n, float *logits, char *err,
                      size_t errlen)
{
    if (!s) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_eval: session is NULL");
    kipp_batch_item it = {s, tokens, n, logits ? 1u : 0u, logits, NULL};
    return kipp_eval_batch(s->model, &it, 1, err, errlen);
}

int kipp_session_eval_text(kipp_session *s, const char *text, size_t len, int flags, float *logits,
                           char *err, size_t errlen)
{
    if (!s || (!text && len)) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_session_eval_text: NULL session or text");
    size_t cap = len + 16, n = 0; /* byte-level BPE: at most one token per byte */
    uint32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory tokenizing %zu bytes", len);
    int rc = kipp_tokenize(s->model, text ? text : "", len, flags, ids, cap, &n, err, errlen);
    if (rc == KIPP_ERANGE && n > cap) { /* defensive: retry with the size the tokenizer asked for */
        uint32_t *bigger = realloc(ids, n * sizeof *ids);
        if (!bigger) {
            free(ids);
            return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu token ids", n);
        }
        ids = bigger;
        cap = n;
        rc = kipp_tokenize(s->model, text, len, flags, ids, cap, &n, err, errlen);
    }
    if (!rc && n > UINT32_MAX) rc = kipp_err(err, errlen, KIPP_ERANGE, "text of %zu tokens is too long", n);
    if (!rc && n == 0) rc = kipp_err(err, errlen, KIPP_EINVAL, "text of %zu bytes produced 0 tokens, expected at least 1", len);
    if (!rc) rc = kipp_session_eval(s, ids, (uint32_t)n, logits, err, errlen);
    free(ids);
    return rc;
}
