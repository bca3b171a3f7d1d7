/*
 * test_spec_draft.c - draft-model speculative decoding (engine/spec_draft.c,
 * issue 55).
 *
 * Greedy: the oracle is plain greedy decoding (prefill, then one
 * kipp_session_eval and kipp_sample_ex per token). Speculative generations
 * through kipp_gen with synthetic-tiny's q8_0 and affine4 twins as drafts, a
 * fixed draft length and the gate, alone and batched with a plain gen in one
 * kipp_eval_batch, must emit the same ids bitwise.
 *
 * Sampled: speculative sampling must keep the target's distribution. On the
 * in-memory fixture model (tests/fixture_model.h, fast), the first token a
 * speculative step emits is drawn N times (seeds 0..N-1), and a chi-square
 * against the target's own distribution, computed here from its logits row
 * (softmax of logit / T over the top k, independent of kipp_sample_probs),
 * must stay under the 0.999 quantile. The draft samples from a flatter law
 * (its temperature differs), so the rejection step matters: with the test
 * hook kipp_spec_broken_residual (a rejected row resampled from p instead of
 * max(0, p - q)) the same statistic must exceed the quantile by far.
 *
 * Bad input: a draft with another vocabulary size or tokenizer is refused,
 * naming the difference.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/spec_impl.h"
#include "engine/tokenizer_impl.h"
#include "tests/fixture_model.h"
#include "tests/test_harness.h"

#define MAXG 40

static kipp_model *target;

/* ---- greedy exactness on synthetic-tiny ---- */

static uint32_t oracle(const uint32_t *prompt, uint32_t n, uint32_t max_new, const kipp_sample_params *p0, uint32_t *out)
{
    kipp_model_info info;
    kipp_model_get_info(target, &info);
    float *lg = malloc((size_t)info.vocab_size * sizeof *lg);
    kipp_session *s = NULL;
    kipp_rng rng;
    kipp_rng_seed(&rng, 1);
    uint32_t hist[256];
    memcpy(hist, prompt, n * sizeof *hist);
    CHECK(kipp_session_create(target, 256, &s, NULL, 0) == 0, "session");
    CHECK(kipp_session_eval(s, prompt, n, lg, NULL, 0) == 0, "prefill");
    uint32_t g = 0;
    while (g < max_new) {
        uint32_t t;
        kipp_sample_params p = *p0;
        p.history = hist, p.history_len = n + g, p.n_prompt_history = n;
        CHECK(kipp_sample_ex(lg, info.vocab_size, &p, &rng, &t, NULL, 0) == 0, "sample");
        if (t == info.stop_ids[0] || (info.n_stop > 1 && t == info.stop_ids[1])) break;
        hist[n + g] = t, out[g++] = t;
        if (g < max_new) CHECK(kipp_session_eval(s, &t, 1, lg, NULL, 0) == 0, "decode");
    }
    kipp_session_destroy(s);
    free(lg);
    return g;
}

/* k gens stepped together, one kipp_eval_batch per step; ids of gen i into out[i], counts returned in n_out. */
static void run_gens(int k, const uint32_t *prompt, uint32_t n, const kipp_gen_options *o, uint32_t out[][MAXG + 17],
                     uint32_t *n_out, kipp_spec_stats *st)
{
    kipp_session *s[2] = {0};
    kipp_gen *g[2] = {0};
    char err[256] = "";
    for (int i = 0; i < k; i++) {
        n_out[i] = 0;
        CHECK(kipp_session_create(target, 256, &s[i], NULL, 0) == 0, "session");
        CHECK(kipp_gen_create(target, s[i], prompt, n, &o[i], &g[i], err, sizeof err) == 0, "gen: %s", err);
    }
    for (int steps = 0; steps < 4 * MAXG; steps++) {
        kipp_batch_item items[2];
        int m = 0, who[2];
        for (int i = 0; i < k; i++) {
            if (!g[i] || kipp_gen_finished(g[i])) continue;
            CHECK(kipp_gen_next(g[i], 64, &items[m], err, sizeof err) == 0, "next: %s", err);
            who[m++] = i;
        }
        if (!m) break;
        CHECK(kipp_eval_batch(target, items, (size_t)m, err, sizeof err) == 0, "batch: %s", err);
        for (int q = 0; q < m; q++) {
            kipp_gen_event ev;
            CHECK(kipp_gen_advance(g[who[q]], 0.001, &ev, err, sizeof err) == 0, "advance: %s", err);
            for (uint32_t t = 0; t < ev.n_tokens && n_out[who[q]] < MAXG + 16; t++) out[who[q]][n_out[who[q]]++] = ev.tokens[t];
        }
    }
    if (st && g[0] && kipp_gen_spec(g[0])) kipp_spec_get_stats(kipp_gen_spec(g[0]), st);
    for (int i = 0; i < k; i++) kipp_gen_destroy(g[i]), kipp_session_destroy(s[i]);
}

