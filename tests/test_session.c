/*
 * test_session.c - session lifecycle, validation before compute, batching
 * (engine/session.c over the ref backend; seed 000 Phase 2 tests).
 *
 * Uses the in-memory fixture model (tests/fixture_model.h) so every case is
 * cheap. The oracle for "same result" is an isolated fresh session evaluating
 * the same timeline; the ref backend promises bitwise equality for it.
 */
#include <math.h>
#include <string.h>

#include "tests/fixture_model.h"
#include "tests/test_harness.h"

static fx_model *fx;

static float *logits_buf(size_t rows)
{
    float *p = malloc(rows * FX_VOCAB * sizeof *p);
    for (size_t i = 0; i < rows * FX_VOCAB; i++) p[i] = 12345.0f; /* sentinel: "not written" */
    return p;
}

static int untouched(const float *p, size_t rows)
{
    for (size_t i = 0; i < rows * FX_VOCAB; i++)
        if (p[i] != 12345.0f) return 0;
    return 1;
}

/* Logits of a fresh session evaluating ids[0..n) in one call. */
static void fresh_logits(const uint32_t *ids, uint32_t n, float *out)
{
    kipp_session *s = NULL;
    CHECK(kipp_session_create(&fx->model, FX_CTX, &s, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval(s, ids, n, out, NULL, 0) == 0, "eval %u", n);
    kipp_session_destroy(s);
}

static void test_capacity_range(void)
{
    kipp_session *s = (kipp_session *)1;
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 0, &s, err, sizeof err) == KIPP_ERANGE, "capacity 0 accepted");
    CHECK(s == NULL, "out not cleared on error");
    CHECK(kipp_session_create(&fx->model, FX_CTX + 1, &s, err, sizeof err) == KIPP_ERANGE, "capacity 301 accepted");
    CHECK(strstr(err, "301") && strstr(err, "300"), "error '%s' does not name 301 and 300", err);
    CHECK(kipp_session_create(&fx->model, FX_CTX, &s, err, sizeof err) == 0, "capacity = context: %s", err);
    CHECK(s && s->n_blocks == 10, "300 tokens -> %u blocks, expected 10", s ? s->n_blocks : 0);
    CHECK(kipp_session_capacity(s) == FX_CTX && kipp_session_length(s) == 0, "capacity/length");
    kipp_session_destroy(s);
    kipp_session_destroy(NULL);
}

static void test_zero_one_many(void)
{
    kipp_session *s = NULL;
    uint32_t ids[40];
    fx_tokens(ids, 40, 1);
    float *lg = logits_buf(1), *ref = logits_buf(1);
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 64, &s, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval(s, ids, 0, lg, err, sizeof err) == KIPP_EINVAL, "0 tokens accepted");
    CHECK(strstr(err, "0 tokens") != NULL, "error '%s' does not name 0 tokens", err);
    CHECK(kipp_session_length(s) == 0 && untouched(lg, 1), "0-token call changed state");
    CHECK(kipp_session_eval(s, ids, 1, lg, NULL, 0) == 0 && kipp_session_length(s) == 1, "one token");
    fresh_logits(ids, 1, ref);
    CHECK(!memcmp(lg, ref, FX_VOCAB * 4), "one-token logits differ from a fresh session");
    CHECK(kipp_session_eval(s, ids + 1, 39, lg, NULL, 0) == 0 && kipp_session_length(s) == 40, "39 more");
    fresh_logits(ids, 40, ref);
    CHECK(!memcmp(lg, ref, FX_VOCAB * 4), "1+39 tokens differ from 40 in one call");
    CHECK(kipp_session_eval(s, ids, 1, NULL, NULL, 0) == 0 && kipp_session_length(s) == 41, "logits NULL");
    kipp_session_destroy(s);
    free(lg), free(ref);
}

static void test_exact_capacity_and_overflow(void)
{
    kipp_session *s = NULL;
    uint32_t ids[71];
    fx_tokens(ids, 71, 2);
    float *lg = logits_buf(1);
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 70, &s, NULL, 0) == 0, "create");
    /* Longer than capacity: rejected before compute (no logits written, nothing appended). */
    CHECK(kipp_session_eval(s, ids, 71, lg, err, sizeof err) == KIPP_ERANGE, "71 tokens into 70 accepted");
    CHECK(strstr(err, "71") && strstr(err, "70"), "error '%s' does not name 71 and 70", err);
    CHECK(kipp_session_length(s) == 0 && untouched(lg, 1), "rejected prompt was computed or appended");
    CHECK(kipp_session_eval(s, ids, 70, lg, err, sizeof err) == 0, "exactly 70: %s", err);
    CHECK(kipp_session_length(s) == 70, "length %u", kipp_session_length(s));
    float *lg2 = logits_buf(1);
    CHECK(kipp_session_eval(s, ids, 1, lg2, err, sizeof err) == KIPP_ERANGE, "71st token accepted");
    CHECK(strstr(err, "70") != NULL, "error '%s' does not name the capacity", err);
    CHECK(kipp_session_length(s) == 70 && untouched(lg2, 1), "overflow changed state");
    kipp_session_destroy(s);
    free(lg), free(lg2);
}

