/*
 * test_sampler.c - kipp_sample_ex (engine/sampler.c) against direct computation.
 *
 * Oracles: hand-computed adjusted logits and their exact softmax (double), and
 * the exact kept sets of top_k / top_p / min_p. Sampled distributions are
 * compared with the exact probabilities over many draws within a 6-sigma
 * binomial bound; tokens outside the kept set must never appear.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tests/test_harness.h"
#include "engine/kipp.h"

#define NDRAW 200000

/* Exact softmax of x[n] / t in double. */
static void softmax_ref(const double *x, size_t n, double t, double *p)
{
    double mx = x[0], s = 0;
    for (size_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (size_t i = 0; i < n; i++) s += (p[i] = exp((x[i] - mx) / t));
    for (size_t i = 0; i < n; i++) p[i] /= s;
}

/* Draw ndraw samples and check each token's frequency against want[] (0 => never). */
static void check_draws(const float *logits, size_t n, const kipp_sample_params *p, const double *want,
                        uint64_t seed, int ndraw)
{
    kipp_rng rng;
    kipp_rng_seed(&rng, seed);
    static long counts[1024];
    memset(counts, 0, sizeof counts);
    char err[256];
    for (int i = 0; i < ndraw; i++) {
        uint32_t tok = 99;
        int rc = kipp_sample_ex(logits, n, p, &rng, &tok, err, sizeof err);
        if (rc || tok >= n) {
            CHECK(0, "draw %d: rc %d token %u (%s)", i, rc, tok, err);
            return;
        }
        counts[tok]++;
    }
    for (size_t t = 0; t < n; t++) {
        double f = (double)counts[t] / ndraw;
        if (want[t] == 0.0) {
            CHECK(counts[t] == 0, "token %zu drawn %ld times but it should be excluded", t, counts[t]);
            continue;
        }
        double sigma = sqrt(want[t] * (1 - want[t]) / ndraw);
        CHECK(fabs(f - want[t]) <= 6 * sigma + 1e-9, "token %zu frequency %.5f, expected %.5f (6 sigma %.5f)",
              t, f, want[t], 6 * sigma);
    }
}

static void check_distribution(const float *logits, size_t n, const kipp_sample_params *p,
                               const double *want, uint64_t seed)
{
    check_draws(logits, n, p, want, seed, NDRAW);
}

static void test_determinism(void)
{
    float logits[64];
    for (int i = 0; i < 64; i++) logits[i] = (float)sin(i * 1.7) * 3.0f;
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    kipp_rng a, b, c;
    kipp_rng_seed(&a, 42);
    kipp_rng_seed(&b, 42);
    kipp_rng_seed(&c, 43);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 200; i++) {
        uint32_t ta, tb, tc;
        CHECK(kipp_sample_ex(logits, 64, &p, &a, &ta, NULL, 0) == 0, "sample a");
        CHECK(kipp_sample_ex(logits, 64, &p, &b, &tb, NULL, 0) == 0, "sample b");
        CHECK(kipp_sample_ex(logits, 64, &p, &c, &tc, NULL, 0) == 0, "sample c");
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    CHECK(same_ab, "the same seed gave different sequences");
    CHECK(!same_ac, "seeds 42 and 43 gave the same 200-token sequence");
}

/* kipp_rng_seed expands the seed with splitmix64; for seed 0 the first two
 * outputs are the values of Vigna's reference splitmix64.c. */
static void test_rng_reference(void)
{
    kipp_rng r;
    kipp_rng_seed(&r, 0);
    /* splitmix64 with state 0 -> first output 0xe220a8397b1dcdaf (Vigna's splitmix64.c). */
    CHECK(r.s[0] == 0xe220a8397b1dcdafull, "splitmix64(0) first output %llx", (unsigned long long)r.s[0]);
    CHECK(r.s[1] == 0x6e789e6aa1b965f4ull, "splitmix64(0) second output %llx", (unsigned long long)r.s[1]);
    kipp_rng_seed(NULL, 0); /* a NULL rng is left alone, not dereferenced */
}

static void test_greedy_is_argmax(void)
{
    float logits[10] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 0, 0, 0, 0, 0};
    kipp_sample_params p = kipp_sample_params_default();
    kipp_rng rng;
    kipp_rng_seed(&rng, 1);
    uint32_t tok = 99;
    CHECK(kipp_sample_ex(logits, 10, &p, &rng, &tok, NULL, 0) == 0, "greedy");
    CHECK(tok == 1, "greedy picked %u, expected 1 (tie with 3 -> lowest id)", tok);
    p.temperature = 5.0f;
    p.top_k = 1;
    for (int i = 0; i < 100; i++) {
        CHECK(kipp_sample_ex(logits, 10, &p, &rng, &tok, NULL, 0) == 0, "top_k 1");
        CHECK(tok == 1, "top_k=1 draw %d picked %u, expected the argmax 1", i, tok);
    }
}

