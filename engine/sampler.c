/*
 * sampler.c - kipp_sample_ex, the one sampling entry point shared by the CLI and
 * the server (seed 000, "Server and API surface": temperature, top_p, top_k,
 * min_p, frequency/presence/repetition penalties over a window, logit_bias, seed).
 *
 * Order of operations (each stage sees the previous stage's output):
 *   1. logit_bias               (additive, OpenAI)
 *   2. repetition penalty       (CTRL, Keskar et al. 2019: positive logits / p,
 *                                negative * p, once per distinct token among the
 *                                last penalty_window of history, prompt included,
 *                                as llama.cpp penalty_last_n; saturated at +-FLT_MAX)
 *   3. frequency / presence     (OpenAI: logit -= count*freq + (count>0)*presence,
 *                                counting generated tokens only: history after
 *                                its first n_prompt_history entries)
 *   4. temperature 0 or top_p 0 => argmax (ties -> lowest id), done
 *   5. temperature scaling      (logit / T)
 *   6. top_k                    (keep the k largest; ties at the boundary -> lower ids)
 *   7. softmax                  (double precision, max-subtracted)
 *   8. top_p                    (nucleus, Holtzman et al. 2020: smallest prefix of the
 *                                descending order whose mass reaches p; at least one)
 *   9. min_p                    (drop p < min_p * p_max)
 *  10. renormalise and draw     (xoshiro256**, u in [0,1) from the top 53 bits)
 * The random generator is Blackman & Vigna's xoshiro256**, seeded via splitmix64.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

/* ---- xoshiro256** ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kipp_rng_seed(kipp_rng *rng, uint64_t seed)
{
    if (!rng) return; /* no error channel here; kipp_sample_ex refuses the NULL rng it would need */
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(kipp_rng *rng)
{
    uint64_t *s = rng->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform double in [0, 1): the top 53 bits scaled by 2^-53. */
static double rng_uniform(kipp_rng *rng) { return (double)(xoshiro_next(rng) >> 11) * 0x1.0p-53; }

kipp_sample_params kipp_sample_params_default(void)
{
    kipp_sample_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.penalty_window = 64;
    return p;
}

/* ---- validation ---- */

/* The one table of numeric sampling fields and their ranges (kipp.h). The
 * repetition penalty's 1/100..100 covers every published setting (1.0-1.5);
 * apply_repetition saturates whatever extreme logits meet it. */
#define SP(f) offsetof(kipp_sample_params, f)
static const kipp_sample_field FIELDS[] = {
    {.name = "temperature", .flag = "--temperature", .metavar = "T", .offset = SP(temperature), .lo = 0, .hi = FLT_MAX,
     .expect = "a finite number >= 0 (0 = greedy)", .dflt = "0 (greedy)"},
    {.name = "top_k", .flag = "--top-k", .metavar = "K", .offset = SP(top_k), .is_int = 1, .lo = 0, .hi = 1 << 30,
     .expect = "an integer in 0..1073741824 (0 = off)", .dflt = "0 (off)"},
    {.name = "top_p", .flag = "--top-p", .metavar = "P", .offset = SP(top_p), .lo = 0, .hi = 1,
     .expect = "a number in [0, 1] (0 = greedy)", .dflt = "1 (off)"},
    {.name = "min_p", .flag = "--min-p", .metavar = "M", .offset = SP(min_p), .lo = 0, .hi = 1,
     .expect = "a number in [0, 1]", .dflt = "0 (off)"},
    {.name = "repetition_penalty", .flag = "--repeat-penalty", .metavar = "R", .offset = SP(repetition_penalty),
     .lo = 0.01, .hi = 100, .expect = "a number in [0.01, 100] (1 = off; CTRL, on the last 64 tokens)", .dflt = "1 (off)"},
    {.name = "frequency_penalty", .flag = "--frequency-penalty", .metavar = "F", .offset = SP(frequency_penalty),
     .lo = -2, .hi = 2, .expect = "a number in [-2, 2]", .dflt = "0"},
    {.name = "presence_penalty", .flag = "--presence-penalty", .metavar = "F", .offset = SP(presence_penalty),
     .lo = -2, .hi = 2, .expect = "a number in [-2, 2]", .dflt = "0"},
};
#undef SP
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

const kipp_sample_field *kipp_sample_fields(size_t *n)
{
    *n = N_FIELDS;
    return FIELDS;
}

const kipp_sample_field *kipp_sample_field_find(const char *name)
{
    int flag = name && !strncmp(name, "--", 2);
    for (size_t i = 0; name && i < N_FIELDS; i++)
        if (!strcmp(name, flag ? FIELDS[i].flag : FIELDS[i].name)) return &FIELDS[i];
    return NULL;
}

void kipp_sample_field_set(kipp_sample_params *p, const kipp_sample_field *f, double x)
{
    char *m = (char *)p + f->offset;
    if (f->is_int) *(int *)(void *)m = (int)x;
    else *(float *)(void *)m = (float)x;
}

double kipp_sample_field_get(const kipp_sample_params *p, const kipp_sample_field *f)
{
    const char *m = (const char *)p + f->offset;
    return f->is_int ? (double)*(const int *)(const void *)m : (double)*(const float *)(const void *)m;
}

static int check_params(const kipp_sample_params *p, size_t n_vocab, char *err, size_t errlen)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        /* a float member holds its bounds rounded to float (0.01 is 0.0099999998f) */
        double x = kipp_sample_field_get(p, &FIELDS[i]), lo = FIELDS[i].lo, hi = FIELDS[i].hi;
        if (!FIELDS[i].is_int) lo = (float)lo, hi = (float)hi;
        if (!(x >= lo && x <= hi))
            return kipp_err(err, errlen, KIPP_EINVAL, "%s %g is invalid, expected %s", FIELDS[i].name, x, FIELDS[i].expect);
    }
    if (p->history_len && !p->history)
        return kipp_err(err, errlen, KIPP_EINVAL, "history is NULL with history_len %zu", p->history_len);
    if (p->n_prompt_history > p->history_len)
        return kipp_err(err, errlen, KIPP_EINVAL, "n_prompt_history %zu is above history_len %zu, expected at most it",
                        p->n_prompt_history, p->history_len);
    for (size_t i = 0; i < p->history_len; i++)
        if (p->history[i] >= n_vocab)
            return kipp_err(err, errlen, KIPP_ERANGE, "history token %u (index %zu) is out of range, expected an id below %zu",
                            p->history[i], i, n_vocab);
    if (p->n_logit_bias && !p->logit_bias)
        return kipp_err(err, errlen, KIPP_EINVAL, "logit_bias is NULL with n_logit_bias %zu", p->n_logit_bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token >= n_vocab)
            return kipp_err(err, errlen, KIPP_ERANGE, "logit_bias token %u is out of range, expected an id below %zu",
                            p->logit_bias[i].token, n_vocab);
        if (!isfinite(p->logit_bias[i].bias))
            return kipp_err(err, errlen, KIPP_EINVAL, "logit_bias %g for token %u is invalid, expected a finite number",
                            (double)p->logit_bias[i].bias, p->logit_bias[i].token);
    }
    return 0;
}

