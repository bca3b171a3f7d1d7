/*
 * linear_matvec.cu - kc_linear (kcuda.h) and its decode path: the matvec of
 * up to KC_MATVEC_MAX_ROWS token rows against a bf16, Q8_0 or Q4_1 weight in
 * the GGUF file layout, reading every weight byte once per launch (the op
 * that bounds decode). Oracles: k_linear_bf16_ref, k_linear_q8_0_ref,
 * k_linear_affine4_ref (FP32 activations, FP32 accumulation; the CUDA path sums
 * per lane and then across the warp, another order).
 *
 * Shape: one warp per output row, 4 warps (128 threads) per block, the token
 * rows R a template argument so the accumulators stay in registers.
 *   bf16: each lane loads 16 bytes (8 weights) at a time, 8 loads in flight
 *         per lane before any arithmetic, 4 KiB per warp: a row of up to
 *         2048 columns is one step.
 *   Q8_0 / Q4_1: the 34- and 20-byte blocks are only 2- or 4-byte aligned,
 *         so the warp copies 64 blocks (2176 / 1280 bytes) of its row into
 *         its own shared-memory stage with 16-byte loads (when the row and
 *         group are 16-byte aligned: Q8_0 with in % 256 == 0, Q4_1 with
 *         in % 128 == 0; else 2-byte loads) and then lane b decodes blocks b, b + 32
 *         against 32 activations of each row: y += d * sum(q x) for Q8_0,
 *         y += d * sum(q x) + m * sum(x) for Q4_1 (kcuda_math.h decode).
 * Activations are read through the read-only cache (every warp of the block
 * reads the same x). The warp sum is a butterfly; lane 0 stores.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_math.h"
#include "kernels/cuda/klinear.h"
#include "kernels/formats.h"

#define MV_WARPS 4u
#define MV_THREADS (MV_WARPS * 32u)
#define MV_LOADS 8u /* 16-byte bf16 weight loads in flight per lane: a 2048-column row at once */
#define MV_GROUP 64u /* quantized blocks staged per warp step: two per lane */
#define MV_PIECES 5u /* 16-byte pieces per lane that cover a staged group */

enum { MV_BF16 = 0, MV_Q8_0 = 1, MV_Q4_1 = 2 };