static void test_temperature_distribution(void)
{
    const float logits[5] = {1.0f, 0.5f, -0.25f, 2.0f, 0.0f};
    double x[5], want[5];
    for (int i = 0; i < 5; i++) x[i] = logits[i];
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    softmax_ref(x, 5, 1.0, want);
    check_distribution(logits, 5, &p, want, 7);
    p.temperature = 2.0f;
    softmax_ref(x, 5, 2.0, want);
    check_distribution(logits, 5, &p, want, 8);
}

/* Hand-computed: rep 2 divides positive / multiplies negative logits of the
 * distinct tokens in the last penalty_window of history (prompt included); then
 * logit -= count*0.5 + 0.25 for tokens generated (history past n_prompt_history). */
static void test_penalties(void)
{
    const float logits[5] = {2.0f, 1.0f, -1.0f, 0.5f, 0.0f};
    const uint32_t history[] = {4, 4, 4, 0, 0, 2}; /* window 3 sees {0, 0, 2}: token 4 is outside */
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.history = history;
    p.history_len = 6;
    p.n_prompt_history = 3; /* the three 4s are prompt: no frequency/presence for them */
    p.penalty_window = 3;
    /* token 0: 2/2 - (2*0.5+0.25) = -0.25; token 2: -1*2 - (0.5+0.25) = -2.75 */
    const double adj[5] = {-0.25, 1.0, -2.75, 0.5, 0.0};
    double want[5];
    softmax_ref(adj, 5, 1.0, want);
    check_distribution(logits, 5, &p, want, 11);
    /* Greedy sees the same adjusted logits: token 1 (1.0) now beats token 0. */
    p.temperature = 0.0f;
    kipp_rng rng;
    kipp_rng_seed(&rng, 1);
    uint32_t tok = 99;
    CHECK(kipp_sample_ex(logits, 5, &p, &rng, &tok, NULL, 0) == 0 && tok == 1, "penalised greedy picked %u, expected 1", tok);
    /* All history generated: frequency counts token 4 (3 times) although the
     * repetition window (3) does not reach it: 0 - (1.5 + 0.25). */
    p.n_prompt_history = 0;
    p.temperature = 1.0f;
    const double adj2[5] = {-0.25, 1.0, -2.75, 0.5, -1.75};
    softmax_ref(adj2, 5, 1.0, want);
    check_distribution(logits, 5, &p, want, 12);
    /* Repetition alone reaches prompt tokens inside the window: 0.5 -> 0.25 for token 3. */
    const uint32_t h3[] = {3, 1};
    p = kipp_sample_params_default();
    p.temperature = 1.0f;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 2.0f;
    p.history = h3, p.history_len = 2, p.n_prompt_history = 2;
    const double adj3[5] = {2.0, 0.5, -1.0, 0.25, 0.0};
    softmax_ref(adj3, 5, 1.0, want);
    check_distribution(logits, 5, &p, want, 13);
}

/* top_p 0 is greedy, whatever the temperature (not refused). */
static void test_top_p_zero_is_greedy(void)
{
    const float logits[5] = {0.1f, 3.0f, 2.9f, -1.0f, 0.0f};
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 5.0f;
    p.top_p = 0.0f;
    for (uint64_t seed = 0; seed < 50; seed++) {
        kipp_rng rng;
        kipp_rng_seed(&rng, seed);
        uint32_t tok = 99;
        char err[128] = "";
        int rc = kipp_sample_ex(logits, 5, &p, &rng, &tok, err, sizeof err);
        CHECK(rc == 0 && tok == 1, "top_p 0 seed %llu: rc %d (%s) token %u, expected token 1", (unsigned long long)seed,
              rc, err, tok);
    }
}

/* probabilities 0.4 0.3 0.2 0.08 0.02 */
static void five_logits(float *logits)
{
    const double pr[5] = {0.4, 0.3, 0.2, 0.08, 0.02};
    for (int i = 0; i < 5; i++) logits[i] = (float)log(pr[i]);
}

