/*
 * test_kv_pool_stress.c - randomized operations on a small pooled model,
 * checked after every step against a model of the expected state (the
 * invariant: eviction never frees a referenced block).
 *
 * Thousands of random open / match / eval / truncate / reset (publish) /
 * destroy operations run on a ref-backend fixture with a 12-block pool and up
 * to 5 sessions whose prompts share prefixes. The model here is written
 * independently of engine/kv_pool.c: published blocks are keyed by their
 * whole token prefix (not by hash), found by linear search, and the LRU is a
 * tick per entry. From it the test predicts, per operation, the adopted
 * length, whether the pool runs out (KIPP_ENOMEM) and which block is evicted,
 * and then checks every pool counter, every session's mapping (shared blocks
 * PUBLISHED with exactly the model's reference count, private blocks PRIVATE
 * and owned once), and - on sampled evaluations - that the logits equal a
 * fresh unpooled evaluation of the session's whole history, bitwise (the ref
 * backend does not depend on how tokens are grouped into calls). A referenced
 * block that was evicted and rewritten would fail that comparison.
 *
 * The pool's block events (kipp_model_set_kv_listener, what kipp-serve
 * --kv-events publishes) are mirrored as a router would index them: a stored
 * block must be new, its parent indexed and its hash the chain hash of its
 * ids; a removed block must be indexed and have no indexed child; after every
 * operation the index holds exactly the model's published prefixes. At the
 * end, kipp_model_pool_clear is refused while a session maps blocks, then
 * empties the pool and the index with one "all cleared" event.
 */
#include <string.h>

#include "engine/kv_pool.h"
#include "tests/fixture_model.h"
#include "tests/test_harness.h"

#define N_OPS 3000
#define POOL 7u
#define MAX_S 5
#define MAX_CAP 128u
#define MAX_ENT 64
#define B 32u

typedef struct {
    kipp_session *s;
    uint32_t cap, len;
    uint32_t t;                 /* template the session's prompt follows */
    uint32_t toks[MAX_CAP];
    uint32_t n_shared, n_alloc; /* model's view of the mapping */
} slot;

typedef struct {
    int live;
    uint32_t nb;                /* prefix length in blocks */
    uint32_t toks[MAX_CAP];     /* [nb*32] the prefix */
    uint32_t refs;
    uint64_t tick;              /* last time refs dropped to 0 (or published) */
} entry;

static fx_model *pf, *plain;
static slot sl[MAX_S];
static entry ent[MAX_ENT];
static uint32_t m_free = POOL;
static uint64_t m_clock, m_evict, m_hits, m_misses, m_enomem;
static uint32_t templ[3][MAX_CAP];
static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* The index a subscriber to the pool's events keeps. */
typedef struct {
    uint64_t hash, parent;
    int has_parent;
    uint32_t ids[B];
} ev_block;
static ev_block ix[MAX_ENT];
static int n_ix, n_cleared;

static int ix_find(uint64_t h)
{
    for (int i = 0; i < n_ix; i++)
        if (ix[i].hash == h) return i;
    return -1;
}

