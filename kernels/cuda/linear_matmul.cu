/*
 * linear_matmul.cu - the prefill path of kc_linear: y[t][o] = sum_c W[o][c] *
 * x[t][c] for many token rows, bf16 / Q8_0 / Q4_1 weights in the GGUF file
 * layout, on the bf16 tensor cores (mma.sync.m16n8k16, FP32 accumulation).
 * Oracles as the matvec: k_linear_<fmt>_ref.
 *
 * Accuracy: x is FP32, so each activation is split into bf16 hi + lo
 * (kc_split_bf16: x - hi - lo ~ 2^-17 |x|) and every tile runs two MMAs, W
 * against hi and against lo. Products of bf16 are exact in FP32, so the
 * result is FP32-accurate (NMSE ~1e-11 against the FP32 oracle) at twice the
 * tensor work, still far above the FP32 SIMT rate.
 * Quantized weights are dequantized per 32-column tile into shared memory as
 * their integer codes (int8 q of Q8_0, nibble q of Q4_1: exact in bf16); the
 * two k16 MMAs of a block accumulate into a temporary fragment that is then
 * scaled by the row's d (and, for Q4_1, the row's m times the token's block
 * sum of x), so no scale is rounded to bf16:
 *   Q8_0: y += d * sum(q x);  Q4_1: y += d * sum(q x) + m * sum(x).
 *
 * Shape: a block of 4 warps computes a 64 (weight rows) x 64 (tokens) tile,
 * each warp 32 x 32 (2 x 4 fragments of 16 x 8), k in steps of 32 (one quant
 * block): all threads stage the W tile (bf16 codes) and x tile (hi, lo) in
 * shared memory with rows padded to 40 halves (20 words: the fragment loads
 * of 8 groups x 4 lanes hit 32 distinct banks), barrier, MMAs, barrier.
 * Rows and tokens past the ends are staged as zeros and never stored.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_math.h"
#include "kernels/cuda/klinear.h"
#include "kernels/formats.h"

#define MM_BM 64u  /* weight rows (outputs) per block */
#define MM_BN 64u  /* tokens per block */
#define MM_BK 32u  /* k per stage: one quant block */
#define MM_LD 40u  /* bf16 per staged row: 32 + 8 pad */
#define MM_THREADS 128u

enum { MM_BF16 = 0, MM_Q8_0 = 1, MM_Q4_1 = 2 };

__device__ __forceinline__ void mm_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* bf16 bits of a small integer code (|v| <= 255: exact). */
__device__ __forceinline__ uint32_t mm_code(int v) { return __float_as_uint((float)v) >> 16; }