static void test_top_k_top_p_min_p(void)
{
    float lg[5];
    five_logits(lg);
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    p.top_k = 2; /* keep {0, 1} */
    double wk[5] = {0.4 / 0.7, 0.3 / 0.7, 0, 0, 0};
    check_distribution(lg, 5, &p, wk, 21);
    p.top_k = 0;
    p.top_p = 0.75f; /* 0.4+0.3 = 0.7 < 0.75 <= 0.9: keep {0, 1, 2} */
    double wp[5] = {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0, 0};
    check_distribution(lg, 5, &p, wp, 22);
    p.top_p = 0.3f; /* the first token alone reaches 0.3 */
    double w1[5] = {1, 0, 0, 0, 0};
    check_distribution(lg, 5, &p, w1, 23);
    p.top_p = 1.0f;
    p.min_p = 0.25f; /* threshold 0.1: keep {0, 1, 2} */
    check_distribution(lg, 5, &p, wp, 24);
    p.min_p = 0.15f; /* threshold 0.06: keep {0, 1, 2, 3} */
    double wm[5] = {0.4 / 0.98, 0.3 / 0.98, 0.2 / 0.98, 0.08 / 0.98, 0};
    check_distribution(lg, 5, &p, wm, 25);
    p.min_p = 0.0f;
    p.top_k = 4;
    p.top_p = 0.8f; /* top_k keeps 4 (mass 0.98, renormalised: 0.408 0.306 0.204 ...): 0.714 < 0.8 <= 0.918 */
    check_distribution(lg, 5, &p, wp, 26);
}

/* Ties at the top_k boundary go to the lower ids (the total order logit desc, id asc). */
static void test_top_k_ties(void)
{
    float lg[10];
    for (int i = 0; i < 10; i++) lg[i] = i == 7 ? 2.0f : 1.0f;
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    p.top_k = 3; /* keep 7 (the max), then 0 and 1 among the tied rest */
    double e = exp(1.0), z = e + 2.0, want[10] = {1 / z, 1 / z, 0, 0, 0, 0, 0, e / z, 0, 0};
    check_distribution(lg, 10, &p, want, 41);
}

/* A 1000-token geometric distribution p_i ~ 0.99^i, shuffled over ids: the
 * nucleus for top_p 0.5 is the m most likely tokens, m computed directly. */
static void test_top_p_large_vocab(void)
{
    enum { N = 1000 };
    static float lg[N];
    static double pr[N], want[N];
    double z = 0, cum = 0;
    for (int r = 0; r < N; r++) z += pow(0.99, r);
    size_t m = 0;
    for (int r = 0; r < N; r++) { /* rank r lives at id (r*7) % N: 7 is coprime to 1000 */
        pr[(r * 7) % N] = pow(0.99, r) / z;
        lg[(r * 7) % N] = (float)(r * log(0.99));
        if (cum < 0.5) cum += pow(0.99, r) / z, m = (size_t)r + 1;
    }
    for (int r = 0; r < N; r++) want[(r * 7) % N] = (size_t)r < m ? pr[(r * 7) % N] / cum : 0.0;
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.5f;
    check_draws(lg, N, &p, want, 42, 40000); /* 69 kept tokens: 6 sigma ~ 0.004 each */
}

static void test_logit_bias(void)
{
    float lg[5];
    five_logits(lg);
    kipp_logit_bias force = {4, 100.0f}, ban = {0, -100.0f};
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 1.0f;
    p.logit_bias = &force;
    p.n_logit_bias = 1;
    double w4[5] = {0, 0, 0, 0, 1};
    check_distribution(lg, 5, &p, w4, 31);
    p.temperature = 0.0f;
    p.logit_bias = &ban;
    kipp_rng rng;
    kipp_rng_seed(&rng, 3);
    uint32_t tok = 99;
    CHECK(kipp_sample_ex(lg, 5, &p, &rng, &tok, NULL, 0) == 0 && tok == 1, "banned argmax: picked %u, expected 1", tok);
}

/* Each bad value is rejected with the right code and an error naming the field. */
static void expect_reject(kipp_sample_params p, int code, const char *name)
{
    float lg[5];
    five_logits(lg);
    kipp_rng rng;
    kipp_rng_seed(&rng, 1);
    uint32_t tok = 77;
    char err[256] = "";
    int rc = kipp_sample_ex(lg, 5, &p, &rng, &tok, err, sizeof err);
    CHECK(rc == code, "%s: rc %d, expected %d", name, rc, code);
    CHECK(strstr(err, name) != NULL, "error '%s' does not name %s", err, name);
    CHECK(tok == 77, "%s: token written on error", name);
}

