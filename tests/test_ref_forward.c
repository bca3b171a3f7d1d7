/*
 * test_ref_forward.c - the ref backend's gates (seed 000 Phase 1 exit, Phase 2,
 * "KV cache" paged-CPU gate).
 *
 * Against the transformers golden vectors (tests/vectors/MANIFEST.json, written
 * by tools/gen_vectors.py from the same synthetic checkpoints):
 *   - kipp_tokenize of each prompt == the HF token ids, exactly;
 *   - final-position logits: identical argmax and NMSE <= 5e-5;
 *   - every stored decode position (greedy tokens fed one by one through the
 *     KV cache): identical argmax and NMSE <= 5e-5;
 *   - cached decode vs a no-cache recompute (fresh session, whole prefix in one
 *     eval) at every checked position: NMSE <= 1e-6 and identical argmax.
 * Structural gates (fixture model and the long multi-block prompt):
 *   - eval_n rows bitwise-equal to per-position evaluation;
 *   - a scrambled block table gives logits bitwise-identical to identity.
 */
#include <jansson.h>
#include <string.h>

#include "tests/fixture_model.h"
#include "tests/test_harness.h"

#define NMSE_HF 5e-5
#define NMSE_CACHE 1e-6

static uint32_t argmax_f(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (uint32_t)b;
}

/* ---- structural gates, on any model ---- */

/* eval_n(n rows) == n separate one-token evaluations, bitwise. */
static void check_eval_n_bitwise(kipp_model *m, const uint32_t *ids, uint32_t n, uint32_t rows)
{
    uint32_t V = m->view.dims.vocab_size;
    float *multi = malloc((size_t)rows * V * 4), *one = malloc((size_t)V * 4);
    kipp_session *a = NULL, *b = NULL;
    CHECK(kipp_session_create(m, n, &a, NULL, 0) == 0 && kipp_session_create(m, n, &b, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval_n(a, ids, n, rows, multi, NULL, 0) == 0, "eval_n");
    CHECK(kipp_session_eval(b, ids, n - rows, NULL, NULL, 0) == 0, "prefix");
    for (uint32_t r = 0; r < rows; r++) {
        CHECK(kipp_session_eval(b, ids + n - rows + r, 1, one, NULL, 0) == 0, "step %u", r);
        CHECK(!memcmp(one, multi + (size_t)r * V, (size_t)V * 4), "eval_n row %u of %u differs from per-position", r, rows);
    }
    kipp_session_destroy(a);
    kipp_session_destroy(b);
    free(multi), free(one);
}

/* A non-identity block table relocates every position but changes no value. */
static void check_scrambled_blocks(kipp_model *m, const uint32_t *ids, uint32_t n)
{
    uint32_t V = m->view.dims.vocab_size;
    float *ident = malloc((size_t)V * 4), *scr = malloc((size_t)V * 4);
    kipp_session *a = NULL, *b = NULL;
    char err[256] = "";
    CHECK(kipp_session_create(m, n, &a, NULL, 0) == 0 && kipp_session_create(m, n, &b, NULL, 0) == 0, "create");
    uint32_t nb = b->n_blocks, *perm = malloc(nb * 4);
    CHECK(nb >= 3, "prompt of %u tokens spans %u blocks, expected >= 3", n, nb);
    for (uint32_t i = 0; i < nb; i++) perm[i] = (i * 5u + 2u) % nb; /* 5 is coprime to nb here */
    if (nb % 5 == 0)
        for (uint32_t i = 0; i < nb; i++) perm[i] = nb - 1 - i;
    CHECK(kipp_session_set_block_table(b, perm, err, sizeof err) == 0, "set table: %s", err);
    CHECK(kipp_session_eval(a, ids, n, ident, NULL, 0) == 0, "identity eval");
    CHECK(kipp_session_eval(b, ids, n, scr, NULL, 0) == 0, "scrambled eval");
    CHECK(!memcmp(ident, scr, (size_t)V * 4), "scrambled block table changed the logits");
    kipp_session_destroy(a);
    kipp_session_destroy(b);
    free(perm), free(ident), free(scr);
}

/* Decode one token at a time from a prompt and compare each step with a fresh
 * session evaluating the whole prefix in one call (the no-cache recompute). */
static void check_cached_decode(kipp_model *m, const uint32_t *ids, uint32_t prompt, uint32_t steps)
{
    uint32_t V = m->view.dims.vocab_size, n = prompt + steps;
    float *cached = malloc((size_t)V * 4), *full = malloc((size_t)V * 4);
    kipp_session *s = NULL;
    CHECK(kipp_session_create(m, n, &s, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval(s, ids, prompt, NULL, NULL, 0) == 0, "prefill");
    for (uint32_t k = 0; k < steps; k++) {
        CHECK(kipp_session_eval(s, ids + prompt + k, 1, cached, NULL, 0) == 0, "decode %u", k);
        kipp_session *f = NULL;
        CHECK(kipp_session_create(m, n, &f, NULL, 0) == 0, "create recompute");
        CHECK(kipp_session_eval(f, ids, prompt + k + 1, full, NULL, 0) == 0, "recompute %u", k);
        kipp_session_destroy(f);
        double e = th_nmse(cached, full, V);
        CHECK(e <= NMSE_CACHE, "decode step %u: cached vs recompute NMSE %.3g > %g", k, e, NMSE_CACHE);
        CHECK(argmax_f(cached, V) == argmax_f(full, V), "decode step %u: argmax differs", k);
    }
    kipp_session_destroy(s);
    free(cached), free(full);
}

static fx_model *fx;

static void test_fixture_eval_n_bitwise(void)
{
    uint32_t ids[70];
    fx_tokens(ids, 70, 5);
    check_eval_n_bitwise(&fx->model, ids, 70, 40); /* rows cross a 32-token round boundary */
}

static void test_fixture_scrambled_blocks(void)
{
    uint32_t ids[100];
    fx_tokens(ids, 100, 6);
    check_scrambled_blocks(&fx->model, ids, 100);
}

static void test_fixture_cached_decode(void)
{
    uint32_t ids[40];
    fx_tokens(ids, 40, 7);
    check_cached_decode(&fx->model, ids, 33, 7);
}

/* ---- golden vectors ---- */

static const char *vectors_dir(void)
{
    const char *d = getenv("KIPP_TEST_VECTORS");
    return d ? d : "tests/vectors";
}

static float *read_bin(const char *path, size_t *n_floats)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *p = malloc((size_t)sz);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) free(p), p = NULL;
    fclose(f);
    *n_floats = (size_t)sz / 4;
    return p;
}

