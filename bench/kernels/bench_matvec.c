/*
 * bench_matvec.c - decode matvec at the DRAM roofline (issue 5, targets:
 * decode >= 95% of the measured read bandwidth). A sweep over 64 distinct
 * 3072x1024 BF16 matrices (384 MiB >> LLC) stands for one decode step's
 * layer weights, so every byte comes from DRAM, as in a real token; both the
 * row-major and the packed layout are measured. Bound: memory.
 */
#include "bench/kernels/kbench.h"

#define N_MAT 64
#define ROWS 3072u
#define COLS 1024u

typedef struct {
    const k_cpu_ops *ops;
    const kipp_bf16 *w; /* [N_MAT][ROWS][COLS] bf16 */
    const float *x;     /* [COLS] */
    float *y;           /* [N_MAT][ROWS] */
    int packed;
} sweep_job;

static void sweep(void *arg, int ith, int nth)
{
    sweep_job *j = arg;
    for (size_t m = 0; m < N_MAT; m++) {
        const kipp_bf16 *w = j->w + m * ROWS * COLS;
        if (j->packed) j->ops->matvec_bf16p(w, j->x, j->y + m * ROWS, ROWS, COLS, ith, nth);
        else j->ops->matvec_bf16(w, j->x, j->y + m * ROWS, ROWS, COLS, ith, nth);
    }
}

int main(int argc, char **argv)
{
    kbench b;
    if (kbench_begin(&b, "matvec", argc, argv)) return 2;
    size_t n = (size_t)N_MAT * ROWS * COLS;
    kipp_bf16 *w = kbench_alloc_big(n * sizeof(kipp_bf16));
    float *x = kipp_aligned_alloc(COLS * sizeof(float)), *y = kipp_aligned_alloc((size_t)N_MAT * ROWS * sizeof(float));
    if (!w || !x || !y) {
        fprintf(stderr, "bench_matvec: cannot allocate %zu MiB of weights\n", n * 2 >> 20);
        return 1;
    }
    kbench_fill_bf16(w, n, 0.05f); /* the packed layout has the same bytes: a permutation does not change timing */
    kbench_fill_f32(x, COLS, 1.0f);
    double bytes = (double)n * 2, flops = 2.0 * (double)n;
    sweep_job j = {b.ops, w, x, y, 0};
    kbench_case(&b, "matvec_bf16 3072x1024 x64 (384 MiB)", sweep, &j, bytes, flops, "memory", 0);
    j.packed = 1;
    kbench_case(&b, "matvec_bf16p 3072x1024 x64 (384 MiB)", sweep, &j, bytes, flops, "memory", 0);
    free(w); /* kbench_alloc_big */
    kipp_aligned_free(x); kipp_aligned_free(y);
    return kbench_end(&b);
}