/* Every row of the sampling-field table (kipp_sample_fields, which the CLI and
 * kipp-serve parse through): both ends accepted, just outside either refused
 * naming the field, and set/get round-trip through the member it names. */
static void test_sample_field_table(void)
{
    size_t n = 0;
    const kipp_sample_field *f = kipp_sample_fields(&n);
    CHECK(n == 7, "%zu sampling fields, expected 7", n);
    float lg[5];
    five_logits(lg);
    for (size_t i = 0; i < n; i++) {
        CHECK(kipp_sample_field_find(f[i].name) == &f[i] && kipp_sample_field_find(f[i].flag) == &f[i],
              "%s / %s not found by name and flag", f[i].name, f[i].flag);
        double ends[2] = {f[i].lo, f[i].hi};
        for (int k = 0; k < 2; k++) {
            kipp_sample_params p = kipp_sample_params_default();
            kipp_sample_field_set(&p, &f[i], ends[k]);
            CHECK(kipp_sample_field_get(&p, &f[i]) == (f[i].is_int ? ends[k] : (double)(float)ends[k]),
                  "%s: set %g, read back %g", f[i].name, ends[k], kipp_sample_field_get(&p, &f[i]));
            kipp_rng rng;
            kipp_rng_seed(&rng, 1);
            uint32_t tok;
            char err[256] = "";
            CHECK(kipp_sample_ex(lg, 5, &p, &rng, &tok, err, sizeof err) == 0, "%s = %g refused: %s", f[i].name, ends[k], err);
        }
        kipp_sample_params p = kipp_sample_params_default();
        kipp_sample_field_set(&p, &f[i], f[i].lo - 1);
        expect_reject(p, KIPP_EINVAL, f[i].name);
        if (f[i].hi < 1e30) {
            p = kipp_sample_params_default();
            kipp_sample_field_set(&p, &f[i], f[i].hi + 1);
            expect_reject(p, KIPP_EINVAL, f[i].name);
        }
    }
    CHECK(kipp_sample_field_find("seed") == NULL && kipp_sample_field_find(NULL) == NULL, "seed is not a range field");
}

static void test_bad_parameters(void)
{
    kipp_sample_params d = kipp_sample_params_default(), p;
    p = d, p.temperature = -0.1f, expect_reject(p, KIPP_EINVAL, "temperature");
    p = d, p.temperature = NAN, expect_reject(p, KIPP_EINVAL, "temperature");
    p = d, p.top_k = -1, expect_reject(p, KIPP_EINVAL, "top_k");
    p = d, p.top_p = -0.1f, expect_reject(p, KIPP_EINVAL, "top_p");
    p = d, p.top_p = 1.5f, expect_reject(p, KIPP_EINVAL, "top_p");
    p = d, p.min_p = -0.1f, expect_reject(p, KIPP_EINVAL, "min_p");
    p = d, p.min_p = 1.1f, expect_reject(p, KIPP_EINVAL, "min_p");
    p = d, p.repetition_penalty = 0.0f, expect_reject(p, KIPP_EINVAL, "repetition_penalty");
    p = d, p.frequency_penalty = 2.5f, expect_reject(p, KIPP_EINVAL, "frequency_penalty");
    p = d, p.presence_penalty = -2.5f, expect_reject(p, KIPP_EINVAL, "presence_penalty");
    kipp_logit_bias far = {5, 1.0f}, nan_bias = {1, NAN};
    p = d, p.logit_bias = &far, p.n_logit_bias = 1, expect_reject(p, KIPP_ERANGE, "logit_bias token 5");
    p = d, p.logit_bias = &nan_bias, p.n_logit_bias = 1, expect_reject(p, KIPP_EINVAL, "logit_bias");
    uint32_t hist[1] = {9};
    p = d, p.history = hist, p.history_len = 1, expect_reject(p, KIPP_ERANGE, "history token 9");
    p = d, p.history = hist, p.history_len = 0, p.n_prompt_history = 1, expect_reject(p, KIPP_EINVAL, "n_prompt_history");
}

/* Vocabularies past the 64-float blocks the scans vectorize over: the greedy
 * token equals a strict left-to-right scan (the lowest id among ties, -0 and +0
 * equal), with ties and maxima in the blocks and in the tail, masked tokens
 * (-inf) never chosen, and a non-finite logit named at its index. */