/* ---- stages 1-3: adjust logits in x (a private copy) ---- */

static void apply_bias(float *x, const kipp_sample_params *p)
{
    for (size_t i = 0; i < p->n_logit_bias; i++) x[p->logit_bias[i].token] += p->logit_bias[i].bias;
}

/* counts[] ([n_vocab], zeroed) marks or counts tokens and is cleared again on
 * the way out, so each pass costs O(tokens looked at), not O(vocab). */
static void apply_repetition(float *x, uint32_t *counts, const kipp_sample_params *p)
{
    size_t w = p->history_len < p->penalty_window ? p->history_len : p->penalty_window;
    if (w == 0 || !p->history || p->repetition_penalty == 1.0f) return; /* history may be NULL */
    const uint32_t *h = p->history + (p->history_len - w);
    for (size_t i = 0; i < w; i++) {
        uint32_t t = h[i];
        if (counts[t]) continue; /* once per distinct token */
        counts[t] = 1;
        float v = x[t] > 0.0f ? x[t] / p->repetition_penalty : x[t] * p->repetition_penalty;
        /* The penalty is monotone, so saturating keeps the order it means to impose
         * where a large finite logit and a small (or large) penalty would overflow. */
        x[t] = isinf(v) ? copysignf(FLT_MAX, v) : v;
    }
    for (size_t i = 0; i < w; i++) counts[h[i]] = 0;
}

