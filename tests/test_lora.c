/*
 * test_lora.c - the quantized LoRA merge (engine/lora_merge.c) and
 * the merge's bookkeeping on a loaded model (engine/lora_apply.c).
 *
 * Oracles are computed here, independently of the merge: each element's
 * target W + delta in double from the source bytes (GGML's Q8_0 d*q and Q4_1
 * d*q+m) and the factors; the stochastic rounding's statistics from the
 * Bernoulli model it must follow.
 *   - Unbiased: over N seeds the mean merged weight equals W + delta. Each
 *     element's merged code is q + floor(t) + Bernoulli(f) (t = delta/step,
 *     f = frac(t)), so its mean over N seeds has standard deviation
 *     step*sqrt(f(1-f)/N). The gate: every |z| < 6, mean z^2 within
 *     1 +- 0.15 (its standard error is sqrt(2/n) = 0.02 for n ~ 4000
 *     elements), and the summed bias within 6 of its standard deviation.
 *   - Retained fraction of a small adapter (|delta| < half a step):
 *     sum((merged - W) * delta) / sum(delta^2); nearest rounding keeps exactly
 *     0, stochastic keeps 1 in expectation (here within 0.85..1.15, > 6 of
 *     its standard deviation); both reported.
 *   - A zero delta copies the source bytes exactly (any block, even d = 0).
 *   - A delta that pushes codes out of range is refit: every merged weight
 *     within one step of the fresh block of W + delta.
 *   - The thread split does not change a single byte.
 *   - On a model: the merged copy replaces the views, the tied output head
 *     keeps the file's tensor, the bytes are counted, and a merge that does
 *     not fit the available memory is refused with the numbers, as is one
 *     whose weights leave their format's range (a huge scale).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/test_harness.h"
#include "engine/lora.h"
#include "kernels/common.h"

#define ROWS 16
#define COLS 256
#define RK 2

/* Deterministic uniform in [0, 1) (splitmix64), so the fixtures are the same every run. */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* A [ROWS][COLS] tensor of fmt with codes away from the range ends (so a sub-step delta stays on the grid). */
static void make_src(uint32_t fmt, uint8_t *buf)
{
    size_t bb = fmt == KIPP_DTYPE_Q8_0 ? 34 : 20;
    for (size_t b = 0; b < ROWS * COLS / 32; b++) {
        uint8_t *p = buf + bb * b;
        uint16_t d = kipp_f32_to_f16((float)(0.005 + 0.01 * urand())), m = kipp_f32_to_f16((float)(-0.08 * urand()));
        memcpy(p, &d, 2);
        if (fmt == KIPP_DTYPE_Q8_0) {
            for (int j = 0; j < 32; j++) p[2 + j] = (uint8_t)(int8_t)(-100 + (int)(201 * urand()));
        } else {
            memcpy(p + 2, &m, 2);
            for (int j = 0; j < 16; j++) p[4 + j] = (uint8_t)((1 + (int)(14 * urand())) | ((1 + (int)(14 * urand())) << 4));
        }
    }
}

/* Decoded weight (row, col) of a [ROWS][COLS] tensor, and its block's step. */
static double weight_at(uint32_t fmt, const uint8_t *buf, size_t row, size_t col, double *step)
{
    size_t bb = fmt == KIPP_DTYPE_Q8_0 ? 34 : 20, j = col % 32;
    const uint8_t *p = buf + bb * (row * (COLS / 32) + col / 32);
    uint16_t dh, mh;
    memcpy(&dh, p, 2);
    double d = kipp_f16_to_f32(dh);
    if (step) *step = d;
    if (fmt == KIPP_DTYPE_Q8_0) return d * (int8_t)p[2 + j];
    memcpy(&mh, p + 2, 2);
    int q = j < 16 ? p[4 + j] & 15 : p[4 + j - 16] >> 4;
    return d * q + kipp_f16_to_f32(mh);
}

