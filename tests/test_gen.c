/*
 * test_gen.c - kipp_gen, the one generation step the CLI and kipp-serve share
 * (engine/gen.c).
 *
 * The oracle is the loop kipp_gen replaced, written here from the public
 * primitives: prefill with one kipp_session_eval, then kipp_sample_ex on each
 * row with prompt + output as history, one kipp_session_eval per token, stop at
 * a stop id, at max_tokens or when the session is full; the text is the
 * detokenizer stream of the emitted ids, cut before the first stop string.
 * A gen must give the same ids, text and finish for greedy and seeded
 * sampling with penalties, for any prefill chunking, with or without
 * speculative drafts, and batched with other gens in one kipp_eval_batch, on
 * the "ref" (scalar oracle) and "cpu" backends of synthetic-tiny.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "tests/test_harness.h"

#define MAXG 48

static kipp_model *model;

typedef struct {
    uint32_t ids[MAXG + 1];
    uint32_t n;
    int finish;
    int stop_index;           /* kipp_gen_stop_index (run_batch only) */
    char text[4096];
    size_t text_len;
} run_out;

static void tokenize(const char *s, uint32_t *ids, size_t *n)
{
    CHECK(kipp_tokenize(model, s, strlen(s), 0, ids, 256, n, NULL, 0) == 0 && *n > 0, "tokenize '%s'", s);
}

/* Text of ids through a fresh detokenizer stream, flushed. */
static size_t detok_all(const uint32_t *ids, uint32_t n, char *out, size_t cap)
{
    kipp_detok_stream *ds = kipp_detok_stream_create(model);
    size_t len = 0, k = 0;
    for (uint32_t i = 0; i < n; i++) {
        CHECK(kipp_detok_stream_push(ds, ids[i], out + len, cap - len, &k, NULL, 0) == 0, "push");
        len += k;
    }
    CHECK(kipp_detok_stream_flush(ds, out + len, cap - len, &k) == 0, "flush");
    kipp_detok_stream_destroy(ds);
    return len + k;
}

/* The oracle loop: prompt[n] in a session of capacity cap. */
static void oracle(const uint32_t *prompt, size_t n, uint32_t cap, const kipp_gen_options *o, run_out *r)
{
    kipp_model_info info;
    kipp_model_get_info(model, &info);
    float *lg = malloc((size_t)info.vocab_size * sizeof *lg);
    uint32_t hist[512];
    memcpy(hist, prompt, n * sizeof *hist);
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    kipp_session *s = NULL;
    memset(r, 0, sizeof *r);
    CHECK(kipp_session_create(model, cap, &s, NULL, 0) == 0, "session");
    CHECK(kipp_session_eval(s, prompt, (uint32_t)n, lg, NULL, 0) == 0, "prefill");
    for (;;) {
        kipp_sample_params p = o->sp;
        p.history = hist, p.history_len = n + r->n, p.n_prompt_history = n;
        uint32_t t;
        CHECK(kipp_sample_ex(lg, info.vocab_size, &p, &rng, &t, NULL, 0) == 0, "sample");
        if (t == info.stop_ids[0] || (info.n_stop > 1 && t == info.stop_ids[1])) {
            r->finish = KIPP_FIN_STOP;
            break;
        }
        hist[n + r->n] = t;
        r->ids[r->n++] = t;
        if (o->max_tokens && r->n >= o->max_tokens) { r->finish = KIPP_FIN_LENGTH; break; }
        if (kipp_session_length(s) >= cap) { r->finish = KIPP_FIN_FULL; break; }
        CHECK(kipp_session_eval(s, &t, 1, lg, NULL, 0) == 0, "decode");
    }
    r->text_len = detok_all(r->ids, r->n, r->text, sizeof r->text);
    kipp_session_destroy(s);
    free(lg);
}

