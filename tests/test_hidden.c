/*
 * test_hidden.c - kipp_batch_item.hidden, the final-RMSNormed state of an
 * item's last position (the embedding path, issue 56), and the model's task.
 *
 * Oracles: on the ref backend, the head applied to `hidden` in FP64 (the
 * file's BF16 output rows, read here) reproduces the logits the same eval
 * returns, so `hidden` is the head's input, the final-norm state; asking for
 * it changes no logit (bitwise against an eval without it). The cpu backend's
 * hidden matches ref's within the cross-backend bound, with the head skipped
 * (logits_count 0), and a batch mixing hidden-only, hidden-and-logits and
 * logits-only items equals each item evaluated alone, bitwise. Model: the
 * synthetic-tiny-embedding twin (`make models-test`).
 */
#include <string.h>

#include "engine/internal.h"
#include "tests/test_harness.h"

#define NMSE_CPU_MAX 1e-4 /* the cross-backend tolerance (test_cpu_backend.c), any KIPP_BF16_ACT mode */
#define N_TOK 23

static const uint32_t toks[N_TOK] = {785,  3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13,  151644, 872,
                                     9707, 1879, 11,    1246,  525,   498, 30,  220,   16,   17, 151643};

static double nmse(const float *got, const float *want, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) e += ((double)got[i] - want[i]) * ((double)got[i] - want[i]), s += (double)want[i] * want[i];
    return s > 0 ? e / s : e;
}

static float bf16_at(const kipp_tensor_view *v, uint64_t i)
{
    uint32_t u = (uint32_t)((const uint16_t *)v->data)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One item of n tokens on a fresh session; 0 on success. */
static int eval_one(kipp_model *m, const uint32_t *t, uint32_t n, uint32_t nlog, float *logits, float *hidden)
{
    kipp_session *s = NULL;
    char err[256] = "";
    int rc = kipp_session_create(m, 64, &s, err, sizeof err);
    kipp_batch_item it = {.session = s, .tokens = t, .token_count = n, .logits_count = nlog, .logits = logits,
                          .hidden = hidden};
    if (!rc) rc = kipp_eval_batch(m, &it, 1, err, sizeof err);
    if (!rc && kipp_session_length(s) != n) rc = -1, snprintf(err, sizeof err, "length %u, expected %u", kipp_session_length(s), n);
    CHECK(rc == 0, "eval of %u tokens: %s", n, err);
    kipp_session_destroy(s);
    return rc;
}

static int open_model(const char *backend, kipp_model **m)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny-embedding.gguf", th_models_dir());
    int rc = kipp_model_open(path, backend, NULL, m, err, sizeof err);
    CHECK(rc == 0, "open %s (%s): %s (run `make models-test`)", path, backend, err);
    return rc;
}

static void test_task_and_variant(void)
{
    kipp_model *m = NULL;
    if (open_model("none", &m)) return;
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    CHECK(kipp_model_task(m) == KIPP_TASK_EMBED, "task %d, expected KIPP_TASK_EMBED", kipp_model_task(m));
    CHECK(info.variant && !strcmp(info.variant, "embedding"), "variant '%s'", info.variant ? info.variant : "(null)");
    CHECK(!info.has_chat, "an embedding model has no chat template");
    kipp_model_close(m);
    CHECK(kipp_model_task(NULL) == KIPP_EINVAL, "NULL model accepted");
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny-reranker.gguf", th_models_dir());
    CHECK(kipp_model_open(path, "none", NULL, &m, err, sizeof err) == 0, "%s: %s", path, err);
    if (m) CHECK(kipp_model_task(m) == KIPP_TASK_RERANK, "reranker task %d", kipp_model_task(m));
    kipp_model_close(m);
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    m = NULL;
    CHECK(kipp_model_open(path, "none", NULL, &m, err, sizeof err) == 0, "%s: %s", path, err);
    if (m) CHECK(kipp_model_task(m) == KIPP_TASK_GENERATE, "synthetic-tiny task %d", kipp_model_task(m));
    kipp_model_close(m);
}