/* Factors p [ROWS][RK], q [RK][COLS] with |delta| <= amp * (smallest step 0.005). */
static void make_factors(float *p, float *q, double amp)
{
    for (size_t i = 0; i < ROWS * RK; i++) p[i] = (float)(urand() - 0.5);
    for (size_t i = 0; i < RK * COLS; i++) q[i] = (float)((urand() - 0.5) * 0.005 * amp * 2);
}

static double delta_at(const float *p, const float *q, size_t row, size_t col)
{
    double s = 0;
    for (int k = 0; k < RK; k++) s += (double)p[row * RK + k] * q[(size_t)k * COLS + col];
    return s;
}

static int merge1(uint32_t fmt, const uint8_t *src, uint8_t *dst, const float *p, const float *q, uint64_t seed,
                  kipp_lora_rounding rnd, int nth, kipp_lora_stats *st)
{
    kipp_lora_term t = {.p = p, .q = q, .r = RK};
    kipp_lora_job j = {.dtype = fmt, .rows = ROWS, .cols = COLS, .src = src, .dst = dst, .tensor_id = 5,
                       .terms = &t, .n_terms = 1};
    char err[256] = "";
    int rc = kipp_lora_merge(&j, 1, nth, seed, rnd, st, err, sizeof err);
    CHECK(rc == 0, "merge: %s", err);
    return rc;
}

static void unbiased(uint32_t fmt, const char *name)
{
    enum { N = 400 };
    size_t bytes = ROWS * COLS / 32 * (fmt == KIPP_DTYPE_Q8_0 ? 34 : 20);
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    float p[ROWS * RK], q[RK * COLS];
    double *sum = calloc(ROWS * COLS, sizeof *sum);
    make_src(fmt, src);
    make_factors(p, q, 1.5); /* up to 1.5 smallest steps: codes move by 0 or 1, some by 2 */
    kipp_lora_stats st = {0};
    for (uint64_t s = 0; s < N; s++) {
        if (merge1(fmt, src, dst, p, q, s, KIPP_LORA_STOCHASTIC, 2, &st)) break;
        for (size_t r = 0; r < ROWS; r++)
            for (size_t c = 0; c < COLS; c++) sum[r * COLS + c] += weight_at(fmt, dst, r, c, NULL);
    }
    CHECK(st.refit == 0, "%s: %llu blocks refit; the fixture keeps codes in range", name, (unsigned long long)st.refit);
    double maxz = 0, z2 = 0, bias = 0, var = 0;
    size_t n = 0;
    for (size_t r = 0; r < ROWS; r++)
        for (size_t c = 0; c < COLS; c++) {
            double step, w = weight_at(fmt, src, r, c, &step), dl = delta_at(p, q, r, c), t = dl / step;
            double f = t - floor(t), mean = sum[r * COLS + c] / N, sd = step * sqrt(f * (1 - f) / N);
            bias += mean - (w + dl);
            var += sd * sd;
            if (f < 0.05 || f > 0.95) continue; /* near-degenerate Bernoulli: z is not normal */
            double z = (mean - (w + dl)) / sd;
            maxz = fmax(maxz, fabs(z));
            z2 += z * z;
            n++;
        }
    double bz = bias / sqrt(var);
    printf("  %s: mean over %d seeds vs W+delta: max |z| %.2f, mean z^2 %.3f over %zu elements, total bias %.2f sd\n",
           name, N, maxz, z2 / n, n, bz);
    CHECK(n > 3000, "%s: only %zu elements with a usable fraction", name, n);
    CHECK(maxz < 6.0, "%s: an element's mean is %.2f standard deviations from W+delta", name, maxz);
    CHECK(fabs(z2 / n - 1.0) < 0.15, "%s: mean z^2 %.3f, expected 1 +- 0.15 (the Bernoulli variance)", name, z2 / n);
    CHECK(fabs(bz) < 6.0, "%s: summed bias is %.2f standard deviations", name, bz);
    free(src), free(dst), free(sum);
}