/* Several gens stepped together, one kipp_eval_batch per step, each with its own chunk size. */
static void run_batch(int k, const uint32_t *const *prompts, const size_t *n, uint32_t cap, const kipp_gen_options *o,
                      const uint32_t *chunk, run_out *r)
{
    kipp_session *s[4] = {0};
    kipp_gen *g[4] = {0};
    char err[256] = "";
    for (int i = 0; i < k; i++) {
        memset(&r[i], 0, sizeof r[i]);
        CHECK(kipp_session_create(model, cap, &s[i], NULL, 0) == 0, "session");
        CHECK(kipp_gen_create(model, s[i], prompts[i], n[i], &o[i], &g[i], err, sizeof err) == 0, "gen: %s", err);
    }
    for (int steps = 0; steps < 4 * MAXG + 64; steps++) {
        kipp_batch_item items[4];
        int m = 0, who[4];
        for (int i = 0; i < k; i++) {
            if (!g[i] || kipp_gen_finished(g[i])) continue;
            CHECK(kipp_gen_next(g[i], chunk[i], &items[m], err, sizeof err) == 0, "next: %s", err);
            who[m++] = i;
        }
        if (!m) break;
        CHECK(kipp_eval_batch(model, items, (size_t)m, err, sizeof err) == 0, "batch: %s", err);
        for (int q = 0; q < m; q++) {
            kipp_gen_event ev;
            run_out *ro = &r[who[q]];
            CHECK(kipp_gen_advance(g[who[q]], 0.001, &ev, err, sizeof err) == 0, "advance: %s", err);
            for (uint32_t t = 0; t < ev.n_tokens && ro->n < MAXG + 1; t++) ro->ids[ro->n++] = ev.tokens[t];
        }
    }
    for (int i = 0; i < k; i++) {
        const char *p;
        size_t len, fin;
        kipp_gen_text(g[i], &p, &len, &fin);
        CHECK(fin == len, "finished text not all final: %zu of %zu", fin, len);
        r[i].finish = kipp_gen_finished(g[i]);
        r[i].stop_index = kipp_gen_stop_index(g[i]);
        r[i].text_len = len < sizeof r[i].text ? len : sizeof r[i].text;
        memcpy(r[i].text, p, r[i].text_len);
        kipp_gen_destroy(g[i]);
        kipp_session_destroy(s[i]);
    }
}

static void same(const run_out *a, const run_out *b, const char *what)
{
    CHECK(a->n == b->n && !memcmp(a->ids, b->ids, a->n * sizeof *a->ids), "%s: %u ids vs the oracle's %u", what, a->n,
          b->n);
    CHECK(a->finish == b->finish, "%s: finish %d vs the oracle's %d", what, a->finish, b->finish);
    CHECK(a->text_len == b->text_len && !memcmp(a->text, b->text, a->text_len), "%s: text differs (%zu vs %zu bytes)",
          what, a->text_len, b->text_len);
}

static kipp_gen_options greedy(uint32_t max_tokens)
{
    return (kipp_gen_options){.sp = kipp_sample_params_default(), .max_tokens = max_tokens, .seed = 3};
}

static kipp_gen_options seeded(uint32_t max_tokens, uint64_t seed)
{
    kipp_gen_options o = greedy(max_tokens);
    o.sp.temperature = 0.9f, o.sp.top_k = 40, o.sp.top_p = 0.95f, o.sp.repetition_penalty = 1.1f;
    o.sp.frequency_penalty = 0.3f, o.seed = seed;
    return o;
}

/* One gen against the oracle, prefilled in chunks of 1, 5 and all at once. */
static void test_matches_oracle(void)
{
    uint32_t ids[256];
    size_t n;
    tokenize("The quick brown fox jumps over the lazy dog, again and again.", ids, &n);
    const uint32_t *pp[1] = {ids};
    kipp_gen_options opts[3] = {greedy(40), seeded(40, 11), seeded(30, 12)};
    for (int oi = 0; oi < 3; oi++) {
        run_out want, got;
        oracle(ids, n, 256, &opts[oi], &want);
        uint32_t chunks[] = {1, 5, UINT32_MAX};
        for (int ci = 0; ci < 3; ci++) {
            char what[64];
            snprintf(what, sizeof what, "options %d chunk %u", oi, chunks[ci]);
            run_batch(1, pp, &n, 256, &opts[oi], &chunks[ci], &got);
            same(&got, &want, what);
        }
    }
}

