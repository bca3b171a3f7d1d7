/*
 * klinear.h - private to kernels/cuda: the two paths behind kc_linear
 * (linear_matvec.cu decides and runs the matvec; linear_matmul.cu the
 * tensor-core matmul). Same arguments as kc_linear; dtype is KIPP_TTYPE_*.
 */
#ifndef KIPP_KLINEAR_H
#define KIPP_KLINEAR_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** n_rows <= KC_MATVEC_MAX_ROWS: one weight read for all rows. */
int kc_linear_matvec(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x, uint32_t n_rows,
                     float *y, cudaStream_t s);
/** Any n_rows: 64 x 64 output tiles on mma.sync bf16 tensor cores (x split hi + lo). */
int kc_linear_matmul(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x, uint32_t n_rows,
                     float *y, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