static void test_q8_0_unbiased(void) { unbiased(KIPP_DTYPE_Q8_0, "Q8_0"); }
static void test_q4_1_unbiased(void) { unbiased(KIPP_DTYPE_Q4_1, "Q4_1"); }

/* sum((merged - W) * delta) / sum(delta^2) of one merge. */
static double retained(uint32_t fmt, const uint8_t *src, const uint8_t *dst, const float *p, const float *q)
{
    double num = 0, den = 0;
    for (size_t r = 0; r < ROWS; r++)
        for (size_t c = 0; c < COLS; c++) {
            double dl = delta_at(p, q, r, c);
            num += (weight_at(fmt, dst, r, c, NULL) - weight_at(fmt, src, r, c, NULL)) * dl;
            den += dl * dl;
        }
    return num / den;
}

static void test_retained_fraction(void)
{
    const uint32_t fmts[2] = {KIPP_DTYPE_Q8_0, KIPP_DTYPE_Q4_1};
    for (int i = 0; i < 2; i++) {
        size_t bytes = ROWS * COLS / 32 * (i ? 20 : 34);
        uint8_t *src = malloc(bytes), *dst = malloc(bytes);
        float p[ROWS * RK], q[RK * COLS];
        make_src(fmts[i], src);
        make_factors(p, q, 0.4); /* |delta| < 0.4 of the smallest step: a "small adapter" */
        merge1(fmts[i], src, dst, p, q, 1, KIPP_LORA_NEAREST, 1, NULL);
        double rn = retained(fmts[i], src, dst, p, q);
        merge1(fmts[i], src, dst, p, q, 1, KIPP_LORA_STOCHASTIC, 1, NULL);
        double rsto = retained(fmts[i], src, dst, p, q);
        printf("  %s small adapter retained: nearest %.3f, stochastic %.3f\n", i ? "Q4_1" : "Q8_0", rn, rsto);
        CHECK(rn == 0.0, "nearest rounding kept %.3f of a sub-half-step delta, expected exactly 0", rn);
        CHECK(fabs(rsto - 1.0) < 0.15, "stochastic rounding kept %.3f, expected 1 +- 0.15", rsto);
        free(src), free(dst);
    }
}

static void test_zero_delta_copies_bytes(void)
{
    const uint32_t fmts[3] = {KIPP_DTYPE_Q8_0, KIPP_DTYPE_Q4_1, KIPP_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        size_t bytes = fmts[i] == KIPP_DTYPE_BF16 ? ROWS * COLS * 2 : ROWS * COLS / 32 * (i ? 20 : 34);
        uint8_t *src = malloc(bytes), *dst = malloc(bytes);
        for (size_t b = 0; b < bytes; b++) src[b] = (uint8_t)(urand() * 256); /* any bytes, NaN scales too */
        memset(src, 0, 4); /* a block with d = 0 */
        float p[ROWS * RK], q[RK * COLS];
        make_factors(p, q, 1.0);
        memset(p, 0, sizeof p); /* scale 0 folds to p = 0 */
        kipp_lora_stats st = {0};
        merge1(fmts[i], src, dst, p, q, 3, KIPP_LORA_STOCHASTIC, 2, &st);
        CHECK(!memcmp(src, dst, bytes), "format %u: zero delta changed bytes", fmts[i]);
        CHECK(st.grid == 0 && st.refit == 0, "format %u: zero delta counted as merged", fmts[i]);
        free(src), free(dst);
    }
}