/* OpenAI frequency/presence over the generated part of history, all of it. */
static void apply_freq_presence(float *x, uint32_t *counts, const kipp_sample_params *p)
{
    if (!p->history || (p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f)) return;
    const uint32_t *h = p->history + p->n_prompt_history;
    size_t n = p->history_len - p->n_prompt_history;
    for (size_t i = 0; i < n; i++) counts[h[i]]++;
    for (size_t i = 0; i < n; i++) {
        uint32_t t = h[i], c = counts[t];
        if (!c) continue; /* already penalised */
        x[t] -= (float)c * p->frequency_penalty + p->presence_penalty;
        counts[t] = 0;
    }
}

/* Blocks of SCAN floats: fixed-length inner loops the compiler vectorizes,
 * so the per-row passes over the vocabulary below run at SIMD width. */
#define SCAN 64

/* The index of the first x[i] for which bad(x[i]) holds (+/-inf or NaN when
 * allow_ninf is 0; NaN or +inf when it is 1), or n when none. */
static size_t first_nonfinite(const float *x, size_t n, int allow_ninf)
{
    const uint32_t ninf = allow_ninf ? 0xff800000u : 0; /* -inf's bits, or 0 (a finite value's) */
    size_t i = 0;
    for (; i + SCAN <= n; i += SCAN) {
        uint32_t bad = 0;
        for (size_t j = 0; j < SCAN; j++) { /* exponent all ones: inf or NaN */
            uint32_t u;
            memcpy(&u, x + i + j, sizeof u);
            bad |= ((u & 0x7f800000u) == 0x7f800000u) & (u != ninf);
        }
        if (bad) break;
    }
    for (; i < n; i++)
        if (!isfinite(x[i]) && !(allow_ninf && x[i] == -INFINITY)) return i;
    return n;
}

/* The first index of the largest value (x free of NaN): the lowest id wins
 * ties, as a strict left-to-right scan gives. The maximum comes from SCAN
 * lanes (max is exact, in any order), then the first index equal to it. */
static uint32_t argmax(const float *x, size_t n)
{
    float lane[SCAN], m = x[0];
    size_t i = 0;
    if (n >= SCAN) {
        memcpy(lane, x, sizeof lane);
        for (i = SCAN; i + SCAN <= n; i += SCAN)
            for (size_t j = 0; j < SCAN; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
        for (size_t j = 0; j < SCAN; j++) m = lane[j] > m ? lane[j] : m;
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (i = 0; i + SCAN <= n; i += SCAN) {
        int hit = 0;
        for (size_t j = 0; j < SCAN; j++) hit |= x[i + j] == m;
        if (hit) break;
    }
    while (x[i] != m) i++; /* m is some x[k], so this stops at or before k */
    return (uint32_t)i;
}

/* ---- stages 5-10 over a candidate list ---- */

typedef struct {
    float logit;
    uint32_t id;
    double p;
} cand;

/* Descending logit, then ascending id: a total order, so results never depend on qsort. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Softmax over c[0..n): fills c[i].p. */
static void softmax(cand *c, size_t n)
{
    float mx = c[0].logit;
    for (size_t i = 1; i < n; i++)
        if (c[i].logit > mx) mx = c[i].logit;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (c[i].p = exp((double)c[i].logit - mx));
    for (size_t i = 0; i < n; i++) c[i].p /= sum;
}

/* Nucleus on a sorted list: keep the shortest prefix whose mass reaches top_p. */
static size_t cut_top_p(const cand *c, size_t n, float top_p)
{
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum >= top_p) return i + 1;
    }
    return n;
}

/* min_p keeps p >= min_p * p_max; compacts c in place, preserving order. */
static size_t cut_min_p(cand *c, size_t n, float min_p)
{
    double pmax = 0.0;
    for (size_t i = 0; i < n; i++)
        if (c[i].p > pmax) pmax = c[i].p;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].p >= min_p * pmax) c[k++] = c[i];
    return k;
}

static uint32_t draw(const cand *c, size_t n, kipp_rng *rng)
{
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += c[i].p;
    double u = rng_uniform(rng) * total, cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (u < cum) return c[i].id;
    }
    for (size_t i = n; i-- > 0;) /* u*total rounded up to total: the last candidate with mass */
        if (c[i].p > 0.0) return c[i].id;
    return c[0].id;
}

/* a ranks before b in the total order of cand_cmp. */
static int better(const cand *a, const cand *b) { return cand_cmp(a, b) < 0; }

