/*
 * attention.cu - kc_attention: causal flash GQA over the paged KV cache
 * (oracle: k_flash_gqa_bf16_ref in kernels/cpu/ref.c), one launcher for
 * decode, batched decode and prefill.
 *
 * Work unit: one thread block of 4 warps per (row, KV head, head subgroup,
 * split). The block's query heads (the group of up to 8 that share the KV
 * head) are staged in shared memory; each warp walks whole 32-position pages
 * of the split (page c0 + warp, + 4, ...), so a page is one block-table entry
 * and its 32 K rows are contiguous per KV head. Per page the warp copies the
 * valid K rows into shared memory (16-byte loads, rows padded to 65 words so
 * that lane j reading row j is conflict-free), lane j scores position j for
 * every query head, the warp takes the page max and the softmax weights
 * (online softmax, FP32, expf), and then walks the page's V rows with each
 * lane owning 4 of the 128 dims (8-byte coalesced loads, 8 rows in flight
 * per lane), the weights broadcast by shuffle. Positions past the row's length are never read.
 * The 4 warp states merge in shared memory at the end (Milakov & Gimelshein's
 * merge, as k_attn_merge). When few rows run (decode), the row's page range is
 * split across kc_attn_n_split blocks (kcuda_math.h) that write partial
 * states (m, l, acc) into a static device buffer, folded by a second kernel;
 * a long context thus spreads over the whole GPU instead of one block per
 * head. The buffer is static (no allocation in the launcher, legal in graph
 * capture); split launches must therefore not run concurrently on two
 * streams of one device.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_math.h"

#define AT_WARPS 4u
#define AT_THREADS (AT_WARPS * 32u) /* == KC_HEAD_DIM: thread t owns dim t in staging and merge */
#define AT_GMAX 8u                  /* query heads per block (a larger group is cut into subgroups) */
#define AT_VBATCH 8u                /* V rows loaded ahead per lane */
#define AT_KROW 65u                 /* 32-bit words per staged K row: 64 (128 bf16) + 1 pad */

static_assert(AT_THREADS == KC_HEAD_DIM, "one thread per head dim in the staging and the merge");
static_assert(AT_WARPS * 32u * AT_KROW >= AT_WARPS * AT_GMAX * (KC_HEAD_DIM + 2u), "merge state fits the K stage");

/* partial states of split walks: [rows][q heads][splits] (kc_attn_n_split bounds the count) */
__device__ float kc_attn_part_m[KC_ATTN_SCRATCH_STATES];
__device__ float kc_attn_part_l[KC_ATTN_SCRATCH_STATES];
__device__ float kc_attn_part_acc[KC_ATTN_SCRATCH_STATES * KC_HEAD_DIM];