static void test_out_of_range_refits(void)
{
    const uint32_t fmts[2] = {KIPP_DTYPE_Q8_0, KIPP_DTYPE_Q4_1};
    for (int i = 0; i < 2; i++) {
        size_t bytes = ROWS * COLS / 32 * (i ? 20 : 34);
        uint8_t *src = malloc(bytes), *dst = malloc(bytes);
        float p[ROWS * RK], q[RK * COLS];
        make_src(fmts[i], src);
        make_factors(p, q, 400.0); /* far beyond the block ranges */
        kipp_lora_stats st = {0};
        merge1(fmts[i], src, dst, p, q, 9, KIPP_LORA_STOCHASTIC, 2, &st);
        CHECK(st.refit > 0, "format %u: no block refit under a delta of many ranges", fmts[i]);
        double worst = 0;
        for (size_t r = 0; r < ROWS; r++)
            for (size_t c = 0; c < COLS; c++) {
                double step, got = weight_at(fmts[i], dst, r, c, &step);
                double want = weight_at(fmts[i], src, r, c, NULL) + delta_at(p, q, r, c);
                worst = fmax(worst, fabs(got - want) / step);
            }
        CHECK(worst <= 1.0, "format %u: a merged weight is %.2f steps from W+delta, expected within one", fmts[i], worst);
        free(src), free(dst);
    }
}

static void test_threads_do_not_change_bytes(void)
{
    size_t bytes = ROWS * COLS / 32 * 34;
    uint8_t *src = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes);
    float p[ROWS * RK], q[RK * COLS];
    make_src(KIPP_DTYPE_Q8_0, src);
    make_factors(p, q, 1.0);
    merge1(KIPP_DTYPE_Q8_0, src, a, p, q, 11, KIPP_LORA_STOCHASTIC, 1, NULL);
    merge1(KIPP_DTYPE_Q8_0, src, b, p, q, 11, KIPP_LORA_STOCHASTIC, 3, NULL);
    CHECK(!memcmp(a, b, bytes), "1 and 3 threads merged different bytes");
    merge1(KIPP_DTYPE_Q8_0, src, b, p, q, 12, KIPP_LORA_STOCHASTIC, 3, NULL);
    CHECK(memcmp(a, b, bytes) != 0, "seeds 11 and 12 drew the same roundings");
    free(src), free(a), free(b);
}

/* ------------------------------------------------------- on a loaded model */

static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }
static void put_str(FILE *f, const char *s) { put_u64(f, strlen(s)), put(f, s, strlen(s)); }
static void put_kv_str(FILE *f, const char *k, const char *v) { put_str(f, k), put_u32(f, KIPP_GGUF_STRING), put_str(f, v); }

/* A one-target F32 adapter GGUF (GGUF dims a [a0, a1], b [b0, b1], alpha 4, values
 * uniform in +-amp/2) in a temp file; the path in out; the values in a_out/b_out when non-NULL. */
static void write_adapter_vals(char *out, const char *target, uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1,
                               float amp, float *a_out, float *b_out)
{
    strcpy(out, "/tmp/kipp_test_lora_XXXXXX");
    int fd = mkstemp(out);
    FILE *f = fdopen(fd, "wb");
    put(f, "GGUF", 4), put_u32(f, 3), put_u64(f, 2), put_u64(f, 4);
    put_kv_str(f, "general.architecture", "qwen3");
    put_kv_str(f, "general.type", "adapter");
    put_kv_str(f, "adapter.type", "lora");
    put_str(f, "adapter.lora.alpha"), put_u32(f, KIPP_GGUF_F32);
    float alpha = 4.0f;
    put(f, &alpha, 4);
    char na[128], nb[128];
    snprintf(na, sizeof na, "%s.lora_a", target);
    snprintf(nb, sizeof nb, "%s.lora_b", target);
    uint64_t abytes = a0 * a1 * 4, aoff = 0, boff = (abytes + 31) / 32 * 32;
    put_str(f, na), put_u32(f, 2), put_u64(f, a0), put_u64(f, a1), put_u32(f, 0), put_u64(f, aoff);
    put_str(f, nb), put_u32(f, 2), put_u64(f, b0), put_u64(f, b1), put_u32(f, 0), put_u64(f, boff);
    long pos = ftell(f);
    for (long i = pos; i % 32; i++) fputc(0, f);
    for (uint64_t i = 0; i < a0 * a1; i++) {
        float v = (float)(urand() - 0.5) * amp;
        if (a_out) a_out[i] = v;
        put(f, &v, 4);
    }
    for (uint64_t i = abytes; i < boff; i++) fputc(0, f);
    for (uint64_t i = 0; i < b0 * b1; i++) {
        float v = (float)(urand() - 0.5) * amp;
        if (b_out) b_out[i] = v;
        put(f, &v, 4);
    }
    fclose(f);
}

