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
 * of 8 groups x 4 lanes hit 32 distinct banks), barrier, issue the next
 * step's global loads into registers (mm_load), MMAs, barrier: the loads of
 * step k + 1 are in flight while step k multiplies.
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

/* One thread's share of a k step's global reads, held in registers so the next step's loads are in
 * flight while this step's MMAs run (register prefetch, one shared stage). */
typedef struct {
    float4 x[4]; /* 4 of the x tile's 512 float4: token (it * 128 + tid) / 8, piece tid % 8 */
    uint4 w[2];  /* bf16: 2 of the W tile's 256 pieces; Q8_0: 16 int8 codes; Q4_1: w[0] = 4 nibble words */
    uint32_t dm; /* quantized: the block's fp16 d | fp16 m << 16 (0 past the last row) */
} mm_raw;

template <int FMT>
__device__ __forceinline__ void mm_load(const uint8_t *w, const float *x, uint32_t o0, uint32_t t0, uint32_t kt,
                                        uint32_t out, uint32_t in, uint32_t n_rows, uint32_t tid, mm_raw &r)
{
    const uint32_t k0 = kt * MM_BK;
#pragma unroll
    for (uint32_t it = 0; it < 4u; it++) { /* 64 tokens x 32 floats = 512 float4; 8 threads per token */
        const uint32_t idx = it * MM_THREADS + tid, t = idx / 8u, part = idx % 8u, tok = t0 + t;
        r.x[it] = tok < n_rows ? __ldg((const float4 *)(x + (size_t)tok * in + k0) + part)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (FMT == MM_BF16) {
#pragma unroll
        for (uint32_t it = 0; it < 2u; it++) { /* 64 rows x 64 bytes = 256 pieces of 16 bytes, 4 per row */
            const uint32_t idx = it * MM_THREADS + tid, row = idx / 4u, part = idx % 4u, o = o0 + row;
            r.w[it] = o < out ? __ldg((const uint4 *)(w + ((size_t)o * in + k0) * 2u) + part) : make_uint4(0, 0, 0, 0);
        }
        r.dm = 0;
        return;
    }
    const uint32_t row = tid / 2u, h = tid % 2u, o = o0 + row; /* two threads per row: half h of the codes */
    r.w[0] = r.w[1] = make_uint4(0, 0, 0, 0);
    r.dm = 0;
    if (o >= out) return;
    if (FMT == MM_Q8_0) {
        const uint8_t *blk = w + kc_qblock_off(o, kt, in, KC_Q8_0_BYTES);
        const uint16_t *q2 = (const uint16_t *)(blk + 2u + 16u * h); /* 2-byte aligned: pairs of codes */
        uint32_t p[8];
#pragma unroll
        for (uint32_t i = 0; i < 8u; i++) p[i] = __ldg(q2 + i);
        r.w[0] = make_uint4(p[0] | p[1] << 16, p[2] | p[3] << 16, p[4] | p[5] << 16, p[6] | p[7] << 16);
        r.dm = __ldg((const uint16_t *)blk);
    } else {
        const uint8_t *blk = w + kc_qblock_off(o, kt, in, KC_Q4_1_BYTES);
        r.w[0] = make_uint4(__ldg((const uint32_t *)(blk + 4u)), __ldg((const uint32_t *)(blk + 8u)),
                            __ldg((const uint32_t *)(blk + 12u)), __ldg((const uint32_t *)(blk + 16u)));
        r.dm = __ldg((const uint32_t *)blk); /* d | m << 16 (4-byte aligned block) */
    }
}

template <int FMT>
__device__ __forceinline__ void mm_store(const mm_raw &r, uint16_t (*ws)[MM_LD], uint16_t (*xh)[MM_LD],
                                         uint16_t (*xl)[MM_LD], float *dsc, float *msc, float *xsum, uint32_t tid)
{
#pragma unroll
    for (uint32_t it = 0; it < 4u; it++) {
        const uint32_t idx = it * MM_THREADS + tid, t = idx / 8u, part = idx % 8u;
        const float4 v = r.x[it];
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
    if (FMT == MM_BF16) {
#pragma unroll
        for (uint32_t it = 0; it < 2u; it++) {
            const uint32_t idx = it * MM_THREADS + tid, row = idx / 4u, part = idx % 4u;
            *(uint4 *)&ws[row][part * 8u] = r.w[it];
        }
        return;
    }
    const uint32_t row = tid / 2u, h = tid % 2u;
    const uint32_t wd[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
    uint32_t packed[8]; /* 16 codes as bf16, 2 per word: columns 16h .. 16h + 15 */
    if (FMT == MM_Q8_0) {
#pragma unroll
        for (uint32_t i = 0; i < 8u; i++) { /* pair i: codes 16h + 2i, 16h + 2i + 1 */
            const uint16_t pair = (uint16_t)(wd[i / 2u] >> (16u * (i % 2u)));
            packed[i] = mm_code(kc_q8_0_pair_code(pair, 0)) | mm_code(kc_q8_0_pair_code(pair, 1)) << 16;
        }
    } else {
#pragma unroll
        for (uint32_t k = 0; k < 4u; k++) { /* word k: codes of columns 16h + 4k .. 16h + 4k + 3 */
            packed[2 * k] = mm_code((int)kc_q4_1_word_code(wd[k], h, 0)) | mm_code((int)kc_q4_1_word_code(wd[k], h, 1)) << 16;
            packed[2 * k + 1] =
                mm_code((int)kc_q4_1_word_code(wd[k], h, 2)) | mm_code((int)kc_q4_1_word_code(wd[k], h, 3)) << 16;
        }
    }
    uint4 *dst = (uint4 *)&ws[row][16u * h];
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    if (h == 0) {
        dsc[row] = kc_f16_to_f32((uint16_t)(r.dm & 0xffffu));
        msc[row] = FMT == MM_Q4_1 ? kc_f16_to_f32((uint16_t)(r.dm >> 16)) : 0.0f;
    }
}

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

    mm_raw raw;
    if (nkt) mm_load<FMT>(w, x, o0, t0, 0, out, in, n_rows, tid, raw); /* in == 0: no k step, y = 0 */
    for (uint32_t kt = 0; kt < nkt; kt++) {
        mm_store<FMT>(raw, ws, xh, xl, dsc, msc, xsum, tid); /* the previous step's readers passed the barrier */
        __syncthreads();
        if (kt + 1u < nkt) mm_load<FMT>(w, x, o0, t0, kt + 1u, out, in, n_rows, tid, raw); /* in flight over the MMAs */

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