/* ref: hidden is the head's input (FP64 head over it = the logits), logits unchanged by asking for it. */
static void test_ref_hidden_is_head_input(void)
{
    kipp_model *m = NULL;
    if (open_model("ref", &m)) return;
    const kipp_dims *d = &m->view.dims;
    size_t V = d->vocab_size, D = d->d_model;
    float *l0 = malloc(V * sizeof *l0), *l1 = malloc(V * sizeof *l1), *h = malloc(D * sizeof *h);
    double worst = 0;
    if (!eval_one(m, toks, N_TOK, 1, l0, NULL) && !eval_one(m, toks, N_TOK, 1, l1, h)) {
        CHECK(!memcmp(l0, l1, V * sizeof *l0), "logits changed when hidden was asked for");
        const kipp_tensor_view *w = &m->view.w.output;
        for (size_t v = 0; v < V; v += 7) { /* every 7th row: the whole head is slow in FP64 */
            double acc = 0;
            for (size_t i = 0; i < D; i++) acc += (double)bf16_at(w, v * D + i) * h[i];
            double e = fabs(acc - l0[v]) / (1 + fabs(acc));
            if (e > worst) worst = e;
        }
        CHECK(worst < 1e-5, "head(hidden) differs from the logits by %g (relative)", worst);
        double ss = 0;
        for (size_t i = 0; i < D; i++) ss += (double)h[i] * h[i];
        CHECK(ss > 0 && isfinite(ss), "hidden norm^2 %g", ss);
    }
    printf("  ref: head(hidden) vs logits worst relative error %.3g\n", worst);
    free(l0), free(l1), free(h);
    kipp_model_close(m);
}

/* cpu (head skipped) against ref; a mixed batch equals isolated items bitwise. */
static void test_cpu_hidden_and_batch(void)
{
    kipp_model *r = NULL, *c = NULL;
    if (open_model("ref", &r) || open_model("cpu", &c)) {
        kipp_model_close(r);
        return;
    }
    size_t V = c->view.dims.vocab_size, D = c->view.dims.d_model;
    float *hr = malloc(D * 4), *hc = malloc(D * 4), *iso_h[3], *iso_l[3], *bh[3], *bl[3];
    for (int i = 0; i < 3; i++) iso_h[i] = calloc(D, 4), bh[i] = calloc(D, 4), iso_l[i] = calloc(V, 4), bl[i] = calloc(V, 4);
    if (!eval_one(r, toks, N_TOK, 0, NULL, hr) && !eval_one(c, toks, N_TOK, 0, NULL, hc)) {
        double e = nmse(hc, hr, D);
        printf("  cpu vs ref hidden NMSE %.3g\n", e);
        CHECK(e <= NMSE_CPU_MAX, "cpu hidden NMSE %g > %g", e, NMSE_CPU_MAX);
    }
    /* item 0: hidden only; 1: hidden + logits; 2: logits only. Lengths interleave rows in a round. */
    const uint32_t len[3] = {N_TOK, 9, 14}, off[3] = {0, 5, 2};
    const uint32_t nlog[3] = {0, 1, 1};
    int ok = 1;
    for (int i = 0; i < 3 && ok; i++)
        ok = !eval_one(c, toks + off[i], len[i], nlog[i], nlog[i] ? iso_l[i] : NULL, i < 2 ? iso_h[i] : NULL);
    kipp_session *s[3] = {0};
    char err[256] = "";
    kipp_batch_item it[3];
    for (int i = 0; i < 3 && ok; i++) {
        ok = !kipp_session_create(c, 64, &s[i], err, sizeof err);
        it[i] = (kipp_batch_item){.session = s[i], .tokens = toks + off[i], .token_count = len[i],
                                  .logits_count = nlog[i], .logits = nlog[i] ? bl[i] : NULL, .hidden = i < 2 ? bh[i] : NULL};
    }
    if (ok) CHECK(kipp_eval_batch(c, it, 3, err, sizeof err) == 0, "batch: %s", err);
    for (int i = 0; i < 3 && ok; i++) {
        CHECK(!memcmp(iso_h[i], bh[i], D * 4), "item %d: batched hidden differs from isolated", i);
        CHECK(!memcmp(iso_l[i], bl[i], V * 4), "item %d: batched logits differ from isolated", i);
        CHECK(kipp_session_length(s[i]) == len[i], "item %d length %u", i, kipp_session_length(s[i]));
    }
    for (int i = 0; i < 3; i++) kipp_session_destroy(s[i]), free(iso_h[i]), free(bh[i]), free(iso_l[i]), free(bl[i]);
    free(hr), free(hc);
    kipp_model_close(r);
    kipp_model_close(c);
}

int main(void)
{
    RUN(test_task_and_variant);
    RUN(test_ref_hidden_is_head_input);
    RUN(test_cpu_hidden_and_batch);
    return th_finish();
}
