/*
 * test_kv_pool.c - the pooled KV gates (seed 000 "Cross-session
 * prefix sharing": the --pooled-cpu gate's cases), on the ref and cpu
 * backends over the in-memory fixture model.
 *
 * The oracle is always unpooled evaluation: the same weights (two fixtures
 * built from the same random stream), the same calls, private KV. Pooled
 * identity, adopted prefixes, mixed batches and truncation must be bitwise
 * equal to it, and so is a mixed batch to isolated evaluation on both
 * backends (the cpu backend is row-invariant: test_invariance.c). The
 * randomized stress test is in test_kv_pool_stress.c.
 */
#include <string.h>

#include "engine/kv_pool.h"
#include "tests/fixture_model.h"
#include "tests/test_harness.h"

static const char *backend;  /* "ref" or "cpu" for the current round of tests */
static fx_model *plain;      /* unpooled oracle */

/* A fixture with the oracle's weights and a pool of n_blocks blocks. */
static fx_model *pooled_fixture(uint32_t n_blocks)
{
    char err[256] = "";
    fx_rand_state = 0x1234567u;
    fx_model *f = fx_model_create(backend, err, sizeof err);
    CHECK(f != NULL, "fixture: %s", err);
    if (!f) return NULL;
    int rc = kipp_model_attach_pool(&f->model, n_blocks, err, sizeof err);
    CHECK(rc == 0, "attach pool of %u blocks: %d %s", n_blocks, rc, err);
    return f;
}

static void pooled_free(fx_model *f)
{
    if (!f) return;
    kipp_kv_pool_destroy(f->model.pool);
    f->model.pool = NULL;
    fx_model_destroy(f);
}

static kipp_session *open_s(fx_model *f, uint32_t cap)
{
    kipp_session *s = NULL;
    char err[256] = "";
    int rc = kipp_session_create(&f->model, cap, &s, err, sizeof err);
    CHECK(rc == 0, "session create: %d %s", rc, err);
    return s;
}

/* Evaluate ids[n] with logits of the last position into out (may be NULL). */
static int ev(kipp_session *s, const uint32_t *ids, uint32_t n, float *out)
{
    char err[256] = "";
    int rc = kipp_session_eval(s, ids, n, out, err, sizeof err);
    CHECK(rc == 0, "eval of %u tokens at %u: %d %s", n, kipp_session_length(s), rc, err);
    return rc;
}

static int same(const float *a, const float *b, size_t rows)
{
    return memcmp(a, b, rows * FX_VOCAB * sizeof *a) == 0;
}

static kipp_pool_stats stats_of(const fx_model *f)
{
    kipp_pool_stats st;
    CHECK(kipp_model_pool_stats(&f->model, &st) == 0, "pool stats");
    return st;
}

/* Pooled sessions alone give the unpooled logits bitwise: prefill, decode, a second session. */
static void test_pooled_identity(void)
{
    fx_model *pf = pooled_fixture(40);
    uint32_t ids[110];
    fx_tokens(ids, 110, 3);
    float a[FX_VOCAB], b[FX_VOCAB];
    kipp_session *u = open_s(plain, FX_CTX), *p = open_s(pf, FX_CTX);
    if (!pf || !u || !p) goto out;
    ev(u, ids, 100, a), ev(p, ids, 100, b);
    CHECK(same(a, b, 1), "pooled prefill of 100 tokens differs from unpooled");
    for (uint32_t i = 100; i < 110; i++) {
        ev(u, ids + i, 1, a), ev(p, ids + i, 1, b);
        CHECK(same(a, b, 1), "pooled decode at %u differs from unpooled", i);
    }
    kipp_pool_stats st = stats_of(pf);
    CHECK(st.blocks_private == 4 && st.blocks_published == 0 && st.blocks_free == 36,
          "110 tokens: %llu private, %llu published, %llu free; expected 4, 0, 36", (unsigned long long)st.blocks_private,
          (unsigned long long)st.blocks_published, (unsigned long long)st.blocks_free);
out:
    kipp_session_destroy(u), kipp_session_destroy(p);
    pooled_free(pf);
}