__device__ __forceinline__ float at_warp_max(float v)
{
    for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float at_warp_sum(float v)
{
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__global__ void __launch_bounds__(AT_THREADS)
kc_attn_kernel(const float *q, const uint16_t *kcache, const uint16_t *vcache, kc_rows rows, uint32_t n_q_head,
               uint32_t n_kv_head, uint32_t group, uint32_t n_sub, uint32_t n_split, float scale, float *out)
{
    __shared__ __align__(16) uint32_t ks[AT_WARPS * 32u * AT_KROW]; /* K stage; then the merge states */
    __shared__ __align__(16) float qs[AT_GMAX][KC_HEAD_DIM];

    const uint32_t split = blockIdx.x, kvh = blockIdx.y / n_sub, sub = blockIdx.y % n_sub, r = blockIdx.z;
    const uint32_t tid = threadIdx.x, warp = tid / 32u, lane = tid % 32u;
    const uint32_t g0 = sub * AT_GMAX, gn = group - g0 < AT_GMAX ? group - g0 : AT_GMAX;
    const uint32_t qh0 = kvh * group + g0; /* first query head of this block */
    const int32_t pos = rows.pos[r];
    const uint32_t len = pos < 0 ? 0u : (uint32_t)pos + 1u; /* causal: positions 0..pos */
    const int32_t bt_off = rows.bt_off[r];
    uint32_t c0, c1;
    kc_attn_split(len, n_split, split, &c0, &c1);

    for (uint32_t g = 0; g < gn; g++) qs[g][tid] = q[((size_t)r * n_q_head + qh0 + g) * KC_HEAD_DIM + tid];
    __syncthreads();

    float m[AT_GMAX], l[AT_GMAX], acc[AT_GMAX][4];
#pragma unroll
    for (uint32_t g = 0; g < AT_GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
    }
    uint32_t *kw = ks + warp * 32u * AT_KROW; /* this warp's 32 staged K rows */
    const size_t row_stride = (size_t)n_kv_head * KC_HEAD_DIM; /* elements between consecutive slots */

    for (uint32_t c = c0 + warp; c < c1; c += AT_WARPS) {
        const uint32_t p_base = c * KC_KV_BLOCK;
        const uint32_t nvalid = len - p_base < KC_KV_BLOCK ? len - p_base : KC_KV_BLOCK; /* >= 1: c < chunks */
        const size_t slot0 = (size_t)rows.bt[(size_t)bt_off + c] * KC_KV_BLOCK; /* kc_kv_slot of p_base */
        const uint16_t *kbase = kcache + slot0 * row_stride + (size_t)kvh * KC_HEAD_DIM;
        const uint16_t *vbase = vcache + slot0 * row_stride + (size_t)kvh * KC_HEAD_DIM;
        __syncwarp(); /* the previous page's K rows are no longer read */
#pragma unroll 4
        for (uint32_t it = 0; it < 16u; it++) { /* 32 rows x 16 pieces of 16 bytes, 2 rows per step */
            const uint32_t idx = it * 32u + lane, j = idx / 16u, part = idx % 16u;
            if (j < nvalid) {
                const uint4 v4 = *(const uint4 *)(kbase + (size_t)j * row_stride + part * 8u);
                uint32_t *d = kw + j * AT_KROW + part * 4u;
                d[0] = v4.x; d[1] = v4.y; d[2] = v4.z; d[3] = v4.w;
            }
        }
        __syncwarp();
        /* lane j scores position p_base + j for every query head */
        float s[AT_GMAX];
#pragma unroll
        for (uint32_t g = 0; g < AT_GMAX; g++) s[g] = 0.0f;
        const uint32_t *krow = kw + lane * AT_KROW;
        for (uint32_t w2 = 0; w2 < KC_HEAD_DIM / 2u; w2++) {
            const uint32_t kv2 = krow[w2];
            const float k0 = __uint_as_float(kv2 << 16), k1 = __uint_as_float(kv2 & 0xffff0000u);
#pragma unroll
            for (uint32_t g = 0; g < AT_GMAX; g++)
                if (g < gn) {
                    const float2 q2 = *(const float2 *)&qs[g][2u * w2];
                    s[g] += q2.x * k0;
                    s[g] += q2.y * k1;
                }
        }
        const bool valid = lane < nvalid;
#pragma unroll
        for (uint32_t g = 0; g < AT_GMAX; g++) {
            if (g >= gn) continue; /* uniform across the warp */
            const float sc = valid ? s[g] * scale : -INFINITY;
            const float m_new = fmaxf(m[g], at_warp_max(sc)); /* finite: lane 0 is valid */
            const float corr = expf(m[g] - m_new);
            const float e = valid ? expf(sc - m_new) : 0.0f;
            l[g] = l[g] * corr + at_warp_sum(e);
            acc[g][0] *= corr; acc[g][1] *= corr; acc[g][2] *= corr; acc[g][3] *= corr;
            m[g] = m_new;
            s[g] = e; /* this lane's softmax weight for head g */
        }
        for (uint32_t j0 = 0; j0 < nvalid; j0 += AT_VBATCH) { /* AT_VBATCH V rows in flight per lane */
            uint2 vv[AT_VBATCH];
#pragma unroll
            for (uint32_t u = 0; u < AT_VBATCH; u++)
                vv[u] = j0 + u < nvalid ? *(const uint2 *)(vbase + (size_t)(j0 + u) * row_stride + lane * 4u)
                                        : make_uint2(0u, 0u); /* rows past the length are never read */
#pragma unroll
            for (uint32_t u = 0; u < AT_VBATCH; u++) {
                const uint32_t j = j0 + u;
                if (j >= nvalid) break; /* uniform across the warp */
                const float v0 = __uint_as_float(vv[u].x << 16), v1 = __uint_as_float(vv[u].x & 0xffff0000u);
                const float v2f = __uint_as_float(vv[u].y << 16), v3 = __uint_as_float(vv[u].y & 0xffff0000u);
#pragma unroll
                for (uint32_t g = 0; g < AT_GMAX; g++) {
                    const float e = __shfl_sync(0xffffffffu, s[g], j); /* every lane joins, g < gn or not */
                    if (g < gn) {
                        acc[g][0] += e * v0; acc[g][1] += e * v1; acc[g][2] += e * v2f; acc[g][3] += e * v3;
                    }
                }
            }
        }
    }

    /* merge the 4 warp states: st[warp][g] = {m, l, acc[128]} in the K stage */
    __syncthreads();
    float *st = (float *)ks;
    const uint32_t st_len = KC_HEAD_DIM + 2u;
#pragma unroll
    for (uint32_t g = 0; g < AT_GMAX; g++) {
        if (g >= gn) continue;
        float *sg = st + (warp * AT_GMAX + g) * st_len;
        if (lane == 0) { sg[0] = m[g]; sg[1] = l[g]; }
        sg[2 + lane * 4u + 0] = acc[g][0]; sg[2 + lane * 4u + 1] = acc[g][1];
        sg[2 + lane * 4u + 2] = acc[g][2]; sg[2 + lane * 4u + 3] = acc[g][3];
    }
    __syncthreads();
    for (uint32_t g = 0; g < gn; g++) {
        float mx = -INFINITY;
        for (uint32_t w = 0; w < AT_WARPS; w++) mx = fmaxf(mx, st[(w * AT_GMAX + g) * st_len]);
        float L = 0.0f, A = 0.0f;
        if (mx != -INFINITY)
            for (uint32_t w = 0; w < AT_WARPS; w++) {
                const float *sw = st + (w * AT_GMAX + g) * st_len;
                const float f = expf(sw[0] - mx); /* 0 for an empty warp state */
                L += sw[1] * f;
                A += sw[2 + tid] * f;
            }
        const size_t qrow = (size_t)r * n_q_head + qh0 + g;
        if (n_split == 1u) {
            out[qrow * KC_HEAD_DIM + tid] = L > 0.0f ? A / L : 0.0f;
        } else {
            const size_t idx = qrow * n_split + split;
            kc_attn_part_acc[idx * KC_HEAD_DIM + tid] = A;
            if (tid == 0) { kc_attn_part_m[idx] = mx; kc_attn_part_l[idx] = L; }
        }
    }
}

/* Fold the n_split partial states of each (row, query head): one block per pair, thread t = dim t. */
__global__ void __launch_bounds__(KC_HEAD_DIM) kc_attn_fold_kernel(uint32_t n_q_head, uint32_t n_split, float *out)
{
    const size_t qrow = (size_t)blockIdx.y * n_q_head + blockIdx.x, idx0 = qrow * n_split;
    const uint32_t d = threadIdx.x;
    float mx = -INFINITY;
    for (uint32_t s = 0; s < n_split; s++) mx = fmaxf(mx, kc_attn_part_m[idx0 + s]);
    float L = 0.0f, A = 0.0f;
    if (mx != -INFINITY)
        for (uint32_t s = 0; s < n_split; s++) {
            const float f = expf(kc_attn_part_m[idx0 + s] - mx); /* empty split: exp(-inf) = 0 */
            L += kc_attn_part_l[idx0 + s] * f;
            A += kc_attn_part_acc[(idx0 + s) * KC_HEAD_DIM + d] * f;
        }
    out[qrow * KC_HEAD_DIM + d] = L > 0.0f ? A / L : 0.0f;
}

extern "C" int kc_attention(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, kc_rows rows,
                            uint32_t n_rows, uint32_t n_q_head, uint32_t n_kv_head, float *out, cudaStream_t s)
{
    if (n_rows == 0) return 0;
    if (n_kv_head == 0 || n_q_head == 0 || n_q_head % n_kv_head || n_rows > 65535u ||
        (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15u)) /* the K rows are staged with 16-byte loads */
        return (int)cudaErrorInvalidValue;
    const uint32_t group = n_q_head / n_kv_head, n_sub = (group + AT_GMAX - 1u) / AT_GMAX;
    if ((uint64_t)n_kv_head * n_sub > 65535u) return (int)cudaErrorInvalidValue;
    const uint32_t n_split = kc_attn_n_split(n_rows, n_kv_head, n_q_head);
    const float scale = 1.0f / sqrtf((float)KC_HEAD_DIM);
    dim3 grid(n_split, n_kv_head * n_sub, n_rows);
    kc_attn_kernel<<<grid, AT_THREADS, 0, s>>>(q, k_cache, v_cache, rows, n_q_head, n_kv_head, group, n_sub, n_split,
                                               scale, out);
    if (n_split > 1u) {
        int e = (int)cudaGetLastError();
        if (e) return e;
        kc_attn_fold_kernel<<<dim3(n_q_head, n_rows), KC_HEAD_DIM, 0, s>>>(n_q_head, n_split, out);
    }
    return (int)cudaGetLastError();
}
