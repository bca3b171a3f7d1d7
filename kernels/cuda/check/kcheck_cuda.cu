/*
 * kcheck_cuda.cu - every CUDA kernel unit of kcuda.h against its CPU oracle
 * (kernels/cpu/ref*.c), over the shared kernel case table
 * (kernels/cpu/check/kcase_table.c: the rows of the ops the CUDA units
 * implement) plus the CUDA-only cases: multi-row matvec, the kc_linear
 * dispatch at 9/33/512 rows, odd output counts, unaligned quantized rows,
 * mixed-sequence kc_rows with non-identity block tables, the split
 * long-context attention and prefill attention. One line per case
 * ("PASS|FAIL <case> nmse <e> (bound <b>)"), then "RESULT <passed> <failed>";
 * exit 1 on any failure (or when no case ran), 2 with a sentence on a usage
 * error (an unknown argument or --op) or when there is no CUDA device.
 *
 * Bounds: table rows keep their own (kcase_table.c says why). The CUDA-only
 * linear cases use 1e-9 for every format, since the CUDA units read FP32
 * activations (no Q8 rounding): the quantized matvec sums the same products
 * in another order, the matmul splits x into bf16 hi + lo (residual
 * ~2^-17 |x|, NMSE ~1e-11). KV writes and RoPE are bit-exact.
 * Free KV slots are filled with NaN, so any read outside a row's causal range
 * or through a wrong block-table entry turns its output into NaN and fails.
 *
 *   build/cuda/kcheck_cuda [--op OP]   (OP: linear rmsnorm head_rmsnorm rope swiglu add embed kv_write attention)
 */
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/cpu/check/kcase.h"
}
#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_math.h"
#include "kernels/cuda/klinear.h"

#define ORDER 1e-9
#define FP32ACT 1e-9
#define EXACT 0.0

static int g_pass, g_fail;
static const char *g_only; /* --op filter */

static int want(const char *op) { return !g_only || !strcmp(g_only, op); }

/* the --op values: any other one would run no case and print RESULT 0 0 with exit 0 */
static const char *const g_ops[] = {"linear", "rmsnorm", "head_rmsnorm", "rope", "swiglu", "add", "embed", "kv_write",
                                    "attention"};
static int known_op(const char *op)
{
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (!strcmp(g_ops[i], op)) return 1;
    return 0;
}

static void report(const char *name, double e, double tol)
{
    int ok = e <= tol; /* NaN fails */
    printf("%s %s nmse %.3g (bound %.1g)\n", ok ? "PASS" : "FAIL", name, e, tol);
    fflush(stdout);
    *(ok ? &g_pass : &g_fail) += 1;
}

/* ---- device memory helpers: NULL on failure (the case then reports 1e30) ---- */

static void *dev_dup(const void *h, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    if (h && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) { cudaFree(d); return NULL; }
    return d;
}

/* A device output buffer of n bytes filled with NaN (0xff bytes), so an element the kernel never writes fails. */
static void *dev_nan(size_t n)
{
    void *d = dev_dup(NULL, n);
    if (d && cudaMemset(d, 0xff, n ? n : 1) != cudaSuccess) { cudaFree(d); return NULL; }
    return d;
}

static int dev_get(void *h, const void *d, size_t n)
{
    return cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess;
}

/* launch status, then the kernel's own: 1 when both are fine */
static int launched(int rc)
{
    if (rc) { fprintf(stderr, "  launch: %s\n", cudaGetErrorString((cudaError_t)rc)); return 0; }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { fprintf(stderr, "  kernel: %s\n", cudaGetErrorString(e)); return 0; }
    return 1;
}

static double nmse_or_fail(int ok, const float *a, const float *ref, size_t n)
{
    return ok ? kc_nmse(a, ref, n) : 1e30;
}

/* Mean device time of reps launches of f (after one warm-up), in microseconds; -1 on error. Only
 * informative (the pass/fail lines do not depend on it): printed as "time ..." for a few cases so
 * that a device run also shows what the units achieve. */
template <typename F> static double time_us(F f, int reps)
{
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess) return -1;
    if (cudaEventCreate(&b) != cudaSuccess) { cudaEventDestroy(a); return -1; }
    float ms = -1;
    int rc = f();
    cudaEventRecord(a, 0);
    for (int i = 0; i < reps && !rc; i++) rc = f();
    cudaEventRecord(b, 0);
    if (!rc && cudaEventSynchronize(b) == cudaSuccess) cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return rc || ms < 0 ? -1.0 : 1000.0 * ms / reps;
}

/* ---- linear ---- */