/* Three gens in one batch per step, each equal to its isolated oracle; greedy ones speculate. */
static void test_batched_and_spec(void)
{
    uint32_t a[256], b[256], c[256];
    size_t n[3];
    tokenize("one two three one two three one two three one two", a, &n[0]);
    tokenize("Hello there", b, &n[1]);
    tokenize("A long prompt that needs several chunks to prefill, with commas, and more words.", c, &n[2]);
    const uint32_t *pp[3] = {a, b, c};
    kipp_gen_options o[3] = {greedy(MAXG), seeded(MAXG, 99), greedy(20)};
    o[0].spec = o[2].spec = 1;
    o[2].spec_opts.fixed_k = 1, o[2].spec_opts.k_max = 4;
    uint32_t chunk[3] = {7, 3, 16};
    run_out want[3], got[3];
    for (int i = 0; i < 3; i++) oracle(pp[i], n[i], 200, &o[i], &want[i]);
    run_batch(3, pp, n, 200, o, chunk, got);
    for (int i = 0; i < 3; i++) {
        char what[32];
        snprintf(what, sizeof what, "batched gen %d", i);
        same(&got[i], &want[i], what);
    }
}

/* Stop strings cut the text before their first occurrence; max_tokens, a full session and a stop id end it. */
static void test_finishes(void)
{
    uint32_t ids[256];
    size_t n;
    tokenize("Stop strings are matched incrementally.", ids, &n);
    const uint32_t *pp[1] = {ids};
    uint32_t all = UINT32_MAX;
    kipp_gen_options o = greedy(MAXG);
    run_out want, got;
    oracle(ids, n, 256, &o, &want);
    CHECK(want.text_len >= 12, "oracle text too short for a stop string: %zu", want.text_len);
    char stop[8] = "";
    memcpy(stop, want.text + want.text_len / 2, 3); /* a string the reply is known to contain */
    const char *stops[] = {"\x01never", stop};
    o.stop = stops, o.n_stop = 2;
    run_batch(1, pp, &n, 256, &o, &all, &got);
    size_t cut = (size_t)(strstr(want.text, stop) - want.text);
    CHECK(got.finish == KIPP_FIN_STOP && got.text_len == cut && !memcmp(got.text, want.text, cut),
          "stop '%s': finish %d, %zu bytes, expected a cut at %zu", stop, got.finish, got.text_len, cut);
    CHECK(got.stop_index == 1, "stop '%s' is stops[1], kipp_gen_stop_index says %d", stop, got.stop_index);
    o = greedy(0); /* until the session is full */
    oracle(ids, n, (uint32_t)n + 9, &o, &want);
    run_batch(1, pp, &n, (uint32_t)n + 9, &o, &all, &got);
    same(&got, &want, "full session");
    CHECK(got.finish == KIPP_FIN_FULL || got.finish == KIPP_FIN_STOP, "full: finish %d", got.finish);
    kipp_model_info info;
    kipp_model_get_info(model, &info);
    kipp_logit_bias force = {info.stop_ids[0], 1e4f};
    o = greedy(MAXG);
    o.sp.logit_bias = &force, o.sp.n_logit_bias = 1;
    run_batch(1, pp, &n, 256, &o, &all, &got);
    CHECK(got.finish == KIPP_FIN_STOP && got.n == 0 && got.text_len == 0, "forced stop id: finish %d, %u ids", got.finish,
          got.n);
    CHECK(got.stop_index == -1, "a stop id is no stop string, kipp_gen_stop_index says %d", got.stop_index);
}

