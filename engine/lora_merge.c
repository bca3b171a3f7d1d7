/*
 * lora_merge.c - the arithmetic of a LoRA merge: one target row at
 * a time, delta = sum over terms of p[row] . q, then a merge rule per format
 * that writes the same format back (seed 002 "Re-quantisation").
 *
 * BF16: each element W + delta rounded to nearest. Q8_0 / Q4_1 (a block of 32
 * weights sharing fp16 scales): the block's scales are kept and each code moves
 * by delta/step, rounded stochastically (up with probability equal to the
 * fraction), so E[merged] = W + delta even when delta is far below half a step,
 * where nearest rounding would snap every weight back to its old code and drop
 * the adapter. The draw is a hash of (seed, tensor, row, element), so a merge
 * is reproducible and independent of the thread split. When a code would
 * leave its range, a fresh quantization of W + delta is tried as well and the
 * candidate with the lower squared error is written. A block (BF16: an
 * element) whose delta is exactly 0 is copied byte for byte, so scale 0
 * reproduces the file.
 *
 * Rows run on worker threads started here: the merge happens before the
 * backend exists (its weights are packed from the merged tensors), so there
 * is no backend pool to borrow yet.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* Inlined: one 16-byte hash per merged weight, where a library call would dominate. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/lora.h"
#include "kernels/common.h"

#define QBLOCK 32        /* weights per Q8_0 / Q4_1 block */
#define CHUNK_ROWS 8     /* rows one worker claims at a time */
#define MAX_THREADS 256

/* Uniform draw in [0, 1) for element (row, col) of tensor tid: 24 bits of XXH3. */
static inline float draw(uint64_t seed, uint32_t tid, uint64_t row, uint64_t col)
{
    uint64_t key[2] = {((uint64_t)tid << 32) ^ row, col};
    return (float)(XXH3_64bits_withSeed(key, sizeof key, seed) >> 40) * 0x1p-24f;
}

/* t rounded to an integer: up with probability frac(t) (stochastic) or to nearest. */
static inline float round_code(float t, float u, kipp_lora_rounding rnd)
{
    if (rnd == KIPP_LORA_NEAREST) return floorf(t + 0.5f);
    float f = floorf(t);
    return f + (u < t - f ? 1.0f : 0.0f);
}

/* Half away from zero, as the converter's encoder (tools/quant_blocks.py) rounds. */
static inline float round_away(float x) { return x < 0 ? -floorf(-x + 0.5f) : floorf(x + 0.5f); }

/* The first merged weight its format cannot hold: (job, row, col) order, so the
 * report does not depend on the thread split. */
typedef struct {
    int set;
    size_t job;
    uint64_t row, col;
    float value; /* W + delta in FP32: Inf or NaN, or beyond the format's range */
} merge_bad;

typedef struct {
    uint64_t seed;
    uint32_t tid;
    uint64_t row;
    kipp_lora_rounding rnd;
    kipp_lora_stats *st;
    size_t job;
    merge_bad *bad;
} row_ctx;

static void note_bad(row_ctx *c, uint64_t col, float value)
{
    if (!c->bad->set) *c->bad = (merge_bad){1, c->job, c->row, col, value};
}

/* Index of the largest |x[j]| of a block: the weight that pushed it out of range. */
static int block_amax(const float *x)
{
    int at = 0;
    for (int j = 1; j < QBLOCK; j++)
        if (!(fabsf(x[j]) <= fabsf(x[at]))) at = j; /* NaN wins too */
    return at;
}

/* ------------------------------------------------------------------ BF16 */

static void merge_bf16_row(const uint16_t *src, uint16_t *dst, const float *dl, uint64_t cols, row_ctx *c)
{
    for (uint64_t j = 0; j < cols; j++) {
        if (dl[j] == 0.0f) {
            dst[j] = src[j];
            c->st->copied++;
        } else {
            float v = kipp_bf16_to_f32(src[j]) + dl[j];
            dst[j] = kipp_f32_to_bf16(v);
            if ((dst[j] & 0x7f80) == 0x7f80) note_bad(c, j, v); /* Inf or NaN: all exponent bits set */
            c->st->grid++;
        }
    }
}