static void on_event(void *ctx, const kipp_kv_event *ev)
{
    (void)ctx;
    if (ev->kind == KIPP_KV_EVENT_STORED) {
        uint64_t want = kipp_kv_pool_hash(ev->has_parent ? ev->parent_hash : KIPP_POOL_ROOT_HASH, ev->token_ids);
        CHECK(ev->block_tokens == B && ev->hash == want && ix_find(ev->hash) < 0 && n_ix < MAX_ENT &&
                  (!ev->has_parent || ix_find(ev->parent_hash) >= 0),
              "stored event: hash %llx (chain hash %llx), already indexed %d, parent indexed %d",
              (unsigned long long)ev->hash, (unsigned long long)want, ix_find(ev->hash) >= 0,
              ev->has_parent ? ix_find(ev->parent_hash) >= 0 : 1);
        if (n_ix >= MAX_ENT) return;
        ix[n_ix] = (ev_block){.hash = ev->hash, .parent = ev->parent_hash, .has_parent = ev->has_parent};
        memcpy(ix[n_ix++].ids, ev->token_ids, sizeof ix[0].ids);
    } else if (ev->kind == KIPP_KV_EVENT_REMOVED) {
        int i = ix_find(ev->hash), child = 0;
        for (int j = 0; j < n_ix; j++) child |= ix[j].has_parent && ix[j].parent == ev->hash;
        CHECK(i >= 0 && !child, "removed event: hash %llx indexed %d, an indexed child names it %d",
              (unsigned long long)ev->hash, i >= 0, child);
        if (i >= 0) ix[i] = ix[--n_ix];
    } else {
        CHECK(ev->kind == KIPP_KV_EVENT_CLEARED, "unknown event kind %d", (int)ev->kind);
        n_ix = 0, n_cleared++;
    }
}

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return n ? (uint32_t)(rng % n) : 0;
}

static uint32_t blocks_for(uint32_t t) { return (t + B - 1) / B; }

/* The entry holding prefix toks[0..nb*32), or -1. */
static int find(const uint32_t *toks, uint32_t nb)
{
    for (int e = 0; e < MAX_ENT; e++)
        if (ent[e].live && ent[e].nb == nb && !memcmp(ent[e].toks, toks, nb * B * sizeof *toks)) return e;
    return -1;
}

static int has_child(int e)
{
    for (int c = 0; c < MAX_ENT; c++)
        if (ent[c].live && ent[c].nb == ent[e].nb + 1 && !memcmp(ent[c].toks, ent[e].toks, ent[e].nb * B * sizeof(uint32_t)))
            return 1;
    return 0;
}

static uint32_t m_unref_count(void)
{
    uint32_t n = 0;
    for (int e = 0; e < MAX_ENT; e++) n += ent[e].live && ent[e].refs == 0;
    return n;
}

/* Model allocation: a free block, else evict the least recently used unreferenced leaf. */
static void m_alloc(void)
{
    if (m_free) {
        m_free--;
        return;
    }
    int best = -1;
    for (int e = 0; e < MAX_ENT; e++)
        if (ent[e].live && ent[e].refs == 0 && !has_child(e) && (best < 0 || ent[e].tick < ent[best].tick)) best = e;
    CHECK(best >= 0, "model: allocation with nothing evictable");
    if (best >= 0) ent[best].live = 0, m_evict++;
}

static void m_unref(slot *x, uint32_t b)
{
    int e = find(x->toks, b + 1);
    CHECK(e >= 0, "model: shared block %u has no entry", b);
    if (e >= 0 && --ent[e].refs == 0) ent[e].tick = ++m_clock;
}

/* Unmap [from, n_alloc) as session_pool.c's unmap_from does, in the model. */
static void m_unmap_from(slot *x, uint32_t from)
{
    for (uint32_t b = from; b < x->n_alloc; b++) {
        if (b < x->n_shared) m_unref(x, b);
        else m_free++;
    }
    if (x->n_shared > from) x->n_shared = from;
    if (x->n_alloc > from) x->n_alloc = from;
}

static void m_release(slot *x)
{
    uint32_t full = x->len / B;
    for (uint32_t b = x->n_shared; b < full; b++) { /* publish the private full blocks */
        int e = find(x->toks, b + 1);
        if (e >= 0) { /* duplicate: the private copy is freed, the shared one mapped */
            m_free++;
            ent[e].refs++;
        } else {
            for (e = 0; e < MAX_ENT && ent[e].live; e++) {}
            CHECK(e < MAX_ENT, "model: entry table full");
            if (e == MAX_ENT) return;
            ent[e] = (entry){1, b + 1, {0}, 1, 0};
            memcpy(ent[e].toks, x->toks, (b + 1) * B * sizeof(uint32_t));
        }
        x->n_shared = b + 1;
    }
    m_unmap_from(x, 0);
    x->len = 0;
}

