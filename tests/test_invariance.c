/*
 * test_invariance.c - the cache and batch invariance gate:
 * on the fast cpu backend a token's logits must not depend on whether it was
 * computed in prefill, in decode, in a batch with other sessions, on a reused
 * (truncated and re-extended) prefix, or with another worker count. Bitwise,
 * for every weight format and every kernel level this CPU has, through the
 * public API on the converted tiny GGUF models (the path a real checkpoint
 * takes).
 *
 * The oracle is plain one-token decoding of the same timeline on the same
 * backend and level: the path every other path must reproduce exactly. (The
 * kernels' own rowinv and flash invariance rows in kcheck cover the levels
 * this CPU lacks, under SIMDe.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kipp.h"
#include "kernels/common.h"
#include "tests/test_harness.h"

#define N_TOK 72u /* crosses two 32-position pages and four 16-position attention chunks */

static const char *const MODELS[] = {"synthetic-tiny.gguf", "synthetic-tiny-q8_0.gguf",
                                     "synthetic-tiny-affine4_gs32.gguf"};

static int g_kv_type = KIPP_KV_BF16; /* the KV type every model opens with (test_kv_q8_0 sets q8_0) */

typedef struct {
    kipp_model *m;
    uint32_t V;
    const char *what; /* "synthetic-tiny.gguf at avx2" */
} tm;

static int tm_open(tm *t, const char *file, int n_threads, const char *what)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", th_models_dir(), file);
    kipp_model_options o = {.n_threads = n_threads, .kv_type = g_kv_type};
    int rc = kipp_model_open(path, "cpu", &o, &t->m, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
    if (rc) return rc;
    kipp_model_info info;
    kipp_model_get_info(t->m, &info);
    t->V = info.vocab_size;
    t->what = what;
    return 0;
}

static void ids_of(uint32_t *ids, uint32_t n, uint32_t vocab, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++) ids[i] = (i * 7919u + salt * 104729u + 13u) % vocab;
}

/* The oracle: rows [0, n) of one-token decode steps. NULL on failure. */
static float *decode_rows(const tm *t, const uint32_t *ids, uint32_t n)
{
    kipp_session *s = NULL;
    float *out = malloc((size_t)n * t->V * sizeof *out);
    char err[256] = "";
    int rc = kipp_session_create(t->m, n, &s, err, sizeof err);
    for (uint32_t i = 0; i < n && rc == 0; i++) rc = kipp_session_eval(s, ids + i, 1, out + (size_t)i * t->V, err, sizeof err);
    CHECK(rc == 0, "%s: decode: %s", t->what, err);
    kipp_session_destroy(s);
    if (rc) { free(out); return NULL; }
    return out;
}

/* Bitwise comparison of n logits rows; names the first row that differs. */
static void same_rows(const tm *t, const float *got, const float *want, uint32_t n, uint32_t pos0, const char *path)
{
    for (uint32_t r = 0; r < n; r++) {
        const float *a = got + (size_t)r * t->V, *b = want + (size_t)r * t->V;
        if (memcmp(a, b, t->V * sizeof *a) == 0) continue;
        double worst = 0;
        for (uint32_t i = 0; i < t->V; i++) worst = fabs((double)a[i] - b[i]) > worst ? fabs((double)a[i] - b[i]) : worst;
        CHECK(0, "%s: %s: position %u differs from decode (max |diff| %.3g)", t->what, path, pos0 + r, worst);
        return;
    }
}

/* Prefill in chunks of the given sizes, repeated (all rows' logits), against decode. */
static void chunked(const tm *t, const uint32_t *ids, const float *want, const uint32_t *sizes, size_t ns, const char *path)
{
    kipp_session *s = NULL;
    float *got = malloc((size_t)N_TOK * t->V * sizeof *got);
    char err[256] = "";
    int rc = kipp_session_create(t->m, N_TOK, &s, err, sizeof err);
    uint32_t p = 0;
    for (size_t i = 0; rc == 0 && p < N_TOK; i++) {
        uint32_t n = sizes[i % ns] < N_TOK - p ? sizes[i % ns] : N_TOK - p;
        rc = kipp_session_eval_n(s, ids + p, n, n, got + (size_t)p * t->V, err, sizeof err);
        p += n;
    }
    CHECK(rc == 0 && p == N_TOK, "%s: %s: %s", t->what, path, err);
    if (rc == 0) same_rows(t, got, want, N_TOK, 0, path);
    kipp_session_destroy(s);
    free(got);
}

