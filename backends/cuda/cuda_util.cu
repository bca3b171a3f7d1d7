/* cuda_util.cu - the CUDA backend's own small kernels (cuda_util.h). */
#include "backends/cuda/cuda_util.h"

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