static void write_adapter(char *out, const char *target, uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1)
{
    write_adapter_vals(out, target, a0, a1, b0, b1, 0.02f, NULL, NULL);
}

static kipp_model *load(const char *name)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", th_models_dir(), name);
    kipp_model *m = NULL;
    int rc = kipp_model_load(path, &m, err, sizeof err);
    CHECK(rc == 0, "load %s: %s", path, err);
    return m;
}

static void test_model_merge_and_memory(void)
{
    kipp_model *m = load("synthetic-tiny-q8_0.gguf");
    if (!m) return;
    char path[64], err[512] = "";
    write_adapter(path, "blk.1.ffn_up.weight", 256, 4, 4, 512);
    kipp_lora_spec spec = {.path = path, .scale = 1.0f};
    const void *file_up = m->layers[1].w_up.data, *file_gate = m->layers[1].w_gate.data;
    kipp_lora_apply_opts tight = {.n_threads = 2, .mem_available = 1000};
    int rc = kipp_lora_apply(m, &spec, 1, &tight, err, sizeof err);
    CHECK(rc == KIPP_ENOMEM && strstr(err, "MiB") && strstr(err, "available"), "tight memory: rc %d, %s", rc, err);
    CHECK(m->layers[1].w_up.data == file_up && m->lora_tensors == 0, "a refused merge changed the model");
    kipp_lora_apply_opts o = {.n_threads = 2};
    rc = kipp_lora_apply(m, &spec, 1, &o, err, sizeof err);
    CHECK(rc == 0, "apply: %s", err);
    CHECK(m->layers[1].w_up.data != file_up && m->layers[1].w_gate.data == file_gate, "views not rebound as targeted");
    CHECK(((uintptr_t)m->layers[1].w_up.data & 63) == 0, "merged copy not 64-byte aligned");
    CHECK(m->lora_tensors == 1 && m->lora_bytes == m->layers[1].w_up.nbytes && m->n_lora == 1,
          "bookkeeping: %u tensors, %llu bytes", m->lora_tensors, (unsigned long long)m->lora_bytes);
    kipp_model_close(m);
    unlink(path);
}

static void test_tied_embedding_changes_lookup_only(void)
{
    kipp_model *m = load("synthetic-tiny.gguf");
    if (!m) return;
    CHECK(m->view.dims.tied_embeddings, "synthetic-tiny is expected tied");
    char path[64], err[512] = "";
    write_adapter(path, "token_embd.weight", 4, 151936, 4, 256); /* a [r, vocab], b [r, d] (llama.cpp) */
    kipp_lora_spec spec = {.path = path, .scale = 1.0f};
    const void *file = m->view.w.token_embd.data;
    kipp_lora_apply_opts o = {.n_threads = 2};
    int rc = kipp_lora_apply(m, &spec, 1, &o, err, sizeof err);
    CHECK(rc == 0, "apply: %s", err);
    CHECK(m->view.w.token_embd.data != file, "the input lookup kept the file's embedding");
    CHECK(m->view.w.output.data == file, "the tied head changed; expected only the lookup to");
    CHECK(memcmp(m->view.w.token_embd.data, file, m->view.w.token_embd.nbytes) != 0, "merged embedding equals the file");
    kipp_model_close(m);
    unlink(path);
}

/* Retained fraction of a small adapter on a model tensor (synthetic-tiny-q8_0 blk.1.ffn_up,
 * [512][256]): sum((merged - file) * delta) / sum(delta^2), delta = alpha/r * B.A in double. */