/* Echo rows: a row for every prompt position, equal to kipp_session_eval_n's. */
static void test_prompt_rows(void)
{
    uint32_t ids[256];
    size_t n;
    tokenize("Rows for every prompt position, please, all of them.", ids, &n);
    kipp_model_info info;
    kipp_model_get_info(model, &info);
    size_t V = info.vocab_size;
    float *want = malloc(n * V * sizeof *want);
    kipp_session *s = NULL, *t = NULL;
    CHECK(kipp_session_create(model, 128, &s, NULL, 0) == 0 && kipp_session_create(model, 128, &t, NULL, 0) == 0, "sessions");
    CHECK(kipp_session_eval_n(s, ids, (uint32_t)n, (uint32_t)n, want, NULL, 0) == 0, "eval_n");
    kipp_gen_options o = greedy(2);
    o.prompt_rows = 1;
    kipp_gen *g = NULL;
    CHECK(kipp_gen_create(model, t, ids, n, &o, &g, NULL, 0) == 0, "gen");
    uint32_t seen = 0;
    while (kipp_gen_prompt_left(g)) {
        kipp_batch_item it;
        kipp_gen_event ev;
        CHECK(kipp_gen_next(g, 1000, &it, NULL, 0) == 0 && it.token_count <= KIPP_GEN_ROWS_CHUNK, "chunk %u", it.token_count);
        CHECK(kipp_eval_batch(model, &it, 1, NULL, 0) == 0 && kipp_gen_advance(g, 0, &ev, NULL, 0) == 0, "step");
        CHECK(ev.n_rows == ev.n_prompt && ev.first_pos == seen, "rows %u of %u at %u", ev.n_rows, ev.n_prompt, ev.first_pos);
        double e = th_nmse(ev.logits, want + (size_t)seen * V, (size_t)ev.n_rows * V);
        CHECK(e <= 1e-10, "prompt rows from %u: nmse %g against kipp_session_eval_n", seen, e);
        seen += ev.n_prompt;
    }
    CHECK(seen == n, "rows for %u of %zu positions", seen, n);
    kipp_gen_destroy(g);
    kipp_session_destroy(s), kipp_session_destroy(t);
    free(want);
}

/* Bad input gets an error that names the value. */
static void test_errors(void)
{
    uint32_t ids[4] = {1, 2, 3, 4};
    kipp_session *s = NULL;
    kipp_gen *g = (kipp_gen *)1;
    char err[256] = "";
    CHECK(kipp_session_create(model, 64, &s, NULL, 0) == 0, "session");
    kipp_gen_options o = greedy(4);
    CHECK(kipp_gen_create(model, s, ids, 0, &o, &g, err, sizeof err) == KIPP_EINVAL && !g, "empty prompt");
    const char *empty[] = {""};
    o.stop = empty, o.n_stop = 1;
    CHECK(kipp_gen_create(model, s, ids, 4, &o, &g, err, sizeof err) == KIPP_EINVAL && strstr(err, "0 bytes"),
          "empty stop string: '%s'", err);
    o.n_stop = KIPP_GEN_MAX_STOP + 1;
    CHECK(kipp_gen_create(model, s, ids, 4, &o, &g, err, sizeof err) == KIPP_EINVAL && strstr(err, "17"), "17 stops: '%s'", err);
    o = greedy(4);
    CHECK(kipp_session_eval(s, ids, 4, NULL, NULL, 0) == 0, "fill");
    CHECK(kipp_gen_create(model, s, ids, 4, &o, &g, err, sizeof err) == KIPP_EINVAL && strstr(err, "holds 4"),
          "session holding the whole prompt: '%s'", err);
    kipp_session_reset(s);
    /* a session of another open model (the same file, opened twice): its items would run on that model */
    char path[512];
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *other = NULL;
    kipp_session *os = NULL;
    CHECK(kipp_model_open(path, "ref", NULL, &other, err, sizeof err) == 0, "second model: %s", err);
    CHECK(other && kipp_session_create(other, 64, &os, err, sizeof err) == 0, "its session: %s", err);
    CHECK(kipp_gen_create(model, os, ids, 4, &o, &g, err, sizeof err) == KIPP_EINVAL && !g && strstr(err, "another model"),
          "session of another model: '%s'", err);
    CHECK(kipp_gen_create(model, s, ids, 4, &o, &g, err, sizeof err) == 0, "create: %s", err);
    CHECK(kipp_gen_rebind(g, os, err, sizeof err) == KIPP_EINVAL && strstr(err, "another model"),
          "rebind to a session of another model: '%s'", err);
    kipp_session_destroy(os);
    kipp_model_close(other);
    kipp_batch_item it;
    kipp_gen_event ev;
    CHECK(kipp_gen_next(g, 0, &it, err, sizeof err) == KIPP_EINVAL && strstr(err, "4 prompt tokens"), "max_prefill 0: '%s'", err);
    CHECK(kipp_gen_advance(g, 0, &ev, err, sizeof err) == KIPP_EINVAL && strstr(err, "no item"), "advance first: '%s'", err);
    kipp_gen_cancel(g);
    CHECK(kipp_gen_finished(g) == KIPP_FIN_CANCELLED, "cancel: %d", kipp_gen_finished(g));
    CHECK(kipp_gen_next(g, 8, &it, err, sizeof err) == 0 && it.token_count == 0, "a finished gen has no item");
    kipp_gen_destroy(g);
    kipp_gen_destroy(NULL);
    kipp_session_destroy(s);
}