static void test_bad_token_id(void)
{
    kipp_session *s = NULL;
    uint32_t ids[3] = {1, FX_VOCAB, 2};
    float *lg = logits_buf(1);
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 32, &s, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval(s, ids, 3, lg, err, sizeof err) == KIPP_ERANGE, "id 512 accepted");
    CHECK(strstr(err, "512") != NULL, "error '%s' does not name 512", err);
    CHECK(kipp_session_length(s) == 0 && untouched(lg, 1), "bad id changed state");
    kipp_session_destroy(s);
    free(lg);
}

static void test_reset_and_truncate(void)
{
    kipp_session *s = NULL;
    uint32_t a[50], b[10], joined[30];
    fx_tokens(a, 50, 3);
    fx_tokens(b, 10, 4);
    float *lg = logits_buf(1), *ref = logits_buf(1);
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 100, &s, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval(s, a, 50, lg, NULL, 0) == 0, "eval a");
    kipp_session_reset(s);
    CHECK(kipp_session_length(s) == 0, "reset left length %u", kipp_session_length(s));
    CHECK(kipp_session_eval(s, a, 50, ref, NULL, 0) == 0, "eval a after reset");
    CHECK(!memcmp(lg, ref, FX_VOCAB * 4), "logits after reset differ");
    CHECK(kipp_session_truncate(s, 51, err, sizeof err) == KIPP_ERANGE, "truncate past the end accepted");
    CHECK(strstr(err, "51") && strstr(err, "50"), "error '%s' does not name 51 and 50", err);
    CHECK(kipp_session_truncate(s, 20, NULL, 0) == 0 && kipp_session_length(s) == 20, "truncate to 20");
    CHECK(kipp_session_eval(s, b, 10, lg, NULL, 0) == 0, "eval b after truncate");
    memcpy(joined, a, 20 * 4);
    memcpy(joined + 20, b, 10 * 4);
    fresh_logits(joined, 30, ref);
    CHECK(!memcmp(lg, ref, FX_VOCAB * 4), "truncate+append differs from a fresh a[:20]+b");
    kipp_session_destroy(s);
    free(lg), free(ref);
}

/* Three sessions advanced in an interleaved order equal each one run alone. */
static void test_interleaved_sessions(void)
{
    enum { NS = 3, LEN = 45 };
    kipp_session *s[NS];
    uint32_t ids[NS][LEN];
    float *lg[NS], *ref = logits_buf(1);
    for (int i = 0; i < NS; i++) {
        fx_tokens(ids[i], LEN, 10 + i);
        lg[i] = logits_buf(1);
        CHECK(kipp_session_create(&fx->model, 64, &s[i], NULL, 0) == 0, "create %d", i);
    }
    for (uint32_t t = 0; t < LEN; t += 5) /* 5-token steps, round-robin */
        for (int i = 0; i < NS; i++)
            CHECK(kipp_session_eval(s[i], ids[i] + t, 5, lg[i], NULL, 0) == 0, "eval %d at %u", i, t);
    for (int i = 0; i < NS; i++) {
        fresh_logits(ids[i], LEN, ref);
        CHECK(!memcmp(lg[i], ref, FX_VOCAB * 4), "interleaved session %d differs from isolated", i);
        kipp_session_destroy(s[i]);
        free(lg[i]);
    }
    free(ref);
}

