/* cuda_util.cu - the CUDA backend's own small kernels (cuda_util.h). */
#include "backends/cuda/cuda_util.h"
#include "kernels/cuda/kcuda_math.h"

#define KB_THREADS 256u

__global__ void kb_gather_rows_k(const float *__restrict__ x, const int32_t *__restrict__ idx,
                                 uint32_t width, float *__restrict__ out)
{
    const float *src = x + (size_t)idx[blockIdx.x] * width;
    float *dst = out + (size_t)blockIdx.x * width;
    for (uint32_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[c];
}

extern "C" int kb_gather_rows(const float *x, const int32_t *idx, uint32_t n, uint32_t width, float *out,
                              cudaStream_t s)
{
    if (n == 0) return 0;
    kb_gather_rows_k<<<n, 256, 0, s>>>(x, idx, width, out);
    return (int)cudaGetLastError();
}

/* One block of KB_THREADS per row, as kc_rmsnorm_kernel (kernels/cuda/elementwise.cu):
 * each thread adds its strided elements, keeps the sum of their squares in the
 * same order, then the warp and block sums in the same order. */
__global__ void kb_add_rmsnorm_k(float *__restrict__ x, const float *__restrict__ y, const uint16_t *__restrict__ w,
                                 float *__restrict__ xn, uint32_t dim, float eps)
{
    __shared__ float part[KB_THREADS / 32];
    float *xr = x + (size_t)blockIdx.x * dim, *nr = xn + (size_t)blockIdx.x * dim;
    const float *yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (uint32_t i = 0; i < blockDim.x / 32; i++) tot += part[i];
    const float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) nr[i] = xr[i] * inv * kc_bf16_to_f32(w[i]);
}

extern "C" int kb_add_rmsnorm(float *x, const float *y, const uint16_t *w, float *xn, uint32_t n_rows, uint32_t dim,
                              float eps, cudaStream_t s)
{
    if (n_rows == 0 || dim == 0) return 0;
    if (n_rows > 0x7fffffffu) return (int)cudaErrorInvalidValue;
    kb_add_rmsnorm_k<<<n_rows, KB_THREADS, 0, s>>>(x, y, w, xn, dim, eps);
    return (int)cudaGetLastError();
}