__device__ __forceinline__ float mv_warp_sum(float v)
{
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float mv_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float mv_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

template <int R>
__global__ void __launch_bounds__(MV_THREADS)
kc_matvec_bf16_kernel(const uint16_t *w, const float *x, float *y, uint32_t out, uint32_t in)
{
    const uint32_t o = blockIdx.x * MV_WARPS + threadIdx.x / 32u, lane = threadIdx.x % 32u;
    if (o >= out) return; /* whole warp */
    const uint4 *wr = (const uint4 *)(w + (size_t)o * in);
    const uint32_t n8 = in / 8u; /* 16-byte pieces per row */
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (uint32_t base = 0; base < n8; base += 32u * MV_LOADS) {
        uint4 wv[MV_LOADS];
#pragma unroll
        for (uint32_t u = 0; u < MV_LOADS; u++) {
            const uint32_t i = base + u * 32u + lane;
            wv[u] = i < n8 ? __ldcs(wr + i) : make_uint4(0, 0, 0, 0); /* streamed: read once */
        }
#pragma unroll
        for (uint32_t u = 0; u < MV_LOADS; u++) {
            const uint32_t i = base + u * 32u + lane;
            if (i >= n8) break;
            const float w0 = mv_lo(wv[u].x), w1 = mv_hi(wv[u].x), w2 = mv_lo(wv[u].y), w3 = mv_hi(wv[u].y);
            const float w4 = mv_lo(wv[u].z), w5 = mv_hi(wv[u].z), w6 = mv_lo(wv[u].w), w7 = mv_hi(wv[u].w);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4 *xr = (const float4 *)(x + (size_t)r * in) + 2u * i;
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                acc[r] += w0 * a.x + w1 * a.y + w2 * a.z + w3 * a.w + w4 * b.x + w5 * b.y + w6 * b.z + w7 * b.w;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = mv_warp_sum(acc[r]);
        if (lane == 0) y[(size_t)r * out + o] = v;
    }
}

static_assert(MV_GROUP * KC_Q8_0_BYTES <= MV_PIECES * 32u * 16u, "a staged group is at most MV_PIECES pieces per lane");

/* Copy nbytes (even) from global src to the warp's stage dst (16-byte aligned). */
__device__ __forceinline__ void mv_stage(uint8_t *dst, const uint8_t *src, uint32_t nbytes, uint32_t lane)
{
    uint32_t done = 0;
    if (((uintptr_t)src & 15u) == 0) {
        const uint32_t n16 = nbytes / 16u;
        const uint4 *s4 = (const uint4 *)src;
        uint4 *d4 = (uint4 *)dst;
        uint4 v[MV_PIECES]; /* up to 136 pieces (Q8_0): all issued before the stores */
#pragma unroll
        for (uint32_t u = 0; u < MV_PIECES; u++) {
            const uint32_t i = u * 32u + lane;
            if (i < n16) v[u] = __ldcs(s4 + i);
        }
#pragma unroll
        for (uint32_t u = 0; u < MV_PIECES; u++) {
            const uint32_t i = u * 32u + lane;
            if (i < n16) d4[i] = v[u];
        }
        done = n16 * 16u;
    }
    const uint16_t *s2 = (const uint16_t *)src;
    uint16_t *d2 = (uint16_t *)dst;
    for (uint32_t i = done / 2u + lane; i < nbytes / 2u; i += 32u) d2[i] = s2[i];
}

template <int R, int FMT>
__global__ void __launch_bounds__(MV_THREADS)
kc_matvec_q_kernel(const uint8_t *w, const float *x, float *y, uint32_t out, uint32_t in)
{
    constexpr uint32_t BB = FMT == MV_Q8_0 ? KC_Q8_0_BYTES : KC_Q4_1_BYTES;
    constexpr uint32_t STAGE = (MV_GROUP * BB + 15u) / 16u * 16u;
    __shared__ __align__(16) uint8_t stage[MV_WARPS][STAGE];
    const uint32_t warp = threadIdx.x / 32u, lane = threadIdx.x % 32u, o = blockIdx.x * MV_WARPS + warp;
    if (o >= out) return; /* whole warp; no block barrier below */
    const uint32_t nb = in / KC_QBLOCK;
    const uint8_t *wr = w + kc_qblock_off(o, 0, in, BB);
    uint8_t *st = stage[warp];
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (uint32_t g = 0; g < nb; g += MV_GROUP) {
        const uint32_t nblk = nb - g < MV_GROUP ? nb - g : MV_GROUP;
        __syncwarp(); /* the previous group is decoded */
        mv_stage(st, wr + (size_t)g * BB, nblk * BB, lane);
        __syncwarp();
        for (uint32_t bi = lane; bi < nblk; bi += 32u) { /* blocks lane and lane + 32 of the group */
            const uint8_t *blk = st + bi * BB;
            const size_t col0 = (size_t)(g + bi) * KC_QBLOCK;
            if (FMT == MV_Q8_0) {
                const float d = kc_q8_0_d(blk);
                const uint16_t *q2 = (const uint16_t *)(blk + 2); /* 2-byte aligned: BB and the stage are even */
                float qf[KC_QBLOCK];
#pragma unroll
                for (uint32_t i = 0; i < KC_QBLOCK / 2u; i++) {
                    const uint16_t v = q2[i];
                    qf[2 * i] = (float)kc_q8_0_pair_code(v, 0);
                    qf[2 * i + 1] = (float)kc_q8_0_pair_code(v, 1);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float4 *xr = (const float4 *)(x + (size_t)r * in + col0);
                    float t = 0.0f;
#pragma unroll
                    for (uint32_t k = 0; k < 8u; k++) {
                        const float4 a = __ldg(xr + k);
                        t += qf[4 * k] * a.x + qf[4 * k + 1] * a.y + qf[4 * k + 2] * a.z + qf[4 * k + 3] * a.w;
                    }
                    acc[r] += d * t;
                }
            } else {
                const float d = kc_q4_1_d(blk), m = kc_q4_1_m(blk);
                const uint32_t *nw = (const uint32_t *)(blk + 4); /* 4-byte aligned: BB = 20 */
                float qf[KC_QBLOCK];
#pragma unroll
                for (uint32_t k = 0; k < 4u; k++) {
                    const uint32_t v = nw[k];
#pragma unroll
                    for (uint32_t b = 0; b < 4u; b++) {
                        qf[4 * k + b] = (float)kc_q4_1_word_code(v, 0, b);      /* q[4k + b] */
                        qf[16 + 4 * k + b] = (float)kc_q4_1_word_code(v, 1, b); /* q[16 + 4k + b] */
                    }
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float4 *xr = (const float4 *)(x + (size_t)r * in + col0);
                    float t = 0.0f, xs = 0.0f;
#pragma unroll
                    for (uint32_t k = 0; k < 8u; k++) {
                        const float4 a = __ldg(xr + k);
                        t += qf[4 * k] * a.x + qf[4 * k + 1] * a.y + qf[4 * k + 2] * a.z + qf[4 * k + 3] * a.w;
                        xs += a.x + a.y + a.z + a.w;
                    }
                    acc[r] += d * t + m * xs;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = mv_warp_sum(acc[r]);
        if (lane == 0) y[(size_t)r * out + o] = v;
    }
}

template <int R>
static void mv_launch(const void *w, int fmt, uint32_t out, uint32_t in, const float *x, float *y, cudaStream_t s)
{
    const uint32_t blocks = (out + MV_WARPS - 1u) / MV_WARPS;
    if (fmt == MV_BF16)
        kc_matvec_bf16_kernel<R><<<blocks, MV_THREADS, 0, s>>>((const uint16_t *)w, x, y, out, in);
    else if (fmt == MV_Q8_0)
        kc_matvec_q_kernel<R, MV_Q8_0><<<blocks, MV_THREADS, 0, s>>>((const uint8_t *)w, x, y, out, in);
    else
        kc_matvec_q_kernel<R, MV_Q4_1><<<blocks, MV_THREADS, 0, s>>>((const uint8_t *)w, x, y, out, in);
}

static int mv_fmt(uint32_t dtype)
{
    return dtype == KIPP_TTYPE_BF16 ? MV_BF16 : dtype == KIPP_TTYPE_Q8_0 ? MV_Q8_0 : dtype == KIPP_TTYPE_Q4_1 ? MV_Q4_1 : -1;
}

extern "C" int kc_linear_matvec(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x,
                                uint32_t n_rows, float *y, cudaStream_t s)
{
    const int fmt = mv_fmt(dtype);
    if (fmt < 0 || in % KC_QBLOCK || n_rows > KC_MATVEC_MAX_ROWS || ((uintptr_t)x & 15u) ||
        (fmt == MV_BF16 && ((uintptr_t)w & 15u)) || (fmt == MV_Q8_0 && ((uintptr_t)w & 1u)) ||
        (fmt == MV_Q4_1 && ((uintptr_t)w & 3u)))
        return (int)cudaErrorInvalidValue;
    if (out == 0 || n_rows == 0) return 0;
    switch (n_rows) {
    case 1: mv_launch<1>(w, fmt, out, in, x, y, s); break;
    case 2: mv_launch<2>(w, fmt, out, in, x, y, s); break;
    case 3: mv_launch<3>(w, fmt, out, in, x, y, s); break;
    case 4: mv_launch<4>(w, fmt, out, in, x, y, s); break;
    case 5: mv_launch<5>(w, fmt, out, in, x, y, s); break;
    case 6: mv_launch<6>(w, fmt, out, in, x, y, s); break;
    case 7: mv_launch<7>(w, fmt, out, in, x, y, s); break;
    default: mv_launch<8>(w, fmt, out, in, x, y, s); break;
    }
    return (int)cudaGetLastError();
}

extern "C" int kc_linear(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x, uint32_t n_rows,
                         float *y, cudaStream_t s)
{
    if (n_rows <= KC_MATVEC_MAX_ROWS) return kc_linear_matvec(w, dtype, out, in, x, n_rows, y, s);
    return kc_linear_matmul(w, dtype, out, in, x, n_rows, y, s);
}