static uint32_t *json_ids(json_t *arr, uint32_t *n)
{
    *n = (uint32_t)json_array_size(arr);
    uint32_t *ids = malloc((*n + 1) * 4);
    for (uint32_t i = 0; i < *n; i++) ids[i] = (uint32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

/* The prompt's text through kipp_tokenize must give the HF ids exactly. */
static void check_tokens(kipp_model *m, const char *cid, const char *pname, const char *text,
                         const uint32_t *want, uint32_t n)
{
    size_t cap = strlen(text) + 16, got_n = 0;
    uint32_t *got = malloc(cap * 4);
    char err[256] = "";
    int rc = kipp_tokenize(m, text, strlen(text), KIPP_TOK_SPECIAL, got, cap, &got_n, err, sizeof err);
    CHECK(rc == 0, "%s/%s: kipp_tokenize failed: %s", cid, pname, err);
    CHECK(rc || (got_n == n && !memcmp(got, want, n * 4)), "%s/%s: %zu ids differ from the %u HF ids", cid, pname, got_n, n);
    free(got);
}

static void compare_hf(const char *cid, const char *pname, uint32_t upto, const float *got, const float *want,
                       uint32_t V)
{
    double e = th_nmse(got, want, V);
    CHECK(e <= NMSE_HF, "%s/%s at %u tokens: NMSE %.3g > %g vs transformers", cid, pname, upto, e, NMSE_HF);
    CHECK(argmax_f(got, V) == argmax_f(want, V), "%s/%s at %u tokens: argmax %u, transformers %u", cid, pname,
          upto, argmax_f(got, V), argmax_f(want, V));
    printf("  %s/%s: %u tokens, NMSE %.3g vs transformers, argmax %u\n", cid, pname, upto, e, argmax_f(got, V));
}

/* Evaluate seq[0..n) in a session whose last `tail` positions go one token at a
 * time (tail rows written to rows), or in one call when tail is 0. */
static kipp_session *prefill(kipp_model *m, const uint32_t *seq, uint32_t n, uint32_t cap, uint32_t tail,
                             float *rows)
{
    uint32_t V = m->view.dims.vocab_size;
    kipp_session *s = NULL;
    char err[256] = "";
    CHECK(kipp_session_create(m, cap, &s, err, sizeof err) == 0, "create: %s", err);
    if (!s) return NULL;
    if (!tail) {
        CHECK(kipp_session_eval(s, seq, n, rows, err, sizeof err) == 0, "prefill: %s", err);
        return s;
    }
    CHECK(kipp_session_eval(s, seq, n - tail, NULL, err, sizeof err) == 0, "prefill: %s", err);
    for (uint32_t r = 0; r < tail; r++)
        CHECK(kipp_session_eval(s, seq + n - tail + r, 1, rows + (size_t)r * V, err, sizeof err) == 0, "step: %s", err);
    return s;
}

/* The stored rows: prompt final position (row 0), then one row per greedy token
 * fed through the KV cache. For a long (multi-block) prompt the paged gates run
 * on the real shapes too, reusing the rows already computed:
 *   - its last 3 positions are evaluated one at a time, and eval_n of the whole
 *     prompt must reproduce those rows bitwise;
 *   - a scrambled block table must reproduce the final row bitwise. */
static void check_prompt(kipp_model *m, const char *cid, const char *pname, json_t *p, const float *bin,
                         size_t bin_n)
{
    uint32_t n, n_greedy, V = m->view.dims.vocab_size;
    uint32_t *ids = json_ids(json_object_get(p, "ids"), &n);
    uint32_t *greedy = json_ids(json_object_get(p, "greedy"), &n_greedy);
    check_tokens(m, cid, pname, json_string_value(json_object_get(p, "text")), ids, n);
    uint32_t *seq = malloc((n + n_greedy) * 4), cap = n + n_greedy, tail = n > 64 ? 3 : 0;
    memcpy(seq, ids, n * 4);
    memcpy(seq + n, greedy, n_greedy * 4);
    json_t *rows = json_object_get(p, "logits");
    uint32_t n_rows = (uint32_t)json_array_size(rows);
    /* lg: [max(tail,1)] prompt rows, then one decode row; last = the prompt's final row */
    uint32_t nr = tail ? tail : 1;
    float *lg = malloc((size_t)(nr + 1) * V * 4), *last = lg + (size_t)(nr - 1) * V, *step = lg + (size_t)nr * V;
    kipp_session *s = prefill(m, seq, n, cap, tail, lg);
    for (uint32_t r = 0; r < n_rows && s; r++) {
        json_t *row = json_array_get(rows, r);
        uint32_t upto = (uint32_t)json_integer_value(json_object_get(row, "n_tokens"));
        size_t off = (size_t)json_integer_value(json_object_get(row, "offset")) / 4;
        CHECK(off + V <= bin_n && upto == n + r && upto <= cap, "%s/%s row %u: bad index", cid, pname, r);
        if (off + V > bin_n || upto != n + r || upto > cap) break;
        if (r) CHECK(kipp_session_eval(s, seq + upto - 1, 1, step, NULL, 0) == 0, "decode %u", r);
        compare_hf(cid, pname, upto, r ? step : last, bin + off, V);
    }
    kipp_session_destroy(s);
    check_cached_decode(m, seq, n, n_rows - 1);
    if (n > 64) {
        float *multi = malloc((size_t)tail * V * 4), *scr = malloc((size_t)V * 4);
        kipp_session *a = NULL, *b = NULL;
        CHECK(kipp_session_create(m, n, &a, NULL, 0) == 0, "create");
        CHECK(kipp_session_eval_n(a, seq, n, tail, multi, NULL, 0) == 0, "eval_n");
        CHECK(!memcmp(multi, lg, (size_t)tail * V * 4), "%s/%s: eval_n rows differ from per-position rows", cid, pname);
        CHECK(kipp_session_create(m, n, &b, NULL, 0) == 0, "create");
        uint32_t nb = b->n_blocks, *perm = malloc(nb * 4);
        for (uint32_t i = 0; i < nb; i++) perm[i] = nb - 1 - i; /* reversed: no block stays put for nb >= 2 */
        CHECK(nb >= 3 && kipp_session_set_block_table(b, perm, NULL, 0) == 0, "%u blocks, scramble", nb);
        CHECK(kipp_session_eval(b, seq, n, scr, NULL, 0) == 0, "scrambled eval");
        CHECK(!memcmp(scr, last, (size_t)V * 4), "%s/%s: scrambled block table changed the logits", cid, pname);
        kipp_session_destroy(a), kipp_session_destroy(b);
        free(multi), free(scr), free(perm);
    }
    free(ids), free(greedy), free(seq), free(lg);
}

static json_t *manifest;

static void check_checkpoint(const char *cid)
{
    json_t *c = json_object_get(json_object_get(manifest, "checkpoints"), cid);
    CHECK(c != NULL, "%s is not in the vectors manifest", cid);
    if (!c) return;
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", vectors_dir(), json_string_value(json_object_get(c, "bin")));
    size_t bin_n = 0;
    float *bin = read_bin(path, &bin_n);
    CHECK(bin != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/%s.gguf", th_models_dir(), cid);
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "ref", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "open %s: %s (run `make models-test`)", path, err);
    if (bin && m) {
        const char *pname;
        json_t *p;
        json_object_foreach(json_object_get(c, "prompts"), pname, p) check_prompt(m, cid, pname, p, bin, bin_n);
    }
    if (th_cur_failed)
        fprintf(stderr, "  hint: the vectors match the checkpoint whose sha256 MANIFEST.json records; "
                        "tests/test_cli.py checks build/models against it\n");
    kipp_model_close(m);
    free(bin);
}

static void test_golden_tiny(void) { check_checkpoint("synthetic-tiny"); }
static void test_golden_tiny_untied(void) { check_checkpoint("synthetic-tiny-untied"); }

/* Text and token-id evaluation converge before the backend: bitwise-equal logits. */
static void test_eval_text(void)
{
    json_t *p = json_object_get(json_object_get(json_object_get(json_object_get(manifest, "checkpoints"),
                                                                "synthetic-tiny"), "prompts"), "short");
    const char *text = json_string_value(json_object_get(p, "text"));
    uint32_t n;
    uint32_t *ids = json_ids(json_object_get(p, "ids"), &n);
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = NULL;
    CHECK(text && kipp_model_open(path, "ref", NULL, &m, err, sizeof err) == 0, "open: %s", err);
    if (m && text) {
        uint32_t V = m->view.dims.vocab_size;
        float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
        kipp_session *s = NULL, *t = NULL;
        CHECK(kipp_session_create(m, n, &s, NULL, 0) == 0 && kipp_session_create(m, n - 1, &t, NULL, 0) == 0, "create");
        CHECK(kipp_session_eval_text(s, text, strlen(text), KIPP_TOK_SPECIAL, a, err, sizeof err) == 0, "text: %s", err);
        CHECK(kipp_session_length(s) == n, "eval_text appended %u tokens, expected %u", kipp_session_length(s), n);
        kipp_session_reset(s);
        CHECK(kipp_session_eval(s, ids, n, b, NULL, 0) == 0, "ids");
        CHECK(!memcmp(a, b, (size_t)V * 4), "eval_text logits differ from eval of the same ids");
        /* one token too long for the session: rejected with both numbers, nothing appended */
        CHECK(kipp_session_eval_text(t, text, strlen(text), KIPP_TOK_SPECIAL, a, err, sizeof err) == KIPP_ERANGE,
              "prompt longer than capacity accepted");
        char want[64];
        snprintf(want, sizeof want, "%u tokens do not fit", n);
        CHECK(strstr(err, want) != NULL && kipp_session_length(t) == 0, "error '%s', length %u", err,
              kipp_session_length(t));
        kipp_session_destroy(s), kipp_session_destroy(t);
        free(a), free(b);
    }
    kipp_model_close(m);
    free(ids);
}

static void test_unknown_backend(void)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = (kipp_model *)1;
    CHECK(kipp_model_open(path, "vulkan", NULL, &m, err, sizeof err) == KIPP_EBACKEND, "backend 'vulkan' accepted");
    CHECK(strstr(err, "vulkan") != NULL, "error '%s' does not name the backend", err);
}

int main(void)
{
    char err[512] = "", path[512];
    fx = fx_model_create("ref", err, sizeof err);
    snprintf(path, sizeof path, "%s/MANIFEST.json", vectors_dir());
    json_error_t jerr;
    manifest = json_load_file(path, 0, &jerr);
    if (!fx || !manifest) {
        fprintf(stderr, "setup: %s %s\n", err, manifest ? "" : jerr.text);
        return 1; /* no RESULT line: counted as a failure */
    }
    RUN(test_fixture_eval_n_bitwise);
    RUN(test_fixture_scrambled_blocks);
    RUN(test_fixture_cached_decode);
    RUN(test_golden_tiny);
    RUN(test_golden_tiny_untied);
    RUN(test_eval_text);
    RUN(test_unknown_backend);
    fx_model_destroy(fx);
    json_decref(manifest);
    return th_finish();
}