static double model_retained(kipp_lora_rounding rnd, double *delta_steps)
{
    enum { N_OUT = 512, N_IN = 256, R = 4 };
    static float a[R * N_IN], b[N_OUT * R];
    kipp_model *m = load("synthetic-tiny-q8_0.gguf");
    if (!m) return NAN;
    char path[64], err[512] = "";
    rs = 0x5eed; /* the same factors for both roundings */
    write_adapter_vals(path, "blk.1.ffn_up.weight", N_IN, R, R, N_OUT, 0.012f, a, b);
    const uint8_t *file = m->layers[1].w_up.data;
    kipp_lora_spec spec = {.path = path, .scale = 1.0f};
    kipp_lora_apply_opts o = {.n_threads = 2, .rounding = rnd};
    int rc = kipp_lora_apply(m, &spec, 1, &o, err, sizeof err);
    CHECK(rc == 0, "apply: %s", err);
    const uint8_t *merged = m->layers[1].w_up.data;
    double num = 0, den = 0, steps = 0;
    for (size_t r = 0; !rc && r < N_OUT; r++)
        for (size_t c = 0; c < N_IN; c++) {
            double dl = 0;
            for (int k = 0; k < R; k++) dl += (double)b[r * R + k] * a[(size_t)k * N_IN + c];
            dl *= 4.0 / R; /* alpha / r */
            const uint8_t *fb = file + 34 * (r * (N_IN / 32) + c / 32), *mb = merged + 34 * (r * (N_IN / 32) + c / 32);
            uint16_t fd, md;
            memcpy(&fd, fb, 2), memcpy(&md, mb, 2);
            double w = kipp_f16_to_f32(fd) * (int8_t)fb[2 + c % 32], w2 = kipp_f16_to_f32(md) * (int8_t)mb[2 + c % 32];
            num += (w2 - w) * dl;
            den += dl * dl;
            steps += fabs(dl) / kipp_f16_to_f32(fd);
        }
    *delta_steps = steps / (N_OUT * N_IN);
    kipp_model_close(m);
    unlink(path);
    return num / den;
}

static void test_model_retained_fraction(void)
{
    double s1, s2, rn = model_retained(KIPP_LORA_NEAREST, &s1), rst = model_retained(KIPP_LORA_STOCHASTIC, &s2);
    printf("  synthetic-tiny-q8_0 blk.1.ffn_up, adapter |delta| %.3f steps on average: retained nearest %.3f, "
           "stochastic %.3f\n", s1, rn, rst);
    CHECK(s1 < 0.5 && s1 == s2, "the fixture is not a small adapter: mean |delta| %.3f steps", s1);
    CHECK(fabs(rst - 1.0) < 0.15, "stochastic rounding kept %.3f of a small adapter, expected 1 +- 0.15", rst);
    CHECK(rn < 0.5 * rst, "nearest rounding kept %.3f, not well below stochastic %.3f", rn, rst);
}

/* Through kipp_model_open: the cpu backend repacks the projections, so their merged copies
 * are freed after it prepared (the embedding's stays: the lookup reads it); ref keeps all. */