/* Compare everything observable with the model. */
/* The event index holds exactly the model's published prefixes. */
static void check_index(int op)
{
    int pub = 0;
    for (int e = 0; e < MAX_ENT; e++) {
        if (!ent[e].live) continue;
        pub++;
        uint64_t h = KIPP_POOL_ROOT_HASH;
        for (uint32_t b = 0; b < ent[e].nb; b++) h = kipp_kv_pool_hash(h, ent[e].toks + b * B);
        int i = ix_find(h);
        CHECK(i >= 0 && !memcmp(ix[i].ids, ent[e].toks + (ent[e].nb - 1) * B, sizeof ix[i].ids),
              "op %d: published prefix of %u blocks is %s in the event index", op, ent[e].nb, i < 0 ? "missing" : "wrong");
    }
    CHECK(n_ix == pub, "op %d: the event index holds %d blocks, the pool publishes %d", op, n_ix, pub);
}

static void check_state(int op)
{
    check_index(op);
    kipp_pool_stats st;
    kipp_model_pool_stats(&pf->model, &st);
    uint32_t priv = 0, pub = 0, refd = 0;
    for (int i = 0; i < MAX_S; i++) priv += sl[i].s ? sl[i].n_alloc - sl[i].n_shared : 0;
    for (int e = 0; e < MAX_ENT; e++) pub += ent[e].live, refd += ent[e].live && ent[e].refs;
    CHECK(st.blocks_free == m_free && st.blocks_private == priv && st.blocks_published == pub &&
              st.blocks_referenced == refd && st.evictions == m_evict && st.hits == m_hits && st.misses == m_misses,
          "op %d: pool free %llu private %llu published %llu referenced %llu evictions %llu hits %llu misses %llu; "
          "model %u %u %u %u %llu %llu %llu", op, (unsigned long long)st.blocks_free, (unsigned long long)st.blocks_private,
          (unsigned long long)st.blocks_published, (unsigned long long)st.blocks_referenced, (unsigned long long)st.evictions,
          (unsigned long long)st.hits, (unsigned long long)st.misses, m_free, priv, pub, refd, (unsigned long long)m_evict,
          (unsigned long long)m_hits, (unsigned long long)m_misses);
    uint8_t owner[POOL];
    memset(owner, 0, sizeof owner);
    for (int i = 0; i < MAX_S; i++) {
        slot *x = &sl[i];
        if (!x->s) continue;
        CHECK(kipp_session_length(x->s) == x->len && x->s->n_shared == x->n_shared && x->s->n_alloc == x->n_alloc,
              "op %d session %d: length %u shared %u mapped %u; model %u %u %u", op, i, kipp_session_length(x->s),
              x->s->n_shared, x->s->n_alloc, x->len, x->n_shared, x->n_alloc);
        for (uint32_t b = 0; b < x->s->n_alloc && b < x->s->n_blocks; b++) {
            uint32_t pb = x->s->block_table[b];
            if (b < x->n_shared) {
                int e = find(x->toks, b + 1);
                CHECK(kipp_kv_pool_state(pf->model.pool, pb) == KIPP_BLOCK_PUBLISHED && e >= 0 &&
                          kipp_kv_pool_refs(pf->model.pool, pb) == ent[e].refs,
                      "op %d session %d: shared block %u -> %u is state %d refs %u; model refs %u", op, i, b, pb,
                      kipp_kv_pool_state(pf->model.pool, pb), kipp_kv_pool_refs(pf->model.pool, pb), e >= 0 ? ent[e].refs : 0);
            } else {
                CHECK(pb < POOL && kipp_kv_pool_state(pf->model.pool, pb) == KIPP_BLOCK_PRIVATE && !owner[pb],
                      "op %d session %d: private block %u -> %u is state %d, owned twice: %d", op, i, b, pb,
                      kipp_kv_pool_state(pf->model.pool, pb), pb < POOL ? owner[pb] : -1);
                if (pb < POOL) owner[pb] = 1;
            }
        }
    }
}