static void sift_down(cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l])) w = l; /* min-heap: the worst candidate at the root */
        if (r < n && better(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

/* Move the k best candidates to c[0..k), sorted: a k-element heap, O(n log k),
 * instead of sorting the whole vocabulary for every token. */
static size_t select_top_k(cand *c, size_t n, size_t k)
{
    for (size_t i = k / 2; i-- > 0;) sift_down(c, k, i);
    for (size_t i = k; i < n; i++)
        if (better(&c[i], &c[0])) {
            c[0] = c[i];
            sift_down(c, k, 0);
        }
    qsort(c, k, sizeof *c, cand_cmp);
    return k;
}

/* Sort only a descending prefix that contains the nucleus: the tokens with
 * p >= t form a prefix of the sorted order, so once their mass reaches top_p
 * the nucleus lies inside it. t starts at p_max/100 and falls by 100x. */
static size_t sorted_nucleus_prefix(cand *c, size_t n, float top_p)
{
    double pmax = 0.0;
    for (size_t i = 0; i < n; i++) pmax = c[i].p > pmax ? c[i].p : pmax;
    double t = pmax * 1e-2;
    for (;; t *= 1e-2) {
        double mass = 0.0;
        for (size_t i = 0; i < n; i++) mass += c[i].p >= t ? c[i].p : 0.0;
        if (mass >= top_p || t < 1e-300) break;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].p >= t || t < 1e-300) c[m++] = c[i];
    qsort(c, m, sizeof *c, cand_cmp);
    return m;
}

/* Stages 5-9 over x: the surviving candidates in c[0..n), each with its softmax
 * mass c[i].p (not renormalised over the survivors; draw() divides by their sum). */
static size_t scaled_candidates(const float *x, size_t n_vocab, const kipp_sample_params *p, cand *c)
{
    /* Subtracting the max before dividing keeps a tiny temperature from overflowing to
     * +Inf; softmax and every cut below are invariant to that shift. */
    float mx = x[argmax(x, n_vocab)];
    size_t n = 0;
    for (size_t i = 0; i < n_vocab; i++) /* masked tokens (-Inf) have p = 0 at every stage: no candidates */
        if (!p->allowed || x[i] != -INFINITY) c[n++] = (cand){(x[i] - mx) / p->temperature, (uint32_t)i, 0.0};
    int sorted = 0;
    if (p->top_k > 0 && (size_t)p->top_k < n) n = select_top_k(c, n, (size_t)p->top_k), sorted = 1;
    softmax(c, n);
    if (p->top_p < 1.0f) {
        if (!sorted) n = sorted_nucleus_prefix(c, n, p->top_p); /* top_k already sorted otherwise */
        n = cut_top_p(c, n, p->top_p);
    }
    if (p->min_p > 0.0f) n = cut_min_p(c, n, p->min_p); /* order-independent */
    return n;
}

/* Stages 1-3 and the mask over x[n_vocab], a copy of logits; counts[n_vocab] zeroed scratch. */
static int prepare(const float *logits, size_t n_vocab, const kipp_sample_params *p, float *x, uint32_t *counts,
                   char *err, size_t errlen)
{
    size_t bad = first_nonfinite(logits, n_vocab, 0);
    if (bad < n_vocab)
        return kipp_err(err, errlen, KIPP_ENUMERIC, "logit %zu is %g, expected a finite value", bad, (double)logits[bad]);
    apply_bias(x, p);
    apply_repetition(x, counts, p);
    apply_freq_presence(x, counts, p);
    /* Biases and penalties are finite, but their sum with a large logit need not be. */
    size_t n_allowed = n_vocab;
    if (p->allowed) {
        n_allowed = 0;
        for (size_t w = 0; w * 64 < n_vocab; w++) { /* a word at a time: masks are mostly all-set or all-clear */
            uint64_t b = p->allowed[w];
            size_t base = w * 64, m = n_vocab - base < 64 ? n_vocab - base : 64;
            if (m < 64) b &= (1ull << m) - 1;
            n_allowed += (size_t)__builtin_popcountll(b);
            if (b == ~0ull) continue;
            for (size_t i = 0; i < m; i++)
                if (!(b >> i & 1)) x[base + i] = -INFINITY; /* no argmax or max can pick it */
        }
    }
    if (!n_allowed) return kipp_err(err, errlen, KIPP_EINVAL, "the allowed-token mask is empty, expected at least one token");
    bad = first_nonfinite(x, n_vocab, p->allowed != NULL);
    if (bad < n_vocab)
        return kipp_err(err, errlen, KIPP_ENUMERIC, "logit %zu became %g after bias/penalties, expected a finite value", bad, (double)x[bad]);
    return 0;
}

/* A thread's scratch for sample_or_probs, kept between calls (freed at thread
 * exit): the logits copy, counts (all zero between calls: the apply_* stages
 * clear what they mark) and the candidates. A fresh malloc and calloc of a
 * vocabulary's floats per sampled row came from mmap, and their page faults
 * cost more than the sampling (the server samples every decoding row of a
 * step on its scheduler thread). */
typedef struct {
    float *x;
    uint32_t *counts;
    cand *c;
    size_t n, n_c;            /* entries x and counts hold; entries c holds */
} sample_scratch;

static pthread_key_t g_scratch_key;
static int g_scratch_ok;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg)
{
    sample_scratch *s = arg;
    free(s->x), free(s->counts), free(s->c), free(s);
}

