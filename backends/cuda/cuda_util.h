/*
 * cuda_util.h - the CUDA backend's own small kernels (backends/cuda/cuda_util.cu),
 * beside the kernel units of kernels/cuda/kcuda.h. Same conventions: device
 * pointers, enqueued on the caller's stream, no synchronisation and no
 * allocation (legal inside stream capture); 0 or the cudaError_t as int.
 */
#ifndef KIPP_CUDA_UTIL_H
#define KIPP_CUDA_UTIL_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/** out[j][c] = x[idx[j]][c] for j < n, c < width (the rows that need logits, compacted). */
int kb_gather_rows(const float *x, const int32_t *idx, uint32_t n, uint32_t width, float *out,
                   cudaStream_t s);

/**
 * The residual add and the next RMSNorm in one pass: x[r] += y[r], then
 * xn[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, w [dim] bf16. The same
 * arithmetic, in the same order, as kc_add followed by kc_rmsnorm.
 */
int kb_add_rmsnorm(float *x, const float *y, const uint16_t *w, float *xn, uint32_t n_rows, uint32_t dim, float eps,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