/* Logits of a fresh unpooled session over the whole history toks[len]. */
static void oracle_check(const slot *x, const float *got, int op)
{
    kipp_session *u = NULL;
    float want[FX_VOCAB];
    if (kipp_session_create(&plain->model, MAX_CAP, &u, NULL, 0) || kipp_session_eval(u, x->toks, x->len, want, NULL, 0)) {
        CHECK(0, "op %d: oracle evaluation failed", op);
    } else {
        CHECK(!memcmp(got, want, sizeof want), "op %d: logits after %u tokens differ from unpooled evaluation", op, x->len);
    }
    kipp_session_destroy(u);
}

static void op_open(slot *x)
{
    static const uint32_t caps[3] = {64, 100, MAX_CAP};
    x->cap = caps[rnd(3)];
    x->t = rnd(3);
    x->len = x->n_shared = x->n_alloc = 0;
    CHECK(kipp_session_create(&pf->model, x->cap, &x->s, NULL, 0) == 0, "open");
}

static void op_match(slot *x)
{
    uint32_t t = rnd(3), n = rnd(MAX_CAP + 1), ids[MAX_CAP];
    memcpy(ids, templ[t], sizeof ids);
    x->t = t;
    if (rnd(3) == 0) ids[rnd(MAX_CAP)] = rnd(FX_VOCAB); /* a near miss */
    uint32_t max = (n < x->cap ? n : x->cap) / B, k = 0;
    while (k < max && find(ids, k + 1) >= 0) k++;
    int got = kipp_session_match_prefix(x->s, ids, n, NULL, 0);
    CHECK(got == (int)(k * B), "match of %u tokens adopted %d, model %u", n, got, k * B);
    for (uint32_t b = 0; b < k; b++) ent[find(ids, b + 1)].refs++;
    m_hits += k, m_misses += max - k;
    memcpy(x->toks, ids, k * B * sizeof *ids);
    x->len = k * B;
    x->n_shared = x->n_alloc = k;
}

static void op_eval(slot *x, int op)
{
    if (x->len == x->cap) return;
    uint32_t n = 1 + rnd(x->cap - x->len < 16 ? x->cap - x->len : 16), ids[16];
    for (uint32_t i = 0; i < n; i++) ids[i] = templ[x->t][x->len + i];
    if (rnd(10) == 0) ids[rnd(n)] = rnd(FX_VOCAB); /* a diverging turn */
    uint32_t need = blocks_for(x->len + n) > x->n_alloc ? blocks_for(x->len + n) - x->n_alloc : 0;
    int expect_fail = need > m_free + m_unref_count();
    float lg[FX_VOCAB];
    int rc = kipp_session_eval(x->s, ids, n, lg, NULL, 0);
    CHECK(rc == (expect_fail ? KIPP_ENOMEM : 0), "op %d: eval of %u needing %u blocks returned %d (model expects %s)", op, n,
          need, rc, expect_fail ? "ENOMEM" : "success");
    m_enomem += rc == KIPP_ENOMEM;
    if (rc) return;
    for (uint32_t i = 0; i < need; i++) m_alloc();
    x->n_alloc += need;
    memcpy(x->toks + x->len, ids, n * sizeof *ids);
    x->len += n;
    if (rnd(8) == 0) oracle_check(x, lg, op);
}

static void op_truncate(slot *x, int op)
{
    uint32_t n = rnd(x->len + 1), cut = n / B;
    int copy = n % B && cut < x->n_shared;
    int expect_fail = copy && m_free + m_unref_count() == 0;
    int rc = kipp_session_truncate(x->s, n, NULL, 0);
    CHECK(rc == (expect_fail ? KIPP_ENOMEM : 0), "op %d: truncate %u -> %u returned %d", op, x->len, n, rc);
    m_enomem += rc == KIPP_ENOMEM;
    if (rc) return;
    if (copy) { /* alloc first, then release cut+1.., then the cut block itself */
        m_alloc();
        m_unmap_from(x, cut + 1);
        m_unref(x, cut);
        x->n_shared = cut;
    } else {
        m_unmap_from(x, blocks_for(n));
    }
    x->len = n;
}