static void test_open_releases_what_the_backend_repacked(void)
{
    char path[64], emb[64], model[512], err[512] = "";
    snprintf(model, sizeof model, "%s/synthetic-tiny-q8_0.gguf", th_models_dir());
    write_adapter(path, "blk.0.attn_v.weight", 256, 4, 4, 1024);
    write_adapter(emb, "token_embd.weight", 4, 151936, 4, 256);
    kipp_lora_spec specs[2] = {{.path = path, .scale = 1.0f}, {.path = emb, .scale = 1.0f}};
    const char *backends[2] = {"cpu", "ref"};
    for (int b = 0; b < 2; b++) {
        kipp_model_options o = {.n_threads = 1, .lora = specs, .n_lora = 2};
        kipp_model *m = NULL;
        int rc = kipp_model_open(model, backends[b], &o, &m, err, sizeof err);
        CHECK(rc == 0, "%s: %s", backends[b], err);
        if (rc) continue;
        kipp_model_info info;
        kipp_model_get_info(m, &info);
        uint64_t v_bytes = 1024ull * 256 / 32 * 34, e_bytes = 151936ull * 256 * 2;
        uint64_t want = b == 0 ? e_bytes : e_bytes + v_bytes;
        CHECK(info.n_lora == 2 && info.lora_tensors == 2 && info.lora_bytes == want,
              "%s: %u adapters, %u tensors, %llu bytes held; expected 2, 2, %llu", backends[b], info.n_lora,
              info.lora_tensors, (unsigned long long)info.lora_bytes, (unsigned long long)want);
        kipp_session *s = NULL;
        float *logits = malloc(151936 * sizeof *logits);
        uint32_t tok = 785;
        rc = kipp_session_create(m, 64, &s, err, sizeof err);
        if (!rc) rc = kipp_session_eval(s, &tok, 1, logits, err, sizeof err);
        CHECK(rc == 0, "%s: eval after the release: %s", backends[b], err);
        kipp_session_destroy(s);
        free(logits);
        kipp_model_close(m);
    }
    unlink(path), unlink(emb);
}

/* A finite scale so large that the merged weights leave their format (BF16
 * overflows to Inf; a Q8_0 or Q4_1 block would need an f16 scale beyond 65504)
 * is refused at open, naming the tensor, the scale and the format's range,
 * instead of merging Inf, NaN or silently clamped weights. Scale 1 opens. */
static void test_huge_scale_refused(void)
{
    static const struct {
        const char *file, *fmt;
        float scale, amp;
    } cases[] = {
        {"synthetic-tiny.gguf", "BF16", 1e37f, 20.0f}, /* factors finite, their products overflow FP32 */
        {"synthetic-tiny-q8_0.gguf", "Q8_0", 1e30f, 0.02f},
        {"synthetic-tiny-affine4_gs32.gguf", "Q4_1", 1e30f, 0.02f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[64], model[512], err[512] = "", scale[32];
        snprintf(model, sizeof model, "%s/%s", th_models_dir(), cases[i].file);
        snprintf(scale, sizeof scale, "LoRA scale %g", (double)cases[i].scale);
        write_adapter_vals(path, "blk.1.ffn_up.weight", 256, 4, 4, 512, cases[i].amp, NULL, NULL);
        kipp_lora_spec spec = {.path = path, .scale = cases[i].scale};
        kipp_model_options o = {.n_threads = 2, .lora = &spec, .n_lora = 1};
        kipp_model *m = NULL;
        int rc = kipp_model_open(model, "ref", &o, &m, err, sizeof err);
        CHECK(rc == KIPP_EINVAL && m == NULL, "%s at scale %g: rc %d, expected a refusal", cases[i].file,
              (double)cases[i].scale, rc);
        CHECK(strstr(err, "'blk.1.ffn_up.weight'") && strstr(err, scale) && strstr(err, cases[i].fmt),
              "%s: message '%s' does not name the tensor, '%s' and %s", cases[i].file, err, scale, cases[i].fmt);
        kipp_model_close(m);
        spec.scale = 1.0f;
        rc = kipp_model_open(model, "ref", &o, &m, err, sizeof err);
        CHECK(rc == 0, "%s at scale 1: %s", cases[i].file, err);
        kipp_model_close(m);
        unlink(path);
    }
}

int main(void)
{
    RUN(test_q8_0_unbiased);
    RUN(test_q4_1_unbiased);
    RUN(test_retained_fraction);
    RUN(test_zero_delta_copies_bytes);
    RUN(test_out_of_range_refits);
    RUN(test_threads_do_not_change_bytes);
    RUN(test_model_merge_and_memory);
    RUN(test_tied_embedding_changes_lookup_only);
    RUN(test_open_releases_what_the_backend_repacked);
    RUN(test_model_retained_fraction);
    RUN(test_huge_scale_refused);
    return th_finish();
}
