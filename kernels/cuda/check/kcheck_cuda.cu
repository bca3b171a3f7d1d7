/*
 * kcheck_cuda.cu - the CUDA kernel units against the CPU oracle, over the same
 * kernel case table as kcheck (kernels/cpu/check/kcase_table.c): every bf16
 * matvec row runs kernels/cuda/matvec_bf16.cu on the device and is compared
 * with the format's FP32 oracle over the file layout (k_fmt_info.linear_ref)
 * within the row's NMSE bound. Built by `make cuda`; needs a GPU to run
 * (exit 2 with a sentence when there is none, never a pass).
 *
 *   build/cuda/kcheck_cuda [--op matvec]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "kernels/cpu/check/kcase.h"
int k_matvec_bf16_cuda_launch(const void *w, const float *x, float *y, uint32_t rows, uint32_t cols,
                              cudaStream_t stream);
}

/* One matvec row on the device; returns 1 on pass. */
static int check_matvec(const kcase *c)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    size_t rows = c->s[0], cols = c->s[1], wbytes = k_fmt_file_bytes(fi, rows, cols);
    float *wf = kc_rand_f32(rows * cols, -0.05f, 0.05f), *x = kc_rand_f32(cols, -1, 1);
    float *ref = kc_rand_f32(rows, 0, 0), *y = kc_rand_f32(rows, 0, 0);
    void *w = kipp_aligned_alloc(wbytes);
    void *dw = NULL;
    float *dx = NULL, *dy = NULL;
    int ok = wf && x && ref && y && w;
    if (ok) {
        fi->from_f32(wf, w, rows, cols);
        fi->linear_ref(w, x, ref, rows, cols, 1, 0, 1);
        ok = cudaMalloc(&dw, wbytes) == cudaSuccess && cudaMalloc((void **)&dx, cols * 4) == cudaSuccess &&
             cudaMalloc((void **)&dy, rows * 4) == cudaSuccess &&
             cudaMemcpy(dw, w, wbytes, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(dx, x, cols * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
             k_matvec_bf16_cuda_launch(dw, dx, dy, (uint32_t)rows, (uint32_t)cols, 0) == 0 &&
             cudaMemcpy(y, dy, rows * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    double e = ok ? kc_nmse(y, ref, rows) : 1e30;
    ok = ok && e <= c->tol;
    printf("%s matvec bf16 %zu %zu [cuda] nmse %.3g (bound %.1g)\n", ok ? "PASS" : "FAIL", rows, cols, e, c->tol);
    cudaFree(dw); cudaFree(dx); cudaFree(dy);
    kipp_aligned_free(wf); kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y); kipp_aligned_free(w);
    return ok;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--op") || i + 1 >= argc || strcmp(argv[++i], "matvec")) {
            fprintf(stderr, "kcheck_cuda: unknown argument '%s'; usage: kcheck_cuda [--op matvec] (the CUDA kernels so far)\n", argv[i]);
            return 2;
        }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "kcheck_cuda: no CUDA device here; the CUDA kernel checks need a GPU; run build/cuda/kcheck_cuda on a machine that has one\n");
        return 2;
    }
    int passed = 0, failed = 0;
    for (const kcase *c = kcase_rows; c->op; c++)
        if (!strcmp(c->op, "matvec") && c->fmt == K_FMT_BF16) *(check_matvec(c) ? &passed : &failed) += 1;
    printf("RESULT %d %d\n", passed, failed);
    return failed ? 1 : 0;
}
