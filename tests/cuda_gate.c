/*
 * cuda_gate.c - `kipp-cuda-gate`: the model gates of the CUDA backend
 * (tools/cuda_check.sh runs it), through the public engine API only.
 *
 *   kipp-cuda-gate --model F.gguf [--model ...] [--prompt N] [--decode N]
 *                  [--batch B] [--long N] [--nmse X] [--json FILE] [--oracle ref]
 *
 * For each model, the "cuda" backend against the "ref" oracle, row by row:
 *   isolated  one session: a prompt of N tokens with logits for every row,
 *             then --decode greedy steps (tokens from the ref's argmax);
 *   batched   B sessions with prompts of different lengths, prefilled in one
 *             kipp_eval_batch (rows interleaved), then --decode steps of B
 *             one-token items per call (the CUDA graph path); ref evaluates
 *             each session alone;
 *   pooled    the batched phase on a model opened with a KV pool, in the same
 *             steps against the same ref rows (the kipp-serve path: block
 *             tables index the shared slab);
 *   grown     a session prefilled, then a larger one created (the backend's
 *             KV arena grows under the first), then both decode in one batch;
 *   long      (--long N > 0) one prefill of N tokens, more than one round
 *             of the backend, logits for its last 4 rows.
 * A row passes when its argmax equals the ref's and its NMSE
 * (sum (cuda - ref)^2 / sum ref^2) is at most --nmse (default 1e-4).
 * Prints one line per phase and "GATE PASS" or "GATE FAIL"; exit 0 only on pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kipp.h"

#define MAX_MODELS 8
#define MAX_BATCH 8

typedef struct {
    const char *models[MAX_MODELS];
    int n_models;
    uint32_t prompt, decode, batch, long_n;
    double nmse_max;
    const char *json, *oracle;
} opts;

typedef struct {
    uint32_t rows, argmax_bad;
    double nmse_max, nmse_sum;
} stats;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_id(uint32_t vocab)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % vocab);
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void compare_rows(const float *cu, const float *ref, uint32_t rows, uint32_t vocab, stats *st)
{
    for (uint32_t r = 0; r < rows; r++) {
        const float *c = cu + (size_t)r * vocab, *f = ref + (size_t)r * vocab;
        double num = 0, den = 0;
        for (uint32_t i = 0; i < vocab; i++) {
            double d = (double)c[i] - (double)f[i];
            num += d * d;
            den += (double)f[i] * f[i];
        }
        double nmse = den > 0 ? num / den : num;
        if (!isfinite(nmse)) nmse = INFINITY;
        uint32_t ac = argmax(c, vocab), af = argmax(f, vocab);
        if (ac != af) {
            st->argmax_bad++;
            fprintf(stderr, "    row %u: argmax cuda %u (ref logit %g) != ref %u (ref logit %g)\n", st->rows, ac,
                    (double)f[ac], af, (double)f[af]);
        }
        if (nmse > st->nmse_max) st->nmse_max = nmse;
        st->nmse_sum += nmse;
        st->rows++;
    }
}

static int pass(const stats *st, const opts *o)
{
    return st->rows > 0 && st->argmax_bad == 0 && st->nmse_max <= o->nmse_max;
}

static int report(const char *model, const char *phase, const stats *st, const opts *o, FILE *js, int *first)
{
    int ok = pass(st, o);
    printf("  %-8s %4u rows  argmax mismatches %u  NMSE max %.3g mean %.3g  %s\n", phase, st->rows,
           st->argmax_bad, st->nmse_max, st->rows ? st->nmse_sum / st->rows : 0.0, ok ? "pass" : "FAIL");
    if (js) {
        fprintf(js, "%s    {\"model\": \"%s\", \"phase\": \"%s\", \"rows\": %u, \"argmax_mismatches\": %u, "
                    "\"nmse_max\": %.6g, \"nmse_mean\": %.6g, \"pass\": %s}",
                *first ? "" : ",\n", model, phase, st->rows, st->argmax_bad, st->nmse_max,
                st->rows ? st->nmse_sum / st->rows : 0.0, ok ? "true" : "false");
        *first = 0;
    }
    return ok;
}

#define TRY(x)                                                    \
    do {                                                          \
        int rc_ = (x);                                            \
        if (rc_) {                                                \
            fprintf(stderr, "  %s: %s (%s)\n", #x, err, kipp_strerror(rc_)); \
            goto out;                                             \
        }                                                         \
    } while (0)

/* One session of capacity cap on each backend: n random ids with logits for
 * the last nl rows, then `decode` greedy steps; every row compared. */