typedef struct {
    const k_fmt_info *fi;
    const void *w;
    const float *x;
    float *y;
    size_t rows, cols, n_tok;
    int ith, nth;
} ref_job;

static void *ref_thread(void *p)
{
    ref_job *j = (ref_job *)p;
    j->fi->linear_ref(j->w, j->x, j->y, j->rows, j->cols, j->n_tok, j->ith, j->nth);
    return NULL;
}

/* The FP32 oracle over the file layout on 16 threads (the big prefill rows). */
static void linear_ref_mt(const k_fmt_info *fi, const void *w, const float *x, float *y, size_t rows, size_t cols,
                          size_t n_tok)
{
    enum { NTH = 16 };
    pthread_t th[NTH];
    ref_job jobs[NTH];
    int started[NTH] = {0};
    for (int i = 0; i < NTH; i++) {
        jobs[i] = (ref_job){fi, w, x, y, rows, cols, n_tok, i, NTH};
        started[i] = pthread_create(&th[i], NULL, ref_thread, &jobs[i]) == 0;
        if (!started[i]) ref_thread(&jobs[i]);
    }
    for (int i = 0; i < NTH; i++)
        if (started[i]) pthread_join(th[i], NULL);
}

static const char *fmt_name(k_fmt f) { return k_fmt_get(f)->name; }
static uint32_t fmt_dtype(k_fmt f) { return k_fmt_get(f)->file->gguf_type; }

enum { PATH_DISPATCH, PATH_MATVEC, PATH_MATMUL };

static void check_linear(const char *label, k_fmt f, size_t out, size_t in, size_t n_rows, int path, double tol,
                         int reps = 0)
{
    const k_fmt_info *fi = k_fmt_get(f);
    size_t wbytes = k_fmt_file_bytes(fi, out, in);
    float *wf = kc_rand_f32(out * in, -0.05f, 0.05f), *x = kc_rand_f32(n_rows * in, -1, 1);
    float *ref = kc_rand_f32(n_rows * out, 0, 0), *y = kc_rand_f32(n_rows * out, 0, 0);
    void *w = malloc(wbytes);
    void *dw = NULL;
    float *dx = NULL, *dy = NULL;
    int ok = wf && x && ref && y && w;
    if (ok) {
        fi->from_f32(wf, w, out, in);
        linear_ref_mt(fi, w, x, ref, out, in, n_rows);
        dw = dev_dup(w, wbytes);
        dx = (float *)dev_dup(x, n_rows * in * 4);
        dy = (float *)dev_nan(n_rows * out * 4); /* NaN: unwritten outputs fail */
        ok = dw && dx && dy;
    }
    if (ok) {
        uint32_t dt = fmt_dtype(f), o = (uint32_t)out, i = (uint32_t)in, n = (uint32_t)n_rows;
        int rc = path == PATH_MATVEC   ? kc_linear_matvec(dw, dt, o, i, dx, n, dy, 0)
                 : path == PATH_MATMUL ? kc_linear_matmul(dw, dt, o, i, dx, n, dy, 0)
                                       : kc_linear(dw, dt, o, i, dx, n, dy, 0);
        ok = launched(rc) && dev_get(y, dy, n_rows * out * 4);
    }
    char name[160];
    snprintf(name, sizeof name, "%s %s %zux%zu rows %zu [%s]", label, fmt_name(f), out, in, n_rows,
             path == PATH_MATVEC ? "matvec" : path == PATH_MATMUL ? "matmul" : "kc_linear");
    report(name, nmse_or_fail(ok, y, ref, n_rows * out), tol);
    if (ok && reps > 0) {
        uint32_t dt = fmt_dtype(f), o = (uint32_t)out, i = (uint32_t)in, n = (uint32_t)n_rows;
        double us = time_us([&] { return kc_linear(dw, dt, o, i, dx, n, dy, 0); }, reps);
        printf("time %s: %.1f us, weights %.0f GB/s, %.1f TFLOP/s\n", name, us, (double)wbytes / us * 1e-3,
               2.0 * (double)out * in * n_rows / us * 1e-6);
    }
    cudaFree(dw); cudaFree(dx); cudaFree(dy);
    kipp_aligned_free(wf); kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y);
    free(w);
}

static int cuda_fmt(int f) { return f == K_FMT_BF16 || f == K_FMT_Q8_0 || f == K_FMT_AFFINE4; }