static void test_eval_batch(void)
{
    kipp_session *s[3];
    uint32_t a[37], b[5], c[1];
    fx_tokens(a, 37, 20), fx_tokens(b, 5, 21), fx_tokens(c, 1, 22);
    for (int i = 0; i < 3; i++) CHECK(kipp_session_create(&fx->model, 64, &s[i], NULL, 0) == 0, "create");
    float *la = logits_buf(3), *lb = logits_buf(1), *ref = logits_buf(3);
    char err[256] = "";
    /* A shared session or one bad item rejects the whole batch before compute. */
    kipp_batch_item dup[2] = {{s[0], a, 37, 1, la, NULL}, {s[0], b, 5, 1, lb, NULL}};
    CHECK(kipp_eval_batch(&fx->model, dup, 2, err, sizeof err) == KIPP_EINVAL, "shared session accepted");
    uint32_t bad[2] = {3, 9999};
    kipp_batch_item one_bad[2] = {{s[0], a, 37, 1, la, NULL}, {s[1], bad, 2, 1, lb, NULL}};
    CHECK(kipp_eval_batch(&fx->model, one_bad, 2, err, sizeof err) == KIPP_ERANGE, "bad id accepted");
    CHECK(strstr(err, "9999") != NULL, "error '%s' does not name 9999", err);
    CHECK(kipp_session_length(s[0]) == 0 && untouched(la, 3), "rejected batch appended or computed");
    kipp_batch_item ok[3] = {{s[0], a, 37, 3, la, NULL}, {s[1], b, 5, 1, lb, NULL}, {s[2], c, 1, 0, NULL, NULL}};
    CHECK(kipp_eval_batch(&fx->model, ok, 3, err, sizeof err) == 0, "batch: %s", err);
    CHECK(kipp_session_length(s[0]) == 37 && kipp_session_length(s[1]) == 5 && kipp_session_length(s[2]) == 1,
          "batch lengths");
    kipp_session *iso = NULL;
    CHECK(kipp_session_create(&fx->model, 64, &iso, NULL, 0) == 0, "create isolated");
    CHECK(kipp_session_eval_n(iso, a, 37, 3, ref, NULL, 0) == 0, "isolated eval_n");
    CHECK(!memcmp(la, ref, 3 * FX_VOCAB * 4), "batched item 0 differs from isolated eval_n");
    fresh_logits(b, 5, ref);
    CHECK(!memcmp(lb, ref, FX_VOCAB * 4), "batched item 1 differs from isolated eval");
    kipp_session_destroy(iso);
    for (int i = 0; i < 3; i++) kipp_session_destroy(s[i]);
    free(la), free(lb), free(ref);
}

/* A NaN weight row makes one logit NaN: reported as ENUMERIC, nothing appended. */
static void test_nonfinite_logits(void)
{
    kipp_bf16 *row = (kipp_bf16 *)fx->model.view.w.output.data + 7 * 64;
    kipp_bf16 saved = row[0];
    row[0] = 0x7fc0; /* quiet NaN */
    kipp_session *s = NULL;
    uint32_t ids[4];
    fx_tokens(ids, 4, 30);
    float *lg = logits_buf(1);
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 32, &s, NULL, 0) == 0, "create");
    CHECK(kipp_session_eval(s, ids, 4, lg, err, sizeof err) == KIPP_ENUMERIC, "NaN logits accepted");
    CHECK(strstr(err, "token 7") != NULL, "error '%s' does not name token 7", err);
    CHECK(kipp_session_length(s) == 0, "NaN eval appended %u tokens", kipp_session_length(s));
    row[0] = saved;
    kipp_session_destroy(s);
    free(lg);
}

static void test_block_table_hook(void)
{
    kipp_session *s = NULL;
    char err[256] = "";
    CHECK(kipp_session_create(&fx->model, 96, &s, NULL, 0) == 0, "create");
    uint32_t not_perm[3] = {0, 2, 2}, perm[3] = {2, 0, 1}, ids[2] = {1, 2};
    CHECK(kipp_session_set_block_table(s, not_perm, err, sizeof err) == KIPP_EINVAL, "non-permutation accepted");
    CHECK(strstr(err, "entry 2") != NULL, "error '%s' does not name entry 2", err);
    CHECK(kipp_session_set_block_table(s, perm, err, sizeof err) == 0, "permutation rejected: %s", err);
    CHECK(kipp_session_eval(s, ids, 2, NULL, NULL, 0) == 0, "eval");
    CHECK(kipp_session_set_block_table(s, perm, err, sizeof err) == KIPP_EINVAL, "non-empty session accepted");
    kipp_session_destroy(s);
}

int main(void)
{
    char err[256] = "";
    fx = fx_model_create("ref", err, sizeof err);
    if (!fx) {
        fprintf(stderr, "fixture model: %s\n", err);
        return 1; /* no RESULT line: run_tests.sh counts a failure */
    }
    RUN(test_capacity_range);
    RUN(test_zero_one_many);
    RUN(test_exact_capacity_and_overflow);
    RUN(test_bad_token_id);
    RUN(test_reset_and_truncate);
    RUN(test_interleaved_sessions);
    RUN(test_eval_batch);
    RUN(test_nonfinite_logits);
    RUN(test_block_table_hook);
    fx_model_destroy(fx);
    return th_finish();
}
