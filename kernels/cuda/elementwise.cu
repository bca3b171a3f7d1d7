/*
 * elementwise.cu - the format-free CUDA units of kcuda.h other than attention:
 * embedding lookup, RMSNorm, per-head Q/K RMSNorm, RoPE, SwiGLU, residual add
 * and the paged KV write. Each follows its CPU oracle in kernels/cpu/ref.c
 * operation for operation (same formula, FP32, expf/sqrtf not the fast
 * intrinsics); only the order of the RMSNorm sum of squares differs (a tree).
 * Launch shapes: kernels/cuda/README.md.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/formats.h"
#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_math.h"

#define EW_THREADS 256u

static uint32_t ew_blocks(size_t n)
{
    size_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return b > 65535u * 8u ? 65535u * 8u : (uint32_t)(b ? b : 1); /* grid-stride beyond */
}

/* ---- embedding: out[r][c] = table[tokens[r]][c] ---- */

__global__ void kc_embed_kernel(const uint8_t *table, uint32_t dtype, const uint32_t *tokens, uint32_t d,
                                float *out)
{
    const uint32_t r = blockIdx.y;
    const size_t tok = tokens[r];
    float *o = out + (size_t)r * d;
    for (uint32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < d; c += gridDim.x * blockDim.x) {
        float v;
        if (dtype == KIPP_TTYPE_BF16) {
            v = kc_bf16_to_f32(((const uint16_t *)table)[tok * d + c]);
        } else if (dtype == KIPP_TTYPE_F32) {
            v = ((const float *)table)[tok * d + c];
        } else if (dtype == KIPP_TTYPE_Q8_0) {
            v = kc_q8_0_weight(table + kc_qblock_off(tok, c / KC_QBLOCK, d, KC_Q8_0_BYTES), c % KC_QBLOCK);
        } else {
            v = kc_q4_1_weight(table + kc_qblock_off(tok, c / KC_QBLOCK, d, KC_Q4_1_BYTES), c % KC_QBLOCK);
        }
        o[c] = v;
    }
}