static void linear_cases(void)
{
    if (!want("linear")) return;
    for (const kcase *c = kcase_rows; c->op; c++) {
        if (!cuda_fmt(c->fmt)) continue;
        if (!strcmp(c->op, "matvec")) /* the decode row: one token (the copies are the CPU bench's) */
            check_linear("table matvec", (k_fmt)c->fmt, c->s[0], c->s[1], 1, PATH_MATVEC, c->tol);
        else if (!strcmp(c->op, "matmul") || !strcmp(c->op, "matmul_f32")) /* accumulate rows: kc_linear stores */
            check_linear(!strcmp(c->op, "matmul") ? "table matmul" : "table matmul_f32", (k_fmt)c->fmt, c->s[0],
                         c->s[1], c->s[2], PATH_MATMUL, c->tol);
    }
    const k_fmt fmts[] = {K_FMT_BF16, K_FMT_Q8_0, K_FMT_AFFINE4};
    const size_t mv_rows[] = {1, 2, 3, 7, 8};
    const size_t disp_rows[] = {1, 8, 9, 33, 512};
    for (size_t fi = 0; fi < 3; fi++) {
        k_fmt f = fmts[fi];
        for (size_t i = 0; i < sizeof mv_rows / sizeof mv_rows[0]; i++) {
            check_linear("cuda batched", f, 1040, 1056, mv_rows[i], PATH_MATVEC, FP32ACT); /* 33 blocks: unaligned rows */
            check_linear("cuda batched", f, 517, 3072, mv_rows[i], PATH_MATVEC, FP32ACT);  /* aligned rows, odd out */
        }
        for (size_t i = 0; i < sizeof disp_rows / sizeof disp_rows[0]; i++)
            check_linear("cuda dispatch", f, 1000, 1024, disp_rows[i], PATH_DISPATCH, FP32ACT);
        check_linear("cuda matmul", f, 1, 64, 1, PATH_MATMUL, FP32ACT);      /* one output, one k step */
        check_linear("cuda matmul", f, 77, 1056, 65, PATH_MATMUL, FP32ACT);  /* tails on both tile axes */
        check_linear("cuda matmul", f, 6144, 2048, 130, PATH_MATMUL, FP32ACT); /* 1.7B gate|up */
        check_linear("cuda matvec", f, 6144, 2048, 8, PATH_MATVEC, FP32ACT);
        check_linear("cuda matvec", f, 1, 32, 1, PATH_MATVEC, FP32ACT);      /* one block */
        check_linear("cuda matvec", f, 3, 9728, 4, PATH_MATVEC, FP32ACT);    /* 4B d_ff: 304 blocks, 10 groups */
    }
    check_linear("cuda head", K_FMT_BF16, 151936, 1024, 8, PATH_MATVEC, FP32ACT, 20); /* multi-row logits */
    check_linear("cuda head", K_FMT_BF16, 151936, 1024, 1, PATH_MATVEC, FP32ACT, 20);  /* decode: HBM-bound */
    for (size_t fi = 0; fi < 3; fi++) { /* timed: decode past L2, and the pp512 projections */
        check_linear("cuda time", fmts[fi], 65536, 2048, 1, PATH_MATVEC, FP32ACT, 20);
        check_linear("cuda time", fmts[fi], 6144, 1024, 512, PATH_MATMUL, FP32ACT, 20);
    }
}

/* ---- format-free ops ---- */

static void check_rmsnorm(const char *label, size_t rows, size_t dim, int inplace, double tol)
{
    float *x = kc_rand_f32(rows * dim, -4, 4), *ref = kc_rand_f32(rows * dim, 0, 0), *y = kc_rand_f32(rows * dim, 0, 0);
    kipp_bf16 *w = kc_rand_bf16(dim, 2.0f);
    float *dx = NULL, *dy = NULL;
    uint16_t *dw = NULL;
    int ok = x && ref && y && w;
    if (ok) {
        k_rmsnorm_f32_ref(x, w, ref, rows, dim, 1e-6f);
        dx = (float *)dev_dup(x, rows * dim * 4);
        dy = inplace ? dx : (float *)dev_nan(rows * dim * 4);
        dw = (uint16_t *)dev_dup(w, dim * 2);
        ok = dx && dy && dw && launched(kc_rmsnorm(dw, dx, dy, (uint32_t)rows, (uint32_t)dim, 1e-6f, 0)) &&
             dev_get(y, dy, rows * dim * 4);
    }
    char name[128];
    snprintf(name, sizeof name, "%s rmsnorm %zux%zu%s", label, rows, dim, inplace ? " in place" : "");
    report(name, nmse_or_fail(ok, y, ref, rows * dim), tol);
    cudaFree(dx); if (!inplace) cudaFree(dy); cudaFree(dw);
    kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y); kipp_aligned_free(w);
}