static void greedy_case(kipp_model *dm, const char *name, const char *text, float repetition_penalty)
{
    uint32_t prompt[128], want[MAXG], got[2][MAXG + 17], n_got[2];
    size_t n = 0;
    CHECK(kipp_tokenize(target, text, strlen(text), 0, prompt, 128, &n, NULL, 0) == 0 && n, "tokenize");
    kipp_sample_params sp = kipp_sample_params_default();
    sp.repetition_penalty = repetition_penalty; /* still greedy; a varied output makes the twin disagree at times */
    uint32_t n_want = oracle(prompt, (uint32_t)n, MAXG, &sp, want);
    kipp_gen_options o[2] = {{.sp = sp, .max_tokens = MAXG, .spec = 1}, {.sp = sp, .max_tokens = MAXG}};
    o[0].spec_opts = (kipp_spec_options){.draft_model = dm, .k_max = 4, .fixed_k = 1};
    for (int mode = 0; mode < 3; mode++) { /* fixed k alone, the gate alone, fixed k batched with a plain gen */
        o[0].spec_opts.fixed_k = mode != 1;
        kipp_spec_stats st = {0};
        run_gens(mode == 2 ? 2 : 1, prompt, (uint32_t)n, o, got, n_got, &st);
        for (int i = 0; i < (mode == 2 ? 2 : 1); i++)
            CHECK(n_got[i] == n_want && !memcmp(got[i], want, n_want * sizeof *want),
                  "%s draft, mode %d, gen %d: %u ids differ from the plain greedy oracle's %u", name, mode, i,
                  n_got[i], n_want);
        if (mode == 0)
            CHECK(st.drafted > 0 && st.accepted > 0, "%s draft: drafted %llu, accepted %llu: the twin never agreed",
                  name, (unsigned long long)st.drafted, (unsigned long long)st.accepted);
        printf("-- %s draft, penalty %.1f, mode %d: acceptance %llu/%llu, %llu tokens in %llu verifications\n", name,
               repetition_penalty, mode,
               (unsigned long long)st.accepted, (unsigned long long)st.drafted, (unsigned long long)st.emitted,
               (unsigned long long)st.steps);
    }
    uint32_t distinct = 0;
    for (uint32_t i = 1; i < n_want; i++) distinct += want[i] != want[i - 1];
    printf("-- %s draft, penalty %.1f: the oracle's %u tokens change %u times\n", name, repetition_penalty, n_want, distinct);
}

static void test_greedy_twins(void)
{
    static const char *twins[] = {"synthetic-tiny-q8_0", "synthetic-tiny-affine4_gs32"};
    for (int i = 0; i < 2; i++) {
        kipp_model *dm = NULL;
        if (th_open_model(twins[i], &dm)) return;
        greedy_case(dm, twins[i], "The quick brown fox jumps over the lazy dog, again and again.", 1.0f);
        greedy_case(dm, twins[i], "one two three one two three", 1.6f);
        kipp_model_close(dm);
    }
}