/* Publish-at-finish, then adoption: continuing from an adopted 64-token prefix
 * equals an unpooled session that evaluated the same calls. */
static void test_adopted_prefix(void)
{
    fx_model *pf = pooled_fixture(40);
    uint32_t ids[120], other[80];
    fx_tokens(ids, 120, 5);
    fx_tokens(other, 80, 6);
    float a[FX_VOCAB], b[FX_VOCAB];
    kipp_session *u = open_s(plain, FX_CTX), *pub = open_s(pf, FX_CTX), *c = NULL;
    char err[256] = "";
    if (!pf || !u || !pub) goto out;
    ev(pub, ids, 64, NULL), ev(pub, ids + 64, 20, NULL); /* 84 tokens: 2 full blocks + a partial */
    CHECK(kipp_session_match_prefix(pub, ids, 64, err, sizeof err) == KIPP_EINVAL && strstr(err, "84"),
          "match on a non-empty session: '%s'", err);
    kipp_session_reset(pub); /* publishes blocks 0 and 1, frees the partial block */
    kipp_pool_stats st = stats_of(pf);
    CHECK(st.blocks_published == 2 && st.blocks_referenced == 0 && st.blocks_private == 0,
          "after reset: %llu published, %llu referenced, %llu private; expected 2, 0, 0",
          (unsigned long long)st.blocks_published, (unsigned long long)st.blocks_referenced, (unsigned long long)st.blocks_private);
    c = open_s(pf, FX_CTX);
    if (!c) goto out;
    int got = kipp_session_match_prefix(c, ids, 119, err, sizeof err);
    CHECK(got == 64 && kipp_session_length(c) == 64, "adopted %d tokens, length %u; expected 64", got, kipp_session_length(c));
    st = stats_of(pf);
    CHECK(st.hits == 2 && st.misses == 1 && st.blocks_referenced == 2, "hits %llu misses %llu referenced %llu; expected 2, 1, 2",
          (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.blocks_referenced);
    ev(u, ids, 64, NULL);
    ev(u, ids + 64, 36, a), ev(c, ids + 64, 36, b);
    CHECK(same(a, b, 1), "suffix after an adopted prefix differs from unpooled");
    for (uint32_t i = 100; i < 110; i++) {
        ev(u, ids + i, 1, a), ev(c, ids + i, 1, b);
        CHECK(same(a, b, 1), "decode at %u after an adopted prefix differs", i);
    }
    /* Another prompt shares nothing; a prompt that differs in its second block adopts one block. */
    kipp_session *d = open_s(pf, FX_CTX);
    CHECK(kipp_session_match_prefix(d, other, 80, NULL, 0) == 0, "unrelated prompt adopted something");
    kipp_session_destroy(d);
    uint32_t mix[96];
    memcpy(mix, ids, sizeof mix);
    mix[40] = (mix[40] + 1) % FX_VOCAB;
    d = open_s(pf, FX_CTX);
    CHECK(kipp_session_match_prefix(d, mix, 96, NULL, 0) == 32, "prompt differing at 40 should adopt 32 tokens");
    kipp_session_destroy(d);
    /* Capacity bounds adoption: a 40-token session adopts one block at most. */
    d = open_s(pf, 40);
    CHECK(kipp_session_match_prefix(d, ids, 119, NULL, 0) == 32, "40-token session should adopt 32 tokens");
    kipp_session_destroy(d);
out:
    kipp_session_destroy(u), kipp_session_destroy(pub), kipp_session_destroy(c);
    pooled_free(pf);
}

/* One kipp_eval_batch mixing a session on an adopted prefix with fresh ones. */
static void test_mixed_batch(void)
{
    fx_model *pf = pooled_fixture(40);
    uint32_t ids[3][100];
    for (uint32_t i = 0; i < 3; i++) fx_tokens(ids[i], 100, 20 + i);
    uint32_t len[3] = {36, 50, 7};
    float *lp = malloc(3 * FX_VOCAB * sizeof *lp), *lu = malloc(3 * FX_VOCAB * sizeof *lu), *li = malloc(3 * FX_VOCAB * sizeof *li);
    kipp_session *ps[3] = {0}, *us[3] = {0}, *is[3] = {0};
    if (!pf) goto out;
    kipp_session *pub = open_s(pf, FX_CTX);
    ev(pub, ids[0], 64, NULL);
    kipp_session_destroy(pub); /* destroy publishes too */
    for (int i = 0; i < 3; i++) ps[i] = open_s(pf, FX_CTX), us[i] = open_s(plain, FX_CTX), is[i] = open_s(plain, FX_CTX);
    CHECK(kipp_session_match_prefix(ps[0], ids[0], 99, NULL, 0) == 64, "adopt 64");
    ev(us[0], ids[0], 64, NULL), ev(is[0], ids[0], 64, NULL);
    uint32_t start[3] = {64, 0, 0};
    kipp_batch_item bp[3], bu[3];
    for (int i = 0; i < 3; i++) {
        bp[i] = (kipp_batch_item){ps[i], ids[i] + start[i], len[i], 1, lp + (size_t)i * FX_VOCAB, NULL};
        bu[i] = (kipp_batch_item){us[i], ids[i] + start[i], len[i], 1, lu + (size_t)i * FX_VOCAB, NULL};
    }
    char err[256] = "";
    CHECK(kipp_eval_batch(&pf->model, bp, 3, err, sizeof err) == 0, "pooled batch: %s", err);
    CHECK(kipp_eval_batch(&plain->model, bu, 3, err, sizeof err) == 0, "unpooled batch: %s", err);
    CHECK(same(lp, lu, 3), "pooled mixed batch differs from the same batch unpooled");
    for (int i = 0; i < 3; i++) ev(is[i], ids[i] + start[i], len[i], li + (size_t)i * FX_VOCAB);
    for (int i = 0; i < 3; i++) {
        const float *g = lp + (size_t)i * FX_VOCAB, *w = li + (size_t)i * FX_VOCAB;
        CHECK(same(g, w, 1), "%s: batched item %d differs from isolated", backend, i);
    }
out:
    for (int i = 0; i < 3; i++) kipp_session_destroy(ps[i]), kipp_session_destroy(us[i]), kipp_session_destroy(is[i]);
    free(lp), free(lu), free(li);
    pooled_free(pf);
}

/* A pool too small fails cleanly: KIPP_ENOMEM naming the need, nothing
 * appended, nothing mapped, logits untouched; room comes back on reset. */
static void test_exhaustion(void)
{
    fx_model *pf = pooled_fixture(4);
    uint32_t ids[200];
    fx_tokens(ids, 200, 9);
    float lg[FX_VOCAB];
    for (uint32_t i = 0; i < FX_VOCAB; i++) lg[i] = 12345.0f;
    char err[256] = "";
    kipp_session *a = open_s(pf, FX_CTX), *b = open_s(pf, FX_CTX);
    if (!pf || !a || !b) goto out;
    ev(a, ids, 100, NULL); /* 4 blocks: the whole pool */
    int rc = kipp_session_eval(a, ids + 100, 40, lg, err, sizeof err);
    CHECK(rc == KIPP_ENOMEM && strstr(err, "exhausted") && strstr(err, "1 more block"), "overflow: %d '%s'", rc, err);
    CHECK(kipp_session_length(a) == 100 && lg[0] == 12345.0f, "failed eval changed the session or logits");
    kipp_pool_stats st = stats_of(pf);
    CHECK(st.blocks_private == 4 && st.blocks_free == 0, "after failure: %llu private %llu free; expected 4, 0",
          (unsigned long long)st.blocks_private, (unsigned long long)st.blocks_free);
    rc = kipp_session_eval(b, ids, 1, lg, err, sizeof err);
    CHECK(rc == KIPP_ENOMEM && kipp_session_length(b) == 0, "second session: %d '%s'", rc, err);
    CHECK(kipp_session_pool_need(b, 40) == 2 && kipp_session_pool_need(a, 100) == 0 && kipp_session_pool_need(a, 129) == 1,
          "pool_need");
    kipp_session_reset(a); /* publishes 3 full blocks: evictable */
    st = stats_of(pf);
    CHECK(st.blocks_available == 4 && st.blocks_published == 3, "after reset: %llu available, %llu published",
          (unsigned long long)st.blocks_available, (unsigned long long)st.blocks_published);
    CHECK(ev(b, ids + 150, 40, lg) == 0, "evaluation after room came back");
    st = stats_of(pf);
    CHECK(st.evictions == 1 && st.blocks_published == 2, "evictions %llu published %llu; expected 1, 2",
          (unsigned long long)st.evictions, (unsigned long long)st.blocks_published);
    /* The least recently used leaf went: blocks 0 and 1 of the chain are still adoptable. */
    kipp_session *c = open_s(pf, FX_CTX);
    CHECK(kipp_session_match_prefix(c, ids, 128, NULL, 0) == 64, "chain head should survive eviction of its leaf");
    kipp_session_destroy(c);
out:
    kipp_session_destroy(a), kipp_session_destroy(b);
    pooled_free(pf);
}

/* Truncation touches only the private tail: into private blocks, at a
 * block boundary inside the shared prefix, and inside a shared block (copied). */
static void test_truncate(void)
{
    fx_model *pf = pooled_fixture(40);
    uint32_t ids[140];
    fx_tokens(ids, 140, 11);
    float a[FX_VOCAB], b[FX_VOCAB];
    char err[256] = "";
    kipp_session *pub = open_s(pf, FX_CTX), *p = NULL, *u = open_s(plain, FX_CTX), *q = NULL;
    if (!pf || !pub || !u) goto out;
    ev(pub, ids, 96, NULL);
    kipp_session_reset(pub); /* 3 published blocks */
    p = open_s(pf, FX_CTX);
    CHECK(kipp_session_match_prefix(p, ids, 139, NULL, 0) == 96, "adopt 96");
    ev(u, ids, 96, NULL);
    ev(p, ids + 96, 30, NULL), ev(u, ids + 96, 30, NULL);
    uint32_t cuts[4] = {110, 100, 64, 40}; /* private tail, private block edge, shared boundary, inside shared */
    for (int k = 0; k < 4; k++) {
        uint32_t n = cuts[k];
        CHECK(kipp_session_truncate(p, n, err, sizeof err) == 0, "pooled truncate to %u: %s", n, err);
        CHECK(kipp_session_truncate(u, n, err, sizeof err) == 0, "truncate to %u: %s", n, err);
        ev(p, ids + n, 126 - n, b), ev(u, ids + n, 126 - n, a);
        CHECK(same(a, b, 1), "re-evaluation after truncating to %u differs", n);
    }
    CHECK(kipp_session_truncate(p, 200, err, sizeof err) == KIPP_ERANGE && strstr(err, "200"), "truncate past length");
    /* The shared blocks were never written: a fresh adopter still matches the oracle. */
    q = open_s(pf, FX_CTX);
    CHECK(kipp_session_match_prefix(q, ids, 139, NULL, 0) == 96, "re-adopt 96 after truncations");
    kipp_session *u2 = open_s(plain, FX_CTX);
    ev(u2, ids, 96, NULL);
    ev(q, ids + 96, 4, b), ev(u2, ids + 96, 4, a);
    CHECK(same(a, b, 1), "shared blocks changed under truncation");
    kipp_session_destroy(u2);
out:
    kipp_session_destroy(pub), kipp_session_destroy(p), kipp_session_destroy(u), kipp_session_destroy(q);
    pooled_free(pf);
}

/* The unpooled API is unchanged: match_prefix adopts nothing, stats say ENOTSUP. */
static void test_unpooled_model(void)
{
    kipp_session *s = open_s(plain, 64);
    uint32_t ids[64];
    fx_tokens(ids, 64, 1);
    kipp_pool_stats st;
    CHECK(kipp_session_match_prefix(s, ids, 64, NULL, 0) == 0, "unpooled match");
    CHECK(kipp_model_pool_stats(&plain->model, &st) == KIPP_ENOTSUP && st.blocks_total == 0, "unpooled stats");
    CHECK(kipp_session_pool_need(s, 64) == 0, "unpooled need");
    kipp_session_destroy(s);
}

/* kipp_model_open_pooled / kipp_model_enable_pool on a converted file: sizes and refusals. */
static void test_open_pooled(void)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = NULL;
    int rc = kipp_model_open_pooled(path, "none", NULL, 16, &m, err, sizeof err);
    CHECK(rc == KIPP_ENOTSUP && m == NULL && strstr(err, "none"), "backend none: %d '%s'", rc, err);
    rc = kipp_model_open_pooled(path, "ref", NULL, 1ull << 30, &m, err, sizeof err); /* 2^32 blocks of 256 KiB */
    CHECK(rc == KIPP_ERANGE && m == NULL && strstr(err, "4294967296 blocks"), "huge pool: %d '%s'", rc, err);
    rc = kipp_model_open_pooled(path, "ref", NULL, 1, &m, err, sizeof err); /* 8 KiB per position: 4 blocks */
    CHECK(rc == 0, "open pooled: %d %s", rc, err);
    if (rc) return;
    kipp_model_info info;
    kipp_pool_stats st;
    kipp_model_get_info(m, &info);
    CHECK(info.kv_pool_blocks == 4 && kipp_model_pool_stats(m, &st) == 0 && st.blocks_total == 4 && st.block_tokens == 32,
          "1 MiB pool: %u blocks, expected 4", info.kv_pool_blocks);
    CHECK(kipp_model_enable_pool(m, 1, err, sizeof err) == KIPP_EINVAL && strstr(err, "already"), "second pool: '%s'", err);
    kipp_model_close(m);
    CHECK(kipp_model_open(path, "ref", NULL, &m, err, sizeof err) == 0, "open: %s", err);
    kipp_session *s = NULL;
    CHECK(kipp_session_create(m, 64, &s, NULL, 0) == 0, "session");
    rc = kipp_model_enable_pool(m, 0, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "1 sessions"), "enable with a live session: %d '%s'", rc, err);
    kipp_session_destroy(s);
    rc = kipp_model_enable_pool(m, 0, err, sizeof err); /* 0: one full context, 4096 / 32 blocks */
    kipp_model_get_info(m, &info);
    CHECK(rc == 0 && info.kv_pool_blocks == 128, "default pool: %d, %u blocks, expected 128 (%s)", rc, info.kv_pool_blocks, err);
    kipp_model_close(m);
}