/* kc_head_rmsnorm over [rows][heads][head_dim] == k_rmsnorm_f32_ref over rows*heads vectors. */
static void check_head_rmsnorm(size_t rows, size_t heads, size_t hd)
{
    size_t n = rows * heads * hd;
    float *x = kc_rand_f32(n, -4, 4), *ref = kc_rand_f32(n, 0, 0), *y = kc_rand_f32(n, 0, 0);
    kipp_bf16 *w = kc_rand_bf16(hd, 2.0f);
    float *dx = NULL;
    uint16_t *dw = NULL;
    int ok = x && ref && y && w;
    if (ok) {
        k_rmsnorm_f32_ref(x, w, ref, rows * heads, hd, 1e-6f);
        dx = (float *)dev_dup(x, n * 4);
        dw = (uint16_t *)dev_dup(w, hd * 2);
        ok = dx && dw &&
             launched(kc_head_rmsnorm(dw, dx, (uint32_t)rows, (uint32_t)heads, (uint32_t)hd, 1e-6f, 0)) &&
             dev_get(y, dx, n * 4);
    }
    char name[128];
    snprintf(name, sizeof name, "cuda head_rmsnorm rows %zu heads %zu dim %zu", rows, heads, hd);
    report(name, nmse_or_fail(ok, y, ref, n), ORDER);
    cudaFree(dx); cudaFree(dw);
    kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y); kipp_aligned_free(w);
}

/* rows with positions pos[] (host), n_heads each, against k_rope_f32_ref with the same table. */
static void check_rope(const char *label, const int32_t *pos, size_t rows, size_t heads, double tol)
{
    int32_t maxp = 0;
    for (size_t r = 0; r < rows; r++) maxp = pos[r] > maxp ? pos[r] : maxp;
    size_t n_pos = (size_t)maxp + 1, n = rows * heads * KIPP_HEAD_DIM;
    float *cs = kc_rand_f32(n_pos * KIPP_HEAD_DIM, 0, 0), *x = kc_rand_f32(n, -2, 2);
    float *ref = kc_rand_f32(n, 0, 0), *y = kc_rand_f32(n, 0, 0);
    float *dcs = NULL, *dx = NULL;
    int32_t *dpos = NULL;
    int ok = cs && x && ref && y;
    if (ok) {
        k_rope_table(cs, n_pos, 1000000.0);
        memcpy(ref, x, n * 4);
        for (size_t r = 0; r < rows; r++)
            k_rope_f32_ref(ref + r * heads * KIPP_HEAD_DIM, heads, cs + (size_t)pos[r] * KIPP_HEAD_DIM);
        dcs = (float *)dev_dup(cs, n_pos * KIPP_HEAD_DIM * 4);
        dx = (float *)dev_dup(x, n * 4);
        dpos = (int32_t *)dev_dup(pos, rows * 4);
        ok = dcs && dx && dpos && launched(kc_rope(dx, dpos, dcs, (uint32_t)rows, (uint32_t)heads, 0)) &&
             dev_get(y, dx, n * 4);
    }
    char name[128];
    snprintf(name, sizeof name, "%s rope rows %zu heads %zu pos %d..", label, rows, heads, (int)pos[0]);
    double e = ok ? (memcmp(y, ref, n * 4) ? 1.0 : 0.0) : 1e30; /* bitwise */
    report(name, e, tol);
    cudaFree(dcs); cudaFree(dx); cudaFree(dpos);
    kipp_aligned_free(cs); kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y);
}

static void check_swiglu_add(const char *op, size_t n, double tol)
{
    int sw = !strcmp(op, "swiglu");
    float *a = kc_rand_f32(n, sw ? -20 : -5, sw ? 20 : 5), *b = kc_rand_f32(n, sw ? -20 : -5, sw ? 20 : 5);
    float *ref = kc_rand_f32(n, 0, 0), *y = kc_rand_f32(n, 0, 0);
    float *da = NULL, *db = NULL, *dy = NULL;
    int ok = a && b && ref && y;
    if (ok) {
        if (sw) k_swiglu_f32_ref(a, b, ref, n);
        else { memcpy(ref, a, n * 4); k_add_f32_ref(ref, b, n); }
        da = (float *)dev_dup(a, n * 4);
        db = (float *)dev_dup(b, n * 4);
        dy = sw ? (float *)dev_nan(n * 4) : da;
        ok = da && db && dy && launched(sw ? kc_swiglu(da, db, dy, n, 0) : kc_add(da, db, n, 0)) &&
             dev_get(y, dy, n * 4);
    }
    char name[96];
    snprintf(name, sizeof name, "table %s n %zu", op, n);
    double e = !ok ? 1e30 : tol == 0 ? (memcmp(y, ref, n * 4) ? 1.0 : 0.0) : kc_nmse(y, ref, n);
    report(name, e, tol);
    cudaFree(da); cudaFree(db); if (sw) cudaFree(dy);
    kipp_aligned_free(a); kipp_aligned_free(b); kipp_aligned_free(ref); kipp_aligned_free(y);
}