/* A reused prefix: 60 tokens, rolled back to 37 (mid-page, mid-chunk), then
 * the rest in one prefill, as a chat turn or a rejected draft does. */
static void reused_prefix(const tm *t, const uint32_t *ids, const float *want)
{
    kipp_session *s = NULL;
    float *got = malloc((size_t)N_TOK * t->V * sizeof *got);
    char err[256] = "";
    int rc = kipp_session_create(t->m, N_TOK, &s, err, sizeof err);
    if (!rc) rc = kipp_session_eval(s, ids, 60, NULL, err, sizeof err);
    if (!rc) rc = kipp_session_truncate(s, 37, err, sizeof err);
    if (!rc) rc = kipp_session_eval_n(s, ids + 37, N_TOK - 37, N_TOK - 37, got, err, sizeof err);
    CHECK(rc == 0, "%s: reused prefix: %s", t->what, err);
    if (rc == 0) same_rows(t, got, want + (size_t)37 * t->V, N_TOK - 37, 37, "prefill on a truncated prefix");
    kipp_session_destroy(s);
    free(got);
}

/* One batch: session a continues ids at 40 (32 rows), b prefills its own
 * 50-token prompt, c decodes its token 30; each against its own decode. */
static void batched(const tm *t, const uint32_t *ids, const float *want)
{
    uint32_t idb[50], idc[31];
    ids_of(idb, 50, t->V, 2);
    ids_of(idc, 31, t->V, 3);
    float *wb = decode_rows(t, idb, 50), *wc = decode_rows(t, idc, 31);
    float *ga = malloc((size_t)32 * t->V * 4), *gb = malloc((size_t)50 * t->V * 4), *gc = malloc((size_t)t->V * 4);
    kipp_session *a = NULL, *b = NULL, *c = NULL;
    char err[256] = "";
    int rc = kipp_session_create(t->m, N_TOK, &a, err, sizeof err);
    if (!rc) rc = kipp_session_create(t->m, N_TOK, &b, err, sizeof err);
    if (!rc) rc = kipp_session_create(t->m, N_TOK, &c, err, sizeof err);
    if (!rc) rc = kipp_session_eval(a, ids, 40, NULL, err, sizeof err);
    if (!rc) rc = kipp_session_eval(c, idc, 30, NULL, err, sizeof err);
    kipp_batch_item items[3] = {{a, ids + 40, 32, 32, ga, NULL}, {b, idb, 50, 50, gb, NULL}, {c, idc + 30, 1, 1, gc, NULL}};
    if (!rc) rc = kipp_eval_batch(t->m, items, 3, err, sizeof err);
    CHECK(rc == 0 && wb && wc, "%s: batch: %s", t->what, err);
    if (rc == 0 && wb && wc) {
        same_rows(t, ga, want + (size_t)40 * t->V, 32, 40, "batched continuation");
        same_rows(t, gb, wb, 50, 0, "batched prefill");
        same_rows(t, gc, wc + (size_t)30 * t->V, 1, 30, "batched decode");
    }
    kipp_session_destroy(a);
    kipp_session_destroy(b);
    kipp_session_destroy(c);
    free(wb), free(wc), free(ga), free(gb), free(gc);
}