/* Refused drafts: another vocabulary size, another token text. */
static void test_refused(void)
{
    kipp_model *dm = NULL;
    char err[256] = "";
    if (th_open_model("synthetic-tiny-q8_0", &dm)) return;
    CHECK(kipp_draft_check(target, dm, err, sizeof err) == 0, "the q8_0 twin refused: %s", err);
    dm->view.dims.vocab_size--;
    kipp_spec *sp = NULL;
    kipp_spec_options so = {.draft_model = dm};
    CHECK(kipp_spec_create(target, &so, &sp, err, sizeof err) == KIPP_EINVAL && strstr(err, "vocabulary"),
          "a smaller vocabulary: '%s'", err);
    dm->view.dims.vocab_size++;
    kipp_str *toks = (kipp_str *)dm->tok->tokens, saved = toks[300]; /* the parsed array, heap memory */
    toks[300] = (kipp_str){"zzz-not-a-token", 15};
    CHECK(kipp_draft_check(target, dm, err, sizeof err) == KIPP_EINVAL && strstr(err, "token 300") &&
              strstr(err, "zzz-not-a-token"),
          "another token text: '%s'", err);
    toks[300] = saved;
    kipp_model_close(dm);
}

/* ---- speculative sampling on the fixture model ---- */

#define N_DRAWS 2000
#define TOP_K 6

/* The target's law at the row after ids[n], from its logits: softmax(logit / t) over the top k. */
static void target_law(fx_model *m, const uint32_t *ids, uint32_t n, float t, double *law)
{
    float lg[FX_VOCAB];
    kipp_session *s = NULL;
    CHECK(kipp_session_create(&m->model, 64, &s, NULL, 0) == 0, "session");
    CHECK(kipp_session_eval(s, ids, n, lg, NULL, 0) == 0, "eval");
    kipp_session_destroy(s);
    int top[TOP_K];
    for (int j = 0; j < TOP_K; j++) { /* the k largest, ties to the lower id (no ties in practice) */
        top[j] = -1;
        for (int v = 0; v < (int)FX_VOCAB; v++) {
            int used = 0;
            for (int i = 0; i < j; i++) used |= top[i] == v;
            if (!used && (top[j] < 0 || lg[v] > lg[top[j]])) top[j] = v;
        }
    }
    double z = 0;
    memset(law, 0, FX_VOCAB * sizeof *law);
    for (int j = 0; j < TOP_K; j++) z += law[top[j]] = exp(((double)lg[top[j]] - lg[top[0]]) / t);
    for (int j = 0; j < TOP_K; j++) law[top[j]] /= z;
}

/* Chi-square of N_DRAWS first emitted tokens against law; *df gets the degrees of freedom. */
static double first_token_chisq(fx_model *tm, fx_model *dm, float t_target, float t_draft, const double *law, int *df)
{
    uint32_t ids[12], counts[FX_VOCAB] = {0}, n = 12;
    fx_tokens(ids, n, 5);
    kipp_session *s = NULL;
    kipp_spec *sp = NULL;
    char err[256] = "";
    kipp_spec_options so = {.draft_model = &dm->model, .k_max = 2, .fixed_k = 1};
    CHECK(kipp_spec_create(&tm->model, &so, &sp, err, sizeof err) == 0, "spec: %s", err);
    CHECK(kipp_session_create(&tm->model, 64, &s, NULL, 0) == 0, "session");
    CHECK(kipp_session_eval(s, ids, n - 1, NULL, NULL, 0) == 0, "prefill");
    kipp_sample_params pt = kipp_sample_params_default(), pd = pt;
    pt.temperature = t_target, pt.top_k = TOP_K, pd.temperature = t_draft, pd.top_k = TOP_K;
    float rows[3 * FX_VOCAB];
    uint32_t accepted = 0, rejected = 0;
    for (uint32_t seed = 0; seed < N_DRAWS && sp; seed++) {
        kipp_rng rng;
        kipp_rng_seed(&rng, seed);
        uint32_t tok[KIPP_SPEC_K_MAX + 1], nt = 0, out[KIPP_SPEC_K_MAX + 1], n_out = 0;
        int rc = kipp_spec_propose_ex(sp, s, ids, n, 8, &pd, &rng, tok, &nt, err, sizeof err);
        if (!rc) rc = kipp_session_eval_n(s, tok, nt, nt, rows, err, sizeof err);
        if (!rc) rc = kipp_spec_accept(sp, s, tok, nt, rows, &pt, &rng, 8, out, &n_out, err, sizeof err);
        CHECK(rc == 0 && n_out >= 1 && nt == 3, "step %u: rc %d (%s), %u drafted", seed, rc, err, nt);
        if (rc || !n_out) break;
        counts[out[0]]++;
        *(out[0] == tok[1] ? &accepted : &rejected) += 1;
        CHECK(kipp_session_truncate(s, n - 1, NULL, 0) == 0, "truncate");
    }
    double chi = 0, rest_law = 0, rest_n = 0;
    *df = -1;
    for (uint32_t v = 0; v < FX_VOCAB; v++) {
        double e = law[v] * N_DRAWS;
        if (e < 5) { /* small and impossible cells are lumped into one */
            rest_law += e, rest_n += counts[v];
            continue;
        }
        chi += (counts[v] - e) * (counts[v] - e) / e, (*df)++;
    }
    if (rest_law >= 5) chi += (rest_n - rest_law) * (rest_n - rest_law) / rest_law, (*df)++;
    else CHECK(rest_n <= 5, "%.0f draws outside the target's support (expected %.2f)", rest_n, rest_law);
    printf("-- chi-square %.2f, %d dof, draft token accepted %u and rejected %u times\n", chi, *df, accepted, rejected);
    kipp_session_destroy(s);
    kipp_spec_destroy(sp);
    return chi;
}