/* embed: d columns, vocab rows, the tokens (host) */
static void check_embed(const char *label, size_t d, size_t vocab, const uint32_t *tok, size_t n_rows)
{
    kipp_bf16 *t = kc_rand_bf16(vocab * d, 3.0f);
    float *ref = kc_rand_f32(n_rows * d, 0, 0), *y = kc_rand_f32(n_rows * d, 0, 0);
    void *dt = NULL, *dtok = NULL;
    float *dy = NULL;
    int ok = t && ref && y;
    if (ok) {
        for (size_t r = 0; r < n_rows; r++) k_embed_bf16_ref(t, tok[r], ref + r * d, d);
        dt = dev_dup(t, vocab * d * 2);
        dtok = dev_dup(tok, n_rows * 4);
        dy = (float *)dev_nan(n_rows * d * 4);
        ok = dt && dtok && dy &&
             launched(kc_embed(dt, KIPP_TTYPE_BF16, (const uint32_t *)dtok, (uint32_t)n_rows, (uint32_t)d, dy, 0)) &&
             dev_get(y, dy, n_rows * d * 4);
    }
    char name[96];
    snprintf(name, sizeof name, "%s embed d %zu vocab %zu rows %zu", label, d, vocab, n_rows);
    report(name, ok ? (memcmp(y, ref, n_rows * d * 4) ? 1.0 : 0.0) : 1e30, EXACT);
    cudaFree(dt); cudaFree(dtok); cudaFree(dy);
    kipp_aligned_free(t); kipp_aligned_free(ref); kipp_aligned_free(y);
}

static void ops_cases(void)
{
    for (const kcase *c = kcase_rows; c->op; c++) {
        if (!strcmp(c->op, "rmsnorm") && want("rmsnorm")) check_rmsnorm("table", c->s[0], c->s[1], (int)c->s[2], c->tol);
        if (!strcmp(c->op, "rope") && want("rope")) {
            int32_t p = (int32_t)c->s[1];
            check_rope("table", &p, 1, c->s[0], c->tol);
        }
        if ((!strcmp(c->op, "swiglu") && want("swiglu")) || (!strcmp(c->op, "add") && want("add")))
            check_swiglu_add(c->op, c->s[0], c->tol);
        if (!strcmp(c->op, "embed") && want("embed")) {
            uint32_t tok = (uint32_t)c->s[2];
            check_embed("table", c->s[0], c->s[1], &tok, 1);
        }
    }
    if (want("rmsnorm")) {
        check_rmsnorm("cuda", 1, 5120, 0, ORDER);
        check_rmsnorm("cuda", 33, 1000, 1, ORDER);
    }
    if (want("head_rmsnorm")) {
        check_head_rmsnorm(1, 16, 128);
        check_head_rmsnorm(7, 8, 128);
        check_head_rmsnorm(130, 40, 128);
        check_head_rmsnorm(3, 5, 96); /* a head_dim that is not a multiple of 32 lanes' 4 */
    }
    if (want("rope")) {
        const int32_t p7[] = {0, 1, 31, 32, 33, 4095, 39999};
        check_rope("cuda", p7, 7, 16, EXACT);
        int32_t p512[512];
        for (int i = 0; i < 512; i++) p512[i] = 100 + i;
        check_rope("cuda", p512, 512, 8, EXACT);
    }
    if (want("embed")) {
        const uint32_t tok[] = {0, 49, 7, 7, 31, 12, 1, 48, 25};
        check_embed("cuda", 1024, 50, tok, 9);
    }
}

/* ---- paged KV write and attention over mixed-sequence rows ---- */

#define AT_MAX_SEQ 16
#define AT_MAX_ROWS 1024
#define KV_ROW (KIPP_N_KV_HEAD * KIPP_HEAD_DIM) /* elements per slot */

typedef struct {
    uint32_t n_seq, len[AT_MAX_SEQ]; /* each sequence's length after the step */
    uint32_t n_rows, seq[AT_MAX_ROWS];
    int32_t pos[AT_MAX_ROWS];        /* rows, in launch order */
} attn_spec;

static uint64_t at_rng = 0x1234abcdULL;
static uint32_t at_rand(uint32_t n)
{
    at_rng = at_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)((at_rng >> 33) % n);
}