template <int FMT>
__global__ void __launch_bounds__(MM_THREADS)
kc_matmul_kernel(const uint8_t *w, const float *x, float *y, uint32_t out, uint32_t in, uint32_t n_rows)
{
    __shared__ __align__(16) uint16_t ws[MM_BM][MM_LD];
    __shared__ __align__(16) uint16_t xh[MM_BN][MM_LD];
    __shared__ __align__(16) uint16_t xl[MM_BN][MM_LD];
    __shared__ float dsc[MM_BM], msc[MM_BM], xsum[MM_BN];

    const uint32_t tid = threadIdx.x, warp = tid / 32u, lane = tid % 32u;
    const uint32_t o0 = blockIdx.x * MM_BM, t0 = blockIdx.y * MM_BN;
    const uint32_t wm = (warp / 2u) * 32u, wn = (warp % 2u) * 32u; /* the warp's 32 x 32 within the tile */
    const uint32_t nkt = in / MM_BK;

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    for (uint32_t kt = 0; kt < nkt; kt++) {
        const uint32_t k0 = kt * MM_BK;
        /* ---- stage x: 64 tokens x 32 floats = 512 float4, 4 per thread; 8 threads per token ---- */
#pragma unroll
        for (uint32_t it = 0; it < 4u; it++) {
            const uint32_t idx = it * MM_THREADS + tid, t = idx / 8u, part = idx % 8u;
            const uint32_t tok = t0 + t;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (tok < n_rows) v = __ldg((const float4 *)(x + (size_t)tok * in + k0) + part);
            uint16_t h0, h1, h2, h3, l0, l1, l2, l3;
            kc_split_bf16(v.x, &h0, &l0);
            kc_split_bf16(v.y, &h1, &l1);
            kc_split_bf16(v.z, &h2, &l2);
            kc_split_bf16(v.w, &h3, &l3);
            *(uint2 *)&xh[t][part * 4u] = make_uint2(h0 | (uint32_t)h1 << 16, h2 | (uint32_t)h3 << 16);
            *(uint2 *)&xl[t][part * 4u] = make_uint2(l0 | (uint32_t)l1 << 16, l2 | (uint32_t)l3 << 16);
            if (FMT == MM_Q4_1) { /* block sum of x per token: the 8 threads of a token are 8 adjacent lanes */
                float sx = v.x + v.y + v.z + v.w;
                sx += __shfl_xor_sync(0xffffffffu, sx, 1);
                sx += __shfl_xor_sync(0xffffffffu, sx, 2);
                sx += __shfl_xor_sync(0xffffffffu, sx, 4);
                if (part == 0) xsum[t] = sx;
            }
        }
        /* ---- stage W: 64 rows x 32 k as bf16 (weights or integer codes) ---- */
        if (FMT == MM_BF16) {
#pragma unroll
            for (uint32_t it = 0; it < 2u; it++) { /* 256 pieces of 16 bytes, 4 per row */
                const uint32_t idx = it * MM_THREADS + tid, row = idx / 4u, part = idx % 4u, o = o0 + row;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (o < out) v = __ldg((const uint4 *)(w + ((size_t)o * in + k0) * 2u) + part);
                *(uint4 *)&ws[row][part * 8u] = v;
            }
        } else { /* two threads per row: half h of the block's 32 codes */
            const uint32_t row = tid / 2u, h = tid % 2u, o = o0 + row;
            uint32_t packed[8]; /* 16 codes, 2 per word */
            float d = 0.0f, m = 0.0f;
            if (o < out) {
                if (FMT == MM_Q8_0) {
                    const uint8_t *blk = w + kc_qblock_off(o, kt, in, KC_Q8_0_BYTES);
                    const uint16_t *q2 = (const uint16_t *)(blk + 2u + 16u * h); /* 2-byte aligned */
                    d = kc_q8_0_d(blk);
#pragma unroll
                    for (uint32_t i = 0; i < 8u; i++) {
                        const uint16_t v = __ldg(q2 + i);
                        packed[i] = mm_code(kc_q8_0_pair_code(v, 0)) | mm_code(kc_q8_0_pair_code(v, 1)) << 16;
                    }
                } else {
                    const uint8_t *blk = w + kc_qblock_off(o, kt, in, KC_Q4_1_BYTES);
                    const uint32_t *nw = (const uint32_t *)(blk + 4u); /* 4-byte aligned */
                    d = kc_q4_1_d(blk);
                    m = kc_q4_1_m(blk);
#pragma unroll
                    for (uint32_t k = 0; k < 4u; k++) {
                        const uint32_t v = __ldg(nw + k); /* codes of columns 16h + 4k .. 16h + 4k + 3 */
                        packed[2 * k] = mm_code((int)kc_q4_1_word_code(v, h, 0)) | mm_code((int)kc_q4_1_word_code(v, h, 1)) << 16;
                        packed[2 * k + 1] =
                            mm_code((int)kc_q4_1_word_code(v, h, 2)) | mm_code((int)kc_q4_1_word_code(v, h, 3)) << 16;
                    }
                }
            } else {
#pragma unroll
                for (uint32_t i = 0; i < 8u; i++) packed[i] = 0;
            }
            uint4 *dst = (uint4 *)&ws[row][16u * h];
            dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
            dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
            if (h == 0) { dsc[row] = d; msc[row] = m; }
        }
        __syncthreads();

        /* ---- MMAs: 2 k16 steps x (2 x 4 fragments) x (hi, lo) ---- */
        float tmp[2][4][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) tmp[i][j][0] = tmp[i][j][1] = tmp[i][j][2] = tmp[i][j][3] = 0.0f;
#pragma unroll
        for (uint32_t kk = 0; kk < MM_BK; kk += 16u) {
            uint32_t a[2][4];
#pragma unroll
            for (uint32_t mi = 0; mi < 2u; mi++)
#pragma unroll
                for (uint32_t rg = 0; rg < 4u; rg++) { /* register rg holds elements 2rg, 2rg + 1 */
                    uint32_t r, c;
                    kc_mma_a_rc(lane, 2u * rg, &r, &c);
                    a[mi][rg] = *(const uint32_t *)&ws[wm + mi * 16u + r][kk + c];
                }
#pragma unroll
            for (uint32_t ni = 0; ni < 4u; ni++) {
                uint32_t k0b, nb, k1b, nb1;
                kc_mma_b_kn(lane, 0, &k0b, &nb);
                kc_mma_b_kn(lane, 2, &k1b, &nb1);
                const uint32_t tn = wn + ni * 8u + nb;
                const uint32_t bh0 = *(const uint32_t *)&xh[tn][kk + k0b], bh1 = *(const uint32_t *)&xh[tn][kk + k1b];
                const uint32_t bl0 = *(const uint32_t *)&xl[tn][kk + k0b], bl1 = *(const uint32_t *)&xl[tn][kk + k1b];
#pragma unroll
                for (uint32_t mi = 0; mi < 2u; mi++) {
                    float *c = FMT == MM_BF16 ? acc[mi][ni] : tmp[mi][ni];
                    mm_mma(c, a[mi], bh0, bh1);
                    mm_mma(c, a[mi], bl0, bl1);
                }
            }
        }
        if (FMT != MM_BF16) { /* scale the block's integer-code dots */
#pragma unroll
            for (uint32_t mi = 0; mi < 2u; mi++)
#pragma unroll
                for (uint32_t ni = 0; ni < 4u; ni++)
#pragma unroll
                    for (uint32_t e = 0; e < 4u; e++) {
                        uint32_t r, c;
                        kc_mma_c_rc(lane, e, &r, &c);
                        const uint32_t row = wm + mi * 16u + r, col = wn + ni * 8u + c;
                        float v = dsc[row] * tmp[mi][ni][e];
                        if (FMT == MM_Q4_1) v += msc[row] * xsum[col];
                        acc[mi][ni][e] += v;
                    }
        }
        __syncthreads(); /* the stages are rewritten next step */
    }

#pragma unroll
    for (uint32_t mi = 0; mi < 2u; mi++)
#pragma unroll
        for (uint32_t ni = 0; ni < 4u; ni++)
#pragma unroll
            for (uint32_t e = 0; e < 4u; e++) {
                uint32_t r, c;
                kc_mma_c_rc(lane, e, &r, &c);
                const uint32_t o = o0 + wm + mi * 16u + r, tok = t0 + wn + ni * 8u + c;
                if (o < out && tok < n_rows) y[(size_t)tok * out + o] = acc[mi][ni][e];
            }
}