/* One gen moved to a new session before steps at[0..n_at) (a scheduler's
 * preemption): the new session holds the first keep_pct% of the tokens the gen
 * allows (as kipp_session_match_prefix would adopt them), evaluated directly. */
static void run_moved(const uint32_t *prompt, size_t n, const kipp_gen_options *o, uint32_t chunk, const int *at, int n_at,
                      int keep_pct, run_out *r)
{
    kipp_session *s = NULL;
    kipp_gen *g = NULL;
    char err[256] = "";
    memset(r, 0, sizeof *r);
    CHECK(kipp_session_create(model, 256, &s, NULL, 0) == 0, "session");
    CHECK(kipp_gen_create(model, s, prompt, n, o, &g, err, sizeof err) == 0, "gen: %s", err);
    uint32_t refilled = 0;
    for (int step = 0, a = 0; step < 4 * MAXG + 64 && !kipp_gen_finished(g); step++) {
        if (a < n_at && at[a] == step) {
            uint32_t most, keep;
            const uint32_t *toks = kipp_gen_tokens(g, &most);
            kipp_session *t = NULL;
            keep = most * (uint32_t)keep_pct / 100;
            CHECK(kipp_session_create(model, 256, &t, NULL, 0) == 0, "new session");
            if (keep) CHECK(kipp_session_eval(t, toks, keep, NULL, NULL, 0) == 0, "adopt %u", keep);
            uint32_t left = kipp_gen_prompt_left(g);
            CHECK(kipp_gen_rebind(g, t, err, sizeof err) == 0, "rebind at step %d: %s", step, err);
            CHECK(kipp_gen_prompt_left(g) == left + (uint32_t)kipp_session_length(s) - keep,
                  "step %d: %u to evaluate after the move, expected %u", step, kipp_gen_prompt_left(g),
                  left + kipp_session_length(s) - keep);
            kipp_session_destroy(s);
            s = t, a++;
        }
        kipp_batch_item it;
        kipp_gen_event ev;
        CHECK(kipp_gen_next(g, chunk, &it, err, sizeof err) == 0, "next: %s", err);
        CHECK(kipp_eval_batch(model, &it, 1, err, sizeof err) == 0, "batch: %s", err);
        CHECK(kipp_gen_advance(g, 0.001, &ev, err, sizeof err) == 0, "advance: %s", err);
        CHECK(!ev.n_refill || (ev.n_rows == 0 || o->prompt_rows) , "a refill step gave %u rows", ev.n_rows);
        refilled += ev.n_refill;
        for (uint32_t q = 0; q < ev.n_tokens && r->n < MAXG + 1; q++) r->ids[r->n++] = ev.tokens[q];
    }
    CHECK(n_at == 0 || refilled > 0 || keep_pct == 100, "moved %d times, nothing evaluated again", n_at);
    const char *p;
    size_t len, fin;
    kipp_gen_text(g, &p, &len, &fin);
    r->finish = kipp_gen_finished(g);
    r->text_len = len < sizeof r->text ? len : sizeof r->text;
    memcpy(r->text, p, r->text_len);
    kipp_gen_destroy(g);
    kipp_session_destroy(s);
}

/* kipp_gen_rebind: moved mid-prompt, right after the first sample and late in
 * the reply, onto empty or partly filled sessions, a gen gives the oracle's
 * ids, text and finish (greedy with drafts, and seeded sampling). */