/* rows [p0, p1) of sequence s, appended round-robin with what is already there when interleave */
static void spec_rows(attn_spec *sp, uint32_t s, uint32_t p0, uint32_t p1)
{
    for (uint32_t p = p0; p < p1 && sp->n_rows < AT_MAX_ROWS; p++) {
        sp->seq[sp->n_rows] = s;
        sp->pos[sp->n_rows++] = (int32_t)p;
    }
    if (p1 > sp->len[s]) sp->len[s] = p1;
    if (s + 1 > sp->n_seq) sp->n_seq = s + 1;
}

/* shuffle the row order (rows of one sequence end up interleaved with the others) */
static void spec_shuffle(attn_spec *sp)
{
    for (uint32_t i = sp->n_rows; i > 1; i--) {
        uint32_t j = at_rand(i), ts = sp->seq[i - 1];
        int32_t tp = sp->pos[i - 1];
        sp->seq[i - 1] = sp->seq[j]; sp->pos[i - 1] = sp->pos[j];
        sp->seq[j] = ts; sp->pos[j] = tp;
    }
}

/* with_kv: 0 attention over the written pool; 1 kc_kv_write then attention; 2 kc_kv_write only, with
 * the table row's special values (NaN, -Inf, a denormal, a tie) in row 0 */
