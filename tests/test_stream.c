/*
 * test_stream.c - layer streaming (seed 002 "Layer
 * streaming"): a cpu model opened streamed (no packed copy; projections and
 * head packed slice by slice from the file mapping per call,
 * backends/cpu/cpu_stream.c) must give the resident model's logits bit for
 * bit, on every path: decode, one prefill with every row's logits, a batch of
 * sessions (the head's scattered path), with and without prefetch, for every
 * weight format and every kernel level this CPU has. Plus the fast bf16
 * packer against the reference packer. The memory-limited run is
 * tests/test_stream_cgroup.py.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kipp.h"
#include "kernels/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pack_pairs.h"
#include "tests/test_harness.h"

#define N_TOK 24u /* prefill rows */
#define N_DEC 6u  /* one-token decode steps (the head dominates: keep the ref level quick) */

void k_pack_bf16_ref(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth);

static void test_pack_pairs(void)
{
    const size_t shapes[][2] = {{16, 32}, {48, 96}, {64, 2560}, {32, 544}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        kipp_bf16 *w = malloc(n * 2), *a = malloc(n * 2), *b = malloc(n * 2);
        for (size_t i = 0; i < n; i++) w[i] = (kipp_bf16)(i * 2654435761u >> 7);
        for (int nth = 1; nth <= 3; nth++) {
            memset(a, 0xAB, n * 2), memset(b, 0xCD, n * 2);
            for (int ith = 0; ith < nth; ith++) {
                k_pack_bf16_ref(w, a, rows, cols, ith, nth);
                k_pack_bf16_pairs(w, b, rows, cols, ith, nth);
            }
            CHECK(memcmp(a, b, n * 2) == 0, "k_pack_bf16_pairs differs from k_pack_bf16_ref at [%zu][%zu], %d threads", rows,
                  cols, nth);
        }
        free(w), free(a), free(b);
    }
}

typedef struct {
    float *dec;   /* [N_DEC][V] one-token decode steps */
    float *pre;   /* [N_TOK][V] one prefill, every row */
    float *bat;   /* [12][V]: the batch's logits rows (b: 2 from 5, then a: 10 continuing at 12) */
    size_t V;
} outs;

static void outs_free(outs *o) { free(o->dec), free(o->pre), free(o->bat); }

/* Run the three paths on a model opened with stream mode `stream` and prefetch. */
static int run(const char *file, int stream, int no_prefetch, outs *o)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", th_models_dir(), file);
    kipp_model_options mo = {.n_threads = 2, .stream = stream, .no_prefetch = no_prefetch};
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "cpu", &mo, &m, err, sizeof err);
    CHECK(rc == 0, "open %s (stream %d): %s", path, stream, err);
    if (rc) return rc;
    char desc[8192] = "";
    kipp_model_describe(m, desc, sizeof desc);
    CHECK((strstr(desc, "prepared weights: none (streamed") != NULL) == (stream == KIPP_STREAM_ON),
          "%s opened with stream %d, but describe says: %s", file, stream, desc);
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    size_t V = o->V = info.vocab_size;
    uint32_t ids[N_TOK];
    for (uint32_t i = 0; i < N_TOK; i++) ids[i] = (i * 7919u + 13u) % info.vocab_size;
    o->dec = malloc(N_DEC * V * 4), o->pre = malloc(N_TOK * V * 4), o->bat = malloc(12 * V * 4);
    kipp_session *s = NULL, *a = NULL, *b = NULL;
    rc = kipp_session_create(m, N_TOK, &s, err, sizeof err);
    for (uint32_t i = 0; i < N_DEC && !rc; i++) rc = kipp_session_eval(s, ids + i, 1, o->dec + i * V, err, sizeof err);
    if (!rc) rc = kipp_session_truncate(s, 0, err, sizeof err);
    if (!rc) rc = kipp_session_eval_n(s, ids, N_TOK, N_TOK, o->pre, err, sizeof err);
    if (!rc) rc = kipp_session_create(m, N_TOK, &a, err, sizeof err);
    if (!rc) rc = kipp_session_create(m, N_TOK, &b, err, sizeof err);
    if (!rc) rc = kipp_session_eval(a, ids, 12, NULL, err, sizeof err);
    /* The round's rows go a then b, but b's logits come first in bat: the destinations are not
     * consecutive, so the head takes its scattered path (every worker at once on its own vocabulary
     * blocks, cpu_forward.c head), not the direct one that decode and prefill take. */
    kipp_batch_item items[2] = {{a, ids + 12, 10, 10, o->bat + 2 * V, NULL}, {b, ids + 5, 2, 2, o->bat, NULL}};
    if (!rc) rc = kipp_eval_batch(m, items, 2, err, sizeof err);
    CHECK(rc == 0, "%s (stream %d): %s", file, stream, err);
    kipp_session_destroy(s), kipp_session_destroy(a), kipp_session_destroy(b);
    kipp_model_close(m);
    return rc;
}