static void test_random_ops(void)
{
    int counts[6] = {0};
    for (int op = 0; op < N_OPS; op++) {
        slot *x = &sl[rnd(MAX_S)];
        int kind = rnd(100);
        if (!x->s) {
            op_open(x), counts[0]++;
        } else if (kind < 12 && x->len == 0) {
            op_match(x), counts[1]++;
        } else if (kind < 60) {
            op_eval(x, op), counts[2]++;
        } else if (kind < 75) {
            op_truncate(x, op), counts[3]++;
        } else if (kind < 90) {
            m_release(x);
            kipp_session_reset(x->s), counts[4]++;
        } else {
            m_release(x);
            kipp_session_destroy(x->s), x->s = NULL, counts[5]++;
        }
        check_state(op);
        if (th_cur_failed > 20) break;
    }
    printf("  ops: open %d, match %d, eval %d, truncate %d, reset %d, destroy %d; evictions %llu, hits %llu, misses %llu, "
           "pool exhausted %llu\n", counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], (unsigned long long)m_evict,
           (unsigned long long)m_hits, (unsigned long long)m_misses, (unsigned long long)m_enomem);
    CHECK(m_evict > 30 && m_hits > 30 && m_enomem > 10,
          "the run should exercise eviction, adoption and exhaustion (evictions %llu, hits %llu, exhausted %llu)",
          (unsigned long long)m_evict, (unsigned long long)m_hits, (unsigned long long)m_enomem);
    int mapped = 0;
    for (int i = 0; i < MAX_S; i++) mapped |= sl[i].s && sl[i].n_alloc;
    CHECK(mapped, "the run ends with sessions mapping blocks (the seeded sequence does), so the refusal below is tested");
    {
        char err[256] = "";
        CHECK(kipp_model_pool_clear(&pf->model, err, sizeof err) == KIPP_EINVAL && strstr(err, "cannot be cleared"),
              "clearing while sessions map blocks must be refused: %s", err);
    }
    for (int i = 0; i < MAX_S; i++)
        if (sl[i].s) m_release(&sl[i]), kipp_session_destroy(sl[i].s), sl[i].s = NULL;
    check_state(N_OPS);
    char err[256] = "";
    CHECK(kipp_model_pool_clear(&pf->model, err, sizeof err) == 0, "clear with no session: %s", err);
    for (int e = 0; e < MAX_ENT; e++) ent[e].live = 0;
    m_free = POOL;
    CHECK(n_cleared == 1 && n_ix == 0, "one all-cleared event empties the index: %d events, %d left", n_cleared, n_ix);
    check_state(N_OPS + 1);
}

int main(void)
{
    char err[256] = "";
    fx_rand_state = 0x1234567u;
    plain = fx_model_create("ref", err, sizeof err);
    fx_rand_state = 0x1234567u;
    pf = fx_model_create("ref", err, sizeof err);
    if (!plain || !pf || kipp_model_attach_pool(&pf->model, POOL, err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        return 1;
    }
    kipp_model_set_kv_listener(&pf->model, on_event, NULL);
    for (uint32_t t = 0; t < 3; t++) { /* three prompts sharing their first 40 tokens */
        fx_tokens(templ[t], MAX_CAP, 40 + t);
        if (t) memcpy(templ[t], templ[0], 40 * sizeof(uint32_t));
    }
    RUN(test_random_ops);
    kipp_kv_pool_destroy(pf->model.pool);
    pf->model.pool = NULL;
    fx_model_destroy(pf);
    fx_model_destroy(plain);
    return th_finish();
}