/* Every path against decode, for one model file at one level. */
static void paths(const char *file, kipp_isa isa)
{
    char what[160];
    snprintf(what, sizeof what, "%s at %s, %s KV", file, kipp_isa_name(isa), kipp_kv_type_name(g_kv_type));
    setenv("KIPP_ISA", kipp_isa_name(isa), 1);
    tm t, t1;
    if (tm_open(&t, file, 2, what)) return;
    uint32_t ids[N_TOK];
    ids_of(ids, N_TOK, t.V, 1);
    float *want = decode_rows(&t, ids, N_TOK);
    if (want) {
        const uint32_t whole[] = {N_TOK}, uneven[] = {7, 1, 25, 16, 3, 48}, pairs[] = {2};
        chunked(&t, ids, want, whole, 1, "one prefill");
        chunked(&t, ids, want, uneven, 6, "prefill in chunks 7,1,25,16,3,..");
        chunked(&t, ids, want, pairs, 1, "prefill in chunks of 2");
        reused_prefix(&t, ids, want);
        batched(&t, ids, want);
        if (!tm_open(&t1, file, 1, what)) { /* another worker count */
            float *one = decode_rows(&t1, ids, N_TOK);
            if (one) same_rows(&t, one, want, N_TOK, 0, "decode on 1 worker vs 2");
            free(one);
            kipp_model_close(t1.m);
        }
    }
    free(want);
    kipp_model_close(t.m);
}

/* bf16 at every level in its default read mode, and on a CPU with the BF16
 * dot also in the other two KIPP_BF16_ACT modes (f32 is the avx512 kernels;
 * bf16 sends Q|K|V through the dot too). */
static void test_bf16(void)
{
    for (int isa = KIPP_ISA_REF; isa <= (int)kipp_isa_cpu_max(); isa++) paths(MODELS[0], (kipp_isa)isa);
    if (kipp_isa_cpu_max() < KIPP_ISA_AVX512_BF16) {
        printf("  note: no BF16 dot on this CPU; the KIPP_BF16_ACT=bf16 path is covered by kcheck_emu's rowinv rows only\n");
        return;
    }
    const char *modes[2] = {"f32", "bf16"};
    for (int i = 0; i < 2; i++) {
        setenv("KIPP_BF16_ACT", modes[i], 1);
        printf("  KIPP_BF16_ACT=%s\n", modes[i]);
        paths(MODELS[0], KIPP_ISA_AVX512_BF16);
    }
    unsetenv("KIPP_BF16_ACT");
}

/* The integer formats on the SIMD levels (the ref level is scalar per row by construction). */
static void test_q8_0(void)
{
    for (int isa = KIPP_ISA_AVX2; isa <= (int)kipp_isa_cpu_max(); isa++) paths(MODELS[1], (kipp_isa)isa);
}

static void test_affine4(void)
{
    for (int isa = KIPP_ISA_AVX2; isa <= (int)kipp_isa_cpu_max(); isa++) paths(MODELS[2], (kipp_isa)isa);
}

/* The integer formats on loud-row, heavy-tailed weights (synthetic-tiny-outliers), where the
 * Q8 activation blocks carry FP32 outliers (kernels.h k_act_q8_block, the formats'
 * outlier_fix): the best level this CPU has. */
static void test_outliers(void)
{
    paths("synthetic-tiny-outliers-q8_0.gguf", kipp_isa_cpu_max());
    paths("synthetic-tiny-outliers-affine4_gs32.gguf", kipp_isa_cpu_max());
}

/* The q8_0 KV cache (kipp_model_options.kv_type): the same gates within that type, bf16 weights
 * at every level, the integer formats and the outlier checkpoints at the best one. */
static void test_kv_q8_0(void)
{
    g_kv_type = KIPP_KV_Q8_0;
    for (int isa = KIPP_ISA_REF; isa <= (int)kipp_isa_cpu_max(); isa++) paths(MODELS[0], (kipp_isa)isa);
    paths(MODELS[1], kipp_isa_cpu_max());
    paths(MODELS[2], kipp_isa_cpu_max());
    paths("synthetic-tiny-outliers.gguf", kipp_isa_cpu_max());
    g_kv_type = KIPP_KV_BF16;
}

int main(void)
{
    printf("levels on this CPU: up to %s (the others: kcheck_emu's rowinv and flash rows)\n",
           kipp_isa_name(kipp_isa_cpu_max()));
    RUN(test_bf16);
    RUN(test_q8_0);
    RUN(test_affine4);
    RUN(test_outliers);
    RUN(test_kv_q8_0);
    unsetenv("KIPP_ISA");
    return th_finish();
}