/* The 0.999 quantile of chi-square with df degrees of freedom, df 1..8. */
static double chisq_999(int df)
{
    static const double q[] = {10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124};
    return df >= 1 && df <= 8 ? q[df - 1] : 0.0;
}

static void test_sampled_law(void)
{
    char err[256] = "";
    fx_rand_state = 0x1234567u;
    fx_model *tm = fx_model_create("cpu", err, sizeof err);
    fx_rand_state = 0x1234567u;
    fx_model *same = fx_model_create("cpu", err, sizeof err); /* the same weights: a draft that differs by law only */
    fx_rand_state = 0x89abcdeu;
    fx_model *other = fx_model_create("cpu", err, sizeof err); /* unrelated weights */
    CHECK(tm && same && other, "fixtures: %s", err);
    if (!tm || !same || !other) return;
    uint32_t ids[12];
    fx_tokens(ids, 12, 5);
    double law[FX_VOCAB];
    target_law(tm, ids, 12, 0.7f, law);
    int df = 0;
    struct { fx_model *d; float t_draft; int broken; const char *what; } cases[] = {
        {same, 0.7f, 0, "same weights and law"},
        {same, 2.5f, 0, "same weights, flatter draft law"},
        {other, 0.7f, 0, "unrelated draft"},
        {same, 2.5f, 1, "flatter draft law, BROKEN rejection step"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kipp_spec_broken_residual = cases[c].broken;
        double chi = first_token_chisq(tm, cases[c].d, 0.7f, cases[c].t_draft, law, &df);
        kipp_spec_broken_residual = 0;
        CHECK(df >= 1 && df <= 8, "%s: %d degrees of freedom, expected 1..%d", cases[c].what, df, TOP_K - 1);
        if (!cases[c].broken)
            CHECK(chi < chisq_999(df), "%s: chi-square %.2f with %d dof is above the 0.999 quantile %.3f",
                  cases[c].what, chi, df, chisq_999(df));
        else
            CHECK(chi > 3 * chisq_999(df), "%s: chi-square %.2f with %d dof, expected far above %.3f: the test "
                  "cannot see a wrong rejection step", cases[c].what, chi, df, chisq_999(df));
    }
    fx_model_destroy(tm), fx_model_destroy(same), fx_model_destroy(other);
}

int main(void)
{
    RUN(test_sampled_law);
    if (th_open_model("synthetic-tiny", &target)) return th_finish();
    RUN(test_refused);
    RUN(test_greedy_twins);
    kipp_model_close(target);
    return th_finish();
}