static int pair_run(kipp_model *mr, kipp_model *mc, uint32_t vocab, uint32_t n, uint32_t nl, uint32_t decode,
                    uint32_t cap, stats *st)
{
    char err[512] = "";
    int ok = 0;
    kipp_session *sr = NULL, *sc = NULL;
    uint32_t *ids = malloc(n * sizeof *ids);
    float *lr = malloc((size_t)nl * vocab * sizeof(float)), *lc = malloc((size_t)nl * vocab * sizeof(float));
    if (!ids || !lr || !lc) goto out;
    for (uint32_t i = 0; i < n; i++) ids[i] = next_id(vocab);
    TRY(kipp_session_create(mr, cap, &sr, err, sizeof err));
    TRY(kipp_session_create(mc, cap, &sc, err, sizeof err));
    TRY(kipp_session_eval_n(sr, ids, n, nl, lr, err, sizeof err));
    TRY(kipp_session_eval_n(sc, ids, n, nl, lc, err, sizeof err));
    compare_rows(lc, lr, nl, vocab, st);
    float *last = lr + (size_t)(nl - 1) * vocab;
    for (uint32_t s = 0; s < decode; s++) {
        uint32_t t = argmax(last, vocab);
        TRY(kipp_session_eval_n(sr, &t, 1, 1, lr, err, sizeof err));
        TRY(kipp_session_eval_n(sc, &t, 1, 1, lc, err, sizeof err));
        compare_rows(lc, lr, 1, vocab, st);
        last = lr;
    }
    ok = 1;
out:
    kipp_session_destroy(sr);
    kipp_session_destroy(sc);
    free(ids);
    free(lr);
    free(lc);
    return ok;
}

/* One session on each backend: prompt with every row's logits, then greedy decode. */
static int phase_isolated(kipp_model *mr, kipp_model *mc, uint32_t vocab, const opts *o, stats *st)
{
    return pair_run(mr, mc, vocab, o->prompt, o->prompt, o->decode, o->prompt + o->decode + 1, st);
}

/* B sessions: each cuda model (mc[0] unpooled, mc[1] pooled) in one
 * kipp_eval_batch per step, ref per session alone; st[k] for mc[k]. */