static void test_rebind(void)
{
    uint32_t ids[256];
    size_t n;
    tokenize("Moving a gen, moving a gen, moving a gen between sessions changes no token of it.", ids, &n);
    kipp_gen_options opts[2] = {greedy(40), seeded(40, 21)};
    opts[0].spec = 1, opts[0].spec_opts.fixed_k = 1, opts[0].spec_opts.k_max = 4;
    const int at[] = {1, 3, 9, 25};
    const int keeps[] = {0, 50, 100};
    for (int oi = 0; oi < 2; oi++) {
        run_out want, got;
        oracle(ids, n, 256, &opts[oi], &want);
        for (int ki = 0; ki < 3; ki++) {
            char what[64];
            snprintf(what, sizeof what, "options %d keep %d%%", oi, keeps[ki]);
            run_moved(ids, n, &opts[oi], 5, at, 4, keeps[ki], &got);
            same(&got, &want, what);
        }
    }
    kipp_session *s = NULL, *t = NULL;
    kipp_gen *g = NULL;
    char err[256] = "";
    kipp_gen_options o = greedy(4);
    CHECK(kipp_session_create(model, 64, &s, NULL, 0) == 0 && kipp_session_create(model, 64, &t, NULL, 0) == 0, "sessions");
    CHECK(kipp_gen_create(model, s, ids, n, &o, &g, err, sizeof err) == 0, "gen: %s", err);
    CHECK(kipp_session_eval(t, ids, (uint32_t)n, NULL, NULL, 0) == 0, "fill");
    CHECK(kipp_gen_rebind(g, t, err, sizeof err) == KIPP_EINVAL && strstr(err, "at most"), "whole prompt held: '%s'", err);
    CHECK(kipp_gen_rebind(g, NULL, err, sizeof err) == KIPP_EINVAL, "NULL session");
    kipp_gen_cancel(g);
    kipp_session_reset(t);
    CHECK(kipp_gen_rebind(g, t, err, sizeof err) == KIPP_EINVAL && strstr(err, "finished"), "finished gen: '%s'", err);
    kipp_gen_destroy(g);
    kipp_session_destroy(s);
    kipp_session_destroy(t);
}

/* The oracle loop with the thinking budget and min_tokens written out: after
 * `budget` sampled tokens (budget < 0: none) the forced ids take the next
 * positions, evaluated like sampled ones; while fewer than min_tokens are out,
 * the stop ids are outside the allowed set. */
static void oracle_ext(const uint32_t *prompt, size_t n, uint32_t cap, const kipp_gen_options *o, int budget,
                       const uint32_t *force, uint32_t n_force, run_out *r)
{
    kipp_model_info info;
    kipp_model_get_info(model, &info);
    float *lg = malloc((size_t)info.vocab_size * sizeof *lg);
    uint64_t *mask = calloc((info.vocab_size + 63) / 64, sizeof *mask);
    for (uint32_t t = 0; t < info.vocab_size; t++) mask[t / 64] |= 1ull << (t % 64);
    for (uint32_t i = 0; i < info.n_stop; i++) mask[info.stop_ids[i] / 64] &= ~(1ull << (info.stop_ids[i] % 64));
    uint32_t hist[512], forced = 0;
    memcpy(hist, prompt, n * sizeof *hist);
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    kipp_session *s = NULL;
    memset(r, 0, sizeof *r);
    CHECK(kipp_session_create(model, cap, &s, NULL, 0) == 0, "session");
    CHECK(kipp_session_eval(s, prompt, (uint32_t)n, lg, NULL, 0) == 0, "prefill");
    for (;;) {
        kipp_sample_params p = o->sp;
        p.history = hist, p.history_len = n + r->n, p.n_prompt_history = n;
        if (r->n < o->min_tokens) p.allowed = mask;
        uint32_t t;
        if (budget >= 0 && r->n >= (uint32_t)budget && forced < n_force) t = force[forced++];
        else CHECK(kipp_sample_ex(lg, info.vocab_size, &p, &rng, &t, NULL, 0) == 0, "sample");
        if (t == info.stop_ids[0] || (info.n_stop > 1 && t == info.stop_ids[1])) {
            r->finish = KIPP_FIN_STOP;
            break;
        }
        hist[n + r->n] = t;
        r->ids[r->n++] = t;
        if (o->max_tokens && r->n >= o->max_tokens) { r->finish = KIPP_FIN_LENGTH; break; }
        CHECK(kipp_session_eval(s, &t, 1, lg, NULL, 0) == 0, "decode");
    }
    r->text_len = detok_all(r->ids, r->n, r->text, sizeof r->text);
    kipp_session_destroy(s);
    free(lg), free(mask);
}