static void test_greedy_large_vocab(void)
{
    kipp_sample_params p = kipp_sample_params_default();
    kipp_rng rng;
    kipp_rng_seed(&rng, 3);
    static float lg[1100];
    static uint64_t allowed[(1100 + 63) / 64];
    uint64_t h = 12345;
    for (int t = 0; t < 200; t++) {
        size_t n = 64 + (size_t)(t * 37) % 1000;
        for (size_t i = 0; i < n; i++) {
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = (float)((h >> 33) % 7) - 3.0f; /* many ties */
            if (lg[i] == 0.0f && (h >> 20 & 1)) lg[i] = -0.0f;
        }
        p.allowed = NULL;
        if (t % 3 == 2) { /* mask a pseudo-random half */
            for (size_t w = 0; w < (n + 63) / 64; w++) h = h * 6364136223846793005ull + 1, allowed[w] = h | 1;
            p.allowed = allowed;
        }
        size_t want = SIZE_MAX;
        for (size_t i = 0; i < n; i++)
            if ((!p.allowed || (allowed[i / 64] >> (i % 64) & 1)) && (want == SIZE_MAX || lg[i] > lg[want])) want = i;
        uint32_t tok = 0;
        CHECK(kipp_sample_ex(lg, n, &p, &rng, &tok, NULL, 0) == 0 && tok == want, "n %zu trial %d: %u, expected %zu", n, t, tok, want);
    }
    p.allowed = NULL;
    const size_t at[5] = {0, 63, 64, 700, 1099};
    for (int k = 0; k < 5; k++) {
        for (size_t i = 0; i < 1100; i++) lg[i] = (float)(i % 13);
        lg[at[k]] = k % 2 ? -INFINITY : NAN;
        char err[256] = "", want[32];
        uint32_t tok = 0;
        int rc = kipp_sample_ex(lg, 1100, &p, &rng, &tok, err, sizeof err);
        snprintf(want, sizeof want, "logit %zu ", at[k]);
        CHECK(rc == KIPP_ENUMERIC && strstr(err, want), "logit %zu non-finite: rc %d '%s'", at[k], rc, err);
    }
}

static void test_nonfinite_logits(void)
{
    float lg[5];
    kipp_sample_params p = kipp_sample_params_default();
    kipp_rng rng;
    kipp_rng_seed(&rng, 1);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++) {
        five_logits(lg);
        lg[3] = bad[b];
        uint32_t tok = 77;
        char err[256] = "";
        int rc = kipp_sample_ex(lg, 5, &p, &rng, &tok, err, sizeof err);
        CHECK(rc == KIPP_ENUMERIC, "logit %g: rc %d, expected ENUMERIC", (double)bad[b], rc);
        CHECK(strstr(err, "logit 3") != NULL, "error '%s' does not name logit 3", err);
    }
}

/* A repetition penalty that would push a large finite logit past FLT_MAX saturates
 * (the order it imposes is kept) instead of failing with a non-finite logit. */
static void test_penalty_saturates(void)
{
    const float lg[3] = {3e38f, 2e38f, -3e38f};
    const uint32_t hist[2] = {0, 2};
    kipp_sample_params p = kipp_sample_params_default();
    p.history = hist;
    p.history_len = 2;
    kipp_rng rng;
    kipp_rng_seed(&rng, 1);
    uint32_t tok = 99;
    char err[256] = "";
    /* 0.5: token 0 -> 6e38 saturates to FLT_MAX and stays first */
    p.repetition_penalty = 0.5f;
    int rc = kipp_sample_ex(lg, 3, &p, &rng, &tok, err, sizeof err);
    CHECK(rc == 0 && tok == 0, "penalty 0.5: rc %d (%s), token %u, expected 0 and token 0", rc, err, tok);
    /* 4: token 0 -> 7.5e37 falls below token 1; token 2 -> -1.2e39 saturates to -FLT_MAX */
    p.repetition_penalty = 4.0f;
    rc = kipp_sample_ex(lg, 3, &p, &rng, &tok, err, sizeof err);
    CHECK(rc == 0 && tok == 1, "penalty 4: rc %d (%s), token %u, expected 0 and token 1", rc, err, tok);
}

int main(void)
{
    RUN(test_rng_reference);
    RUN(test_determinism);
    RUN(test_greedy_is_argmax);
    RUN(test_temperature_distribution);
    RUN(test_penalties);
    RUN(test_greedy_large_vocab);
    RUN(test_top_k_top_p_min_p);
    RUN(test_top_p_zero_is_greedy);
    RUN(test_top_k_ties);
    RUN(test_top_p_large_vocab);
    RUN(test_logit_bias);
    RUN(test_bad_parameters);
    RUN(test_sample_field_table);
    RUN(test_nonfinite_logits);
    RUN(test_penalty_saturates);
    return th_finish();
}