static int phase_batched(kipp_model *mr, kipp_model *const mc[2], uint32_t vocab, const opts *o, stats st[2])
{
    char err[512] = "";
    int ok = 0;
    uint32_t B = o->batch, len[MAX_BATCH], cap = o->prompt + 8 + o->decode + 1;
    kipp_session *sr[MAX_BATCH] = {0}, *sc[2][MAX_BATCH] = {{0}};
    uint32_t *ids[MAX_BATCH] = {0};
    float *lr[MAX_BATCH] = {0}, *lc[MAX_BATCH] = {0};
    kipp_batch_item items[MAX_BATCH];
    uint32_t tok[MAX_BATCH];
    for (uint32_t j = 0; j < B; j++) {
        len[j] = o->prompt + 8 - (j * 5) % 13; /* different lengths: rows of different items interleave */
        if (len[j] == 0) len[j] = 1;
        ids[j] = malloc(len[j] * sizeof(uint32_t));
        lr[j] = malloc((size_t)len[j] * vocab * sizeof(float));
        lc[j] = malloc((size_t)len[j] * vocab * sizeof(float));
        if (!ids[j] || !lr[j] || !lc[j]) goto out;
        for (uint32_t i = 0; i < len[j]; i++) ids[j][i] = next_id(vocab);
        TRY(kipp_session_create(mr, cap, &sr[j], err, sizeof err));
        for (int k = 0; k < 2; k++) TRY(kipp_session_create(mc[k], cap, &sc[k][j], err, sizeof err));
        TRY(kipp_session_eval_n(sr[j], ids[j], len[j], len[j], lr[j], err, sizeof err));
    }
    for (int k = 0; k < 2; k++) {
        for (uint32_t j = 0; j < B; j++) items[j] = (kipp_batch_item){sc[k][j], ids[j], len[j], len[j], lc[j], NULL};
        TRY(kipp_eval_batch(mc[k], items, B, err, sizeof err));
        for (uint32_t j = 0; j < B; j++) compare_rows(lc[j], lr[j], len[j], vocab, &st[k]);
    }
    for (uint32_t j = 0; j < B; j++) tok[j] = argmax(lr[j] + (size_t)(len[j] - 1) * vocab, vocab);
    for (uint32_t s = 0; s < o->decode; s++) {
        for (uint32_t j = 0; j < B; j++) TRY(kipp_session_eval_n(sr[j], &tok[j], 1, 1, lr[j], err, sizeof err));
        for (int k = 0; k < 2; k++) {
            for (uint32_t j = 0; j < B; j++) items[j] = (kipp_batch_item){sc[k][j], &tok[j], 1, 1, lc[j], NULL};
            TRY(kipp_eval_batch(mc[k], items, B, err, sizeof err));
            for (uint32_t j = 0; j < B; j++) compare_rows(lc[j], lr[j], 1, vocab, &st[k]);
        }
        for (uint32_t j = 0; j < B; j++) tok[j] = argmax(lr[j], vocab);
    }
    ok = 1;
out:
    for (uint32_t j = 0; j < B; j++) {
        kipp_session_destroy(sr[j]);
        kipp_session_destroy(sc[0][j]);
        kipp_session_destroy(sc[1][j]);
        free(ids[j]);
        free(lr[j]);
        free(lc[j]);
    }
    return ok;
}

/* A session prefilled, then a larger one created (the CUDA backend grows its
 * KV arena, copying the first session's KV), then both decode in one batch. */
static int phase_grow(kipp_model *mr, kipp_model *mc, uint32_t vocab, const opts *o, stats *st)
{
    char err[512] = "";
    int ok = 0;
    uint32_t cap[2] = {o->prompt + o->decode + 1, 8 * (o->prompt + o->decode + 1) + 512}; /* > 2x the arena so far */
    kipp_session *sr[2] = {0}, *sc[2] = {0};
    uint32_t *ids = malloc(o->prompt * sizeof *ids), tok[2];
    float *lr[2] = {0}, *lc[2] = {0};
    kipp_batch_item items[2];
    if (!ids) goto out;
    for (int j = 0; j < 2; j++) {
        lr[j] = malloc((size_t)o->prompt * vocab * sizeof(float));
        lc[j] = malloc((size_t)o->prompt * vocab * sizeof(float));
        if (!lr[j] || !lc[j]) goto out;
    }
    for (int j = 0; j < 2; j++) {
        for (uint32_t i = 0; i < o->prompt; i++) ids[i] = next_id(vocab);
        TRY(kipp_session_create(mr, cap[j], &sr[j], err, sizeof err));
        TRY(kipp_session_create(mc, cap[j], &sc[j], err, sizeof err));
        TRY(kipp_session_eval_n(sr[j], ids, o->prompt, 1, lr[j], err, sizeof err));
        TRY(kipp_session_eval_n(sc[j], ids, o->prompt, 1, lc[j], err, sizeof err));
        compare_rows(lc[j], lr[j], 1, vocab, st);
        tok[j] = argmax(lr[j], vocab);
    }
    for (uint32_t s = 0; s < o->decode; s++) {
        for (int j = 0; j < 2; j++) {
            TRY(kipp_session_eval_n(sr[j], &tok[j], 1, 1, lr[j], err, sizeof err));
            items[j] = (kipp_batch_item){sc[j], &tok[j], 1, 1, lc[j], NULL};
        }
        TRY(kipp_eval_batch(mc, items, 2, err, sizeof err));
        for (int j = 0; j < 2; j++) {
            compare_rows(lc[j], lr[j], 1, vocab, st);
            tok[j] = argmax(lr[j], vocab);
        }
    }
    ok = 1;
out:
    for (int j = 0; j < 2; j++) {
        kipp_session_destroy(sr[j]);
        kipp_session_destroy(sc[j]);
        free(lr[j]);
        free(lc[j]);
    }
    free(ids);
    return ok;
}