/* The thinking budget (reply starting inside reasoning, as after a template
 * that opened <think>): `budget` sampled tokens, then "\n</think>\n\n" forced
 * (Qwen3's ids 198, 151668, 271), then sampling again; the same batched next
 * to a gen without a budget, which stays equal to its own oracle. A budget
 * the model's own </think> beats is not applied twice. min_tokens keeps a
 * reply whose every sample would be the stop id going for that many tokens. */
static void test_budget_and_min_tokens(void)
{
    uint32_t ids[256], force[8];
    size_t n, nf = 0;
    tokenize("Think about the weather in Paris.", ids, &n);
    CHECK(kipp_tokenize(model, "\n</think>\n\n", 11, KIPP_TOK_SPECIAL, force, 8, &nf, NULL, 0) == 0, "tokenize end");
    CHECK(nf == 3 && force[0] == 198 && force[1] == 151668 && force[2] == 271, "\\n</think>\\n\\n is %zu ids", nf);
    const uint32_t *pp[2] = {ids, ids};
    size_t nn[2] = {n, n};
    uint32_t chunk[2] = {4, 64};
    for (int budget = 0; budget <= 5; budget += 5) {
        kipp_gen_options o[2] = {seeded(20, 5), seeded(20, 6)};
        o[0].think_budget_on = 1, o[0].think_budget = (uint32_t)budget;
        o[0].think_close = "</think>", o[0].think_end = "\n</think>\n\n";
        run_out want[2], got[2];
        oracle_ext(ids, n, 256, &o[0], budget, force, 3, &want[0]);
        oracle(ids, n, 256, &o[1], &want[1]);
        run_batch(2, pp, nn, 256, o, chunk, got);
        char what[48];
        snprintf(what, sizeof what, "budget %d", budget);
        same(&got[0], &want[0], what);
        same(&got[1], &want[1], "the gen beside it");
        CHECK(got[0].n > (uint32_t)budget + 2 && got[0].ids[budget + 1] == 151668, "%s: </think> at %d", what, budget + 1);
    }
    /* a stop id favoured at every step: without min_tokens no token comes out, with 5 exactly 5 */
    kipp_model_info info;
    kipp_model_get_info(model, &info);
    kipp_logit_bias bias = {info.stop_ids[0], 1000.0f};
    kipp_gen_options o = greedy(20);
    o.sp.logit_bias = &bias, o.sp.n_logit_bias = 1;
    run_out got, want;
    run_batch(1, pp, nn, 256, &o, chunk, &got);
    CHECK(got.n == 0 && got.finish == KIPP_FIN_STOP, "biased stop id: %u tokens", got.n);
    o.min_tokens = 5;
    oracle_ext(ids, n, 256, &o, -1, force, 0, &want);
    run_batch(1, pp, nn, 256, &o, chunk, &got);
    same(&got, &want, "min_tokens 5");
    CHECK(got.n == 5 && got.finish == KIPP_FIN_STOP, "min_tokens 5: %u tokens, finish %d", got.n, got.finish);
}

int main(void)
{
    const char *backends[] = {"ref", "cpu"};
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    for (int b = 0; b < 2; b++) {
        if (kipp_model_open(path, backends[b], NULL, &model, err, sizeof err)) {
            printf("FAIL open %s on %s: %s\n", path, backends[b], err);
            th_failed++;
            return th_finish();
        }
        printf("backend %s\n", backends[b]);
        RUN(test_matches_oracle);
        RUN(test_batched_and_spec);
        RUN(test_finishes);
        RUN(test_prompt_rows);
        RUN(test_rebind);
        RUN(test_budget_and_min_tokens);
        if (b == 0) RUN(test_errors);
        kipp_model_close(model);
    }
    return th_finish();
}
