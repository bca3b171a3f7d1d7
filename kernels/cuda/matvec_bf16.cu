/*
 * matvec_bf16.cu - first CUDA kernel unit: BF16 decode matvec, the op that
 * bounds decode (seed 000, Phase 4). Only compiled by `make cuda`; there is no
 * CUDA backend in the ops table yet, and no GPU on the development machines,
 * so this unit is build-checked only.
 *
 * y[r] = sum_c w[r][c] * x[c]; w: [rows][cols] bf16 (row-major, device),
 * x: [cols] f32, y: [rows] f32. One warp per row, FP32 accumulation, warp
 * shuffle reduction. cols % 2 == 0.
 */
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" __global__ void k_matvec_bf16_cuda(const __nv_bfloat16 *w, const float *x, float *y,
                                              uint32_t rows, uint32_t cols)
{
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint32_t lane = threadIdx.x % 32u;
    if (warp >= rows) return;
    const __nv_bfloat162 *wr = (const __nv_bfloat162 *)(w + (size_t)warp * cols);
    float acc = 0.0f;
    for (uint32_t c = lane; c < cols / 2u; c += 32u) {
        float2 wf = __bfloat1622float2(wr[c]);
        acc += wf.x * x[2u * c] + wf.y * x[2u * c + 1u];
    }
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) y[warp] = acc;
}

/** Host launcher: 8 warps per block. Returns the cudaError_t of the launch as int. */
extern "C" int k_matvec_bf16_cuda_launch(const void *w, const float *x, float *y, uint32_t rows,
                                         uint32_t cols, cudaStream_t stream)
{
    const uint32_t threads = 256u, blocks = (rows * 32u + threads - 1u) / threads;
    k_matvec_bf16_cuda<<<blocks, threads, 0, stream>>>((const __nv_bfloat16 *)w, x, y, rows, cols);
    return (int)cudaGetLastError();
}