static void check_attn(const char *label, const attn_spec *sp, uint32_t group, int with_kv)
{
    const uint32_t n_q = KIPP_N_KV_HEAD * group, R = sp->n_rows;
    uint32_t bt_off[AT_MAX_SEQ], n_log = 0;
    for (uint32_t s = 0; s < sp->n_seq; s++) { bt_off[s] = n_log; n_log += (sp->len[s] + 31) / 32; }
    const uint32_t n_phys = n_log + 3; /* spare pages stay NaN */
    uint32_t *perm = (uint32_t *)malloc(n_phys * 4), *bt = (uint32_t *)malloc((n_log + 1) * 4);
    const size_t pool = (size_t)n_phys * KIPP_KV_BLOCK * KV_ROW;
    kipp_bf16 *kc = (kipp_bf16 *)malloc(pool * 2), *vc = (kipp_bf16 *)malloc(pool * 2);
    kipp_bf16 *kd = (kipp_bf16 *)malloc(pool * 2), *vd = (kipp_bf16 *)malloc(pool * 2);
    float *k = kc_rand_f32((size_t)R * KV_ROW, -1, 1), *v = kc_rand_f32((size_t)R * KV_ROW, -1, 1);
    float *pre = kc_rand_f32(2 * KV_ROW, -1, 1), *q = kc_rand_f32((size_t)R * n_q * KIPP_HEAD_DIM, -1, 1);
    float *ref = kc_rand_f32((size_t)R * n_q * KIPP_HEAD_DIM, 0, 0), *y = kc_rand_f32((size_t)R * n_q * KIPP_HEAD_DIM, 0, 0);
    float *m = kc_rand_f32(group, 0, 0), *l = kc_rand_f32(group, 0, 0), *acc = kc_rand_f32((size_t)group * KIPP_HEAD_DIM, 0, 0);
    int32_t rbt[AT_MAX_ROWS];
    char *written = (char *)calloc((size_t)n_log * 32 + 1, 1);
    void *d_kc = NULL, *d_vc = NULL, *d_k = NULL, *d_v = NULL, *d_q = NULL, *d_y = NULL, *d_pos = NULL, *d_off = NULL,
         *d_bt = NULL;
    int ok = perm && bt && kc && vc && kd && vd && k && v && pre && q && ref && y && m && l && acc && written;
    double e_kv = 1e30, e_at = 1e30;
    if (ok) {
        for (uint32_t i = 0; i < n_phys; i++) perm[i] = i;
        for (uint32_t i = n_phys; i > 1; i--) { uint32_t j = at_rand(i), t = perm[i - 1]; perm[i - 1] = perm[j]; perm[j] = t; }
        for (uint32_t i = 0; i < n_log; i++) bt[i] = perm[i];
        for (size_t i = 0; i < pool; i++) kc[i] = vc[i] = 0x7fc0; /* NaN: never read */
        if (with_kv == 2) { k[0] = 1e-40f; k[1] = NAN; v[2] = -INFINITY; v[3] = 1.00390625f; } /* the table row's */
        for (uint32_t r = 0; r < R; r++) {
            rbt[r] = (int32_t)bt_off[sp->seq[r]];
            written[(size_t)bt_off[sp->seq[r]] * 32 + (uint32_t)sp->pos[r]] = 1;
        }
        for (uint32_t s = 0; s < sp->n_seq; s++) /* the cached prefix: every position no row writes */
            for (uint32_t p = 0; p < sp->len[s]; p++)
                if (!written[(size_t)bt_off[s] * 32 + p]) {
                    for (size_t i = 0; i < 2 * KV_ROW; i++) pre[i] = (float)((int)at_rand(2001) - 1000) / 1000.0f;
                    k_kv_write_bf16_ref(kc, vc, bt + bt_off[s], p, pre, pre + KV_ROW);
                }
        memcpy(kd, kc, pool * 2);
        memcpy(vd, vc, pool * 2);
        for (uint32_t r = 0; r < R; r++)
            k_kv_write_bf16_ref(kc, vc, bt + rbt[r], (uint32_t)sp->pos[r], k + (size_t)r * KV_ROW, v + (size_t)r * KV_ROW);
        const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t h = 0; h < KIPP_N_KV_HEAD; h++) {
                k_attn_init(group, m, l, acc);
                const size_t q0 = ((size_t)r * n_q + (size_t)h * group) * KIPP_HEAD_DIM;
                k_flash_gqa_bf16_ref(q + q0, group, kc, vc, h, bt + rbt[r], 0, (uint32_t)sp->pos[r] + 1, scale, m, l, acc);
                for (uint32_t g = 0; g < group; g++)
                    for (uint32_t i = 0; i < KIPP_HEAD_DIM; i++)
                        ref[q0 + (size_t)g * KIPP_HEAD_DIM + i] = acc[(size_t)g * KIPP_HEAD_DIM + i] / l[g];
            }
        /* the device starts from the pre-write pool and writes the rows itself (with_kv), or gets the written one */
        d_kc = dev_dup(with_kv ? kd : kc, pool * 2);
        d_vc = dev_dup(with_kv ? vd : vc, pool * 2);
        d_k = dev_dup(k, (size_t)R * KV_ROW * 4);
        d_v = dev_dup(v, (size_t)R * KV_ROW * 4);
        d_q = dev_dup(q, (size_t)R * n_q * KIPP_HEAD_DIM * 4);
        d_y = dev_nan((size_t)R * n_q * KIPP_HEAD_DIM * 4);
        d_pos = dev_dup(sp->pos, R * 4);
        d_off = dev_dup(rbt, R * 4);
        d_bt = dev_dup(bt, (n_log + 1) * 4);
        ok = d_kc && d_vc && d_k && d_v && d_q && d_y && d_pos && d_off && d_bt;
    }
    kc_rows rows = {(const int32_t *)d_pos, (const int32_t *)d_off, (const uint32_t *)d_bt};
    if (ok && with_kv) {
        ok = launched(kc_kv_write((uint16_t *)d_kc, (uint16_t *)d_vc, (const float *)d_k, (const float *)d_v, rows, R,
                                  KV_ROW, 0)) &&
             dev_get(kd, d_kc, pool * 2) && dev_get(vd, d_vc, pool * 2);
        e_kv = ok ? (memcmp(kd, kc, pool * 2) || memcmp(vd, vc, pool * 2) ? 1.0 : 0.0) : 1e30;
    }
    if (ok && with_kv != 2 && (!with_kv || e_kv == 0.0)) {
        ok = launched(kc_attention((const float *)d_q, (const uint16_t *)d_kc, (const uint16_t *)d_vc, rows, R, n_q,
                                   KIPP_N_KV_HEAD, (float *)d_y, 0)) &&
             dev_get(y, d_y, (size_t)R * n_q * KIPP_HEAD_DIM * 4);
        e_at = nmse_or_fail(ok, y, ref, (size_t)R * n_q * KIPP_HEAD_DIM);
    }
    char name[160];
    if (with_kv) {
        snprintf(name, sizeof name, "%s kv_write rows %u seqs %u", label, R, sp->n_seq);
        report(name, e_kv, EXACT);
    }
    if (with_kv == 2) goto done;
    snprintf(name, sizeof name, "%s attention rows %u seqs %u group %u (splits %u)", label, R, sp->n_seq, group,
             kc_attn_n_split(R, KIPP_N_KV_HEAD, n_q));
    report(name, e_at, ORDER);
    if (e_at <= ORDER && (R == 1 || R >= 512)) {
        double us = time_us([&] { return kc_attention((const float *)d_q, (const uint16_t *)d_kc, (const uint16_t *)d_vc,
                                                       rows, R, n_q, KIPP_N_KV_HEAD, (float *)d_y, 0); }, 20);
        printf("time %s: %.1f us\n", name, us);
    }