extern "C" int kc_linear_matmul(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x,
                                uint32_t n_rows, float *y, cudaStream_t s)
{
    const int fmt = dtype == KIPP_TTYPE_BF16 ? MM_BF16 : dtype == KIPP_TTYPE_Q8_0 ? MM_Q8_0
                  : dtype == KIPP_TTYPE_Q4_1 ? MM_Q4_1 : -1;
    if (fmt < 0 || in % MM_BK || ((uintptr_t)x & 15u) || (fmt == MM_BF16 && ((uintptr_t)w & 15u)) ||
        (fmt == MM_Q8_0 && ((uintptr_t)w & 1u)) || (fmt == MM_Q4_1 && ((uintptr_t)w & 3u)) ||
        kc_n_tiles(n_rows, MM_BN) > 65535u)
        return (int)cudaErrorInvalidValue;
    if (out == 0 || n_rows == 0) return 0;
    dim3 grid(kc_n_tiles(out, MM_BM), kc_n_tiles(n_rows, MM_BN));
    const uint8_t *wb = (const uint8_t *)w;
    if (fmt == MM_BF16)
        kc_matmul_kernel<MM_BF16><<<grid, MM_THREADS, 0, s>>>(wb, x, y, out, in, n_rows);
    else if (fmt == MM_Q8_0)
        kc_matmul_kernel<MM_Q8_0><<<grid, MM_THREADS, 0, s>>>(wb, x, y, out, in, n_rows);
    else
        kc_matmul_kernel<MM_Q4_1><<<grid, MM_THREADS, 0, s>>>(wb, x, y, out, in, n_rows);
    return (int)cudaGetLastError();
}
