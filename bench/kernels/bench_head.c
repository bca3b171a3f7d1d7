/*
 * bench_head.c - the final-head matvec: 151,936 x d_model BF16 rows (the
 * largest single matrix of a decode step, 311 MiB at d_model 1024, 778 MiB at
 * 2560). Memory-bound: it must run at the DRAM read roofline.
 */
#include "bench/kernels/kbench.h"

#define VOCAB 151936u

typedef struct {
    const k_cpu_ops *ops;
    const kipp_bf16 *w;
    const float *x;
    float *y;
    size_t cols;
    int packed;
} head_job;

static void head(void *arg, int ith, int nth)
{
    head_job *j = arg;
    if (j->packed) j->ops->matvec_bf16p(j->w, j->x, j->y, VOCAB, j->cols, ith, nth);
    else j->ops->matvec_bf16(j->w, j->x, j->y, VOCAB, j->cols, ith, nth);
}

int main(int argc, char **argv)
{
    kbench b;
    if (kbench_begin(&b, "head", argc, argv)) return 2;
    const size_t cols = 1024;
    size_t n = (size_t)VOCAB * cols;
    kipp_bf16 *w = kbench_alloc_big(n * 2);
    float *x = kipp_aligned_alloc(cols * 4), *y = kipp_aligned_alloc((size_t)VOCAB * 4);
    if (!w || !x || !y) {
        fprintf(stderr, "bench_head: cannot allocate %zu MiB\n", n * 2 >> 20);
        return 1;
    }
    kbench_fill_bf16(w, n, 0.05f);
    kbench_fill_f32(x, cols, 1.0f);
    head_job j = {b.ops, w, x, y, cols, 0};
    kbench_case(&b, "head matvec_bf16 151936x1024", head, &j, (double)n * 2, 2.0 * (double)n, "memory", 0);
    j.packed = 1;
    kbench_case(&b, "head matvec_bf16p 151936x1024", head, &j, (double)n * 2, 2.0 * (double)n, "memory", 0);
    free(w); /* kbench_alloc_big */
    kipp_aligned_free(x); kipp_aligned_free(y);
    return kbench_end(&b);
}