/* One prefill longer than a backend round; logits for the last 4 rows. */
static int phase_long(kipp_model *mr, kipp_model *mc, uint32_t vocab, const opts *o, stats *st)
{
    return pair_run(mr, mc, vocab, o->long_n, o->long_n < 4 ? o->long_n : 4, 0, o->long_n, st);
}

static int usage(void)
{
    fprintf(stderr, "usage: kipp-cuda-gate --model F.gguf [--model ...] [--prompt N (default 24)] [--decode N (8)]\n"
                    "                      [--batch B (1..8, default 3)] [--long N (0)] [--nmse X (1e-4)] [--json FILE]\n"
                    "                      [--oracle ref|cpu (the backend cuda is compared with, default ref)]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts o = {.prompt = 24, .decode = 8, .batch = 3, .nmse_max = 1e-4, .oracle = "ref"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (!strcmp(a, "--model") && o.n_models < MAX_MODELS) o.models[o.n_models++] = v;
        else if (!strcmp(a, "--prompt")) o.prompt = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--decode")) o.decode = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--batch")) o.batch = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--long")) o.long_n = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--nmse")) o.nmse_max = strtod(v, NULL);
        else if (!strcmp(a, "--json")) o.json = v;
        else if (!strcmp(a, "--oracle")) o.oracle = v;
        else return usage();
        i++;
    }
    if (!o.n_models || o.prompt < 1 || o.batch < 1 || o.batch > MAX_BATCH) return usage();
    FILE *js = NULL;
    if (o.json && !(js = fopen(o.json, "w"))) {
        perror(o.json);
        return 2;
    }
    if (js) fprintf(js, "{\"nmse_limit\": %g, \"gates\": [\n", o.nmse_max);
    int all_ok = 1, first = 1;
    for (int k = 0; k < o.n_models; k++) {
        char err[512] = "";
        kipp_model *mr = NULL, *mc = NULL, *mp = NULL;
        const char *path = o.models[k];
        printf("%s\n", path);
        int rc = kipp_model_open(path, o.oracle, NULL, &mr, err, sizeof err);
        if (!rc) rc = kipp_model_open(path, "cuda", NULL, &mc, err, sizeof err);
        if (!rc) rc = kipp_model_open_pooled(path, "cuda", NULL, 256, &mp, err, sizeof err);
        if (rc) {
            printf("  open: %s (%s)  FAIL\n", err, kipp_strerror(rc));
            all_ok = 0;
        } else {
            kipp_model_info info;
            kipp_model_get_info(mr, &info);
            uint32_t V = info.vocab_size;
            stats si = {0}, sb[2] = {{0}}, sl = {0};
            kipp_model *const both[2] = {mc, mp};
            int ok = phase_isolated(mr, mc, V, &o, &si);
            all_ok &= report(path, "isolated", &si, &o, js, &first) && ok;
            ok = phase_batched(mr, both, V, &o, sb);
            all_ok &= report(path, "batched", &sb[0], &o, js, &first) && ok;
            all_ok &= report(path, "pooled", &sb[1], &o, js, &first) && ok;
            stats sg = {0};
            ok = phase_grow(mr, mc, V, &o, &sg);
            all_ok &= report(path, "grown", &sg, &o, js, &first) && ok;
            if (o.long_n) {
                ok = phase_long(mr, mc, V, &o, &sl);
                all_ok &= report(path, "long", &sl, &o, js, &first) && ok;
            }
        }
        kipp_model_close(mp);
        kipp_model_close(mc);
        kipp_model_close(mr);
    }
    if (js) {
        fprintf(js, "\n], \"pass\": %s}\n", all_ok ? "true" : "false");
        fclose(js);
    }
    printf("GATE %s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