/* Either block format (Q8_0, Q4_1): a block whose 32 deltas are all zero is
 * copied unchanged (st->copied); 1 when it was. */
static int copy_untouched(const uint8_t *src, uint8_t *dst, size_t bytes, const float *dl, row_ctx *c)
{
    for (int j = 0; j < QBLOCK; j++)
        if (dl[j] != 0.0f) return 0;
    memcpy(dst, src, bytes);
    c->st->copied++;
    return 1;
}

/* ------------------------------------------------------------------ Q8_0 */

/* A fresh Q8_0 block of x[32] (amax/127 scale, codes round half away, +-127); its squared error. */
static double refit_q8_0(const float *x, uint16_t *dh, int8_t *q)
{
    float amax = 0;
    for (int j = 0; j < QBLOCK; j++) amax = fmaxf(amax, fabsf(x[j]));
    *dh = kipp_f32_to_f16(amax / 127.0f);
    float d = kipp_f16_to_f32(*dh);
    double e = 0;
    for (int j = 0; j < QBLOCK; j++) {
        float v = d > 0 ? fminf(127.0f, fmaxf(-127.0f, round_away(x[j] / d))) : 0.0f;
        q[j] = (int8_t)v;
        double r = (double)d * v - x[j];
        e += r * r;
    }
    return isfinite(d) ? e : INFINITY;
}

static void merge_q8_0_block(const uint8_t *src, uint8_t *dst, const float *dl, uint64_t col0, row_ctx *c)
{
    if (copy_untouched(src, dst, 34, dl, c)) return;
    uint16_t dh;
    memcpy(&dh, src, 2);
    const int8_t *q = (const int8_t *)(src + 2);
    float d = kipp_f16_to_f32(dh), x[QBLOCK];
    int8_t g[QBLOCK];
    const int no_grid = !(d > 0 && isfinite(d)); /* a zero scale has no grid to move on */
    int out = no_grid;
    const float inv = no_grid ? 0.0f : 1.0f / d;
    for (int j = 0; j < QBLOCK; j++) {
        float n = q[j];
        if (!isfinite(dl[j])) /* no code for it (and converting NaN to int8 is undefined) */
            note_bad(c, col0 + j, d * (float)q[j] + dl[j]);
        else if (dl[j] != 0.0f && !no_grid) {
            float u = c->rnd == KIPP_LORA_NEAREST ? 0 : draw(c->seed, c->tid, c->row, col0 + j);
            n = round_code((float)q[j] + dl[j] * inv, u, c->rnd);
            if (n > 127.0f || n < -127.0f) out = 1, n = fminf(127.0f, fmaxf(-127.0f, n));
        }
        g[j] = (int8_t)n;
    }
    if (out) { /* only here do the two candidates' errors matter */
        double eg = 0;
        for (int j = 0; j < QBLOCK; j++) {
            x[j] = d * (float)q[j] + dl[j];
            double r = (double)d * g[j] - x[j];
            eg += r * r;
        }
        uint16_t rh;
        int8_t rq[QBLOCK];
        double er = refit_q8_0(x, &rh, rq);
        if (!(er < INFINITY)) { /* no f16 scale reaches these weights: clamping would change them silently */
            int at = block_amax(x);
            note_bad(c, col0 + (uint64_t)at, x[at]);
        }
        if (no_grid || er < eg) {
            memcpy(dst, &rh, 2);
            memcpy(dst + 2, rq, QBLOCK);
            c->st->refit++;
            return;
        }
    }
    memcpy(dst, &dh, 2);
    memcpy(dst + 2, g, QBLOCK);
    c->st->grid++;
}

/* ------------------------------------------------------------------ Q4_1 */