done:;
    void *dv[] = {d_kc, d_vc, d_k, d_v, d_q, d_y, d_pos, d_off, d_bt};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) cudaFree(dv[i]);
    free(perm); free(bt); free(kc); free(vc); free(kd); free(vd); free(written);
    float *fv[] = {k, v, pre, q, ref, y, m, l, acc};
    for (size_t i = 0; i < sizeof fv / sizeof fv[0]; i++) kipp_aligned_free(fv[i]);
}

static attn_spec *spec_new(void) { return (attn_spec *)calloc(1, sizeof(attn_spec)); }

static void attn_cases(void)
{
    if (!want("attention") && !want("kv_write")) return;
    attn_spec *sp;
    /* the table's kv_write row: positions 0, 31, 32, 77, 127 of one sequence (page edges, a scrambled table) */
    if ((sp = spec_new())) {
        const uint32_t p[] = {0, 31, 32, 77, 127};
        for (size_t i = 0; i < 5; i++) spec_rows(sp, 0, p[i], p[i] + 1);
        check_attn("table (NaN, Inf, denormal)", sp, 2, 2);
        check_attn("table", sp, 2, 1);
        free(sp);
    }
    /* the table's flash_gqa rows: one decode row at p1 - 1 (the CUDA walk is causal from 0) */
    for (const kcase *c = kcase_rows; c->op; c++)
        if (!strcmp(c->op, "flash_gqa") && (sp = spec_new())) {
            spec_rows(sp, 0, (uint32_t)c->s[2] - 1, (uint32_t)c->s[2]);
            check_attn("table flash_gqa", sp, (uint32_t)c->s[0], 0);
            free(sp);
        }
    /* batched decode: 8 sequences, one row each, lengths across page edges, shuffled */
    if ((sp = spec_new())) {
        const uint32_t lens[] = {1, 32, 33, 34, 101, 1001, 2048, 4096};
        for (uint32_t s = 0; s < 8; s++) spec_rows(sp, s, lens[s] - 1, lens[s]);
        spec_shuffle(sp);
        check_attn("cuda decode8", sp, 2, 1);
        check_attn("cuda decode8", sp, 4, 1);
        free(sp);
    }
    /* long context, one row: 32 splits; groups of the registry and a 2-subgroup one */
    const uint32_t groups[] = {2, 4, 5, 8, 16};
    for (size_t i = 0; i < 5; i++)
        if ((sp = spec_new())) {
            spec_rows(sp, 0, 4095, 4096);
            check_attn("cuda tg4k", sp, groups[i], 1);
            free(sp);
        }
    /* 9 rows of 9 sequences (4 splits) */
    if ((sp = spec_new())) {
        for (uint32_t s = 0; s < 9; s++) spec_rows(sp, s, 37 * s * s, 37 * s * s + 1);
        check_attn("cuda decode9", sp, 8, 1);
        free(sp);
    }
    /* prefill from 0 (no split), a chunk continuing a cached prefix, mixed with decode rows */
    if ((sp = spec_new())) {
        spec_rows(sp, 0, 0, 130);
        check_attn("cuda prefill", sp, 2, 1);
        free(sp);
    }
    if ((sp = spec_new())) {
        spec_rows(sp, 0, 100, 164);
        spec_rows(sp, 1, 0, 33);
        spec_rows(sp, 2, 4000, 4001);
        spec_shuffle(sp);
        check_attn("cuda mixed", sp, 4, 1);
        free(sp);
    }
    if ((sp = spec_new())) {
        spec_rows(sp, 0, 0, 512);
        check_attn("cuda pp512", sp, 2, 1);
        free(sp);
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--op") && i + 1 < argc && known_op(argv[i + 1])) { g_only = argv[++i]; continue; }
        const int bad_op = !strcmp(argv[i], "--op") && i + 1 < argc;
        fprintf(stderr, "kcheck_cuda: unknown %s '%s'; usage: kcheck_cuda [--op linear|rmsnorm|head_rmsnorm|"
                        "rope|swiglu|add|embed|kv_write|attention]\n", bad_op ? "op" : "argument",
                bad_op ? argv[i + 1] : argv[i]);
        return 2;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "kcheck_cuda: no CUDA device here; the CUDA kernel checks need a GPU; run "
                        "build/cuda/kcheck_cuda on a machine that has one\n");
        return 2;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    ops_cases();
    attn_cases();
    linear_cases();
    printf("RESULT %d %d\n", g_pass, g_fail);
    return g_fail || !g_pass ? 1 : 0; /* a run that checked nothing is no pass */
}
