/*
 * bench_matmul.c - prefill matmul at the compute roofline (issue 5 target:
 * pp512 >= 80% of the BF16 dot peak). The 0.6B shapes with 512 tokens: fused
 * gate|up (6144x1024) and down (1024x3072), packed (BF16 activations,
 * vdpbf16ps on AVX-512-BF16, widening FMA on AVX2) and row-major (FP32
 * activations, FP32 FMA). Activation rounding (cvt_bf16) is timed separately
 * since the backend does it once per matmul input. Bound: compute.
 */
#include "bench/kernels/kbench.h"

typedef struct {
    const k_cpu_ops *ops;
    const kipp_bf16 *w, *wp, *xb;
    const float *x;
    float *y;
    size_t rows, cols, n_tok;
    int packed;
} mm_job;

static void mm(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    if (j->packed) j->ops->matmul_bf16p(j->wp, j->xb, j->y, j->rows, j->cols, j->n_tok, 0, ith, nth);
    else j->ops->matmul_bf16(j->w, j->x, j->y, j->rows, j->cols, j->n_tok, ith, nth);
}

static void cvt(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    size_t n = j->n_tok * j->cols, r0, r1;
    k_split_rows(n, ith, nth, 64, &r0, &r1);
    j->ops->cvt_bf16(j->x + r0, (kipp_bf16 *)j->xb + r0, r1 - r0);
}

static int run_shape(kbench *b, size_t rows, size_t cols, size_t n_tok, const char *label)
{
    kipp_bf16 *w = kipp_aligned_alloc(rows * cols * 2), *wp = kipp_aligned_alloc(rows * cols * 2);
    kipp_bf16 *xb = kipp_aligned_alloc(n_tok * cols * 2);
    float *x = kipp_aligned_alloc(n_tok * cols * 4), *y = kipp_aligned_alloc(n_tok * rows * 4);
    if (!w || !wp || !xb || !x || !y) return -1;
    kbench_fill_bf16(w, rows * cols, 0.05f);
    kbench_fill_f32(x, n_tok * cols, 1.0f);
    b->ops->pack_bf16(w, wp, rows, cols, 0, 1);
    b->ops->cvt_bf16(x, xb, n_tok * cols);
    mm_job j = {b->ops, w, wp, xb, x, y, rows, cols, n_tok, 1};
    double flops = 2.0 * (double)rows * cols * n_tok, bytes = (double)rows * cols * 2;
    char name[96];
    snprintf(name, sizeof name, "matmul_bf16p %s %zux%zu n_tok %zu", label, rows, cols, n_tok);
    kbench_case(b, name, mm, &j, bytes, flops, "compute", !strcmp(b->ops->isa, "avx512"));
    j.packed = 0;
    snprintf(name, sizeof name, "matmul_bf16 %s %zux%zu n_tok %zu", label, rows, cols, n_tok);
    kbench_case(b, name, mm, &j, bytes, flops, "compute", 0);
    snprintf(name, sizeof name, "cvt_bf16 %zux%zu", n_tok, cols);
    kbench_case(b, name, cvt, &j, (double)n_tok * cols * 6, 0, "memory", 0);
    kipp_aligned_free(w); kipp_aligned_free(wp); kipp_aligned_free(xb); kipp_aligned_free(x); kipp_aligned_free(y);
    return 0;
}

int main(int argc, char **argv)
{
    kbench b;
    if (kbench_begin(&b, "matmul", argc, argv)) return 2;
    if (run_shape(&b, 6144, 1024, 512, "gate|up") || run_shape(&b, 1024, 3072, 512, "down") ||
        run_shape(&b, 1024, 1024, 64, "o-proj")) {
        fprintf(stderr, "bench_matmul: out of memory\n");
        return 1;
    }
    return kbench_end(&b);
}