/* A fresh Q4_1 block of x[32] (m = min, d = (max-m)/15, codes 0..15); its squared error. */
static double refit_affine4(const float *x, uint16_t *dh, uint16_t *mh, uint8_t *q)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < QBLOCK; j++) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
    *mh = kipp_f32_to_f16(lo);
    float m = kipp_f16_to_f32(*mh);
    *dh = kipp_f32_to_f16((hi - m) / 15.0f);
    float d = kipp_f16_to_f32(*dh);
    double e = 0;
    for (int j = 0; j < QBLOCK; j++) {
        float v = d != 0 ? fminf(15.0f, fmaxf(0.0f, round_away((x[j] - m) / d))) : 0.0f;
        q[j] = (uint8_t)v;
        double r = (double)d * v + m - x[j];
        e += r * r;
    }
    return isfinite(d) && isfinite(m) ? e : INFINITY;
}

static void put_affine4(uint8_t *dst, uint16_t dh, uint16_t mh, const uint8_t *q)
{
    memcpy(dst, &dh, 2);
    memcpy(dst + 2, &mh, 2);
    for (int j = 0; j < 16; j++) dst[4 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

static void merge_q4_1_block(const uint8_t *src, uint8_t *dst, const float *dl, uint64_t col0, row_ctx *c)
{
    if (copy_untouched(src, dst, 20, dl, c)) return;
    uint16_t dh, mh;
    memcpy(&dh, src, 2);
    memcpy(&mh, src + 2, 2);
    float d = kipp_f16_to_f32(dh), m = kipp_f16_to_f32(mh), x[QBLOCK];
    uint8_t q[QBLOCK], g[QBLOCK];
    for (int j = 0; j < 16; j++) q[j] = src[4 + j] & 15, q[j + 16] = src[4 + j] >> 4;
    const int no_grid = !(d > 0 && isfinite(d));
    int out = no_grid;
    const float inv = no_grid ? 0.0f : 1.0f / d;
    for (int j = 0; j < QBLOCK; j++) {
        float n = q[j];
        if (!isfinite(dl[j])) /* no code for it (and converting NaN to uint8 is undefined) */
            note_bad(c, col0 + j, d * (float)q[j] + m + dl[j]);
        else if (dl[j] != 0.0f && !no_grid) {
            float u = c->rnd == KIPP_LORA_NEAREST ? 0 : draw(c->seed, c->tid, c->row, col0 + j);
            n = round_code((float)q[j] + dl[j] * inv, u, c->rnd);
            if (n > 15.0f || n < 0.0f) out = 1, n = fminf(15.0f, fmaxf(0.0f, n));
        }
        g[j] = (uint8_t)n;
    }
    if (out) { /* only here do the two candidates' errors matter */
        double eg = 0;
        for (int j = 0; j < QBLOCK; j++) {
            x[j] = d * (float)q[j] + m + dl[j];
            double r = (double)d * g[j] + m - x[j];
            eg += r * r;
        }
        uint16_t rd, rm;
        uint8_t rq[QBLOCK];
        double er = refit_affine4(x, &rd, &rm, rq);
        if (!(er < INFINITY)) { /* no f16 minimum and step reach these weights */
            int at = block_amax(x);
            note_bad(c, col0 + (uint64_t)at, x[at]);
        }
        if (no_grid || er < eg) {
            put_affine4(dst, rd, rm, rq);
            c->st->refit++;
            return;
        }
    }
    put_affine4(dst, dh, mh, g);
    c->st->grid++;
}

/* ----------------------------------------------------------------- rows */

/* Four floats in an SSE register (GNU vector extension; baseline x86-64 has SSE2). */
typedef float v4f __attribute__((vector_size(16)));

/* delta[0..cols) of one row: the sum of every term's p[row] . q, eight columns at a
 * time in two vector accumulators (the scalar loop does not vectorize at -O2). */
static void delta_row(const kipp_lora_job *jb, uint64_t row, float *restrict delta)
{
    const uint64_t cols = jb->cols;
    memset(delta, 0, cols * sizeof *delta);
    for (uint32_t t = 0; t < jb->n_terms; t++) {
        const kipp_lora_term *tm = &jb->terms[t];
        const float *pr = tm->p + row * tm->r;
        uint64_t j = 0;
        for (; j + 8 <= cols; j += 8) {
            v4f a0 = {0, 0, 0, 0}, a1 = {0, 0, 0, 0}, q0, q1;
            for (uint32_t k = 0; k < tm->r; k++) {
                const float *qk = tm->q + (size_t)k * cols + j;
                v4f pk = {pr[k], pr[k], pr[k], pr[k]};
                memcpy(&q0, qk, sizeof q0);
                memcpy(&q1, qk + 4, sizeof q1);
                a0 += pk * q0;
                a1 += pk * q1;
            }
            memcpy(&q0, delta + j, sizeof q0);
            memcpy(&q1, delta + j + 4, sizeof q1);
            q0 += a0, q1 += a1;
            memcpy(delta + j, &q0, sizeof q0);
            memcpy(delta + j + 4, &q1, sizeof q1);
        }
        for (; j < cols; j++) {
            float a = 0;
            for (uint32_t k = 0; k < tm->r; k++) a += pr[k] * tm->q[(size_t)k * cols + j];
            delta[j] += a;
        }
    }
}

static void merge_row(const kipp_lora_job *jb, uint64_t row, const float *dl, row_ctx *c)
{
    const kipp_fmt_facts *f = kipp_fmt_by_gguf(jb->dtype);
    size_t rb = kipp_fmt_file_bytes(f, 1, jb->cols);
    const uint8_t *src = (const uint8_t *)jb->src + rb * row;
    uint8_t *dst = (uint8_t *)jb->dst + rb * row;
    if (jb->dtype == KIPP_DTYPE_BF16) {
        merge_bf16_row((const uint16_t *)src, (uint16_t *)dst, dl, jb->cols, c);
        return;
    }
    for (uint64_t b = 0; b < jb->cols / QBLOCK; b++) {
        if (jb->dtype == KIPP_DTYPE_Q8_0) merge_q8_0_block(src + 34 * b, dst + 34 * b, dl + QBLOCK * b, QBLOCK * b, c);
        else merge_q4_1_block(src + 20 * b, dst + 20 * b, dl + QBLOCK * b, QBLOCK * b, c);
    }
}

/* --------------------------------------------------------------- workers */

typedef struct {
    size_t job;
    uint64_t r0, r1;
} chunk;

typedef struct {
    const kipp_lora_job *jobs;
    const chunk *chunks;
    size_t n_chunks;
    atomic_size_t next;
    uint64_t seed;
    kipp_lora_rounding rnd;
    uint64_t max_cols;
    pthread_mutex_t mu;
    kipp_lora_stats total;
    merge_bad bad;
    int oom;
} merge_ctx;

/* 1 when a comes before b in (job, row, col) order. */
static int bad_before(const merge_bad *a, const merge_bad *b)
{
    if (a->job != b->job) return a->job < b->job;
    return a->row != b->row ? a->row < b->row : a->col < b->col;
}

static void *worker(void *arg)
{
    merge_ctx *x = arg;
    float *delta = malloc(x->max_cols * sizeof *delta);
    kipp_lora_stats st = {0};
    merge_bad bad = {0};
    if (delta) {
        for (size_t i; (i = atomic_fetch_add(&x->next, 1)) < x->n_chunks;) {
            const chunk *ch = &x->chunks[i];
            const kipp_lora_job *jb = &x->jobs[ch->job];
            for (uint64_t r = ch->r0; r < ch->r1; r++) {
                row_ctx c = {.seed = x->seed, .tid = jb->tensor_id, .row = r, .rnd = x->rnd, .st = &st,
                             .job = ch->job, .bad = &bad};
                delta_row(jb, r, delta);
                merge_row(jb, r, delta, &c);
            }
        }
    }
    pthread_mutex_lock(&x->mu);
    x->total.copied += st.copied, x->total.grid += st.grid, x->total.refit += st.refit;
    x->oom |= !delta;
    if (bad.set && (!x->bad.set || bad_before(&bad, &x->bad))) x->bad = bad;
    pthread_mutex_unlock(&x->mu);
    free(delta);
    return NULL;
}

/* What each format can hold, for the refusal's sentence. */
static const char *format_range(uint32_t dtype)
{
    switch (dtype) {
    case KIPP_DTYPE_BF16: return "a finite BF16 weight (|w| <= 3.39e38)";
    case KIPP_DTYPE_Q8_0: return "a Q8_0 weight (|w| <= 127 x 65504, the largest f16 block scale)";
    default: return "a Q4_1 weight (a block's minimum and 15 x step within the f16 range, 65504)";
    }
}

static int report_bad(const kipp_lora_job *jb, const merge_bad *b, char *err, size_t errlen)
{
    char id[32];
    snprintf(id, sizeof id, "tensor %u", jb->tensor_id);
    return kipp_err(err, errlen, KIPP_EINVAL, "merging the LoRA delta into %s sets row %llu column %llu to %g, "
                    "expected %s: a smaller scale keeps the merged weights in range", jb->label ? jb->label : id,
                    (unsigned long long)b->row, (unsigned long long)b->col, (double)b->value, format_range(jb->dtype));
}

int kipp_lora_merge(const kipp_lora_job *jobs, size_t n, int n_threads, uint64_t seed, kipp_lora_rounding rnd,
                    kipp_lora_stats *stats, char *err, size_t errlen)
{
    size_t n_chunks = 0;
    uint64_t max_cols = 1;
    for (size_t i = 0; i < n; i++) {
        const kipp_fmt_facts *f = kipp_fmt_by_gguf(jobs[i].dtype);
        if (!f || jobs[i].cols % f->block)
            return kipp_err(err, errlen, KIPP_EINVAL, "tensor %u has type %s with %llu columns: no LoRA merge rule, "
                            "expected BF16, Q8_0 or Q4_1 with whole blocks", jobs[i].tensor_id,
                            kipp_gguf_type_name(jobs[i].dtype), (unsigned long long)jobs[i].cols);
        n_chunks += (jobs[i].rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
        if (jobs[i].cols > max_cols) max_cols = jobs[i].cols;
    }
    chunk *chunks = malloc((n_chunks ? n_chunks : 1) * sizeof *chunks);
    if (!chunks) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu merge chunks", n_chunks);
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t r = 0; r < jobs[i].rows; r += CHUNK_ROWS)
            chunks[c++] = (chunk){i, r, r + CHUNK_ROWS < jobs[i].rows ? r + CHUNK_ROWS : jobs[i].rows};
    merge_ctx x = {.jobs = jobs, .chunks = chunks, .n_chunks = n_chunks, .seed = seed, .rnd = rnd, .max_cols = max_cols};
    atomic_init(&x.next, 0);
    pthread_mutex_init(&x.mu, NULL);
    long nth = n_threads > 0 ? n_threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (nth < 1) nth = 1;
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    if ((size_t)nth > n_chunks) nth = n_chunks ? (long)n_chunks : 1;
    pthread_t th[MAX_THREADS];
    long started = 0;
    for (long t = 1; t < nth; t++, started++)
        if (pthread_create(&th[t], NULL, worker, &x)) break; /* fewer workers still finish every chunk */
    worker(&x);
    for (long t = 1; t <= started; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&x.mu);
    free(chunks);
    if (stats) *stats = x.total;
    if (x.oom && atomic_load(&x.next) < n_chunks) /* no worker had scratch to finish */
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a %llu-column merge row", (unsigned long long)max_cols);
    if (x.bad.set) return report_bad(&jobs[x.bad.job], &x.bad, err, errlen);
    return KIPP_OK;
}