/* A block's chain hash names its KV type: the same ids under another type's root never match, so
 * a block (or a disk file named by its hash) of one type is never adopted by a session of another. */
static void test_kv_type_roots(void)
{
    uint32_t ids[32];
    fx_tokens(ids, 32, 9);
    uint64_t rb = kipp_kv_pool_root(KIPP_KV_BF16), rq = kipp_kv_pool_root(KIPP_KV_Q8_0);
    CHECK(rb == KIPP_POOL_ROOT_HASH, "bf16 root %llx changed (older pools and disk files)", (unsigned long long)rb);
    CHECK(rq != rb && kipp_kv_pool_hash(rq, ids) != kipp_kv_pool_hash(rb, ids), "q8_0 and bf16 chain hashes collide");
}

int main(void)
{
    RUN(test_open_pooled);
    RUN(test_kv_type_roots);
    const char *backends[2] = {"ref", "cpu"};
    for (int i = 0; i < 4; i++) {
        backend = backends[i % 2];
        fx_kv_type = i < 2 ? KIPP_KV_BF16 : KIPP_KV_Q8_0;
        printf("-- backend %s, %s KV\n", backend, kipp_kv_type_name(fx_kv_type));
        char err[256] = "";
        fx_rand_state = 0x1234567u;
        plain = fx_model_create(backend, err, sizeof err);
        if (!plain) {
            fprintf(stderr, "fixture (%s): %s\n", backend, err);
            return 1;
        }
        RUN(test_pooled_identity);
        RUN(test_adopted_prefix);
        RUN(test_mixed_batch);
        RUN(test_exhaustion);
        RUN(test_truncate);
        RUN(test_unpooled_model);
        fx_model_destroy(plain);
    }
    return th_finish();
}