static void scratch_key(void) { g_scratch_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0; }

/* This thread's scratch with room for n_vocab entries (candidates too when
 * want_c), or NULL when out of memory. */
static sample_scratch *scratch_get(size_t n_vocab, int want_c)
{
    pthread_once(&g_scratch_once, scratch_key);
    if (!g_scratch_ok) return NULL;
    sample_scratch *s = pthread_getspecific(g_scratch_key);
    if (!s && (!(s = calloc(1, sizeof *s)) || pthread_setspecific(g_scratch_key, s))) return free(s), NULL;
    if (s->n < n_vocab) {
        free(s->x), free(s->counts);
        s->x = malloc(n_vocab * sizeof *s->x), s->counts = calloc(n_vocab, sizeof *s->counts);
        s->n = s->x && s->counts ? n_vocab : 0;
        if (!s->n) return NULL;
    }
    if (want_c && s->n_c < n_vocab) {
        free(s->c);
        s->n_c = (s->c = malloc(n_vocab * sizeof *s->c)) ? n_vocab : 0;
        if (!s->n_c) return NULL;
    }
    return s;
}

/* Shared by kipp_sample_ex and kipp_sample_probs: the token (probs NULL) or the whole distribution. */
static int sample_or_probs(const float *logits, size_t n_vocab, const kipp_sample_params *p, kipp_rng *rng,
                           uint32_t *token, float *probs, char *err, size_t errlen)
{
    int rc = check_params(p, n_vocab, err, errlen);
    if (rc) return rc;
    int greedy = p->temperature == 0.0f || p->top_p == 0.0f;
    sample_scratch *sc = scratch_get(n_vocab, !greedy);
    if (!sc) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory sampling over %zu logits", n_vocab);
    float *x = sc->x;
    uint32_t *counts = sc->counts;
    cand *c = greedy ? NULL : sc->c;
    memcpy(x, logits, n_vocab * sizeof *x);
    rc = prepare(logits, n_vocab, p, x, counts, err, errlen);
    size_t n = !rc && !greedy ? scaled_candidates(x, n_vocab, p, c) : 0;
    if (!rc && !probs) *token = greedy ? argmax(x, n_vocab) : draw(c, n, rng);
    if (!rc && probs) {
        memset(probs, 0, n_vocab * sizeof *probs);
        if (greedy) probs[argmax(x, n_vocab)] = 1.0f;
        double total = 0.0;
        for (size_t i = 0; i < n; i++) total += c[i].p;
        for (size_t i = 0; i < n; i++) probs[c[i].id] = (float)(c[i].p / total);
    }
    return rc;
}

int kipp_sample_ex(const float *logits, size_t n_vocab, const kipp_sample_params *p, kipp_rng *rng,
                   uint32_t *token, char *err, size_t errlen)
{
    if (!logits || !p || !rng || !token || n_vocab == 0 || n_vocab > UINT32_MAX)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_sample_ex: NULL argument or vocabulary size %zu, expected 1..2^32-1", n_vocab);
    return sample_or_probs(logits, n_vocab, p, rng, token, NULL, err, errlen);
}

int kipp_sample_probs(const float *logits, size_t n_vocab, const kipp_sample_params *p, float *probs, char *err,
                      size_t errlen)
{
    if (!logits || !p || !probs || n_vocab == 0 || n_vocab > UINT32_MAX)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_sample_probs: NULL argument or vocabulary size %zu, expected 1..2^32-1", n_vocab);
    return sample_or_probs(logits, n_vocab, p, NULL, NULL, probs, err, errlen);
}

double kipp_rng_uniform(kipp_rng *rng) { return rng ? rng_uniform(rng) : 0.0; }