static void same(const float *a, const float *b, size_t n, const char *what, const char *file)
{
    if (memcmp(a, b, n * sizeof *a) == 0) return;
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fabs((double)a[i] - b[i]) > worst ? fabs((double)a[i] - b[i]) : worst;
    CHECK(0, "%s: streamed %s logits differ from resident (max |diff| %.3g)", file, what, worst);
}

static void compare(const char *file, const char *level)
{
    outs r = {0}, s = {0}, p = {0};
    printf("  %s at %s\n", file, level);
    if (!run(file, KIPP_STREAM_OFF, 0, &r) && !run(file, KIPP_STREAM_ON, 0, &s) && !run(file, KIPP_STREAM_ON, 1, &p)) {
        size_t V = r.V;
        same(s.dec, r.dec, N_DEC * V, "decode", file);
        same(s.pre, r.pre, N_TOK * V, "prefill", file);
        same(s.bat, r.bat, 12 * V, "batch", file);
        same(p.dec, r.dec, N_DEC * V, "decode (no prefetch)", file);
        same(p.bat, r.bat, 12 * V, "batch (no prefetch)", file);
    }
    outs_free(&r), outs_free(&s), outs_free(&p);
}

static void test_streamed_equals_resident(void)
{
    for (int isa = KIPP_ISA_REF; isa <= (int)kipp_isa_cpu_max(); isa++) {
        setenv("KIPP_ISA", kipp_isa_name((kipp_isa)isa), 1);
        compare("synthetic-tiny.gguf", kipp_isa_name((kipp_isa)isa));
    }
    unsetenv("KIPP_ISA");
    if (kipp_isa_cpu_max() >= KIPP_ISA_AVX512_BF16) {
        setenv("KIPP_BF16_ACT", "bf16", 1);
        compare("synthetic-tiny.gguf", "KIPP_BF16_ACT=bf16");
        unsetenv("KIPP_BF16_ACT");
    }
    /* the outlier checkpoint: Q8 blocks with FP32 outliers, which the streamed slices add back (outlier_fix);
     * a quantized head (kipp.quant.head): the head streamed in q8_0 with Q8 activations */
    const char *files[] = {"synthetic-tiny-q8_0.gguf", "synthetic-tiny-affine4_gs32.gguf", "synthetic-tiny-untied.gguf",
                           "synthetic-tiny-outliers-q8_0.gguf", "synthetic-tiny-q8_0-head_q8_0.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) compare(files[i], kipp_isa_name(kipp_isa_cpu_max()));
}

/* KIPP_STREAM decides when the options say auto, and a bad value is refused by name. */
static void test_stream_env(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = NULL;
    setenv("KIPP_STREAM", "sometimes", 1);
    int rc = kipp_model_open(path, "cpu", NULL, &m, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "KIPP_STREAM=sometimes"), "rc %d: %s", rc, err);
    kipp_model_close(m);
    m = NULL;
    setenv("KIPP_STREAM", "on", 1);
    rc = kipp_model_open(path, "cpu", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    char desc[8192] = "";
    if (!rc) kipp_model_describe(m, desc, sizeof desc);
    CHECK(strstr(desc, "streamed") != NULL, "KIPP_STREAM=on: describe does not say streamed: %s", desc);
    kipp_model_close(m);
    unsetenv("KIPP_STREAM");
    kipp_model_options bad = {.stream = 7};
    m = NULL;
    rc = kipp_model_open(path, "cpu", &bad, &m, err, sizeof err);
    CHECK(rc == KIPP_EINVAL, "stream 7 accepted (rc %d)", rc);
    kipp_model_close(m);
}

/* Backend ref has no streamed mode and no prefetch thread: asking for either
 * through the options is refused by name, not ignored. n_threads above 1 is
 * accepted (documented: ref evaluates on one thread; kipp-serve passes
 * --threads to every backend), and OFF and AUTO open as before. */
static void test_ref_refuses_streaming(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = NULL;
    kipp_model_options on = {.stream = KIPP_STREAM_ON};
    int rc = kipp_model_open(path, "ref", &on, &m, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && m == NULL && strstr(err, "KIPP_STREAM_ON") && strstr(err, "ref"),
          "ref with stream on: rc %d '%s'", rc, err);
    kipp_model_options np = {.no_prefetch = 1};
    rc = kipp_model_open(path, "ref", &np, &m, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && m == NULL && strstr(err, "no_prefetch is 1") && strstr(err, "ref"),
          "ref with no_prefetch: rc %d '%s'", rc, err);
    const kipp_model_options fine[3] = {{.stream = KIPP_STREAM_OFF}, {.stream = KIPP_STREAM_AUTO}, {.n_threads = 2}};
    for (int i = 0; i < 3; i++) {
        rc = kipp_model_open(path, "ref", &fine[i], &m, err, sizeof err);
        CHECK(rc == 0, "ref with options %d: %s", i, err);
        kipp_model_close(m);
        m = NULL;
    }
}

int main(void)
{
    RUN(test_pack_pairs);
    RUN(test_streamed_equals_resident);
    RUN(test_stream_env);
    RUN(test_ref_refuses_streaming);
    return th_finish();
}