extern "C" int kc_embed(const void *table, uint32_t dtype, const uint32_t *tokens, uint32_t n_rows, uint32_t d,
                        float *out, cudaStream_t s)
{
    if (n_rows == 0 || d == 0) return 0;
    int quant = dtype == KIPP_TTYPE_Q8_0 || dtype == KIPP_TTYPE_Q4_1;
    if (!(dtype == KIPP_TTYPE_BF16 || dtype == KIPP_TTYPE_F32 || quant) || (quant && d % KC_QBLOCK) ||
        n_rows > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((d + EW_THREADS - 1) / EW_THREADS, n_rows);
    kc_embed_kernel<<<grid, EW_THREADS, 0, s>>>((const uint8_t *)table, dtype, tokens, d, out);
    return (int)cudaGetLastError();
}

/* ---- reductions ---- */

__device__ __forceinline__ float kc_warp_sum(float v)
{
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* ---- RMSNorm: one block of 256 threads per row ---- */

__global__ void kc_rmsnorm_kernel(const uint16_t *w, const float *x, float *y, uint32_t dim, float eps)
{
    __shared__ float part[EW_THREADS / 32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = kc_warp_sum(ss);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (uint32_t i = 0; i < blockDim.x / 32; i++) tot += part[i]; /* every thread, same order */
    const float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    /* all reads of xr happened before the barrier: y may alias x */
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * kc_bf16_to_f32(w[i]);
}

extern "C" int kc_rmsnorm(const uint16_t *w, const float *x, float *y, uint32_t n_rows, uint32_t dim, float eps,
                          cudaStream_t s)
{
    if (n_rows == 0 || dim == 0) return 0;
    if (n_rows > 0x7fffffffu) return (int)cudaErrorInvalidValue;
    kc_rmsnorm_kernel<<<n_rows, EW_THREADS, 0, s>>>(w, x, y, dim, eps);
    return (int)cudaGetLastError();
}

/* ---- per-head RMSNorm: one warp per (row, head), 8 warps per block ---- */

__global__ void kc_head_rmsnorm_kernel(const uint16_t *w, float *x, uint32_t n_vec, uint32_t head_dim, float eps)
{
    const uint32_t v = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (v >= n_vec) return; /* whole warps leave together: the shuffles below stay full */
    float *xv = x + (size_t)v * head_dim;
    float ss = 0.0f;
    for (uint32_t i = lane; i < head_dim; i += 32) ss += xv[i] * xv[i];
    ss = kc_warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (uint32_t i = lane; i < head_dim; i += 32) xv[i] = xv[i] * inv * kc_bf16_to_f32(w[i]);
}

extern "C" int kc_head_rmsnorm(const uint16_t *w, float *x, uint32_t n_rows, uint32_t n_heads, uint32_t head_dim,
                               float eps, cudaStream_t s)
{
    const uint64_t n_vec = (uint64_t)n_rows * n_heads;
    if (n_vec == 0 || head_dim == 0) return 0;
    const uint32_t per = EW_THREADS / 32;
    if (n_vec > 0xffffffffull - per) return (int)cudaErrorInvalidValue;
    kc_head_rmsnorm_kernel<<<(uint32_t)((n_vec + per - 1) / per), EW_THREADS, 0, s>>>(w, x, (uint32_t)n_vec,
                                                                                      head_dim, eps);
    return (int)cudaGetLastError();
}

/* ---- RoPE: one thread per (row, head, pair i < 64) ---- */

__global__ void kc_rope_kernel(float *x, const int32_t *pos, const float *cs, uint32_t n_heads, uint64_t n)
{
    const uint32_t half = KC_HEAD_DIM / 2;
    for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < n; t += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(t % half);
        const uint64_t vec = t / half; /* row * n_heads + head */
        const uint64_t r = vec / n_heads;
        const float *c = cs + (size_t)pos[r] * KC_HEAD_DIM;
        float *xh = x + vec * KC_HEAD_DIM;
        const float cv = c[i], sv = c[half + i], a = xh[i], b = xh[i + half];
        /* the _rn intrinsics are never fused into an FMA: bit for bit the CPU's
         * a * c - b * s (built with -ffp-contract=off), as the exact check asks */
        xh[i] = __fsub_rn(__fmul_rn(a, cv), __fmul_rn(b, sv));
        xh[i + half] = __fadd_rn(__fmul_rn(b, cv), __fmul_rn(a, sv));
    }
}

extern "C" int kc_rope(float *x, const int32_t *pos, const float *cs, uint32_t n_rows, uint32_t n_heads,
                       cudaStream_t s)
{
    const uint64_t n = (uint64_t)n_rows * n_heads * (KC_HEAD_DIM / 2);
    if (n == 0) return 0;
    kc_rope_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(x, pos, cs, n_heads, n);
    return (int)cudaGetLastError();
}

/* ---- SwiGLU and residual add: grid-stride, one element per thread step ---- */

__global__ void kc_swiglu_kernel(const float *gate, const float *up, float *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" int kc_swiglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s)
{
    if (n == 0) return 0;
    kc_swiglu_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(gate, up, out, n);
    return (int)cudaGetLastError();
}

__global__ void kc_add_kernel(float *x, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" int kc_add(float *x, const float *y, size_t n, cudaStream_t s)
{
    if (n == 0) return 0;
    kc_add_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(x, y, n);
    return (int)cudaGetLastError();
}

/* ---- paged KV write: one thread per (row, element of kv_dim) ---- */

__global__ void kc_kv_write_kernel(uint16_t *kc, uint16_t *vc, const float *k, const float *v, kc_rows rows,
                                   uint32_t kv_dim, uint64_t n)
{
    for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < n; t += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = t / kv_dim;
        const uint32_t i = (uint32_t)(t % kv_dim);
        if (rows.pos[r] < 0) continue; /* no position, no KV (kc_attention reads none for it either) */
        const size_t slot = kc_kv_slot(rows.bt, rows.bt_off[r], (uint32_t)rows.pos[r]);
        const size_t dst = slot * kv_dim + i;
        kc[dst] = kc_f32_to_bf16(k[t]);
        vc[dst] = kc_f32_to_bf16(v[t]);
    }
}

extern "C" int kc_kv_write(uint16_t *k_cache, uint16_t *v_cache, const float *k, const float *v, kc_rows rows,
                           uint32_t n_rows, uint32_t kv_dim, cudaStream_t s)
{
    const uint64_t n = (uint64_t)n_rows * kv_dim;
    if (n == 0) return 0;
    kc_kv_write_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(k_cache, v_cache, k, v, rows, kv_dim, n);
    return (int)cudaGetLastError();
}
